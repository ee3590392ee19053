//! Our iSCSI target driven by the programs people use: libiscsi's iscsi-ls,
//! iscsi-inq, iscsi-readcapacity16 and iscsi-swp, qemu-img and qemu-io (through
//! their libiscsi block driver), with a read-only export and CHAP logins.

use std::path::Path;

use blockwire_tests::iscsi::{qemu_iscsi_unavailable, run_conformance_tests, tool, tool_ok};
use blockwire_tests::require_qemu_iscsi;
use blockwire_tests::{
    blockwire_bin, path_str, patterned_file, require, sparse_file, text, Served, MIB,
};

/// A sparse image of `len` bytes in `dir`, served over iSCSI with `extra` arguments.
fn serve(dir: &Path, len: u64, extra: &[&str]) -> (Served, std::path::PathBuf) {
    let image = sparse_file(dir, "disk.img", len);
    let mut args = vec![path_str(&image)];
    args.extend_from_slice(extra);
    (Served::start_iscsi(&args, "disk"), image)
}

/// The value after `key:` on the line of `output` that starts with it.
fn field<'a>(output: &'a str, key: &str) -> Option<&'a str> {
    output
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .map(str::trim)
}

#[test]
fn discovery_lists_the_target_and_its_lun() {
    require!("iscsi-ls");
    let dir = tempfile::tempdir().unwrap();
    let (served, _) = serve(dir.path(), 64 * MIB, &[]);
    let portal = format!("iscsi://{}", served.iscsi_portal());

    let listing = text(&tool_ok("iscsi-ls", &[&portal]).stdout);
    let expected = format!("Target:{} Portal:{}", served.iqn(), served.iscsi_portal());
    assert!(
        listing.lines().any(|line| line.starts_with(&expected)),
        "{expected} in:\n{listing}"
    );

    let luns = text(&tool_ok("iscsi-ls", &["-s", &portal]).stdout);
    let lun0 = luns
        .lines()
        .find(|line| line.trim_start().starts_with("Lun:0"))
        .unwrap_or_else(|| panic!("LUN 0 listed:\n{luns}"));
    assert!(lun0.contains("DIRECT_ACCESS"), "{lun0}");
    // iscsi-ls prints the last LBA's offset in MiB: 63M for 64 MiB.
    assert!(lun0.contains("(Size:63M)"), "{lun0}");
}

#[test]
fn inquiry_standard_and_vpd_pages_parse() {
    require!("iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let (served, _) = serve(dir.path(), 64 * MIB, &[]);
    let url = served.iscsi_url();

    let standard = text(&tool_ok("iscsi-inq", &[url]).stdout);
    assert_eq!(
        field(&standard, "Peripheral Qualifier:"),
        Some("CONNECTED"),
        "{standard}"
    );
    assert_eq!(
        field(&standard, "Peripheral Device Type:"),
        Some("DIRECT_ACCESS"),
        "{standard}"
    );
    assert!(
        field(&standard, "Vendor:").is_some_and(|v| !v.is_empty()),
        "{standard}"
    );
    assert!(
        field(&standard, "Product:").is_some_and(|p| !p.is_empty()),
        "{standard}"
    );
    assert_eq!(
        field(&standard, "CmdQue:"),
        Some("1"),
        "command queueing: {standard}"
    );

    // iscsi-inq takes the page code in decimal.
    let page =
        |code: u8| text(&tool_ok("iscsi-inq", &["-e", "1", "-c", &code.to_string(), url]).stdout);
    let supported = page(0x00);
    for listed in [
        "Page:0x00 SUPPORTED_VPD_PAGES",
        "Page:0x80 UNIT_SERIAL_NUMBER",
        "Page:0x83 DEVICE_IDENTIFICATION",
        "Page:0xb0 BLOCK_LIMITS",
    ] {
        assert!(supported.contains(listed), "{listed} in:\n{supported}");
    }
    let serial = page(0x80);
    let serial = field(&serial, "Unit Serial Number:")
        .unwrap_or_else(|| panic!("a serial number:\n{serial}"))
        .trim_matches(|c| c == '[' || c == ']')
        .trim();
    assert!(!serial.is_empty(), "the serial number is empty");
    let identification = page(0x83);
    assert!(
        identification.contains("DEVICE DESIGNATOR #0"),
        "{identification}"
    );
    assert!(
        identification.contains("Page Code:(0x83)"),
        "{identification}"
    );
    let limits = page(0xb0);
    assert!(
        field(&limits, "maximum transfer length:").is_some(),
        "{limits}"
    );
    assert!(
        field(&limits, "optimal transfer length granularity:").is_some(),
        "{limits}"
    );

    // A page nobody defines is refused, with sense, not answered with garbage.
    let unknown = tool("iscsi-inq", &["-e", "1", "-c", "200", url]);
    assert!(!unknown.status.success(), "VPD page 0xc8 answered");
    assert!(
        text(&unknown.stderr).contains("ILLEGAL_REQUEST"),
        "{}",
        text(&unknown.stderr)
    );
}

#[test]
fn read_capacity16_gives_the_file_size() {
    require!("iscsi-readcapacity16");
    let dir = tempfile::tempdir().unwrap();
    let len = 48 * MIB + 4096;
    let (served, _) = serve(dir.path(), len, &[]);
    let output = text(&tool_ok("iscsi-readcapacity16", &[served.iscsi_url()]).stdout);
    assert_eq!(
        field(&output, "Total size:"),
        Some(len.to_string().as_str()),
        "{output}"
    );
    let block: u64 = field(&output, "LOGICAL BLOCK LENGTH IN BYTES:")
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("a block length:\n{output}"));
    let last: u64 = field(&output, "RETURNED LOGICAL BLOCK ADDRESS:")
        .and_then(|b| b.parse().ok())
        .unwrap_or_else(|| panic!("a last LBA:\n{output}"));
    assert_eq!((last + 1) * block, len, "{output}");
}

#[test]
fn software_write_protect_turns_on_and_off() {
    require!("iscsi-swp", "iscsi-test-cu");
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let (served, image) = serve(dir.path(), 16 * MIB, &[]);
    let url = served.iscsi_url();
    let swp = || text(&tool_ok("iscsi-swp", &[url]).stdout);
    assert!(swp().contains("SWP:0"), "{}", swp());

    tool_ok("iscsi-swp", &["-s", "on", url]);
    assert!(swp().contains("SWP:1"), "{}", swp());
    // The target refuses writes itself (DATA PROTECT), which qemu-io cannot show:
    // it sees the WP bit and will not open the LUN for writing.
    let protected = run_conformance_tests(url, "ALL.ReadOnly");
    assert!(protected.failures.is_empty(), "{}", protected.output);
    assert!(
        !protected.output.contains("not write-protected"),
        "{}",
        protected.output
    );
    let write = tool("qemu-io", &["-f", "raw", "-c", "write -P 0x5a 0 64k", url]);
    assert!(
        !write.status.success(),
        "qemu-io wrote to a write-protected LUN"
    );
    assert!(std::fs::read(&image).unwrap()[..65536]
        .iter()
        .all(|&b| b == 0));

    tool_ok("iscsi-swp", &["-s", "off", url]);
    assert!(swp().contains("SWP:0"), "{}", swp());
    tool_ok("qemu-io", &["-f", "raw", "-c", "write -P 0x5a 0 64k", url]);
    drop(served);
    assert!(std::fs::read(&image).unwrap()[..65536]
        .iter()
        .all(|&b| b == 0x5a));
}

#[test]
fn qemu_img_writes_and_reads_back_the_same_bytes() {
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let source = patterned_file(dir.path(), "source.img", (16 * MIB) as usize, 7);
    let (served, image) = serve(dir.path(), 16 * MIB, &[]);
    let url = served.iscsi_url();
    tool_ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            path_str(&source),
            url,
        ],
    );
    let back = dir.path().join("back.img");
    tool_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", url, path_str(&back)],
    );
    let expected = std::fs::read(&source).unwrap();
    assert!(
        std::fs::read(&back).unwrap() == expected,
        "what qemu-img read back differs"
    );
    tool_ok(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", path_str(&source), url],
    );
    drop(served);
    assert!(
        std::fs::read(&image).unwrap() == expected,
        "the file differs"
    );
}

#[test]
fn qemu_io_reads_the_pattern_it_wrote() {
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let (served, image) = serve(dir.path(), 16 * MIB, &[]);
    let url = served.iscsi_url();
    // Unaligned to the request size, across a MiB boundary, and at the very end.
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xa5 1020k 72k",
            "-c",
            "write -P 0x3c 16380k 4k",
            "-c",
            "flush",
            url,
        ],
    );
    tool_ok(
        "qemu-io",
        &[
            "-r",
            "-f",
            "raw",
            "-c",
            "read -P 0xa5 1020k 72k",
            "-c",
            "read -P 0x3c 16380k 4k",
            "-c",
            "read -P 0 0 1020k",
            url,
        ],
    );
    let wrong = tool(
        "qemu-io",
        &["-r", "-f", "raw", "-c", "read -P 0xa6 1020k 72k", url],
    );
    assert!(
        text(&wrong.stdout).contains("Pattern verification failed"),
        "a wrong pattern is noticed: {}",
        text(&wrong.stdout)
    );
    drop(served);
    let data = std::fs::read(&image).unwrap();
    assert!(data[1020 << 10..1092 << 10].iter().all(|&b| b == 0xa5));
    assert!(data[16380 << 10..].iter().all(|&b| b == 0x3c));
}

#[test]
fn a_read_only_export_refuses_writes() {
    require!("iscsi-test-cu");
    let dir = tempfile::tempdir().unwrap();
    let image = patterned_file(dir.path(), "golden.img", (16 * MIB) as usize, 3);
    let before = std::fs::read(&image).unwrap();
    let served = Served::start_iscsi(&[path_str(&image), "--read-only"], "golden");
    let url = served.iscsi_url();
    // The WP bit is set (MODE SENSE's header; the ReadOnly suite skips itself
    // otherwise), and every kind of write fails with DATA PROTECT / WRITE PROTECTED.
    let counts = run_conformance_tests(url, "ALL.ReadOnly");
    assert!(counts.failures.is_empty(), "{}", counts.output);
    assert!(
        !counts.output.contains("not write-protected"),
        "{}",
        counts.output
    );
    let write_protect = run_conformance_tests(url, "ALL.Write10.WriteProtect");
    assert!(
        write_protect.failures.is_empty(),
        "{}",
        write_protect.output
    );
    if qemu_iscsi_unavailable().is_none() {
        let write = tool("qemu-io", &["-f", "raw", "-c", "write -P 0x11 0 4k", url]);
        assert!(
            !write.status.success(),
            "qemu-io wrote to a read-only export"
        );
        tool_ok("qemu-io", &["-r", "-f", "raw", "-c", "read 0 1M", url]);
    }
    drop(served);
    assert!(std::fs::read(&image).unwrap() == before, "the file changed");
}

/// The target half of a URL, `127.0.0.1:PORT/IQN/0`.
fn without_scheme(url: &str) -> &str {
    url.strip_prefix("iscsi://").expect("an iscsi:// URL")
}

#[test]
fn chap_logs_in_with_the_right_secret_and_refuses_a_wrong_one() {
    require!("iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("chap.secret");
    std::fs::write(&secret_file, "s3cret-s3cret-42\n").unwrap();
    let (served, _) = serve(
        dir.path(),
        16 * MIB,
        &[
            "--chap-user",
            "alice",
            "--chap-secret-file",
            path_str(&secret_file),
        ],
    );
    let target = without_scheme(served.iscsi_url());

    let right = format!("iscsi://alice%s3cret-s3cret-42@{target}");
    assert!(text(&tool_ok("iscsi-inq", &[&right]).stdout).contains("DIRECT_ACCESS"));
    for refused in [
        format!("iscsi://alice%s3cret-s3cret-43@{target}"),
        format!("iscsi://mallory%s3cret-s3cret-42@{target}"),
        format!("iscsi://{target}"),
    ] {
        let output = tool("iscsi-inq", &[&refused]);
        assert!(!output.status.success(), "{refused} logged in");
        assert!(
            text(&output.stderr).contains("Login Failed"),
            "{refused}: {}",
            text(&output.stderr)
        );
    }
}

#[test]
fn chap_secret_from_the_environment() {
    require!("iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "disk.img", 16 * MIB);
    let mut command = std::process::Command::new(blockwire_bin());
    command
        .env("BLOCKWIRE_CHAP_SECRET", "from-the-env-123")
        .args([
            "serve",
            path_str(&image),
            "--iscsi",
            "127.0.0.1:0",
            "--chap-user",
            "bob",
        ]);
    let served = Served::spawn_ready(command, "disk");
    let target = without_scheme(served.iscsi_url());
    tool_ok(
        "iscsi-inq",
        &[&format!("iscsi://bob%from-the-env-123@{target}")],
    );
    let wrong = tool(
        "iscsi-inq",
        &[&format!("iscsi://bob%from-the-env-124@{target}")],
    );
    assert!(!wrong.status.success(), "a wrong secret logged in");
}

#[test]
fn mutual_chap_authenticates_the_target_too() {
    require!("iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("chap.secret");
    let mutual_file = dir.path().join("mutual.secret");
    std::fs::write(&secret_file, "initiator-secret\n").unwrap();
    std::fs::write(&mutual_file, "target-secret-99\n").unwrap();
    let (served, _) = serve(
        dir.path(),
        16 * MIB,
        &[
            "--chap-user",
            "alice",
            "--chap-secret-file",
            path_str(&secret_file),
            "--mutual-chap-user",
            "blockwire",
            "--mutual-chap-secret-file",
            path_str(&mutual_file),
        ],
    );
    let target = without_scheme(served.iscsi_url());
    let credentials = "alice%initiator-secret";
    // libiscsi checks the target's answer when given target_user/target_password.
    let mutual = |user: &str, password: &str| {
        format!("iscsi://{credentials}@{target}?target_user={user}&target_password={password}")
    };
    tool_ok("iscsi-inq", &[&mutual("blockwire", "target-secret-99")]);
    let impostor = tool("iscsi-inq", &[&mutual("blockwire", "target-secret-98")]);
    assert!(
        !impostor.status.success(),
        "the initiator accepted a target that does not know the mutual secret"
    );
    assert!(
        text(&impostor.stderr).contains("CHAP_R"),
        "{}",
        text(&impostor.stderr)
    );
    let wrong = tool(
        "iscsi-inq",
        &[&format!("iscsi://alice%initiator-secreT@{target}")],
    );
    assert!(
        !wrong.status.success(),
        "a wrong initiator secret logged in"
    );
}

#[test]
fn a_config_file_serves_an_export_over_iscsi() {
    require!("iscsi-inq", "iscsi-readcapacity16");
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "cfg.img", 32 * MIB);
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[iscsi]\nlisten = [\"127.0.0.1:0\"]\niqn_prefix = \"iqn.2026-11.test.blockwire\"\n\n\
             [[export]]\nname = \"cfg\"\npath = \"{}\"\niscsi = true\n",
            path_str(&image)
        ),
    )
    .unwrap();
    let served = Served::start_config_ready(&config, "cfg");
    assert_eq!(served.iqn(), "iqn.2026-11.test.blockwire:cfg");
    assert!(served.iscsi_url().ends_with("/0"), "{}", served.iscsi_url());
    let capacity = text(&tool_ok("iscsi-readcapacity16", &[served.iscsi_url()]).stdout);
    assert_eq!(
        field(&capacity, "Total size:"),
        Some((32 * MIB).to_string().as_str())
    );
}
