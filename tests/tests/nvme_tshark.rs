//! NVMe/TCP sessions between our initiator and our target, captured on loopback and
//! decoded by Wireshark's `nvme-tcp` dissector (tshark): discovery, `info`, a copy in
//! and a copy out, once without digests and once with header and data digests.
//! Every PDU type we send is recognised (ICReq, ICResp, command and response
//! capsules, H2CData, C2HData, R2T), every digest checks out, and nothing is
//! malformed.

use std::path::Path;
use std::process::Command;

use blockwire_tests::{
    blockwire_bin, path_str, patterned_file, require, run, sparse_file, start_capture, text,
    Served, MIB,
};

/// The TCP port of an `nvme+tcp://HOST:PORT[/...]` URI.
fn port_of(uri: &str) -> u16 {
    let authority = uri.trim_start_matches("nvme+tcp://");
    let authority = authority.split('/').next().unwrap();
    authority.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// tshark's answer to `filter` over the capture, both ports decoded as NVMe/TCP
/// with digests checked, as rows of tab-separated `fields`.
fn rows(capture: &Path, ports: [u16; 2], filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let decodes: Vec<String> = ports
        .iter()
        .map(|port| format!("tcp.port=={port},nvme-tcp"))
        .collect();
    // As in iscsi_tshark.rs: loopback may reorder a connection's segments, and
    // without sequence analysis and out-of-order reassembly tshark would read a
    // retransmission as a new PDU.
    let mut args = vec![
        "-r",
        path_str(capture),
        "-o",
        "tcp.analyze_sequence_numbers:TRUE",
        "-o",
        "tcp.reassemble_out_of_order:TRUE",
        "-o",
        "nvme-tcp.check_hdgst:TRUE",
        "-o",
        "nvme-tcp.check_ddgst:TRUE",
    ];
    for decode in &decodes {
        args.extend(["-d", decode.as_str()]);
    }
    args.extend(["-Y", filter, "-T", "fields"]);
    for field in fields {
        args.extend(["-e", field]);
    }
    let output = run("tshark", &args);
    text(&output.stdout)
        .lines()
        .map(|line| line.split('\t').map(str::to_string).collect())
        .collect()
}

/// Every value of `field` in the PDUs `filter` selects: a frame may carry several
/// PDUs, and tshark then lists a field's values with commas.
fn values(capture: &Path, ports: [u16; 2], filter: &str, field: &str) -> Vec<String> {
    rows(capture, ports, filter, &[field])
        .into_iter()
        .flat_map(|row| {
            row[0]
                .split(',')
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn blockwire_ok(args: &[&str]) {
    let output = Command::new(blockwire_bin())
        .args(args)
        .output()
        .expect("run blockwire");
    assert!(
        output.status.success(),
        "blockwire {args:?}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// Discovery, `info`, then 4 MiB copied in and out through `uri`; the bytes must
/// come back.
fn session(dir: &Path, discovery: &str, uri: &str, seed: u8) {
    blockwire_ok(&["info", discovery]);
    blockwire_ok(&["info", uri]);
    let len = (4 * MIB) as usize;
    let source = patterned_file(dir, &format!("source{seed}.img"), len, seed);
    blockwire_ok(&["copy", "--quiet", path_str(&source), uri]);
    let back = dir.join(format!("back{seed}.img"));
    blockwire_ok(&["copy", "--quiet", uri, path_str(&back)]);
    let (a, b) = (
        std::fs::read(&source).unwrap(),
        std::fs::read(&back).unwrap(),
    );
    assert!(b.len() >= len && a[..] == b[..len], "the bytes differ");
}

#[test]
fn tshark_decodes_sessions_with_and_without_digests() {
    require!("tshark");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 16 * MIB);
    let served = Served::start_nvme(&[path_str(&disk), "--name", "disk"], "disk");
    let subsystem = served.nvme[0].clone();
    let discovery = served
        .nvme_discovery
        .clone()
        .expect("a discovery announcement");
    let ports = [port_of(&subsystem), port_of(&discovery)];
    let capture = dir.path().join("nvme.pcapng");

    let mut command = Command::new("tshark");
    command.args([
        "-i",
        "lo",
        // A large capture buffer: loopback segments are up to 64 KiB.
        "-B",
        "64",
        "-f",
        &format!("tcp port {} or tcp port {}", ports[0], ports[1]),
        "-w",
        path_str(&capture),
    ]);
    let mut tshark = start_capture(command);
    session(dir.path(), &discovery, &subsystem, 3);
    let digests = format!("{subsystem}?hdr_digest=1&data_digest=1");
    session(dir.path(), &discovery, &digests, 4);
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(tshark.id() as i32, libc::SIGINT) };
    tshark.wait().unwrap();
    drop(served);

    let types = values(&capture, ports, "nvme-tcp", "nvme-tcp.type");
    let count = |t: &str| types.iter().filter(|x| *x == t).count();
    for (pdu_type, what, at_least) in [
        // Discovery, info (both twice) and four copies: a connection at least each.
        ("0", "ICReq", 8),
        ("1", "ICResp", 8),
        ("4", "CapsuleCmd", 50),
        ("5", "CapsuleResp", 20),
        ("6", "H2CData", 1),
        ("7", "C2HData", 10),
        ("9", "R2T", 1),
    ] {
        assert!(
            count(pdu_type) >= at_least,
            "at least {at_least} {what} PDUs (type {pdu_type}) decoded, not {}",
            count(pdu_type)
        );
    }
    assert_eq!(count("2") + count("3"), 0, "a termination request");

    // Both sessions' PDUs: with and without the digests the host asked for, and
    // every digest tshark computed matches (status 1: good; 0 would be bad).
    for (flag, status) in [
        ("nvme-tcp.flags.pdu.hdgst", "nvme-tcp.hdgst.status"),
        ("nvme-tcp.flags.pdu.ddgst", "nvme-tcp.ddgst.status"),
    ] {
        let with = values(&capture, ports, &format!("{flag} == 1"), status);
        assert!(with.len() >= 10, "{flag}: {with:?}");
        assert!(with.iter().all(|s| s == "1"), "{status}: {with:?}");
        assert!(
            !values(&capture, ports, &format!("{flag} == 0"), "nvme-tcp.type").is_empty(),
            "no PDU without {flag}"
        );
    }

    let malformed = rows(
        &capture,
        ports,
        "_ws.malformed",
        &["frame.number", "nvme-tcp.type"],
    );
    assert!(malformed.is_empty(), "malformed frames: {malformed:?}");
    let errors = rows(
        &capture,
        ports,
        "_ws.expert.severity >= 8388608",
        &["frame.number", "_ws.expert.message"],
    );
    assert!(errors.is_empty(), "tshark reports errors: {errors:?}");
}
