"""GCS resumable uploads that really resume: after a transient failure, ask the session how
many bytes it committed and continue from there, instead of starting over.

The protocol (https://cloud.google.com/storage/docs/performing-resumable-uploads): a session
URL from ``Blob.create_resumable_upload_session``; each chunk is a ``PUT`` with
``Content-Range: bytes FIRST-LAST/TOTAL`` answered by ``308`` and ``Range: bytes=0-N`` (committed
so far) until the last one, answered by 200/201. ``Content-Range: bytes */TOTAL`` with no body
asks for the committed size. The final chunk carries ``X-Goog-Hash: crc32c=...`` of the whole
file, so GCS refuses to finalise a corrupted upload.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Protocol

from lading.core.checksums import crc32c_of_file
from lading.stores.base import ProgressCallback


class UploadTarget(Protocol):
    """What an upload needs of the GCS store (implemented by ``GCSStore``)."""

    root: str
    chunk_size: int

    def _where(self, key: str) -> str: ...

    def _gcs_call(self, where: str, operation: Callable[[Any], Any]) -> Any: ...

    def _timeout(self) -> Any: ...


class ResumableUpload:
    """One upload of ``src`` to ``key``; :meth:`run` drives it through the store's retries."""

    def __init__(self, store: UploadTarget, src: Path, key: str, size: int, progress: ProgressCallback | None) -> None:
        self.store, self.src, self.key, self.size, self.progress = store, src, key, size, progress
        self.where = store._where(key)
        self.session_url: str | None = None
        self.committed: int | None = 0  # None: unknown after a failure, ask the session
        self.reported = 0  # bytes passed to ``progress``: only ever committed ones
        self.done = False

    def run(self) -> None:
        """Create the session, then send chunks until GCS reports the object complete."""
        crc = crc32c_of_file(self.src)
        self.session_url = self.store._gcs_call(
            self.where,
            lambda bucket: bucket.blob(self.store.root + self.key).create_resumable_upload_session(
                size=self.size, checksum=None, retry=None, timeout=self.store._timeout()
            ),
        )
        while not self.done:
            self.store._gcs_call(self.where, lambda bucket: self._step(bucket, crc))

    def _step(self, bucket: Any, crc: str) -> None:
        session = bucket.client._http
        try:
            if self.committed is None:
                self._advance(self._put(session, b"", f"bytes */{self.size}", {}))
                if self.done:
                    return
            start = self.committed or 0
            with open(self.src, "rb") as handle:
                data = os.pread(handle.fileno(), self.store.chunk_size, start)
            last = start + len(data) >= self.size
            headers = {"X-Goog-Hash": f"crc32c={crc}"} if last else {}
            self.committed = None  # unknown until the server answers
            self._advance(self._put(session, data, f"bytes {start}-{start + len(data) - 1}/{self.size}", headers))
        except BaseException:
            self.committed = None
            raise

    def _put(self, session: Any, data: bytes, content_range: str, headers: dict[str, str]) -> Any:
        assert self.session_url is not None
        response = session.put(
            self.session_url,
            data=data,
            timeout=self.store._timeout(),
            headers={"Content-Range": content_range, **headers},
        )
        if response.status_code >= 400:
            from google.api_core.exceptions import from_http_response

            raise from_http_response(response)
        return response

    def _advance(self, response: Any) -> None:
        """Record what the session committed, report newly committed bytes, notice completion."""
        if response.status_code in (200, 201):
            committed = self.size
            self.done = True
        else:  # 308: "Range: bytes=0-N", absent when nothing is committed yet
            span = response.headers.get("Range", "")
            committed = int(span.rsplit("-", 1)[1]) + 1 if "-" in span else 0
        if self.progress is not None and committed > self.reported:
            self.progress(committed - self.reported)
        self.reported = max(self.reported, committed)
        self.committed = committed
