//! A short iSCSI session with our target captured on loopback and decoded by
//! Wireshark's dissector (tshark): login, SCSI commands, Data-In, responses and
//! logout are all recognised, and no PDU is malformed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use blockwire_tests::iscsi::{tool_ok, Backing, Tgtd};
use blockwire_tests::{
    path_str, patterned_file, require, require_qemu_iscsi, require_tgtd, run, start_capture, text,
    Served, MIB,
};

/// tshark's answer to `filter` over the capture, as rows of tab-separated `fields`.
fn rows(capture: &str, port: u16, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let decode = format!("tcp.port=={port},iscsi");
    // Loopback can reorder a connection's segments when they are sent from two
    // CPUs, and TCP then retransmits some of them. With sequence analysis and
    // out-of-order reassembly tshark puts the stream back together; without them
    // it reads a retransmitted segment as the start of a new PDU, and calls it
    // malformed. TCP's own notes are warnings, not errors, so they do not hide
    // the PDUs' errors checked below.
    let mut args = vec![
        "-r",
        capture,
        "-o",
        "tcp.analyze_sequence_numbers:TRUE",
        "-o",
        "tcp.reassemble_out_of_order:TRUE",
        "-d",
        &decode,
        "-Y",
        filter,
        "-T",
        "fields",
    ];
    for field in fields {
        args.extend(["-e", field]);
    }
    let output = run("tshark", &args);
    text(&output.stdout)
        .lines()
        .map(|line| line.split('\t').map(str::to_string).collect())
        .collect()
}

/// Captures what `session` does on loopback port `port` into `capture`.
fn capture_session(capture: &Path, port: u16, session: impl FnOnce()) {
    let mut command = Command::new("tshark");
    command.args([
        "-i",
        "lo",
        // A large capture buffer: loopback segments are up to 64 KiB.
        "-B",
        "64",
        "-f",
        &format!("tcp port {port}"),
        "-w",
        path_str(capture),
    ]);
    let mut tshark = start_capture(command);
    session();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    tshark.wait().unwrap();
}

/// An inquiry, then a 2 MiB read and a 256 KiB write (as immediate data, or
/// Data-Out PDUs, as the login negotiated), each its own session.
fn session(url: &str) {
    tool_ok("iscsi-inq", &[url]);
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "read 0 2M",
            "-c",
            "write -P 0x77 4M 256k",
            url,
        ],
    );
}

/// Checks the decoded capture: every kind of PDU the session needs, a status for
/// every command, nothing malformed, no dissector errors.
fn check_capture(capture: &Path, port: u16) {
    let capture = path_str(capture);
    // Per PDU: a frame may carry several, and then lists their fields with commas.
    let per_pdu = |field: &str| -> Vec<String> {
        rows(capture, port, "iscsi", &[field])
            .into_iter()
            .flat_map(|row| {
                row[0]
                    .split(',')
                    .filter(|v| !v.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let opcodes = per_pdu("iscsi.opcode");
    let count = |opcode: &str| opcodes.iter().filter(|o| *o == opcode).count();
    for (opcode, what, at_least) in [
        ("0x03", "Login Command", 2),
        ("0x23", "Login Response", 2),
        ("0x01", "SCSI Command", 10),
        ("0x25", "SCSI Data-In", 5),
        ("0x06", "Logout Command", 2),
        ("0x26", "Logout Response", 2),
    ] {
        assert!(
            count(opcode) >= at_least,
            "at least {at_least} {what} PDUs ({opcode}) decoded, not {}: {opcodes:?}",
            count(opcode)
        );
    }
    let writes = per_pdu("iscsi.scsicommand.W")
        .iter()
        .filter(|w| *w == "1" || *w == "True")
        .count();
    assert!(writes >= 1, "a write command decoded: {opcodes:?}");
    // Every command is answered: a SCSI Response, or status in its last Data-In.
    let data_in_status = per_pdu("iscsi.scsidata.S")
        .iter()
        .filter(|s| *s == "1" || *s == "True")
        .count();
    let statuses = count("0x21") + data_in_status;
    assert!(
        statuses >= count("0x01"),
        "{statuses} statuses for {} commands",
        count("0x01")
    );

    // Wireshark calls SCSI data cut short at the initiator's allocation length
    // (SPC-4 4.2.5.6: a target returns no more than that) malformed, when the page
    // says it is longer; libiscsi asks 64 bytes first, then the page's full length.
    // Those are excused; anything else malformed is not.
    let malformed = rows(
        capture,
        port,
        "_ws.malformed",
        &[
            "frame.number",
            "iscsi.opcode",
            "iscsi.request_frame",
            "iscsi.datasegmentlength",
        ],
    );
    for row in &malformed {
        let (frame, opcode, request, length) = (&row[0], &row[1], &row[2], &row[3]);
        let allocation = if opcode == "0x25" && !request.is_empty() {
            rows(
                capture,
                port,
                &format!("frame.number == {request}"),
                &["scsi.cdb.alloclen", "scsi.cdb.alloclen16"],
            )
            .into_iter()
            .flatten()
            .find(|a| !a.is_empty())
        } else {
            None
        };
        assert_eq!(
            allocation.as_deref(),
            Some(length.as_str()),
            "frame {frame} (opcode {opcode}) is malformed and not an answer cut at its \
             allocation length ({malformed:?})"
        );
        eprintln!("frame {frame}: data cut at the allocation length ({length} bytes)");
    }
    let warnings = rows(
        capture,
        port,
        "_ws.expert.severity >= 6291456",
        &["frame.number", "_ws.expert.message"],
    );
    for row in &warnings {
        eprintln!(
            "tshark warns about frame {}: {}",
            row[0],
            row[1..].join(" ")
        );
    }
    let errors = rows(
        capture,
        port,
        "_ws.expert.severity >= 8388608 && !_ws.malformed",
        &["frame.number", "_ws.expert.message"],
    );
    assert!(errors.is_empty(), "tshark reports errors: {errors:?}");
}

#[test]
fn tshark_decodes_every_pdu_of_a_session() {
    require!("tshark", "iscsi-inq");
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let image = patterned_file(dir.path(), "disk.img", (8 * MIB) as usize, 5);
    let capture = dir.path().join("iscsi.pcapng");
    let served = Served::start_iscsi(&[path_str(&image)], "disk");
    let port = served.iscsi_port();
    capture_session(&capture, port, || session(served.iscsi_url()));
    drop(served);
    check_capture(&capture, port);
}

/// The same session and checks against tgtd: the checks hold for a reference
/// target (and its VPD page 0x83, longer than 64 bytes, exercises the excuse).
#[test]
fn the_same_checks_hold_for_tgtd() {
    require!("tshark", "iscsi-inq");
    require_qemu_iscsi!();
    require_tgtd!();
    let dir = tempfile::tempdir().unwrap();
    let image = patterned_file(dir.path(), "disk.img", (8 * MIB) as usize, 5);
    let capture = dir.path().join("tgtd.pcapng");
    let mut tgtd = Tgtd::start();
    let url = tgtd.add_target("tshark", Backing::File(&image));
    capture_session(&capture, tgtd.port, || session(&url));
    check_capture(&capture, tgtd.port);
}
