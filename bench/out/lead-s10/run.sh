#!/bin/bash
# The lead's idle runs of record at the end of session 10 (main's head; helpers stopped).
source ~/.lead-env
export PATH=/work/benchenv/bin:$PATH
cd /work/main
OUT=bench/out/lead-s10
mkdir -p $OUT
log() { echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $*" >> $OUT/loads.txt; }
log "start $(git rev-parse --short HEAD)"
/work/main/.venv/bin/python -m pip --python /work/bench-venv/bin/python install -q --no-deps --no-build-isolation -e /work/main > /dev/null 2>&1
log small; LADING_BENCH_BUCKET=bench-lead10-small .venv/bin/python bench/bench_sync.py --only small --small-count 2000 --rounds 4 --tools new,baseline,s5cmd,rclone,obstore --baseline /work/wt-hotpath7base --out $OUT/small > $OUT/small.log 2>&1
log big; LADING_BENCH_BUCKET=bench-lead10-big .venv/bin/python bench/bench_sync.py --only big --rounds 4 --tools new,baseline,s5cmd,rclone,obstore --baseline /work/wt-hotpath7base --out $OUT/big > $OUT/big.log 2>&1
for b in bench-lead10-small bench-lead10-big; do aws s3 rb s3://$b --force > /dev/null 2>&1; done
log startup; .venv/bin/python bench/bench_startup.py --baseline /work/wt-hotpath7base --rounds 10 > $OUT/startup.log 2>&1
log stream; /work/bench-venv/bin/python bench/bench_streaming.py stream --tools lading,litdata,mosaic --litdata-workers 1 --epochs 2 --out $OUT/stream > $OUT/stream.log 2>&1
log mount; .venv/bin/python bench/bench_mount.py --only random,seq --tools lading,s3fs,direct --rounds 3 --out $OUT/mount --cleanup > $OUT/mount.log 2>&1
log scale-first; rm -rf /tmp/bench-scale7/dest-lading /tmp/bench-scale7/dest-lading.done
.venv/bin/python bench/bench_sync_scale.py --only local --tools lading,rclone --keep --noop-rounds 3 --work /tmp/bench-scale7 > $OUT/scale.log 2>&1
log end
