#!/usr/bin/env bash
# blockwire's own network baseline (blockwire netserve + bench --workload network) vs
# iperf3 (iperf3 -s + bench --iperf-port, which runs iperf3 -c and -c -R) on loopback,
# same duration and streams, both directions. Prints MB/s and CPU% of each and the
# ratio blockwire / iperf3; on loopback both are bound by memory copies and CPU, so a
# ratio near 1.0 means our sender and receiver add nothing of their own.
#
# usage: bench/netserve-vs-iperf3.sh [--time SECS] [--streams N]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
time=5
streams=1
while [ $# -gt 0 ]; do
  case "$1" in
    --time) time=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    *) echo "usage: $0 [--time SECS] [--streams N]" >&2; exit 2 ;;
  esac
done
command -v iperf3 >/dev/null || { echo "iperf3 missing (apt-get install iperf3)" >&2; exit 1; }
(cd "$root" && cargo build --release --quiet -p blockwire)
bin="$root/target/release/blockwire"

tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
netserve_port=$(free_port)
iperf_port=$(free_port)
"$bin" netserve --listen "127.0.0.1:$netserve_port" >/dev/null 2>&1 &
pids+=($!)
iperf3 -s -B 127.0.0.1 -p "$iperf_port" >/dev/null 2>&1 &
pids+=($!)
sleep 1

# A host:port target names no device: only the network workload runs.
"$bin" bench "127.0.0.1:1" --workload network --time "$time" --network-streams "$streams" \
  --netserve-port "$netserve_port" --json "$tmp/netserve.json" >/dev/null
"$bin" bench "127.0.0.1:1" --workload network --time "$time" --network-streams "$streams" \
  --iperf-port "$iperf_port" --json "$tmp/iperf3.json" >/dev/null

python3 - "$tmp/netserve.json" "$tmp/iperf3.json" <<'PY'
import json, sys
ours, theirs = (json.load(open(p)) for p in sys.argv[1:3])
def phases(report):
    return {r["op"]: r for r in report["results"] if r["workload"] == "network"}
o, t = phases(ours), phases(theirs)
print(f"{'direction':<9} {'netserve MB/s':>13} {'iperf3 MB/s':>11} {'ratio':>6} "
      f"{'CPU% ours':>9} {'CPU% iperf3':>11} {'tgt CPU% ours':>13} {'tgt CPU% iperf3':>15}")
def cpu(value):
    return "-" if value is None else f"{value:.0f}"
for op in ("send", "receive"):
    if op not in o or op not in t:
        print(f"{op:<9} missing: netserve {op in o}, iperf3 {op in t}")
        continue
    a, b = o[op], t[op]
    print(f"{op:<9} {a['mb_per_s']:>13.0f} {b['mb_per_s']:>11.0f} {a['mb_per_s'] / b['mb_per_s']:>6.2f} "
          f"{cpu(a['cpu_percent']):>9} {cpu(b['cpu_percent']):>11} "
          f"{cpu(a['target_cpu_percent']):>13} {cpu(b['target_cpu_percent']):>15}")
PY
