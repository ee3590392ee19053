#!/usr/bin/env bash
# Seed 003's protocol table on one host: one file, served by one `blockwire serve`
# over NBD, AoE and iSCSI at once, in a namespace joined to the initiator's by one
# veth link; `blockwire bench` measures it through each protocol's initiator (TCP
# baseline both ways, 1 MiB sequential with 16 in flight, bonnie++'s block phases
# and seeks), and
# `blockwire bench --compare` prints the runs side by side with each protocol's
# throughput as a fraction of the link's measured TCP throughput. Needs root.
#
# usage: bench/protocols.sh [--size 512M] [--time 3] [--mtu 9000] [--rate 1000 (Mbit/s; 0 unlimited)]
#                           [--dir /var/tmp] [--out DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

if [ "$(id -u)" != 0 ]; then
  echo "protocols.sh needs root (network namespaces and raw sockets)" >&2
  exit 1
fi
(cd "$root" && cargo build --release -q -p blockwire)
exec python3 "$here/lib/protocols.py" --blockwire "$root/target/release/blockwire" "$@"
