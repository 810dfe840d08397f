#!/bin/bash
# CPU seconds of radosgw + ceph-osd while a command runs
t() { for p in $(pgrep -x radosgw) $(pgrep -x ceph-osd); do awk '{print $14+$15}' /proc/$p/stat; done | awk -v h=$(getconf CLK_TCK) '{s+=$1} END {printf "%.2f", s/h}'; }
a=$(t); "$@"; b=$(t); echo "server CPU (radosgw + ceph-osd): $(echo "$b - $a" | bc) s"
