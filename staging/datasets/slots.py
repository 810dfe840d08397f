"""Where this process sits: its rank in torch.distributed and its DataLoader worker slot.

torch is consulted only when something already imported it (a DataLoader worker has), so
``import lading.datasets`` never imports torch.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from typing import Any

_TORCH_BASES: list[tuple[type, ...]] = []


def worker_slot() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker running this code, else (0, 1)."""
    if sys.modules.get("torch") is None:  # not imported (a DataLoader worker has it)
        return 0, 1
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def distributed_slot() -> tuple[int, int]:
    """``(rank, world size)`` from an initialised torch.distributed process group, else (0, 1)."""
    if sys.modules.get("torch") is None:  # not imported (a DataLoader worker has it)
        return 0, 1
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def torch_bases(kind: str) -> tuple[type, ...]:
    """``(torch.utils.data.IterableDataset,)`` or ``(Dataset,)`` when torch is installed, else ().

    DataLoader checks ``isinstance(dataset, IterableDataset)`` to decide how to iterate, so the
    iterable datasets are built as subclasses of it when torch is there (see ``__new__`` in
    :mod:`lading.datasets.shards`). torch is imported only when a dataset is created.
    """
    if not _TORCH_BASES:
        if importlib.util.find_spec("torch") is None:  # not installed (or blocked in sys.modules)
            _TORCH_BASES.append(())
            _TORCH_BASES.append(())
        else:
            with warnings.catch_warnings():  # torch warns at import when numpy is missing; we don't use it
                warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
                from torch.utils.data import Dataset, IterableDataset
            _TORCH_BASES.append((IterableDataset,))
            _TORCH_BASES.append((Dataset,))
    return _TORCH_BASES[0] if kind == "iterable" else _TORCH_BASES[1]


def split(total: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, end)`` of part ``index`` when ``total`` items are cut into ``parts`` near-equal runs."""
    return total * index // parts, total * (index + 1) // parts


_SUBCLASSES: dict[type, type] = {}


def iterable_class(cls: type) -> type:
    """``cls``, or (torch installed) a subclass that is also torch's IterableDataset, so that
    DataLoader iterates it. Used by the iterable datasets' ``__new__``."""
    found = _SUBCLASSES.get(cls)
    if found is None:
        bases = torch_bases("iterable")
        found = (
            cls
            if not bases
            else type(cls.__name__, (cls, *bases), {"__doc__": cls.__doc__, "__module__": cls.__module__})
        )
        _SUBCLASSES[cls] = found
    return found


def rebuild(cls: Any, state: dict) -> object:
    """Unpickle an iterable dataset (pickled by its plain class, rebuilt as :func:`iterable_class`)."""
    dataset = cls.__new__(cls)
    dataset.__dict__.update(state)
    return dataset
