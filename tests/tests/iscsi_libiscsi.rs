//! Data written and read back through libiscsi itself (tests/tools/libiscsi_rw.py
//! drives the libiscsi7 library with ctypes), so this check needs neither qemu's
//! optional iSCSI module nor anything but the package the conformance suite comes in.

use std::path::{Path, PathBuf};
use std::process::Command;

use blockwire_tests::{path_str, require, sparse_file, text, Served, MIB};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/libiscsi_rw.py")
}

/// The pattern the script writes (its formula, byte for byte).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((seed + i * 7 + i / 512) & 0xff) as u8)
        .collect()
}

fn libiscsi_available() -> bool {
    Command::new("python3")
        .args(["-c", "import ctypes; ctypes.CDLL('libiscsi.so.7')"])
        .status()
        .is_ok_and(|s| s.success())
}

fn run(url: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new("python3")
        .arg(script())
        .arg(url)
        .args(args)
        .output()
        .expect("run python3");
    (
        output.status.success(),
        format!("{}{}", text(&output.stdout), text(&output.stderr)),
    )
}

#[test]
fn libiscsi_writes_land_in_the_file_and_read_back() {
    require!("python3");
    if !libiscsi_available() {
        eprintln!("skipped: libiscsi.so.7 is not installed (package libiscsi7)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "disk.img", 64 * MIB);
    let served = Served::start_iscsi(&[path_str(&image)], "disk");
    let (lba, blocks, seed) = (2048u64, 256usize, 41u64);
    let (ok, output) = run(
        served.iscsi_url(),
        &[&lba.to_string(), &blocks.to_string(), &seed.to_string()],
    );
    assert!(ok && output.trim() == "ok", "{output}");
    drop(served);
    let file = std::fs::read(&image).unwrap();
    let at = (lba * 512) as usize;
    assert_eq!(
        &file[at..at + blocks * 512],
        &pattern(seed, blocks * 512)[..]
    );
    // Nothing around the range was touched.
    assert!(file[at - 512..at].iter().all(|&b| b == 0));
    assert!(file[at + blocks * 512..at + blocks * 512 + 512]
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_read_only_export_answers_libiscsi_writes_with_data_protect() {
    require!("python3");
    if !libiscsi_available() {
        eprintln!("skipped: libiscsi.so.7 is not installed (package libiscsi7)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "disk.img", 16 * MIB);
    let served = Served::start_iscsi(&[path_str(&image), "--read-only"], "disk");
    let (ok, output) = run(served.iscsi_url(), &["0", "8", "1", "--read-only-check"]);
    assert!(ok && output.trim() == "refused", "{output}");
    drop(served);
    assert!(std::fs::read(&image).unwrap().iter().all(|&b| b == 0));
}
