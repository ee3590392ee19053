//! `blockwire bench nbd://...` from the command line: our initiator measuring our own
//! `blockwire serve`, its JSON report, several connections, and a URI where nothing
//! listens.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use blockwire_tests::{
    assert_success, blockwire_bin, free_port, path_str, run_bounded, text, Served, MIB,
};

/// A safety net against a hang, not a timing assertion: these runs take seconds.
const LIMIT: Duration = Duration::from_secs(180);
const SIZE: u64 = 16 * MIB;

/// `blockwire bench URI --workload sequential,random` on a small data set, with a
/// JSON report in `json`, plus `extra` arguments.
fn bench_uri(uri: &str, json: &Path, extra: &[&str]) -> Output {
    let mut command = Command::new(blockwire_bin());
    command.args([
        "bench",
        uri,
        "--workload",
        "sequential,random",
        "--size",
        "16M",
        "--time",
        "0.2",
        "--random-depths",
        "1,4",
        "--json",
        path_str(json),
    ]);
    command.args(extra);
    run_bounded(command, LIMIT)
}

fn report(json: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(json).expect("bench wrote its JSON");
    serde_json::from_str(&text).expect("bench's JSON parses")
}

/// The sequential rows of a report: a write and a read, each at the URI default
/// queue depth of 16, each having moved data.
fn check_sequential(report: &serde_json::Value) {
    let results = report["results"].as_array().expect("results array");
    let sequential: Vec<_> = results
        .iter()
        .filter(|r| r["workload"] == "sequential")
        .collect();
    for op in ["write", "read"] {
        assert!(
            sequential.iter().any(|r| r["op"] == op),
            "no sequential {op} in {report}"
        );
    }
    for row in sequential {
        assert_eq!(row["queue_depth"], 16, "{row}");
        assert!(row["bytes"].as_u64().is_some_and(|b| b > 0), "{row}");
        assert!(row["mb_per_s"].as_f64().is_some_and(|v| v > 0.0), "{row}");
    }
}

/// Every storage phase carries the target's CPU%, and the target did measurable
/// work in some. (A phase of a few milliseconds may read 0% from /proc, whose
/// clock ticks every 10 ms.)
fn check_target_cpu(report: &serde_json::Value) {
    let storage: Vec<f64> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["workload"] != "network")
        .map(|row| {
            row["target_cpu_percent"]
                .as_f64()
                .unwrap_or_else(|| panic!("no target CPU in {row}"))
        })
        .collect();
    assert!(!storage.is_empty(), "{report}");
    assert!(storage.iter().all(|&p| p >= 0.0), "{storage:?}");
    assert!(storage.iter().any(|&p| p > 0.0), "{storage:?}");
}

#[test]
fn bench_measures_our_own_nbd_target() {
    // No PATH: `serve` exports a 1 GiB in-memory device named "demo".
    let served = Served::start(&[], "demo");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let output = bench_uri(&served.uri(), &json, &[]);
    assert_success(&output);
    // No --target-pid and no netserve: the bench finds the process listening on
    // the target's port and measures its CPU.
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!("target CPU: process {}", served.pid())),
        "{stderr}"
    );
    let report = report(&json);
    check_target_cpu(&report);
    assert_eq!(report["target"], served.uri().as_str());
    assert_eq!(report["config"]["size"], SIZE);
    assert_eq!(report["config"]["queue_depth"], 16);
    check_sequential(&report);

    // The random workload ran at the depths asked for, reading and writing.
    let results = report["results"].as_array().unwrap();
    for op in ["randread", "randwrite"] {
        for depth in [1, 4] {
            let row = results
                .iter()
                .find(|r| r["workload"] == "random" && r["op"] == op && r["queue_depth"] == depth)
                .unwrap_or_else(|| panic!("no random {op} QD{depth} in {report}"));
            assert_eq!(row["block_size"], 4096, "{row}");
            assert!(row["ops"].as_u64().is_some_and(|n| n > 0), "{row}");
            assert!(row["iops"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        }
    }
    // Nothing but storage was asked for, so no share of the link was measured.
    assert!(results.iter().all(|r| r["workload"] != "network"));
    assert!(report["network_mb_per_s"].is_null());
    for row in results {
        let share = row
            .get("link_percent")
            .expect("link_percent in each result");
        assert!(share.is_null(), "{row}");
    }
    assert_eq!(
        served.terminate(),
        Some(0),
        "the target did not stop cleanly"
    );
}

#[test]
fn bench_over_two_connections() {
    // A file-backed export this time: the other backend a user would serve.
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("export.img");
    let served = Served::start(&[path_str(&image), "--size", "64M", "--name", "two"], "two");
    let json = dir.path().join("run.json");
    let output = bench_uri(&served.uri(), &json, &["--connections", "2"]);
    assert_success(&output);
    check_sequential(&report(&json));
    assert_eq!(
        served.terminate(),
        Some(0),
        "the target did not stop cleanly"
    );
}

#[test]
fn bench_where_nothing_listens_fails_with_one_line() {
    // Free a moment ago; nothing of ours listens there.
    let port = free_port();
    let uri = format!("nbd://127.0.0.1:{port}/nothing");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let output = bench_uri(&uri, &json, &[]);
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "bench succeeded against {uri}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot connect") && stderr.contains(&port.to_string()),
        "{stderr}"
    );
    assert!(!json.exists(), "a report was written for a failed run");
}

#[test]
fn storage_results_carry_their_share_of_the_measured_link() {
    let netserve_port = free_port();
    let served = Served::start(
        &["--netserve", &format!("127.0.0.1:{netserve_port}")],
        "demo",
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let mut command = Command::new(blockwire_bin());
    command.args([
        "bench",
        &served.uri(),
        "--workload",
        "network,sequential",
        "--size",
        "16M",
        "--time",
        "0.5",
        "--netserve-port",
        &netserve_port.to_string(),
        "--json",
        path_str(&json),
    ]);
    let output = run_bounded(command, LIMIT);
    assert_success(&output);
    // Our target reports its own CPU through its netserve.
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "target CPU: reported by blockwire's netserve at 127.0.0.1:{netserve_port}"
        )),
        "{stderr}"
    );
    let report = report(&json);
    check_target_cpu(&report);
    assert!(report["network_mb_per_s"].as_f64().is_some_and(|v| v > 0.0));
    for row in report["results"].as_array().unwrap() {
        let share = &row["link_percent"];
        if row["workload"] == "network" {
            assert!(share.is_null(), "{row}");
        } else {
            assert!(share.as_f64().is_some_and(|p| p > 0.0), "{row}");
        }
    }
    check_sequential(&report);
    assert_eq!(
        served.terminate(),
        Some(0),
        "the target did not stop cleanly"
    );
}
