//! `blockwire bench` at its edges: a URI scheme it does not speak is refused at once
//! with nothing sent, a run that measured nothing fails, an interrupted or killed
//! bench takes its iperf3 client with it, and an iSCSI target's CPU is found
//! without being named.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blockwire_tests::{
    blockwire_bin, free_port, path_str, require, run_bounded, sparse_file, text, Served, MIB,
};

/// A safety net against a hang, not a timing assertion.
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn a_scheme_bench_does_not_speak_is_refused_at_once_and_nothing_is_sent() {
    // Where the network test would have connected first.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut command = Command::new(blockwire_bin());
    command.args([
        "bench",
        "smb://127.0.0.1/share/f",
        "--netserve-port",
        &port.to_string(),
    ]);
    let started = Instant::now();
    let output = run_bounded(command, LIMIT);
    let took = started.elapsed();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    // Refused before any network test: a probe alone waits 2 s for an answer.
    assert!(took < Duration::from_secs(2), "took {took:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    for scheme in [
        "smb://",
        "nfs://",
        "nbd://",
        "aoe://",
        "iscsi://",
        "HOST:PORT",
    ] {
        assert!(lines[0].contains(scheme), "{scheme} in {stderr}");
    }
    assert!(text(&output.stdout).is_empty(), "{}", text(&output.stdout));
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the bench connected: {accepted:?}"
    );
}

#[test]
fn a_bench_that_measured_nothing_of_what_was_asked_fails() {
    // The network alone, asked of a local path: skipped, so nothing measured.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let mut command = Command::new(blockwire_bin());
    command
        .args(["bench", "--workload", "network", "--json"])
        .arg(&json)
        .arg(dir.path());
    let output = run_bounded(command, LIMIT);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("network: skipped"), "{stderr}");
    assert!(
        stderr.contains("nothing was measured of what was asked"),
        "{stderr}"
    );
    assert!(
        !json.exists(),
        "a report was written for a run that measured nothing"
    );
}

/// The PIDs of `pid`'s children, from every thread's children list.
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return children;
    };
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        children.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    children
}

/// The command name of process `pid`, if it is alive (a zombie counts as gone).
fn alive_comm(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (comm, rest) = stat.rsplit_once(')')?;
    if rest.trim_start().starts_with('Z') {
        return None;
    }
    Some(comm.split_once('(')?.1.to_string())
}

/// An `iperf3 -s` on a free loopback port, up (it holds the port) when returned.
fn iperf3_server() -> (Child, u16) {
    let port = free_port();
    let server = Command::new("iperf3")
        .args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start iperf3 -s");
    // Not by connecting: iperf3 takes a connection as a test's control channel.
    let started = Instant::now();
    while TcpListener::bind(("127.0.0.1", port)).is_ok() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "iperf3 -s did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, port)
}

/// Starts a bench whose network test runs `iperf3 -c` against `port` for 30 s, and
/// waits until its iperf3 child is there; returns the bench and that child's PIDs.
fn bench_with_iperf3_running(port: u16) -> (Child, Vec<u32>) {
    let mut bench = Command::new(blockwire_bin())
        .args([
            "bench",
            &format!("127.0.0.1:{port}"),
            "--workload",
            "network",
            "--iperf-port",
            &port.to_string(),
            "--time",
            "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = bench.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let iperf3: Vec<u32> = children_of(pid)
            .into_iter()
            .filter(|&child| alive_comm(child).as_deref() == Some("iperf3"))
            .collect();
        if !iperf3.is_empty() {
            // Let it get going: the test, not its start, is what is interrupted.
            std::thread::sleep(Duration::from_millis(500));
            return (bench, iperf3);
        }
        if let Ok(Some(status)) = bench.try_wait() {
            panic!("the bench ended ({status}) before its iperf3 was seen");
        }
        assert!(
            Instant::now() < deadline,
            "no iperf3 child of the bench within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to a few seconds for every PID in `pids` to be gone; returns those
/// still running iperf3.
fn survivors(pids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&pid| alive_comm(pid).as_deref() == Some("iperf3"))
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}

#[test]
fn an_interrupted_bench_leaves_no_iperf3_behind() {
    require!("iperf3");
    let (mut server, port) = iperf3_server();
    let (mut bench, iperf3) = bench_with_iperf3_running(port);
    signal(&bench, libc::SIGINT);
    let status = bench.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut bench.stderr.take().unwrap(), &mut stderr).unwrap();
    let left = survivors(&iperf3);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(status.code(), Some(130), "{status:?}\n{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        left.is_empty(),
        "iperf3 {left:?} outlived the bench\n{stderr}"
    );
}

#[test]
fn a_killed_bench_leaves_no_iperf3_behind() {
    // SIGKILL runs no handler: the kernel's parent-death signal ends the child.
    require!("iperf3");
    let (mut server, port) = iperf3_server();
    let (mut bench, iperf3) = bench_with_iperf3_running(port);
    signal(&bench, libc::SIGKILL);
    let status = bench.wait().unwrap();
    let left = survivors(&iperf3);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    assert!(left.is_empty(), "iperf3 {left:?} outlived the killed bench");
}

#[test]
fn an_iscsi_targets_cpu_is_found_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "lun.img", 64 * MIB);
    let served = Served::start_iscsi(&[path_str(&image)], "cpu");
    let json = dir.path().join("run.json");
    let mut command = Command::new(blockwire_bin());
    command.args([
        "bench",
        served.iscsi_url(),
        "--workload",
        "sequential",
        "--size",
        "32M",
        "--force",
        "--json",
        path_str(&json),
    ]);
    let output = run_bounded(command, LIMIT);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // No --target-pid and no netserve: the process listening on the iSCSI port.
    assert!(
        stderr.contains(&format!("target CPU: process {} ", served.pid())),
        "{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cpu: Vec<f64> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["target_cpu_percent"].as_f64().unwrap_or(-1.0))
        .collect();
    assert!(cpu.iter().all(|&c| c >= 0.0), "{report:#}");
    // 32 MB each way through the target: more than a 10 ms clock tick of its CPU.
    assert!(cpu.iter().any(|&c| c > 0.0), "{report:#}");
}
