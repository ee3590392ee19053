#!/usr/bin/env bash
# What blockwire costs in front of Ceph: one throwaway one-node cluster (one mon,
# one BlueStore OSD whose disk is in RAM, allocated whole: --osd-disk file for a
# sparse file on the host's disk, where every write round pays the file system's
# allocation; cephx on, everything in a temp dir), one
# prefilled image, and in interleaved rounds: fio's rbd engine (librbd in-process,
# the most any client gets from this cluster: the ceiling), blockwire serving the
# image over NBD (fio's nbd engine) and over iSCSI (libiscsi's iscsi-perf for reads,
# blockwire's own initiator for writes), and tgtd with --bstype rbd (Debian tgt-rbd)
# over iSCSI. The direct client runs without librbd's cache, as the gateway does
# (--direct-cache on for fio's default). The image is read once whole before the
# first round, so every round finds the OSD's cache in the same state. Jobs: 4 KiB
# random read and write at QD32, 1 MiB sequential read and write at QD16. Prints medians,
# the ratios to the ceiling and to tgt-rbd, and each server's CPU seconds per GB
# moved, and which rounds land more than 2x from their median (fio's runs also keep
# their MB/s per 500 ms, where a stall shows); writes JSON
# (bench/results/rbd-gateway.json). --pin CLUSTER,CLIENT[,GATEWAY] puts the cluster,
# the clients and the gateways on cores of their own (taskset). Needs root (tgtd's
# control socket). Not a test: shared machines are noisy.
#
# usage: bench/rbd-gateway.sh [--size 1G] [--time 10] [--rounds 3] [--osd-disk ram|file]
#                             [--servers direct,nbd,iscsi,tgt-rbd] [--pin 0,1[,GW]]
#                             [--direct-cache off|on]
#                             [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "rbd-gateway needs root (tgtd's control socket lives in /var/run/tgtd)" >&2
  exit 1
fi
missing=()
command -v ceph-mon >/dev/null || missing+=(ceph-mon)
command -v ceph-osd >/dev/null || missing+=(ceph-osd)
command -v rbd >/dev/null || missing+=(ceph-common)
command -v fio >/dev/null || missing+=(fio)
command -v iscsi-perf >/dev/null || missing+=(libiscsi-bin)
command -v tgtd >/dev/null || missing+=(tgt)
[ -e /usr/lib/x86_64-linux-gnu/tgt/backing-store/bs_rbd.so ] || [ -n "$(dpkg -L tgt-rbd 2>/dev/null | grep bs_rbd)" ] || missing+=(tgt-rbd)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p blockwire)
fi
exec python3 "$here/lib/rbd_gateway.py" --blockwire "$blockwire" "$@"
