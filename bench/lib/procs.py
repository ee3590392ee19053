"""Process helpers the benchmark drivers share: logging, free ports, CPU seconds
read from /proc, stopping our own children, sizes like 4G, and results written
with the machine they were measured on."""

import json
import os
import platform
import signal
import time
import socket
import subprocess
import sys

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


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
