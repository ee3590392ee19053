//! Finding targets: a Query Config Information (read) broadcast on every interface,
//! and the answers collected (AoEr11 §3.2).
//!
//! Targets also announce themselves unasked with the same message when they start
//! (vblade does); such announcements heard while listening count as answers.

use std::io;
use std::time::{Duration, Instant};

use crate::rawsock::{Interface, RawSocket, RecvBatch};
use crate::wire::{
    encode_frame, Body, Command, ConfigCommand, ConfigQuery, Header, MacAddr, BROADCAST,
    BROADCAST_SHELF, BROADCAST_SLOT,
};

use super::uri::target_name;

/// A target that answered a query, as seen from one local interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The local interface the answer came in on.
    pub interface: Interface,
    /// The target's MAC address on that segment.
    pub target_mac: MacAddr,
    pub shelf: u16,
    pub slot: u8,
    /// Frames the target can queue: the most an initiator should have outstanding.
    pub buffer_count: u16,
    pub firmware_version: u16,
    /// Most sectors the target takes in one ATA frame.
    pub sector_count: u8,
    /// The AoE version the target speaks.
    pub aoe_version: u8,
    /// The target's config string (often empty).
    pub config: Vec<u8>,
    /// How long after the (last) query the answer came.
    pub answered_in: Duration,
}

impl Found {
    /// `eSHELF.SLOT`.
    pub fn target_name(&self) -> String {
        target_name(self.shelf, self.slot)
    }

    /// The config string as text (invalid UTF-8 replaced).
    pub fn config_text(&self) -> String {
        String::from_utf8_lossy(&self.config).into_owned()
    }
}

/// Formats a MAC address as `02:00:00:00:00:aa`.
pub fn format_mac(mac: &MacAddr) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Broadcasts a config query for `shelf`.`slot` (0xffff / 0xff for any) on every
/// interface and collects the answers for `wait`, one per (interface, target MAC,
/// shelf, slot), sorted by shelf, slot, interface and MAC.
pub fn discover(
    interfaces: &[Interface],
    shelf: u16,
    slot: u8,
    wait: Duration,
) -> io::Result<Vec<Found>> {
    let sockets = interfaces
        .iter()
        .map(|interface| RawSocket::open(interface, 0))
        .collect::<io::Result<Vec<_>>>()?;
    let mut found: Vec<Found> = query(&sockets, shelf, slot, wait, false)?
        .into_iter()
        .map(|(_, found)| found)
        .collect();
    found.sort_by(|a, b| {
        (a.shelf, a.slot, &a.interface.name, a.target_mac).cmp(&(
            b.shelf,
            b.slot,
            &b.interface.name,
            b.target_mac,
        ))
    });
    Ok(found)
}

/// [`discover`] on interfaces named (each looked up first).
pub fn discover_by_name<S: AsRef<str>>(
    names: &[S],
    shelf: u16,
    slot: u8,
    wait: Duration,
) -> io::Result<Vec<Found>> {
    let interfaces = names
        .iter()
        .map(|name| Interface::lookup(name.as_ref()))
        .collect::<io::Result<Vec<_>>>()?;
    discover(&interfaces, shelf, slot, wait)
}

/// The config query frame (a broadcast) from our MAC `local`; pure, so the
/// session builds its rediscovery queries with it too.
pub(crate) fn query_frame(local: MacAddr, shelf: u16, slot: u8, tag: u32) -> Vec<u8> {
    let header = Header::request(BROADCAST, local, shelf, slot, Command::QueryConfig, tag);
    let query = ConfigQuery {
        buffer_count: 0,
        firmware_version: 0,
        sector_count: 0,
        aoe_version: 0,
        command: ConfigCommand::Read as u8,
        config: b"",
    };
    let mut frame = Vec::new();
    encode_frame(&header, &Body::QueryConfig(query), &mut frame);
    frame
}

/// A config answer addressed to us from a target matching `shelf`.`slot`.
fn parse_answer(
    frame: &[u8],
    interface: &Interface,
    shelf: u16,
    slot: u8,
    answered_in: Duration,
) -> Option<Found> {
    let (header, body) = Header::parse(frame).ok()?;
    if !header.response
        || header.command != Command::QueryConfig as u8
        || header.error != 0
        || (header.dst != interface.mac && header.dst != BROADCAST)
        || header.shelf == BROADCAST_SHELF
        || header.slot == BROADCAST_SLOT
        || (shelf != BROADCAST_SHELF && header.shelf != shelf)
        || (slot != BROADCAST_SLOT && header.slot != slot)
    {
        return None;
    }
    let config = ConfigQuery::parse(body).ok()?;
    Some(Found {
        interface: interface.clone(),
        target_mac: header.src,
        shelf: header.shelf,
        slot: header.slot,
        buffer_count: config.buffer_count,
        firmware_version: config.firmware_version,
        sector_count: config.sector_count,
        aoe_version: config.aoe_version,
        config: config.config.to_vec(),
        answered_in,
    })
}

/// A tag that differs between processes and runs.
pub(crate) fn random_tag() -> u32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mixed = (u64::from(now.subsec_nanos()) ^ now.as_secs().rotate_left(32))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(std::process::id()).wrapping_mul(0xD1B5_4A32_D192_ED03);
    (mixed >> 32) as u32
}

/// Queries on every socket at once and listens for `wait`; with `settle`, an
/// interface stops listening shortly after its first answer (enough for a second
/// target MAC to answer too), which is what opening a known target needs. Returns
/// the answers with the index of the socket each came in on.
pub(crate) fn query(
    sockets: &[RawSocket],
    shelf: u16,
    slot: u8,
    wait: Duration,
    settle: bool,
) -> io::Result<Vec<(usize, Found)>> {
    let tag = random_tag();
    let results: Vec<io::Result<Vec<Found>>> = std::thread::scope(|scope| {
        let listeners: Vec<_> = sockets
            .iter()
            .map(|socket| scope.spawn(move || listen(socket, shelf, slot, tag, wait, settle)))
            .collect();
        listeners
            .into_iter()
            .map(|listener| {
                listener
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("discovery thread panicked")))
            })
            .collect()
    });
    let mut all = Vec::new();
    for (index, result) in results.into_iter().enumerate() {
        all.extend(result?.into_iter().map(|found| (index, found)));
    }
    Ok(all)
}

/// One interface's share of a query: send, re-send while unanswered, collect.
fn listen(
    socket: &RawSocket,
    shelf: u16,
    slot: u8,
    tag: u32,
    wait: Duration,
    settle: bool,
) -> io::Result<Vec<Found>> {
    let interface = socket.interface();
    let frame = query_frame(interface.mac, shelf, slot, tag);
    let start = Instant::now();
    let deadline = start + wait;
    // Queries are re-sent while nothing answered, in case one was lost.
    let resend_every = (wait / 4).max(Duration::from_millis(10));
    socket.send(&frame)?;
    let mut sent_at = start;
    let mut stop_at = deadline;
    let mut found: Vec<Found> = Vec::new();
    let mut batch = RecvBatch::new(16, interface.mtu + 64);
    loop {
        let now = Instant::now();
        if now >= stop_at {
            break;
        }
        if found.is_empty() && now >= sent_at + resend_every {
            socket.send(&frame)?;
            sent_at = now;
        }
        let next = if found.is_empty() {
            stop_at.min(sent_at + resend_every)
        } else {
            stop_at
        };
        let received = socket.recv_batch(&mut batch, Some(next.saturating_duration_since(now)))?;
        let now = Instant::now();
        for i in 0..received {
            let Some(answer) = parse_answer(batch.frame(i), interface, shelf, slot, now - sent_at)
            else {
                continue;
            };
            let duplicate = found.iter().any(|f| {
                (f.target_mac, f.shelf, f.slot) == (answer.target_mac, answer.shelf, answer.slot)
            });
            if duplicate {
                continue;
            }
            if settle && found.is_empty() {
                // Another MAC of the same target answers about as fast: wait a few
                // round trips more, at least 20 ms.
                let grace = (answer.answered_in * 4).max(Duration::from_millis(20));
                stop_at = stop_at.min(now + grace);
            }
            found.push(answer);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interface() -> Interface {
        Interface {
            name: "veth0".into(),
            index: 3,
            mac: [2, 0, 0, 0, 0, 1],
            mtu: 1500,
        }
    }

    fn answer(shelf: u16, slot: u8, dst: MacAddr, config: &[u8]) -> Vec<u8> {
        let request = Header::request(
            dst,
            [2, 0, 0, 0, 0, 0xaa],
            shelf,
            slot,
            Command::QueryConfig,
            7,
        );
        let header = Header {
            dst,
            src: [2, 0, 0, 0, 0, 0xaa],
            response: true,
            ..request
        };
        let query = ConfigQuery {
            buffer_count: 16,
            firmware_version: 0x4019,
            sector_count: 2,
            aoe_version: 1,
            command: 0,
            config,
        };
        let mut frame = Vec::new();
        header.encode(&mut frame);
        Body::QueryConfig(query).encode(&mut frame);
        frame
    }

    #[test]
    fn the_query_is_a_broadcast_config_read() {
        let frame = query_frame(interface().mac, 0xffff, 0xff, 42);
        assert_eq!(frame.len(), 60);
        let (header, body) = Header::parse(&frame).unwrap();
        assert_eq!(header.dst, BROADCAST);
        assert_eq!(header.src, interface().mac);
        assert_eq!((header.shelf, header.slot, header.tag), (0xffff, 0xff, 42));
        assert!(!header.response);
        assert_eq!(header.command, Command::QueryConfig as u8);
        let query = ConfigQuery::parse(body).unwrap();
        assert_eq!(query.command, ConfigCommand::Read as u8);
        assert!(query.config.is_empty());
    }

    #[test]
    fn answers_are_parsed_even_when_short() {
        // vblade's answer is 32 bytes: no Ethernet padding.
        let frame = answer(1, 2, interface().mac, b"");
        assert_eq!(frame.len(), 32);
        let found = parse_answer(&frame, &interface(), 1, 2, Duration::from_micros(80)).unwrap();
        assert_eq!(found.target_name(), "e1.2");
        assert_eq!(found.target_mac, [2, 0, 0, 0, 0, 0xaa]);
        assert_eq!(
            (
                found.buffer_count,
                found.sector_count,
                found.firmware_version
            ),
            (16, 2, 0x4019)
        );
        assert_eq!(found.aoe_version, 1);
        assert_eq!(found.interface.name, "veth0");
        let with_config = answer(1, 2, BROADCAST, b"hello");
        let found = parse_answer(&with_config, &interface(), 0xffff, 0xff, Duration::ZERO);
        assert_eq!(found.unwrap().config_text(), "hello");
    }

    #[test]
    fn other_answers_are_not_taken() {
        let iface = interface();
        let wait = Duration::ZERO;
        // Another target than asked for.
        assert!(parse_answer(&answer(1, 3, iface.mac, b""), &iface, 1, 2, wait).is_none());
        assert!(parse_answer(&answer(2, 2, iface.mac, b""), &iface, 1, 0xff, wait).is_none());
        assert!(parse_answer(&answer(2, 2, iface.mac, b""), &iface, 0xffff, 2, wait).is_some());
        // Addressed to another initiator.
        assert!(parse_answer(&answer(1, 2, [2; 6], b""), &iface, 1, 2, wait).is_none());
        // Our own query, a request.
        let query = query_frame(iface.mac, 1, 2, 5);
        assert!(parse_answer(&query, &iface, 1, 2, wait).is_none());
        // Truncated.
        let frame = answer(1, 2, iface.mac, b"abc");
        assert!(parse_answer(&frame[..30], &iface, 1, 2, wait).is_none());
    }

    #[test]
    fn macs_print_in_the_usual_form() {
        assert_eq!(
            format_mac(&[0, 0x1b, 0x21, 0xa, 0xb, 0xff]),
            "00:1b:21:0a:0b:ff"
        );
    }

    #[test]
    fn tags_vary() {
        let tags: Vec<u32> = (0..4)
            .map(|_| {
                std::thread::sleep(Duration::from_micros(10));
                random_tag()
            })
            .collect();
        assert!(tags.windows(2).any(|w| w[0] != w[1]));
    }
}
