//! The initiator's protocol state, sans-IO: which frames are outstanding under which
//! tags, the window, the retransmission timer, and the checks every answer must pass.
//!
//! No sockets, threads or clock here: callers pass `now` in and carry frames out, so
//! tests drive it with a virtual clock and fake targets (`session_tests.rs`), and the
//! driver (`engine.rs`) stays a thin loop around it. The call order is:
//!
//! 1. [`Session::submit`] a request (a read, write, flush or IDENTIFY as a [`Plan`]);
//! 2. [`Session::poll_transmits`] hands out frames while the window has room; the
//!    caller encodes and sends each [`Transmit`];
//! 3. [`Session::handle_frame`] for every frame received: an answer completes its
//!    frame (for reads it says which bytes to copy where), anything else is ignored;
//!    then `poll_transmits` again, to refill the window;
//! 4. [`Session::handle_timeout`] once [`Session::next_timeout`] has passed:
//!    retransmissions come out as transmits, requests that ran out of time finish
//!    with [`Fault::TimedOut`].
//!
//! Finished requests come out in [`Outputs::finished`], once each, with their result.
//! Frames of the session's own come out in [`Outputs::control`]: when a path's target
//! stops answering (a restart, a new MAC), config queries to find it again and an
//! IDENTIFY DEVICE to check that what answers is still the device opened (see
//! [`Purpose`]). The driver sends them as they are; their answers go to
//! `handle_frame` like any other.
//!
//! Fences ([`super::fence`]): after a write frame went out more than once, or failed
//! with copies outstanding, its sectors are fenced for [`FENCE_LIFETIME`]: a new
//! write that overlaps them waits (and the requests behind it with it) until the
//! fence lapses, by when a stale copy has arrived or is gone.
//!
//! Tags: the low [`SLOT_BITS`] bits are the index of the window slot a frame occupies,
//! the high bits a per-slot generation that advances with every transmission. An
//! answer is accepted when its slot holds a frame and its generation is one of that
//! frame's transmissions, so answers to a frame that already completed (duplicates,
//! late answers to retransmitted frames) are recognised and ignored, and the answer to
//! the latest transmission gives an unambiguous round-trip sample.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::discovery::{format_mac, query_frame};
use super::fence::Fences;
pub use super::fence::FENCE_LIFETIME;
use super::rtt::{RttEstimator, RTO_MAX, RTO_MIN};
use crate::identify::Identity;
use crate::wire::{
    ata, AtaArgs, Command, ConfigQuery, Header, MacAddr, ATA_HEADER_LEN, BROADCAST, MIN_FRAME_LEN,
    SECTOR_SIZE,
};

/// Tag bits that index the window slot.
pub const SLOT_BITS: u32 = 10;
/// Slots the tag layout allows.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// The slot whose tags the session keeps for its own frames (identity checks);
/// requests use the others.
pub const CONTROL_SLOT: usize = MAX_SLOTS - 1;
/// The largest window: every slot but [`CONTROL_SLOT`].
pub const MAX_WINDOW: usize = MAX_SLOTS - 1;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
const GEN_BITS: u32 = 32 - SLOT_BITS;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Largest sector count of a request with 28-bit addressing: LBAs end at 2^28.
pub const LBA28_LIMIT: u64 = 1 << 28;
/// Largest sector count with 48-bit addressing.
pub const LBA48_LIMIT: u64 = 1 << 48;

/// The tag of a transmission from `slot` in generation `generation`.
pub fn tag(generation: u32, slot: usize) -> u32 {
    ((generation & GEN_MASK) << SLOT_BITS) | (slot as u32 & SLOT_MASK)
}

/// A tag's generation and slot.
pub fn split_tag(tag: u32) -> (u32, usize) {
    (tag >> SLOT_BITS, (tag & SLOT_MASK) as usize)
}

/// Generations are compared modulo 2^GEN_BITS.
fn generation_distance(from: u32, to: u32) -> u32 {
    to.wrapping_sub(from) & GEN_MASK
}

/// The bit of transmission `generation` of a frame first sent as `first` (none past
/// the 64th).
fn generation_bit(first: u32, generation: u32) -> u64 {
    1u64.checked_shl(generation_distance(first, generation))
        .unwrap_or(0)
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
    Flush,
    /// ATA IDENTIFY DEVICE: one sector of data, like a read.
    Identify,
}

impl Kind {
    /// Whether answers carry sector data.
    pub fn reads(self) -> bool {
        matches!(self, Kind::Read | Kind::Identify)
    }
}

/// One request before it is split into frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub kind: Kind,
    /// First sector (reads and writes).
    pub lba: u64,
    /// Sectors to move (reads and writes; IDENTIFY moves one, flush none).
    pub sectors: u64,
}

/// Where one frame of a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpec {
    pub lba: u64,
    /// Sectors in this frame.
    pub sectors: u8,
    /// Byte offset of this frame's data in the request's buffer.
    pub offset: usize,
}

impl Plan {
    pub fn read(lba: u64, sectors: u64) -> Plan {
        Plan {
            kind: Kind::Read,
            lba,
            sectors,
        }
    }

    pub fn write(lba: u64, sectors: u64) -> Plan {
        Plan {
            kind: Kind::Write,
            lba,
            sectors,
        }
    }

    pub fn flush() -> Plan {
        Plan {
            kind: Kind::Flush,
            lba: 0,
            sectors: 0,
        }
    }

    pub fn identify() -> Plan {
        Plan {
            kind: Kind::Identify,
            lba: 0,
            sectors: 1,
        }
    }

    /// Frames this request needs with `per_frame` sectors per frame.
    pub fn frames(&self, per_frame: u8) -> u32 {
        match self.kind {
            Kind::Flush | Kind::Identify => 1,
            Kind::Read | Kind::Write => {
                let frames = self.sectors.div_ceil(u64::from(per_frame.max(1)));
                u32::try_from(frames).expect("requests are limited to 32 MiB")
            }
        }
    }

    /// The `index`-th frame.
    pub fn frame(&self, per_frame: u8, index: u32) -> FrameSpec {
        match self.kind {
            Kind::Flush => FrameSpec {
                lba: 0,
                sectors: 0,
                offset: 0,
            },
            Kind::Identify => FrameSpec {
                lba: 0,
                sectors: 1,
                offset: 0,
            },
            Kind::Read | Kind::Write => {
                let per_frame = u64::from(per_frame.max(1));
                let start = u64::from(index) * per_frame;
                FrameSpec {
                    lba: self.lba + start,
                    sectors: (self.sectors - start).min(per_frame) as u8,
                    offset: start as usize * SECTOR_SIZE,
                }
            }
        }
    }
}

/// The ATA arguments of a frame: READ/WRITE SECTORS (EXT with 48-bit addressing),
/// FLUSH CACHE (EXT when the target supports it), IDENTIFY DEVICE.
pub fn ata_args(kind: Kind, frame: FrameSpec, lba48: bool, flush_ext: bool) -> AtaArgs {
    let (cmd_status, extended, write) = match kind {
        Kind::Read if lba48 => (ata::READ_SECTORS_EXT, true, false),
        Kind::Read => (ata::READ_SECTORS, false, false),
        Kind::Write if lba48 => (ata::WRITE_SECTORS_EXT, true, true),
        Kind::Write => (ata::WRITE_SECTORS, false, true),
        Kind::Flush if flush_ext => (ata::FLUSH_CACHE_EXT, true, false),
        Kind::Flush => (ata::FLUSH_CACHE, false, false),
        Kind::Identify => (ata::IDENTIFY_DEVICE, false, false),
    };
    AtaArgs {
        extended,
        write,
        sector_count: frame.sectors,
        cmd_status,
        lba: frame.lba,
        ..AtaArgs::default()
    }
}

/// One way to the target: a local socket (interface) and the target's MAC on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathAddr {
    /// Index of the local socket the driver sends and receives on.
    pub socket: usize,
    /// Our MAC on that interface.
    pub local: MacAddr,
    /// The target's MAC as seen from that interface.
    pub target: MacAddr,
}

/// What a session is set up with.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub shelf: u16,
    pub slot: u8,
    /// At least one.
    pub paths: Vec<PathAddr>,
    /// Frames outstanding at once, 1 to [`MAX_WINDOW`].
    pub window: usize,
    /// Sectors per frame, at least 1.
    pub sectors_per_frame: u8,
    /// Use the 48-bit (EXT) commands.
    pub lba48: bool,
    /// Flush with FLUSH CACHE EXT (else FLUSH CACHE).
    pub flush_ext: bool,
    /// A frame unanswered this long fails its request, and when nothing at all has
    /// been answered for this long every request fails.
    pub timeout: Duration,
    /// A round-trip sample to start from (the discovery exchange).
    pub initial_rtt: Option<Duration>,
    /// First tag generation, so tags differ from an earlier session's.
    pub tag_seed: u32,
}

/// One frame to send: the driver encodes the header and arguments, then the request
/// buffer's `data` bytes (writes), and sends it on `paths[path].socket`.
#[derive(Debug, Clone)]
pub struct Transmit<R> {
    pub request: R,
    pub path: usize,
    pub socket: usize,
    pub header: Header,
    pub args: AtaArgs,
    /// Bytes of the request's buffer this frame carries (empty unless writing).
    pub data: Range<usize>,
    /// Whether this is a retransmission.
    pub retransmit: bool,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The target's ATA status had ERR (or DF) set; `error` is the error register.
    Ata { status: u8, error: u8 },
    /// The target set the AoE error flag with this code.
    Aoe { code: u8 },
    /// An answer matched the frame but could not be right.
    Malformed(String),
    /// A frame went unanswered for `waited` despite `retransmits` retransmissions,
    /// or (`silent`) the target answered nothing at all for that long.
    TimedOut {
        waited: Duration,
        retransmits: u32,
        silent: bool,
    },
    /// The session was closed.
    Closed,
    /// What answers for the target now is not the device opened (another size or
    /// serial number, or it cannot take our frames): every request fails, now and
    /// later, rather than reading or writing the wrong device.
    Changed(String),
}

/// A request that finished, with its result.
#[derive(Debug)]
pub struct Finished<R> {
    pub request: R,
    pub result: Result<(), Fault>,
}

/// Why the session sends a frame of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A Query Config Information broadcast for our shelf.slot on the path's
    /// interface: its target stopped answering, and may come back under another MAC
    /// (a restart on other hardware, a changed address).
    Rediscover,
    /// IDENTIFY DEVICE to a target found again (or answering again after an
    /// outage), to check it is still the device opened.
    Verify,
}

/// A frame of the session's own, no request's: send `frame` as it is on `socket`.
#[derive(Debug, Clone)]
pub struct Control {
    pub path: usize,
    pub socket: usize,
    pub purpose: Purpose,
    pub frame: Vec<u8>,
}

/// What a driver may want to tell its user.
///
/// A target that stops answering for a moment (a flush, writeback) is looked for
/// and checked like one that went away (`Rediscovering`, then `Rediscovered` or
/// `Verified`) — a few milliseconds of silence are enough to start that — but only
/// a silence of [`OUTAGE_AFTER`] is an outage worth telling the user about:
/// `Unreachable`, and `Reachable` once it is over. A driver logs those two, and
/// the others quietly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The path's target stopped answering: rediscovery starts.
    Rediscovering { path: usize, socket: usize },
    /// The path's target has answered nothing for `silent`, at least
    /// [`OUTAGE_AFTER`], while frames were outstanding: an outage, not a stall.
    /// Once per outage; [`Event::Reachable`] follows when it ends.
    Unreachable {
        path: usize,
        socket: usize,
        silent: Duration,
    },
    /// The target of a path that was [`Event::Unreachable`] answers again, at
    /// `target`, and passed the identity check (when there is an identity to check
    /// against); `after` the outage began.
    Reachable {
        path: usize,
        socket: usize,
        target: MacAddr,
        after: Duration,
    },
    /// The target was found again on the path, at `target` (`previous` before; the
    /// same when it came back at its old MAC) and passed the identity check; the
    /// path's frames go there now.
    Rediscovered {
        path: usize,
        socket: usize,
        previous: MacAddr,
        target: MacAddr,
    },
    /// The target answered again at its MAC after an outage and passed the identity
    /// check.
    Verified { path: usize, socket: usize },
}

impl Event {
    /// The local socket of the path the event is about.
    pub fn socket(&self) -> usize {
        match *self {
            Event::Rediscovering { socket, .. }
            | Event::Unreachable { socket, .. }
            | Event::Reachable { socket, .. }
            | Event::Rediscovered { socket, .. }
            | Event::Verified { socket, .. } => socket,
        }
    }

    /// What a driver logs for the event, and how loud: `target` is `eSHELF.SLOT`,
    /// `interface` the path's local interface. Only an outage and its end, and a
    /// target found at another MAC, are above DEBUG.
    pub fn message(&self, target: &str, interface: &str) -> (tracing::Level, String) {
        match *self {
            Event::Rediscovering { .. } => (
                tracing::Level::DEBUG,
                format!("AoE {target}: no answer on {interface}; looking for the target again"),
            ),
            Event::Unreachable { silent, .. } => (
                tracing::Level::WARN,
                format!(
                    "AoE {target}: the target does not answer on {interface} (nothing for {:.1} s); still trying",
                    silent.as_secs_f64()
                ),
            ),
            Event::Reachable {
                target: mac, after, ..
            } => (
                tracing::Level::INFO,
                format!(
                    "AoE {target}: the target answers again at {} on {interface} after {:.1} s",
                    format_mac(&mac),
                    after.as_secs_f64()
                ),
            ),
            Event::Rediscovered {
                previous,
                target: mac,
                ..
            } if previous == mac => (
                tracing::Level::DEBUG,
                format!(
                    "AoE {target}: found the target at {} on {interface} again; identity checked",
                    format_mac(&mac)
                ),
            ),
            Event::Rediscovered {
                previous,
                target: mac,
                ..
            } => (
                tracing::Level::WARN,
                format!(
                    "AoE {target}: the target moved from {} to {} on {interface}",
                    format_mac(&previous),
                    format_mac(&mac)
                ),
            ),
            Event::Verified { .. } => (
                tracing::Level::DEBUG,
                format!(
                    "AoE {target}: the target answers on {interface} again; identity checked"
                ),
            ),
        }
    }
}

/// What the session produced in one call: frames to send, finished requests, frames
/// of its own and events.
#[derive(Debug)]
pub struct Outputs<R> {
    pub transmits: Vec<Transmit<R>>,
    pub finished: Vec<Finished<R>>,
    pub control: Vec<Control>,
    pub events: Vec<Event>,
}

impl<R> Default for Outputs<R> {
    fn default() -> Self {
        Outputs {
            transmits: Vec::new(),
            finished: Vec::new(),
            control: Vec::new(),
            events: Vec::new(),
        }
    }
}

impl<R> Outputs<R> {
    pub fn is_empty(&self) -> bool {
        self.transmits.is_empty()
            && self.finished.is_empty()
            && self.control.is_empty()
            && self.events.is_empty()
    }

    pub fn clear(&mut self) {
        self.transmits.clear();
        self.finished.clear();
        self.control.clear();
        self.events.clear();
    }
}

/// Why a received frame was not taken as an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignore {
    /// Not an AoE frame, or shorter than its header.
    NotAoe,
    /// A request (the R flag is clear), e.g. another initiator's.
    NotResponse,
    /// An answer to another command: a config answer no path is looking for (a
    /// late answer to the discovery that opened the device, another target's).
    OtherCommand,
    /// The tag names no outstanding transmission: a duplicate or late answer.
    UnknownTag,
    /// Not from the target's MAC to ours on that interface.
    WrongPath,
    /// From another shelf.slot.
    WrongTarget,
}

/// What a received frame was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled<R> {
    Ignored(Ignore),
    /// An answer completed (or failed) a frame that moves no data to the caller.
    Answered,
    /// A read answer: copy `frame[data]` to the request's buffer at `offset`.
    Read {
        request: R,
        offset: usize,
        data: Range<usize>,
    },
    /// An answer to one of the session's own frames (a config query or an identity
    /// check).
    Control,
}

/// Counters for diagnostics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames handed out, retransmissions included.
    pub transmits: u64,
    pub retransmits: u64,
    /// Retransmissions while the target answered nothing (probes of a stalled or
    /// gone target); the rest were frames deemed lost while others were answered.
    pub probes: u64,
    /// Retransmissions that proved needless: the earlier transmission was answered.
    pub needless: u64,
    /// Answers accepted.
    pub answers: u64,
    /// Frames ignored.
    pub ignored: u64,
    /// Requests failed by a timeout.
    pub timeouts: u64,
    /// Config queries broadcast to find a target that stopped answering.
    pub rediscoveries: u64,
    /// Identity checks passed by a target found again (at a new MAC or its old one),
    /// after a stall as after an outage.
    pub recoveries: u64,
    /// Outages: a path's target silent for [`OUTAGE_AFTER`] ([`Event::Unreachable`]).
    pub outages: u64,
    /// Write frames whose sectors were fenced (sent more than once, or failed with
    /// copies outstanding).
    pub fences: u64,
    /// Times a new write waited for a fence to lapse.
    pub fenced_waits: u64,
}

struct RequestState<R> {
    handle: R,
    plan: Plan,
    frames: u32,
    issued: u32,
    done: u32,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    request: u32,
    index: u32,
    first_generation: u32,
    first_sent: Instant,
    sent_at: Instant,
    /// Order of the latest transmission among all transmissions.
    sent_seq: u64,
    /// Order of the first transmission: the oldest frame is probed first.
    first_seq: u64,
    /// The last retransmission was because frames sent after it were answered.
    reordered: bool,
    deadline: Instant,
    retries: u32,
    path: usize,
}

/// What one path has been doing.
#[derive(Debug, Clone, Copy, Default)]
struct PathState {
    /// Timeouts since its last answer; with [`PATH_FAILURES`] or more the path is
    /// avoided for new frames (but probed now and then).
    failures: u32,
    /// When it last carried an answer.
    last_answer: Option<Instant>,
    /// The order of the latest transmission answered on it: targets answer a path's
    /// frames in order, so frames sent after that one are queued, not lost.
    newest_answered_seq: u64,
    /// When the last config query for its target went out, while the path is
    /// rediscovering (after [`REDISCOVER_AFTER`] timeouts in a row).
    rediscovering: Option<Instant>,
    /// Its target was found again at its MAC and sent one probe: once that is
    /// answered, the frames sent before it are lost (targets answer a path's frames
    /// in order) and go again at once, not when their hold runs out.
    release_held: bool,
    /// Since when nothing has answered on it, while it has failures: the later of
    /// its last answer and the transmission whose timeout was the first failure.
    unanswered_since: Option<Instant>,
    /// Set when an outage was reported ([`Event::Unreachable`]), to when it began;
    /// taken when [`Event::Reachable`] reports its end.
    outage: Option<Instant>,
}

/// An IDENTIFY DEVICE sent to `mac` on `path`, to check it is the device opened.
#[derive(Debug, Clone, Copy)]
struct Check {
    path: usize,
    mac: MacAddr,
    /// Whether the path's frames wait for it: a target found by rediscovery is only
    /// used once it passed. Otherwise the path's target answered again by itself and
    /// is checked as it goes on.
    gate: bool,
    started: Instant,
    sent_at: Instant,
    /// Generations of the control slot its transmissions had.
    first_generation: u32,
    last_generation: u32,
}

/// What a late answer to a completed, retransmitted frame needs.
#[derive(Debug, Clone, Copy)]
struct Retransmitted {
    first_generation: u32,
    last_generation: u32,
    first_sent: Instant,
    reordered: bool,
    /// The frame's transmissions answered so far, one bit per generation from the
    /// first: once every one is, no copy is left on the way and the frame's fence
    /// (if it has one) is lifted.
    answered: u64,
    /// A late answer already showed the retransmission needless (counted once).
    needless_seen: bool,
}

impl Retransmitted {
    /// How many times the frame went out.
    fn transmissions(&self) -> u32 {
        generation_distance(self.first_generation, self.last_generation) + 1
    }

    /// Whether every transmission has been answered.
    fn all_answered(&self) -> bool {
        let n = self.transmissions();
        n <= MAX_TRACKED_TRANSMISSIONS && self.answered == (u64::MAX >> (64 - n))
    }
}

/// Transmissions of one frame whose answers are told apart; a frame sent more often
/// keeps its fence until it lapses.
const MAX_TRACKED_TRANSMISSIONS: u32 = 64;

#[derive(Debug, Clone, Copy)]
struct Slot {
    generation: u32,
    frame: Option<InFlight>,
    /// The last frame completed here after retransmissions. A late answer to one of
    /// its earlier transmissions shows the retransmission was needless.
    retransmitted: Option<Retransmitted>,
}

/// The initiator's state for one target; see the module documentation.
pub struct Session<R> {
    config: SessionConfig,
    slots: Vec<Slot>,
    free: Vec<usize>,
    requests: Vec<Option<RequestState<R>>>,
    free_requests: Vec<u32>,
    /// Requests with frames not yet handed out, oldest first.
    queue: VecDeque<u32>,
    in_flight: usize,
    rtt: RttEstimator,
    /// Congestion window (frames): halved when a frame times out, grown by one per
    /// window of answers, never above the target's buffer count.
    cwnd: f64,
    /// The window before the last halving, restored when that proves needless.
    cwnd_before_loss: f64,
    /// How long past its timer a frame may still be answered after frames sent
    /// later were: 0 until the target is seen to reorder, then grown each time a
    /// retransmission proves needless, halved after [`REORDER_DECAY`] answers without.
    reorder_window: Duration,
    answers_since_needless: u32,
    /// No further halving before this time (once per round trip).
    recover_until: Option<Instant>,
    next_path: usize,
    /// What each path has been doing.
    path_state: Vec<PathState>,
    /// When a new frame last went to an avoided path, to see whether it recovered.
    last_probe: Option<Instant>,
    /// Since when frames have been outstanding without any answer.
    waiting_since: Option<Instant>,
    next_deadline: Option<Instant>,
    /// Transmissions so far (their order).
    seq: u64,
    closed: bool,
    /// Set when the target turned out not to be the device opened: every request
    /// fails with it.
    broken: Option<Fault>,
    /// What IDENTIFY DEVICE said when the device was opened, to check a target
    /// found again against.
    expected: Option<Identity>,
    /// Identity checks under way.
    checks: Vec<Check>,
    /// Generation of the control slot's latest transmission.
    control_generation: u32,
    /// Sectors new writes keep off for now; see the module documentation.
    fences: Fences,
    stats: Stats,
}

impl<R: Clone> Session<R> {
    pub fn new(config: SessionConfig) -> Session<R> {
        assert!(!config.paths.is_empty(), "a session needs a path");
        let window = config.window.clamp(1, MAX_WINDOW);
        let slots = vec![
            Slot {
                generation: config.tag_seed & GEN_MASK,
                frame: None,
                retransmitted: None,
            };
            window
        ];
        let paths = config.paths.len();
        let mut rtt = RttEstimator::new();
        if let Some(sample) = config.initial_rtt {
            rtt.sample(sample);
        }
        Session {
            config: SessionConfig {
                window,
                sectors_per_frame: config.sectors_per_frame.max(1),
                ..config
            },
            free: (0..window).rev().collect(),
            slots,
            requests: Vec::new(),
            free_requests: Vec::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            rtt,
            cwnd: window as f64,
            cwnd_before_loss: window as f64,
            reorder_window: Duration::ZERO,
            answers_since_needless: 0,
            recover_until: None,
            next_path: 0,
            path_state: vec![PathState::default(); paths],
            last_probe: None,
            waiting_since: None,
            next_deadline: None,
            seq: 0,
            closed: false,
            broken: None,
            expected: None,
            checks: Vec::new(),
            control_generation: config.tag_seed & GEN_MASK,
            fences: Fences::default(),
            stats: Stats::default(),
        }
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Frames outstanding.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Requests not yet finished.
    pub fn requests(&self) -> usize {
        self.requests.len() - self.free_requests.len()
    }

    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    /// How long past its timer a frame may still be answered out of order.
    pub fn reorder_window(&self) -> Duration {
        self.reorder_window
    }

    /// The congestion window, in frames.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Switches between 28- and 48-bit commands and the two flushes (once IDENTIFY
    /// told what the target supports); applies to frames handed out from now on.
    pub fn set_addressing(&mut self, lba48: bool, flush_ext: bool) {
        self.config.lba48 = lba48;
        self.config.flush_ext = flush_ext;
    }

    /// What a target found again must match: what IDENTIFY DEVICE said when the
    /// device was opened (capacity and serial number are compared). Without it,
    /// any answer passes.
    pub fn set_identity(&mut self, identity: Identity) {
        self.expected = Some(identity);
    }

    /// The target's MAC on each path (they change when it is rediscovered).
    pub fn paths(&self) -> &[PathAddr] {
        &self.config.paths
    }

    /// Queues a request. A closed session finishes it at once with [`Fault::Closed`],
    /// one whose target changed with [`Fault::Changed`].
    pub fn submit(&mut self, request: R, plan: Plan, out: &mut Outputs<R>) {
        if self.closed || self.broken.is_some() {
            let fault = self.broken.clone().unwrap_or(Fault::Closed);
            out.finished.push(Finished {
                request,
                result: Err(fault),
            });
            return;
        }
        let frames = plan.frames(self.config.sectors_per_frame);
        let state = RequestState {
            handle: request,
            plan,
            frames,
            issued: 0,
            done: 0,
        };
        let key = match self.free_requests.pop() {
            Some(key) => {
                self.requests[key as usize] = Some(state);
                key
            }
            None => {
                self.requests.push(Some(state));
                (self.requests.len() - 1) as u32
            }
        };
        self.queue.push_back(key);
    }

    /// Frames the window may hold now.
    fn limit(&self) -> usize {
        (self.cwnd as usize).clamp(1, self.slots.len())
    }

    /// Hands out frames of queued requests, oldest request first, while the window
    /// has room.
    pub fn poll_transmits(&mut self, now: Instant, out: &mut Outputs<R>) {
        self.poll_transmits_up_to(now, out, usize::MAX);
    }

    /// Like [`poll_transmits`](Self::poll_transmits), but hands out at most `max`
    /// frames; returns how many. A driver that sends a large window in chunks, each
    /// polled just before it is sent, keeps the send times it reports honest.
    pub fn poll_transmits_up_to(
        &mut self,
        now: Instant,
        out: &mut Outputs<R>,
        max: usize,
    ) -> usize {
        let mut handed = 0;
        while let Some(&key) = self.queue.front() {
            if self.in_flight >= self.limit() || handed == max {
                break;
            }
            if let Some(until) = self.fenced(key, now) {
                // Held, with everything behind it, until the fence lapses: the
                // timer brings the driver back then.
                self.note_deadline(until);
                break;
            }
            let Some(slot) = self.free.pop() else {
                break;
            };
            handed += 1;
            let state = self.requests[key as usize]
                .as_mut()
                .expect("queued requests exist");
            let index = state.issued;
            state.issued += 1;
            if state.issued == state.frames {
                self.queue.pop_front();
            }
            let generation = (self.slots[slot].generation + 1) & GEN_MASK;
            self.slots[slot].generation = generation;
            let path = self.pick_path(now);
            let deadline = now + self.rtt.backoff(0);
            self.slots[slot].frame = Some(InFlight {
                request: key,
                index,
                first_generation: generation,
                first_sent: now,
                sent_at: now,
                sent_seq: self.seq + 1,
                first_seq: self.next_seq(),
                deadline,
                retries: 0,
                reordered: false,
                path,
            });
            self.in_flight += 1;
            self.waiting_since.get_or_insert(now);
            self.note_deadline(deadline);
            self.note_deadline(now + self.config.timeout);
            out.transmits.push(self.transmit(slot, false));
        }
        handed
    }

    /// When the next frame of request `key` may go, if it is a write onto fenced
    /// sectors.
    fn fenced(&mut self, key: u32, now: Instant) -> Option<Instant> {
        let state = self.requests[key as usize].as_ref()?;
        if state.plan.kind != Kind::Write {
            return None;
        }
        let spec = state
            .plan
            .frame(self.config.sectors_per_frame, state.issued);
        let until = self
            .fences
            .blocking(&(spec.lba..spec.lba + u64::from(spec.sectors)), now)?;
        self.stats.fenced_waits += 1;
        Some(until)
    }

    /// Fences the sectors of write frame `index` of `plan` from `now` on; `owner`
    /// (its slot and first generation) lets the answers to all its copies lift it.
    fn fence(&mut self, plan: Plan, index: u32, now: Instant, owner: Option<(usize, u32)>) {
        if plan.kind != Kind::Write {
            return;
        }
        let spec = plan.frame(self.config.sectors_per_frame, index);
        self.stats.fences += 1;
        self.fences
            .add(spec.lba..spec.lba + u64::from(spec.sectors), now, owner);
    }

    /// An answer to a transmission of the frame that last completed in `slot`
    /// after retransmissions: the first such answer to an earlier transmission
    /// shows a retransmission was needless; once every copy is answered, none is
    /// left on the way and the frame's fence goes.
    fn late_answer(&mut self, slot: usize, generation: u32, now: Instant) {
        let Some(mut done) = self.slots[slot].retransmitted else {
            return;
        };
        let first = done.first_generation;
        let offset = generation_distance(first, generation);
        if offset >= done.transmissions() {
            return;
        }
        if offset < done.transmissions() - 1 && !done.needless_seen {
            done.needless_seen = true;
            let sample = (generation == first).then(|| now - done.first_sent);
            self.needless_retransmission(done.reordered, sample);
        }
        done.answered |= generation_bit(first, generation);
        if done.all_answered() {
            self.fences.lift((slot, first));
            self.slots[slot].retransmitted = None;
        } else {
            self.slots[slot].retransmitted = Some(done);
        }
    }

    fn healthy(&self, path: usize) -> bool {
        self.path_state[path].failures < PATH_FAILURES
    }

    /// The path for a new frame: round-robin over healthy paths; once per
    /// [`PROBE_INTERVAL`], or when none is healthy, plain round-robin, so a path that
    /// recovers is noticed.
    fn pick_path(&mut self, now: Instant) -> usize {
        let count = self.config.paths.len();
        let start = self.next_path;
        let mut path = (0..count)
            .map(|i| (start + i) % count)
            .find(|&p| self.healthy(p))
            .unwrap_or(start);
        if path != start && self.last_probe.is_none_or(|at| now >= at + PROBE_INTERVAL) {
            self.last_probe = Some(now);
            path = start;
        }
        self.next_path = (path + 1) % count;
        path
    }

    /// The path for a retransmission: the next healthy one after `path`, else the
    /// next one.
    fn other_path(&self, path: usize) -> usize {
        let count = self.config.paths.len();
        (1..=count)
            .map(|i| (path + i) % count)
            .find(|&p| self.healthy(p))
            .unwrap_or((path + 1) % count)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Tells the session that the frames with these tags went out at `now` (after
    /// `sendmmsg` returned): their timers and their place in the send order start
    /// here rather than when they were handed out, which matters when the sending
    /// thread was delayed in between, or two threads sent at once. Frames already
    /// answered (or sent again since) are skipped. Optional: without it, frames
    /// count as sent when handed out.
    pub fn sent(&mut self, now: Instant, tags: &[u32]) {
        for &tag in tags {
            let (generation, slot) = split_tag(tag);
            let Some(entry) = self.slots.get_mut(slot) else {
                continue;
            };
            let Some(frame) = entry.frame.as_mut() else {
                continue;
            };
            if entry.generation != generation & GEN_MASK {
                continue;
            }
            self.seq += 1;
            frame.sent_seq = self.seq;
            if frame.retries == 0 {
                frame.first_sent = now;
                frame.first_seq = self.seq;
            }
            frame.sent_at = now;
            frame.deadline = now + self.rtt.backoff(frame.retries);
        }
    }

    fn note_deadline(&mut self, deadline: Instant) {
        if self.next_deadline.is_none_or(|next| deadline < next) {
            self.next_deadline = Some(deadline);
        }
    }

    /// The frame in `slot`, as its current transmission.
    fn transmit(&mut self, slot: usize, retransmit: bool) -> Transmit<R> {
        let frame = self.slots[slot].frame.expect("slot holds a frame");
        let state = self.requests[frame.request as usize]
            .as_ref()
            .expect("frames belong to live requests");
        let spec = state.plan.frame(self.config.sectors_per_frame, frame.index);
        let path = self.config.paths[frame.path];
        let header = Header::request(
            path.target,
            path.local,
            self.config.shelf,
            self.config.slot,
            Command::Ata,
            tag(self.slots[slot].generation, slot),
        );
        let args = ata_args(
            state.plan.kind,
            spec,
            self.config.lba48,
            self.config.flush_ext,
        );
        let data = match state.plan.kind {
            Kind::Write => spec.offset..spec.offset + usize::from(spec.sectors) * SECTOR_SIZE,
            _ => 0..0,
        };
        self.stats.transmits += 1;
        if retransmit {
            self.stats.retransmits += 1;
        }
        Transmit {
            request: state.handle.clone(),
            path: frame.path,
            socket: path.socket,
            header,
            args,
            data,
            retransmit,
        }
    }

    /// Takes a frame received on local socket `socket`.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        socket: usize,
        frame: &[u8],
        out: &mut Outputs<R>,
    ) -> Handled<R> {
        let handled = self.check_frame(now, socket, frame, out);
        if let Handled::Ignored(_) = handled {
            self.stats.ignored += 1;
        }
        handled
    }

    fn check_frame(
        &mut self,
        now: Instant,
        socket: usize,
        frame: &[u8],
        out: &mut Outputs<R>,
    ) -> Handled<R> {
        let Ok((header, body)) = Header::parse(frame) else {
            return Handled::Ignored(Ignore::NotAoe);
        };
        if !header.response {
            return Handled::Ignored(Ignore::NotResponse);
        }
        if header.command == Command::QueryConfig as u8 {
            return self.handle_config(now, socket, &header, body, out);
        }
        if header.command != Command::Ata as u8 {
            return Handled::Ignored(Ignore::OtherCommand);
        }
        let (generation, slot) = split_tag(header.tag);
        if slot == CONTROL_SLOT {
            return self.handle_check(now, socket, &header, body, generation, out);
        }
        let Some(entry) = self.slots.get(slot) else {
            return Handled::Ignored(Ignore::UnknownTag);
        };
        let current = entry.generation;
        let inflight = entry.frame.filter(|f| {
            generation_distance(f.first_generation, generation)
                <= generation_distance(f.first_generation, current)
        });
        let Some(inflight) = inflight else {
            if entry.retransmitted.is_some() {
                self.late_answer(slot, generation, now);
            }
            return Handled::Ignored(Ignore::UnknownTag);
        };
        let Some(path) =
            self.config.paths.iter().position(|p| {
                p.socket == socket && p.target == header.src && p.local == header.dst
            })
        else {
            return Handled::Ignored(Ignore::WrongPath);
        };
        if header.shelf != self.config.shelf || header.slot != self.config.slot {
            return Handled::Ignored(Ignore::WrongTarget);
        }

        // The answer is ours: from here on it completes or fails its frame.
        self.stats.answers += 1;
        self.path_state[path].failures = 0;
        self.path_state[path].unanswered_since = None;
        self.path_state[path].last_answer = Some(now);
        if self.path_state[path].rediscovering.take().is_some() {
            // Back after an outage at the same MAC: perhaps a restarted target, perhaps
            // on another file. It is used already (its answers are here); check it
            // at once, and fail everything if it is not the device opened.
            let target = self.config.paths[path].target;
            self.checks.retain(|c| c.path != path);
            self.start_check(now, path, target, false, out);
        }
        if !self.checks.iter().any(|c| c.path == path) {
            // No check to wait for (no identity to compare, or it gave up): an
            // outage ends with this answer.
            self.outage_over(now, path, out);
        }
        self.waiting_since = Some(now);
        let key = inflight.request;
        if header.error != 0 {
            self.fail(key, Fault::Aoe { code: header.error }, Some(now), out);
            return Handled::Answered;
        }
        let state = self.requests[key as usize]
            .as_ref()
            .expect("frames belong to live requests");
        let kind = state.plan.kind;
        let spec = state
            .plan
            .frame(self.config.sectors_per_frame, inflight.index);
        let args = match AtaArgs::parse(body) {
            Ok((args, _)) => args,
            Err(_) => {
                let fault = Fault::Malformed(format!(
                    "an ATA answer of {} bytes, shorter than its {ATA_HEADER_LEN}-byte header",
                    frame.len()
                ));
                self.fail(key, fault, Some(now), out);
                return Handled::Answered;
            }
        };
        if args.cmd_status & (ata::STATUS_ERR | STATUS_DF) != 0 {
            let fault = Fault::Ata {
                status: args.cmd_status,
                error: args.err_feature,
            };
            self.fail(key, fault, Some(now), out);
            return Handled::Answered;
        }
        // Targets either echo the count or, like an ATA device, count it down to zero.
        if args.sector_count != 0 && args.sector_count != spec.sectors {
            let fault = Fault::Malformed(format!(
                "the answer reports {} sectors for a frame of {}",
                args.sector_count, spec.sectors
            ));
            self.fail(key, fault, Some(now), out);
            return Handled::Answered;
        }
        let data_len = usize::from(spec.sectors) * SECTOR_SIZE;
        let data = ATA_HEADER_LEN..ATA_HEADER_LEN + data_len;
        if kind.reads() && frame.len() < data.end {
            let fault = Fault::Malformed(format!(
                "a read answer carries {} bytes of data, expected {data_len}",
                frame.len() - ATA_HEADER_LEN
            ));
            self.fail(key, fault, Some(now), out);
            return Handled::Answered;
        }

        // Success.
        if generation != current {
            let sample = (generation == inflight.first_generation)
                .then(|| now.saturating_duration_since(inflight.first_sent));
            self.needless_retransmission(inflight.reordered, sample);
        } else {
            self.answers_since_needless += 1;
            if self.answers_since_needless >= REORDER_DECAY {
                self.reorder_window /= 2;
                self.answers_since_needless = 0;
            }
        }
        if generation == current {
            self.rtt
                .sample(now.saturating_duration_since(inflight.sent_at));
            let state = &mut self.path_state[path];
            state.newest_answered_seq = state.newest_answered_seq.max(inflight.sent_seq);
            if std::mem::take(&mut state.release_held) {
                self.release_held(now, path, inflight.sent_seq);
            }
        }
        if inflight.retries > 0 {
            // Another copy of this frame may still be on its way: fenced until it
            // lapses, or until the answers to every copy are in.
            let plan = self.requests[key as usize]
                .as_ref()
                .expect("frames belong to live requests")
                .plan;
            self.fence(
                plan,
                inflight.index,
                now,
                Some((slot, inflight.first_generation)),
            );
        }
        self.cwnd = (self.cwnd + 1.0 / self.cwnd).min(self.slots.len() as f64);
        self.slots[slot].retransmitted = (inflight.retries > 0).then(|| Retransmitted {
            first_generation: inflight.first_generation,
            last_generation: current,
            first_sent: inflight.first_sent,
            reordered: inflight.reordered,
            answered: generation_bit(inflight.first_generation, generation),
            // An earlier copy answered first: counted as needless above.
            needless_seen: generation != current,
        });
        self.release_slot(slot);
        let state = self.requests[key as usize]
            .as_mut()
            .expect("frames belong to live requests");
        state.done += 1;
        let handled = if kind.reads() {
            Handled::Read {
                request: state.handle.clone(),
                offset: spec.offset,
                data,
            }
        } else {
            Handled::Answered
        };
        if state.done == state.frames {
            let state = self.remove_request(key);
            out.finished.push(Finished {
                request: state.handle,
                result: Ok(()),
            });
        }
        handled
    }

    /// An earlier transmission of a retransmitted frame was answered after all: undo
    /// the window's halving, learn the round trip of the first transmission when it
    /// was that one (its tag tells; this is how the timer learns about slow
    /// answers), and if the retransmission was for reordering, tolerate more.
    fn needless_retransmission(&mut self, reordered: bool, first_rtt: Option<Duration>) {
        self.stats.needless += 1;
        self.cwnd = self.cwnd.max(self.cwnd_before_loss);
        if let Some(rtt) = first_rtt {
            self.rtt.sample(rtt);
        }
        if reordered {
            let step = (self.rtt.srtt().unwrap_or(RTO_MIN) / 4).max(RTO_MIN / 4);
            self.reorder_window = (self.reorder_window * 2).max(step).min(RTO_MAX);
            self.answers_since_needless = 0;
        }
    }

    fn release_slot(&mut self, slot: usize) {
        if self.slots[slot].frame.take().is_some() {
            self.free.push(slot);
            self.in_flight -= 1;
            if self.in_flight == 0 {
                self.waiting_since = None;
            }
        }
    }

    fn remove_request(&mut self, key: u32) -> RequestState<R> {
        let state = self.requests[key as usize].take().expect("request is live");
        self.free_requests.push(key);
        state
    }

    /// Fails a request: its outstanding frames are forgotten (their answers will be
    /// ignored), its unsent frames dropped. With `now`, the sectors of its write
    /// frames still outstanding are fenced: their copies may yet land. (Without,
    /// the session is closing and takes no more writes.)
    fn fail(&mut self, key: u32, fault: Fault, now: Option<Instant>, out: &mut Outputs<R>) {
        let Some(state) = self.requests[key as usize].as_ref() else {
            return;
        };
        let plan = state.plan;
        if state.issued < state.frames {
            self.queue.retain(|&queued| queued != key);
        }
        for slot in 0..self.slots.len() {
            let Some(frame) = self.slots[slot].frame.filter(|f| f.request == key) else {
                continue;
            };
            if let Some(now) = now {
                self.fence(plan, frame.index, now, None);
            }
            self.release_slot(slot);
        }
        let state = self.remove_request(key);
        out.finished.push(Finished {
            request: state.handle,
            result: Err(fault),
        });
    }

    /// When [`handle_timeout`](Self::handle_timeout) has something to do next (it
    /// may be called earlier or more often; it checks).
    pub fn next_timeout(&self) -> Option<Instant> {
        self.next_deadline
    }

    /// Retransmits frames whose timer ran out (on the next path, with a new tag and
    /// a doubled timeout) and fails requests that ran out of time.
    pub fn handle_timeout(&mut self, now: Instant, out: &mut Outputs<R>) {
        match self.next_deadline {
            Some(due) if now >= due => {}
            _ => return,
        }
        self.next_deadline = None;
        let timeout = self.config.timeout;
        if let Some(since) = self.waiting_since {
            if now.saturating_duration_since(since) >= timeout {
                // Nothing at all answered for the whole timeout: the target is gone,
                // and every request fails now rather than one timeout after another.
                let retransmits = self
                    .slots
                    .iter()
                    .filter_map(|s| s.frame.map(|f| f.retries))
                    .max()
                    .unwrap_or(0);
                let fault = Fault::TimedOut {
                    waited: now.saturating_duration_since(since),
                    retransmits,
                    silent: true,
                };
                self.fail_all(fault, Some(now), out);
                return;
            }
            self.note_deadline(since + timeout);
        }
        let rto = self.rtt.rto();
        let answering = |state: &PathState| state.last_answer.filter(|at| now < *at + rto);
        let target_answering = self.path_state.iter().any(|p| answering(p).is_some());
        // A path that answers nothing (a stalled or busy target, a dead link): sending
        // its whole share again only piles duplicates on it. As TCP after a timeout,
        // send only its oldest frame again, as a probe (on the next path), and hold
        // the others until the probe's timer runs out. Once it failed
        // [`PATH_FAILURES`] probes in a row while another path answers, it is dead:
        // everything moves over.
        let mut probes: Vec<Option<(u64, usize)>> = vec![None; self.config.paths.len()];
        for (slot, entry) in self.slots.iter().enumerate() {
            let due = |f: &InFlight| {
                now >= f.deadline
                    && now.saturating_duration_since(f.first_sent) < timeout
                    && answering(&self.path_state[f.path]).is_none()
            };
            if let Some(frame) = entry.frame.filter(due) {
                let probe = &mut probes[frame.path];
                if probe.is_none_or(|(first_seq, _)| frame.first_seq < first_seq) {
                    *probe = Some((frame.first_seq, slot));
                }
            }
        }
        let held_until: Vec<Option<Instant>> = probes
            .iter()
            .map(|probe| {
                probe.map(|(_, slot)| {
                    let retries = self.slots[slot].frame.map_or(0, |f| f.retries);
                    now + self.rtt.backoff(retries + 1)
                })
            })
            .collect();
        let mut expired = Vec::new();
        for slot in 0..self.slots.len() {
            let Some(mut frame) = self.slots[slot].frame else {
                continue;
            };
            if now.saturating_duration_since(frame.first_sent) >= timeout {
                expired.push((frame.request, frame.first_sent, frame.retries));
                continue;
            }
            let on_path = self.path_state[frame.path];
            let due = now >= frame.deadline;
            if let Some(answered_at) = answering(&on_path) {
                if due && frame.sent_seq > on_path.newest_answered_seq {
                    // The target is still answering frames sent on this path before
                    // this one: it is queued, not lost. Restart its timer from the last
                    // answer, as TCP restarts its timer when an acknowledgement
                    // arrives.
                    frame.deadline = answered_at + rto;
                    self.slots[slot].frame = Some(frame);
                } else if due {
                    // Frames sent after it were answered: lost, unless the target
                    // is known to reorder this much.
                    let lost_at =
                        frame.sent_at + self.rtt.backoff(frame.retries) + self.reorder_window;
                    if now >= lost_at {
                        frame = self.retransmit(now, slot, true, out);
                    } else {
                        frame.deadline = lost_at;
                        self.slots[slot].frame = Some(frame);
                    }
                }
            } else if due && target_answering && !self.healthy(frame.path) {
                // A dead path while another answers: move the frame over.
                frame = self.retransmit(now, slot, false, out);
            } else if due && probes[frame.path].is_some_and(|p| p.1 == slot) {
                self.stats.probes += 1;
                frame = self.retransmit(now, slot, false, out);
            } else if let Some(until) = held_until[frame.path].filter(|_| due) {
                // Held behind its path's probe.
                frame.deadline = until;
                self.slots[slot].frame = Some(frame);
            }
            self.note_deadline(frame.deadline);
            self.note_deadline(frame.first_sent + timeout);
        }
        for (key, first_sent, retries) in expired {
            if self.requests[key as usize].is_some() {
                self.stats.timeouts += 1;
                let fault = Fault::TimedOut {
                    waited: now.saturating_duration_since(first_sent),
                    retransmits: retries,
                    silent: false,
                };
                self.fail(key, fault, Some(now), out);
            }
        }
        // A write held by a fence goes when the fence lapses: wake up then.
        if let Some(until) = self.fences.next_lapse(now) {
            self.note_deadline(until);
        }
        self.rediscover(now, out);
        self.run_checks(now, out);
    }

    /// Broadcasts a config query for our shelf.slot on each path that has gone
    /// [`REDISCOVER_AFTER`] timeouts without an answer, again every
    /// [`REDISCOVER_INTERVAL`] while it stays so and frames are outstanding. The
    /// data frames keep being probed meanwhile: a target back at its old MAC takes
    /// them as they come.
    fn rediscover(&mut self, now: Instant, out: &mut Outputs<R>) {
        if self.in_flight == 0 {
            return;
        }
        for path in 0..self.config.paths.len() {
            let state = self.path_state[path];
            if state.failures < REDISCOVER_AFTER {
                continue;
            }
            let addr = self.config.paths[path];
            if state
                .rediscovering
                .is_none_or(|at| now >= at + REDISCOVER_INTERVAL)
            {
                if state.rediscovering.is_none() {
                    out.events.push(Event::Rediscovering {
                        path,
                        socket: addr.socket,
                    });
                }
                self.path_state[path].rediscovering = Some(now);
                self.stats.rediscoveries += 1;
                // The tag does not matter: answers are matched by command and address.
                let tag = tag(self.control_generation, CONTROL_SLOT);
                out.control.push(Control {
                    path,
                    socket: addr.socket,
                    purpose: Purpose::Rediscover,
                    frame: query_frame(addr.local, self.config.shelf, self.config.slot, tag),
                });
            }
            let last = self.path_state[path].rediscovering.unwrap_or(now);
            self.note_deadline(last + REDISCOVER_INTERVAL);
            let state = self.path_state[path];
            if let Some(since) = state.unanswered_since.filter(|_| state.outage.is_none()) {
                let silent = now.saturating_duration_since(since);
                if silent >= OUTAGE_AFTER {
                    self.path_state[path].outage = Some(since);
                    self.stats.outages += 1;
                    out.events.push(Event::Unreachable {
                        path,
                        socket: addr.socket,
                        silent,
                    });
                } else {
                    self.note_deadline(since + OUTAGE_AFTER);
                }
            }
        }
    }

    /// A config answer: on a path that lost its target, a target answering for our
    /// shelf.slot is checked (IDENTIFY DEVICE) and, if it is the device opened, the
    /// path's frames go to it.
    fn handle_config(
        &mut self,
        now: Instant,
        socket: usize,
        header: &Header,
        body: &[u8],
        out: &mut Outputs<R>,
    ) -> Handled<R> {
        // Unless a path is looking for its target, config answers are late answers
        // to the discovery that opened the device, or another target's.
        let unused = Handled::Ignored(Ignore::OtherCommand);
        if header.error != 0 || header.shelf != self.config.shelf || header.slot != self.config.slot
        {
            return unused;
        }
        let Ok(answer) = ConfigQuery::parse(body) else {
            return unused;
        };
        let paths = &self.config.paths;
        let reaches =
            |p: &PathAddr| p.socket == socket && (header.dst == p.local || header.dst == BROADCAST);
        // A MAC another path already uses is that path's (a target with several
        // ports on one segment); any other may be the one this path lost.
        let candidate = (0..paths.len()).find(|&p| {
            reaches(&paths[p])
                && self.path_state[p].rediscovering.is_some()
                && !paths
                    .iter()
                    .enumerate()
                    .any(|(other, q)| other != p && q.socket == socket && q.target == header.src)
                && !self
                    .checks
                    .iter()
                    .any(|c| c.path == p && c.gate && c.mac == header.src)
        });
        let Some(path) = candidate else {
            return unused;
        };
        if answer.sector_count != 0 && answer.sector_count < self.config.sectors_per_frame {
            let fault = Fault::Changed(format!(
                "the target answering at {} takes at most {} sectors per frame, fewer than the {} in use",
                format_mac(&header.src),
                answer.sector_count,
                self.config.sectors_per_frame
            ));
            self.break_session(fault, out);
            return Handled::Control;
        }
        self.start_check(now, path, header.src, true, out);
        Handled::Control
    }

    /// Starts an identity check of `mac` on `path` and sends its first IDENTIFY.
    fn start_check(
        &mut self,
        now: Instant,
        path: usize,
        mac: MacAddr,
        gate: bool,
        out: &mut Outputs<R>,
    ) {
        if self.expected.is_none() && !gate {
            // Nothing to compare with yet (the device is being opened).
            return;
        }
        self.checks.push(Check {
            path,
            mac,
            gate,
            started: now,
            sent_at: now,
            first_generation: 0,
            last_generation: 0,
        });
        let index = self.checks.len() - 1;
        self.send_check(now, index, true, out);
    }

    /// Sends (again) the IDENTIFY of check `index`, with a new tag of the control slot.
    fn send_check(&mut self, now: Instant, index: usize, first: bool, out: &mut Outputs<R>) {
        self.control_generation = (self.control_generation + 1) & GEN_MASK;
        let generation = self.control_generation;
        let check = &mut self.checks[index];
        if first {
            check.first_generation = generation;
        }
        check.last_generation = generation;
        check.sent_at = now;
        let addr = self.config.paths[check.path];
        let header = Header::request(
            check.mac,
            addr.local,
            self.config.shelf,
            self.config.slot,
            Command::Ata,
            tag(generation, CONTROL_SLOT),
        );
        let args = ata_args(Kind::Identify, Plan::identify().frame(1, 0), false, false);
        let mut frame = Vec::new();
        header.encode(&mut frame);
        args.encode(&mut frame);
        frame.resize(frame.len().max(MIN_FRAME_LEN), 0);
        out.control.push(Control {
            path: check.path,
            socket: addr.socket,
            purpose: Purpose::Verify,
            frame,
        });
        self.note_deadline(now + CHECK_INTERVAL);
    }

    /// Re-sends unanswered identity checks every [`CHECK_INTERVAL`]; gives up on one
    /// unanswered for the whole timeout (a gated path then goes on rediscovering).
    fn run_checks(&mut self, now: Instant, out: &mut Outputs<R>) {
        let mut index = 0;
        while index < self.checks.len() {
            let check = self.checks[index];
            if now.saturating_duration_since(check.started) >= self.config.timeout {
                self.checks.remove(index);
                continue;
            }
            if now >= check.sent_at + CHECK_INTERVAL {
                self.send_check(now, index, false, out);
            } else {
                self.note_deadline(check.sent_at + CHECK_INTERVAL);
            }
            index += 1;
        }
    }

    /// An answer to an identity check (a tag of the control slot).
    fn handle_check(
        &mut self,
        now: Instant,
        socket: usize,
        header: &Header,
        body: &[u8],
        generation: u32,
        out: &mut Outputs<R>,
    ) -> Handled<R> {
        let paths = &self.config.paths;
        let Some(index) = self.checks.iter().position(|c| {
            let addr = paths[c.path];
            addr.socket == socket
                && addr.local == header.dst
                && c.mac == header.src
                && generation_distance(c.first_generation, generation)
                    <= generation_distance(c.first_generation, c.last_generation)
        }) else {
            return Handled::Ignored(Ignore::UnknownTag);
        };
        if header.shelf != self.config.shelf || header.slot != self.config.slot {
            return Handled::Ignored(Ignore::WrongTarget);
        }
        let check = self.checks.remove(index);
        let problem = if header.error != 0 {
            Some(format!(
                "answers IDENTIFY DEVICE with AoE error {}",
                header.error
            ))
        } else {
            match AtaArgs::parse(body) {
                Err(_) => Some("sends a truncated IDENTIFY DEVICE answer".to_string()),
                Ok((args, _)) if args.cmd_status & (ata::STATUS_ERR | STATUS_DF) != 0 => {
                    Some(format!(
                        "fails IDENTIFY DEVICE (status {:#04x}, error {:#04x})",
                        args.cmd_status, args.err_feature
                    ))
                }
                Ok((_, data)) if data.len() < SECTOR_SIZE => {
                    Some("sends a truncated IDENTIFY DEVICE block".to_string())
                }
                Ok((_, data)) => self.identity_differs(&data[..SECTOR_SIZE]),
            }
        };
        if let Some(problem) = problem {
            let fault = Fault::Changed(format!(
                "the target now answering at {} {problem}",
                format_mac(&check.mac)
            ));
            self.break_session(fault, out);
            return Handled::Control;
        }
        // The device opened: the path is alive, at that MAC.
        let path = check.path;
        self.stats.recoveries += 1;
        self.checks.retain(|c| c.path != path);
        let state = &mut self.path_state[path];
        state.failures = 0;
        state.unanswered_since = None;
        state.last_answer = Some(now);
        state.rediscovering = None;
        if self.in_flight > 0 {
            self.waiting_since = Some(now);
        }
        let socket = self.config.paths[path].socket;
        if check.gate {
            let previous = std::mem::replace(&mut self.config.paths[path].target, check.mac);
            out.events.push(Event::Rediscovered {
                path,
                socket,
                previous,
                target: check.mac,
            });
            // Frames sent to another MAC were lost, all of them; at the same MAC the
            // target may only have stalled, and one probe now (the rest follow once
            // it is answered) spares it a window of duplicates.
            let same = previous == check.mac;
            self.path_state[path].release_held = same;
            self.resend_path(now, path, same, out);
        } else {
            out.events.push(Event::Verified { path, socket });
        }
        self.outage_over(now, path, out);
        Handled::Control
    }

    /// The path's target answers again (and passed its check, if it had one): if an
    /// outage was reported, its end is too.
    fn outage_over(&mut self, now: Instant, path: usize, out: &mut Outputs<R>) {
        if let Some(since) = self.path_state[path].outage.take() {
            let addr = self.config.paths[path];
            out.events.push(Event::Reachable {
                path,
                socket: addr.socket,
                target: addr.target,
                after: now.saturating_duration_since(since),
            });
        }
    }

    /// Why an IDENTIFY DEVICE block shows another device than the one opened, if it
    /// does.
    fn identity_differs(&self, block: &[u8]) -> Option<String> {
        if !Identity::checksum_ok(block) {
            return Some("sends an IDENTIFY DEVICE block that fails its checksum".into());
        }
        let found = Identity::parse(block)?;
        let expected = self.expected.as_ref()?;
        if found.sectors != expected.sectors {
            return Some(format!(
                "has {} sectors ({} bytes), not the {} ({} bytes) opened",
                found.sectors,
                found.sectors * SECTOR_SIZE as u64,
                expected.sectors,
                expected.sectors * SECTOR_SIZE as u64
            ));
        }
        if found.serial != expected.serial {
            return Some(format!(
                "has serial number {:?}, not the {:?} opened",
                found.serial, expected.serial
            ));
        }
        None
    }

    /// Sends the outstanding frames of `path` (or only its oldest) again now, to its
    /// target found again: they waited for it.
    fn resend_path(&mut self, now: Instant, path: usize, only_oldest: bool, out: &mut Outputs<R>) {
        let timeout = self.config.timeout;
        let live =
            |f: &InFlight| f.path == path && now.saturating_duration_since(f.first_sent) < timeout;
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.frame.filter(live).map(|f| (f.first_seq, slot)))
            .min()
            .map(|(_, slot)| slot);
        for slot in 0..self.slots.len() {
            let Some(mut frame) = self.slots[slot].frame.filter(live) else {
                continue;
            };
            if only_oldest && Some(slot) != oldest {
                continue;
            }
            frame.retries += 1;
            frame.reordered = false;
            frame.sent_at = now;
            frame.sent_seq = self.next_seq();
            frame.deadline = now + self.rtt.backoff(0);
            self.slots[slot].generation = (self.slots[slot].generation + 1) & GEN_MASK;
            self.slots[slot].frame = Some(frame);
            out.transmits.push(self.transmit(slot, true));
            self.note_deadline(frame.deadline);
        }
    }

    /// Makes the frames of `path` sent before transmission `seq` due now.
    fn release_held(&mut self, now: Instant, path: usize, seq: u64) {
        for slot in 0..self.slots.len() {
            if let Some(frame) = self.slots[slot].frame.as_mut() {
                if frame.path == path && frame.sent_seq < seq {
                    frame.deadline = now;
                    self.note_deadline(now);
                }
            }
        }
    }

    /// The target is not the device opened: fail everything, now and later.
    fn break_session(&mut self, fault: Fault, out: &mut Outputs<R>) {
        self.broken = Some(fault.clone());
        self.checks.clear();
        self.fail_all(fault, None, out);
    }

    /// Sends the frame in `slot` again: a new tag, the next path (writes: the same
    /// path unless it is dead), a doubled timer.
    /// Returns the updated frame.
    fn retransmit(
        &mut self,
        now: Instant,
        slot: usize,
        reordered: bool,
        out: &mut Outputs<R>,
    ) -> InFlight {
        let mut frame = self.slots[slot].frame.expect("slot holds a frame");
        let unanswered_since = frame.sent_at;
        frame.reordered = reordered;
        // Lost (or slow): halve the window once per round trip.
        if self.recover_until.is_none_or(|until| now >= until) {
            self.cwnd_before_loss = self.cwnd;
            self.cwnd = (self.cwnd / 2.0).max(1.0);
            self.recover_until = Some(now + self.rtt.rto());
        }
        frame.retries += 1;
        frame.sent_at = now;
        frame.sent_seq = self.next_seq();
        frame.deadline = now + self.rtt.backoff(frame.retries);
        let state = &mut self.path_state[frame.path];
        state.failures = state.failures.saturating_add(1);
        if state.failures == 1 {
            // Nothing answered on the path since then (an answer resets failures).
            let since = state
                .last_answer
                .map_or(unanswered_since, |at| at.max(unanswered_since));
            state.unanswered_since = Some(since);
        }
        // A write's copies stay on one path while it is alive: the target takes a
        // path's frames in order, so a stale copy is written before anything sent
        // after it. Across paths a late copy could land after a newer write to the
        // same sectors and undo it (seen in the two-link conformance test).
        let is_write = self.requests[frame.request as usize]
            .as_ref()
            .is_some_and(|r| r.plan.kind == Kind::Write);
        if !is_write || !self.healthy(frame.path) {
            frame.path = self.other_path(frame.path);
        }
        self.slots[slot].generation = (self.slots[slot].generation + 1) & GEN_MASK;
        self.slots[slot].frame = Some(frame);
        out.transmits.push(self.transmit(slot, true));
        frame
    }

    fn fail_all(&mut self, fault: Fault, now: Option<Instant>, out: &mut Outputs<R>) {
        for key in 0..self.requests.len() as u32 {
            if self.requests[key as usize].is_some() {
                if matches!(fault, Fault::TimedOut { .. }) {
                    self.stats.timeouts += 1;
                }
                self.fail(key, fault.clone(), now, out);
            }
        }
        self.next_deadline = None;
    }

    /// Fails every request with [`Fault::Closed`] and refuses new ones.
    pub fn close(&mut self, out: &mut Outputs<R>) {
        self.closed = true;
        self.checks.clear();
        self.fail_all(Fault::Closed, None, out);
    }
}

/// ATA status: device fault.
const STATUS_DF: u8 = 0x20;
/// Answers without a needless retransmission after which the reordering window
/// halves.
const REORDER_DECAY: u32 = 4096;
/// Timeouts in a row after which a path is avoided.
const PATH_FAILURES: u32 = 3;
/// How often a new frame goes to an avoided path, to see whether it recovered.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Timeouts in a row after which a path looks for its target again (config queries):
/// as many as make it avoided, a few milliseconds of silence on a LAN.
pub const REDISCOVER_AFTER: u32 = PATH_FAILURES;
/// How often the config query is broadcast while the target stays lost.
pub const REDISCOVER_INTERVAL: Duration = Duration::from_millis(250);
/// How long a path's target must answer nothing, frames outstanding, before that is
/// an outage ([`Event::Unreachable`]) rather than a stall: twice the longest wait of
/// the retransmission timer. A target busy with a flush or writeback stalls for
/// milliseconds to a few hundred; a killed, restarting or unplugged one for longer.
pub const OUTAGE_AFTER: Duration = Duration::from_secs(2);
/// How often an unanswered identity check is sent again.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// Appends the frame of `transmit` to `out`: header, ATA arguments, the bytes
/// `source[transmit.data]` (writes), zero padding to the Ethernet minimum. Returns
/// where in `out` the frame lies.
pub fn encode_transmit<R>(
    transmit: &Transmit<R>,
    source: &[u8],
    out: &mut Vec<u8>,
) -> Range<usize> {
    let start = encode_transmit_head(transmit, out).start;
    out.extend_from_slice(&source[transmit.data.clone()]);
    let end = out.len().max(start + MIN_FRAME_LEN);
    out.resize(end, 0);
    start..end
}

/// Appends a transmit's headers (Ethernet, AoE, ATA) to `out`, without its data,
/// for a send that gathers the data from the request's buffer; returns their range.
pub fn encode_transmit_head<R>(transmit: &Transmit<R>, out: &mut Vec<u8>) -> Range<usize> {
    let start = out.len();
    transmit.header.encode(out);
    transmit.args.encode(out);
    start..out.len()
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
