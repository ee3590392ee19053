//! `serve --config` on SIGHUP over iSCSI (issue 24): a target added to the file is
//! listed and answers libiscsi's tools, a removed one is no longer listed and
//! refuses logins, a session on it is asked to log out (AsyncEvent 1, Parameter3
//! the grace period) and closed when it does not, and a session on an unchanged
//! target keeps answering.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use blockwire_iscsi::initiator::login::{InitiatorLogin, LoginOptions, LoginStep};
use blockwire_iscsi::pdu::{padded, Bhs, Pdu, ScsiCommand, BHS_LEN};
use blockwire_tests::iscsi::{tool, tool_ok};
use blockwire_tests::{require, text, Served};

const PREFIX: &str = "iqn.2026-11.dev.blockwire";

/// A logged-in session driven by hand: PDUs out, whole PDUs in.
struct Session {
    stream: TcpStream,
    cmd_sn: u32,
    exp_stat_sn: u32,
}

fn send(stream: &mut TcpStream, pdu: Pdu, data: &[u8]) {
    let header = pdu.encode(data.len() as u32);
    let mut out = header.bhs.0.to_vec();
    out.extend_from_slice(data);
    out.resize(BHS_LEN + padded(data.len()), 0);
    stream.write_all(&out).unwrap();
}

/// The next PDU and its data; None when the target closed the connection.
fn receive(stream: &mut TcpStream) -> Option<(Pdu, Vec<u8>)> {
    let mut bhs = Bhs::default();
    stream.read_exact(&mut bhs.0).ok()?;
    let mut data = vec![0u8; padded(bhs.data_len() as usize)];
    stream.read_exact(&mut data).ok()?;
    data.truncate(bhs.data_len() as usize);
    Some((Pdu::decode(&bhs, &[]).expect("target PDUs decode"), data))
}

impl Session {
    fn login(portal: &str, iqn: &str) -> Session {
        let mut stream = TcpStream::connect(portal).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut login = InitiatorLogin::new(LoginOptions {
            initiator_name: format!("{PREFIX}:reload-test"),
            target_name: Some(iqn.to_string()),
            isid: 0x8000_0000_0042,
            tsih: 0,
            cid: 1,
            cmd_sn: 1,
            chap: None,
            digests: false,
        });
        let mut step = login.start();
        loop {
            match step {
                LoginStep::Done(params) => {
                    return Session {
                        stream,
                        cmd_sn: 1,
                        exp_stat_sn: params.exp_stat_sn,
                    }
                }
                LoginStep::Send { request, data } => {
                    send(&mut stream, Pdu::LoginRequest(request), &data);
                    let (response, data) = receive(&mut stream).expect("a login response");
                    let Pdu::LoginResponse(response) = response else {
                        panic!("expected a login response, got {response:?}");
                    };
                    step = login.handle(&response, &data).expect("login");
                }
            }
        }
    }

    /// TEST UNIT READY; its SCSI status.
    fn test_unit_ready(&mut self, itt: u32) -> u8 {
        let command = ScsiCommand {
            final_bit: true,
            initiator_task_tag: itt,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: vec![0; 6],
            ..ScsiCommand::default()
        };
        self.cmd_sn += 1;
        send(&mut self.stream, Pdu::ScsiCommand(command), &[]);
        match receive(&mut self.stream).expect("a response").0 {
            Pdu::ScsiResponse(response) => {
                self.exp_stat_sn = response.stat_sn.wrapping_add(1);
                response.status
            }
            // No NOP-In ping comes within this test's time (30 s idle).
            other => panic!("expected a SCSI response, got {other:?}"),
        }
    }
}

fn config(exports: &[&str]) -> String {
    let mut text = "[iscsi]\nlisten = [\"127.0.0.1:0\"]\n".to_string();
    for name in exports {
        text.push_str(&format!(
            "\n[[export]]\nname = \"{name}\"\nmemory = \"16M\"\nnbd = false\niscsi = true\n"
        ));
    }
    text
}

fn wait_logged(log: &Path, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let logged = std::fs::read_to_string(log).unwrap_or_default();
        if logged.contains(text) {
            return logged;
        }
        assert!(
            Instant::now() < deadline,
            "no '{text}' in the log:\n{logged}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn targets_are_added_and_removed_on_sighup_while_sessions_stay() {
    require!("iscsi-ls", "iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    std::fs::write(&file, config(&["keep", "gone"])).unwrap();
    let log = dir.path().join("serve.log");
    let served = Served::start_config_logged(&file, "keep", &log);
    let portal = served.iscsi_portal().to_string();
    let url = |name: &str| format!("iscsi://{portal}/{PREFIX}:{name}/0");

    let mut on_keep = Session::login(&portal, &format!("{PREFIX}:keep"));
    let mut on_gone = Session::login(&portal, &format!("{PREFIX}:gone"));
    assert_eq!(on_keep.test_unit_ready(1), 0);
    assert_eq!(on_gone.test_unit_ready(1), 0);

    std::fs::write(&file, config(&["keep", "fresh"])).unwrap();
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(served.pid(), libc::SIGHUP) }, 0);
    let logged = wait_logged(&log, "reload: unchanged");
    assert!(
        logged.contains("reload: export 'gone' removed (iscsi)"),
        "{logged}"
    );
    assert!(
        logged.contains("reload: export 'fresh' added (iscsi)"),
        "{logged}"
    );

    // RFC 7143 §11.9.1: the session on the removed target is asked to log out,
    // with the seconds it has in Parameter3 (the 10 s grace period).
    match receive(&mut on_gone.stream).expect("an async message").0 {
        Pdu::AsyncMessage(message) => {
            assert_eq!(message.event, 1);
            assert_eq!(message.parameter3, 10);
        }
        other => panic!("expected an Asynchronous Message, got {other:?}"),
    }
    // The session on the unchanged target goes on.
    assert_eq!(on_keep.test_unit_ready(2), 0);

    // Discovery lists the new target and not the removed one.
    let listing = text(&tool_ok("iscsi-ls", &[&format!("iscsi://{portal}")]).stdout);
    assert!(listing.contains(&format!("{PREFIX}:fresh")), "{listing}");
    assert!(!listing.contains(&format!("{PREFIX}:gone")), "{listing}");
    tool_ok("iscsi-inq", &[&url("fresh")]);
    let refused = tool("iscsi-inq", &[&url("gone")]);
    assert!(!refused.status.success(), "a removed target answered");
    let said = text(&refused.stderr).to_lowercase();
    assert!(said.contains("not found"), "{said}");

    // Ignoring the request, the session is closed when the grace period ends.
    let started = Instant::now();
    assert!(receive(&mut on_gone.stream).is_none());
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(on_keep.test_unit_ready(3), 0);
    assert_eq!(served.terminate(), Some(0));
}
