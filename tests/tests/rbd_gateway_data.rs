//! Data through the gateway, checked by Ceph's own tool: what our iSCSI initiator
//! writes to an `rbd:` export is what `rbd export` reads, and what `rbd import`
//! wrote reads back equal over iSCSI (both through the target's request queue);
//! qemu-img writes and compares an image through NBD on the same export.

use blockwire_tests::ceph::Cluster;
use blockwire_tests::{
    blockwire_bin, path_str, patterned_file, require, require_ceph, run_bounded_ok, Served, MIB,
};

const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

fn ok(program: &str, args: &[&str]) -> String {
    run_bounded_ok(program, args, LIMIT)
}

fn same(a: &std::path::Path, b: &std::path::Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn iscsi_and_qemu_img_data_through_the_gateway_is_what_ceph_holds() {
    require_ceph!();
    require!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start();
    let blockwire = blockwire_bin();
    let blockwire = path_str(&blockwire);

    // Imported by Ceph, read over iSCSI by our initiator.
    let imported = patterned_file(dir.path(), "imported.bin", 16 * MIB as usize, 21);
    cluster.rbd_ok(&["import", path_str(&imported), "rbd/gw"]);
    let spec = cluster.spec("gw");
    {
        let served = Served::start_iscsi(&[&spec, "--listen", "127.0.0.1:0"], "gw");
        let read = dir.path().join("read-over-iscsi.bin");
        ok(blockwire, &["copy", served.iscsi_url(), path_str(&read)]);
        assert!(
            same(&read, &imported),
            "what rbd import wrote reads back different over iSCSI"
        );

        // Written by our initiator over iSCSI, read by `rbd export`.
        let written = patterned_file(dir.path(), "written.bin", 16 * MIB as usize, 42);
        ok(blockwire, &["copy", path_str(&written), served.iscsi_url()]);
        let exported = dir.path().join("exported.bin");
        cluster.rbd_ok(&["export", "rbd/gw", path_str(&exported)]);
        assert!(
            same(&exported, &written),
            "rbd export differs from what was written over iSCSI"
        );

        // qemu-img through NBD: write a raw image into the export, then compare.
        let source = patterned_file(dir.path(), "qemu.bin", 16 * MIB as usize, 63);
        let uri = served.uri();
        ok(
            "qemu-img",
            &[
                "convert",
                "-n",
                "-f",
                "raw",
                "-O",
                "raw",
                path_str(&source),
                &uri,
            ],
        );
        ok(
            "qemu-img",
            &["compare", "-f", "raw", "-F", "raw", path_str(&source), &uri],
        );
        let exported = dir.path().join("exported-after-qemu.bin");
        cluster.rbd_ok(&["export", "rbd/gw", path_str(&exported)]);
        assert!(
            same(&exported, &source),
            "rbd export differs from what qemu-img wrote over NBD"
        );
    }
}
