//! What the connection thread and the threads that run its commands share: the
//! CmdSN window every PDU sent carries (RFC 7143 §4.2.2.1), and the tasks running
//! on the device, which task management and logout wait for.
//!
//! No socket and no clock: the sans-IO full feature phase
//! ([`super::full_feature`]) checks CmdSNs against it, and tests drive it directly.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::io::Window;

/// `a <= b` in serial number arithmetic (RFC 1982, as RFC 7143 §4.2.2.1 uses it).
pub fn serial_le(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) >= 0
}

/// Where a CmdSN stands against the window.
#[derive(Debug, PartialEq, Eq)]
pub enum CmdSnCheck {
    /// In the window: accept (ExpCmdSN has moved past it if it was not immediate).
    Accept,
    /// Outside the window: drop the PDU silently (§4.2.2.1).
    Ignore,
}

/// The CmdSN window of a session and the tasks it has running on the device.
pub struct Tasks {
    /// The next CmdSN expected.
    exp_cmd_sn: AtomicU32,
    /// How many commands beyond ExpCmdSN the initiator may send.
    window: u32,
    /// Initiator task tags of commands running off the connection's thread.
    executing: Mutex<HashSet<u32>>,
    executing_changed: Condvar,
}

impl Window for Tasks {
    fn window(&self) -> (u32, u32) {
        let exp = self.exp_cmd_sn.load(Ordering::Acquire);
        (exp, exp.wrapping_add(self.window - 1))
    }
}

impl Tasks {
    /// A window starting at `exp_cmd_sn` (the login's) of `window` commands.
    pub fn new(exp_cmd_sn: u32, window: u32) -> Tasks {
        Tasks {
            exp_cmd_sn: AtomicU32::new(exp_cmd_sn),
            window: window.max(1),
            executing: Mutex::new(HashSet::new()),
            executing_changed: Condvar::new(),
        }
    }

    /// Checks a PDU's CmdSN and, for a non-immediate PDU in the window, moves
    /// ExpCmdSN (and with it MaxCmdSN) past it. One connection delivers commands in
    /// order, so a CmdSN ahead of ExpCmdSN (a lost command) moves the window on
    /// rather than waiting forever.
    pub fn check_cmd_sn(&self, cmd_sn: u32, immediate: bool) -> CmdSnCheck {
        let (exp, max) = self.window();
        if immediate {
            // Immediate PDUs carry the current CmdSN and do not advance it.
            return CmdSnCheck::Accept;
        }
        if !(serial_le(exp, cmd_sn) && serial_le(cmd_sn, max)) {
            return CmdSnCheck::Ignore;
        }
        self.exp_cmd_sn
            .store(cmd_sn.wrapping_add(1), Ordering::Release);
        CmdSnCheck::Accept
    }

    /// Marks a command as running off the connection's thread.
    pub fn start_executing(&self, itt: u32) {
        self.lock_executing().insert(itt);
    }

    /// Marks a command as answered.
    pub fn finish_executing(&self, itt: u32) {
        self.lock_executing().remove(&itt);
        self.executing_changed.notify_all();
    }

    pub fn is_executing(&self, itt: u32) -> bool {
        self.lock_executing().contains(&itt)
    }

    /// Waits until the command `itt` (or, with None, every command) is answered.
    pub fn wait_executing(&self, itt: Option<u32>) {
        let mut executing = self.lock_executing();
        while match itt {
            Some(itt) => executing.contains(&itt),
            None => !executing.is_empty(),
        } {
            executing = self
                .executing_changed
                .wait(executing)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn lock_executing(&self) -> MutexGuard<'_, HashSet<u32>> {
        self.executing.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(serial_le(5, 5));
        assert!(serial_le(5, 6));
        assert!(!serial_le(6, 5));
        assert!(serial_le(u32::MAX, 0));
        assert!(!serial_le(0, u32::MAX));
    }

    #[test]
    fn the_window_wraps_past_the_largest_cmd_sn() {
        let tasks = Tasks::new(u32::MAX, 4);
        assert_eq!(tasks.window(), (u32::MAX, 2));
        assert_eq!(tasks.check_cmd_sn(u32::MAX, false), CmdSnCheck::Accept);
        assert_eq!(tasks.check_cmd_sn(2, false), CmdSnCheck::Accept);
        assert_eq!(tasks.window(), (3, 6));
        assert_eq!(tasks.check_cmd_sn(1, false), CmdSnCheck::Ignore);
    }
}
