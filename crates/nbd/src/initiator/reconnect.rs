//! Riding out a server restart: when a connection drops with requests unanswered,
//! connect again, negotiate the same export, check it is the same one (size, flags,
//! block sizes), put the new connection in place of the old, and let the callers
//! send their requests again.
//!
//! Replaying is safe for every NBD command: reads, writes, trims and zeroing give
//! the same result when repeated, and a request whose reply was lost may have run
//! once already. Writes the server acknowledged stay acknowledged: the callers
//! already have their answers and nothing is sent again for them. A flush sent
//! after a reconnect covers the writes replayed on the new connection, since the
//! callers only learn of those writes once the new connection has answered them.
//!
//! Who replays: a caller blocked in [`NbdClient`]'s request path sends its request
//! again itself; a request queue resubmits the failed requests it owns (queue.rs).
//! A request that timed out (the server is there but does not answer) is not
//! replayed: that server would time out again; nor is one whose connection ended
//! in a protocol violation, nor one that has already been sent [`MAX_REPLAYS`]
//! times (a request that brings its server down each time it arrives).

use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, ErrorKind};

use super::connection::Connection;
use super::device::{differs, open, NbdClient};

/// First wait between attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Most times one request is sent again.
pub(crate) const MAX_REPLAYS: u32 = 8;

/// Reconnect state shared by everyone using one client.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// Set when reconnecting failed for good: why. Requests then fail at once.
    given_up: Option<String>,
    /// Reconnects so far, for messages and tests.
    pub reconnects: u64,
}

/// Whether a request failed because its connection is gone (and may be sent again
/// on a new one).
pub(crate) fn worth_it(error: &Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Disconnected | ErrorKind::ShuttingDown
    )
}

/// Makes sure `failed` has been replaced by a working connection, reconnecting if
/// nobody else has yet; on success the caller sends its request again (for the
/// `replays + 1`th time). Fails with `error` (or why reconnecting failed) when
/// reconnecting is off, not worth it, has failed for good, or finds a different
/// export.
pub(crate) fn recover(
    client: &NbdClient,
    failed: &std::sync::Arc<Connection>,
    error: Error,
    replays: u32,
) -> Result<(), Error> {
    let Some(limit) = client.options.reconnect else {
        return Err(error);
    };
    if failed.broke_protocol() {
        return Err(error);
    }
    if replays >= MAX_REPLAYS {
        let reason = format!(
            "the connection dropped each of the {} times this request was sent; \
             not sending it again",
            replays + 1
        );
        return Err(disconnected(&error, reason));
    }
    let index = failed.index();
    let mut recovery = client.recovery.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(reason) = &recovery.given_up {
        return Err(disconnected(&error, reason.clone()));
    }
    if !std::sync::Arc::ptr_eq(&client.connection(index), failed) {
        // Another caller reconnected while this one waited for the lock.
        return Ok(());
    }
    let name = format!("connection {index} to {}", client.address);
    tracing::warn!("{name} dropped ({error}); reconnecting for up to {limit:?}");
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    loop {
        let last = match open(client.uri(), &client.options) {
            Ok((socket, details)) => {
                if let Some(change) = differs(&client.details, &details) {
                    let reason = format!(
                        "{name}: the export changed across a reconnect ({change}); \
                         nothing was replayed"
                    );
                    tracing::error!("{reason}");
                    return Err(give_up(&mut recovery, reason, &error));
                }
                match Connection::start(
                    socket,
                    &details,
                    &client.address,
                    index,
                    client.options.request_timeout,
                ) {
                    Ok(connection) => {
                        client.replace_connection(index, connection);
                        recovery.reconnects += 1;
                        tracing::warn!(
                            "{name}: reconnected after {:.1?}; sending unanswered requests again",
                            started.elapsed()
                        );
                        return Ok(());
                    }
                    Err(e) => format!("starting the connection: {e}"),
                }
            }
            Err(e) => e.to_string(),
        };
        if started.elapsed() + backoff > limit {
            let reason = format!("{name}: could not reconnect within {limit:?}: {last}");
            tracing::error!("{reason}");
            return Err(give_up(&mut recovery, reason, &error));
        }
        tracing::debug!("{name}: reconnect failed ({last}); again in {backoff:?}");
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Records that reconnecting failed for good and returns the request's error.
fn give_up(recovery: &mut Recovery, reason: String, error: &Error) -> Error {
    recovery.given_up = Some(reason.clone());
    disconnected(error, reason)
}

/// The request's error, now for good.
fn disconnected(error: &Error, reason: String) -> Error {
    Error::new(
        ErrorKind::Disconnected,
        error.op(),
        error.offset(),
        error.len(),
    )
    .with_detail(reason)
}
