//! `blockwire lab` with an NFS cell (nfs-ganesha and rpcbind in the target
//! namespace, our libnfs client in the initiator's) and with a bonnie++ cell on
//! ext4 over `blockwire mount`, end to end, and nothing left behind: no namespace,
//! process (ganesha, rpcbind, bonnie++, the mount), loop device, memory cgroup or
//! work directory.
//! Needs root; skipped with a reason when ganesha or bonnie++ is missing.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockwire_tests::lab::leftovers;
use blockwire_tests::{assert_success, blockwire_bin, require, require_root};

/// PIDs of the processes whose name (comm) is `name`.
fn pids_named(name: &str) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            if comm.trim() == name {
                out.insert(pid);
            }
        }
    }
    out
}

/// Processes named `name` that are not in `before` and run in a network namespace
/// that has no name any more (not this one, not one under /run/netns): what a lab
/// leaves when it deletes its namespaces but not their processes. (Other tests on
/// the host may run their own, in namespaces that still have their names.)
fn orphans_named(name: &str, before: &BTreeSet<u32>) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let inode = |path: &std::path::Path| std::fs::metadata(path).ok().map(|m| m.ino());
    let mut named: BTreeSet<u64> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| inode(&e.path()))
        .collect();
    named.extend(inode(std::path::Path::new("/proc/self/ns/net")));
    pids_named(name)
        .difference(before)
        .copied()
        .filter(|pid| {
            inode(std::path::Path::new(&format!("/proc/{pid}/ns/net")))
                .is_some_and(|ns| !named.contains(&ns))
        })
        .collect()
}

/// Runs `blockwire lab ARGS --json FILE`; returns the report and the lab's PID.
fn lab(args: &[&str]) -> (serde_json::Value, u32) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("lab.json");
    let child = Command::new(blockwire_bin())
        .arg("lab")
        .args(args)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    assert_success(&output);
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (report, pid)
}

#[test]
fn one_nfs_cell_over_a_shaped_link_and_no_ganesha_or_rpcbind_left() {
    require_root!();
    require!("ganesha.nfsd", "rpcbind");
    let ganesha_before = pids_named("ganesha.nfsd");
    let rpcbind_before = pids_named("rpcbind");
    let (report, pid) = lab(&[
        "--protocols",
        "nfs",
        "--rate",
        "1g",
        "--mtu",
        "1500",
        "--size",
        "64M",
    ]);
    assert!(report["notes"].as_array().unwrap().is_empty(), "{report:#}");
    let cells = report["cells"].as_array().unwrap();
    let ops: Vec<&str> = cells.iter().map(|c| c["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["write", "read"], "{report:#}");
    for cell in cells {
        assert_eq!(cell["protocol"], "nfs", "{cell:#}");
        // The link, not a throttle, is NFS's maximum; ganesha's CPU is the target's.
        assert!(cell["disk_mb_per_s"].is_null(), "{cell:#}");
        let network = cell["network_mb_per_s"].as_f64().unwrap();
        assert!(network > 60.0 && network < 140.0, "{cell:#}");
        let efficiency = cell["efficiency"].as_f64().unwrap();
        assert!(efficiency > 0.5 && efficiency <= 1.1, "{cell:#}");
        assert!(cell["target_cpu_pct"].as_f64().unwrap() > 0.0, "{cell:#}");
    }
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:#?}");
    assert_eq!(
        orphans_named("ganesha.nfsd", &ganesha_before),
        Vec::<u32>::new(),
        "a ganesha left"
    );
    assert_eq!(
        orphans_named("rpcbind", &rpcbind_before),
        Vec::<u32>::new(),
        "an rpcbind left"
    );
}

#[test]
fn bonnie_on_ext4_over_blockwire_mount_gives_block_rows_and_leaves_nothing() {
    require_root!();
    require!("bonnie++", "losetup", "mkfs.ext4");
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    // 200 Mbit: bonnie's 64 MiB then take a few seconds per test, long enough for
    // it to time each one (it prints "+++++" for what ends too soon).
    let (report, pid) = lab(&[
        "--protocols",
        "nbd",
        "--workloads",
        "bonnie-fs",
        "--rate",
        "200m",
        "--mtu",
        "1500",
        "--size",
        "64M",
    ]);
    let cells = report["cells"].as_array().unwrap();
    let ops: Vec<&str> = cells.iter().map(|c| c["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["write", "rewrite", "read", "seeks"], "{report:#}");
    for cell in cells {
        assert_eq!(cell["workload"], "bonnie-fs", "{cell:#}");
        if cell["op"] != "seeks" {
            let mb = cell["mb_per_s"].as_f64().unwrap();
            // Every block crossed the 25 MB/s link: no cache answered.
            assert!(mb > 1.0 && mb < 30.0, "{cell:#}");
        } else {
            assert!(cell["iops"].as_f64().unwrap() > 0.0, "{cell:#}");
        }
        assert!(cell["target_cpu_pct"].as_f64().is_some(), "{cell:#}");
    }
    // bonnie++ and the mount name the work directory on their command lines.
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn sigint_while_bonnie_runs_on_ext4_unmounts_and_releases_everything() {
    require_root!();
    require!("bonnie++", "losetup", "mkfs.ext4");
    if !std::path::Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    // 256 MiB over 200 Mbit: bonnie's write alone takes about ten seconds.
    let mut child = Command::new(blockwire_bin())
        .args([
            "lab",
            "--protocols",
            "nbd",
            "--workloads",
            "bonnie-fs",
            "--rate",
            "200m",
            "--mtu",
            "1500",
            "--size",
            "256M",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let lines = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // After the network line: the mount, mkfs and bonnie++ in turn.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut bonnie_running = false;
    while Instant::now() < deadline && !bonnie_running {
        while rx.try_recv().is_ok() {}
        bonnie_running = leftovers(pid)
            .iter()
            .any(|l| l.contains("bonnie++") && l.starts_with("process"));
        std::thread::sleep(Duration::from_millis(200));
    }
    if !bonnie_running {
        let _ = child.kill();
        panic!("bonnie++ did not start: {:#?}", leftovers(pid));
    }
    std::thread::sleep(Duration::from_secs(2));
    let during = leftovers(pid);
    assert!(
        during.iter().any(|l| l.starts_with("loop device"))
            && during.iter().any(|l| l.starts_with("memory cgroup")),
        "the loop device and bonnie's cgroup should exist now: {during:#?}"
    );
    // SAFETY: kill(2) on the child we started and have not reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}\n{stderr}");
    let left = leftovers(pid);
    assert!(
        left.is_empty(),
        "left behind after SIGINT: {left:#?}\n{stderr}"
    );
}
