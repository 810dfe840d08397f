"""lading.datasets.DataLoader through real forked workers: set_epoch reaches persistent workers,
state_dict()/load_state_dict() count delivered samples themselves and resume exactly with another
worker count, and the settings that would make a resume silently wrong are refused."""

from __future__ import annotations

from collections import Counter

import pytest
from lading.core.errors import UsageError
from lading.datasets import ShardDataset
from lading.pack import PackOptions, plan_pack, run_pack

pytest.importorskip("torch.utils.data")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NSAMPLES = 60
BATCH = 4


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("loader")
    source = root / "src"
    source.mkdir()
    for i in range(NSAMPLES):
        (source / f"k{i:03d}.bin").write_bytes(bytes([i]) * (40 + i))
    plan = plan_pack(str(source), str(root / "out"), PackOptions("ds", shard_size=3_000))
    run_pack(plan, str(source), str(root / "out"))
    return str(root / "out" / "ds.index.json")


def keys_of(batch):
    return [sample["__key__"] for sample in batch]


def dataset(index: str, **options) -> ShardDataset:
    return ShardDataset(index, rank=0, world_size=1, shuffle_buffer=16, seed=5, **options)


def loader(data, workers: int = 2, **options):
    from lading.datasets import DataLoader

    return DataLoader(data, batch_size=BATCH, num_workers=workers, collate_fn=keys_of,
                      multiprocessing_context="fork", **options)


def epoch_keys(index: str, epoch: int) -> list[str]:
    data = dataset(index)
    data.set_epoch(epoch)
    return [key for batch in loader(data) for key in batch]


def test_set_epoch_reaches_persistent_workers(index):
    wanted = [epoch_keys(index, epoch) for epoch in (0, 1, 2)]
    assert wanted[0] != wanted[1] != wanted[2]
    persistent = loader(dataset(index), persistent_workers=True)
    got = []
    for epoch in range(3):
        persistent.set_epoch(epoch)
        got.append([key for batch in persistent for key in batch])
    assert got == wanted


def test_set_epoch_on_the_dataset_also_reaches_persistent_workers(index):
    data = dataset(index)
    persistent = loader(data, persistent_workers=True)
    first = [key for batch in persistent for key in batch]
    data.set_epoch(1)
    second = [key for batch in persistent for key in batch]
    assert first == epoch_keys(index, 0) and second == epoch_keys(index, 1)


def test_state_dict_counts_delivered_samples_and_resumes_exactly(index):
    first = loader(dataset(index), workers=2, prefetch_factor=4)
    seen: list[str] = []
    for number, batch in enumerate(first):
        seen.extend(batch)
        if number == 6:
            state = first.state_dict()  # workers have run ahead; only the 7 batches count
            break
    assert first.delivered == 7 * BATCH
    resumed = loader(dataset(index), workers=3)
    resumed.load_state_dict(state)
    rest = [key for batch in resumed for key in batch]
    assert Counter(seen + rest) == Counter(f"k{i:03d}" for i in range(NSAMPLES))


def test_a_dataset_without_batch_size_takes_the_loaders(index):
    data = dataset(index)
    loader(data)
    assert data.batch_size == BATCH


def test_a_different_dataset_batch_size_is_refused(index):
    with pytest.raises(UsageError, match="batch_size=3 differs"):
        loader(dataset(index, batch_size=3))


def test_in_order_false_is_refused(index):
    with pytest.raises(UsageError, match="in_order=False"):
        loader(dataset(index), in_order=False)


def test_a_batch_it_cannot_count_needs_samples_in(index):
    from lading.datasets import DataLoader

    counted = DataLoader(dataset(index), batch_size=BATCH, collate_fn=lambda batch: object())
    with pytest.raises(UsageError, match="cannot tell how many samples"):
        next(iter(counted))
    explicit = DataLoader(dataset(index), batch_size=BATCH, collate_fn=lambda batch: object(),
                          samples_in=lambda batch: BATCH)
    for number, _batch in enumerate(explicit):
        if number == 2:
            break
    assert explicit.delivered == 3 * BATCH
