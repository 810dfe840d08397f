#!/bin/bash
# Single-node Ceph RADOS Gateway for the sync benchmarks (throwaway; no systemd, no auth).
# One monitor, one memstore OSD and radosgw, serving S3 at http://127.0.0.1:$RGW_PORT
# with access key "test" / secret "test".
#
#   bench/rgw.sh install   apt-get radosgw ceph-mon ceph-osd ceph-common curl rclone
#   bench/rgw.sh start     fresh cluster in $RGW_DIR (~15 s); prints "ready" once S3 answers
#   bench/rgw.sh stop      stop the daemons started here, by their recorded PIDs
#   bench/rgw.sh status    exit 0 when S3 answers
#
# Environment: RGW_DIR (/tmp/lading-rgw), RGW_PORT (7480), RGW_MON_PORT (3300: give a second
# cluster its own, with its own RGW_DIR and RGW_PORT), RGW_STORE (memstore|bluestore),
# RGW_MEM_BYTES (memstore capacity, 12 GiB). Deleted objects are garbage-collected after 30-90 s.
set -euo pipefail
dir=${RGW_DIR:-/tmp/lading-rgw}
port=${RGW_PORT:-7480}
mon_port=${RGW_MON_PORT:-3300}
store=${RGW_STORE:-memstore}
conf="$dir/ceph.conf"

do_install() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    radosgw ceph-mon ceph-osd ceph-common curl rclone >/dev/null
}

write_config() {
  local fsid=$1
  cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 5
mon max pg per osd = 1000
osd objectstore = $store
memstore device bytes = ${RGW_MEM_BYTES:-12884901888}
bluestore block path = $dir/osd-\$id.block
bluestore block create = true
bluestore block size = 21474836480
bluestore cache autotune = false
osd memory target = 1073741824
osd op num shards = 1
osd op num threads per shard = 2
osd fast shutdown notify mon = false
ms bind ipv4 = true
ms bind ipv6 = false
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
keyring = $dir/keyring
mon data = $dir/mon.\$id
osd data = $dir/osd.\$id

[client.rgw]
# auth is off, so the monitor connection must not ask for "secure" mode
ms mon client mode = crc
auth client required = none
# Nagle's algorithm otherwise delays small responses by ~40 ms
rgw frontends = beast endpoint=127.0.0.1:$port tcp_nodelay=1
rgw dns name = localhost
rgw thread pool size = 64
# memstore holds deleted objects' tails until RGW's garbage collector runs (2 h by default): a
# deleted bench bucket must give its memory back within a minute, or the OSD grows until OOM-killed
rgw gc obj min wait = 30
rgw gc processor period = 60
log file = $dir/log/rgw.log
CONF
}

wait_for() {  # wait_for SECONDS CMD...: poll CMD until it succeeds
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "timed out waiting for: $*" >&2; exit 1; }
    sleep 0.2
  done
}

osd_up() { timeout 3 ceph -c "$conf" osd stat 2>/dev/null | grep -q "1 up"; }
s3_up() { curl -s -o /dev/null "http://127.0.0.1:$port/"; }

spawn() {  # spawn NAME CMD...: start a daemon in its own session, remember its PID
  local name=$1; shift
  setsid "$@" -f >"$dir/log/$name.stdout" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

do_start() {
  command -v radosgw >/dev/null || { echo "radosgw missing: run '$0 install' first" >&2; exit 2; }
  rm -rf "$dir"
  mkdir -p "$dir"/{mon.a,run,log,pids}
  local fsid; fsid=$(cat /proc/sys/kernel/random/uuid)
  write_config "$fsid"
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
  spawn ceph-mon ceph-mon -c "$conf" -i a
  wait_for 60 timeout 3 ceph -c "$conf" mon stat
  local osd; osd=$(timeout 20 ceph -c "$conf" osd create)
  mkdir -p "$dir/osd.$osd"
  ceph-osd -c "$conf" -i "$osd" --mkfs --osd-uuid "$(cat /proc/sys/kernel/random/uuid)" \
    >"$dir/log/osd-mkfs.log" 2>&1
  spawn ceph-osd ceph-osd -c "$conf" -i "$osd"
  wait_for 60 osd_up
  spawn radosgw radosgw -c "$conf" -n client.rgw
  wait_for 60 s3_up
  radosgw-admin -c "$conf" user create --uid test --display-name test \
    --access-key test --secret test >/dev/null 2>&1 || true
  echo "ready: http://127.0.0.1:$port (access key test, secret test)"
}

do_stop() {
  # gateway first and monitor last; the other order hangs on shutdown
  local name pid
  for name in radosgw ceph-osd ceph-mon; do
    pid=$(cat "$dir/pids/$name" 2>/dev/null) || continue
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$dir/pids/$name"
  done
}

case "${1:-}" in
  install) do_install ;;
  start) do_start ;;
  stop) do_stop ;;
  status) s3_up ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
