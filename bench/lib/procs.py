"""Process helpers the benchmark drivers share: logging, free ports, CPU seconds
read from /proc, stopping our own children, sizes like 4G, and results written
with the machine they were measured on."""

import json
import os
import platform
import re
import signal
import time
import socket
import subprocess
import sys

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Where every script keeps its runs by default: bench/results beside this directory.
RESULTS_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results"))

# A kept run's file name: its series (e.g. nbd-vs-peers, nbd-vs-peers-tls), then
# -N from the second run on. A series name must not end in -DIGITS itself.
RUN_FILE = re.compile(r"^(?P<series>.+?)(?:-(?P<number>[0-9]+))?\.json$")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """utime + stime of a whole process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def stop(proc, grace=5):
    """SIGTERM, then SIGKILL after `grace` seconds, our own child by PID."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def parse_size(text):
    """A byte count from `4G`, `512M`, `64KiB` or a plain number."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def machine():
    """What a run was measured on, kept with its figures: CPU model, cores, kernel,
    memory and the date (UTC)."""
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "host": platform.node(),
        "cpu": model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_file(name):
    """(series, run number) of a results file name: nbd-vs-peers.json is run 1 of
    nbd-vs-peers, nbd-vs-peers-3.json run 3; None for a name that is not JSON."""
    found = RUN_FILE.match(os.path.basename(name))
    if not found:
        return None
    return found["series"], int(found["number"] or 1)


def results_path(series, directory=RESULTS_DIR):
    """Where a new run of `series` goes when no --json PATH is given: SERIES.json for
    the first, then SERIES-N.json one past the highest number kept, so a rerun is
    added beside the earlier ones instead of replacing them, and the numbers follow
    the order the runs were made in."""
    highest = 0
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            parsed = run_file(name)
            if parsed and parsed[0] == series:
                highest = max(highest, parsed[1])
    name = f"{series}.json" if highest == 0 else f"{series}-{highest + 1}.json"
    return os.path.join(directory, name)


def write_json(path, result):
    """Writes a run's results to `path` (making its directory), with the machine
    they were measured on, and says where."""
    described = machine()
    if isinstance(result.get("machine"), dict):
        described.update(result["machine"])
    result = {"machine": described, **{k: v for k, v in result.items() if k != "machine"}}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"\nJSON: {path}")
