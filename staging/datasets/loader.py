"""``lading.datasets.DataLoader``: torch's DataLoader, with what users of resumable datasets get wrong.

- ``set_epoch`` reaches persistent workers: the epoch lives in a shared cell that workers read
  whenever an iteration starts (a worker's copy of the dataset otherwise keeps the epoch it was
  started with).
- ``state_dict()`` / ``load_state_dict()`` count the samples behind the batches the loop was
  handed (never what workers prefetched), so a checkpoint resumes exactly without the caller
  counting. A batch is never looked into: ``(images, labels)``, dicts, tensors or any object a
  ``collate_fn`` returns count the same. An iterable dataset's rank yields ``len(dataset)``
  samples in batches of ``batch_size`` (the last one short), so ``k`` batches are
  ``min(k * batch_size, len(dataset))`` samples; a map-style dataset's batches are as long as
  the index lists its (batch) sampler drew, recorded as the loader draws them. Without a
  ``batch_size`` (``batch_size=None``) every item is one sample.
- A dataset ``batch_size`` that differs from the loader's, or ``in_order=False``, would make a
  resume silently wrong: both are refused. A dataset without one takes the loader's.

Importing this module imports torch; ``lading.datasets`` exposes the class lazily.
"""

from __future__ import annotations

import collections
import multiprocessing
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, Sized, cast

import torch.utils.data as tud

from lading.core.errors import UsageError


class DataLoader(tud.DataLoader):
    """torch's DataLoader plus ``set_epoch``, ``state_dict`` and ``load_state_dict`` (see the module
    docstring)."""

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        self._drawn: collections.deque[int] = collections.deque()  # sizes of batches drawn, not yet handed over
        super().__init__(dataset, *args, **kwargs)
        self._batches = 0
        self._samples = 0
        self._counted_epoch: int | None = None
        self._resumable = _resumable_of(self)
        _check_order(self, kwargs)
        self._epoch_cell = _share_epoch(self)

    @property
    def _index_sampler(self) -> Any:
        """torch's index sampler, recording the size of each batch it draws (map-style datasets)."""
        sampler = super()._index_sampler
        if isinstance(self.dataset, tud.IterableDataset):
            return sampler  # no indices: batches are counted by batch_size (see delivered)
        return _Recorded(sampler, self._drawn, self._auto_collation)

    # -- epochs ----------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch for the next iteration, in this process and in persistent workers."""
        for target in (self.dataset, self.sampler, getattr(self.batch_sampler, "sampler", None)):
            setter = getattr(target, "set_epoch", None)
            if setter is not None:
                setter(epoch)
        if self._epoch_cell is not None:
            self._epoch_cell.value = epoch

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._epoch_cell is not None:
            self._epoch_cell.value = cast(Any, self.dataset).epoch  # a set_epoch called on the dataset itself
        self._batches = self._samples = 0
        self._counted_epoch = self._epoch()
        iterable = isinstance(self.dataset, tud.IterableDataset)
        for batch in super().__iter__():
            self._batches += 1
            if not iterable:
                self._samples += self._drawn.popleft()
            yield batch

    def _epoch(self) -> int | None:
        return getattr(self._resumable, "epoch", None)

    # -- resume ----------------------------------------------------------------------------------

    @property
    def delivered(self) -> int:
        """Samples handed to the loop in the current epoch's iteration (since the resume point,
        after a resume); 0 once another epoch is selected."""
        if self._counted_epoch is None or self._epoch() != self._counted_epoch:
            return 0
        if not isinstance(self.dataset, tud.IterableDataset):
            return self._samples
        if self.batch_size is None:
            return self._batches
        try:
            length = len(cast(Sized, self.dataset))
        except TypeError:  # no length (shards without an index): no resume state either
            return self._batches * self.batch_size
        return min(self._batches * self.batch_size, length)

    def state_dict(self) -> dict[str, Any]:
        """The resumable dataset's (or sampler's) state after the samples delivered so far."""
        if self._resumable is None:
            raise UsageError(
                "neither the dataset nor the sampler can save a resume state",
                "use ShardDataset, MixedDataset, or PackedDataset with NodeLocalSampler",
            )
        return {"lading_loader": 1, "state": self._resumable.state_dict(samples_seen=self.delivered)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` (any world size, worker count)."""
        if self._resumable is None or not isinstance(state, Mapping) or "lading_loader" not in state:
            raise UsageError("not a lading DataLoader state", "pass what DataLoader.state_dict() returned")
        self._resumable.load_state_dict(state["state"])
        if self._epoch_cell is not None:
            self._epoch_cell.value = cast(Any, self.dataset).epoch
        self._batches = self._samples = 0
        self._counted_epoch = None


class _Recorded:
    """An index sampler whose drawn batch sizes go to ``drawn`` (one per index when not batching)."""

    def __init__(self, sampler: Iterable[Any], drawn: collections.deque[int], batching: bool) -> None:
        self.sampler, self.drawn, self.batching = sampler, drawn, batching

    def __iter__(self) -> Iterator[Any]:
        self.drawn.clear()  # a new iteration: what an abandoned one drew is never handed over
        for item in self.sampler:
            self.drawn.append(len(item) if self.batching else 1)
            yield item

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


def _resumable_of(loader: tud.DataLoader) -> Any:
    for candidate in (loader.dataset, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if (
            hasattr(candidate, "state_dict")
            and hasattr(candidate, "load_state_dict")
            and hasattr(candidate, "set_epoch")
        ):
            return candidate
    return None


def _check_order(loader: tud.DataLoader, kwargs: Mapping[str, Any]) -> None:
    """Refuse what would make a resume silently wrong; give the dataset the loader's batch size."""
    dataset: Any = loader.dataset
    if kwargs.get("in_order", True) is False and _resumable_of(loader) is not None:
        raise UsageError(
            "in_order=False delivers batches out of order, so a resume state cannot say which samples were consumed",
            "leave in_order at True",
        )
    if not hasattr(dataset, "iter_worker"):
        return  # map-style: the sampler's order is the loader's
    ours = getattr(dataset, "batch_size", None)
    if ours is None:
        dataset.batch_size = loader.batch_size
    elif ours != loader.batch_size:
        raise UsageError(
            f"the dataset's batch_size={ours} differs from the DataLoader's batch_size="
            f"{loader.batch_size}: workers would hand out batches a resume cannot account for",
            "pass the same batch_size to both (or none to the dataset)",
        )


def _share_epoch(loader: tud.DataLoader) -> Any:
    """A shared epoch cell for persistent workers of an iterable dataset (None when not needed)."""
    dataset: Any = loader.dataset
    if not (
        loader.persistent_workers
        and loader.num_workers > 0
        and hasattr(dataset, "epoch")
        and hasattr(dataset, "iter_worker")
    ):
        return None
    context = loader.multiprocessing_context or multiprocessing.get_context()
    cell = context.Value("q", int(dataset.epoch), lock=False)
    dataset._epoch_cell = cell  # workers read it when an iteration starts (ElasticIterable.__iter__)
    return cell


__all__ = ["DataLoader"]
