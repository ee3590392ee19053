//! `blockwire copy aoe://... FILE` keeps a new file sparse, as copies from NBD and
//! iSCSI do: AoE has no block status, so the copy finds the zero blocks in what it
//! read and does not write them. Against our target and vblade, across a veth pair
//! between two network namespaces. Needs root; the vblade test also vblade.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use blockwire_tests::aoe::{AoeLab, Vblade};
use blockwire_tests::netns::VethLab;
use blockwire_tests::{blockwire_bin, path_str, require_root, require_vblade, text, MIB};

const SIZE: u64 = 64 * MIB;

/// A sparse file of `SIZE` with a few patterned pieces: 1 MiB at the start, 4 KiB
/// in the middle of a request, and 8 KiB across the boundary of two requests.
fn mostly_zero_image(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::FileExt;
    let path = dir.join("source.img");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(SIZE).unwrap();
    let piece = |len: usize, seed: u8| -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
            .collect()
    };
    file.write_all_at(&piece(1 << 20, 1), 0).unwrap();
    file.write_all_at(&piece(4096, 2), 20 * MIB + 512 * 1024)
        .unwrap();
    file.write_all_at(&piece(8192, 3), 48 * MIB - 4096).unwrap();
    path
}

/// Runs `blockwire copy SOURCE DESTINATION --quiet` in the initiator namespace;
/// returns its report.
fn copy_in(lab: &VethLab, source: &str, destination: &Path) -> String {
    let output = lab
        .command_in(lab.initiator_ns(), blockwire_bin())
        .args(["copy", source, path_str(destination), "--quiet"])
        .output()
        .expect("run blockwire copy");
    assert!(
        output.status.success(),
        "blockwire copy {source}: {}",
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// The copy equals the source and is sparse: far fewer bytes allocated than its
/// size (the data is 1 MiB + 12 KiB).
fn assert_sparse_copy(source: &Path, copy: &Path, report: &str) {
    assert_eq!(std::fs::metadata(copy).unwrap().len(), SIZE, "{report}");
    assert!(
        std::fs::read(copy).unwrap() == std::fs::read(source).unwrap(),
        "the copy differs from the source; {report}"
    );
    let allocated = std::fs::metadata(copy).unwrap().blocks() * 512;
    eprintln!("{report}; {allocated} bytes allocated");
    assert!(
        allocated < 4 * MIB,
        "{allocated} bytes allocated for a copy of {SIZE} with 1 MiB of data; {report}"
    );
}

#[test]
fn a_copy_from_our_target_to_a_new_file_stays_sparse() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let source = mostly_zero_image(dir.path());
    let lab = AoeLab::start("sc", 1500, &[path_str(&source)]);
    let out = dir.path().join("out.img");
    let report = copy_in(&lab.lab, "aoe://eth0/e1.2", &out);
    assert_sparse_copy(&source, &out, &report);
}

#[test]
fn a_copy_from_vblade_to_a_new_file_stays_sparse() {
    require_root!();
    require_vblade!();
    let tag = format!("sv{}", std::process::id() % 100000);
    let lab = VethLab::new(&tag, 1, 1500).expect("build the veth lab");
    let dir = tempfile::tempdir().unwrap();
    let source = mostly_zero_image(dir.path());
    let _vblade = Vblade::start(&lab, lab.target_ns(), 1, 2, "eth0", &source);
    let out = dir.path().join("out.img");
    // vblade answers once it is up; the copy opens the target with one query, so
    // wait for it with `info` first.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let info = lab
            .command_in(lab.initiator_ns(), blockwire_bin())
            .args(["info", "aoe://eth0/e1.2"])
            .output()
            .unwrap();
        if info.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "vblade does not answer: {}",
            text(&info.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let report = copy_in(&lab, "aoe://eth0/e1.2", &out);
    assert_sparse_copy(&source, &out, &report);
}
