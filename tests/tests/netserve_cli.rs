//! The bench's network baseline against our own netperf server: `blockwire serve
//! --netserve` beside an export, `blockwire netserve` alone, and a server that
//! outlives clients speaking garbage.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use blockwire_tests::{blockwire_bin, free_port, path_str, require, text, Served};

/// Runs `blockwire bench TARGET --workload network --netserve-port PORT --time 1
/// --json FILE` and returns the JSON report.
fn bench_network(target: &str, port: u16, json: &Path) -> serde_json::Value {
    bench_network_with(target, "--netserve-port", port, json)
}

/// Like [`bench_network`] with another port option (`--iperf-port`).
fn bench_network_with(target: &str, option: &str, port: u16, json: &Path) -> serde_json::Value {
    let output = Command::new(blockwire_bin())
        .args(["bench", target, "--workload", "network", "--time", "1"])
        .args([option, &port.to_string(), "--json", path_str(json)])
        .output()
        .expect("run blockwire bench");
    assert!(
        output.status.success(),
        "blockwire bench failed:\nstdout: {}\nstderr: {}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let mut report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(json).expect("read the JSON report"))
            .expect("the JSON report parses");
    // What the bench said (which tool it used, or why it skipped), for messages.
    report["stderr"] = text(&output.stderr).into();
    report
}

/// Checks that the report holds both network phases, each moving data, with the
/// target's CPU% filled in.
fn assert_both_directions(report: &serde_json::Value) {
    let results = report["results"].as_array().expect("results");
    for op in ["send", "receive"] {
        let phase = results
            .iter()
            .find(|r| r["workload"] == "network" && r["op"] == op)
            .unwrap_or_else(|| panic!("no network {op} phase in {report:#}"));
        assert!(phase["mb_per_s"].as_f64().unwrap() > 0.0, "{phase:#}");
        assert!(phase["bytes"].as_u64().unwrap() > 0, "{phase:#}");
        assert!(phase["seconds"].as_f64().unwrap() > 0.5, "{phase:#}");
        assert!(phase["target_cpu_percent"].is_number(), "{phase:#}");
        assert!(phase["mb_per_s_per_cpu_percent"].is_number(), "{phase:#}");
    }
    assert!(report["network_mb_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_measures_both_directions_against_serve_netserve() {
    let dir = tempfile::tempdir().unwrap();
    let netserve_port = free_port();
    let served = Served::start(
        &["--netserve", &format!("127.0.0.1:{netserve_port}")],
        "demo",
    );
    let report = bench_network(
        &format!("nbd://127.0.0.1:{}/", served.port),
        netserve_port,
        &dir.path().join("run.json"),
    );
    assert_both_directions(&report);
    assert_eq!(
        report["config"]["workloads"],
        serde_json::json!(["network"])
    );
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn netserve_alone_exits_0_on_sigterm() {
    let netserve = Served::start_netserve(&[]);
    assert_ne!(netserve.port, 0);
    assert_eq!(netserve.terminate(), Some(0));
}

#[test]
fn garbage_handshakes_do_not_kill_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let netserve = Served::start_netserve(&[]);
    // A stranger that sends garbage: the server closes on it without an answer.
    let mut stranger = TcpStream::connect(("127.0.0.1", netserve.port)).unwrap();
    stranger
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let garbage: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
    stranger.write_all(&garbage).unwrap();
    let mut answer = Vec::new();
    // End of file or a reset (the garbage it did not read): either way, closed
    // without a word.
    let _ = stranger.read_to_end(&mut answer);
    assert!(answer.is_empty(), "{answer:?}");
    // A client that connects and hangs up without a word.
    drop(TcpStream::connect(("127.0.0.1", netserve.port)).unwrap());

    // A real client is still served. The NBD port names nothing: the network test
    // alone needs no export.
    let report = bench_network(
        &format!("nbd://127.0.0.1:{}/none", free_port()),
        netserve.port,
        &dir.path().join("run.json"),
    );
    assert_both_directions(&report);
    assert_eq!(netserve.terminate(), Some(0));
}

#[test]
fn bench_falls_back_to_iperf3_given_its_port() {
    require!("iperf3");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut iperf3 = Command::new("iperf3")
        .args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start iperf3 -s");
    // Wait until iperf3 holds the port. Not by connecting: iperf3 serves one client
    // at a time, and a probe that hangs up can make it turn the bench away as busy.
    let started = std::time::Instant::now();
    while std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "iperf3 -s did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let report = bench_network_with(
        &format!("127.0.0.1:{port}"),
        "--iperf-port",
        port,
        &dir.path().join("run.json"),
    );
    let _ = iperf3.kill();
    let _ = iperf3.wait();
    assert_both_directions(&report);
}
