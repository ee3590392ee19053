#!/usr/bin/env bash
# Serve the same file over AoE from vblade and from blockwire in turn, between two
# network namespaces joined by a veth pair, at MTU 1500 and 9000, and measure both
# with the same initiator (blockwire's): sequential 1 MiB write and read, random
# 4 KiB read at queue depth 16. Prints MB/s, IOPS, MB per target CPU-second and the
# ratios blockwire / vblade, in two settings:
#   durable   vblade -d  vs  blockwire serve --direct   (O_DIRECT on both)
#   buffered  vblade     vs  blockwire serve            (page cache on both)
# Needs root (namespaces, raw sockets). Shared machines are noisy: use --rounds.
#
# usage: bench/aoe-vs-vblade.sh [--size 1G] [--durable-size 128M] [--time 3] [--rounds 1]
#                               [--mtus 1500,9000] [--settings durable,buffered]
#                               [--dir /var/tmp] [--json FILE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "aoe-vs-vblade needs root (network namespaces and raw sockets)" >&2
  exit 1
fi
command -v vblade >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq vblade >/dev/null
}
(cd "$root" && cargo build --release -q -p blockwire)
exec python3 "$here/lib/aoe_vs_vblade.py" --blockwire "$root/target/release/blockwire" "$@"
