"""Build a dataset once from Python code, cache it in a bucket by name and version, reuse it everywhere.

.. code-block:: python

    import lading.datalayer

    @lading.datalayer.cached("s3://bucket/cache", "mnist", "v1", shuffle=True, seed=0)
    def mnist():
        for image, label in read_raw_mnist():
            yield {"image": image, "label": label}     # numpy array, int

    train = mnist()   # a ShardDataset: built by one process, read by all

- :func:`cached`: the decorator (see its docstring for every option).
- :mod:`lading.datalayer.encoding`: how fields and types are stored (recorded in the index).
- :mod:`lading.datalayer.claim`: how one process among many is elected to build (a store-side
  claim with a heartbeat), and how a dead builder's claim expires.
- :mod:`lading.datalayer.fingerprint`: what makes two builds "the same" (versions are immutable).
- :func:`list_versions`, :func:`describe`, :func:`remove`: what ``lading datasets`` runs.
"""

from __future__ import annotations

from lading.datalayer.cached import DEFAULT_SHUFFLE_BUFFER, CachedFunction, cached, open_dataset, resolve_slot
from lading.datalayer.catalog import Removed, VersionSummary, describe, list_versions, node_cache_status, remove
from lading.datalayer.claim import ClaimLost, ClaimRecord
from lading.datalayer.encoding import Decode, Encoder
from lading.datalayer.ensure import BuildFailed, BuildOptions, Outcome, VersionConflict, WaitTimeout, ensure
from lading.datalayer.layout import Location

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "BuildFailed",
    "BuildOptions",
    "CachedFunction",
    "ClaimLost",
    "ClaimRecord",
    "Decode",
    "Encoder",
    "Location",
    "Outcome",
    "Removed",
    "VersionConflict",
    "VersionSummary",
    "WaitTimeout",
    "cached",
    "describe",
    "ensure",
    "list_versions",
    "node_cache_status",
    "open_dataset",
    "remove",
    "resolve_slot",
]
