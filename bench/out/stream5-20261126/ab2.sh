#!/bin/bash
# dev A/B in one hold: env settings alternate (A: DEV_MMAP=1, B: pread), ROUNDS rounds
cd /work/wt-stream5/bench/out/stream5-20261126
flock /work/bench.lock bash -c '
for r in $(seq '${ROUNDS:-3}'); do
 for v in "$@"; do
  echo "== $v $(uptime | sed "s/.*load/load/")"
  env $v AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 PYTHONPATH=. \
   /work/bench-venv/bin/python -c "import json, dev; dev.run({})" 2>&1 | grep "^epoch"
 done
done' _ "$@"
