//! The AoE address probe (`blockwire_aoe::probe::who_answers`), which `serve` asks
//! before it answers for an address: across a veth pair between two network
//! namespaces it finds vblade and our own target at the address they serve, by
//! their MAC, and finds nothing at a free address. Needs root; the vblade test also
//! vblade.

use std::time::{Duration, Instant};

use blockwire_aoe::probe::{who_answers, who_answers_on, AddressTaken, DEFAULT_WAIT};
use blockwire_tests::aoe::{interface_mac, AoeLab, Vblade, SHELF, SLOT};
use blockwire_tests::netns::VethLab;
use blockwire_tests::{path_str, require_root, require_vblade};

/// Probes `shelf`.`slot` on eth0 from the initiator namespace, again while nothing
/// answers until `patience` is over (a target just started may not answer yet).
fn probe_until_found(
    lab: &VethLab,
    shelf: u16,
    slot: u8,
    patience: Duration,
) -> Option<AddressTaken> {
    let deadline = Instant::now() + patience;
    lab.run_in(lab.initiator_ns(), || loop {
        let found = who_answers("eth0", shelf, slot, DEFAULT_WAIT).expect("probe eth0");
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
    })
}

/// A probe of a free address: nothing, after about the wait.
fn assert_free(lab: &VethLab, shelf: u16, slot: u8) {
    let started = Instant::now();
    let found = lab.run_in(lab.initiator_ns(), || {
        who_answers("eth0", shelf, slot, DEFAULT_WAIT).expect("probe eth0")
    });
    let took = started.elapsed();
    assert_eq!(found, None, "e{shelf}.{slot} is free");
    assert!(
        took >= DEFAULT_WAIT && took < DEFAULT_WAIT * 3,
        "a probe that finds nothing waits its wait: {took:?}"
    );
}

#[test]
fn vblade_is_found_at_its_address_and_only_there() {
    require_root!();
    require_vblade!();
    let tag = format!("pv{}", std::process::id() % 100000);
    let lab = VethLab::new(&tag, 1, 1500).expect("build the veth lab");
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vblade.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let _vblade = Vblade::start(&lab, lab.target_ns(), 1, 2, "eth0", &image);
    let mac = interface_mac(&lab, lab.target_ns(), "eth0");

    let started = Instant::now();
    let taken = probe_until_found(&lab, 1, 2, Duration::from_secs(10))
        .expect("vblade answers e1.2 on the other end of eth0");
    assert_eq!(
        taken,
        AddressTaken {
            interface: "eth0".into(),
            shelf: 1,
            slot: 2,
            mac,
        }
    );
    assert_eq!(
        taken.to_string(),
        format!(
            "another AoE target (MAC {}) already answers e1.2 on eth0",
            blockwire_aoe::initiator::format_mac(&mac)
        )
    );
    eprintln!("found {taken} after {:?}", started.elapsed());

    // An answered probe returns soon after the answer, not at the end of its wait.
    let started = Instant::now();
    let again = lab.run_in(lab.initiator_ns(), || {
        who_answers("eth0", 1, 2, Duration::from_secs(5)).expect("probe eth0")
    });
    assert_eq!(again.map(|t| t.mac), Some(mac));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // Neighbouring addresses are free.
    assert_free(&lab, 1, 3);
    assert_free(&lab, 2, 2);
    // Several interfaces at once: the same answer, listed once.
    let all = lab.run_in(lab.initiator_ns(), || {
        who_answers_on(&["eth0"], 1, 2, DEFAULT_WAIT).expect("probe eth0")
    });
    assert_eq!(all.iter().map(|t| t.mac).collect::<Vec<_>>(), vec![mac]);
}

#[test]
fn our_own_target_is_found_the_same_way() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aoe.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    // Started and announced ready: it answers from now on.
    let lab = AoeLab::start("pb", 1500, &[path_str(&file)]);
    let taken = probe_until_found(&lab.lab, SHELF, SLOT, Duration::from_secs(5))
        .expect("our target answers its address");
    assert_eq!(taken.mac, lab.target_mac());
    assert_eq!((taken.shelf, taken.slot), (SHELF, SLOT));
    assert_eq!(taken.interface, "eth0");
    assert_free(&lab.lab, SHELF, SLOT + 1);
}
