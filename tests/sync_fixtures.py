"""Helpers for the sync tests: sample objects in moto, reading a DEST tree, counting object GETs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Mapping

from lading.stores.base import ObjectInfo

BUCKET = "sync-bucket"
PREFIX = "data"


def s3_client(env: Mapping[str, str], endpoint: str | None = None):
    """A boto3 client for setting up test data (the code under test never sees it)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint or env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def gcs_client(env: Mapping[str, str]):
    """A google-cloud-storage client of the suite's fake-gcs-server, for setting up test data."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": env["STORAGE_EMULATOR_HOST"]},
    )


def sample_objects(n: int = 24, seed: int = 0) -> dict[str, bytes]:
    """``n`` small objects in a few directories, with skewed sizes."""
    objects = {}
    for i in range(n):
        size = 3000 if i % 7 == 0 else 100 + (i * 37) % 400
        body = hashlib.sha256(f"{seed}-{i}".encode()).digest() * (size // 32 + 1)
        objects[f"d{i % 3}/sub/obj-{i:03d}.bin"] = body[:size]
    return objects


def put_objects(
    client, objects: Mapping[str, bytes], bucket: str = BUCKET, prefix: str = PREFIX, create: bool = True
) -> None:
    """Create ``bucket`` (if asked) and upload ``objects`` under ``prefix/``."""
    if create:
        client.create_bucket(Bucket=bucket)
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}" if prefix else key, Body=body)


def put_multipart(client, key: str, body: bytes, part_size: int = 5 << 20, bucket: str = BUCKET) -> str:
    """Upload ``body`` to ``key`` in parts of ``part_size`` (S3's smallest: 5 MiB); its ETag (no
    MD5: ``<hash>-<parts>``)."""
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(body), part_size), start=1):
        answer = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=body[start : start + part_size]
        )
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
    done = client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    return done["ETag"].strip('"')


def read_tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` except lading's state files, by relative POSIX path."""
    tree = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if rel.startswith(".lading-sync"):
                continue
            tree[rel] = path.read_bytes()
    return tree


def stray_temporaries(root: Path) -> list[str]:
    """Names under ``root`` that look like an unfinished write."""
    return [
        str(Path(d, n))
        for d, _, names in os.walk(root)
        for n in names
        if ".lading-part" in n or ".lading-link-" in n or n.endswith(".journal")
    ]


def object_gets(proxy) -> int:
    """GET requests for objects (listings carry a query string, object GETs don't)."""
    return proxy.count("GET", where=lambda seen: "list-type" not in seen.query and "location" not in seen.query)


class ListedStore:
    """A store whose listing is given: keys no filesystem can hold, or out of key order."""

    url = "mem://"

    def __init__(self, objects: list[ObjectInfo]) -> None:
        self.objects = objects

    def list(self, prefix: str = ""):
        yield from self.objects

    def list_pages(self, prefix: str = ""):
        yield from pages_of(self.objects)


def pages_of(infos, per_page: int = 3):
    """A test store's listing as Store.list_pages gives it: ObjectInfo's fields in order, in
    pages (small ones, so that checks across pages are exercised)."""
    rows = [(i.key, i.size, i.version, i.mtime, i.md5, i.crc32c) for i in infos]
    return (rows[start : start + per_page] for start in range(0, len(rows), per_page))
