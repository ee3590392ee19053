//! The initiator's handshake against scripted server bytes and against our own
//! target's negotiation.

use std::io::{self, Cursor, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use blockwire_blockdev::{Device, MemoryDevice};

use super::*;
use crate::target::{Export, ExportSet};

/// A stream that plays back what a server would send and records what the client
/// sent.
struct Script {
    input: Cursor<Vec<u8>>,
    sent: Vec<u8>,
}

impl Script {
    fn new(server: Vec<u8>) -> Script {
        Script {
            input: Cursor::new(server),
            sent: Vec::new(),
        }
    }

    fn all_read(&self) -> bool {
        self.input.position() as usize == self.input.get_ref().len()
    }
}

impl Read for Script {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Script {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sent.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Everything but extended headers, which the scripted tests below predate (they
/// have tests of their own).
const WANT_ALL: Wanted = Wanted {
    structured: true,
    extended: false,
    base_allocation: true,
};

fn greeting(flags: u16) -> Vec<u8> {
    let mut out = Vec::new();
    encode_greeting(&mut out, flags);
    out
}

fn reply(option: u32, reply: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_option_reply(&mut out, option, reply, payload);
    out
}

fn options(list: &[ClientOption]) -> Vec<u8> {
    let mut out = Vec::new();
    for option in list {
        option.encode(&mut out);
    }
    out
}

fn go(name: &str) -> ClientOption {
    ClientOption::Go {
        name: name.into(),
        requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME, NBD_INFO_DESCRIPTION],
    }
}

fn set_meta(name: &str) -> ClientOption {
    ClientOption::SetMetaContext {
        name: name.into(),
        queries: vec![BASE_ALLOCATION.into()],
    }
}

const FLAGS: u16 = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_CAN_MULTI_CONN;

#[test]
fn go_with_structured_replies_and_base_allocation() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]),
        reply(
            NBD_OPT_SET_META_CONTEXT,
            NBD_REP_META_CONTEXT,
            &rep_meta_context_payload(7, BASE_ALLOCATION),
        ),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_export_payload(1 << 20, FLAGS),
        ),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_block_size_payload(512, 4096, 1 << 20),
        ),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_string_payload(NBD_INFO_NAME, "canonical"),
        ),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_string_payload(NBD_INFO_DESCRIPTION, "scratch disk"),
        ),
        // An information type we do not know is ignored.
        reply(NBD_OPT_GO, NBD_REP_INFO, &[0x00, 0x63, 1, 2, 3]),
        reply(NBD_OPT_GO, NBD_REP_ACK, &[]),
    ]
    .concat();
    let mut script = Script::new(server);
    let details = negotiate(&mut script, "test", "disk", WANT_ALL).unwrap();
    assert!(script.all_read());
    let expected_sent = [
        (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec(),
        options(&[ClientOption::StructuredReply, set_meta("disk"), go("disk")]),
    ]
    .concat();
    assert_eq!(script.sent, expected_sent);
    assert_eq!(details.name, "canonical");
    assert_eq!(details.description.as_deref(), Some("scratch disk"));
    assert_eq!(details.size, 1 << 20);
    assert_eq!(details.flags, FLAGS);
    assert!(details.structured && details.used_go);
    assert_eq!(details.base_allocation_id, Some(7));
    assert_eq!(details.contexts, vec![BASE_ALLOCATION.to_string()]);
    assert_eq!(details.block_sizes().minimum, 512);
    assert_eq!(details.block_sizes().maximum, 1 << 20);
}

#[test]
fn go_unsupported_falls_back_to_export_name() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ERR_UNSUP, b"no"),
        reply(NBD_OPT_GO, NBD_REP_ERR_UNSUP, &[]),
        {
            let mut out = Vec::new();
            encode_export_name_reply(&mut out, 4096, FLAGS, true);
            out
        },
    ]
    .concat();
    let mut script = Script::new(server);
    let details = negotiate(&mut script, "test", "old", WANT_ALL).unwrap();
    assert!(script.all_read());
    // No meta context is asked for without structured replies.
    let expected_sent = [
        (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec(),
        options(&[
            ClientOption::StructuredReply,
            go("old"),
            ClientOption::ExportName("old".into()),
        ]),
    ]
    .concat();
    assert_eq!(script.sent, expected_sent);
    assert!(!details.structured && !details.used_go && !details.base_allocation());
    assert_eq!((details.size, details.flags), (4096, FLAGS));
    assert_eq!(details.advertised_block_sizes, None);
}

#[test]
fn plain_newstyle_server_gets_export_name_and_sends_zeroes() {
    let server = [greeting(0), {
        let mut out = Vec::new();
        encode_export_name_reply(&mut out, 8192, FLAGS, false);
        out
    }]
    .concat();
    let mut script = Script::new(server);
    let details = negotiate(&mut script, "test", "", WANT_ALL).unwrap();
    assert!(script.all_read());
    assert_eq!(
        script.sent,
        [
            vec![0, 0, 0, 0],
            options(&[ClientOption::ExportName(String::new())])
        ]
        .concat()
    );
    assert_eq!(details.size, 8192);
}

#[test]
fn flags_without_has_flags_mean_nothing() {
    let server = [greeting(0), {
        let mut out = Vec::new();
        encode_export_name_reply(&mut out, 8192, NBD_FLAG_READ_ONLY, false);
        out
    }]
    .concat();
    let details = negotiate(&mut Script::new(server), "test", "", WANT_ALL).unwrap();
    assert_eq!(details.flags, 0);
}

#[test]
fn oldstyle_and_foreign_servers_are_refused_clearly() {
    let mut oldstyle = Vec::new();
    oldstyle.extend_from_slice(&NBDMAGIC.to_be_bytes());
    oldstyle.extend_from_slice(&CLISERV_MAGIC.to_be_bytes());
    oldstyle.extend_from_slice(&[0u8; 8 + 4 + 124]);
    let err = negotiate(&mut Script::new(oldstyle), "h:1", "", WANT_ALL).unwrap_err();
    assert!(matches!(err, ClientError::Oldstyle { .. }), "{err}");
    assert!(err.to_string().contains("oldstyle"), "{err}");

    let ssh = b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n".to_vec();
    let err = negotiate(&mut Script::new(ssh), "h:22", "", WANT_ALL).unwrap_err();
    assert!(matches!(err, ClientError::NotNbd { .. }), "{err}");

    let err = negotiate(&mut Script::new(Vec::new()), "h:1", "", WANT_ALL).unwrap_err();
    assert!(matches!(err, ClientError::Closed { .. }), "{err}");
}

#[test]
fn unknown_export_is_refused_with_the_servers_message() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ERR_UNKNOWN, b"nope"),
        reply(
            NBD_OPT_GO,
            NBD_REP_ERR_UNKNOWN,
            b"export 'x' does not exist",
        ),
        reply(NBD_OPT_ABORT, NBD_REP_ACK, &[]),
    ]
    .concat();
    let mut script = Script::new(server);
    let err = negotiate(&mut script, "h:1", "x", WANT_ALL).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("refused export 'x'")
            && text.contains("NBD_REP_ERR_UNKNOWN")
            && text.contains("does not exist"),
        "{text}"
    );
    // The negotiation ends with a soft disconnect.
    assert!(script.sent.ends_with(&options(&[ClientOption::Abort])));
}

#[test]
fn export_name_refusal_is_a_hangup() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(NBD_OPT_GO, NBD_REP_ERR_UNSUP, &[]),
    ]
    .concat();
    let err = negotiate(&mut Script::new(server), "h:1", "gone", WANT_ALL).unwrap_err();
    assert!(matches!(err, ClientError::Closed { .. }), "{err}");
    assert!(err.to_string().contains("export 'gone'"), "{err}");
}

#[test]
fn broken_replies_are_protocol_errors() {
    // A reply to an option we did not send.
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE),
        reply(NBD_OPT_GO, NBD_REP_ACK, &[]),
    ]
    .concat();
    let err = negotiate(&mut Script::new(server), "h:1", "", WANT_ALL).unwrap_err();
    assert!(matches!(err, ClientError::Protocol { .. }), "{err}");

    // GO succeeding without NBD_INFO_EXPORT.
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(NBD_OPT_GO, NBD_REP_ACK, &[]),
    ]
    .concat();
    let err = negotiate(&mut Script::new(server), "h:1", "", WANT_ALL).unwrap_err();
    assert!(err.to_string().contains("NBD_INFO_EXPORT"), "{err}");

    // A minimum block size that is not a power of two.
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_block_size_payload(3, 4096, 1 << 20),
        ),
    ]
    .concat();
    let err = negotiate(&mut Script::new(server), "h:1", "", WANT_ALL).unwrap_err();
    assert!(err.to_string().contains("minimum block size 3"), "{err}");

    // A bad option reply magic.
    let mut bad = reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]);
    bad[0] ^= 0xff;
    let server = [greeting(NBD_FLAG_FIXED_NEWSTYLE), bad].concat();
    let err = negotiate(&mut Script::new(server), "h:1", "", WANT_ALL).unwrap_err();
    assert!(matches!(err, ClientError::Protocol { .. }), "{err}");
}

#[test]
fn list_collects_exports_then_aborts() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(
            NBD_OPT_LIST,
            NBD_REP_SERVER,
            &rep_server_payload("a", "first"),
        ),
        reply(NBD_OPT_LIST, NBD_REP_SERVER, &rep_server_payload("b", "")),
        reply(NBD_OPT_LIST, NBD_REP_ACK, &[]),
        reply(NBD_OPT_ABORT, NBD_REP_ACK, &[]),
    ]
    .concat();
    let mut script = Script::new(server);
    let exports = list(&mut script, "h:1", None).unwrap();
    assert!(script.all_read());
    assert_eq!(
        exports,
        vec![
            ("a".to_string(), "first".to_string()),
            ("b".to_string(), String::new())
        ]
    );
    assert_eq!(
        script.sent,
        [
            (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
                .to_be_bytes()
                .to_vec(),
            options(&[ClientOption::List, ClientOption::Abort])
        ]
        .concat()
    );
    // A server that hangs up instead of acknowledging the abort is fine too.
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE),
        reply(NBD_OPT_LIST, NBD_REP_ACK, &[]),
    ]
    .concat();
    assert_eq!(list(&mut Script::new(server), "h:1", None).unwrap(), vec![]);
}

fn our_server() -> Arc<ExportSet> {
    let mut exports = ExportSet::new();
    let device = Device::from_device(MemoryDevice::new(8 << 20));
    exports
        .add(Export::new("disk", "a memory disk", device.clone()))
        .unwrap();
    exports
        .add(Export::new("ro", "", device.read_only()))
        .unwrap();
    Arc::new(exports)
}

/// Runs our target's negotiation on one end of a socket pair and `client` on the
/// other.
fn against_our_server<T>(client: impl FnOnce(&mut UnixStream) -> T) -> T {
    let (mut ours, mut theirs) = UnixStream::pair().unwrap();
    let exports = our_server();
    let server = std::thread::spawn(move || {
        let _ = crate::target::negotiate(&mut theirs, exports, "test");
    });
    let result = client(&mut ours);
    drop(ours);
    server.join().unwrap();
    result
}

#[test]
fn negotiates_with_our_target() {
    let details = against_our_server(|s| negotiate(s, "pair", "disk", WANT_ALL)).unwrap();
    assert_eq!(details.name, "disk");
    assert_eq!(details.description.as_deref(), Some("a memory disk"));
    assert_eq!(details.size, 8 << 20);
    assert!(details.structured && details.base_allocation() && details.used_go);
    assert!(details.has(NBD_FLAG_CAN_MULTI_CONN) && details.has(NBD_FLAG_SEND_DF));
    assert!(!details.read_only());
    let sizes = details.block_sizes();
    assert_eq!(
        (sizes.minimum, sizes.preferred, sizes.maximum),
        (1, 4096, 32 << 20)
    );

    let plain = Wanted {
        structured: false,
        extended: false,
        base_allocation: true,
    };
    let details = against_our_server(|s| negotiate(s, "pair", "ro", plain)).unwrap();
    assert!(details.read_only() && !details.structured && !details.base_allocation());
    assert!(!details.has(NBD_FLAG_SEND_DF));

    let err = against_our_server(|s| negotiate(s, "pair", "nope", WANT_ALL)).unwrap_err();
    assert!(err.to_string().contains("NBD_REP_ERR_UNKNOWN"), "{err}");

    let exports = against_our_server(|s| list(s, "pair", None)).unwrap();
    let names: Vec<_> = exports.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["disk", "ro"]);
    assert_eq!(exports[0].1, "a memory disk");
}

const WANT_EXTENDED: Wanted = Wanted {
    structured: true,
    extended: true,
    base_allocation: true,
};

#[test]
fn extended_headers_come_first_and_replace_structured_replies() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(NBD_OPT_EXTENDED_HEADERS, NBD_REP_ACK, &[]),
        reply(
            NBD_OPT_SET_META_CONTEXT,
            NBD_REP_META_CONTEXT,
            &rep_meta_context_payload(3, BASE_ALLOCATION),
        ),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_export_payload(1 << 20, FLAGS),
        ),
        reply(NBD_OPT_GO, NBD_REP_ACK, &[]),
    ]
    .concat();
    let mut script = Script::new(server);
    let details = negotiate(&mut script, "test", "disk", WANT_EXTENDED).unwrap();
    assert!(script.all_read());
    let expected_sent = [
        (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec(),
        options(&[ClientOption::ExtendedHeaders, set_meta("disk"), go("disk")]),
    ]
    .concat();
    assert_eq!(script.sent, expected_sent);
    assert!(details.extended_headers && details.structured && details.base_allocation());
    assert_eq!(details.framing(), Framing::Extended);
}

#[test]
fn refused_extended_headers_fall_back_to_structured_replies() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(
            NBD_OPT_EXTENDED_HEADERS,
            NBD_REP_ERR_UNSUP,
            b"unknown option",
        ),
        reply(NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &[]),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(
            NBD_OPT_GO,
            NBD_REP_INFO,
            &info_export_payload(1 << 20, FLAGS),
        ),
        reply(NBD_OPT_GO, NBD_REP_ACK, &[]),
    ]
    .concat();
    let mut script = Script::new(server);
    let details = negotiate(&mut script, "test", "disk", WANT_EXTENDED).unwrap();
    assert!(script.all_read());
    let expected_sent = [
        (NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec(),
        options(&[
            ClientOption::ExtendedHeaders,
            ClientOption::StructuredReply,
            set_meta("disk"),
            go("disk"),
        ]),
    ]
    .concat();
    assert_eq!(script.sent, expected_sent);
    assert!(!details.extended_headers && details.structured);
    assert_eq!(details.framing(), Framing::Structured);
}

#[test]
fn go_unsupported_after_extended_headers_is_a_violation() {
    let server = [
        greeting(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
        reply(NBD_OPT_EXTENDED_HEADERS, NBD_REP_ACK, &[]),
        reply(NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &[]),
        reply(NBD_OPT_GO, NBD_REP_ERR_UNSUP, &[]),
    ]
    .concat();
    let mut script = Script::new(server);
    let err = negotiate(&mut script, "test", "disk", WANT_EXTENDED).unwrap_err();
    assert!(err.to_string().contains("extended headers"), "{err}");
    // No NBD_OPT_EXPORT_NAME was tried.
    let mut export_name = Vec::new();
    ClientOption::ExportName("disk".into()).encode(&mut export_name);
    assert!(!script
        .sent
        .windows(export_name.len())
        .any(|w| w == export_name.as_slice()));
}

#[test]
fn negotiates_extended_headers_with_our_target() {
    let details = against_our_server(|s| negotiate(s, "pair", "disk", WANT_EXTENDED)).unwrap();
    assert!(details.extended_headers && details.base_allocation() && details.used_go);
    assert!(details.has(NBD_FLAG_SEND_DF));
}
