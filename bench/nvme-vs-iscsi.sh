#!/usr/bin/env bash
# One prefilled file served over iSCSI and NVMe/TCP by one `blockwire serve`
# process on loopback, measured through our own initiators (`blockwire bench`):
# 4 KiB random with 32 in flight and 1 MiB sequential with 16 in flight, reads and
# writes, rounds interleaved (the protocols take turns going first). Prints the
# medians of MB/s (10^6 bytes) and CPU milliseconds per MB on the initiator and the
# target (bench's cpu_percent and target_cpu_percent), then NVMe/TCP / iSCSI ratios
# (issue 33: throughput ≥ 1, CPU per MB ≤ 1); writes JSON
# (bench/results/nvme-vs-iscsi.json). --baseline BIN measures another blockwire
# binary the same way (serve and bench), for an A/B run. Server and client are
# pinned to different CPUs when there are two or more.
#
# usage: bench/nvme-vs-iscsi.sh [--size 1G] [--time 3] [--rounds 3] [--dir /var/tmp]
#                               [--baseline BIN] [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p blockwire)
fi
exec python3 "$here/lib/nvme_vs_iscsi.py" --blockwire "$blockwire" "$@"
