#!/usr/bin/env python3
"""Runs the same fio nbd-engine jobs against several NBD servers; see nbd-vs-peers.sh."""

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from procs import results_path, write_json  # noqa: E402

JOBS = [
    # name, fio rw, block size, iodepth
    ("seq-write-1M", "write", "1M", 16),
    ("seq-read-1M", "read", "1M", 16),
    ("rand-read-4K", "randread", "4k", 32),
    ("rand-write-4K", "randwrite", "4k", 32),
]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PSK_USER = "bench"


def make_psk(workdir):
    """A PSK file (psktool's USERNAME:HEXKEY) in its own directory: qemu's
    tls-creds-psk object reads DIR/keys.psk."""
    directory = os.path.join(workdir, "psk")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "keys.psk")
    with open(path, "w") as f:
        f.write(f"{PSK_USER}:{os.urandom(32).hex()}\n")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on port {port}")


def cpu_seconds(pid):
    """User + system CPU of a process, its threads and its reaped children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / CLOCK_TICKS


class Server:
    """A server process started for the benchmark and stopped by PID."""

    def __init__(self, name, argv, port, export, pid_finder=None, workdir=None, psk_file=None):
        self.name, self.argv, self.port, self.export = name, argv, port, export
        self.pid_finder, self.workdir = pid_finder, workdir
        self.psk_file = psk_file
        self.proc = None
        self.pid = None

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=self.workdir)
        wait_for_port(self.port)
        self.pid = self.pid_finder() if self.pid_finder else self.proc.pid

    def stop(self):
        if self.pid and self.pid != self.proc.pid:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # a daemon (nbd-server) is not our child: wait for it to go
        if self.pid and self.pid != self.proc.pid:
            for _ in range(200):
                if not os.path.exists(f"/proc/{self.pid}"):
                    break
                time.sleep(0.05)

    @property
    def uri(self):
        if self.psk_file:
            return (f"nbds://{PSK_USER}@127.0.0.1:{self.port}/{self.export}"
                    f"?tls-psk-file={self.psk_file}")
        return f"nbd://127.0.0.1:{self.port}/{self.export}"


def make_servers(names, blockwire, image, workdir, psk=None, baseline=None):
    """The servers to compare; with `psk` (a PSK file), each requires TLS with it.
    `baseline` is another blockwire binary, served as "blockwire-baseline" (A/B)."""
    servers = []
    for name in names:
        port = free_port()
        if psk and name not in ("blockwire", "nbdkit", "nbdkit-null", "qemu-nbd"):
            raise SystemExit(f"--tls: {name} is not set up for TLS here")
        if name in ("blockwire", "blockwire-baseline"):
            if name == "blockwire-baseline" and not baseline:
                raise SystemExit("blockwire-baseline needs --baseline BIN")
            binary = baseline if name == "blockwire-baseline" else blockwire
            argv = [binary, "serve", image, "--listen", f"127.0.0.1:{port}", "--name", "bench"]
            if psk:
                argv += ["--tls", "require", "--tls-psk", psk]
            servers.append(Server(name, argv, port, "bench", psk_file=psk))
        elif name == "blockwire-metrics":
            # The same with the Prometheus endpoint on: every request counted
            # (issue 24 asks that this stay within the noise of metrics off).
            argv = [blockwire, "serve", image, "--listen", f"127.0.0.1:{port}", "--name", "bench",
                    "--metrics", "127.0.0.1:0"]
            servers.append(Server(name, argv, port, "bench"))
        elif name == "nbdkit":
            argv = ["nbdkit", "--foreground", "--port", str(port), "--ipaddr", "127.0.0.1",
                    "--exportname", "bench"]
            if psk:
                argv += ["--tls=require", f"--tls-psk={psk}"]
            argv += ["file", f"file={image}"]
            servers.append(Server(name, argv, port, "bench", psk_file=psk))
        elif name == "nbdkit-null":
            # No storage behind it: reads are zeroes, writes are dropped. What fio
            # reaches here is the most this client gets from any server on this
            # machine, so it shows how much room a faster server can have.
            argv = ["nbdkit", "--foreground", "--port", str(port), "--ipaddr", "127.0.0.1",
                    "--exportname", "bench"]
            if psk:
                argv += ["--tls=require", f"--tls-psk={psk}"]
            argv += ["null", f"size={os.path.getsize(image)}"]
            servers.append(Server(name, argv, port, "bench", psk_file=psk))
        elif name == "qemu-nbd":
            argv = ["qemu-nbd", "--format=raw", "--port", str(port), "--bind", "127.0.0.1",
                    "--export-name", "bench", "--shared", "16", "--persistent",
                    "--cache=writeback", "--aio=threads"]
            if psk:
                argv += ["--object", f"tls-creds-psk,id=tls0,endpoint=server,dir={os.path.dirname(psk)}",
                         "--tls-creds", "tls0"]
            argv += [image]
            servers.append(Server(name, argv, port, "bench", psk_file=psk))
        elif name == "nbd-server":
            conf = os.path.join(workdir, "nbd-server.conf")
            with open(conf, "w") as f:
                f.write(f"[generic]\n    port = {port}\n    listenaddr = 127.0.0.1\n"
                        f"[bench]\n    exportname = {image}\n")
            argv = ["nbd-server", "-C", conf]

            def find(conf=conf):
                # nbd-server daemonises; its main process has init as parent
                out = subprocess.run(["pgrep", "-f", f"nbd-server -C {conf}"],
                                     capture_output=True, text=True).stdout.split()
                for pid in out:
                    with open(f"/proc/{pid}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    if ppid == 1 or not os.path.exists(f"/proc/{ppid}/cmdline") or \
                            b"nbd-server" not in open(f"/proc/{ppid}/cmdline", "rb").read():
                        return int(pid)
                raise RuntimeError("nbd-server process not found")
            servers.append(Server(name, argv, port, "bench", pid_finder=find))
        else:
            raise SystemExit(f"unknown server {name}")
    return servers


def run_fio(uri, rw, bs, depth, runtime, size):
    argv = ["fio", "--name=job", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
            f"--iodepth={depth}", f"--runtime={runtime}", "--time_based", f"--size={size}",
            "--randrepeat=0", "--norandommap", "--output-format=json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["write"] if "write" in rw else job["read"]
    client_cpu = job["usr_cpu"] + job["sys_cpu"]  # % of one CPU
    return (side["bw_bytes"] / 1e6, side["iops"],
            side["clat_ns"]["percentile"].get("99.000000", 0) / 1000, client_cpu)


def parse_bytes(text):
    """'1M' -> 1048576, '4k' -> 4096."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    suffix = text[-1].lower()
    return int(text[:-1]) * units[suffix] if suffix in units else int(text)


def run_measured(argv):
    """Runs argv to completion; returns (stdout, wall seconds, CPU seconds it used)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.monotonic() - started
    # The child is reaped: its CPU shows in our children's resource usage.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {err.strip()}")
    return out, wall, usage.ru_utime + usage.ru_stime


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tls_job(uri, rw, bs, depth, runtime, size, image, blockwire, workdir):
    """One job against an nbds:// URI. fio's nbd engine cannot take a PSK file (libnbd
    refuses local files in URIs unless the program allows them, and fio does not), so
    the sequential jobs run nbdcopy (libnbd and GnuTLS, fio's library) over the whole
    image, and the random ones our initiator (`blockwire bench --workload random`,
    OpenSSL): the same client for every server either way."""
    before = children_cpu()
    if rw in ("write", "read"):
        if rw == "write":
            argv = ["nbdcopy", "--connections=1", f"--requests={depth}", f"--request-size={parse_bytes(bs)}",
                    image, uri]
        else:
            argv = ["nbdcopy", "--connections=1", f"--requests={depth}", f"--request-size={parse_bytes(bs)}",
                    uri, "null:"]
        _, wall, _ = run_measured(argv)
        mbps = os.path.getsize(image) / wall / 1e6
        client_cpu = (children_cpu() - before) / wall * 100
        requests_per_s = os.path.getsize(image) / parse_bytes(bs) / wall
        return mbps, requests_per_s, 0.0, client_cpu
    report = os.path.join(workdir, "random.json")
    argv = [blockwire, "bench", uri, "--workload", "random", "--random-depths", str(depth),
            "--time", str(runtime), "--size", size, "--json", report]
    _, wall, _ = run_measured(argv)
    with open(report) as f:
        results = json.load(f)["results"]
    op = "randread" if rw == "randread" else "randwrite"
    row = next(r for r in results if r["op"] == op)
    client_cpu = (children_cpu() - before) / wall * 100
    return row["mb_per_s"], row["iops"], row["latency_us"]["p99"], client_cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blockwire", required=True)
    parser.add_argument("--baseline", default=None,
                        help="another blockwire binary, served as blockwire-baseline (A/B)")
    parser.add_argument("--size", default="4G")
    parser.add_argument("--runtime", type=int, default=10, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per server and job (median)")
    parser.add_argument("--json", default=None, help="where the results go (default: the next free "
                        "bench/results/nbd-vs-peers[-N].json, with --tls nbd-vs-peers-tls[-N].json)")
    parser.add_argument("--dir", default=None, help="where the test image goes (default: a temp dir)")
    parser.add_argument("--servers", default=None,
                        help="default blockwire,nbdkit,qemu-nbd,nbd-server,nbdkit-null "
                             "(with --tls: blockwire,nbdkit,qemu-nbd)")
    parser.add_argument("--tls", action="store_true",
                        help="every server requires TLS with the same pre-shared key")
    parser.add_argument("--jobs", default=",".join(j[0] for j in JOBS))
    args = parser.parse_args()
    if args.servers is None:
        args.servers = ("blockwire,nbdkit,qemu-nbd" if args.tls
                        else "blockwire,nbdkit,qemu-nbd,nbd-server,nbdkit-null")
    if args.json is None:
        args.json = results_path("nbd-vs-peers-tls" if args.tls else "nbd-vs-peers")

    workdir = tempfile.mkdtemp(prefix="bw-bench-", dir=args.dir)
    image = os.path.join(workdir, "image.raw")
    try:
        size_arg = args.size
        print(f"prefilling {size_arg} at {image} ...", file=sys.stderr)
        subprocess.run(["fio", "--name=prefill", f"--filename={image}", "--rw=write", "--bs=1M",
                        f"--size={size_arg}", "--ioengine=psync", "--refill_buffers",
                        "--output-format=terse"], check=True, capture_output=True)
        os.sync()  # write-back of the prefill must not run during the first server's jobs
        jobs = [j for j in JOBS if j[0] in args.jobs.split(",")]
        psk = make_psk(workdir) if args.tls else None
        servers = make_servers(args.servers.split(","), args.blockwire, image, workdir, psk,
                               args.baseline)
        # Every server runs at once (idle ones cost nothing) and each job is run by
        # each server in turn, round after round with the order rotated: a shared,
        # noisy machine then disturbs all of them alike. Medians are reported.
        samples = {}
        try:
            for server in servers:
                server.start()
            for name, rw, bs, depth in jobs:
                for round_ in range(args.rounds):
                    shift = round_ % len(servers)
                    for server in servers[shift:] + servers[:shift]:
                        before = cpu_seconds(server.pid)
                        if args.tls:
                            mbps, iops, p99, client_cpu = run_tls_job(
                                server.uri, rw, bs, depth, args.runtime, size_arg, image,
                                args.blockwire, workdir)
                        else:
                            mbps, iops, p99, client_cpu = run_fio(server.uri, rw, bs, depth,
                                                                  args.runtime, size_arg)
                        time.sleep(0.3)  # let a forking server reap the connection's child
                        cpu = cpu_seconds(server.pid) - before
                        os.sync()  # each run starts with no dirty pages left by the last
                        samples.setdefault(name, {}).setdefault(server.name, []).append(
                            (mbps, iops, p99, cpu, client_cpu))
                        print(f"{server.name:>11} {name:<14} round {round_ + 1}: {mbps:9.1f} MB/s "
                              f"{iops:9.0f} IOPS server cpu {cpu:5.2f}s client cpu {client_cpu:4.0f}%",
                              file=sys.stderr)
        finally:
            for server in servers:
                if server.proc:
                    server.stop()
        results = {}
        for name, per_server in samples.items():
            for server_name, runs in per_server.items():
                mbps = statistics.median(r[0] for r in runs)
                iops = statistics.median(r[1] for r in runs)
                p99 = statistics.median(r[2] for r in runs)
                cpu = sum(r[3] for r in runs)
                mb = sum(r[0] for r in runs) * args.runtime
                results.setdefault(name, {})[server_name] = {
                    "mb_per_s": round(mbps, 1), "iops": round(iops), "p99_us": round(p99, 1),
                    "server_cpu_s": round(cpu / len(runs), 2),
                    "client_cpu_pct": round(statistics.median(r[4] for r in runs), 1),
                    "mb_per_server_cpu_s": round(mb / cpu, 1) if cpu > 0 else None,
                    "runs": [{"mb_per_s": round(r[0], 1), "iops": round(r[1]), "server_cpu_s": round(r[3], 2),
                              "client_cpu_pct": round(r[4], 1)} for r in runs],
                }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    names = args.servers.split(",")
    print()
    header = f"{'job':<14}" + "".join(f"{n + ' MB/s':>18}" for n in names)
    client = "client CPU%" if args.tls else "fio CPU% (bw)"
    header += f"{'bw/nbdkit':>11}{'MB/cpu-s bw/nbdkit':>20}{client:>15}{'null/nbdkit':>13}"
    print(header)
    ratios = {}
    for name, _, _, _ in jobs:
        row = results[name]
        line = f"{name:<14}" + "".join(
            f"{row[n]['mb_per_s']:>11.1f} ({row[n]['iops']:>6})" if n in row else f"{'-':>18}" for n in names)
        if "blockwire" in row and "nbdkit" in row:
            speed = row["blockwire"]["mb_per_s"] / row["nbdkit"]["mb_per_s"]
            eff_b, eff_k = row["blockwire"]["mb_per_server_cpu_s"], row["nbdkit"]["mb_per_server_cpu_s"]
            eff = eff_b / eff_k if eff_b and eff_k else float("nan")
            ratios[name] = {"throughput": round(speed, 2), "mb_per_server_cpu_s": round(eff, 2)}
            line += f"{speed:>10.2f}x{eff:>19.2f}x{row['blockwire']['client_cpu_pct']:>14.0f}%"
            if "nbdkit-null" in row:
                # The room the client leaves: no server can be faster than nothing.
                room = row["nbdkit-null"]["mb_per_s"] / row["nbdkit"]["mb_per_s"]
                ratios[name]["client_ceiling_over_nbdkit"] = round(room, 2)
                line += f"{room:>12.2f}x"
        print(line)
    write_json(args.json, {"size": args.size, "runtime_s": args.runtime, "rounds": args.rounds,
                           "client": ("nbdcopy (sequential), blockwire bench (random)" if args.tls
                                      else "fio ioengine=nbd"),
                           "tls": "psk" if args.tls else None,
                           "results": results, "ratios_blockwire_over_nbdkit": ratios})


if __name__ == "__main__":
    main()
