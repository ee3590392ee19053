//! Telling systemd how `serve` is doing (`Type=notify`): READY=1 once every listener
//! is up, RELOADING=1 around a reload, STOPPING=1 at shutdown. Outside systemd
//! (no NOTIFY_SOCKET) these do nothing.

use sd_notify::NotifyState;

fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

/// Every listener is up: clients may connect.
pub fn ready() {
    notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

/// A reload began; [`reloaded`] ends it.
pub fn reloading() {
    // systemd ≥ 253 wants the monotonic time beside RELOADING=1 to match them up.
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let usec = i128::from(now.tv_sec) * 1_000_000 + i128::from(now.tv_nsec) / 1_000;
    notify(&[NotifyState::Reloading, NotifyState::MonotonicUsec(usec)]);
}

/// The reload is over (applied or refused): serving again.
pub fn reloaded(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Shutting down.
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}
