use super::*;

fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_port: name.into(),
        transport_id: name.as_bytes().to_vec(),
        relative_target_port: 1,
    }
}

fn out(action: u8, kind: u8, key: u64, action_key: u64) -> PrOut {
    PrOut {
        action,
        scope: 0,
        kind,
        key,
        action_key,
        spec_i_pt: false,
        all_tg_pt: false,
        aptpl: false,
    }
}

fn register(state: &mut Reservations, who: &Nexus, key: u64) {
    state
        .persistent_reserve_out(
            who,
            &out(action::REGISTER_AND_IGNORE_EXISTING_KEY, 0, 0, key),
        )
        .unwrap();
}

const TYPES: [PrType; 6] = [
    PrType::WriteExclusive,
    PrType::ExclusiveAccess,
    PrType::WriteExclusiveRegistrantsOnly,
    PrType::ExclusiveAccessRegistrantsOnly,
    PrType::WriteExclusiveAllRegistrants,
    PrType::ExclusiveAccessAllRegistrants,
];

#[test]
fn register_rules() {
    let mut state = Reservations::new();
    let a = nexus("a");
    // An unregistered nexus with a non-zero reservation key conflicts.
    assert_eq!(
        state.persistent_reserve_out(&a, &out(action::REGISTER, 0, 5, 7)),
        Err(PrError::Conflict)
    );
    state
        .persistent_reserve_out(&a, &out(action::REGISTER, 0, 0, 7))
        .unwrap();
    assert_eq!(state.generation(), 1);
    // Re-registering needs the current key.
    assert_eq!(
        state.persistent_reserve_out(&a, &out(action::REGISTER, 0, 0, 8)),
        Err(PrError::Conflict)
    );
    state
        .persistent_reserve_out(&a, &out(action::REGISTER, 0, 7, 8))
        .unwrap();
    assert_eq!(&state.read_keys()[8..16], &8u64.to_be_bytes());
    state
        .persistent_reserve_out(&a, &out(action::REGISTER, 0, 8, 0))
        .unwrap();
    assert_eq!(state.read_keys()[4..8], [0, 0, 0, 0]);
    assert_eq!(state.generation(), 3);
}

#[test]
fn reserve_and_release_each_type() {
    for kind in TYPES {
        let mut state = Reservations::new();
        let a = nexus("a");
        register(&mut state, &a, 1);
        state
            .persistent_reserve_out(&a, &out(action::RESERVE, kind as u8, 1, 0))
            .unwrap();
        assert!(state.any_reservation());
        let rr = state.read_reservation();
        assert_eq!(&rr[4..8], &16u32.to_be_bytes());
        let key = if kind.all_registrants() { 0 } else { 1 };
        assert_eq!(&rr[8..16], &u64::to_be_bytes(key));
        assert_eq!(rr[21], kind as u8);
        // Same type again: fine; another type: conflict.
        state
            .persistent_reserve_out(&a, &out(action::RESERVE, kind as u8, 1, 0))
            .unwrap();
        let other = if kind == PrType::WriteExclusive { 3 } else { 1 };
        assert_eq!(
            state.persistent_reserve_out(&a, &out(action::RESERVE, other, 1, 0)),
            Err(PrError::Conflict)
        );
        // Releasing with the wrong type is an invalid release.
        assert_eq!(
            state.persistent_reserve_out(&a, &out(action::RELEASE, other, 1, 0)),
            Err(PrError::Check(
                codes::INVALID_RELEASE_OF_PERSISTENT_RESERVATION
            ))
        );
        state
            .persistent_reserve_out(&a, &out(action::RELEASE, kind as u8, 1, 0))
            .unwrap();
        assert!(!state.any_reservation());
        assert_eq!(
            state.generation(),
            1,
            "RESERVE and RELEASE keep the generation"
        );
    }
}

#[test]
fn invalid_type_and_scope() {
    let mut state = Reservations::new();
    let a = nexus("a");
    register(&mut state, &a, 1);
    assert_eq!(
        state.persistent_reserve_out(&a, &out(action::RESERVE, 2, 1, 0)),
        Err(PrError::Check(codes::INVALID_FIELD_IN_CDB))
    );
    let mut scoped = out(action::RESERVE, 1, 1, 0);
    scoped.scope = 1;
    assert_eq!(
        state.persistent_reserve_out(&a, &scoped),
        Err(PrError::Check(codes::INVALID_FIELD_IN_CDB))
    );
    assert_eq!(
        state.persistent_reserve_out(&nexus("b"), &out(action::RESERVE, 1, 0, 0)),
        Err(PrError::Conflict)
    );
}

/// SPC-4 table 47 as libiscsi's access tests check it: (type, registered non-holder
/// reads, writes, unregistered reads, writes).
#[test]
fn conflict_table() {
    let table = [
        (PrType::ExclusiveAccess, false, false, false, false),
        (PrType::WriteExclusive, true, false, true, false),
        (
            PrType::ExclusiveAccessRegistrantsOnly,
            true,
            true,
            false,
            false,
        ),
        (
            PrType::WriteExclusiveRegistrantsOnly,
            true,
            true,
            true,
            false,
        ),
        (
            PrType::ExclusiveAccessAllRegistrants,
            true,
            true,
            false,
            false,
        ),
        (
            PrType::WriteExclusiveAllRegistrants,
            true,
            true,
            true,
            false,
        ),
    ];
    for (kind, reg_read, reg_write, unreg_read, unreg_write) in table {
        let mut state = Reservations::new();
        let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
        register(&mut state, &a, 1);
        register(&mut state, &b, 2);
        state
            .persistent_reserve_out(&a, &out(action::RESERVE, kind as u8, 1, 0))
            .unwrap();
        assert!(!state.conflicts(&a, Access::Read));
        assert!(!state.conflicts(&a, Access::Write));
        assert_eq!(!state.conflicts(&b, Access::Read), reg_read, "{kind:?}");
        assert_eq!(!state.conflicts(&b, Access::Write), reg_write, "{kind:?}");
        assert_eq!(!state.conflicts(&c, Access::Read), unreg_read, "{kind:?}");
        assert_eq!(!state.conflicts(&c, Access::Write), unreg_write, "{kind:?}");
        for who in [&a, &b, &c] {
            assert!(!state.conflicts(who, Access::Allowed));
            assert!(!state.conflicts(who, Access::Exempt));
        }
    }
}

#[test]
fn holder_unregistering_releases_unless_all_registrants() {
    for kind in TYPES {
        let mut state = Reservations::new();
        let (a, b) = (nexus("a"), nexus("b"));
        register(&mut state, &a, 1);
        register(&mut state, &b, 2);
        state
            .persistent_reserve_out(&a, &out(action::RESERVE, kind as u8, 1, 0))
            .unwrap();
        let attentions = state
            .persistent_reserve_out(&a, &out(action::REGISTER, 0, 1, 0))
            .unwrap();
        assert_eq!(state.any_reservation(), kind.all_registrants(), "{kind:?}");
        let told = attentions
            .iter()
            .any(|(who, code)| *who == b.key() && *code == codes::RESERVATIONS_RELEASED);
        assert_eq!(
            told,
            matches!(
                kind,
                PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
            ),
            "{kind:?}"
        );
        if kind.all_registrants() {
            // The remaining registrant holds it and may release it.
            state
                .persistent_reserve_out(&b, &out(action::RELEASE, kind as u8, 2, 0))
                .unwrap();
            assert!(!state.any_reservation());
        }
    }
}

#[test]
fn clear_removes_everything_and_tells_the_others() {
    let mut state = Reservations::new();
    let (a, b) = (nexus("a"), nexus("b"));
    register(&mut state, &a, 1);
    register(&mut state, &b, 2);
    state
        .persistent_reserve_out(&a, &out(action::RESERVE, 3, 1, 0))
        .unwrap();
    let generation = state.generation();
    let attentions = state
        .persistent_reserve_out(&a, &out(action::CLEAR, 0, 1, 0))
        .unwrap();
    assert_eq!(attentions, vec![(b.key(), codes::RESERVATIONS_PREEMPTED)]);
    assert!(!state.any_reservation());
    assert_eq!(state.read_keys()[4..8], [0, 0, 0, 0]);
    assert_eq!(state.generation(), generation + 1);
}

#[test]
fn preempt_registrations_without_reservation() {
    let mut state = Reservations::new();
    let (a, b) = (nexus("a"), nexus("b"));
    register(&mut state, &a, 1);
    register(&mut state, &b, 2);
    let generation = state.generation();
    let attentions = state
        .persistent_reserve_out(&b, &out(action::PREEMPT, 3, 2, 1))
        .unwrap();
    assert_eq!(attentions, vec![(a.key(), codes::REGISTRATIONS_PREEMPTED)]);
    assert_eq!(state.generation(), generation + 1);
    assert_eq!(
        &state.read_keys()[4..16],
        &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 2]
    );
    // Nobody has key 9: conflict. Key 0 without a reservation: invalid.
    assert_eq!(
        state.persistent_reserve_out(&b, &out(action::PREEMPT, 3, 2, 9)),
        Err(PrError::Conflict)
    );
    assert_eq!(
        state.persistent_reserve_out(&b, &out(action::PREEMPT, 3, 2, 0)),
        Err(PrError::Check(codes::INVALID_FIELD_IN_PARAMETER_LIST))
    );
}

#[test]
fn preempt_takes_over_the_reservation() {
    let mut state = Reservations::new();
    let (a, b) = (nexus("a"), nexus("b"));
    register(&mut state, &a, 1);
    register(&mut state, &b, 2);
    state
        .persistent_reserve_out(&a, &out(action::RESERVE, 1, 1, 0))
        .unwrap();
    let attentions = state
        .persistent_reserve_out(&b, &out(action::PREEMPT_AND_ABORT, 3, 2, 1))
        .unwrap();
    assert_eq!(attentions, vec![(a.key(), codes::REGISTRATIONS_PREEMPTED)]);
    let rr = state.read_reservation();
    assert_eq!(&rr[8..16], &2u64.to_be_bytes());
    assert_eq!(rr[21], 3);
    assert!(state.conflicts(&a, Access::Read));
}

#[test]
fn preempt_all_registrants_with_zero_key() {
    let mut state = Reservations::new();
    let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
    register(&mut state, &a, 1);
    register(&mut state, &b, 2);
    register(&mut state, &c, 3);
    state
        .persistent_reserve_out(&a, &out(action::RESERVE, 8, 1, 0))
        .unwrap();
    let attentions = state
        .persistent_reserve_out(&b, &out(action::PREEMPT, 1, 2, 0))
        .unwrap();
    assert_eq!(attentions.len(), 2);
    assert_eq!(state.read_reservation()[21], 1);
    assert!(state.conflicts(&a, Access::Write));
    assert!(!state.conflicts(&b, Access::Write));
}

#[test]
fn legacy_reservations() {
    let mut state = Reservations::new();
    let (a, b) = (nexus("a"), nexus("b"));
    state.reserve_legacy(&a).unwrap();
    state.reserve_legacy(&a).unwrap();
    assert_eq!(state.reserve_legacy(&b), Err(PrError::Conflict));
    assert!(state.conflicts(&b, Access::Allowed));
    assert!(state.conflicts(&b, Access::Read));
    assert!(!state.conflicts(&b, Access::Exempt));
    assert!(!state.conflicts(&a, Access::Write));
    // Another nexus's RELEASE does nothing.
    state.release_legacy(&b).unwrap();
    assert!(state.any_reservation());
    state.nexus_lost(&a);
    assert!(!state.any_reservation());
    state.reserve_legacy(&b).unwrap();
    state.reset_legacy();
    assert!(!state.any_reservation());
    // A persistent reservation blocks RESERVE(6) from others.
    register(&mut state, &a, 1);
    state
        .persistent_reserve_out(&a, &out(action::RESERVE, 1, 1, 0))
        .unwrap();
    assert_eq!(state.reserve_legacy(&b), Err(PrError::Conflict));
    state.reserve_legacy(&a).unwrap();
}

#[test]
fn parameter_list_checks() {
    let mut params = [0u8; 24];
    params[7] = 5;
    params[15] = 6;
    let parsed = PrOut::parse(action::REGISTER, 0, 0, &params).unwrap();
    assert_eq!((parsed.key, parsed.action_key), (5, 6));
    assert_eq!(
        PrOut::parse(0, 0, 0, &params[..20]),
        Err(PrError::Check(codes::PARAMETER_LIST_LENGTH_ERROR))
    );
    assert_eq!(
        PrOut::parse(0, 0, 0, &[0u8; 28]),
        Err(PrError::Check(codes::PARAMETER_LIST_LENGTH_ERROR))
    );
    params[20] = 0x08;
    assert_eq!(
        PrOut::parse(0, 0, 0, &params),
        Err(PrError::Check(codes::INVALID_FIELD_IN_PARAMETER_LIST))
    );
}

#[test]
fn full_status_reports_the_holder_and_transport_id() {
    let mut state = Reservations::new();
    let a = nexus("a");
    register(&mut state, &a, 1);
    state
        .persistent_reserve_out(&a, &out(action::RESERVE, 1, 1, 0))
        .unwrap();
    let data = state.read_full_status();
    let len = u32::from_be_bytes([data[4], data[5], data[6], data[7]]) as usize;
    assert_eq!(len + 8, data.len());
    assert_eq!(&data[8..16], &1u64.to_be_bytes());
    assert_eq!(data[20], 1);
    assert_eq!(data[21], 1);
    assert_eq!(&data[26..28], &[0, 1]);
    assert_eq!(&data[32..], b"a");
}
