"""A dlt source: subscriptions, customers and orders of many stores into any warehouse.

``subscription_service`` (``_source``) has one resource per list endpoint (``subscriptions``,
``customers``, ``orders``, and any ``list_paths``), each merging on (``store``, ``id``); its rows
are ``_records``, its clients and pulls ``_session`` (on an event loop of the run's own, beside
dlt's), its hard deletes ``_deletes``. docs/dlt.md says how dlt runs them, with examples.
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
