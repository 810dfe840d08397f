"""StoreDataset (map-style over a store prefix): indexing, transforms, pickling, prefetch, DataLoader."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from lading.core.errors import NotFound
from lading.datasets import StoreDataset


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    objects = {f"{group}/{i:02d}.bin": f"{group}-{i}".encode() * (i + 1) for group in "ab" for i in range(9)}
    objects["empty.bin"] = b""
    objects["notes.txt"] = b"not a sample"
    for key, data in objects.items():
        path = tmp_path / "data" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tmp_path / "data", objects


def test_objects_in_key_order(folder):
    root, objects = folder
    dataset = StoreDataset(str(root))
    assert len(dataset) == len(objects)
    assert [dataset.key(i) for i in range(len(dataset))] == sorted(objects)
    assert [dataset[i] for i in range(len(dataset))] == [objects[k] for k in sorted(objects)]
    assert dataset[-1] == objects[sorted(objects)[-1]]
    with pytest.raises(IndexError):
        dataset[len(objects)]


def test_suffix_filter_and_transform(folder):
    root, objects = folder
    dataset = StoreDataset(str(root), suffixes=[".bin"], transform=lambda data, key: (key, len(data)))
    assert len(dataset) == len(objects) - 1
    assert dataset[0] == ("a/00.bin", len(objects["a/00.bin"]))


def test_random_access_after_sequential_access(folder):
    root, objects = folder
    dataset = StoreDataset(str(root), prefetch=3)
    keys = sorted(objects)
    assert [dataset[i] for i in (0, 1, 2, 15, 3, 4, 0)] == [objects[keys[i]] for i in (0, 1, 2, 15, 3, 4, 0)]


def test_vanished_object_is_not_found(folder):
    root, objects = folder
    dataset = StoreDataset(str(root), prefetch=0)
    (root / "a" / "03.bin").unlink()
    with pytest.raises(NotFound):
        dataset[sorted(objects).index("a/03.bin")]


def test_pickle_drops_threads_and_connection(folder):
    root, objects = folder
    dataset = StoreDataset(str(root), prefetch=2)
    dataset[0], dataset[1]  # starts the prefetch pool
    clone = pickle.loads(pickle.dumps(dataset))
    assert dataset._local.built and not clone._local.built  # pool, store and prefetched data stay behind
    assert [clone[i] for i in range(len(clone))] == [objects[k] for k in sorted(objects)]


def test_missing_prefix_is_not_found(tmp_path):
    with pytest.raises(NotFound):
        StoreDataset(str(tmp_path / "missing"))


def test_an_empty_prefix_is_not_found_as_the_cli_says(s3_env, lading, folder, tmp_path):
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="empty-prefix")
    assert lading("sync", "s3://empty-prefix/train", str(tmp_path / "out")).returncode == NotFound.exit_code
    with pytest.raises(NotFound, match="nothing at s3://empty-prefix/train"):
        StoreDataset("s3://empty-prefix/train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFound, match="nothing at"):
        StoreDataset(str(tmp_path / "empty"))
    with pytest.raises(NotFound, match=r"no objects ending in \.jpg"):
        StoreDataset(str(folder[0]), suffixes=[".jpg"])


def test_dataloader_map_style_with_workers(folder):
    torch_data = pytest.importorskip("torch.utils.data")
    root, objects = folder
    dataset = StoreDataset(str(root), prefetch=2)
    loader = torch_data.DataLoader(dataset, batch_size=3, num_workers=2, collate_fn=list)
    assert [item for batch in loader for item in batch] == [objects[k] for k in sorted(objects)]


def test_batches_are_fetched_together(folder):
    root, objects = folder
    keys = sorted(objects)
    dataset = StoreDataset(str(root), prefetch=4, transform=lambda data, key: (key, data))
    assert dataset.__getitems__([3, 0, -1, 7]) == [(keys[i], objects[keys[i]]) for i in (3, 0, -1, 7)]
    with pytest.raises(IndexError):
        dataset.__getitems__([0, 99])
