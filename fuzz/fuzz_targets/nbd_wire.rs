//! Every NBD decoder on arbitrary bytes: none may panic, and what decodes must
//! re-encode to the same bytes where the codec has an encoder.
#![no_main]

use blockwire_nbd::wire::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= OPTION_HEADER_LEN {
        let _ = OptionHeader::decode(data[..OPTION_HEADER_LEN].try_into().unwrap());
    }
    if let Some((&option, rest)) = data.split_first() {
        let _ = ClientOption::parse(u32::from(option % 16), rest);
    }
    if data.len() >= REQUEST_LEN {
        if let Ok(request) = Request::decode(data[..REQUEST_LEN].try_into().unwrap()) {
            let mut out = Vec::new();
            request.encode(&mut out);
            assert_eq!(&out[..], &data[..REQUEST_LEN]);
        }
    }
    if data.len() >= EXTENDED_REQUEST_LEN {
        let header = &data[..EXTENDED_REQUEST_LEN];
        if let Ok(request) = Request::decode_extended(header.try_into().unwrap()) {
            let mut out = Vec::new();
            request.encode_extended(&mut out);
            assert_eq!(&out[..], header);
            assert_eq!(Request::decode_framed(Framing::Extended, header), Ok(request));
        }
    }
    for framing in [Framing::Simple, Framing::Extended] {
        let _ = Request::decode_framed(framing, data);
    }
    if data.len() >= OPTION_REPLY_HEADER_LEN {
        let _ = OptionReplyHeader::decode(data[..OPTION_REPLY_HEADER_LEN].try_into().unwrap());
    }
    if data.len() >= GREETING_LEN {
        let _ = decode_greeting(data[..GREETING_LEN].try_into().unwrap());
    }
    if let Ok(Some((header, used))) = ReplyHeader::decode(data) {
        assert!(used <= data.len());
        // An extended chunk re-encodes to the bytes it came from.
        if let ReplyHeader::Extended {
            flags,
            kind,
            cookie,
            offset,
            len,
        } = header
        {
            let mut out = Vec::new();
            ChunkFrame::extended(cookie, offset).header(&mut out, flags, kind, len);
            assert_eq!(&out[..], &data[..used]);
        }
    }
    let _ = InfoReply::decode(data);
    let _ = decode_error_payload(data);
    let _ = decode_block_status(data);
    let _ = decode_block_status_ext(data);
});
