"""The transfer engine: fetch a batch of objects into final paths, safely.

Contract (used by sync, hook, fetch and pack):
- each file is written under a temporary name in its destination directory and renamed into
  place only when complete and verified (size; MD5 for single-part S3 ETags; CRC32C or MD5
  for GCS), so no partial file is ever visible under its final name;
- large objects are fetched as parallel ranged reads guarded by ``ObjectInfo.version``;
- transient failures are retried (``StoreConfig.retry``); a failed item is reported in its
  ``TransferResult`` and never aborts the others, except for KeyboardInterrupt;
- progress and completion are reported through ``TransferEvents`` callbacks only.

Modules: ``types`` (items, options, results, events), ``engine`` (a coroutine per object on the
I/O core; large objects through :mod:`lading.stores.download`), ``readers`` (how bytes come from a
store), ``files`` (temporary names, resume records, publishing), ``verify`` (checksums).
"""

from lading.transfer.engine import fetch_all
from lading.transfer.types import NoEvents, TransferEvents, TransferItem, TransferOptions, TransferResult

__all__ = ["NoEvents", "TransferEvents", "TransferItem", "TransferOptions", "TransferResult", "fetch_all"]
