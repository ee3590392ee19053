#!/usr/bin/env python3
"""One prefilled file served over iSCSI and NVMe/TCP by one blockwire process on
loopback, measured through our own initiators with `blockwire bench`: 4 KiB random
with 32 in flight and 1 MiB sequential with 16 in flight, reads and writes, rounds
interleaved; medians of MB/s and CPU per MB on both ends, and the NVMe/iSCSI
ratios; see nvme-vs-iscsi.sh."""

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time

from procs import log, machine, parse_size, results_path, stop, write_json

# (name, `blockwire bench` arguments): the two shapes.
JOBS = [
    ("random-4K-qd32", ["--workload", "random", "--random-depths", "32"]),
    ("sequential-1M-qd16", ["--workload", "sequential", "--block-size", "1M",
                            "--queue-depth", "16"]),
]
PROTOCOLS = ["nvme", "iscsi"]
# Server and client each get a CPU of their own (when there are two or more), as on
# two hosts.
CPUS = os.cpu_count() or 1
PIN_SERVER = ["taskset", "-c", "0"] if CPUS >= 2 else []
PIN_CLIENT = ["taskset", "-c", f"1-{CPUS - 1}"] if CPUS >= 2 else []


class Serve:
    """`blockwire serve IMAGE --iscsi ... --nvme ...` on loopback ports the kernel
    picks; the URIs it announces."""

    def __init__(self, binary, image):
        self.proc = subprocess.Popen(
            [*PIN_SERVER, binary, "serve", image, "--name", "disk",
             "--iscsi", "127.0.0.1:0", "--nvme", "127.0.0.1:0",
             "--nvme-discovery", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.uris = {}
        deadline = time.time() + 30
        for line in self.proc.stdout:
            for protocol, pattern in (("iscsi", r"(iscsi://\S+)"),
                                      ("nvme", r"(nvme\+tcp://\S+/nqn\S+)")):
                m = re.search(pattern, line)
                if m and protocol not in self.uris:
                    self.uris[protocol] = m.group(1)
            if "press Ctrl-C to stop" in line or time.time() > deadline:
                break
        if set(self.uris) != set(PROTOCOLS):
            stop(self.proc)
            raise SystemExit(f"{binary} serve announced {self.uris}: needs --iscsi and --nvme")
        # Keep draining its stdout.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.pid = self.proc.pid

    def close(self):
        stop(self.proc)


def bench(binary, uri, job_args, args, target_pid, out):
    """One `blockwire bench` run; its result rows by op."""
    cmd = [*PIN_CLIENT, binary, "bench", uri, *job_args, "--size", args.size,
           "--time", str(args.time), "--target-pid", str(target_pid), "--json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open(out) as f:
        report = json.load(f)
    rows = {}
    for r in report["results"]:
        if not r.get("mb_per_s"):
            continue
        # CPU milliseconds per MB (10^6 bytes): (cores busy) / (MB per second).
        per_mb = lambda pct: None if pct is None else round(pct * 10 / r["mb_per_s"], 4)
        rows[r["op"]] = {
            "mb_per_s": round(r["mb_per_s"], 1),
            "iops": round(r["iops"]),
            "initiator_cpu_percent": round(r["cpu_percent"], 1),
            "target_cpu_percent": round(r.get("target_cpu_percent") or 0, 1),
            "initiator_cpu_ms_per_mb": per_mb(r["cpu_percent"]),
            "target_cpu_ms_per_mb": per_mb(r.get("target_cpu_percent")),
        }
    return rows


def median(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--baseline", help="another blockwire binary, measured the same way")
    parser.add_argument("--size", default="1G")
    parser.add_argument("--time", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--json", default=None, help="where the results go (default: the next free "
                        "bench/results/nvme-vs-iscsi[-N].json)")
    args = parser.parse_args()
    binaries = [("blockwire", args.blockwire)]
    if args.baseline:
        binaries.append(("baseline", args.baseline))

    runs = []
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        image = os.path.join(work, "disk.img")
        # Written through once, so no protocol pays for allocating the file.
        subprocess.run(["dd", "if=/dev/zero", f"of={image}", "bs=1M",
                        f"count={parse_size(args.size) >> 20}", "conv=fsync", "status=none"],
                       check=True)
        for name, binary in binaries:
            serve = Serve(binary, image)
            try:
                for round_ in range(args.rounds):
                    for job, job_args in JOBS:
                        # Alternate who goes first, so neither always gets the
                        # warmer cache.
                        order = PROTOCOLS if round_ % 2 == 0 else PROTOCOLS[::-1]
                        for protocol in order:
                            out = os.path.join(work, "bench.json")
                            rows = bench(binary, serve.uris[protocol], job_args, args,
                                         serve.pid, out)
                            for op, row in rows.items():
                                log(f"{name} round {round_ + 1} {job} {protocol} {op}: "
                                    f"{row['mb_per_s']} MB/s, CPU ms/MB initiator "
                                    f"{row['initiator_cpu_ms_per_mb']} target "
                                    f"{row['target_cpu_ms_per_mb']}")
                                runs.append({"binary": name, "round": round_ + 1, "job": job,
                                             "protocol": protocol, "op": op, **row})
            finally:
                serve.close()

    medians, ratios = {}, {}
    keys = ["mb_per_s", "initiator_cpu_ms_per_mb", "target_cpu_ms_per_mb"]
    for (name, _), (job, _) in ((b, j) for b in binaries for j in JOBS):
        ops = sorted({r["op"] for r in runs if r["binary"] == name and r["job"] == job})
        for op in ops:
            cell = {}
            for protocol in PROTOCOLS:
                rs = [r for r in runs if (r["binary"], r["job"], r["protocol"], r["op"])
                      == (name, job, protocol, op)]
                cell[protocol] = {k: median(rs, k) for k in keys}
            medians.setdefault(name, {}).setdefault(job, {})[op] = cell
            ratios.setdefault(name, {}).setdefault(job, {})[op] = {
                k: ratio(cell["nvme"][k], cell["iscsi"][k]) for k in keys}

    print(f"one file ({args.size}), one `blockwire serve --iscsi --nvme`, loopback; "
          f"{args.rounds} rounds of {args.time} s, medians. CPU: ms per MB (10^6 bytes).")
    header = (f"{'binary':9} {'job':19} {'op':9} {'proto':5} {'MB/s':>8} "
              f"{'ini ms/MB':>9} {'tgt ms/MB':>9}")
    print(header)
    for name in medians:
        for job in medians[name]:
            for op, cell in medians[name][job].items():
                for protocol in PROTOCOLS:
                    m = cell[protocol]
                    print(f"{name:9} {job:19} {op:9} {protocol:5} {m['mb_per_s'] or 0:8.1f} "
                          f"{m['initiator_cpu_ms_per_mb'] or 0:9.3f} "
                          f"{m['target_cpu_ms_per_mb'] or 0:9.3f}")
    print("\nNVMe/TCP / iSCSI (throughput: ≥ 1 is NVMe faster; CPU per MB: ≤ 1 is NVMe "
          "cheaper):")
    print(f"{'binary':9} {'job':19} {'op':9} {'MB/s':>6} {'ini CPU/MB':>10} {'tgt CPU/MB':>10}")
    for name in ratios:
        for job in ratios[name]:
            for op, r in ratios[name][job].items():
                fmt = lambda v: f"{v:.2f}" if v is not None else "-"
                print(f"{name:9} {job:19} {op:9} {fmt(r['mb_per_s']):>6} "
                      f"{fmt(r['initiator_cpu_ms_per_mb']):>10} "
                      f"{fmt(r['target_cpu_ms_per_mb']):>10}")
    write_json(args.json or results_path("nvme-vs-iscsi"), {
        "machine": machine(),
        "config": {"size": args.size, "time": args.time, "rounds": args.rounds,
                   "pinned": bool(PIN_SERVER),
                   "jobs": {job: job_args for job, job_args in JOBS}},
        "medians": medians,
        "ratios": ratios,
        "runs": runs,
    })


if __name__ == "__main__":
    main()
