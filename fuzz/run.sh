#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer on the stable toolchain (the flags cargo-fuzz
# passes with `-s none`) and runs each for SECONDS (default 60).
# usage: fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(nbd_wire nbd_server aoe_wire aoe_target netperf_wire iscsi_pdu iscsi_login)
triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions" \
  cargo build --release --bins --target "$triple"
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  "./target/$triple/release/$target" "corpus/$target" -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=4096
done
