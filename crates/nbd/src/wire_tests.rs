//! Byte-exact vectors for the NBD codec, written from the protocol document.

use super::*;

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

#[test]
fn greeting() {
    let mut out = Vec::new();
    encode_greeting(&mut out, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
    assert_eq!(out, hex("4e42444d41474943 49484156454f5054 0003"));
    assert_eq!(decode_greeting(out.as_slice().try_into().unwrap()), Ok(3));
}

#[test]
fn oldstyle_greeting_is_refused() {
    let bytes = hex("4e42444d41474943 0000420281861253 0000");
    let err = decode_greeting(bytes.as_slice().try_into().unwrap()).unwrap_err();
    assert!(matches!(
        err,
        WireError::BadMagic {
            found: CLISERV_MAGIC,
            ..
        }
    ));
}

#[test]
fn option_header() {
    let bytes = hex("49484156454f5054 00000007 0000000c");
    let header = OptionHeader::decode(bytes.as_slice().try_into().unwrap()).unwrap();
    assert_eq!(
        header,
        OptionHeader {
            option: NBD_OPT_GO,
            len: 12
        }
    );
    let bad = hex("49484156454f5055 00000007 0000000c");
    assert!(OptionHeader::decode(bad.as_slice().try_into().unwrap()).is_err());
}

#[test]
fn go_option() {
    let data = hex("00000004 6469736b 0002 0003 0001");
    let parsed = ClientOption::parse(NBD_OPT_GO, &data).unwrap();
    let expected = ClientOption::Go {
        name: "disk".into(),
        requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME],
    };
    assert_eq!(parsed, expected);
    let mut encoded = Vec::new();
    expected.encode(&mut encoded);
    assert_eq!(
        encoded,
        [hex("49484156454f5054 00000007 0000000e"), data].concat()
    );
}

#[test]
fn go_option_with_bad_lengths_is_malformed() {
    // Name length beyond the data.
    assert!(ClientOption::parse(NBD_OPT_GO, &hex("00000010 6469736b 0000")).is_err());
    // Request count that does not match the remaining bytes.
    assert!(ClientOption::parse(NBD_OPT_INFO, &hex("00000000 0002 0003")).is_err());
    // Too short to hold a name length.
    assert!(ClientOption::parse(NBD_OPT_GO, &hex("0000")).is_err());
}

#[test]
fn meta_context_option() {
    let data = hex("00000000 00000001 0000000f 626173653a616c6c6f636174696f6e");
    let parsed = ClientOption::parse(NBD_OPT_SET_META_CONTEXT, &data).unwrap();
    assert_eq!(
        parsed,
        ClientOption::SetMetaContext {
            name: String::new(),
            queries: vec![BASE_ALLOCATION.into()]
        }
    );
    let too_many = hex("00000000 00000002 0000000f 626173653a616c6c6f636174696f6e");
    assert!(ClientOption::parse(NBD_OPT_SET_META_CONTEXT, &too_many).is_err());
}

#[test]
fn options_that_take_no_data() {
    assert_eq!(
        ClientOption::parse(NBD_OPT_LIST, &[]),
        Ok(ClientOption::List)
    );
    assert!(ClientOption::parse(NBD_OPT_LIST, &[1]).is_err());
    assert!(ClientOption::parse(NBD_OPT_STRUCTURED_REPLY, &[0]).is_err());
    assert_eq!(
        ClientOption::parse(NBD_OPT_ABORT, &[1, 2]),
        Ok(ClientOption::Abort)
    );
    assert_eq!(
        ClientOption::parse(42, &[1, 2]),
        Ok(ClientOption::Unknown(42))
    );
}

#[test]
fn export_names_must_be_utf8_without_nul() {
    assert!(ClientOption::parse(NBD_OPT_EXPORT_NAME, b"ok").is_ok());
    assert_eq!(
        ClientOption::parse(NBD_OPT_EXPORT_NAME, b"a\0b"),
        Err(WireError::BadString)
    );
    assert_eq!(
        ClientOption::parse(NBD_OPT_EXPORT_NAME, &[0xff]),
        Err(WireError::BadString)
    );
}

#[test]
fn option_replies() {
    let mut out = Vec::new();
    encode_option_reply(&mut out, NBD_OPT_GO, NBD_REP_ACK, &[]);
    assert_eq!(out, hex("0003e889045565a9 00000007 00000001 00000000"));
    let header = OptionReplyHeader::decode(out.as_slice().try_into().unwrap()).unwrap();
    assert_eq!(header.reply, NBD_REP_ACK);

    out.clear();
    encode_option_reply(
        &mut out,
        NBD_OPT_LIST,
        NBD_REP_SERVER,
        &rep_server_payload("a", "d"),
    );
    assert_eq!(
        out,
        hex("0003e889045565a9 00000003 00000002 00000006 00000001 61 64")
    );

    out.clear();
    encode_option_reply(&mut out, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, b"x");
    assert_eq!(out, hex("0003e889045565a9 00000007 80000006 00000001 78"));
}

#[test]
fn server_and_meta_context_payloads_decode() {
    let server = hex("00000004 6469736b 7363726174636820 64697363");
    assert_eq!(
        decode_rep_server(&server),
        Ok(("disk".into(), "scratch disc".into()))
    );
    assert_eq!(
        decode_rep_server(&rep_server_payload("a", "d")),
        Ok(("a".into(), "d".into()))
    );
    assert_eq!(
        decode_rep_server(&hex("00000000")),
        Ok((String::new(), String::new()))
    );
    assert!(decode_rep_server(&hex("00000005 6469736b")).is_err());
    assert!(decode_rep_server(&hex("0000")).is_err());

    let context = hex("00000001 626173653a616c6c6f636174696f6e");
    assert_eq!(
        decode_rep_meta_context(&context),
        Ok((1, BASE_ALLOCATION.into()))
    );
    assert_eq!(rep_meta_context_payload(1, BASE_ALLOCATION), context);
    assert!(decode_rep_meta_context(&hex("000000")).is_err());
}

#[test]
fn info_payloads() {
    let export = info_export_payload(1 << 20, 0x0d4d);
    assert_eq!(export, hex("0000 0000000000100000 0d4d"));
    assert_eq!(
        InfoReply::decode(&export),
        Ok(InfoReply::Export {
            size: 1 << 20,
            flags: 0x0d4d
        })
    );
    let block = info_block_size_payload(1, 4096, 32 << 20);
    assert_eq!(block, hex("0003 00000001 00001000 02000000"));
    assert_eq!(
        InfoReply::decode(&block),
        Ok(InfoReply::BlockSize {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20
        })
    );
    assert_eq!(info_string_payload(NBD_INFO_NAME, "d"), hex("0001 64"));
    assert!(InfoReply::decode(&hex("0000 00")).is_err());
}

#[test]
fn export_name_reply() {
    let mut out = Vec::new();
    encode_export_name_reply(&mut out, 4096, 0x0003, false);
    assert_eq!(out.len(), 8 + 2 + 124);
    assert_eq!(&out[..10], hex("0000000000001000 0003").as_slice());
    out.clear();
    encode_export_name_reply(&mut out, 4096, 0x0003, true);
    assert_eq!(out.len(), 10);
}

#[test]
fn request() {
    let bytes = hex("25609513 0001 0001 0000000000000007 0000000000001000 00000200");
    let request = Request::decode(bytes.as_slice().try_into().unwrap()).unwrap();
    assert_eq!(
        request,
        Request {
            flags: NBD_CMD_FLAG_FUA,
            command: NBD_CMD_WRITE,
            cookie: 7,
            offset: 4096,
            len: 512
        }
    );
    let mut out = Vec::new();
    request.encode(&mut out);
    assert_eq!(out, bytes);
    let mut bad = bytes.clone();
    bad[0] = 0x26;
    assert!(matches!(
        Request::decode(bad.as_slice().try_into().unwrap()),
        Err(WireError::BadMagic { .. })
    ));
}

#[test]
fn extended_request() {
    // proto.md (extension-ext-header), "Request message": magic 0x21e41c71, flags,
    // type, cookie, offset, 64-bit length.
    let bytes = hex("21e41c71 0021 0001 0000000000000007 0000000000100000 0000000280000000");
    let request = Request::decode_extended(bytes.as_slice().try_into().unwrap()).unwrap();
    let expected = Request {
        flags: NBD_CMD_FLAG_PAYLOAD_LEN | NBD_CMD_FLAG_FUA,
        command: NBD_CMD_WRITE,
        cookie: 7,
        offset: 1 << 20,
        len: 0x2_8000_0000,
    };
    assert_eq!(request, expected);
    let mut out = Vec::new();
    expected.encode_extended(&mut out);
    assert_eq!(out, bytes);
    assert_eq!(
        Request::decode_framed(Framing::Extended, &bytes),
        Ok(expected)
    );
    // The compact magic is not an extended header, nor the other way round.
    let mut compact = Vec::new();
    Request {
        len: 512,
        ..expected
    }
    .encode(&mut compact);
    assert!(
        Request::decode_framed(Framing::Extended, &[compact.clone(), vec![0; 4]].concat()).is_err()
    );
    assert!(Request::decode_framed(Framing::Structured, &bytes[..REQUEST_LEN]).is_err());
    assert!(Request::decode_framed(Framing::Structured, &compact).is_ok());
    // A header of the wrong size is malformed, not a panic.
    assert!(Request::decode_framed(Framing::Extended, &compact).is_err());
}

#[test]
fn extended_headers_option_takes_no_data() {
    let mut out = Vec::new();
    ClientOption::ExtendedHeaders.encode(&mut out);
    assert_eq!(out, hex("49484156454f5054 0000000b 00000000"));
    assert_eq!(
        ClientOption::parse(NBD_OPT_EXTENDED_HEADERS, &[]),
        Ok(ClientOption::ExtendedHeaders)
    );
    assert!(matches!(
        ClientOption::parse(NBD_OPT_EXTENDED_HEADERS, &[1]),
        Err(WireError::MalformedOption { .. })
    ));
}

#[test]
fn extended_reply_chunks() {
    // proto.md, "Extended reply chunk message": magic 0x6e8a278c, flags, type,
    // cookie, the request's offset, 64-bit payload length.
    let frame = ChunkFrame::extended(9, 4096);
    let mut out = Vec::new();
    frame.offset_data_header(&mut out, 8192, 512, true);
    assert_eq!(
        out,
        hex(
            "6e8a278c 0001 0001 0000000000000009 0000000000001000 0000000000000208 \
             0000000000002000"
        )
    );
    let (header, used) = ReplyHeader::decode(&out).unwrap().unwrap();
    assert_eq!(used, EXTENDED_REPLY_LEN);
    assert_eq!(
        header,
        ReplyHeader::Extended {
            flags: NBD_REPLY_FLAG_DONE,
            kind: NBD_REPLY_TYPE_OFFSET_DATA,
            cookie: 9,
            offset: 4096,
            len: 520,
        }
    );
    assert_eq!(header.cookie(), 9);
    // Fewer than 32 bytes: more are needed.
    assert_eq!(ReplyHeader::decode(&out[..20]), Ok(None));

    out.clear();
    frame.none(&mut out);
    assert_eq!(
        out,
        hex("6e8a278c 0001 0000 0000000000000009 0000000000001000 0000000000000000")
    );
    out.clear();
    frame.error(&mut out, NBD_EIO, "no");
    assert_eq!(
        out,
        hex(
            "6e8a278c 0001 8001 0000000000000009 0000000000001000 0000000000000008 \
             00000005 0002 6e6f"
        )
    );
    // The same error as a structured chunk differs only in the header.
    let mut structured = Vec::new();
    ChunkFrame::structured(9).error(&mut structured, NBD_EIO, "no");
    assert_eq!(&structured[CHUNK_HEADER_LEN..], &out[EXTENDED_REPLY_LEN..]);
    assert_eq!(ChunkFrame::structured(9).header_len(), CHUNK_HEADER_LEN);
    assert_eq!(frame.header_len(), EXTENDED_REPLY_LEN);
}

#[test]
fn extended_block_status_chunk() {
    // NBD_REPLY_TYPE_BLOCK_STATUS_EXT: context id, descriptor count, then 64-bit
    // length and 64-bit status per descriptor.
    let mut out = Vec::new();
    let descriptors = [(0x1_0000_0000, 0), (4096, NBD_STATE_HOLE | NBD_STATE_ZERO)];
    ChunkFrame::extended(3, 0).block_status(&mut out, 1, &descriptors, true);
    assert_eq!(
        out,
        hex(
            "6e8a278c 0001 0006 0000000000000003 0000000000000000 0000000000000028 \
             00000001 00000002 \
             0000000100000000 0000000000000000 \
             0000000000001000 0000000000000003"
        )
    );
    let payload = &out[EXTENDED_REPLY_LEN..];
    assert_eq!(
        decode_block_status_ext(payload),
        Ok((1, vec![(0x1_0000_0000, 0), (4096, 3)]))
    );
    // A count that disagrees with the length, or no descriptor at all.
    let mut wrong = payload.to_vec();
    wrong[7] = 3;
    assert!(decode_block_status_ext(&wrong).is_err());
    assert!(decode_block_status_ext(&payload[..8]).is_err());
    assert!(decode_block_status_ext(&payload[..payload.len() - 1]).is_err());
    // Structured framing keeps the 32-bit type.
    let mut compact = Vec::new();
    ChunkFrame::structured(3).block_status(&mut compact, 1, &[(4096, 3)], true);
    let mut legacy = Vec::new();
    encode_block_status(&mut legacy, 3, 1, &[(4096, 3)], true);
    assert_eq!(compact, legacy);
    assert_eq!(
        decode_block_status(&compact[CHUNK_HEADER_LEN..]),
        Ok((1, vec![(4096, 3)]))
    );
}

#[test]
fn simple_reply() {
    let mut out = Vec::new();
    encode_simple_reply(&mut out, NBD_EINVAL, 7);
    assert_eq!(out, hex("67446698 00000016 0000000000000007"));
    assert_eq!(
        ReplyHeader::decode(&out),
        Ok(Some((
            ReplyHeader::Simple {
                error: NBD_EINVAL,
                cookie: 7
            },
            16
        )))
    );
    assert_eq!(ReplyHeader::decode(&out[..10]), Ok(None));
}

#[test]
fn offset_data_and_hole_chunks() {
    let mut out = Vec::new();
    encode_offset_data_header(&mut out, 9, 4096, 512, true);
    assert_eq!(
        out,
        hex("668e33ef 0001 0001 0000000000000009 00000208 0000000000001000")
    );
    out.clear();
    encode_offset_hole(&mut out, 9, 4096, 65536, true);
    assert_eq!(
        out,
        hex("668e33ef 0001 0002 0000000000000009 0000000c 0000000000001000 00010000")
    );
    assert_eq!(
        ReplyHeader::decode(&out),
        Ok(Some((
            ReplyHeader::Chunk {
                flags: 1,
                kind: NBD_REPLY_TYPE_OFFSET_HOLE,
                cookie: 9,
                len: 12
            },
            20
        )))
    );
}

#[test]
fn block_status_chunk() {
    let mut out = Vec::new();
    encode_block_status(
        &mut out,
        5,
        1,
        &[(4096, 0), (8192, NBD_STATE_HOLE | NBD_STATE_ZERO)],
        true,
    );
    assert_eq!(
        out,
        hex("668e33ef 0001 0005 0000000000000005 00000014 00000001 00001000 00000000 00002000 00000003")
    );
    assert_eq!(
        decode_block_status(&out[20..]),
        Ok((1, vec![(4096, 0), (8192, 3)]))
    );
    assert!(decode_block_status(&out[20..30]).is_err());
}

#[test]
fn error_and_none_chunks() {
    let mut out = Vec::new();
    encode_error_chunk(&mut out, 3, NBD_EPERM, "no");
    assert_eq!(
        out,
        hex("668e33ef 0001 8001 0000000000000003 00000008 00000001 0002 6e6f")
    );
    assert_eq!(
        decode_error_payload(&out[20..]),
        Ok((NBD_EPERM, "no".into()))
    );
    out.clear();
    encode_none_chunk(&mut out, 3);
    assert_eq!(out, hex("668e33ef 0001 0000 0000000000000003 00000000"));
}

#[test]
fn long_error_messages_are_cut_on_a_character_boundary() {
    let mut out = Vec::new();
    let message = "é".repeat(400);
    encode_error_chunk(&mut out, 1, NBD_EIO, &message);
    let (_, decoded) = decode_error_payload(&out[20..]).unwrap();
    assert!(decoded.len() <= 512 && decoded.chars().all(|c| c == 'é'));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn request_round_trips(flags: u16, command: u16, cookie: u64, offset: u64, len: u32) {
            let request = Request { flags, command, cookie, offset, len: len.into() };
            let mut out = Vec::new();
            request.encode(&mut out);
            prop_assert_eq!(Request::decode(out.as_slice().try_into().unwrap()), Ok(request));
        }

        #[test]
        fn extended_request_round_trips(flags: u16, command: u16, cookie: u64, offset: u64, len: u64) {
            let request = Request { flags, command, cookie, offset, len };
            let mut out = Vec::new();
            request.encode_extended(&mut out);
            prop_assert_eq!(out.len(), EXTENDED_REQUEST_LEN);
            prop_assert_eq!(Request::decode_extended(out.as_slice().try_into().unwrap()), Ok(request));
        }

        #[test]
        fn reply_header_decoding_never_panics(data in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = ReplyHeader::decode(&data);
            let _ = decode_block_status_ext(&data);
        }

        #[test]
        fn option_parsing_never_panics(option in 0u32..16, data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = ClientOption::parse(option, &data);
        }

        #[test]
        fn go_round_trips(name in "[a-z0-9/]{0,40}", requests in proptest::collection::vec(0u16..4, 0..4)) {
            let option = ClientOption::Go { name, requests };
            let mut out = Vec::new();
            option.encode(&mut out);
            let header = OptionHeader::decode(out[..16].try_into().unwrap()).unwrap();
            prop_assert_eq!(ClientOption::parse(header.option, &out[16..]), Ok(option));
        }
    }
}
