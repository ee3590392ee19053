//! Reload end to end inside one process: a configuration planned and started
//! (NBD, iSCSI and NVMe/TCP targets bound on loopback, not run; memory devices), then a new
//! configuration diffed and applied to the running targets.

use std::sync::Arc;

use blockwire_nbd::NbdTarget;

use crate::config::Config;
use crate::created_files::CreatedFiles;
use crate::reload_apply::Live;
use crate::serve_plan::plan_from_config;
use crate::serve_start::{start, Started};

fn config(text: &str) -> Config {
    let config: Config = toml::from_str(text).unwrap();
    config.validate().unwrap();
    config
}

/// `text` planned and started, with metrics when `metrics`; the live state that
/// reloads it and the targets it hands new sets to.
fn serve(text: &str, metrics: bool) -> (Live, Started) {
    let plan = plan_from_config(config(text), 2, None, &CreatedFiles::default()).unwrap();
    let metrics = metrics.then_some("127.0.0.1:0");
    let mut started = start(plan, metrics, None).unwrap();
    let live = Live::new(
        started.file.take().unwrap(),
        started
            .server
            .as_ref()
            .map(|(nbd, _, _)| nbd.reload_handle()),
        started.iscsi.as_ref().map(|iscsi| iscsi.reload_handle()),
        std::mem::take(&mut started.targets),
        started.meters.clone(),
    )
    .with_nvme(started.nvme.as_ref().map(|nvme| nvme.reload_handle()));
    (live, started)
}

const LISTEN: &str = "[server]\nlisten = \"127.0.0.1:0\"\n[iscsi]\nlisten = \"127.0.0.1:0\"\n\
                      [nvme]\nlisten = \"127.0.0.1:0\"\ndiscovery = false\n";

fn nbd_names(started: &Started) -> Vec<String> {
    let (nbd, _, _): &(NbdTarget, _, _) = started.server.as_ref().unwrap();
    let mut names: Vec<String> = nbd
        .exports()
        .iter()
        .filter(|e| !e.is_retired())
        .map(|e| e.name.clone())
        .collect();
    names.sort();
    names
}

fn iscsi_names(started: &Started) -> Vec<String> {
    let handle = started.iscsi.as_ref().unwrap().reload_handle();
    let mut names: Vec<String> = handle.targets().into_iter().map(|t| t.name).collect();
    names.sort();
    names
}

#[test]
fn exports_move_between_protocols_and_unchanged_ones_keep_their_target() {
    let old = format!(
        "{LISTEN}[[export]]\nname = \"a\"\nmemory = \"1M\"\n\
         [[export]]\nname = \"b\"\nmemory = \"1M\"\niscsi = true\n"
    );
    let (mut live, started) = serve(&old, false);
    assert_eq!(nbd_names(&started), ["a", "b"]);
    assert_eq!(iscsi_names(&started), ["iqn.2026-11.dev.blockwire:b"]);
    let handle = started.iscsi.as_ref().unwrap().reload_handle();
    let b_before = handle.targets()[0].scsi.clone();

    // a leaves NBD for iSCSI, b stays as it is, c is new on both.
    let new = format!(
        "{LISTEN}[[export]]\nname = \"a\"\nmemory = \"1M\"\nnbd = false\niscsi = true\n\
         [[export]]\nname = \"b\"\nmemory = \"1M\"\niscsi = true\n\
         [[export]]\nname = \"c\"\nmemory = \"2M\"\niscsi = true\n"
    );
    let applied = live.apply(config(&new)).unwrap();
    assert_eq!(nbd_names(&started), ["b", "c"]);
    assert_eq!(
        iscsi_names(&started),
        [
            "iqn.2026-11.dev.blockwire:a",
            "iqn.2026-11.dev.blockwire:b",
            "iqn.2026-11.dev.blockwire:c"
        ]
    );
    let b_after = handle
        .targets()
        .into_iter()
        .find(|t| t.name.ends_with(":b"))
        .unwrap()
        .scsi;
    assert!(Arc::ptr_eq(&b_before, &b_after), "b's target was rebuilt");
    // a: NBD removed, iSCSI added; c: added twice; b: unchanged twice.
    assert_eq!((applied.changed, applied.unchanged), (4, 2));
}

#[test]
fn the_same_configuration_again_changes_nothing() {
    let text = format!("{LISTEN}[[export]]\nname = \"a\"\nmemory = \"1M\"\niscsi = true\n");
    let (mut live, started) = serve(&text, true);
    let applied = live.apply(config(&text)).unwrap();
    assert_eq!((applied.changed, applied.unchanged), (0, 2));
    assert_eq!(nbd_names(&started), ["a"]);
}

#[test]
fn a_protocol_that_was_not_started_is_not_served_by_a_reload() {
    let old = "[server]\nlisten = \"127.0.0.1:0\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n";
    let (mut live, started) = serve(old, false);
    assert!(started.iscsi.is_none());
    let new =
        format!("{old}[[export]]\nname = \"b\"\nmemory = \"1M\"\nnbd = false\niscsi = true\n");
    let applied = live.apply(config(&new)).unwrap();
    // b over iSCSI needs a restart (logged); nothing else changed.
    assert_eq!((applied.changed, applied.unchanged), (0, 1));
    assert_eq!(nbd_names(&started), ["a"]);
}

#[test]
fn metered_exports_added_by_a_reload_are_counted() {
    let old = format!("{LISTEN}[[export]]\nname = \"a\"\nmemory = \"1M\"\n");
    let (mut live, started) = serve(&old, true);
    let new = format!("{old}[[export]]\nname = \"c\"\nmemory = \"1M\"\n");
    live.apply(config(&new)).unwrap();
    let (nbd, _, _) = started.server.as_ref().unwrap();
    let c = nbd
        .exports()
        .iter()
        .find(|e| e.name == "c")
        .cloned()
        .unwrap();
    c.device
        .write(&[7u8; 512], 0, blockwire_blockdev::WriteFlags::default())
        .unwrap();
    let text = started.meters.as_ref().unwrap().metrics.encode().unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("export=\"c\"") && l.contains("protocol=\"nbd\"")),
        "{text}"
    );
}

fn nvme_nqns(started: &Started) -> Vec<String> {
    let mut nqns = started.nvme.as_ref().unwrap().subsystem_nqns();
    nqns.sort();
    nqns
}

#[test]
fn nvme_subsystems_are_added_and_removed_live() {
    let old = format!("{LISTEN}[[export]]\nname = \"a\"\nmemory = \"1M\"\nnvme = true\n");
    let (mut live, started) = serve(&old, true);
    assert_eq!(nvme_nqns(&started), ["nqn.2026-11.dev.blockwire:a"]);
    let handle = started.nvme.as_ref().unwrap().reload_handle();
    let a_before = handle.subsystems()[0].clone();

    // b joins over NVMe/TCP under a name of its own; a stays as it is.
    let new = format!(
        "{old}[[export]]\nname = \"b\"\nmemory = \"2M\"\nnbd = false\n\
         nvme = {{ nqn = \"nqn.2026-11.com.example:b\" }}\n"
    );
    let applied = live.apply(config(&new)).unwrap();
    assert_eq!(
        nvme_nqns(&started),
        ["nqn.2026-11.com.example:b", "nqn.2026-11.dev.blockwire:a"]
    );
    let a_after = handle
        .subsystems()
        .into_iter()
        .find(|s| s.name == "a")
        .unwrap();
    assert!(
        Arc::ptr_eq(&a_before, &a_after),
        "a's subsystem was rebuilt"
    );
    // b: NVMe added; a: NBD and NVMe unchanged.
    assert_eq!((applied.changed, applied.unchanged), (1, 2));
    let b = handle
        .subsystems()
        .into_iter()
        .find(|s| s.name == "b")
        .unwrap();
    assert_eq!(b.device.size(), 2 << 20);
    // Added subsystems are counted with protocol="nvme".
    b.device
        .write(&[7u8; 512], 0, blockwire_blockdev::WriteFlags::default())
        .unwrap();
    let text = started.meters.as_ref().unwrap().metrics.encode().unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("export=\"b\"") && l.contains("protocol=\"nvme\"")),
        "{text}"
    );

    // a leaves NVMe/TCP (and stays on NBD).
    let last = format!(
        "{LISTEN}[[export]]\nname = \"a\"\nmemory = \"1M\"\n\
         [[export]]\nname = \"b\"\nmemory = \"2M\"\nnbd = false\n\
         nvme = {{ nqn = \"nqn.2026-11.com.example:b\" }}\n"
    );
    live.apply(config(&last)).unwrap();
    assert_eq!(nvme_nqns(&started), ["nqn.2026-11.com.example:b"]);
    assert_eq!(nbd_names(&started), ["a"]);
}
