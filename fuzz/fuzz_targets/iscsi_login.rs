//! The target's login negotiation on arbitrary sequences of Login Requests and
//! their text, and the full feature phase's text answers on arbitrary bytes: nothing
//! may panic, every response must fit a PDU, and a login that ended stays ended.
#![no_main]

use std::sync::{Arc, OnceLock};

use blockwire_iscsi::login::{
    answer_text, ChapConfig, LoginConfig, LoginMachine, LoginStep, Negotiated, SessionType,
    TargetEntry, TargetLimits,
};
use blockwire_iscsi::pdu::{opcode, Bhs, LoginRequest, Pdu, BHS_LEN, MAX_DATA_SEGMENT};
use libfuzzer_sys::fuzz_target;

fn chap(user: &str) -> ChapConfig {
    ChapConfig {
        user: user.into(),
        secret: b"secretsecret".to_vec(),
        mutual: Some(("target".into(), b"targetsecret".to_vec())),
    }
}

/// Two configurations: one open, one where everything needs CHAP.
fn configs() -> &'static [Arc<LoginConfig>; 2] {
    static CONFIGS: OnceLock<[Arc<LoginConfig>; 2]> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let target = |name: &str, chap: Option<ChapConfig>, allowed: Vec<String>| TargetEntry {
            name: name.into(),
            alias: Some("alias".into()),
            portal_group_tag: 1,
            allowed_initiators: allowed,
            chap,
        };
        let make = |with_chap: bool| {
            Arc::new(LoginConfig {
                targets: vec![
                    target("iqn.t:a", with_chap.then(|| chap("a")), Vec::new()),
                    target("iqn.t:b", None, vec!["iqn.i:b".into()]),
                ],
                discovery_chap: with_chap.then(|| chap("d")),
                limits: TargetLimits::default(),
                portals: vec!["127.0.0.1:3260,1".into()],
            })
        };
        [make(false), make(true)]
    })
}

/// A Login Request from 48 arbitrary header bytes (the opcode forced).
fn login_request(head: &[u8; BHS_LEN]) -> LoginRequest {
    let mut bhs = Bhs(*head);
    bhs.0[0] = 0x40 | opcode::LOGIN_REQUEST;
    bhs.0[4] = 0;
    match Pdu::decode(&bhs, &[]) {
        Ok(Pdu::LoginRequest(request)) => request,
        other => panic!("a login header decodes as a login request: {other:?}"),
    }
}

fn check_step(step: &LoginStep) {
    let (response, data) = match step {
        LoginStep::Continue { response, data } => {
            assert_eq!(response.status_class, 0);
            (response, data)
        }
        LoginStep::Complete { response, data, .. } => {
            assert_eq!(response.status_class, 0);
            assert!(response.transit);
            (response, data)
        }
        LoginStep::Fail { response, data, .. } => {
            assert_ne!(response.status_class, 0);
            (response, data)
        }
    };
    assert!(
        data.len() <= 8192,
        "a login response fits the default segment"
    );
    assert!(data.len() as u32 <= MAX_DATA_SEGMENT);
    let _ = Pdu::LoginResponse(response.clone()).encode(data.len() as u32);
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, mut rest)) = data.split_first() else {
        return;
    };
    let config = &configs()[usize::from(selector & 1)];

    // Text answers on the whole input, for both session types.
    for session_type in [SessionType::Normal, SessionType::Discovery] {
        let negotiated = negotiated(session_type);
        if let Ok(answer) = answer_text(config, &negotiated, rest) {
            assert!(answer.is_empty() || answer.ends_with(&[0]));
        }
    }

    // Records: a 48-byte header, a 2-byte length, then that much text.
    let mut machine = LoginMachine::new(config.clone());
    let mut ended = false;
    let mut first = true;
    while let Some((head, after)) = rest.split_first_chunk::<BHS_LEN>() {
        let Some((len, after)) = after.split_first_chunk::<2>() else {
            break;
        };
        let len = usize::from(u16::from_be_bytes(*len)).min(after.len());
        let (text, after) = after.split_at(len);
        rest = after;
        // Selector bits 1 and 2 start the first request with who logs in to what,
        // so the fuzzer spends its time past target lookup.
        let mut owned;
        let text = match (first, selector >> 1 & 3) {
            (true, 1) => {
                owned = b"InitiatorName=iqn.i:b\0TargetName=iqn.t:a\0".to_vec();
                owned.extend_from_slice(text);
                &owned[..]
            }
            (true, 2) => {
                owned = b"InitiatorName=iqn.i:b\0SessionType=Discovery\0".to_vec();
                owned.extend_from_slice(text);
                &owned[..]
            }
            _ => text,
        };
        first = false;
        let step = machine.handle(&login_request(head), text);
        check_step(&step);
        if ended {
            assert!(
                matches!(step, LoginStep::Fail { .. }),
                "a login that ended stays ended"
            );
        }
        if let LoginStep::Complete { negotiated, .. } = &step {
            assert!(negotiated.first_burst_length <= negotiated.max_burst_length);
            assert!(negotiated.initiator_max_recv_data_segment_length >= 512);
            let _ = answer_text(config, negotiated, text);
        }
        ended |= !matches!(step, LoginStep::Continue { .. });
    }
});

fn negotiated(session_type: SessionType) -> Negotiated {
    Negotiated {
        session_type,
        initiator_name: "iqn.i:b".into(),
        initiator_alias: None,
        target_name: (session_type == SessionType::Normal).then(|| "iqn.t:b".into()),
        isid: 1,
        tsih: 0,
        cid: 0,
        header_digest: false,
        data_digest: false,
        initiator_max_recv_data_segment_length: 8192,
        target_max_recv_data_segment_length: 8192,
        max_burst_length: 262_144,
        first_burst_length: 65_536,
        initial_r2t: true,
        immediate_data: true,
        max_outstanding_r2t: 1,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        default_time2wait: 2,
        default_time2retain: 20,
        error_recovery_level: 0,
        max_connections: 1,
        stat_sn: 0,
        exp_cmd_sn: 0,
    }
}
