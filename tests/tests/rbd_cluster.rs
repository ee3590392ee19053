//! The throwaway Ceph cluster the RBD tests use comes up with cephx on, serves an
//! image, refuses a client without the key, and goes away.

use blockwire_tests::ceph::Cluster;
use blockwire_tests::{require_ceph, text};

#[test]
fn a_one_node_cluster_serves_an_image_and_requires_its_key() {
    require_ceph!();
    let cluster = Cluster::start();
    let image = cluster.create_image("probe", 64 << 20);
    let info = text(&cluster.rbd_ok(&["info", &format!("rbd/{image}")]).stdout);
    assert!(info.contains("size 64 MiB"), "rbd info: {info}");
    assert!(info.contains("exclusive-lock"), "default features: {info}");
    // cephx is on: a client whose keyring holds another key is turned away.
    let wrong = cluster.dir().join("wrong.keyring");
    blockwire_tests::run(
        "ceph-authtool",
        &[
            "--create-keyring",
            blockwire_tests::path_str(&wrong),
            "--gen-key",
            "-n",
            "client.admin",
        ],
    );
    let refused = cluster.rbd(&[
        "--keyring",
        blockwire_tests::path_str(&wrong),
        "info",
        &format!("rbd/{image}"),
    ]);
    assert!(!refused.status.success(), "a wrong key was accepted");
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    assert!(!dir.exists(), "the cluster's directory outlived it");
}
