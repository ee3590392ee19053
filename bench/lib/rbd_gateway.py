#!/usr/bin/env python3
"""Ceph RBD behind blockwire against librbd in-process and tgtd's rbd store; see
rbd-gateway.sh."""

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from procs import CLOCK_TICKS, cpu_seconds, free_port, log, parse_size, results_path, stop, write_json  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from iscsi_writes_vs_tgt import run_job  # noqa: E402

# (job name, fio rw, request bytes, requests in flight)
JOBS = [
    ("rand-read-4K-qd32", "randread", 4096, 32),
    ("rand-write-4K-qd32", "randwrite", 4096, 32),
    ("seq-read-1M-qd16", "read", 1 << 20, 16),
    ("seq-write-1M-qd16", "write", 1 << 20, 16),
]
SERVERS = ["direct", "nbd", "iscsi", "tgt-rbd"]
TGT_IQN = "iqn.2026-11.dev.blockwire.bench:tgt-rbd"
LIMIT = 120  # seconds any ceph command may take (without a mgr some wait forever)


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=LIMIT,
                          **kw).stdout


CLUSTER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "scripts", "ceph-cluster.sh")


class Cluster:
    """One mon, one BlueStore OSD, no mgr, cephx on, all in a temp dir on loopback:
    scripts/ceph-cluster.sh, the bring-up tests/src/ceph.rs uses too, with
    BlueStore's own cache sizing, so the image is cached as a real OSD would cache it.

    The OSD's disk is in RAM, allocated whole (`in_ram`, the default), four times
    the image and at least 4 GiB. On the host's disk it is a 20 GiB sparse file that
    BlueStore writes with O_DIRECT to fresh space on every write, so each write round
    waits for the host file system to allocate what it writes, and for the shared
    disk: sequential write rounds then ran anywhere from 300 to 1300 MB/s."""

    def __init__(self, in_ram, image_size):
        self.dir = tempfile.mkdtemp(prefix="bw-rbd-bench-")
        disk = ["--block-size", str(max(4 << 30, 4 * image_size)), "--block-in-ram"] \
            if in_ram else ["--block-size", str(20 << 30)]
        proc = subprocess.run(["bash", CLUSTER_SCRIPT, "start", self.dir, *disk,
                               "--pgs", "32", "--cache-size", "auto"],
                              capture_output=True, text=True, timeout=5 * LIMIT)
        if proc.returncode != 0:
            raise SystemExit(f"the cluster did not come up: {proc.stderr.strip()}; "
                             f"logs in {self.dir}/log")
        self.conf = proc.stdout.strip()

    def pin(self, core):
        """Moves the monitor and the OSD, every thread, to `core`; threads they start
        later inherit it."""
        for name in ("mon", "osd"):
            with open(os.path.join(self.dir, "pid", name)) as f:
                pid = f.read().strip()
            run("taskset", "-a", "-p", "-c", str(core), pid)

    def ceph(self, *args, check=True):
        try:
            return run("ceph", "-c", self.conf, *args)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            if check:
                raise
            return None

    def rbd(self, *args):
        return run("rbd", "-c", self.conf, *args)

    def close(self):
        # Clients are gone by now; the script stops the OSD first, then the monitor.
        subprocess.run(["bash", CLUSTER_SCRIPT, "stop", self.dir], timeout=LIMIT)
        shutil.rmtree(self.dir, ignore_errors=True)


SAMPLE_MS = 500  # fio's bandwidth samples: a stall inside a run shows as a low one


def fio(args, job, seconds, size, env=None, pin=()):
    """One fio run (prefixed by `pin`); returns MB/s, IOPS and the MB/s of each
    SAMPLE_MS of it."""
    name, rw, request, depth = job
    with tempfile.TemporaryDirectory(prefix="bw-rbd-fio-") as logs:
        cmd = [*pin, "fio", "--name", name, "--rw", rw, "--bs", str(request), "--iodepth",
               str(depth), "--time_based", "--runtime", str(seconds), "--size", str(size),
               "--randrepeat=0", "--output-format=json",
               f"--write_bw_log={logs}/run", f"--log_avg_msec={SAMPLE_MS}", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=seconds + LIMIT)
        if proc.returncode != 0:
            raise SystemExit(f"fio failed: {' '.join(cmd)}\n{proc.stdout[-2000:]}"
                             f"{proc.stderr[-2000:]}")
        samples = []
        with open(f"{logs}/run_bw.1.log") as f:
            for line in f:
                # time ms, KiB/s, direction, request size, offset
                samples.append(round(int(line.split(",")[1]) * 1024 / 1e6))
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    j = out["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["bw_bytes"] / 1e6, side["iops"], samples


def iscsi_perf(url, job, seconds, pin=()):
    name, rw, request, depth = job
    cmd = [*pin, "iscsi-perf", "-t", str(seconds), "-m", str(depth), "-b", str(request // 512),
           *(["-r"] if rw.startswith("rand") else []), url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + LIMIT)
    text = (proc.stdout + proc.stderr).replace("\r", "\n")
    m = re.findall(r"^iops average (\d+)", text, re.M)
    if not m:
        raise SystemExit(f"iscsi-perf failed: {' '.join(cmd)}\n{text[-2000:]}")
    iops = int(m[-1])
    return iops * request / 1e6, iops


# iSCSI write jobs through blockwire's own initiator (iscsi-perf only reads):
# (fio rw) -> (bench arguments, op and queue depth of the row to read)
BENCH_WRITES = {
    "randwrite": (["--workload", "random", "--random-depths", "32"], "randwrite", 32),
    "write": (["--workload", "sequential", "--block-size", str(1 << 20), "--queue-depth",
               "16"], "write", 16),
}


def bench_writes(binary, url, job, seconds, size, pin=()):
    """One write job over iSCSI by `blockwire bench`, pinned like the other clients;
    returns MB/s, IOPS and the target's CPU seconds over the job's own measurement
    (its other phases left out)."""
    name, rw, request, depth = job
    args, op, row_depth = BENCH_WRITES[rw]
    row = run_job(binary, url, args, op, row_depth, seconds, size, pin=list(pin))
    cpu = row["server_cpu_percent"]
    return row["mb_per_s"], row["iops"], None if cpu is None else cpu / 100.0 * seconds


class Blockwire:
    def __init__(self, binary, spec, iscsi, pin=()):
        listen = ["--iscsi", "127.0.0.1:0"] if iscsi else ["--listen", "127.0.0.1:0"]
        extra = os.environ.get("BLOCKWIRE_SERVE_ARGS", "").split()
        self.proc = subprocess.Popen([*pin, binary, "serve", spec, "--name", "img", *listen, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.url = None
        for line in self.proc.stdout:
            m = re.search(r"((?:nbd|iscsi)://\S+)", line)
            if m and self.url is None:
                self.url = m.group(1)
            if "press Ctrl-C to stop" in line:
                break
        if self.url is None:
            stop(self.proc, grace=10)
            raise SystemExit("blockwire serve did not announce its URL")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        self.pid = self.proc.pid

    def close(self):
        stop(self.proc, grace=10)


class TgtRbd:
    def __init__(self, conf, pin=()):
        self.control = 10000 + (os.getpid() * 31) % 22000
        self.port = free_port()
        self.log = open(f"/tmp/bw-rbd-bench-tgtd-{self.control}.log", "w+")
        self.proc = subprocess.Popen([*pin, "tgtd", "-f", "-C", str(self.control), "--iscsi",
                                      f"portal=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=self.log)
        self.pid = self.proc.pid
        deadline = time.time() + 20
        while subprocess.run(self.adm("--mode", "target", "--op", "show"),
                             capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("tgtd did not start")
            time.sleep(0.05)
        for args in (
            ["--mode", "target", "--op", "new", "--tid", "1", "--targetname", TGT_IQN],
            ["--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", "1", "--bstype",
             "rbd", "--backing-store", "rbd/img", "--bsopts", f"conf={conf};id=admin"],
            ["--mode", "target", "--op", "bind", "--tid", "1", "--initiator-address", "ALL"],
        ):
            subprocess.run(self.adm(*args), check=True, timeout=LIMIT)
        self.url = f"iscsi://127.0.0.1:{self.port}/{TGT_IQN}/1"

    def adm(self, *args):
        return ["tgtadm", "-C", str(self.control), "--lld", "iscsi", *args]

    def close(self):
        # Delete the logical unit first: tgtd then closes the image, and librbd gives
        # back the exclusive lock and its watch. Stopped with them held, the next
        # writer in the run would wait until the cluster times the watch out.
        for args in (["--mode", "logicalunit", "--op", "delete", "--tid", "1", "--lun", "1"],
                     ["--mode", "target", "--op", "delete", "--force", "--tid", "1"]):
            subprocess.run(self.adm(*args), capture_output=True, timeout=LIMIT)
        stop(self.proc, grace=5)
        self.log.close()
        for suffix in ("", ".lock"):
            try:
                os.remove(f"/var/run/tgtd/socket.{self.control}{suffix}")
            except FileNotFoundError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--blockwire", default="target/release/blockwire")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--time", type=int, default=10, help="seconds per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--osd-disk", choices=["ram", "file"], default="ram",
                    help="the OSD's disk: in RAM, allocated whole (default), or a sparse "
                    "file on the host's disk (every write round pays its allocation)")
    ap.add_argument("--direct-cache", choices=["off", "on"], default="off",
                    help="librbd's cache in the direct client: off (default) as in the "
                    "gateway, so both answer a write when the OSD has it; on is fio's "
                    "default, which answers 4 KiB writes early and in bursts")
    ap.add_argument("--pin", metavar="CLUSTER,CLIENT[,GATEWAY]",
                    help="cores for the cluster (mon and OSD), the clients (fio, "
                    "iscsi-perf, blockwire bench: the direct client's librbd with them) "
                    "and the gateways (blockwire serve, tgtd; the client's core unless "
                    "given), e.g. 0,1")
    ap.add_argument("--json", default=None, help="where the results go (default: the next free "
                    "bench/results/rbd-gateway[-N].json)")
    args = ap.parse_args()
    servers = [s for s in args.servers.split(",") if s]
    for s in servers:
        if s not in SERVERS:
            raise SystemExit(f"unknown server {s!r}: choose from {','.join(SERVERS)}")
    size = parse_size(args.size)
    cores = [int(c) for c in args.pin.split(",")] if args.pin else []
    if cores and len(cores) == 2:
        cores.append(cores[1])
    if cores and len(cores) != 3:
        raise SystemExit(f"--pin {args.pin}: give CLUSTER,CLIENT[,GATEWAY] cores")
    client_pin = ["taskset", "-c", str(cores[1])] if cores else []
    gateway_pin = ["taskset", "-c", str(cores[2])] if cores else []
    cluster = Cluster(args.osd_disk == "ram", size)
    env = dict(os.environ, CEPH_CONF=cluster.conf)
    # The direct client only (the gateway sets rbd_cache itself): without this it
    # would be measured with a cache the gateway leaves off for data safety.
    direct_env = dict(env, CEPH_ARGS=f"{env.get('CEPH_ARGS', '')} --rbd_cache="
                      f"{'true' if args.direct_cache == 'on' else 'false'}".strip())
    runs = []
    try:
        if cores:
            cluster.pin(cores[0])
        log(f"cluster up in {cluster.dir}; creating and prefilling a {args.size} image")
        cluster.rbd("create", "--size", f"{size >> 20}M", "rbd/img")
        direct = ["--ioengine=rbd", "--clientname=admin", "--pool=rbd", "--rbdname=img"]
        subprocess.run(["fio", "--name=prefill", "--rw=write", "--bs=4M", "--iodepth=16",
                        f"--size={size}", *direct], check=True, env=env,
                       capture_output=True, timeout=3600)
        # One whole read first: otherwise the first round meets a colder OSD cache
        # than the later ones (direct 4K random reads doubled from round 1 to 2).
        subprocess.run(["fio", "--name=warm", "--rw=read", "--bs=4M", "--iodepth=16",
                        f"--size={size}", *direct], check=True, env=env,
                       capture_output=True, timeout=3600)
        spec = f"rbd:rbd/img:conf={cluster.conf}"
        for rnd in range(1, args.rounds + 1):
            for server in servers:
                target = None
                if server == "nbd":
                    target = Blockwire(args.blockwire, spec, iscsi=False, pin=gateway_pin)
                elif server == "iscsi":
                    target = Blockwire(args.blockwire, spec, iscsi=True, pin=gateway_pin)
                elif server == "tgt-rbd":
                    target = TgtRbd(cluster.conf, pin=gateway_pin)
                try:
                    for job in JOBS:
                        name, rw, request, depth = job
                        before = cpu_seconds(target.pid) if target else 0.0
                        cpu = None
                        samples = None
                        if server == "direct":
                            mbps, iops, samples = fio(direct, job, args.time, size,
                                                      direct_env, pin=client_pin)
                        elif server == "nbd":
                            mbps, iops, samples = fio(
                                ["--ioengine=nbd", f"--uri={target.url}"], job, args.time,
                                size, pin=client_pin)
                        elif "write" in rw:
                            mbps, iops, cpu = bench_writes(args.blockwire, target.url, job,
                                                           args.time, size, pin=client_pin)
                        else:
                            mbps, iops = iscsi_perf(target.url, job, args.time,
                                                    pin=client_pin)
                        if target and cpu is None:
                            cpu = cpu_seconds(target.pid) - before
                        gb = mbps * args.time / 1000
                        r = {"server": server, "job": name, "round": rnd,
                             "mb_per_s": round(mbps, 1), "iops": round(iops),
                             "server_cpu_s": round(cpu, 2) if cpu is not None else None,
                             "server_cpu_s_per_gb": round(cpu / gb, 2) if cpu and gb else None}
                        if samples is not None:
                            r[f"mb_per_s_each_{SAMPLE_MS}ms"] = samples
                        runs.append(r)
                        log(f"round {rnd} {server:8} {name:19} {mbps:9.1f} MB/s {iops:9.0f} IOPS"
                            + (f"  server CPU {cpu:6.2f} s" if cpu is not None else "")
                            + (f"  slowest {SAMPLE_MS} ms {min(samples)} MB/s"
                               if samples else ""))
                finally:
                    if target:
                        target.close()
    finally:
        cluster.close()

    medians = {}
    for r in runs:
        medians.setdefault(r["server"], {}).setdefault(r["job"], []).append(r)
    table = {}
    unsteady = []
    for server, jobs in medians.items():
        for job, rs in jobs.items():
            per_gb = [r["server_cpu_s_per_gb"] for r in rs if r["server_cpu_s_per_gb"]]
            median = statistics.median(r["mb_per_s"] for r in rs)
            # How far the round furthest from the median is from it, as a factor.
            spread = max(max(r["mb_per_s"] / median, median / r["mb_per_s"])
                         if r["mb_per_s"] else float("inf") for r in rs) if median else None
            if spread is None or spread > 2:
                unsteady.append(f"{server} {job} (rounds {', '.join(str(r['mb_per_s']) for r in rs)})")
            table.setdefault(server, {})[job] = {
                "rounds_spread": round(spread, 2) if spread is not None else None,
                "mb_per_s": round(median, 1),
                "iops": int(statistics.median(r["iops"] for r in rs)),
                "server_cpu_s_per_gb": round(statistics.median(per_gb), 2) if per_gb else None,
            }
    placement = (f"cluster on core {cores[0]}, clients on {cores[1]}, gateways on {cores[2]}"
                 if cores else "nothing pinned")
    print(f"\nCeph RBD, one-node cluster on this host (OSD disk: {args.osd_disk}, "
          f"{placement}), {args.size} image, {args.time} s per run, median of {args.rounds} "
          f"interleaved rounds")
    print(f"{'job':19} {'server':8} {'MB/s':>9} {'IOPS':>9} {'x direct':>9} {'x tgt-rbd':>10} "
          f"{'srv CPU s/GB':>13}")
    for name, *_ in JOBS:
        for server in servers:
            m = table.get(server, {}).get(name)
            if not m:
                continue
            d = table.get("direct", {}).get(name)
            t = table.get("tgt-rbd", {}).get(name)
            xd = f"{m['mb_per_s'] / d['mb_per_s']:.2f}" if d and d["mb_per_s"] else "-"
            xt = f"{m['mb_per_s'] / t['mb_per_s']:.2f}" if t and t["mb_per_s"] else "-"
            cpu = f"{m['server_cpu_s_per_gb']:.2f}" if m["server_cpu_s_per_gb"] else "-"
            print(f"{name:19} {server:8} {m['mb_per_s']:9.1f} {m['iops']:9} {xd:>9} {xt:>10} "
                  f"{cpu:>13}")
    print("every round within 2x of its median" if not unsteady else
          "rounds more than 2x from their median: " + "; ".join(unsteady))
    result = {
        "benchmark": "rbd-gateway",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "config": {"size": args.size, "seconds": args.time, "rounds": args.rounds,
                   "servers": servers, "osd_disk": args.osd_disk,
                   "direct_rbd_cache": args.direct_cache,
                   "pin": {"cluster": cores[0], "clients": cores[1], "gateways": cores[2]}
                   if cores else None},
        "medians": table,
        "runs": runs,
    }
    write_json(args.json or results_path("rbd-gateway"), result)


if __name__ == "__main__":
    main()
