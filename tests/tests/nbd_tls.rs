//! NBD over TLS (NBD_OPT_STARTTLS): our target against libnbd (nbdinfo, nbdcopy) and
//! QEMU (qemu-img, qemu-io with `tls-creds-psk` and `tls-creds-x509`), our initiator
//! against nbdkit and qemu-nbd, a plain client against `--tls require`, and wrong
//! keys and untrusted certificates refused with one log line.
//!
//! Keys and certificates are made in each test's temporary directory (openssl), never
//! committed. A test whose peer program is missing is skipped with a message.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::conformance;
use blockwire_blockdev::Device;
use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
use blockwire_nbd::tls::InitiatorTlsSettings;
use blockwire_nbd::wire::*;
use blockwire_tests::{
    blockwire_bin, free_port, nbdkit, path_str, patterned_file, require, run, sparse_file, text,
    Served, MIB,
};

// ---------------------------------------------------------------------------------
// Credentials

/// A PSK file with one random 32-byte key for `user` (psktool's format).
fn psk_file(dir: &Path, name: &str, user: &str) -> PathBuf {
    let key = text(&run("openssl", &["rand", "-hex", "32"]).stdout);
    let path = dir.join(name);
    std::fs::write(&path, format!("{user}:{}\n", key.trim())).unwrap();
    path
}

/// The URI libnbd's tools take for export `name` on `port`, with alice's key in `keys`.
fn nbds_uri(port: u16, name: &str, keys: &Path) -> String {
    format!(
        "nbds://alice@127.0.0.1:{port}/{name}?tls-psk-file={}",
        keys.display()
    )
}

/// Serves `disk` as `name`, requiring TLS with the keys in `keys`.
fn served_with_psk(disk: &Path, name: &str, keys: &Path) -> Served {
    Served::start(
        &[
            path_str(disk),
            "--name",
            name,
            "--tls",
            "require",
            "--tls-psk",
            path_str(keys),
        ],
        name,
    )
}

/// A certificate authority in `dir` (ca-cert.pem, ca-key.pem).
fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            path_str(&dir.join("ca-key.pem")),
            "-out",
            path_str(&dir.join("ca-cert.pem")),
        ],
    );
}

/// `ROLE-cert.pem` and `ROLE-key.pem` in `out`, signed by the CA in `ca`, plus a
/// copy of that CA's certificate as `out/ca-cert.pem`: qemu's and nbdkit's layout.
/// QEMU insists on keyEncipherment in the key usage.
fn issue(ca: &Path, out: &Path, role: &str, extensions: &str) {
    std::fs::create_dir_all(out).unwrap();
    let key = out.join(format!("{role}-key.pem"));
    let csr = out.join(format!("{role}.csr"));
    let ext = out.join(format!("{role}.ext"));
    run(
        "openssl",
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={role}"),
            "-keyout",
            path_str(&key),
            "-out",
            path_str(&csr),
        ],
    );
    std::fs::write(
        &ext,
        format!(
            "keyUsage=critical,digitalSignature,keyEncipherment\n\
             basicConstraints=critical,CA:FALSE\n{extensions}\n"
        ),
    )
    .unwrap();
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            path_str(&csr),
            "-CA",
            path_str(&ca.join("ca-cert.pem")),
            "-CAkey",
            path_str(&ca.join("ca-key.pem")),
            "-CAcreateserial",
            "-extfile",
            path_str(&ext),
            "-out",
            path_str(&out.join(format!("{role}-cert.pem"))),
        ],
    );
    std::fs::copy(ca.join("ca-cert.pem"), out.join("ca-cert.pem")).unwrap();
}

/// A CA, a server directory (for 127.0.0.1 and localhost) and a client directory
/// under `dir`; returns (server dir, client dir).
fn certificates(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = dir.join("ca");
    make_ca(&ca, "blockwire test CA");
    let (server, client) = (dir.join("server"), dir.join("client"));
    issue(
        &ca,
        &server,
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
    );
    issue(&ca, &client, "client", "extendedKeyUsage=clientAuth");
    (server, client)
}

// ---------------------------------------------------------------------------------
// Our target

/// A `blockwire serve` whose log (stderr) goes to a file, for tests that read it.
struct Logged {
    served: Served,
    log: PathBuf,
}

impl Logged {
    fn start(dir: &Path, args: &[&str], name: &str) -> Logged {
        let log = dir.join(format!("{name}.log"));
        // exec: the shell becomes blockwire, so Served stops the server itself.
        let mut script = format!("exec '{}' serve", blockwire_bin().display());
        for arg in args.iter().chain(&["--listen", "127.0.0.1:0"]) {
            script.push_str(&format!(" '{arg}'"));
        }
        script.push_str(&format!(" 2>'{}'", log.display()));
        let mut command = Command::new("sh");
        command.args(["-c", &script]);
        let served = Served::spawn_ready(command, name);
        Logged { served, log }
    }

    fn port(&self) -> u16 {
        self.served.port
    }

    /// The log's lines so far, without colour codes.
    fn lines(&self) -> Vec<String> {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        strip_ansi(&raw).lines().map(str::to_string).collect()
    }

    /// Waits until a log line contains `needle`; returns every line that does.
    fn wait_for(&self, needle: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<String> = self
                .lines()
                .into_iter()
                .filter(|l| l.contains(needle))
                .collect();
            if !found.is_empty() || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn run_unchecked(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn assert_same_file(actual: &Path, expected: &Path) {
    let (a, e) = (
        std::fs::read(actual).unwrap(),
        std::fs::read(expected).unwrap(),
    );
    assert_eq!(a.len(), e.len(), "{} length", actual.display());
    if let Some(at) = a.iter().zip(&e).position(|(x, y)| x != y) {
        panic!("{} differs at byte {at}", actual.display());
    }
}

#[test]
fn nbdinfo_and_nbdcopy_over_a_pre_shared_key() {
    require!("openssl", "nbdinfo", "nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let disk = sparse_file(dir.path(), "disk.img", 32 * MIB);
    let src = patterned_file(dir.path(), "src.img", (32 * MIB) as usize, 11);
    let served = served_with_psk(&disk, "disk", &keys);
    let uri = nbds_uri(served.port, "disk", &keys);
    let info = text(&run("nbdinfo", &[&uri]).stdout);
    assert!(info.contains("with TLS"), "{info}");
    assert!(
        info.contains(&format!("export-size: {}", 32 * MIB)),
        "{info}"
    );
    // Several connections, with many requests in flight on each.
    run(
        "nbdcopy",
        &["--connections=4", "--requests=16", path_str(&src), &uri],
    );
    let back = dir.path().join("back.img");
    run("nbdcopy", &[&uri, path_str(&back)]);
    assert_same_file(&back, &src);
    drop(served);
    assert_same_file(&disk, &src);
}

#[test]
fn nbdinfo_and_nbdcopy_over_certificates_with_client_verification() {
    require!("openssl", "nbdinfo", "nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (server_dir, client_dir) = certificates(dir.path());
    let disk = sparse_file(dir.path(), "disk.img", 16 * MIB);
    let src = patterned_file(dir.path(), "src.img", (16 * MIB) as usize, 5);
    let served = Served::start(
        &[
            path_str(&disk),
            "--name",
            "disk",
            "--tls",
            "require",
            "--tls-certificates",
            path_str(&server_dir),
            "--tls-verify-peer",
        ],
        "disk",
    );
    let uri = format!(
        "nbds://127.0.0.1:{}/disk?tls-certificates={}",
        served.port,
        client_dir.display()
    );
    let size = text(&run("nbdinfo", &["--size", &uri]).stdout);
    assert_eq!(size.trim(), (16 * MIB).to_string());
    run("nbdcopy", &[path_str(&src), &uri]);
    let back = dir.path().join("back.img");
    run("nbdcopy", &[&uri, path_str(&back)]);
    assert_same_file(&back, &src);
}

/// qemu-io's arguments for an NBD export at `port` through the TLS object `object`.
fn qemu_args<'a>(object: &'a str, image: &'a str, commands: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--object", object, "--image-opts", image];
    for command in commands {
        args.extend(["-c", command]);
    }
    args
}

/// qemu-io's output says it read the 2 MiB it was asked to (with the pattern), and
/// qemu-img sees the 8 MiB export through the same credentials.
fn assert_qemu_read_and_size(qemu_io: &Output, object: &str, image: &str) {
    assert!(
        text(&qemu_io.stdout).contains("read 2097152/2097152"),
        "{}",
        text(&qemu_io.stdout)
    );
    let info = text(
        &run(
            "qemu-img",
            &["info", "--object", object, "--image-opts", image],
        )
        .stdout,
    );
    assert!(info.contains("8 MiB (8388608 bytes)"), "{info}");
}

#[test]
fn qemu_with_tls_creds_psk_and_tls_creds_x509() {
    require!("openssl", "qemu-io", "qemu-img");
    let dir = tempfile::tempdir().unwrap();
    // QEMU reads a PSK directory's keys.psk.
    let psk_dir = dir.path().join("psk");
    std::fs::create_dir(&psk_dir).unwrap();
    let keys = psk_file(&psk_dir, "keys.psk", "alice");
    let (server_dir, client_dir) = certificates(dir.path());
    let disk = sparse_file(dir.path(), "disk.img", 8 * MIB);

    let with_psk = served_with_psk(&disk, "disk", &keys);
    let object = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        psk_dir.display()
    );
    let image = format!(
        "driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0",
        with_psk.port
    );
    let out = run(
        "qemu-io",
        &qemu_args(
            &object,
            &image,
            &["write -P 0x5a 1M 2M", "read -P 0x5a 1M 2M"],
        ),
    );
    assert_qemu_read_and_size(&out, &object, &image);
    drop(with_psk);

    let with_x509 = Served::start(
        &[
            path_str(&disk),
            "--name",
            "disk",
            "--tls",
            "require",
            "--tls-certificates",
            path_str(&server_dir),
            "--tls-verify-peer",
        ],
        "disk",
    );
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        client_dir.display()
    );
    let image = format!(
        "driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0",
        with_x509.port
    );
    // What went in over PSK comes out over X.509, and a pattern that is not there
    // is not found.
    let out = run(
        "qemu-io",
        &qemu_args(&object, &image, &["read -P 0x5a 1M 2M"]),
    );
    assert_qemu_read_and_size(&out, &object, &image);
    let wrong = run_unchecked(
        "qemu-io",
        &qemu_args(&object, &image, &["read -P 0x77 1M 4K"]),
    );
    assert!(
        text(&wrong.stdout).contains("Pattern verification failed"),
        "{}",
        text(&wrong.stdout)
    );
}

/// Connects in plain text, reads the greeting and sends the client flags.
fn plain_handshake(port: u16) -> TcpStream {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut greeting = [0u8; GREETING_LEN];
    socket.read_exact(&mut greeting).unwrap();
    let flags = decode_greeting(&greeting).unwrap();
    assert_ne!(flags & NBD_FLAG_FIXED_NEWSTYLE, 0);
    socket
        .write_all(&(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    socket
}

/// Sends `option` and returns the reply types up to and including the first that
/// is not NBD_REP_SERVER / NBD_REP_INFO, and every payload byte seen.
fn ask(socket: &mut TcpStream, option: ClientOption) -> (Vec<u32>, Vec<u8>) {
    let mut out = Vec::new();
    option.encode(&mut out);
    socket.write_all(&out).unwrap();
    let (mut replies, mut payloads) = (Vec::new(), Vec::new());
    loop {
        let mut header = [0u8; OPTION_REPLY_HEADER_LEN];
        socket.read_exact(&mut header).unwrap();
        let header = OptionReplyHeader::decode(&header).unwrap();
        let mut payload = vec![0u8; header.len as usize];
        socket.read_exact(&mut payload).unwrap();
        replies.push(header.reply);
        payloads.extend(payload);
        if header.reply != NBD_REP_SERVER && header.reply != NBD_REP_INFO {
            return (replies, payloads);
        }
    }
}

#[test]
fn a_client_without_tls_gets_tls_reqd_and_no_data() {
    require!("openssl");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let disk = patterned_file(dir.path(), "secret.img", MIB as usize, 9);
    let served = Served::start(
        &[
            path_str(&disk),
            "--name",
            "secret",
            "--description",
            "classified",
            "--tls",
            "require",
            "--tls-psk",
            path_str(&keys),
        ],
        "secret",
    );
    let mut socket = plain_handshake(served.port);
    let go = ClientOption::Go {
        name: "secret".into(),
        requests: vec![NBD_INFO_NAME, NBD_INFO_DESCRIPTION],
    };
    for option in [
        ClientOption::List,
        ClientOption::Info {
            name: "secret".into(),
            requests: vec![NBD_INFO_DESCRIPTION],
        },
        ClientOption::StructuredReply,
        go,
    ] {
        let name = format!("{option:?}");
        let (replies, payload) = ask(&mut socket, option);
        assert_eq!(replies, [NBD_REP_ERR_TLS_REQD], "{name}");
        // Not even the export's name or description leaks.
        let payload = String::from_utf8_lossy(&payload);
        assert!(
            !payload.contains("secret") && !payload.contains("classified"),
            "{payload}"
        );
    }
    // NBD_OPT_EXPORT_NAME has no error reply: the connection closes, with no data.
    let mut out = Vec::new();
    ClientOption::ExportName("secret".into()).encode(&mut out);
    socket.write_all(&out).unwrap();
    let mut rest = Vec::new();
    let _ = socket.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "{} bytes after NBD_OPT_EXPORT_NAME",
        rest.len()
    );

    // libnbd without TLS gets nothing either.
    if blockwire_tests::have("nbdinfo") {
        let plain = run_unchecked(
            "nbdinfo",
            &[&format!("nbd://127.0.0.1:{}/secret", served.port)],
        );
        assert!(!plain.status.success(), "{}", text(&plain.stdout));
        assert!(
            !text(&plain.stdout).contains("export-size"),
            "{}",
            text(&plain.stdout)
        );
    }
}

#[test]
fn tls_on_serves_plain_and_tls_clients_alike() {
    require!("openssl", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let served = Served::start(
        &[
            "--name",
            "demo",
            "--tls",
            "on",
            "--tls-psk",
            path_str(&keys),
        ],
        "demo",
    );
    let plain = text(
        &run(
            "nbdinfo",
            &[&format!("nbd://127.0.0.1:{}/demo", served.port)],
        )
        .stdout,
    );
    assert!(plain.contains("without TLS"), "{plain}");
    let secure = nbds_uri(served.port, "demo", &keys);
    let secure = text(&run("nbdinfo", &[&secure]).stdout);
    assert!(secure.contains("with TLS"), "{secure}");
}

#[test]
fn a_wrong_key_or_an_untrusted_certificate_is_refused_with_one_log_line() {
    require!("openssl", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let wrong = psk_file(dir.path(), "wrong.psk", "alice");
    let served = Logged::start(
        dir.path(),
        &[
            "--name",
            "demo",
            "--tls",
            "require",
            "--tls-psk",
            path_str(&keys),
        ],
        "psk",
    );
    let uri = nbds_uri(served.port(), "demo", &wrong);
    let refused = run_unchecked("nbdinfo", &["--size", &uri]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stdout).trim().is_empty(),
        "{}",
        text(&refused.stdout)
    );
    let failures = served.wait_for("TLS handshake failed");
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert!(
        failures[0].contains("PSK identity 'alice'"),
        "{}",
        failures[0]
    );
    assert!(
        failures[0].contains("127.0.0.1"),
        "no peer in: {}",
        failures[0]
    );
    drop(served);

    // A client certificate from another CA.
    let (server_dir, _) = certificates(dir.path());
    let other_ca = dir.path().join("other-ca");
    make_ca(&other_ca, "somebody else's CA");
    let stranger = dir.path().join("stranger");
    issue(
        &other_ca,
        &stranger,
        "client",
        "extendedKeyUsage=clientAuth",
    );
    // It trusts our server, so only its own certificate is in question.
    std::fs::copy(server_dir.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();
    let served = Logged::start(
        dir.path(),
        &[
            "--name",
            "demo",
            "--tls",
            "require",
            "--tls-certificates",
            path_str(&server_dir),
            "--tls-verify-peer",
        ],
        "x509",
    );
    let uri = format!(
        "nbds://127.0.0.1:{}/demo?tls-certificates={}",
        served.port(),
        stranger.display()
    );
    let refused = run_unchecked("nbdinfo", &["--size", &uri]);
    assert!(!refused.status.success());
    let failures = served.wait_for("TLS handshake failed");
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert!(failures[0].contains("certificate"), "{}", failures[0]);
}

#[test]
fn tls_settings_come_from_the_config_file_and_bad_files_are_named() {
    require!("openssl", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let config = dir.path().join("blockwire.toml");
    let write_config = |psk: &Path| {
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = [\"127.0.0.1:0\"]\ntls = \"require\"\ntls_psk = \"{}\"\n\
                 [[export]]\nname = \"a\"\nmemory = \"4M\"\n",
                psk.display()
            ),
        )
        .unwrap()
    };
    write_config(&keys);
    let served = Served::start_config(&config, "a");
    let uri = nbds_uri(served.port, "a", &keys);
    assert_eq!(
        text(&run("nbdinfo", &["--size", &uri]).stdout).trim(),
        (4 * MIB).to_string()
    );
    let plain = run_unchecked("nbdinfo", &[&format!("nbd://127.0.0.1:{}/a", served.port)]);
    assert!(!plain.status.success());
    drop(served);

    // A broken key file stops the start with one line that names it.
    let broken = dir.path().join("broken.psk");
    std::fs::write(&broken, "alice:not-hex\n").unwrap();
    write_config(&broken);
    let out = Command::new(blockwire_bin())
        .args(["serve", "--config", path_str(&config)])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = strip_ansi(&text(&out.stderr));
    let line = stderr
        .lines()
        .find(|l| l.contains("broken.psk"))
        .unwrap_or_else(|| panic!("no line names the file:\n{stderr}"));
    assert!(line.contains("line 1"), "{line}");
    // And a certificate directory without the server's key.
    let empty = dir.path().join("empty-certs");
    std::fs::create_dir(&empty).unwrap();
    let out = Command::new(blockwire_bin())
        .args([
            "serve",
            "--tls",
            "on",
            "--tls-certificates",
            path_str(&empty),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = strip_ansi(&text(&out.stderr));
    assert!(stderr.contains("server-cert.pem"), "{stderr}");
}

// ---------------------------------------------------------------------------------
// Our initiator

fn psk_uri(port: u16, keys: &Path) -> NbdUri {
    NbdUri::tcp("127.0.0.1", port, "").with_tls(InitiatorTlsSettings {
        psk_file: Some(keys.to_path_buf()),
        username: Some("alice".into()),
        ..InitiatorTlsSettings::default()
    })
}

/// Connects once the peer listens (it may still be starting up).
fn connect_when_up(uri: &NbdUri, options: ClientOptions) -> NbdClient {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match NbdClient::connect(uri, options) {
            Ok(client) => return client,
            Err(e) if Instant::now() < deadline && e.to_string().contains("cannot connect") => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("cannot connect to {uri}: {e}"),
        }
    }
}

/// A peer server process, killed and reaped when dropped.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn our_initiator_against_nbdkit_with_a_pre_shared_key() {
    require!("openssl", "nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let port = free_port();
    let tls = format!("--tls-psk={}", keys.display());
    let _peer = Peer(
        nbdkit(port, false, &["--tls=require", &tls, "memory", "64M"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let uri = psk_uri(port, &keys);
    let options = ClientOptions {
        connections: 2,
        ..ClientOptions::default()
    };
    let client = connect_when_up(&uri, options);
    assert_eq!(client.details().size, 64 * MIB);
    conformance::run_all(&Device::new(Arc::new(client)));

    // The wrong key is refused, and says so.
    let wrong = psk_file(dir.path(), "wrong.psk", "alice");
    let err = NbdClient::connect(&psk_uri(port, &wrong), ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    // Plain text is refused with NBD_REP_ERR_TLS_REQD.
    let err = NbdClient::connect(
        &NbdUri::tcp("127.0.0.1", port, ""),
        ClientOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("NBD_REP_ERR_TLS_REQD"), "{err}");
}

#[test]
fn our_initiator_against_qemu_nbd_with_certificates() {
    require!("openssl", "qemu-nbd");
    let dir = tempfile::tempdir().unwrap();
    let (server_dir, client_dir) = certificates(dir.path());
    let disk = sparse_file(dir.path(), "disk.img", 32 * MIB);
    let port = free_port();
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=server,dir={},verify-peer=on",
        server_dir.display()
    );
    let _peer = Peer(
        Command::new("qemu-nbd")
            .args([
                "--format=raw",
                "--bind=127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args([
                "--object",
                &object,
                "--tls-creds=tls0",
                "--export-name=disk",
                "--persistent",
            ])
            .arg(&disk)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let uri = NbdUri::tcp("127.0.0.1", port, "disk").with_tls(InitiatorTlsSettings {
        certificates: Some(client_dir.clone()),
        ..InitiatorTlsSettings::default()
    });
    let client = connect_when_up(&uri, ClientOptions::default());
    let device = Device::new(Arc::new(client));
    conformance::write_read_verify(&device);
    drop(device);

    // The server's certificate must name the host: as "localhost" it passes, as
    // another name it is refused.
    let named = |host: &str| {
        NbdUri::tcp("127.0.0.1", port, "disk").with_tls(InitiatorTlsSettings {
            certificates: Some(client_dir.clone()),
            hostname: Some(host.into()),
            ..InitiatorTlsSettings::default()
        })
    };
    NbdClient::connect(&named("localhost"), ClientOptions::default()).unwrap();
    let err = NbdClient::connect(&named("disk.example"), ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[test]
fn blockwire_copy_over_nbds_to_our_own_target() {
    require!("openssl");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let disk = sparse_file(dir.path(), "disk.img", 24 * MIB);
    let src = patterned_file(dir.path(), "src.img", (24 * MIB) as usize, 3);
    let served = served_with_psk(&disk, "disk", &keys);
    let uri = nbds_uri(served.port, "disk", &keys);
    // The copy's request queue keeps many writes in flight over several connections.
    let out = run(
        path_str(&blockwire_bin()),
        &[
            "copy",
            path_str(&src),
            &uri,
            "--verify",
            "--quiet",
            "--connections",
            "2",
            "--request-size",
            "64K",
        ],
    );
    assert!(
        text(&out.stdout).contains("matches"),
        "{}",
        text(&out.stdout)
    );
    drop(served);
    assert_same_file(&disk, &src);
}

#[test]
fn nbds_unix_with_nbdinfo_and_our_initiator() {
    require!("openssl", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let socket = dir.path().join("nbd.sock");
    let _served = Served::start(
        &[
            "--name",
            "demo",
            "--socket",
            path_str(&socket),
            "--tls",
            "require",
            "--tls-psk",
            path_str(&keys),
        ],
        "demo",
    );
    let uri = format!(
        "nbds+unix://alice@/demo?socket={}&tls-psk-file={}",
        socket.display(),
        keys.display()
    );
    let info = text(&run("nbdinfo", &[&uri]).stdout);
    assert!(info.contains("with TLS"), "{info}");
    let client = NbdClient::connect(&uri.parse().unwrap(), ClientOptions::default()).unwrap();
    let device = Device::new(Arc::new(client));
    conformance::write_read_verify(&device);
}

#[test]
fn a_copy_over_nbds_rides_out_a_target_restart() {
    require!("openssl");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let image = sparse_file(dir.path(), "restart.img", 128 * MIB);
    let source = patterned_file(dir.path(), "source.img", (128 * MIB) as usize, 8);
    let port = free_port();
    let serve = || {
        let mut command = Command::new(blockwire_bin());
        command
            .arg("serve")
            .arg(&image)
            .args([
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--name",
                "restart",
            ])
            .args(["--tls", "require", "--tls-psk", path_str(&keys)]);
        Served::spawn_ready(command, "restart")
    };
    let served = serve();
    let uri = format!(
        "nbds://alice@127.0.0.1:{port}/restart?tls-psk-file={}",
        keys.display()
    );
    // Every reconnect runs a new TLS handshake.
    let copy = blockwire_tests::copy_in_background(&source, &uri, &["--connections", "2"]);
    std::thread::sleep(Duration::from_millis(400));
    assert!(!copy.is_finished(), "the copy ended before the kill");
    served.kill_hard();
    std::thread::sleep(Duration::from_millis(300));
    let served = serve();
    let output = copy.join().unwrap();
    let stderr = strip_ansi(&text(&output.stderr));
    assert!(output.status.success(), "the copy failed: {stderr}");
    assert!(stderr.contains("reconnected after"), "{stderr}");
    drop(served);
    assert_same_file(&image, &source);
}

#[test]
fn garbage_instead_of_a_tls_handshake_closes_only_that_connection() {
    require!("openssl", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let served = Logged::start(
        dir.path(),
        &[
            "--name",
            "demo",
            "--tls",
            "require",
            "--tls-psk",
            path_str(&keys),
        ],
        "garbage",
    );
    let mut socket = plain_handshake(served.port());
    let (replies, _) = ask(&mut socket, ClientOption::StartTls);
    assert_eq!(replies, [NBD_REP_ACK]);
    // An NBD option where a TLS ClientHello belongs.
    let mut out = Vec::new();
    ClientOption::List.encode(&mut out);
    out.extend([0xffu8; 64]);
    socket.write_all(&out).unwrap();
    let mut rest = Vec::new();
    let _ = socket.read_to_end(&mut rest);
    // At most a TLS alert comes back (content type 21), never NBD data.
    assert!(rest.is_empty() || rest[0] == 21, "{rest:?}");
    assert_eq!(served.wait_for("TLS handshake failed").len(), 1);
    // The server carries on.
    let uri = nbds_uri(served.port(), "demo", &keys);
    assert!(text(&run("nbdinfo", &[&uri]).stdout).contains("with TLS"));
}

#[test]
fn our_initiator_asking_for_tls_from_a_plain_server_is_refused_with_the_reason() {
    require!("openssl");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let served = Served::start(&["--name", "demo"], "demo");
    let err = NbdClient::connect(&psk_uri(served.port, &keys), ClientOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("NBD_OPT_STARTTLS") && err.contains("NBD_REP_ERR_UNSUP"),
        "{err}"
    );
}

#[test]
fn keys_and_certificates_together_with_client_verification() {
    require!("openssl", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let keys = psk_file(dir.path(), "keys.psk", "alice");
    let (server_dir, client_dir) = certificates(dir.path());
    let served = Served::start(
        &[
            "--name",
            "demo",
            "--tls",
            "require",
            "--tls-psk",
            path_str(&keys),
            "--tls-certificates",
            path_str(&server_dir),
            "--tls-verify-peer",
        ],
        "demo",
    );
    // A key authenticates its client as a certificate does.
    let with_key = nbds_uri(served.port, "demo", &keys);
    let with_certificate = format!(
        "nbds://127.0.0.1:{}/demo?tls-certificates={}",
        served.port,
        client_dir.display()
    );
    for uri in [&with_key, &with_certificate] {
        let size = text(&run("nbdinfo", &["--size", uri]).stdout);
        assert_eq!(size.trim(), "1073741824", "{uri}");
    }
    // Neither: the server's certificate is trusted, but the client shows nothing.
    let anonymous = dir.path().join("anonymous");
    std::fs::create_dir(&anonymous).unwrap();
    std::fs::copy(
        client_dir.join("ca-cert.pem"),
        anonymous.join("ca-cert.pem"),
    )
    .unwrap();
    let uri = format!(
        "nbds://127.0.0.1:{}/demo?tls-certificates={}",
        served.port,
        anonymous.display()
    );
    assert!(!run_unchecked("nbdinfo", &["--size", &uri]).status.success());
}
