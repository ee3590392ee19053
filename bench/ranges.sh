#!/usr/bin/env bash
# The range of every ratio over the runs kept in bench/results, per series of runs
# (nbd-vs-peers.json, nbd-vs-peers-2.json, ... are one series; nbd-vs-peers-tls.json
# starts another): per job and ratio (blockwire / peer, MB per CPU-second where the
# runs have it) the lowest and highest value and how many runs gave it, beside the
# machine and date of each run. Files whose shape it does not know are named, not
# ranged. Reads only; needs python3.
#
# usage: bench/ranges.sh [SERIES...] [--since DATE] [--machine-cpu SUBSTRING] [--dir DIR]
#   e.g. bench/ranges.sh nbd-vs-peers nvme-vs-iscsi --since 2026-11-28
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec python3 "$here/lib/ranges.py" "$@"
