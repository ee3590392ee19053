//! The NVMe/TCP PDU codec on arbitrary bytes, with and without digests. Decoding
//! must never panic; what decodes must encode back and decode to the same PDU, and a
//! data PDU's header must decode alone to the same fields.
#![no_main]

use blockwire_nvme::pdu::{decode, decode_data_header, pdu_len, Digests, Framing, Pdu};
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
    let header = decode_data_header(bytes, &framing);
    let Ok(Some((pdu, used))) = decode(bytes, &framing) else {
        return;
    };
    assert!(used <= bytes.len());
    // A data PDU that decodes whole has a header that decodes alone, saying the same.
    if let Pdu::H2CData(d) = &pdu {
        let h = header.expect("the header of a valid H2CData");
        assert_eq!((h.cccid, h.ttag, h.offset), (d.cccid, d.ttag, d.offset));
        assert_eq!(h.length as usize, d.data.len());
        assert_eq!(&bytes[h.data_at..h.data_at + d.data.len()], &d.data[..]);
    }
    let again = pdu.to_bytes(&framing);
    let (decoded, len) = decode(&again, &framing)
        .expect("an encoded PDU decodes")
        .expect("an encoded PDU is complete");
    assert_eq!(len, again.len());
    assert_eq!(decoded, pdu);
});
