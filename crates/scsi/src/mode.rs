//! Mode parameters (SPC-4 7.5, SBC-3 6.4): the caching page (WCE), the control page
//! (D_SENSE, SWP) and the informational exceptions control page, for MODE SENSE and
//! MODE SELECT. Values live in atomics: the data path reads WCE, SWP and D_SENSE on
//! every command without a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::sense::{codes, FieldPointer, Sense};

pub const PAGE_CACHING: u8 = 0x08;
pub const PAGE_CONTROL: u8 = 0x0a;
pub const PAGE_INFORMATIONAL_EXCEPTIONS: u8 = 0x1c;
pub const PAGE_ALL: u8 = 0x3f;

/// Page control values of MODE SENSE (2 is default, 3 saved).
const PC_CURRENT: u8 = 0;
const PC_CHANGEABLE: u8 = 1;

/// The logical unit facts a mode parameter header and block descriptor report.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub num_blocks: u64,
    pub block_size: u32,
    /// WP bit of the device-specific parameter.
    pub write_protected: bool,
}

/// The mode parameters of one logical unit.
#[derive(Debug)]
pub struct ModeState {
    default_wce: bool,
    wce: AtomicBool,
    d_sense: AtomicBool,
    swp: AtomicBool,
    /// Counts MODE SELECTs that changed something.
    changes: AtomicU64,
}

/// Values of the changeable fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Values {
    wce: bool,
    d_sense: bool,
    swp: bool,
}

fn invalid_cdb(byte: u16) -> Sense {
    Sense::new(codes::INVALID_FIELD_IN_CDB).with_field(FieldPointer {
        in_cdb: true,
        byte,
        bit: None,
    })
}

fn invalid_param(byte: usize) -> Sense {
    Sense::new(codes::INVALID_FIELD_IN_PARAMETER_LIST).with_field(FieldPointer {
        in_cdb: false,
        byte: byte.min(usize::from(u16::MAX)) as u16,
        bit: None,
    })
}

impl ModeState {
    /// `volatile_cache`: the device has a write cache that FLUSH empties, so writes
    /// are cached (WCE=1) by default.
    pub fn new(volatile_cache: bool) -> ModeState {
        ModeState {
            default_wce: volatile_cache,
            wce: AtomicBool::new(volatile_cache),
            d_sense: AtomicBool::new(false),
            swp: AtomicBool::new(false),
            changes: AtomicU64::new(0),
        }
    }

    /// How many times MODE SELECT changed a parameter: lets the target tell the
    /// other nexuses (MODE PARAMETERS CHANGED, SPC-4 6.9).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Write cache enabled: without it every write is forced unit access.
    pub fn write_cache(&self) -> bool {
        self.wce.load(Ordering::Relaxed)
    }

    /// Descriptor-format sense data (control page D_SENSE).
    pub fn descriptor_sense(&self) -> bool {
        self.d_sense.load(Ordering::Relaxed)
    }

    /// Software write protect (control page SWP).
    pub fn software_write_protect(&self) -> bool {
        self.swp.load(Ordering::Relaxed)
    }

    /// Back to the defaults (power on; a TARGET COLD RESET).
    pub fn reset(&self) {
        self.wce.store(self.default_wce, Ordering::Relaxed);
        self.d_sense.store(false, Ordering::Relaxed);
        self.swp.store(false, Ordering::Relaxed);
    }

    fn values(&self, pc: u8) -> Values {
        match pc {
            PC_CURRENT => Values {
                wce: self.write_cache(),
                d_sense: self.descriptor_sense(),
                swp: self.software_write_protect(),
            },
            PC_CHANGEABLE => Values {
                wce: true,
                d_sense: true,
                swp: true,
            },
            // Default, and saved: nothing is saved, so power on brings the defaults.
            _ => Values {
                wce: self.default_wce,
                d_sense: false,
                swp: false,
            },
        }
    }

    fn page(&self, code: u8, pc: u8) -> Option<Vec<u8>> {
        let v = self.values(pc);
        let changeable = pc == PC_CHANGEABLE;
        let fixed = |value: u8| if changeable { 0 } else { value };
        Some(match code {
            PAGE_CACHING => {
                // SBC-3 6.4.5: WCE is bit 2 of byte 2.
                let mut page = vec![0u8; 20];
                page[0] = PAGE_CACHING;
                page[1] = 0x12;
                page[2] = if v.wce { 0x04 } else { 0 };
                page
            }
            PAGE_CONTROL => {
                // SPC-4 7.5.8: D_SENSE byte 2 bit 2, QUEUE ALGORITHM MODIFIER 1
                // (unrestricted reordering), SWP byte 4 bit 3, busy timeout unlimited.
                let mut page = vec![0u8; 12];
                page[0] = PAGE_CONTROL;
                page[1] = 0x0a;
                page[2] = if v.d_sense { 0x04 } else { 0 };
                page[3] = fixed(0x10);
                page[4] = if v.swp { 0x08 } else { 0 };
                page[8] = fixed(0xff);
                page[9] = fixed(0xff);
                page
            }
            PAGE_INFORMATIONAL_EXCEPTIONS => {
                // SPC-4 7.5.12: exceptions disabled (DEXCPT), nothing changeable.
                let mut page = vec![0u8; 12];
                page[0] = PAGE_INFORMATIONAL_EXCEPTIONS;
                page[1] = 0x0a;
                page[2] = fixed(0x08);
                page
            }
            _ => return None,
        })
    }

    /// MODE SENSE(6)/(10) parameter data, before the allocation-length cut.
    #[allow(clippy::too_many_arguments)]
    pub fn sense(
        &self,
        ten: bool,
        dbd: bool,
        llbaa: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        geometry: Geometry,
    ) -> Result<Vec<u8>, Sense> {
        // Subpages: only "all pages and subpages" with page 3Fh (SPC-4 6.11).
        if subpage != 0 && !(page == PAGE_ALL && subpage == 0xff) {
            return Err(invalid_cdb(3));
        }
        let mut pages = Vec::new();
        if page == PAGE_ALL {
            for code in [PAGE_CACHING, PAGE_CONTROL, PAGE_INFORMATIONAL_EXCEPTIONS] {
                pages.extend(self.page(code, pc).unwrap_or_default());
            }
        } else {
            pages = self.page(page, pc).ok_or_else(|| invalid_cdb(2))?;
        }
        // Device-specific parameter (SBC-3 6.4.2): WP, and DPOFUA: DPO and FUA bits
        // are honoured.
        let dsp = 0x10
            | if geometry.write_protected || self.software_write_protect() {
                0x80
            } else {
                0
            };
        let descriptor = if dbd {
            Vec::new()
        } else if llbaa {
            let mut d = vec![0u8; 16];
            d[0..8].copy_from_slice(&geometry.num_blocks.to_be_bytes());
            d[12..16].copy_from_slice(&geometry.block_size.to_be_bytes());
            d
        } else {
            let mut d = vec![0u8; 8];
            let blocks = u32::try_from(geometry.num_blocks).unwrap_or(u32::MAX);
            d[0..4].copy_from_slice(&blocks.to_be_bytes());
            d[5..8].copy_from_slice(&geometry.block_size.to_be_bytes()[1..4]);
            d
        };
        let mut out = Vec::with_capacity(8 + descriptor.len() + pages.len());
        if ten {
            let len = (6 + descriptor.len() + pages.len()) as u16;
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&[0, dsp, u8::from(llbaa && !dbd), 0]);
            out.extend_from_slice(&(descriptor.len() as u16).to_be_bytes());
        } else {
            let len = (3 + descriptor.len() + pages.len()).min(255) as u8;
            out.extend_from_slice(&[len, 0, dsp, descriptor.len() as u8]);
        }
        out.extend_from_slice(&descriptor);
        out.extend_from_slice(&pages);
        Ok(out)
    }

    /// MODE SELECT(6)/(10): checks every page against the changeable masks before
    /// applying any of it, so a bad list changes nothing (SPC-4 6.9).
    pub fn select(
        &self,
        ten: bool,
        sp: bool,
        params: &[u8],
        geometry: Geometry,
    ) -> Result<bool, Sense> {
        if sp {
            // Nothing can be saved.
            return Err(invalid_cdb(1));
        }
        if params.is_empty() {
            return Ok(false);
        }
        let header = if ten { 8 } else { 4 };
        if params.len() < header {
            return Err(Sense::new(codes::PARAMETER_LIST_LENGTH_ERROR));
        }
        let descriptors = if ten {
            usize::from(u16::from_be_bytes([params[6], params[7]]))
        } else {
            usize::from(params[3])
        };
        let body = header + descriptors;
        if params.len() < body {
            return Err(Sense::new(codes::PARAMETER_LIST_LENGTH_ERROR));
        }
        // A block descriptor may only repeat the block length we have.
        let mut at = header;
        let long = ten && params[4] & 1 != 0;
        let step = if long { 16 } else { 8 };
        while at + step <= body {
            let length = if long {
                u32::from_be_bytes([
                    params[at + 12],
                    params[at + 13],
                    params[at + 14],
                    params[at + 15],
                ])
            } else {
                u32::from_be_bytes([0, params[at + 5], params[at + 6], params[at + 7]])
            };
            if length != 0 && length != geometry.block_size {
                return Err(invalid_param(at + step - 3));
            }
            at += step;
        }
        let mut next = self.values(PC_CURRENT);
        let mut at = body;
        while at < params.len() {
            let code = params[at] & 0x3f;
            if params[at] & 0x40 != 0 {
                // Sub-page format: none of our pages has subpages.
                return Err(invalid_param(at));
            }
            let len = match params.get(at + 1) {
                Some(&len) => usize::from(len),
                None => return Err(Sense::new(codes::PARAMETER_LIST_LENGTH_ERROR)),
            };
            let Some(page) = params.get(at..at + 2 + len) else {
                return Err(Sense::new(codes::PARAMETER_LIST_LENGTH_ERROR));
            };
            let current = self
                .page(code, PC_CURRENT)
                .ok_or_else(|| invalid_param(at))?;
            let mask = self.page(code, PC_CHANGEABLE).unwrap_or_default();
            if page.len() != current.len() {
                return Err(invalid_param(at + 1));
            }
            // PS (bit 7 of byte 0) is reserved in MODE SELECT; compare the rest.
            for i in 1..page.len() {
                let m = mask.get(i).copied().unwrap_or(0);
                if (page[i] ^ current[i]) & !m != 0 {
                    return Err(invalid_param(at + i));
                }
            }
            match code {
                PAGE_CACHING => next.wce = page[2] & 0x04 != 0,
                PAGE_CONTROL => {
                    next.d_sense = page[2] & 0x04 != 0;
                    next.swp = page[4] & 0x08 != 0;
                }
                _ => {}
            }
            at += 2 + len;
        }
        let changed = next != self.values(PC_CURRENT);
        self.wce.store(next.wce, Ordering::Relaxed);
        self.d_sense.store(next.d_sense, Ordering::Relaxed);
        self.swp.store(next.swp, Ordering::Relaxed);
        if changed {
            self.changes.fetch_add(1, Ordering::AcqRel);
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEOMETRY: Geometry = Geometry {
        num_blocks: 1000,
        block_size: 512,
        write_protected: false,
    };

    #[test]
    fn sense6_header_and_descriptor() {
        let mode = ModeState::new(true);
        let data = mode
            .sense(false, false, false, 0, PAGE_CACHING, 0, GEOMETRY)
            .unwrap();
        assert_eq!(&data[..4], &[3 + 8 + 20, 0, 0x10, 8]);
        assert_eq!(&data[4..12], &[0, 0, 0x03, 0xe8, 0, 0, 0x02, 0]);
        assert_eq!(data[12], PAGE_CACHING);
        assert_eq!(data[14] & 0x04, 0x04);
    }

    #[test]
    fn unknown_pages_and_subpages_are_invalid() {
        let mode = ModeState::new(false);
        assert!(mode
            .sense(false, true, false, 0, 0x05, 0, GEOMETRY)
            .is_err());
        assert!(mode
            .sense(false, true, false, 0, PAGE_CONTROL, 1, GEOMETRY)
            .is_err());
        let all = mode
            .sense(true, true, false, 0, PAGE_ALL, 0xff, GEOMETRY)
            .unwrap();
        assert_eq!(all.len(), 8 + 20 + 12 + 12);
    }

    #[test]
    fn select_sets_d_sense_and_refuses_fixed_fields() {
        let mode = ModeState::new(false);
        let mut page = mode.page(PAGE_CONTROL, PC_CURRENT).unwrap();
        page[2] |= 0x04;
        let mut params = vec![0, 0, 0, 0];
        params.extend_from_slice(&page);
        assert_eq!(mode.select(false, false, &params, GEOMETRY), Ok(true));
        assert!(mode.descriptor_sense());
        params[4 + 3] = 0x00; // QUEUE ALGORITHM MODIFIER is not changeable
        assert_eq!(
            mode.select(false, false, &params, GEOMETRY)
                .unwrap_err()
                .code,
            codes::INVALID_FIELD_IN_PARAMETER_LIST
        );
        assert!(mode.select(false, false, &params[..5], GEOMETRY).is_err());
    }
}
