//! Target and initiator sessions against each other over socket pairs: the
//! handshake with pre-shared keys, data both ways from several threads at once,
//! sends that a full socket takes piecemeal, and refusals.

use std::io::{IoSlice, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;

use super::target::TargetTlsSettings;
use super::*;

fn write_keys(dir: &Path, name: &str, line: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, line).unwrap();
    path
}

const KEY: &str = "alice:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
const OTHER_KEY: &str = "alice:ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n";

fn target(keys: &Path) -> TargetTls {
    TargetTls::load(&TargetTlsSettings {
        mode: TlsMode::Require,
        psk_file: Some(keys.to_path_buf()),
        ..TargetTlsSettings::default()
    })
    .unwrap()
    .unwrap()
}

fn initiator(keys: &Path) -> InitiatorTls {
    let settings = InitiatorTlsSettings {
        psk_file: Some(keys.to_path_buf()),
        username: Some("alice".into()),
        ..InitiatorTlsSettings::default()
    };
    InitiatorTls::load(&settings, Some("127.0.0.1")).unwrap()
}

/// One end of a socket pair and how its handshake went.
type End = (UnixStream, Result<TlsSession, TlsError>);

/// Runs both handshakes over a socket pair; returns (target side, initiator side).
fn pair(target_keys: &Path, initiator_keys: &Path) -> (End, End) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let target = target(target_keys);
    let server = thread::spawn(move || {
        let session = target.accept(&mut a);
        (a, session)
    });
    let session = initiator(initiator_keys).connect(&mut b);
    if session.is_err() {
        // The target may wait for a message the refused initiator never sends.
        let _ = b.shutdown(std::net::Shutdown::Both);
    }
    (server.join().unwrap(), (b, session))
}

#[test]
fn data_crosses_both_ways_while_several_threads_write() {
    let dir = tempfile::tempdir().unwrap();
    let keys = write_keys(dir.path(), "keys.psk", KEY);
    let ((server_socket, server), (client_socket, client)) = pair(&keys, &keys);
    let (server, client) = (Arc::new(server.unwrap()), Arc::new(client.unwrap()));
    assert!(server.description().starts_with("TLSv1.3"), "{server:?}");
    assert!(!client.peer_certified());

    // The target echoes every message it reads; four writer threads answer
    // through one writer (as its worker pool does), each message whole.
    let writer = Arc::new(Mutex::new(TlsStream::new(
        server_socket.try_clone().unwrap(),
        server.clone(),
    )));
    let echo = thread::spawn(move || {
        let mut reader = TlsStream::new(server_socket, server);
        let mut helpers = Vec::new();
        loop {
            let mut len = [0u8; 4];
            if reader.read_exact(&mut len).is_err() {
                break;
            }
            let mut message = vec![0u8; u32::from_be_bytes(len) as usize];
            reader.read_exact(&mut message).unwrap();
            let writer = writer.clone();
            helpers.push(thread::spawn(move || {
                let len = (message.len() as u32).to_be_bytes();
                let slices = [IoSlice::new(&len), IoSlice::new(&message)];
                // Our write_vectored is all or nothing: one message, one call.
                let written = writer.lock().unwrap().write_vectored(&slices).unwrap();
                assert_eq!(written, 4 + message.len());
            }));
            if helpers.len() >= 4 {
                helpers.remove(0).join().unwrap();
            }
        }
        for helper in helpers {
            helper.join().unwrap();
        }
    });

    // The initiator sends messages of many sizes from one thread while another
    // reads the echoes back.
    let sizes: Vec<usize> = (0..200).map(|i| (i * 7919) % (300 * 1024) + 1).collect();
    let mut reader = TlsStream::new(client_socket.try_clone().unwrap(), client.clone());
    let expected: u64 = sizes.iter().map(|&n| n as u64).sum();
    let collector = thread::spawn(move || {
        let mut total = 0u64;
        let mut seen = Vec::new();
        while total < expected {
            let mut len = [0u8; 4];
            reader.read_exact(&mut len).unwrap();
            let mut message = vec![0u8; u32::from_be_bytes(len) as usize];
            reader.read_exact(&mut message).unwrap();
            // Every message is one byte value throughout: a torn record shows.
            assert!(message.iter().all(|&b| b == message[0]));
            total += message.len() as u64;
            seen.push(message.len());
        }
        seen
    });
    let mut writer = TlsStream::new(client_socket, client);
    for (i, &size) in sizes.iter().enumerate() {
        let message = vec![i as u8; size];
        writer.write_all(&(size as u32).to_be_bytes()).unwrap();
        writer.write_all(&message).unwrap();
    }
    let mut seen = collector.join().unwrap();
    writer.close();
    writer.socket().shutdown(std::net::Shutdown::Write).unwrap();
    echo.join().unwrap();
    seen.sort_unstable();
    let mut sent = sizes.clone();
    sent.sort_unstable();
    assert_eq!(seen, sent);
}

#[test]
fn a_socket_that_takes_little_at_a_time_gets_every_sealed_byte_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let keys = write_keys(dir.path(), "keys.psk", KEY);
    let ((server_socket, server), (client_socket, client)) = pair(&keys, &keys);
    let (server, client) = (Arc::new(server.unwrap()), Arc::new(client.unwrap()));
    let data: Vec<u8> = (0..600 * 1024).map(|i| (i % 251) as u8).collect();
    let reading = thread::spawn(move || {
        let mut reader = TlsStream::new(server_socket, server);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        got
    });
    let mut writer = TlsStream::new(client_socket, client);
    // Takes at most 1000 bytes per call and refuses every third call outright.
    let calls = std::cell::Cell::new(0);
    let trickle = |socket: &UnixStream, bytes: &[u8]| {
        calls.set(calls.get() + 1);
        if calls.get() % 3 == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        (&*socket).write(&bytes[..bytes.len().min(1000)])
    };
    let mut rest: &[u8] = &data;
    while !rest.is_empty() || writer.has_unsent() {
        let piece = &rest[..rest.len().min(70_000)];
        match writer.send_now(&[IoSlice::new(piece)], trickle) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    writer.close();
    writer.socket().shutdown(std::net::Shutdown::Both).unwrap();
    assert!(reading.join().unwrap() == data);
}

#[test]
fn a_wrong_key_fails_both_ends_and_the_target_names_the_identity() {
    let dir = tempfile::tempdir().unwrap();
    let keys = write_keys(dir.path(), "keys.psk", KEY);
    let wrong = write_keys(dir.path(), "wrong.psk", OTHER_KEY);
    let ((_, server), (_, client)) = pair(&keys, &wrong);
    let server = server.unwrap_err().to_string();
    assert!(server.contains("PSK identity 'alice'"), "{server}");
    assert!(!server.contains('\n'), "{server}");
    assert!(client
        .unwrap_err()
        .to_string()
        .contains("TLS handshake failed"));

    let stranger = write_keys(dir.path(), "bob.psk", &KEY.replace("alice", "bob"));
    let settings = InitiatorTlsSettings {
        psk_file: Some(stranger),
        username: Some("bob".into()),
        ..InitiatorTlsSettings::default()
    };
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let target = target(&keys);
    let server = thread::spawn(move || target.accept(&mut a));
    let client = InitiatorTls::load(&settings, None).unwrap().connect(&mut b);
    assert!(client.is_err());
    let _ = b.shutdown(std::net::Shutdown::Both);
    let server = server.join().unwrap().unwrap_err().to_string();
    assert!(server.contains("'bob' is not in"), "{server}");
}

#[test]
fn credentials_are_checked_when_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let no_credentials = TargetTls::load(&TargetTlsSettings {
        mode: TlsMode::On,
        ..TargetTlsSettings::default()
    });
    assert!(matches!(no_credentials, Err(TlsError::Config(_))));
    let off = TargetTls::load(&TargetTlsSettings::default()).unwrap();
    assert!(off.is_none());
    let missing = TargetTls::load(&TargetTlsSettings {
        mode: TlsMode::On,
        certificates: Some(dir.path().to_path_buf()),
        ..TargetTlsSettings::default()
    })
    .unwrap_err()
    .to_string();
    assert!(missing.contains("server-cert.pem"), "{missing}");
    let keys = write_keys(dir.path(), "keys.psk", KEY);
    let settings = InitiatorTlsSettings {
        psk_file: Some(keys),
        username: Some("carol".into()),
        ..InitiatorTlsSettings::default()
    };
    let err = InitiatorTls::load(&settings, None).unwrap_err().to_string();
    assert!(err.contains("keys.psk") && err.contains("'carol'"), "{err}");
}
