#!/usr/bin/env bash
# Serve the same prefilled file from blockwire, nbdkit (file plugin), qemu-nbd and
# nbd-server in turn, on loopback, and drive each with fio's nbd engine: sequential
# 1 MiB write and read at iodepth 16, random 4 KiB read and write at iodepth 32.
# Prints MB/s, IOPS, server CPU seconds, MB per server CPU-second and the ratio
# blockwire / nbdkit for every job; writes everything as JSON.
#
# All servers run at once; each job is run by each server in turn, for several rounds
# with the order rotated, and medians are reported (shared machines are noisy).
#
# usage: bench/nbd-vs-peers.sh [--size 4G] [--runtime 10] [--rounds 3] [--json FILE] [--dir DIR]
#                              [--servers blockwire,nbdkit,qemu-nbd,nbd-server,nbdkit-null]
#                              [--tls] [--baseline OTHER_BLOCKWIRE_BINARY]
#
# --baseline serves a second blockwire build as "blockwire-baseline" (add it to
# --servers), so a change is measured against the code before it in the same run.
#
# --tls measures the cost of TLS: every server requires it with one pre-shared key
# (blockwire --tls require --tls-psk FILE, nbdkit --tls=require --tls-psk=FILE,
# qemu-nbd with a tls-creds-psk object), and clients connect to nbds://...?tls-psk-file=
# FILE. fio's nbd engine cannot take a key file (libnbd refuses local files in URIs
# unless the program allows them), so the sequential jobs run nbdcopy over the whole
# image instead (libnbd and GnuTLS, as fio) and the random ones `blockwire bench
# --workload random` (our initiator): the same client for every server. The servers
# default to blockwire,nbdkit,qemu-nbd (nbd-server's TLS needs certificates).
#
# blockwire-metrics is blockwire with `--metrics` on (every request counted), to
# compare with blockwire: `--servers blockwire,blockwire-metrics`.
#
# nbdkit-null has no storage behind it (reads are zeroes, writes are dropped): what the
# client reaches there is its own ceiling on this machine, printed as null/nbdkit, the
# most any server could gain over nbdkit with this client. fio's CPU% is printed too.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

need=()
command -v fio >/dev/null || need+=(fio)
command -v nbdkit >/dev/null || need+=(nbdkit)
command -v qemu-nbd >/dev/null || need+=(qemu-utils)
command -v nbd-server >/dev/null || need+=(nbd-server)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing: ${need[*]} (install them, or run as root)" >&2
    exit 1
  fi
fi

(cd "$root" && cargo build --release --quiet -p blockwire)
exec python3 "$here/lib/nbd_vs_peers.py" --blockwire "${CARGO_TARGET_DIR:-$root/target}/release/blockwire" "$@"
