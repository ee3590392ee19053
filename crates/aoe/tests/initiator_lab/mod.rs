//! A two-namespace lab for the initiator's tests: `links` veth pairs, `iniN` on the
//! initiator side and `tgtN` on the target side, programs started in the target
//! namespace and killed by PID, everything removed on drop (also when a test panics).
//! Needs root; [`unavailable`] says why a test must skip.

#![allow(dead_code)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;

/// Why namespace tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, raw sockets)".into());
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

pub fn ip(args: &[&str]) -> Result<(), String> {
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

/// Moves the calling thread into network namespace `ns`.
fn enter(ns: &str) {
    let file = std::fs::File::open(Path::new("/run/netns").join(ns))
        .unwrap_or_else(|e| panic!("network namespace {ns}: {e}"));
    // SAFETY: setns(2) on a descriptor held open for the call; it only moves this
    // thread into the namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

pub struct Lab {
    pub initiator: String,
    pub target: String,
    pub links: usize,
    children: Vec<Option<Child>>,
    files: Vec<PathBuf>,
}

impl Lab {
    /// Namespaces `bwi<tag><pid>` and `bwt<tag><pid>` joined by `links` veth pairs at
    /// `mtu`.
    pub fn new(tag: &str, links: usize, mtu: usize) -> Lab {
        let pid = std::process::id();
        let lab = Lab {
            initiator: format!("bwi{tag}{pid}"),
            target: format!("bwt{tag}{pid}"),
            links,
            children: Vec::new(),
            files: Vec::new(),
        };
        for ns in [&lab.initiator, &lab.target] {
            if Path::new("/run/netns").join(ns).exists() {
                let _ = ip(&["netns", "del", ns]); // left by a killed run of ours
            }
        }
        // From here on, dropping `lab` removes whatever exists.
        for ns in [&lab.initiator, &lab.target] {
            ip(&["netns", "add", ns]).unwrap();
            ip(&["-n", ns, "link", "set", "lo", "up"]).unwrap();
        }
        let mtu = mtu.to_string();
        for i in 0..links {
            let (ini, tgt) = (format!("ini{i}"), format!("tgt{i}"));
            // Made inside the namespaces: the names never meet the host's interfaces.
            ip(&[
                "-n",
                &lab.target,
                "link",
                "add",
                &tgt,
                "type",
                "veth",
                "peer",
                "name",
                &ini,
                "netns",
                &lab.initiator,
            ])
            .unwrap();
            ip(&["-n", &lab.target, "link", "set", &tgt, "mtu", &mtu, "up"]).unwrap();
            ip(&["-n", &lab.initiator, "link", "set", &ini, "mtu", &mtu, "up"]).unwrap();
        }
        lab
    }

    /// The initiator side's interfaces.
    pub fn initiator_interfaces(&self) -> Vec<String> {
        (0..self.links).map(|i| format!("ini{i}")).collect()
    }

    /// A sparse file of `size` bytes, removed with the lab.
    pub fn image(&mut self, name: &str, size: u64) -> PathBuf {
        let path = std::env::temp_dir().join(format!("{}-{name}", self.target));
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        self.files.push(path.clone());
        path
    }

    /// Starts `program args...` in the target namespace; returns its index for
    /// [`kill`](Self::kill).
    pub fn spawn_in_target(&mut self, program: &Path, args: &[&str]) -> usize {
        // `ip netns exec` execs the program, so the child's PID is the program's.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.target])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        self.children.push(Some(child));
        self.children.len() - 1
    }

    /// Kills a program started by [`spawn_in_target`](Self::spawn_in_target), by PID.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `f` on a thread inside the initiator namespace.
    pub fn in_initiator<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.initiator, f)
    }

    /// Starts `f` on a thread inside the target namespace.
    pub fn spawn_target_thread<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let ns = self.target.clone();
        thread::spawn(move || {
            enter(&ns);
            f()
        })
    }
}

/// Runs `f` on a new thread that joined namespace `ns`; a panic in `f` is passed on.
pub fn run_in<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    thread::scope(|scope| {
        scope
            .spawn(|| {
                enter(ns);
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl Drop for Lab {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
        for ns in [&self.initiator, &self.target] {
            if Path::new("/run/netns").join(ns).exists() {
                if let Err(e) = ip(&["netns", "del", ns]) {
                    eprintln!("{e}");
                }
            }
        }
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}
