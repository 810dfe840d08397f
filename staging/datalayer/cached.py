"""``@cached(store_uri, name, version, **dataset_options)``: build a dataset once from Python code,
cache it by name and version in a bucket, and read it as a ShardDataset (or PackedDataset)
everywhere after."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Iterable, Mapping

from lading.core.errors import UsageError
from lading.datalayer.encoding import Decode
from lading.datalayer.ensure import BuildOptions, Outcome, ensure
from lading.datalayer.fingerprint import fingerprint as fingerprint_of
from lading.datalayer.layout import Location
from lading.datasets import PackedDataset, ShardDataset
from lading.pack.plan import DEFAULT_SHARD_SIZE
from lading.selection.topology import detect_topology
from lading.stores.config import StoreConfig

#: ``shuffle=True`` without ``shuffle_buffer=``: samples are permuted within windows of this many.
DEFAULT_SHUFFLE_BUFFER = 10_000
_ORDER_OPTIONS = ("shuffle", "seed", "shuffle_buffer", "rank", "world_size", "distributed")


def resolve_slot(
    rank: int | None = None,
    world_size: int | None = None,
    distributed: Any = None,
    env: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """This process's ``(rank, world size)``, each from the first of: the argument; ``distributed``
    (anything with ``get_rank()`` and ``get_size()``, such as Determined's
    ``core_context.distributed`` or a PyTorchTrial context's ``context.distributed``); an initialised
    torch.distributed process group; the launcher's environment as ``lading topology`` reads it
    (torchrun and Determined's launchers set ``RANK``/``WORLD_SIZE``; Horovod, MPI, SLURM, SageMaker);
    rank 0 of 1."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if distributed is not None:
        found = int(distributed.get_rank()), int(distributed.get_size())
    elif _torch_distributed() is not None:
        found = _torch_distributed()  # type: ignore[assignment]
    else:
        topology = detect_topology(os.environ if env is None else env)
        found = topology.rank, topology.world_size
    return (found[0] if rank is None else rank), (found[1] if world_size is None else world_size)


def _torch_distributed() -> tuple[int, int] | None:
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class CachedFunction:
    """A function whose samples are cached as a dataset version (what :func:`cached` returns).

    Calling it returns the dataset; :meth:`ensure` only builds or checks the version.
    """

    def __init__(
        self,
        function: Callable[..., Iterable[Any]],
        location: Location,
        *,
        explicit: str | None,
        build: BuildOptions,
        dataset: dict[str, Any],
        config: StoreConfig | None,
    ) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.location = location
        self.explicit_fingerprint = explicit
        self.build_options = build
        self.dataset_options = dataset
        self.config = config

    @property
    def uri(self) -> str:
        """``STORE_URI/NAME/VERSION``."""
        return self.location.uri

    @property
    def index_uri(self) -> str:
        """The version's index (what ShardDataset and PackedDataset open)."""
        return self.location.index_uri

    def fingerprint(self, *args: Any, **kwargs: Any) -> str:
        """The fingerprint a call with these arguments builds under (see :mod:`lading.datalayer.fingerprint`)."""
        return fingerprint_of(self.function, args, kwargs, self.explicit_fingerprint)

    def ensure(self, *args: Any, **kwargs: Any) -> Outcome:
        """Build the version from ``function(*args, **kwargs)`` unless it exists (or another process is
        building it: then wait for it); check it. Returns what happened."""
        name = f"{getattr(self.function, '__module__', '?')}.{getattr(self.function, '__qualname__', '?')}"
        return ensure(
            self.location,
            lambda: self.function(*args, **kwargs),
            self.fingerprint(*args, **kwargs),
            function=name,
            options=self.build_options,
            config=self._config(),
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The dataset over the version, built first if needed."""
        outcome = self.ensure(*args, **kwargs)
        return open_dataset(outcome, config=self._config(), **self.dataset_options)

    def _config(self) -> StoreConfig:
        return self.config or StoreConfig.from_env()

    def __repr__(self) -> str:
        return f"<cached {getattr(self.function, '__qualname__', self.function)} as {self.location}>"


def cached(
    store_uri: str,
    name: str,
    version: str,
    *,
    fingerprint: str | None = None,
    random_access: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    distributed: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    transform: Callable[[dict[str, Any]], Any] | None = None,
    config: StoreConfig | None = None,
    claim_ttl: float = 60.0,
    wait_timeout: float = 3600.0,
    shard_size: int = DEFAULT_SHARD_SIZE,
    spool_dir: str | os.PathLike[str] | None = None,
    **dataset_options: Any,
) -> Callable[[Callable[..., Iterable[Any]]], CachedFunction]:
    """Cache what the decorated function returns as ``store_uri/name/version/`` and read it from there.

    The function returns (or yields) samples: dicts of ``bytes``, ``str``, ``int``, ``float``,
    ``bool``, ``None``, lists/dicts of those, numpy arrays and scalars, torch tensors, with an
    optional ``__key__`` (a unique string). A call of the decorated function:

    1. if the version holds a complete dataset (its index), skips the function;
    2. otherwise, in exactly one process of all those calling at once (on any number of nodes),
       runs it once and packs its samples into shards there, recording their encoding in the
       index (see :mod:`lading.datalayer.encoding`); the others wait for the index;
    3. returns a :class:`~lading.datasets.ShardDataset` over it (a
       :class:`~lading.datasets.PackedDataset` with ``random_access=True``) whose samples have
       the fields and types the function produced, plus ``__key__``.

    Args:
        store_uri: where datasets are cached: ``s3://bucket/prefix``, ``gs://...`` or a directory.
        name, version: the dataset's name and version (letters, digits, ``.``, ``_``, ``-``).
            Versions are immutable: a build from other code or arguments is refused; publish a
            new version for new data.
        fingerprint: identifies a build instead of the function's code and arguments
            (see :mod:`lading.datalayer.fingerprint`).
        random_access: a map-style PackedDataset (use a DistributedSampler) instead.
        shuffle: a seeded shuffle: shards in a random order and samples permuted within windows
            of ``shuffle_buffer`` (default 10,000), another order each ``set_epoch``.
        seed: the shuffle's seed.
        rank, world_size, distributed: this process's place (see :func:`resolve_slot`); every
            rank reads its own share of each epoch.
        cache_dir: the node cache root (shards downloaded once per node).
        transform: applied to each decoded sample.
        config: store settings (default: ``StoreConfig.from_env()``).
        claim_ttl: seconds without a heartbeat after which a builder's claim expires.
        wait_timeout: seconds to wait for another process's build before WaitTimeout (exit 5).
        shard_size: target shard size in bytes.
        spool_dir: local directory for the build's spool and temporary shards.
        **dataset_options: passed on to ShardDataset (``batch_size``, ``remainder``,
            ``cache_limit``, ``prefetch``) or PackedDataset (``max_gap``, ``threads``,
            ``use_cache``).
    """
    location = Location.of(store_uri, name, version)
    build = BuildOptions(
        claim_ttl=float(claim_ttl),
        wait_timeout=float(wait_timeout),
        shard_size=int(shard_size),
        spool_dir=None if spool_dir is None else os.fspath(spool_dir),
    )
    if "decode" in dataset_options:
        raise UsageError(
            "cached datasets decode their fields by the encoding recorded in the index",
            "drop decode=; pass transform= for more processing",
        )
    given = {
        "shuffle": shuffle,
        "seed": seed,
        "shuffle_buffer": shuffle_buffer,
        "rank": rank,
        "world_size": world_size,
        "distributed": distributed,
    }
    if random_access:
        ordering = [option for option in _ORDER_OPTIONS if given[option] not in (None, False, 0)]
        if ordering:
            raise UsageError(
                f"random_access=True takes no {', '.join(ordering)}: a PackedDataset has no order of its own",
                "use a sampler: DataLoader(ds, sampler=DistributedSampler(ds, shuffle=True, seed=0))",
            )
    if shuffle_buffer is not None and shuffle_buffer < 0:
        raise UsageError(f"shuffle_buffer={shuffle_buffer} must not be negative")
    dataset = {
        "random_access": random_access,
        "transform": transform,
        "cache_dir": cache_dir,
        **given,
        **dataset_options,
    }

    def decorate(function: Callable[..., Iterable[Any]]) -> CachedFunction:
        if not callable(function):
            raise UsageError("@cached(...) decorates a function that returns samples")
        return CachedFunction(function, location, explicit=fingerprint, build=build, dataset=dataset, config=config)

    return decorate


def open_dataset(
    outcome: Outcome,
    *,
    random_access: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    shuffle_buffer: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    distributed: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
    transform: Callable[[dict[str, Any]], Any] | None = None,
    config: StoreConfig | None = None,
    **dataset_options: Any,
) -> Any:
    """The dataset over a built version, decoding each sample by the recorded encoding."""
    decode = Decode(outcome.encoding, transform)
    if random_access:
        return PackedDataset(
            outcome.location.index_uri, transform=decode, config=config, cache_dir=cache_dir, **dataset_options
        )
    rank, world_size = resolve_slot(rank, world_size, distributed)
    window = (
        (DEFAULT_SHUFFLE_BUFFER if shuffle_buffer is None else shuffle_buffer) if shuffle else (shuffle_buffer or 0)
    )
    return ShardDataset(
        outcome.location.index_uri,
        rank=rank,
        world_size=world_size,
        shuffle_buffer=window,
        seed=seed,
        randomize_shard_order=shuffle,
        transform=decode,
        config=config,
        cache_dir=cache_dir,
        **dataset_options,
    )
