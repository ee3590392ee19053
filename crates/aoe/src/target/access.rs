//! A target's management state and the commands that change it (AoEr11 §3.2–3.4):
//! the config string, the MAC mask list (who may talk to the target at all) and the
//! reserve list (who may issue ATA commands). Pure logic: tested without sockets.

use std::sync::RwLock;

use crate::wire::{
    mask, reserve, AoeError, ConfigCommand, ConfigQuery, MacAddr, MaskDirective, MaskList,
    ReserveList, MAX_CONFIG_LEN,
};

/// Longest MAC mask list the target keeps (one response frame carries 255).
pub const MAX_MASKS: usize = 255;
/// Longest reserve list (also bounded by one frame).
pub const MAX_RESERVED: usize = 255;

/// What a request from a given source may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Proceed.
    Allowed,
    /// Drop silently: the source is not on a non-empty MAC mask list.
    Ignored,
    /// Answer ATA and mask edits with "target is reserved".
    Reserved,
}

/// The answer to a Query Config Information request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigAnswer {
    /// Reply with this config string.
    Reply(Vec<u8>),
    /// Send nothing (a test that did not match).
    Silent,
    /// Reply with an AoE error.
    Error(AoeError),
}

#[derive(Default)]
struct Lists {
    config: Vec<u8>,
    masks: Vec<MacAddr>,
    reserved: Vec<MacAddr>,
}

/// The management state of one target, shared by its receive threads.
#[derive(Default)]
pub struct AccessState {
    lists: RwLock<Lists>,
}

impl AccessState {
    /// A state with an initial config string (truncated to 1024 bytes).
    pub fn with_config(config: &[u8]) -> AccessState {
        let state = AccessState::default();
        state.write().config = config[..config.len().min(MAX_CONFIG_LEN)].to_vec();
        state
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Lists> {
        self.lists.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Lists> {
        self.lists.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `src` may send commands, and may send ATA commands.
    pub fn admit(&self, src: &MacAddr) -> Admission {
        let lists = self.read();
        if !lists.masks.is_empty() && !lists.masks.contains(src) {
            Admission::Ignored
        } else if !lists.reserved.is_empty() && !lists.reserved.contains(src) {
            Admission::Reserved
        } else {
            Admission::Allowed
        }
    }

    /// The current config string.
    pub fn config(&self) -> Vec<u8> {
        self.read().config.clone()
    }

    /// Carries out a Query Config Information request.
    pub fn query_config(&self, query: &ConfigQuery<'_>) -> ConfigAnswer {
        let Some(command) = ConfigCommand::from_code(query.command) else {
            return ConfigAnswer::Error(AoeError::BadArgument);
        };
        match command {
            ConfigCommand::Read => ConfigAnswer::Reply(self.config()),
            ConfigCommand::TestExact => {
                let config = self.config();
                if config == query.config {
                    ConfigAnswer::Reply(config)
                } else {
                    ConfigAnswer::Silent
                }
            }
            ConfigCommand::TestPrefix => {
                let config = self.config();
                if config.starts_with(query.config) {
                    ConfigAnswer::Reply(config)
                } else {
                    ConfigAnswer::Silent
                }
            }
            ConfigCommand::SetIfEmpty => {
                let mut lists = self.write();
                if !lists.config.is_empty() && lists.config != query.config {
                    return ConfigAnswer::Error(AoeError::ConfigStringPresent);
                }
                lists.config = query.config.to_vec();
                ConfigAnswer::Reply(lists.config.clone())
            }
            ConfigCommand::ForceSet => {
                let mut lists = self.write();
                lists.config = query.config.to_vec();
                ConfigAnswer::Reply(lists.config.clone())
            }
        }
    }

    /// Carries out a MAC Mask List request; returns the response body.
    pub fn mask_list(&self, request: &MaskList) -> Result<MaskList, AoeError> {
        let mut lists = self.write();
        let mut error = 0;
        match request.command {
            mask::READ => {}
            mask::EDIT => {
                // Directives apply in order; the first bad one stops the edit and is
                // reported in the mask error field.
                for directive in &request.directives {
                    match directive.command {
                        mask::DIRECTIVE_NONE => {}
                        mask::DIRECTIVE_ADD => {
                            if !lists.masks.contains(&directive.mac) {
                                if lists.masks.len() >= MAX_MASKS {
                                    error = mask::ERROR_LIST_FULL;
                                    break;
                                }
                                lists.masks.push(directive.mac);
                            }
                        }
                        mask::DIRECTIVE_DELETE => lists.masks.retain(|m| *m != directive.mac),
                        _ => {
                            error = mask::ERROR_BAD_DIRECTIVE;
                            break;
                        }
                    }
                }
            }
            _ => return Err(AoeError::BadArgument),
        }
        Ok(MaskList {
            command: request.command,
            error,
            directives: lists
                .masks
                .iter()
                .map(|&mac| MaskDirective {
                    command: mask::DIRECTIVE_NONE,
                    mac,
                })
                .collect(),
        })
    }

    /// Carries out a Reserve/Release request from `src`; returns the response body.
    pub fn reserve(&self, src: &MacAddr, request: &ReserveList) -> Result<ReserveList, AoeError> {
        let mut lists = self.write();
        match request.command {
            reserve::READ => {}
            reserve::SET => {
                if !lists.reserved.is_empty() && !lists.reserved.contains(src) {
                    return Err(AoeError::TargetReserved);
                }
                lists.reserved = request.macs.iter().take(MAX_RESERVED).copied().collect();
            }
            reserve::FORCE_SET => {
                lists.reserved = request.macs.iter().take(MAX_RESERVED).copied().collect();
            }
            _ => return Err(AoeError::BadArgument),
        }
        Ok(ReserveList {
            command: request.command,
            macs: lists.reserved.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = [2, 0, 0, 0, 0, 0xa];
    const B: MacAddr = [2, 0, 0, 0, 0, 0xb];

    fn query(command: ConfigCommand, config: &[u8]) -> ConfigQuery<'_> {
        ConfigQuery {
            buffer_count: 0,
            firmware_version: 0,
            sector_count: 0,
            aoe_version: 1,
            command: command as u8,
            config,
        }
    }

    fn edit(directives: &[(u8, MacAddr)]) -> MaskList {
        MaskList {
            command: mask::EDIT,
            error: 0,
            directives: directives
                .iter()
                .map(|&(command, mac)| MaskDirective { command, mac })
                .collect(),
        }
    }

    #[test]
    fn config_string_tests_and_sets() {
        let state = AccessState::default();
        use ConfigAnswer::*;
        assert_eq!(
            state.query_config(&query(ConfigCommand::Read, b"")),
            Reply(vec![])
        );
        assert_eq!(
            state.query_config(&query(ConfigCommand::SetIfEmpty, b"host-a")),
            Reply(b"host-a".to_vec())
        );
        assert_eq!(
            state.query_config(&query(ConfigCommand::SetIfEmpty, b"host-b")),
            Error(AoeError::ConfigStringPresent)
        );
        assert_eq!(
            state.query_config(&query(ConfigCommand::TestExact, b"host")),
            Silent
        );
        assert_eq!(
            state.query_config(&query(ConfigCommand::TestPrefix, b"host")),
            Reply(b"host-a".to_vec())
        );
        assert_eq!(
            state.query_config(&query(ConfigCommand::ForceSet, b"host-b")),
            Reply(b"host-b".to_vec())
        );
        assert_eq!(
            state.query_config(&query(ConfigCommand::TestExact, b"host-b")),
            Reply(b"host-b".to_vec())
        );
        let mut bad = query(ConfigCommand::Read, b"");
        bad.command = 9;
        assert_eq!(state.query_config(&bad), Error(AoeError::BadArgument));
    }

    #[test]
    fn mask_list_limits_who_is_heard() {
        let state = AccessState::default();
        assert_eq!(state.admit(&A), Admission::Allowed);
        let list = state.mask_list(&edit(&[(mask::DIRECTIVE_ADD, A)])).unwrap();
        assert_eq!(list.directives.len(), 1);
        assert_eq!(state.admit(&A), Admission::Allowed);
        assert_eq!(state.admit(&B), Admission::Ignored);
        state
            .mask_list(&edit(&[(mask::DIRECTIVE_DELETE, A)]))
            .unwrap();
        assert_eq!(state.admit(&B), Admission::Allowed);
    }

    #[test]
    fn a_bad_directive_stops_the_edit() {
        let state = AccessState::default();
        let list = state
            .mask_list(&edit(&[
                (mask::DIRECTIVE_ADD, A),
                (7, B),
                (mask::DIRECTIVE_ADD, B),
            ]))
            .unwrap();
        assert_eq!(list.error, mask::ERROR_BAD_DIRECTIVE);
        assert_eq!(list.directives.len(), 1);
        assert_eq!(list.directives[0].mac, A);
    }

    #[test]
    fn reservations_admit_only_holders() {
        let state = AccessState::default();
        let set = |command, macs: Vec<MacAddr>| ReserveList { command, macs };
        state.reserve(&A, &set(reserve::SET, vec![A])).unwrap();
        assert_eq!(state.admit(&A), Admission::Allowed);
        assert_eq!(state.admit(&B), Admission::Reserved);
        assert_eq!(
            state.reserve(&B, &set(reserve::SET, vec![B])),
            Err(AoeError::TargetReserved)
        );
        let read = state.reserve(&B, &set(reserve::READ, vec![])).unwrap();
        assert_eq!(read.macs, vec![A]);
        state
            .reserve(&B, &set(reserve::FORCE_SET, vec![B]))
            .unwrap();
        assert_eq!(state.admit(&A), Admission::Reserved);
        state.reserve(&B, &set(reserve::SET, vec![])).unwrap();
        assert_eq!(state.admit(&A), Admission::Allowed);
    }
}
