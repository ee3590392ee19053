//! The device conformance suite on a stripe of remote members: two `blockwire
//! serve` NBD exports, reached through our initiator, striped in this process.

use std::sync::Arc;

use blockwire_blockdev::{conformance, Device, Stripe};
use blockwire_nbd::client::{ClientOptions, NbdClient, NbdUri};
use blockwire_tests::{path_str, sparse_file, Served, MIB};

fn member(served: &Served) -> Device {
    let uri: NbdUri = served.uri().parse().expect("URI");
    let client = NbdClient::connect(&uri, ClientOptions::default()).expect("connect");
    Device::new(Arc::new(client))
}

#[test]
fn a_stripe_of_two_nbd_exports_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 8 * MIB);
    let b = sparse_file(dir.path(), "b.img", 8 * MIB);
    let served_a = Served::start(&[path_str(&a), "--name", "a"], "a");
    let served_b = Served::start(&[path_str(&b), "--name", "b"], "b");
    for chunk in [4 << 10, 64 << 10, 1 << 20] {
        let members = vec![member(&served_a), member(&served_b)];
        let names = vec![served_a.uri(), served_b.uri()];
        let stripe = Stripe::with_names(members, names, chunk).expect("stripe");
        let device = Device::new(Arc::new(stripe));
        assert_eq!(device.size(), 16 * MIB);
        conformance::run_all(&device);
    }
}
