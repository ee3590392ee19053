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
//! packages are unavailable, or while `blockwire serve` has no `--nvme`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blockwire_tests::vm::{self, Vm};
use blockwire_tests::{blockwire_bin, free_port, path_str, sparse_file, text, MIB};

/// The export's name, and so its subsystem's NQN (`nqn.2026-11.dev.blockwire:NAME`).
const NAME: &str = "kernel";

/// `blockwire serve DISK --name kernel --nvme 127.0.0.1:PORT [--nvme-discovery
/// 127.0.0.1:DPORT]`, stopped by its PID when dropped.
struct NvmeServe {
    child: Child,
    /// The subsystem NQN of its `nvme+tcp://HOST:PORT/NQN` announcement.
    nqn: Option<String>,
}

impl NvmeServe {
    /// Starts the server and waits until it says "press Ctrl-C to stop".
    fn start(disk: &Path, port: u16, discovery: Option<u16>) -> NvmeServe {
        let mut command = Command::new(blockwire_bin());
        command
            .args(["serve", path_str(disk), "--name", NAME, "--nvme"])
            .arg(format!("127.0.0.1:{port}"));
        if let Some(dport) = discovery {
            command
                .arg("--nvme-discovery")
                .arg(format!("127.0.0.1:{dport}"));
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start blockwire serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, announced) = mpsc::channel();
        std::thread::spawn(move || {
            let mut nqn = None;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if nqn.is_none() {
                    nqn = announced_nqn(&line);
                }
                if line.contains("press Ctrl-C to stop") {
                    let _ = send.send(nqn.take());
                }
            }
        });
        match announced.recv_timeout(Duration::from_secs(20)) {
            Ok(nqn) => NvmeServe { child, nqn },
            Err(e) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("{command:?} did not come up ({e}); exit status {status:?}");
            }
        }
    }

    /// SIGTERM; the server must exit 0 within 20 s.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "blockwire serve did not exit within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "blockwire serve exited {status}");
    }
}

impl Drop for NvmeServe {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The NQN of an announcement line `nvme+tcp://HOST:PORT/NQN[/NSID]`.
fn announced_nqn(line: &str) -> Option<String> {
    let url = &line[line.find("nvme+tcp://")? + "nvme+tcp://".len()..];
    let path = &url[url.find('/')? + 1..];
    let nqn = path.split(['/', ' ']).next()?;
    nqn.starts_with("nqn.").then(|| nqn.to_string())
}

/// `blockwire serve --help`, to learn whether the target is there yet.
fn serve_help() -> String {
    let output = Command::new(blockwire_bin())
        .args(["serve", "--help"])
        .output()
        .expect("run blockwire serve --help");
    text(&output.stdout) + &text(&output.stderr)
}

#[test]
fn kernel_nvme_tcp_host_judges_the_target() {
    let help = serve_help();
    if !help.contains("--nvme") {
        eprintln!("skipped: `blockwire serve --help` lists no --nvme (the NVMe/TCP target is not built yet)");
        return;
    }
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
    // Fixed ports: the restarted target must come back where the host reconnects.
    let port = free_port();
    // Without a discovery flag the I/O port answers discovery too, as nvmet's do.
    let discovery = help.contains("--nvme-discovery").then(free_port);
    let served = NvmeServe::start(&disk, port, discovery);
    let nqn = served
        .nqn
        .clone()
        .unwrap_or_else(|| format!("nqn.2026-11.dev.blockwire:{NAME}"));

    let script = vm::judge_script(
        "nvme",
        &[
            ("NQN", nqn),
            ("ADDR", "10.0.2.2".into()),
            ("PORT", port.to_string()),
            ("DPORT", discovery.unwrap_or(port).to_string()),
            ("SIZE_BYTES", size.to_string()),
            ("MODEL", "blockwire".into()),
            ("DATA_OFFSET_MIB", "64".into()),
            ("DATA_MIB", "64".into()),
        ],
    );
    let mut vm = Vm::boot(&images, &script);
    vm.wait_for_marker("restart-target");
    served.stop();
    // Down long enough for the host to notice and retry a few times.
    std::thread::sleep(Duration::from_secs(3));
    let served = NvmeServe::start(&disk, port, discovery);
    let outcome = vm.finish();
    outcome.assert_pass();
    let data = outcome
        .data_written()
        .unwrap_or_else(|| panic!("the guest reported no DATA line:\n{}", outcome.console));
    assert_eq!((data.offset, data.len), (64 * MIB, 64 * MIB));

    served.stop();
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
