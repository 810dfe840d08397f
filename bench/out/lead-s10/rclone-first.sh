#!/bin/bash
cd /tmp/lead10
while ! grep -q '^done' ab-first.txt 2>/dev/null; do sleep 5; done
rm -rf /tmp/bench-scale7/dest-rc2; sync; sleep 5
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) start rclone" >> ab-first.txt
env -u AWS_CA_BUNDLE /usr/bin/time -f "rclone %e s %U u %S s %M KB" -a -o /tmp/lead10/ab-first.txt /work/benchenv/bin/rclone --config /tmp/bench-scale7/rclone.conf copy /tmp/bench-scale7/src-1280000 /tmp/bench-scale7/dest-rc2 --transfers 64 --checkers 64
echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg) end rclone $(find /tmp/bench-scale7/dest-rc2 -type f | wc -l) files" >> ab-first.txt
rm -rf /tmp/bench-scale7/dest-rc2
echo rcdone >> ab-first.txt
