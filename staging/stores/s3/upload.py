"""S3 multipart uploads: parts uploaded in parallel, each retried on its own, aborted on failure."""

from __future__ import annotations

import base64
import hashlib
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Protocol

from lading.stores.base import ProgressCallback


class UploadTarget(Protocol):
    """What an upload needs of the S3 store (implemented by ``S3Store``)."""

    bucket: str
    root: str
    part_size: int
    upload_workers: int

    def _where(self, key: str) -> str: ...

    def _boto_call(self, where: str, operation: Callable[[Any], Any]) -> Any: ...

    def _boto_attempt(self, where: str, operation: Callable[[Any], Any]) -> Any: ...


_MIN_PART = 5 << 20
_MAX_PARTS = 10_000


class MultipartUpload:
    """CreateMultipartUpload, parallel UploadPart (each retried), Complete; Abort on failure."""

    def __init__(self, store: UploadTarget, src: Path, key: str, size: int, progress: ProgressCallback | None) -> None:
        self.store, self.src, self.key, self.size, self.progress = store, src, key, size, progress
        self.part_size = max(store.part_size, _MIN_PART, math.ceil(size / _MAX_PARTS))
        self.where = store._where(key)
        self.full_key = store.root + key

    def run(self) -> None:
        """Upload every part and complete the upload; abort it if anything fails."""
        store = self.store
        created = store._boto_call(
            self.where, lambda client: client.create_multipart_upload(Bucket=store.bucket, Key=self.full_key)
        )
        upload_id = created["UploadId"]
        try:
            count = math.ceil(self.size / self.part_size)
            with ThreadPoolExecutor(max_workers=max(1, min(store.upload_workers, count))) as pool:
                etags = list(pool.map(lambda n: self._part(upload_id, n), range(1, count + 1)))
            parts = [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)]
            store._boto_call(
                self.where,
                lambda client: client.complete_multipart_upload(
                    Bucket=store.bucket, Key=self.full_key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            self._abort(upload_id)
            raise

    def _part(self, upload_id: str, number: int) -> str:
        offset = (number - 1) * self.part_size
        with open(self.src, "rb") as handle:
            data = os.pread(handle.fileno(), self.part_size, offset)
        digest = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
        response = self.store._boto_call(
            self.where,
            lambda client: client.upload_part(
                Bucket=self.store.bucket,
                Key=self.full_key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentMD5=digest,
            ),
        )
        if self.progress is not None:
            self.progress(len(data))
        return str(response["ETag"])

    def _abort(self, upload_id: str) -> None:
        try:
            self.store._boto_attempt(
                self.where,
                lambda client: client.abort_multipart_upload(
                    Bucket=self.store.bucket, Key=self.full_key, UploadId=upload_id
                ),
            )
        except Exception:  # best effort: the original error is the one to report
            pass
