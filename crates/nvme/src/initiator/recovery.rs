//! Reconnecting after the target restarts or the network drops: the first
//! request to see its connection lost builds a new association (retrying until
//! the reconnect deadline), the others wait for it; each then sends its
//! request again on the new queues. A target that stays away fails the
//! requests with a disconnected error, and later ones try once each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::NvmeClient;
use super::session::Session;

/// Pause between attempts to reach the target again.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Reconnect state of one client.
#[derive(Default)]
pub(crate) struct Recovery {
    /// Reconnecting ran out of time: later attempts make one try each instead
    /// of waiting the deadline again.
    gave_up: bool,
    /// Associations built after the first.
    pub reconnects: u64,
}

impl NvmeClient {
    /// The association to use instead of `failed`: the current one when
    /// another request already replaced it, otherwise a new one. Errs with why
    /// the target could not be reached in time.
    pub(crate) fn recover(&self, failed: &Arc<Session>) -> Result<Arc<Session>, String> {
        let Some(deadline) = self.options.reconnect else {
            return Err("reconnecting is off".into());
        };
        let mut recovery = self.recovery.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current();
        if !Arc::ptr_eq(&current, failed) && !current.is_broken() {
            return Ok(current);
        }
        current.close();
        let start = Instant::now();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match Session::connect(&self.options) {
                Ok(session) => {
                    if session.namespace != Some(*self.namespace()) {
                        session.close();
                        recovery.gave_up = true;
                        return Err(format!(
                            "after reconnecting, namespace {} is {:?}, not {:?}",
                            self.options.nsid,
                            session.namespace,
                            self.namespace()
                        ));
                    }
                    let session = Arc::new(session);
                    *self.session.write().unwrap_or_else(|e| e.into_inner()) = session.clone();
                    recovery.gave_up = false;
                    recovery.reconnects += 1;
                    tracing::info!(
                        "NVMe/TCP {}: reconnected after {attempt} attempt(s)",
                        self.options.address()
                    );
                    return Ok(session);
                }
                Err(e) => {
                    if recovery.gave_up || start.elapsed() + RETRY_PAUSE > deadline {
                        recovery.gave_up = true;
                        return Err(format!(
                            "target unreachable for {:.1}s: {e}",
                            start.elapsed().as_secs_f64()
                        ));
                    }
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    /// Associations built after the first one.
    pub fn reconnects(&self) -> u64 {
        self.recovery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reconnects
    }
}
