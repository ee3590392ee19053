//! Reply parsing driven with bytes made by the codec's encoders.

use super::*;

const COOKIE: u64 = 9;

fn read(offset: u64, len: u32, structured: bool) -> Expect {
    Expect {
        command: NBD_CMD_READ,
        offset,
        len,
        structured,
        extended: false,
        context: None,
    }
}

fn status(offset: u64, len: u32) -> Expect {
    Expect {
        command: NBD_CMD_BLOCK_STATUS,
        offset,
        len,
        structured: true,
        extended: false,
        context: Some(1),
    }
}

fn write(structured: bool) -> Expect {
    Expect {
        command: NBD_CMD_WRITE,
        offset: 0,
        len: 512,
        structured,
        extended: false,
        context: None,
    }
}

/// Feeds `stream` (one whole reply) through a [`ReplyState`] the way the reader
/// does, into a buffer that starts out as 0xAA.
fn drive(expect: Expect, stream: &[u8]) -> Result<(Completion, Vec<u8>), Violation> {
    let mut state = ReplyState::new(expect);
    let mut buf = vec![0xAAu8; expect.len as usize];
    let mut input = stream;
    loop {
        let (header, used) = ReplyHeader::decode(input)
            .map_err(|e| Violation(e.to_string()))?
            .expect("a whole header");
        input = &input[used..];
        let mut next = match header {
            ReplyHeader::Simple { error, cookie } => {
                assert_eq!(cookie, COOKIE);
                state.simple(error)?
            }
            ReplyHeader::Chunk {
                flags,
                kind,
                cookie,
                len,
            } => {
                assert_eq!(cookie, COOKIE);
                state.chunk(flags, kind, len)?
            }
            ReplyHeader::Extended {
                flags,
                kind,
                cookie,
                offset,
                len,
            } => {
                assert_eq!(cookie, COOKIE);
                state.extended_chunk(flags, kind, offset, len)?
            }
        };
        loop {
            next = match next {
                Next::Payload(n) => {
                    let (payload, rest) = input.split_at(n);
                    input = rest;
                    state.payload(payload)?
                }
                Next::Data { at, len } => {
                    buf[at..at + len].copy_from_slice(&input[..len]);
                    input = &input[len..];
                    state.data_done()?
                }
                Next::Zeroes { at, len } => {
                    buf[at..at + len].fill(0);
                    state.data_done()?
                }
                Next::More => break,
                Next::Complete(completion) => {
                    assert!(input.is_empty(), "bytes left after the reply");
                    return Ok((completion, buf));
                }
            }
        }
    }
}

fn data_chunk(offset: u64, data: &[u8], done: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_offset_data_header(&mut out, COOKIE, offset, data.len() as u32, done);
    out.extend_from_slice(data);
    out
}

fn hole_chunk(offset: u64, len: u32, done: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_offset_hole(&mut out, COOKIE, offset, len, done);
    out
}

fn none_chunk() -> Vec<u8> {
    let mut out = Vec::new();
    encode_none_chunk(&mut out, COOKIE);
    out
}

fn error_chunk(error: u32, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_error_chunk(&mut out, COOKIE, error, message);
    out
}

fn error_offset_chunk(error: u32, message: &str, offset: u64, done: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let flags = if done { NBD_REPLY_FLAG_DONE } else { 0 };
    let len = 14 + message.len() as u32;
    encode_chunk_header(&mut out, flags, NBD_REPLY_TYPE_ERROR_OFFSET, COOKIE, len);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
    out
}

fn simple(error: u32) -> Vec<u8> {
    let mut out = Vec::new();
    encode_simple_reply(&mut out, error, COOKIE);
    out
}

fn status_chunk(context: u32, descriptors: &[(u32, u32)], done: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_block_status(&mut out, COOKIE, context, descriptors, done);
    out
}

fn violation_of(expect: Expect, stream: &[u8]) -> String {
    match drive(expect, stream) {
        Err(Violation(reason)) => reason,
        Ok(result) => panic!("accepted: {result:?}"),
    }
}

#[test]
fn simple_read_carries_its_data() {
    let data: Vec<u8> = (0..=255).collect();
    let stream = [simple(0), data.clone()].concat();
    let (completion, buf) = drive(read(4096, 256, false), &stream).unwrap();
    assert_eq!(completion, Ok(Outcome::Done));
    assert_eq!(buf, data);
}

#[test]
fn simple_errors_carry_no_data() {
    let (completion, _) = drive(read(0, 512, false), &simple(NBD_EIO)).unwrap();
    assert_eq!(
        completion,
        Err(ServerError {
            error: NBD_EIO,
            message: String::new(),
            offset: None
        })
    );
    let (completion, _) = drive(write(false), &simple(0)).unwrap();
    assert_eq!(completion, Ok(Outcome::Done));
    // With structured replies, non-read commands may still get simple replies.
    let (completion, _) = drive(write(true), &simple(NBD_ENOSPC)).unwrap();
    assert_eq!(completion.unwrap_err().error, NBD_ENOSPC);
}

#[test]
fn structured_read_in_one_chunk() {
    let data = vec![7u8; 1024];
    let (completion, buf) =
        drive(read(1 << 20, 1024, true), &data_chunk(1 << 20, &data, true)).unwrap();
    assert_eq!(completion, Ok(Outcome::Done));
    assert_eq!(buf, data);
}

#[test]
fn structured_read_assembled_from_chunks_in_any_order() {
    // 4096 bytes at 8192: data for the last 1024, a hole in the middle, data first.
    let stream = [
        data_chunk(8192 + 3072, &[3u8; 1024], false),
        hole_chunk(8192 + 1024, 2048, false),
        data_chunk(8192, &[1u8; 1024], false),
        none_chunk(),
    ]
    .concat();
    let (completion, buf) = drive(read(8192, 4096, true), &stream).unwrap();
    assert_eq!(completion, Ok(Outcome::Done));
    assert!(buf[..1024].iter().all(|&b| b == 1));
    assert!(buf[1024..3072].iter().all(|&b| b == 0));
    assert!(buf[3072..].iter().all(|&b| b == 3));

    let (completion, buf) = drive(read(0, 65536, true), &hole_chunk(0, 65536, true)).unwrap();
    assert_eq!(completion, Ok(Outcome::Done));
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn error_chunks_carry_message_and_offset() {
    let stream = error_chunk(NBD_EIO, "medium error at sector 9");
    let (completion, _) = drive(read(0, 4096, true), &stream).unwrap();
    assert_eq!(
        completion,
        Err(ServerError {
            error: NBD_EIO,
            message: "medium error at sector 9".into(),
            offset: None
        })
    );

    // Partial data, then an error at an offset, then the end.
    let stream = [
        data_chunk(0, &[5u8; 512], false),
        error_offset_chunk(NBD_EIO, "bad", 512, false),
        none_chunk(),
    ]
    .concat();
    let (completion, _) = drive(read(0, 1024, true), &stream).unwrap();
    let error = completion.unwrap_err();
    assert_eq!((error.error, error.offset), (NBD_EIO, Some(512)));

    // An unknown error type still fails the request.
    let mut stream = error_chunk(NBD_EPERM, "x");
    stream[6] = 0x80;
    stream[7] = 0x63;
    let (completion, _) = drive(write(true), &stream).unwrap();
    assert_eq!(completion.unwrap_err().error, NBD_EPERM);
}

#[test]
fn block_status_descriptors() {
    let descriptors = [(4096, 0), (8192, NBD_STATE_HOLE | NBD_STATE_ZERO)];
    let wide: Vec<(u64, u32)> = descriptors.iter().map(|&(l, s)| (l.into(), s)).collect();
    let (completion, _) = drive(status(0, 65536), &status_chunk(1, &descriptors, true)).unwrap();
    assert_eq!(completion, Ok(Outcome::Extents(wide.clone())));
    // Ended by a separate NONE chunk.
    let stream = [status_chunk(1, &descriptors, false), none_chunk()].concat();
    let (completion, _) = drive(status(0, 65536), &stream).unwrap();
    assert_eq!(completion, Ok(Outcome::Extents(wide.clone())));
    // An error instead.
    let (completion, _) = drive(status(0, 65536), &error_chunk(NBD_EINVAL, "past end")).unwrap();
    assert_eq!(completion.unwrap_err().error, NBD_EINVAL);
}

#[test]
fn chunks_outside_or_overlapping_the_request_are_violations() {
    let beyond = violation_of(
        read(4096, 1024, true),
        &data_chunk(4096 + 512, &[0; 1024], true),
    );
    assert!(beyond.contains("outside"), "{beyond}");
    let before = violation_of(read(4096, 1024, true), &data_chunk(0, &[0; 512], true));
    assert!(before.contains("outside"), "{before}");
    let hole = violation_of(read(0, 1024, true), &hole_chunk(512, 1024, true));
    assert!(hole.contains("outside"), "{hole}");
    let wrap = violation_of(read(0, 1024, true), &hole_chunk(u64::MAX - 10, 100, true));
    assert!(wrap.contains("outside"), "{wrap}");
    let too_long = violation_of(read(0, 16, true), &data_chunk(0, &[0; 32], true));
    assert!(too_long.contains("data chunk of 40 bytes"), "{too_long}");

    let overlap = [data_chunk(0, &[0; 512], false), hole_chunk(256, 512, true)].concat();
    let overlap = violation_of(read(0, 1024, true), &overlap);
    assert!(overlap.contains("overlaps"), "{overlap}");

    let short = violation_of(read(0, 1024, true), &data_chunk(0, &[0; 512], true));
    assert!(short.contains("512 of 1024"), "{short}");
    let empty_hole = violation_of(read(0, 1024, true), &hole_chunk(0, 0, true));
    assert!(empty_hole.contains("zero bytes"), "{empty_hole}");
}

#[test]
fn replies_that_do_not_fit_the_request_are_violations() {
    // A simple reply to a read once structured replies are on.
    let reason = violation_of(read(0, 512, true), &[simple(0), vec![0; 512]].concat());
    assert!(reason.contains("simple reply to a read"), "{reason}");
    // A chunk without structured replies.
    let reason = violation_of(write(false), &none_chunk());
    assert!(reason.contains("not negotiated"), "{reason}");
    // Content chunks for a write, status for a read.
    let reason = violation_of(write(true), &data_chunk(0, &[0; 8], true));
    assert!(reason.contains("reply to a write"), "{reason}");
    let reason = violation_of(read(0, 512, true), &status_chunk(1, &[(512, 0)], true));
    assert!(reason.contains("reply to a read"), "{reason}");
    // NONE must be final and empty.
    let mut open_none = none_chunk();
    open_none[5] = 0;
    let reason = violation_of(write(true), &open_none);
    assert!(reason.contains("DONE"), "{reason}");
    // A chunk type nobody defined.
    let mut unknown = none_chunk();
    unknown[7] = 42;
    let reason = violation_of(write(true), &unknown);
    assert!(reason.contains("unknown chunk type 42"), "{reason}");
    // Error value 0, message longer than the chunk.
    let reason = violation_of(write(true), &error_chunk(0, "x"));
    assert!(reason.contains("error value 0"), "{reason}");
    let mut long_message = error_chunk(NBD_EIO, "abc");
    long_message[CHUNK_HEADER_LEN + 5] = 200;
    let reason = violation_of(write(true), &long_message);
    assert!(reason.contains("message of 200 bytes"), "{reason}");
    let reason = violation_of(
        read(0, 1024, true),
        &error_offset_chunk(NBD_EIO, "", 4096, true),
    );
    assert!(reason.contains("outside"), "{reason}");
}

#[test]
fn block_status_violations() {
    let reason = violation_of(status(0, 4096), &status_chunk(2, &[(4096, 0)], true));
    assert!(reason.contains("context 2"), "{reason}");
    let twice = [
        status_chunk(1, &[(4096, 0)], false),
        status_chunk(1, &[(4096, 0)], true),
    ]
    .concat();
    let reason = violation_of(status(0, 4096), &twice);
    assert!(reason.contains("two block status chunks"), "{reason}");
    let reason = violation_of(status(0, 4096), &status_chunk(1, &[(0, 0)], true));
    assert!(reason.contains("zero length"), "{reason}");
    let reason = violation_of(status(0, 4096), &none_chunk());
    assert!(reason.contains("without a status chunk"), "{reason}");
    let reason = violation_of(status(0, 4096), &simple(0));
    assert!(reason.contains("simple reply"), "{reason}");
}

fn extended(expect: Expect) -> Expect {
    Expect {
        extended: true,
        ..expect
    }
}

#[test]
fn extended_chunks_carry_the_request_offset() {
    let expect = extended(read(4096, 1024, true));
    let frame = ChunkFrame::extended(COOKIE, 4096);
    let mut stream = Vec::new();
    frame.offset_data_header(&mut stream, 4096, 512, false);
    stream.extend_from_slice(&[5u8; 512]);
    frame.offset_hole(&mut stream, 4608, 512, true);
    let (completion, buf) = drive(expect, &stream).unwrap();
    assert_eq!(completion, Ok(Outcome::Done));
    assert_eq!(&buf[..512], &[5u8; 512]);
    assert_eq!(&buf[512..], &[0u8; 512]);

    // The header's offset must repeat the request's.
    let mut wrong = Vec::new();
    ChunkFrame::extended(COOKIE, 0).offset_hole(&mut wrong, 4096, 1024, true);
    let err = drive(expect, &wrong).unwrap_err();
    assert!(err.0.contains("offset"), "{err}");

    // Neither simple replies nor structured chunks once extended headers are on.
    let mut simple_ok = Vec::new();
    encode_simple_reply(&mut simple_ok, 0, COOKIE);
    assert!(drive(extended(write(true)), &simple_ok).is_err());
    assert!(drive(extended(write(true)), &none_chunk()).is_err());
    // Nor extended chunks without them.
    let mut none = Vec::new();
    ChunkFrame::extended(COOKIE, 0).none(&mut none);
    assert!(drive(write(true), &none).is_err());
    assert_eq!(
        drive(extended(write(true)), &none).unwrap().0,
        Ok(Outcome::Done)
    );
}

#[test]
fn extended_block_status_has_64_bit_descriptors() {
    let expect = extended(status(0, 65536));
    let descriptors = [(1 << 33, 0), (4096, NBD_STATE_HOLE | NBD_STATE_ZERO)];
    let mut stream = Vec::new();
    ChunkFrame::extended(COOKIE, 0).block_status(&mut stream, 1, &descriptors, true);
    let (completion, _) = drive(expect, &stream).unwrap();
    assert_eq!(completion, Ok(Outcome::Extents(descriptors.to_vec())));
    // The 32-bit type is not valid with extended headers, nor the other way round.
    let mut compact = Vec::new();
    encode_block_status(&mut compact, COOKIE, 1, &[(4096, 0)], true);
    assert!(drive(expect, &compact).is_err());
    let mut wrong_framing = Vec::new();
    ChunkFrame::structured(COOKIE).block_status(&mut wrong_framing, 1, &[(4096, 0)], true);
    wrong_framing[7] = NBD_REPLY_TYPE_BLOCK_STATUS_EXT as u8;
    assert!(drive(status(0, 65536), &wrong_framing).is_err());
    // A length beyond 32 bits in an extended header is not believed.
    let mut huge = Vec::new();
    ChunkFrame::extended(COOKIE, 0).header(
        &mut huge,
        NBD_REPLY_FLAG_DONE,
        NBD_REPLY_TYPE_BLOCK_STATUS_EXT,
        1 << 33,
    );
    assert!(drive(expect, &huge).is_err());
}
