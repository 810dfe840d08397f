#!/bin/bash
cd /tmp/lead10
while ! grep -q '^ab2done' ab-first.txt 2>/dev/null; do sleep 3; done
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) start 948a6f0 into fresh dest-ab4" >> ab-first.txt
( cd wt-948a6f0; /usr/bin/time -f "948a6f0 %e s %U u %S s %M KB" -a -o /tmp/lead10/ab-first.txt .venv/bin/python -m lading sync /tmp/bench-scale7/src-1280000 /tmp/bench-scale7/dest-ab4 --no-cache --json > /dev/null )
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) end 948a6f0" >> ab-first.txt
echo ab3done >> ab-first.txt
