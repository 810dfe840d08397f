"""``lading.datasets.DataLoader``: torch's DataLoader, with what users of resumable datasets get wrong.

- ``set_epoch`` reaches persistent workers: the epoch lives in a shared cell that workers read
  whenever an iteration starts (a worker's copy of the dataset otherwise keeps the epoch it was
  started with).
- ``state_dict()`` / ``load_state_dict()`` count the samples the loop was handed (never what
  workers prefetched), so a checkpoint resumes exactly without the caller counting.
- A dataset ``batch_size`` that differs from the loader's, or ``in_order=False``, would make a
  resume silently wrong: both are refused. A dataset without one takes the loader's.

Importing this module imports torch; ``lading.datasets`` exposes the class lazily.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import torch.utils.data as tud

from lading.core.errors import UsageError

#: How many samples a batch holds when the loader cannot tell (see ``samples_in``).
SamplesIn = Callable[[Any], int]


class DataLoader(tud.DataLoader):
    """torch's DataLoader plus ``set_epoch``, ``state_dict`` and ``load_state_dict`` (see the module
    docstring). ``samples_in(batch)`` counts a batch's samples for a ``collate_fn`` whose batches
    are not a list, tuple, mapping of such, or tensor."""

    def __init__(self, dataset: Any, *args: Any, samples_in: SamplesIn | None = None, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        self._samples_in = samples_in
        self._delivered = 0
        self._resumable = _resumable_of(self)
        _check_order(self, kwargs)
        self._epoch_cell = _share_epoch(self)

    # -- epochs ----------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch for the next iteration, in this process and in persistent workers."""
        for target in (self.dataset, self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
        if self._epoch_cell is not None:
            self._epoch_cell.value = epoch

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._epoch_cell is not None:
            self._epoch_cell.value = self.dataset.epoch  # a set_epoch called on the dataset itself
        self._delivered = 0
        for batch in super().__iter__():
            self._delivered += self._count(batch)
            yield batch

    def _count(self, batch: Any) -> int:
        if self._samples_in is not None:
            return self._samples_in(batch)
        return _batch_length(batch, self.batch_size)

    # -- resume ----------------------------------------------------------------------------------

    @property
    def delivered(self) -> int:
        """Samples handed to the loop in the current iteration (since the resume point, after a resume)."""
        return self._delivered

    def state_dict(self) -> dict[str, Any]:
        """The resumable dataset's (or sampler's) state after the samples delivered so far."""
        if self._resumable is None:
            raise UsageError("neither the dataset nor the sampler can save a resume state",
                             "use ShardDataset, MixedDataset, or PackedDataset with NodeLocalSampler")
        return {"lading_loader": 1, "state": self._resumable.state_dict(samples_seen=self._delivered)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (any world size, worker count)."""
        if self._resumable is None or not isinstance(state, Mapping) or "lading_loader" not in state:
            raise UsageError("not a lading DataLoader state", "pass what DataLoader.state_dict() returned")
        self._resumable.load_state_dict(state["state"])
        if self._epoch_cell is not None:
            self._epoch_cell.value = self.dataset.epoch
        self._delivered = 0


def _resumable_of(loader: tud.DataLoader) -> Any:
    for candidate in (loader.dataset, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if hasattr(candidate, "state_dict") and hasattr(candidate, "load_state_dict") \
                and hasattr(candidate, "set_epoch"):
            return candidate
    return None


def _check_order(loader: tud.DataLoader, kwargs: Mapping[str, Any]) -> None:
    """Refuse what would make a resume silently wrong; give the dataset the loader's batch size."""
    dataset = loader.dataset
    if not hasattr(dataset, "iter_worker"):
        return  # map-style: the sampler's order is the loader's
    if kwargs.get("in_order", True) is False:
        raise UsageError("in_order=False delivers batches out of order, so a resume state cannot say which "
                         "samples were consumed", "leave in_order at True for lading's iterable datasets")
    ours = getattr(dataset, "batch_size", None)
    if ours is None:
        dataset.batch_size = loader.batch_size
    elif loader.batch_size is not None and ours != loader.batch_size:
        raise UsageError(f"the dataset's batch_size={ours} differs from the DataLoader's batch_size="
                         f"{loader.batch_size}: workers would hand out batches a resume cannot account for",
                         "pass the same batch_size to both (or none to the dataset)")


def _share_epoch(loader: tud.DataLoader) -> Any:
    """A shared epoch cell for persistent workers of an iterable dataset (None when not needed)."""
    dataset = loader.dataset
    if not (loader.persistent_workers and loader.num_workers > 0 and hasattr(dataset, "epoch")
            and hasattr(dataset, "iter_worker")):
        return None
    context = loader.multiprocessing_context or multiprocessing.get_context()
    cell = context.Value("q", int(dataset.epoch), lock=False)
    dataset._epoch_cell = cell  # workers read it when an iteration starts (ElasticIterable.__iter__)
    return cell


def _batch_length(batch: Any, batch_size: int | None) -> int:
    if isinstance(batch, Mapping) and batch:
        return _batch_length(next(iter(batch.values())), batch_size)
    if isinstance(batch, (list, tuple)):
        return len(batch)
    shape = getattr(batch, "shape", None)
    if shape:
        return int(shape[0])
    if batch_size is None:
        return 1
    raise UsageError(f"cannot tell how many samples a batch of type {type(batch).__name__} holds",
                     "pass samples_in=lambda batch: ... to the DataLoader")


__all__ = ["DataLoader"]
