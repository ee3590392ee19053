//! The block commands (SBC-3): READ, WRITE, WRITE AND VERIFY, VERIFY, WRITE SAME,
//! UNMAP, COMPARE AND WRITE, SYNCHRONIZE CACHE, PRE-FETCH and GET LBA STATUS.
//!
//! Reads go straight from the device into one page-aligned [`IoBuf`] that becomes the
//! data-in; writes go straight from the transport's data-out to the device. Writes
//! hold the logical unit's write lock shared, COMPARE AND WRITE exclusively.

use blockwire_blockdev::{ExtentState, IoBuf, WriteFlags, ZeroFlags};

use crate::cdb::{CdbError, Rw};
use crate::command::Response;
use crate::lun::{Deallocate, LogicalUnit};
use crate::sense::{codes, FieldPointer, Sense};

/// Largest buffer a replicated WRITE SAME pattern is written from.
const WRITE_SAME_CHUNK: usize = 1 << 20;
/// Most descriptors one GET LBA STATUS returns.
const MAX_LBA_STATUS_DESCRIPTORS: usize = 1024;

/// Provisioning status of GET LBA STATUS (SBC-3 table 60).
const MAPPED: u8 = 0;
const DEALLOCATED: u8 = 1;

/// A transfer length beyond our limits (no field pointer: the field's place varies
/// with the CDB size).
fn invalid_length() -> Sense {
    Sense::new(codes::INVALID_FIELD_IN_CDB)
}

fn miscompare(offset: usize) -> Sense {
    Sense::new(codes::MISCOMPARE_DURING_VERIFY).with_information(offset as u64)
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

impl LogicalUnit {
    /// Byte offset and length of `blocks` blocks at `lba`, or LBA OUT OF RANGE.
    pub(crate) fn range(&self, lba: u64, blocks: u64) -> Result<(u64, u64), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.num_blocks => {
                let bs = u64::from(self.block_size);
                Ok((lba * bs, blocks * bs))
            }
            _ => Err(Sense::new(codes::LBA_OUT_OF_RANGE).with_information(lba)),
        }
    }

    /// Range and MAXIMUM TRANSFER LENGTH checks for a data-moving command.
    pub(crate) fn transfer_range(&self, lba: u64, blocks: u32) -> Result<(u64, u64), Sense> {
        let range = self.range(lba, u64::from(blocks))?;
        if blocks > self.facts.max_transfer_blocks {
            return Err(invalid_length());
        }
        Ok(range)
    }

    /// FUA for a write: asked for, or implied by a disabled write cache; dropped
    /// when the device has no cache to bypass.
    pub(crate) fn write_flags(&self, fua: bool) -> WriteFlags {
        WriteFlags {
            fua: self.fua && (fua || !self.mode.write_cache()),
        }
    }

    fn write_shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.write_gate.shared()
    }

    pub(crate) fn read(&self, rw: Rw, expected: u64) -> Response {
        let (offset, len) = match self.transfer_range(rw.lba, rw.blocks) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, expected),
        };
        let mut buf = IoBuf::new(len as usize);
        if len > 0 {
            if let Err(err) = self.device.read(&mut buf, offset) {
                return self.device_error(&err, expected);
            }
        }
        Response::with_data(buf, expected)
    }

    /// READ when every byte is in the device's cache; None when it would wait for
    /// the device or fail (then [`read`](Self::read) runs where blocking is fine and
    /// reports the error).
    pub(crate) fn try_read(&self, rw: Rw, expected: u64) -> Option<Response> {
        let (offset, len) = self.transfer_range(rw.lba, rw.blocks).ok()?;
        let mut buf = IoBuf::new(len as usize);
        if len > 0 && !self.device.try_read(&mut buf, offset).ok()? {
            return None;
        }
        Some(Response::with_data(buf, expected))
    }

    /// WRITE and WRITE AND VERIFY. Data-out shorter than the CDB asks for is written
    /// as far as it goes and no further (FCP-4 9.4.2 a: process the command, transfer
    /// no more than was sent); a cut last block keeps the rest of its old bytes.
    pub(crate) fn write(&self, rw: Rw, data: &[u8], expected: u64) -> Response {
        let (offset, len) = match self.transfer_range(rw.lba, rw.blocks) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, expected),
        };
        let got = data.len().min(len as usize);
        if got == 0 {
            return Response::good(expected);
        }
        let bs = self.block_size as usize;
        let flags = self.write_flags(rw.fua);
        let result = if got.is_multiple_of(bs) {
            let _shared = self.write_shared();
            self.device.write(&data[..got], offset, flags)
        } else {
            self.write_partial(&data[..got], offset, flags)
        };
        match result {
            Ok(()) => Response::good(expected),
            Err(err) => self.device_error(&err, expected),
        }
    }

    /// Writes `data`, whose last block is cut, merged over the old contents of that
    /// block; other writes wait so the merge does not lose theirs.
    fn write_partial(
        &self,
        data: &[u8],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<(), blockwire_blockdev::Error> {
        let bs = self.block_size as usize;
        let span = data.len().div_ceil(bs) * bs;
        let _exclusive = self.write_gate.exclusive();
        let mut buf = IoBuf::new(span);
        self.device
            .read(&mut buf[span - bs..], offset + (span - bs) as u64)?;
        buf[..data.len()].copy_from_slice(data);
        self.device.write(&buf, offset, flags)
    }

    /// ORWRITE(16) (SBC-3 5.12): each byte becomes itself OR the data-out's, with
    /// other writes held off between the read and the write. Bytes the initiator did
    /// not send are left alone.
    pub(crate) fn or_write(&self, rw: Rw, data: &[u8], expected: u64) -> Response {
        let (offset, len) = match self.transfer_range(rw.lba, rw.blocks) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, expected),
        };
        let got = data.len().min(len as usize);
        if got == 0 {
            return Response::good(expected);
        }
        let span = got.div_ceil(self.block_size as usize) * self.block_size as usize;
        let _exclusive = self.write_gate.exclusive();
        let mut buf = IoBuf::new(span);
        if let Err(err) = self.device.read(&mut buf, offset) {
            return self.device_error(&err, expected);
        }
        for (byte, with) in buf.iter_mut().zip(data) {
            *byte |= with;
        }
        match self.device.write(&buf, offset, self.write_flags(rw.fua)) {
            Ok(()) => Response::good(expected),
            Err(err) => self.device_error(&err, expected),
        }
    }

    /// VERIFY: BYTCHK 0 checks only the range (the medium is always readable as far
    /// as we can tell without reading it); 1 compares the data-out with the blocks;
    /// 3 compares one data-out block with each block (SBC-3 5.29).
    pub(crate) fn verify(
        &self,
        lba: u64,
        blocks: u32,
        bytchk: u8,
        data: &[u8],
        expected: u64,
    ) -> Response {
        let (offset, len) = match self.transfer_range(lba, blocks) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, expected),
        };
        if bytchk == 0 || len == 0 {
            return Response::good(expected);
        }
        let bs = self.block_size as usize;
        let need = if bytchk == 1 { len as usize } else { bs };
        if data.len() < need {
            return self.fail(codes::INVALID_FIELD_IN_INFORMATION_UNIT, expected);
        }
        let mut buf = IoBuf::new(len as usize);
        if let Err(err) = self.device.read(&mut buf, offset) {
            return self.device_error(&err, expected);
        }
        let mismatch = if bytchk == 1 {
            first_difference(&buf, &data[..need])
        } else {
            buf.chunks(bs)
                .enumerate()
                .find_map(|(i, block)| first_difference(block, &data[..bs]).map(|at| i * bs + at))
        };
        match mismatch {
            Some(at) => self.fail(miscompare(at), expected),
            None => Response::good(expected),
        }
    }

    pub(crate) fn synchronize_cache(&self, lba: u64, blocks: u32) -> Response {
        if let Err(sense) = self.range(lba, u64::from(blocks)) {
            return self.fail(sense, 0);
        }
        // Without a volatile cache every write is already durable.
        if self.flush {
            if let Err(err) = self.device.flush() {
                return self.device_error(&err, 0);
            }
        }
        Response::good(0)
    }

    /// PRE-FETCH: a cache hint. SBC-3 5.9 allows CONDITION MET when the range fits
    /// the cache; we cannot tell, so GOOD (which initiators and libiscsi expect).
    pub(crate) fn pre_fetch(&self, lba: u64, blocks: u32) -> Response {
        let (offset, len) = match self.range(lba, u64::from(blocks)) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, 0),
        };
        if len > 0 {
            if let Err(err) = self.device.cache(offset, len) {
                return self.device_error(&err, 0);
            }
        }
        Response::good(0)
    }

    /// Makes a byte range deallocated (UNMAP): a hole that reads as zeroes where the
    /// device can, else a trim.
    fn deallocate_range(&self, offset: u64, len: u64) -> Result<(), blockwire_blockdev::Error> {
        match self.deallocate {
            Deallocate::Zeroes => self.device.write_zeroes(
                offset,
                len,
                ZeroFlags {
                    fua: false,
                    no_hole: false,
                    fast: false,
                },
            ),
            Deallocate::Trim => self.device.trim(offset, len, WriteFlags::NONE),
            Deallocate::None => Ok(()),
        }
    }

    /// WRITE SAME(10)/(16) (SBC-3 5.44): NUMBER OF LOGICAL BLOCKS 0 means to the end
    /// of the medium (WSNZ is 0). UNMAP deallocates; otherwise a zero block (or NDOB)
    /// becomes write-zeroes and any other block is replicated.
    pub(crate) fn write_same(
        &self,
        lba: u64,
        blocks: u32,
        unmap: bool,
        ndob: bool,
        data: &[u8],
        expected: u64,
    ) -> Response {
        let blocks = match blocks {
            0 => self.num_blocks.saturating_sub(lba),
            n => u64::from(n),
        };
        let (offset, len) = match self.range(lba, blocks) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, expected),
        };
        if blocks > self.facts.max_write_same_blocks {
            return self.fail(invalid_length(), expected);
        }
        let bs = self.block_size as usize;
        let pattern = if ndob {
            None
        } else if data.len() != bs {
            // The data-out must be exactly one block.
            return self.fail(codes::INVALID_FIELD_IN_CDB, expected);
        } else {
            Some(data)
        };
        if len == 0 {
            return Response::good(expected);
        }
        let _shared = self.write_shared();
        let zero = pattern.is_none_or(|p| p.iter().all(|&b| b == 0));
        let result = if unmap && self.deallocate != Deallocate::None {
            // SBC-3 4.7.3.4: with UNMAP the blocks are deallocated whatever the
            // data block holds, and then read as LBPRZ says.
            self.deallocate_range(offset, len)
        } else if zero {
            // Zeroes without UNMAP keep the blocks mapped.
            self.device.write_zeroes(
                offset,
                len,
                ZeroFlags {
                    fua: self.write_flags(false).fua,
                    no_hole: true,
                    fast: false,
                },
            )
        } else {
            self.replicate(pattern.unwrap_or_default(), offset, len)
        };
        match result {
            Ok(()) => Response::good(expected),
            Err(err) => self.device_error(&err, expected),
        }
    }

    fn replicate(
        &self,
        pattern: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<(), blockwire_blockdev::Error> {
        let bs = pattern.len().max(1);
        let chunk = (WRITE_SAME_CHUNK / bs).max(1) * bs;
        let chunk = chunk.min(len as usize);
        let mut buf = IoBuf::new(chunk);
        for piece in buf.chunks_mut(bs) {
            piece.copy_from_slice(&pattern[..piece.len()]);
        }
        let flags = self.write_flags(false);
        let mut at = 0u64;
        while at < len {
            let piece = (len - at).min(chunk as u64) as usize;
            self.device.write(&buf[..piece], offset + at, flags)?;
            at += piece as u64;
        }
        Ok(())
    }

    /// UNMAP (SBC-3 5.28): every descriptor is checked before any is executed.
    pub(crate) fn unmap(&self, param_len: u32, data: &[u8]) -> Response {
        let expected = u64::from(param_len);
        if self.deallocate == Deallocate::None {
            return self.fail(codes::INVALID_COMMAND_OPERATION_CODE, expected);
        }
        if param_len == 0 {
            return Response::good(expected);
        }
        let params = &data[..data.len().min(param_len as usize)];
        if params.len() < 8 {
            return self.fail(codes::PARAMETER_LIST_LENGTH_ERROR, expected);
        }
        let declared = usize::from(u16::from_be_bytes([params[2], params[3]]));
        let count = declared.min(params.len() - 8) / 16;
        if count > self.facts.max_unmap_descriptors as usize {
            return self.fail(
                Sense::new(codes::INVALID_FIELD_IN_PARAMETER_LIST).with_field(FieldPointer {
                    in_cdb: false,
                    byte: 2,
                    bit: None,
                }),
                expected,
            );
        }
        let mut ranges = Vec::with_capacity(count);
        for (i, descriptor) in params[8..8 + count * 16].chunks_exact(16).enumerate() {
            let mut lba = [0u8; 8];
            lba.copy_from_slice(&descriptor[0..8]);
            let lba = u64::from_be_bytes(lba);
            let blocks =
                u32::from_be_bytes([descriptor[8], descriptor[9], descriptor[10], descriptor[11]]);
            let range = match self.range(lba, u64::from(blocks)) {
                Ok(range) => range,
                Err(sense) => return self.fail(sense, expected),
            };
            if blocks > self.facts.max_unmap_blocks {
                return self.fail(
                    Sense::new(codes::INVALID_FIELD_IN_PARAMETER_LIST).with_field(FieldPointer {
                        in_cdb: false,
                        byte: (8 + i * 16 + 8).min(usize::from(u16::MAX)) as u16,
                        bit: None,
                    }),
                    expected,
                );
            }
            if range.1 > 0 {
                ranges.push(range);
            }
        }
        let _shared = self.write_shared();
        for (offset, len) in ranges {
            if let Err(err) = self.deallocate_range(offset, len) {
                return self.device_error(&err, expected);
            }
        }
        Response::good(expected)
    }

    /// COMPARE AND WRITE (SBC-3 5.2): the first half of the data-out is compared with
    /// the blocks and, if equal, the second half written, with every other write to
    /// the logical unit held off in between.
    pub(crate) fn compare_and_write(
        &self,
        lba: u64,
        blocks: u32,
        fua: bool,
        data: &[u8],
        expected: u64,
    ) -> Response {
        let (offset, len) = match self.range(lba, u64::from(blocks)) {
            Ok(range) => range,
            Err(sense) => return self.fail(sense, expected),
        };
        if blocks > u32::from(self.facts.max_compare_and_write_blocks) {
            return self.fail(
                CdbError::InvalidField {
                    byte: 13,
                    bit: None,
                }
                .sense(),
                expected,
            );
        }
        if blocks == 0 {
            // Nothing to compare; data-out with it means the length field is wrong
            // (an initiator that put 256 into the one-byte field, say).
            if !data.is_empty() {
                return self.fail(
                    CdbError::InvalidField {
                        byte: 13,
                        bit: None,
                    }
                    .sense(),
                    expected,
                );
            }
            return Response::good(expected);
        }
        let len = len as usize;
        if data.len() != 2 * len {
            return self.fail(codes::INVALID_FIELD_IN_INFORMATION_UNIT, expected);
        }
        let (verify, write) = data.split_at(len);
        let _exclusive = self.write_gate.exclusive();
        let mut current = IoBuf::new(len);
        if let Err(err) = self.device.read(&mut current, offset) {
            return self.device_error(&err, expected);
        }
        if let Some(at) = first_difference(&current, verify) {
            return self.fail(miscompare(at), expected);
        }
        match self.device.write(write, offset, self.write_flags(fua)) {
            Ok(()) => Response::good(expected),
            Err(err) => self.device_error(&err, expected),
        }
    }

    /// GET LBA STATUS (SBC-3 5.5): mapped or deallocated runs from the device's
    /// extents, starting at the LBA asked for.
    pub(crate) fn get_lba_status(&self, lba: u64, alloc: u32) -> Response {
        let expected = u64::from(alloc);
        if lba >= self.num_blocks {
            return self.fail(
                Sense::new(codes::LBA_OUT_OF_RANGE).with_information(lba),
                expected,
            );
        }
        let bs = u64::from(self.block_size);
        let offset = lba * bs;
        let extents = match self.device.extents(
            offset,
            self.device.size().min(self.num_blocks * bs) - offset,
        ) {
            Ok(extents) => extents,
            Err(err) => return self.device_error(&err, expected),
        };
        let max = ((alloc as usize).saturating_sub(8) / 16).clamp(1, MAX_LBA_STATUS_DESCRIPTORS);
        let mut runs: Vec<(u64, u64, u8)> = Vec::new();
        let mut cursor = lba;
        for extent in extents {
            let hole = extent.state == ExtentState::Hole && self.facts.unmap;
            // A block counts as deallocated only when all of it is.
            let end = if hole {
                extent.end() / bs
            } else {
                extent.end().div_ceil(bs)
            }
            .min(self.num_blocks);
            if end <= cursor {
                continue;
            }
            let status = if hole { DEALLOCATED } else { MAPPED };
            match runs.last_mut() {
                Some(last) if last.2 == status && last.0 + last.1 == cursor => {
                    last.1 += end - cursor
                }
                _ => {
                    if runs.len() == max {
                        break;
                    }
                    runs.push((cursor, end - cursor, status));
                }
            }
            cursor = end;
        }
        if runs.is_empty() {
            runs.push((lba, 1, MAPPED));
        }
        let mut out = Vec::with_capacity(8 + 16 * runs.len());
        out.extend_from_slice(&((4 + 16 * runs.len()) as u32).to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        for (start, blocks, status) in runs {
            out.extend_from_slice(&start.to_be_bytes());
            out.extend_from_slice(&(blocks.min(u64::from(u32::MAX)) as u32).to_be_bytes());
            out.extend_from_slice(&[status, 0, 0, 0]);
        }
        Response::with_allocation(&out, alloc)
    }
}
