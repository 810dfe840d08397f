"""lading on Ray (optional: the ``ray`` extra, see lading.core.install). Nothing here is imported unless asked.

- :func:`run_pack_ray`: ``lading pack --engine ray``. The shard plan is made on the driver, as
  for the local engine; Ray runs one task per shard, each reading its members from SOURCE and
  writing its shard straight to DEST; the driver checks every shard, then writes the manifest,
  the offsets file and, last, the index.
- :class:`ShardSink`: a ``ray.data.Datasink`` writing any Ray Dataset's rows as WebDataset tar
  shards with lading's index and offsets file (readable by ShardDataset, PackedDataset, wids and
  webdataset).
- :func:`ray_session`: join a running cluster (``address`` or ``RAY_ADDRESS``) or start a local
  Ray for the duration.
"""

from __future__ import annotations

from typing import Any

from lading.pack.ray.engine import run_pack_ray
from lading.pack.ray.session import ray_session

__all__ = ["RowEncoder", "ShardSink", "ray_session", "run_pack_ray"]


def __getattr__(name: str) -> Any:
    """ShardSink and RowEncoder subclass Ray's classes: imported on first use, so that
    ``lading pack --engine ray`` without Ray installed is a usage error, not an ImportError."""
    if name in ("ShardSink", "RowEncoder"):
        from lading.pack.ray.session import require_ray

        require_ray()
        from lading.pack.ray import sink

        return getattr(sink, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
