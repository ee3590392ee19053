#!/usr/bin/env bash
# Writes over iSCSI: the same prefilled file served by blockwire and by Debian's tgtd
# in turn (and tgtd's null store, the client's ceiling), driven by blockwire's own
# iSCSI initiator (iscsi-perf only reads): 1 MiB sequential writes with 16 in flight,
# 4 KiB random writes with 32 in flight. Interleaved rounds, medians; prints MB/s,
# IOPS, the server's CPU and MB per server CPU-second, and the ratios blockwire /
# tgtd; writes JSON (bench/results/iscsi-writes-vs-tgt.json). Needs root for tgtd.
#
# usage: bench/iscsi-writes-vs-tgt.sh [--size 512M] [--dir /var/tmp] [--time 5]
#                                     [--rounds 3] [--servers blockwire,tgt,tgt-null]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "iscsi-writes-vs-tgt needs root (tgtd's control socket lives in /var/run/tgtd)" >&2
  exit 1
fi
command -v tgtd >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tgt >/dev/null
}
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p blockwire)
fi
exec python3 "$here/lib/iscsi_writes_vs_tgt.py" --blockwire "$blockwire" "$@"
