//! Login and text negotiation against the sequences real initiators send
//! (libiscsi's lib/login.c, open-iscsi), key by key, and against bad input.

use std::sync::Arc;

use super::chap::encode_hex;
use super::*;
use crate::pdu::text;
use crate::pdu::LoginRequest;

const INITIATOR: &str = "iqn.2026-01.test:initiator";
const TARGET: &str = "iqn.2026-01.test:disk1";
const LOCKED: &str = "iqn.2026-01.test:locked";
const SECRET: &[u8] = b"secretsecret";
const MUTUAL_SECRET: &[u8] = b"targetsecret1";

fn chap() -> ChapConfig {
    ChapConfig {
        user: "alice".into(),
        secret: SECRET.to_vec(),
        mutual: Some(("disk1-target".into(), MUTUAL_SECRET.to_vec())),
    }
}

fn config() -> LoginConfig {
    LoginConfig {
        targets: vec![
            TargetEntry {
                name: TARGET.into(),
                alias: Some("disk one".into()),
                portal_group_tag: 1,
                allowed_initiators: Vec::new(),
                chap: None,
            },
            TargetEntry {
                name: LOCKED.into(),
                alias: None,
                portal_group_tag: 1,
                allowed_initiators: vec!["iqn.2026-01.test:other".into()],
                chap: None,
            },
            TargetEntry {
                name: "iqn.2026-01.test:chap".into(),
                alias: None,
                portal_group_tag: 2,
                allowed_initiators: Vec::new(),
                chap: Some(chap()),
            },
        ],
        discovery_chap: None,
        limits: TargetLimits::default(),
        portals: vec!["127.0.0.1:3260,1".into(), "[::1]:3260,1".into()],
    }
}

fn request(current_stage: u8, next_stage: u8, transit: bool) -> LoginRequest {
    LoginRequest {
        transit,
        continue_bit: false,
        current_stage,
        next_stage,
        version_max: 0,
        version_min: 0,
        isid: 0x0002_3d00_0001,
        tsih: 0,
        initiator_task_tag: 0x1234,
        cid: 1,
        cmd_sn: 7,
        exp_stat_sn: 100,
    }
}

fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
    text::encode(pairs)
}

fn parse(data: &[u8]) -> Vec<(String, String)> {
    text::parse(data).expect("our own text parses")
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The keys libiscsi sends in its operational stage (lib/login.c).
fn libiscsi_operational() -> Vec<(&'static str, &'static str)> {
    vec![
        ("HeaderDigest", "None,CRC32C"),
        ("DataDigest", "None"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxBurstLength", "262144"),
        ("FirstBurstLength", "262144"),
        ("DefaultTime2Wait", "2"),
        ("DefaultTime2Retain", "0"),
        ("MaxOutstandingR2T", "1"),
        ("ErrorRecoveryLevel", "0"),
        ("IFMarker", "No"),
        ("OFMarker", "No"),
        ("MaxConnections", "1"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("DataPDUInOrder", "Yes"),
        ("DataSequenceInOrder", "Yes"),
    ]
}

fn expect_continue(step: LoginStep) -> (LoginResponse, Vec<(String, String)>) {
    match step {
        LoginStep::Continue { response, data } => {
            assert_eq!(response.status_class, 0);
            (response, parse(&data))
        }
        other => panic!("expected Continue, got {other:?}"),
    }
}

fn expect_complete(step: LoginStep) -> (LoginResponse, Vec<(String, String)>, Negotiated) {
    match step {
        LoginStep::Complete {
            response,
            data,
            negotiated,
        } => {
            assert_eq!(response.status_class, 0);
            assert!(response.transit);
            assert_eq!(response.next_stage, stage::FULL_FEATURE);
            (response, parse(&data), negotiated)
        }
        other => panic!("expected Complete, got {other:?}"),
    }
}

fn expect_fail(step: LoginStep, status: u16) -> String {
    match step {
        LoginStep::Fail {
            response,
            data,
            reason,
        } => {
            assert_eq!(
                u16::from(response.status_class) << 8 | u16::from(response.status_detail),
                status,
                "{reason}"
            );
            assert!(!response.transit);
            assert!(data.is_empty());
            reason
        }
        other => panic!("expected Fail with {status:#06x}, got {other:?}"),
    }
}

fn machine(config: LoginConfig) -> LoginMachine {
    LoginMachine::new(Arc::new(config))
}

/// One operational-stage request straight to full feature (open-iscsi without
/// authentication), with the identity keys and `keys`.
fn operational_login(
    config: LoginConfig,
    keys: &[(&str, &str)],
) -> (Vec<(String, String)>, Negotiated) {
    let mut login = machine(config);
    let mut pairs = vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)];
    pairs.extend_from_slice(keys);
    let (_, answers, negotiated) = expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&pairs),
    ));
    (answers, negotiated)
}

/// Reads CHAP_A, CHAP_I and CHAP_C out of a challenge.
fn challenge(answers: &[(String, String)]) -> (ChapAlgorithm, u8, Vec<u8>) {
    let algorithm = ChapAlgorithm::from_code(get(answers, "CHAP_A").unwrap().parse().unwrap())
        .expect("an algorithm we know");
    let id: u8 = get(answers, "CHAP_I").unwrap().parse().unwrap();
    let hex = get(answers, "CHAP_C").unwrap();
    let bytes = chap::decode_binary(hex).unwrap();
    assert_eq!(bytes.len(), algorithm.digest_len());
    (algorithm, id, bytes)
}

#[test]
fn chap_md5_vector() {
    // Pinned from `md5sum` of 0x01 || "secretsecret" || 00 01 .. 0f.
    let challenge: Vec<u8> = (0u8..16).collect();
    let response = chap_response(ChapAlgorithm::Md5, 1, SECRET, &challenge);
    assert_eq!(encode_hex(&response), "0x226dc576c33f04ff9c3a200ffe35f442");
}

#[test]
fn chap_sha256_vector() {
    // Pinned from Python's hashlib.sha256 of 0xa5 || "secretsecret" || 00 .. 1f.
    let challenge: Vec<u8> = (0u8..32).collect();
    let response = chap_response(ChapAlgorithm::Sha256, 0xa5, SECRET, &challenge);
    assert_eq!(
        encode_hex(&response),
        "0x8d46beb922a6d272fb1f53cf59e198dabc2fdab088175f0150f387512c0da779"
    );
}

#[test]
fn libiscsi_login_without_authentication() {
    // libiscsi without a CHAP user starts in the operational stage; it sends no
    // SessionType (Normal by default).
    let (answers, negotiated) = operational_login(config(), &libiscsi_operational());
    let expected = [
        ("TargetPortalGroupTag", "1"),
        ("TargetAlias", "disk one"),
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxBurstLength", "262144"),
        ("FirstBurstLength", "262144"),
        ("DefaultTime2Wait", "2"),
        ("DefaultTime2Retain", "0"),
        ("MaxOutstandingR2T", "1"),
        ("ErrorRecoveryLevel", "0"),
        ("IFMarker", "No"),
        ("OFMarker", "No"),
        ("MaxConnections", "1"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("DataPDUInOrder", "Yes"),
        ("DataSequenceInOrder", "Yes"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(answers, expected);
    assert_eq!(
        negotiated,
        Negotiated {
            session_type: SessionType::Normal,
            initiator_name: INITIATOR.into(),
            initiator_alias: None,
            target_name: Some(TARGET.into()),
            isid: 0x0002_3d00_0001,
            tsih: 0,
            cid: 1,
            header_digest: false,
            data_digest: false,
            initiator_max_recv_data_segment_length: 262_144,
            target_max_recv_data_segment_length: 262_144,
            max_burst_length: 262_144,
            first_burst_length: 262_144,
            initial_r2t: false,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            default_time2wait: 2,
            default_time2retain: 0,
            error_recovery_level: 0,
            max_connections: 1,
            stat_sn: 101,
            exp_cmd_sn: 7,
        }
    );
}

#[test]
fn sequence_numbers_of_responses() {
    let mut login = machine(config());
    let mut first = request(stage::SECURITY, stage::OPERATIONAL, true);
    first.exp_stat_sn = u32::MAX;
    first.cmd_sn = 0xffff_fff0;
    let (response, _) = expect_continue(login.handle(
        &first,
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]),
    ));
    assert_eq!(response.stat_sn, u32::MAX);
    assert_eq!(response.exp_cmd_sn, 0xffff_fff0);
    // MaxCmdSN = ExpCmdSN + 128 - 1, wrapping (serial arithmetic).
    assert_eq!(response.max_cmd_sn, 0x6f);
    assert_eq!(response.initiator_task_tag, 0x1234);
    assert_eq!(response.isid, 0x0002_3d00_0001);
    assert!(response.transit);
    assert_eq!(response.current_stage, stage::SECURITY);
    assert_eq!(response.next_stage, stage::OPERATIONAL);
    let mut second = request(stage::OPERATIONAL, stage::FULL_FEATURE, true);
    second.exp_stat_sn = 0;
    second.cmd_sn = 0xffff_fff0;
    let (response, _, negotiated) = expect_complete(login.handle(&second, &[]));
    assert_eq!(response.stat_sn, 0);
    assert_eq!(negotiated.stat_sn, 1);
    assert_eq!(negotiated.exp_cmd_sn, 0xffff_fff0);
}

/// libiscsi with a CHAP user: AuthMethod=CHAP,None with T set, then CHAP_A without
/// T, then CHAP_N/CHAP_R (plus CHAP_I/CHAP_C when mutual) with T, then the
/// operational stage.
fn libiscsi_chap_login(
    target_chap: Option<ChapConfig>,
    algorithms: &str,
    mutual: bool,
) -> (Negotiated, Vec<(String, String)>) {
    let mut cfg = config();
    cfg.targets[0].chap = target_chap;
    let mut login = machine(cfg);
    let (response, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, true),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("InitiatorAlias", "host1"),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP,None"),
        ]),
    ));
    assert!(!response.transit, "authentication is still to come");
    assert_eq!(get(&answers, "AuthMethod"), Some("CHAP"));
    assert_eq!(get(&answers, "TargetPortalGroupTag"), Some("1"));

    let (response, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, false),
        &encode(&[("CHAP_A", algorithms)]),
    ));
    assert!(!response.transit);
    let (algorithm, id, target_challenge) = challenge(&answers);
    let answer = chap_response(algorithm, id, SECRET, &target_challenge);

    let mut keys = vec![
        ("CHAP_N".to_string(), "alice".to_string()),
        ("CHAP_R".to_string(), encode_hex(&answer)),
    ];
    let initiator_challenge: Vec<u8> = (100u8..132).collect();
    if mutual {
        keys.push(("CHAP_I".into(), "77".into()));
        keys.push(("CHAP_C".into(), encode_hex(&initiator_challenge)));
    }
    let (response, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, true),
        &text::encode(&keys),
    ));
    assert!(response.transit);
    assert_eq!(response.next_stage, stage::OPERATIONAL);
    if mutual {
        assert_eq!(get(&answers, "CHAP_N"), Some("disk1-target"));
        let expected = chap_response(algorithm, 77, MUTUAL_SECRET, &initiator_challenge);
        assert_eq!(
            get(&answers, "CHAP_R"),
            Some(encode_hex(&expected).as_str())
        );
    } else {
        assert!(answers.is_empty(), "{answers:?}");
    }

    let (_, answers, negotiated) = expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&libiscsi_operational()),
    ));
    // Not repeated after the first response.
    assert_eq!(get(&answers, "TargetPortalGroupTag"), None);
    assert_eq!(negotiated.stat_sn, 104);
    assert_eq!(negotiated.initiator_alias.as_deref(), Some("host1"));
    (negotiated, answers)
}

#[test]
fn libiscsi_chap_md5() {
    libiscsi_chap_login(Some(chap()), "5", false);
}

#[test]
fn chap_sha256_preferred_from_the_initiators_list() {
    libiscsi_chap_login(Some(chap()), "7,5", false);
    libiscsi_chap_login(Some(chap()), "6,5,7", false);
}

#[test]
fn mutual_chap() {
    libiscsi_chap_login(Some(chap()), "5", true);
    libiscsi_chap_login(Some(chap()), "7", true);
}

#[test]
fn chap_offered_to_a_target_without_chap_gets_none() {
    // libiscsi with a user offers CHAP,None; then repeats InitiatorName and
    // TargetName in the operational stage, which is allowed with the same values.
    let mut login = machine(config());
    let (response, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, true),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP,None"),
        ]),
    ));
    assert!(response.transit);
    assert_eq!(get(&answers, "AuthMethod"), Some("None"));
    let mut keys = vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)];
    keys.extend(libiscsi_operational());
    expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&keys),
    ));
}

/// Runs a CHAP login up to the challenge; returns the machine and the challenge.
fn chap_until_challenge(algorithms: &str) -> (LoginMachine, (ChapAlgorithm, u8, Vec<u8>)) {
    let mut cfg = config();
    cfg.targets[0].chap = Some(chap());
    let mut login = machine(cfg);
    expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, false),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP"),
        ]),
    ));
    let (_, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, false),
        &encode(&[("CHAP_A", algorithms)]),
    ));
    let challenge = challenge(&answers);
    (login, challenge)
}

#[test]
fn chap_failures() {
    let respond = |pairs: Vec<(String, String)>| {
        let (mut login, _) = chap_until_challenge("5");
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &text::encode(&pairs),
        )
    };
    let pair = |k: &str, v: String| (k.to_string(), v);

    // Wrong secret.
    let (mut login, (algorithm, id, c)) = chap_until_challenge("5");
    let wrong = chap_response(algorithm, id, b"not the secret", &c);
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &text::encode(&[
                pair("CHAP_N", "alice".into()),
                pair("CHAP_R", encode_hex(&wrong)),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // Right secret, wrong user.
    let (mut login, (algorithm, id, c)) = chap_until_challenge("5");
    let right = chap_response(algorithm, id, SECRET, &c);
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &text::encode(&[
                pair("CHAP_N", "bob".into()),
                pair("CHAP_R", encode_hex(&right)),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // A truncated response, garbage, a missing CHAP_R.
    expect_fail(
        respond(vec![
            pair("CHAP_N", "alice".into()),
            pair("CHAP_R", "0x0102".into()),
        ]),
        status::AUTHENTICATION_FAILURE,
    );
    expect_fail(
        respond(vec![
            pair("CHAP_N", "alice".into()),
            pair("CHAP_R", "hello".into()),
        ]),
        status::AUTHENTICATION_FAILURE,
    );
    expect_fail(
        respond(vec![pair("CHAP_N", "alice".into())]),
        status::AUTHENTICATION_FAILURE,
    );
    // Leaving the security stage before answering the challenge.
    expect_fail(respond(Vec::new()), status::AUTHENTICATION_FAILURE);
}

#[test]
fn chap_response_in_base64_is_accepted() {
    let (mut login, (algorithm, id, c)) = chap_until_challenge("5");
    let right = chap_response(algorithm, id, SECRET, &c);
    let base64 = format!("0b{}", base64(&right));
    let (response, _) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, true),
        &encode(&[("CHAP_N", "alice"), ("CHAP_R", &base64)]),
    ));
    assert!(response.transit);
}

/// A plain base64 encoder for the test (RFC 4648 §4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let mut buf = [0u8; 3];
        buf[..chunk.len()].copy_from_slice(chunk);
        let n = u32::from(buf[0]) << 16 | u32::from(buf[1]) << 8 | u32::from(buf[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    while !out.len().is_multiple_of(4) {
        out.push('=');
    }
    out
}

#[test]
fn mutual_chap_refusals() {
    // The initiator's challenge reflects ours back.
    let (mut login, (algorithm, id, c)) = chap_until_challenge("5");
    let right = encode_hex(&chap_response(algorithm, id, SECRET, &c));
    let reflected = encode_hex(&c);
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &encode(&[
                ("CHAP_N", "alice"),
                ("CHAP_R", &right),
                ("CHAP_I", "3"),
                ("CHAP_C", &reflected),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // Mutual CHAP asked of a target that has no mutual credentials.
    let mut cfg = config();
    cfg.targets[0].chap = Some(ChapConfig {
        mutual: None,
        ..chap()
    });
    let mut login = machine(cfg);
    expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, false),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP"),
        ]),
    ));
    let (_, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, false),
        &encode(&[("CHAP_A", "5")]),
    ));
    let (algorithm, id, c) = challenge(&answers);
    let right = encode_hex(&chap_response(algorithm, id, SECRET, &c));
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &encode(&[
                ("CHAP_N", "alice"),
                ("CHAP_R", &right),
                ("CHAP_I", "3"),
                ("CHAP_C", "0x0102030405060708"),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // CHAP_I without CHAP_C, and an identifier out of range.
    for extra in [
        vec![("CHAP_I", "3")],
        vec![("CHAP_I", "256"), ("CHAP_C", "0x01")],
    ] {
        let (mut login, (algorithm, id, c)) = chap_until_challenge("5");
        let right = encode_hex(&chap_response(algorithm, id, SECRET, &c));
        let mut keys = vec![("CHAP_N", "alice"), ("CHAP_R", right.as_str())];
        keys.extend(extra);
        expect_fail(
            login.handle(
                &request(stage::SECURITY, stage::OPERATIONAL, true),
                &encode(&keys),
            ),
            status::AUTHENTICATION_FAILURE,
        );
    }
}

#[test]
fn chap_required_refusals() {
    let mut cfg = config();
    cfg.targets[0].chap = Some(chap());
    // An initiator offering only None.
    let mut login = machine(cfg.clone());
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &encode(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("AuthMethod", "None"),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // An initiator skipping the security stage.
    let mut login = machine(cfg.clone());
    expect_fail(
        login.handle(
            &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
            &encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // An algorithm we do not support.
    let mut login = machine(cfg.clone());
    expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, false),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP"),
        ]),
    ));
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, false),
            &encode(&[("CHAP_A", "6,128")]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // CHAP_A before AuthMethod; CHAP keys to a target without CHAP.
    let mut login = machine(cfg);
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, false),
            &encode(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("CHAP_A", "5"),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    let mut login = machine(config());
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, false),
            &encode(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("CHAP_A", "5"),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
    // A security key in the operational stage.
    let mut login = machine(config());
    expect_fail(
        login.handle(
            &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
            &encode(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", TARGET),
                ("AuthMethod", "None"),
            ]),
        ),
        status::INITIATOR_ERROR,
    );
}

#[test]
fn security_straight_to_full_feature() {
    let mut login = machine(config());
    let (_, answers, negotiated) = expect_complete(login.handle(
        &request(stage::SECURITY, stage::FULL_FEATURE, true),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]),
    ));
    assert_eq!(get(&answers, "AuthMethod"), Some("None"));
    assert_eq!(get(&answers, "MaxRecvDataSegmentLength"), None);
    // Nothing declared: both sides hold to the RFC default, and every key to its own.
    assert_eq!(negotiated.target_max_recv_data_segment_length, 8192);
    assert_eq!(negotiated.initiator_max_recv_data_segment_length, 8192);
    assert_eq!(negotiated.max_burst_length, 262_144);
    assert_eq!(negotiated.first_burst_length, 65_536);
    assert!(negotiated.initial_r2t);
    assert!(negotiated.immediate_data);
    assert_eq!(negotiated.max_outstanding_r2t, 1);
    assert_eq!(negotiated.default_time2retain, 20);
}

#[test]
fn open_iscsi_declares_our_max_recv_even_when_it_declares_none() {
    let (answers, negotiated) = operational_login(config(), &[("HeaderDigest", "CRC32C,None")]);
    assert_eq!(get(&answers, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(negotiated.target_max_recv_data_segment_length, 262_144);
    assert_eq!(negotiated.initiator_max_recv_data_segment_length, 8192);
    assert!(negotiated.header_digest);
}

#[test]
fn each_key_follows_its_rule() {
    // (key, offered value, our answer, check on the result)
    type Check = fn(&Negotiated) -> bool;
    let table: &[(&str, &str, &str, Check)] = &[
        ("HeaderDigest", "CRC32C,None", "CRC32C", |n| n.header_digest),
        ("HeaderDigest", "None,CRC32C", "None", |n| !n.header_digest),
        ("DataDigest", "CRC32C", "CRC32C", |n| n.data_digest),
        ("DataDigest", "MD5,CRC32C", "CRC32C", |n| n.data_digest),
        ("DataDigest", "MD5", "Reject", |n| !n.data_digest),
        ("MaxBurstLength", "1048576", "1048576", |n| {
            n.max_burst_length == 1_048_576
        }),
        ("MaxBurstLength", "16777215", "16776192", |n| {
            n.max_burst_length == 16_776_192
        }),
        ("MaxBurstLength", "511", "Reject", |n| {
            n.max_burst_length == 262_144
        }),
        ("MaxBurstLength", "16777216", "Reject", |n| {
            n.max_burst_length == 262_144
        }),
        ("MaxBurstLength", "0x10000", "65536", |n| {
            n.max_burst_length == 65_536
        }),
        ("MaxBurstLength", "12ab", "Reject", |n| {
            n.max_burst_length == 262_144
        }),
        ("FirstBurstLength", "1048576", "262144", |n| {
            n.first_burst_length == 262_144
        }),
        ("FirstBurstLength", "4096", "4096", |n| {
            n.first_burst_length == 4096
        }),
        ("InitialR2T", "Yes", "Yes", |n| n.initial_r2t),
        ("InitialR2T", "No", "No", |n| !n.initial_r2t),
        ("InitialR2T", "Maybe", "Reject", |n| n.initial_r2t),
        ("ImmediateData", "Yes", "Yes", |n| n.immediate_data),
        ("ImmediateData", "No", "No", |n| !n.immediate_data),
        ("MaxOutstandingR2T", "16", "8", |n| {
            n.max_outstanding_r2t == 8
        }),
        ("MaxOutstandingR2T", "2", "2", |n| {
            n.max_outstanding_r2t == 2
        }),
        ("MaxOutstandingR2T", "0", "Reject", |n| {
            n.max_outstanding_r2t == 1
        }),
        ("DataPDUInOrder", "No", "Yes", |n| n.data_pdu_in_order),
        ("DataSequenceInOrder", "No", "Yes", |n| {
            n.data_sequence_in_order
        }),
        ("DefaultTime2Wait", "0", "2", |n| n.default_time2wait == 2),
        ("DefaultTime2Wait", "10", "10", |n| {
            n.default_time2wait == 10
        }),
        ("DefaultTime2Wait", "3601", "Reject", |n| {
            n.default_time2wait == 2
        }),
        ("DefaultTime2Retain", "60", "20", |n| {
            n.default_time2retain == 20
        }),
        ("DefaultTime2Retain", "5", "5", |n| {
            n.default_time2retain == 5
        }),
        ("ErrorRecoveryLevel", "2", "0", |n| {
            n.error_recovery_level == 0
        }),
        ("ErrorRecoveryLevel", "3", "Reject", |n| {
            n.error_recovery_level == 0
        }),
        ("MaxConnections", "8", "1", |n| n.max_connections == 1),
        ("MaxRecvDataSegmentLength", "65536", "262144", |n| {
            n.initiator_max_recv_data_segment_length == 65_536
        }),
        ("MaxRecvDataSegmentLength", "33554432", "262144", |n| {
            n.initiator_max_recv_data_segment_length == 16_777_215
        }),
        ("OFMarker", "Yes", "No", |_| true),
        ("IFMarker", "No", "No", |_| true),
        ("OFMarkInt", "2048~8192", "Irrelevant", |_| true),
        ("IFMarkInt", "2048", "Irrelevant", |_| true),
        ("TaskReporting", "FastAbort", "RFC3720", |_| true),
        ("iSCSIProtocolLevel", "2", "1", |_| true),
        ("RDMAExtensions", "Yes", "No", |_| true),
        ("X-com.example.Thing", "1", "NotUnderstood", |_| true),
        ("MadeUpKey", "1", "NotUnderstood", |_| true),
        ("TargetAddress", "10.0.0.1", "Reject", |_| true),
        // Our own declaration stands, once.
        ("TargetAlias", "me", "disk one", |_| true),
        ("SendTargets", "All", "Reject", |_| true),
    ];
    for &(key, offered, answer, check) in table {
        let (answers, negotiated) = operational_login(config(), &[(key, offered)]);
        assert_eq!(get(&answers, key), Some(answer), "{key}={offered}");
        assert_eq!(answers.iter().filter(|(k, _)| k == key).count(), 1);
        assert!(check(&negotiated), "{key}={offered}: {negotiated:?}");
    }
}

#[test]
fn target_limits_shape_the_answers() {
    let mut cfg = config();
    cfg.limits.header_digest = DigestChoice::Crc32cOnly;
    cfg.limits.data_digest = DigestChoice::NoneOnly;
    cfg.limits.immediate_data = false;
    cfg.limits.initial_r2t = true;
    cfg.limits.max_recv_data_segment_length = 64 * 1024;
    let (answers, negotiated) = operational_login(
        cfg,
        &[
            ("HeaderDigest", "None,CRC32C"),
            ("DataDigest", "CRC32C,None"),
            ("ImmediateData", "Yes"),
            ("InitialR2T", "No"),
            ("MaxRecvDataSegmentLength", "8192"),
        ],
    );
    assert_eq!(get(&answers, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(get(&answers, "DataDigest"), Some("None"));
    assert_eq!(get(&answers, "ImmediateData"), Some("No"));
    assert_eq!(get(&answers, "InitialR2T"), Some("Yes"));
    assert_eq!(get(&answers, "MaxRecvDataSegmentLength"), Some("65536"));
    assert!(negotiated.header_digest && !negotiated.data_digest);
    assert!(!negotiated.immediate_data && negotiated.initial_r2t);
    assert_eq!(negotiated.target_max_recv_data_segment_length, 65_536);

    let mut cfg = config();
    cfg.limits.header_digest = DigestChoice::Crc32cOnly;
    let (answers, negotiated) = operational_login(cfg, &[("HeaderDigest", "None")]);
    assert_eq!(get(&answers, "HeaderDigest"), Some("Reject"));
    assert!(!negotiated.header_digest);
}

#[test]
fn first_burst_never_exceeds_max_burst() {
    let (answers, negotiated) = operational_login(
        config(),
        &[("FirstBurstLength", "131072"), ("MaxBurstLength", "65536")],
    );
    assert_eq!(get(&answers, "FirstBurstLength"), Some("65536"));
    assert_eq!(get(&answers, "MaxBurstLength"), Some("65536"));
    assert_eq!(negotiated.first_burst_length, 65_536);
    // Only MaxBurstLength offered, below the default FirstBurstLength.
    let (_, negotiated) = operational_login(config(), &[("MaxBurstLength", "4096")]);
    assert_eq!(negotiated.first_burst_length, 4096);
}

#[test]
fn bad_max_recv_data_segment_length_fails() {
    for value in ["511", "0", "lots", ""] {
        let mut login = machine(config());
        expect_fail(
            login.handle(
                &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
                &encode(&[
                    ("InitiatorName", INITIATOR),
                    ("TargetName", TARGET),
                    ("MaxRecvDataSegmentLength", value),
                ]),
            ),
            status::INITIATOR_ERROR,
        );
    }
}

#[test]
fn identity_failures() {
    let attempt = |keys: &[(&str, &str)]| {
        let mut login = machine(config());
        login.handle(
            &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
            &encode(keys),
        )
    };
    expect_fail(
        attempt(&[("InitiatorName", INITIATOR), ("TargetName", "iqn.nope")]),
        status::TARGET_NOT_FOUND,
    );
    expect_fail(
        attempt(&[("InitiatorName", INITIATOR), ("TargetName", LOCKED)]),
        status::AUTHORIZATION_FAILURE,
    );
    expect_fail(
        attempt(&[("TargetName", TARGET)]),
        status::MISSING_PARAMETER,
    );
    expect_fail(
        attempt(&[("InitiatorName", ""), ("TargetName", TARGET)]),
        status::MISSING_PARAMETER,
    );
    expect_fail(
        attempt(&[("InitiatorName", INITIATOR)]),
        status::MISSING_PARAMETER,
    );
    expect_fail(
        attempt(&[
            ("InitiatorName", INITIATOR),
            ("SessionType", "Weird"),
            ("TargetName", TARGET),
        ]),
        status::SESSION_TYPE_NOT_SUPPORTED,
    );
    // The ACL lets the listed initiator in, case-insensitively.
    let mut login = machine(config());
    expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&[
            ("InitiatorName", "IQN.2026-01.test:OTHER"),
            ("TargetName", LOCKED),
        ]),
    ));
}

#[test]
fn protocol_violations_fail() {
    let keys = encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]);
    let attempt = |request: LoginRequest, data: &[u8]| machine(config()).handle(&request, data);

    let mut versioned = request(stage::OPERATIONAL, stage::FULL_FEATURE, true);
    versioned.version_min = 1;
    versioned.version_max = 2;
    expect_fail(attempt(versioned, &keys), status::UNSUPPORTED_VERSION);
    // A range that includes 0 is fine.
    let mut versioned = request(stage::OPERATIONAL, stage::FULL_FEATURE, true);
    versioned.version_max = 5;
    expect_complete(attempt(versioned, &keys));

    for (csg, nsg, transit) in [
        (3, 3, true),
        (2, 3, true),
        (1, 1, true),
        (0, 0, true),
        (1, 2, true),
        (0, 2, true),
    ] {
        expect_fail(
            attempt(request(csg, nsg, transit), &keys),
            status::INITIATOR_ERROR,
        );
    }
    let mut both = request(stage::SECURITY, stage::OPERATIONAL, true);
    both.continue_bit = true;
    expect_fail(attempt(both, &keys), status::INITIATOR_ERROR);

    let duplicated = encode(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", TARGET),
        ("MaxBurstLength", "65536"),
        ("MaxBurstLength", "65536"),
    ]);
    expect_fail(
        attempt(request(1, 3, true), &duplicated),
        status::INITIATOR_ERROR,
    );
    expect_fail(
        attempt(request(1, 3, true), b"InitiatorName=\xff\xfe\0"),
        status::INITIATOR_ERROR,
    );
    let long_key = format!("{}=1", "K".repeat(64));
    expect_fail(
        attempt(request(1, 3, true), long_key.as_bytes()),
        status::INITIATOR_ERROR,
    );
    let long_value = format!("InitiatorName={}", "v".repeat(300));
    expect_fail(
        attempt(request(1, 3, true), long_value.as_bytes()),
        status::INITIATOR_ERROR,
    );
    expect_fail(
        attempt(request(1, 3, true), b"NoEquals\0"),
        status::INITIATOR_ERROR,
    );
}

#[test]
fn keys_negotiated_twice_across_requests_fail() {
    let mut login = machine(config());
    expect_continue(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, false),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("MaxBurstLength", "65536"),
        ]),
    ));
    expect_fail(
        login.handle(
            &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
            &encode(&[("MaxBurstLength", "65536")]),
        ),
        status::INITIATOR_ERROR,
    );
    // Identity keys may be repeated, but not changed.
    let mut login = machine(config());
    expect_continue(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, false),
        &encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
    ));
    expect_fail(
        login.handle(
            &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
            &encode(&[("TargetName", LOCKED)]),
        ),
        status::INITIATOR_ERROR,
    );
}

#[test]
fn stages_and_nexus_must_stay_consistent() {
    // Back to the security stage after moving on.
    let mut login = machine(config());
    expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, true),
        &encode(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", TARGET),
            ("AuthMethod", "None"),
        ]),
    ));
    expect_fail(
        login.handle(&request(stage::SECURITY, stage::OPERATIONAL, true), &[]),
        status::INITIATOR_ERROR,
    );
    // A changed ISID.
    let mut login = machine(config());
    expect_continue(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, false),
        &encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
    ));
    let mut other = request(stage::OPERATIONAL, stage::FULL_FEATURE, true);
    other.isid += 1;
    expect_fail(login.handle(&other, &[]), status::INITIATOR_ERROR);
    // Nothing after a failure or completion.
    expect_fail(
        login.handle(&request(stage::OPERATIONAL, stage::FULL_FEATURE, true), &[]),
        status::INITIATOR_ERROR,
    );
    let mut login = machine(config());
    expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
    ));
    expect_fail(
        login.handle(&request(stage::OPERATIONAL, stage::FULL_FEATURE, true), &[]),
        status::INITIATOR_ERROR,
    );
}

#[test]
fn continued_text_is_gathered() {
    let mut keys = vec![("InitiatorName", INITIATOR), ("TargetName", TARGET)];
    keys.extend(libiscsi_operational());
    let whole = encode(&keys);
    let mut login = machine(config());
    // Split mid-pair, in three pieces.
    let pieces = [&whole[..10], &whole[10..100], &whole[100..]];
    for (index, piece) in pieces.iter().enumerate() {
        let last = index == pieces.len() - 1;
        let mut req = request(stage::OPERATIONAL, stage::FULL_FEATURE, last);
        req.continue_bit = !last;
        let step = login.handle(&req, piece);
        if last {
            let (response, answers, negotiated) = expect_complete(step);
            assert_eq!(response.stat_sn, 102);
            assert_eq!(get(&answers, "MaxBurstLength"), Some("262144"));
            assert!(!negotiated.initial_r2t);
        } else {
            let (response, answers) = expect_continue(step);
            assert!(answers.is_empty());
            assert!(!response.transit && !response.continue_bit);
            assert_eq!(response.stat_sn, 100 + index as u32);
        }
    }
}

#[test]
fn continued_text_is_bounded() {
    let mut login = machine(config());
    let chunk = vec![b'a'; 8192];
    let mut req = request(stage::OPERATIONAL, stage::FULL_FEATURE, false);
    req.continue_bit = true;
    for _ in 0..8 {
        expect_continue(login.handle(&req, &chunk));
    }
    expect_fail(login.handle(&req, &chunk), status::INITIATOR_ERROR);
}

#[test]
fn a_login_that_never_concludes_is_ended() {
    let mut login = machine(config());
    let req = request(stage::OPERATIONAL, stage::FULL_FEATURE, false);
    expect_continue(login.handle(
        &req,
        &encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
    ));
    for _ in 1..machine::MAX_LOGIN_REQUESTS {
        expect_continue(login.handle(&req, &[]));
    }
    expect_fail(login.handle(&req, &[]), status::INITIATOR_ERROR);
}

#[test]
fn failure_response_keeps_the_sequence_numbers() {
    let mut login = machine(config());
    let (response, _, _) = expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&[("InitiatorName", INITIATOR), ("TargetName", TARGET)]),
    ));
    let refused = failure_response(&response, status::SESSION_DOES_NOT_EXIST);
    assert_eq!(refused.status_class, 2);
    assert_eq!(refused.status_detail, 0x0a);
    assert!(!refused.transit);
    assert_eq!(refused.stat_sn, response.stat_sn);
    assert_eq!(refused.initiator_task_tag, response.initiator_task_tag);
}

fn discovery_login(cfg: LoginConfig, initiator: &str) -> (Vec<(String, String)>, Negotiated) {
    let mut login = machine(cfg);
    let (response, answers) = expect_continue(login.handle(
        &request(stage::SECURITY, stage::OPERATIONAL, true),
        &encode(&[
            ("InitiatorName", initiator),
            ("SessionType", "Discovery"),
            ("AuthMethod", "None"),
        ]),
    ));
    assert!(response.transit);
    assert_eq!(get(&answers, "TargetPortalGroupTag"), None);
    let (_, answers, negotiated) = expect_complete(login.handle(
        &request(stage::OPERATIONAL, stage::FULL_FEATURE, true),
        &encode(&libiscsi_operational()),
    ));
    (answers, negotiated)
}

#[test]
fn discovery_session() {
    let (answers, negotiated) = discovery_login(config(), INITIATOR);
    assert_eq!(negotiated.session_type, SessionType::Discovery);
    assert_eq!(negotiated.target_name, None);
    for key in [
        "MaxBurstLength",
        "FirstBurstLength",
        "InitialR2T",
        "ImmediateData",
        "MaxOutstandingR2T",
        "DataPDUInOrder",
        "DataSequenceInOrder",
        "MaxConnections",
    ] {
        assert_eq!(get(&answers, key), Some("Irrelevant"), "{key}");
    }
    assert_eq!(get(&answers, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(get(&answers, "HeaderDigest"), Some("None"));
}

#[test]
fn discovery_chap() {
    let mut cfg = config();
    cfg.discovery_chap = Some(chap());
    let mut login = machine(cfg);
    expect_fail(
        login.handle(
            &request(stage::SECURITY, stage::OPERATIONAL, true),
            &encode(&[
                ("InitiatorName", INITIATOR),
                ("SessionType", "Discovery"),
                ("AuthMethod", "None"),
            ]),
        ),
        status::AUTHENTICATION_FAILURE,
    );
}

#[test]
fn send_targets() {
    let cfg = config();
    let (_, discovery) = discovery_login(cfg.clone(), INITIATOR);
    let answer = |negotiated: &Negotiated, request: &[u8]| {
        parse(&answer_text(&cfg, negotiated, request).unwrap())
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    // All: every target the initiator may see (not the locked one).
    assert_eq!(
        answer(&discovery, b"SendTargets=All\0"),
        pairs(&[
            ("TargetName", TARGET),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "[::1]:3260,1"),
            ("TargetName", "iqn.2026-01.test:chap"),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "[::1]:3260,1"),
        ])
    );
    // One by name; a hidden or unknown one gives nothing.
    assert_eq!(
        answer(&discovery, b"SendTargets=iqn.2026-01.test:chap\0"),
        pairs(&[
            ("TargetName", "iqn.2026-01.test:chap"),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "[::1]:3260,1"),
        ])
    );
    assert!(answer(&discovery, format!("SendTargets={LOCKED}\0").as_bytes()).is_empty());
    assert!(answer(&discovery, b"SendTargets=iqn.none\0").is_empty());
    assert_eq!(
        answer(&discovery, b"SendTargets=\0"),
        pairs(&[("SendTargets", "Reject")])
    );
    // The other initiator sees the locked target too.
    let (_, other) = discovery_login(cfg.clone(), "iqn.2026-01.test:other");
    assert_eq!(
        answer(&other, b"SendTargets=All\0")
            .iter()
            .filter(|(k, _)| k == "TargetName")
            .count(),
        3
    );

    // A normal session: empty means its own target; All is refused.
    let (_, normal) = operational_login(cfg.clone(), &[]);
    assert_eq!(
        answer(&normal, b"SendTargets=\0"),
        pairs(&[
            ("TargetName", TARGET),
            ("TargetAddress", "127.0.0.1:3260,1"),
            ("TargetAddress", "[::1]:3260,1"),
        ])
    );
    assert_eq!(
        answer(&normal, b"SendTargets=All\0"),
        pairs(&[("SendTargets", "Reject")])
    );
    // Other keys.
    assert_eq!(
        answer(&normal, b"X-vendor.Key=1\0MaxBurstLength=4096\0"),
        pairs(&[
            ("X-vendor.Key", "NotUnderstood"),
            ("MaxBurstLength", "Reject")
        ])
    );
    assert!(answer(&normal, b"").is_empty());
    // Bad text.
    assert_eq!(
        answer_text(&cfg, &normal, b"SendTargets=All\0SendTargets=All\0"),
        Err(TextAnswerError::DuplicateKey("SendTargets".into()))
    );
    assert!(matches!(
        answer_text(&cfg, &normal, b"SendTargets\0"),
        Err(TextAnswerError::Malformed(_))
    ));
}

#[test]
fn chap_secrets_stay_out_of_debug_output() {
    let shown = format!("{:?}", chap());
    assert!(shown.contains("alice"));
    assert!(!shown.contains("secretsecret"));
    assert!(!shown.contains("targetsecret1"));
}
