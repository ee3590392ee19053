//! Child processes that end with their parent. The bench runs `iperf3 -c` for the
//! network baseline and `blkid -p` to look for a file system; the lab runs targets,
//! benches, `ip` and `tc`. None of them may outlive the process that started it:
//!
//! - [`die_with_parent`] asks the kernel to send SIGTERM to the child when its parent
//!   ends (`prctl(PR_SET_PDEATHSIG)`, set between fork and exec), which covers a
//!   parent killed with SIGKILL, where no handler runs;
//! - [`Owned`] stops its child when dropped (an early return, a panic, an error);
//! - [`end_all`] stops every [`Owned`] child still running, for a SIGINT/SIGTERM
//!   handler about to call `exit`, which runs no destructors.
//!
//! The death signal is tied to the *thread* that spawned the child (prctl(2): "the
//! parent" is the creating thread), so a child must be spawned by a thread that
//! outlives it: the thread that waits for it, as here.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// PIDs of the [`Owned`] children not yet reaped.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Set by [`end_all`]: the process is about to exit.
static ENDING: AtomicBool = AtomicBool::new(false);

/// A thread whose child [`end_all`] stopped does not go on: it would take the stop
/// for the child's failure and race the signal handler's `exit` with an exit
/// status of its own. It waits for that exit instead.
fn unless_ending() {
    while ENDING.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

fn running() -> std::sync::MutexGuard<'static, Vec<u32>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes `command`'s child get SIGTERM when the thread that spawns it ends (with the
/// whole process: exit, a signal, SIGKILL). A parent that died between fork and the
/// prctl is caught by comparing the parent PID afterwards: the child then exits
/// before exec.
pub fn die_with_parent(command: &mut Command) -> &mut Command {
    // SAFETY: getpid(2) has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe system calls (prctl, getppid, _exit); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGTERM as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    }
}

/// A running child that ends with its parent ([`die_with_parent`]), is stopped when
/// dropped, and by [`end_all`].
#[derive(Debug)]
pub struct Owned {
    child: Child,
}

impl Owned {
    /// Spawns `command` as an owned child.
    pub fn spawn(command: &mut Command) -> io::Result<Owned> {
        die_with_parent(command);
        // Registered under the lock it is spawned under, so that a signal handler's
        // `end_all` either sees it or runs before it exists.
        let mut running = running();
        let child = command.spawn()?;
        running.push(child.id());
        Ok(Owned { child })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child to end, then reaps it under the list's lock: a PID
    /// leaves the list before the system may reuse it, so [`end_all`] never signals
    /// someone else's process. A child `end_all` has taken is its to reap.
    fn wait(&mut self) -> io::Result<ExitStatus> {
        let pid = self.child.id();
        wait_without_reaping(pid);
        let mut running = running();
        if !running.contains(&pid) {
            drop(running);
            unless_ending();
            return self.child.wait();
        }
        running.retain(|&p| p != pid);
        self.child.wait()
    }

    /// Reads its stdout and stderr (when piped) to the end and waits for it. On an
    /// error the child is stopped, as on drop.
    pub fn wait_with_output(mut self) -> io::Result<Output> {
        let stdout = self.child.stdout.take();
        let stderr = self.child.stderr.take();
        // Both at once: a child blocked on a full stderr pipe would never close its
        // stdout.
        let stderr = stderr.map(|mut pipe| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                pipe.read_to_end(&mut bytes).map(|_| bytes)
            })
        });
        let mut out = Vec::new();
        if let Some(mut pipe) = stdout {
            pipe.read_to_end(&mut out)?;
        }
        let err = match stderr {
            Some(reader) => reader
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the stderr reader panicked")))?,
            None => Vec::new(),
        };
        let status = self.wait()?;
        Ok(Output {
            status,
            stdout: out,
            stderr: err,
        })
    }

    /// SIGTERM, up to `grace` to end, then SIGKILL; reaped either way. Nothing
    /// when it was reaped already, or [`end_all`] has taken it.
    fn stop(&mut self, grace: Duration) {
        let pid = self.child.id();
        let mine = {
            let mut running = running();
            let mine = running.contains(&pid);
            running.retain(|&p| p != pid);
            mine
        };
        if mine {
            stop_pid(pid, grace);
            let _ = self.child.wait();
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Blocks until child `pid` has ended, leaving it to be reaped (`WNOWAIT`).
fn wait_without_reaping(pid: u32) {
    loop {
        // SAFETY: waitid(2) writes one siginfo_t through a valid pointer.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Stops every [`Owned`] child still running: SIGTERM to all, up to `grace` for them
/// to end, then SIGKILL; reaps them. For a signal handler that is about to exit:
/// the threads that were waiting for these children do not return from the wait.
/// Returns the PIDs it stopped.
pub fn end_all(grace: Duration) -> Vec<u32> {
    let pids = {
        let mut running = running();
        ENDING.store(true, Ordering::SeqCst);
        std::mem::take(&mut *running)
    };
    end(&pids, grace);
    pids
}

/// SIGTERM to every child in `pids`, up to `grace` for them to end, then SIGKILL;
/// all reaped. The PIDs are children of ours that no one else reaps: taken from
/// the list, whose owners no longer reap them ([`Owned::wait`]).
fn end(pids: &[u32], grace: Duration) {
    for &pid in pids {
        // SAFETY: kill(2) on a child of ours not yet reaped, so the PID is not
        // reused.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    let mut left = pids.to_vec();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|&pid| !reaped(pid));
        if !left.is_empty() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for pid in left {
        // SAFETY: as above; waitpid reaps it.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
            libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

/// Whether child `pid` has ended (and is now reaped), or is not ours to wait for.
fn reaped(pid: u32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid(2) with WNOHANG on a PID; `status` is a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG) };
    rc == pid as libc::pid_t || rc < 0
}

/// Sends SIGTERM to child `pid`, waits up to `grace` for it to end (reaping it),
/// then SIGKILLs and reaps it.
pub fn stop_pid(pid: u32, grace: Duration) {
    // SAFETY: kill(2) on a PID we started and have not reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if reaped(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above; waitpid reaps it.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
        libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    fn alive(pid: u32) -> bool {
        // A reaped child has no /proc entry; a zombie would say 'Z'.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
    }

    #[test]
    fn a_dropped_child_is_stopped_and_reaped() {
        let child = Owned::spawn(Command::new("sleep").arg("60")).unwrap();
        let pid = child.id();
        assert!(alive(pid));
        assert!(running().contains(&pid));
        drop(child);
        assert!(!alive(pid));
        assert!(!running().contains(&pid));
    }

    #[test]
    fn every_listed_child_is_stopped_at_the_end() {
        // `end_all` takes the whole list, which would stop other tests' children:
        // the two of this test are taken out by hand and ended as it ends them.
        let a = Owned::spawn(Command::new("sleep").arg("60")).unwrap();
        let b = Owned::spawn(Command::new("sleep").arg("60")).unwrap();
        let pids = [a.id(), b.id()];
        running().retain(|pid| !pids.contains(pid));
        end(&pids, Duration::from_secs(2));
        assert!(!alive(pids[0]) && !alive(pids[1]));
        // Dropping them afterwards is harmless.
        drop((a, b));
    }

    #[test]
    fn output_is_collected_and_the_child_forgotten() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo out; echo err >&2"]);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = Owned::spawn(&mut command).unwrap();
        let pid = child.id();
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.stdout, b"out\n");
        assert_eq!(output.stderr, b"err\n");
        assert!(output.status.success());
        assert!(!running().contains(&pid));
    }

    #[test]
    fn a_child_ends_when_the_thread_that_spawned_it_ends() {
        // The death signal follows the spawning thread: a thread standing in for a
        // parent killed with SIGKILL, where no destructor runs.
        let pid = std::thread::spawn(|| {
            let child = Owned::spawn(Command::new("sleep").arg("60")).unwrap();
            let pid = child.id();
            std::mem::forget(child);
            pid
        })
        .join()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !reaped(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        running().retain(|&p| p != pid);
        assert!(!alive(pid), "the child outlived the thread that spawned it");
    }
}
