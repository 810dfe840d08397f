"""What ShardDataset and MixedDataset share: dealing an epoch's positions to ranks and DataLoader
workers, ``set_epoch``, ``__len__``, and the resume state (see :mod:`lading.datasets.order`)."""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from lading.core.errors import UsageError
from lading.datasets.order import Deal, check_remainder, check_slot, worker_batches
from lading.datasets.slots import distributed_slot, iterable_class, rebuild


class EpochPlan(Protocol):
    """One epoch of a dataset, for one process: samples by position."""

    def begin(self, position: int) -> None:
        """Iteration starts at ``position`` (prefetch from there)."""

    def fetch(self, position: int) -> Any:
        """The (decoded, transformed) sample at ``position``."""


class ElasticIterable:
    """Base of the iterable datasets: subclasses give ``_total()``, ``_plan(epoch)``,
    ``_identity()`` (what a resume state must match) and ``STATE_FORMAT``."""

    STATE_FORMAT = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__new__(iterable_class(cls))

    def __reduce__(self) -> tuple[Any, ...]:
        base = next(klass for klass in type(self).__mro__ if "STATE_FORMAT" in klass.__dict__)
        state = {name: value for name, value in self.__dict__.items() if name != "_local"}
        return (rebuild, (base, state))  # per-process readers (threads, open shards) stay behind

    def _setup(self, rank: int | None, world_size: int | None, batch_size: int | None, remainder: str) -> None:
        default_rank, default_world = distributed_slot()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world if world_size is None else world_size
        check_slot(self.rank, self.world_size)
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size={batch_size} must be positive")
        self.batch_size = batch_size
        self.remainder = check_remainder(remainder)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, positions consumed before this run)

    # -- hooks -----------------------------------------------------------------------------------

    def _total(self) -> int:
        raise NotImplementedError

    def _plan(self, epoch: int) -> EpochPlan:
        raise NotImplementedError

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    # -- epochs and dealing ----------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate (another reproducible order per epoch). Call it before
        creating the DataLoader iterator: workers copy the dataset when they start."""
        self.epoch = epoch

    def _start(self, epoch: int) -> int:
        if self._resume is not None and self._resume[0] == epoch:
            return self._resume[1]
        return 0

    def deal(self, epoch: int | None = None) -> Deal:
        """This rank's share of the epoch (``count`` samples, ``position(i)``)."""
        epoch = self.epoch if epoch is None else epoch
        return Deal(self._total(), self._start(epoch), self.world_size, self.rank, self.remainder)

    def __len__(self) -> int:
        """Samples this rank yields in the current epoch (from the resume point, after a resume)."""
        return self.deal().count

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """What DataLoader worker ``worker`` of ``num_workers`` yields: the rank's batches
        ``worker``, ``worker + num_workers``, ... (each ``batch_size`` samples)."""
        deal = self.deal()
        plan = self._plan(self.epoch)
        batches = worker_batches(deal.count, self.batch_size or 1, worker, num_workers)
        position = deal.position
        fetch = plan.fetch
        for number, batch in enumerate(batches):
            if number == 0:
                plan.begin(position(batch.start))
            for local in batch:
                yield fetch(position(local))

    def __iter__(self) -> Iterator[Any]:
        from lading import (
            datasets as package,  # looked up there, so a test can stand in a slot
        )

        cell = self.__dict__.get("_epoch_cell")
        if cell is not None:  # lading.datasets.DataLoader with persistent workers: the epoch it set
            self.epoch = int(cell.value)
        worker, num_workers = package._worker_slot()
        return self.iter_worker(worker, num_workers)

    # -- resume ----------------------------------------------------------------------------------

    def state_dict(self, samples_seen: int) -> dict[str, Any]:
        """A small JSON-able state: save it with the checkpoint, on any rank (they agree).

        ``samples_seen`` is how many samples this rank's training loop has consumed in the current
        epoch *in this run* (since iteration started, or since the resume point after a resume).
        """
        deal = self.deal()
        if not 0 <= samples_seen <= deal.count:
            raise UsageError(f"samples_seen={samples_seen}: this rank has {deal.count} samples in epoch {self.epoch}")
        consumed = min(deal.total, deal.start + samples_seen * self.world_size)
        return {"format": self.STATE_FORMAT, "epoch": self.epoch, "consumed": consumed, "total": deal.total,
                **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch where it stopped, with this dataset's world size, workers and
        batch size: every position of the epoch not consumed before is delivered once."""
        if not isinstance(state, dict) or state.get("format") != self.STATE_FORMAT:
            raise UsageError(f"not a {type(self).__name__} state (format {self.STATE_FORMAT!r} expected)")
        mine = self._identity()
        differing = sorted(key for key, value in mine.items() if state.get(key) != value)
        if state.get("total") != self._total():
            differing.append("total")
        if differing:
            shown = ", ".join(f"{key}: saved {state.get(key)!r}, now {mine.get(key, self._total())!r}"
                              for key in differing)
            raise UsageError(f"the saved state is for another dataset or order ({shown})",
                             "resume with the same index, seed and shuffle settings as the saved run")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if not 0 <= consumed <= self._total():
            raise UsageError(f"the saved state's consumed={consumed} is outside 0..{self._total()}")
        self.epoch = epoch
        self._resume = (epoch, consumed)
