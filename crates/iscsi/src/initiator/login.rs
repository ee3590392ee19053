//! The initiator side of the login phase (RFC 7143 §6.3, §11.12, §11.13, §12, §13),
//! sans-IO: [`InitiatorLogin::start`] gives the first Login Request; each Login
//! Response goes into [`InitiatorLogin::handle`], which answers with the next
//! request or, once the target moves to the full feature phase, the session's
//! parameters.
//!
//! The sequence is libiscsi's, which every target we meet accepts: the security
//! stage first (AuthMethod=None, or CHAP with CHAP_A=5, then CHAP_N/CHAP_R and, for
//! mutual CHAP, our own CHAP_I/CHAP_C), then the operational stage with all our keys
//! in one request asking to move to the full feature phase.

use std::collections::HashSet;

use crate::login::{
    chap_response, constant_time_eq, decode_binary, encode_hex, parse_number, stage, status,
    ChapAlgorithm,
};
use crate::pdu::{text, LoginRequest, LoginResponse};

/// The most Login Requests we send before giving up on a target that never ends
/// the login (CHAP with continuations needs well under ten).
const MAX_REQUESTS: u32 = 32;
/// The most response text we gather over C-bit continuations (§6.1.2).
const MAX_RESPONSE_TEXT: usize = 64 * 1024;
/// Length of our challenge for mutual CHAP (as long as an MD5 digest, like
/// open-iscsi's).
const CHALLENGE_LEN: usize = 16;
/// The MaxBurstLength we offer: the largest multiple of 1 KiB the key's range allows.
pub const OFFERED_MAX_BURST: u32 = 16 * 1024 * 1024 - 1024;
/// The FirstBurstLength we offer.
pub const OFFERED_FIRST_BURST: u32 = 256 * 1024;
/// The MaxRecvDataSegmentLength we declare.
pub const DECLARED_MAX_RECV: u32 = 256 * 1024;
/// What a peer may send per PDU until it declares otherwise (§13.12).
pub const DEFAULT_MAX_RECV: u32 = 8192;

/// CHAP credentials for one login. `Debug` hides the secrets.
#[derive(Clone, Default)]
pub struct Credentials {
    /// Our CHAP_N.
    pub user: String,
    pub secret: Vec<u8>,
    /// Mutual CHAP: the name the target must answer with (any, if `None`) and the
    /// secret it must prove it knows.
    pub mutual: Option<(Option<String>, Vec<u8>)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .field("mutual", &self.mutual.is_some())
            .finish()
    }
}

/// What a login asks for.
#[derive(Debug, Clone)]
pub struct LoginOptions {
    pub initiator_name: String,
    /// The target to log in to; `None` for a discovery session.
    pub target_name: Option<String>,
    /// Initiator Session ID (§11.12.5): the same ISID and TSIH 0 again reinstates a
    /// session (§6.3.5).
    pub isid: u64,
    /// 0 for a new session.
    pub tsih: u16,
    pub cid: u16,
    /// The session's first CmdSN.
    pub cmd_sn: u32,
    pub chap: Option<Credentials>,
    /// Insist on CRC32C header and data digests.
    pub digests: bool,
}

/// What the login settled, for the full feature phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub isid: u64,
    pub tsih: u16,
    pub cid: u16,
    pub header_digest: bool,
    pub data_digest: bool,
    /// The most data we may send in one PDU (the target's declaration).
    pub target_max_recv: u32,
    /// The most data the target may send us in one PDU (our declaration).
    pub initiator_max_recv: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    pub target_alias: Option<String>,
    pub target_portal_group_tag: Option<u16>,
    /// The CmdSN of the first command (the login's: logins are immediate).
    pub cmd_sn: u32,
    /// The StatSN we expect next.
    pub exp_stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// The target answered with a non-zero status (§11.13.5).
    #[error("{} ({status:#06x}){}", status_name(*status), redirect.as_ref().map(|a| format!(": target moved to {a}")).unwrap_or_default())]
    Refused {
        status: u16,
        /// TargetAddress of a redirection (class 1).
        redirect: Option<String>,
    },
    /// The target answered something the protocol does not allow.
    #[error("login protocol error: {0}")]
    Protocol(String),
    /// The target cannot authenticate the way we must (or failed mutual CHAP).
    #[error("authentication failure: {0}")]
    Authentication(String),
}

/// The name of a login status (class << 8 | detail), as RFC 7143 §11.13.5 words it.
pub fn status_name(code: u16) -> &'static str {
    match code {
        status::SUCCESS => "success",
        0x0101 => "target moved temporarily",
        0x0102 => "target moved permanently",
        status::INITIATOR_ERROR => "initiator error",
        status::AUTHENTICATION_FAILURE => "authentication failure",
        status::AUTHORIZATION_FAILURE => "authorization failure",
        status::TARGET_NOT_FOUND => "target not found",
        status::TARGET_REMOVED => "target removed",
        status::UNSUPPORTED_VERSION => "unsupported version",
        status::TOO_MANY_CONNECTIONS => "too many connections",
        status::MISSING_PARAMETER => "missing parameter",
        status::CANT_INCLUDE_IN_SESSION => "can't include in session",
        status::SESSION_TYPE_NOT_SUPPORTED => "session type not supported",
        status::SESSION_DOES_NOT_EXIST => "session does not exist",
        status::INVALID_DURING_LOGIN => "invalid request during login",
        status::TARGET_ERROR => "target error",
        status::SERVICE_UNAVAILABLE => "service unavailable",
        status::OUT_OF_RESOURCES => "out of resources",
        _ => match code >> 8 {
            1 => "redirection",
            2 => "initiator error",
            3 => "target error",
            _ => "unknown status",
        },
    }
}

/// What to do after a Login Response.
#[derive(Debug, Clone)]
pub enum LoginStep {
    /// Send this request (with this text) and feed the response back.
    Send {
        request: LoginRequest,
        data: Vec<u8>,
    },
    /// The target entered the full feature phase.
    Done(SessionParams),
}

/// Where CHAP stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Auth {
    /// AuthMethod offered, no answer yet.
    Offered,
    /// The target chose CHAP; CHAP_A not sent yet.
    ChapChosen,
    /// CHAP_A sent; waiting for the target's challenge.
    AlgorithmSent,
    /// Our response sent; for mutual CHAP, our challenge with it.
    ResponseSent { mutual: Option<(u8, Vec<u8>)> },
    /// Authenticated, or no authentication.
    Done,
}

/// The initiator side of one connection's login.
pub struct InitiatorLogin {
    options: LoginOptions,
    /// The stage our next request is in.
    stage: u8,
    auth: Auth,
    exp_stat_sn: u32,
    requests: u32,
    /// Text of a response continued with the C bit.
    pending: Vec<u8>,
    /// Operational keys we offered (their answers are results, not offers).
    offered: HashSet<&'static str>,
    /// Whether our last request set T, and its NSG.
    transit_sent: bool,
    next_sent: u8,
    params: SessionParams,
}

impl InitiatorLogin {
    pub fn new(options: LoginOptions) -> InitiatorLogin {
        let params = SessionParams {
            isid: options.isid,
            tsih: options.tsih,
            cid: options.cid,
            header_digest: false,
            data_digest: false,
            target_max_recv: DEFAULT_MAX_RECV,
            initiator_max_recv: DEFAULT_MAX_RECV,
            // The RFC defaults of §13, for keys nobody settles.
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            target_alias: None,
            target_portal_group_tag: None,
            cmd_sn: options.cmd_sn,
            exp_stat_sn: 0,
            exp_cmd_sn: options.cmd_sn,
            max_cmd_sn: options.cmd_sn,
        };
        InitiatorLogin {
            options,
            stage: stage::SECURITY,
            auth: Auth::Offered,
            exp_stat_sn: 0,
            requests: 0,
            pending: Vec::new(),
            offered: HashSet::new(),
            transit_sent: false,
            next_sent: 0,
            params,
        }
    }

    fn discovery(&self) -> bool {
        self.options.target_name.is_none()
    }

    /// The first Login Request: who we are, what we log in to, how we authenticate.
    pub fn start(&mut self) -> LoginStep {
        let mut pairs: Vec<(&str, String)> =
            vec![("InitiatorName", self.options.initiator_name.clone())];
        match &self.options.target_name {
            Some(target) => {
                pairs.push(("TargetName", target.clone()));
                pairs.push(("SessionType", "Normal".into()));
            }
            None => pairs.push(("SessionType", "Discovery".into())),
        }
        // Offering None beside CHAP lets a target that needs no authentication
        // choose it (§12.1: the target picks the first method it accepts).
        let chap = self.options.chap.is_some();
        pairs.push(("AuthMethod", if chap { "CHAP,None" } else { "None" }.into()));
        // Without CHAP we are ready to leave the security stage at once.
        self.request(pairs, !chap, stage::OPERATIONAL)
    }

    /// Builds a request in the current stage, counting it.
    fn request(&mut self, pairs: Vec<(&str, String)>, transit: bool, next: u8) -> LoginStep {
        self.requests += 1;
        self.transit_sent = transit;
        self.next_sent = next;
        LoginStep::Send {
            request: LoginRequest {
                transit,
                continue_bit: false,
                current_stage: self.stage,
                next_stage: if transit { next } else { 0 },
                version_max: 0,
                version_min: 0,
                isid: self.options.isid,
                tsih: self.options.tsih,
                // One task tag for the whole login (§11.12.6 allows reuse).
                initiator_task_tag: 0,
                cid: self.options.cid,
                cmd_sn: self.options.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            },
            data: text::encode(&pairs),
        }
    }

    /// One Login Response (header and text data).
    pub fn handle(
        &mut self,
        response: &LoginResponse,
        data: &[u8],
    ) -> Result<LoginStep, LoginError> {
        if self.requests >= MAX_REQUESTS {
            return Err(LoginError::Protocol(format!(
                "the target did not finish the login in {MAX_REQUESTS} requests"
            )));
        }
        let code = u16::from(response.status_class) << 8 | u16::from(response.status_detail);
        if code != status::SUCCESS {
            let redirect = (response.status_class == 1)
                .then(|| {
                    text::parse(data).ok().and_then(|pairs| {
                        pairs
                            .into_iter()
                            .find(|(key, _)| key == "TargetAddress")
                            .map(|(_, value)| value)
                    })
                })
                .flatten();
            return Err(LoginError::Refused {
                status: code,
                redirect,
            });
        }
        if response.version_active != 0 {
            return Err(LoginError::Protocol(format!(
                "the target speaks version {}, not 0",
                response.version_active
            )));
        }
        if response.current_stage != self.stage {
            return Err(LoginError::Protocol(format!(
                "response in stage {}, request in stage {}",
                response.current_stage, self.stage
            )));
        }
        if response.transit && response.continue_bit {
            return Err(LoginError::Protocol("response with both T and C".into()));
        }
        self.exp_stat_sn = response.stat_sn.wrapping_add(1);
        self.params.exp_cmd_sn = response.exp_cmd_sn;
        self.params.max_cmd_sn = response.max_cmd_sn;
        if self.pending.len() + data.len() > MAX_RESPONSE_TEXT {
            return Err(LoginError::Protocol("login response text too long".into()));
        }
        self.pending.extend_from_slice(data);
        if response.continue_bit {
            // More text follows: ask for it with an empty request (§6.1.2), still
            // ready (or not) to move on as before.
            let (transit, next) = (self.transit_sent, self.next_sent);
            return Ok(self.request(Vec::new(), transit, next));
        }
        let text = std::mem::take(&mut self.pending);
        let pairs = text::parse(&text)
            .map_err(|error| LoginError::Protocol(format!("login response text: {error}")))?;
        if response.transit && !self.transit_sent {
            return Err(LoginError::Protocol(
                "the target changed stage without our asking".into(),
            ));
        }
        match self.stage {
            stage::SECURITY => self.security(response, &pairs),
            stage::OPERATIONAL => self.operational(response, &pairs),
            other => Err(LoginError::Protocol(format!("login in stage {other}"))),
        }
    }

    /// Declarations any response may carry.
    fn declaration(&mut self, key: &str, value: &str) -> bool {
        match key {
            "TargetAlias" => self.params.target_alias = Some(value.to_string()),
            "TargetPortalGroupTag" => {
                self.params.target_portal_group_tag =
                    parse_number(value).and_then(|n| u16::try_from(n).ok())
            }
            // Only meaningful in a redirection, or a SendTargets answer.
            "TargetAddress" => {}
            _ => return false,
        }
        true
    }

    fn security(
        &mut self,
        response: &LoginResponse,
        pairs: &[(String, String)],
    ) -> Result<LoginStep, LoginError> {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        for (key, value) in pairs {
            if self.declaration(key, value) {
                continue;
            }
            match key.as_str() {
                "AuthMethod" => {
                    if self.auth != Auth::Offered {
                        return Err(LoginError::Protocol("AuthMethod answered twice".into()));
                    }
                    self.auth = match value.as_str() {
                        "None" => Auth::Done,
                        "CHAP" if self.options.chap.is_some() => Auth::ChapChosen,
                        other => {
                            return Err(LoginError::Authentication(format!(
                                "the target answers AuthMethod={other}{}",
                                if self.options.chap.is_none() {
                                    " (it may need CHAP: give a user and secret)"
                                } else {
                                    ""
                                }
                            )))
                        }
                    };
                }
                "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R" => {}
                _ => {}
            }
        }
        let credentials = self.options.chap.clone();
        match (&self.auth, credentials) {
            (Auth::AlgorithmSent, Some(credentials)) => {
                // The target's challenge (§12.1.3): answer it, and challenge the
                // target in turn for mutual CHAP.
                let algorithm = get("CHAP_A")
                    .and_then(parse_number)
                    .and_then(ChapAlgorithm::from_code)
                    .filter(|a| *a == ChapAlgorithm::Md5)
                    .ok_or_else(|| {
                        LoginError::Authentication(format!(
                            "the target chose CHAP_A={}, we offered 5 (MD5)",
                            get("CHAP_A").unwrap_or("nothing")
                        ))
                    })?;
                let id = get("CHAP_I")
                    .and_then(parse_number)
                    .and_then(|n| u8::try_from(n).ok())
                    .ok_or_else(|| LoginError::Protocol("CHAP_I missing or not 0..=255".into()))?;
                let challenge = get("CHAP_C")
                    .and_then(decode_binary)
                    .ok_or_else(|| LoginError::Protocol("CHAP_C missing or malformed".into()))?;
                let answer = chap_response(algorithm, id, &credentials.secret, &challenge);
                let mut out: Vec<(&str, String)> = vec![
                    ("CHAP_N", credentials.user.clone()),
                    ("CHAP_R", encode_hex(&answer)),
                ];
                let mut mutual = None;
                if credentials.mutual.is_some() {
                    let mut random = [0u8; 1 + CHALLENGE_LEN];
                    getrandom::getrandom(&mut random).map_err(|e| {
                        LoginError::Authentication(format!("no random bytes for a challenge: {e}"))
                    })?;
                    let mut ours = random[1..].to_vec();
                    // Never send the target's own challenge back (a reflection, §12.1.3).
                    if ours == challenge {
                        ours[0] ^= 0xff;
                    }
                    out.push(("CHAP_I", random[0].to_string()));
                    out.push(("CHAP_C", encode_hex(&ours)));
                    mutual = Some((random[0], ours));
                }
                self.auth = Auth::ResponseSent { mutual };
                Ok(self.request(out, true, stage::OPERATIONAL))
            }
            (Auth::ResponseSent { mutual }, Some(credentials)) => {
                if let (Some((id, ours)), Some((user, secret))) = (mutual, &credentials.mutual) {
                    let name = get("CHAP_N").ok_or_else(|| {
                        LoginError::Authentication("the target did not answer our challenge".into())
                    })?;
                    let proof = get("CHAP_R").and_then(decode_binary).unwrap_or_default();
                    let expected = chap_response(ChapAlgorithm::Md5, *id, secret, ours);
                    let name_ok = user.as_deref().is_none_or(|user| user == name);
                    if !(name_ok & constant_time_eq(&proof, &expected)) {
                        return Err(LoginError::Authentication(format!(
                            "the target ({name}) failed mutual CHAP"
                        )));
                    }
                }
                self.auth = Auth::Done;
                self.after_security(response)
            }
            (Auth::ChapChosen, Some(_)) => {
                self.auth = Auth::AlgorithmSent;
                Ok(self.request(vec![("CHAP_A", "5".into())], false, 0))
            }
            (Auth::Done, _) => self.after_security(response),
            (Auth::Offered, _) if !response.transit => Err(LoginError::Protocol(
                "the target did not answer AuthMethod".into(),
            )),
            (Auth::Offered, _) => {
                // A target that needs no authentication may skip the answer.
                self.auth = Auth::Done;
                self.after_security(response)
            }
            _ => Err(LoginError::Protocol("unexpected CHAP state".into())),
        }
    }

    /// Security done: move on if the target did, else ask to.
    fn after_security(&mut self, response: &LoginResponse) -> Result<LoginStep, LoginError> {
        if !response.transit {
            return Ok(self.request(Vec::new(), true, stage::OPERATIONAL));
        }
        match response.next_stage {
            stage::OPERATIONAL => {
                self.stage = stage::OPERATIONAL;
                let pairs = self.operational_offer();
                Ok(self.request(pairs, true, stage::FULL_FEATURE))
            }
            stage::FULL_FEATURE => Ok(LoginStep::Done(self.finish(response))),
            other => Err(LoginError::Protocol(format!(
                "the target moves to stage {other}"
            ))),
        }
    }

    /// Our operational keys (§13): the best both sides allow.
    fn operational_offer(&mut self) -> Vec<(&'static str, String)> {
        let digest = if self.options.digests {
            "CRC32C"
        } else {
            "None"
        };
        let mut pairs: Vec<(&'static str, String)> = vec![
            ("HeaderDigest", digest.into()),
            ("DataDigest", digest.into()),
            ("MaxRecvDataSegmentLength", DECLARED_MAX_RECV.to_string()),
        ];
        if !self.discovery() {
            pairs.extend([
                ("InitialR2T", "No".to_string()),
                ("ImmediateData", "Yes".to_string()),
                ("MaxBurstLength", OFFERED_MAX_BURST.to_string()),
                ("FirstBurstLength", OFFERED_FIRST_BURST.to_string()),
                ("MaxOutstandingR2T", "8".to_string()),
                ("MaxConnections", "1".to_string()),
                ("DataPDUInOrder", "Yes".to_string()),
                ("DataSequenceInOrder", "Yes".to_string()),
                ("DefaultTime2Wait", "2".to_string()),
                ("DefaultTime2Retain", "0".to_string()),
                ("ErrorRecoveryLevel", "0".to_string()),
            ]);
        }
        self.offered = pairs.iter().map(|(key, _)| *key).collect();
        self.params.initiator_max_recv = DECLARED_MAX_RECV;
        pairs
    }

    fn operational(
        &mut self,
        response: &LoginResponse,
        pairs: &[(String, String)],
    ) -> Result<LoginStep, LoginError> {
        let mut answers: Vec<(String, String)> = Vec::new();
        for (key, value) in pairs {
            if self.declaration(key, value) {
                continue;
            }
            if key == "MaxRecvDataSegmentLength" {
                // The target's declaration (§13.12).
                let n = parse_number(value).filter(|&n| n >= 512).ok_or_else(|| {
                    LoginError::Protocol(format!("MaxRecvDataSegmentLength={value}"))
                })?;
                self.params.target_max_recv = n.min(u64::from(crate::pdu::MAX_DATA_SEGMENT)) as u32;
                continue;
            }
            let offered = self.offered.contains(key.as_str());
            let answer = self.apply(key, value)?;
            if !offered {
                answers.push(answer);
            }
        }
        if self.params.first_burst_length > self.params.max_burst_length {
            self.params.first_burst_length = self.params.max_burst_length;
        }
        if response.transit {
            if response.next_stage != stage::FULL_FEATURE {
                return Err(LoginError::Protocol(format!(
                    "the target moves to stage {} from the operational stage",
                    response.next_stage
                )));
            }
            return Ok(LoginStep::Done(self.finish(response)));
        }
        let answers = answers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        Ok(self.request(answers, true, stage::FULL_FEATURE))
    }

    /// Applies a target's answer to one of our keys, or its own offer of one;
    /// returns what we answer to an offer. Our preferences
    /// (InitialR2T=No, ImmediateData=Yes) make both boolean results the target's
    /// value (§13.10: InitialR2T is an OR; §13.11: ImmediateData an AND).
    fn apply(&mut self, key: &str, value: &str) -> Result<(String, String), LoginError> {
        let refused = matches!(value, "Reject" | "NotUnderstood" | "Irrelevant");
        let number = || parse_number(value).and_then(|n| u32::try_from(n).ok());
        let params = &mut self.params;
        let answer = match key {
            "HeaderDigest" | "DataDigest" => {
                let crc = match value {
                    "CRC32C" => true,
                    "None" => false,
                    _ if refused && !self.options.digests => false,
                    _ => {
                        return Err(LoginError::Protocol(format!(
                            "the target answers {key}={value}; CRC32C digests were asked for"
                        )))
                    }
                };
                // Digests were asked for: a target that refuses them fails the login
                // rather than running without.
                if self.options.digests && !crc {
                    return Err(LoginError::Protocol(format!(
                        "the target refuses CRC32C for {key}"
                    )));
                }
                if key == "HeaderDigest" {
                    params.header_digest = crc;
                } else {
                    params.data_digest = crc;
                }
                if crc { "CRC32C" } else { "None" }.to_string()
            }
            "MaxBurstLength" => {
                if let Some(n) = number().filter(|&n| n >= 512) {
                    params.max_burst_length = n.min(OFFERED_MAX_BURST);
                }
                params.max_burst_length.to_string()
            }
            "FirstBurstLength" => {
                if let Some(n) = number().filter(|&n| n >= 512) {
                    params.first_burst_length = n.min(OFFERED_FIRST_BURST);
                }
                params.first_burst_length.to_string()
            }
            "MaxOutstandingR2T" => {
                if let Some(n) = number().filter(|&n| n >= 1) {
                    params.max_outstanding_r2t = n.min(8);
                }
                params.max_outstanding_r2t.to_string()
            }
            "InitialR2T" => {
                if !refused {
                    params.initial_r2t = value == "Yes";
                }
                if params.initial_r2t { "Yes" } else { "No" }.to_string()
            }
            "ImmediateData" => {
                if !refused {
                    params.immediate_data = value == "Yes";
                }
                if params.immediate_data { "Yes" } else { "No" }.to_string()
            }
            "ErrorRecoveryLevel" => {
                if !refused && value != "0" {
                    return Err(LoginError::Protocol(format!(
                        "ErrorRecoveryLevel={value}; we offered 0"
                    )));
                }
                "0".to_string()
            }
            "MaxConnections" => "1".to_string(),
            "DataPDUInOrder" | "DataSequenceInOrder" => "Yes".to_string(),
            "DefaultTime2Wait" | "DefaultTime2Retain" => value.to_string(),
            // Markers are gone from RFC 7143; an AND we answer No.
            "IFMarker" | "OFMarker" | "RDMAExtensions" => "No".to_string(),
            "IFMarkInt" | "OFMarkInt" => "Irrelevant".to_string(),
            "TaskReporting" => "RFC3720".to_string(),
            "iSCSIProtocolLevel" => "0".to_string(),
            // A key we do not know (§6.2).
            _ => "NotUnderstood".to_string(),
        };
        Ok((key.to_string(), answer))
    }

    fn finish(&mut self, response: &LoginResponse) -> SessionParams {
        let mut params = self.params.clone();
        params.tsih = response.tsih;
        params.exp_stat_sn = self.exp_stat_sn;
        params.exp_cmd_sn = response.exp_cmd_sn;
        params.max_cmd_sn = response.max_cmd_sn;
        params
    }
}
