"""Building a version: samples spooled to a local file, packed by ``lading pack``'s writer into
shards of a build folder, then the index, created only if absent, while the claim is held.

1. The function's samples are encoded (:mod:`lading.datalayer.encoding`) and appended to one
   local spool file, a sample at a time (memory holds one sample, plus a few dozen bytes per
   field for the plan).
2. :func:`lading.pack.plan.plan_shards` cuts them into shards; :func:`lading.pack.write_pack`
   writes the shards (two at a time on local disk) through :class:`VersionPublisher`, which
   uploads them into ``build-<id>/`` while the next is written, then the manifest and the offsets
   file, and last the index: with the datalayer block added, after the claim is confirmed, by a
   conditional create (so a version gets exactly one index, whatever happens to claims).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from lading.core.checksums import crc32c_of_file
from lading.core.errors import ProblemFound, UsageError, local_error
from lading.datalayer.claim import Claim
from lading.datalayer.encoding import Encoder
from lading.datalayer.layout import BLOCK, FORMAT, Location
from lading.pack import write_pack
from lading.pack.grouping import Member, group_samples
from lading.pack.index import PublishedShard, dump
from lading.pack.plan import DEFAULT_SHARD_SIZE, PackOptions, ShardPlan, plan_shards
from lading.pack.upload import MakeIndex
from lading.pack.writer import ShardWriter
from lading.stores import claims
from lading.stores.base import ObjectInfo, Store

#: Check the claim (and give up early when it was lost) every this many samples.
_CHECK_EVERY = 64


class Spool:
    """Encoded members appended to one local file; each remembered as an ObjectInfo whose
    ``version`` is its offset in the file (what :class:`SpoolSource` reads back)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        try:
            self.folder = Path(tempfile.mkdtemp(prefix="lading-datalayer-", dir=directory))
            self.path = self.folder / "members"
            self._handle = open(self.path, "wb")
        except OSError as err:
            raise local_error(
                err,
                f"create a spool file in {directory or tempfile.gettempdir()}",
                "pass spool_dir= (a local directory with room for the dataset)",
            ) from err
        self.infos: list[ObjectInfo] = []
        self.nbytes = 0

    def add(self, key: str, members: list[tuple[str, bytes]]) -> None:
        """Append one sample's members."""
        for ext, data in members:
            try:
                self._handle.write(data)
            except OSError as err:
                raise local_error(err, f"write the spool file {self.path}", "pass spool_dir= with more room") from err
            self.infos.append(ObjectInfo(f"{key}.{ext}", len(data), str(self.nbytes)))
            self.nbytes += len(data)

    def source(self) -> "SpoolSource":
        """The spool as pack's member source (closes the file for writing)."""
        self._handle.close()
        return SpoolSource(self.path)

    def close(self) -> None:
        """Remove the spool."""
        self._handle.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class SpoolSource:
    """pack's MemberSource over the spool: each member read at its offset."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write_members(self, members: Iterable[Member], writer: ShardWriter) -> None:
        """Append each member, read from the spool at its offset."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for member in members:
                info = member.info
                os.lseek(fd, int(info.version), os.SEEK_SET)
                writer.add_file(info.key, fd, info.size, str(self.path))
        finally:
            os.close(fd)

    def close(self) -> None:
        """Nothing to release (the spool removes its folder)."""


class VersionPublisher:
    """pack's Publisher for a datalayer build: shards and documents into ``build-<id>/``, then
    the index at the version's top, created only if absent, while the claim is ours."""

    def __init__(
        self,
        store: Store,
        location: Location,
        claim: Claim,
        finalize: Callable[[dict[str, Any]], dict[str, Any]],
        spool_dir: str | os.PathLike[str] | None,
    ) -> None:
        self.store, self.location, self.claim, self.finalize = store, location, claim, finalize
        self.build = claim.record.build
        self._tmp = tempfile.TemporaryDirectory(prefix="lading-datalayer-shards-", dir=spool_dir)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lading-datalayer-upload")
        self._uploads: list[tuple[ShardPlan, Future[tuple[ObjectInfo, str]]]] = []
        self.index: dict[str, Any] | None = None

    def shard_path(self, shard: ShardPlan) -> Path:
        """The shard's local temporary file."""
        return Path(self._tmp.name) / shard.name

    def _upload(self, path: Path, key: str) -> tuple[ObjectInfo, str]:
        """The uploaded object and the CRC32C of the file (read while it is still in the page cache)."""
        try:
            self.claim.check()
            crc32c = crc32c_of_file(path)
            return self.store.upload(path, key), crc32c
        finally:
            path.unlink(missing_ok=True)

    def commit_shard(self, shard: ShardPlan, path: Path) -> None:
        """Queue the upload; wait while two are already waiting (bounds local disk)."""
        self.claim.check()
        waiting = [future for _, future in self._uploads if not future.done()]
        if len(waiting) >= 2:
            waiting[0].result()
        self._uploads.append((shard, self._pool.submit(self._upload, path, f"{self.build}/{shard.name}")))

    def finish(self, documents: list[tuple[str, bytes]], make_index: MakeIndex) -> list[PublishedShard]:
        """Every shard, then the documents, then the index (conditional create)."""
        published = []
        for shard, future in self._uploads:
            info, crc32c = future.result()
            name = f"{self.build}/{shard.name}"
            published.append(PublishedShard(name, len(shard.samples), info.size, info.version, crc32c))
        extras = []
        for key, data in documents:
            name = f"{self.build}/{Path(key).name}"
            path = Path(self._tmp.name) / Path(key).name
            path.write_bytes(data)
            info, crc32c = self._upload(path, name)
            extras.append(PublishedShard(name, 0, info.size, info.version, crc32c))
        index = self.finalize(json.loads(make_index(published, extras)))
        self.claim.beat()  # still ours, for another TTL: nobody else is publishing
        version = claims.create(self.store, self.location.index_key, dump(index))
        if version is None:
            raise ProblemFound(
                f"{self.location.index_uri} appeared while this process built it",
                "another process published the version first; nothing of this build is used",
            )
        self.index = index
        self.abort()
        return published

    def abort(self) -> None:
        """Cancel queued uploads and remove the temporary directory."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._tmp.cleanup()


def build_version(
    store: Store,
    location: Location,
    samples: Iterable[Any],
    claim: Claim,
    *,
    function: str,
    shard_size: int = DEFAULT_SHARD_SIZE,
    spool_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Encode ``samples`` and publish them as ``location`` (the claim held); the index written."""
    started = time.time()
    encoder = Encoder()
    try:
        produced = iter(samples)
    except TypeError:
        raise UsageError(
            f"{function} returned a {type(samples).__name__}, not samples",
            "return a list of sample dicts, or yield them",
        ) from None
    spool = Spool(spool_dir)
    try:
        for sample in produced:
            spool.add(*encoder.encode(sample))
            if encoder.samples % _CHECK_EVERY == 0:
                claim.check()
        if encoder.samples == 0:
            raise UsageError(
                f"{function} produced no samples, so there is nothing to cache as {location}",
                "return (or yield) at least one sample dict",
            )
        claim.check()
        options = PackOptions(location.name, shard_size=shard_size)
        plan = plan_shards(group_samples(spool.infos, directories_possible=False), options)
        record = claim.record

        def finalize(index: dict[str, Any]) -> dict[str, Any]:
            index.setdefault("lading", {})["version"] = location.version
            index[BLOCK] = {
                "format": FORMAT,
                "name": location.name,
                "version": location.version,
                "fingerprint": record.fingerprint,
                "function": function,
                "encoding": encoder.table(),
                "samples": encoder.samples,
                "build": record.build,
                "built_by": {"host": socket.gethostname(), "pid": os.getpid(), "user": record.user},
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(time.time() - started, 3),
            }
            return index

        publisher = VersionPublisher(store, location, claim, finalize, spool_dir)
        write_pack(plan, spool.source(), publisher, f"{location.uri}/{record.build}")
        assert publisher.index is not None
        return publisher.index
    finally:
        spool.close()
