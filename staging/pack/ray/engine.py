"""``lading pack --engine ray``: the local engine's plan, run as one Ray task per shard.

The driver (the process running ``lading pack``) plans the shards exactly as the local engine
does, then submits a task per shard: the task opens SOURCE itself, writes its shard with the
same writer and checks (:func:`lading.pack.execute.write_shard`) into a local file, publishes it
at its final key under DEST, and records a small receipt next to it. The driver holds the plan,
one task reference per shard in flight, and the (name, size, ETag) of each shard done. Once every
shard is done it checks them all in one listing of DEST, writes the manifest and the offsets file,
and last the index; then it removes the receipts.

A pack that fails or is interrupted writes no index. Running it again reuses every shard whose
receipt matches the plan (same members, sizes and versions) and whose object DEST still lists
at the receipt's ETag and size: only the missing shards are written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lading.core.checksums import crc32c_of_bytes, crc32c_of_file
from lading.core.errors import LadingError, ProblemFound, TransientError, UsageError, local_error
from lading.pack import PackEvents, PackResult, index_maker, open_source, pack_documents
from lading.pack.execute import write_shard
from lading.pack.index import PublishedShard
from lading.pack.plan import PackPlan, ShardPlan
from lading.pack.ray.session import ray_session, require_ray, task_error
from lading.stores import claims, open_store
from lading.stores.base import ObjectInfo, Store
from lading.stores.config import StoreConfig
from lading.stores.uri import parse_uri

log = logging.getLogger(__name__)
#: Attempts of a shard's task when its worker dies (Ray's own retries); transient errors are retried too.
MAX_RETRIES = 3
#: Seconds a Ctrl-C or a failure waits for the tasks in flight to end before the driver goes on.
CANCEL_GRACE = 10.0


def make_directory(path: Path) -> None:
    """Create a local DEST (and its parents)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise local_error(err, f"create {path}") from err


def receipts_prefix(plan: PackPlan) -> str:
    """Where the receipts of a pack in progress go (removed once its index is written)."""
    return f"{plan.prefix}{plan.options.name}.lading-pack/"


def shard_fingerprint(shard: ShardPlan) -> str:
    """What a shard is made of: its name, size and every member's key, size and version."""
    digest = hashlib.sha256(f"{shard.name}\0{shard.nbytes}\0".encode())
    for sample in shard.samples:
        for member in sample.members:
            info = member.info
            digest.update(f"{info.key}\0{info.size}\0{info.version}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


@dataclass(frozen=True)
class ShardJob:
    """What a task needs: the shard, where it goes, and its fingerprint for the receipt."""

    shard: ShardPlan
    key: str
    receipt_key: str
    fingerprint: str


def _publish_local(store: Store, root: Path, path: Path, key: str) -> ObjectInfo:
    target = root / key
    os.replace(path, target)
    return store.stat(key)


def write_shard_job(job: ShardJob, source: str, dest: str, config: StoreConfig) -> tuple[str, int, int, str]:
    """Run in a Ray task: write the shard, publish it under DEST, then its receipt.
    Returns ``(etag, size, payload bytes, CRC32C)``."""
    dest_uri = parse_uri(dest)
    store = open_store(dest_uri, config)
    member_source = open_source(parse_uri(source), config)
    try:
        if dest_uri.scheme == "file":  # written next to its final place, renamed in
            root = Path(dest_uri.prefix)
            (root / job.key).parent.mkdir(parents=True, exist_ok=True)
            path = (root / job.key).with_name(f".{job.shard.name}.{uuid.uuid4().hex[:12]}.part")
            try:
                payload = write_shard(job.shard, member_source, path)
                crc32c = crc32c_of_file(path)
                info = _publish_local(store, root, path, job.key)
            finally:
                path.unlink(missing_ok=True)
        else:
            with tempfile.TemporaryDirectory(prefix="lading-pack-ray-") as folder:
                path = Path(folder) / job.shard.name
                payload = write_shard(job.shard, member_source, path)
                crc32c = crc32c_of_file(path)
                info = store.upload(path, job.key)
    finally:
        member_source.close()
    if info.size != job.shard.nbytes:
        raise ProblemFound(f"{dest}/{job.key} holds {info.size} bytes once published, planned {job.shard.nbytes}")
    receipt = {"fingerprint": job.fingerprint, "etag": info.version, "size": info.size, "crc32c": crc32c}
    _put_small(store, job.receipt_key, json.dumps(receipt).encode())
    return info.version, info.size, payload, crc32c


def _put_small(store: Store, key: str, data: bytes) -> ObjectInfo:
    with tempfile.TemporaryDirectory(prefix="lading-pack-ray-") as folder:
        path = Path(folder) / "document"
        path.write_bytes(data)
        return store.upload(path, key)


def reusable_shards(store: Store, plan: PackPlan, jobs: list[ShardJob]) -> dict[int, PublishedShard]:
    """Shards a previous attempt published that match the plan: receipt fingerprint equal, and
    the listing shows the shard at the receipt's ETag and size."""
    listing = {info.key: info for info in store.list(plan.prefix + plan.options.name)}
    found: dict[int, PublishedShard] = {}
    for number, job in enumerate(jobs):
        info = listing.get(job.key)
        if info is None or job.receipt_key not in listing:
            continue
        read = claims.read(store, job.receipt_key)
        try:
            receipt = json.loads(read[0]) if read else None
        except ValueError:
            continue
        if (
            isinstance(receipt, dict)
            and receipt.get("fingerprint") == job.fingerprint
            and receipt.get("etag") == info.version
            and receipt.get("size") == info.size == job.shard.nbytes
        ):
            crc32c = receipt.get("crc32c")  # absent from a receipt an older lading wrote
            found[number] = PublishedShard(
                job.shard.name,
                len(job.shard.samples),
                info.size,
                info.version,
                crc32c if isinstance(crc32c, str) else None,
            )
    return found


def _check_published(store: Store, plan: PackPlan, published: list[PublishedShard]) -> None:
    """One listing: every shard at the ETag and size its task reported."""
    listing = {info.key: info for info in store.list(plan.prefix + plan.options.name)}
    for shard in published:
        info = listing.get(plan.prefix + shard.name)
        if info is None or info.version != shard.etag or info.size != shard.filesize:
            raise ProblemFound(
                f"{plan.prefix}{shard.name} is not as its task published it "
                f"({'missing' if info is None else f'ETag {info.version}, {info.size} bytes'})",
                "was DEST written by someone else meanwhile? run lading pack again",
            )


def _payload(shard: ShardPlan) -> int:
    return sum(member.info.size for sample in shard.samples for member in sample.members)


def run_pack_ray(
    plan: PackPlan,
    source: str,
    dest: str,
    config: StoreConfig | None = None,
    events: PackEvents | None = None,
    address: str | None = None,
    now: Callable[[], float] = time.monotonic,
) -> PackResult:
    """Write the planned shards on Ray (see the module docstring); the index goes last, or not at all."""
    require_ray()  # before anything is created at DEST
    config = config or StoreConfig.from_env()
    events = events or PackEvents()
    started = now()
    dest_uri = parse_uri(dest)
    if dest_uri.scheme == "file":
        make_directory(Path(dest_uri.prefix))
    store = open_store(dest_uri, config)
    if any(info.key == plan.index_key for info in store.list(plan.index_key)):
        raise UsageError(
            f"{store.url}/{plan.index_key} already exists: a dataset with this name was packed there",
            "use a new --version or --name, or delete the old dataset first",
        )
    receipts = receipts_prefix(plan)
    jobs = [
        ShardJob(shard, plan.shard_key(shard), f"{receipts}{shard.name}.json", shard_fingerprint(shard))
        for shard in plan.shards
    ]
    published: dict[int, PublishedShard] = reusable_shards(store, plan, jobs)
    if published:
        log.info("reusing %d of %d shards already written under %s", len(published), len(jobs), store.url)
    for number in sorted(published):
        events.on_bytes(_payload(plan.shards[number]))
        events.on_shard(plan.shards[number].name, plan.shards[number].nbytes)
    todo = [number for number in range(len(jobs)) if number not in published]
    if todo:
        with ray_session(address) as ray:
            # absolute: a worker's working directory is not the driver's
            _run_tasks(ray, plan, jobs, todo, str(parse_uri(source)), str(dest_uri), config, events, published)
    shards = [published[number] for number in range(len(jobs))]
    _check_published(store, plan, shards)
    documents = pack_documents(plan, str(dest_uri))
    extras = [
        PublishedShard(Path(key).name, 0, info.size, info.version, crc32c_of_bytes(data))
        for key, data, info in ((key, data, _put_small(store, key, data)) for key, data in documents)
    ]
    _put_small(store, plan.index_key, index_maker(plan)(shards, extras))
    try:
        claims.delete_prefix(store, receipts)
    except LadingError as err:  # leftovers cost nothing but a listing entry
        log.warning("could not remove the receipts under %s/%s: %s", store.url, receipts, err)
    return PackResult(plan, str(dest_uri), shards, now() - started)


def _run_tasks(
    ray: Any,
    plan: PackPlan,
    jobs: list[ShardJob],
    todo: list[int],
    source: str,
    dest: str,
    config: StoreConfig,
    events: PackEvents,
    published: dict[int, PublishedShard],
) -> None:
    """Submit a task per shard in ``todo`` (a bounded number in flight), record each as it
    completes; on any failure or Ctrl-C submit no more (the tasks in flight end)."""
    remote = ray.remote(write_shard_job).options(
        name="lading_pack_shard",
        max_retries=MAX_RETRIES,
        retry_exceptions=[TransientError],
        num_cpus=1,
        scheduling_strategy="SPREAD",
    )
    in_flight = max(4, 2 * int(ray.cluster_resources().get("CPU", 1)))
    config_ref = ray.put(config.for_workers())  # each worker resolves its own credentials
    waiting: dict[Any, int] = {}
    queue = list(reversed(todo))
    try:
        while queue or waiting:
            while queue and len(waiting) < in_flight:
                number = queue.pop()
                waiting[remote.remote(jobs[number], source, dest, config_ref)] = number
            done, _ = ray.wait(list(waiting), num_returns=1, timeout=0.5)  # Ctrl-C is seen between waits
            for ref in done:
                number = waiting.pop(ref)
                shard = plan.shards[number]
                try:
                    etag, size, payload, crc32c = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - turned into a project error
                    raise task_error(ray, err, f"writing {shard.name}") from None
                published[number] = PublishedShard(shard.name, len(shard.samples), size, etag, crc32c)
                events.on_bytes(payload)
                events.on_shard(shard.name, shard.nbytes)
    except BaseException:
        # Submit nothing more and let the few tasks in flight end: cancelling them (ray.cancel,
        # forced or not) trips a fatal check in Ray 2.60's task manager now and then ("Tried to
        # complete task that was not pending"), which kills this process before it can exit 130.
        ray.wait(list(waiting), num_returns=len(waiting), timeout=CANCEL_GRACE)
        raise
