//! What the lab has made that must not outlive it: namespaces, child processes and
//! its work directory. Everything is registered here while a lock is held, so a
//! SIGINT or SIGTERM handled on another thread either sees a thing registered or
//! stops the run before it is made; the handler then removes it all and exits.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

#[derive(Default)]
pub struct Registry {
    namespaces: Vec<String>,
    children: Vec<u32>,
    dirs: Vec<PathBuf>,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Registry::default()))
}

/// The registry, locked. Make a thing and register it under one lock.
pub fn lock() -> MutexGuard<'static, Registry> {
    registry()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Registry {
    pub fn add_namespace(&mut self, name: &str) {
        self.namespaces.push(name.to_string());
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.namespaces.retain(|n| n != name);
    }

    pub fn add_child(&mut self, pid: u32) {
        self.children.push(pid);
    }

    pub fn remove_child(&mut self, pid: u32) {
        self.children.retain(|&p| p != pid);
    }

    pub fn add_dir(&mut self, dir: PathBuf) {
        self.dirs.push(dir);
    }

    pub fn remove_dir(&mut self, dir: &std::path::Path) {
        self.dirs.retain(|d| d != dir);
    }

    /// Stops every child (SIGTERM, then SIGKILL after a grace period), newest first
    /// (a bench, or bonnie's script, which still unmounts and flushes through the
    /// target, before the target), deletes every namespace (which deletes the veth
    /// pairs in it) and removes the directories. Returns what it removed, for the
    /// user.
    pub fn tear_down(&mut self) -> Vec<String> {
        let mut removed = Vec::new();
        for pid in self.children.drain(..).rev() {
            stop_process(pid, Duration::from_secs(3));
            removed.push(format!("process {pid}"));
        }
        for ns in self.namespaces.drain(..) {
            if delete_namespace(&ns) {
                removed.push(format!("namespace {ns}"));
            }
        }
        for dir in self.dirs.drain(..) {
            if std::fs::remove_dir_all(&dir).is_ok() {
                removed.push(format!("directory {}", dir.display()));
            }
        }
        removed
    }
}

/// Sends SIGTERM to `pid`, waits up to `grace` for it to end (reaping it, as our
/// child), then SIGKILLs it.
pub fn stop_process(pid: u32, grace: Duration) {
    blockwire_bench::child::stop_pid(pid, grace);
}

/// Deletes namespace `name` if it exists; returns whether it did.
pub fn delete_namespace(name: &str) -> bool {
    if !std::path::Path::new("/run/netns").join(name).exists() {
        return false;
    }
    let mut command = Command::new("ip");
    command
        .args(["netns", "del", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    blockwire_bench::child::die_with_parent(&mut command)
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs the SIGINT/SIGTERM handler: on the first signal, everything registered
/// is removed and the process exits with 128 + the signal, as a shell reports it.
pub fn install_signal_handler() -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    std::thread::Builder::new()
        .name("lab-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("\nblockwire lab: interrupted; tearing the bed down");
                let mut registry = lock();
                for what in registry.tear_down() {
                    eprintln!("  removed {what}");
                }
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}
