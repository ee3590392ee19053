//! Our release binary's NBD target against real peers: nbdinfo and nbdcopy (libnbd),
//! qemu-img and qemu-io (QEMU's NBD client), and fio's nbd engine (libnbd again).
//!
//! Each test makes its own temporary directory and starts its own server on a free
//! loopback port; a test whose peer program is missing is skipped with a message.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use blockwire_tests::{path_str, patterned_file, require, run, sparse_file, text, Served, MIB};

/// stdout and stderr of a finished command, for assertion messages and searches.
fn both(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// Runs a command that may fail and returns its output.
fn run_unchecked(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Panics naming the first differing byte (not dumping megabytes) if `actual` differs
/// from `expected`.
fn assert_same_bytes(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{what}: length {} instead of {}",
        actual.len(),
        expected.len()
    );
    if let Some(at) = actual.iter().zip(expected).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {at}: {:#04x} instead of {:#04x}",
            actual[at], expected[at]
        );
    }
}

fn assert_files_equal(actual: &Path, expected: &Path) {
    let a = std::fs::read(actual).expect("read file");
    let e = std::fs::read(expected).expect("read file");
    assert_same_bytes(
        &a,
        &e,
        &format!("{} vs {}", actual.display(), expected.display()),
    );
}

/// Overwrites `[offset, offset + len)` of a file with zero bytes (real zeroes, not a
/// hole), so a source has a run that copy tools detect and send as zero requests.
fn zero_range(path: &Path, offset: u64, len: u64) {
    let mut data = std::fs::read(path).expect("read file");
    data[offset as usize..(offset + len) as usize].fill(0);
    std::fs::write(path, data).expect("write file");
}

/// Stops the server with SIGTERM and checks that it exits cleanly.
fn stop(served: Served) {
    assert_eq!(
        served.terminate(),
        Some(0),
        "blockwire serve did not exit 0 on SIGTERM"
    );
}

// ---------------------------------------------------------------------------------
// nbdinfo

/// Whether nbdinfo's text output has an `export-size: SIZE` line (maybe followed by
/// a rounded size such as "(16M)").
fn shows_size(nbdinfo: &str, size: u64) -> bool {
    let size = size.to_string();
    nbdinfo.lines().any(|line| {
        let mut fields = line.split_whitespace();
        fields.next() == Some("export-size:") && fields.next() == Some(size.as_str())
    })
}

#[test]
fn nbdinfo_shows_size_and_name() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    // An odd size (20 MiB + 512 bytes) so a rounded or default size cannot pass.
    let size = 20 * MIB + 512;
    let disk = sparse_file(dir.path(), "disk.img", size);
    let served = Served::start(
        &[
            path_str(&disk),
            "--name",
            "info-disk",
            "--description",
            "interop disk",
        ],
        "info-disk",
    );

    let out = text(&run("nbdinfo", &[&served.uri()]).stdout);
    assert!(
        out.contains("export=\"info-disk\":"),
        "no export name in:\n{out}"
    );
    assert!(
        shows_size(&out, size),
        "export size is not {size} in:\n{out}"
    );
    assert!(
        out.contains("is_read_only: false"),
        "not writable in:\n{out}"
    );

    let exact = text(&run("nbdinfo", &["--size", &served.uri()]).stdout);
    assert_eq!(exact.trim(), size.to_string());

    // The name and description as the server lists them (NBD_OPT_LIST / INFO), not
    // as nbdinfo echoes them back from the URI.
    let base = format!("nbd://127.0.0.1:{}", served.port);
    let list = text(&run("nbdinfo", &["--list", &base]).stdout);
    assert!(
        list.contains("export=\"info-disk\":"),
        "not listed:\n{list}"
    );
    assert!(
        list.contains("description: interop disk"),
        "no description in:\n{list}"
    );

    // A name the server does not export is refused.
    let wrong = run_unchecked("nbdinfo", &[&format!("{base}/no-such-export")]);
    assert!(
        !wrong.status.success(),
        "nbdinfo accepted an unknown export name:\n{}",
        both(&wrong)
    );
    stop(served);
}

#[test]
fn nbdinfo_lists_exports_of_config_file() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "a.img", 16 * MIB);
    let config = dir.path().join("blockwire.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\
             [[export]]\nname = \"a\"\npath = \"{}\"\n\
             [[export]]\nname = \"b\"\nmemory = \"64M\"\ndescription = \"scratch\"\n",
            disk.display()
        ),
    )
    .unwrap();
    let served = Served::start_config(&config, "a");
    let port = served.port;

    let list = text(&run("nbdinfo", &["--list", &format!("nbd://127.0.0.1:{port}")]).stdout);
    let exports: Vec<&str> = list
        .lines()
        .filter(|line| line.starts_with("export="))
        .collect();
    assert_eq!(
        exports,
        ["export=\"a\":", "export=\"b\":"],
        "exports listed:\n{list}"
    );
    // Each export's details follow its header line.
    let (a, b) = list.split_at(list.find("export=\"b\"").unwrap());
    assert!(shows_size(a, 16 * MIB), "a:\n{a}");
    assert!(shows_size(b, 64 * MIB), "b:\n{b}");
    assert!(b.contains("description: scratch"), "b:\n{b}");

    // Both are reachable by name.
    let size_b = text(&run("nbdinfo", &["--size", &format!("nbd://127.0.0.1:{port}/b")]).stdout);
    assert_eq!(size_b.trim(), (64 * MIB).to_string());
    let size_a = text(&run("nbdinfo", &["--size", &served.uri()]).stdout);
    assert_eq!(size_a.trim(), (16 * MIB).to_string());
    stop(served);
}

/// One line of `nbdinfo --map`: offset, length, description ("data", "hole,zero", ...).
fn map_entries(map: &str) -> Vec<(u64, u64, String)> {
    map.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let offset = fields.next()?.parse().ok()?;
            let length = fields.next()?.parse().ok()?;
            let _type = fields.next()?;
            Some((offset, length, fields.collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

fn entry_at(entries: &[(u64, u64, String)], offset: u64) -> &(u64, u64, String) {
    entries
        .iter()
        .find(|(start, len, _)| *start <= offset && offset < start + len)
        .unwrap_or_else(|| panic!("no map entry covers offset {offset}: {entries:?}"))
}

#[test]
fn nbdinfo_map_shows_hole_after_discard() {
    require!("nbdinfo", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "map.img", 16 * MIB);
    let served = Served::start(&[path_str(&disk), "--name", "map"], "map");

    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &served.uri(),
            "-c",
            "write -P 0x5a 0 4M",
            "-c",
            "discard 1M 1M",
        ],
    );
    let map = text(&run("nbdinfo", &["--map", &served.uri()]).stdout);
    let entries = map_entries(&map);
    assert!(!entries.is_empty(), "no extents in:\n{map}");

    let (_, _, first) = entry_at(&entries, 0);
    assert!(
        first.contains("data") && !first.contains("hole"),
        "the written start is not data:\n{map}"
    );
    let (start, len, trimmed) = entry_at(&entries, MIB);
    assert!(
        trimmed.contains("hole"),
        "the discarded range is not a hole:\n{map}"
    );
    assert!(
        *start <= MIB && start + len >= 2 * MIB,
        "the hole does not cover the whole discarded 1M..2M:\n{map}"
    );
    let (_, _, after) = entry_at(&entries, 2 * MIB);
    assert!(
        after.contains("data") && !after.contains("hole"),
        "data after the discarded range is not data:\n{map}"
    );
    let (_, _, tail) = entry_at(&entries, 8 * MIB);
    assert!(
        tail.contains("hole"),
        "the never-written tail is not a hole:\n{map}"
    );
    stop(served);
}

// ---------------------------------------------------------------------------------
// qemu-img, qemu-io

#[test]
fn qemu_img_convert_and_compare() {
    require!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let size = 32 * MIB;
    let src = patterned_file(dir.path(), "src.raw", size as usize, 7);
    zero_range(&src, 12 * MIB, 3 * MIB);
    let disk = sparse_file(dir.path(), "dst.img", size);
    let served = Served::start(&[path_str(&disk), "--name", "convert"], "convert");

    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            path_str(&src),
            &served.uri(),
        ],
    );
    let compare = run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            path_str(&src),
            &served.uri(),
        ],
    );
    assert!(
        text(&compare.stdout).contains("Images are identical"),
        "{}",
        both(&compare)
    );
    stop(served);
    assert_files_equal(&disk, &src);
}

#[test]
fn qemu_img_compare_detects_a_difference() {
    // Shows that qemu_img_convert_and_compare's compare can fail: one changed byte
    // in the export makes `qemu-img compare` exit 1.
    require!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let src = patterned_file(dir.path(), "src.raw", (16 * MIB) as usize, 3);
    let mut changed = std::fs::read(&src).unwrap();
    changed[5 * MIB as usize + 17] ^= 0xff;
    let disk = dir.path().join("changed.img");
    std::fs::write(&disk, &changed).unwrap();
    let served = Served::start(&[path_str(&disk), "--name", "changed"], "changed");

    let compare = run_unchecked(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            path_str(&src),
            &served.uri(),
        ],
    );
    assert_eq!(compare.status.code(), Some(1), "{}", both(&compare));
    assert!(
        text(&compare.stdout).contains(&format!("offset {}", 5 * MIB)),
        "{}",
        both(&compare)
    );
    stop(served);
}

#[test]
fn qemu_io_write_read_discard_zero() {
    require!("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    // Start from non-zero bytes, so the reads of zeroes after discard and write -z
    // prove that those requests zeroed something.
    let disk = patterned_file(dir.path(), "io.img", (16 * MIB) as usize, 1);
    let before = std::fs::read(&disk).unwrap();
    let served = Served::start(&[path_str(&disk), "--name", "io"], "io");

    let output = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &served.uri(),
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "discard 1M 1M",
            "-c",
            "read -P 0 1M 1M",
            "-c",
            "write -z 2M 1M",
            "-c",
            "read -P 0 2M 1M",
        ],
    );
    let all = both(&output);
    assert!(!all.contains("Pattern verification failed"), "{all}");
    let reads = all
        .lines()
        .filter(|line| line.starts_with("read 1048576/1048576 bytes at offset"))
        .count();
    assert_eq!(reads, 3, "not every read completed:\n{all}");
    assert!(
        all.contains("wrote 1048576/1048576 bytes at offset 2097152"),
        "{all}"
    );
    assert!(
        all.contains("discard 1048576/1048576 bytes at offset 1048576"),
        "{all}"
    );

    // A second connection sees the same bytes.
    let again = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-r",
            &served.uri(),
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "read -P 0 1M 2M",
        ],
    );
    assert!(
        !both(&again).contains("Pattern verification failed"),
        "{}",
        both(&again)
    );
    stop(served);

    // And so does the backing file; bytes past 3 MiB are untouched.
    let after = std::fs::read(&disk).unwrap();
    assert!(after[..MIB as usize].iter().all(|&b| b == 0xab));
    assert!(after[MIB as usize..3 * MIB as usize]
        .iter()
        .all(|&b| b == 0));
    assert_same_bytes(
        &after[3 * MIB as usize..],
        &before[3 * MIB as usize..],
        "bytes after 3 MiB",
    );
}

// ---------------------------------------------------------------------------------
// nbdcopy

/// Copies a file into a served export and back out to another file with `nbdcopy
/// EXTRA...`, and checks both copies and the backing file byte for byte. The source
/// has a run of zeroes, and both destinations start out full of other bytes, so the
/// zero run must really be written (or trimmed to zeroes) on each side.
fn nbdcopy_round_trip(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let size = 32 * MIB as usize;
    let src = patterned_file(dir.path(), "src.raw", size, 11);
    zero_range(&src, 8 * MIB, 4 * MIB);
    let disk = patterned_file(dir.path(), "disk.img", size, 99);
    let back = patterned_file(dir.path(), "back.raw", size, 55);
    let served = Served::start(&[path_str(&disk), "--name", "copy"], "copy");

    let uri = served.uri();
    let mut args: Vec<&str> = extra.to_vec();
    args.extend([path_str(&src), &uri]);
    run("nbdcopy", &args);

    let mut args: Vec<&str> = extra.to_vec();
    args.extend([&uri, path_str(&back)]);
    run("nbdcopy", &args);

    assert_files_equal(&back, &src);
    stop(served);
    assert_files_equal(&disk, &src);
}

#[test]
fn nbdcopy_round_trip_preserves_bytes() {
    require!("nbdcopy");
    nbdcopy_round_trip(&[]);
}

#[test]
fn nbdcopy_round_trip_with_four_connections() {
    require!("nbdcopy");
    nbdcopy_round_trip(&["--connections=4"]);
}

// ---------------------------------------------------------------------------------
// fio

/// The integer after `"key" :` that follows `anchor` in fio's JSON output.
fn fio_int_after(json: &str, anchor: &str, key: &str) -> u64 {
    let start = json
        .find(anchor)
        .unwrap_or_else(|| panic!("no {anchor} in fio output:\n{json}"));
    let rest = &json[start..];
    let needle = format!("\"{key}\"");
    let at = rest
        .find(&needle)
        .unwrap_or_else(|| panic!("no {needle} after {anchor} in fio output:\n{json}"));
    let value = rest[at + needle.len()..]
        .trim_start()
        .trim_start_matches(':')
        .trim_start();
    let digits: String = value.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{needle} after {anchor} is not a number:\n{json}"))
}

/// Runs fio's nbd engine with a 64 MiB random-write verify job in `dir` (where fio
/// would leave its files), panicking with its output if it fails; returns its JSON.
fn fio(dir: &Path, uri: &str, extra: &[&str]) -> String {
    let mut command = Command::new("fio");
    command
        .current_dir(dir)
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=64M",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--name=v",
            "--output-format=json",
        ])
        .args(extra);
    let output = command.output().expect("cannot run fio");
    assert!(
        output.status.success(),
        "fio {extra:?} failed ({}):\n{}",
        output.status,
        both(&output)
    );
    text(&output.stdout)
}

#[test]
fn fio_random_writes_verify() {
    require!("fio");
    let dir = tempfile::tempdir().unwrap();
    // Let the server create the sparse backing file.
    let disk = dir.path().join("fio.img");
    let served = Served::start(&[path_str(&disk), "--size", "64M", "--name", "fio"], "fio");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 64 * MIB);

    // Write 64 MiB of checksummed 4 KiB blocks at random, then read all back and verify.
    let json = fio(dir.path(), &served.uri(), &["--do_verify=1"]);
    assert_eq!(fio_int_after(&json, "\"jobs\"", "error"), 0, "{json}");
    assert_eq!(
        fio_int_after(&json, "\"write\"", "io_bytes"),
        64 * MIB,
        "{json}"
    );
    assert_eq!(
        fio_int_after(&json, "\"read\"", "io_bytes"),
        64 * MIB,
        "the verify pass did not read everything back:\n{json}"
    );

    // A new connection verifies the same data again (what the first wrote is on the
    // server, not in a client cache).
    let json = fio(dir.path(), &served.uri(), &["--verify_only"]);
    assert_eq!(fio_int_after(&json, "\"jobs\"", "error"), 0, "{json}");
    assert_eq!(
        fio_int_after(&json, "\"read\"", "io_bytes"),
        64 * MIB,
        "{json}"
    );
    stop(served);
}

/// Large requests with many in flight go to the worker pool instead of running on
/// the connection's thread (crates/nbd/src/target/offload.rs); their data must come
/// back the same, and replies leave out of order.
#[test]
fn fio_large_requests_verify() {
    require!("fio");
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("fio.img");
    let served = Served::start(&[path_str(&disk), "--size", "64M", "--name", "fio"], "fio");
    // fio takes the last of repeated options: 1 MiB and 256 KiB blocks, 16 in flight.
    for bs in ["--bs=1M", "--bs=256k"] {
        let json = fio(
            dir.path(),
            &served.uri(),
            &[bs, "--iodepth=16", "--do_verify=1"],
        );
        assert_eq!(fio_int_after(&json, "\"jobs\"", "error"), 0, "{json}");
        assert_eq!(
            fio_int_after(&json, "\"read\"", "io_bytes"),
            64 * MIB,
            "the verify pass did not read everything back:\n{json}"
        );
    }
    stop(served);
}

// ---------------------------------------------------------------------------------
// read-only exports

/// Sends one NBD_CMD_WRITE of `data` at `offset` over a minimal fixed-newstyle client
/// (NBD_OPT_EXPORT_NAME, simple replies), which, unlike libnbd and QEMU, does not
/// refuse to write to a read-only export itself. Returns the transmission flags and
/// the reply's error (0 for success, 1 for EPERM).
fn raw_nbd_write(port: u16, name: &str, offset: u64, data: &[u8]) -> (u16, u32) {
    const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 18];
    s.read_exact(&mut buf).expect("read greeting");
    assert_eq!(&buf[..8], b"NBDMAGIC");
    assert_eq!(&buf[8..16], IHAVEOPT);
    let handshake = u16::from_be_bytes([buf[16], buf[17]]);
    assert_ne!(handshake & 1, 0, "server is not fixed newstyle");
    let no_zeroes = handshake & 2 != 0;
    let client_flags: u32 = if no_zeroes { 3 } else { 1 };

    let mut msg = client_flags.to_be_bytes().to_vec();
    msg.extend_from_slice(IHAVEOPT);
    msg.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    msg.extend_from_slice(&(name.len() as u32).to_be_bytes());
    msg.extend_from_slice(name.as_bytes());
    s.write_all(&msg).unwrap();

    let mut info = [0u8; 10];
    s.read_exact(&mut info).expect("read export info");
    let flags = u16::from_be_bytes([info[8], info[9]]);
    if !no_zeroes {
        s.read_exact(&mut [0u8; 124]).unwrap();
    }

    let request = |kind: u16, handle: u64, offset: u64, len: u32| {
        let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&kind.to_be_bytes());
        r.extend_from_slice(&handle.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r
    };
    let mut msg = request(1, 0x1234, offset, data.len() as u32); // NBD_CMD_WRITE
    msg.extend_from_slice(data);
    s.write_all(&msg).unwrap();

    let mut reply = [0u8; 16];
    s.read_exact(&mut reply).expect("read write reply");
    assert_eq!(
        &reply[..4],
        &0x6744_6698u32.to_be_bytes(),
        "not a simple reply"
    );
    let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
    assert_eq!(&reply[8..], &0x1234u64.to_be_bytes(), "wrong handle");
    s.write_all(&request(2, 0x1235, 0, 0)).unwrap(); // NBD_CMD_DISC
    (flags, error)
}

const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
const NBD_EPERM: u32 = 1;

#[test]
fn raw_client_write_succeeds_on_writable_export() {
    // The control for read_only_export_refuses_writes: the same hand-made client's
    // write is accepted by a writable export and lands in the file.
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "rw.img", 16 * MIB);
    let served = Served::start(&[path_str(&disk), "--name", "rw"], "rw");
    let (flags, error) = raw_nbd_write(served.port, "rw", 4096, &[0xcd; 4096]);
    assert_eq!(flags & NBD_FLAG_READ_ONLY, 0);
    assert_eq!(error, 0);
    stop(served);
    let after = std::fs::read(&disk).unwrap();
    assert!(after[4096..8192].iter().all(|&b| b == 0xcd));
}

#[test]
fn read_only_export_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let disk = patterned_file(dir.path(), "ro.img", (16 * MIB) as usize, 5);
    let before = std::fs::read(&disk).unwrap();
    let served = Served::start(&[path_str(&disk), "--name", "ro", "--read-only"], "ro");

    if blockwire_tests::have("qemu-io") {
        // QEMU sees NBD_FLAG_READ_ONLY and refuses to open the export for writing
        // (EACCES, "Permission denied"), or, opened read-only, refuses the write.
        for extra in [&[][..], &["-r"][..]] {
            let mut args = vec!["-f", "raw"];
            args.extend_from_slice(extra);
            let uri = served.uri();
            args.extend([uri.as_str(), "-c", "write -P 0xcd 0 64k"]);
            let output = run_unchecked("qemu-io", &args);
            let all = both(&output);
            assert!(
                !all.contains("wrote "),
                "qemu-io wrote to a read-only export:\n{all}"
            );
            assert!(
                ["Operation not permitted", "Permission denied", "read-only"]
                    .iter()
                    .any(|m| all.contains(m)),
                "qemu-io gave no permission error:\n{all}"
            );
        }
        // Reading still works.
        run(
            "qemu-io",
            &["-f", "raw", "-r", &served.uri(), "-c", "read 0 64k"],
        );
    } else {
        eprintln!("qemu-io is not installed: checking the server side only");
    }

    // The server itself refuses a write that reaches it, with EPERM.
    let (flags, error) = raw_nbd_write(served.port, "ro", 0, &[0xcd; 65536]);
    assert_ne!(flags & NBD_FLAG_READ_ONLY, 0, "read-only flag not set");
    assert_eq!(
        error, NBD_EPERM,
        "write to a read-only export: error {error}"
    );

    stop(served);
    let after = std::fs::read(&disk).unwrap();
    assert_same_bytes(&after, &before, "read-only backing file");
}
