//! The network baseline's decoders (what `blockwire netserve` and the bench read from
//! a socket) on arbitrary bytes: none may panic, and what decodes re-encodes to the
//! same bytes' meaning.
#![no_main]

use blockwire_bench::netperf::wire::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = Request::decode(data) {
        assert_eq!(Request::decode(&request.encode()).unwrap(), request);
        if let Request::Test(test) = request {
            assert_eq!(test.validate(), Ok(()));
        }
    }
    if let Ok(accept) = Accept::decode(data) {
        assert_eq!(Accept::decode(&accept.encode()).unwrap(), accept);
    }
    if let Ok(report) = Report::decode(data) {
        assert_eq!(Report::decode(&report.encode()).unwrap(), report);
    }
    if let Some(header) = data.first_chunk::<CHUNK_HEADER_LEN>() {
        let buffer = data.get(4..8).map_or(1 << 20, |b| {
            u32::from_be_bytes(b.try_into().expect("four bytes"))
        });
        if let Ok(len) = decode_chunk_header(*header, buffer) {
            assert!(len <= buffer);
        }
    }
});
