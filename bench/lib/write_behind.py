#!/usr/bin/env python3
"""Sequential writes and the flush after them, with and without write-behind; see
write-behind.sh."""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from procs import cpu_seconds, free_port, log, parse_size, results_path, stop, write_json


def wait_listening(port, deadline=10.0):
    import socket

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def one_run(blockwire, setting, size, workdir):
    image = os.path.join(workdir, "image")
    if os.path.exists(image):
        os.remove(image)
    port = free_port()
    uri = f"nbd://127.0.0.1:{port}/image"
    server = subprocess.Popen(
        [blockwire, "serve", image, "--size", str(2 * size), "--listen", f"127.0.0.1:{port}",
         "--write-behind", setting],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        cpu_before = cpu_seconds(server.pid)
        out = os.path.join(workdir, "fio.json")
        started = time.monotonic()
        subprocess.run(
            ["fio", "--name=write", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M",
             "--iodepth=16", f"--size={size}", "--output-format=json", f"--output={out}"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wrote = time.monotonic() - started
        flush_started = time.monotonic()
        subprocess.run(["qemu-io", "-f", "raw", uri, "-c", "flush"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        flushed = time.monotonic() - flush_started
        cpu = cpu_seconds(server.pid) - cpu_before
        with open(out) as f:
            job = json.load(f)["jobs"][0]
        runtime = job["job_runtime"] / 1000
        return {
            "client_mb_s": job["write"]["io_bytes"] / 1e6 / runtime,
            "flush_s": flushed,
            "stable_mb_s": size / 1e6 / (wrote + flushed),
            "server_cpu_s": cpu,
        }
    finally:
        stop(server)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--size", default="4G")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settings", default="16M,0")
    parser.add_argument("--json", default=None, help="where the results go (default: the next free "
                        "bench/results/write-behind[-N].json)")
    args = parser.parse_args()
    size = parse_size(args.size)
    settings = args.settings.split(",")
    runs = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as workdir:
        for round_ in range(args.rounds):
            order = settings if round_ % 2 == 0 else list(reversed(settings))
            for setting in order:
                result = one_run(args.blockwire, setting, size, workdir)
                log(f"round {round_ + 1}, --write-behind {setting}: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in result.items()))
                runs[setting].append(result)
    keys = ["client_mb_s", "flush_s", "stable_mb_s", "server_cpu_s"]
    medians = {s: {k: statistics.median(r[k] for r in runs[s]) for k in keys} for s in settings}
    print(f"\n{args.size} written, 1 MiB QD16, medians of {args.rounds} rounds")
    print(f"{'--write-behind':>15} {'client MB/s':>12} {'flush s':>9} {'to disk MB/s':>13} {'server CPU s':>13}")
    for s in settings:
        m = medians[s]
        print(f"{s:>15} {m['client_mb_s']:>12.0f} {m['flush_s']:>9.2f} {m['stable_mb_s']:>13.0f} {m['server_cpu_s']:>13.2f}")
    if len(settings) == 2:
        a, b = (medians[s] for s in settings)
        print(f"{settings[0]} / {settings[1]}: client {a['client_mb_s'] / b['client_mb_s']:.2f}x, "
              f"flush {a['flush_s'] / max(b['flush_s'], 1e-9):.2f}x, "
              f"to disk {a['stable_mb_s'] / b['stable_mb_s']:.2f}x, "
              f"server CPU {a['server_cpu_s'] / max(b['server_cpu_s'], 1e-9):.2f}x")
    write_json(args.json or results_path("write-behind"),
               {"size": args.size, "rounds": args.rounds, "medians": medians, "runs": runs})


if __name__ == "__main__":
    main()
