//! The initiator against vblade, a real AoE target, over a veth pair between two
//! network namespaces of our own: discovery, IDENTIFY, the device conformance suite,
//! sequential 1 MiB throughput at MTU 1500 and 9000, and a target that goes silent.
//!
//! Needs root (namespaces, raw sockets) and vblade (`/usr/sbin/vblade`, Debian
//! package vblade); skipped with a message otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_aoe::initiator::{discover_by_name, AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{Device, ErrorKind, WriteFlags};

const SIZE: u64 = 64 << 20;
const SHELF: u16 = 1;
const SLOT: u8 = 2;

fn vblade() -> Option<PathBuf> {
    ["/usr/sbin/vblade", "/usr/bin/vblade", "/sbin/vblade"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Why this test cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, raw sockets)".into());
    }
    if vblade().is_none() {
        return Some("vblade is not installed (Debian package vblade)".into());
    }
    let ip = Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !ip.is_ok_and(|s| s.success()) {
        return Some("iproute2 (ip) is not installed".into());
    }
    None
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Two namespaces of our own joined by one veth pair (`veth1` on the target side,
/// `veth0` on ours), vblade serving an image in the target namespace. Everything is
/// removed on drop, also when the test panics; vblade is killed by its PID.
struct Lab {
    initiator: String,
    target: String,
    image: PathBuf,
    vblade: Option<Child>,
}

impl Lab {
    fn start(tag: &str, mtu: usize) -> Lab {
        let pid = std::process::id();
        let mut lab = Lab {
            initiator: format!("bwvi{tag}{pid}"),
            target: format!("bwvt{tag}{pid}"),
            image: std::env::temp_dir().join(format!("bw-vblade-{tag}-{pid}.img")),
            vblade: None,
        };
        for ns in [&lab.initiator, &lab.target] {
            ip(&["netns", "add", ns]).unwrap();
            ip(&["-n", ns, "link", "set", "lo", "up"]).unwrap();
        }
        // Made inside the namespaces, so the names never meet the host's interfaces.
        ip(&[
            "-n",
            &lab.target,
            "link",
            "add",
            "veth1",
            "type",
            "veth",
            "peer",
            "name",
            "veth0",
            "netns",
            &lab.initiator,
        ])
        .unwrap();
        let mtu = mtu.to_string();
        ip(&["-n", &lab.target, "link", "set", "veth1", "mtu", &mtu, "up"]).unwrap();
        ip(&[
            "-n",
            &lab.initiator,
            "link",
            "set",
            "veth0",
            "mtu",
            &mtu,
            "up",
        ])
        .unwrap();
        std::fs::File::create(&lab.image)
            .unwrap()
            .set_len(SIZE)
            .unwrap();
        lab.start_vblade();
        lab
    }

    fn start_vblade(&mut self) {
        // `ip netns exec` execs the program, so the child's PID is vblade's.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.target])
            .arg(vblade().unwrap())
            .args([&SHELF.to_string(), &SLOT.to_string(), "veth1"])
            .arg(&self.image)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start vblade");
        self.vblade = Some(child);
    }

    fn kill_vblade(&mut self) {
        if let Some(mut child) = self.vblade.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `f` on a thread inside the initiator namespace.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let ns = Path::new("/run/netns").join(&self.initiator);
        thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = std::fs::File::open(&ns).unwrap();
                    use std::os::fd::AsRawFd;
                    // SAFETY: setns(2) on a descriptor held open for the call; it only
                    // moves this thread into the namespace.
                    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.kill_vblade();
        for ns in [&self.initiator, &self.target] {
            if Path::new("/run/netns").join(ns).exists() {
                if let Err(e) = ip(&["netns", "del", ns]) {
                    eprintln!("{e}");
                }
            }
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

fn uri() -> AoeUri {
    AoeUri::new("veth0", SHELF, SLOT)
}

/// Opens the target, retrying while vblade starts up.
fn open(options: AoeOptions) -> AoeClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match AoeClient::open(&uri(), options) {
            Ok(client) => return client,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for vblade: {e}");
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("open {}: {e}", uri()),
        }
    }
}

/// MB/s of sequential 1 MiB requests over the whole device.
fn sequential(device: &Device, write: bool) -> f64 {
    let chunk = 1 << 20;
    let mut buf = pattern(5, 0, chunk);
    let start = Instant::now();
    for offset in (0..SIZE).step_by(chunk) {
        if write {
            device.write(&buf, offset, WriteFlags::NONE).unwrap();
        } else {
            device.read(&mut buf, offset).unwrap();
        }
    }
    if write {
        device.flush().unwrap();
    }
    SIZE as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn against_vblade(tag: &str, mtu: usize, per_frame: u8) {
    if let Some(reason) = unavailable() {
        eprintln!("skipped: {reason}");
        return;
    }
    let mut lab = Lab::start(tag, mtu);
    lab.run(|| {
        let client = open(AoeOptions::default());
        let found = discover_by_name(&["veth0"], 0xffff, 0xff, Duration::from_millis(300))
            .expect("discover");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].shelf, found[0].slot), (SHELF, SLOT));
        assert_eq!(found[0].target_mac, client.paths()[0].target_mac);

        let identity = client.identity().clone();
        assert_eq!(identity.sectors, SIZE / 512);
        assert!(identity.lba48);
        assert!(identity.model.contains("vblade"), "{identity:?}");
        // vblade has FLUSH CACHE but not FLUSH CACHE EXT.
        assert!(!client.flush_ext());
        assert_eq!(client.sectors_per_frame(), per_frame);
        assert_eq!(client.paths().len(), 1);
        assert_eq!(client.paths()[0].interface.name, "veth0");
        eprintln!(
            "MTU {mtu}: {} sectors ({}), buffer count {}, window {}, {} sectors per frame, firmware {:#x}",
            identity.sectors,
            identity.model,
            client.buffer_count(),
            client.window(),
            client.sectors_per_frame(),
            client.firmware_version()
        );

        let client = Arc::new(client);
        let device = Device::new(client.clone());
        assert_eq!(device.size(), SIZE);
        conformance::run_all(&device);
        eprintln!("MTU {mtu}: after conformance: {:?}", client.stats());

        let write = sequential(&device, true);
        let read = sequential(&device, false);
        let (srtt, rto) = client.timing();
        eprintln!(
            "MTU {mtu}: sequential 1 MiB requests: write {write:.0} MB/s, read {read:.0} MB/s \
             ({:?}; srtt {srtt:?}, rto {rto:?})",
            client.stats()
        );
    });

    // A target that stops answering fails requests after the timeout.
    let options = AoeOptions {
        timeout: Duration::from_secs(1),
        ..AoeOptions::default()
    };
    let client = lab.run(|| open(options));
    let device = Device::new(Arc::new(client));
    let mut block = vec![0u8; 4096];
    device.read(&mut block, 0).unwrap();
    lab.kill_vblade();
    let start = Instant::now();
    let error = device.read(&mut block, 8192).unwrap_err();
    let waited = start.elapsed();
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    let text = error.to_string();
    assert!(text.contains("e1.2") && text.contains("veth0"), "{text}");
    eprintln!("silent target: {text}");
    drop(device);
}

#[test]
fn vblade_at_mtu_1500() {
    against_vblade("a", 1500, 2);
}

#[test]
fn vblade_at_mtu_9000() {
    against_vblade("b", 9000, 17);
}
