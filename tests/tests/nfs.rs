//! `nfs://` end to end: nfs-ganesha (with its rpcbind, through blockwire-lab's
//! `NfsServer`) in a target namespace, our libnfs client and libnfs-utils'
//! `nfs-cat`/`nfs-cp` in the initiator namespace across a veth pair. What
//! `blockwire copy` writes, `nfs-cat` reads back, and the reverse; `blockwire
//! bench` measures a file there; `blockwire info` describes one; a missing libnfs,
//! an unreachable server, a refused export and a missing file each fail in one
//! line. Needs root; skipped
//! with a reason when ganesha, rpcbind, libnfs-utils or libnfs is missing.

use std::path::Path;
use std::process::{Command, Output};

use blockwire_lab::netns::{self, Channels, NamespacePair};
use blockwire_lab::nfs_server::{NfsServer, NfsServerConfig};
use blockwire_tests::{
    assert_success, blockwire_bin, path_str, patterned_file, require, require_root, text, MIB,
};

/// Whether the dynamic linker knows a libnfs (the client loads it at run time).
fn have_libnfs() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|out| text(&out.stdout).contains("libnfs.so.1"))
}

/// Returns from the test, saying why, unless everything it needs is here.
macro_rules! require_nfs {
    () => {
        require_root!();
        require!(
            "ganesha.nfsd",
            "rpcbind",
            "nfs-cat",
            "nfs-cp",
            "unshare",
            "nsenter"
        );
        if !have_libnfs() {
            eprintln!("skipped: libnfs is not installed (libnfs13)");
            return;
        }
    };
}

/// A ganesha serving a temporary directory in its own namespace pair.
struct Bed {
    // Dropped first: the server stops before its namespace goes.
    server: NfsServer,
    pair: NamespacePair,
    dir: tempfile::TempDir,
}

impl Bed {
    /// Namespaces `bwnf<PID><tag>t`/`...i` joined by one addressed veth channel.
    fn start(tag: char) -> Bed {
        let id = std::process::id() % 100_000;
        let channels = Channels {
            count: 1,
            mtu: 1500,
            rate_mbit: None,
            addressed: true,
        };
        let pair = NamespacePair::create(
            &format!("bwnf{id}{tag}t"),
            &format!("bwnf{id}{tag}i"),
            &channels,
        )
        .expect("build the namespace pair");
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::create_dir(dir.path().join("export")).unwrap();
        let config = NfsServerConfig {
            netns: Some(pair.target_ns().to_string()),
            listen: netns::target_addr(0).parse().unwrap(),
            export_dir: dir.path().join("export"),
            pseudo: "/blockwire".to_string(),
            state_dir: dir.path().join("ganesha"),
        };
        let server = NfsServer::start(&config).expect("start ganesha");
        Bed { server, pair, dir }
    }

    fn export(&self) -> std::path::PathBuf {
        self.dir.path().join("export")
    }

    /// Runs `program ARGS` in the initiator namespace.
    fn run(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
        netns::command_in(self.pair.initiator_ns(), program)
            .args(args)
            .output()
            .expect("run a command in the initiator namespace")
    }

    fn blockwire(&self, args: &[&str]) -> Output {
        self.run(blockwire_bin(), args)
    }
}

/// Asserts that `output` failed with one line on stderr holding every piece of
/// `wanted`; returns the line.
fn fails_in_one_line(output: &Output, wanted: &[&str]) -> String {
    assert!(
        !output.status.success(),
        "succeeded: {}",
        text(&output.stdout)
    );
    let stderr = text(&output.stderr);
    let line = stderr.trim();
    assert!(!line.contains('\n'), "more than one line:\n{stderr}");
    for piece in wanted {
        assert!(line.contains(piece), "'{piece}' missing from: {line}");
    }
    line.to_string()
}

#[test]
fn what_blockwire_copies_to_nfs_nfs_cat_reads_back() {
    require_nfs!();
    let bed = Bed::start('a');
    let local = patterned_file(bed.dir.path(), "local.bin", 3 * MIB as usize + 4096, 7);
    let url = bed.server.url("copied.img");
    assert_success(&bed.blockwire(&["copy", "--quiet", path_str(&local), &url]));
    let read = bed.run("nfs-cat", &[&url]);
    assert_success(&read);
    let expected = std::fs::read(&local).unwrap();
    assert!(read.stdout == expected, "nfs-cat read other bytes");
    // The server's file is the same too (the export is a directory here).
    assert!(std::fs::read(bed.export().join("copied.img")).unwrap() == expected);
}

#[test]
fn what_nfs_cp_writes_blockwire_copies_back() {
    require_nfs!();
    let bed = Bed::start('b');
    let local = patterned_file(bed.dir.path(), "local.bin", 2 * MIB as usize, 11);
    let url = bed.server.url("by-nfs-cp.img");
    assert_success(&bed.run("nfs-cp", &[path_str(&local), &url]));
    let back = bed.dir.path().join("back.bin");
    assert_success(&bed.blockwire(&["copy", "--quiet", &url, path_str(&back)]));
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&local).unwrap());
}

#[test]
fn bench_measures_a_file_on_nfs() {
    require_nfs!();
    let bed = Bed::start('c');
    // No file yet: --size creates it on the server, as for a local path.
    let url = bed.server.url("bench.img");
    let ganesha = bed.server.pids()[0].to_string();
    let output = bed.blockwire(&[
        "bench",
        &url,
        "--size",
        "64M",
        "--workload",
        "sequential,random",
        "--time",
        "0.5",
        "--random-depths",
        "4",
        "--target-pid",
        &ganesha,
    ]);
    assert_success(&output);
    let created = std::fs::metadata(bed.export().join("bench.img")).unwrap();
    assert_eq!(
        created.len(),
        64 * MIB,
        "--size made the file on the server"
    );
    let table = text(&output.stdout);
    for row in [
        "sequential  write",
        "sequential  read",
        "randread",
        "randwrite",
    ] {
        assert!(table.contains(row), "no '{row}' row:\n{table}");
    }
    let notes = text(&output.stderr);
    assert!(notes.contains("not a block device"), "{notes}");

    // On the server's own host (its namespace) the bench finds ganesha by its port.
    let here = netns::command_in(bed.pair.target_ns(), blockwire_bin())
        .args(["bench", &url, "--size", "16M", "--workload", "sequential"])
        .args(["--time", "0.3"])
        .output()
        .expect("run blockwire bench in the target namespace");
    assert_success(&here);
    let notes = text(&here.stderr);
    let found = format!("target CPU: process {ganesha} (ganesha.nfsd)");
    assert!(notes.contains(&found), "{notes}");
}

#[test]
fn info_describes_a_file_on_nfs() {
    require_nfs!();
    let bed = Bed::start('e');
    // 5 MiB and 512 bytes: a size no default would give.
    let size = 5 * MIB + 512;
    std::fs::File::create(bed.export().join("info.img"))
        .and_then(|f| f.set_len(size))
        .expect("make the file on the server");
    let url = bed.server.url("info.img");
    let output = bed.blockwire(&["info", &url]);
    assert_success(&output);
    let stdout = text(&output.stdout);
    for line in [
        format!("file: {url}"),
        format!("server: {}", netns::target_addr(0)),
        "export: /blockwire".to_string(),
        "path in export: /info.img".to_string(),
        "NFS version: 3".to_string(),
        format!("size: {size} (5.0M)"),
        "block sizes: minimum 512, preferred 4096".to_string(),
        "read-only: no".to_string(),
        "operations: read write flush".to_string(),
    ] {
        assert!(stdout.contains(&line), "no '{line}' in:\n{stdout}");
    }
    let json = bed.blockwire(&["info", "--json", &url]);
    assert_success(&json);
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(value["size"], size);
    assert_eq!(value["nfs_version"], 3);
    assert_eq!(value["read_only_by_server"], false);

    // A missing file is one line, and info creates nothing.
    let missing = bed.server.url("missing.img");
    let line = fails_in_one_line(
        &bed.blockwire(&["info", &missing]),
        &[&missing, "does not exist in export /blockwire"],
    );
    assert!(!line.contains("give a size"), "info takes no size: {line}");
    assert!(!bed.export().join("missing.img").exists());
}

#[test]
fn failures_are_one_line_each() {
    require_nfs!();
    let bed = Bed::start('d');
    let local = patterned_file(bed.dir.path(), "local.bin", MIB as usize, 3);
    let out = bed.dir.path().join("out.bin");

    // A file that does not exist, read without a size to create it with.
    let missing = bed.server.url("missing.img");
    fails_in_one_line(
        &bed.blockwire(&["copy", "--quiet", &missing, path_str(&out)]),
        &[
            &missing,
            "does not exist in export /blockwire",
            "give a size",
        ],
    );

    // An export the server does not have.
    let server = netns::target_addr(0);
    let nope = format!("nfs://{server}/nope/f.img");
    fails_in_one_line(
        &bed.blockwire(&["copy", "--quiet", path_str(&local), &nope]),
        &[&nope, "refused export /nope or has no such export"],
    );

    // No NFS server at the address: the initiator's own, where nothing listens.
    let nobody = format!("nfs://{}/blockwire/f.img", netns::initiator_addr(0));
    fails_in_one_line(
        &bed.blockwire(&["copy", "--quiet", path_str(&local), &nobody]),
        &[&nobody, "cannot reach NFS server", "Connection refused"],
    );

    // No libnfs: the library hidden behind /dev/null in a private mount namespace.
    let library = Path::new("/usr/lib/x86_64-linux-gnu/libnfs.so.13");
    if library.exists() {
        let script = format!(
            "mount --bind /dev/null {} && exec \"$0\" \"$@\"",
            library.display()
        );
        let url = bed.server.url("f.img");
        let output = bed.run(
            "unshare",
            &[
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
                path_str(&blockwire_bin()),
                "copy",
                "--quiet",
                path_str(&local),
                &url,
            ],
        );
        fails_in_one_line(&output, &[&url, "libnfs not found (install libnfs13)"]);
    } else {
        eprintln!(
            "libnfs is not at {}: its absence is not tried",
            library.display()
        );
    }
}
