//! `blockwire copy` between files and our NBD export: bytes equal, holes kept holes.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use blockwire_tests::{blockwire_bin, patterned_file, Served};

fn copy(args: &[&str]) -> String {
    let output = Command::new(blockwire_bin())
        .arg("copy")
        .args(args)
        .arg("--quiet")
        .output()
        .expect("run blockwire copy");
    assert!(
        output.status.success(),
        "blockwire copy {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn copies_through_an_export_and_back_keeping_holes() {
    let dir = tempfile::tempdir().unwrap();
    // 8 MiB of data followed by 56 MiB of hole.
    let source = patterned_file(dir.path(), "source.img", 8 << 20, 9);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let exported = dir.path().join("exported.img");
    std::fs::File::create(&exported)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let served = Served::start(&[exported.to_str().unwrap(), "--name", "disk"], "disk");

    let report = copy(&[source.to_str().unwrap(), &served.uri(), "--verify"]);
    assert!(report.contains("verified"), "{report}");
    let back = dir.path().join("back.img");
    copy(&[&served.uri(), back.to_str().unwrap(), "--verify"]);

    let original = std::fs::read(&source).unwrap();
    assert!(
        std::fs::read(&back).unwrap() == original,
        "copied image differs"
    );
    // The hole stayed a hole: far less than 64 MiB allocated.
    let allocated = std::fs::metadata(&back).unwrap().blocks() * 512;
    assert!(allocated < 16 << 20, "{allocated} bytes allocated");
    assert_eq!(served.terminate(), Some(0));
    assert!(
        std::fs::read(&exported).unwrap() == original,
        "export's file differs"
    );
}

#[test]
fn refuses_a_destination_smaller_than_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let source = patterned_file(dir.path(), "source.img", 4 << 20, 1);
    let small = dir.path().join("small.img");
    std::fs::File::create(&small)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let output = Command::new(blockwire_bin())
        .args([
            "copy",
            source.to_str().unwrap(),
            small.to_str().unwrap(),
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("destination holds"), "{stderr}");
    assert_eq!(std::fs::metadata(&small).unwrap().len(), 1 << 20);
}
