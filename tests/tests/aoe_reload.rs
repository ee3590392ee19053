//! `serve --config` on SIGHUP over AoE (issue 24): in the lab's namespaces, an
//! export added to the file answers at its shelf.slot, a removed one stops
//! answering, and an unchanged one keeps its data and keeps answering. Needs root.

use std::path::Path;
use std::time::{Duration, Instant};

use blockwire_aoe::wire::{ata, SECTOR_SIZE};
use blockwire_tests::aoe::{ata_args, AoeLab, SHELF, SLOT};
use blockwire_tests::netns::VethLab;
use blockwire_tests::{blockwire_bin, require_root, Served};

/// The exports as (name, slot), each a 16 MiB memory device at eSHELF.slot on eth0.
fn config(exports: &[(&str, u8)]) -> String {
    let mut text = String::new();
    for (name, slot) in exports {
        text.push_str(&format!(
            "[[export]]\nname = \"{name}\"\nmemory = \"16M\"\nnbd = false\n\
             aoe = {{ interfaces = [\"eth0\"], shelf = {SHELF}, slot = {slot} }}\n\n"
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
fn aoe_exports_are_added_and_removed_on_sighup() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    let (gone, fresh) = (SLOT + 1, SLOT + 2);
    std::fs::write(&file, config(&[("keep", SLOT), ("gone", gone)])).unwrap();
    let tag = format!("rl{}", std::process::id() % 100000);
    let mut lab = AoeLab {
        served: None,
        lab: VethLab::new(&tag, 1, 1500).expect("build the veth lab"),
        mtu: 1500,
    };
    let mut command = lab.lab.command_in(lab.lab.target_ns(), blockwire_bin());
    command.arg("serve").arg("--config").arg(&file);
    let log = dir.path().join("serve.log");
    lab.served = Some(Served::spawn_ready_logged(command, "keep", &log));

    let mut client = lab.client();
    client.discover();
    let pattern = vec![0xa5u8; 2 * SECTOR_SIZE];
    client.write(8, &pattern);
    client.slot = gone;
    client.write(8, &pattern);
    assert_eq!(client.read(8, 2), pattern);

    std::fs::write(&file, config(&[("keep", SLOT), ("fresh", fresh)])).unwrap();
    let pid = lab.served.as_ref().unwrap().pid();
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let logged = wait_logged(&log, "reload: unchanged");
    assert!(
        logged.contains("reload: export 'gone' removed (aoe)"),
        "{logged}"
    );
    assert!(
        logged.contains("reload: export 'fresh' added (aoe)"),
        "{logged}"
    );
    assert!(logged.contains("reload: unchanged 1"), "{logged}");

    // The removed export no longer answers.
    client.slot = gone;
    assert!(
        client
            .ata(ata_args(ata::READ_SECTORS_EXT, 8, 2, false), &[])
            .is_none(),
        "a removed AoE export answered"
    );
    // The added one does.
    client.slot = fresh;
    assert_eq!(client.read(8, 2), vec![0u8; 2 * SECTOR_SIZE]);
    client.write(8, &pattern);
    assert_eq!(client.read(8, 2), pattern);
    // The unchanged one kept its data and answers.
    client.slot = SLOT;
    assert_eq!(client.read(8, 2), pattern);
    let served = lab.served.take().unwrap();
    assert_eq!(served.terminate(), Some(0));
}
