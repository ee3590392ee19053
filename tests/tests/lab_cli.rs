//! `blockwire lab` end to end: a small bed (two channels shaped to 200 Mbit, MTU
//! 1500 and 9000), one short sequential cell per protocol, the JSON and HTML it
//! writes, and nothing (namespace, veth, process, work directory) left behind —
//! after a normal run, after a SIGINT in the middle of a cell, no process after a
//! SIGKILL, and refused with one line without CAP_NET_ADMIN. Needs root.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blockwire_tests::lab::{leftovers, prefix};
use blockwire_tests::{assert_success, blockwire_bin, require_root, text};

fn lab_command(args: &[&str]) -> Command {
    let mut command = Command::new(blockwire_bin());
    command.arg("lab").args(args);
    command
}

#[test]
fn two_shaped_channels_one_cell_per_protocol_json_html_and_nothing_left() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let html = dir.path().join("lab.html");
    let csv = dir.path().join("lab.csv");
    let started = Instant::now();
    let child = lab_command(&[
        "--protocols",
        "nbd,aoe,iscsi",
        "--channels",
        "2",
        "--rate",
        "200m",
        "--mtu",
        "1500,9000",
        "--size",
        "32M",
        "--time",
        "1",
    ])
    .arg("--json")
    .arg(&json)
    .arg("--html")
    .arg(&html)
    .arg("--csv")
    .arg(&csv)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    assert_success(&output);
    eprintln!("lab run took {:?}", started.elapsed());
    let stdout = text(&output.stdout);
    assert!(stdout.contains("[6/6]"), "{stdout}");
    assert!(stdout.contains("bed: 2 × 200 Mbit at MTU 9000"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cells = report["cells"].as_array().unwrap();
    // 3 protocols × 2 MTUs, each a write and a read.
    assert_eq!(cells.len(), 12, "{report:#}");
    for protocol in ["nbd", "aoe", "iscsi"] {
        for mtu in [1500, 9000] {
            for op in ["write", "read"] {
                assert!(
                    cells
                        .iter()
                        .any(|c| c["protocol"] == protocol && c["mtu"] == mtu && c["op"] == op),
                    "no {protocol} {mtu} {op} in {report:#}"
                );
            }
        }
    }
    for cell in cells {
        for field in [
            "protocol",
            "mtu",
            "channels",
            "striped",
            "rate_mbit",
            "workload",
            "op",
            "mb_per_s",
            "network_mb_per_s",
            "max_mb_per_s",
            "efficiency",
            "initiator_cpu_pct",
            "target_cpu_pct",
        ] {
            assert!(cell.get(field).is_some(), "{field} missing: {cell:#}");
        }
        assert_eq!(cell["channels"], 2);
        assert_eq!(cell["striped"], true);
        assert_eq!(cell["rate_mbit"], 200);
        assert_eq!(cell["workload"], "sequential");
        let mb = cell["mb_per_s"].as_f64().unwrap();
        let network = cell["network_mb_per_s"].as_f64().unwrap();
        let max = cell["max_mb_per_s"].as_f64().unwrap();
        let efficiency = cell["efficiency"].as_f64().unwrap();
        assert!(mb > 0.0, "{cell:#}");
        // Two channels at 200 Mbit carry at most 50 MB/s; the measured aggregate
        // must be near that, and nothing is faster than the shaping allows.
        assert!(network > 30.0 && network <= 52.0, "{cell:#}");
        assert!(mb <= 52.0, "faster than two 200 Mbit links: {cell:#}");
        assert!((max - network).abs() < 1e-6, "no disk throttle: {cell:#}");
        assert!(efficiency > 0.0 && efficiency <= 1.5, "{cell:#}");
        assert!((efficiency - mb / max).abs() < 1e-9, "{cell:#}");
        assert!(
            cell["initiator_cpu_pct"].as_f64().unwrap() > 0.0,
            "{cell:#}"
        );
        assert!(cell["target_cpu_pct"].as_f64().is_some(), "{cell:#}");
    }

    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    // The terminal and the page count the same cells (and rows).
    let count = "6 of 6 cells measured, 12 rows (one per operation)";
    assert!(stdout.contains(count), "{stdout}");
    assert!(page.contains(count), "the page counts otherwise");
    assert!(page.contains("<svg"), "no chart in the page");
    assert!(page.contains("Efficiency"));
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 13);

    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// Starts a lab run whose first cell takes long enough to be interrupted, and
/// returns it once its bed, target and bench are all there.
fn lab_in_the_middle_of_a_cell() -> std::process::Child {
    // Large enough that the first cell is still running when the signal comes
    // (256 MB at 25 MB/s is ten seconds a direction).
    let mut child = lab_command(&[
        "--protocols",
        "nbd",
        "--channels",
        "2",
        "--rate",
        "200m",
        "--mtu",
        "1500",
        "--size",
        "512M",
        "--time",
        "1",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    // The network line comes once the target is up and the channels measured (each
    // moving its 256 MB share of the data set both ways, about 20 s); the bench
    // starts right after it.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("network:")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("the first cell did not start: {seen:#?}");
            }
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    // The bed, the target and the bench are all there now.
    let before = leftovers(pid);
    assert!(
        before.iter().filter(|l| l.starts_with("namespace")).count() == 2,
        "{before:#?}"
    );
    assert!(
        before.iter().any(|l| l.contains(" serve "))
            && before.iter().any(|l| l.contains(" bench ")),
        "target and bench should be running: {before:#?}"
    );
    child
}

#[test]
fn sigint_in_the_middle_of_a_cell_tears_everything_down() {
    require_root!();
    let mut child = lab_in_the_middle_of_a_cell();
    let pid = child.id();
    // SAFETY: kill(2) on the child we started and have not reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left = leftovers(pid);
    assert!(
        left.is_empty(),
        "left behind after SIGINT: {left:#?}\n{stderr}"
    );
}

#[test]
fn a_killed_lab_takes_its_target_and_bench_with_it() {
    require_root!();
    let mut child = lab_in_the_middle_of_a_cell();
    let pid = child.id();
    // SIGKILL runs no handler: the kernel's parent-death signal stops the children.
    // SAFETY: kill(2) on the child we started and have not reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let processes = || -> Vec<String> {
        leftovers(pid)
            .into_iter()
            .filter(|l| l.starts_with("process"))
            .collect()
    };
    while !processes().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = processes();
    // What only a handler removes (namespaces, the work directory): by hand.
    let prefix = prefix(pid);
    for entry in std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
    for entry in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    assert!(left.is_empty(), "outlived the killed lab: {left:#?}");
}

#[test]
fn without_cap_net_admin_it_says_so_in_one_line() {
    require_root!();
    // Root without CAP_NET_ADMIN in its bounding set: the capability is gone from
    // the lab's effective set.
    let child = Command::new("setpriv")
        .args(["--bounding-set", "-net_admin", "--inh-caps", "-net_admin"])
        .arg(blockwire_bin())
        .args(["lab", "--protocols", "nbd", "--size", "32M"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(child) = child else {
        eprintln!("skipped: setpriv is not installed");
        return;
    };
    // setpriv execs the lab: the PID is the lab's.
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("needs root (CAP_NET_ADMIN)"), "{stderr}");
    assert!(
        text(&output.stdout).is_empty(),
        "nothing to say before the refusal"
    );
    let left = leftovers(pid);
    assert!(left.is_empty(), "{left:#?}");
}

#[test]
fn file_backed_exports_and_one_aoe_export_over_both_channels() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    // Striped and one export over both channels, one after the other on the same
    // bed: each cell's files are its own (a cell must not find the last one's).
    let child = lab_command(&[
        "--protocols",
        "aoe",
        "--channels",
        "2",
        "--striped",
        "both",
        "--backing",
        "file",
        "--rate",
        "200m",
        "--mtu",
        "9000",
        "--size",
        "32M",
        "--disk-rate",
        "20",
    ])
    .arg("--json")
    .arg(&json)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    assert_success(&output);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["notes"].as_array().unwrap().is_empty(), "{report:#}");
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "{report:#}");
    for cell in cells {
        let striped = cell["striped"].as_bool().unwrap();
        // Two 20 MB/s disks striped, or one alone: the disks are the maximum.
        let disks = if striped { 40.0 } else { 20.0 };
        assert_eq!(cell["max_mb_per_s"].as_f64().unwrap(), disks, "{cell:#}");
        let mb = cell["mb_per_s"].as_f64().unwrap();
        assert!(mb > 0.0 && mb <= disks * 1.1, "{cell:#}");
        let efficiency = cell["efficiency"].as_f64().unwrap();
        assert!(efficiency > 0.5 && efficiency <= 1.1, "{cell:#}");
    }
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:#?}");
}
