#!/usr/bin/env python3
"""One file served over NBD, AoE and iSCSI by one blockwire process, measured through
each protocol's initiator over the same veth link; see protocols.sh."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from shaped_link import PIN_INITIATOR, PIN_TARGET, TARGET_IP, ShapedLink, in_ns, sh

NBD_PORT, ISCSI_PORT, NETSERVE_PORT = 10809, 3260, 10810
SHELF, SLOT = 1, 1


def serve(link, blockwire, image):
    """Starts the target and waits until every protocol is up; returns the process
    and the iSCSI URL it announced."""
    cmd = in_ns(link.target, *PIN_TARGET, blockwire, "serve", image, "--name", "disk",
                "--listen", f"{TARGET_IP}:{NBD_PORT}",
                "--aoe", "eth0", "--shelf", str(SHELF), "--slot", str(SLOT),
                "--iscsi", f"{TARGET_IP}:{ISCSI_PORT}",
                "--netserve", f"{TARGET_IP}:{NETSERVE_PORT}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    iscsi = None
    deadline = time.time() + 30
    for line in proc.stdout:
        if line.strip().startswith("iscsi://"):
            iscsi = line.strip()
        if "press Ctrl-C to stop" in line:
            break
        if time.time() > deadline:
            break
    if iscsi is None:
        proc.kill()
        sys.exit("the target did not come up (no iSCSI URL announced)")
    # Keep draining its output so it never blocks on a full pipe.
    subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.DEVNULL)
    return proc, iscsi


def bench(link, blockwire, uri, label, workloads, target_pid, args, out):
    # `ip netns exec` and taskset exec the target: its PID is blockwire's.
    cmd = in_ns(link.initiator, *PIN_INITIATOR, blockwire, "bench", uri,
                "--workload", workloads, "--size", args.size, "--time", str(args.time),
                "--netserve-port", str(NETSERVE_PORT), "--target-pid", str(target_pid),
                "--label", label, "--json", out)
    print(f"== {label}: {uri}", flush=True)
    sh(*cmd, stdout=subprocess.DEVNULL)


def parse_mib(text):
    units = {"K": 1 / 1024, "M": 1, "G": 1024}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return max(1, int(float(text[:-1]) * units[text[-1]]))
    return max(1, int(text) // (1 << 20))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--size", default="512M")
    parser.add_argument("--time", type=int, default=3)
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--rate", type=int, default=1000,
                        help="link rate in Mbit/s, seed 003's gigabit by default (0: unlimited)")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--out", default=None, help="directory for the JSON reports")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="bw-protocols-")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as work, \
            ShapedLink("bwproto", args.mtu, args.rate) as link:
        image = os.path.join(work, "disk.img")
        # Written through once, so no protocol pays for allocating the file.
        size_mib = parse_mib(args.size)
        sh("dd", "if=/dev/zero", f"of={image}", "bs=1M", f"count={size_mib}",
           "conv=fsync", "status=none")
        proc, iscsi = serve(link, args.blockwire, image)
        try:
            # The link's TCP baseline is measured once, with the NBD run (the bench
            # finds the target host in an nbd:// URI; an aoe:// URI names none).
            protocols = [
                ("NBD", f"nbd://{TARGET_IP}:{NBD_PORT}/disk"),
                ("AoE", f"aoe://eth0/e{SHELF}.{SLOT}"),
                ("iSCSI", iscsi),
            ]
            # Two tables: 1 MiB sequential with 16 in flight (what a copy or a
            # striped volume sees), and bonnie++'s block phases (8 KiB, one at a
            # time: what the seeds measured).
            reports = {"sequential": [], "bonnie": []}
            for kind in reports:
                for label, uri in protocols:
                    workloads = kind
                    if kind == "sequential" and label == "NBD":
                        workloads = "network,sequential"
                    report = os.path.join(out, f"{label.lower()}-{kind}.json")
                    bench(link, args.blockwire, uri, label, workloads, proc.pid, args, report)
                    reports[kind].append(report)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rate = f"{args.rate} Mbit/s" if args.rate else "unlimited"
    print(f"\none file, one target process, one veth link (MTU {args.mtu}, {rate}); "
          f"size {args.size}; reports in {out}")
    print("\n1 MiB sequential, 16 in flight:")
    sh(args.blockwire, "bench", "--compare", *reports["sequential"])
    print("\nbonnie++ block phases (8 KiB, one at a time) and seeks:")
    sh(args.blockwire, "bench", "--compare", *reports["bonnie"])
    # Each protocol's block throughput against the link's measured TCP throughput.
    print("\n1 MiB sequential as a fraction of the link's TCP throughput "
          "(seed 003 §5.4's efficiency):")
    loaded = []
    for path in reports["sequential"]:
        with open(path) as f:
            report = json.load(f)
        loaded.append((report, {(p["workload"], p["op"]): p for p in report["results"]}))
    link = loaded[0][1]
    send = link.get(("network", "send"), {}).get("mb_per_s")
    receive = link.get(("network", "receive"), {}).get("mb_per_s")
    for report, phases in loaded:
        write = phases.get(("sequential", "write"), {}).get("mb_per_s")
        read = phases.get(("sequential", "read"), {}).get("mb_per_s")
        cells = []
        for op, mb, link_mb in (("write", write, send), ("read", read, receive)):
            if not (mb and link_mb):
                continue
            target_cpu = phases[("sequential", op)].get("target_cpu_percent")
            cpu = f", target CPU {target_cpu:.0f}%" if target_cpu is not None else ""
            cells.append(f"{op} {mb / link_mb:.0%} of {link_mb:.0f} MB/s{cpu}")
        print(f"  {report['label']:6} " + "; ".join(cells))


if __name__ == "__main__":
    main()
