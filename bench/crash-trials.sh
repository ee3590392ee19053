#!/usr/bin/env bash
# Crash trials: writers keep writing through our NBD, iSCSI or AoE initiator (stamped
# blocks, overwrites, FUA on some, a flush every few) while `blockwire serve` is
# SIGKILLed at a random moment; then every write the target acknowledged must be in
# the file, and nothing in it that nobody wrote (tests/src/crash.rs). Buffered and
# --direct exports. Prints, per protocol and setting, the trials run, the writes
# checked and the trials that lost data (the goal: none). AoE needs root (it runs
# between two network namespaces).
#
# usage: bench/crash-trials.sh [--protocol nbd,iscsi,aoe] [--trials 100]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

protocols=nbd,iscsi,aoe
trials=100
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) protocols=$2; shift 2 ;;
    --trials) trials=$2; shift 2 ;;
    *) echo "usage: $0 [--protocol nbd,iscsi,aoe] [--trials N]" >&2; exit 2 ;;
  esac
done
cd "$root"
cargo build --release -q -p blockwire
BLOCKWIRE_CRASH_TRIALS=$trials BLOCKWIRE_CRASH_PROTOCOLS=$protocols \
  cargo test --release -q -p blockwire-tests --test crash_trials -- --nocapture --test-threads 1 2>&1 |
  grep -E '^crash trials|trial [0-9]+:|test result'
