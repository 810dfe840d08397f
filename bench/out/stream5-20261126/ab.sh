#!/bin/bash
# dev A/B in one hold of the lock: each argument is an options json, run in turn, rounds times
cd /work/wt-stream5/bench/out/stream5-20261126
rounds=${ROUNDS:-2}
flock /work/bench.lock bash -c '
for r in $(seq '$rounds'); do
 for o in "$@"; do
  echo "== $o $(uptime | sed "s/.*load/load/")"
  env AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 PYTHONPATH=. INSTR_EVENTS=/tmp/stream5/ev-$r-$(echo $o | md5sum | cut -c1-6).txt \
   /work/bench-venv/bin/python -c "import sys, json, instr, dev; dev.run(json.loads(sys.argv[1]))" "$o" 2>&1 | grep -v "going over\|^\[worker"
 done
done' _ "$@"
