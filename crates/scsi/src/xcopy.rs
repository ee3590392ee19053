//! EXTENDED COPY(LID1) and RECEIVE COPY RESULTS OPERATING PARAMETERS (SPC-4 6.4,
//! 6.18.4): copies between logical units of this target without the data crossing
//! the network (VMware's VAAI "full copy"). Parameter-list parsing is pure; the copy
//! itself reads from the source device and writes to the destination in bounded
//! pieces.
//!
//! Supported: identification target descriptors (E4h) naming a logical unit by the
//! NAA designator of its VPD page 83h, and block-to-block segment descriptors (02h).
//! Copies run to completion inside the command; unless the list identifier is to be
//! discarded, their outcome is kept for RECEIVE COPY RESULTS COPY STATUS.

use std::collections::VecDeque;
use std::sync::Mutex;

use blockwire_blockdev::IoBuf;

use crate::cdb::Access;
use crate::command::{Command, Response};
use crate::lun::LogicalUnit;
use crate::nexus::{Nexus, NexusKey};
use crate::sense::{codes, Sense};
use crate::vpd;

pub const MAX_TARGET_DESCRIPTORS: usize = 8;
pub const MAX_SEGMENT_DESCRIPTORS: usize = 64;
const TARGET_DESCRIPTOR_LEN: usize = 32;
const BLOCK_SEGMENT_LEN: usize = 28;
pub const MAX_DESCRIPTOR_LIST_LEN: usize =
    MAX_TARGET_DESCRIPTORS * TARGET_DESCRIPTOR_LEN + MAX_SEGMENT_DESCRIPTORS * BLOCK_SEGMENT_LEN;
/// Largest segment in bytes (a block-to-block segment counts at most 65535 blocks).
pub const MAX_SEGMENT_BYTES: u32 = 64 << 20;
/// Bytes read and written at once while copying.
const COPY_CHUNK: usize = 1 << 20;

const IDENTIFICATION_DESCRIPTOR: u8 = 0xe4;
const BLOCK_TO_BLOCK: u8 = 0x02;

/// A copy source or destination: a designation descriptor from VPD page 83h.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyTarget {
    pub code_set: u8,
    pub designator_type: u8,
    pub designator: Vec<u8>,
    /// Logical block size the initiator expects (0: not given).
    pub block_size: u32,
}

/// One block-to-block segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub source: u16,
    pub destination: u16,
    pub blocks: u16,
    pub source_lba: u64,
    pub destination_lba: u64,
}

/// A parsed EXTENDED COPY parameter list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CopyList {
    pub list_id: u8,
    /// LIST ID USAGE 11b: keep nothing for RECEIVE COPY RESULTS.
    pub discard: bool,
    pub targets: Vec<CopyTarget>,
    pub segments: Vec<Segment>,
}

/// Copy results kept per logical unit.
const HELD_RESULTS: usize = 32;

/// The outcome of a finished EXTENDED COPY, for COPY STATUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Outcome {
    failed: bool,
    segments: u16,
    bytes: u64,
}

/// Outcomes of recent copies by I_T nexus and list identifier (SPC-4 5.17.4.3).
#[derive(Debug, Default)]
pub(crate) struct HeldResults(Mutex<VecDeque<(NexusKey, u8, Outcome)>>);

impl HeldResults {
    fn record(&self, nexus: &Nexus, list_id: u8, outcome: Outcome) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|(who, id, _)| !(nexus.is(who) && *id == list_id));
        if held.len() == HELD_RESULTS {
            held.pop_front();
        }
        held.push_back((nexus.key(), list_id, outcome));
    }

    /// COPY STATUS(LID1) data for the nexus's copy `list_id` (SPC-4 6.18.2).
    pub(crate) fn copy_status(&self, nexus: &Nexus, list_id: u8) -> Option<Vec<u8>> {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (_, _, outcome) = held
            .iter()
            .find(|(who, id, _)| nexus.is(who) && *id == list_id)?;
        let mut out = vec![0u8; 12];
        out[3] = 8;
        out[4] = u8::from(outcome.failed); // 00h done, 01h done with error
        out[5..7].copy_from_slice(&outcome.segments.to_be_bytes());
        // Bytes while they fit the field, else KiB (transfer count units F1h).
        let (units, count) = match u32::try_from(outcome.bytes) {
            Ok(bytes) => (0x00, bytes),
            Err(_) => (0xf1, (outcome.bytes >> 10).min(u64::from(u32::MAX)) as u32),
        };
        out[7] = units;
        out[8..12].copy_from_slice(&count.to_be_bytes());
        Some(out)
    }
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(raw)
}

/// Parses the parameter list (SPC-4 6.4.3). The order of the checks follows what
/// initiators (and libiscsi) expect: lengths first, then counts, then types.
pub fn parse(params: &[u8]) -> Result<CopyList, Sense> {
    let length_error = || Sense::new(codes::PARAMETER_LIST_LENGTH_ERROR);
    if params.is_empty() {
        return Ok(CopyList::default());
    }
    if params.len() < 16 {
        return Err(length_error());
    }
    let target_len = u16_at(params, 2);
    let segment_len = u32_at(params, 8);
    let inline_len = u32_at(params, 12);
    let end = 16usize
        .checked_add(target_len)
        .and_then(|n| n.checked_add(segment_len))
        .and_then(|n| n.checked_add(inline_len))
        .ok_or_else(length_error)?;
    if end > params.len() || target_len + segment_len > MAX_DESCRIPTOR_LIST_LEN {
        return Err(length_error());
    }
    if inline_len != 0 {
        return Err(Sense::new(codes::INVALID_FIELD_IN_PARAMETER_LIST));
    }
    if !target_len.is_multiple_of(TARGET_DESCRIPTOR_LEN) {
        return Err(length_error());
    }
    if target_len / TARGET_DESCRIPTOR_LEN > MAX_TARGET_DESCRIPTORS {
        return Err(Sense::new(codes::TOO_MANY_TARGET_DESCRIPTORS));
    }
    let mut list = CopyList {
        list_id: params[0],
        discard: (params[1] >> 3) & 0x03 == 0x03,
        ..CopyList::default()
    };
    for d in params[16..16 + target_len].chunks_exact(TARGET_DESCRIPTOR_LEN) {
        if d[0] != IDENTIFICATION_DESCRIPTOR {
            return Err(Sense::new(codes::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE));
        }
        // Only block devices (peripheral device type 0) can be copied between.
        if d[1] & 0x1f != 0 {
            return Err(Sense::new(codes::INVALID_FIELD_IN_PARAMETER_LIST));
        }
        let len = usize::from(d[7]).min(20);
        list.targets.push(CopyTarget {
            code_set: d[4] & 0x0f,
            designator_type: d[5] & 0x0f,
            designator: d[8..8 + len].to_vec(),
            block_size: u32::from_be_bytes([0, d[29], d[30], d[31]]),
        });
    }
    let segments = &params[16 + target_len..16 + target_len + segment_len];
    let mut at = 0;
    while at < segments.len() {
        if list.segments.len() == MAX_SEGMENT_DESCRIPTORS {
            return Err(Sense::new(codes::TOO_MANY_SEGMENT_DESCRIPTORS));
        }
        let header = segments.get(at..at + 4).ok_or_else(length_error)?;
        if header[0] != BLOCK_TO_BLOCK {
            return Err(Sense::new(codes::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE));
        }
        let len = 4 + u16_at(header, 2);
        if len != BLOCK_SEGMENT_LEN {
            return Err(Sense::new(codes::INVALID_FIELD_IN_PARAMETER_LIST));
        }
        let d = segments.get(at..at + len).ok_or_else(length_error)?;
        list.segments.push(Segment {
            source: u16::from_be_bytes([d[4], d[5]]),
            destination: u16::from_be_bytes([d[6], d[7]]),
            blocks: u16::from_be_bytes([d[10], d[11]]),
            source_lba: u64_at(d, 12),
            destination_lba: u64_at(d, 20),
        });
        at += len;
    }
    Ok(list)
}

/// RECEIVE COPY RESULTS OPERATING PARAMETERS data (SPC-4 6.18.4).
pub fn operating_parameters() -> Vec<u8> {
    let mut out = vec![0u8; 46];
    let available = (out.len() - 4) as u32;
    out[0..4].copy_from_slice(&available.to_be_bytes());
    out[8..10].copy_from_slice(&(MAX_TARGET_DESCRIPTORS as u16).to_be_bytes());
    out[10..12].copy_from_slice(&(MAX_SEGMENT_DESCRIPTORS as u16).to_be_bytes());
    out[12..16].copy_from_slice(&(MAX_DESCRIPTOR_LIST_LEN as u32).to_be_bytes());
    out[16..20].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    // No inline or held data, no stream devices; one copy at a time per command.
    out[34..36].copy_from_slice(&1u16.to_be_bytes());
    out[36] = 1;
    out[37] = 9; // data segment granularity: 512 bytes
    out[43] = 2;
    out[44] = BLOCK_TO_BLOCK;
    out[45] = IDENTIFICATION_DESCRIPTOR;
    out
}

/// Whether `target` names `unit`: its NAA designator from VPD page 83h.
fn names(target: &CopyTarget, unit: &LogicalUnit) -> bool {
    target.code_set == 1
        && target.designator_type == 3
        && target.designator == vpd::naa(unit.config().unique_id)
}

fn aborted(code: crate::sense::Code) -> Sense {
    Sense::new(code)
}

/// Executes EXTENDED COPY addressed to `unit`; `others` are the logical units the
/// copy may also name.
pub(crate) fn extended_copy<'a>(
    unit: &'a LogicalUnit,
    others: &[&'a LogicalUnit],
    command: &Command<'_>,
    param_len: u32,
) -> Response {
    let expected = u64::from(param_len);
    let data = command.data_out;
    if data.len() < param_len as usize {
        return unit.fail(codes::PARAMETER_LIST_LENGTH_ERROR, expected);
    }
    let list = match parse(&data[..param_len as usize]) {
        Ok(list) => list,
        Err(sense) => return unit.fail(sense, expected),
    };
    let resolve = |index: u16| -> Option<&'a LogicalUnit> {
        let target = list.targets.get(usize::from(index))?;
        let found = std::iter::once(unit)
            .chain(others.iter().copied())
            .find(|candidate| names(target, candidate))?;
        (target.block_size == 0 || target.block_size == found.block_size()).then_some(found)
    };
    // Check every segment before copying any, so a bad one changes nothing.
    let mut plan = Vec::with_capacity(list.segments.len());
    for segment in &list.segments {
        let (Some(source), Some(destination)) =
            (resolve(segment.source), resolve(segment.destination))
        else {
            return unit.fail(aborted(codes::COPY_TARGET_DEVICE_NOT_REACHABLE), expected);
        };
        if source.conflicts(command.nexus, Access::Read)
            || destination.conflicts(command.nexus, Access::Write)
        {
            return Response::reservation_conflict(expected);
        }
        if let Some(code) = destination.write_protection() {
            return unit.fail(code, expected);
        }
        let blocks = u64::from(segment.blocks);
        let (Ok(from), Ok(to)) = (
            source.range(segment.source_lba, blocks),
            destination.range(segment.destination_lba, blocks),
        ) else {
            return unit.fail(aborted(codes::COPY_ABORTED), expected);
        };
        if source.block_size() != destination.block_size() || from.1 > u64::from(MAX_SEGMENT_BYTES)
        {
            return unit.fail(aborted(codes::COPY_ABORTED), expected);
        }
        plan.push((source, destination, from, to));
    }
    let mut outcome = Outcome {
        failed: false,
        segments: 0,
        bytes: 0,
    };
    let mut result = Response::good(expected);
    for (source, destination, (from, len), (to, _)) in plan {
        if let Err(err) = copy(source, destination, from, to, len) {
            tracing::debug!(%err, "extended copy failed");
            outcome.failed = true;
            result = unit.fail(aborted(codes::COPY_ABORTED), expected);
            break;
        }
        outcome.segments += 1;
        outcome.bytes += len;
    }
    if !list.discard && !list.segments.is_empty() {
        unit.copy_results
            .record(command.nexus, list.list_id, outcome);
    }
    result
}

fn copy(
    source: &LogicalUnit,
    destination: &LogicalUnit,
    from: u64,
    to: u64,
    len: u64,
) -> Result<(), blockwire_blockdev::Error> {
    if len == 0 {
        return Ok(());
    }
    let mut buf = IoBuf::new(COPY_CHUNK.min(len as usize));
    let mut done = 0u64;
    while done < len {
        let piece = (len - done).min(buf.len() as u64) as usize;
        source.device().read(&mut buf[..piece], from + done)?;
        let _shared = destination.write_gate.shared();
        destination
            .device()
            .write(&buf[..piece], to + done, destination.write_flags(false))?;
        done += piece as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(target_len: u16, segment_len: u32) -> Vec<u8> {
        let mut out = vec![0u8; 16];
        out[0] = 1;
        out[2..4].copy_from_slice(&target_len.to_be_bytes());
        out[8..12].copy_from_slice(&segment_len.to_be_bytes());
        out
    }

    fn target(naa: [u8; 8]) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4] = 1;
        d[5] = 3;
        d[7] = 8;
        d[8..16].copy_from_slice(&naa);
        d[31] = 0x02; // 512
        d[30] = 0x00;
        d
    }

    fn segment(blocks: u16, src: u64, dst: u64) -> Vec<u8> {
        let mut d = vec![0u8; 28];
        d[0] = 0x02;
        d[3] = 0x18;
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src.to_be_bytes());
        d[20..28].copy_from_slice(&dst.to_be_bytes());
        d
    }

    #[test]
    fn parses_one_target_and_segment() {
        let mut params = header(32, 28);
        params.extend(target(vpd::naa(5)));
        params.extend(segment(8, 1, 100));
        let list = parse(&params).unwrap();
        assert_eq!((list.list_id, list.discard), (1, false));
        assert_eq!(list.targets[0].designator, vpd::naa(5));
        assert_eq!(list.targets[0].block_size, 2);
        assert_eq!(
            list.segments,
            vec![Segment {
                source: 0,
                destination: 0,
                blocks: 8,
                source_lba: 1,
                destination_lba: 100
            }]
        );
    }

    #[test]
    fn refusals() {
        let code = |params: &[u8]| parse(params).unwrap_err().code;
        assert_eq!(parse(&[]).unwrap(), CopyList::default());
        assert_eq!(code(&[0; 8]), codes::PARAMETER_LIST_LENGTH_ERROR);
        let mut cut = header(32, 28);
        cut.extend(target(vpd::naa(5)));
        assert_eq!(code(&cut), codes::PARAMETER_LIST_LENGTH_ERROR);
        let mut many = header(9 * 32, 0);
        for _ in 0..9 {
            many.extend(target(vpd::naa(5)));
        }
        assert_eq!(code(&many), codes::TOO_MANY_TARGET_DESCRIPTORS);
        let mut kind = header(32, 0);
        let mut t = target(vpd::naa(5));
        t[0] = 0xe0;
        kind.extend(t);
        assert_eq!(code(&kind), codes::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE);
        let mut stream = header(32, 28);
        stream.extend(target(vpd::naa(5)));
        let mut s = segment(1, 0, 0);
        s[0] = 0x00;
        stream.extend(s);
        assert_eq!(
            code(&stream),
            codes::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE
        );
        let mut segments = header(32, 65 * 28);
        segments.extend(target(vpd::naa(5)));
        for _ in 0..65 {
            segments.extend(segment(1, 0, 0));
        }
        assert_eq!(code(&segments), codes::TOO_MANY_SEGMENT_DESCRIPTORS);
    }

    #[test]
    fn operating_parameters_are_consistent() {
        let data = operating_parameters();
        assert_eq!(u32_at(&data, 0) + 4, data.len());
        assert_eq!(usize::from(data[43]), data.len() - 44);
    }
}
