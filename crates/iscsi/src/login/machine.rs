//! One connection's login phase on the target side (RFC 7143 §6.3, §11.12, §11.13).

use std::collections::HashSet;
use std::sync::Arc;

use super::chap::{self, ChapAlgorithm};
use super::keys::{self, KeyClass, Outcome, Params, DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH};
use super::{stage, status, ChapConfig, LoginConfig, LoginStep, Negotiated, SessionType};
use crate::pdu::text;
use crate::pdu::{LoginRequest, LoginResponse};

/// The most text one login request may accumulate over C-bit continuations. The
/// keys a login needs fit in a few KiB; this bounds what a peer can make us hold.
pub const MAX_LOGIN_TEXT: usize = 64 * 1024;
/// The most Login Requests one login may take. A CHAP login with continuations needs
/// well under ten; this ends a peer that never concludes.
pub const MAX_LOGIN_REQUESTS: u32 = 64;
/// The longest challenge we answer for mutual CHAP (RFC 7143 §12.1.3 bounds binary
/// values; 1024 bytes is far beyond any real initiator's).
const MAX_INITIATOR_CHALLENGE: usize = 1024;

/// Who is logging in, to what: settled by the first complete request.
#[derive(Debug, Clone)]
struct Identity {
    session_type: SessionType,
    initiator_name: String,
    initiator_alias: Option<String>,
    /// Index into `LoginConfig::targets`; None for discovery.
    target: Option<usize>,
}

/// Where authentication stands.
#[derive(Debug, Clone)]
enum Auth {
    /// No AuthMethod agreed yet.
    Pending,
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    ChapAlgorithm,
    /// Challenge sent; waiting for CHAP_N and CHAP_R.
    ChapResponse {
        algorithm: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    /// Authenticated (or no authentication needed).
    Done,
}

/// The header fields every request of one login must repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Nexus {
    isid: u64,
    tsih: u16,
    cid: u16,
}

/// The target side of one connection's login phase (RFC 7143 §6, §12, §13).
///
/// Feed each Login Request with [`LoginMachine::handle`] and send what it returns;
/// after a `Complete` or `Fail` the machine refuses further requests.
pub struct LoginMachine {
    config: Arc<LoginConfig>,
    finished: bool,
    /// The stage the next request must be in (known after the first request).
    stage: Option<u8>,
    nexus: Option<Nexus>,
    /// StatSN of the next response.
    stat_sn: u32,
    exp_cmd_sn: u32,
    requests: u32,
    /// Text of a request continued with the C bit.
    pending: Vec<u8>,
    identity: Option<Identity>,
    /// Non-identity keys received so far: none may come twice (§6.2).
    seen: HashSet<String>,
    auth: Auth,
    params: Params,
    /// Whether we declared our MaxRecvDataSegmentLength.
    declared_max_recv: bool,
}

/// The reply a request gets, before it is wrapped as a step.
struct Reply {
    pairs: Vec<(String, String)>,
    transit: bool,
    next_stage: u8,
}

/// Why a request ends the login.
struct Failure {
    status: u16,
    reason: String,
}

fn fail(status: u16, reason: impl Into<String>) -> Failure {
    Failure {
        status,
        reason: reason.into(),
    }
}

/// Turns a response into a failure with `status` (class << 8 | detail), keeping its
/// ITT, ISID and sequence numbers: for a driver that refuses a login the machine
/// completed (an unknown TSIH, too many sessions).
pub fn failure_response(response: &LoginResponse, status: u16) -> LoginResponse {
    LoginResponse {
        transit: false,
        continue_bit: false,
        next_stage: 0,
        status_class: (status >> 8) as u8,
        status_detail: status as u8,
        ..response.clone()
    }
}

impl LoginMachine {
    pub fn new(config: Arc<LoginConfig>) -> LoginMachine {
        LoginMachine {
            config,
            finished: false,
            stage: None,
            nexus: None,
            stat_sn: 0,
            exp_cmd_sn: 0,
            requests: 0,
            pending: Vec::new(),
            identity: None,
            seen: HashSet::new(),
            auth: Auth::Pending,
            params: Params::default(),
            declared_max_recv: false,
        }
    }

    /// One Login Request (header and its text data segment).
    pub fn handle(&mut self, request: &LoginRequest, data: &[u8]) -> LoginStep {
        if self.finished {
            let failure = fail(
                status::INITIATOR_ERROR,
                "login request after the login ended",
            );
            return self.fail_step(request, failure);
        }
        match self.step(request, data) {
            Ok(step) => step,
            Err(failure) => self.fail_step(request, failure),
        }
    }

    fn step(&mut self, request: &LoginRequest, data: &[u8]) -> Result<LoginStep, Failure> {
        self.requests += 1;
        if self.requests > MAX_LOGIN_REQUESTS {
            return Err(fail(status::INITIATOR_ERROR, "too many login requests"));
        }
        let nexus = Nexus {
            isid: request.isid,
            tsih: request.tsih,
            cid: request.cid,
        };
        match self.nexus {
            None => {
                // Responses count StatSN up from what the initiator expects (§11.12.8).
                self.stat_sn = request.exp_stat_sn;
                self.nexus = Some(nexus);
            }
            Some(first) if first != nexus => {
                return Err(fail(
                    status::INITIATOR_ERROR,
                    "ISID, TSIH or CID changed during login",
                ));
            }
            Some(_) => {}
        }
        // A login request is immediate: CmdSN does not advance (§11.12.7).
        self.exp_cmd_sn = request.cmd_sn;
        // We speak version 0 only (§11.12.4).
        if request.version_min != 0 {
            return Err(fail(
                status::UNSUPPORTED_VERSION,
                format!(
                    "initiator versions {}..={} exclude version 0",
                    request.version_min, request.version_max
                ),
            ));
        }
        self.check_stages(request)?;
        let current = request.current_stage;
        self.stage = Some(current);

        if self.pending.len() + data.len() > MAX_LOGIN_TEXT {
            return Err(fail(
                status::INITIATOR_ERROR,
                format!("login text longer than {MAX_LOGIN_TEXT} bytes"),
            ));
        }
        self.pending.extend_from_slice(data);
        if request.continue_bit {
            // More text follows: acknowledge with an empty response (§6.1.2).
            let reply = Reply {
                pairs: Vec::new(),
                transit: false,
                next_stage: 0,
            };
            return Ok(self.continue_step(request, reply));
        }
        let text = std::mem::take(&mut self.pending);
        let pairs = text::parse(&text)
            .map_err(|error| fail(status::INITIATOR_ERROR, format!("login text: {error}")))?;
        let mut in_request = HashSet::new();
        for (key, _) in &pairs {
            if !in_request.insert(key.as_str()) {
                return Err(fail(
                    status::INITIATOR_ERROR,
                    format!("key {key} appears twice in one request"),
                ));
            }
        }

        let mut answers = self.identify(&pairs)?;
        let reply = match current {
            stage::SECURITY => self.security(request, &pairs, &mut answers)?,
            _ => self.operational(request, &pairs, &mut answers)?,
        };
        if reply.transit && reply.next_stage == stage::FULL_FEATURE {
            return Ok(self.complete_step(request, reply));
        }
        if reply.transit {
            self.stage = Some(reply.next_stage);
        }
        Ok(self.continue_step(request, reply))
    }

    /// Checks CSG, NSG, T and C against the stage we are in (§11.12.3).
    fn check_stages(&self, request: &LoginRequest) -> Result<(), Failure> {
        let current = request.current_stage;
        if current != stage::SECURITY && current != stage::OPERATIONAL {
            return Err(fail(
                status::INITIATOR_ERROR,
                format!("login request in stage {current}"),
            ));
        }
        if let Some(expected) = self.stage {
            if current != expected {
                return Err(fail(
                    status::INITIATOR_ERROR,
                    format!("login request in stage {current}, expected stage {expected}"),
                ));
            }
        }
        if request.transit && request.continue_bit {
            return Err(fail(
                status::INITIATOR_ERROR,
                "login request with both T and C set",
            ));
        }
        if request.transit {
            let next = request.next_stage;
            let valid =
                (next == stage::OPERATIONAL || next == stage::FULL_FEATURE) && next > current;
            if !valid {
                return Err(fail(
                    status::INITIATOR_ERROR,
                    format!("no transition from stage {current} to stage {next}"),
                ));
            }
        }
        Ok(())
    }

    /// Settles who logs in to what from the first complete request; later requests
    /// may repeat those keys (libiscsi does) but not change them. Returns the
    /// target's declarations for the first response of a normal session.
    fn identify(&mut self, pairs: &[(String, String)]) -> Result<Vec<(String, String)>, Failure> {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        if let Some(identity) = &self.identity {
            let target_name = identity
                .target
                .map(|index| self.config.targets[index].name.as_str());
            let session_type = match identity.session_type {
                SessionType::Normal => "Normal",
                SessionType::Discovery => "Discovery",
            };
            let same = get("InitiatorName").is_none_or(|v| v == identity.initiator_name)
                && get("InitiatorAlias")
                    .is_none_or(|v| Some(v) == identity.initiator_alias.as_deref())
                && get("SessionType").is_none_or(|v| v == session_type)
                && get("TargetName")
                    .is_none_or(|v| target_name.is_none_or(|name| name.eq_ignore_ascii_case(v)));
            if !same {
                return Err(fail(
                    status::INITIATOR_ERROR,
                    "InitiatorName, InitiatorAlias, SessionType or TargetName changed during login",
                ));
            }
            return Ok(Vec::new());
        }

        let initiator_name = match get("InitiatorName") {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => {
                return Err(fail(
                    status::MISSING_PARAMETER,
                    "the first login request has no InitiatorName",
                ))
            }
        };
        let session_type = match get("SessionType") {
            None | Some("Normal") => SessionType::Normal,
            Some("Discovery") => SessionType::Discovery,
            Some(other) => {
                return Err(fail(
                    status::SESSION_TYPE_NOT_SUPPORTED,
                    format!("SessionType={other}"),
                ))
            }
        };
        let mut declarations = Vec::new();
        let target = match session_type {
            SessionType::Discovery => None,
            SessionType::Normal => {
                let Some(name) = get("TargetName").filter(|name| !name.is_empty()) else {
                    return Err(fail(
                        status::MISSING_PARAMETER,
                        "a normal session's first login request has no TargetName",
                    ));
                };
                let Some(index) = self
                    .config
                    .targets
                    .iter()
                    .position(|target| target.name.eq_ignore_ascii_case(name))
                else {
                    return Err(fail(
                        status::TARGET_NOT_FOUND,
                        format!("no target named {name}"),
                    ));
                };
                let entry = &self.config.targets[index];
                if !entry.allows(&initiator_name) {
                    return Err(fail(
                        status::AUTHORIZATION_FAILURE,
                        format!(
                            "initiator {initiator_name} may not log in to {}",
                            entry.name
                        ),
                    ));
                }
                // The first response of a normal session names the portal group
                // (§13.9); the alias is a declaration (§13.6).
                declarations.push((
                    "TargetPortalGroupTag".to_string(),
                    entry.portal_group_tag.to_string(),
                ));
                if let Some(alias) = &entry.alias {
                    declarations.push(("TargetAlias".to_string(), alias.clone()));
                }
                Some(index)
            }
        };
        self.identity = Some(Identity {
            session_type,
            initiator_name,
            initiator_alias: get("InitiatorAlias").map(str::to_string),
            target,
        });
        Ok(declarations)
    }

    fn identity(&self) -> &Identity {
        self.identity
            .as_ref()
            .expect("identified before stages run")
    }

    /// The CHAP credentials this login must pass, if any.
    fn required_chap(&self) -> Option<ChapConfig> {
        let identity = self.identity();
        match identity.target {
            Some(index) => self.config.targets[index].chap.clone(),
            None => self.config.discovery_chap.clone(),
        }
    }

    /// Records a non-identity key, refusing one offered before (§6.2).
    fn first_time(&mut self, key: &str) -> Result<(), Failure> {
        if self.seen.insert(key.to_string()) {
            Ok(())
        } else {
            Err(fail(
                status::INITIATOR_ERROR,
                format!("key {key} negotiated twice"),
            ))
        }
    }

    /// Answers a key that is neither identity nor security, in either stage.
    fn other_key(&mut self, key: &str, value: &str) -> Result<(String, String), Failure> {
        self.first_time(key)?;
        let answer = match keys::classify(key) {
            KeyClass::Operational => {
                let discovery = self.identity().session_type == SessionType::Discovery;
                match keys::negotiate(&mut self.params, &self.config.limits, discovery, key, value)
                {
                    Outcome::Answer(answer) => {
                        if key == "MaxRecvDataSegmentLength" {
                            self.declared_max_recv = true;
                        }
                        answer
                    }
                    Outcome::Fail(status, reason) => return Err(fail(status, reason)),
                }
            }
            // Keys only a target sends, or only valid in the full feature phase.
            KeyClass::NotHere => "Reject".to_string(),
            _ => "NotUnderstood".to_string(),
        };
        Ok((key.to_string(), answer))
    }

    fn security(
        &mut self,
        request: &LoginRequest,
        pairs: &[(String, String)],
        answers: &mut Vec<(String, String)>,
    ) -> Result<Reply, Failure> {
        let required = self.required_chap();
        // Once CHAP is under way, each request must carry its next step: CHAP_A
        // after AuthMethod=CHAP, CHAP_N and CHAP_R after our challenge (§12.1.3).
        let has = |name: &str| pairs.iter().any(|(key, _)| key == name);
        match self.auth {
            Auth::ChapAlgorithm if !has("CHAP_A") => {
                return Err(fail(
                    status::AUTHENTICATION_FAILURE,
                    "CHAP_A expected after AuthMethod=CHAP",
                ));
            }
            Auth::ChapResponse { .. } if !has("CHAP_R") => {
                return Err(fail(
                    status::AUTHENTICATION_FAILURE,
                    "CHAP_N and CHAP_R expected after our challenge",
                ));
            }
            _ => {}
        }
        let mut chap_keys: Vec<(&str, &str)> = Vec::new();
        let mut offered_method = false;
        for (key, value) in pairs {
            match keys::classify(key) {
                KeyClass::Identity => {}
                KeyClass::Security if key == "AuthMethod" => {
                    self.first_time(key)?;
                    offered_method = true;
                    let methods: Vec<&str> = value.split(',').collect();
                    let chosen = if required.is_some() {
                        methods.contains(&"CHAP").then_some("CHAP")
                    } else {
                        methods.contains(&"None").then_some("None")
                    };
                    let Some(chosen) = chosen else {
                        return Err(fail(
                            status::AUTHENTICATION_FAILURE,
                            format!("AuthMethod={value} offers no method we accept"),
                        ));
                    };
                    self.auth = if chosen == "CHAP" {
                        Auth::ChapAlgorithm
                    } else {
                        Auth::Done
                    };
                    answers.push((key.clone(), chosen.to_string()));
                }
                KeyClass::Security => {
                    self.first_time(key)?;
                    chap_keys.push((key.as_str(), value.as_str()));
                }
                _ => {
                    let answer = self.other_key(key, value)?;
                    answers.push(answer);
                }
            }
        }
        if !chap_keys.is_empty() {
            let credentials = required.as_ref().ok_or_else(|| {
                fail(
                    status::AUTHENTICATION_FAILURE,
                    "CHAP keys without AuthMethod=CHAP",
                )
            })?;
            self.chap(credentials, &chap_keys, answers)?;
        }
        if !offered_method && matches!(self.auth, Auth::Pending) && required.is_none() {
            // A security stage without AuthMethod, where none is needed: nothing
            // to authenticate.
            self.auth = Auth::Done;
        }
        if request.transit && matches!(self.auth, Auth::Done) {
            // Operational declarations wait for the operational stage: initiators
            // (open-iscsi) refuse operational keys in a security-stage response.
            return Ok(Reply {
                pairs: std::mem::take(answers),
                transit: true,
                next_stage: request.next_stage,
            });
        }
        if request.transit && matches!(self.auth, Auth::Pending) {
            return Err(fail(
                status::AUTHENTICATION_FAILURE,
                "the initiator leaves the security stage without authenticating",
            ));
        }
        // Authentication still under way: stay in the security stage.
        Ok(Reply {
            pairs: std::mem::take(answers),
            transit: false,
            next_stage: 0,
        })
    }

    /// Runs the CHAP keys of one request: CHAP_A (we challenge), then CHAP_N and
    /// CHAP_R (we verify) with CHAP_I and CHAP_C for mutual CHAP (we answer).
    fn chap(
        &mut self,
        credentials: &ChapConfig,
        chap_keys: &[(&str, &str)],
        answers: &mut Vec<(String, String)>,
    ) -> Result<(), Failure> {
        let get = |name: &str| {
            chap_keys
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| *value)
        };
        if let Some(offer) = get("CHAP_A") {
            if !matches!(self.auth, Auth::ChapAlgorithm) {
                return Err(fail(status::AUTHENTICATION_FAILURE, "CHAP_A out of order"));
            }
            // The first algorithm of the initiator's list we support (§12.1.3).
            let algorithm = offer
                .split(',')
                .find_map(|code| keys::parse_number(code).and_then(ChapAlgorithm::from_code))
                .ok_or_else(|| {
                    fail(
                        status::AUTHENTICATION_FAILURE,
                        format!("CHAP_A={offer} names no algorithm we support"),
                    )
                })?;
            let mut random = vec![0u8; 1 + algorithm.digest_len()];
            getrandom::getrandom(&mut random)
                .map_err(|error| fail(status::TARGET_ERROR, format!("no random bytes: {error}")))?;
            let id = random[0];
            let challenge = random[1..].to_vec();
            answers.push(("CHAP_A".to_string(), algorithm.code().to_string()));
            answers.push(("CHAP_I".to_string(), id.to_string()));
            answers.push(("CHAP_C".to_string(), chap::encode_hex(&challenge)));
            self.auth = Auth::ChapResponse {
                algorithm,
                id,
                challenge,
            };
            if chap_keys.len() > 1 {
                return Err(fail(
                    status::AUTHENTICATION_FAILURE,
                    "CHAP keys beside CHAP_A before our challenge",
                ));
            }
            return Ok(());
        }
        let Auth::ChapResponse {
            algorithm,
            id,
            challenge,
        } = self.auth.clone()
        else {
            return Err(fail(
                status::AUTHENTICATION_FAILURE,
                "CHAP response before our challenge",
            ));
        };
        let (Some(name), Some(response)) = (get("CHAP_N"), get("CHAP_R")) else {
            return Err(fail(
                status::AUTHENTICATION_FAILURE,
                "CHAP_N and CHAP_R must come together",
            ));
        };
        let response = chap::decode_binary(response).ok_or_else(|| {
            fail(
                status::AUTHENTICATION_FAILURE,
                "CHAP_R is not a binary value",
            )
        })?;
        let expected = chap::chap_response(algorithm, id, &credentials.secret, &challenge);
        // Check the user and the response together, and always compute both, so a
        // wrong name and a wrong secret look alike from outside.
        let name_ok = chap::constant_time_eq(name.as_bytes(), credentials.user.as_bytes());
        let response_ok = chap::constant_time_eq(&response, &expected);
        if !(name_ok & response_ok) {
            return Err(fail(
                status::AUTHENTICATION_FAILURE,
                format!("CHAP authentication of user {name} failed"),
            ));
        }
        match (get("CHAP_I"), get("CHAP_C")) {
            (None, None) => {}
            (Some(initiator_id), Some(initiator_challenge)) => {
                let Some((mutual_user, mutual_secret)) = &credentials.mutual else {
                    return Err(fail(
                        status::AUTHENTICATION_FAILURE,
                        "the initiator asks for mutual CHAP, which is not configured",
                    ));
                };
                let initiator_id = keys::parse_number(initiator_id)
                    .and_then(|n| u8::try_from(n).ok())
                    .ok_or_else(|| fail(status::AUTHENTICATION_FAILURE, "CHAP_I is not 0..=255"))?;
                let initiator_challenge = chap::decode_binary(initiator_challenge)
                    .filter(|bytes| bytes.len() <= MAX_INITIATOR_CHALLENGE)
                    .ok_or_else(|| {
                        fail(
                            status::AUTHENTICATION_FAILURE,
                            "CHAP_C is not a valid challenge",
                        )
                    })?;
                // Our own challenge coming back is a reflection attack (§12.1.3).
                if initiator_challenge == challenge {
                    return Err(fail(
                        status::AUTHENTICATION_FAILURE,
                        "the initiator's CHAP challenge repeats ours",
                    ));
                }
                let answer = chap::chap_response(
                    algorithm,
                    initiator_id,
                    mutual_secret,
                    &initiator_challenge,
                );
                answers.push(("CHAP_N".to_string(), mutual_user.clone()));
                answers.push(("CHAP_R".to_string(), chap::encode_hex(&answer)));
            }
            _ => {
                return Err(fail(
                    status::AUTHENTICATION_FAILURE,
                    "CHAP_I and CHAP_C must come together",
                ))
            }
        }
        self.auth = Auth::Done;
        Ok(())
    }

    fn operational(
        &mut self,
        request: &LoginRequest,
        pairs: &[(String, String)],
        answers: &mut Vec<(String, String)>,
    ) -> Result<Reply, Failure> {
        if self.required_chap().is_some() && !matches!(self.auth, Auth::Done) {
            // Only reachable when the login starts in the operational stage.
            return Err(fail(
                status::AUTHENTICATION_FAILURE,
                "the target requires CHAP; the initiator skipped the security stage",
            ));
        }
        self.auth = Auth::Done;
        for (key, value) in pairs {
            match keys::classify(key) {
                KeyClass::Identity => {}
                KeyClass::Security => {
                    return Err(fail(
                        status::INITIATOR_ERROR,
                        format!("security key {key} in the operational stage"),
                    ))
                }
                _ => {
                    let answer = self.other_key(key, value)?;
                    answers.push(answer);
                }
            }
        }
        // FirstBurstLength may not exceed MaxBurstLength (§13.14), whichever order
        // the two came in.
        if self.params.first_burst_length > self.params.max_burst_length {
            self.params.first_burst_length = self.params.max_burst_length;
            for (key, value) in answers.iter_mut() {
                if key == "FirstBurstLength" {
                    *value = self.params.first_burst_length.to_string();
                }
            }
        }
        self.declare_max_recv(answers);
        Ok(Reply {
            pairs: std::mem::take(answers),
            transit: request.transit,
            next_stage: if request.transit {
                request.next_stage
            } else {
                0
            },
        })
    }

    /// Declares our MaxRecvDataSegmentLength once, in the operational stage, even
    /// when the initiator did not declare its own (§13.12: both sides declare).
    fn declare_max_recv(&mut self, answers: &mut Vec<(String, String)>) {
        if !self.declared_max_recv {
            self.declared_max_recv = true;
            self.seen.insert("MaxRecvDataSegmentLength".to_string());
            answers.push((
                "MaxRecvDataSegmentLength".to_string(),
                keys::declared_max_recv(&self.config.limits).to_string(),
            ));
        }
    }

    /// The response header for `request`, consuming one StatSN.
    fn response(&mut self, request: &LoginRequest, reply: &Reply, status: u16) -> LoginResponse {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let window = self.config.limits.cmd_window.max(1);
        LoginResponse {
            transit: reply.transit,
            continue_bit: false,
            current_stage: request.current_stage,
            next_stage: reply.next_stage,
            version_max: 0,
            version_active: 0,
            isid: request.isid,
            tsih: request.tsih,
            initiator_task_tag: request.initiator_task_tag,
            stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.exp_cmd_sn.wrapping_add(window - 1),
            status_class: (status >> 8) as u8,
            status_detail: status as u8,
        }
    }

    /// The response text: each key once. A key an initiator sends that only a target
    /// may send (TargetAlias) already has our declaration as its answer.
    fn reply_text(reply: &Reply) -> Vec<u8> {
        let mut keys = HashSet::new();
        let unique: Vec<&(String, String)> = reply
            .pairs
            .iter()
            .filter(|(key, _)| keys.insert(key.as_str()))
            .collect();
        let pairs: Vec<(&str, &str)> = unique
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect();
        text::encode(&pairs)
    }

    fn continue_step(&mut self, request: &LoginRequest, reply: Reply) -> LoginStep {
        let response = self.response(request, &reply, status::SUCCESS);
        LoginStep::Continue {
            response,
            data: Self::reply_text(&reply),
        }
    }

    fn complete_step(&mut self, request: &LoginRequest, reply: Reply) -> LoginStep {
        let response = self.response(request, &reply, status::SUCCESS);
        self.finished = true;
        let identity = self.identity().clone();
        let params = &self.params;
        let negotiated = Negotiated {
            session_type: identity.session_type,
            initiator_name: identity.initiator_name,
            initiator_alias: identity.initiator_alias,
            target_name: identity
                .target
                .map(|index| self.config.targets[index].name.clone()),
            isid: request.isid,
            tsih: request.tsih,
            cid: request.cid,
            header_digest: params.header_digest,
            data_digest: params.data_digest,
            initiator_max_recv_data_segment_length: params.initiator_max_recv_data_segment_length,
            target_max_recv_data_segment_length: if self.declared_max_recv {
                keys::declared_max_recv(&self.config.limits)
            } else {
                DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH
            },
            max_burst_length: params.max_burst_length,
            first_burst_length: params.first_burst_length.min(params.max_burst_length),
            initial_r2t: params.initial_r2t,
            immediate_data: params.immediate_data,
            max_outstanding_r2t: params.max_outstanding_r2t,
            data_pdu_in_order: params.data_pdu_in_order,
            data_sequence_in_order: params.data_sequence_in_order,
            default_time2wait: params.default_time2wait,
            default_time2retain: params.default_time2retain,
            error_recovery_level: params.error_recovery_level,
            max_connections: params.max_connections,
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
        };
        LoginStep::Complete {
            response,
            data: Self::reply_text(&reply),
            negotiated,
        }
    }

    fn fail_step(&mut self, request: &LoginRequest, failure: Failure) -> LoginStep {
        self.finished = true;
        self.pending = Vec::new();
        let reply = Reply {
            pairs: Vec::new(),
            transit: false,
            next_stage: 0,
        };
        let response = self.response(request, &reply, failure.status);
        LoginStep::Fail {
            response,
            data: Vec::new(),
            reason: failure.reason,
        }
    }
}
