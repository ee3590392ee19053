#!/usr/bin/env bash
# Our iSCSI initiator against libiscsi's: on the same target — Debian's tgtd and
# `blockwire serve --iscsi`, each serving one prefilled file on loopback — run
# `blockwire bench iscsi://...` and libiscsi's iscsi-perf at the same queue depth:
# 1 MiB sequential reads with 16 in flight, 4 KiB random reads with 32 in flight.
# Interleaved rounds, medians; prints MB/s, IOPS and ours / libiscsi; writes JSON
# (bench/results/iscsi-initiator-vs-libiscsi.json). The aim: at least 1.0x.
# Needs root for tgtd (its control socket lives in /var/run/tgtd); with
# --targets blockwire it does not.
#
# usage: bench/iscsi-initiator-vs-libiscsi.sh [--size 512M] [--dir /var/tmp] [--time 5]
#                                             [--rounds 3] [--targets tgt,blockwire]
#                                             [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
command -v iscsi-perf >/dev/null || { echo "iscsi-perf missing (package libiscsi-bin)" >&2; exit 1; }
case " $* " in
  *" --targets blockwire "*|*" --targets=blockwire "*) ;;
  *)
    command -v tgtd >/dev/null || { echo "tgtd missing (package tgt)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "tgtd needs root (or pass --targets blockwire)" >&2; exit 1; }
    ;;
esac
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p blockwire)
fi
mkdir -p "$root/bench/results"
json=$root/bench/results/iscsi-initiator-vs-libiscsi.json
exec python3 "$here/lib/iscsi_initiator_vs_libiscsi.py" --blockwire "$blockwire" \
  --json "$json" "$@"
