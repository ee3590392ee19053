//! The NVMe/TCP PDU codec on arbitrary bytes, with and without digests. Decoding
//! must never panic; what decodes must encode back and decode to the same PDU.
#![no_main]

use blockwire_nvme::pdu::{decode, pdu_len, Digests, Framing};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let framing = Framing {
        digests: Digests::from_byte(mode & 3),
        send_pda: (mode >> 2) & 7,
        ..Framing::default()
    };
    let _ = pdu_len(bytes, &framing);
    let Ok(Some((pdu, used))) = decode(bytes, &framing) else {
        return;
    };
    assert!(used <= bytes.len());
    let again = pdu.to_bytes(&framing);
    let (decoded, len) = decode(&again, &framing)
        .expect("an encoded PDU decodes")
        .expect("an encoded PDU is complete");
    assert_eq!(len, again.len());
    assert_eq!(decoded, pdu);
});
