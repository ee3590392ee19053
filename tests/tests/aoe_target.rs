//! Our AoE target (`blockwire serve --aoe`) in a network namespace, driven by raw
//! frames from another namespace over a veth pair: discovery, IDENTIFY, reads and
//! writes at MTU 1500 and 9000, the spec's answers to bad frames, config string,
//! MAC mask and reservations, durability of flushed writes across SIGKILL, NBD and
//! AoE on one export, and the peers aoe-sancheck, aoeping and tshark. Needs root.

use std::time::Duration;

use blockwire_aoe::identify::Identity;
use blockwire_aoe::wire::{
    ata, encode_frame, mask, reserve, AoeError, Body, Command, ConfigQuery, Header, MaskDirective,
    MaskList, ReserveList, SECTOR_SIZE,
};
use blockwire_tests::aoe::{ata_args, file_has, AoeLab, RawClient, ANSWER_WAIT, SHELF, SLOT};
use blockwire_tests::{path_str, require, require_root, start_capture, text, MIB};

const SIZE: u64 = 64 * MIB;
const OTHER: [u8; 6] = [0x02, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b];

fn backing_file(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("aoe.img");
    std::fs::File::create(&path).unwrap().set_len(SIZE).unwrap();
    path_str(&path).to_string()
}

fn sectors(seed: u8, count: usize) -> Vec<u8> {
    (0..count * SECTOR_SIZE)
        .map(|i| (i as u8).wrapping_mul(7) ^ seed)
        .collect()
}

fn aoe_error(client: &mut RawClient, header: &Header, body: &Body<'_>) -> Option<AoeError> {
    let frame = client.exchange(header, body, ANSWER_WAIT)?;
    Header::parse(&frame).unwrap().0.error()
}

fn query(command: u8, config: &[u8]) -> Body<'_> {
    Body::QueryConfig(ConfigQuery {
        buffer_count: 0,
        firmware_version: 0,
        sector_count: 0,
        aoe_version: 1,
        command,
        config,
    })
}

fn discovery_identify_and_io(short: &str, mtu: usize, per_frame: u8) {
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let lab = AoeLab::start(short, mtu, &[&file]);
    let mut client = lab.client();

    let (header, config, _) = client.discover();
    assert_eq!((header.shelf, header.slot), (SHELF, SLOT));
    assert_eq!(
        config.sector_count, per_frame,
        "sectors per frame at MTU {mtu}"
    );
    assert_eq!(config.aoe_version, 1);
    assert!(config.buffer_count >= 16);

    let (_, args, block) = client
        .ata(ata_args(ata::IDENTIFY_DEVICE, 0, 1, false), &[])
        .expect("an IDENTIFY answer");
    assert_eq!(args.cmd_status, ata::STATUS_DRDY);
    assert!(Identity::checksum_ok(&block));
    let identity = Identity::parse(&block).unwrap();
    assert_eq!(identity.sectors, SIZE / SECTOR_SIZE as u64);
    assert!(identity.lba48);

    let data = sectors(5, usize::from(per_frame));
    client.write(100, &data);
    assert_eq!(client.read(100, per_frame), data);
    client.flush();
    assert!(file_has(
        dir.path().join("aoe.img").as_path(),
        100 * SECTOR_SIZE,
        &data
    ));

    // The last sector, and the 28-bit forms.
    let last = SIZE / SECTOR_SIZE as u64 - 1;
    client.write(last, &sectors(9, 1));
    let mut lba28 = ata_args(ata::READ_SECTORS, last, 1, false);
    lba28.extended = false;
    let (_, args, back) = client.ata(lba28, &[]).unwrap();
    assert_eq!(args.cmd_status, ata::STATUS_DRDY);
    assert_eq!(&back[..SECTOR_SIZE], &sectors(9, 1)[..]);

    let (_, args, _) = client
        .ata(ata_args(ata::CHECK_POWER_MODE, 0, 0, false), &[])
        .unwrap();
    assert_eq!(args.sector_count, ata::POWER_ACTIVE);
    let (_, args, _) = client.ata(ata_args(0xc8, 0, 1, false), &[]).unwrap();
    assert_eq!(args.cmd_status, ata::STATUS_DRDY | ata::STATUS_ERR);
    assert_eq!(args.err_feature, ata::ERROR_ABRT);
}

#[test]
fn discovery_identify_and_io_at_mtu_1500() {
    require_root!();
    discovery_identify_and_io("ad", 1500, 2);
}

#[test]
fn discovery_identify_and_io_at_mtu_9000() {
    require_root!();
    discovery_identify_and_io("aj", 9000, 17);
}

#[test]
fn bad_frames_get_the_spec_answers_and_the_target_carries_on() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let lab = AoeLab::start("ab", 1500, &[&file]);
    let mut client = lab.client();
    client.discover();
    let read = ata_args(ata::READ_SECTORS_EXT, 0, 1, false);

    let mut header = client.header(Command::Ata);
    header.version = 2;
    assert_eq!(
        aoe_error(&mut client, &header, &Body::Ata(read, &[])),
        Some(AoeError::UnsupportedVersion)
    );

    let mut header = client.header(Command::Ata);
    header.command = 0x42;
    assert_eq!(
        aoe_error(&mut client, &header, &Body::Ata(read, &[])),
        Some(AoeError::UnrecognizedCommand)
    );

    let beyond = ata_args(ata::READ_SECTORS_EXT, SIZE / SECTOR_SIZE as u64, 1, false);
    let (header, args, _) = client.ata(beyond, &[]).unwrap();
    assert_eq!(header.error(), None);
    assert_eq!(args.cmd_status & ata::STATUS_ERR, ata::STATUS_ERR);
    assert_ne!(args.err_feature & ata::ERROR_IDNF, 0);

    let header = client.header(Command::Ata);
    let oversized = ata_args(ata::READ_SECTORS_EXT, 0, 3, false);
    assert_eq!(
        aoe_error(&mut client, &header, &Body::Ata(oversized, &[])),
        Some(AoeError::BadArgument)
    );

    // A write announcing two sectors but carrying one and a bit: refused, and the
    // file is untouched.
    let header = client.header(Command::Ata);
    let short = ata_args(ata::WRITE_SECTORS_EXT, 8, 2, true);
    assert_eq!(
        aoe_error(&mut client, &header, &Body::Ata(short, &[0xee; 600])),
        Some(AoeError::BadArgument)
    );
    assert!(file_has(
        dir.path().join("aoe.img").as_path(),
        8 * SECTOR_SIZE,
        &[0; 1024]
    ));

    // A config string longer than the frame that carries it.
    let header = client.header(Command::QueryConfig);
    let mut frame = Vec::new();
    encode_frame(&header, &query(0, b"abc"), &mut frame);
    frame[30..32].copy_from_slice(&900u16.to_be_bytes());
    client.send_raw(&frame);
    let answer = client.answer(header.tag, ANSWER_WAIT).expect("an answer");
    assert_eq!(
        Header::parse(&answer).unwrap().0.error(),
        Some(AoeError::BadArgument)
    );

    // Frames for another slot, and responses, are not answered.
    let mut header = client.header(Command::Ata);
    header.slot = SLOT + 1;
    assert_eq!(
        client.exchange(&header, &Body::Ata(read, &[]), Duration::from_millis(300)),
        None
    );
    let mut header = client.header(Command::Ata);
    header.response = true;
    assert_eq!(
        client.exchange(&header, &Body::Ata(read, &[]), Duration::from_millis(300)),
        None
    );

    // Garbage with the AoE ethertype, then a read that still works.
    let mut garbage = vec![0xa5u8; 60];
    garbage[..6].copy_from_slice(&client.target);
    garbage[6..12].copy_from_slice(&client.mac);
    garbage[12..14].copy_from_slice(&[0x88, 0xa2]);
    for _ in 0..100 {
        client.send_raw(&garbage);
    }
    client.write(0, &sectors(1, 2));
    assert_eq!(client.read(0, 2), sectors(1, 2));
}

#[test]
fn config_string_mask_list_and_reservations() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let lab = AoeLab::start("ac", 1500, &[&file]);
    let mut client = lab.client();
    client.discover();
    let quiet = Duration::from_millis(300);

    // Config string: set if empty, then tests.
    let header = client.header(Command::QueryConfig);
    let answer = client
        .exchange(&header, &query(3, b"owner=a"), ANSWER_WAIT)
        .unwrap();
    let (_, body) = Header::parse(&answer).unwrap();
    assert_eq!(ConfigQuery::parse(body).unwrap().config, b"owner=a");
    let header = client.header(Command::QueryConfig);
    assert_eq!(
        aoe_error(&mut client, &header, &query(3, b"owner=b")),
        Some(AoeError::ConfigStringPresent)
    );
    let header = client.header(Command::QueryConfig);
    assert_eq!(client.exchange(&header, &query(1, b"owner=b"), quiet), None);
    let header = client.header(Command::QueryConfig);
    assert!(client
        .exchange(&header, &query(2, b"owner"), quiet)
        .is_some());

    // MAC mask: once the list holds only another address, we are not heard.
    let edit = |command, mac| {
        Body::MacMaskList(MaskList {
            command: mask::EDIT,
            error: 0,
            directives: vec![MaskDirective { command, mac }],
        })
    };
    let header = client.header(Command::MacMaskList);
    assert!(client
        .exchange(&header, &edit(mask::DIRECTIVE_ADD, OTHER), ANSWER_WAIT)
        .is_some());
    let header = client.header(Command::QueryConfig);
    assert_eq!(client.exchange(&header, &query(0, b""), quiet), None);
    // The allowed address (forged here) empties the list again.
    let mut header = client.header(Command::MacMaskList);
    header.src = OTHER;
    let mut frame = Vec::new();
    encode_frame(&header, &edit(mask::DIRECTIVE_DELETE, OTHER), &mut frame);
    client.send_raw(&frame);
    std::thread::sleep(Duration::from_millis(100));
    let header = client.header(Command::QueryConfig);
    assert!(client
        .exchange(&header, &query(0, b""), ANSWER_WAIT)
        .is_some());

    // Reservations: another holder makes our ATA commands fail, config still works.
    let reserve_body = |command, macs| Body::ReserveRelease(ReserveList { command, macs });
    let header = client.header(Command::ReserveRelease);
    client
        .exchange(
            &header,
            &reserve_body(reserve::FORCE_SET, vec![OTHER]),
            ANSWER_WAIT,
        )
        .expect("reserve answer");
    let header = client.header(Command::Ata);
    let read = ata_args(ata::READ_SECTORS_EXT, 0, 1, false);
    assert_eq!(
        aoe_error(&mut client, &header, &Body::Ata(read, &[])),
        Some(AoeError::TargetReserved)
    );
    let header = client.header(Command::ReserveRelease);
    let ours = reserve_body(reserve::SET, vec![client.mac]);
    assert_eq!(
        aoe_error(&mut client, &header, &ours),
        Some(AoeError::TargetReserved)
    );
    let header = client.header(Command::QueryConfig);
    assert!(client
        .exchange(&header, &query(0, b""), ANSWER_WAIT)
        .is_some());
    let header = client.header(Command::ReserveRelease);
    client
        .exchange(
            &header,
            &reserve_body(reserve::FORCE_SET, vec![]),
            ANSWER_WAIT,
        )
        .expect("release answer");
    client.read(0, 1);
}

#[test]
fn read_only_exports_abort_writes() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let lab = AoeLab::start("ar", 1500, &[&file, "--read-only"]);
    let mut client = lab.client();
    client.discover();
    let (header, args, _) = client
        .ata(ata_args(ata::WRITE_SECTORS_EXT, 0, 1, true), &[0xff; 512])
        .unwrap();
    assert_eq!(header.error(), None);
    assert_eq!(args.cmd_status, ata::STATUS_DRDY | ata::STATUS_ERR);
    assert_eq!(args.err_feature, ata::ERROR_ABRT);
    assert!(file_has(dir.path().join("aoe.img").as_path(), 0, &[0; 512]));
    client.read(0, 1);
}

/// Writes, flushes, kills the target with SIGKILL and checks the file; returns the
/// lab (its target gone) for further checks.
fn flushed_writes_survive_sigkill(short: &str, extra: &[&str]) -> AoeLab {
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let mut args = vec![file.as_str()];
    args.extend_from_slice(extra);
    let mut lab = AoeLab::start(short, 1500, &args);
    let mut client = lab.client();
    client.discover();
    // Unaligned sectors too: with --direct they go through read-modify-write.
    let mut expected = Vec::new();
    for i in 0..64u64 {
        let data = sectors(i as u8, 2);
        client.write(3 + i * 2, &data);
        expected.extend_from_slice(&data);
    }
    client.flush();
    lab.kill_target();
    assert!(file_has(
        dir.path().join("aoe.img").as_path(),
        3 * SECTOR_SIZE,
        &expected
    ));
    lab
}

/// Over the AF_XDP path too; and the killed target's XDP program went with it
/// (it hangs on a BPF link, which the kernel drops with the process).
#[test]
fn flushed_writes_survive_sigkill_over_af_xdp_and_leave_no_program() {
    require_root!();
    let lab = flushed_writes_survive_sigkill("af", &["--aoe-xdp"]);
    assert!(
        !lab.lab.xdp_attached(lab.lab.target_ns()),
        "the killed target's program is still attached"
    );
}

/// `--aoe-xdp` on an interface whose frames do not fit the AF_XDP path: the
/// target does not start, and says why.
#[test]
fn af_xdp_at_mtu_9000_is_refused_with_the_reason() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let tag = format!("ay{}", std::process::id() % 100000);
    let lab = blockwire_tests::netns::VethLab::new(&tag, 1, 9000).expect("build the veth lab");
    // Under `timeout`: a target that wrongly starts would serve forever.
    let out = lab
        .command_in(lab.target_ns(), "timeout")
        .arg("20")
        .arg(blockwire_tests::blockwire_bin())
        .args([
            "serve",
            file.as_str(),
            "--aoe",
            "eth0",
            "--shelf",
            "1",
            "--slot",
            "2",
        ])
        .args(["--aoe-xdp"])
        .output()
        .expect("run blockwire");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(124),
        "still serving after 20 s: {stderr}"
    );
    assert!(!out.status.success(), "served at MTU 9000 over AF_XDP");
    // The refusal itself (the startup log names the MTU too).
    assert!(stderr.contains("MTU 9000 is above the 3822"), "{stderr}");
}

#[test]
fn flushed_writes_survive_sigkill_buffered() {
    require_root!();
    flushed_writes_survive_sigkill("ak", &[]);
}

#[test]
fn flushed_writes_survive_sigkill_direct() {
    require_root!();
    flushed_writes_survive_sigkill("ax", &["--direct"]);
}

#[test]
fn one_export_over_nbd_and_aoe() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let socket = dir.path().join("nbd.sock");
    let lab = AoeLab::start("an", 1500, &[&file, "--socket", path_str(&socket)]);
    let mut client = lab.client();
    client.discover();
    let data = sectors(42, 2);
    client.write(2048, &data);
    let uri = format!("nbd+unix:///aoe.img?socket={}", path_str(&socket));
    let nbd = blockwire_nbd::initiator::NbdClient::connect(
        &uri.parse().unwrap(),
        blockwire_nbd::initiator::ClientOptions::default(),
    )
    .expect("connect over NBD");
    let device = blockwire_blockdev::Device::from_device(nbd);
    let mut back = vec![0; data.len()];
    device.read(&mut back, 2048 * SECTOR_SIZE as u64).unwrap();
    assert_eq!(back, data, "a write through AoE reads back through NBD");
    device
        .write(&sectors(7, 1), 0, blockwire_blockdev::WriteFlags::default())
        .unwrap();
    assert_eq!(client.read(0, 1), sectors(7, 1), "and the other way");
}

#[test]
fn aoe_sancheck_and_aoeping_find_the_target() {
    require_root!();
    require!("aoe-sancheck", "aoeping");
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let lab = AoeLab::start("as", 1500, &[&file]);
    let output = lab
        .lab
        .command_in(lab.lab.initiator_ns(), "aoe-sancheck")
        .output()
        .unwrap();
    let report = text(&output.stdout);
    let line = report
        .lines()
        .find(|l| l.starts_with(&format!("e{SHELF}.{SLOT}")))
        .unwrap_or_else(|| panic!("aoe-sancheck did not find e{SHELF}.{SLOT}:\n{report}"));
    assert!(line.contains("1024"), "payload 1024 at MTU 1500: {line}");

    let output = lab
        .lab
        .command_in(lab.lab.initiator_ns(), "aoeping")
        .args(["-i", &SHELF.to_string(), &SLOT.to_string(), "eth0"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "aoeping -i: {}",
        text(&output.stderr)
    );
    assert!(text(&output.stdout).contains("identify response"));
}

#[test]
fn tshark_decodes_every_frame() {
    require_root!();
    require!("tshark");
    let dir = tempfile::tempdir().unwrap();
    let file = backing_file(&dir);
    let capture = dir.path().join("aoe.pcapng");
    let lab = AoeLab::start("at", 1500, &[&file]);
    let mut command = lab.lab.command_in(lab.lab.initiator_ns(), "tshark");
    command.args([
        "-i",
        "eth0",
        "-f",
        "ether proto 0x88a2",
        "-w",
        path_str(&capture),
    ]);
    let mut tshark = start_capture(command);

    let mut client = lab.client();
    client.discover();
    client.ata(ata_args(ata::IDENTIFY_DEVICE, 0, 1, false), &[]);
    client.write(10, &sectors(3, 2));
    client.read(10, 2);
    client.flush();
    let header = client.header(Command::Ata);
    let oversized = ata_args(ata::READ_SECTORS_EXT, 0, 3, false);
    aoe_error(&mut client, &header, &Body::Ata(oversized, &[]));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    tshark.wait().unwrap();

    let count = |filter: &str| {
        let output = blockwire_tests::run(
            "tshark",
            &[
                "-r",
                path_str(&capture),
                "-Y",
                filter,
                "-T",
                "fields",
                "-e",
                "frame.number",
            ],
        );
        text(&output.stdout).lines().count()
    };
    let frames = count("aoe");
    assert!(
        frames >= 12,
        "12 AoE frames captured and decoded, not {frames}"
    );
    assert_eq!(count("_ws.malformed || _ws.expert.severity >= 6291456"), 0);
    assert!(count("aoe.response == 1") >= 6, "responses are recognised");
    assert!(
        count("aoe.response_to") >= 4,
        "ATA responses match their requests"
    );
}
