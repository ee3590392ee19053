//! Our AoE initiator against our AoE target across a veth pair between two network
//! namespaces: the device conformance suite at MTU 1500 and 9000, and the commands a
//! user runs on an AoE URI — info, copy (which flushes: the data survives SIGKILL of
//! the target), bench, and serve as a gateway to NBD. Needs root.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{Device, ErrorKind, IoBuf, QueuedOp, Submission, WriteFlags};
use blockwire_tests::aoe::{file_has, AoeLab, SHELF, SLOT};
use blockwire_tests::{
    blockwire_bin, path_str, patterned_file, require_root, run_queued, text, Served, MIB,
};

fn backing_file(dir: &tempfile::TempDir, size: u64) -> String {
    let path = dir.path().join("aoe.img");
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    path_str(&path).to_string()
}

fn uri() -> String {
    format!("aoe://eth0/e{SHELF}.{SLOT}")
}

/// The device conformance suite through our initiator against our target, which
/// is served with `extra` arguments; `query` is added to the initiator's URI.
fn conformance_through_aoe(short: &str, mtu: usize, extra: &[&str], query: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir, 64 * MIB);
    let mut args = vec![file.as_str()];
    args.extend_from_slice(extra);
    let lab = AoeLab::start(short, mtu, &args);
    let uri: AoeUri = format!("{}{query}", uri()).parse().unwrap();
    let client = lab.lab.run_in(lab.lab.initiator_ns(), || {
        AoeClient::open(&uri, AoeOptions::default()).expect("open the AoE target")
    });
    assert_eq!(
        client.sectors_per_frame(),
        blockwire_aoe::wire::sectors_per_frame(mtu)
    );
    let device = Device::new(Arc::new(client));
    conformance::run_all(&device);
}

#[test]
fn conformance_suite_through_aoe_at_mtu_1500() {
    require_root!();
    conformance_through_aoe("cf", 1500, &[], "");
}

#[test]
fn conformance_suite_through_aoe_at_mtu_9000() {
    require_root!();
    conformance_through_aoe("cj", 9000, &[], "");
}

#[test]
fn conformance_suite_through_aoe_over_af_xdp_at_both_ends() {
    require_root!();
    conformance_through_aoe("cx", 1500, &["--aoe-xdp"], "?xdp");
}

#[test]
fn conformance_suite_through_aoe_to_a_direct_io_export() {
    require_root!();
    conformance_through_aoe("cd", 1500, &["--direct"], "");
}

#[test]
fn conformance_suite_through_aoe_to_a_direct_io_export_at_mtu_9000() {
    require_root!();
    // Full 17-sector frames: runs on workers grow across receive batches.
    conformance_through_aoe("cg", 9000, &["--direct"], "");
}

#[test]
fn two_links_are_two_paths_and_both_carry_frames() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir, 64 * MIB);
    let lab = AoeLab::start_links("c2", 2, 1500, &[&file]);
    let uri: AoeUri = format!("aoe://eth0,eth1/e{SHELF}.{SLOT}").parse().unwrap();
    let client = lab.lab.run_in(lab.lab.initiator_ns(), || {
        AoeClient::open(&uri, AoeOptions::default()).expect("open over two links")
    });
    assert_eq!(client.paths().len(), 2, "one path per link");
    let device = Device::new(Arc::new(client));
    conformance::run_all(&device);
    // Both links carried traffic (the target's receive counters on each).
    for link in ["eth0", "eth1"] {
        let output = lab
            .lab
            .command_in(lab.lab.target_ns(), "cat")
            .arg(format!("/sys/class/net/{link}/statistics/rx_packets"))
            .output()
            .unwrap();
        let packets: u64 = text(&output.stdout).trim().parse().unwrap_or(0);
        assert!(packets > 100, "{link} carried only {packets} frames");
    }
}

#[test]
fn a_config_file_serves_one_export_over_aoe_and_nbd() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir, 16 * MIB);
    let socket = dir.path().join("nbd.sock");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nsocket = [\"{}\"]\n\n[[export]]\nname = \"disk\"\npath = \"{file}\"\n\
             aoe = {{ interfaces = [\"eth0\"], shelf = {SHELF}, slot = {SLOT}, \
             buffer_count = 32, config_string = \"rack-7\", xdp = \"generic\" }}\n",
            path_str(&socket)
        ),
    )
    .unwrap();
    // Not "cg": conformance_suite_through_aoe_to_a_direct_io_export_at_mtu_9000
    // has that, and tests of one binary run at once.
    let tag = format!("cn{}", std::process::id() % 100000);
    let lab = blockwire_tests::netns::VethLab::new(&tag, 1, 1500).unwrap();
    let mut command = lab.command_in(lab.target_ns(), blockwire_bin());
    command.arg("serve").arg("--config").arg(&config);
    let served = Served::spawn_ready(command, "disk");

    let output = lab
        .command_in(lab.initiator_ns(), blockwire_bin())
        .args(["info", "--json", &uri()])
        .output()
        .unwrap();
    let info = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(info.contains("\"config_string\": \"rack-7\""), "{info}");
    assert!(info.contains("\"buffer_count\": 32"), "{info}");

    let uri: AoeUri = uri().parse().unwrap();
    let aoe = lab.run_in(lab.initiator_ns(), || {
        AoeClient::open(&uri, AoeOptions::default()).expect("open the AoE export")
    });
    let aoe = Device::new(Arc::new(aoe));
    let data = vec![0x5a; 64 << 10];
    aoe.write(&data, 1 << 20, blockwire_blockdev::WriteFlags::default())
        .unwrap();
    let nbd_uri = format!("nbd+unix:///disk?socket={}", path_str(&socket));
    let nbd = blockwire_nbd::initiator::NbdClient::connect(
        &nbd_uri.parse().unwrap(),
        blockwire_nbd::initiator::ClientOptions::default(),
    )
    .expect("connect over NBD");
    let mut back = vec![0; data.len()];
    Device::new(Arc::new(nbd)).read(&mut back, 1 << 20).unwrap();
    assert!(back == data, "an AoE write reads back over NBD");
    drop(aoe);
    drop(served);
}

#[test]
fn info_copy_bench_and_gateway_on_an_aoe_uri() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir, 32 * MIB);
    let mut lab = AoeLab::start("cc", 1500, &[&file]);
    let initiator = lab.lab.initiator_ns().to_string();
    let blockwire = |args: &[&str]| {
        let output = std::process::Command::new("ip")
            .args(["netns", "exec", &initiator])
            .arg(blockwire_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "blockwire {args:?}: {}",
            text(&output.stderr)
        );
        text(&output.stdout)
    };

    let info = blockwire(&["info", &uri()]);
    assert!(info.contains(&format!("target: e{SHELF}.{SLOT}")), "{info}");
    assert!(info.contains("sectors per frame: 2"), "{info}");
    assert!(info.contains("33554432 bytes"), "{info}");
    let list = blockwire(&["info", "--list", "--json", "aoe://eth0"]);
    assert!(
        list.contains(&format!("\"target\": \"e{SHELF}.{SLOT}\"")),
        "{list}"
    );

    let source = patterned_file(dir.path(), "source.img", 8 << 20, 3);
    blockwire(&["copy", path_str(&source), &uri()]);
    // copy flushed before it returned: the data is in the file even if the target
    // dies at once.
    lab.kill_target();
    let expected = std::fs::read(&source).unwrap();
    assert!(file_has(dir.path().join("aoe.img").as_path(), 0, &expected));
    lab.restart(&[&file]);

    // Gateway: the AoE device, opened by our initiator, served again over NBD.
    let socket = dir.path().join("gateway.sock");
    let mut command = lab.lab.command_in(&initiator, blockwire_bin());
    command
        .args(["serve", &uri(), "--name", "gw", "--socket"])
        .arg(&socket);
    let _gateway = Served::spawn_ready(command, "gw");
    let nbd_uri = format!("nbd+unix:///gw?socket={}", path_str(&socket));
    let client = blockwire_nbd::initiator::NbdClient::connect(
        &nbd_uri.parse().unwrap(),
        blockwire_nbd::initiator::ClientOptions::default(),
    )
    .expect("connect to the gateway");
    let device = Device::new(Arc::new(client));
    assert_eq!(device.size(), 32 * MIB);
    let mut back = vec![0; 1 << 20];
    device.read(&mut back, 0).unwrap();
    assert!(
        back == expected[..1 << 20],
        "the gateway serves the AoE data"
    );
    drop(device);
    drop(_gateway);

    // Last, as it overwrites the device with its own data.

    let json = dir.path().join("bench.json");
    blockwire(&[
        "bench",
        &uri(),
        "--workload",
        "sequential",
        "--size",
        "8M",
        "--json",
        path_str(&json),
    ]);
    let report = std::fs::read_to_string(&json).unwrap();
    for op in ["\"op\": \"write\"", "\"op\": \"read\""] {
        assert!(report.contains(op), "bench reports {op}: {report}");
    }
}

/// The request queue over AoE: many multi-frame requests in flight from one thread,
/// data round trip, the handle's refusals, and a target that dies failing what is in
/// flight within the initiator's timeout.
#[test]
fn request_queue_through_aoe() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir, 32 * MIB);
    let mut lab = AoeLab::start("rq", 1500, &[file.as_str()]);
    let uri: AoeUri = uri().parse().unwrap();
    let options = AoeOptions {
        timeout: Duration::from_secs(2),
        ..AoeOptions::default()
    };
    let client = lab.lab.run_in(lab.lab.initiator_ns(), || {
        AoeClient::open(&uri, options).expect("open the AoE target")
    });
    let device = Device::new(Arc::new(client));
    let mut queue = device
        .queue()
        .expect("the AoE initiator has a request queue");
    // 8 KiB requests (8 frames each at MTU 1500), 32 in flight.
    let block = 8192usize;
    let at = |n: u64| n * 3 * block as u64;
    let writes = (0..256u64)
        .map(|n| Submission {
            tag: n,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&pattern(n, 0, block)),
            offset: at(n),
        })
        .collect();
    for completion in run_queued(queue.as_mut(), writes, 32) {
        completion.result.expect("queued write");
    }
    let read_of = |n: u64| Submission {
        tag: n,
        op: QueuedOp::Read,
        buf: IoBuf::new(block),
        offset: at(n),
    };
    let read = run_queued(queue.as_mut(), (0..256u64).rev().map(read_of).collect(), 32);
    assert_eq!(read.len(), 256);
    for completion in read {
        completion.result.expect("queued read");
        let n = completion.tag;
        assert!(completion.buf[..] == pattern(n, 0, block)[..], "block {n}");
    }
    // Refused by the checks, without reaching the target.
    for (tag, offset) in [(1u64, 32 * MIB), (2, 100)] {
        queue.submit(Submission {
            tag,
            op: QueuedOp::Read,
            buf: IoBuf::new(block),
            offset,
        });
    }
    let mut refused = Vec::new();
    queue.complete(2, &mut refused);
    refused.sort_by_key(|c| c.tag);
    let kinds: Vec<ErrorKind> = refused
        .iter()
        .map(|c| c.result.as_ref().unwrap_err().kind())
        .collect();
    assert_eq!(kinds, [ErrorKind::OutOfRange, ErrorKind::Misaligned]);

    // The target dies: what is in flight comes back failed, within the timeout.
    lab.kill_target();
    let started = Instant::now();
    let failed = run_queued(queue.as_mut(), (0..64u64).map(read_of).collect(), 16);
    assert_eq!(failed.len(), 64);
    for completion in failed {
        let err = completion.result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}
