#!/usr/bin/env python3
"""Serves one prefilled file over iSCSI from blockwire and from tgtd in turn (and
tgtd's null store, tgtd's protocol ceiling) and drives each with libiscsi's
iscsi-perf; see iscsi-vs-tgt.sh."""

import argparse
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from procs import CLOCK_TICKS, cpu_seconds, free_port, log, parse_size, results_path, stop, write_json  # noqa: F401

# (job name, request bytes, requests in flight, random?)
JOBS = [
    ("rand-read-4K-qd32", 4096, 32, True),
    ("seq-read-1M-qd16", 1 << 20, 16, False),
]
SERVERS = ["blockwire", "tgt", "tgt-null"]
# Another blockwire binary (--baseline BIN), served the same way: an A/B comparison.
BASELINE = "blockwire-baseline"
TGT_IQN = "iqn.2026-11.dev.blockwire.bench:tgt"
# Server and client each get a CPU of their own (when there are two or more), as on
# two hosts: otherwise they fight for one scheduler and single runs vary widely.
CPUS = os.cpu_count() or 1
PIN_SERVER = ["taskset", "-c", "0"] if CPUS >= 2 else []
PIN_CLIENT = ["taskset", "-c", f"1-{CPUS - 1}"] if CPUS >= 2 else []


class Blockwire:
    def __init__(self, binary, image):
        self.proc = subprocess.Popen(
            [*PIN_SERVER, binary, "serve", image, "--iscsi", "127.0.0.1:0",
             *os.environ.get("BLOCKWIRE_SERVE_ARGS", "").split()],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.url = None
        deadline = time.time() + 30
        for line in self.proc.stdout:
            m = re.search(r"(iscsi://\S+)", line)
            if m and self.url is None:
                self.url = m.group(1)
            if "press Ctrl-C to stop" in line:
                break
            if time.time() > deadline:
                break
        if self.url is None:
            stop(self.proc)
            raise SystemExit("blockwire serve did not announce an iscsi:// URL "
                             "(does this build have --iscsi?)")
        # Keep draining its stdout.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.pid = self.proc.pid

    def close(self):
        stop(self.proc)


class Tgtd:
    """tgtd in the foreground with a control port of its own (so it never meets a
    system tgtd) and a portal on a free loopback port."""

    def __init__(self, image, null=False):
        self.control = 10000 + (os.getpid() * 31 + (1 if null else 0)) % 22000  # tgtd takes up to 32767
        self.port = free_port()
        self.log = open(f"/tmp/bw-iscsi-bench-tgtd-{self.control}.log", "w+")
        self.proc = subprocess.Popen(
            [*PIN_SERVER, "tgtd", "-f", "-C", str(self.control), "--iscsi",
             f"portal=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=self.log)
        self.pid = self.proc.pid
        deadline = time.time() + 20
        while True:
            ok = subprocess.run(self.adm("--mode", "target", "--op", "show"),
                                capture_output=True).returncode == 0
            if ok and self.listening():
                break
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                raise SystemExit(f"tgtd did not start: {self.log.read()}")
            time.sleep(0.05)
        store = ["--bstype", "null", "--backing-store", "/dev/null"] if null else [
            "--backing-store", image]
        for args in (
            ["--mode", "target", "--op", "new", "--tid", "1", "--targetname", TGT_IQN],
            ["--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", *store],
            ["--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL"],
        ):
            subprocess.run(self.adm(*args), check=True)
        self.url = f"iscsi://127.0.0.1:{self.port}/{TGT_IQN}/1"

    def adm(self, *args):
        return ["tgtadm", "-C", str(self.control), "--lld", "iscsi", *args]

    def listening(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def close(self):
        # tgtd lingers while it has targets; its stores write through.
        stop(self.proc, grace=2)
        self.log.close()
        for suffix in ("", ".lock"):
            try:
                os.remove(f"/var/run/tgtd/socket.{self.control}{suffix}")
            except FileNotFoundError:
                pass


def block_size(url):
    out = subprocess.run(["iscsi-readcapacity16", url], capture_output=True, text=True,
                         check=True).stdout
    return int(re.search(r"LOGICAL BLOCK LENGTH IN BYTES:(\d+)", out).group(1))


def perf(url, pid, request, depth, rand, seconds):
    """One iscsi-perf run; returns MB/s, IOPS, server and client CPU seconds."""
    blocks = max(1, request // block_size(url))
    cmd = [*PIN_CLIENT, "iscsi-perf", "-t", str(seconds), "-m", str(depth), "-b",
           str(blocks), *(["-r"] if rand else []), url]
    cpu_before = cpu_seconds(pid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # iscsi-perf ends only when its once-a-second check lands exactly on the last
    # second: on a loaded machine it can miss it and run forever. SIGINT ends it
    # the way Ctrl-C does (it drains, then prints the average over the whole run).
    overran = threading.Event()

    def interrupt():
        overran.set()
        proc.send_signal(signal.SIGINT)

    watchdog = threading.Timer(seconds + 15, interrupt)
    watchdog.start()
    started = time.monotonic()
    out = b""
    # read() and wait4() rather than communicate(): the client's own CPU time too.
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    watchdog.cancel()
    if overran.is_set():
        log(f"iscsi-perf missed its {seconds} s deadline and was interrupted: "
            "this run lasted longer (its figures are averages over all of it)")
    proc.returncode = os.waitstatus_to_exitcode(status)
    server_cpu = cpu_seconds(pid) - cpu_before
    text = out.decode(errors="replace").replace("\r", "\n")
    # The last average printed covers the whole run (an interrupted run prints it
    # inside a progress line).
    m = re.findall(r"iops average (\d+)", text)
    if proc.returncode != 0 or not m:
        raise SystemExit(f"iscsi-perf failed ({proc.returncode}): {' '.join(cmd)}\n{text[-2000:]}")
    iops = int(m[-1])
    mbps = iops * request / 1e6
    # The seconds the average covers: the runtime asked for, or all of an overrun.
    ran = time.monotonic() - started if overran.is_set() else seconds
    return {
        "mb_per_s": round(mbps, 1),
        "iops": iops,
        "server_cpu_s": round(server_cpu, 3),
        "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "mb_per_server_cpu_s": round(mbps * ran / server_cpu, 1) if server_cpu > 0 else None,
        "overran": overran.is_set(),
    }


def prefill(path, size):
    if os.path.exists(path) and os.path.getsize(path) == size:
        log(f"using {path} ({size} bytes, prefilled before)")
        return
    log(f"prefilling {path} with {size} bytes of random data")
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(size >> 20):
            # Distinct MiBs: no store can deduplicate them.
            f.write(i.to_bytes(8, "little") + chunk[8:])
        f.write(chunk[: size % (1 << 20)])
        f.flush()
        os.fsync(f.fileno())


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blockwire", default="target/release/blockwire")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--time", type=int, default=5, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", default=",".join(SERVERS),
                    help="comma-separated subset of " + ",".join(SERVERS + [BASELINE]))
    ap.add_argument("--baseline", default=None,
                    help="another blockwire binary, served as " + BASELINE +
                    " (A/B; added to --servers after blockwire)")
    ap.add_argument("--json", default=None, help="where the results go (default: the next free "
                    "bench/results/iscsi-vs-tgt[-N].json)")
    args = ap.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    if args.baseline and BASELINE not in servers:
        at = servers.index("blockwire") + 1 if "blockwire" in servers else len(servers)
        servers.insert(at, BASELINE)
    for s in servers:
        if s not in SERVERS + [BASELINE]:
            raise SystemExit(f"unknown server {s!r}: choose from {','.join(SERVERS + [BASELINE])}")
    if BASELINE in servers and not args.baseline:
        raise SystemExit(f"{BASELINE} needs --baseline BIN")
    size = parse_size(args.size)
    image = os.path.join(args.dir, "bw-iscsi-bench.img")
    prefill(image, size)
    # Both servers read it through the page cache; warm it for both alike.
    with open(image, "rb") as f:
        while f.read(8 << 20):
            pass

    runs = []
    for rnd in range(1, args.rounds + 1):
        # Interleaved: each round serves every server in turn, so drift in the
        # machine's speed spreads over all of them.
        for server in servers:
            if server == "blockwire":
                target = Blockwire(args.blockwire, image)
            elif server == BASELINE:
                target = Blockwire(args.baseline, image)
            else:
                target = Tgtd(image, null=server == "tgt-null")
            try:
                for job, request, depth, rand in JOBS:
                    r = perf(target.url, target.pid, request, depth, rand, args.time)
                    r.update(server=server, job=job, round=rnd)
                    runs.append(r)
                    log(f"round {rnd} {server:9} {job:18} {r['mb_per_s']:9.1f} MB/s "
                        f"{r['iops']:8} IOPS  server CPU {r['server_cpu_s']:6.2f} s  "
                        f"client CPU {r['client_cpu_s']:6.2f} s")
            finally:
                target.close()

    medians = {}
    for server in servers:
        for job, *_ in JOBS:
            rs = [r for r in runs if r["server"] == server and r["job"] == job]
            effs = [r["mb_per_server_cpu_s"] for r in rs if r["mb_per_server_cpu_s"]]
            medians.setdefault(server, {})[job] = {
                "mb_per_s": round(statistics.median(r["mb_per_s"] for r in rs), 1),
                "iops": int(statistics.median(r["iops"] for r in rs)),
                "server_cpu_s": round(statistics.median(r["server_cpu_s"] for r in rs), 3),
                "client_cpu_s": round(statistics.median(r["client_cpu_s"] for r in rs), 3),
                "mb_per_server_cpu_s": round(statistics.median(effs), 1) if effs else None,
            }
    def ratios_over(other):
        if "blockwire" not in medians or other not in medians:
            return {}
        out = {}
        for job, *_ in JOBS:
            ours, theirs = medians["blockwire"][job], medians[other][job]
            out[job] = {
                "throughput": round(ours["mb_per_s"] / theirs["mb_per_s"], 2),
                "mb_per_server_cpu_s": round(
                    ours["mb_per_server_cpu_s"] / theirs["mb_per_server_cpu_s"], 2)
                if ours["mb_per_server_cpu_s"] and theirs["mb_per_server_cpu_s"] else None,
            }
        return out

    ratios = ratios_over("tgt")
    baseline_ratios = ratios_over(BASELINE)

    print(f"\niSCSI on loopback, {args.size} prefilled file, iscsi-perf {args.time} s per run, "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'job':18} {'server':10} {'MB/s':>9} {'IOPS':>9} {'srv CPU s':>10} "
          f"{'MB/srv CPU-s':>13} {'cli CPU s':>10}")
    for job, *_ in JOBS:
        for server in servers:
            m = medians[server][job]
            eff = f"{m['mb_per_server_cpu_s']:13.1f}" if m["mb_per_server_cpu_s"] else f"{'-':>13}"
            print(f"{job:18} {server:10} {m['mb_per_s']:9.1f} {m['iops']:9} "
                  f"{m['server_cpu_s']:10.2f} {eff} {m['client_cpu_s']:10.2f}")
        for name, table in (("tgt", ratios), ("baseline", baseline_ratios)):
            if job in table:
                r = table[job]
                eff = f"{r['mb_per_server_cpu_s']:.2f}x" if r["mb_per_server_cpu_s"] else "-"
                print(f"{'':18} blockwire / {name}: throughput {r['throughput']:.2f}x, "
                      f"MB per server CPU-second {eff}")
    if "tgt-null" in servers:
        print("tgt-null is tgtd's null store (no storage I/O at all): tgtd's own protocol ceiling.")

    result = {
        "benchmark": "iscsi-vs-tgt",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": CPUS, "kernel": platform.release(),
                    "pinned": bool(PIN_SERVER)},
        "config": {"size": args.size, "image": image, "seconds": args.time,
                   "rounds": args.rounds, "servers": servers,
                   "baseline": args.baseline,
                   "client": "iscsi-perf (libiscsi)",
                   "jobs": [{"name": j, "request_bytes": b, "in_flight": d, "random": r}
                            for j, b, d, r in JOBS]},
        "medians": medians,
        "ratios_blockwire_over_tgt": ratios,
        "ratios_blockwire_over_baseline": baseline_ratios,
        "runs": runs,
    }
    write_json(args.json or results_path("iscsi-vs-tgt"), result)


if __name__ == "__main__":
    main()
