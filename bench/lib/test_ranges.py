"""Tests of how runs are kept (procs.results_path, procs.write_json) and of the ranges
printed over them (ranges.py), on small synthetic results files in a temp dir.

python3 -m unittest discover -s bench/lib -p 'test_*.py'
"""

import contextlib
import glob
import io
import json
import os
import re
import tempfile
import unittest

import procs
import ranges

HERE = os.path.dirname(os.path.abspath(__file__))


def read(path):
    with open(path) as f:
        return f.read()


def machine(date, cpu="AMD EPYC 7763"):
    return {"host": "test", "cpu": cpu, "cores": 2, "kernel": "6.1.0", "memory_gib": 4.0, "date": date}


def nbd_run(write_mb, nbdkit_mb, blockwire_eff=None, nbdkit_eff=None, date=None, cpu="AMD EPYC 7763"):
    """An nbd-vs-peers results file with one job, rand-write-4K."""
    run = {"size": "1G", "runtime_s": 3, "rounds": 2,
           "results": {"rand-write-4K": {
               "blockwire": {"mb_per_s": write_mb, "mb_per_server_cpu_s": blockwire_eff},
               "nbdkit": {"mb_per_s": nbdkit_mb, "mb_per_server_cpu_s": nbdkit_eff},
               "nbdkit-null": {"mb_per_s": 2 * nbdkit_mb, "mb_per_server_cpu_s": None}}}}
    if date is not None:
        run["machine"] = machine(date, cpu)
    return run


class Results(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def put(self, name, data):
        with open(os.path.join(self.dir, name), "w") as f:
            if isinstance(data, str):
                f.write(data)
            else:
                json.dump(data, f)

    def run_main(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = ranges.main([*argv, "--dir", self.dir])
        return code, out.getvalue(), err.getvalue()


class DefaultPath(Results):
    def test_first_run_gets_the_plain_name_then_numbers_follow_the_highest(self):
        self.assertEqual(procs.results_path("nbd-vs-peers", self.dir),
                         os.path.join(self.dir, "nbd-vs-peers.json"))
        self.put("nbd-vs-peers.json", {})
        self.assertEqual(os.path.basename(procs.results_path("nbd-vs-peers", self.dir)), "nbd-vs-peers-2.json")
        self.put("nbd-vs-peers-5.json", {})
        # Another series sharing the start is not counted, and a gap is not refilled.
        self.put("nbd-vs-peers-tls.json", {})
        self.put("nbd-vs-peers-tls-9.json", {})
        self.assertEqual(os.path.basename(procs.results_path("nbd-vs-peers", self.dir)), "nbd-vs-peers-6.json")
        self.assertEqual(os.path.basename(procs.results_path("nbd-vs-peers-tls", self.dir)),
                         "nbd-vs-peers-tls-10.json")

    def test_a_second_run_is_added_beside_the_first_with_its_machine(self):
        for figure in (1.0, 2.0):
            with contextlib.redirect_stdout(io.StringIO()):
                procs.write_json(procs.results_path("write-behind", self.dir), {"figure": figure})
        kept = sorted(glob.glob(os.path.join(self.dir, "*.json")))
        self.assertEqual([os.path.basename(p) for p in kept], ["write-behind-2.json", "write-behind.json"])
        first = json.loads(read(os.path.join(self.dir, "write-behind.json")))
        second = json.loads(read(os.path.join(self.dir, "write-behind-2.json")))
        self.assertEqual((first["figure"], second["figure"]), (1.0, 2.0))
        for run in (first, second):
            self.assertRegex(run["machine"]["date"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
            for key in ("cpu", "cores", "kernel"):
                self.assertIn(key, run["machine"])

    def test_an_explicit_path_is_written_even_when_it_exists(self):
        path = os.path.join(self.dir, "mine.json")
        self.put("mine.json", {"old": True})
        with contextlib.redirect_stdout(io.StringIO()):
            procs.write_json(path, {"new": True})
        self.assertEqual(json.loads(read(path)), {"machine": json.loads(read(path))["machine"], "new": True})

    def test_run_file_names(self):
        self.assertEqual(procs.run_file("nbd-vs-peers.json"), ("nbd-vs-peers", 1))
        self.assertEqual(procs.run_file("nbd-vs-peers-12.json"), ("nbd-vs-peers", 12))
        self.assertEqual(procs.run_file("nbd-vs-peers-tls.json"), ("nbd-vs-peers-tls", 1))
        self.assertEqual(procs.run_file("write-behind-2g.json"), ("write-behind-2g", 1))
        self.assertIsNone(procs.run_file("notes.txt"))


class EveryScript(unittest.TestCase):
    def test_scripts_that_write_results_do_so_through_procs(self):
        """A script that writes results keeps its runs side by side (results_path) and
        records the machine (write_json); none writes its own JSON file."""
        scripts = glob.glob(os.path.join(HERE, "*.py"))
        # The shell wrappers too: one that writes JSON itself must do so the same way.
        scripts += glob.glob(os.path.join(HERE, "..", "*.sh"))
        for path in sorted(scripts):
            name = os.path.basename(path)
            if name in ("procs.py", "ranges.py") or name.startswith("test_"):
                continue
            source = read(path)
            if "write_json(" not in source and "json.dump(" not in source:
                continue
            with self.subTest(script=name):
                self.assertNotIn("json.dump(", source)
                self.assertIn("results_path(", source)
                self.assertIn("write_json(", source)


class Ranges(Results):
    def test_range_count_and_machines_over_runs(self):
        self.put("nbd-vs-peers.json", nbd_run(150, 100, 200, 100, date="2026-11-26T10:00:00Z"))
        self.put("nbd-vs-peers-2.json", nbd_run(120, 100, 150, 100, date="2026-11-27T10:00:00Z"))
        self.put("nbd-vs-peers-3.json", nbd_run(175, 100, None, 100, date="2026-11-28T10:00:00Z"))
        runs = ranges.load(self.dir)["nbd-vs-peers"]
        table = ranges.ranges(runs)
        speed = [v for _, v in table[("rand-write-4K", "blockwire ÷ nbdkit: MB/s")]]
        self.assertEqual(sorted(speed), [1.2, 1.5, 1.75])
        # Run 3 has no efficiency for blockwire: the row says it came from two runs.
        eff = table[("rand-write-4K", "blockwire ÷ nbdkit: MB per server CPU-s")]
        self.assertEqual(sorted(v for _, v in eff), [1.5, 2.0])
        self.assertEqual([r.number for r, _ in eff], [1, 2])
        # A server with nothing behind it is the client's ceiling, not a peer.
        self.assertNotIn(("rand-write-4K", "blockwire ÷ nbdkit-null: MB/s"), table)
        code, out, _ = self.run_main("nbd-vs-peers")
        self.assertEqual(code, 0)
        self.assertRegex(out, r"blockwire ÷ nbdkit: MB/s\s+1\.20-1\.75×\s+3\n")
        self.assertRegex(out, r"MB per server CPU-s\s+1\.50-2\.00×\s+2 of 3: #1, #2\n")
        self.assertRegex(out, r"nbdkit-null ÷ nbdkit: MB/s \(the client's ceiling\)\s+2\.00×\s+3\n")
        for date in ("2026-11-26T10:00:00Z", "2026-11-27T10:00:00Z", "2026-11-28T10:00:00Z"):
            self.assertIn(date, out)
        self.assertIn("AMD EPYC 7763, 2 cores, kernel 6.1.0", out)

    def test_other_families(self):
        self.put("nvme-vs-iscsi.json", {"machine": machine("2026-11-28T10:00:00Z"), "ratios": {
            "blockwire": {"random-4K-qd32": {"randread": {"mb_per_s": 0.5, "target_cpu_ms_per_mb": 2.0}}}}})
        self.put("nvme-vs-iscsi-2.json", {"machine": machine("2026-11-28T11:00:00Z"), "ratios": {
            "blockwire": {"random-4K-qd32": {"randread": {"mb_per_s": 0.4, "target_cpu_ms_per_mb": 1.5}}}}})
        self.put("iscsi-writes-vs-tgt.json", {"machine": "vm", "cpus": 2, "rows": [
            {"job": "seq-write", "server": "blockwire", "mb_per_s": 300.0, "mb_per_server_cpu_s": 400.0},
            {"job": "seq-write", "server": "tgt", "mb_per_s": 100.0, "mb_per_server_cpu_s": 100.0}]})
        self.put("rbd-gateway.json", {"medians": {
            "nbd": {"seq-read": {"mb_per_s": 90.0, "server_cpu_s_per_gb": 1.0}},
            "tgt-rbd": {"seq-read": {"mb_per_s": 60.0, "server_cpu_s_per_gb": 2.0}}}})
        code, out, _ = self.run_main()
        self.assertEqual(code, 0)
        self.assertRegex(out, r"random-4K-qd32 randread\s+NVMe/TCP ÷ iSCSI: MB/s\s+0\.40-0\.50×\s+2\n")
        self.assertRegex(out, r"target CPU per MB \(below 1: NVMe cheaper\)\s+1\.50-2\.00×\s+2\n")
        self.assertRegex(out, r"seq-write\s+blockwire ÷ tgt: MB/s\s+3\.00×\s+1\n")
        self.assertRegex(out, r"seq-write\s+blockwire ÷ tgt: MB per server CPU-s\s+4\.00×\s+1\n")
        # CPU per GB is turned over, so above 1 still means blockwire's gateway is cheaper.
        self.assertRegex(out, r"seq-read\s+nbd ÷ tgt-rbd: MB per server CPU-s\s+2\.00×\s+1\n")
        self.assertRegex(out, r"iscsi-writes-vs-tgt.json\s+date \?\s+CPU \?, 2 cores, kernel \?")

    def test_unknown_shapes_are_named_not_ranged(self):
        self.put("nbd-vs-peers.json", nbd_run(150, 100, date="2026-11-28T10:00:00Z"))
        self.put("nbd-vs-peers-2.json", {"machine": machine("2026-11-28T11:00:00Z"), "what": "hand-made"})
        self.put("nbd-vs-peers-3.json", {"results": {"rand-write-4K": ["not", "servers"]}})
        self.put("nbd-vs-peers-4.json", "{ not json")
        self.put("nbd-vs-peers-5.json", [1, 2, 3])
        # Looks like aoe-vs-vblade's rows but lacks their fields: not understood, no crash.
        self.put("nbd-vs-peers-6.json", {"results": [{"vblade": {}, "ratio": 1.0}]})
        code, out, _ = self.run_main("nbd-vs-peers")
        self.assertEqual(code, 0)
        self.assertRegex(out, r"nbd-vs-peers-2\.json .*\n\s+shape not understood \(top-level keys: machine, what\)")
        self.assertRegex(out, r"nbd-vs-peers-3\.json .*\n\s+shape not understood \(top-level keys: results\)")
        self.assertRegex(out, r"nbd-vs-peers-4\.json\s+not readable as JSON")
        self.assertRegex(out, r"nbd-vs-peers-5\.json\s+shape not understood: the top level is not an object")
        self.assertRegex(out, r"nbd-vs-peers-6\.json .*\n\s+shape not understood \(top-level keys: results\)")
        # The one understood run is the only one counted.
        self.assertRegex(out, r"blockwire ÷ nbdkit: MB/s\s+1\.50×\s+1\n")

    def test_since_keeps_later_runs_and_names_undated_ones(self):
        self.put("nbd-vs-peers.json", nbd_run(300, 100))
        self.put("nbd-vs-peers-2.json", nbd_run(200, 100, date="2026-11-20T10:00:00Z"))
        self.put("nbd-vs-peers-3.json", nbd_run(110, 100, date="2026-11-28T09:00:00Z"))
        self.put("nbd-vs-peers-4.json", nbd_run(130, 100, date="2026-11-28T18:00:00Z"))
        code, out, _ = self.run_main("nbd-vs-peers", "--since", "2026-11-28")
        self.assertEqual(code, 0)
        self.assertIn("2 of 4 kept runs pass the filters", out)
        self.assertIn("left out nbd-vs-peers.json: no date recorded", out)
        self.assertIn("left out nbd-vs-peers-2.json: dated 2026-11-20T10:00:00Z", out)
        self.assertRegex(out, r"blockwire ÷ nbdkit: MB/s\s+1\.10-1\.30×\s+2\n")
        _, out, _ = self.run_main("nbd-vs-peers", "--since", "2026-11-28T12")
        self.assertRegex(out, r"blockwire ÷ nbdkit: MB/s\s+1\.30×\s+1\n")
        _, out, _ = self.run_main("nbd-vs-peers")
        self.assertRegex(out, r"blockwire ÷ nbdkit: MB/s\s+1\.10-3\.00×\s+4\n")

    def test_machine_cpu_keeps_matching_models_in_any_case(self):
        self.put("nbd-vs-peers.json", nbd_run(120, 100, date="2026-11-28T10:00:00Z", cpu="AMD EPYC 7763"))
        self.put("nbd-vs-peers-2.json", nbd_run(200, 100, date="2026-11-28T11:00:00Z", cpu="Intel Xeon Gold"))
        self.put("nbd-vs-peers-3.json", nbd_run(140, 100))
        code, out, _ = self.run_main("nbd-vs-peers", "--machine-cpu", "epyc")
        self.assertEqual(code, 0)
        self.assertIn("left out nbd-vs-peers-2.json: CPU Intel Xeon Gold", out)
        self.assertIn("left out nbd-vs-peers-3.json: no CPU model recorded", out)
        self.assertRegex(out, r"blockwire ÷ nbdkit: MB/s\s+1\.20×\s+1\n")

    def test_series_are_chosen_by_script_name_and_a_missing_one_fails(self):
        self.put("nbd-vs-peers.json", nbd_run(120, 100, date="2026-11-28T10:00:00Z"))
        self.put("nbd-vs-peers-tls.json", nbd_run(400, 100, date="2026-11-28T10:00:00Z"))
        _, out, _ = self.run_main("bench/nbd-vs-peers.sh")
        self.assertEqual(re.findall(r"^== (\S+):", out, re.M), ["nbd-vs-peers"])
        _, out, _ = self.run_main()
        self.assertEqual(re.findall(r"^== (\S+):", out, re.M), ["nbd-vs-peers", "nbd-vs-peers-tls"])
        code, _, err = self.run_main("nvme_vs_iscsi.py")
        self.assertEqual(code, 1)
        self.assertIn("no kept runs of nvme-vs-iscsi", err)


if __name__ == "__main__":
    unittest.main()
