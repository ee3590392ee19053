//! What a protocol target reports to whoever counts its work (the `serve` command's
//! Prometheus endpoint): requests through [`IoMeter`] (see [`crate::Metered`]), and
//! connections through [`SessionMeter`]. The interfaces live here, beside the device
//! trait every target already depends on, so that targets stay free of any metrics
//! library and count nothing when nobody asks.

use std::fmt;
use std::time::Duration;

use crate::error::{ErrorKind, Op};

/// Receives one call per request that reaches a [`crate::Metered`] device.
///
/// Called on the data path, from many threads at once: implementations must not
/// take a lock (atomic or per-thread counters only).
pub trait IoMeter: Send + Sync {
    /// A request has started (for a gauge of requests in flight).
    fn started(&self);

    /// A request has finished: `bytes` moved (0 for a failed one and for requests
    /// that move no data), how long it took, and the kind of error if it failed.
    fn finished(&self, op: Op, bytes: u64, elapsed: Duration, error: Option<ErrorKind>);
}

/// Receives the connections (NBD) or sessions (iSCSI) of a target.
///
/// Called once per connection, never per request; `export` is the export the
/// connection chose.
pub trait SessionMeter: Send + Sync + fmt::Debug {
    /// A connection entered service for `export`.
    fn opened(&self, export: &str);

    /// A connection [`opened`](Self::opened) for `export` has ended.
    fn closed(&self, export: &str);

    /// A connection was closed at once because of the configured limit `limit` (the
    /// setting's name, e.g. `max_connections`), before it chose an export.
    fn refused(&self, limit: &str);
}

/// Calls [`SessionMeter::closed`] when dropped, so that every way out of a
/// connection's code counts its end.
pub struct OpenSession<'a> {
    meter: &'a dyn SessionMeter,
    export: &'a str,
}

impl<'a> OpenSession<'a> {
    /// Counts a session of `export` as opened, until the result is dropped.
    pub fn open(meter: &'a dyn SessionMeter, export: &'a str) -> OpenSession<'a> {
        meter.opened(export);
        OpenSession { meter, export }
    }
}

impl Drop for OpenSession<'_> {
    fn drop(&mut self) {
        self.meter.closed(self.export);
    }
}
