#!/usr/bin/env python3
"""CPU of an AoE stream at link speed, against vblade and NBD; see aoe-efficiency.sh."""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from shaped_link import PIN_INITIATOR, PIN_TARGET, TARGET_IP, ShapedLink, in_ns, sh
from procs import results_path, write_json  # noqa: E402

SHELF, SLOT = 1, 1
NBD_PORT = 10809
# (job, bench workload, op)
JOBS = [
    ("seq-write-1M-qd16", "sequential", "write"),
    ("seq-read-1M-qd16", "sequential", "read"),
    ("rand-read-4K-qd1", "random", "randread"),
]


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:13]) / CLOCK_TICKS


def frame_path(link, tool, seconds):
    """The bare frame path's CPU at the link's rate (MTU 1500 only: its frames are an
    AoE write's): frame_pingpong blasts 1060-byte frames through AF_PACKET as a
    window of 256, the reflector answers each with 60 bytes, and nothing else runs.
    What both ends spend is what any AoE write pays this kernel per frame."""
    reflector = subprocess.Popen(in_ns(link.target, *PIN_TARGET, tool, "reflect", "packet", "eth0"),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if reflector.stdout.readline().strip() != "ready":
            return None
        before = cpu_seconds(reflector.pid)
        blast = subprocess.Popen(in_ns(link.initiator, *PIN_INITIATOR, tool, "blast", "packet",
                                       "eth0", str(seconds)),
                                 stdout=subprocess.PIPE, text=True)
        output = blast.stdout.read()
        _, status, usage = os.wait4(blast.pid, 0)
        target_cpu = cpu_seconds(reflector.pid) - before
    finally:
        stop(reflector)
    if status != 0:
        return None
    fields = output.split()
    mb_per_s = float(fields[fields.index("MB/s") + 1])
    return {
        "mb_per_s": mb_per_s,
        "target_cpu": 100 * target_cpu / seconds,
        "initiator_cpu": 100 * (usage.ru_utime + usage.ru_stime) / seconds,
        "p50_us": None,
    }


def start(link, server, blockwire, image):
    if server == "vblade":
        cmd = ["vblade", str(SHELF), str(SLOT), "eth0", image]
        uri = f"aoe://eth0/e{SHELF}.{SLOT}"
    elif server == "aoe":
        cmd = [blockwire, "serve", image, "--aoe", "eth0", "--shelf", str(SHELF),
               "--slot", str(SLOT)]
        uri = f"aoe://eth0/e{SHELF}.{SLOT}"
    else:
        cmd = [blockwire, "serve", image, "--name", "disk",
               "--listen", f"{TARGET_IP}:{NBD_PORT}"]
        uri = f"nbd://{TARGET_IP}:{NBD_PORT}/disk"
    # `ip netns exec` and taskset exec the server: the PID is the server's.
    proc = subprocess.Popen(in_ns(link.target, *PIN_TARGET, *cmd),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    if proc.poll() is not None:
        sys.exit(f"{server} did not start")
    return proc, uri


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(link, server, args, image):
    proc, uri = start(link, server, args.blockwire, image)
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            sh(*in_ns(link.initiator, *PIN_INITIATOR, args.blockwire, "bench", uri,
                      "--workload", "sequential,random", "--random-depths", "1",
                      "--size", args.size, "--time", str(args.time),
                      "--target-pid", str(proc.pid), "--json", out.name),
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            report = json.load(open(out.name))
    finally:
        stop(proc)
    rows = {}
    for job, workload, op in JOBS:
        for r in report["results"]:
            if r["workload"] == workload and r["op"] == op:
                rows[job] = {
                    "mb_per_s": r["mb_per_s"],
                    "target_cpu": r.get("target_cpu_percent"),
                    "initiator_cpu": r["cpu_percent"],
                    "p50_us": r["latency_us"]["p50"],
                }
    return rows


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--rate", type=int, default=400, help="Mbit/s (0: unlimited)")
    parser.add_argument("--mtus", default="1500,9000")
    parser.add_argument("--size", default="256M")
    parser.add_argument("--time", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--servers", default="aoe,vblade,nbd")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", help="where the results go (default: the next free "
                        "bench/results/aoe-efficiency[-N].json)")
    parser.add_argument("--pingpong", help="frame_pingpong binary: adds the bare frame path")
    args = parser.parse_args()
    mtus = [int(m) for m in args.mtus.split(",")]
    servers = args.servers.split(",")
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as work, \
            ShapedLink("bwaoeeff", mtus[0], args.rate) as link:
        image = os.path.join(work, "disk.img")
        sh("fallocate", "-l", args.size, image)
        for mtu in mtus:
            link.set(mtu, args.rate)
            runs = {s: [] for s in servers}
            for round_ in range(args.rounds):
                order = servers if round_ % 2 == 0 else servers[::-1]
                for server in order:
                    print(f"MTU {mtu}, {server}, round {round_ + 1}", file=sys.stderr)
                    runs[server].append(measure(link, server, args, image))
            if args.pingpong and mtu == 1500:
                frames = [frame_path(link, args.pingpong, args.time) for _ in range(args.rounds)]
                got = [f for f in frames if f]
                results[(mtu, "frames", "seq-write-1M-qd16")] = {
                    field: median([g[field] for g in got])
                    for field in ("mb_per_s", "target_cpu", "initiator_cpu", "p50_us")
                } if got else None
            for server in servers:
                for job, _, _ in JOBS:
                    got = [r[job] for r in runs[server] if job in r]
                    results[(mtu, server, job)] = {
                        field: median([g[field] for g in got])
                        for field in ("mb_per_s", "target_cpu", "initiator_cpu", "p50_us")
                    }
    rate = f"{args.rate} Mbit/s" if args.rate else "unlimited"
    print(f"\nveth shaped to {rate}, {args.size}, median of {args.rounds} interleaved rounds; "
          "CPU% of one core")
    if args.pingpong:
        print("'frames': frame_pingpong's bare AF_PACKET path, AoE write-shaped frames, "
              "nothing else: this kernel's floor")
    header = (f"{'MTU':>5} {'job':18} {'server':7} {'MB/s':>7} {'target CPU%':>11} "
              f"{'initiator CPU%':>14} {'MB/CPU-s':>9} {'p50 µs':>8}")
    print(header)
    print("-" * len(header))
    table = []
    for mtu in mtus:
        for job, _, _ in JOBS:
            for server in servers + ["frames"]:
                r = results.get((mtu, server, job))
                if r is None:
                    continue
                cpu = (r["target_cpu"] or 0) + (r["initiator_cpu"] or 0)
                per_cpu = r["mb_per_s"] / (cpu / 100) if r["mb_per_s"] and cpu else None
                print(f"{mtu:>5} {job:18} {server:7} {fmt(r['mb_per_s']):>7} "
                      f"{fmt(r['target_cpu']):>11} {fmt(r['initiator_cpu']):>14} "
                      f"{fmt(per_cpu, 0):>9} {fmt(r['p50_us']):>8}")
                table.append({"mtu": mtu, "job": job, "server": server, **r})
            aoe = results.get((mtu, "aoe", job))
            vblade = results.get((mtu, "vblade", job))
            nbd = results.get((mtu, "nbd", job))
            notes = []
            if aoe and vblade and aoe["target_cpu"] and vblade["target_cpu"]:
                notes.append(f"AoE target CPU / vblade's: {aoe['target_cpu'] / vblade['target_cpu']:.2f}")
            if aoe and nbd and aoe["mb_per_s"] and nbd["mb_per_s"]:
                both = lambda r: (r["target_cpu"] or 0) + (r["initiator_cpu"] or 0)
                notes.append(f"AoE both ends {both(aoe):.0f}% vs NBD's {both(nbd):.0f}%")
                notes.append(f"AoE MB/s / NBD's: {aoe['mb_per_s'] / nbd['mb_per_s']:.2f}")
            if notes:
                print(f"{'':>5} {'':18} " + "; ".join(notes))
    write_json(args.json or results_path("aoe-efficiency"),
               {"rate_mbit": args.rate or None, "size": args.size, "rows": table})


if __name__ == "__main__":
    main()
