"""What a pack will write, computed before anything is written: samples in order, cut into shards.

The plan is data: ``lading pack --dry-run`` and ``--json`` show it, the writer follows it.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass, field

from lading.core.errors import UsageError
from lading.pack.grouping import Sample
from lading.pack.tarformat import BLOCK, archive_size, member_size

_PLAIN_SIZE_LIMIT = 8**11  # sizes from here on need a pax record (see tarformat)

DEFAULT_SHARD_SIZE = 150_000_000
#: The offsets file next to the index (format: :mod:`lading.pack.offsets`).
OFFSETS_SUFFIX = ".offsets.safetensors"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class PackOptions:
    """How to pack: dataset name, target shard size in bytes, optional seeded shuffle and version."""

    name: str
    shard_size: int = DEFAULT_SHARD_SIZE
    shuffle: bool = False
    seed: int = 0
    version: str | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "--name")
        if self.version is not None:
            check_name(self.version, "--version")
        if self.shard_size < 1:
            raise UsageError(f"--shard-size must be positive, not {self.shard_size}")


def check_name(value: str, what: str) -> None:
    """Refuse a dataset name or version that is not a plain file-name-safe word."""
    if not _NAME.match(value):
        raise UsageError(
            f"{what} {value!r} is not usable in shard names",
            "use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )


@dataclass(frozen=True)
class ShardPlan:
    """One tar shard: its file name, its samples in order, its exact size in bytes, and where
    each sample starts in it (so several writers can fill one shard at once)."""

    name: str
    samples: tuple[Sample, ...]
    nbytes: int
    offsets: tuple[int, ...] = ()

    @property
    def nfiles(self) -> int:
        """Number of tar members."""
        return sum(len(sample.members) for sample in self.samples)


@dataclass(frozen=True)
class PackPlan:
    """The whole dataset: shards in order, and where the index and manifest go (relative keys)."""

    options: PackOptions
    shards: tuple[ShardPlan, ...]
    index_key: str
    manifest_key: str
    prefix: str = ""  # the directory under DEST everything goes in ("NAME/V/" with --version)
    input_bytes: int = field(default=0)

    @property
    def nsamples(self) -> int:
        """Samples in the dataset."""
        return sum(len(shard.samples) for shard in self.shards)

    @property
    def nbytes(self) -> int:
        """Bytes of all shards together."""
        return sum(shard.nbytes for shard in self.shards)

    @property
    def offsets_key(self) -> str:
        """The offsets file's key relative to DEST (next to the index)."""
        return f"{self.prefix}{self.options.name}{OFFSETS_SUFFIX}"

    def shard_key(self, shard: ShardPlan) -> str:
        """The shard's key relative to DEST."""
        return self.prefix + shard.name


def _sizes(samples: list[Sample]) -> tuple[list[int], int]:
    """Each sample's bytes in a shard and all payload bytes: one pass, with tarformat's
    one-header-block case inlined, since it runs once per file."""
    sizes: list[int] = []
    add = sizes.append
    payload = 0
    for sample in samples:
        total = 0
        for info, _ in sample.members:
            key, size = info.key, info.size
            payload += size
            if len(key) <= 100 and size < _PLAIN_SIZE_LIMIT and key.isascii():
                total += BLOCK + size + (-size % BLOCK)
            else:
                total += member_size(key, size)
        add(total)
    return sizes, payload


def order_samples(samples: list[Sample], options: PackOptions) -> list[Sample]:
    """Samples in key order, or shuffled by ``options.seed`` (samples move, members stay together)."""
    ordered = sorted(samples)  # by key: the first field, unique
    if options.shuffle:
        random.Random(options.seed).shuffle(ordered)
    return ordered


def cut_balanced(sizes: list[int], target: int) -> list[int]:
    """Indices where shards start: contiguous runs of nearly equal bytes, about ``target`` each.

    Each new shard aims at ``remaining / ceil(remaining / target)`` bytes and ends at the sample
    boundary closest to that goal. Samples are never split, so a sample larger than ``target``
    makes a shard of its own.
    """
    starts = [0]
    remaining = sum(sizes)
    goal = remaining / max(1, math.ceil(remaining / target))
    current = 0
    for index, size in enumerate(sizes):
        if current and remaining > current and abs(current - goal) <= abs(current + size - goal):
            starts.append(index)
            remaining -= current
            goal = remaining / max(1, math.ceil(remaining / target))
            current = 0
        current += size
    return starts


def plan_shards(samples: list[Sample], options: PackOptions) -> PackPlan:
    """Order the samples and cut them into balanced shards named ``NAME-000000.tar`` onwards."""
    if not samples:
        raise UsageError("nothing to pack: the source has no files")
    ordered = order_samples(samples, options)
    sizes, input_bytes = _sizes(ordered)
    starts = cut_balanced(sizes, options.shard_size) + [len(ordered)]
    shards = tuple(
        ShardPlan(
            f"{options.name}-{number:06d}.tar",
            tuple(ordered[start:end]),
            archive_size(sum(sizes[start:end])),
            tuple(itertools.accumulate(sizes[start : end - 1], initial=0)),
        )
        for number, (start, end) in enumerate(zip(starts, starts[1:]))
    )
    prefix = f"{options.name}/{options.version}/" if options.version else ""
    return PackPlan(
        options,
        shards,
        f"{prefix}{options.name}.index.json",
        f"{prefix}{options.name}.manifest.json",
        prefix,
        input_bytes,
    )
