#!/bin/bash
# A/B dev rounds: $1 = rounds; each round runs main then new (lading only, 2 epochs), under the bench lock per run.
# Prints server CPU (radosgw + ceph-osd) per run.
cd /work/wt-stream7/bench/out/stream7-20261127
t() { for p in $(pgrep -x radosgw) $(pgrep -x ceph-osd); do awk '{print $14+$15}' /proc/$p/stat; done | awk -v h=$(getconf CLK_TCK) '{s+=$1} END {printf "%.2f", s/h}'; }
for r in $(seq 1 ${1:-1}); do
  for v in ${VARIANTS:-main new}; do
    flock /work/bench.lock bash -c "
      a=\$($(declare -f t); t); echo \"== round $r $v \$(uptime | sed 's/.*load/load/')\"
      env AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 PYTHONPATH=/tmp/stream7/ab/$v \
        /work/bench-venv/bin/python dev.py run '${OPTS:-{\}}' 2>&1 | grep -v 'going over'
      b=\$($(declare -f t); t); echo \"server CPU: \$(echo \"\$b - \$a\" | bc) s\""
  done
done
