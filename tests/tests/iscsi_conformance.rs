//! libiscsi's conformance suite (`iscsi-test-cu --dataloss --test=ALL`) against our
//! iSCSI target and, in the same test, against Debian's tgtd serving a file of the
//! same size: ours must fail nothing and pass at least as many tests as tgtd.
//! tgtd needs root; without it ours is still held to zero failures.

use blockwire_tests::iscsi::{run_conformance, tgtd_unavailable, Backing, ConformanceCounts, Tgtd};
use blockwire_tests::{path_str, require, sparse_file, Served, MIB};

/// Large enough for every test's ranges (some write near the end, some many
/// blocks at once); sparse, as the suite overwrites what it reads.
const IMAGE_SIZE: u64 = 256 * MIB;

fn report(who: &str, counts: &ConformanceCounts) {
    eprintln!("{who}: {}", counts.summary());
    for failure in &counts.failures {
        eprintln!("  {who} failed: {failure}");
    }
}

#[test]
fn the_whole_suite_passes_and_passes_at_least_what_tgtd_passes() {
    require!("iscsi-test-cu");
    let dir = tempfile::tempdir().unwrap();

    // tgtd first: its counts are printed even if ours cannot start.
    let reference = match tgtd_unavailable() {
        Some(reason) => {
            eprintln!("tgtd not compared: {reason}");
            None
        }
        None => {
            let image = sparse_file(dir.path(), "tgtd.img", IMAGE_SIZE);
            let mut tgtd = Tgtd::start();
            let url = tgtd.add_target("conformance", Backing::File(&image));
            let counts = run_conformance(&url);
            report("tgtd", &counts);
            Some(counts)
        }
    };

    let image = sparse_file(dir.path(), "ours.img", IMAGE_SIZE);
    let served = Served::start_iscsi(&[path_str(&image)], "ours");
    let ours = run_conformance(served.iscsi_url());
    report("blockwire", &ours);
    drop(served);

    ours.assert_clean("blockwire", 0);
    if let Some(tgtd) = reference {
        assert!(
            tgtd.passed > 0 && tgtd.failures.len() == tgtd.failed,
            "the tgtd run itself did not complete:\n{}",
            tgtd.output
        );
        assert!(
            ours.passed >= tgtd.passed,
            "blockwire passes {} tests, tgtd {} (blockwire: {}; tgtd: {})",
            ours.passed,
            tgtd.passed,
            ours.summary(),
            tgtd.summary()
        );
    }
}
