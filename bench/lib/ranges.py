#!/usr/bin/env python3
"""The range of every ratio over the runs kept in bench/results: for each series of
runs (nbd-vs-peers.json, nbd-vs-peers-2.json, ... are one series), per job and per
ratio (blockwire / peer, and MB per CPU-second ratios where a run has them) the
lowest and highest value, how many runs gave it, and the machine and date of each
run. A figure is quoted only when it holds over these runs. See bench/ranges.sh."""

import argparse
import json
import math
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import RESULTS_DIR, run_file  # noqa: E402

# Servers and clients that are not blockwire, in any script: what "peer" means when a
# run's servers do not include one named "blockwire" (rbd-gateway's nbd and iscsi are
# blockwire's gateways; direct is librbd without a gateway).
PEERS = {"nbdkit", "nbdkit-null", "qemu-nbd", "nbd-server", "tgt", "tgt-null", "tgt-rbd",
         "direct", "vblade", "frames", "libiscsi", "fio", "nbdcopy"}

# Top-level scalars (and those under "config") worth showing beside each run, so runs
# made with different settings are not read as one.
SETTINGS = ("size", "durable_size", "runtime_s", "time_s", "time", "seconds", "rounds",
            "local_dir", "part", "tls", "rate_mbit", "osd_disk", "direct_rbd_cache", "pinned")


class Run:
    """One kept results file: its series and number, its parsed JSON (or why not),
    and the ratios found in it."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        self.series, self.number = run_file(self.name)
        self.data = None
        self.error = None
        self.ratios = []
        self.machine = describe_machine({})
        try:
            with open(path) as f:
                self.data = json.load(f)
        except (OSError, ValueError) as e:
            self.error = f"not readable as JSON: {e}"
            return
        if not isinstance(self.data, dict):
            self.error = "shape not understood: the top level is not an object"
            return
        found = extract(self.data)
        if found is None:
            keys = ", ".join(sorted(self.data)) or "none"
            self.error = f"shape not understood (top-level keys: {keys}); no ratios read"
        else:
            self.ratios = found
        self.machine = describe_machine(self.data)

    @property
    def readable(self):
        return isinstance(self.data, dict)

    @property
    def date(self):
        return self.machine["date"]

    @property
    def cpu(self):
        return self.machine["cpu"]


def describe_machine(data):
    """The machine record a run carries, with None where it is not recorded. Early runs
    kept only cores and kernel, one only the host name; nothing is guessed."""
    record = data.get("machine")
    found = {"host": None, "cpu": None, "cores": None, "kernel": None, "date": None}
    if isinstance(record, dict):
        found["host"] = record.get("host")
        found["cpu"] = record.get("cpu")
        found["cores"] = record.get("cores", record.get("cpus"))
        found["kernel"] = record.get("kernel")
        found["date"] = record.get("date")
    elif isinstance(record, str):
        found["host"] = record
    if found["date"] is None and isinstance(data.get("date"), str):
        found["date"] = data["date"]
    if found["cores"] is None and number(data.get("cpus")) is not None:
        found["cores"] = data["cpus"]
    return found


def settings_of(data):
    """The run's settings worth comparing across runs, as `key value, ...`."""
    shown = []
    for source in (data, data.get("config") if isinstance(data.get("config"), dict) else {}):
        for key in SETTINGS:
            value = source.get(key)
            if key in source and not isinstance(value, (dict, list)):
                shown.append(f"{key} {value}")
    return ", ".join(shown)


def number(value):
    """A finite float, or None for anything else (missing, null, NaN, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def divide(a, b):
    a, b = number(a), number(b)
    return a / b if a is not None and b else None


def pairs(servers):
    """(ours, peer) for every comparison among the servers of one job: blockwire
    against each other server when one is named blockwire, else each server that is
    not a known peer against each known peer. A `X-null` server (nothing behind it) is
    compared with X instead, as the client's ceiling."""
    servers = list(servers)
    if "blockwire" in servers:
        ours = ["blockwire"]
    else:
        ours = [s for s in servers if s not in PEERS]
    for o in ours:
        for p in servers:
            if p != o and p not in ours and not p.endswith("-null") and (o == "blockwire" or p in PEERS):
                yield o, p


def ceilings(servers):
    """(null server, real one) for every X-null whose X ran too."""
    for s in servers:
        if s.endswith("-null") and s[: -len("-null")] in servers:
            yield s, s[: -len("-null")]


def server_table(table, efficiency_key, lower_is_better=False, efficiency_label="MB per server CPU-s"):
    """Ratios of one job's servers: MB/s and efficiency, ours / peer (efficiency given
    as CPU per data, lower better, is turned so that above 1 still means ours is
    better), and each null server over its real one."""
    out = []
    for job, servers in table.items():
        for ours, peer in pairs(servers):
            a, b = servers[ours], servers[peer]
            out.append((job, f"{ours} ÷ {peer}: MB/s", divide(a["mb_per_s"], b["mb_per_s"])))
            if lower_is_better:
                eff = divide(b.get(efficiency_key), a.get(efficiency_key))
            else:
                eff = divide(a.get(efficiency_key), b.get(efficiency_key))
            out.append((job, f"{ours} ÷ {peer}: {efficiency_label}", eff))
        for null, real in ceilings(servers):
            out.append((job, f"{null} ÷ {real}: MB/s (the client's ceiling)",
                        divide(servers[null]["mb_per_s"], servers[real]["mb_per_s"])))
    return out


# Each family reads one shape of results file and returns (job, ratio, value) rows,
# or None when the data is not of its shape.

def nbd_family(data):
    """nbd-vs-peers (and runs like nbd-metrics-on-vs-off): results[job][server]."""
    results = data.get("results")
    if not isinstance(results, dict) or not results:
        return None
    if not all(isinstance(s, dict) and all("mb_per_s" in r for r in s.values()) for s in results.values()):
        return None
    return server_table(results, "mb_per_server_cpu_s")


def medians_family(data):
    """iscsi-vs-tgt and rbd-gateway: medians[server][job]."""
    medians = data.get("medians")
    if not isinstance(medians, dict) or not medians:
        return None
    table = {}
    for server, jobs in medians.items():
        for job, row in jobs.items():
            if "mb_per_s" not in row:
                return None
            table.setdefault(job, {})[server] = row
    if any("mb_per_server_cpu_s" in r for s in table.values() for r in s.values()):
        return server_table(table, "mb_per_server_cpu_s")
    return server_table(table, "server_cpu_s_per_gb", lower_is_better=True)


def rows_family(data):
    """iscsi-writes-vs-tgt and aoe-efficiency: rows[] of {job, server, mb_per_s}."""
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows or not all({"job", "server", "mb_per_s"} <= set(r) for r in rows):
        return None
    table = {}
    for r in rows:
        job = f"MTU {r['mtu']} {r['job']}" if "mtu" in r else r["job"]
        if "mb_per_server_cpu_s" not in r and number(r.get("target_cpu")):
            # aoe-efficiency keeps target CPU as % of a core.
            r = {**r, "mb_per_server_cpu_s": r["mb_per_s"] / (r["target_cpu"] / 100)}
        table.setdefault(job, {})[r["server"]] = r
    return server_table(table, "mb_per_server_cpu_s")


def nvme_family(data):
    """nvme-vs-iscsi: ratios[binary][job][op] = NVMe/TCP over iSCSI, both blockwire's."""
    ratios = data.get("ratios")
    if not isinstance(ratios, dict) or not ratios:
        return None
    labels = {"mb_per_s": "NVMe/TCP ÷ iSCSI: MB/s",
              "initiator_cpu_ms_per_mb": "NVMe/TCP ÷ iSCSI: initiator CPU per MB (below 1: NVMe cheaper)",
              "target_cpu_ms_per_mb": "NVMe/TCP ÷ iSCSI: target CPU per MB (below 1: NVMe cheaper)"}
    out = []
    for binary, jobs in ratios.items():
        for job, ops in jobs.items():
            for op, values in ops.items():
                if not set(values) & set(labels):
                    return None
                name = f"{job} {op}" + ("" if binary == "blockwire" else f" ({binary} build)")
                for key, label in labels.items():
                    if key in values:
                        out.append((name, label, number(values[key])))
    return out


def aoe_vs_vblade_family(data):
    """aoe-vs-vblade: results[] with vblade, blockwire, ratio, efficiency_ratio."""
    results = data.get("results")
    if not isinstance(results, list) or not results or not all("vblade" in r and "ratio" in r for r in results):
        return None
    out = []
    for r in results:
        job = f"{r['setting']} MTU {r['mtu']} {r['job']}"
        out.append((job, "blockwire ÷ vblade: MB/s", number(r["ratio"])))
        out.append((job, "blockwire ÷ vblade: MB per target CPU-s", number(r.get("efficiency_ratio"))))
    return out


def initiator_family(data):
    """iscsi-initiator-vs-libiscsi: results[] with median.{libiscsi,blockwire}, ratio."""
    results = data.get("results")
    if not isinstance(results, list) or not results or not all("median" in r and "ratio" in r for r in results):
        return None
    out = []
    for r in results:
        job = f"{r['job']} against {r['target']}"
        ours, theirs = r["median"]["blockwire"], r["median"]["libiscsi"]
        out.append((job, "blockwire ÷ libiscsi (initiators): MB/s", number(r["ratio"])))
        # Both ran for the same time, so MB/s per CPU-second compares like MB per CPU-s.
        eff = divide(divide(ours["mb_per_s"], ours.get("client_cpu_s")),
                     divide(theirs["mb_per_s"], theirs.get("client_cpu_s")))
        out.append((job, "blockwire ÷ libiscsi (initiators): MB per client CPU-s", eff))
    return out


def frame_ceiling_family(data):
    """aoe-frame-ceiling: results[] with percent_of_mtu9000_write."""
    results = data.get("results")
    if not isinstance(results, list) or not results or not all("percent_of_mtu9000_write" in r for r in results):
        return None
    return [(r.get("label", r["path"]), "share of blockwire's AoE write at MTU 9000",
             divide(r["percent_of_mtu9000_write"], 100))
            for r in results if r.get("path") != "aoe-9000"]


def bench_vs_fio_family(data):
    """bench-vs-fio: local[] and nbd[] with ratio (blockwire bench over fio)."""
    if not isinstance(data.get("local"), list) or not isinstance(data.get("nbd"), list):
        return None
    out = []
    for where in ("local", "nbd"):
        for r in data[where]:
            job = f"local {r['job']}" if where == "local" else f"NBD {r.get('server', '?')} {r['job']}"
            out.append((job, "blockwire bench ÷ fio (clients): MB/s", number(r["ratio"])))
    return out


def write_behind_family(data):
    """write-behind: medians[setting] with client_mb_s, stable_mb_s, server_cpu_s;
    the first setting over the second, as the script prints it."""
    medians = data.get("medians")
    if not isinstance(medians, dict) or len(medians) != 2:
        return None
    (a_name, a), (b_name, b) = medians.items()
    if not all(isinstance(m, dict) and "client_mb_s" in m for m in (a, b)):
        return None
    pair = f"write-behind {a_name} ÷ {b_name}"
    return [("seq write", f"{pair}: client MB/s", divide(a["client_mb_s"], b["client_mb_s"])),
            ("seq write", f"{pair}: MB/s to stable storage", divide(a["stable_mb_s"], b["stable_mb_s"])),
            ("seq write", f"{pair}: server CPU s", divide(a["server_cpu_s"], b["server_cpu_s"]))]


def copy_family(data):
    """copy-vs-nbdcopy: one speed ratio."""
    if "speed_ratio_blockwire_over_nbdcopy" not in data:
        return None
    return [("copy", "blockwire copy ÷ nbdcopy: speed", number(data["speed_ratio_blockwire_over_nbdcopy"]))]


FAMILIES = [nvme_family, nbd_family, aoe_vs_vblade_family, initiator_family, frame_ceiling_family,
            bench_vs_fio_family, rows_family, write_behind_family, medians_family, copy_family]


def extract(data):
    """The (job, ratio, value) rows of one run, values None where a side was missing;
    None when no family knows the shape (or the one that seemed to is wrong about it)."""
    for family in FAMILIES:
        try:
            found = family(data)
        except (KeyError, TypeError, AttributeError, ValueError, ZeroDivisionError):
            found = None
        if found:
            return found
    return None


def series_name(text):
    """nbd-vs-peers from nbd-vs-peers, bench/nbd-vs-peers.sh or nbd_vs_peers.py."""
    base = os.path.basename(text)
    for ext in (".sh", ".py", ".json"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base.replace("_", "-")


def load(directory):
    """Every kept run in `directory`, by series, in run order."""
    runs = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if os.path.isfile(path) and run_file(name):
            run = Run(path)
            runs.setdefault(run.series, []).append(run)
    for series in runs.values():
        series.sort(key=lambda r: r.number)
    return runs


def selected(runs, since=None, cpu=None):
    """(kept, left out with the reason) under the --since and --machine-cpu filters.
    A run whose date (or CPU) was not recorded cannot be shown to pass, so it is left
    out, and said so."""
    kept, left = [], []
    for run in runs:
        if not run.readable:
            kept.append(run)  # reported as unreadable below
            continue
        if since is not None:
            date = run.date
            if not date:
                left.append((run, "no date recorded"))
                continue
            if date[: len(since)] < since:
                left.append((run, f"dated {date}"))
                continue
        if cpu is not None:
            model = run.cpu
            if not model:
                left.append((run, "no CPU model recorded"))
                continue
            if cpu.lower() not in model.lower():
                left.append((run, f"CPU {model}"))
                continue
        kept.append(run)
    return kept, left


def ranges(runs):
    """{(job, ratio): [(run, value), ...]} over the runs, in first-seen order."""
    table = {}
    for run in runs:
        for job, ratio, value in run.ratios:
            if value is not None:
                table.setdefault((job, ratio), []).append((run, value))
    return table


def machine_text(run):
    m = run.machine
    cores = f"{m['cores']} cores" if m["cores"] is not None else "cores ?"
    return (f"{m['date'] or 'date ?'}  {m['cpu'] or 'CPU ?'}, {cores}, "
            f"kernel {m['kernel'] or '?'}")


def render(series, runs, left):
    """The text for one series: its runs with their machines, then the ranges."""
    total = len(runs) + len(left)
    kept = f"{len(runs)} of {total} kept runs pass the filters" if left else f"{total} kept run(s)"
    lines = [f"== {series}: {kept}"]
    for run, why in left:
        lines.append(f"  left out {run.name}: {why}")
    width = max([len(r.name) for r in runs] + [4])
    for run in runs:
        if not run.readable:
            lines.append(f"  {run.name:{width}}  {run.error}")
            continue
        settings = settings_of(run.data)
        lines.append(f"  {run.name:{width}}  {machine_text(run)}" + (f"  [{settings}]" if settings else ""))
        if run.error:
            lines.append(f"  {'':{width}}  {run.error}")
    understood = [r for r in runs if r.ratios]
    table = ranges(understood)
    if not table:
        lines.append("  no ratios to range over")
        return "\n".join(lines)
    job_w = max(len(job) for job, _ in table)
    ratio_w = max(len(ratio) for _, ratio in table)
    lines.append(f"  {'job':{job_w}}  {'ratio':{ratio_w}}  {'range':>11}  runs")
    for (job, ratio), got in table.items():
        values = [v for _, v in got]
        low, high = min(values), max(values)
        shown = f"{low:.2f}×" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}×"
        count = f"{len(got)}"
        if len(got) < len(understood):
            count += " of " + str(len(understood)) + ": " + ", ".join(f"#{r.number}" for r, _ in got)
        lines.append(f"  {job:{job_w}}  {ratio:{ratio_w}}  {shown:>11}  {count}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*",
                        help="series to show, e.g. nbd-vs-peers or bench/nbd-vs-peers.sh "
                             "(default: every series kept)")
    parser.add_argument("--since", metavar="DATE",
                        help="only runs dated DATE or later (UTC, e.g. 2026-11-28 or 2026-11-28T16)")
    parser.add_argument("--machine-cpu", metavar="SUBSTRING",
                        help="only runs whose CPU model contains SUBSTRING (any case)")
    parser.add_argument("--dir", default=RESULTS_DIR, help="where the runs are kept (default: bench/results)")
    args = parser.parse_args(argv)

    if not os.path.isdir(args.dir):
        print(f"ranges: no results directory {args.dir}", file=sys.stderr)
        return 1
    runs = load(args.dir)
    wanted = [series_name(s) for s in args.scripts] or sorted(runs)
    missing = [s for s in wanted if s not in runs]
    blocks = []
    for series in wanted:
        if series in runs:
            kept, left = selected(runs[series], args.since, args.machine_cpu)
            blocks.append(render(series, kept, left))
    print("\n\n".join(blocks))
    for series in missing:
        others = sorted(s for s in runs if s.startswith(series))
        hint = f" (kept series with that start: {', '.join(others)})" if others else ""
        print(f"ranges: no kept runs of {series} in {args.dir}{hint}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends us quietly
    sys.exit(main())
