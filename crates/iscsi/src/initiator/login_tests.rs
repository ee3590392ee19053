//! The initiator's login against the target's [`LoginMachine`], both sans-IO, in
//! one thread: every request goes straight into the machine and every response
//! straight back.

use std::sync::Arc;

use super::login::*;
use crate::login::{
    status, ChapConfig, LoginConfig, LoginMachine, LoginStep as TargetStep, Negotiated,
    TargetEntry, TargetLimits,
};
use crate::pdu::LoginResponse;

const IQN: &str = "iqn.2026-11.dev.blockwire:login";
const INITIATOR: &str = "iqn.2026-11.dev.blockwire:initiator";

fn config(chap: Option<ChapConfig>, limits: TargetLimits) -> Arc<LoginConfig> {
    Arc::new(LoginConfig {
        targets: vec![TargetEntry {
            name: IQN.into(),
            alias: Some("disk".into()),
            portal_group_tag: 1,
            allowed_initiators: Vec::new(),
            chap,
        }],
        discovery_chap: None,
        limits,
        portals: vec!["127.0.0.1:3260,1".into()],
    })
}

fn options(target: Option<&str>, chap: Option<Credentials>, digests: bool) -> LoginOptions {
    LoginOptions {
        initiator_name: INITIATOR.into(),
        target_name: target.map(str::to_string),
        isid: 0x8000_1234_0000,
        tsih: 0,
        cid: 0,
        cmd_sn: 7,
        chap,
        digests,
    }
}

/// Runs a login to its end: both sides' results, or the initiator's error.
fn run(
    config: Arc<LoginConfig>,
    options: LoginOptions,
) -> Result<(SessionParams, Negotiated), LoginError> {
    let mut target = LoginMachine::new(config);
    let mut initiator = InitiatorLogin::new(options);
    let mut step = initiator.start();
    let mut negotiated = None;
    for _ in 0..20 {
        let (request, data) = match step {
            LoginStep::Done(params) => {
                return Ok((params, negotiated.expect("the target completed")))
            }
            LoginStep::Send { request, data } => (request, data),
        };
        let (response, data): (LoginResponse, Vec<u8>) = match target.handle(&request, &data) {
            TargetStep::Continue { response, data } => (response, data),
            TargetStep::Complete {
                mut response,
                data,
                negotiated: settled,
            } => {
                // The driver's duty: a new session's TSIH.
                response.tsih = 0x42;
                negotiated = Some(settled);
                (response, data)
            }
            TargetStep::Fail { response, data, .. } => (response, data),
        };
        step = initiator.handle(&response, &data)?;
    }
    panic!("the login did not end");
}

#[test]
fn no_authentication_and_the_best_operational_keys() {
    let (params, negotiated) = run(
        config(None, TargetLimits::default()),
        options(Some(IQN), None, false),
    )
    .unwrap();
    assert_eq!(params.tsih, 0x42);
    assert!(params.immediate_data && !params.initial_r2t);
    assert_eq!(params.first_burst_length, 256 * 1024);
    assert_eq!(params.max_burst_length, 16 * 1024 * 1024 - 1024);
    assert_eq!(params.target_max_recv, 256 * 1024);
    assert_eq!(params.initiator_max_recv, DECLARED_MAX_RECV);
    assert_eq!(params.target_alias.as_deref(), Some("disk"));
    assert_eq!(params.target_portal_group_tag, Some(1));
    assert!(!params.header_digest && !params.data_digest);
    // The first command uses the login's CmdSN (logins are immediate, §3.2.2.1).
    assert_eq!(params.cmd_sn, 7);
    assert_eq!(params.exp_cmd_sn, 7);
    assert_eq!(params.exp_stat_sn, negotiated.stat_sn);
    // Both sides agree.
    assert_eq!(
        negotiated.initiator_max_recv_data_segment_length,
        DECLARED_MAX_RECV
    );
    assert_eq!(negotiated.first_burst_length, params.first_burst_length);
    assert_eq!(negotiated.max_burst_length, params.max_burst_length);
    assert_eq!(negotiated.immediate_data, params.immediate_data);
    assert_eq!(negotiated.initial_r2t, params.initial_r2t);
    assert_eq!(negotiated.max_outstanding_r2t, params.max_outstanding_r2t);
}

#[test]
fn digests_when_asked() {
    let (params, negotiated) = run(
        config(None, TargetLimits::default()),
        options(Some(IQN), None, true),
    )
    .unwrap();
    assert!(params.header_digest && params.data_digest);
    assert!(negotiated.header_digest && negotiated.data_digest);
    // A target that allows no digests fails the login instead of running without.
    let limits = TargetLimits {
        header_digest: crate::login::DigestChoice::NoneOnly,
        ..TargetLimits::default()
    };
    let error = run(config(None, limits), options(Some(IQN), None, true)).unwrap_err();
    assert!(error.to_string().contains("HeaderDigest"), "{error}");
}

#[test]
fn a_stricter_target_wins() {
    let limits = TargetLimits {
        max_recv_data_segment_length: 8192,
        max_burst_length: 128 * 1024,
        first_burst_length: 64 * 1024,
        max_outstanding_r2t: 1,
        immediate_data: false,
        initial_r2t: true,
        ..TargetLimits::default()
    };
    let (params, _) = run(config(None, limits), options(Some(IQN), None, false)).unwrap();
    assert_eq!(params.target_max_recv, 8192);
    assert_eq!(params.max_burst_length, 128 * 1024);
    assert_eq!(params.first_burst_length, 64 * 1024);
    assert_eq!(params.max_outstanding_r2t, 1);
    assert!(!params.immediate_data);
    assert!(params.initial_r2t);
}

fn alice(mutual: Option<(Option<String>, Vec<u8>)>, secret: &[u8]) -> Credentials {
    Credentials {
        user: "alice".into(),
        secret: secret.to_vec(),
        mutual,
    }
}

fn chap_config(mutual: bool) -> ChapConfig {
    ChapConfig {
        user: "alice".into(),
        secret: b"0123456789ab".to_vec(),
        mutual: mutual.then(|| ("target".to_string(), b"ba9876543210".to_vec())),
    }
}

#[test]
fn chap_one_way() {
    let config = config(Some(chap_config(false)), TargetLimits::default());
    let (params, negotiated) = run(
        config.clone(),
        options(Some(IQN), Some(alice(None, b"0123456789ab")), false),
    )
    .unwrap();
    assert_eq!(params.tsih, 0x42);
    assert_eq!(negotiated.target_name.as_deref(), Some(IQN));
    let error = run(
        config.clone(),
        options(Some(IQN), Some(alice(None, b"wrong-secret")), false),
    )
    .unwrap_err();
    assert_eq!(
        error,
        LoginError::Refused {
            status: status::AUTHENTICATION_FAILURE,
            redirect: None
        }
    );
    assert_eq!(error.to_string(), "authentication failure (0x0201)");
    // Without credentials the target's refusal names the status too.
    let error = run(config, options(Some(IQN), None, false)).unwrap_err();
    assert_eq!(error.to_string(), "authentication failure (0x0201)");
}

#[test]
fn chap_credentials_for_a_target_without_chap_choose_none() {
    let (params, _) = run(
        config(None, TargetLimits::default()),
        options(Some(IQN), Some(alice(None, b"0123456789ab")), false),
    )
    .unwrap();
    assert_eq!(params.tsih, 0x42);
}

#[test]
fn mutual_chap() {
    let config = config(Some(chap_config(true)), TargetLimits::default());
    let mutual = Some((Some("target".to_string()), b"ba9876543210".to_vec()));
    run(
        config.clone(),
        options(Some(IQN), Some(alice(mutual, b"0123456789ab")), false),
    )
    .unwrap();
    // The target proves a different secret than we expect: we refuse it.
    let wrong = Some((None, b"not-the-secret".to_vec()));
    let error = run(
        config.clone(),
        options(Some(IQN), Some(alice(wrong, b"0123456789ab")), false),
    )
    .unwrap_err();
    assert!(matches!(error, LoginError::Authentication(_)), "{error}");
    // Or answers with another name.
    let other = Some((Some("impostor".to_string()), b"ba9876543210".to_vec()));
    let error = run(
        config,
        options(Some(IQN), Some(alice(other, b"0123456789ab")), false),
    )
    .unwrap_err();
    assert!(error.to_string().contains("mutual CHAP"), "{error}");
}

#[test]
fn refusals_name_their_status() {
    let error = run(
        config(None, TargetLimits::default()),
        options(Some("iqn.2026-11.dev.blockwire:nothing"), None, false),
    )
    .unwrap_err();
    assert_eq!(error.to_string(), "target not found (0x0203)");
    let redirect = LoginError::Refused {
        status: 0x0101,
        redirect: Some("10.0.0.2:3260,1".into()),
    };
    assert_eq!(
        redirect.to_string(),
        "target moved temporarily (0x0101): target moved to 10.0.0.2:3260,1"
    );
}

#[test]
fn discovery_sessions() {
    let (params, negotiated) = run(
        config(None, TargetLimits::default()),
        options(None, None, false),
    )
    .unwrap();
    assert_eq!(
        negotiated.session_type,
        crate::login::SessionType::Discovery
    );
    assert_eq!(params.target_max_recv, 256 * 1024);
}

#[test]
fn continued_responses_are_gathered() {
    let mut initiator = InitiatorLogin::new(options(Some(IQN), None, false));
    let LoginStep::Send { request, .. } = initiator.start() else {
        panic!("a request first");
    };
    let response = LoginResponse {
        continue_bit: true,
        current_stage: request.current_stage,
        ..LoginResponse::default()
    };
    // The first part: the initiator asks for the rest with an empty request.
    let LoginStep::Send {
        request: next,
        data,
    } = initiator.handle(&response, b"TargetAlias=di").unwrap()
    else {
        panic!("asks for more");
    };
    assert!(data.is_empty());
    // Still ready to leave the security stage, as the first request said.
    assert!(next.transit && !next.continue_bit);
    assert_eq!(next.next_stage, 1);
    let last = LoginResponse {
        transit: true,
        current_stage: 0,
        next_stage: 1,
        ..LoginResponse::default()
    };
    // The rest, with T: it moves on to the operational stage.
    let LoginStep::Send { request, data } = initiator.handle(&last, b"sk\0").unwrap() else {
        panic!("operational keys next");
    };
    assert_eq!(request.current_stage, 1);
    assert!(String::from_utf8_lossy(&data).contains("InitialR2T=No"));
}

#[test]
fn bad_responses_are_errors_not_panics() {
    let mut initiator = InitiatorLogin::new(options(Some(IQN), None, false));
    initiator.start();
    let wrong_stage = LoginResponse {
        current_stage: 1,
        ..LoginResponse::default()
    };
    assert!(matches!(
        initiator.handle(&wrong_stage, b""),
        Err(LoginError::Protocol(_))
    ));
    let mut initiator = InitiatorLogin::new(options(Some(IQN), None, false));
    initiator.start();
    assert!(initiator
        .handle(&LoginResponse::default(), b"\xff\xfe")
        .is_err());
    let mut initiator = InitiatorLogin::new(options(Some(IQN), None, false));
    initiator.start();
    let both = LoginResponse {
        transit: true,
        continue_bit: true,
        ..LoginResponse::default()
    };
    assert!(initiator.handle(&both, b"").is_err());
}

mod arbitrary {
    use proptest::prelude::*;

    use super::*;

    fn response() -> impl Strategy<Value = LoginResponse> {
        (
            any::<(bool, bool, u8, u8, u8, u8)>(),
            any::<(u16, u32, u32, u32, u32)>(),
        )
            .prop_map(
                |((transit, continue_bit, csg, nsg, class, detail), (tsih, itt, a, b, c))| {
                    LoginResponse {
                        transit,
                        continue_bit,
                        current_stage: csg & 3,
                        next_stage: nsg & 3,
                        status_class: class % 4,
                        status_detail: detail % 4,
                        tsih,
                        initiator_task_tag: itt,
                        stat_sn: a,
                        exp_cmd_sn: b,
                        max_cmd_sn: c,
                        ..LoginResponse::default()
                    }
                },
            )
    }

    fn text() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                prop_oneof![
                    Just("AuthMethod=CHAP"),
                    Just("AuthMethod=None"),
                    Just("CHAP_A=5"),
                    Just("CHAP_I=7"),
                    Just("CHAP_C=0x0102"),
                    Just("CHAP_N=target"),
                    Just("CHAP_R=0xff"),
                    Just("MaxRecvDataSegmentLength=0"),
                    Just("MaxBurstLength=99999999999"),
                    Just("FirstBurstLength=512"),
                    Just("HeaderDigest=Reject"),
                    Just("InitialR2T=Yes"),
                    Just("X-odd=1"),
                ],
                0..6
            )
            .prop_map(|keys| {
                let mut out = Vec::new();
                for key in keys {
                    out.extend_from_slice(key.as_bytes());
                    out.push(0);
                }
                out
            }),
        ]
    }

    proptest! {
        /// Whatever the target answers, the login answers with a request, a
        /// result or an error: never a panic, and never more than it allows.
        #[test]
        fn arbitrary_responses_never_panic(
            steps in proptest::collection::vec((response(), text()), 1..12),
            chap in any::<bool>(),
            mutual in any::<bool>(),
        ) {
            let credentials = chap.then(|| Credentials {
                user: "u".into(),
                secret: b"0123456789ab".to_vec(),
                mutual: mutual.then(|| (None, b"ba9876543210".to_vec())),
            });
            let mut login = InitiatorLogin::new(options(Some(IQN), credentials, false));
            login.start();
            for (response, data) in steps {
                match login.handle(&response, &data) {
                    Ok(LoginStep::Send { .. }) => {}
                    Ok(LoginStep::Done(params)) => {
                        prop_assert!(params.first_burst_length <= params.max_burst_length);
                        prop_assert!(params.target_max_recv >= 512);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }
}
