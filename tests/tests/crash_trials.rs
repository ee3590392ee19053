//! Crash trials (tests/src/crash.rs) against `blockwire serve`, through our NBD,
//! iSCSI and AoE initiators (AoE between two network namespaces, as root), with
//! buffered and `--direct` exports: writers keep writing
//! while the target is SIGKILLed at a random moment, and every write the target
//! acknowledged must be in the file afterwards, with nothing in it nobody wrote.
//! A few trials each here; `bench/crash-trials.sh` runs many
//! (`BLOCKWIRE_CRASH_TRIALS`, `BLOCKWIRE_CRASH_PROTOCOLS`).

use std::sync::Arc;
use std::time::Duration;

use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::Device;
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
use blockwire_tests::aoe::{AoeLab, SHELF, SLOT};
use blockwire_tests::crash::{run_trial, CrashTrial};
use blockwire_tests::{path_str, sparse_file, Served, MIB};

const SIZE: u64 = 8 * MIB;

fn trials() -> u64 {
    std::env::var("BLOCKWIRE_CRASH_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

fn wanted(protocol: &str) -> bool {
    std::env::var("BLOCKWIRE_CRASH_PROTOCOLS")
        .map_or(true, |list| list.split(',').any(|p| p.trim() == protocol))
}

/// Runs the trials of one protocol and setting; panics on any lost write.
fn trials_of(protocol: &str, direct: bool) {
    if !wanted(protocol) {
        return;
    }
    let setting = if direct { "direct" } else { "buffered" };
    let dir = tempfile::tempdir().unwrap();
    let (mut writes, mut lost) = (0, 0);
    let count = trials();
    for trial in 0..count {
        let image = sparse_file(dir.path(), &format!("crash-{trial}.img"), SIZE);
        let mut args = vec![path_str(&image), "--name", "crash"];
        if direct {
            args.push("--direct");
        }
        // The target, how to kill it, and a device through our initiator for it.
        // Nothing reconnects: the writers stop at the kill.
        let (device, kill): (Device, Box<dyn FnOnce()>) = match protocol {
            "nbd" => {
                let served = Served::start(&args, "crash");
                let uri: NbdUri = served.uri().parse().unwrap();
                let options = ClientOptions {
                    connections: 2,
                    reconnect: None,
                    ..ClientOptions::default()
                };
                let client = NbdClient::connect(&uri, options).expect("connect");
                (
                    Device::new(Arc::new(client)),
                    Box::new(|| served.kill_hard()),
                )
            }
            "iscsi" => {
                let served = Served::start_iscsi(&args, "crash");
                let uri: IscsiUri = served.iscsi_url().parse().unwrap();
                let options = IscsiOptions {
                    reconnect: None,
                    ..IscsiOptions::default()
                };
                let client = IscsiClient::connect(&uri, options).expect("login");
                (
                    Device::new(Arc::new(client)),
                    Box::new(|| served.kill_hard()),
                )
            }
            _ => {
                // Each setting its own namespaces: the two tests run at once.
                let tag = if direct { "crd" } else { "crb" };
                let mut lab = AoeLab::start(tag, 9000, &args);
                let uri: AoeUri = format!("aoe://eth0/e{SHELF}.{SLOT}").parse().unwrap();
                // After the kill, requests fail once a frame stays unanswered this
                // long, instead of the default 10 s.
                let options = AoeOptions {
                    timeout: Duration::from_secs(1),
                    ..AoeOptions::default()
                };
                let client = lab.lab.run_in(lab.lab.initiator_ns(), || {
                    AoeClient::open(&uri, options).expect("open the AoE target")
                });
                // The lab (its namespaces) goes when the trial's kill has run.
                (
                    Device::new(Arc::new(client)),
                    Box::new(move || lab.kill_target()),
                )
            }
        };
        // A different moment each trial, 50-350 ms into the writing.
        let kill_after = Duration::from_millis(50 + (trial * 7919 + 113) % 300);
        let initial = vec![0u8; SIZE as usize];
        let outcome = run_trial(
            &device,
            CrashTrial::default(),
            trial + 1,
            kill_after,
            kill,
            &initial,
            || std::fs::read(&image).expect("read the image"),
        );
        assert!(
            outcome.acknowledged > 0,
            "trial {trial}: nothing was written"
        );
        writes += outcome.acknowledged;
        if outcome.violations > 0 {
            lost += 1;
            eprintln!(
                "{protocol} {setting} trial {trial}: {}",
                outcome.first.as_deref().unwrap_or("")
            );
        }
    }
    println!(
        "crash trials, {protocol}, {setting}: {count} trials, {writes} acknowledged writes checked, {lost} trials lost data"
    );
    assert_eq!(
        lost, 0,
        "{protocol} {setting}: acknowledged writes were lost"
    );
}

#[test]
fn nbd_buffered() {
    trials_of("nbd", false);
}

#[test]
fn nbd_direct() {
    trials_of("nbd", true);
}

#[test]
fn iscsi_buffered() {
    trials_of("iscsi", false);
}

#[test]
fn iscsi_direct() {
    trials_of("iscsi", true);
}

#[test]
fn aoe_buffered() {
    blockwire_tests::require_root!();
    trials_of("aoe", false);
}

#[test]
fn aoe_direct() {
    blockwire_tests::require_root!();
    trials_of("aoe", true);
}
