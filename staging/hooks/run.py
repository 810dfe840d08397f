"""``lading hook run``: stage the datasets an experiment config lists under ``data:``.

Schema (the rest of ``data:`` is yours; lading reads only ``data.datasets``)::

    data:
      datasets:
        - source: s3://bucket/train/     # required: s3://, gs:// or a path; an object or a prefix
          dest: /tmp/train               # required: absolute directory (or file, for one object)
          distribution: replicated       # optional: replicated (default) | sharded
          slots: true                    # optional: also build {dest}-rank{i} views (default false)

- ``replicated``: every slot sees everything. With ``slots: true`` each slot ``i`` of
  ``DET_SLOT_IDS`` (by position, which is the slot's ``LOCAL_RANK``) gets ``{dest}-rank{i}``,
  a tree of hard links to ``dest`` (no extra space, no second download).
- ``sharded``: :mod:`lading.selection.sharding`'s rule (keys sorted, key ``k`` to rank
  ``k mod world_size``); rank ``i`` sees its shard in ``{dest}-rank{i}``. A startup hook runs before any rank exists, so this needs the
  whole trial in this container (``resources.slots_per_trial`` equal to the container's slot
  count); otherwise it is refused: use ``lading sync --distribution sharded`` in the entrypoint.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

from lading.core.errors import UsageError
from lading.hooks.stage import StageResult

DISTRIBUTIONS = ("replicated", "sharded")
_FIELDS = {"source", "dest", "distribution", "slots"}


@dataclass(frozen=True)
class DatasetSpec:
    """One entry of ``data.datasets``."""

    source: str
    dest: str
    distribution: str = "replicated"
    slots: bool = False


def datasets_from_config(config: Mapping[str, object], origin: str = "experiment config") -> list[DatasetSpec]:
    """Validate and return ``data.datasets``; an absent section is an empty list."""
    data = config.get("data") or {}
    if not isinstance(data, Mapping):
        raise UsageError(f"{origin}: 'data' must be a mapping")
    entries = data.get("datasets") or []
    if not isinstance(entries, list):
        raise UsageError(f"{origin}: 'data.datasets' must be a list", "see `lading hook run --help` for the schema")
    return [_dataset(entry, f"{origin}: data.datasets[{i}]") for i, entry in enumerate(entries)]


def _dataset(entry: object, where: str) -> DatasetSpec:
    if not isinstance(entry, Mapping):
        raise UsageError(f"{where} must be a mapping with 'source' and 'dest'")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise UsageError(
            f"{where}: unknown field(s) {', '.join(map(str, unknown))}", f"the fields are {', '.join(sorted(_FIELDS))}"
        )
    source, dest = entry.get("source"), entry.get("dest")
    if not isinstance(source, str) or not source:
        raise UsageError(f"{where}: 'source' is required (s3://bucket/prefix, gs://bucket/prefix or a path)")
    if not isinstance(dest, str) or not os.path.isabs(dest):
        raise UsageError(f"{where}: 'dest' is required and must be an absolute path, got {dest!r}")
    distribution = entry.get("distribution", "replicated")
    if distribution not in DISTRIBUTIONS:
        raise UsageError(f"{where}: distribution {distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
    slots = entry.get("slots", False)
    if not isinstance(slots, bool):
        raise UsageError(f"{where}: 'slots' must be true or false")
    return DatasetSpec(source, dest, distribution, slots)


def slots_per_trial(config: Mapping[str, object]) -> int | None:
    """``resources.slots_per_trial`` when the config states it."""
    resources = config.get("resources")
    value = resources.get("slots_per_trial") if isinstance(resources, Mapping) else None
    return value if isinstance(value, int) and value > 0 else None


def views_for(
    spec: DatasetSpec, result: StageResult, slot_count: int, trial_slots: int | None
) -> dict[int, Callable[[], Iterator[str]]]:
    """Which keys each per-slot view ``{dest}-rank{i}`` holds (empty dict: no views), streamed in
    key order: all of them, or the sharded rule's share (``balance='count'``: the ``i``-th key in
    key order goes to rank ``i mod world``, as :func:`~lading.selection.sharding.select_for_rank`)."""
    if spec.distribution == "replicated":
        return dict.fromkeys(range(slot_count), result.keys) if spec.slots else {}
    world = _sharded_world(spec, slot_count, trial_slots)
    return {i: functools.partial(_every, result.keys, i, world) for i in range(world)}


def _every(keys: Callable[[], Iterator[str]], start: int, step: int) -> Iterator[str]:
    return itertools.islice(keys(), start, None, step)


def check_sharding(spec: DatasetSpec, slot_count: int, trial_slots: int | None) -> None:
    """Refuse a sharded dataset the hook cannot split, before downloading anything."""
    if spec.distribution == "sharded":
        _sharded_world(spec, slot_count, trial_slots)


def _sharded_world(spec: DatasetSpec, slot_count: int, trial_slots: int | None) -> int:
    """The world size to shard over: the whole trial, which must be in this container."""
    world = trial_slots or slot_count
    if slot_count == 0 or world != slot_count:
        raise UsageError(
            f"{spec.source}: 'sharded' in a startup hook needs the whole trial in this container "
            f"(slots_per_trial={trial_slots}, DET_SLOT_IDS has {slot_count})",
            "no rank exists yet in a startup hook; run `lading sync --distribution sharded` from the entrypoint",
        )
    return world


def dest_path(spec: DatasetSpec) -> str:
    """DEST as given (a trailing slash keeps its "into this directory" meaning)."""
    return spec.dest if spec.dest.endswith("/") else str(Path(spec.dest))
