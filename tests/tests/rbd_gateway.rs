//! blockwire as a gateway to Ceph: one `rbd:` image served over NBD and iSCSI at
//! once, checked with peer programs (nbdinfo, nbdcopy, qemu-io, libiscsi's tools)
//! and with Ceph's own `rbd` tool on the other side: what blockwire writes is what
//! `rbd export` reads, what `rbd import` wrote reads back equal through blockwire, a
//! trim and a write-zeroes of whole objects show in `rbd diff`, a snapshot refuses
//! writes, and a missing image or a wrong key is one line naming it.

use std::process::Command;

use blockwire_tests::ceph::Cluster;
use blockwire_tests::iscsi::tool;
use blockwire_tests::{
    blockwire_bin, have, path_str, patterned_file, require, require_ceph, run_bounded,
    run_bounded_ok, text, Served, MIB,
};

const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

fn ok(program: &str, args: &[&str]) -> String {
    run_bounded_ok(program, args, LIMIT)
}

#[test]
fn an_rbd_image_served_over_nbd_and_iscsi_matches_what_ceph_reads() {
    require_ceph!();
    require!("nbdinfo", "nbdcopy", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start();
    cluster.create_image("gw", 16 * MIB);
    let spec = cluster.spec("gw");
    {
        let served = Served::start_iscsi(&[&spec, "--listen", "127.0.0.1:0"], "gw");
        let uri = served.uri();

        // What NBD clients learn: size, and the object size as the preferred block.
        let info = ok("nbdinfo", &["--json", &uri]);
        let info: serde_json::Value = serde_json::from_str(&info).unwrap();
        let export = &info["exports"][0];
        assert_eq!(export["export-size"], 16 * MIB, "{info}");
        assert_eq!(export["block_size_preferred"], 4 * MIB, "{info}");
        assert_eq!(export["can_flush"], true, "{info}");

        // Written through blockwire, read by Ceph's own tool.
        let source = patterned_file(dir.path(), "source.bin", 16 * MIB as usize, 3);
        ok("nbdcopy", &["--flush", path_str(&source), &uri]);
        let exported = dir.path().join("exported.bin");
        cluster.rbd_ok(&["export", "rbd/gw", path_str(&exported)]);
        assert!(
            std::fs::read(&exported).unwrap() == std::fs::read(&source).unwrap(),
            "rbd export differs from what was written over NBD"
        );

        // iSCSI on the same export sees the same image.
        if have("iscsi-readcapacity16") {
            let capacity = text(&tool("iscsi-readcapacity16", &[served.iscsi_url()]).stdout);
            assert!(
                capacity.contains(&format!("Total size:{}", 16 * MIB)),
                "{capacity}"
            );
        } else {
            eprintln!("iSCSI part skipped: iscsi-readcapacity16 is not installed");
        }

        // A 4 MiB trim and a 4 MiB write-zeroes (whole objects) leave `rbd diff`
        // and read back as zeroes; the objects around them keep their data.
        let io = ok(
            "qemu-io",
            &[
                "-f",
                "raw",
                &uri,
                "-c",
                "discard 4M 4M",
                "-c",
                "write -z 8M 4M",
                "-c",
                "flush",
                "-c",
                "read -P 0 4M 8M",
            ],
        );
        assert!(!io.contains("Pattern verification failed"), "{io}");
        let diff = text(&cluster.rbd_ok(&["diff", "rbd/gw"]).stdout);
        let starts: Vec<&str> = diff
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(
            starts,
            ["0", "12582912"],
            "rbd diff after trim and zero:\n{diff}"
        );
    }

    // Imported by Ceph, read back equal through blockwire (`copy rbd:`).
    let imported = patterned_file(dir.path(), "imported.bin", 8 * MIB as usize, 9);
    cluster.rbd_ok(&["import", path_str(&imported), "rbd/imported"]);
    let copied = dir.path().join("copied.bin");
    ok(
        path_str(&blockwire_bin()),
        &["copy", &cluster.spec("imported"), path_str(&copied)],
    );
    assert!(
        std::fs::read(&copied).unwrap() == std::fs::read(&imported).unwrap(),
        "an rbd-imported image reads back different through blockwire"
    );

    // A snapshot is served read-only and refuses writes.
    cluster.rbd_ok(&["snap", "create", "rbd/gw@frozen"]);
    {
        let snap_spec = cluster.spec("gw@frozen");
        let served = Served::start(&[&snap_spec], "gw");
        let info = ok("nbdinfo", &["--json", &served.uri()]);
        assert!(info.contains("\"is_read_only\": true"), "{info}");
        let mut write = Command::new("qemu-io");
        write.args(["-f", "raw", &served.uri(), "-c", "write -P 7 0 4k"]);
        let refused = run_bounded(write, LIMIT);
        let said = format!("{}{}", text(&refused.stdout), text(&refused.stderr));
        assert!(
            !refused.status.success() || said.contains("failed"),
            "a write to a snapshot export succeeded: {said}"
        );
    }

    // --exclusive: the first gateway keeps the lock; a second one fails in one line.
    {
        let _first = Served::start(&[&spec, "--exclusive"], "gw");
        let mut second = Command::new(blockwire_bin());
        second.args(["serve", &spec, "--exclusive", "--listen", "127.0.0.1:0"]);
        let refused = run_bounded(second, LIMIT);
        let said = text(&refused.stderr);
        assert!(
            !refused.status.success(),
            "a second exclusive gateway started"
        );
        assert!(said.contains("exclusive lock"), "{said}");
        assert_eq!(said.trim().lines().count(), 1, "{said}");
    }
    // A gateway that stops gives back its lock and its watch at once, so the next
    // writer (a restarted gateway) does not wait for the cluster to time them out.
    let locks = cluster.rbd_ok(&["lock", "ls", "rbd/gw"]);
    assert!(
        text(&locks.stdout).trim().is_empty(),
        "a stopped gateway left its lock: {}",
        text(&locks.stdout)
    );
    let status = cluster.rbd_ok(&["status", "rbd/gw"]);
    assert!(
        text(&status.stdout).contains("Watchers: none"),
        "a stopped gateway left its watch: {}",
        text(&status.stdout)
    );

    // A config file's export names the image as its path and how to reach the
    // cluster in its `rbd` table: here a user of its own, whose key is only in the
    // keyring the table names (the conf names the admin's), so the export opens
    // only if `id` and `keyring` are both honoured. Read-only there too.
    {
        let keyring = dir.path().join("gateway.keyring");
        let key = cluster.ceph_ok(&[
            "auth",
            "get-or-create",
            "client.gateway",
            "mon",
            "profile rbd",
            "osd",
            "profile rbd pool=rbd",
        ]);
        std::fs::write(&keyring, &key.stdout).unwrap();
        let config = dir.path().join("rbd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = [\"127.0.0.1:0\"]\n\
                 [[export]]\nname = \"vm\"\npath = \"rbd:rbd/imported\"\nread_only = true\n\
                 rbd = {{ id = \"gateway\", conf = \"{}\", keyring = \"{}\", timeout = 20 }}\n",
                path_str(&cluster.conf()),
                path_str(&keyring),
            ),
        )
        .unwrap();
        let served = Served::start_config(&config, "vm");
        let info = ok("nbdinfo", &["--json", &served.uri()]);
        assert!(
            info.contains(&format!("\"export-size\": {}", 8 * MIB)),
            "{info}"
        );
        assert!(info.contains("\"is_read_only\": true"), "{info}");
        let read = dir.path().join("read.bin");
        ok("nbdcopy", &[&served.uri(), path_str(&read)]);
        assert!(
            std::fs::read(&read).unwrap() == std::fs::read(&imported).unwrap(),
            "the config file's rbd export reads back different"
        );
    }

    // A missing image and a wrong key: one line naming what is wrong.
    let mut info = Command::new(blockwire_bin());
    info.args(["info", &cluster.spec("nosuchimage")]);
    let missing = run_bounded(info, LIMIT);
    let said = text(&missing.stderr);
    assert!(!missing.status.success());
    assert!(
        said.contains("rbd/nosuchimage") && said.contains("does not exist"),
        "{said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "{said}");

    let wrong = dir.path().join("wrong.keyring");
    ok(
        "ceph-authtool",
        &[
            "--create-keyring",
            path_str(&wrong),
            "--gen-key",
            "-n",
            "client.admin",
        ],
    );
    let mut info = Command::new(blockwire_bin());
    info.args([
        "info",
        &format!("{}:keyring={}", cluster.spec("gw"), path_str(&wrong)),
    ]);
    let refused = run_bounded(info, LIMIT);
    let said = text(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        said.contains("rbd:rbd/gw") && said.contains("key"),
        "{said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "{said}");
}
