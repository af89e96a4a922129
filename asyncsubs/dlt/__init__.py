"""A dlt source: subscriptions, customers and orders of many stores into any warehouse.

::

    import dlt
    from asyncsubs.dlt import subscription_service

    pipeline = dlt.pipeline("subscriptions", destination="duckdb", dataset_name="subs")
    pipeline.run(subscription_service(stores_file="stores.toml"))

``subscription_service`` has one resource per list endpoint (``subscriptions``, ``customers``,
``orders``, and any ``list_paths``), each merging on (``store``, ``id``). See docs/dlt.md.

dlt runs every resource, an async generator, on one event loop of its own, where the stores'
clients live (``_session``): docs/dlt.md, "Many stores and how dlt runs them", says how.
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
