//! `blockwire info` (our initiator, through the release binary) against our own
//! served exports, compared with what nbdinfo (libnbd) says about the same export.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

use blockwire_tests::{blockwire_bin, path_str, require, run, sparse_file, text, Served, MIB};

const GIB: u64 = 1 << 30;

fn info(args: &[&str]) -> Output {
    Command::new(blockwire_bin())
        .arg("info")
        .args(args)
        .output()
        .expect("run blockwire info")
}

fn info_ok(args: &[&str]) -> String {
    let output = info(args);
    assert!(
        output.status.success(),
        "blockwire info {args:?} failed: {}",
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// A sparse file with data at a few places, some beyond the first 2 GiB so that
/// mapping it takes more than one block-status request.
fn patchy_file(dir: &Path) -> std::path::PathBuf {
    let path = sparse_file(dir, "patchy.img", 5 * GIB);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    for (offset, len) in [
        (MIB, MIB),
        (3 * MIB, 64 * 1024),
        (2 * GIB + 8 * MIB, 2 * MIB),
        (4 * GIB, MIB),
    ] {
        file.write_all_at(&vec![0xA5; len as usize], offset)
            .unwrap();
    }
    file.sync_all().unwrap();
    path
}

/// `(offset, length, type)` rows of a `--map` listing, neighbours of the same
/// type merged (a map may be split wherever the server's answers were).
fn map_rows(listing: &str) -> Vec<(u64, u64, u32)> {
    let mut rows: Vec<(u64, u64, u32)> = Vec::new();
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() >= 4, "odd map line {line:?}");
        let row = (
            fields[0].parse().unwrap(),
            fields[1].parse().unwrap(),
            fields[2].parse().unwrap(),
        );
        match rows.last_mut() {
            Some(last) if last.2 == row.2 && last.0 + last.1 == row.0 => last.1 += row.1,
            _ => rows.push(row),
        }
    }
    rows
}

#[test]
fn map_matches_nbdinfo() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let disk = patchy_file(dir.path());
    let served = Served::start(&[path_str(&disk), "--name", "patchy"], "patchy");
    let ours = info_ok(&["--map", &served.uri()]);
    let theirs = text(&run("nbdinfo", &["--map", &served.uri()]).stdout);
    let rows = map_rows(&ours);
    assert_eq!(rows, map_rows(&theirs), "ours:\n{ours}\nnbdinfo:\n{theirs}");
    // The map covers the export and shows the data where it was written.
    assert_eq!(rows.first().unwrap().0, 0);
    let last = rows.last().unwrap();
    assert_eq!(last.0 + last.1, 5 * GIB);
    assert!(rows.contains(&(MIB, MIB, 0)), "{ours}");
    assert!(rows
        .iter()
        .any(|&(o, l, t)| t == 0 && o <= 4 * GIB && o + l >= 4 * GIB + MIB));
    // Same columns as nbdinfo, not just the same numbers.
    for line in ours.lines() {
        assert!(
            theirs.lines().any(|t| t == line),
            "{line:?} not in nbdinfo's map"
        );
    }
    // JSON carries the same rows.
    let json = info_ok(&["--map", "--json", &served.uri()]);
    assert_eq!(
        json.matches("\"offset\"").count(),
        ours.lines().count(),
        "{json}"
    );
    assert!(json.contains("\"description\": \"hole,zero\""), "{json}");
}

#[test]
fn info_matches_nbdinfo() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let size = 20 * MIB + 512;
    let disk = sparse_file(dir.path(), "disk.img", size);
    let served = Served::start(
        &[
            path_str(&disk),
            "--name",
            "info-disk",
            "--description",
            "cli disk",
        ],
        "info-disk",
    );
    let ours = info_ok(&[&served.uri()]);
    let theirs = text(&run("nbdinfo", &[&served.uri()]).stdout);
    assert!(ours.contains("export: \"info-disk\""), "{ours}");
    assert!(ours.contains("description: cli disk"), "{ours}");
    assert!(ours.contains(&format!("size: {size} (20.0M)")), "{ours}");
    assert!(theirs.contains(&format!("export-size: {size}")), "{theirs}");
    // Every flag nbdinfo reports as true is among ours, and the other way round.
    let words = [
        ("can_flush", "flush"),
        ("can_fua", "fua"),
        ("can_trim", "trim"),
        ("can_zero", "zero"),
        ("can_fast_zero", "fast-zero"),
        ("can_multi_conn", "multi-conn"),
        ("can_cache", "cache"),
        ("can_df", "df"),
        ("is_read_only", "read-only"),
    ];
    let flags_line = ours
        .lines()
        .find(|l| l.starts_with("flags:"))
        .expect("a flags line");
    let flags: Vec<&str> = flags_line["flags:".len()..].split_whitespace().collect();
    for (theirs_name, ours_name) in words {
        let true_there = theirs.contains(&format!("{theirs_name}: true"));
        assert_eq!(
            true_there,
            flags.contains(&ours_name),
            "{theirs_name} vs {ours_name}:\n{ours}\n{theirs}"
        );
    }
    for line in [
        "block sizes: minimum 1, preferred 4096, maximum 33554432",
        "structured replies: yes",
        // Our initiator and target agree on extended headers.
        "extended headers: yes",
        "contexts: base:allocation",
    ] {
        assert!(ours.contains(line), "{line:?} missing:\n{ours}");
    }
    assert!(theirs.contains("block_size_maximum: 33554432"), "{theirs}");

    let json = info_ok(&["--json", &served.uri()]);
    assert!(json.contains(&format!("\"size\": {size}")), "{json}");
    assert!(json.contains("\"export\": \"info-disk\""), "{json}");

    // --list: the server's exports with descriptions, like nbdinfo --list.
    let base = format!("nbd://127.0.0.1:{}", served.port);
    let list = info_ok(&["--list", &base]);
    assert_eq!(list, "\"info-disk\"\tcli disk\n");
    let nbdinfo_list = text(&run("nbdinfo", &["--list", &base]).stdout);
    assert!(nbdinfo_list.contains("description: cli disk"));
}

#[test]
fn read_only_export_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "ro.img", 8 * MIB);
    let served = Served::start(&[path_str(&disk), "--name", "ro", "--read-only"], "ro");
    let ours = info_ok(&[&served.uri()]);
    let flags = ours.lines().find(|l| l.starts_with("flags:")).unwrap();
    assert!(flags.contains("read-only"), "{ours}");
    assert!(!flags.contains("trim"), "{ours}");
}

#[test]
fn bad_uris_and_unreachable_servers_fail_in_one_line() {
    let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = unused.local_addr().unwrap().port();
    drop(unused);
    let unreachable = format!("nbd://127.0.0.1:{port}/x");
    for (args, expect) in [
        (vec!["http://host/x"], "not a URI blockwire info reads"),
        (vec!["nbd://host:99999/x"], "port"),
        (vec!["nbd+unix:///x"], "socket=PATH"),
        (vec![unreachable.as_str()], "cannot connect"),
        (vec!["--list", unreachable.as_str()], "cannot connect"),
        (vec!["--map", unreachable.as_str()], "cannot connect"),
    ] {
        let output = info(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = text(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn unknown_export_is_one_line_with_the_servers_reason() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "d.img", 8 * MIB);
    let served = Served::start(&[path_str(&disk), "--name", "d"], "d");
    let output = info(&[&format!("nbd://127.0.0.1:{}/nope", served.port)]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("nope") && stderr.contains("NBD_REP_ERR_UNKNOWN"),
        "{stderr}"
    );
}
