#!/bin/bash
cd /tmp/lead10
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) start 8333a93 into fresh dest-ab5" >> ab-first.txt
( cd wt-8333a93; /usr/bin/time -f "8333a93 %e s %U u %S s %M KB" -a -o /tmp/lead10/ab-first.txt .venv/bin/python -m lading sync /tmp/bench-scale7/src-1280000 /tmp/bench-scale7/dest-ab5 --no-cache --json > /dev/null )
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) end 8333a93" >> ab-first.txt
echo ab4done >> ab-first.txt
