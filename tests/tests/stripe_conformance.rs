//! The device conformance suite on stripes of remote members reached through our
//! initiators and striped in this process: two `blockwire serve` NBD exports, two
//! iSCSI logical units, and one of each. (The lab's tests stripe AoE targets too,
//! over shaped links between namespaces: tests/tests/lab_cli.rs.)

use std::sync::Arc;

use blockwire_blockdev::{conformance, Device, Stripe};
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
use blockwire_tests::{path_str, sparse_file, Served, MIB};

fn member(served: &Served) -> Device {
    let uri: NbdUri = served.uri().parse().expect("URI");
    let client = NbdClient::connect(&uri, ClientOptions::default()).expect("connect");
    Device::new(Arc::new(client))
}

fn iscsi_member(served: &Served) -> Device {
    let uri: IscsiUri = served.iscsi_url().parse().expect("URL");
    let client = IscsiClient::connect(&uri, IscsiOptions::default()).expect("login");
    Device::new(Arc::new(client))
}

/// The suite on stripes of `members()` at small, middling and large chunks.
fn conformance_over(members: impl Fn() -> (Vec<Device>, Vec<String>), size: u64) {
    for chunk in [4 << 10, 64 << 10, 1 << 20] {
        let (devices, names) = members();
        let stripe = Stripe::with_names(devices, names, chunk).expect("stripe");
        let device = Device::new(Arc::new(stripe));
        assert_eq!(device.size(), size);
        conformance::run_all(&device);
    }
}

#[test]
fn a_stripe_of_two_iscsi_units_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 8 * MIB);
    let b = sparse_file(dir.path(), "b.img", 8 * MIB);
    let served_a = Served::start_iscsi(&[path_str(&a), "--name", "a"], "a");
    let served_b = Served::start_iscsi(&[path_str(&b), "--name", "b"], "b");
    conformance_over(
        || {
            (
                vec![iscsi_member(&served_a), iscsi_member(&served_b)],
                vec![served_a.iscsi_url().into(), served_b.iscsi_url().into()],
            )
        },
        16 * MIB,
    );
}

#[test]
fn a_stripe_of_an_nbd_export_and_an_iscsi_unit_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 8 * MIB);
    let b = sparse_file(dir.path(), "b.img", 8 * MIB);
    let served_a = Served::start(&[path_str(&a), "--name", "a"], "a");
    let served_b = Served::start_iscsi(&[path_str(&b), "--name", "b"], "b");
    conformance_over(
        || {
            (
                vec![member(&served_a), iscsi_member(&served_b)],
                vec![served_a.uri(), served_b.iscsi_url().into()],
            )
        },
        16 * MIB,
    );
}

#[test]
fn a_stripe_of_two_nbd_exports_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 8 * MIB);
    let b = sparse_file(dir.path(), "b.img", 8 * MIB);
    let served_a = Served::start(&[path_str(&a), "--name", "a"], "a");
    let served_b = Served::start(&[path_str(&b), "--name", "b"], "b");
    conformance_over(
        || {
            (
                vec![member(&served_a), member(&served_b)],
                vec![served_a.uri(), served_b.uri()],
            )
        },
        16 * MIB,
    );
}
