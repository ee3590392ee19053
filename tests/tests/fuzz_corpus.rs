//! The fuzz targets' seed corpus (`fuzz/corpus/TARGET/NAME`), built here from our own
//! encoders: a valid NBD session, AoE frames of every command, iSCSI logins,
//! commands and a full feature phase session, SCSI CDBs with their data, NVMe/TCP
//! PDUs of every type and NVMe admin and I/O commands. Short fuzzing runs start from
//! these, already past the first checks of every parser; the tests below replay or
//! decode the seeds to keep it so.
//!
//! The test fails when a committed seed differs from what the encoders make now (a
//! codec changed and the corpus is stale). `BLOCKWIRE_BLESS_FUZZ_CORPUS=1 cargo test
//! -p blockwire-tests --test fuzz_corpus` writes them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_aoe::wire::{ata, encode_frame, AtaArgs, Body, Command, ConfigQuery, Header};
use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_iscsi::login::{LoginConfig, Negotiated, SessionType};
use blockwire_iscsi::pdu::{
    Bhs, DataOut, LoginRequest, LogoutReason, LogoutRequest, NopOut, Pdu, ScsiCommand,
    TaskAttribute, TaskFunction, TaskMgmtRequest, BHS_LEN, RESERVED_TAG,
};
use blockwire_iscsi::target::full_feature::{FullFeature, Timers, Work};
use blockwire_iscsi::target::tasks::Tasks;
use blockwire_nbd::wire::*;
use blockwire_nvme::controller::{Action, Core, Queue, Settings, Subsystem};
use blockwire_nvme::cqe::{Cqe, Status};
use blockwire_nvme::fabrics::{Connect, ConnectData, PropertyCommand, DYNAMIC_CNTLID};
use blockwire_nvme::opcodes::{admin, cns, feature, io, log};
use blockwire_nvme::pdu::{
    self as nvme_pdu, fes, C2HData, CapsuleCmd, CapsuleResp, H2CData, IcReq, IcResp, TermReq, R2T,
};
use blockwire_nvme::{Digests, SglDescriptor, Sqe};
use blockwire_server::serve_iscsi::{self, IscsiExport};

type Corpus = BTreeMap<(&'static str, &'static str), Vec<u8>>;

fn nbd_request(out: &mut Vec<u8>, command: u16, flags: u16, offset: u64, len: u32) {
    nbd_request_framed(out, Framing::Structured, command, flags, offset, len);
}

fn nbd_request_framed(
    out: &mut Vec<u8>,
    framing: Framing,
    command: u16,
    flags: u16,
    offset: u64,
    len: u32,
) {
    Request {
        flags,
        command,
        cookie: out.len() as u64,
        offset,
        len: len.into(),
    }
    .encode_framed(framing, out);
}

/// A client's side of a whole NBD session: the handshake with `options`, then
/// every command once.
fn nbd_session(options: &[(u32, Vec<u8>)]) -> Vec<u8> {
    nbd_session_framed(options, Framing::Structured)
}

/// [`nbd_session`] with requests framed as `framing` says (extended headers once
/// NBD_OPT_EXTENDED_HEADERS is among the options).
fn nbd_session_framed(options: &[(u32, Vec<u8>)], framing: Framing) -> Vec<u8> {
    let nbd_request = |out: &mut Vec<u8>, command, flags, offset, len| {
        nbd_request_framed(out, framing, command, flags, offset, len)
    };
    let mut out = (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    for (option, data) in options {
        OptionHeader::encode(&mut out, *option, data);
    }
    nbd_request(&mut out, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 4096, 512);
    out.extend_from_slice(&[0xa5; 512]);
    nbd_request(&mut out, NBD_CMD_READ, 0, 4096, 512);
    nbd_request(&mut out, NBD_CMD_FLUSH, 0, 0, 0);
    nbd_request(&mut out, NBD_CMD_TRIM, 0, 65536, 65536);
    nbd_request(
        &mut out,
        NBD_CMD_WRITE_ZEROES,
        NBD_CMD_FLAG_NO_HOLE,
        0,
        8192,
    );
    nbd_request(
        &mut out,
        NBD_CMD_BLOCK_STATUS,
        NBD_CMD_FLAG_REQ_ONE,
        0,
        1 << 20,
    );
    nbd_request(&mut out, NBD_CMD_CACHE, 0, 0, 65536);
    nbd_request(&mut out, NBD_CMD_DISC, 0, 0, 0);
    out
}

fn go(name: &str) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&3u16.to_be_bytes()); // NBD_INFO_BLOCK_SIZE
    data
}

fn meta_context() -> Vec<u8> {
    let mut data = 0u32.to_be_bytes().to_vec();
    data.extend_from_slice(&1u32.to_be_bytes());
    let query = b"base:allocation";
    data.extend_from_slice(&(query.len() as u32).to_be_bytes());
    data.extend_from_slice(query);
    data
}

fn nbd(corpus: &mut Corpus) {
    let structured = nbd_session(&[
        (NBD_OPT_LIST, Vec::new()),
        (NBD_OPT_STRUCTURED_REPLY, Vec::new()),
        (NBD_OPT_SET_META_CONTEXT, meta_context()),
        (NBD_OPT_GO, go("")),
    ]);
    let export_name = nbd_session(&[(NBD_OPT_EXPORT_NAME, Vec::new())]);
    let extended = nbd_session_framed(
        &[
            (NBD_OPT_EXTENDED_HEADERS, Vec::new()),
            (NBD_OPT_SET_META_CONTEXT, meta_context()),
            (NBD_OPT_GO, go("")),
        ],
        Framing::Extended,
    );
    let mut extended_reading = vec![0x00];
    extended_reading.extend_from_slice(&extended);
    corpus.insert(("nbd_server", "extended-session"), extended_reading);
    // nbd_server: the first byte says how the client reads its replies.
    let mut reading = vec![0x00];
    reading.extend_from_slice(&structured);
    corpus.insert(("nbd_server", "structured-session"), reading);
    let mut stops = vec![0x81];
    stops.extend_from_slice(&structured);
    corpus.insert(("nbd_server", "client-stops-reading"), stops);
    let mut simple = vec![0x00];
    simple.extend_from_slice(&export_name);
    corpus.insert(("nbd_server", "export-name-session"), simple);

    let mut request = Vec::new();
    nbd_request(&mut request, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 4096, 512);
    corpus.insert(("nbd_wire", "request"), request);
    let mut extended_request = Vec::new();
    nbd_request_framed(
        &mut extended_request,
        Framing::Extended,
        NBD_CMD_WRITE,
        NBD_CMD_FLAG_PAYLOAD_LEN,
        4096,
        512,
    );
    corpus.insert(("nbd_wire", "extended-request"), extended_request);
    let mut extended_status = Vec::new();
    ChunkFrame::extended(7, 0).block_status(&mut extended_status, 1, &[(1 << 33, 3)], true);
    corpus.insert(("nbd_wire", "extended-block-status-reply"), extended_status);
    let mut option = Vec::new();
    OptionHeader::encode(&mut option, NBD_OPT_GO, &go("disk"));
    corpus.insert(("nbd_wire", "option-go"), option);
    let mut chunk = Vec::new();
    encode_block_status(&mut chunk, 7, 1, &[(4096, 0), (8192, 3)], true);
    corpus.insert(("nbd_wire", "block-status-reply"), chunk);
    let mut error = Vec::new();
    encode_error_chunk(&mut error, 7, 22, "bad");
    corpus.insert(("nbd_wire", "error-chunk"), error);
}

const TARGET: [u8; 6] = [2, 0, 0, 0, 0, 1];
const INITIATOR: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// AoE frames of every command the target answers, to shelf 1 slot 1.
fn aoe_frames() -> Vec<(&'static str, Vec<u8>)> {
    let ata_frame = |tag: u32, cmd: u8, lba: u64, count: u8, data: &[u8]| {
        let header = Header::request(TARGET, INITIATOR, 1, 1, Command::Ata, tag);
        let args = AtaArgs {
            extended: true,
            write: !data.is_empty(),
            sector_count: count,
            cmd_status: cmd,
            lba,
            ..AtaArgs::default()
        };
        let mut frame = Vec::new();
        encode_frame(&header, &Body::Ata(args, data), &mut frame);
        frame
    };
    let query = {
        let header = Header::request(TARGET, INITIATOR, 1, 1, Command::QueryConfig, 1);
        let body = ConfigQuery {
            buffer_count: 0,
            firmware_version: 0,
            sector_count: 0,
            aoe_version: 1,
            command: 0,
            config: b"",
        };
        let mut frame = Vec::new();
        encode_frame(&header, &Body::QueryConfig(body), &mut frame);
        frame
    };
    vec![
        ("query-config", query),
        ("identify", ata_frame(2, ata::IDENTIFY_DEVICE, 0, 1, &[])),
        (
            "write-2",
            ata_frame(3, ata::WRITE_SECTORS_EXT, 8, 2, &[0x5a; 1024]),
        ),
        (
            "write-2-next",
            ata_frame(4, ata::WRITE_SECTORS_EXT, 10, 2, &[0xa5; 1024]),
        ),
        ("read-2", ata_frame(5, ata::READ_SECTORS_EXT, 8, 2, &[])),
        ("flush", ata_frame(6, ata::FLUSH_CACHE_EXT, 0, 0, &[])),
    ]
}

fn aoe(corpus: &mut Corpus) {
    let frames = aoe_frames();
    for (name, frame) in &frames {
        corpus.insert(("aoe_wire", name), frame.clone());
    }
    // aoe_target: a device choice byte, then frames without the Ethernet addresses
    // and type, each after its length; two writes in one batch and the rest in the
    // next, so a run is held across the batch boundary.
    for (name, choice) in [("inline-device", 0u8), ("worker-device", 1)] {
        let mut input = vec![choice];
        for (i, (_, frame)) in frames.iter().enumerate() {
            let body = &frame[14..];
            let mut len = body.len() as u16;
            if i == 3 {
                len |= 0x8000;
            }
            input.extend_from_slice(&len.to_be_bytes());
            input.extend_from_slice(body);
        }
        corpus.insert(("aoe_target", name), input);
    }
}

fn text(keys: &[&str]) -> Vec<u8> {
    keys.iter().flat_map(|key| key.bytes().chain([0])).collect()
}

fn login(stage: u8, next: u8) -> Pdu {
    Pdu::LoginRequest(LoginRequest {
        transit: true,
        continue_bit: false,
        current_stage: stage,
        next_stage: next,
        version_max: 0,
        version_min: 0,
        isid: 0x23d0_0000_0001,
        tsih: 0,
        initiator_task_tag: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    })
}

fn iscsi(corpus: &mut Corpus) {
    let bhs = |pdu: &Pdu, data_len: u32| pdu.encode(data_len).bhs.0.to_vec();
    let security = text(&[
        "InitiatorName=iqn.i:b",
        "TargetName=iqn.t:b",
        "AuthMethod=None",
    ]);
    let operational = text(&[
        "HeaderDigest=None",
        "DataDigest=None",
        "MaxRecvDataSegmentLength=65536",
        "ImmediateData=Yes",
        "InitialR2T=No",
        "MaxBurstLength=262144",
        "FirstBurstLength=65536",
    ]);
    // iscsi_login: a selector byte, then records of a 48-byte header, a two-byte
    // length and that much text.
    let mut input = vec![0u8];
    for (pdu, keys) in [(login(0, 1), &security), (login(1, 3), &operational)] {
        input.extend_from_slice(&bhs(&pdu, keys.len() as u32));
        input.extend_from_slice(&(keys.len() as u16).to_be_bytes());
        input.extend_from_slice(keys);
    }
    corpus.insert(("iscsi_login", "normal-session"), input);
    let discovery = text(&[
        "InitiatorName=iqn.i:b",
        "SessionType=Discovery",
        "AuthMethod=None",
    ]);
    let mut input = vec![0u8];
    input.extend_from_slice(&bhs(&login(0, 3), discovery.len() as u32));
    input.extend_from_slice(&(discovery.len() as u16).to_be_bytes());
    input.extend_from_slice(&discovery);
    corpus.insert(("iscsi_login", "discovery-session"), input);

    corpus.insert(
        ("iscsi_pdu", "login"),
        bhs(&login(0, 1), security.len() as u32),
    );
    let mut cdb = vec![0x2a, 0, 0, 0, 0, 8, 0, 0, 2, 0];
    cdb.resize(16, 0);
    let write = Pdu::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: false,
        write: true,
        attribute: TaskAttribute::Simple,
        lun: 0,
        initiator_task_tag: 2,
        expected_data_transfer_length: 1024,
        cmd_sn: 2,
        exp_stat_sn: 1,
        cdb,
        bidi_read_length: None,
    });
    corpus.insert(("iscsi_pdu", "scsi-write"), bhs(&write, 1024));
}

/// One scsi_cdb record: control byte (nexus, LUN, CDB length, data blocks), CDB,
/// data-out.
fn scsi_command(out: &mut Vec<u8>, nexus: u8, cdb: &[u8], data: &[u8]) {
    let length_code = match cdb.len() {
        6 => 0,
        10 => 1,
        12 => 2,
        _ => 3,
    };
    assert_eq!(data.len() % 512, 0);
    out.push(nexus | length_code << 2 | ((data.len() / 512) as u8) << 4);
    out.extend_from_slice(cdb);
    out.extend_from_slice(data);
}

fn scsi(corpus: &mut Corpus) {
    let mut io = Vec::new();
    scsi_command(&mut io, 0, &[0x12, 0, 0, 0, 96, 0], &[]); // INQUIRY
    scsi_command(&mut io, 0, &[0x12, 1, 0x83, 0, 255, 0], &[]); // INQUIRY VPD 83h
    scsi_command(
        &mut io,
        0,
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
        &[],
    ); // READ CAPACITY (16)
    scsi_command(
        &mut io,
        0,
        &[0x2a, 0x08, 0, 0, 0, 8, 0, 0, 1, 0],
        &[0x5a; 512],
    ); // WRITE (10), FUA
    scsi_command(&mut io, 0, &[0x28, 0, 0, 0, 0, 8, 0, 0, 1, 0], &[]); // READ (10)
    scsi_command(&mut io, 0, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]); // SYNCHRONIZE CACHE (10)
    scsi_command(&mut io, 0, &[0x1a, 0, 0x3f, 0, 255, 0], &[]); // MODE SENSE (6), all pages
    let mut unmap = vec![
        0, 22, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 8, 0, 0, 0, 0,
    ];
    unmap.resize(512, 0);
    scsi_command(&mut io, 0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &unmap); // UNMAP
    corpus.insert(("scsi_cdb", "inquiry-write-read-unmap"), io);

    let mut reservations = Vec::new();
    let mut register = vec![0; 24];
    register[8..16].copy_from_slice(&0x1234u64.to_be_bytes());
    register.resize(512, 0);
    // PERSISTENT RESERVE OUT, REGISTER (parameter list length 24), then RESERVE with
    // type 1 (write exclusive), then a write from the other nexus.
    scsi_command(
        &mut reservations,
        0,
        &[0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0],
        &register,
    );
    let mut reserve = vec![0; 24];
    reserve[..8].copy_from_slice(&0x1234u64.to_be_bytes());
    reserve.resize(512, 0);
    scsi_command(
        &mut reservations,
        0,
        &[0x5f, 1, 1, 0, 0, 0, 0, 0, 24, 0],
        &reserve,
    );
    scsi_command(
        &mut reservations,
        1,
        &[0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        &[1; 512],
    );
    scsi_command(&mut reservations, 1, &[0x03, 0, 0, 0, 252, 0], &[]); // REQUEST SENSE
    scsi_command(
        &mut reservations,
        0,
        &[0x5e, 0, 0, 0, 0, 0, 0, 4, 0, 0],
        &[],
    ); // PERSISTENT RESERVE IN
    corpus.insert(("scsi_cdb", "reservations"), reservations);
}

/// One record of an iscsi_session input: a PDU from the initiator with its data
/// segment, or the clock moving on by `half_seconds` × 500 ms.
enum SessionRecord {
    Pdu(Pdu, Vec<u8>),
    Clock { half_seconds: u8 },
}

/// The opcodes iscsi_session forces, in the order its control byte picks them.
const ISCSI_SESSION_OPCODES: [u8; 6] = [0x01, 0x05, 0x02, 0x00, 0x04, 0x06];

/// An iscsi_session input: the setup byte (the negotiated parameters), then each
/// record as a control byte, for a PDU its 48-byte header and its data segment.
fn iscsi_session_input(setup: u8, records: &[SessionRecord]) -> Vec<u8> {
    let mut input = vec![setup];
    for record in records {
        match record {
            SessionRecord::Pdu(pdu, data) => {
                let header = pdu.encode(data.len() as u32);
                assert!(header.ahs.is_empty(), "iscsi_session takes no AHS");
                let opcode = header.bhs.0[0] & 0x3f;
                let kind = ISCSI_SESSION_OPCODES
                    .iter()
                    .position(|&o| o == opcode)
                    .expect("an opcode the initiator sends");
                input.push(kind as u8);
                input.extend_from_slice(&header.bhs.0);
                input.extend_from_slice(data);
            }
            SessionRecord::Clock { half_seconds } => {
                assert!(*half_seconds < 32);
                input.push(7 | half_seconds << 3);
            }
        }
    }
    input
}

fn cdb10(opcode: u8, lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = vec![0u8; 16];
    cdb[0] = opcode;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

/// A READ (10) or WRITE (10) for LUN 0 of 512-byte blocks, no unsolicited
/// Data-Out to follow.
fn iscsi_rw(write: bool, itt: u32, cmd_sn: u32, lba: u32, blocks: u16) -> Pdu {
    Pdu::ScsiCommand(ScsiCommand {
        immediate: false,
        final_bit: true,
        read: !write,
        write,
        attribute: TaskAttribute::Simple,
        lun: 0,
        initiator_task_tag: itt,
        expected_data_transfer_length: u32::from(blocks) * 512,
        cmd_sn,
        exp_stat_sn: 0,
        cdb: cdb10(if write { 0x2a } else { 0x28 }, lba, blocks),
        bidi_read_length: None,
    })
}

fn iscsi_data_out(itt: u32, ttt: u32, offset: u32) -> Pdu {
    Pdu::DataOut(DataOut {
        final_bit: true,
        lun: 0,
        initiator_task_tag: itt,
        target_transfer_tag: ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: offset,
    })
}

/// The iscsi_session setup byte: a normal session, MaxBurstLength 4096,
/// FirstBurstLength 2048, one R2T outstanding, ImmediateData=Yes, and InitialR2T
/// as asked.
fn iscsi_setup(initial_r2t: bool) -> u8 {
    0x20 | if initial_r2t { 0x10 } else { 0 }
}

/// The iscsi_session seeds: (name, setup byte, records). The phase starts with
/// ExpCmdSN 0 and gives the first R2T the transfer tag 1.
fn iscsi_session_records() -> Vec<(&'static str, u8, Vec<SessionRecord>)> {
    use SessionRecord::{Clock, Pdu as P};
    let session = vec![
        P(iscsi_rw(false, 1, 0, 8, 2), Vec::new()),
        // 512 bytes of immediate data: the whole write, no R2T.
        P(iscsi_rw(true, 2, 1, 8, 1), vec![0x5a; 512]),
        // No immediate data: the target asks for it with R2T 1.
        P(iscsi_rw(true, 3, 2, 16, 2), Vec::new()),
        P(iscsi_data_out(3, 1, 0), vec![0xa5; 1024]),
        // A write left waiting for its R2T's data, then aborted.
        P(iscsi_rw(true, 4, 3, 24, 2), Vec::new()),
        P(
            Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate: true,
                function: TaskFunction::AbortTask,
                lun: 0,
                initiator_task_tag: 5,
                referenced_task_tag: 4,
                cmd_sn: 4,
                exp_stat_sn: 0,
                ref_cmd_sn: 3,
                exp_data_sn: 0,
            }),
            Vec::new(),
        ),
        P(
            Pdu::NopOut(NopOut {
                immediate: true,
                lun: 0,
                initiator_task_tag: 6,
                target_transfer_tag: RESERVED_TAG,
                cmd_sn: 4,
                exp_stat_sn: 0,
            }),
            b"ping".to_vec(),
        ),
        P(
            Pdu::LogoutRequest(LogoutRequest {
                immediate: false,
                reason: LogoutReason::CloseSession,
                initiator_task_tag: 7,
                cid: 1,
                cmd_sn: 4,
                exp_stat_sn: 0,
            }),
            Vec::new(),
        ),
    ];
    // InitialR2T=Yes: immediate data only, the rest after an R2T; then the clock
    // runs past the NOP-In interval and its timeout.
    let initial_r2t = vec![
        P(iscsi_rw(true, 1, 0, 0, 4), vec![0x11; 512]),
        P(iscsi_data_out(1, 1, 512), vec![0x22; 1536]),
        P(iscsi_rw(false, 2, 1, 0, 4), Vec::new()),
        Clock { half_seconds: 12 },
        Clock { half_seconds: 12 },
    ];
    vec![
        ("read-write-abort-nop-logout", iscsi_setup(false), session),
        ("initial-r2t-then-idle", iscsi_setup(true), initial_r2t),
    ]
}

fn iscsi_session_seeds() -> Vec<(&'static str, Vec<u8>)> {
    iscsi_session_records()
        .into_iter()
        .map(|(name, setup, records)| (name, iscsi_session_input(setup, &records)))
        .collect()
}

/// The nvme_pdu mode byte: digests in bits 1:0, the sender's PDA in bits 4:2.
const NVME_PLAIN: u8 = 0;
const NVME_DIGESTS: u8 = 3;
const NVME_DIGESTS_PDA: u8 = 3 | 3 << 2;

fn nvme_framing(mode: u8) -> nvme_pdu::Framing {
    nvme_pdu::Framing {
        digests: Digests::from_byte(mode & 3),
        send_pda: (mode >> 2) & 7,
        ..nvme_pdu::Framing::default()
    }
}

const NVME_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";
/// The namespace every subsystem serves.
const NSID: u32 = 1;

/// An NVM read, write or compare of `blocks` 512-byte blocks from `slba`: a
/// read's data moves by C2HData, the others' in the capsule.
fn nvme_rw(opcode: u8, cid: u16, slba: u64, blocks: u16) -> Sqe {
    let mut sqe = Sqe::new(opcode, cid);
    sqe.set_nsid(NSID);
    sqe.set_cdw10_11(slba);
    sqe.set_cdw(12, u32::from(blocks - 1));
    let len = u32::from(blocks) * 512;
    sqe.set_sgl(if opcode == io::READ {
        SglDescriptor::transport(len)
    } else {
        SglDescriptor::in_capsule(len)
    });
    sqe
}

/// The nvme_pdu seeds: (name, mode byte, PDU).
fn nvme_pdu_seeds() -> Vec<(&'static str, u8, nvme_pdu::Pdu)> {
    use nvme_pdu::Pdu;
    let connect = Pdu::CapsuleCmd(CapsuleCmd {
        sqe: Connect {
            cid: 1,
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 120_000,
        }
        .to_sqe(),
        data: ConnectData {
            host_id: [1; 16],
            cntlid: DYNAMIC_CNTLID,
            subnqn: blockwire_nvme::default_nqn("fuzz"),
            hostnqn: NVME_HOST.into(),
        }
        .to_bytes(),
    });
    let read = Pdu::CapsuleCmd(CapsuleCmd {
        sqe: nvme_rw(io::READ, 3, 8, 1),
        data: Vec::new(),
    });
    let write = Pdu::CapsuleCmd(CapsuleCmd {
        sqe: nvme_rw(io::WRITE, 4, 8, 1),
        data: vec![0x5a; 512],
    });
    let response = Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe {
            result: 0,
            sq_head: 2,
            sq_id: 1,
            cid: 4,
            status: Status::SUCCESS,
        },
    });
    let h2c = Pdu::H2CData(H2CData {
        cccid: 5,
        ttag: 1,
        offset: 0,
        last: true,
        data: vec![0xa5; 512],
    });
    let c2h = Pdu::C2HData(C2HData {
        cccid: 3,
        offset: 0,
        last: true,
        success: true,
        data: vec![0x5a; 512],
    });
    let r2t = Pdu::R2T(R2T {
        cccid: 5,
        ttag: 1,
        offset: 0,
        length: 512,
    });
    // A TermReq carries back the header of the PDU it refuses: here the R2T's.
    let term = Pdu::H2CTermReq(TermReq {
        fes: fes::INVALID_PDU_HEADER_FIELD,
        fei: 2,
        data: r2t.to_bytes(&nvme_framing(NVME_PLAIN)),
    });
    let mut seeds = vec![
        (
            "icreq",
            NVME_PLAIN,
            Pdu::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests {
                    header: true,
                    data: true,
                },
                maxr2t: 0,
            }),
        ),
        (
            "icresp",
            NVME_PLAIN,
            Pdu::IcResp(IcResp {
                pfv: 0,
                cpda: 0,
                digests: Digests {
                    header: true,
                    data: true,
                },
                maxh2cdata: 131_072,
            }),
        ),
        ("capsule-write-pda", NVME_DIGESTS_PDA, write.clone()),
    ];
    let pdus = [connect, read, write, response, h2c, c2h, r2t, term];
    let plain = [
        "capsule-connect",
        "capsule-read",
        "capsule-write",
        "capsule-resp",
        "h2c-data",
        "c2h-data",
        "r2t",
        "h2c-term-req",
    ];
    let digests = [
        "capsule-connect-digests",
        "capsule-read-digests",
        "capsule-write-digests",
        "capsule-resp-digests",
        "h2c-data-digests",
        "c2h-data-digests",
        "r2t-digests",
        "h2c-term-req-digests",
    ];
    for (mode, names) in [(NVME_PLAIN, plain), (NVME_DIGESTS, digests)] {
        seeds.extend(
            names
                .into_iter()
                .zip(pdus.clone())
                .map(|(n, p)| (n, mode, p)),
        );
    }
    seeds
}

/// Which nvme_controller queue a record goes to (the selector byte; no clock
/// step, no reload).
const ADMIN_QUEUE: u8 = 0;
const IO_QUEUE: u8 = 1;

/// One nvme_controller command: the selector byte, the SQE, its data.
type ControllerRecord = (u8, Sqe, Vec<u8>);

/// An nvme_controller input: each record a selector byte, the data length in
/// 16-byte units, the SQE and the data.
fn nvme_controller_input(records: &[ControllerRecord]) -> Vec<u8> {
    let mut input = Vec::new();
    for (selector, sqe, data) in records {
        assert_eq!(data.len() % 16, 0);
        input.push(*selector);
        input.push(u8::try_from(data.len() / 16).expect("at most 4080 bytes of data"));
        input.extend_from_slice(&sqe.0);
        input.extend_from_slice(data);
    }
    input
}

fn nvme_admin(opcode: u8, cid: u16, nsid: u32, cdw10: u32, cdw11: u32, len: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode, cid);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cdw10);
    sqe.set_cdw(11, cdw11);
    if len > 0 {
        sqe.set_sgl(SglDescriptor::transport(len));
    }
    sqe
}

/// The nvme_controller seeds: (name, records of (selector, SQE, data)).
fn nvme_controller_seeds() -> Vec<(&'static str, Vec<ControllerRecord>)> {
    let admin = |sqe: Sqe| (ADMIN_QUEUE, sqe, Vec::new());
    let admin_commands = vec![
        admin(nvme_admin(
            admin::IDENTIFY,
            10,
            0,
            cns::CONTROLLER.into(),
            0,
            4096,
        )),
        admin(nvme_admin(
            admin::IDENTIFY,
            11,
            NSID,
            cns::NAMESPACE.into(),
            0,
            4096,
        )),
        admin(nvme_admin(
            admin::IDENTIFY,
            12,
            0,
            cns::ACTIVE_NAMESPACES.into(),
            0,
            4096,
        )),
        admin(nvme_admin(
            admin::GET_FEATURES,
            13,
            0,
            feature::NUMBER_OF_QUEUES.into(),
            0,
            0,
        )),
        admin(nvme_admin(
            admin::SET_FEATURES,
            14,
            0,
            feature::VOLATILE_WRITE_CACHE.into(),
            1,
            0,
        )),
        // The SMART log, 512 bytes (NUMDL 127, 0's based dwords).
        admin(nvme_admin(
            admin::GET_LOG_PAGE,
            15,
            0xffff_ffff,
            u32::from(log::SMART) | 127 << 16,
            0,
            512,
        )),
        admin(nvme_admin(admin::KEEP_ALIVE, 16, 0, 0, 0, 0)),
        admin(nvme_admin(admin::ASYNC_EVENT_REQUEST, 17, 0, 0, 0, 0)),
    ];
    let data: Vec<u8> = (0..1024u32).map(|i| (i * 7) as u8).collect();
    let mut flush = Sqe::new(io::FLUSH, 24);
    flush.set_nsid(NSID);
    let mut write_zeroes = nvme_rw(io::WRITE_ZEROES, 25, 16, 8);
    write_zeroes.set_sgl(SglDescriptor::default());
    // One range: context attributes, 8 blocks, from LBA 32.
    let mut range = vec![0; 16];
    range[4..8].copy_from_slice(&8u32.to_le_bytes());
    range[8..16].copy_from_slice(&32u64.to_le_bytes());
    let mut deallocate = Sqe::new(io::DATASET_MANAGEMENT, 26);
    deallocate.set_nsid(NSID);
    deallocate.set_cdw(10, 0);
    deallocate.set_cdw(11, 1 << 2);
    deallocate.set_sgl(SglDescriptor::in_capsule(16));
    let mut write_fua = nvme_rw(io::WRITE, 20, 8, 2);
    write_fua.set_cdw(12, write_fua.cdw(12) | 1 << 30);
    let io_commands = vec![
        (IO_QUEUE, write_fua, data.clone()),
        (IO_QUEUE, nvme_rw(io::READ, 21, 8, 2), Vec::new()),
        (IO_QUEUE, nvme_rw(io::COMPARE, 22, 8, 2), data),
        (IO_QUEUE, flush, Vec::new()),
        (IO_QUEUE, write_zeroes, Vec::new()),
        (IO_QUEUE, deallocate, range),
    ];
    vec![
        ("admin-commands", admin_commands),
        ("io-commands", io_commands),
    ]
}

fn corpus() -> Corpus {
    let mut corpus = Corpus::new();
    nbd(&mut corpus);
    aoe(&mut corpus);
    iscsi(&mut corpus);
    for (name, input) in iscsi_session_seeds() {
        corpus.insert(("iscsi_session", name), input);
    }
    scsi(&mut corpus);
    for (name, mode, pdu) in nvme_pdu_seeds() {
        let mut input = vec![mode];
        pdu.encode(&nvme_framing(mode), &mut input);
        corpus.insert(("nvme_pdu", name), input);
    }
    for (name, records) in nvme_controller_seeds() {
        corpus.insert(("nvme_controller", name), nvme_controller_input(&records));
    }
    corpus
}

#[test]
fn seed_corpus_is_current() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let bless = std::env::var_os("BLOCKWIRE_BLESS_FUZZ_CORPUS").is_some();
    let mut stale = Vec::new();
    for ((target, name), bytes) in corpus() {
        let path = root.join(target).join(name);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else if std::fs::read(&path).ok().as_ref() != Some(&bytes) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "seeds differ from what the encoders make now (rerun with \
         BLOCKWIRE_BLESS_FUZZ_CORPUS=1): {stale:?}"
    );
}

#[test]
fn nvme_pdu_seeds_decode_whole() {
    for (name, mode, pdu) in nvme_pdu_seeds() {
        let framing = nvme_framing(mode);
        let bytes = pdu.to_bytes(&framing);
        let (decoded, used) = nvme_pdu::decode(&bytes, &framing)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: incomplete"));
        assert_eq!(used, bytes.len(), "{name}: one PDU, all of it");
        assert_eq!(decoded, pdu, "{name}");
        let header_digest = bytes[1] & nvme_pdu::flags::HDGSTF != 0;
        let may_have_digest = pdu.pdu_type().may_have_header_digest();
        assert_eq!(
            header_digest,
            mode & 1 != 0 && may_have_digest,
            "{name}: header digest as the mode says"
        );
    }
}

/// The nvme_controller target's setup: an admin queue connected and enabled, an
/// I/O queue connected, on a 1 MiB memory namespace.
fn nvme_controller_queues() -> (Queue, Queue) {
    let device = Device::from_device(MemoryDevice::new(1 << 20));
    let subsystem = Arc::new(Subsystem::new("fuzz", device));
    let core = Arc::new(Core::new(Settings::default(), vec![subsystem]));
    let now = Instant::now();
    let connect = |qid, cntlid| {
        let mut queue = Queue::new(core.clone(), None, false);
        let sqe = Connect {
            cid: 1,
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato: 0,
        }
        .to_sqe();
        let data = ConnectData {
            host_id: [1; 16],
            cntlid,
            subnqn: blockwire_nvme::default_nqn("fuzz"),
            hostnqn: NVME_HOST.into(),
        }
        .to_bytes();
        match queue.submit(&sqe, data, now) {
            Action::Complete(reply) if reply.cqe.status.is_success() => {
                (queue, reply.cqe.result as u16)
            }
            other => panic!("connect to queue {qid}: {other:?}"),
        }
    };
    let (mut admin, cntlid) = connect(0, DYNAMIC_CNTLID);
    let enable = PropertyCommand::Set {
        offset: 0x14,
        eight_bytes: false,
        value: 0x0046_0001,
    }
    .to_sqe(2);
    match admin.submit(&enable, Vec::new(), now) {
        Action::Complete(reply) => assert!(reply.cqe.status.is_success(), "enable"),
        other => panic!("enable: {other:?}"),
    }
    let (io, _) = connect(1, cntlid);
    (admin, io)
}

#[test]
fn nvme_controller_seeds_reach_their_work() {
    for (name, records) in nvme_controller_seeds() {
        // The records survive the target's framing unchanged.
        let input = nvme_controller_input(&records);
        let mut rest = &input[..];
        for (selector, sqe, data) in &records {
            assert_eq!(rest[0], *selector);
            let n = usize::from(rest[1]) * 16;
            assert_eq!(Sqe::from_slice(&rest[2..]), Some(*sqe));
            assert_eq!(&rest[66..66 + n], &data[..]);
            rest = &rest[66 + n..];
        }
        assert!(rest.is_empty(), "{name}: nothing left over");

        // Every command succeeds: I/O ones by device work, the event request later.
        let (mut admin_queue, mut io_queue) = nvme_controller_queues();
        let now = Instant::now();
        for (selector, sqe, data) in records {
            let what = format!("{name}: opcode {:#04x} cid {}", sqe.opcode(), sqe.cid());
            let queue = if selector == IO_QUEUE {
                &mut io_queue
            } else {
                &mut admin_queue
            };
            let reply = match queue.submit(&sqe, data, now) {
                Action::Complete(reply) => {
                    assert_eq!(
                        selector, ADMIN_QUEUE,
                        "{what}: answered without device work"
                    );
                    reply
                }
                Action::Io(command) => {
                    assert_eq!(selector, IO_QUEUE, "{what}");
                    command.execute()
                }
                Action::Deferred => {
                    assert_eq!(sqe.opcode(), admin::ASYNC_EVENT_REQUEST, "{what}");
                    continue;
                }
            };
            assert!(reply.cqe.status.is_success(), "{what}: {reply:?}");
            assert_eq!(reply.cqe.cid, sqe.cid(), "{what}");
            let to_host = sqe.direction() == blockwire_nvme::Direction::ToHost;
            if to_host {
                assert_eq!(
                    reply.data.len() as u32,
                    sqe.sgl().length,
                    "{what}: the data asked for"
                );
            }
        }
    }
}

#[test]
fn iscsi_session_seeds_decode() {
    for (name, setup, records) in iscsi_session_records() {
        let input = iscsi_session_input(setup, &records);
        assert_eq!(input[0], setup);
        // Walk the input as iscsi_session does: the header it forces and the data
        // length it cuts must leave every PDU as it was built.
        let mut rest = &input[1..];
        for record in &records {
            let control = rest[0];
            rest = &rest[1..];
            match record {
                SessionRecord::Clock { half_seconds } => {
                    assert_eq!(control, 7 | half_seconds << 3, "{name}");
                }
                SessionRecord::Pdu(pdu, data) => {
                    let mut bhs = Bhs::default();
                    bhs.0.copy_from_slice(&rest[..BHS_LEN]);
                    let forced = ISCSI_SESSION_OPCODES[usize::from(control & 7)];
                    assert_eq!(bhs.0[0] & 0x3f, forced, "{name}: {pdu:?}");
                    assert_eq!(bhs.0[4], 0, "{name}: no AHS");
                    let len = bhs.data_len() as usize;
                    assert_eq!(len, data.len(), "{name}: {pdu:?}");
                    assert!(len <= 8192, "{name}: within the target's MAX_SEGMENT");
                    assert_eq!(Pdu::decode(&bhs, &[]).as_ref(), Ok(pdu), "{name}");
                    assert_eq!(&rest[BHS_LEN..BHS_LEN + len], &data[..]);
                    rest = &rest[BHS_LEN + len..];
                }
            }
        }
        assert!(rest.is_empty(), "{name}: nothing left over");
    }
}

/// The negotiated parameters iscsi_session derives from its setup byte (a normal
/// session; the bits the seeds use).
fn iscsi_session_negotiated(setup: u8) -> Negotiated {
    Negotiated {
        session_type: SessionType::Normal,
        initiator_name: "iqn.fuzz:i".into(),
        initiator_alias: None,
        target_name: Some("iqn.fuzz:t".into()),
        isid: 1,
        tsih: 1,
        cid: 1,
        header_digest: false,
        data_digest: true,
        initiator_max_recv_data_segment_length: 1024,
        target_max_recv_data_segment_length: 8192,
        max_burst_length: 4096 << (setup & 3),
        first_burst_length: 2048 << (setup >> 2 & 3),
        initial_r2t: setup & 0x10 != 0,
        immediate_data: setup & 0x20 != 0,
        max_outstanding_r2t: 1 + u32::from(setup >> 6 & 1) * 3,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        default_time2wait: 2,
        default_time2retain: 20,
        error_recovery_level: 0,
        max_connections: 1,
        stat_sn: 0,
        exp_cmd_sn: 0,
    }
}

/// Replays an iscsi_session seed on the full feature phase as the fuzz target
/// sets it up, and says what each record led to: the PDUs sent (R2Ts with their
/// tag, offset and length) and the commands handed to the device (with the
/// data-out received).
fn replay_iscsi_session(setup: u8, records: &[SessionRecord]) -> Vec<Vec<String>> {
    assert_eq!(setup & 0x80, 0, "a normal session");
    let device = Device::from_device(MemoryDevice::new(256 * 1024));
    let target = serve_iscsi::definition(
        IscsiExport {
            name: "fuzz".into(),
            device,
            iqn: "iqn.fuzz:t".into(),
            block_size: 512,
            initiators: Vec::new(),
            alias: None,
        },
        None,
    )
    .expect("a target of one memory LUN");
    let timers = Timers {
        nop_interval: Duration::from_secs(5),
        nop_timeout: Duration::from_secs(5),
    };
    let mut now = Instant::now();
    let mut phase = FullFeature::new(
        iscsi_session_negotiated(setup),
        Arc::new(LoginConfig::default()),
        Some(target.scsi),
        Arc::new(Tasks::new(0, 8)),
        timers,
        now,
    );
    let mut effects = Vec::new();
    for record in records {
        match record {
            SessionRecord::Pdu(pdu, data) => {
                let header = pdu.encode(data.len() as u32);
                phase.handle_pdu(now, &header.bhs, &header.ahs, data);
            }
            SessionRecord::Clock { half_seconds } => {
                now += Duration::from_millis(u64::from(*half_seconds) * 500);
                phase.handle_timeout(now);
            }
        }
        let mut seen = Vec::new();
        loop {
            while let Some(transmit) = phase.poll_transmit() {
                seen.push(match transmit.pdu {
                    Pdu::R2t(r2t) => format!(
                        "R2t {} {}+{}",
                        r2t.target_transfer_tag,
                        r2t.buffer_offset,
                        r2t.desired_data_transfer_length
                    ),
                    Pdu::TaskMgmtResponse(response) => {
                        format!("TaskMgmtResponse {}", response.response)
                    }
                    other => {
                        let debug = format!("{other:?}");
                        debug.split('(').next().unwrap_or_default().to_string()
                    }
                });
            }
            match phase.poll_work() {
                None => break,
                Some(Work::Execute(job)) => {
                    let received = job.data.as_ref().map_or(0, |(_, received)| *received);
                    assert!(job.early.is_none(), "task {} refused early", job.itt);
                    seen.push(format!("execute {} with {received}", job.itt));
                }
                Some(Work::Quiesce { reset, .. }) => {
                    assert!(reset.is_none(), "no reset in the seeds");
                    seen.push("quiesce".into());
                    phase.quiesced();
                }
            }
        }
        if phase.ending().is_some() {
            seen.push("ended".into());
        }
        effects.push(seen);
    }
    effects
}

#[test]
fn iscsi_session_seeds_reach_the_device() {
    let effects: BTreeMap<_, _> = iscsi_session_records()
        .into_iter()
        .map(|(name, setup, records)| (name, replay_iscsi_session(setup, &records)))
        .collect();
    let expect = |list: &[&[&str]]| -> Vec<Vec<String>> {
        list.iter()
            .map(|r| r.iter().map(|s| s.to_string()).collect())
            .collect()
    };
    assert_eq!(
        effects["read-write-abort-nop-logout"],
        expect(&[
            &["execute 1 with 0"],
            &["execute 2 with 512"],
            &["R2t 1 0+1024"],
            &["execute 3 with 1024"],
            &["R2t 2 0+1024"],
            // The aborted write waited for data, not for the device: function
            // complete at once.
            &["TaskMgmtResponse 0"],
            &["NopIn"],
            &["quiesce", "LogoutResponse", "ended"],
        ])
    );
    assert_eq!(
        effects["initial-r2t-then-idle"],
        expect(&[
            &["R2t 1 512+1536"],
            &["execute 1 with 2048"],
            &["execute 2 with 0"],
            &["NopIn"],
            &["ended"],
        ])
    );
}
