//! The cluster goes away under a gateway: with the OSD stopped, requests to an
//! `rbd:` export fail after the timeout instead of hanging the connection, the
//! server keeps running, and once the OSD is back the same export works again.

use std::process::Command;
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, IoBuf, QueuedOp, Submission, WriteFlags};
use blockwire_rbd::{RbdDevice, RbdSpec};
use blockwire_tests::ceph::Cluster;
use blockwire_tests::{
    path_str, require, require_ceph, run_bounded, run_queued, text, Served, MIB,
};

/// A queued read at offset 0, a queued FUA write and a queued plain write of 64 KiB
/// behind it; their results. With the OSD down all three must fail: the image has
/// no write-back cache to answer the plain write early.
fn queued_pair(device: &Device) -> Vec<Result<(), String>> {
    let mut queue = device.queue().expect("an RBD image has a queue");
    let subs = vec![
        Submission {
            tag: 0,
            op: QueuedOp::Read,
            buf: IoBuf::new(64 * 1024),
            offset: 0,
        },
        Submission {
            tag: 1,
            op: QueuedOp::Write(WriteFlags::FUA),
            buf: IoBuf::from_slice(&[9u8; 64 * 1024]),
            offset: 64 * 1024,
        },
        Submission {
            tag: 2,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&[7u8; 64 * 1024]),
            offset: 128 * 1024,
        },
    ];
    let mut done = run_queued(&mut *queue, subs, 3);
    done.sort_by_key(|c| c.tag);
    done.into_iter()
        .map(|c| c.result.map_err(|e| e.to_string()))
        .collect()
}

fn qemu_io(uri: &str, commands: &[&str]) -> (bool, String, Duration) {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw", uri]);
    for c in commands {
        command.args(["-c", c]);
    }
    let started = Instant::now();
    let output = run_bounded(command, Duration::from_secs(180));
    let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
    // qemu-io reports a failed command on stdout and may still exit 0.
    let ok = output.status.success() && !said.contains("failed");
    (ok, said, started.elapsed())
}

#[test]
fn requests_fail_after_the_timeout_while_the_osd_is_down_and_work_again_after() {
    require_ceph!();
    require!("qemu-io");
    let mut cluster = Cluster::start();
    cluster.create_image("outage", 16 * MIB);
    let spec = format!("{}:timeout=5", cluster.spec("outage"));
    let mut served = Served::start(&[&spec], "outage");
    let uri = served.uri();
    let (ok, said, _) = qemu_io(&uri, &["write -P 1 0 1M", "flush", "read -P 1 0 1M"]);
    assert!(ok, "before the outage: {said}");
    // A client in this process driving the device's request queue, on an image of
    // its own (on the same image the two writers would pass the lock back and forth).
    cluster.create_image("queued", 16 * MIB);
    let mut direct = RbdSpec::new(&cluster.pool, "queued");
    direct.conf = Some(path_str(&cluster.conf()).to_string());
    direct.timeout = Some(Duration::from_secs(3));
    let device = Device::from_device(RbdDevice::open(&direct, false).unwrap());
    assert!(queued_pair(&device).iter().all(Result::is_ok));

    cluster.stop_osd();
    // A read of written data (librbd caches no reads) and a write must both
    // reach the OSD. (A read of a never-written object would succeed: the object
    // map says it is a hole.)
    let (ok, said, took) = qemu_io(&uri, &["read 512k 64k", "write -P 2 0 64k", "flush"]);
    assert!(!ok, "I/O succeeded with the OSD down: {said}");
    assert!(
        said.contains("read failed"),
        "the read did not fail: {said}"
    );
    eprintln!("with the OSD down, after {took:?}:\n{said}");
    assert!(
        took < Duration::from_secs(60),
        "failing took {took:?} with a 5 s timeout: {said}"
    );
    assert!(
        served.child.try_wait().expect("wait").is_none(),
        "the server exited during the outage"
    );
    let started = Instant::now();
    let results = queued_pair(&device);
    eprintln!(
        "queued, with the OSD down, after {:?}: {results:?}",
        started.elapsed()
    );
    assert!(
        results.iter().all(Result::is_err),
        "queued I/O succeeded: {results:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "queued requests hung"
    );

    cluster.resume_osd();
    // The placement groups peer again within seconds of the OSD's return.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (ok, said, _) = qemu_io(&uri, &["write -P 3 0 64k", "flush", "read -P 3 0 64k"]);
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "I/O still fails 120 s after the OSD returned: {said}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let (ok, said, _) = qemu_io(&uri, &["read -P 1 64k 960k"]);
    assert!(ok, "data written before the outage: {said}");
    let results = queued_pair(&device);
    assert!(
        results.iter().all(Result::is_ok),
        "queued I/O after: {results:?}"
    );
    drop(device);
    drop(served);
}
