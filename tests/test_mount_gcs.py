"""A GCS bucket (the emulator) through a real mount: listing, whole and ranged reads."""

from __future__ import annotations

import os
import random
from pathlib import Path

from lading.stores import StoreConfig, open_store
from test_mount_support import mounted


def test_gcs_bucket_reads_byte_identical(gcs_env, tmp_path: Path) -> None:
    endpoint = gcs_env["STORAGE_EMULATOR_HOST"]
    store = open_store("gs://mount-gcs", StoreConfig(gcs_anonymous=True, gcs_endpoint=endpoint))
    client = store._client.get()  # test set-up only: create the bucket
    if not client.bucket("mount-gcs").exists():
        client.create_bucket("mount-gcs")
    rng = random.Random(9)
    objects = {"a/one.bin": rng.randbytes(70_000), "a/b/two.bin": rng.randbytes(1_500_000), "top.txt": b"top\n"}
    for key, body in objects.items():
        src = tmp_path / "upload"
        src.write_bytes(body)
        store.upload(src, key)
    with mounted("gs://mount-gcs", tmp_path / "mnt", env=gcs_env) as mnt:
        assert sorted(os.listdir(mnt.path)) == ["a", "top.txt"]
        for key, body in objects.items():
            assert (mnt.path / key).read_bytes() == body
        fd = os.open(mnt.path / "a/b/two.bin", os.O_RDONLY)
        try:
            for offset in (0, 999_999, 1_400_000):
                assert os.pread(fd, 50_000, offset) == objects["a/b/two.bin"][offset : offset + 50_000]
        finally:
            os.close(fd)
