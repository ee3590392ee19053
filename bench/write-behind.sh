#!/usr/bin/env bash
# Whether `serve --write-behind` (the default, 16M) pays for itself: the same
# sequential 1 MiB QD16 write (fio's nbd engine) to a fresh file served with
# --write-behind 16M and with 0 (writeback left to the kernel), then one NBD flush
# right after it (qemu-io -c flush), timed on its own. Prints, per setting, what the
# client saw (MB/s until the last write was acknowledged), the flush's latency, the
# rate to stable storage (bytes / (write + flush time)) and the server's CPU-seconds;
# then 16M / 0 ratios. Rounds alternate the order; medians are reported.
#
# usage: bench/write-behind.sh [--size 4G] [--rounds 3] [--settings 16M,0] [--json FILE]
#
# --size sets how much is written: below the kernel's dirty limit (dirty_ratio of
# RAM) the client's rate is the page cache's; above it, both settings wait for the
# disk and the flush is short.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
for program in fio qemu-io; do
  command -v "$program" >/dev/null || { echo "missing: $program (fio, qemu-utils)" >&2; exit 1; }
done
(cd "$root" && cargo build --release --quiet -p blockwire)
exec python3 "$here/lib/write_behind.py" --blockwire "${CARGO_TARGET_DIR:-$root/target}/release/blockwire" "$@"
