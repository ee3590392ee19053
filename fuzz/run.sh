#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer on the stable toolchain (the flags cargo-fuzz
# passes with `-s none`) and runs each for SECONDS (default 60), starting from the
# committed seeds in fuzz/corpus/TARGET. Fails on the first crash, and on any input
# that runs longer than 10 s (a hang). Crash files go to $FUZZ_ARTIFACTS (default
# /tmp/blockwire-fuzz-artifacts), outside the source tree, and are printed.
#
# New inputs go to $FUZZ_CORPUS/TARGET (default: a temporary directory, removed at
# the end), so the committed seeds stay as they are; point FUZZ_CORPUS at a
# directory that you keep to let a long campaign resume where it stopped.
#
# usage: fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(nbd_wire nbd_server aoe_wire aoe_target netperf_wire iscsi_pdu iscsi_login iscsi_session scsi_cdb nvme_pdu nvme_controller)
artifacts=${FUZZ_ARTIFACTS:-/tmp/blockwire-fuzz-artifacts}
if [ -n "${FUZZ_CORPUS:-}" ]; then
  corpus=$FUZZ_CORPUS
else
  corpus=$(mktemp -d)
  trap 'rm -rf "$corpus"' EXIT
fi
mkdir -p "$artifacts"

triple=$(rustc -vV | sed -n 's/^host: //p')
# The instrumented build always goes to fuzz/target, whatever CARGO_TARGET_DIR the
# caller uses for the workspace: the binaries are looked for there.
export CARGO_TARGET_DIR="$PWD/target"
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions" \
  cargo build --release --bins --target "$triple"

failed=()
for target in "${targets[@]}"; do
  mkdir -p "$corpus/$target" "corpus/$target"
  log="$corpus/$target.log"
  if "./target/$triple/release/$target" "$corpus/$target" "corpus/$target" \
      -max_total_time="$seconds" -timeout=10 -max_len=8192 -rss_limit_mb=4096 \
      -artifact_prefix="$artifacts/$target-" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $target: ${runs:-?} runs in ${seconds}s, ${coverage:-cov: ?}, no crash"
  else
    failed+=("$target")
    echo "fuzz $target: FAILED" >&2
    grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" >&2 || tail -20 "$log" >&2
    for crash in "$artifacts/$target-"*; do
      [ -f "$crash" ] || continue
      echo "-- $crash:" >&2
      od -A x -t x1z "$crash" | head -32 >&2
    done
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]} (inputs in $artifacts)" >&2
  exit 1
fi
