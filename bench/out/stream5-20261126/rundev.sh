#!/bin/bash
# dev loop: lading only, pack already in bench-stream5-dev; $1 = options json
cd /work/wt-stream5/bench/out/stream5-20261126
uptime
flock /work/bench.lock env AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 PYTHONPATH=. \
  /work/bench-venv/bin/python -c "import sys, instr, dev; sys.argv=['dev','run','${1:-{\}}']; dev.run(__import__('json').loads(sys.argv[2]))" 2>&1 | grep -v "going over"
uptime
