//! libiscsi's conformance suite (`iscsi-test-cu --dataloss --test=ALL`) against an
//! `rbd:` export: READs and WRITEs go through the image's request queue there, so
//! the suite checks that path as it checks the file path (COMPARE AND WRITE,
//! ORWRITE and cut writes against queued writes, errors, residuals, task
//! management). Nothing may fail.

use blockwire_tests::ceph::Cluster;
use blockwire_tests::iscsi::run_conformance;
use blockwire_tests::{require, require_ceph, Served, MIB};

/// As for the file-backed run: room for every test's ranges.
const IMAGE_SIZE: u64 = 256 * MIB;

#[test]
fn the_whole_suite_passes_on_an_rbd_image() {
    require_ceph!();
    require!("iscsi-test-cu");
    let cluster = Cluster::start();
    let image = cluster.create_image("conformance", IMAGE_SIZE);
    let spec = cluster.spec(&image);
    let served = Served::start_iscsi(&[&spec, "--listen", "127.0.0.1:0"], "rbd");
    let counts = run_conformance(served.iscsi_url());
    drop(served);
    eprintln!("blockwire on rbd: {}", counts.summary());
    // 194 of the 230 pass here; the rest skip what an image without zeroing
    // trims does not offer. Far fewer means the suite did not really run.
    counts.assert_clean("blockwire on rbd", 150);
}
