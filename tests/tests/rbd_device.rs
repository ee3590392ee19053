//! The RBD backend on a throwaway one-node cluster: the device conformance suite
//! on an image, many requests in flight through its queue, a snapshot served
//! read-only, and opening errors that name what is wrong in one line.

use blockwire_blockdev::conformance::{self, pattern, Expect};
use blockwire_blockdev::{Device, ErrorKind, IoBuf, QueuedOp, Submission, WriteFlags};
use blockwire_rbd::{RbdDevice, RbdSpec};
use blockwire_tests::ceph::Cluster;
use blockwire_tests::{path_str, require_ceph, run_queued, MIB};

fn spec(cluster: &Cluster, image: &str) -> RbdSpec {
    let mut spec = RbdSpec::new(&cluster.pool, image);
    spec.conf = Some(path_str(&cluster.conf()).to_string());
    spec
}

fn open(spec: &RbdSpec, read_only: bool) -> Device {
    let device = RbdDevice::open(spec, read_only).unwrap_or_else(|e| panic!("{e}"));
    Device::from_device(device)
}

#[test]
fn an_rbd_image_is_a_conforming_device() {
    require_ceph!();
    let cluster = Cluster::start();
    cluster.create_image("conformance", 64 * MIB);
    {
        let device = open(&spec(&cluster, "conformance"), false);
        assert_eq!(device.size(), 64 * MIB);
        assert_eq!(device.info().block_sizes.preferred, 4 << 20, "object size");
        // Extents are whole objects: a zeroed range inside an object is data.
        conformance::run_all_expecting(
            &device,
            Expect {
                zeroed_reported_as_zero: false,
            },
        );
        queued_requests_in_flight(&device);
        // A whole object zeroed is a hole again (librbd removes the object).
        device
            .write_zeroes(8 * MIB, 4 * MIB, Default::default())
            .unwrap();
        let extents = device.extents(8 * MIB, 4 * MIB).unwrap();
        assert!(
            extents.iter().all(|e| e.state.reads_zero()),
            "a zeroed object is reported as data: {extents:?}"
        );
        device.flush().unwrap();
    }
    exclusive_lock_keeps_a_second_writer_out(&cluster);
    snapshot_is_read_only(&cluster);
    open_errors_name_what_is_wrong(&cluster);
}

/// 64 writes (a quarter with FUA) in flight at once, then 64 reads, each checked.
fn queued_requests_in_flight(device: &Device) {
    let mut queue = device.queue().expect("an RBD image has a request queue");
    let len = 64 * 1024;
    let writes = (0..64u64)
        .map(|i| Submission {
            tag: i,
            op: QueuedOp::Write(WriteFlags { fua: i % 4 == 0 }),
            buf: IoBuf::from_slice(&pattern(i, i * len as u64, len)),
            offset: 16 * MIB + i * len as u64,
        })
        .collect();
    for done in run_queued(&mut *queue, writes, 64) {
        done.result
            .unwrap_or_else(|e| panic!("queued write {}: {e}", done.tag));
    }
    let reads = (0..64u64)
        .map(|i| Submission {
            tag: i,
            op: QueuedOp::Read,
            buf: IoBuf::new(len),
            offset: 16 * MIB + i * len as u64,
        })
        .collect();
    let done = run_queued(&mut *queue, reads, 64);
    assert_eq!(done.len(), 64);
    for done in done {
        done.result
            .as_ref()
            .unwrap_or_else(|e| panic!("queued read {}: {e}", done.tag));
        let i = done.tag;
        assert!(
            done.buf[..] == pattern(i, i * len as u64, len)[..],
            "queued read {i} differs"
        );
    }
}

/// With `exclusive`, the lock stays with the first gateway: a second exclusive
/// open fails in one line, and a second plain writer's writes fail.
fn exclusive_lock_keeps_a_second_writer_out(cluster: &Cluster) {
    let mut exclusive = spec(cluster, "conformance");
    exclusive.exclusive = true;
    let first = open(&exclusive, false);
    first.write(&[3; 4096], 0, WriteFlags::FUA).unwrap();
    let error = RbdDevice::open(&exclusive, false)
        .err()
        .expect("a second exclusive open succeeded");
    let text = error.to_string();
    assert!(text.contains("exclusive lock"), "{text}");
    assert!(!text.contains('\n'), "{text}");
    let mut plain = spec(cluster, "conformance");
    plain.timeout = Some(std::time::Duration::from_secs(5));
    let second = open(&plain, false);
    let refused = second.write(&[4; 4096], 0, WriteFlags::FUA);
    eprintln!("a second writer while the lock is kept: {refused:?}");
    assert!(
        refused.is_err(),
        "a second writer wrote past the exclusive lock"
    );
    let mut back = [0u8; 4096];
    first.read(&mut back, 0).unwrap();
    assert!(
        back.iter().all(|&b| b == 3),
        "the first writer's data changed"
    );
}

fn snapshot_is_read_only(cluster: &Cluster) {
    cluster.create_image("snapped", 8 * MIB);
    {
        let device = open(&spec(cluster, "snapped"), false);
        device
            .write(&[0x5a; 4096], 0, WriteFlags::FUA)
            .expect("write before the snapshot");
    }
    cluster.rbd_ok(&["snap", "create", "rbd/snapped@before"]);
    let mut at_snap = spec(cluster, "snapped");
    at_snap.snapshot = Some("before".into());
    let device = open(&at_snap, false);
    assert!(device.info().read_only, "a snapshot is served read-only");
    let mut back = [0u8; 4096];
    device.read(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a), "snapshot data");
    let refused = device.write(&[1; 4096], 0, WriteFlags::NONE).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ReadOnly);
}

fn open_errors_name_what_is_wrong(cluster: &Cluster) {
    let error = RbdDevice::open(&spec(cluster, "missing"), false)
        .err()
        .expect("a missing image opens");
    let text = error.to_string();
    assert!(
        text.contains("rbd:rbd/missing") && text.contains("does not exist"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");

    let wrong = cluster.dir().join("wrong.keyring");
    blockwire_tests::run(
        "ceph-authtool",
        &[
            "--create-keyring",
            path_str(&wrong),
            "--gen-key",
            "-n",
            "client.admin",
        ],
    );
    let mut with_wrong_key = spec(cluster, "conformance");
    with_wrong_key.keyring = Some(path_str(&wrong).to_string());
    let error = RbdDevice::open(&with_wrong_key, false)
        .err()
        .expect("a wrong key was accepted");
    let text = error.to_string();
    assert!(
        text.contains("refused the key") || text.contains("key"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");

    let mut no_pool = spec(cluster, "conformance");
    no_pool.pool = "nopool".into();
    let error = RbdDevice::open(&no_pool, false).err().expect("no pool");
    assert!(
        error.to_string().contains("pool 'nopool' does not exist"),
        "{error}"
    );
}
