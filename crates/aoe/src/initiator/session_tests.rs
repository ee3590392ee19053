//! The session against fake targets over a simulated link, with a virtual clock:
//! splitting, the window, tags, answers that must be ignored, errors, retransmission,
//! timeouts, and a lossy, duplicating, reordering link.

use std::collections::HashMap;

use super::*;
use crate::wire::{Body, ATA_HEADER_LEN};

const INITIATOR: MacAddr = [0x02, 0, 0, 0, 0, 0x01];
const INITIATOR_2: MacAddr = [0x02, 0, 0, 0, 0, 0x02];
const TARGET: MacAddr = [0x02, 0, 0, 0, 0, 0xaa];
const TARGET_2: MacAddr = [0x02, 0, 0, 0, 0, 0xbb];
const MS: Duration = Duration::from_millis(1);
const US: Duration = Duration::from_micros(1);

fn path(socket: usize, local: MacAddr, target: MacAddr) -> PathAddr {
    PathAddr {
        socket,
        local,
        target,
    }
}

fn config(window: usize, per_frame: u8) -> SessionConfig {
    SessionConfig {
        shelf: 1,
        slot: 2,
        paths: vec![path(0, INITIATOR, TARGET)],
        window,
        sectors_per_frame: per_frame,
        lba48: true,
        flush_ext: true,
        timeout: Duration::from_secs(10),
        initial_rtt: Some(100 * US),
        tag_seed: 77,
    }
}

/// A target that serves a memory disk the way vblade does: it counts the sector count
/// down to zero and answers IDNF beyond the end.
struct FakeTarget {
    disk: Vec<u8>,
    /// Flushes seen.
    flushes: usize,
    /// Answer with this AoE error instead.
    aoe_error: Option<u8>,
    /// What IDENTIFY DEVICE answers.
    identity: Identity,
}

impl FakeTarget {
    fn new(sectors: usize) -> FakeTarget {
        let disk = (0..sectors * SECTOR_SIZE)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        FakeTarget {
            disk,
            flushes: 0,
            aoe_error: None,
            identity: Identity {
                sectors: sectors as u64,
                lba48: true,
                model: "fake target".into(),
                serial: "e1.2".into(),
                firmware: "1".into(),
            },
        }
    }

    /// The answer to a config query, sent from `mac`.
    fn config_answer(&self, query: &[u8], mac: MacAddr) -> Vec<u8> {
        let (header, body) = Header::parse(query).unwrap();
        assert!(!header.response);
        assert_eq!(header.command, Command::QueryConfig as u8);
        assert!(ConfigQuery::parse(body).is_ok());
        let mut reply = header.response_to(mac);
        reply.shelf = 1;
        reply.slot = 2;
        let config = ConfigQuery {
            buffer_count: 16,
            firmware_version: 1,
            sector_count: 2,
            aoe_version: 1,
            command: 0,
            config: b"",
        };
        let mut out = Vec::new();
        encode_frame(&reply, &Body::QueryConfig(config), &mut out);
        out
    }

    /// The answer to a request frame, sent from `mac`.
    fn answer(&mut self, frame: &[u8], mac: MacAddr) -> Vec<u8> {
        let (header, body) = Header::parse(frame).unwrap();
        assert!(!header.response);
        assert_eq!((header.shelf, header.slot), (1, 2));
        let (mut args, data) = AtaArgs::parse(body).unwrap();
        let mut reply = header.response_to(mac);
        if let Some(code) = self.aoe_error {
            reply.error = code;
            let mut out = Vec::new();
            encode_frame(&reply, &Body::Ata(args, &[]), &mut out);
            return out;
        }
        let sectors = args.sector_count as usize;
        let start = args.lba as usize * SECTOR_SIZE;
        let end = start + sectors * SECTOR_SIZE;
        let mut payload = Vec::new();
        let beyond = end > self.disk.len();
        match args.cmd_status {
            ata::READ_SECTORS
            | ata::READ_SECTORS_EXT
            | ata::WRITE_SECTORS
            | ata::WRITE_SECTORS_EXT
                if beyond =>
            {
                args.cmd_status = ata::STATUS_DRDY | ata::STATUS_ERR;
                args.err_feature = ata::ERROR_IDNF;
            }
            ata::READ_SECTORS | ata::READ_SECTORS_EXT => {
                payload.extend_from_slice(&self.disk[start..end]);
                args.sector_count = 0;
                args.cmd_status = ata::STATUS_DRDY;
            }
            ata::WRITE_SECTORS | ata::WRITE_SECTORS_EXT => {
                assert!(args.write);
                self.disk[start..end].copy_from_slice(&data[..sectors * SECTOR_SIZE]);
                args.sector_count = 0;
                args.cmd_status = ata::STATUS_DRDY;
            }
            ata::FLUSH_CACHE | ata::FLUSH_CACHE_EXT => {
                self.flushes += 1;
                args.cmd_status = ata::STATUS_DRDY;
            }
            ata::IDENTIFY_DEVICE => {
                payload.extend_from_slice(&self.identity.encode());
                args.cmd_status = ata::STATUS_DRDY;
            }
            _ => {
                args.cmd_status = ata::STATUS_DRDY | ata::STATUS_ERR;
                args.err_feature = ata::ERROR_ABRT;
            }
        }
        let mut out = Vec::new();
        encode_frame(&reply, &Body::Ata(args, &payload), &mut out);
        out
    }
}

use crate::wire::encode_frame;

/// The initiator's side of a test: a session, request buffers by id, a clock.
struct Harness {
    session: Session<usize>,
    buffers: HashMap<usize, Vec<u8>>,
    results: HashMap<usize, Result<(), Fault>>,
    out: Outputs<usize>,
    /// The session's own frames and events, as they came out.
    control: Vec<Control>,
    events: Vec<Event>,
    now: Instant,
    next_id: usize,
}

impl Harness {
    fn new(config: SessionConfig) -> Harness {
        Harness {
            session: Session::new(config),
            buffers: HashMap::new(),
            results: HashMap::new(),
            out: Outputs::default(),
            control: Vec::new(),
            events: Vec::new(),
            now: Instant::now(),
            next_id: 0,
        }
    }

    fn submit(&mut self, plan: Plan, buffer: Vec<u8>) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        self.buffers.insert(id, buffer);
        self.session.submit(id, plan, &mut self.out);
        self.collect();
        id
    }

    fn read(&mut self, lba: u64, sectors: u64) -> usize {
        self.submit(
            Plan::read(lba, sectors),
            vec![0; sectors as usize * SECTOR_SIZE],
        )
    }

    /// Frames the session wants sent now, encoded, with their socket.
    fn transmit(&mut self) -> Vec<(usize, Vec<u8>)> {
        self.session.poll_transmits(self.now, &mut self.out);
        self.take_frames()
    }

    fn take_frames(&mut self) -> Vec<(usize, Vec<u8>)> {
        let frames = self
            .out
            .transmits
            .drain(..)
            .map(|t| {
                let mut frame = Vec::new();
                encode_transmit(&t, &self.buffers[&t.request], &mut frame);
                (t.socket, frame)
            })
            .collect();
        self.collect();
        frames
    }

    fn collect(&mut self) {
        self.control.append(&mut self.out.control);
        self.events.append(&mut self.out.events);
        for finished in self.out.finished.drain(..) {
            let old = self.results.insert(finished.request, finished.result);
            assert!(old.is_none(), "request {} finished twice", finished.request);
        }
    }

    fn receive(&mut self, socket: usize, frame: &[u8]) -> Handled<usize> {
        let handled = self
            .session
            .handle_frame(self.now, socket, frame, &mut self.out);
        if let Handled::Read {
            request,
            offset,
            data,
        } = &handled
        {
            let buffer = self.buffers.get_mut(request).unwrap();
            buffer[*offset..*offset + data.len()].copy_from_slice(&frame[data.clone()]);
        }
        self.collect();
        handled
    }

    fn advance(&mut self, by: Duration) -> Vec<(usize, Vec<u8>)> {
        self.now += by;
        self.session.handle_timeout(self.now, &mut self.out);
        self.take_frames()
    }

    /// Moves the clock on in small steps until the session sends something.
    fn advance_until_sent(&mut self) -> Vec<(usize, Vec<u8>)> {
        for _ in 0..100_000 {
            let sent = self.advance(10 * US);
            if !sent.is_empty() {
                return sent;
            }
        }
        panic!("nothing sent for a second");
    }

    /// Sends everything, lets `target` answer on a perfect link, until idle.
    fn run(&mut self, target: &mut FakeTarget) {
        let mut frames = self.transmit();
        while !frames.is_empty() {
            for (socket, frame) in std::mem::take(&mut frames) {
                let answer = target.answer(&frame, TARGET);
                self.now += 10 * US;
                self.receive(socket, &answer);
            }
            frames = self.transmit();
        }
    }
}

#[test]
fn tags_carry_slot_and_generation() {
    for (generation, slot) in [(0, 0), (1, 5), (GEN_MASK, MAX_SLOTS - 1), (12345, 1000)] {
        assert_eq!(split_tag(tag(generation, slot)), (generation, slot));
    }
    // Generations wrap within their bits.
    assert_eq!(split_tag(tag(GEN_MASK + 1, 3)), (0, 3));
    assert_eq!(generation_distance(GEN_MASK, 1), 2);
}

#[test]
fn requests_split_into_frames() {
    let plan = Plan::read(100, 5);
    assert_eq!(plan.frames(2), 3);
    let frames: Vec<FrameSpec> = (0..3).map(|i| plan.frame(2, i)).collect();
    assert_eq!(
        frames,
        [
            FrameSpec {
                lba: 100,
                sectors: 2,
                offset: 0
            },
            FrameSpec {
                lba: 102,
                sectors: 2,
                offset: 1024
            },
            FrameSpec {
                lba: 104,
                sectors: 1,
                offset: 2048
            },
        ]
    );
    assert_eq!(Plan::write(0, 255).frames(255), 1);
    assert_eq!(Plan::write(0, 256).frames(255), 2);
    assert_eq!(Plan::write(0, 65536).frames(17), 3856);
    assert_eq!(Plan::flush().frames(2), 1);
    assert_eq!(Plan::identify().frame(2, 0).sectors, 1);
}

#[test]
fn frames_use_28_or_48_bit_commands() {
    // The last LBA28 sectors and the first beyond: the frame's LBA is encoded whole.
    let plan = Plan::read(LBA28_LIMIT - 3, 4);
    let last = plan.frame(2, 1);
    assert_eq!(last.lba, LBA28_LIMIT - 1);
    let args = ata_args(Kind::Read, last, false, false);
    assert_eq!(args.cmd_status, ata::READ_SECTORS);
    assert!(!args.extended);
    let mut bytes = Vec::new();
    args.encode(&mut bytes);
    let (parsed, _) = AtaArgs::parse(&bytes).unwrap();
    assert_eq!(parsed.lba, LBA28_LIMIT - 1);

    let beyond = FrameSpec {
        lba: LBA28_LIMIT + 1,
        sectors: 2,
        offset: 0,
    };
    let args = ata_args(Kind::Write, beyond, true, true);
    assert_eq!(args.cmd_status, ata::WRITE_SECTORS_EXT);
    assert!(args.extended && args.write);
    let mut bytes = Vec::new();
    args.encode(&mut bytes);
    assert_eq!(AtaArgs::parse(&bytes).unwrap().0.lba, LBA28_LIMIT + 1);
    let top = FrameSpec {
        lba: LBA48_LIMIT - 1,
        ..beyond
    };
    let mut bytes = Vec::new();
    ata_args(Kind::Read, top, true, true).encode(&mut bytes);
    assert_eq!(AtaArgs::parse(&bytes).unwrap().0.lba, LBA48_LIMIT - 1);

    let flush = Plan::flush().frame(2, 0);
    assert_eq!(
        ata_args(Kind::Flush, flush, true, true).cmd_status,
        ata::FLUSH_CACHE_EXT
    );
    assert_eq!(
        ata_args(Kind::Flush, flush, true, false).cmd_status,
        ata::FLUSH_CACHE
    );
    let identify = ata_args(Kind::Identify, Plan::identify().frame(2, 0), true, true);
    assert_eq!(
        (
            identify.cmd_status,
            identify.sector_count,
            identify.extended
        ),
        (ata::IDENTIFY_DEVICE, 1, false)
    );
}

#[test]
fn reads_writes_and_flushes_reach_a_target() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(4, 2));
    let data: Vec<u8> = (0..7 * SECTOR_SIZE).map(|i| (i % 13) as u8).collect();
    let write = h.submit(Plan::write(3, 7), data.clone());
    let flush = h.submit(Plan::flush(), Vec::new());
    h.run(&mut target);
    assert_eq!(h.results[&write], Ok(()));
    assert_eq!(h.results[&flush], Ok(()));
    assert_eq!(target.flushes, 1);
    assert_eq!(&target.disk[3 * SECTOR_SIZE..10 * SECTOR_SIZE], &data[..]);

    let read = h.read(2, 9);
    h.run(&mut target);
    assert_eq!(h.results[&read], Ok(()));
    assert_eq!(
        h.buffers[&read],
        target.disk[2 * SECTOR_SIZE..11 * SECTOR_SIZE]
    );
    assert_eq!(h.session.in_flight(), 0);
    assert_eq!(h.session.requests(), 0);
    assert_eq!(h.session.stats().retransmits, 0);
}

#[test]
fn the_window_bounds_frames_outstanding() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(4, 1));
    let first = h.read(0, 10);
    let second = h.read(20, 1);
    let frames = h.transmit();
    assert_eq!(frames.len(), 4);
    assert!(h.transmit().is_empty(), "the window is full");
    // One answer frees one slot for the next frame, still of the oldest request.
    let answer = target.answer(&frames[0].1, TARGET);
    assert!(matches!(h.receive(0, &answer), Handled::Read { .. }));
    let next = h.transmit();
    assert_eq!(next.len(), 1);
    let (header, body) = Header::parse(&next[0].1).unwrap();
    let (args, _) = AtaArgs::parse(body).unwrap();
    assert_eq!(args.lba, 4);
    // Tags of frames outstanding at once are distinct.
    let mut tags: Vec<u32> = frames[1..]
        .iter()
        .map(|(_, f)| Header::parse(f).unwrap().0.tag)
        .collect();
    tags.push(header.tag);
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), 4);
    for (socket, frame) in frames[1..].iter().chain(&next) {
        let answer = target.answer(frame, TARGET);
        h.receive(*socket, &answer);
    }
    h.run(&mut target);
    assert_eq!(h.results[&first], Ok(()));
    assert_eq!(h.results[&second], Ok(()));
}

#[test]
fn duplicate_and_late_answers_are_ignored() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(2, 1));
    let id = h.read(0, 4);
    let frames = h.transmit();
    let answer = target.answer(&frames[0].1, TARGET);
    assert!(matches!(h.receive(0, &answer), Handled::Read { .. }));
    // The same answer again: the frame is done.
    assert_eq!(h.receive(0, &answer), Handled::Ignored(Ignore::UnknownTag));
    // The slot is reused by the next frame; the old answer still does not match it.
    let next = h.transmit();
    assert_eq!(next.len(), 1);
    assert_eq!(
        split_tag(Header::parse(&next[0].1).unwrap().0.tag).1,
        split_tag(Header::parse(&frames[0].1).unwrap().0.tag).1
    );
    assert_eq!(h.receive(0, &answer), Handled::Ignored(Ignore::UnknownTag));
    // A retransmitted frame: the answer to the first transmission completes it, the
    // answer to the retransmission is then ignored.
    // The target answers nothing for a while: only the oldest frame outstanding is
    // sent again, as a probe.
    let retransmitted = h.advance(Duration::from_millis(50));
    assert_eq!(retransmitted.len(), 1);
    assert_eq!(lba_of(&retransmitted[0].1), lba_of(&frames[1].1));
    let late = target.answer(&frames[1].1, TARGET);
    assert!(matches!(h.receive(0, &late), Handled::Read { .. }));
    let again = target.answer(&retransmitted[0].1, TARGET);
    assert_eq!(h.receive(0, &again), Handled::Ignored(Ignore::UnknownTag));
    // The frame held behind the probe is answered as it was.
    let held = target.answer(&next[0].1, TARGET);
    assert!(matches!(h.receive(0, &held), Handled::Read { .. }));
    h.run(&mut target);
    assert_eq!(h.results[&id], Ok(()));
    assert_eq!(h.buffers[&id], target.disk[..4 * SECTOR_SIZE]);
    assert_eq!(h.session.stats().ignored, 3);
}

#[test]
fn answers_from_elsewhere_are_ignored() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(2, 1));
    let id = h.read(0, 1);
    let frames = h.transmit();
    let answer = target.answer(&frames[0].1, TARGET);

    let from_other_mac = target.answer(&frames[0].1, TARGET_2);
    assert_eq!(
        h.receive(0, &from_other_mac),
        Handled::Ignored(Ignore::WrongPath)
    );
    assert_eq!(h.receive(1, &answer), Handled::Ignored(Ignore::WrongPath));
    let mut to_other = answer.clone();
    to_other[..6].copy_from_slice(&INITIATOR_2);
    assert_eq!(h.receive(0, &to_other), Handled::Ignored(Ignore::WrongPath));
    let mut other_slot = answer.clone();
    other_slot[18] = 3;
    assert_eq!(
        h.receive(0, &other_slot),
        Handled::Ignored(Ignore::WrongTarget)
    );
    let mut other_shelf = answer.clone();
    other_shelf[16..18].copy_from_slice(&9u16.to_be_bytes());
    assert_eq!(
        h.receive(0, &other_shelf),
        Handled::Ignored(Ignore::WrongTarget)
    );
    let mut request = answer.clone();
    request[14] &= !0x08;
    assert_eq!(
        h.receive(0, &request),
        Handled::Ignored(Ignore::NotResponse)
    );
    let mut config_answer = Vec::new();
    let (header, _) = Header::parse(&answer).unwrap();
    let header = Header {
        command: Command::QueryConfig as u8,
        ..header
    };
    let query = ConfigQuery {
        buffer_count: 16,
        firmware_version: 1,
        sector_count: 2,
        aoe_version: 1,
        command: 0,
        config: b"",
    };
    encode_frame(&header, &Body::QueryConfig(query), &mut config_answer);
    assert_eq!(
        h.receive(0, &config_answer),
        Handled::Ignored(Ignore::OtherCommand)
    );
    assert_eq!(
        h.receive(0, &answer[..20]),
        Handled::Ignored(Ignore::NotAoe)
    );
    let mut not_aoe = answer.clone();
    not_aoe[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    assert_eq!(h.receive(0, &not_aoe), Handled::Ignored(Ignore::NotAoe));
    let mut bad_tag = answer.clone();
    bad_tag[23] ^= 0x01;
    assert_eq!(h.receive(0, &bad_tag), Handled::Ignored(Ignore::UnknownTag));

    assert!(h.results.is_empty());
    assert!(matches!(h.receive(0, &answer), Handled::Read { .. }));
    assert_eq!(h.results[&id], Ok(()));
}

#[test]
fn short_answers_are_accepted_when_complete() {
    // A write answer is only the headers; veth does not pad it to 60 bytes.
    let mut target = FakeTarget::new(8);
    let mut h = Harness::new(config(2, 2));
    let id = h.submit(Plan::write(0, 1), vec![1; SECTOR_SIZE]);
    let frames = h.transmit();
    let answer = target.answer(&frames[0].1, TARGET);
    assert_eq!(h.receive(0, &answer[..ATA_HEADER_LEN]), Handled::Answered);
    assert_eq!(h.results[&id], Ok(()));
}

#[test]
fn ata_errors_fail_the_request_and_forget_its_frames() {
    let mut target = FakeTarget::new(8);
    let mut h = Harness::new(config(8, 1));
    // Sectors 6..10: the last two are beyond the end.
    let id = h.read(6, 4);
    let frames = h.transmit();
    assert_eq!(frames.len(), 4);
    let answers: Vec<Vec<u8>> = frames
        .iter()
        .map(|(_, f)| target.answer(f, TARGET))
        .collect();
    assert!(matches!(h.receive(0, &answers[0]), Handled::Read { .. }));
    assert_eq!(h.receive(0, &answers[2]), Handled::Answered);
    assert_eq!(
        h.results[&id],
        Err(Fault::Ata {
            status: ata::STATUS_DRDY | ata::STATUS_ERR,
            error: ata::ERROR_IDNF
        })
    );
    // The other frames were forgotten.
    assert_eq!(h.session.in_flight(), 0);
    assert_eq!(
        h.receive(0, &answers[1]),
        Handled::Ignored(Ignore::UnknownTag)
    );
    assert_eq!(
        h.receive(0, &answers[3]),
        Handled::Ignored(Ignore::UnknownTag)
    );
    assert!(h.advance(Duration::from_secs(20)).is_empty());
}

#[test]
fn aoe_errors_fail_the_request() {
    let mut target = FakeTarget::new(8);
    target.aoe_error = Some(3);
    let mut h = Harness::new(config(8, 2));
    let id = h.submit(Plan::write(0, 4), vec![0; 4 * SECTOR_SIZE]);
    h.run(&mut target);
    assert_eq!(h.results[&id], Err(Fault::Aoe { code: 3 }));
    assert_eq!(h.session.requests(), 0);
}

#[test]
fn malformed_answers_fail_the_request() {
    let mut target = FakeTarget::new(8);
    let mut h = Harness::new(config(8, 2));
    let short = h.read(0, 2);
    let frames = h.transmit();
    let answer = target.answer(&frames[0].1, TARGET);
    assert_eq!(
        h.receive(0, &answer[..ATA_HEADER_LEN + 600]),
        Handled::Answered
    );
    assert!(
        matches!(&h.results[&short], Err(Fault::Malformed(m)) if m.contains("600")),
        "{:?}",
        h.results[&short]
    );

    let count = h.read(0, 2);
    let frames = h.transmit();
    let mut answer = target.answer(&frames[0].1, TARGET);
    answer[HEADER_COUNT_AT] = 1;
    assert_eq!(h.receive(0, &answer), Handled::Answered);
    assert!(matches!(&h.results[&count], Err(Fault::Malformed(_))));

    // Echoing the count is as good as counting it down.
    let echo = h.read(0, 2);
    let frames = h.transmit();
    let mut answer = target.answer(&frames[0].1, TARGET);
    answer[HEADER_COUNT_AT] = 2;
    assert!(matches!(h.receive(0, &answer), Handled::Read { .. }));
    assert_eq!(h.results[&echo], Ok(()));
}

fn lba_of(frame: &[u8]) -> u64 {
    let (_, body) = Header::parse(frame).unwrap();
    AtaArgs::parse(body).unwrap().0.lba
}

/// Offset of the ATA sector count in a frame.
const HEADER_COUNT_AT: usize = 26;

#[test]
fn silent_targets_time_out_with_back_off() {
    let mut h = Harness::new(config(4, 2));
    let id = h.read(0, 2);
    let queued = h.read(10, 2);
    let first = h.transmit();
    assert_eq!(first.len(), 2);
    let start = h.now;
    let rto = h.session.rtt().rto();
    assert!(h.advance(rto / 2).is_empty());
    let mut gaps = Vec::new();
    let mut last = start;
    let mut tags = vec![Header::parse(&first[0].1).unwrap().0.tag];
    while h.results.is_empty() {
        let sent = h.advance(100 * US);
        if let Some((_, frame)) = sent.first() {
            gaps.push(h.now - last);
            last = h.now;
            tags.push(Header::parse(frame).unwrap().0.tag);
        }
        assert!(h.now < start + Duration::from_secs(11));
    }
    // Each retransmission waits about twice as long as the one before, up to 1 s,
    // and has a new tag in the same slot.
    assert!(gaps.len() > 8, "{gaps:?}");
    for pair in gaps.windows(2).take(6) {
        let ratio = pair[1].as_secs_f64() / pair[0].as_secs_f64();
        assert!((1.6..2.5).contains(&ratio), "{gaps:?}");
    }
    assert!(gaps.iter().all(|gap| *gap <= Duration::from_millis(1001)));
    let slots: Vec<usize> = tags.iter().map(|t| split_tag(*t).1).collect();
    assert!(slots.iter().all(|s| *s == slots[0]));
    let mut unique = tags.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), tags.len());
    // Both requests fail after the timeout, within a few milliseconds of it.
    for request in [id, queued] {
        match &h.results[&request] {
            Err(Fault::TimedOut {
                waited,
                retransmits,
                silent: true,
            }) => {
                assert!(*waited >= Duration::from_secs(10));
                assert!(*waited < Duration::from_millis(10_010));
                assert!(*retransmits > 8);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(h.session.in_flight(), 0);
    assert_eq!(h.session.stats().timeouts, 2);
}

#[test]
fn one_lost_frame_times_out_alone_while_others_are_answered() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(4, 1));
    let start = h.now;
    let doomed = h.read(0, 1);
    assert_eq!(h.transmit().len(), 1, "sent, and lost");
    let mut others = Vec::new();
    while !h.results.contains_key(&doomed) {
        assert!(h.now < start + Duration::from_secs(11));
        others.push(h.read(8, 1));
        let mut frames = h.transmit();
        frames.extend(h.advance(50 * MS));
        for (socket, frame) in frames {
            let (_, body) = Header::parse(&frame).unwrap();
            if AtaArgs::parse(body).unwrap().0.lba == 0 {
                continue; // every transmission of the doomed frame is lost
            }
            let answer = target.answer(&frame, TARGET);
            h.receive(socket, &answer);
        }
    }
    assert!(h.now >= start + Duration::from_secs(10));
    match &h.results[&doomed] {
        Err(Fault::TimedOut {
            silent: false,
            retransmits,
            ..
        }) => assert!(*retransmits > 5),
        other => panic!("{other:?}"),
    }
    assert!(others.iter().all(|id| h.results.get(id) == Some(&Ok(()))));
}

#[test]
fn frames_queued_behind_answered_ones_are_not_retransmitted() {
    // A target working through a full window in order, slower than the RTO per
    // frame of the queue: the frames behind are waiting, not lost.
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(16, 1));
    let id = h.read(0, 16);
    let frames = h.transmit();
    assert_eq!(frames.len(), 16);
    let rto = h.session.rtt().rto();
    for (socket, frame) in &frames {
        assert!(h.advance(rto * 2 / 3).is_empty(), "spurious retransmission");
        let answer = target.answer(frame, TARGET);
        h.receive(*socket, &answer);
    }
    assert_eq!(h.results[&id], Ok(()));
    assert_eq!(h.session.stats().retransmits, 0);

    // When a frame sent later is answered first, the earlier one was lost.
    let id = h.read(0, 2);
    let frames = h.transmit();
    let answer = target.answer(&frames[1].1, TARGET);
    h.receive(0, &answer);
    let again = h.advance(h.session.rtt().rto());
    assert_eq!(again.len(), 1);
    let answer = target.answer(&again[0].1, TARGET);
    h.receive(0, &answer);
    assert_eq!(h.results[&id], Ok(()));

    // When the target stops answering altogether, only the oldest frame is probed;
    // once the probe is answered, the frame held behind it counts as lost.
    let id = h.read(0, 3);
    let frames = h.transmit();
    let answer = target.answer(&frames[0].1, TARGET);
    h.receive(0, &answer);
    let probe = h.advance_until_sent();
    assert_eq!(probe.len(), 1, "the others wait for the probe");
    assert_eq!(lba_of(&probe[0].1), 1);
    let answer = target.answer(&probe[0].1, TARGET);
    h.receive(0, &answer);
    let lost = h.advance_until_sent();
    assert_eq!(lost.len(), 1);
    assert_eq!(lba_of(&lost[0].1), 2);
    let answer = target.answer(&lost[0].1, TARGET);
    h.receive(0, &answer);
    assert_eq!(h.results[&id], Ok(()));
}

#[test]
fn a_stalled_target_gets_probes_not_a_storm() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(16, 1));
    let id = h.read(0, 16);
    let frames = h.transmit();
    assert_eq!(frames.len(), 16);
    // The target stalls for 20 ms (a write blocked on writeback, say).
    let end = h.now + 20 * MS;
    let mut sent = Vec::new();
    while h.now < end {
        sent.extend(h.advance(50 * US));
    }
    assert!((3..=8).contains(&sent.len()), "{} probes", sent.len());
    assert!(sent.iter().all(|(_, frame)| lba_of(frame) == 0));
    // Then it answers everything, in order, duplicates last.
    for (socket, frame) in frames.iter().chain(&sent) {
        let answer = target.answer(frame, TARGET);
        h.receive(*socket, &answer);
    }
    assert_eq!(h.results[&id], Ok(()));
    assert_eq!(h.session.stats().retransmits, sent.len() as u64);
    assert_eq!(h.session.stats().ignored, sent.len() as u64);
}

#[test]
fn a_reordering_target_teaches_patience() {
    // The target answers the second frame at once and the first one late (a read
    // that missed its cache, say): the first retransmission of it proves needless,
    // so the next time the session waits longer before deciding it was lost.
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(4, 1));
    let mut waits = Vec::new();
    for round in 0..2 {
        let id = h.read(0, 2);
        let frames = h.transmit();
        let start = h.now;
        let second = target.answer(&frames[1].1, TARGET);
        h.receive(0, &second);
        let again = h.advance_until_sent();
        waits.push(h.now - start);
        assert_eq!(again.len(), 1);
        assert_eq!(lba_of(&again[0].1), 0);
        let first = target.answer(&frames[0].1, TARGET);
        assert!(matches!(h.receive(0, &first), Handled::Read { .. }));
        let duplicate = target.answer(&again[0].1, TARGET);
        assert_eq!(
            h.receive(0, &duplicate),
            Handled::Ignored(Ignore::UnknownTag)
        );
        assert_eq!(h.results[&id], Ok(()));
        assert_eq!(h.session.stats().needless, round + 1);
        // The halving of the window was undone.
        assert!(h.session.cwnd() >= 4.0 - 1e-9, "{}", h.session.cwnd());
    }
    assert!(waits[1] > waits[0], "{waits:?}");

    // A needless retransmission is also recognised when its answer comes first.
    let id = h.read(0, 2);
    let frames = h.transmit();
    let second = target.answer(&frames[1].1, TARGET);
    h.receive(0, &second);
    let again = h.advance_until_sent();
    let duplicate = target.answer(&again[0].1, TARGET);
    assert!(matches!(h.receive(0, &duplicate), Handled::Read { .. }));
    assert_eq!(h.results[&id], Ok(()));
    let first = target.answer(&frames[0].1, TARGET);
    assert_eq!(h.receive(0, &first), Handled::Ignored(Ignore::UnknownTag));
    assert_eq!(h.session.stats().needless, 3);
}

#[test]
fn frames_overtaken_past_their_timer_widen_the_reorder_window() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(4, 1));
    assert_eq!(h.session.reorder_window(), Duration::ZERO);
    let id = h.read(0, 3);
    let frames = h.transmit();
    // The third frame is answered first, the second keeps the target looking busy,
    // the first is late: it counts as lost, for reordering.
    let third = target.answer(&frames[2].1, TARGET);
    h.receive(0, &third);
    let rto = h.session.rtt().rto();
    assert!(h.advance(rto * 9 / 10).is_empty());
    let second = target.answer(&frames[1].1, TARGET);
    h.receive(0, &second);
    let again = h.advance_until_sent();
    assert_eq!(again.len(), 1);
    assert_eq!(h.session.stats().probes, 0);
    let first = target.answer(&frames[0].1, TARGET);
    assert!(matches!(h.receive(0, &first), Handled::Read { .. }));
    assert_eq!(h.results[&id], Ok(()));
    assert!(h.session.reorder_window() > Duration::ZERO);
}

#[test]
fn timers_start_when_frames_are_reported_sent() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(4, 1));
    let id = h.read(0, 2);
    h.session.poll_transmits(h.now, &mut h.out);
    let tags: Vec<u32> = h.out.transmits.iter().map(|t| t.header.tag).collect();
    let frames = h.take_frames();
    // The sending thread was held up for 5 ms before the frames went out.
    h.now += 5 * MS;
    let first = target.answer(&frames[0].1, TARGET);
    h.receive(0, &first);
    h.session.sent(h.now, &tags); // the answered frame is skipped
    let sent_at = h.now;
    let rto = h.session.rtt().rto();
    let again = h.advance_until_sent();
    assert!(h.now - sent_at >= rto, "the timer started at the send");
    assert_eq!(lba_of(&again[0].1), 1);
    let answer = target.answer(&again[0].1, TARGET);
    h.receive(0, &answer);
    assert_eq!(h.results[&id], Ok(()));
}

#[test]
fn retransmissions_take_the_next_path() {
    let mut cfg = config(4, 1);
    cfg.paths = vec![path(0, INITIATOR, TARGET), path(1, INITIATOR_2, TARGET_2)];
    let mut h = Harness::new(cfg);
    let mut target = FakeTarget::new(64);
    let id = h.read(0, 4);
    let frames = h.transmit();
    // Round-robin over both paths, each with its own addresses.
    let sockets: Vec<usize> = frames.iter().map(|(s, _)| *s).collect();
    assert_eq!(sockets, [0, 1, 0, 1]);
    for (socket, frame) in &frames {
        let (header, _) = Header::parse(frame).unwrap();
        let expected = if *socket == 0 {
            (TARGET, INITIATOR)
        } else {
            (TARGET_2, INITIATOR_2)
        };
        assert_eq!((header.dst, header.src), expected);
    }
    // Nothing answered: each path's oldest frame is probed, on the other path; then
    // the frames held behind the probes, which count as lost once the probes are
    // answered, move over too.
    for _ in 0..2 {
        let again = h.advance(Duration::from_secs(1));
        let sockets: Vec<usize> = again.iter().map(|(s, _)| *s).collect();
        assert_eq!(sockets, [1, 0]);
        for (socket, frame) in &again {
            let mac = if *socket == 0 { TARGET } else { TARGET_2 };
            let answer = target.answer(frame, mac);
            assert!(matches!(h.receive(*socket, &answer), Handled::Read { .. }));
        }
    }
    assert_eq!(h.results[&id], Ok(()));
}

#[test]
fn a_dead_path_is_avoided_and_probed() {
    let mut cfg = config(8, 1);
    cfg.paths = vec![path(0, INITIATOR, TARGET), path(1, INITIATOR_2, TARGET_2)];
    let mut h = Harness::new(cfg);
    let mut target = FakeTarget::new(64);
    // Path 0 loses everything: requests still complete, through path 1.
    let mut sent_on_0 = Vec::new();
    for round in 0..100 {
        let id = h.read(round % 32, 2);
        let mut on_0 = 0;
        let mut frames = h.transmit();
        while !h.results.contains_key(&id) {
            for (socket, frame) in std::mem::take(&mut frames) {
                if socket == 0 {
                    on_0 += 1;
                    continue;
                }
                let answer = target.answer(&frame, TARGET_2);
                h.receive(1, &answer);
            }
            let wait = h.session.next_timeout().unwrap() - h.now;
            frames = h.advance(wait);
        }
        assert_eq!(h.results[&id], Ok(()));
        sent_on_0.push(on_0);
    }
    // After the first few rounds, only probes go to path 0.
    let later: usize = sent_on_0[10..].iter().sum();
    assert!(sent_on_0[..3].iter().sum::<usize>() >= 3, "{sent_on_0:?}");
    assert!(later <= 4, "{sent_on_0:?}");
    // Path 0 answers again: once a probe gets through, it takes its share again.
    let mut on_0 = 0;
    for round in 0..100 {
        h.now += 5 * MS;
        let id = h.read(round % 32, 2);
        for (socket, frame) in h.transmit() {
            let mac = if socket == 0 { TARGET } else { TARGET_2 };
            on_0 += usize::from(socket == 0);
            let answer = target.answer(&frame, mac);
            h.receive(socket, &answer);
        }
        assert_eq!(h.results[&id], Ok(()));
    }
    assert!(on_0 >= 60, "{on_0} of 200 frames on path 0");
}

#[test]
fn loss_halves_the_window_and_answers_grow_it_back() {
    let mut target = FakeTarget::new(256);
    let mut h = Harness::new(config(16, 1));
    h.read(0, 32);
    let frames = h.transmit();
    assert_eq!(frames.len(), 16);
    let again = h.advance(Duration::from_millis(200));
    assert_eq!(again.len(), 1, "only the oldest frame is probed");
    assert_eq!(h.session.cwnd(), 8.0);
    for (socket, frame) in again.iter().chain(&frames[1..]) {
        let answer = target.answer(frame, TARGET);
        h.receive(*socket, &answer);
    }
    // Only about half a window goes out now.
    let cwnd = h.session.cwnd();
    assert!((8.0..11.0).contains(&cwnd), "{cwnd}");
    let frames = h.transmit();
    assert_eq!(frames.len(), cwnd as usize);
    for (socket, frame) in &frames {
        let answer = target.answer(frame, TARGET);
        h.receive(*socket, &answer);
    }
    h.run(&mut target);
    for _ in 0..10 {
        h.read(0, 64);
        h.run(&mut target);
    }
    assert_eq!(h.session.cwnd(), 16.0);
}

#[test]
fn close_fails_everything_and_refuses_more() {
    let mut h = Harness::new(config(2, 1));
    let sent = h.read(0, 4);
    let queued = h.read(10, 1);
    assert_eq!(h.transmit().len(), 2);
    h.session.close(&mut h.out);
    h.collect();
    assert_eq!(h.results[&sent], Err(Fault::Closed));
    assert_eq!(h.results[&queued], Err(Fault::Closed));
    let late = h.read(0, 1);
    assert_eq!(h.results[&late], Err(Fault::Closed));
    assert!(h.transmit().is_empty());
    assert_eq!(h.session.in_flight(), 0);
}

/// A deterministic xorshift generator, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

#[test]
fn a_lossy_duplicating_reordering_link_still_delivers_every_byte() {
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let mut target = FakeTarget::new(512);
        let mut cfg = config(8, 3);
        cfg.timeout = Duration::from_secs(30);
        let mut h = Harness::new(cfg);
        let mut expected = target.disk.clone();
        // Writes one at a time (each spread over many frames), so the result is
        // defined; then every read at once.
        for _ in 0..12 {
            let lba = rng.next() % 400;
            let sectors = 1 + rng.next() % 100;
            let data: Vec<u8> = (0..sectors as usize * SECTOR_SIZE)
                .map(|_| rng.next() as u8)
                .collect();
            let at = lba as usize * SECTOR_SIZE;
            expected[at..at + data.len()].copy_from_slice(&data);
            let id = h.submit(Plan::write(lba, sectors), data);
            let mut frames = h.transmit();
            drive_lossy(&mut h, &mut target, &mut rng, &mut frames);
            assert_eq!(h.results.get(&id), Some(&Ok(())), "seed {seed} write {id}");
        }
        assert!(target.disk == expected, "seed {seed}: the disk differs");
        let mut reads = Vec::new();
        for _ in 0..30 {
            let lba = rng.next() % 400;
            let sectors = 1 + rng.next() % 100;
            reads.push((h.read(lba, sectors), lba));
        }
        let mut frames = h.transmit();
        drive_lossy(&mut h, &mut target, &mut rng, &mut frames);
        for (id, lba) in reads {
            assert_eq!(h.results.get(&id), Some(&Ok(())), "seed {seed} read {id}");
            let at = lba as usize * SECTOR_SIZE;
            let buffer = &h.buffers[&id];
            assert!(
                buffer[..] == expected[at..at + buffer.len()],
                "seed {seed}: read {id} differs"
            );
        }
        let stats = h.session.stats();
        assert!(stats.retransmits > 0 && stats.ignored > 0, "{stats:?}");
        assert_eq!(h.session.in_flight(), 0);
    }
}

/// Runs the link until the session is idle: each frame is lost with 10 %
/// probability, duplicated with 10 %, and answers arrive in shuffled batches.
fn drive_lossy(
    h: &mut Harness,
    target: &mut FakeTarget,
    rng: &mut Rng,
    frames: &mut Vec<(usize, Vec<u8>)>,
) {
    let mut rounds = 0;
    while h.session.requests() > 0 {
        rounds += 1;
        assert!(rounds < 100_000, "no progress");
        let mut answers = Vec::new();
        for (socket, frame) in frames.drain(..) {
            if rng.chance(10) {
                continue;
            }
            let answer = target.answer(&frame, TARGET);
            if rng.chance(10) {
                answers.push((socket, answer.clone()));
            }
            if !rng.chance(10) {
                answers.push((socket, answer));
            }
        }
        for i in (1..answers.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            answers.swap(i, j);
        }
        h.now += 20 * US;
        for (socket, answer) in &answers {
            h.receive(*socket, answer);
        }
        frames.extend(h.transmit());
        if frames.is_empty() {
            let wait = h
                .session
                .next_timeout()
                .map_or(MS, |due| due.saturating_duration_since(h.now));
            frames.extend(h.advance(wait));
        }
    }
}

#[test]
fn a_lost_write_frame_is_resent_on_its_own_path_a_read_on_the_other() {
    let mut cfg = config(16, 2);
    cfg.paths = vec![path(0, INITIATOR, TARGET), path(1, INITIATOR_2, TARGET_2)];
    for (write, expected_socket) in [(true, 0), (false, 1)] {
        let mut h = Harness::new(cfg.clone());
        if write {
            h.submit(Plan::write(0, 2), vec![7; 2 * SECTOR_SIZE]);
        } else {
            h.read(0, 2);
        }
        let first = h.transmit();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, 0, "the first frame goes out on path 0");
        // Nothing answers: the frame is resent.
        let again = h.advance_until_sent();
        assert_eq!(
            again[0].0, expected_socket,
            "write {write}: resent on socket {}",
            again[0].0
        );
    }
}

/// Data frames, config queries and identity checks go to `dst`.
fn dst_of(frame: &[u8]) -> MacAddr {
    Header::parse(frame).unwrap().0.dst
}

/// A session with a write and a read of four one-sector frames each in flight to a
/// target that then stops answering for `silence` (killed); returns their ids.
fn outage(h: &mut Harness, target: &FakeTarget, silence: Duration) -> (usize, usize) {
    h.session.set_identity(target.identity.clone());
    let data: Vec<u8> = (0..4 * SECTOR_SIZE).map(|i| (i % 239) as u8).collect();
    let write = h.submit(Plan::write(0, 4), data);
    let read = h.read(8, 4);
    let frames = h.transmit();
    assert_eq!(frames.len(), 8);
    let end = h.now + silence;
    while h.now < end {
        for (_, frame) in h.advance(MS) {
            assert_eq!(dst_of(&frame), TARGET, "probes go where the target was");
        }
    }
    assert!(h.results.is_empty(), "{:?}", h.results);
    (write, read)
}

/// Answers everything the session sends on a perfect link from `mac` until idle:
/// data frames, identity checks and config queries.
fn serve_from(h: &mut Harness, target: &mut FakeTarget, mac: MacAddr) {
    let mut frames = h.transmit();
    loop {
        let control: Vec<Control> = std::mem::take(&mut h.control);
        if frames.is_empty() && control.is_empty() {
            break;
        }
        for control in control {
            let answer = match control.purpose {
                Purpose::Rediscover => target.config_answer(&control.frame, mac),
                Purpose::Verify if dst_of(&control.frame) == mac => {
                    target.answer(&control.frame, mac)
                }
                Purpose::Verify => continue,
            };
            h.now += 10 * US;
            h.receive(control.socket, &answer);
        }
        for (socket, frame) in std::mem::take(&mut frames) {
            if dst_of(&frame) != mac {
                continue;
            }
            let answer = target.answer(&frame, mac);
            h.now += 10 * US;
            h.receive(socket, &answer);
        }
        frames = h.transmit();
    }
}

#[test]
fn a_target_back_under_a_new_mac_is_found_checked_and_sent_the_frames() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    let start = h.now;
    let (write, read) = outage(&mut h, &target, Duration::from_secs(3));

    // After a few unanswered probes, config queries for e1.2, broadcast on the
    // path's interface every 250 ms, while the data probes go on.
    let queries: Vec<&Control> = h.control.iter().collect();
    assert!(
        (11..=13).contains(&queries.len()),
        "{} queries",
        queries.len()
    );
    for query in &queries {
        assert_eq!(query.purpose, Purpose::Rediscover);
        assert_eq!((query.path, query.socket), (0, 0));
        let (header, body) = Header::parse(&query.frame).unwrap();
        assert_eq!((header.dst, header.src), (BROADCAST, INITIATOR));
        assert_eq!((header.shelf, header.slot), (1, 2));
        assert_eq!(header.command, Command::QueryConfig as u8);
        assert!(!header.response);
        assert_eq!(ConfigQuery::parse(body).unwrap().command, 0);
    }
    assert_eq!(
        h.events,
        vec![
            Event::Rediscovering { path: 0, socket: 0 },
            Event::Unreachable {
                path: 0,
                socket: 0,
                silent: OUTAGE_AFTER
            }
        ]
    );
    assert!(h.session.stats().probes >= 3);
    assert_eq!(h.session.stats().rediscoveries, queries.len() as u64);

    // Back, under another MAC: it answers the next query. Before any data goes to
    // it, an IDENTIFY checks that it is the device opened.
    let query = h.control.pop().unwrap();
    h.control.clear();
    let answer = target.config_answer(&query.frame, TARGET_2);
    assert_eq!(h.receive(0, &answer), Handled::Control);
    assert!(h.take_frames().is_empty(), "no data before the check");
    let check = h.control.pop().expect("an identity check");
    assert_eq!(check.purpose, Purpose::Verify);
    let (header, body) = Header::parse(&check.frame).unwrap();
    assert_eq!((header.dst, header.src), (TARGET_2, INITIATOR));
    assert_eq!(split_tag(header.tag).1, CONTROL_SLOT);
    assert_eq!(
        AtaArgs::parse(body).unwrap().0.cmd_status,
        ata::IDENTIFY_DEVICE
    );
    // An answer from the old MAC, or to a tag never sent, is not the check's.
    let late = target.answer(&check.frame, TARGET);
    assert_eq!(h.receive(0, &late), Handled::Ignored(Ignore::UnknownTag));
    let passed = target.answer(&check.frame, TARGET_2);
    assert_eq!(h.receive(0, &passed), Handled::Control);
    // Found elsewhere, and the outage is over.
    assert!(matches!(
        h.events[h.events.len() - 2..],
        [
            Event::Rediscovered {
                path: 0,
                socket: 0,
                previous: TARGET,
                target: TARGET_2
            },
            Event::Reachable {
                path: 0,
                socket: 0,
                target: TARGET_2,
                ..
            }
        ]
    ));
    assert_eq!(h.session.paths()[0].target, TARGET_2);

    // Every outstanding frame goes to the new MAC at once, and completes.
    let resent = h.take_frames();
    assert_eq!(resent.len(), 8);
    assert!(resent.iter().all(|(_, f)| dst_of(f) == TARGET_2));
    for (socket, frame) in resent {
        let answer = target.answer(&frame, TARGET_2);
        h.receive(socket, &answer);
    }
    assert_eq!(h.results[&write], Ok(()));
    assert_eq!(h.results[&read], Ok(()));
    assert!(h.now < start + Duration::from_secs(10));
    let expected: Vec<u8> = (0..4 * SECTOR_SIZE).map(|i| (i % 239) as u8).collect();
    assert_eq!(&target.disk[..4 * SECTOR_SIZE], &expected[..]);
    assert_eq!(
        h.buffers[&read],
        target.disk[8 * SECTOR_SIZE..12 * SECTOR_SIZE]
    );
    assert_eq!(h.session.stats().recoveries, 1);

    // From now on: no more queries, frames to the new MAC.
    let next = h.read(20, 3);
    serve_from(&mut h, &mut target, TARGET_2);
    assert_eq!(h.results[&next], Ok(()));
    let settled = h.now;
    while h.now < settled + Duration::from_secs(1) {
        assert!(h.advance(10 * MS).is_empty());
    }
    assert!(h.control.is_empty());
}

#[test]
fn a_target_back_at_its_mac_is_checked_and_probed_at_once() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    let (write, read) = outage(&mut h, &target, Duration::from_secs(3));
    let query = h.control.pop().unwrap();
    h.control.clear();
    // It answers the query at its old MAC: checked, then one frame (the oldest)
    // goes out at once rather than at the next probe up to a second later, and the
    // rest once that one is answered. A target that only stalled gets no window of
    // duplicates.
    let answer = target.config_answer(&query.frame, TARGET);
    assert_eq!(h.receive(0, &answer), Handled::Control);
    let check = h.control.pop().expect("an identity check");
    assert_eq!(dst_of(&check.frame), TARGET);
    let passed = target.answer(&check.frame, TARGET);
    assert_eq!(h.receive(0, &passed), Handled::Control);
    assert!(matches!(
        h.events[h.events.len() - 2..],
        [
            Event::Rediscovered { previous, target, .. },
            Event::Reachable { .. },
        ] if previous == target
    ));
    let probe = h.take_frames();
    assert_eq!(probe.len(), 1);
    assert_eq!(lba_of(&probe[0].1), 0);
    let answer = target.answer(&probe[0].1, TARGET);
    h.receive(0, &answer);
    let rest = h.advance_until_sent();
    assert_eq!(rest.len(), 7);
    for (socket, frame) in rest {
        let answer = target.answer(&frame, TARGET);
        h.receive(socket, &answer);
    }
    assert_eq!(h.results[&write], Ok(()));
    assert_eq!(h.results[&read], Ok(()));
}

#[test]
fn a_target_back_with_another_size_is_not_used() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    let (write, read) = outage(&mut h, &target, Duration::from_secs(2));
    // Restarted on a smaller file, at a new MAC.
    target.identity.sectors = 32;
    let query = h.control.pop().unwrap();
    let answer = target.config_answer(&query.frame, TARGET_2);
    h.receive(0, &answer);
    let check = h.control.pop().unwrap();
    let answer = target.answer(&check.frame, TARGET_2);
    h.receive(0, &answer);
    assert!(h.take_frames().is_empty(), "nothing is sent to it");
    for id in [write, read] {
        match &h.results[&id] {
            Err(Fault::Changed(why)) => {
                assert!(why.contains("02:00:00:00:00:bb"), "{why}");
                assert!(why.contains("32 sectors") && why.contains("64"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(h.session.in_flight(), 0);
    assert_eq!(h.session.paths()[0].target, TARGET);
    // And stays so: later requests fail at once.
    let late = h.read(0, 1);
    assert!(matches!(h.results[&late], Err(Fault::Changed(_))));
    assert!(h.transmit().is_empty());
}

#[test]
fn a_target_back_at_its_mac_on_another_device_fails_what_follows() {
    // It takes the probes before anything can tell: the first answer after the
    // outage starts a check, and when it shows another serial number (another
    // shelf.slot's device) everything in flight and everything later fails.
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    let (write, read) = outage(&mut h, &target, Duration::from_secs(2));
    target.identity.serial = "e1.3".into();
    h.control.clear();
    let probe = h.advance_until_sent();
    assert_eq!(probe.len(), 1);
    let answer = target.answer(&probe[0].1, TARGET);
    h.receive(0, &answer);
    let check = h.control.pop().expect("a check after the outage");
    assert_eq!(check.purpose, Purpose::Verify);
    assert_eq!(dst_of(&check.frame), TARGET);
    let answer = target.answer(&check.frame, TARGET);
    h.receive(0, &answer);
    let failed = [write, read]
        .iter()
        .filter(|id| matches!(&h.results[id], Err(Fault::Changed(why)) if why.contains("\"e1.3\"")))
        .count();
    assert!(failed >= 1, "{:?}", h.results);
    let late = h.read(0, 1);
    assert!(matches!(h.results[&late], Err(Fault::Changed(_))));
}

#[test]
fn a_target_that_stays_away_times_out_as_before_and_queries_stop() {
    let target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    let start = h.now;
    let (write, read) = outage(&mut h, &target, Duration::from_millis(9_990));
    h.advance(20 * MS);
    for id in [write, read] {
        assert!(matches!(
            h.results[&id],
            Err(Fault::TimedOut { silent: true, .. })
        ));
    }
    assert!(h.now < start + Duration::from_millis(10_020));
    h.control.clear();
    assert!(h.session.next_timeout().is_none());
    for _ in 0..10 {
        h.advance(100 * MS);
    }
    assert!(h.control.is_empty());
}

#[test]
fn only_a_path_that_lost_its_target_takes_another_mac() {
    // Two paths on one interface (a target with two ports on the segment): the
    // dead one does not take the MAC of the live one, and while both answer,
    // config answers change nothing.
    let mut cfg = config(8, 1);
    cfg.paths = vec![path(0, INITIATOR, TARGET), path(0, INITIATOR, TARGET_2)];
    let mut h = Harness::new(cfg);
    let mut target = FakeTarget::new(64);
    h.session.set_identity(target.identity.clone());
    let query = query_frame(INITIATOR, 1, 2, 9);
    let answer = target.config_answer(&query, [2, 0, 0, 0, 0, 0xcc]);
    assert_eq!(
        h.receive(0, &answer),
        Handled::Ignored(Ignore::OtherCommand)
    );
    // Path 0 dies; path 1 carries on.
    for round in 0..20 {
        let id = h.read(round, 2);
        let mut frames = h.transmit();
        while !h.results.contains_key(&id) {
            for (socket, frame) in std::mem::take(&mut frames) {
                if dst_of(&frame) == TARGET_2 {
                    let answer = target.answer(&frame, TARGET_2);
                    h.receive(socket, &answer);
                }
            }
            let wait = h.session.next_timeout().unwrap() - h.now;
            frames = h.advance(wait);
        }
        assert_eq!(h.results[&id], Ok(()));
        // Keep a frame outstanding on path 0 so it goes on rediscovering.
        h.now += 300 * MS;
    }
    let query = h
        .control
        .iter()
        .rev()
        .find(|c| c.purpose == Purpose::Rediscover);
    let query = query.expect("the dead path rediscovers").frame.clone();
    assert!(h.control.iter().all(|c| c.path == 0));
    h.control.clear();
    let answer = target.config_answer(&query, TARGET_2);
    h.receive(0, &answer);
    assert!(h.control.is_empty(), "path 1's MAC is not path 0's to take");
    assert_eq!(h.session.paths()[0].target, TARGET);
}

/// Polls, moving the clock on in steps of `step`, until the session sends
/// something; returns when, and what.
fn poll_until_sent(
    h: &mut Harness,
    step: Duration,
    limit: Duration,
) -> (Duration, Vec<(usize, Vec<u8>)>) {
    let start = h.now;
    while h.now - start < limit {
        h.now += step;
        h.session.handle_timeout(h.now, &mut h.out);
        let sent = h.transmit();
        if !sent.is_empty() {
            return (h.now - start, sent);
        }
    }
    panic!("nothing sent within {limit:?}");
}

#[test]
fn a_write_waits_while_a_copy_of_an_earlier_one_may_still_land() {
    let mut h = Harness::new(config(16, 2));
    let mut target = FakeTarget::new(64);
    // The old data: its first copy is held up on the way (a busy path, a target
    // thread that stalls); the retransmission gets there and is answered.
    let old = h.submit(Plan::write(0, 2), vec![1; 2 * SECTOR_SIZE]);
    let first = h.transmit();
    assert_eq!(first.len(), 1);
    let held_up = first[0].1.clone();
    let again = h.advance_until_sent();
    let answer = target.answer(&again[0].1, TARGET);
    h.receive(again[0].0, &answer);
    assert_eq!(h.results[&old], Ok(()));
    assert_eq!(h.session.stats().fences, 1);

    // New data for the same sectors must not go before the old copy can land.
    let new = h.submit(Plan::write(1, 2), vec![2; 2 * SECTOR_SIZE]);
    assert!(h.transmit().is_empty(), "the new write went out at once");
    let wake = h.session.next_timeout().expect("a timer for the fence");
    assert!(
        wake <= h.now + FENCE_LIFETIME,
        "no wake-up when the fence lapses"
    );
    // Half a fence later the old copy lands (its late answer is ignored): every
    // copy is accounted for, so the fence goes and the new write with it, long
    // before the fence would have lapsed; its data stays.
    h.now += FENCE_LIFETIME / 2;
    let late = target.answer(&held_up, TARGET);
    assert!(matches!(h.receive(0, &late), Handled::Ignored(_)));
    let (waited, sent) = poll_until_sent(&mut h, MS, FENCE_LIFETIME);
    assert!(
        waited <= 2 * MS,
        "the new write waited {waited:?} after the last copy was answered"
    );
    assert_eq!(sent.len(), 1);
    let answer = target.answer(&sent[0].1, TARGET);
    h.receive(sent[0].0, &answer);
    assert_eq!(h.results[&new], Ok(()));
    assert!(target.disk[SECTOR_SIZE..3 * SECTOR_SIZE]
        .iter()
        .all(|&b| b == 2));
    assert!(h.session.stats().fenced_waits >= 1);

    // A copy that never lands: the next write there waits the fence out.
    h.submit(Plan::write(40, 2), vec![5; 2 * SECTOR_SIZE]);
    assert_eq!(h.transmit().len(), 1, "lost on the way");
    let again = h.advance_until_sent();
    h.receive(again[0].0, &target.answer(&again[0].1, TARGET));
    h.submit(Plan::write(40, 2), vec![6; 2 * SECTOR_SIZE]);
    assert!(h.transmit().is_empty(), "the rewrite went out at once");
    let (waited, sent) = poll_until_sent(&mut h, MS, 2 * FENCE_LIFETIME);
    assert!(waited >= FENCE_LIFETIME - MS, "went after {waited:?}");
    h.receive(sent[0].0, &target.answer(&sent[0].1, TARGET));

    // Reads and writes elsewhere never wait for a fence.
    h.submit(Plan::write(8, 2), vec![3; 2 * SECTOR_SIZE]);
    assert_eq!(h.transmit().len(), 1, "lost on the way");
    let again = h.advance_until_sent();
    h.receive(again[0].0, &target.answer(&again[0].1, TARGET));
    let fences = h.session.stats().fences;
    assert_eq!(fences, 3, "the retransmitted write at 8 fenced its sectors");
    h.read(8, 2);
    assert_eq!(h.transmit().len(), 1, "a read of fenced sectors waited");
    h.submit(Plan::write(20, 2), vec![4; 2 * SECTOR_SIZE]);
    assert_eq!(h.transmit().len(), 1, "a write elsewhere waited");
}

#[test]
fn a_fence_goes_only_when_every_copy_is_answered_whichever_came_first() {
    let mut h = Harness::new(config(16, 2));
    let mut target = FakeTarget::new(64);
    // Three copies: the first two held up, the third answered.
    h.submit(Plan::write(0, 2), vec![1; 2 * SECTOR_SIZE]);
    let mut copies = vec![h.transmit()[0].1.clone()];
    copies.push(h.advance_until_sent()[0].1.clone());
    let third = h.advance_until_sent();
    h.receive(third[0].0, &target.answer(&third[0].1, TARGET));
    h.submit(Plan::write(0, 2), vec![2; 2 * SECTOR_SIZE]);
    assert!(h.transmit().is_empty(), "the new write went out at once");
    // One late copy lands: another is still on the way.
    let late = target.answer(&copies[1], TARGET);
    assert!(matches!(h.receive(0, &late), Handled::Ignored(_)));
    h.advance(MS);
    assert!(h.transmit().is_empty(), "went with a copy still on the way");
    // The last lands: the new write goes.
    let late = target.answer(&copies[0], TARGET);
    assert!(matches!(h.receive(0, &late), Handled::Ignored(_)));
    let (waited, sent) = poll_until_sent(&mut h, MS, FENCE_LIFETIME);
    assert!(waited <= 2 * MS, "waited {waited:?}");
    h.receive(sent[0].0, &target.answer(&sent[0].1, TARGET));
    assert!(target.disk[..2 * SECTOR_SIZE].iter().all(|&b| b == 2));

    // The first copy answered first: the fence waits for the retransmission's.
    h.submit(Plan::write(20, 2), vec![3; 2 * SECTOR_SIZE]);
    let first = h.transmit();
    let retransmission = h.advance_until_sent()[0].1.clone();
    h.receive(first[0].0, &target.answer(&first[0].1, TARGET));
    h.submit(Plan::write(20, 2), vec![4; 2 * SECTOR_SIZE]);
    h.advance(MS);
    assert!(
        h.transmit().is_empty(),
        "went with the retransmission on the way"
    );
    let late = target.answer(&retransmission, TARGET);
    assert!(matches!(h.receive(0, &late), Handled::Ignored(_)));
    let (waited, sent) = poll_until_sent(&mut h, MS, FENCE_LIFETIME);
    assert!(waited <= 2 * MS, "waited {waited:?}");
    h.receive(sent[0].0, &target.answer(&sent[0].1, TARGET));
    assert!(target.disk[20 * SECTOR_SIZE..22 * SECTOR_SIZE]
        .iter()
        .all(|&b| b == 4));
}

#[test]
fn a_write_that_failed_with_copies_outstanding_fences_its_sectors() {
    let mut cfg = config(16, 2);
    cfg.timeout = Duration::from_millis(200);
    let mut h = Harness::new(cfg);
    let mut target = FakeTarget::new(64);
    // Nothing answers until the write fails; its copies may still be on the way.
    let lost = h.submit(Plan::write(4, 2), vec![1; 2 * SECTOR_SIZE]);
    h.transmit();
    while !h.results.contains_key(&lost) {
        h.advance(MS);
    }
    assert!(matches!(h.results[&lost], Err(Fault::TimedOut { .. })));
    // The caller writes the sectors again: that waits out the fence.
    h.submit(Plan::write(4, 2), vec![2; 2 * SECTOR_SIZE]);
    assert!(h.transmit().is_empty(), "the rewrite went out at once");
    let (waited, sent) = poll_until_sent(&mut h, MS, 2 * FENCE_LIFETIME);
    assert!(waited >= FENCE_LIFETIME - MS, "went after {waited:?}");
    h.receive(sent[0].0, &target.answer(&sent[0].1, TARGET));
    assert!(target.disk[4 * SECTOR_SIZE..6 * SECTOR_SIZE]
        .iter()
        .all(|&b| b == 2));
}

/// What a driver logs at INFO or louder for the events so far, as `engine.rs` does.
fn loud_messages(h: &Harness) -> Vec<String> {
    h.events
        .iter()
        .map(|event| event.message("e1.2", "eth0"))
        .filter(|(level, _)| *level <= tracing::Level::INFO)
        .map(|(_, message)| message)
        .collect()
}

/// Answers everything the session sent or sends from `TARGET` until `id` finished:
/// `pending` first (frames sent while the target was away), then whatever comes.
fn finish(h: &mut Harness, target: &mut FakeTarget, pending: Vec<(usize, Vec<u8>)>, id: usize) {
    serve_from(h, target, TARGET);
    for (socket, frame) in pending {
        let answer = target.answer(&frame, TARGET);
        h.now += 10 * US;
        h.receive(socket, &answer);
    }
    let start = h.now;
    while !h.results.contains_key(&id) {
        assert!(h.now < start + Duration::from_secs(5), "{:?}", h.results);
        for (socket, frame) in h.advance(MS) {
            let answer = target.answer(&frame, TARGET);
            h.receive(socket, &answer);
        }
        serve_from(h, target, TARGET);
    }
    assert_eq!(h.results[&id], Ok(()));
}

#[test]
fn a_healthy_exchange_and_a_single_retransmission_report_no_recovery() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    h.session.set_identity(target.identity.clone());
    // Plain exchanges.
    let read = h.read(0, 16);
    let data = vec![7u8; 4 * SECTOR_SIZE];
    let write = h.submit(Plan::write(20, 4), data);
    h.run(&mut target);
    assert_eq!(h.results[&read], Ok(()));
    assert_eq!(h.results[&write], Ok(()));
    // One frame lost while the others are answered: retransmitted once.
    let id = h.read(0, 2);
    let frames = h.transmit();
    let answer = target.answer(&frames[1].1, TARGET);
    h.receive(0, &answer);
    let again = h.advance_until_sent();
    assert_eq!(again.len(), 1);
    let answer = target.answer(&again[0].1, TARGET);
    h.receive(0, &answer);
    assert_eq!(h.results[&id], Ok(()));
    assert_eq!(h.session.stats().retransmits, 1);
    assert!(h.events.is_empty(), "{:?}", h.events);
    assert!(h.control.is_empty());
    assert_eq!(h.session.stats().outages, 0);
}

#[test]
fn a_target_stalled_for_a_moment_reports_no_recovery() {
    // The target stops answering for 30 ms (a flush, writeback): after a few
    // unanswered probes the session looks for it (config queries) and checks it
    // when it answers, but it never was away; nothing is logged above DEBUG.
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(16, 1));
    h.session.set_identity(target.identity.clone());
    let id = h.read(0, 16);
    let mut pending = h.transmit();
    let end = h.now + 30 * MS;
    while h.now < end {
        pending.extend(h.advance(50 * US));
    }
    assert!(h.session.stats().probes >= 3);
    assert!(
        h.control.iter().any(|c| c.purpose == Purpose::Rediscover),
        "rediscovery started"
    );
    // Its receive thread answers the config query first, then the rest.
    finish(&mut h, &mut target, pending, id);
    assert!(h.session.stats().recoveries >= 1);
    assert_eq!(loud_messages(&h), Vec::<String>::new(), "{:?}", h.events);
    assert!(
        !h.events
            .iter()
            .any(|e| matches!(e, Event::Unreachable { .. } | Event::Reachable { .. })),
        "{:?}",
        h.events
    );
    assert_eq!(h.session.stats().outages, 0);
}

#[test]
fn a_real_outage_is_reported_and_then_its_end() {
    let mut target = FakeTarget::new(64);
    let mut h = Harness::new(config(8, 1));
    let start = h.now;
    let (write, read) = outage(&mut h, &target, Duration::from_secs(3));
    // Once, when it has answered nothing for OUTAGE_AFTER.
    let unreachable: Vec<&Event> = h
        .events
        .iter()
        .filter(|e| matches!(e, Event::Unreachable { .. }))
        .collect();
    assert_eq!(unreachable.len(), 1, "{:?}", h.events);
    let Event::Unreachable {
        path,
        socket,
        silent,
    } = *unreachable[0]
    else {
        unreachable!()
    };
    assert_eq!((path, socket), (0, 0));
    assert!(
        silent >= OUTAGE_AFTER && silent < OUTAGE_AFTER + 10 * MS,
        "{silent:?}"
    );
    assert_eq!(
        loud_messages(&h),
        vec![
            "AoE e1.2: the target does not answer on eth0 (nothing for 2.0 s); still trying"
                .to_string()
        ]
    );
    assert_eq!(h.session.stats().outages, 1);

    // Back at its MAC: checked, then reported.
    let mut target_back = FakeTarget::new(64);
    target_back.disk = target.disk.clone();
    target = target_back;
    finish(&mut h, &mut target, Vec::new(), read);
    assert_eq!(h.results[&write], Ok(()));
    let Some(&Event::Reachable {
        path: 0,
        socket: 0,
        target: mac,
        after,
    }) = h.events.last()
    else {
        panic!("{:?}", h.events);
    };
    assert_eq!(mac, TARGET);
    assert!(
        after >= Duration::from_secs(3) && after < h.now - start,
        "{after:?}"
    );
    let loud = loud_messages(&h);
    assert_eq!(loud.len(), 2, "{loud:?}");
    assert!(
        loud[1].starts_with(
            "AoE e1.2: the target answers again at 02:00:00:00:00:aa on eth0 after 3."
        ),
        "{loud:?}"
    );
    assert_eq!(h.session.stats().outages, 1);
}
