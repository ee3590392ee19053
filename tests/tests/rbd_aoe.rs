//! An RBD image served over AoE: our AoE target serves an `rbd:` image and our AoE
//! initiator, in another network namespace, writes and reads it; Ceph's own `rbd`
//! tool checks what arrived. Needs root and the Ceph packages.
//!
//! The target must reach the cluster on host loopback and answer AoE frames on a
//! veth link at once. Network namespaces belong to threads and sockets, not to
//! processes: the image is opened here, in the host namespace, where librados makes
//! its connections and its messenger threads (which make any later ones); then the
//! AoE target starts on a thread that joined the lab's target namespace, so its raw
//! sockets and receiver threads are there. The initiator runs in the other one.

use std::sync::Arc;

use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_aoe::target::{AoeTarget, TargetConfig};
use blockwire_blockdev::{Device, IoBuf, QueuedOp, Submission, WriteFlags};
use blockwire_rbd::{RbdDevice, RbdSpec};
use blockwire_tests::ceph::Cluster;
use blockwire_tests::netns::VethLab;
use blockwire_tests::{path_str, require_ceph, require_root, run_queued, MIB};

const SHELF: u16 = 3;
const SLOT: u8 = 4;
const SIZE: u64 = 16 * MIB;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

#[test]
fn our_aoe_initiator_reads_and_writes_an_rbd_image_through_our_aoe_target() {
    require_root!();
    require_ceph!();
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start();
    // Data Ceph wrote, for the initiator to read: the image is imported from a file
    // whose second MiB is a pattern.
    let imported = pattern(MIB as usize, 5);
    let mut file = vec![0u8; SIZE as usize];
    file[MIB as usize..2 * MIB as usize].copy_from_slice(&imported);
    let source = dir.path().join("imported");
    std::fs::write(&source, &file).unwrap();
    let image = format!("{}/aoe", cluster.pool);
    cluster.rbd_ok(&["import", "--no-progress", path_str(&source), &image]);
    let mut spec = RbdSpec::new(&cluster.pool, "aoe");
    spec.conf = Some(path_str(&cluster.conf()).to_string());
    spec.timeout = Some(std::time::Duration::from_secs(30));

    let lab = VethLab::new(&format!("ra{}", std::process::id() % 100000), 1, 1500)
        .expect("build the veth lab");
    // Opened here, in the host namespace, where the cluster is.
    let device = Device::from_device(RbdDevice::open(&spec, false).unwrap());
    let target = lab.run_in(lab.target_ns(), || {
        AoeTarget::start(device, TargetConfig::new(SHELF, SLOT, vec!["eth0".into()]))
            .expect("start the AoE target on the rbd image")
    });
    let uri = AoeUri::new("eth0", SHELF, SLOT);
    let client = lab.run_in(lab.initiator_ns(), || {
        AoeClient::open(&uri, AoeOptions::default()).expect("open the AoE target")
    });
    let remote = Device::new(Arc::new(client));
    assert_eq!(remote.size(), SIZE);

    // What Ceph wrote reads back through AoE.
    let mut back = vec![0u8; MIB as usize];
    remote.read(&mut back, MIB).unwrap();
    assert!(back == imported, "the imported MiB reads back different");

    // Writes through AoE, a FUA one and queued ones, then a flush.
    let first = pattern(MIB as usize, 9);
    remote.write(&first, 0, WriteFlags::FUA).unwrap();
    let mut queue = remote.queue().expect("the AoE initiator has a queue");
    let tail = pattern(4 * MIB as usize, 77);
    let subs = tail
        .chunks(256 * 1024)
        .enumerate()
        .map(|(i, chunk)| Submission {
            tag: i as u64,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(chunk),
            offset: 8 * MIB + (i as u64) * 256 * 1024,
        })
        .collect();
    let done = run_queued(&mut *queue, subs, 8);
    drop(queue);
    assert_eq!(done.len(), 16);
    for completion in &done {
        assert!(completion.result.is_ok(), "{:?}", completion.result);
    }
    remote.flush().unwrap();
    let mut back = vec![0u8; 4 * MIB as usize];
    remote.read(&mut back, 8 * MIB).unwrap();
    assert!(
        back == tail,
        "the queued writes read back different over AoE"
    );

    // Ceph's own tool sees what the initiator wrote.
    let exported = dir.path().join("exported");
    cluster.rbd_ok(&["export", "--no-progress", &image, path_str(&exported)]);
    let on_ceph = std::fs::read(&exported).unwrap();
    assert_eq!(on_ceph.len() as u64, SIZE);
    assert!(
        on_ceph[..MIB as usize] == first[..],
        "first MiB differs on Ceph"
    );
    assert!(
        on_ceph[MIB as usize..2 * MIB as usize] == imported[..],
        "imported MiB differs on Ceph"
    );
    assert!(
        on_ceph[8 * MIB as usize..12 * MIB as usize] == tail[..],
        "queued writes differ on Ceph"
    );
    drop(remote);
    drop(target);
}
