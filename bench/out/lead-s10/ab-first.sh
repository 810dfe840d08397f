#!/bin/bash
cd /tmp/lead10
for rev in c1eb6bd 6f7fbdc; do
  rm -rf /tmp/bench-scale7/dest-ab; sync; sleep 5
  echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) start $rev" >> ab-first.txt
  ( cd wt-$rev; /usr/bin/time -f "$rev %e s %U u %S s %M KB" -a -o /tmp/lead10/ab-first.txt .venv/bin/python -m lading sync /tmp/bench-scale7/src-1280000 /tmp/bench-scale7/dest-ab --no-cache --json > /dev/null )
  echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) end $rev" >> ab-first.txt
done
rm -rf /tmp/bench-scale7/dest-ab
echo done >> ab-first.txt
