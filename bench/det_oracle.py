"""det's own reader as an oracle: run with the Python of a venv that has `determined` installed.

    /tmp/detvenv/bin/python bench/det_oracle.py CONTEXT [-i INCLUDE ...] [--limit BYTES]

Prints one JSON object: det's files {path: raw size}, directories, total (det's accounting),
error (det's ValueError text, e.g. over the limit or duplicate names) and the seconds
``read_v1_context`` took. Never imported by lading or its tests.
"""

import argparse
import base64
import contextlib
import io
import json
import pathlib
import sys
import tarfile
import time

from determined.common import context, v1file_utils


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("context")
    parser.add_argument("-i", "--include", action="append", default=[])
    parser.add_argument("--limit", type=int, default=10**15)
    args = parser.parse_args()
    result = {"files": {}, "dirs": [], "total": 0, "error": None, "seconds": 0.0}
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            items = context.read_v1_context(
                pathlib.Path(args.context), [pathlib.Path(p) for p in args.include], args.limit
            )
    except ValueError as err:
        result["error"] = str(err)
        items = []
    result["seconds"] = time.perf_counter() - started
    for item in items:
        if item.type == ord(tarfile.DIRTYPE):
            result["dirs"].append(item.path)
        else:
            result["files"][item.path] = len(base64.b64decode(item.content))
        result["total"] += v1file_utils.v1File_size(item)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
