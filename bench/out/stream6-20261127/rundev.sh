#!/bin/bash
# dev loop: lading only, pack in bench-stream6-dev; $1 = options json; PROFILE=file for py-spy
cd /tmp/stream6/dev
t() { for p in $(pgrep -x radosgw) $(pgrep -x ceph-osd); do awk '{print $14+$15}' /proc/$p/stat; done | awk -v h=$(getconf CLK_TCK) '{s+=$1} END {printf "%.2f", s/h}'; }
uptime
a=$(t)
PRE=""
if [ -n "$PROFILE" ]; then PRE="/work/benchenv/bin/py-spy record --subprocesses --format raw --rate 250 --nonblocking $SPYOPTS --output $PROFILE --"; fi
env AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 PYTHONPATH=. \
  $PRE /work/bench-venv/bin/python -c "import sys, instr, dev; dev.run(__import__('json').loads(sys.argv[1]))" "${1:-{\}}" 2>&1 | grep -v "going over"
b=$(t); echo "server CPU (radosgw + ceph-osd): $(echo "$b - $a" | bc) s"
uptime
