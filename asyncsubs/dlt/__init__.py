"""A dlt source: subscriptions, customers and orders of many stores into any warehouse.

::

    import dlt
    from asyncsubs.dlt import subscription_service

    pipeline = dlt.pipeline("subscriptions", destination="duckdb", dataset_name="subs")
    pipeline.run(subscription_service(stores_file="stores.toml"))

``subscription_service`` has one resource per list endpoint (``subscriptions``, ``customers``,
``orders``, and any ``list_paths``), each merging on (``store``, ``id``). See docs/dlt.md.

How dlt runs it: every resource is an async generator. dlt's extract wraps each in a plain
generator whose items are awaitables of the next page, and submits those to one event loop it
starts for the extract in a background thread (``asyncio.run_coroutine_threadsafe``), at most
``extract.max_parallel_items`` (20) at a time; that loop is closed, after
``shutdown_asyncgens()``, when the extract ends. ``parallelized=True`` concerns plain generators
(each ``next()`` goes to a thread pool of ``extract.workers``) and does nothing for async ones,
and ``dlt.defer`` runs a function in that thread pool: neither is used here. So all of a
source's resources run on one loop, and that is where the clients live: the first resource to
start makes one ``AdminClient`` per store there (its pools, its ``max_in_flight``), every
resource uses it, and the last to finish closes it. Within a resource each store is a task of
its own on that loop, so the stores' pulls go on while dlt writes a page, and the items dlt has
in flight at once are the resources, not the stores.
"""

from ..stores import RESOURCES, Store
from ..stores import Incremental as IncrementalFilter
from ._deletes import DELETED_COLUMN, Delete, DeleteLog
from ._source import DEFAULT_LAG, stores_from_file, subscription_service

__all__ = [
    "DEFAULT_LAG",
    "DELETED_COLUMN",
    "RESOURCES",
    "Delete",
    "DeleteLog",
    "IncrementalFilter",
    "Store",
    "stores_from_file",
    "subscription_service",
]
