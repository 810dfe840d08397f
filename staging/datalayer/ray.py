"""The data layer from a Ray pipeline: publish a Ray Dataset once as a cached version, read it everywhere.

.. code-block:: python

    import ray, lading.datalayer
    from lading.datalayer.ray import publish

    def preprocessed():                       # called only by the process elected to build
        return ray.data.read_images("s3://raw/train/").map(resize)

    outcome = publish(preprocessed, "s3://bucket/cache", "train-224", "v1")
    train = lading.datalayer.open_dataset(outcome)     # a ShardDataset over the version

The same claim protocol and checks as :func:`lading.datalayer.cached`
(:func:`lading.datalayer.ensure`): of all the processes publishing one name and version at
once, one builds (its Ray job writes the shards from the cluster's workers, through
:class:`lading.pack.ray.ShardSink`, into the version's ``build-<id>/`` folder) and the others
wait for its index; a version is immutable (another fingerprint is refused); a reader checks
every object against the index's ETags. Rows are encoded exactly as ``cached`` encodes samples
(:mod:`lading.datalayer.encoding`: field names and types come back when read), in write-task order.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable

from lading.core.errors import LadingError, ProblemFound, UsageError
from lading.datalayer.claim import Claim
from lading.datalayer.encoding import ENCODING, Encoder
from lading.datalayer.ensure import BuildOptions, Outcome, ensure
from lading.datalayer.fingerprint import fingerprint as fingerprint_of
from lading.datalayer.layout import BLOCK, FORMAT, Location
from lading.pack.index import dump
from lading.pack.plan import DEFAULT_SHARD_SIZE
from lading.pack.ray import RowEncoder, ShardSink
from lading.pack.ray.session import task_error
from lading.stores import claims
from lading.stores.base import Store
from lading.stores.config import StoreConfig

__all__ = ["publish"]


class _Rows(RowEncoder):
    """A write task's rows through the data layer's Encoder (``KEY.FIELD.TYPE`` members)."""

    def __init__(self, task: int) -> None:
        super().__init__(task)
        self.encoder = Encoder()

    def encode(self, row: dict[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
        """The stored key and members; keyless rows are keyed by write task and position."""
        stored, members = self.encoder.encode(row)
        return (stored if self.encoder.keyed else f"{self.task:06d}-{stored}"), members

    def summary(self) -> dict[str, Any]:
        """The fields seen, whether rows had keys, and how many."""
        return {"fields": self.encoder.fields, "keyed": self.encoder.keyed, "samples": self.encoder.samples}


class _VersionSink(ShardSink):
    """ShardSink into ``build-<id>/`` of a version; the index (with the datalayer block) is
    created at the version's top, only if absent, while the claim is ours."""

    def __init__(
        self, location: Location, claim: Claim, function: str, shard_size: int, config: StoreConfig | None
    ) -> None:
        super().__init__(location.uri, name=location.name, shard_size=shard_size, config=config)
        self.folder = claim.record.build.rstrip("/") + "/"
        self.location, self.claim, self.function = location, claim, function
        self.started = time.time()
        self._block: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["claim"] = None  # the claim (its heartbeat thread) stays on the driver
        return state

    def row_encoder(self, task: int) -> RowEncoder:
        """Rows encoded as the data layer encodes samples."""
        return _Rows(task)

    def merge_summaries(self, summaries: list[Any]) -> dict[str, Any]:
        """One field table for the version; the same key rule in every task."""
        fields: dict[str, dict[str, str]] = {}
        keyed = {summary["keyed"] for summary in summaries if summary and summary["keyed"] is not None}
        if len(keyed) > 1:
            raise UsageError("some rows have a __key__ and others not", "give every row a __key__, or none")
        for summary in summaries:
            for ext, entry in (summary or {}).get("fields", {}).items():
                known = fields.setdefault(ext, entry)
                if known["field"] != entry["field"]:
                    raise UsageError(
                        f"fields {known['field']!r} and {entry['field']!r} differ only by case",
                        "WebDataset readers lower-case extensions; use one spelling",
                    )
        record = self.claim.record if self.claim is not None else None
        self._block = {
            "format": FORMAT,
            "name": self.location.name,
            "version": self.location.version,
            "fingerprint": record.fingerprint if record else "",
            "function": self.function,
            "encoding": {
                "format": ENCODING,
                "keys": "given" if keyed == {True} else "position",
                "fields": dict(sorted(fields.items())),
            },
            "samples": sum(summary["samples"] for summary in summaries if summary),
            "build": record.build if record else self.folder.rstrip("/"),
            "writer": "ray",
            "built_by": {"host": socket.gethostname(), "pid": os.getpid(), "user": record.user if record else ""},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return {}

    def publish_index(self, store: Store, key: str, index: dict[str, Any]) -> dict[str, Any]:
        """Conditional create of the index, with the datalayer block, while the claim is ours."""
        index.setdefault("lading", {})["version"] = self.location.version
        index[BLOCK] = dict(self._block, build_seconds=round(time.time() - self.started, 3))
        assert self.claim is not None, "publish_index runs on the driver"
        self.claim.check()
        self.claim.beat()
        if claims.create(store, self.location.index_key, dump(index)) is None:
            raise ProblemFound(
                f"{self.location.index_uri} appeared while this process built it",
                "another process published the version first; nothing of this build is used",
            )
        return index


def _ray_builder(
    make: Callable[[], Any], function: str, shard_size: int, config: StoreConfig | None
) -> Callable[[Store, Location, Claim], dict[str, Any]]:
    def build(store: Store, location: Location, claim: Claim) -> dict[str, Any]:
        dataset = make()
        if not hasattr(dataset, "write_datasink"):
            raise UsageError(f"{function} returned a {type(dataset).__name__}, not a Ray Dataset")
        sink = _VersionSink(location, claim, function, shard_size, config)
        try:
            import ray

            dataset.write_datasink(sink)
        except LadingError:
            raise
        except Exception as err:  # noqa: BLE001 - Ray's wrapping of a task's error
            raise task_error(ray, err, f"writing {location} on Ray") from None
        if sink.index is None:
            raise ProblemFound(f"the Ray write of {location} finished without an index")
        return sink.index

    return build


def publish(
    dataset: Any,
    store_uri: str,
    name: str,
    version: str,
    *,
    fingerprint: str | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    config: StoreConfig | None = None,
    claim_ttl: float = 60.0,
    wait_timeout: float = 3600.0,
) -> Outcome:
    """Publish a Ray Dataset as ``store_uri/name/version/`` unless that version exists (or is being
    published by another process: then wait for it); check it; return what happened.

    Args:
        dataset: a function of no arguments returning the Ray Dataset (called only by the process
            elected to build), or a Ray Dataset (then ``fingerprint=`` is required).
        store_uri, name, version: where the version lives, as for :func:`lading.datalayer.cached`.
        fingerprint: what identifies this build (default for a function: its code, see
            :mod:`lading.datalayer.fingerprint`); another fingerprint for an existing version is refused.
        shard_size: target shard size in bytes (each write task cuts its rows at about this size).
        config, claim_ttl, wait_timeout: as for :func:`lading.datalayer.cached`.

    Read it with :func:`lading.datalayer.open_dataset` (ShardDataset, or PackedDataset with
    ``random_access=True``).
    """
    location = Location.of(store_uri, name, version)
    if callable(dataset) and not hasattr(dataset, "write_datasink"):
        make, function = dataset, f"{getattr(dataset, '__module__', '?')}.{getattr(dataset, '__qualname__', '?')}"
        built_as = fingerprint_of(dataset, (), {}, fingerprint)
    else:
        if fingerprint is None:
            raise UsageError(
                "a Ray Dataset has no code lading can fingerprint: pass fingerprint=",
                'e.g. publish(ds, ..., fingerprint="resize-224 of raw/v3"), or pass a function '
                "that returns the dataset",
            )
        make, function = (lambda: dataset), "ray.data.Dataset"
        built_as = fingerprint_of(make, (), {}, fingerprint)
    options = BuildOptions(claim_ttl=float(claim_ttl), wait_timeout=float(wait_timeout), shard_size=int(shard_size))
    return ensure(
        location,
        lambda: (),
        built_as,
        function=function,
        options=options,
        config=config,
        builder=_ray_builder(make, function, int(shard_size), config),
    )
