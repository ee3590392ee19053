#!/usr/bin/env bash
# What an AoE stream at link speed costs: two namespaces joined by one veth pair
# shaped with tc (default 400 Mbit/s), MTU 1500 and 9000; blockwire's AoE target,
# vblade and blockwire's NBD target serve the same file in turn, and `blockwire bench`
# drives each from the other namespace (sequential 1 MiB at QD16, then random 4 KiB
# at QD1 for latency). Every server moves what the link allows, so the CPU% of both
# ends (target: --target-pid; initiator: the bench process) is what differs; prints
# them with MB per CPU-second and the ratios against vblade and NBD, beside the bare
# frame path's cost at the same rate (bench/lib/frame_pingpong.c). Interleaved
# rounds, medians. Needs root. Not a test: shared machines are noisy.
#
# usage: bench/aoe-efficiency.sh [--rate 400] [--mtus 1500,9000] [--size 256M]
#                                [--time 3] [--rounds 2] [--servers aoe,vblade,nbd]
#                                [--dir /var/tmp] [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "aoe-efficiency needs root (network namespaces and raw sockets)" >&2
  exit 1
fi
command -v vblade >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq vblade >/dev/null
}
blockwire=${BLOCKWIRE_BIN:-$root/target/release/blockwire}
if [ -z "${BLOCKWIRE_BIN:-}" ]; then
  (cd "$root" && cargo build --release -q -p blockwire)
fi
# The bare frame path (frame_pingpong) gives the floor any AoE write pays here.
if ! command -v gcc >/dev/null || [ ! -e /usr/include/xdp/xsk.h ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libxdp-dev libbpf-dev >/dev/null
fi
tool_dir=$(mktemp -d)
trap 'rm -rf "$tool_dir"' EXIT
gcc -O2 -Wall -Wextra -o "$tool_dir/frame_pingpong" "$here/lib/frame_pingpong.c" -lxdp -lbpf
python3 "$here/lib/aoe_efficiency.py" --blockwire "$blockwire" \
  --pingpong "$tool_dir/frame_pingpong" "$@"
