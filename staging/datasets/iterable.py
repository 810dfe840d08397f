"""What the iterable datasets (ShardDataset, MixedDataset) share with torch: being an
``IterableDataset`` when torch is installed, pickling without per-process state, and finding
their DataLoader worker slot and epoch when iterated."""

from __future__ import annotations

from typing import Any, Iterator

from lading.datasets.slots import iterable_class, rebuild


class IterableBase:
    """Base of the iterable datasets: subclasses give ``iter_worker(worker, num_workers)``."""

    epoch: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__new__(iterable_class(cls))

    def __reduce__(self) -> tuple[Any, ...]:
        base = next(klass for klass in type(self).__mro__ if "iter_worker" in klass.__dict__)
        state = {name: value for name, value in self.__dict__.items() if name != "_local"}
        return (rebuild, (base, state))  # per-process readers (threads, open shards) stay behind

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate (another reproducible order per epoch). Call it before
        creating the DataLoader iterator: workers copy the dataset when they start."""
        self.epoch = epoch

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[Any]:
        """What DataLoader worker ``worker`` of ``num_workers`` yields."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        from lading import datasets as package  # looked up there, so a test can stand in a slot

        cell = self.__dict__.get("_epoch_cell")
        if cell is not None:  # lading.datasets.DataLoader with persistent workers: the epoch it set
            self.epoch = int(cell.value)
        worker, num_workers = package._worker_slot()
        return self.iter_worker(worker, num_workers)
