#!/bin/bash
cd /tmp/lead10
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) start 6f7fbdc into fresh dest-ab6 (no deletion before)" >> ab-first.txt
( cd wt-6f7fbdc; /usr/bin/time -f "6f7fbdc %e s %U u %S s %M KB" -a -o /tmp/lead10/ab-first.txt .venv/bin/python -m lading sync /tmp/bench-scale7/src-1280000 /tmp/bench-scale7/dest-ab6 --no-cache --json > /dev/null )
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) end 6f7fbdc" >> ab-first.txt
echo ab5done >> ab-first.txt
