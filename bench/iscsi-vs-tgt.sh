#!/usr/bin/env bash
# Serve the same prefilled file over iSCSI from blockwire and from Debian's tgtd in
# turn (and from tgtd's null store, which does no storage I/O: what tgtd's protocol
# path reaches at best), on loopback, and drive each with libiscsi's iscsi-perf:
# 4 KiB random reads with 32 in flight, 1 MiB sequential reads with 16 in flight.
# Interleaved rounds, medians; prints MB/s (10^6 bytes), IOPS, the server's CPU
# seconds (utime+stime from /proc/PID/stat over each run), MB per server
# CPU-second and the ratios blockwire / tgtd; writes JSON
# (bench/results/iscsi-vs-tgt.json). --baseline BIN serves another blockwire binary
# too, as blockwire-baseline, and prints blockwire / baseline (an A/B run).
# Needs root: tgtd's control socket lives in /var/run/tgtd. Server and client are
# pinned to different CPUs when there are two or more.
#
# usage: bench/iscsi-vs-tgt.sh [--size 1G] [--dir /var/tmp] [--time 5] [--rounds 3]
#                              [--servers blockwire,tgt,tgt-null] [--baseline BIN]
#                              [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "iscsi-vs-tgt needs root (tgtd's control socket lives in /var/run/tgtd)" >&2
  exit 1
fi
missing=()
command -v iscsi-perf >/dev/null || missing+=(libiscsi-bin)
command -v tgtd >/dev/null || missing+=(tgt)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
case " $* " in
  *" --servers "*blockwire*|*" --servers="*blockwire*) build=1 ;;
  *" --servers "*|*" --servers="*) build=0 ;;
  *) build=1 ;;
esac
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ "$build" = 1 ] && [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p blockwire)
fi
exec python3 "$here/lib/iscsi_vs_tgt.py" --blockwire "$blockwire" "$@"
