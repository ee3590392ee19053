//! The fuzz targets' seed corpus (`fuzz/corpus/TARGET/NAME`), built here from our own
//! encoders: a valid NBD session, AoE frames of every command, iSCSI logins and
//! commands, SCSI CDBs with their data. Short fuzzing runs start from these, already
//! past the first checks of every parser.
//!
//! The test fails when a committed seed differs from what the encoders make now (a
//! codec changed and the corpus is stale). `BLOCKWIRE_BLESS_FUZZ_CORPUS=1 cargo test
//! -p blockwire-tests --test fuzz_corpus` writes them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use blockwire_aoe::wire::{ata, encode_frame, AtaArgs, Body, Command, ConfigQuery, Header};
use blockwire_iscsi::pdu::{LoginRequest, Pdu, ScsiCommand, TaskAttribute};
use blockwire_nbd::wire::*;

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

fn corpus() -> Corpus {
    let mut corpus = Corpus::new();
    nbd(&mut corpus);
    aoe(&mut corpus);
    iscsi(&mut corpus);
    scsi(&mut corpus);
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
