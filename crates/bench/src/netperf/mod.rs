//! blockwire's own TCP throughput test, the bench's network baseline when iperf3 is
//! not at hand: a server ([`server::NetServer`], `blockwire netserve`) on the target
//! host and a client ([`client::measure`]) in the bench.
//!
//! A test runs one direction over one or more streams: the client sends (an upload
//! to the target host, what storage writes need) or receives (a download, what
//! reads need). It is measured as the receiving side saw it, and the server reports
//! its process's CPU time so that the bench can show the target's CPU% beside its
//! own. The protocol is in [`wire`]; it is ours and small, not iperf3's.

pub mod client;
pub mod server;
pub mod wire;

pub use client::{measure, sample_cpu, ClientConfig, ClientError, Measurement};
pub use server::{NetServer, RunningServer, ServerConfig, ShutdownHandle};
pub use wire::Direction;

/// The port `blockwire netserve` listens on by default: the one after NBD's 10809.
pub const DEFAULT_PORT: u16 = 10810;

/// Fills a data buffer with a cheap pseudo-random pattern (xorshift). Not zeroes:
/// a compressing tunnel or VPN on the path would make zeroes look faster than any
/// real data.
pub(crate) fn fill_pattern(buffer: &mut [u8]) {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in buffer.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

/// User + system CPU time of this whole process, in nanoseconds.
pub(crate) fn process_cpu_ns() -> Option<u64> {
    crate::meter::own_cpu_time().map(|t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_not_compressible_zeroes() {
        let mut buffer = vec![0u8; 4099];
        fill_pattern(&mut buffer);
        assert!(buffer.iter().filter(|&&b| b == 0).count() < 100);
        let mut again = vec![0u8; 4099];
        fill_pattern(&mut again);
        assert_eq!(buffer, again);
        assert!(process_cpu_ns().is_some());
    }
}
