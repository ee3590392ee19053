//! Crash trials (tests/src/crash.rs) against `blockwire serve`, through our NBD and
//! iSCSI initiators, with buffered and `--direct` exports: writers keep writing
//! while the target is SIGKILLed at a random moment, and every write the target
//! acknowledged must be in the file afterwards, with nothing in it nobody wrote.
//! A few trials each here; `bench/crash-trials.sh` runs many
//! (`BLOCKWIRE_CRASH_TRIALS`, `BLOCKWIRE_CRASH_PROTOCOLS`).

use std::sync::Arc;
use std::time::Duration;

use blockwire_blockdev::Device;
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_nbd::client::{ClientOptions, NbdClient, NbdUri};
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
        let served = if protocol == "nbd" {
            Served::start(&args, "crash")
        } else {
            Served::start_iscsi(&args, "crash")
        };
        // Nothing reconnects: the writers stop at the kill.
        let device = if protocol == "nbd" {
            let uri: NbdUri = served.uri().parse().unwrap();
            let options = ClientOptions {
                connections: 2,
                reconnect: None,
                ..ClientOptions::default()
            };
            Device::new(Arc::new(
                NbdClient::connect(&uri, options).expect("connect"),
            ))
        } else {
            let uri: IscsiUri = served.iscsi_url().parse().unwrap();
            let options = IscsiOptions {
                reconnect: None,
                ..IscsiOptions::default()
            };
            Device::new(Arc::new(
                IscsiClient::connect(&uri, options).expect("login"),
            ))
        };
        // A different moment each trial, 50-350 ms into the writing.
        let kill_after = Duration::from_millis(50 + (trial * 7919 + 113) % 300);
        let initial = vec![0u8; SIZE as usize];
        let outcome = run_trial(
            &device,
            CrashTrial::default(),
            trial + 1,
            kill_after,
            || served.kill_hard(),
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
