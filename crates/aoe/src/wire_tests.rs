//! Byte-exact vectors for the AoE codec, written out from the field tables of AoEr11,
//! plus round-trip properties.

use super::*;
use proptest::prelude::*;

const INITIATOR: MacAddr = [0x02, 0, 0, 0, 0, 0x01];
const TARGET: MacAddr = [0x02, 0, 0, 0, 0, 0x02];

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = vec![
        0x02, 0, 0, 0, 0, 0x02, // dst
        0x02, 0, 0, 0, 0, 0x01, // src
        0x88, 0xa2, // ethertype
    ];
    out.extend_from_slice(body);
    out
}

#[test]
fn ata_read_request_lba48_decodes() {
    let bytes = frame(&[
        0x10, 0x00, // version 1, no flags; error 0
        0x00, 0x07, 0x03, 0x00, // shelf 7, slot 3, command ATA
        0xde, 0xad, 0xbe, 0xef, // tag
        0x40, 0x00, 0x02, 0x24, // aflags E; feature; 2 sectors; READ SECTORS EXT
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, // lba, little end first
        0x00, 0x00, // reserved
    ]);
    let (header, rest) = Header::parse(&bytes).unwrap();
    assert_eq!(
        header,
        Header::request(TARGET, INITIATOR, 7, 3, Command::Ata, 0xdead_beef)
    );
    let body = Body::parse(Command::Ata, rest).unwrap();
    let Body::Ata(args, data) = body else {
        panic!("not ATA")
    };
    assert_eq!(
        args,
        AtaArgs {
            extended: true,
            sector_count: 2,
            cmd_status: ata::READ_SECTORS_EXT,
            lba: 0x0605_0403_0201,
            ..AtaArgs::default()
        }
    );
    assert!(data.is_empty());
    assert_eq!(args.data_len(), 1024);
}

#[test]
fn ata_lba28_masks_the_device_register_bits() {
    let bytes = frame(&[
        0x10, 0x00, 0x00, 0x01, 0x01, 0x00, 0, 0, 0, 1, // header, tag 1
        0x01, 0x00, 0x01, 0x30, // W; 1 sector; WRITE SECTORS
        0x78, 0x56, 0x34, 0xe2, 0xff, 0xff, 0x00, 0x00,
    ]);
    let (_, rest) = Header::parse(&bytes).unwrap();
    let (args, _) = AtaArgs::parse(rest).unwrap();
    assert!(args.write && !args.extended);
    assert_eq!(args.lba, 0x0234_5678);

    let mut encoded = Vec::new();
    args.encode(&mut encoded);
    assert_eq!(
        encoded,
        [0x01, 0x00, 0x01, 0x30, 0x78, 0x56, 0x34, 0xe2, 0, 0, 0, 0]
    );
}

#[test]
fn ata_write_response_encodes_exactly() {
    let request = Header::request(TARGET, INITIATOR, 1, 2, Command::Ata, 0x0102_0304);
    let response = request.response_to(TARGET);
    let args = AtaArgs {
        extended: true,
        write: true,
        sector_count: 1,
        cmd_status: ata::STATUS_DRDY,
        lba: 8,
        ..AtaArgs::default()
    };
    let mut out = Vec::new();
    encode_frame(&response, &Body::Ata(args, &[]), &mut out);
    let mut expected = vec![
        0x02, 0, 0, 0, 0, 0x01, // back to the initiator
        0x02, 0, 0, 0, 0, 0x02, // from the target
        0x88, 0xa2, 0x18, 0x00, // version 1 | R
        0x00, 0x01, 0x02, 0x00, 0x01, 0x02, 0x03, 0x04, // shelf 1, slot 2, ATA, tag
        0x41, 0x00, 0x01, 0x40, // E|W, 1 sector, status DRDY
        0x08, 0, 0, 0, 0, 0, 0, 0,
    ];
    expected.resize(MIN_FRAME_LEN, 0);
    assert_eq!(out, expected);
}

#[test]
fn error_response_sets_the_flag_and_code() {
    let request = Header::request(TARGET, INITIATOR, 1, 2, Command::Ata, 9);
    let mut response = request.response_to(TARGET);
    response.error = AoeError::UnsupportedVersion as u8;
    let mut out = Vec::new();
    response.encode(&mut out);
    assert_eq!(&out[14..16], &[0x1c, 0x05]);
    let (decoded, _) = Header::parse(&out).unwrap();
    assert_eq!(decoded.error(), Some(AoeError::UnsupportedVersion));
    assert!(decoded.response);
}

#[test]
fn config_query_round_trips_with_its_string() {
    let bytes = frame(&[
        0x18, 0x00, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 5, // broadcast, config, tag 5
        0x00, 0x40, // buffer count 64
        0x40, 0x15, // firmware
        0x11, // 17 sectors
        0x11, // version 1, sub-command test exact
        0x00, 0x03, b'a', b'b', b'c',
    ]);
    let (header, rest) = Header::parse(&bytes).unwrap();
    assert!(header.addresses(7, 9));
    let Body::QueryConfig(config) = Body::parse(Command::QueryConfig, rest).unwrap() else {
        panic!("not config")
    };
    assert_eq!(
        config,
        ConfigQuery {
            buffer_count: 64,
            firmware_version: 0x4015,
            sector_count: 17,
            aoe_version: 1,
            command: ConfigCommand::TestExact as u8,
            config: b"abc",
        }
    );
    let mut out = Vec::new();
    header.encode(&mut out);
    config.encode(&mut out);
    assert_eq!(out, bytes);
}

#[test]
fn config_string_longer_than_1024_is_a_bad_argument() {
    let mut body = vec![0, 0, 0, 0, 0, 0x10, 0x04, 0x01];
    body.resize(8 + 1025, b'x');
    assert_eq!(
        ConfigQuery::parse(&body),
        Err(FrameError::BadArgument(
            "config string longer than 1024 bytes"
        ))
    );
}

#[test]
fn config_string_past_the_frame_is_truncated() {
    let body = [0, 0, 0, 0, 0, 0x10, 0x00, 0x10, b'a'];
    assert!(matches!(
        ConfigQuery::parse(&body),
        Err(FrameError::Truncated { .. })
    ));
}

#[test]
fn mask_list_edit_decodes_directives() {
    let body = [
        0x00, 0x01, 0x00, 0x02, // edit, no error, 2 directives
        0x00, 0x01, 1, 2, 3, 4, 5, 6, // add
        0x00, 0x02, 6, 5, 4, 3, 2, 1, // delete
    ];
    let list = MaskList::parse(&body).unwrap();
    assert_eq!(
        list,
        MaskList {
            command: mask::EDIT,
            error: 0,
            directives: vec![
                MaskDirective {
                    command: mask::DIRECTIVE_ADD,
                    mac: [1, 2, 3, 4, 5, 6]
                },
                MaskDirective {
                    command: mask::DIRECTIVE_DELETE,
                    mac: [6, 5, 4, 3, 2, 1]
                },
            ],
        }
    );
    let mut out = Vec::new();
    list.encode(&mut out);
    assert_eq!(out, body);
    assert!(MaskList::parse(&body[..19]).is_err());
}

#[test]
fn reserve_list_round_trips() {
    let body = [0x01, 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    let list = ReserveList::parse(&body).unwrap();
    assert_eq!(list.command, reserve::SET);
    assert_eq!(list.macs, vec![[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]);
    let mut out = Vec::new();
    list.encode(&mut out);
    assert_eq!(out, body);
    assert!(ReserveList::parse(&body[..13]).is_err());
}

#[test]
fn short_and_foreign_frames_are_rejected() {
    assert_eq!(
        Header::parse(&[0; 23]),
        Err(FrameError::Truncated {
            len: 23,
            needed: 24
        })
    );
    let mut ip = frame(&[0; 10]);
    ip[12] = 0x08;
    ip[13] = 0x00;
    assert_eq!(Header::parse(&ip), Err(FrameError::NotAoe(0x0800)));
    let short_ata = frame(&[0x10, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0x40, 0]);
    let (_, rest) = Header::parse(&short_ata).unwrap();
    assert!(Body::parse(Command::Ata, rest).is_err());
}

#[test]
fn sectors_per_frame_follows_the_mtu() {
    assert_eq!(sectors_per_frame(1500), 2);
    assert_eq!(sectors_per_frame(9000), 17);
    assert_eq!(sectors_per_frame(100), 0);
    assert_eq!(sectors_per_frame(1 << 20), 255);
}

#[test]
fn broadcast_addresses_everyone_and_direct_only_one() {
    let mut h = Header::request(BROADCAST, INITIATOR, 1, 1, Command::QueryConfig, 0);
    assert!(h.addresses(1, 1));
    assert!(!h.addresses(1, 2));
    h.slot = BROADCAST_SLOT;
    assert!(h.addresses(1, 2));
    assert!(!h.addresses(2, 2));
    h.shelf = BROADCAST_SHELF;
    assert!(h.addresses(2, 2));
}

fn any_header() -> impl Strategy<Value = Header> {
    (
        any::<[u8; 6]>(),
        any::<[u8; 6]>(),
        0u8..16,
        any::<bool>(),
        any::<u8>(),
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
    )
        .prop_map(
            |(dst, src, version, response, error, shelf, slot, command, tag)| Header {
                dst,
                src,
                version,
                response,
                error,
                shelf,
                slot,
                command,
                tag,
            },
        )
}

proptest! {
    #[test]
    fn headers_round_trip(header in any_header()) {
        let mut out = Vec::new();
        header.encode(&mut out);
        let (decoded, rest) = Header::parse(&out).unwrap();
        prop_assert_eq!(decoded, header);
        prop_assert!(rest.is_empty());
    }

    #[test]
    fn lba48_args_round_trip(lba in 0u64..(1 << 48), count: u8, cmd: u8, write: bool) {
        let args = AtaArgs { extended: true, write, sector_count: count, cmd_status: cmd, lba, ..AtaArgs::default() };
        let mut out = Vec::new();
        args.encode(&mut out);
        prop_assert_eq!(AtaArgs::parse(&out).unwrap().0, args);
    }

    #[test]
    fn lba28_args_round_trip(lba in 0u64..(1 << 28), count: u8) {
        let args = AtaArgs { sector_count: count, cmd_status: ata::READ_SECTORS, lba, ..AtaArgs::default() };
        let mut out = Vec::new();
        args.encode(&mut out);
        prop_assert_eq!(AtaArgs::parse(&out).unwrap().0, args);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok((header, rest)) = Header::parse(&bytes) {
            if let Some(command) = Command::from_code(header.command) {
                let _ = Body::parse(command, rest);
            }
        }
    }
}
