//! A short `blockwire bench` of a device, and the check that every job moved data:
//! the judge of "bench measures this target like any other".

use std::path::Path;

use crate::{blockwire_bin, path_str, text};

/// `blockwire bench TARGET --workload sequential,random` on 16 MiB, `seconds` per
/// job at queue depths `depths` (e.g. "1,4"), its JSON report in `dir`; asserts that
/// the sequential write and read and the random reads and writes each moved data.
/// Returns the report.
pub fn quick_bench_moves_data(
    target: &str,
    dir: &Path,
    seconds: &str,
    depths: &str,
) -> serde_json::Value {
    let json = dir.join("bench.json");
    let output = std::process::Command::new(blockwire_bin())
        .args(["bench", target, "--workload", "sequential,random"])
        .args([
            "--size",
            "16M",
            "--time",
            seconds,
            "--random-depths",
            depths,
        ])
        .args(["--json", path_str(&json)])
        .output()
        .expect("run blockwire bench");
    assert!(
        output.status.success(),
        "blockwire bench {target} failed: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("bench wrote its JSON"))
            .expect("bench's JSON parses");
    let rows = report["results"].as_array().expect("bench results");
    for (workload, op) in [
        ("sequential", "write"),
        ("sequential", "read"),
        ("random", "randread"),
        ("random", "randwrite"),
    ] {
        assert!(
            rows.iter().any(|r| r["workload"] == workload
                && r["op"] == op
                && r["bytes"].as_u64().is_some_and(|b| b > 0)),
            "no {workload} {op} that moved data in {report}"
        );
    }
    report
}
