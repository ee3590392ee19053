#!/usr/bin/env bash
# How fast can any AoE write go at MTU 1500 on this machine? Bounces AoE-shaped
# frames (1060-byte requests, 60-byte answers, a window of 256) between two network
# namespaces on a veth pair with a bare C program that does nothing else
# (bench/lib/frame_pingpong.c), through AF_PACKET as blockwire does and through
# AF_XDP, and measures blockwire's AoE sequential write (buffered) at MTU 1500 and
# 9000, and at MTU 1500 over its opt-in AF_XDP path (serve --aoe-xdp, aoe://...?xdp),
# in the same rounds. Prints each as MB/s and as a share of blockwire's MTU 9000
# write. Needs root. Shared machines are noisy: use --rounds.
#
# usage: bench/aoe-frame-ceiling.sh [--rounds 3] [--seconds 4] [--size 1G]
#                                   [--dir /var/tmp] [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "aoe-frame-ceiling needs root (network namespaces, raw and XDP sockets)" >&2
  exit 1
fi
if ! command -v gcc >/dev/null || [ ! -e /usr/include/xdp/xsk.h ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libxdp-dev libbpf-dev >/dev/null
fi
(cd "$root" && cargo build --release -q -p blockwire)
tool_dir=$(mktemp -d)
trap 'rm -rf "$tool_dir"' EXIT
gcc -O2 -Wall -Wextra -o "$tool_dir/frame_pingpong" "$here/lib/frame_pingpong.c" -lxdp -lbpf
python3 "$here/lib/aoe_frame_ceiling.py" --blockwire "$root/target/release/blockwire" \
  --pingpong "$tool_dir/frame_pingpong" "$@"
