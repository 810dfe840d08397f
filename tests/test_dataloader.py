"""lading.datasets.DataLoader through real forked workers: set_epoch reaches persistent workers,
state_dict()/load_state_dict() count delivered samples themselves (samples, never the fields of a
collated batch) and resume exactly with another worker count, and the settings that would make a
resume silently wrong are refused."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
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

    return DataLoader(
        data, batch_size=BATCH, num_workers=workers, collate_fn=keys_of, multiprocessing_context="fork", **options
    )


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


def test_in_order_false_is_refused_for_a_resumable_sampler_too(index):
    from lading.datasets import DataLoader, NodeLocalSampler, PackedDataset

    packed = PackedDataset(index)
    sampler = NodeLocalSampler(packed, rank=0, world_size=1)
    with pytest.raises(UsageError, match="in_order=False"):
        DataLoader(packed, batch_size=BATCH, sampler=sampler, num_workers=2, in_order=False)


def number_of(sample) -> int:
    return int(sample["__key__"][1:])


def to_pair(sample):
    """The README's transform: a sample -> (image tensor, label); the label is the sample's number."""
    return torch.tensor(list(sample["bin"][:3]), dtype=torch.float32), number_of(sample)


def labels_of(batch) -> list[int]:
    """The sample numbers in a default-collated batch of (images, labels)."""
    return batch[1].tolist()


def pair_loader(data, workers: int = 2, **options):
    from lading.datasets import DataLoader

    return DataLoader(data, batch_size=BATCH, num_workers=workers, multiprocessing_context="fork", **options)


def ddp_ranks(
    index: str, world: int, state=None, epochs: int = 1, stop_after: int | None = None, workers: int = 2
) -> tuple[list[int], dict | None]:
    """The README's preemptible DDP loop, each rank in turn (persistent workers, (images, labels)
    batches, a checkpoint every 2 steps): the labels every rank was handed, and the last checkpoint."""
    seen: list[int] = []
    checkpoint = None
    for rank in range(world):
        train = ShardDataset(index, rank=rank, world_size=world, shuffle_buffer=16, seed=5, transform=to_pair)
        loader = pair_loader(train, workers, persistent_workers=True)
        if state is not None:
            loader.load_state_dict(state)
        for epoch in range(train.epoch, epochs):
            loader.set_epoch(epoch)
            for step, (images, labels) in enumerate(loader, start=1):
                assert images.shape == (len(labels), 3)
                seen += labels.tolist()
                if step % 2 == 0 and rank == 0:
                    checkpoint = loader.state_dict()
                if step == stop_after:
                    break
    return seen, checkpoint


def test_readme_ddp_loop_with_image_label_batches_resumes_exactly(index):
    before, checkpoint = ddp_ranks(index, 2, stop_after=4)  # preempted after 4 steps, saved at step 4
    assert len(before) == 2 * 4 * BATCH
    after, _ = ddp_ranks(index, 2, state=checkpoint, workers=3)
    assert Counter(before + after) == Counter(range(NSAMPLES))


def test_after_two_full_epochs_the_checkpoint_counts_every_sample(index):
    seen, checkpoint = ddp_ranks(index, 2, epochs=2)  # 30 samples a rank: the last save is after all of them
    assert Counter(seen) == Counter({number: 2 for number in range(NSAMPLES)})
    train = ShardDataset(index, rank=0, world_size=2, shuffle_buffer=16, seed=5, transform=to_pair)
    resumed = pair_loader(train)
    resumed.load_state_dict(checkpoint)
    assert train.epoch == 1 and len(train) == 0 and list(resumed) == []


def test_two_workers_without_a_dataset_batch_size_resume_exactly(index):
    train = ShardDataset(index, rank=0, world_size=1, shuffle_buffer=16, seed=5, transform=to_pair)
    assert train.batch_size is None
    first = pair_loader(train, workers=2, prefetch_factor=4)
    seen: list[int] = []
    for step, batch in enumerate(first, start=1):
        seen += labels_of(batch)
        if step == 5:
            state = first.state_dict()
            break
    assert first.delivered == 5 * BATCH
    resumed = pair_loader(
        ShardDataset(index, rank=0, world_size=1, shuffle_buffer=16, seed=5, transform=to_pair), workers=3
    )
    resumed.load_state_dict(state)
    rest = [label for batch in resumed for label in labels_of(batch)]
    assert Counter(seen + rest) == Counter(range(NSAMPLES))


def test_without_a_batch_size_each_item_is_one_sample(index):
    from lading.datasets import DataLoader

    train = ShardDataset(index, rank=0, world_size=1, shuffle_buffer=16, seed=5, transform=to_pair)
    first = DataLoader(train, batch_size=None, num_workers=2, multiprocessing_context="fork")
    seen = []
    for step, (image, label) in enumerate(first, start=1):  # one (image, label) pair per item
        seen.append(int(label))
        if step == 7:
            state = first.state_dict()
            break
    assert first.delivered == 7
    resumed = DataLoader(
        ShardDataset(index, rank=0, world_size=1, shuffle_buffer=16, seed=5, transform=to_pair),
        batch_size=None,
        num_workers=3,
        multiprocessing_context="fork",
    )
    resumed.load_state_dict(state)
    assert Counter(seen + [int(label) for _image, label in resumed]) == Counter(range(NSAMPLES))


def test_a_dataset_batch_size_under_an_unbatched_loader_is_refused(index):
    from lading.datasets import DataLoader

    with pytest.raises(UsageError, match="batch_size=4 differs from the DataLoader's batch_size=None"):
        DataLoader(dataset(index, batch_size=BATCH), batch_size=None, num_workers=2)


def as_dict(batch):
    """A collate_fn returning a nested dict: the labels inside a tuple, then the images."""
    return {
        "meta": ([number_of(sample) for sample in batch], "extra"),
        "images": torch.stack([to_pair(sample)[0] for sample in batch]),
    }


class Opaque:
    """What a collate_fn may return: nothing the loader could measure."""

    def __init__(self, batch):
        self.numbers = [number_of(sample) for sample in batch]


@pytest.mark.parametrize("collate", [as_dict, Opaque], ids=["nested-dict", "opaque"])
def test_any_batch_structure_counts_its_samples(index, collate):
    from lading.datasets import DataLoader

    counted = DataLoader(
        dataset(index), batch_size=7, num_workers=2, collate_fn=collate, multiprocessing_context="fork"
    )
    assert len(list(counted)) == 9 and counted.delivered == NSAMPLES  # 8 batches of 7, one of 4
    for step, _batch in enumerate(counted, start=1):
        if step == 3:
            break
    assert counted.delivered == 3 * 7


def test_a_new_epoch_starts_the_count_again(index):
    counted = loader(dataset(index))
    for _batch in counted:
        pass
    assert counted.delivered == NSAMPLES
    counted.set_epoch(1)
    assert counted.delivered == 0 and counted.state_dict()["state"]["epoch"] == 1


def test_map_style_batches_of_any_size_resume_exactly(index):
    from lading.datasets import DataLoader, NodeLocalSampler, PackedDataset
    from torch.utils.data import Sampler

    class Varying(Sampler):
        """Batches of 1, 2, 3, 1, 2, 3, ... indices."""

        def __init__(self, sampler):
            self.sampler = sampler

        def __iter__(self):
            batch, want = [], 1
            for position in self.sampler:
                batch.append(position)
                if len(batch) == want:
                    yield batch
                    batch, want = [], want % 3 + 1
            if batch:
                yield batch

    packed = PackedDataset(index, transform=to_pair)
    sampler = NodeLocalSampler(packed, rank=0, world_size=1, shuffle_buffer=16, seed=5)
    first = DataLoader(packed, batch_sampler=Varying(sampler), num_workers=2, multiprocessing_context="fork")
    seen: list[int] = []
    for step, batch in enumerate(first, start=1):
        seen += labels_of(batch)
        if step == 5:  # 1 + 2 + 3 + 1 + 2
            state = first.state_dict()
            break
    assert first.delivered == 9
    resumed_sampler = NodeLocalSampler(packed, rank=0, world_size=1, shuffle_buffer=16, seed=5)
    resumed = DataLoader(packed, batch_sampler=Varying(resumed_sampler), num_workers=3, multiprocessing_context="fork")
    resumed.load_state_dict(state)
    rest = [label for batch in resumed for label in labels_of(batch)]
    assert Counter(seen + rest) == Counter(range(NSAMPLES))
