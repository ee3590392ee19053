//! Reservations, as a pure state machine: persistent reservations (SPC-4 5.12,
//! PERSISTENT RESERVE IN/OUT) and the older RESERVE/RELEASE (SPC-2 7.21). The
//! logical unit keeps one [`Reservations`] behind a lock and asks [`conflicts`]
//! before each command; the answers to PR IN and the unit attentions PR OUT raises
//! come back as plain values.
//!
//! [`conflicts`]: Reservations::conflicts

use crate::cdb::Access;
use crate::nexus::{Nexus, NexusKey};
use crate::sense::{codes, Code};

/// Persistent reservation types (SPC-4 6.15.3.4 table 172).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    pub fn from_code(code: u8) -> Option<PrType> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant is a reservation holder (SPC-4 5.12.10).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants only or all registrants: registrants get access.
    fn registrants_have_access(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }

    /// Reads by those without access conflict.
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// PERSISTENT RESERVE OUT service actions.
pub mod action {
    pub const REGISTER: u8 = 0x00;
    pub const RESERVE: u8 = 0x01;
    pub const RELEASE: u8 = 0x02;
    pub const CLEAR: u8 = 0x03;
    pub const PREEMPT: u8 = 0x04;
    pub const PREEMPT_AND_ABORT: u8 = 0x05;
    pub const REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 0x06;
    /// PERSISTENT RESERVE IN service actions.
    pub const READ_KEYS: u8 = 0x00;
    pub const READ_RESERVATION: u8 = 0x01;
    pub const REPORT_CAPABILITIES: u8 = 0x02;
    pub const READ_FULL_STATUS: u8 = 0x03;
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Registration {
    nexus: NexusKey,
    transport_id: Vec<u8>,
    key: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    /// The nexus that reserved (for all-registrants types, every registrant holds).
    holder: NexusKey,
    kind: PrType,
}

/// A decoded PERSISTENT RESERVE OUT request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrOut {
    pub action: u8,
    pub scope: u8,
    pub kind: u8,
    /// RESERVATION KEY.
    pub key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub action_key: u64,
    pub spec_i_pt: bool,
    pub all_tg_pt: bool,
    pub aptpl: bool,
}

/// Why a PR OUT request fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrError {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION with this code.
    Check(Code),
}

impl PrOut {
    /// Decodes the 24-byte basic parameter list (SPC-4 6.16.3).
    pub fn parse(action: u8, scope: u8, kind: u8, params: &[u8]) -> Result<PrOut, PrError> {
        if params.len() < 24 {
            return Err(PrError::Check(codes::PARAMETER_LIST_LENGTH_ERROR));
        }
        let u64_at = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&params[at..at + 8]);
            u64::from_be_bytes(raw)
        };
        let flags = params[20];
        let out = PrOut {
            action,
            scope,
            kind,
            key: u64_at(0),
            action_key: u64_at(8),
            spec_i_pt: flags & 0x08 != 0,
            all_tg_pt: flags & 0x04 != 0,
            aptpl: flags & 0x01 != 0,
        };
        // SPEC_I_PT and ALL_TG_PT are not supported (REPORT CAPABILITIES says so).
        if out.spec_i_pt || out.all_tg_pt {
            return Err(PrError::Check(codes::INVALID_FIELD_IN_PARAMETER_LIST));
        }
        if params.len() != 24 {
            return Err(PrError::Check(codes::PARAMETER_LIST_LENGTH_ERROR));
        }
        Ok(out)
    }
}

/// Unit attentions a PR OUT raises, for the logical unit to queue.
pub type Attentions = Vec<(NexusKey, Code)>;

/// The reservation state of one logical unit.
#[derive(Debug, Default, Clone)]
pub struct Reservations {
    registrations: Vec<Registration>,
    reservation: Option<Reservation>,
    generation: u32,
    /// The holder of an SPC-2 RESERVE(6)/(10) reservation.
    legacy: Option<NexusKey>,
}

impl Reservations {
    pub fn new() -> Reservations {
        Reservations::default()
    }

    /// Whether any reservation (persistent or SPC-2) exists: when not, nothing
    /// conflicts and the logical unit skips the lock (its fast path).
    pub fn any_reservation(&self) -> bool {
        self.reservation.is_some() || self.legacy.is_some()
    }

    pub fn generation(&self) -> u32 {
        self.generation
    }

    fn registration(&self, nexus: &Nexus) -> Option<&Registration> {
        self.registrations.iter().find(|r| nexus.is(&r.nexus))
    }

    fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            Some(r) if r.kind.all_registrants() => self.registration(nexus).is_some(),
            Some(r) => nexus.is(&r.holder),
            None => false,
        }
    }

    /// Whether a command of class `access` from `nexus` meets a reservation conflict
    /// (SPC-4 5.12.1 table 47; SPC-2 7.21 for RESERVE/RELEASE).
    pub fn conflicts(&self, nexus: &Nexus, access: Access) -> bool {
        if access == Access::Exempt {
            return false;
        }
        if let Some(holder) = &self.legacy {
            return !nexus.is(holder);
        }
        let Some(reservation) = &self.reservation else {
            return false;
        };
        if access == Access::Allowed || self.is_holder(nexus) {
            return false;
        }
        let kind = reservation.kind;
        if kind.registrants_have_access() && self.registration(nexus).is_some() {
            return false;
        }
        match access {
            Access::Read => kind.exclusive_access(),
            _ => true,
        }
    }

    /// RESERVE(6)/(10). SPC-4 5.12.3 (CRH): a persistent reservation holder's
    /// RESERVE succeeds without effect; anyone else's conflicts.
    pub fn reserve_legacy(&mut self, nexus: &Nexus) -> Result<(), PrError> {
        if self.reservation.is_some() {
            return if self.is_holder(nexus) {
                Ok(())
            } else {
                Err(PrError::Conflict)
            };
        }
        match &self.legacy {
            Some(holder) if !nexus.is(holder) => Err(PrError::Conflict),
            _ => {
                self.legacy = Some(nexus.key());
                Ok(())
            }
        }
    }

    /// RELEASE(6)/(10): releases the nexus's own reservation; anyone else's RELEASE
    /// succeeds without effect (SPC-2 7.24).
    pub fn release_legacy(&mut self, nexus: &Nexus) -> Result<(), PrError> {
        if self.reservation.is_some() && !self.is_holder(nexus) {
            return Err(PrError::Conflict);
        }
        if self.legacy.as_ref().is_some_and(|h| nexus.is(h)) {
            self.legacy = None;
        }
        Ok(())
    }

    /// Drops the SPC-2 reservation (logical unit reset, SPC-2 5.5.3).
    pub fn reset_legacy(&mut self) {
        self.legacy = None;
    }

    /// The nexus is gone: its SPC-2 reservation goes with it; persistent
    /// registrations stay (SPC-4 5.12.1).
    pub fn nexus_lost(&mut self, nexus: &Nexus) {
        if self.legacy.as_ref().is_some_and(|h| nexus.is(h)) {
            self.legacy = None;
        }
    }

    fn others(&self, nexus: &Nexus, code: Code) -> Attentions {
        self.registrations
            .iter()
            .filter(|r| !nexus.is(&r.nexus))
            .map(|r| (r.nexus.clone(), code))
            .collect()
    }

    /// Removes the nexus's registration and what hangs on it (SPC-4 5.12.11.2.3).
    fn unregister(&mut self, nexus: &Nexus) -> Attentions {
        let mut attentions = Vec::new();
        if let Some(reservation) = &self.reservation {
            let kind = reservation.kind;
            let holder = nexus.is(&reservation.holder);
            let last = self.registrations.len() == 1;
            if kind.all_registrants() {
                if last {
                    self.reservation = None;
                }
            } else if holder {
                self.reservation = None;
                // Released by unregistering: registrants-only types tell the others.
                if kind.registrants_have_access() {
                    attentions = self.others(nexus, codes::RESERVATIONS_RELEASED);
                }
            }
            if kind.all_registrants() && holder && self.reservation.is_some() {
                // Keep the reservation reported under a registrant that remains.
                if let Some(next) = self.registrations.iter().find(|r| !nexus.is(&r.nexus)) {
                    let next = next.nexus.clone();
                    if let Some(r) = self.reservation.as_mut() {
                        r.holder = next;
                    }
                }
            }
        }
        self.registrations.retain(|r| !nexus.is(&r.nexus));
        attentions
    }

    /// Executes PERSISTENT RESERVE OUT (SPC-4 5.12.7 - 5.12.11, 6.16).
    pub fn persistent_reserve_out(
        &mut self,
        nexus: &Nexus,
        request: &PrOut,
    ) -> Result<Attentions, PrError> {
        use action::*;
        let registered_key = self.registration(nexus).map(|r| r.key);
        match request.action {
            REGISTER | REGISTER_AND_IGNORE_EXISTING_KEY => {
                let ignore = request.action == REGISTER_AND_IGNORE_EXISTING_KEY;
                match registered_key {
                    None => {
                        if !ignore && request.key != 0 {
                            return Err(PrError::Conflict);
                        }
                        if request.action_key != 0 {
                            self.registrations.push(Registration {
                                nexus: nexus.key(),
                                transport_id: nexus.transport_id.clone(),
                                key: request.action_key,
                            });
                            self.bump();
                        }
                        Ok(Vec::new())
                    }
                    Some(key) => {
                        if !ignore && request.key != key {
                            return Err(PrError::Conflict);
                        }
                        let attentions = if request.action_key == 0 {
                            self.unregister(nexus)
                        } else {
                            for r in self.registrations.iter_mut() {
                                if nexus.is(&r.nexus) {
                                    r.key = request.action_key;
                                }
                            }
                            Vec::new()
                        };
                        self.bump();
                        Ok(attentions)
                    }
                }
            }
            RESERVE | RELEASE | CLEAR | PREEMPT | PREEMPT_AND_ABORT => {
                let Some(key) = registered_key else {
                    return Err(PrError::Conflict);
                };
                if request.key != key {
                    return Err(PrError::Conflict);
                }
                let needs_type = request.action != CLEAR;
                if needs_type && request.scope != 0 {
                    return Err(PrError::Check(codes::INVALID_FIELD_IN_CDB));
                }
                let kind = PrType::from_code(request.kind);
                if needs_type && kind.is_none() {
                    return Err(PrError::Check(codes::INVALID_FIELD_IN_CDB));
                }
                match (request.action, kind) {
                    (RESERVE, Some(kind)) => self.reserve(nexus, kind),
                    (RELEASE, Some(kind)) => self.release(nexus, kind),
                    (CLEAR, _) => Ok(self.clear(nexus)),
                    (_, Some(kind)) => self.preempt(nexus, kind, request.action_key),
                    _ => Err(PrError::Check(codes::INVALID_FIELD_IN_CDB)),
                }
            }
            _ => Err(PrError::Check(codes::INVALID_FIELD_IN_CDB)),
        }
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    fn reserve(&mut self, nexus: &Nexus, kind: PrType) -> Result<Attentions, PrError> {
        if self.legacy.is_some() {
            return Err(PrError::Conflict);
        }
        match &self.reservation {
            // SPC-4 5.12.9: the holder may repeat its reservation, not change it.
            Some(r) if self.is_holder(nexus) && r.kind == kind => Ok(Vec::new()),
            Some(_) => Err(PrError::Conflict),
            None => {
                self.reservation = Some(Reservation {
                    holder: nexus.key(),
                    kind,
                });
                Ok(Vec::new())
            }
        }
    }

    fn release(&mut self, nexus: &Nexus, kind: PrType) -> Result<Attentions, PrError> {
        let Some(reservation) = &self.reservation else {
            return Ok(Vec::new());
        };
        if !self.is_holder(nexus) {
            return Ok(Vec::new());
        }
        if reservation.kind != kind {
            return Err(PrError::Check(
                codes::INVALID_RELEASE_OF_PERSISTENT_RESERVATION,
            ));
        }
        self.reservation = None;
        // SPC-4 5.12.11.2.2: releasing a registrants-only or all-registrants
        // reservation tells the other registrants.
        Ok(if kind.registrants_have_access() {
            self.others(nexus, codes::RESERVATIONS_RELEASED)
        } else {
            Vec::new()
        })
    }

    fn clear(&mut self, nexus: &Nexus) -> Attentions {
        let attentions = self.others(nexus, codes::RESERVATIONS_PREEMPTED);
        self.registrations.clear();
        self.reservation = None;
        self.bump();
        attentions
    }

    /// Removes every other registration with `key`, returning who lost one.
    fn remove_key(&mut self, nexus: &Nexus, key: u64) -> Attentions {
        let removed: Attentions = self
            .registrations
            .iter()
            .filter(|r| r.key == key && !nexus.is(&r.nexus))
            .map(|r| (r.nexus.clone(), codes::REGISTRATIONS_PREEMPTED))
            .collect();
        self.registrations
            .retain(|r| r.key != key || nexus.is(&r.nexus));
        removed
    }

    fn preempt(
        &mut self,
        nexus: &Nexus,
        kind: PrType,
        target_key: u64,
    ) -> Result<Attentions, PrError> {
        let current = self.reservation.clone();
        match current {
            // All-registrants reservation with key 0: everyone else goes and the
            // preempting nexus takes a new reservation (SPC-4 5.12.11.4.3).
            Some(r) if r.kind.all_registrants() && target_key == 0 => {
                let removed: Attentions = self.others(nexus, codes::REGISTRATIONS_PREEMPTED);
                self.registrations.retain(|reg| nexus.is(&reg.nexus));
                self.reservation = Some(Reservation {
                    holder: nexus.key(),
                    kind,
                });
                self.bump();
                Ok(removed)
            }
            Some(r) if !r.kind.all_registrants() && self.holder_key() == Some(target_key) => {
                let removed = self.remove_key(nexus, target_key);
                let changed = r.kind != kind;
                self.reservation = Some(Reservation {
                    holder: nexus.key(),
                    kind,
                });
                let mut attentions = removed.clone();
                if changed {
                    for (who, _) in self.others(nexus, codes::RESERVATIONS_RELEASED) {
                        if !removed.iter().any(|(gone, _)| *gone == who) {
                            attentions.push((who, codes::RESERVATIONS_RELEASED));
                        }
                    }
                }
                self.bump();
                Ok(attentions)
            }
            _ => {
                // Preempting registrations only (no reservation, or one whose holder
                // does not have the key).
                if target_key == 0 {
                    return Err(PrError::Check(codes::INVALID_FIELD_IN_PARAMETER_LIST));
                }
                let removed = self.remove_key(nexus, target_key);
                if removed.is_empty() {
                    return Err(PrError::Conflict);
                }
                if let Some(r) = &self.reservation {
                    if !self.registrations.iter().any(|reg| reg.nexus == r.holder) {
                        if r.kind.all_registrants() && !self.registrations.is_empty() {
                            let next = self.registrations[0].nexus.clone();
                            if let Some(r) = self.reservation.as_mut() {
                                r.holder = next;
                            }
                        } else {
                            self.reservation = None;
                        }
                    }
                }
                self.bump();
                Ok(removed)
            }
        }
    }

    fn holder_key(&self) -> Option<u64> {
        let holder = &self.reservation.as_ref()?.holder;
        self.registrations
            .iter()
            .find(|r| r.nexus == *holder)
            .map(|r| r.key)
    }

    /// PERSISTENT RESERVE IN READ KEYS (SPC-4 6.15.2).
    pub fn read_keys(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 8 * self.registrations.len());
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&((8 * self.registrations.len()) as u32).to_be_bytes());
        for r in &self.registrations {
            out.extend_from_slice(&r.key.to_be_bytes());
        }
        out
    }

    /// PERSISTENT RESERVE IN READ RESERVATION (SPC-4 6.15.3).
    pub fn read_reservation(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend_from_slice(&self.generation.to_be_bytes());
        match &self.reservation {
            None => out.extend_from_slice(&0u32.to_be_bytes()),
            Some(r) => {
                out.extend_from_slice(&16u32.to_be_bytes());
                // All-registrants reservations report key 0 (SPC-4 6.15.3.3).
                let key = if r.kind.all_registrants() {
                    0
                } else {
                    self.holder_key().unwrap_or(0)
                };
                out.extend_from_slice(&key.to_be_bytes());
                out.extend_from_slice(&[0, 0, 0, 0, 0, r.kind as u8, 0, 0]);
            }
        }
        out
    }

    /// PERSISTENT RESERVE IN REPORT CAPABILITIES (SPC-4 6.15.4).
    pub fn report_capabilities() -> Vec<u8> {
        vec![
            0x00, 0x08,
            // CRH: RESERVE/RELEASE follow SPC-4 5.12.3; no SIP_C, ATP_C, PTPL_C.
            0x10, // TMV with ALLOW COMMANDS 000b; PTPL_A clear.
            0x80, // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX; then EX_AC_AR.
            0xea, 0x01, 0x00, 0x00,
        ]
    }

    /// PERSISTENT RESERVE IN READ FULL STATUS (SPC-4 6.15.5).
    pub fn read_full_status(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for r in &self.registrations {
            let holder = match &self.reservation {
                Some(res) if res.kind.all_registrants() => true,
                Some(res) => res.holder == r.nexus,
                None => false,
            };
            body.extend_from_slice(&r.key.to_be_bytes());
            body.extend_from_slice(&[0, 0, 0, 0]);
            body.push(u8::from(holder));
            body.push(match (&self.reservation, holder) {
                (Some(res), true) => res.kind as u8,
                _ => 0,
            });
            body.extend_from_slice(&[0, 0, 0, 0]);
            body.extend_from_slice(&r.nexus.relative_target_port.to_be_bytes());
            body.extend_from_slice(&(r.transport_id.len() as u32).to_be_bytes());
            body.extend_from_slice(&r.transport_id);
        }
        let mut out = Vec::with_capacity(8 + body.len());
        out.extend_from_slice(&self.generation.to_be_bytes());
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }
}

#[cfg(test)]
mod tests;
