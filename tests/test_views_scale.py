"""`lading fetch --slots` / `hook run` at scale (issue 27): the per-slot views and their records
stream, so their memory does not grow with the key count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_VIEWS_SCRIPT = """
import resource, sys
from pathlib import Path
from lading.hooks.stage import VIEW_RECORD, build_views, view_root

count, root = int(sys.argv[1]), Path(sys.argv[2])
root.mkdir()
(root / "x").touch()

def keys():  # ImageNet-like keys, in key order, never held as a list
    per = count // 200
    return (f"train/n{f:08d}/n{f:08d}_{i:06d}.JPEG" for f in range(200) for i in range(per))

def fewer():  # a tenth of the keys left the view
    return (key for key in keys() if not key.endswith("0.JPEG"))

staged = lambda key: root / "x"  # every key is one staged file: the bookkeeping is what counts
build_views(root, staged, {0: keys})
build_views(root, staged, {0: fewer})
with open(view_root(root, 0) / VIEW_RECORD) as record:  # a JSON array, one key a line
    lines = sum(1 for _ in record)
assert lines == count - count // 10 + 2, lines
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _views_peak_kb(tmp_path: Path, count: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _VIEWS_SCRIPT, str(count), str(tmp_path / f"staged{count}")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip())


def test_view_memory_does_not_grow_with_the_key_count(tmp_path):
    small = _views_peak_kb(tmp_path, 20_000)
    large = _views_peak_kb(tmp_path, 200_000)
    # the lists of keys, the paths and the whole previous record held in memory: +60 MB and more
    assert large - small < 16 * 1024, (small, large)
