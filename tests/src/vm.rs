//! The kernel judges' VM (scripts/vm, docs/testing.md): Debian's cloud kernel under
//! qemu, booted with a guest script that drives the guest kernel's own initiator
//! (nvme-tcp, nbd, ...) against a server on this host's loopback (10.0.2.2 from the
//! guest) and ends in one verdict line.
//!
//! [`images`] builds or finds the kernel and initramfs (or says why it cannot, for a
//! skip), [`Vm::boot`] starts qemu with a guest script, [`Vm::wait_for_marker`] lets
//! a test act on the host at a point the guest announces, and [`Vm::finish`] waits
//! for the verdict and returns it with the whole console.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::{have, run_bounded, text};

/// How long a boot may take, guest script included, unless `BLOCKWIRE_VM_TIMEOUT`
/// (seconds) says otherwise: qemu's TCG emulation is slow on a busy machine.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The kernel and initramfs of the judges' VM, and the static busybox that packs
/// guest scripts.
#[derive(Debug, Clone)]
pub struct VmImages {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub busybox: PathBuf,
}

/// The folder of the VM scripts in this workspace.
fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vm")
}

/// Builds the VM images (or finds them in the cache) with scripts/vm/build-images.sh.
/// `Err` says why they cannot be had here (no qemu, no apt, no network): the caller
/// skips. A build that fails for another reason fails the test.
pub fn images() -> Result<VmImages, String> {
    if !have("qemu-system-x86_64") {
        return Err("qemu-system-x86_64 is not installed (scripts/test.sh installs it)".into());
    }
    let mut command = Command::new("bash");
    command.arg(scripts_dir().join("build-images.sh"));
    // The first build downloads about 40 MB of packages; later ones reuse the cache.
    let output = run_bounded(command, Duration::from_secs(900));
    let stderr = text(&output.stderr);
    match output.status.code() {
        Some(0) => {}
        Some(3) => return Err(format!("no VM images: {}", stderr.trim())),
        _ => panic!(
            "scripts/vm/build-images.sh failed ({}):\n{stderr}",
            output.status
        ),
    }
    let stdout = text(&output.stdout);
    let value = |key: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("build-images.sh printed no {key} line:\n{stdout}"))
    };
    Ok(VmImages {
        kernel: value("KERNEL="),
        initrd: value("INITRD="),
        busybox: value("BUSYBOX="),
    })
}

/// A guest script that sets shell variables and then sources the judge
/// `scripts/vm/judges/JUDGE.sh` (baked into the initramfs as /lib/judges/).
pub fn judge_script(judge: &str, vars: &[(&str, String)]) -> String {
    let mut script = String::new();
    for (name, value) in vars {
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "not a shell variable name: {name}"
        );
        assert!(!value.contains('\''), "a quote in {name}'s value: {value}");
        script.push_str(&format!("{name}='{value}'\n"));
    }
    script.push_str(&format!(". /lib/judges/{judge}.sh\n"));
    script
}

/// What the guest concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// `VERDICT FAIL: reason`.
    Fail(String),
    /// No verdict line: the VM timed out or qemu ended without one (the reason says).
    None(String),
}

/// The verdict in one console line, if it is the verdict line (kernel messages may
/// precede it on the same line).
pub fn parse_verdict(line: &str) -> Option<Verdict> {
    let rest = &line[line.find("VERDICT ")? + "VERDICT ".len()..];
    let rest = rest.trim();
    if rest == "PASS" {
        Some(Verdict::Pass)
    } else {
        let reason = rest.strip_prefix("FAIL").unwrap_or(rest);
        Some(Verdict::Fail(
            reason.trim_start_matches(':').trim().to_string(),
        ))
    }
}

/// A finished boot: the verdict and every console line.
#[derive(Debug)]
pub struct VmOutcome {
    pub verdict: Verdict,
    pub console: String,
}

/// The guest's report of the data it wrote: `DATA md5=HEX offset_mib=N mib=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataWritten {
    pub md5: String,
    pub offset: u64,
    pub len: u64,
}

impl DataWritten {
    /// Parses a `DATA ...` console line.
    pub fn parse(line: &str) -> Option<DataWritten> {
        let rest = &line[line.find("DATA ")? + "DATA ".len()..];
        let (mut md5, mut offset, mut len) = (None, None, None);
        for field in rest.split_whitespace() {
            match field.split_once('=')? {
                ("md5", v) if v.len() == 32 && v.chars().all(|c| c.is_ascii_hexdigit()) => {
                    md5 = Some(v.to_string())
                }
                ("offset_mib", v) => offset = v.parse::<u64>().ok().map(|m| m << 20),
                ("mib", v) => len = v.parse::<u64>().ok().map(|m| m << 20),
                _ => return None,
            }
        }
        Some(DataWritten {
            md5: md5?,
            offset: offset?,
            len: len?,
        })
    }

    /// Fails the test unless `file` holds, at the reported offset, the bytes whose
    /// MD5 the guest reported (md5sum of that range on this host).
    pub fn assert_in_file(&self, file: &Path) {
        let script = format!(
            "dd if='{}' bs=1M skip={} count={} 2>/dev/null | md5sum",
            file.display(),
            self.offset >> 20,
            self.len >> 20
        );
        let output = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .expect("run md5sum");
        let host = text(&output.stdout);
        let host = host.split_whitespace().next().unwrap_or_default();
        assert_eq!(
            host,
            self.md5,
            "{}: bytes {}..{} differ from what the guest wrote",
            file.display(),
            self.offset,
            self.offset + self.len
        );
    }
}

impl VmOutcome {
    /// Fails the test, with the console, unless the guest said PASS.
    pub fn assert_pass(&self) {
        assert_eq!(
            self.verdict,
            Verdict::Pass,
            "the guest's verdict; console:\n{}",
            self.console
        );
    }

    /// The guest's last `DATA ...` report.
    pub fn data_written(&self) -> Option<DataWritten> {
        self.console.lines().rev().find_map(DataWritten::parse)
    }
}

/// A running judge VM; qemu is killed (by its PID) if this is dropped unfinished.
pub struct Vm {
    qemu: Child,
    lines: Receiver<String>,
    console: Vec<String>,
    verdict: Option<Verdict>,
    deadline: Instant,
    _workdir: tempfile::TempDir,
}

impl Vm {
    /// Boots the VM with `script` as the guest's /test.sh (scripts/vm/boot.sh); the
    /// console is echoed to stderr as it comes and kept.
    pub fn boot(images: &VmImages, script: &str) -> Vm {
        Vm::boot_forwarding(images, script, &[])
    }

    /// [`boot`](Self::boot), with this host's `127.0.0.1:HOST_PORT` forwarded to the
    /// guest's `GUEST_PORT` for each pair of `forwards` (a target in the guest, such
    /// as judges/nvmet-peer.sh, for our initiator).
    pub fn boot_forwarding(images: &VmImages, script: &str, forwards: &[(u16, u16)]) -> Vm {
        let netdev: Vec<String> = forwards
            .iter()
            .map(|(host, guest)| format!("hostfwd=tcp:127.0.0.1:{host}-:{guest}"))
            .collect();
        let workdir = tempfile::tempdir().expect("VM work folder");
        let script_path = workdir.path().join("guest.sh");
        std::fs::write(&script_path, script).expect("write the guest script");
        // boot.sh packs the script and then execs qemu: the child's PID is qemu's.
        let mut qemu = Command::new("bash")
            .arg(scripts_dir().join("boot.sh"))
            .arg(&script_path)
            .arg(workdir.path())
            .env("KERNEL", &images.kernel)
            .env("INITRD", &images.initrd)
            .env("BUSYBOX", &images.busybox)
            .env("BLOCKWIRE_VM_NETDEV", netdev.join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start scripts/vm/boot.sh");
        let stdout = qemu.stdout.take().expect("piped stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // Lossy: firmware writes terminal escapes and the odd invalid byte.
            let mut reader = BufReader::new(stdout);
            let mut bytes = Vec::new();
            while reader.read_until(b'\n', &mut bytes).unwrap_or(0) > 0 {
                let line = String::from_utf8_lossy(&bytes)
                    .trim_end_matches(['\r', '\n'])
                    .to_string();
                eprintln!("vm| {line}");
                if send.send(line).is_err() {
                    return;
                }
                bytes.clear();
            }
        });
        let timeout = std::env::var("BLOCKWIRE_VM_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_TIMEOUT);
        Vm {
            qemu,
            lines,
            console: Vec::new(),
            verdict: None,
            deadline: Instant::now() + timeout,
            _workdir: workdir,
        }
    }

    /// The next console line, or why there is none (the VM ended or timed out).
    fn next_line(&mut self) -> Result<String, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => {
                self.console.push(line.clone());
                if let Some(verdict) = parse_verdict(&line) {
                    self.verdict = Some(verdict);
                }
                Ok(line)
            }
            Err(RecvTimeoutError::Timeout) => Err("the VM timed out".into()),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.qemu.wait().expect("wait for qemu");
                Err(format!("qemu ended ({status}) without a verdict"))
            }
        }
    }

    /// Reads the console until the guest prints `MARKER NAME`; fails the test (with
    /// the console) if the VM ends or gives its verdict first.
    pub fn wait_for_marker(&mut self, name: &str) {
        let want = format!("MARKER {name}");
        loop {
            match self.next_line() {
                Ok(line) if line.trim() == want => return,
                Ok(_) if self.verdict.is_some() => panic!(
                    "the guest gave its verdict before `{want}`:\n{}",
                    self.console.join("\n")
                ),
                Ok(_) => {}
                Err(why) => panic!("{why} before `{want}`:\n{}", self.console.join("\n")),
            }
        }
    }

    /// Waits for the verdict and for qemu to exit (the guest powers off after its
    /// verdict); returns both with the whole console.
    pub fn finish(mut self) -> VmOutcome {
        while self.verdict.is_none() {
            if let Err(why) = self.next_line() {
                self.verdict = Some(Verdict::None(why));
                break;
            }
        }
        // The rest of the console (the power-off), until qemu exits or a few seconds
        // pass.
        let grace = Instant::now() + Duration::from_secs(20);
        self.deadline = self.deadline.min(grace);
        while self.next_line().is_ok() {}
        let verdict = self.verdict.take().expect("a verdict was set");
        VmOutcome {
            verdict,
            console: std::mem::take(&mut self.console).join("\n"),
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Ok(None) = self.qemu.try_wait() {
            let _ = self.qemu.kill();
            let _ = self.qemu.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_lines() {
        assert_eq!(parse_verdict("VERDICT PASS"), Some(Verdict::Pass));
        assert_eq!(parse_verdict("VERDICT PASS\r"), Some(Verdict::Pass));
        assert_eq!(
            parse_verdict("VERDICT FAIL: no eth0"),
            Some(Verdict::Fail("no eth0".into()))
        );
        // A kernel message's tail before the verdict on the same line.
        assert_eq!(
            parse_verdict("[   3.1] nbd0: gone VERDICT FAIL: read back md5 x"),
            Some(Verdict::Fail("read back md5 x".into()))
        );
        assert_eq!(parse_verdict("STEP discover"), None);
        assert_eq!(parse_verdict("VERDICT"), None);
    }

    #[test]
    fn data_lines() {
        let md5 = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            DataWritten::parse(&format!("DATA md5={md5} offset_mib=8 mib=16")),
            Some(DataWritten {
                md5: md5.into(),
                offset: 8 << 20,
                len: 16 << 20
            })
        );
        assert_eq!(DataWritten::parse("DATA md5=xyz offset_mib=8 mib=16"), None);
        assert_eq!(DataWritten::parse(&format!("DATA md5={md5} mib=16")), None);
        assert_eq!(DataWritten::parse("STEP DATA"), None);
    }

    #[test]
    fn data_written_matches_the_file_range() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk");
        let mut bytes = vec![0u8; 3 << 20];
        bytes[1 << 20..2 << 20].fill(0x5a);
        std::fs::write(&file, &bytes).unwrap();
        let range = |md5: &str| DataWritten {
            md5: md5.into(),
            offset: 1 << 20,
            len: 1 << 20,
        };
        let output = Command::new("sh")
            .arg("-c")
            .arg("head -c 1048576 /dev/zero | tr '\\0' Z | md5sum")
            .output()
            .unwrap();
        let md5 = text(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        range(&md5).assert_in_file(&file);
        let wrong = std::panic::catch_unwind(|| range(&"0".repeat(32)).assert_in_file(&file));
        assert!(wrong.is_err(), "a wrong MD5 was accepted");
    }

    #[test]
    fn judge_scripts_set_variables_then_source_the_judge() {
        let script = judge_script(
            "nbd",
            &[("PORT", "10809".into()), ("EXPORT", "a.img".into())],
        );
        assert_eq!(
            script,
            "PORT='10809'\nEXPORT='a.img'\n. /lib/judges/nbd.sh\n"
        );
        assert!(scripts_dir().join("judges/nbd.sh").exists());
        assert!(
            std::panic::catch_unwind(|| judge_script("nbd", &[("A B", String::new())])).is_err()
        );
    }
}
