#!/usr/bin/env bash
# blockwire copy vs nbdcopy: a sparse-ish image (half data, half holes) copied between
# two NBD servers (blockwire serve on loopback), a few rounds each, alternating.
# nbdcopy runs with --flush: blockwire copy always flushes the destination before it
# reports success, so both finish with the copy on disk.
# Prints the median seconds of each and the speed ratio blockwire / nbdcopy, and
# keeps every round's seconds, the medians and that ratio with the machine and date
# in a new bench/results/copy-vs-nbdcopy[-N].json (or --json FILE).
#
# usage: bench/copy-vs-nbdcopy.sh [--json FILE] [SIZE (default 4G)] [ROUNDS (default 3)]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
json=
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --json) [ $# -ge 2 ] || { echo "--json needs a file name" >&2; exit 2; }; json=$2; shift 2 ;;
    --json=*) json=${1#--json=}; shift ;;
    *) positional+=("$1"); shift ;;
  esac
done
size=${positional[0]:-4G}
rounds=${positional[1]:-3}
command -v nbdcopy >/dev/null || { echo "nbdcopy missing (apt-get install libnbd-bin)" >&2; exit 1; }
(cd "$root" && cargo build --release --quiet -p blockwire)
bw="$root/target/release/blockwire"

work=$(mktemp -d /tmp/bw-copy-XXXXXX)
# Server PIDs go to a file: `serve` runs in a command substitution's subshell, where
# appending to an array would be lost.
cleanup() {
  [ -f "$work/pids" ] && while read -r pid; do kill "$pid" 2>/dev/null || true; done < "$work/pids"
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Source: 64 MiB of random data every 128 MiB, the rest holes.
truncate -s "$size" "$work/src.img"
bytes=$(stat -c %s "$work/src.img")
for ((offset = 0; offset < bytes; offset += 128 << 20)); do
  dd if=/dev/urandom of="$work/src.img" bs=1M count=64 seek=$((offset >> 20)) conv=notrunc status=none
done
sync

serve() { # serve FILE NAME -> prints the port
  "$bw" serve "$1" --name "$2" --listen 127.0.0.1:0 > "$work/$2.out" 2>/dev/null &
  echo $! >> "$work/pids"
  for _ in $(seq 100); do
    port=$(sed -n 's#.*nbd://127.0.0.1:\([0-9]*\)/.*#\1#p' "$work/$2.out" | head -1)
    [ -n "$port" ] && { echo "$port"; return; }
    sleep 0.05
  done
  echo "server for $1 did not start" >&2; exit 1
}
src_port=$(serve "$work/src.img" src)
truncate -s "$size" "$work/dst.img"
dst_port=$(serve "$work/dst.img" dst)
src="nbd://127.0.0.1:$src_port/src"
dst="nbd://127.0.0.1:$dst_port/dst"

reset_destination() { # punch the whole destination back to a hole
  fallocate --punch-hole --offset 0 --length "$bytes" "$work/dst.img"
  sync
}
timed() { local start end; start=$(date +%s.%N); "$@" >/dev/null; end=$(date +%s.%N); echo "$end - $start" | bc; }

declare -a t_nbdcopy t_blockwire
for ((r = 0; r < rounds; r++)); do
  reset_destination
  t_nbdcopy+=("$(timed nbdcopy --flush "$src" "$dst")")
  cmp "$work/src.img" "$work/dst.img" || { echo "nbdcopy produced a different image" >&2; exit 1; }
  reset_destination
  t_blockwire+=("$(timed "$bw" copy "$src" "$dst" --quiet)")
  cmp "$work/src.img" "$work/dst.img" || { echo "blockwire copy produced a different image" >&2; exit 1; }
  echo "round $((r + 1)): nbdcopy ${t_nbdcopy[r]} s, blockwire copy ${t_blockwire[r]} s" >&2
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
m_nbdcopy=$(median "${t_nbdcopy[@]}")
m_blockwire=$(median "${t_blockwire[@]}")
echo "image $size (half data), $rounds rounds, median seconds:"
echo "  nbdcopy         $m_nbdcopy"
echo "  blockwire copy  $m_blockwire"
ratio=$(awk -v a="$m_nbdcopy" -v b="$m_blockwire" 'BEGIN {printf "%.2f", a / b}')
echo "  speed ratio blockwire / nbdcopy: ${ratio}x"
# The figures printed above, as JSON numbers, with the machine and date (procs.py),
# in a new bench/results/copy-vs-nbdcopy[-N].json unless --json names a file.
python3 - "$here/lib" "$json" "$size" "$rounds" "${t_nbdcopy[*]}" "${t_blockwire[*]}" \
  "$m_nbdcopy" "$m_blockwire" "$ratio" <<'PY'
import sys
lib, path, size, rounds, nbdcopy, blockwire, m_nbdcopy, m_blockwire, ratio = sys.argv[1:]
sys.path.insert(0, lib)
import procs
procs.write_json(path or procs.results_path("copy-vs-nbdcopy"), {
    "size": size, "rounds": int(rounds),
    "nbdcopy_s": [float(t) for t in nbdcopy.split()],
    "blockwire_s": [float(t) for t in blockwire.split()],
    "median_nbdcopy_s": float(m_nbdcopy), "median_blockwire_s": float(m_blockwire),
    "speed_ratio_blockwire_over_nbdcopy": float(ratio)})
PY
