"""Publishing a pack: shards first, then the manifest, then the index, so a reader never finds
an index whose shards are missing. A pack that fails or is killed leaves no index behind.

- Local DEST: shards are written into a hidden staging directory next to their final place,
  renamed into place once all are complete, then the manifest and index are renamed in.
- Bucket DEST: shards are written to a local temporary directory and uploaded by a background
  thread while the next shard is being written (at most two waiting); the index goes last.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

from lading.core.checksums import crc32c_of_file
from lading.core.errors import LadingError, UsageError, local_error
from lading.core.locks import process_alive
from lading.pack.index import PublishedShard
from lading.pack.plan import PackPlan, ShardPlan
from lading.stores.base import ObjectInfo, Store


#: ``make_index(published shards, published documents) -> index bytes``: the index records the
#: stored version of each shard and of the documents published before it (the offsets file).
MakeIndex = Callable[[list[PublishedShard], list[PublishedShard]], bytes]


class Publisher(Protocol):
    """Where shards, manifest and index go."""

    def shard_path(self, shard: ShardPlan) -> Path:
        """A local file to write the shard into."""
        ...

    def commit_shard(self, shard: ShardPlan, path: Path) -> None:
        """The shard at ``path`` is complete: publish it (maybe in the background)."""
        ...

    def finish(self, documents: list[tuple[str, bytes]], make_index: MakeIndex) -> list[PublishedShard]:
        """Wait for every shard, then publish ``documents`` (key, bytes) in order and, last, the
        index that ``make_index(shards, documents as published)`` returns."""
        ...

    def abort(self) -> None:
        """Remove temporaries; never leaves an index."""
        ...


def _dest_error(err: OSError, where: Path) -> LadingError:
    """Creating DEST (or its staging directory) failed: exit 4 when denied or read-only, 6 when
    the disk is full, 2 when DEST is not a directory (:func:`local_error`)."""
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        return UsageError(f"DEST {where} is not a directory", "DEST is a directory or a bucket prefix")
    return local_error(err, f"write in {where}")


def _already_packed(where: str) -> UsageError:
    return UsageError(
        f"{where} already exists: a dataset with this name was packed there",
        "use a new --version or --name, or delete the old dataset first",
    )


class LocalPublisher:
    """Publishes into a local directory with renames (atomic on one filesystem). A pack that
    fails leaves nothing behind: its staging directory is removed, and so are the directories
    it created for DEST (when still empty)."""

    def __init__(self, root: Path, plan: PackPlan) -> None:
        self.plan = plan
        self.final_dir = root / plan.prefix if plan.prefix else root
        self._created: list[Path] = []  # the directories this pack made for DEST, deepest first
        try:  # the check too: a DEST under a directory we may not enter fails here (EACCES)
            if (self.final_dir / Path(plan.index_key).name).exists():
                raise _already_packed(str(self.final_dir / Path(plan.index_key).name))
            self._created = _missing_dirs(self.final_dir)
            self.final_dir.mkdir(parents=True, exist_ok=True)
            _remove_stale_staging(self.final_dir, plan.options.name)
            self.staging = Path(
                tempfile.mkdtemp(prefix=f".{plan.options.name}.lading-pack-{os.getpid()}-", dir=self.final_dir)
            )
        except OSError as err:
            self._remove_created()
            raise _dest_error(err, self.final_dir) from err
        self._done: list[tuple[ShardPlan, Path]] = []

    def shard_path(self, shard: ShardPlan) -> Path:
        """The shard's file in the staging directory."""
        return self.staging / shard.name

    def commit_shard(self, shard: ShardPlan, path: Path) -> None:
        """Keep the complete shard in staging until every shard is done."""
        self._done.append((shard, path))

    def finish(self, documents: list[tuple[str, bytes]], make_index: MakeIndex) -> list[PublishedShard]:
        """Rename shards into place, then the documents (manifest, offsets), then the index."""
        try:
            published = self._publish(documents, make_index)
        except OSError as err:
            raise _dest_error(err, self.final_dir) from err
        self._created = []  # published: DEST's directories hold the dataset now
        self.abort()
        return published

    def _publish(self, documents: list[tuple[str, bytes]], make_index: MakeIndex) -> list[PublishedShard]:
        published = [_local_version(shard.name, len(shard.samples), path) for shard, path in self._done]
        staged = []
        for number, (key, data) in enumerate(documents):
            path = self.staging / f"document-{number}"
            path.write_bytes(data)
            staged.append((path, Path(key).name))
        extras = [_local_version(name, 0, path) for path, name in staged]
        (self.staging / "index").write_bytes(make_index(published, extras))
        for shard, path in self._done:
            os.replace(path, self.final_dir / shard.name)
        for path, name in staged:
            os.replace(path, self.final_dir / name)
        os.replace(self.staging / "index", self.final_dir / Path(self.plan.index_key).name)
        return published

    def abort(self) -> None:
        """Remove the staging directory and whatever is still in it, then the directories this
        pack created for DEST unless it was published (only empty ones: never another's files)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        self._remove_created()

    def _remove_created(self) -> None:
        for directory in self._created:
            try:
                directory.rmdir()
            except OSError:  # not empty (another writer's files), or gone already
                break
        self._created = []


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


def _local_version(name: str, nsamples: int, path: Path) -> PublishedShard:
    """A local file as published: its version is the LocalStore's (``<mtime_ns>-<size>``), which
    a rename keeps."""
    st = path.stat()
    return PublishedShard(name, nsamples, st.st_size, f"{st.st_mtime_ns}-{st.st_size}", crc32c_of_file(path))


def _remove_stale_staging(directory: Path, name: str) -> None:
    """Remove staging directories left by packs that were killed (their process is gone)."""
    for leftover in directory.glob(f".{name}.lading-pack-*-*"):
        pid = leftover.name.rsplit("-", 2)[-2]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


class StorePublisher:
    """Uploads shards in the background while the next one is written; index last."""

    def __init__(self, store: Store, plan: PackPlan) -> None:
        self.store = store
        self.plan = plan
        # Listing (not stat) fails for a missing bucket or no access, before any shard is written.
        if any(info.key == plan.index_key for info in store.list(plan.index_key)):
            raise _already_packed(f"{store.url}/{plan.index_key}")
        self._tmp = tempfile.TemporaryDirectory(prefix="lading-pack-")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lading-pack-upload")
        self._uploads: list[tuple[ShardPlan, Future[tuple[ObjectInfo, str]]]] = []

    def shard_path(self, shard: ShardPlan) -> Path:
        """The shard's local temporary file."""
        return Path(self._tmp.name) / shard.name

    def _upload(self, path: Path, key: str, remove: bool) -> tuple[ObjectInfo, str]:
        """The uploaded object and the CRC32C of the file (read while it is still in the page cache)."""
        try:
            crc32c = crc32c_of_file(path)
            return self.store.upload(path, key), crc32c  # stores retry transient errors themselves
        finally:
            if remove:
                path.unlink(missing_ok=True)

    def commit_shard(self, shard: ShardPlan, path: Path) -> None:
        """Queue the upload; block while two shards are already waiting (bounds disk use)."""
        waiting = [future for _, future in self._uploads if not future.done()]
        if len(waiting) >= 2:
            waiting[0].result()
        self._uploads.append((shard, self._pool.submit(self._upload, path, self.plan.shard_key(shard), True)))

    def finish(self, documents: list[tuple[str, bytes]], make_index: MakeIndex) -> list[PublishedShard]:
        """Wait for every shard upload (re-raising the first failure), then the documents
        (manifest, offsets) in order, then the index."""
        published = []
        for shard, future in self._uploads:
            info, crc32c = future.result()
            published.append(PublishedShard(shard.name, len(shard.samples), info.size, info.version, crc32c))
        extras = []
        for key, data in documents:
            info, crc32c = self._put_document(key, data)
            extras.append(PublishedShard(Path(key).name, 0, info.size, info.version, crc32c))
        self._put_document(self.plan.index_key, make_index(published, extras))
        self.abort()
        return published

    def _put_document(self, key: str, data: bytes) -> tuple[ObjectInfo, str]:
        path = Path(self._tmp.name) / Path(key).name
        path.write_bytes(data)
        return self._upload(path, key, remove=True)

    def abort(self) -> None:
        """Cancel queued uploads and remove the temporary directory."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._tmp.cleanup()
