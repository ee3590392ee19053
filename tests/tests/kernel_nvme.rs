//! The Linux kernel's NVMe/TCP host, in a VM (scripts/vm, docs/testing.md), against
//! our release binary's NVMe/TCP target (issue 33, "How it is judged"): in one boot
//! the guest runs `nvme discover`, `connect-all`, checks `id-ctrl` and `id-ns`
//! (subnqn, model, nn, nsze), makes and checks an ext4 filesystem over a connection
//! without digests, then over one with header and data digests (an admin queue and
//! one I/O queue per guest CPU, each its own TCP connection) writes 64 MiB and reads
//! it back, flushes, rides out a restart of the target (this test restarts
//! `blockwire serve` on the same ports when the guest asks) and disconnects. The
//! served file must then hold the bytes the guest wrote.
//!
//! The judge's guest script is checked against the kernel's own nvmet-tcp by
//! scripts/vm/nvmet-self-check.sh. Skipped, saying why, when qemu or the VM's Debian
//! packages are unavailable.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use blockwire_tests::vm::{self, Vm};
use blockwire_tests::{blockwire_bin, free_port, path_str, sparse_file, Served, MIB};

/// The export's name, and so its subsystem's NQN (`nqn.2026-11.dev.blockwire:NAME`).
const NAME: &str = "kernel";

/// `blockwire serve DISK --name kernel --nvme 127.0.0.1:PORT --nvme-discovery
/// 127.0.0.1:DPORT`, up: fixed ports, so that a restarted target comes back where
/// the host reconnects.
fn serve(disk: &Path, port: u16, discovery: u16) -> Served {
    let mut command = Command::new(blockwire_bin());
    command
        .args(["serve", path_str(disk), "--name", NAME])
        .arg("--nvme")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--nvme-discovery")
        .arg(format!("127.0.0.1:{discovery}"));
    Served::spawn_ready(command, NAME)
}

/// SIGTERM; the server must exit 0 (its final flush done).
fn stop(served: Served) {
    assert_eq!(
        served.terminate(),
        Some(0),
        "blockwire serve did not exit 0"
    );
}

/// The NQN of an announcement line `nvme+tcp://HOST:PORT/NQN[/NSID]`.
fn announced_nqn(line: &str) -> Option<String> {
    let url = &line[line.find("nvme+tcp://")? + "nvme+tcp://".len()..];
    let path = &url[url.find('/')? + 1..];
    let nqn = path.split(['/', ' ']).next()?;
    nqn.starts_with("nqn.").then(|| nqn.to_string())
}

#[test]
fn kernel_nvme_tcp_host_judges_the_target() {
    let images = match vm::images() {
        Ok(images) => images,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let size = 256 * MIB;
    let disk = sparse_file(dir.path(), "kernel.img", size);
    let (port, discovery) = (free_port(), free_port());
    let served = serve(&disk, port, discovery);
    let nqn = served
        .nvme
        .first()
        .and_then(|line| announced_nqn(line))
        .unwrap_or_else(|| panic!("no nvme+tcp:// announcement: {:?}", served.nvme));

    let script = vm::judge_script(
        "nvme",
        &[
            ("NQN", nqn),
            ("ADDR", "10.0.2.2".into()),
            ("PORT", port.to_string()),
            ("DPORT", discovery.to_string()),
            ("SIZE_BYTES", size.to_string()),
            ("MODEL", "blockwire".into()),
            ("DATA_OFFSET_MIB", "64".into()),
            ("DATA_MIB", "64".into()),
        ],
    );
    let mut vm = Vm::boot(&images, &script);
    vm.wait_for_marker("restart-target");
    stop(served);
    // Down long enough for the host to notice and retry a few times.
    std::thread::sleep(Duration::from_secs(3));
    let served = serve(&disk, port, discovery);
    let outcome = vm.finish();
    outcome.assert_pass();
    let data = outcome
        .data_written()
        .unwrap_or_else(|| panic!("the guest reported no DATA line:\n{}", outcome.console));
    assert_eq!((data.offset, data.len), (64 * MIB, 64 * MIB));

    stop(served);
    data.assert_in_file(&disk);
}

#[test]
fn announced_nqns() {
    assert_eq!(
        announced_nqn("  nvme+tcp://127.0.0.1:4420/nqn.2026-11.dev.blockwire:kernel"),
        Some("nqn.2026-11.dev.blockwire:kernel".into())
    );
    assert_eq!(
        announced_nqn("nvme+tcp://127.0.0.1:4420/nqn.2026-11.dev.blockwire:a/1 (namespace 1)"),
        Some("nqn.2026-11.dev.blockwire:a".into())
    );
    assert_eq!(announced_nqn("nbd://127.0.0.1:10809/kernel"), None);
    assert_eq!(announced_nqn("nvme+tcp://127.0.0.1:4420"), None);
}
