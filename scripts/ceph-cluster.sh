#!/usr/bin/env bash
# A throwaway one-node Ceph cluster: one monitor and one BlueStore OSD on a sparse
# file, no manager (RBD needs none), no systemd, cephx on, msgr2 on a free loopback
# port, every file under DIR, and a pool `rbd` of size 1 for images. The one
# bring-up the RBD tests (tests/src/ceph.rs) and the RBD bench
# (bench/lib/rbd_gateway.py) share.
#
# usage: scripts/ceph-cluster.sh start DIR [--block-size BYTES] [--pgs N]
#                                          [--cache-size BYTES|auto] [--block-in-ram]
#          makes and starts the cluster in DIR (created if missing, must be empty),
#          waits until the OSD is up, and prints the path of its ceph.conf;
#          --block-in-ram puts the OSD's disk in /dev/shm, allocated whole at start
#        scripts/ceph-cluster.sh stop DIR       stops the OSD, then the monitor (and
#                                               frees a --block-in-ram disk)
#        scripts/ceph-cluster.sh kill-osd DIR   SIGKILLs the OSD (a crash) and marks
#                                               it down, so clients notice at once
#        scripts/ceph-cluster.sh start-osd DIR  starts the OSD again, waits until up
#
# Daemons run in the foreground of background jobs (so they share the caller's
# process group: an interrupted test run takes them along); their PIDs are in
# DIR/pid/. Every ceph command is bounded: without a manager some wait forever.
# Logs are in DIR/log/. stop leaves DIR for the caller to remove.
#
# Without --block-in-ram the OSD's disk is a sparse file in DIR, which BlueStore
# writes with O_DIRECT: every write to a part of it not written before makes the
# host's file system allocate blocks first, and BlueStore writes new data to fresh
# space, so write benchmarks keep paying that (and the host disk's own noise) round
# after round. In RAM and allocated whole, every round writes the same kind of space.
set -euo pipefail

LIMIT=120 # seconds one command, or a daemon's start, may take

die() {
  echo "ceph-cluster: $*" >&2
  exit 1
}

usage() {
  sed -n '8,18p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

bounded() {
  timeout --kill-after=5 "$LIMIT" "$@"
}

ceph_cmd() {
  bounded ceph -c "$dir/ceph.conf" "$@"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# daemon NAME PROGRAM ARGS...: starts PROGRAM in the foreground of a background job.
daemon() {
  local name=$1
  shift
  "$@" -c "$dir/ceph.conf" -f </dev/null >"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/pid/$name"
}

# wait_for WHAT COMMAND...: polls COMMAND until it succeeds, up to LIMIT seconds.
wait_for() {
  local what=$1
  shift
  local deadline=$((SECONDS + LIMIT))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what did not come up within $LIMIT s; logs in $dir/log"
    sleep 0.25
  done
}

mon_up() {
  ceph_cmd --connect-timeout 5 mon stat >/dev/null 2>&1
}

osd_up() {
  # {"epoch":..,"num_osds":1,"num_up_osds":1,...}
  ceph_cmd osd stat --format json 2>/dev/null | grep -q '"num_up_osds":1'
}

# free_ram_block: removes the /dev/shm directory a --block-in-ram OSD's disk is in
# (the OSD must be stopped); nothing for a disk in DIR.
free_ram_block() {
  local link="$dir/osd/block" target
  [ -L "$link" ] || return 0
  target=$(dirname "$(readlink "$link")")
  case $target in
    /dev/shm/ceph-cluster-*) rm -rf "$target" ;;
  esac
  rm -f "$link"
}

# stop_daemon NAME SIGNAL: signals the daemon, waits up to 10 s, then SIGKILLs it.
stop_daemon() {
  local pidfile="$dir/pid/$1" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  rm -f "$pidfile"
  kill "-$2" "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

start_osd() {
  [ ! -f "$dir/pid/osd" ] || die "the OSD is running already ($dir/pid/osd)"
  daemon osd ceph-osd -i 0
  wait_for "the OSD" osd_up
}

write_config() {
  local port=$1 fsid=$2 block_size=$3 cache_size=$4 block_in_ram=$5
  local cache prealloc=""
  # Allocating a RAM disk whole costs a second; a sparse file on disk stays sparse.
  [ "$block_in_ram" = 0 ] || prealloc="bluestore block preallocate file = true"
  if [ "$cache_size" = auto ]; then
    cache="bluestore cache autotune = true"
  else
    # A small fixed cache keeps a test cluster's memory low.
    cache="bluestore cache autotune = false
bluestore cache size = $cache_size
osd memory target = 939524096"
  fi
  cat >"$dir/ceph.conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
mon data = $dir/mon/\$cluster-\$id
osd data = $dir/osd/\$cluster-\$id
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
osd crush chooseleaf type = 0
osd objectstore = bluestore
bluestore block path = $dir/osd/block
bluestore block create = true
bluestore block size = $block_size
bluestore block db create = false
bluestore block wal create = false
$prealloc
$cache
[osd]
keyring = $dir/osd/\$cluster-\$id/keyring
CONF
}

start() {
  local block_size=10737418240 pgs=8 cache_size=134217728 block_in_ram=0
  while [ $# -gt 0 ]; do
    case $1 in
      --block-in-ram) block_in_ram=1; shift ;;
      --block-size) block_size=$2; shift 2 ;;
      --pgs) pgs=$2; shift 2 ;;
      --cache-size) cache_size=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  for program in ceph-mon ceph-osd ceph rbd monmaptool ceph-authtool; do
    command -v "$program" >/dev/null ||
      die "$program is not installed (Debian: ceph-mon ceph-osd ceph-common)"
  done
  mkdir -p "$dir"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
  mkdir -p "$dir"/{mon/ceph-a,osd/ceph-0,run,log,pid}
  if [ "$block_in_ram" = 1 ]; then
    local avail ram
    avail=$(df --output=avail -B1 /dev/shm | tail -1)
    [ "$avail" -gt "$block_size" ] ||
      die "--block-in-ram: /dev/shm has $avail bytes free, the OSD needs $block_size"
    ram=$(mktemp -d /dev/shm/ceph-cluster-XXXXXX)
    # BlueStore creates (and preallocates) the file through the link.
    ln -s "$ram/block" "$dir/osd/block"
  fi
  local port fsid
  port=$(free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  write_config "$port" "$fsid" "$block_size" "$cache_size" "$block_in_ram"

  bounded ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. \
    --cap mon 'allow *' >/dev/null
  bounded ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  bounded ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/keyring" >/dev/null
  bounded monmaptool --create --addv a "[v2:127.0.0.1:$port]" --fsid "$fsid" \
    "$dir/monmap" >/dev/null
  bounded ceph-mon -c "$dir/ceph.conf" --mkfs -i a --monmap "$dir/monmap" \
    --keyring "$dir/mon.keyring" >/dev/null
  daemon mon ceph-mon -i a
  wait_for "the monitor" mon_up

  local osd_uuid secret id
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  secret=$(bounded ceph-authtool --gen-print-key)
  printf '{"cephx_secret": "%s"}\n' "$secret" >"$dir/osd-secret.json"
  id=$(ceph_cmd osd new "$osd_uuid" -i "$dir/osd-secret.json")
  [ "$id" = 0 ] || die "the first OSD is osd.$id, not osd.0"
  bounded ceph-authtool --create-keyring "$dir/osd/ceph-0/keyring" --name osd.0 \
    --add-key "$secret" >/dev/null
  bounded ceph-osd -c "$dir/ceph.conf" -i 0 --mkfs --osd-uuid "$osd_uuid" \
    >"$dir/log/osd-mkfs.out" 2>&1 || die "ceph-osd --mkfs failed; see $dir/log/osd-mkfs.out"
  start_osd
  ceph_cmd osd pool create rbd "$pgs" "$pgs" >/dev/null
  ceph_cmd osd pool application enable rbd rbd >/dev/null
  echo "$dir/ceph.conf"
}

[ $# -ge 2 ] || usage
command=$1
dir=$(realpath -m "$2")
shift 2
case $command in
  start)
    # A failed start leaves nothing running.
    trap 'stop_daemon osd TERM; stop_daemon mon TERM; free_ram_block' EXIT
    start "$@"
    trap - EXIT
    ;;
  stop)
    # The OSD first, then the monitor (clients are the caller's to stop first).
    stop_daemon osd TERM
    stop_daemon mon TERM
    free_ram_block
    ;;
  kill-osd)
    stop_daemon osd KILL
    ceph_cmd osd down 0 >/dev/null 2>&1 || die "cannot mark osd.0 down"
    ;;
  start-osd) start_osd ;;
  *) usage ;;
esac
