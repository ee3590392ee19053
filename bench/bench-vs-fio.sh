#!/usr/bin/env bash
# blockwire bench vs fio on the same workloads: on a local file (direct I/O, N threads
# of synchronous I/O on both sides) and on the same NBD export (fio's nbd engine, i.e.
# libnbd, vs blockwire's initiator, at the same queue depth). Prints both figures and
# the ratio blockwire / fio per job; the accuracy target is agreement within 10% on the
# local file, the speed target a ratio of at least 1.0 over NBD.
#
# Each job runs --rounds times per tool (default 2), alternating which goes first;
# the best figure of each is kept.
#
# The local jobs run on a file in /dev/shm by default: they check that both tools
# measure alike, and this machine's virtual disk swings too much between runs for
# that (--local-dir DIR runs them on another file system, e.g. a disk).
#
# Writes JSON (--json FILE; default bench/results/bench-vs-fio.json, or
# bench-vs-fio-PART.json for a --part run, which has only that part's rows) and ends
# with one verdict line per job and target (met / not met); missing a target does not
# make the script fail.
#
# The NBD jobs run against `blockwire serve` and, when it is installed, nbdkit's file
# plugin serving the same image (--nbd-servers blockwire,nbdkit picks).
#
# usage: [BLOCKWIRE_BIN=PATH] bench/bench-vs-fio.sh [--size 2G] [--time 5] [--rounds 2] [--dir DIR]
#                              [--local-dir DIR] [--part all|local|nbd] [--json FILE]
#                              [--nbd-servers blockwire,nbdkit]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
command -v fio >/dev/null || { echo "fio missing (apt-get install fio)" >&2; exit 1; }
# BLOCKWIRE_BIN=PATH measures that binary as it is (no build): a copy taken aside
# stays the same while others rebuild the tree.
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release --quiet -p blockwire)
fi
exec python3 "$here/lib/bench_vs_fio.py" --blockwire "$blockwire" "$@"
