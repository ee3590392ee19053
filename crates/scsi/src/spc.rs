//! The SPC commands of a logical unit that need more than a line of dispatch:
//! INQUIRY, READ CAPACITY(16), RESERVE/RELEASE and PERSISTENT RESERVE IN/OUT.

use crate::cdb::CdbError;
use crate::command::Response;
use crate::inquiry::{self, DISK};
use crate::lun::LogicalUnit;
use crate::nexus::Nexus;
use crate::reservation::{PrError, PrOut, Reservations};
use crate::vpd;

impl LogicalUnit {
    pub(crate) fn inquiry(&self, evpd: bool, page: u8, alloc: u32, nexus: &Nexus) -> Response {
        if !evpd {
            return Response::with_allocation(&inquiry::standard(&self.config, DISK), alloc);
        }
        match vpd::vpd_page(page, &self.config, &self.facts, nexus) {
            Some(out) => Response::with_allocation(&out, alloc),
            None => self.fail(
                CdbError::InvalidField { byte: 2, bit: None }.sense(),
                u64::from(alloc),
            ),
        }
    }

    pub(crate) fn read_capacity16(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[0..8].copy_from_slice(&(self.num_blocks - 1).to_be_bytes());
        out[8..12].copy_from_slice(&self.block_size.to_be_bytes());
        out[13] = self.lbppbe & 0x0f;
        if self.facts.unmap {
            out[14] |= 0x80; // LBPME
        }
        if self.facts.lbprz {
            out[14] |= 0x40; // LBPRZ
        }
        out
    }

    pub(crate) fn legacy(
        &self,
        f: impl FnOnce(&mut Reservations) -> Result<(), PrError>,
    ) -> Response {
        let mut state = self.reservations_mut();
        let result = f(&mut state);
        self.publish(&state);
        match result {
            Ok(()) => Response::good(0),
            Err(PrError::Conflict) => Response::reservation_conflict(0),
            Err(PrError::Check(code)) => self.fail(code, 0),
        }
    }

    pub(crate) fn persistent_reserve_in(&self, action: u8, alloc: u32) -> Response {
        use crate::reservation::action::*;
        let state = self.reservations();
        let out = match action {
            READ_KEYS => state.read_keys(),
            READ_RESERVATION => state.read_reservation(),
            REPORT_CAPABILITIES => Reservations::report_capabilities(),
            READ_FULL_STATUS => state.read_full_status(),
            _ => {
                return self.fail(
                    CdbError::InvalidField {
                        byte: 1,
                        bit: Some(4),
                    }
                    .sense(),
                    u64::from(alloc),
                )
            }
        };
        Response::with_allocation(&out, alloc)
    }

    pub(crate) fn persistent_reserve_out(
        &self,
        nexus: &Nexus,
        action: u8,
        scope: u8,
        kind: u8,
        param_len: u32,
        data: &[u8],
    ) -> Response {
        let expected = u64::from(param_len);
        let params = &data[..data.len().min(param_len as usize)];
        let request = match PrOut::parse(action, scope, kind, params) {
            Ok(request) => request,
            Err(PrError::Check(code)) => return self.fail(code, expected),
            Err(PrError::Conflict) => return Response::reservation_conflict(expected),
        };
        let mut state = self.reservations_mut();
        let result = state.persistent_reserve_out(nexus, &request);
        self.publish(&state);
        drop(state);
        match result {
            Ok(attentions) => {
                self.queue_attentions(attentions);
                Response::good(expected)
            }
            Err(PrError::Conflict) => Response::reservation_conflict(expected),
            Err(PrError::Check(code)) => self.fail(code, expected),
        }
    }
}
