#!/bin/bash
cd /tmp/lead10
while ! grep -q 'stream2 end' /work/main/bench/out/lead-s10/loads.txt 2>/dev/null; do sleep 5; done
for pair in "6f7fbdc dest-ab2" "c1eb6bd dest-ab3"; do
  set -- $pair
  echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) start $1 into fresh $2" >> ab-first.txt
  ( cd wt-$1; /usr/bin/time -f "$1 %e s %U u %S s %M KB" -a -o /tmp/lead10/ab-first.txt .venv/bin/python -m lading sync /tmp/bench-scale7/src-1280000 /tmp/bench-scale7/$2 --no-cache --json > /dev/null )
  echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) end $1" >> ab-first.txt
done
echo ab2done >> ab-first.txt
