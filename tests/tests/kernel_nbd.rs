//! The Linux kernel's NBD client, in a VM (scripts/vm, docs/testing.md), against our
//! release binary's NBD target: nbd-client connects the guest's /dev/nbd0 to
//! `blockwire serve` on this host's loopback; the guest checks the size, makes and
//! checks an ext4 filesystem, writes 16 MiB of random bytes and reads them back
//! (direct I/O), and disconnects. The served file must then hold those bytes.
//!
//! Skipped, saying why, when qemu or the Debian packages of the VM are unavailable.

use blockwire_tests::vm::{self, Vm};
use blockwire_tests::{path_str, sparse_file, Served, MIB};

#[test]
fn kernel_nbd_client_reads_writes_and_makes_a_filesystem() {
    let images = match vm::images() {
        Ok(images) => images,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let disk = sparse_file(dir.path(), "kernel.img", size);
    let served = Served::start(&[path_str(&disk), "--name", "kernel"], "kernel");

    let script = vm::judge_script(
        "nbd",
        &[
            ("PORT", served.port.to_string()),
            ("EXPORT", served.name.clone()),
            ("SIZE_BYTES", size.to_string()),
            // Not at 0, so that bytes landing at the wrong offset show on the host.
            ("DATA_OFFSET_MIB", "8".into()),
            ("DATA_MIB", "16".into()),
        ],
    );
    let outcome = Vm::boot(&images, &script).finish();
    outcome.assert_pass();
    let data = outcome
        .data_written()
        .unwrap_or_else(|| panic!("the guest reported no DATA line:\n{}", outcome.console));
    assert_eq!((data.offset, data.len), (8 * MIB, 16 * MIB));

    assert_eq!(
        served.terminate(),
        Some(0),
        "blockwire serve did not exit 0 on SIGTERM"
    );
    data.assert_in_file(&disk);
}
