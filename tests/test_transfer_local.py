"""The transfer engine against LocalStore (plus small wrapper stores that fail or corrupt on
purpose): atomic publish, verification, ranged downloads, resume, object changes, interrupts."""

from __future__ import annotations

import _thread
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from lading.core.errors import ObjectChanged, TransientError
from lading.core.retry import RetryPolicy
from lading.stores.base import ObjectInfo
from lading.stores.local import LocalStore
from lading.transfer import TransferItem, TransferOptions, TransferResult, fetch_all
from lading.transfer.engine import COPY_THREADS
from lading.transfer.files import ResumeRecord, is_temporary, sidecar_path, temporary_path
from lading.transfer.verify import IntegrityError

NO_RETRY = RetryPolicy(attempts=1)
TINY = TransferOptions(workers=4, part_size=1000, multipart_threshold=3000, retry=NO_RETRY)


class Recorder:
    """TransferEvents that remember what they saw."""

    def __init__(self) -> None:
        self.bytes = 0
        self.done: list[TransferResult] = []
        self.lock = threading.Lock()

    def on_bytes(self, nbytes: int) -> None:
        with self.lock:
            self.bytes += nbytes

    def on_done(self, result: TransferResult) -> None:
        with self.lock:
            self.done.append(result)


class Wrapped(LocalStore):
    """A LocalStore whose reads can be observed, failed or corrupted by a hook."""

    def __init__(self, inner: LocalStore, on_read=None, corrupt: bool = False) -> None:
        super().__init__(inner.root)
        self.inner = inner
        self.on_read = on_read
        self.corrupt = corrupt
        self.ranges: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.reading = 0
        self.idle = threading.Condition(self.lock)

    def wait_idle(self, timeout: float) -> bool:
        """Whether every read that started has returned within ``timeout`` seconds."""
        with self.idle:
            return self.idle.wait_for(lambda: self.reading == 0, timeout)

    def list(self, prefix: str = ""):
        return self.inner.list(prefix)

    def stat(self, key: str) -> ObjectInfo:
        return self.inner.stat(key)

    def read_range(self, key: str, start: int, end: int, version: str | None = None) -> bytes:
        with self.lock:
            self.ranges.append((start, end))
            count = len(self.ranges)
            self.reading += 1
        try:
            if self.on_read is not None:
                self.on_read(key, start, count)
            data = self.inner.read_range(key, start, end, version)
        finally:
            with self.idle:
                self.reading -= 1
                self.idle.notify_all()
        return self._maybe_corrupt(data)

    def download(self, key: str, dest: Path, version: str | None = None, progress=None, size=None) -> None:
        if self.on_read is not None:
            self.on_read(key, 0, 0)
        self.inner.download(key, dest, version, progress)
        if self.corrupt:
            data = dest.read_bytes()
            dest.write_bytes(self._maybe_corrupt(data))

    def _maybe_corrupt(self, data: bytes) -> bytes:
        if not self.corrupt or not data:
            return data
        return bytes([data[0] ^ 0xFF]) + data[1:]

    def upload(self, src: Path, key: str, progress=None) -> ObjectInfo:
        return self.inner.upload(src, key, progress)


def _with_md5(info: ObjectInfo, data: bytes) -> ObjectInfo:
    return ObjectInfo(info.key, info.size, info.version, info.mtime, md5=hashlib.md5(data).hexdigest())


def _make_source(root: Path, files: dict[str, bytes]) -> LocalStore:
    for key, data in files.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return LocalStore(root)


def _items(store, dest: Path, md5_of: dict[str, bytes] | None = None) -> list[TransferItem]:
    items = []
    for info in store.list():
        if md5_of is not None:
            info = _with_md5(info, md5_of[info.key])
        items.append(TransferItem(info, dest / info.key))
    return items


def _stray_temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if is_temporary(p.name) or p.name.endswith(".tmp")]


def test_small_and_large_files_arrive_byte_identical_with_progress(tmp_path):
    files = {f"d{i % 3}/f{i}.bin": os.urandom(100 + i * 37) for i in range(30)}
    files["big/blob.bin"] = os.urandom(10_500)  # 11 parts of 1000 bytes
    files["empty"] = b""
    store = _make_source(tmp_path / "src", files)
    wrapped = Wrapped(store)
    events = Recorder()
    dest = tmp_path / "dest"

    results = fetch_all(wrapped, _items(store, dest, files), TINY, events)

    assert len(results) == len(files) and all(r.ok for r in results), [r.error for r in results]
    for key, data in files.items():
        assert (dest / key).read_bytes() == data
    assert events.bytes == sum(len(d) for d in files.values())
    assert sorted(r.key for r in events.done) == sorted(files)
    assert sorted(wrapped.ranges) == [(0, 0)] + [(i * 1000, min(10_500, (i + 1) * 1000)) for i in range(11)]
    assert _stray_temporaries(dest) == []  # the empty file's (0, 0): its version checked, no copy


def test_an_existing_file_is_replaced_only_when_the_new_one_is_complete(tmp_path):
    store = _make_source(tmp_path / "src", {"a.txt": b"new content"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a.txt").write_bytes(b"old")
    seen_during_read: list[bytes] = []
    wrapped = Wrapped(store, on_read=lambda *_: seen_during_read.append((dest / "a.txt").read_bytes()))

    [result] = fetch_all(wrapped, _items(store, dest), TINY)

    assert result.ok and (dest / "a.txt").read_bytes() == b"new content"
    assert seen_during_read == [b"old"]  # the old file stayed whole until the rename


def test_corrupt_bytes_fail_the_item_and_leave_no_file(tmp_path):
    files = {"small.bin": os.urandom(500), "large.bin": os.urandom(4500)}
    store = _make_source(tmp_path / "src", files)
    dest = tmp_path / "dest"

    results = fetch_all(Wrapped(store, corrupt=True), _items(store, dest, files), TINY)

    assert len(results) == 2
    for result in results:
        assert not result.ok and isinstance(result.error, IntegrityError)
        assert "MD5 mismatch" in result.error.message
        assert not result.dest.exists()
    assert list(dest.rglob("*")) == []  # temporaries of unverifiable content are removed


def test_verify_false_checks_the_size_only(tmp_path):
    files = {"f": b"content!"}
    store = _make_source(tmp_path / "src", files)
    options = TransferOptions(workers=1, verify=False, retry=NO_RETRY)

    [result] = fetch_all(Wrapped(store, corrupt=True), _items(store, tmp_path / "out", files), options)

    assert result.ok  # the MD5 was not checked: the flipped byte went through, as asked
    assert (tmp_path / "out" / "f").read_bytes() != files["f"]


def test_size_is_checked_even_without_a_checksum(tmp_path):
    store = _make_source(tmp_path / "src", {"f": b"12345"})
    [info] = store.list()
    lying = ObjectInfo("f", 9, info.version)  # listing said 9 bytes, the file has 5

    [result] = fetch_all(store, [TransferItem(lying, tmp_path / "out" / "f")], TINY)

    assert not result.ok and "got 5 bytes, expected 9" in result.error.message
    assert not (tmp_path / "out" / "f").exists()


def test_failed_part_keeps_parts_on_disk_and_a_rerun_fetches_only_missing_ones(tmp_path):
    data = os.urandom(8000)  # 8 parts
    store = _make_source(tmp_path / "src", {"big": data})
    dest = tmp_path / "dest"

    def fail_on_fifth(key, start, count):
        if count == 5:
            raise TransientError("connection reset (test)")

    one_worker = TransferOptions(workers=1, part_size=1000, multipart_threshold=3000, retry=NO_RETRY)
    first = Wrapped(store, on_read=fail_on_fifth)
    [result] = fetch_all(first, _items(store, dest, {"big": data}), one_worker)

    assert not result.ok and isinstance(result.error, TransientError)
    assert not (dest / "big").exists()
    record = ResumeRecord.load(sidecar_path(dest / "big"))
    assert record is not None and record.done == {0, 1, 2, 3}
    assert temporary_path(dest / "big").stat().st_size == len(data)

    second = Wrapped(store)
    events = Recorder()
    [result] = fetch_all(second, _items(store, dest, {"big": data}), TINY, events)

    assert result.ok, result.error
    assert (dest / "big").read_bytes() == data
    assert sorted(second.ranges) == [(i * 1000, (i + 1) * 1000) for i in range(4, 8)]
    assert events.bytes == len(data)  # resumed bytes count as progress once
    assert _stray_temporaries(dest) == []


def test_parts_of_another_version_are_discarded(tmp_path):
    data = os.urandom(5000)
    store = _make_source(tmp_path / "src", {"big": data})
    dest = tmp_path / "dest"
    dest.mkdir()
    temporary_path(dest / "big").write_bytes(b"x" * 5000)
    ResumeRecord("big", "some-older-version", 5000, 1000, {0, 1, 2, 3, 4}).save(sidecar_path(dest / "big"))
    wrapped = Wrapped(store)

    [result] = fetch_all(wrapped, _items(store, dest), TINY)

    assert result.ok and (dest / "big").read_bytes() == data
    assert len(wrapped.ranges) == 5


def test_object_replaced_mid_download_is_reported_and_never_mixed(tmp_path):
    data = os.urandom(6000)
    store = _make_source(tmp_path / "src", {"big": data})
    items = _items(store, tmp_path / "dest")
    source_file = tmp_path / "src" / "big"

    def replace_after_two_parts(key, start, count):
        if count == 3:
            source_file.write_bytes(os.urandom(6000))
            os.utime(source_file, ns=(1, 1))  # a different mtime, hence a different version

    one_worker = TransferOptions(workers=1, part_size=1000, multipart_threshold=3000, retry=NO_RETRY)
    [result] = fetch_all(Wrapped(store, on_read=replace_after_two_parts), items, one_worker)

    assert not result.ok and isinstance(result.error, ObjectChanged)
    assert list((tmp_path / "dest").iterdir()) == []  # no final file, no useless parts


def test_small_object_changed_since_listing(tmp_path):
    store = _make_source(tmp_path / "src", {"f": b"first"})
    items = _items(store, tmp_path / "dest")
    (tmp_path / "src" / "f").write_bytes(b"second, longer")

    [result] = fetch_all(store, items, TINY)

    assert not result.ok and isinstance(result.error, ObjectChanged)
    assert list((tmp_path / "dest").iterdir()) == []


def test_unwritable_destination_is_a_failed_result_not_an_exception(tmp_path):
    store = _make_source(tmp_path / "src", {"a/b": b"data", "c": b"fine"})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a").write_text("a file where a directory is needed")

    results = {r.key: r for r in fetch_all(store, _items(store, dest), TINY)}

    assert not results["a/b"].ok and "cannot write" in results["a/b"].error.message
    assert results["c"].ok and (dest / "c").read_bytes() == b"fine"


def test_keyboard_interrupt_stops_promptly_and_a_rerun_resumes(tmp_path):
    data = os.urandom(20_000)  # 20 parts
    store = _make_source(tmp_path / "src", {"big": data, "small": b"s" * 100})
    dest = tmp_path / "dest"
    options = TransferOptions(workers=2, part_size=1000, multipart_threshold=3000, retry=NO_RETRY)
    release = threading.Event()

    def interrupt_on_sixth(key, start, count):
        if count == 6:
            _thread.interrupt_main()
        if count >= 6:
            release.wait(30)  # stall like a slow network until fetch_all returned; cancellation must not wait for us

    first = Wrapped(store, on_read=interrupt_on_sixth)
    with pytest.raises(KeyboardInterrupt):
        fetch_all(first, _items(store, dest), options)
    release.set()
    assert first.wait_idle(30)  # a rerun is a new process: the reads the first run abandoned end first

    assert not (dest / "big").exists()
    record = ResumeRecord.load(sidecar_path(dest / "big"))
    assert record is not None and 0 < len(record.done) < 20
    finals = [p for p in dest.iterdir() if not is_temporary(p.name)]
    assert all(p.name == "small" and p.read_bytes() == b"s" * 100 for p in finals)

    second = Wrapped(store)
    results = fetch_all(second, _items(store, dest), options)

    assert all(r.ok for r in results), [(r.key, r.error) for r in results if not r.ok]
    assert (dest / "big").read_bytes() == data
    assert len(second.ranges) == 20 - len(record.done)
    assert _stray_temporaries(dest) == []


def _main_thread_reaches(function, callee: str, within: float) -> bool:
    """Whether the main thread gets to call ``callee`` from ``function`` within ``within`` s."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code.co_name == callee and frame.f_back is not None and frame.f_back.f_code is function.__code__:
                return True
            frame = frame.f_back
        time.sleep(0.001)
    return False


def test_an_interrupt_lets_the_local_copy_in_progress_finish_and_starts_no_other(tmp_path):
    """Small local files are copied in chunks on pool threads: at Ctrl-C the copy in progress
    ends (published, no temporary left) before fetch_all returns, and no further copy starts."""
    files = {f"d{i // 50}/f{i:03d}": os.urandom(10 + i) for i in range(200)}
    store = _make_source(tmp_path / "src", files)
    dest = tmp_path / "dest"
    started: list[str] = []
    seen = threading.Event()  # the main thread took the interrupt

    def took_it(signum, frame):
        seen.set()
        raise KeyboardInterrupt

    def interrupt_on_fortieth(key, start, count):
        started.append(key)
        if len(started) == 40:
            _thread.interrupt_main()
            # the copy in progress outlasts the interrupt's arrival, however loaded the machine
            assert seen.wait(30) and _main_thread_reaches(fetch_all, "wait", within=30)

    previous = signal.signal(signal.SIGINT, took_it)
    try:
        with pytest.raises(KeyboardInterrupt):
            fetch_all(Wrapped(store, on_read=interrupt_on_fortieth), _items(store, dest), TransferOptions(workers=1))
    finally:
        signal.signal(signal.SIGINT, previous)

    assert len(started) == 40
    finals = sorted(str(p.relative_to(dest)) for p in dest.rglob("f*"))
    assert finals == sorted(started) and all((dest / key).read_bytes() == files[key] for key in finals)
    assert _stray_temporaries(dest) == []
    results = fetch_all(store, _items(store, dest), TransferOptions(workers=1))
    assert all(r.ok for r in results) and all((dest / key).read_bytes() == data for key, data in files.items())


def test_local_results_carry_the_published_files_stat(tmp_path):
    files = {"a": b"alpha", "d/b": b"", "big": os.urandom(5000)}
    store = _make_source(tmp_path / "src", files)
    dest = tmp_path / "dest"

    results = fetch_all(store, _items(store, dest), TINY)

    assert all(r.ok for r in results)
    for result in results:
        st = os.lstat(result.dest)
        assert result.local in (None, (st.st_mtime_ns, st.st_size)), result.key
    assert {r.key for r in results if r.local is not None} == {"a", "d/b"}  # the ranged one: stat'ed by the journal


def test_an_empty_file_is_created_in_place_after_its_version_is_checked(tmp_path):
    store = _make_source(tmp_path / "src", {"a/empty": b"", "a/full": b"x" * 10, "b/empty": b"", "c/empty": b""})
    copied: list[str] = []
    wrapped = Wrapped(store, on_read=lambda key, start, count: copied.append(key) if count == 0 else None)
    dest = tmp_path / "dest"
    (dest / "b").mkdir(parents=True)
    (dest / "b" / "empty").write_bytes(b"stale")  # a file in the way is replaced atomically, as always
    items = _items(store, dest)
    (tmp_path / "src" / "c" / "empty").write_bytes(b"grown")  # changed since the listing

    results = {r.key: r for r in fetch_all(wrapped, items, TINY)}

    assert copied == ["a/full", "b/empty"]  # no temporary copied for a/empty
    assert (dest / "a" / "empty").read_bytes() == b"" and (dest / "b" / "empty").read_bytes() == b""
    assert results["a/empty"].ok and results["a/empty"].local == ((dest / "a" / "empty").stat().st_mtime_ns, 0)
    assert isinstance(results["c/empty"].error, ObjectChanged) and not (dest / "c" / "empty").exists()
    assert _stray_temporaries(dest) == []


def test_a_local_source_is_copied_on_the_engine_s_own_few_threads(tmp_path):
    store = _make_source(tmp_path / "src", {f"d{i % 4}/f{i}": b"x" * i for i in range(200)})
    threads: set[str] = set()
    wrapped = Wrapped(store, on_read=lambda key, start, count: threads.add(threading.current_thread().name))

    results = fetch_all(wrapped, _items(store, tmp_path / "dest"), TransferOptions(workers=64))

    assert all(r.ok for r in results)
    assert threads and all(name.startswith("lading-copy") for name in threads), threads
    assert len(threads) <= COPY_THREADS


def test_temporary_names_are_recognised():
    assert is_temporary(temporary_path(Path("/d/a.bin")).name)
    assert is_temporary(sidecar_path(Path("/d/a.bin")).name)
    assert is_temporary(".a.bin.lading-part.json.tmp")  # a sidecar caught mid-save by kill -9
    assert not is_temporary("a.bin") and not is_temporary(".hidden") and not is_temporary("x.lading-part")


def test_sidecar_is_plain_json_naming_the_version(tmp_path):
    record = ResumeRecord("k", "etag", 10, 4, {0, 2})
    path = tmp_path / ".k.lading-part.json"
    record.save(path)
    assert json.loads(path.read_text()) == {"key": "k", "version": "etag", "size": 10, "part_size": 4, "done": [0, 2]}
    path.write_text("{not json")
    assert ResumeRecord.load(path) is None


def test_parts_are_appended_to_the_sidecar_and_a_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / ".k.lading-part.json"
    ResumeRecord("k", "etag", 100, 4, {0}).save(path)
    record = ResumeRecord.load(path)
    record.add(path, 7)
    record.add(path, 3)
    with open(path, "a") as handle:
        handle.write("1")  # killed mid-line: "1" of "12"
    assert ResumeRecord.load(path).done == {0, 3, 7}


def test_a_resumed_download_with_a_small_lead_hashes_the_parts_on_disk_and_completes(tmp_path):
    data = os.urandom(8000)  # 8 parts
    store = _make_source(tmp_path / "src", {"big": data})
    dest = tmp_path / "dest"

    def fail_on_seventh(key, start, count):
        if count == 7:
            raise TransientError("connection reset (test)")

    one_worker = TransferOptions(workers=1, part_size=1000, multipart_threshold=3000, retry=NO_RETRY)
    [result] = fetch_all(Wrapped(store, on_read=fail_on_seventh), _items(store, dest, {"big": data}), one_worker)
    assert not result.ok
    # parts 0-5 are on disk and unhashed by this run: part 6 is far past a lead of 1 part
    tiny_lead = TransferOptions(workers=4, part_size=1000, multipart_threshold=3000, retry=NO_RETRY, part_concurrency=1)
    second = Wrapped(store)
    [result] = fetch_all(second, _items(store, dest, {"big": data}), tiny_lead)

    assert result.ok, result.error
    assert (dest / "big").read_bytes() == data
    assert sorted(second.ranges) == [(6000, 7000), (7000, 8000)]
    assert _stray_temporaries(dest) == []


def test_a_corrupt_part_under_a_small_lead_fails_the_item_without_hanging(tmp_path):
    data = os.urandom(5000)
    store = _make_source(tmp_path / "src", {"big": data})
    dest = tmp_path / "dest"
    small_lead = TransferOptions(
        workers=4, part_size=1000, multipart_threshold=3000, retry=NO_RETRY, part_concurrency=1
    )

    [result] = fetch_all(Wrapped(store, corrupt=True), _items(store, dest, {"big": data}), small_lead)

    assert not result.ok and isinstance(result.error, IntegrityError)
    assert not (dest / "big").exists() and _stray_temporaries(dest) == []
