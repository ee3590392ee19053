#!/usr/bin/env python3
"""Writes over iSCSI: blockwire's target against tgtd (and tgtd's null store, which
drops what it is sent: the ceiling of the client), all driven by blockwire's iSCSI
initiator (`blockwire bench iscsi://...`; libiscsi's iscsi-perf only reads). Jobs:
1 MiB sequential writes with 16 in flight, 4 KiB random writes with 32 in flight.
Interleaved rounds, medians; the server's CPU comes from the bench's own sample of
the process listening on the target's port. See iscsi-writes-vs-tgt.sh.

Target helpers (tgtd on a private control port, blockwire serve, prefill) are
iscsi_vs_tgt.py's."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from iscsi_vs_tgt import PIN_CLIENT, Blockwire, Tgtd, log, parse_size, prefill  # noqa: E402
from procs import results_path, write_json  # noqa: E402

# (job, bench arguments, op and queue depth of the row to read)
JOBS = [
    ("seq-write-1M-qd16",
     ["--workload", "sequential", "--block-size", str(1 << 20), "--queue-depth", "16"],
     "write", 16),
    ("rand-write-4K-qd32",
     ["--workload", "random", "--random-depths", "32"],
     "randwrite", 32),
]


def run_job(binary, url, args, op, depth, seconds, size, pin=PIN_CLIENT):
    """One `blockwire bench` run (pinned with `pin`); the row of `op` at `depth`."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [*pin, binary, "bench", url, "--size", str(size), "--force",
               "--time", str(seconds), "--json", out.name, *args]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise SystemExit(f"blockwire bench failed: {' '.join(cmd)}\n"
                             f"{proc.stderr.decode()[-2000:]}")
        results = json.load(open(out.name))["results"]
    row = next(r for r in results if r["op"] == op and r["queue_depth"] == depth)
    server_cpu = row.get("target_cpu_percent")
    mb = row["mb_per_s"]
    return {
        "mb_per_s": round(mb, 1),
        "iops": round(row["iops"]),
        "server_cpu_percent": None if server_cpu is None else round(server_cpu, 1),
        "mb_per_server_cpu_s": (round(mb / (server_cpu / 100.0), 1)
                                if server_cpu else None),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--size", default="512M")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--time", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="blockwire,tgt,tgt-null")
    parser.add_argument("--json", default=None, help="where the results go (default: the next free "
                        "bench/results/iscsi-writes-vs-tgt[-N].json)")
    args = parser.parse_args()
    size = parse_size(args.size)
    image = os.path.join(args.dir, "bw-iscsi-writes-bench.img")
    prefill(image, size)
    servers = args.servers.split(",")
    samples = {(s, job[0]): [] for s in servers for job in JOBS}
    for round_no in range(1, args.rounds + 1):
        for server in servers:
            target = (Blockwire(args.blockwire, image) if server == "blockwire"
                      else Tgtd(image, null=(server == "tgt-null")))
            try:
                for job, bench_args, op, depth in JOBS:
                    result = run_job(args.blockwire, target.url, bench_args, op, depth,
                                     args.time, size)
                    samples[(server, job)].append(result)
                    log(f"round {round_no} {server:9} {job:19} {result['mb_per_s']:8.1f} MB/s "
                        f"{result['iops']:8} IOPS  server CPU {result['server_cpu_percent']}%")
            finally:
                target.close()

    def median(server, job, key):
        values = [s[key] for s in samples[(server, job)] if s[key] is not None]
        return statistics.median(values) if values else None

    print(f"iSCSI writes on loopback through blockwire's initiator, {args.size} file, "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'job':19} {'server':9} {'MB/s':>9} {'IOPS':>9} {'srv CPU %':>10} {'MB/srv CPU-s':>13}")
    table = []
    for job, *_ in JOBS:
        for server in servers:
            row = {key: median(server, job, key)
                   for key in ("mb_per_s", "iops", "server_cpu_percent", "mb_per_server_cpu_s")}
            table.append({"job": job, "server": server, **row})
            fmt = lambda v, w, p=1: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"
            print(f"{job:19} {server:9} {fmt(row['mb_per_s'], 9)} {fmt(row['iops'], 9, 0)} "
                  f"{fmt(row['server_cpu_percent'], 10)} {fmt(row['mb_per_server_cpu_s'], 13)}")
        if "blockwire" in servers and "tgt" in servers:
            ours = {k: median("blockwire", job, k) for k in ("mb_per_s", "mb_per_server_cpu_s")}
            theirs = {k: median("tgt", job, k) for k in ("mb_per_s", "mb_per_server_cpu_s")}
            ratio = ours["mb_per_s"] / theirs["mb_per_s"]
            line = f"{'':19} blockwire / tgt: throughput {ratio:.2f}x"
            if ours["mb_per_server_cpu_s"] and theirs["mb_per_server_cpu_s"]:
                line += (f", MB per server CPU-second "
                         f"{ours['mb_per_server_cpu_s'] / theirs['mb_per_server_cpu_s']:.2f}x")
            print(line)
    print("tgt-null drops every write: the client's ceiling.")
    write_json(args.json or results_path("iscsi-writes-vs-tgt"),
               {"size": args.size, "time_s": args.time, "rounds": args.rounds, "rows": table,
                "samples": {f"{s}/{j}": v for (s, j), v in samples.items()}})


if __name__ == "__main__":
    main()
