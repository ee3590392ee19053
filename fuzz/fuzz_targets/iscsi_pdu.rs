//! The iSCSI PDU codec on arbitrary headers: a 48-byte BHS and whatever AHS follows.
//! Decoding must never panic, and what decodes must survive encode and decode
//! unchanged (reserved bits are dropped, so the comparison is between decoded PDUs).
#![no_main]

use blockwire_iscsi::pdu::{Bhs, Pdu, BHS_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<BHS_LEN>() else {
        return;
    };
    let bhs = Bhs(*head);
    let ahs_len = bhs.ahs_len();
    // Also try a wrong AHS length: it must be refused, not trusted.
    let _ = Pdu::decode(&bhs, rest);
    let Some(ahs) = rest.get(..ahs_len) else {
        return;
    };
    let Ok(pdu) = Pdu::decode(&bhs, ahs) else {
        return;
    };
    let header = pdu.encode(bhs.data_len());
    assert_eq!(header.bhs.data_len(), bhs.data_len());
    assert_eq!(header.bhs.ahs_len(), header.ahs.len());
    let again = Pdu::decode(&header.bhs, &header.ahs).expect("an encoded PDU decodes");
    assert_eq!(again, pdu);
    assert_eq!(again.encode(bhs.data_len()), header);
});
