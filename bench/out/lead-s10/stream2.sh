#!/bin/bash
cd /work/main
while ! grep -q '^rcdone' /tmp/lead10/ab-first.txt 2>/dev/null; do sleep 5; done
source ~/.lead-env
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) stream2" >> bench/out/lead-s10/loads.txt
/work/bench-venv/bin/python bench/bench_streaming.py stream --tools lading,litdata --litdata-workers 1 --epochs 2 --out bench/out/lead-s10/stream2 > bench/out/lead-s10/stream2.log 2>&1
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) stream2 end" >> bench/out/lead-s10/loads.txt
