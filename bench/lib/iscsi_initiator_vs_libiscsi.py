#!/usr/bin/env python3
"""Our iSCSI initiator (`blockwire bench iscsi://...`) against libiscsi's iscsi-perf,
on the same target: tgtd and `blockwire serve --iscsi`, each serving one prefilled
file. Jobs: 1 MiB sequential reads with 16 in flight, 4 KiB random reads with 32 in
flight. Interleaved rounds, medians; prints MB/s, IOPS, client CPU seconds and the
ratio ours / libiscsi; writes JSON. See iscsi-initiator-vs-libiscsi.sh.

Target helpers (tgtd on a private control port, blockwire serve, iscsi-perf runs,
prefill) are iscsi_vs_tgt.py's."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from iscsi_vs_tgt import PIN_CLIENT, Blockwire, Tgtd, log, parse_size, perf, prefill  # noqa: E402
from procs import results_path, write_json  # noqa: E402

# (job, request bytes, requests in flight, random?)
JOBS = [
    ("seq-read-1M-qd16", 1 << 20, 16, False),
    ("rand-read-4K-qd32", 4096, 32, True),
]


def ours(binary, url, request, depth, rand, seconds, size):
    """One `blockwire bench` run of the job; MB/s, IOPS and the client's CPU seconds."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        if rand:
            args = ["--workload", "random", "--random-depths", str(depth), "--time", str(seconds)]
        else:
            args = ["--workload", "sequential", "--block-size", str(request),
                    "--queue-depth", str(depth)]
        cmd = [*PIN_CLIENT, binary, "bench", url, "--size", str(size), "--force",
               "--json", out.name, *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"blockwire bench failed: {' '.join(cmd)}\n{err.decode()[-2000:]}")
        results = json.load(open(out.name))["results"]
    op = "randread" if rand else "read"
    row = next(r for r in results if r["op"] == op and r["queue_depth"] == depth)
    return {
        "mb_per_s": round(row["mb_per_s"], 1),
        "iops": round(row["iops"]),
        "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--size", default="512M")
    parser.add_argument("--dir", default="/var/tmp")
    parser.add_argument("--time", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default="tgt,blockwire")
    parser.add_argument("--json", default=None, help="where the results go (default: the next free "
                        "bench/results/iscsi-initiator-vs-libiscsi[-N].json)")
    args = parser.parse_args()
    size = parse_size(args.size)
    image = os.path.join(args.dir, "bw-iscsi-initiator-bench.img")
    prefill(image, size)
    runs = {}
    for target_name in args.targets.split(","):
        target = Tgtd(image) if target_name == "tgt" else Blockwire(args.blockwire, image)
        try:
            for rnd in range(args.rounds):
                for job, request, depth, rand in JOBS:
                    # Interleaved: each round runs both clients back to back.
                    for client in ("libiscsi", "blockwire"):
                        if client == "libiscsi":
                            r = perf(target.url, target.pid, request, depth, rand, args.time)
                        else:
                            r = ours(args.blockwire, target.url, request, depth, rand,
                                     args.time, size)
                        runs.setdefault((target_name, job, client), []).append(r)
                        log(f"round {rnd + 1} {target_name} {job} {client}: "
                            f"{r['mb_per_s']} MB/s, {r['iops']} IOPS")
        finally:
            target.close()
    report = {"size": size, "time": args.time,
              "rounds": args.rounds, "results": []}
    print(f"{'target':10} {'job':18} {'client':10} {'MB/s':>8} {'IOPS':>8} {'ratio':>6}")
    for target_name in args.targets.split(","):
        for job, *_ in JOBS:
            med = {}
            for client in ("libiscsi", "blockwire"):
                rows = runs[(target_name, job, client)]
                med[client] = {
                    "mb_per_s": statistics.median(r["mb_per_s"] for r in rows),
                    "iops": statistics.median(r["iops"] for r in rows),
                    "client_cpu_s": statistics.median(r["client_cpu_s"] for r in rows),
                }
            ratio = med["blockwire"]["mb_per_s"] / med["libiscsi"]["mb_per_s"]
            for client in ("libiscsi", "blockwire"):
                m = med[client]
                shown = f"{ratio:6.2f}" if client == "blockwire" else ""
                print(f"{target_name:10} {job:18} {client:10} {m['mb_per_s']:8.1f} "
                      f"{m['iops']:8.0f} {shown:>6}")
            report["results"].append({"target": target_name, "job": job, "median": med,
                                      "ratio": round(ratio, 3)})
    write_json(args.json or results_path("iscsi-initiator-vs-libiscsi"), report)


if __name__ == "__main__":
    main()
