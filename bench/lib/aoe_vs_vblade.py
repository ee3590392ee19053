#!/usr/bin/env python3
"""Serves one file over AoE from vblade and from blockwire in turn and measures both
with the same initiator (blockwire's); see aoe-vs-vblade.sh."""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from shaped_link import PIN_INITIATOR, PIN_TARGET, in_ns, sh  # noqa: F401 (re-exported)
from procs import results_path, write_json  # noqa: E402

TARGET_NS = "bwaoebench-t"
INITIATOR_NS = "bwaoebench-i"
SHELF, SLOT = 1, 1
URI = f"aoe://eth0/e{SHELF}.{SLOT}"
# (job name, bench workload, op, queue depth filter)
JOBS = [
    ("seq-write-1M", "sequential", "write"),
    ("seq-read-1M", "sequential", "read"),
    ("rand-read-4K", "random", "randread"),
]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Lab:
    """Two namespaces and one veth pair, removed on exit."""

    def __enter__(self):
        self.remove()
        for ns in (TARGET_NS, INITIATOR_NS):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", TARGET_NS, "link", "add", "eth0", "type", "veth",
           "peer", "name", "eth0", "netns", INITIATOR_NS)
        return self

    def mtu(self, mtu):
        for ns in (TARGET_NS, INITIATOR_NS):
            sh("ip", "-n", ns, "link", "set", "eth0", "mtu", str(mtu), "up")

    def remove(self):
        for ns in (TARGET_NS, INITIATOR_NS):
            sh("ip", "netns", "del", ns, check=False, stderr=subprocess.DEVNULL)

    def __exit__(self, *exc):
        self.remove()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLOCK_TICKS


def start(server, setting, image, blockwire, serve_args=()):
    if server == "vblade":
        cmd = ["vblade"] + (["-d"] if setting == "durable" else []) + [
            str(SHELF), str(SLOT), "eth0", image]
    else:
        cmd = [blockwire, "serve", image, "--aoe", "eth0", "--shelf", str(SHELF),
               "--slot", str(SLOT)] + (["--direct"] if setting == "durable" else []) + (
                   os.environ.get("BLOCKWIRE_SERVE_ARGS", "").split()) + list(serve_args)
    proc = subprocess.Popen(in_ns(TARGET_NS, *PIN_TARGET, *cmd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        probe = subprocess.run(
            in_ns(INITIATOR_NS, blockwire, "info", "--list", "aoe://eth0"),
            capture_output=True, text=True)
        if f"e{SHELF}.{SLOT}" in probe.stdout:
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{server} did not answer discovery")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(server, setting, image, size, seconds, blockwire,
            workloads="sequential,random", serve_args=(), uri=URI):
    proc = start(server, setting, image, blockwire, serve_args)
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            before = cpu_seconds(proc.pid)
            sh(*in_ns(INITIATOR_NS, *PIN_INITIATOR, blockwire, "bench", uri,
                      "--workload", workloads, "--random-depths", "16",
                      "--size", size, "--time", str(seconds),
                      "--target-pid", str(proc.pid), "--json", out.name),
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            total_cpu = cpu_seconds(proc.pid) - before
            report = json.load(open(out.name))
    finally:
        stop(proc)
    rows = {}
    for name, workload, op in JOBS:
        match = [r for r in report["results"] if r["workload"] == workload and r["op"] == op]
        if not match:
            continue
        r = match[0]
        cpu = (r.get("target_cpu_percent") or 0.0) / 100.0 * r["seconds"]
        rows[name] = {
            "mb_per_s": r["mb_per_s"],
            "iops": r["iops"],
            "target_cpu_s": cpu,
            "mb_per_target_cpu_s": r["bytes"] / 1e6 / cpu if cpu > 0 else None,
        }
    return rows, total_cpu


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1G", help="data set, buffered setting")
    parser.add_argument("--durable-size", default="128M", help="data set, durable setting")
    parser.add_argument("--time", type=int, default=3, help="seconds of random reads")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--mtus", default="1500,9000")
    parser.add_argument("--settings", default="durable,buffered")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", help="where the results go (default: the next free "
                        "bench/results/aoe-vs-vblade[-N].json)")
    parser.add_argument("--blockwire", required=True)
    args = parser.parse_args()

    mtus = [int(m) for m in args.mtus.split(",")]
    settings = args.settings.split(",")
    servers = ["vblade", "blockwire"]
    image = os.path.join(args.dir, "aoe-vs-vblade.img")
    results = {}
    with Lab() as lab:
        try:
            for mtu in mtus:
                lab.mtu(mtu)
                for setting in settings:
                    size = args.durable_size if setting == "durable" else args.size
                    sh("rm", "-f", image)
                    sh("fallocate", "-l", size, image)
                    runs = {s: [] for s in servers}
                    for round_ in range(args.rounds):
                        order = servers if round_ % 2 == 0 else servers[::-1]
                        for server in order:
                            print(f"MTU {mtu}, {setting}, {server}, round {round_ + 1}",
                                  file=sys.stderr)
                            rows, _ = measure(server, setting, image, size, args.time,
                                              args.blockwire)
                            runs[server].append(rows)
                    for server in servers:
                        for name, _, _ in JOBS:
                            key = (mtu, setting, name, server)
                            got = [r[name] for r in runs[server] if name in r]
                            results[key] = {
                                field: median([g[field] for g in got])
                                for field in ("mb_per_s", "iops", "target_cpu_s",
                                              "mb_per_target_cpu_s")
                            }
        finally:
            sh("rm", "-f", image)

    header = (f"{'MTU':>5} {'setting':8} {'job':13} {'vblade MB/s':>11} {'ours MB/s':>10} "
              f"{'ratio':>6} {'vblade IOPS':>11} {'ours IOPS':>10} {'vblade MB/CPUs':>14} "
              f"{'ours MB/CPUs':>12} {'eff ratio':>9}")
    print(header)
    print("-" * len(header))
    table = []
    for mtu in mtus:
        for setting in settings:
            for name, _, _ in JOBS:
                v = results.get((mtu, setting, name, "vblade"), {})
                b = results.get((mtu, setting, name, "blockwire"), {})
                ratio = (b["mb_per_s"] / v["mb_per_s"]
                         if v.get("mb_per_s") and b.get("mb_per_s") else None)
                eff = (b["mb_per_target_cpu_s"] / v["mb_per_target_cpu_s"]
                       if v.get("mb_per_target_cpu_s") and b.get("mb_per_target_cpu_s")
                       else None)
                print(f"{mtu:>5} {setting:8} {name:13} {fmt(v.get('mb_per_s')):>11} "
                      f"{fmt(b.get('mb_per_s')):>10} {fmt(ratio, 2):>6} "
                      f"{fmt(v.get('iops'), 0):>11} {fmt(b.get('iops'), 0):>10} "
                      f"{fmt(v.get('mb_per_target_cpu_s')):>14} "
                      f"{fmt(b.get('mb_per_target_cpu_s')):>12} {fmt(eff, 2):>9}")
                table.append({"mtu": mtu, "setting": setting, "job": name,
                              "vblade": v, "blockwire": b, "ratio": ratio,
                              "efficiency_ratio": eff})
    if 1500 in mtus and 9000 in mtus and "buffered" in settings:
        for server in servers:
            small = results.get((1500, "buffered", "seq-write-1M", server), {}).get("mb_per_s")
            large = results.get((9000, "buffered", "seq-write-1M", server), {}).get("mb_per_s")
            if small and large:
                print(f"{server}: buffered seq write at MTU 1500 is {100 * small / large:.0f}% "
                      f"of its MTU 9000 figure")
    write_json(args.json or results_path("aoe-vs-vblade"),
               {"rounds": args.rounds, "size": args.size, "durable_size": args.durable_size,
                "results": table})


if __name__ == "__main__":
    main()
