//! The handshake state machine driven without sockets.

use std::sync::Arc;

use blockwire_blockdev::{Device, MemoryDevice};

use super::*;
use crate::target::export::{Export, ExportSet};
use crate::target::session::Action;

fn exports() -> Arc<ExportSet> {
    let mut set = ExportSet::new();
    let disk = Device::from_device(MemoryDevice::new(1 << 20));
    set.add(Export::new("disk", "the disk", disk)).unwrap();
    let other = Device::from_device(MemoryDevice::new(2 << 20)).read_only();
    set.add(Export::new("other", "", other)).unwrap();
    Arc::new(set)
}

fn start() -> Negotiation {
    Negotiation::start(exports(), NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).unwrap()
}

/// Splits option replies into (option, reply type, payload).
fn replies(mut bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header =
            OptionReplyHeader::decode(bytes[..OPTION_REPLY_HEADER_LEN].try_into().unwrap())
                .unwrap();
        let end = OPTION_REPLY_HEADER_LEN + header.len as usize;
        out.push((
            header.option,
            header.reply,
            bytes[OPTION_REPLY_HEADER_LEN..end].to_vec(),
        ));
        bytes = &bytes[end..];
    }
    out
}

fn send(negotiation: &mut Negotiation, option: ClientOption) -> (Step, Vec<(u32, u32, Vec<u8>)>) {
    let mut encoded = Vec::new();
    option.encode(&mut encoded);
    let header = OptionHeader::decode(encoded[..OPTION_HEADER_LEN].try_into().unwrap()).unwrap();
    let mut out = Vec::new();
    let step = negotiation.handle(header.option, &encoded[OPTION_HEADER_LEN..], &mut out);
    (step, replies(&out))
}

fn go(name: &str) -> ClientOption {
    ClientOption::Go {
        name: name.into(),
        requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME, NBD_INFO_DESCRIPTION],
    }
}

fn block_status_allowed(session: &Session) -> bool {
    let request = Request {
        flags: 0,
        command: NBD_CMD_BLOCK_STATUS,
        cookie: 1,
        offset: 0,
        len: 4096,
    };
    matches!(session.classify(&request), Action::Execute(_))
}

#[test]
fn clients_must_speak_fixed_newstyle() {
    assert_eq!(
        Negotiation::start(exports(), 0).err(),
        Some(HandshakeError::NotFixedNewstyle(0))
    );
    assert_eq!(
        Negotiation::start(exports(), NBD_FLAG_C_FIXED_NEWSTYLE | 0x100).err(),
        Some(HandshakeError::UnknownClientFlags(0x101))
    );
}

#[test]
fn go_answers_info_then_ack_and_enters_transmission() {
    let mut negotiation = start();
    let (step, replies) = send(&mut negotiation, go("disk"));
    let Step::Transmission(session) = step else {
        panic!("GO did not enter transmission: {step:?}");
    };
    let kinds: Vec<u32> = replies.iter().map(|r| r.1).collect();
    assert_eq!(kinds.last(), Some(&NBD_REP_ACK));
    let infos: Vec<InfoReply> = replies
        .iter()
        .filter(|r| r.1 == NBD_REP_INFO)
        .map(|r| InfoReply::decode(&r.2).unwrap())
        .collect();
    assert!(infos.contains(&InfoReply::Export {
        size: 1 << 20,
        flags: session.flags()
    }));
    assert!(infos.contains(&InfoReply::Name("disk".into())));
    assert!(infos.contains(&InfoReply::Description("the disk".into())));
    assert!(infos
        .iter()
        .any(|i| matches!(i, InfoReply::BlockSize { maximum, .. } if *maximum == 32 << 20)));
    // Without structured replies, no DF and no block status.
    assert_eq!(session.flags() & NBD_FLAG_SEND_DF, 0);
    assert!(!block_status_allowed(&session));
}

#[test]
fn empty_name_selects_the_default_export() {
    let mut negotiation = start();
    let (step, _) = send(&mut negotiation, go(""));
    let Step::Transmission(session) = step else {
        panic!("no transmission")
    };
    assert_eq!(session.export().name, "disk");
}

#[test]
fn unknown_export_is_an_error_and_negotiation_continues() {
    let mut negotiation = start();
    let (step, replies) = send(&mut negotiation, go("nope"));
    assert!(matches!(step, Step::Continue));
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].1, NBD_REP_ERR_UNKNOWN);
    let (step, _) = send(&mut negotiation, go("disk"));
    assert!(matches!(step, Step::Transmission(_)));
}

#[test]
fn list_names_every_export() {
    let mut negotiation = start();
    let (_, replies) = send(&mut negotiation, ClientOption::List);
    let servers: Vec<&Vec<u8>> = replies
        .iter()
        .filter(|r| r.1 == NBD_REP_SERVER)
        .map(|r| &r.2)
        .collect();
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0], &rep_server_payload("disk", "the disk"));
    assert_eq!(replies.last().unwrap().1, NBD_REP_ACK);
}

#[test]
fn starttls_and_unknown_options_are_refused_politely() {
    let mut negotiation = start();
    let (step, replies) = send(&mut negotiation, ClientOption::StartTls);
    assert!(matches!(step, Step::Continue));
    assert_eq!(replies[0].1, NBD_REP_ERR_UNSUP);
    let (step, replies) = send(&mut negotiation, ClientOption::Unknown(77));
    assert!(matches!(step, Step::Continue));
    assert_eq!(
        replies[0],
        (
            77,
            NBD_REP_ERR_UNSUP,
            b"option 77 is not supported".to_vec()
        )
    );
}

#[test]
fn malformed_option_data_gets_invalid() {
    let mut negotiation = start();
    let mut out = Vec::new();
    let step = negotiation.handle(NBD_OPT_GO, &[0, 0, 0, 9, b'x'], &mut out);
    assert!(matches!(step, Step::Continue));
    assert_eq!(replies(&out)[0].1, NBD_REP_ERR_INVALID);
}

#[test]
fn abort_acks_and_closes() {
    let mut negotiation = start();
    let (step, replies) = send(&mut negotiation, ClientOption::Abort);
    assert!(matches!(step, Step::Close));
    assert_eq!(replies[0].1, NBD_REP_ACK);
}

#[test]
fn meta_contexts_need_structured_replies_first() {
    let mut negotiation = start();
    let set = ClientOption::SetMetaContext {
        name: "disk".into(),
        queries: vec![BASE_ALLOCATION.into()],
    };
    let (_, replies) = send(&mut negotiation, set.clone());
    assert_eq!(replies[0].1, NBD_REP_ERR_INVALID);

    send(&mut negotiation, ClientOption::StructuredReply);
    let (_, replies) = send(&mut negotiation, set);
    assert_eq!(replies[0].1, NBD_REP_META_CONTEXT);
    assert_eq!(
        replies[0].2,
        rep_meta_context_payload(BASE_ALLOCATION_ID, BASE_ALLOCATION)
    );
    assert_eq!(replies[1].1, NBD_REP_ACK);

    let (step, _) = send(&mut negotiation, go("disk"));
    let Step::Transmission(session) = step else {
        panic!("no transmission")
    };
    assert!(block_status_allowed(&session));
    assert_ne!(session.flags() & NBD_FLAG_SEND_DF, 0);
}

#[test]
fn a_context_chosen_for_another_export_does_not_carry_over() {
    let mut negotiation = start();
    send(&mut negotiation, ClientOption::StructuredReply);
    let set = ClientOption::SetMetaContext {
        name: "other".into(),
        queries: vec![BASE_ALLOCATION.into()],
    };
    send(&mut negotiation, set);
    let (step, _) = send(&mut negotiation, go("disk"));
    let Step::Transmission(session) = step else {
        panic!("no transmission")
    };
    assert!(!block_status_allowed(&session));
}

#[test]
fn list_meta_context_lists_without_selecting() {
    let mut negotiation = start();
    send(&mut negotiation, ClientOption::StructuredReply);
    let list = ClientOption::ListMetaContext {
        name: "disk".into(),
        queries: vec![],
    };
    let (_, replies) = send(&mut negotiation, list);
    assert_eq!(replies[0].1, NBD_REP_META_CONTEXT);
    assert_eq!(replies[0].2, rep_meta_context_payload(0, BASE_ALLOCATION));
    let unknown_namespace = ClientOption::ListMetaContext {
        name: "disk".into(),
        queries: vec!["qemu:dirty-bitmap:x".into()],
    };
    let (_, replies) = send(&mut negotiation, unknown_namespace);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].1, NBD_REP_ACK);
    let (step, _) = send(&mut negotiation, go("disk"));
    let Step::Transmission(session) = step else {
        panic!("no transmission")
    };
    assert!(!block_status_allowed(&session));
}

#[test]
fn export_name_replies_with_size_and_flags() {
    let mut negotiation = start();
    let mut out = Vec::new();
    let step = negotiation.handle(NBD_OPT_EXPORT_NAME, b"other", &mut out);
    let Step::Transmission(session) = step else {
        panic!("no transmission")
    };
    // NO_ZEROES was negotiated: size and flags only.
    assert_eq!(out.len(), 10);
    assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 2 << 20);
    let flags = u16::from_be_bytes(out[8..10].try_into().unwrap());
    assert_eq!(flags, session.flags());
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(flags & NBD_FLAG_SEND_TRIM, 0);

    let mut out = Vec::new();
    let step = start().handle(NBD_OPT_EXPORT_NAME, b"missing", &mut out);
    assert!(matches!(step, Step::Close));
    assert!(out.is_empty());
}

#[test]
fn flags_follow_device_capabilities() {
    let info = Device::from_device(MemoryDevice::new(4096))
        .info()
        .to_owned();
    let flags = transmission_flags(&info, true);
    for flag in [
        NBD_FLAG_HAS_FLAGS,
        NBD_FLAG_SEND_FLUSH,
        NBD_FLAG_SEND_FUA,
        NBD_FLAG_SEND_TRIM,
        NBD_FLAG_SEND_WRITE_ZEROES,
        NBD_FLAG_SEND_FAST_ZERO,
        NBD_FLAG_SEND_DF,
        NBD_FLAG_CAN_MULTI_CONN,
        NBD_FLAG_SEND_CACHE,
    ] {
        assert_ne!(flags & flag, 0, "flag {flag:#x} missing");
    }
    let read_only = Device::from_device(MemoryDevice::new(4096))
        .read_only()
        .info()
        .to_owned();
    let flags = transmission_flags(&read_only, false);
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(
        flags
            & (NBD_FLAG_SEND_TRIM
                | NBD_FLAG_SEND_WRITE_ZEROES
                | NBD_FLAG_SEND_FAST_ZERO
                | NBD_FLAG_SEND_DF),
        0
    );
}

#[test]
fn extended_headers_are_acknowledged_and_frame_the_session() {
    let mut negotiation = start();
    let (step, replies) = send(&mut negotiation, ClientOption::ExtendedHeaders);
    assert!(matches!(step, Step::Continue));
    assert_eq!(
        replies,
        vec![(NBD_OPT_EXTENDED_HEADERS, NBD_REP_ACK, vec![])]
    );
    // Metadata contexts need structured replies or extended headers: these do.
    let (_, replies) = send(
        &mut negotiation,
        ClientOption::SetMetaContext {
            name: "disk".into(),
            queries: vec![BASE_ALLOCATION.into()],
        },
    );
    assert_eq!(replies[0].1, NBD_REP_META_CONTEXT);
    // A later structured-reply request cannot downgrade them.
    let (step, replies) = send(&mut negotiation, ClientOption::StructuredReply);
    assert!(matches!(step, Step::Continue));
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].1, NBD_REP_ERR_EXT_HEADER_REQD);
    let (step, replies) = send(&mut negotiation, go("disk"));
    let info = replies
        .iter()
        .find_map(|(_, reply, payload)| match InfoReply::decode(payload) {
            Ok(InfoReply::Export { flags, .. }) if *reply == NBD_REP_INFO => Some(flags),
            _ => None,
        })
        .expect("NBD_INFO_EXPORT");
    assert_ne!(info & NBD_FLAG_SEND_DF, 0, "DF goes with chunked replies");
    assert_eq!(
        info & NBD_FLAG_BLOCK_STATUS_PAYLOAD,
        0,
        "payload form not served"
    );
    let Step::Transmission(session) = step else {
        panic!("GO did not enter transmission");
    };
    assert_eq!(session.framing(), Framing::Extended);
    assert!(session.structured() && session.sizes_negotiated());
    assert!(block_status_allowed(&session));
}

#[test]
fn export_name_after_extended_headers_closes_and_data_is_invalid() {
    let mut negotiation = start();
    let (_, acked) = send(&mut negotiation, ClientOption::ExtendedHeaders);
    assert_eq!(acked[0].1, NBD_REP_ACK);
    let (step, answered) = send(&mut negotiation, ClientOption::ExportName("disk".into()));
    assert!(matches!(step, Step::Close));
    assert!(answered.is_empty());

    // The option takes no data (NBD_REP_ERR_INVALID, and nothing is negotiated).
    let mut negotiation = start();
    let mut out = Vec::new();
    let step = negotiation.handle(NBD_OPT_EXTENDED_HEADERS, &[0], &mut out);
    assert!(matches!(step, Step::Continue));
    assert_eq!(replies(&out)[0].1, NBD_REP_ERR_INVALID);
    let (step, _) = send(&mut negotiation, go("disk"));
    let Step::Transmission(session) = step else {
        panic!("GO did not enter transmission");
    };
    assert_eq!(session.framing(), Framing::Simple);
}

#[test]
fn only_a_go_that_asks_for_block_sizes_negotiates_them() {
    let mut negotiation = start();
    let (step, _) = send(
        &mut negotiation,
        ClientOption::Go {
            name: "disk".into(),
            requests: vec![NBD_INFO_NAME],
        },
    );
    let Step::Transmission(session) = step else {
        panic!("GO did not enter transmission");
    };
    assert!(!session.sizes_negotiated());

    let (step, _) = send(&mut start(), go("disk"));
    let Step::Transmission(session) = step else {
        panic!("GO did not enter transmission");
    };
    assert!(session.sizes_negotiated());

    // Its answer is size and flags, not an option reply.
    let mut out = Vec::new();
    let step = start().handle(NBD_OPT_EXPORT_NAME, b"disk", &mut out);
    assert_eq!(out.len(), 10);
    let Step::Transmission(session) = step else {
        panic!("EXPORT_NAME did not enter transmission");
    };
    assert!(!session.sizes_negotiated());
    assert_eq!(session.framing(), Framing::Simple);
}

#[test]
fn required_tls_refuses_every_option_but_starttls_and_abort() {
    let mut negotiation = start();
    negotiation.offer_tls(true);
    for option in [
        ClientOption::List,
        ClientOption::StructuredReply,
        ClientOption::Info {
            name: "disk".into(),
            requests: vec![],
        },
        go("disk"),
        ClientOption::ListMetaContext {
            name: "disk".into(),
            queries: vec![],
        },
        ClientOption::Unknown(77),
    ] {
        let name = format!("{option:?}");
        let (step, replies) = send(&mut negotiation, option);
        assert!(matches!(step, Step::Continue), "{name}");
        assert_eq!(replies.len(), 1, "{name}");
        assert_eq!(replies[0].1, NBD_REP_ERR_TLS_REQD, "{name}");
    }
    // NBD_OPT_EXPORT_NAME cannot be refused with a reply: the connection closes
    // without a byte of export data.
    let mut closing = start();
    closing.offer_tls(true);
    let (step, replies) = send(&mut closing, ClientOption::ExportName("disk".into()));
    assert!(matches!(step, Step::Close));
    assert!(replies.is_empty());
    let (step, replies) = send(&mut closing, ClientOption::Abort);
    assert!(matches!(step, Step::Close));
    assert_eq!(replies[0].1, NBD_REP_ACK);

    let (step, replies) = send(&mut negotiation, ClientOption::StartTls);
    assert!(matches!(step, Step::StartTls));
    assert_eq!(replies, [(NBD_OPT_STARTTLS, NBD_REP_ACK, vec![])]);
    negotiation.tls_started();
    assert!(negotiation.tls_active());
    // Inside TLS everything works, and a second STARTTLS is invalid.
    let (_, replies) = send(&mut negotiation, ClientOption::StartTls);
    assert_eq!(replies[0].1, NBD_REP_ERR_INVALID);
    let (_, replies) = send(&mut negotiation, ClientOption::List);
    assert_eq!(replies.last().unwrap().1, NBD_REP_ACK);
    let (step, _) = send(&mut negotiation, go("disk"));
    assert!(matches!(step, Step::Transmission(_)));
}

#[test]
fn offered_tls_lets_plain_clients_in_and_starttls_forgets_plain_text_haggling() {
    let mut negotiation = start();
    negotiation.offer_tls(false);
    let (_, replies) = send(&mut negotiation, ClientOption::StructuredReply);
    assert_eq!(replies[0].1, NBD_REP_ACK);
    let (_, replies) = send(&mut negotiation, ClientOption::List);
    assert_eq!(replies.last().unwrap().1, NBD_REP_ACK);
    let (step, _) = send(&mut negotiation, ClientOption::StartTls);
    assert!(matches!(step, Step::StartTls));
    negotiation.tls_started();
    // Structured replies were agreed in plain text, where anyone could have
    // added them; inside TLS they must be asked for again.
    let (step, _) = send(&mut negotiation, go("disk"));
    match step {
        Step::Transmission(session) => assert!(!session.structured()),
        other => panic!("expected transmission, got {other:?}"),
    }
}
