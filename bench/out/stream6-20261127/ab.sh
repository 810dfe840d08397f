#!/bin/bash
# dev A/B in one hold: env settings alternate, ROUNDS rounds
cd /tmp/stream6/dev
t() { for p in $(pgrep -x radosgw) $(pgrep -x ceph-osd); do awk '{print $14+$15}' /proc/$p/stat; done | awk -v h=$(getconf CLK_TCK) '{s+=$1} END {printf "%.2f", s/h}'; }
for r in $(seq ${ROUNDS:-2}); do
 for v in "$@"; do
  a=$(t)
  echo "== $v $(uptime | sed "s/.*load/load/")"
  env $v AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 PYTHONPATH=. \
   /work/bench-venv/bin/python -c "import os, json, instr, dev; dev.run(json.loads(os.environ.get(\"OPTS\", \"{}\")))" 2>&1 | grep "^epoch"
  b=$(t); echo "   server cpu $(echo "$b - $a" | bc)"
 done
done
