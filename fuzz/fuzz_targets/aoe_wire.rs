//! Every AoE decoder on arbitrary bytes: none may panic, and what decodes re-encodes
//! to bytes that decode to the same message.
#![no_main]

use blockwire_aoe::identify::Identity;
use blockwire_aoe::wire::*;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Identity::parse(data);
    let Ok((header, rest)) = Header::parse(data) else {
        return;
    };
    let mut again = Vec::new();
    header.encode(&mut again);
    assert_eq!(Header::parse(&again).unwrap().0, header);
    // Try the body as every command, not only the one the header names.
    for command in [
        Command::Ata,
        Command::QueryConfig,
        Command::MacMaskList,
        Command::ReserveRelease,
    ] {
        if let Ok(body) = Body::parse(command, rest) {
            let mut encoded = Vec::new();
            body.encode(&mut encoded);
            assert_eq!(Body::parse(command, &encoded).unwrap(), body);
        }
    }
});
