"""Every Python example in README.md and docs/**/*.md runs, as a user would copy it.

Each ```python block is written to a file in a fresh temporary directory and run in a subprocess
(cwd: that directory; env: the moto server's AWS variables and a node cache of its own). An HTML
comment on the line above a block declares what it needs:

    <!-- example: needs bucket, pets -->      the set-ups below, made on the moto server first
    <!-- example: needs pets; torchrun 2 -->  run under ``torchrun --nproc-per-node 2``
    <!-- example: skip: REASON -->           an API fragment that cannot run here (say why)
    <!-- example: bash; needs bucket -->     a ```bash block that is run too (quick starts)

Set-ups (bucket ``bucket`` on the test server unless said otherwise):
    bucket    s3://bucket/train/ with img-000.jpg, img-001.jpg, labels.csv
    pets      s3://bucket/datasets/pets/v1/pets.index.json: 32 samples (jpg 8x8 RGB, cls, json)
    records   s3://bucket/tok/train.bin: a 1024-byte header and 16 records of 4096 bytes
    snapshot  train.snap.jsonl (in cwd) of s3://bucket/train, and s3://mirror/train, a copy
    manifest  data/manifest.jsonl (in cwd): an augmented manifest synced from s3://bucket/data
    cache     an empty s3://bucket/cache/ for lading.datalayer
    local     nothing remote: the example makes its own local data (no moto variables either)
    fuse      the example mounts: skipped where /dev/fuse or fusermount3 is missing

The environment also has TMPDIR and RAY_TMPDIR set to a short temporary directory of the test's
own (AF_UNIX socket paths, of multiprocessing's fork server and of Ray, must fit in 107 bytes).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO, run_lading

SETUPS = {"bucket", "pets", "records", "snapshot", "manifest", "cache", "local", "fuse"}
MARKER = re.compile(r"<!--\s*example:\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Example:
    """One fenced block of a Markdown file and what its marker asks for."""

    path: Path
    line: int
    language: str
    code: str
    needs: set[str] = field(default_factory=set)
    skip: str | None = None
    torchrun: int = 0
    run_bash: bool = False

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def parse_marker(text: str, example: Example) -> None:
    """Apply ``needs A, B; torchrun N; bash`` or ``skip: REASON`` to ``example``."""
    if text.startswith("skip"):
        example.skip = text.partition(":")[2].strip() or "no reason given"
        return
    for part in filter(None, (p.strip() for p in text.split(";"))):
        word, _, rest = part.partition(" ")
        if word == "needs":
            example.needs |= {name.strip() for name in rest.split(",") if name.strip()}
        elif word == "torchrun":
            example.torchrun = int(rest)
        elif word == "bash":
            example.run_bash = True
        else:
            raise ValueError(f"unknown example marker {part!r}")
    unknown = example.needs - SETUPS
    if unknown:
        raise ValueError(f"unknown set-up {sorted(unknown)}")


def blocks(path: Path) -> list[Example]:
    """The fenced blocks of ``path`` with the marker (if any) on the nearest non-blank line above."""
    lines = path.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match or not match.group(1):
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        example = Example(path, index + 1, match.group(1), "\n".join(lines[index + 1 : end]) + "\n")
        above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.search(above)
        if marker:
            parse_marker(marker.group(1), example)
        found.append(example)
        index = end + 1
    return found


def examples() -> list[Example]:
    """Every python block, and every bash block marked to run."""
    chosen = []
    for path in doc_files():
        for example in blocks(path):
            if example.language == "python" or (example.language == "bash" and example.run_bash):
                chosen.append(example)
    return chosen


# ---------------------------------------------------------------------------------------- set-ups


def s3_client(env: dict[str, str]):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def jpeg(colour: tuple[int, int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(out, format="JPEG")
    return out.getvalue()


def ensure_bucket(client, name: str) -> None:
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if name not in existing:
        client.create_bucket(Bucket=name)


def setup_bucket(client, env: dict[str, str], cwd: Path) -> None:
    ensure_bucket(client, "bucket")
    client.put_object(Bucket="bucket", Key="train/img-000.jpg", Body=jpeg((255, 0, 0)))
    client.put_object(Bucket="bucket", Key="train/img-001.jpg", Body=jpeg((0, 255, 0)))
    client.put_object(Bucket="bucket", Key="train/labels.csv", Body=b"img-000.jpg,0\nimg-001.jpg,1\n")


def setup_pets(client, env: dict[str, str], cwd: Path) -> None:
    ensure_bucket(client, "bucket")
    source = cwd.parent / "pets-source"
    source.mkdir()
    for i in range(32):
        (source / f"pet{i:04d}.jpg").write_bytes(jpeg((i * 8, 100, 200)))
        (source / f"pet{i:04d}.cls").write_text(str(i % 2))
        (source / f"pet{i:04d}.json").write_text(json.dumps({"id": i}))
    result = run_lading(
        "pack", str(source), "s3://bucket/datasets", "--name", "pets", "--version", "v1", "-q", env=env, cwd=cwd
    )
    assert result.returncode == 0, result.stderr


def setup_records(client, env: dict[str, str], cwd: Path) -> None:
    ensure_bucket(client, "bucket")
    body = b"H" * 1024 + bytes(range(256)) * 16 * 16
    client.put_object(Bucket="bucket", Key="tok/train.bin", Body=body)


def setup_snapshot(client, env: dict[str, str], cwd: Path) -> None:
    setup_bucket(client, env, cwd)
    ensure_bucket(client, "mirror")
    for key in ("img-000.jpg", "img-001.jpg", "labels.csv"):
        client.copy_object(Bucket="mirror", Key=f"train/{key}", CopySource={"Bucket": "bucket", "Key": f"train/{key}"})
    result = run_lading("snapshot", "s3://bucket/train", "-o", "train.snap.jsonl", env=env, cwd=cwd)
    assert result.returncode == 0, result.stderr


def setup_manifest(client, env: dict[str, str], cwd: Path) -> None:
    ensure_bucket(client, "bucket")
    client.put_object(Bucket="bucket", Key="data/img/1.jpg", Body=jpeg((1, 2, 3)))
    client.put_object(Bucket="bucket", Key="data/img/2.jpg", Body=jpeg((4, 5, 6)))
    lines = [
        {"source-ref": "s3://bucket/data/img/1.jpg", "class": 3},
        {"source-ref": "s3://bucket/data/img/2.jpg", "class": 5},
    ]
    (cwd / "train.manifest").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run_lading(
        "sync", "s3://bucket/data", str(cwd / "data"), "--manifest", "train.manifest", "-q", env=env, cwd=cwd
    )
    assert result.returncode == 0, result.stderr


def setup_cache(client, env: dict[str, str], cwd: Path) -> None:
    ensure_bucket(client, "bucket")


SETUP_FUNCTIONS = {
    "bucket": setup_bucket,
    "pets": setup_pets,
    "records": setup_records,
    "snapshot": setup_snapshot,
    "manifest": setup_manifest,
    "cache": setup_cache,
}


# ------------------------------------------------------------------------------------------- tests


def example_env(example: Example, tmp_path: Path, server_env: dict[str, str]) -> dict[str, str]:
    """The process environment of an example: no cloud settings of the user's, a private cache."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(
            ("AWS_", "LADING_", "STORAGE_EMULATOR", "GOOGLE_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        )
    }
    if "local" not in example.needs:
        env.update(server_env)
    env["LADING_CACHE_DIR"] = str(tmp_path / "node-cache")
    # AF_UNIX paths (107 bytes: multiprocessing's fork server, Ray's session sockets) must fit
    # under it: a short directory in the session's short TMPDIR (tests/hermetic.py), removed after
    env["TMPDIR"] = env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ex")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def command(example: Example, script: Path) -> list[str]:
    if example.language == "bash":
        return ["bash", "-euo", "pipefail", str(script)]
    if example.torchrun:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={example.torchrun}",
            str(script),
        ]
    return [sys.executable, str(script)]


def run_in_group(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run an example in a process group of its own, and end whatever it left running (a server
    it started in the background, say) when it is done."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


ALL = examples()


def test_the_docs_have_examples() -> None:
    """The collector sees the README's examples (a broken parser must not pass by finding none)."""
    assert sum(1 for e in ALL if e.path.name == "README.md") >= 3


@pytest.mark.parametrize("example", ALL, ids=[e.id for e in ALL])
def test_example_runs(example: Example, tmp_path: Path, moto_server) -> None:
    if example.skip:
        pytest.skip(example.skip)
    if example.torchrun or "import torch" in example.code or "from torch" in example.code:
        pytest.importorskip("torch")
    if "fuse" in example.needs and not (os.path.exists("/dev/fuse") and shutil.which("fusermount3")):
        pytest.skip("needs /dev/fuse and fusermount3")
    from servers import reset_moto

    reset_moto(moto_server)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = example_env(example, tmp_path, moto_server.env)
    client = s3_client(moto_server.env) if example.needs - {"local", "fuse"} else None
    for name in sorted(example.needs - {"local", "fuse"}):
        SETUP_FUNCTIONS[name](client, env, cwd)
    suffix = ".sh" if example.language == "bash" else ".py"
    script = tmp_path / f"example{suffix}"
    script.write_text(example.code)
    try:
        result = run_in_group(command(example, script), cwd, env)
    finally:
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    assert result.returncode == 0, (
        f"{example.id} failed (exit {result.returncode})\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-3000:]}"
    )
    # an example follows the fork rule it teaches: no worker forked after the I/O core started
    assert "obstore is not fork-safe" not in result.stderr, f"{example.id}:\n{result.stderr[-3000:]}"


def test_markers_parse() -> None:
    """The marker grammar: needs, torchrun, bash, skip with a reason; unknown words are errors."""
    example = Example(REPO / "README.md", 1, "python", "")
    parse_marker("needs pets, bucket; torchrun 2", example)
    assert example.needs == {"pets", "bucket"} and example.torchrun == 2
    skipped = Example(REPO / "README.md", 1, "python", "")
    parse_marker("skip: needs TensorFlow", skipped)
    assert skipped.skip == "needs TensorFlow"
    with pytest.raises(ValueError):
        parse_marker("needs nonsense", Example(REPO / "README.md", 1, "python", ""))
    with pytest.raises(ValueError):
        parse_marker("frobnicate", Example(REPO / "README.md", 1, "python", ""))


def test_skips_are_few() -> None:
    """Skipping is for fragments that cannot run here, sparingly."""
    skipped = [e.id for e in ALL if e.skip]
    assert len(skipped) <= max(3, len(ALL) // 4), skipped
