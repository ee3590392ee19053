#!/usr/bin/env python3
"""Measures the raw frame path's ceiling at MTU 1500 (frame_pingpong, through
AF_PACKET and AF_XDP) beside blockwire's AoE sequential write at MTU 1500 and 9000,
in the same namespaces and the same rounds; see aoe-frame-ceiling.sh."""

import argparse
import os
import select
import subprocess
import sys

from aoe_vs_vblade import (INITIATOR_NS, PIN_INITIATOR, PIN_TARGET, TARGET_NS, URI, Lab,
                           fmt, in_ns, measure, median, sh, stop)
from procs import results_path, write_json  # noqa: E402

MODES = ["packet", "xdp", "xdp-generic"]
LABELS = {
    "packet": "frame path, AF_PACKET ring + sendmmsg",
    "xdp": "frame path, AF_XDP copy, driver hook",
    "xdp-generic": "frame path, AF_XDP copy, generic hook",
    "aoe-1500": "blockwire AoE write, MTU 1500",
    "aoe-1500-xdp": "blockwire AoE write, MTU 1500, AF_XDP",
    "aoe-9000": "blockwire AoE write, MTU 9000",
}


def pingpong(tool, mode, seconds):
    """MB/s of 1 KiB payloads the bare reflector answered, or None if the mode
    cannot run here (no AF_XDP, no XDP on the interface)."""
    reflector = subprocess.Popen(in_ns(TARGET_NS, *PIN_TARGET, tool, "reflect", mode, "eth0"),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([reflector.stdout], [], [], 30)
        if not ready or reflector.stdout.readline().strip() != "ready":
            if reflector.poll() is None:
                reflector.kill()
            reflector.wait()
            print(f"  {mode}: reflector failed: {reflector.stderr.read().strip()}",
                  file=sys.stderr)
            return None
        blast = subprocess.run(
            in_ns(INITIATOR_NS, *PIN_INITIATOR, tool, "blast", mode, "eth0", str(seconds)),
            capture_output=True, text=True, timeout=seconds + 60)
    finally:
        if reflector.poll() is None:
            stop(reflector)  # SIGTERM: the reflector detaches what it attached
    if blast.returncode != 0:
        print(f"  {mode}: blaster failed: {blast.stderr.strip()}", file=sys.stderr)
        return None
    fields = blast.stdout.split()
    return float(fields[fields.index("MB/s") + 1])


def aoe_write(lab, mtu, image, size, blockwire, xdp=False):
    """blockwire's buffered sequential write; with `xdp`, both ends over AF_XDP."""
    lab.mtu(mtu)
    rows, _ = measure("blockwire", "buffered", image, size, 3, blockwire,
                      workloads="sequential",
                      serve_args=["--aoe-xdp"] if xdp else [],
                      uri=URI + "?xdp" if xdp else URI)
    return rows.get("seq-write-1M", {}).get("mb_per_s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4, help="per frame-path run")
    parser.add_argument("--size", default="1G", help="blockwire's write")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", help="where the results go (default: the next free "
                        "bench/results/aoe-frame-ceiling[-N].json)")
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--pingpong", required=True)
    args = parser.parse_args()

    image = os.path.join(args.dir, "aoe-frame-ceiling.img")
    runs = {key: [] for key in LABELS}
    with Lab() as lab:
        try:
            sh("fallocate", "-l", args.size, image)
            for round_ in range(args.rounds):
                print(f"round {round_ + 1}", file=sys.stderr)
                lab.mtu(1500)
                for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
                    runs[mode].append(pingpong(args.pingpong, mode, args.seconds))
                ours = [("aoe-1500", 1500, False), ("aoe-1500-xdp", 1500, True),
                        ("aoe-9000", 9000, False)]
                for key, mtu, xdp in (ours if round_ % 2 == 0 else ours[::-1]):
                    runs[key].append(aoe_write(lab, mtu, image, args.size, args.blockwire,
                                               xdp))
        finally:
            sh("rm", "-f", image)

    reference = median(runs["aoe-9000"])
    header = f"{'path (MTU 1500 unless said)':42} {'MB/s':>7}  {'% of our MTU 9000 write':>23}  runs"
    print(header)
    print("-" * len(header))
    table = []
    for key, label in LABELS.items():
        value = median(runs[key])
        share = 100 * value / reference if value and reference else None
        shown = " ".join(fmt(v, 0) for v in runs[key])
        print(f"{label:42} {fmt(value, 0):>7}  {fmt(share, 0):>23}  {shown}")
        table.append({"path": key, "label": label, "mb_per_s": value,
                      "percent_of_mtu9000_write": share, "runs": runs[key]})
    write_json(args.json or results_path("aoe-frame-ceiling"),
               {"rounds": args.rounds, "seconds": args.seconds, "size": args.size, "results": table})


if __name__ == "__main__":
    main()
