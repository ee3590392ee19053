//! A striped volume (RAID-0): one device made of N member devices, cut into chunks
//! that go round-robin across the members (see [`Layout`]), so a large request keeps
//! every member busy at once — seed 003's four targets on four links, as one disk.
//!
//! Members are checked handles ([`Device`]), so each member splits, limits and
//! emulates for itself; the stripe only maps and fans out. Requests that touch
//! several members run on one scoped thread per member (the caller's thread takes
//! one of them); a request inside one chunk runs inline, so small I/O pays no
//! hand-off. Buffers are split into sub-slices, never copied. There is no lock on
//! the data path.

mod extents;
pub mod layout;

use std::io::IoSlice;
use std::thread;

pub use layout::{Layout, Piece};

use crate::device::{BlockDevice, Extent, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::fast_path::FastPath;
use crate::handle::Device;
use crate::info::{BlockSizes, Capabilities, DeviceInfo, Limits, Support};

/// On members that finish in memory (page cache, RAM), requests up to this size run
/// on the caller's thread: a thread costs more than copying this much.
const INLINE_BYTES: u64 = 256 * 1024;

/// Why members cannot form a stripe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StripeError {
    #[error("a stripe needs at least one member")]
    NoMembers,
    #[error("the chunk size must be above zero")]
    ZeroChunk,
    #[error(
        "block sizes cannot be reconciled: {first} has {first_block}-byte blocks, \
         {second} has {second_block}-byte blocks (one must be a multiple of the other)"
    )]
    BlockSizes {
        first: String,
        first_block: u32,
        second: String,
        second_block: u32,
    },
    #[error("the chunk size {chunk} is not a multiple of {member}'s block size {block}")]
    ChunkMisaligned {
        chunk: u64,
        member: String,
        block: u32,
    },
    #[error("{member} ({size} bytes) is smaller than one chunk ({chunk} bytes)")]
    MemberTooSmall {
        member: String,
        size: u64,
        chunk: u64,
    },
    #[error("the volume would be larger than 2^64 bytes")]
    TooLarge,
    #[error("{count} member names for {members} members")]
    Names { count: usize, members: usize },
}

/// A RAID-0 volume over member devices.
pub struct Stripe {
    members: Vec<Device>,
    names: Vec<String>,
    layout: Layout,
    info: DeviceInfo,
    /// Whether any member has a fast path: only then does the volume offer its own.
    members_fast: bool,
}

impl std::fmt::Debug for Stripe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stripe")
            .field("members", &self.names)
            .field("chunk", &self.layout.chunk())
            .field("size", &self.info.size)
            .finish()
    }
}

impl Stripe {
    /// A stripe of `members` with `chunk`-byte chunks, its members named
    /// "member 0", "member 1", ... in errors.
    pub fn new(members: Vec<Device>, chunk: u64) -> Result<Stripe, StripeError> {
        let names = (0..members.len()).map(|i| format!("member {i}")).collect();
        Stripe::with_names(members, names, chunk)
    }

    /// Like [`new`](Self::new), with a name for each member (its URI, say) that
    /// errors carry.
    pub fn with_names(
        members: Vec<Device>,
        names: Vec<String>,
        chunk: u64,
    ) -> Result<Stripe, StripeError> {
        if members.is_empty() {
            return Err(StripeError::NoMembers);
        }
        if names.len() != members.len() {
            return Err(StripeError::Names {
                count: names.len(),
                members: members.len(),
            });
        }
        let layout = Layout::new(members.len(), chunk).ok_or(StripeError::ZeroChunk)?;
        let info = combined_info(&members, &names, chunk)?;
        let members_fast = members.iter().any(Device::has_fast_path);
        Ok(Stripe {
            members,
            names,
            layout,
            info,
            members_fast,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    pub fn members(&self) -> &[Device] {
        &self.members
    }

    pub fn member_names(&self) -> &[String] {
        &self.names
    }

    /// The bytes of each member the volume uses (the smallest member, rounded down
    /// to the chunk).
    pub fn member_size(&self) -> u64 {
        self.info.size / self.members.len() as u64
    }

    /// A member's error as the volume's: the volume's operation and range, with the
    /// member named.
    fn member_error(&self, member: usize, op: Op, offset: u64, len: u64, e: Error) -> Error {
        Error::new(e.kind(), op, offset, len)
            .with_detail(format!("stripe member {}: {e}", self.names[member]))
    }

    /// Whether a request of `len` bytes touching `touched` members is worth threads.
    fn parallel(&self, touched: usize, len: u64) -> bool {
        touched > 1 && !(self.info.completes_inline && len <= INLINE_BYTES)
    }

    /// Runs `work` for every job, on one scoped thread per job except the first,
    /// which runs on the caller's thread (or all in order here, unless `parallel`).
    /// Returns the failure of the lowest-numbered member, if any.
    fn fan_out<J: Send>(
        &self,
        jobs: Vec<(usize, J)>,
        parallel: bool,
        work: impl Fn(usize, J) -> Result<()> + Sync,
    ) -> std::result::Result<(), (usize, Error)> {
        let work = &work;
        let mut failures: Vec<(usize, Error)> = Vec::new();
        if !parallel || jobs.len() < 2 {
            for (member, job) in jobs {
                if let Err(e) = work(member, job) {
                    failures.push((member, e));
                }
            }
        } else {
            thread::scope(|scope| {
                let mut jobs = jobs.into_iter();
                let first = jobs.next();
                let mut spawned = Vec::new();
                for (member, job) in jobs {
                    let started = thread::Builder::new()
                        .name(format!("stripe-{member}"))
                        .spawn_scoped(scope, move || work(member, job));
                    match started {
                        Ok(handle) => spawned.push((member, handle)),
                        // Rare (out of threads); the job is lost with the closure,
                        // so the request fails rather than half-succeeds silently.
                        Err(e) => failures.push((
                            member,
                            Error::new(ErrorKind::NoMemory, Op::Open, 0, 0)
                                .with_detail(format!("cannot start a thread: {e}")),
                        )),
                    }
                }
                if let Some((member, job)) = first {
                    if let Err(e) = work(member, job) {
                        failures.push((member, e));
                    }
                }
                for (member, handle) in spawned {
                    match handle.join() {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => failures.push((member, e)),
                        Err(_) => failures.push((
                            member,
                            Error::new(ErrorKind::Io, Op::Open, 0, 0)
                                .with_detail("a stripe thread panicked"),
                        )),
                    }
                }
            });
        }
        match failures.into_iter().min_by_key(|(member, _)| *member) {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Runs `call(member, member offset, len)` on the span of every member the range
    /// touches (trim, write-zeroes, cache: one call per member).
    fn per_member_span(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        call: impl Fn(&Device, u64, u64) -> Result<()> + Sync,
    ) -> Result<()> {
        let jobs: Vec<(usize, (u64, u64))> = (0..self.members.len())
            .filter_map(|m| self.layout.member_span(m, offset, len).map(|s| (m, s)))
            .collect();
        let parallel = jobs.len() > 1 && !self.info.completes_inline;
        self.fan_out(jobs, parallel, |m, (at, span)| {
            call(&self.members[m], at, span)
        })
        .map_err(|(m, e)| self.member_error(m, op, offset, len, e))
    }
}

/// The volume's info from its members': the strictest block sizes, the
/// intersection of capabilities, N × the smallest member rounded down to the chunk.
fn combined_info(
    members: &[Device],
    names: &[String],
    chunk: u64,
) -> Result<DeviceInfo, StripeError> {
    let infos: Vec<&DeviceInfo> = members.iter().map(Device::info).collect();
    // The largest minimum block size must be a multiple of every other one, or no
    // request size suits all members.
    let (strictest, _) = infos
        .iter()
        .enumerate()
        .max_by_key(|(_, info)| info.block_sizes.minimum)
        .ok_or(StripeError::NoMembers)?;
    let minimum = infos[strictest].block_sizes.minimum.max(1);
    for (i, info) in infos.iter().enumerate() {
        if !minimum.is_multiple_of(info.block_sizes.minimum.max(1)) {
            return Err(StripeError::BlockSizes {
                first: names[strictest].clone(),
                first_block: minimum,
                second: names[i].clone(),
                second_block: info.block_sizes.minimum,
            });
        }
    }
    if !chunk.is_multiple_of(u64::from(minimum)) {
        return Err(StripeError::ChunkMisaligned {
            chunk,
            member: names[strictest].clone(),
            block: minimum,
        });
    }
    for (i, info) in infos.iter().enumerate() {
        if info.size < chunk {
            return Err(StripeError::MemberTooSmall {
                member: names[i].clone(),
                size: info.size,
                chunk,
            });
        }
    }
    let smallest = infos.iter().map(|i| i.size).min().unwrap_or(0);
    let member_size = smallest / chunk * chunk;
    let size = member_size
        .checked_mul(members.len() as u64)
        .ok_or(StripeError::TooLarge)?;
    let preferred = infos
        .iter()
        .map(|i| i.block_sizes.preferred)
        .max()
        .unwrap_or(minimum)
        .max(minimum);
    // The members' smallest maximum transfer, once per member: a request of that
    // size spread over the stripe gives each member about its own maximum (each
    // member's handle splits anything larger anyway).
    let member_max = infos
        .iter()
        .map(|i| u64::from(i.block_sizes.maximum))
        .min()
        .unwrap_or(u64::from(minimum));
    let maximum = (member_max * members.len() as u64)
        .min(u64::from(DeviceInfo::DEFAULT_MAX_TRANSFER))
        / u64::from(minimum)
        * u64::from(minimum);
    let all = |f: &dyn Fn(&DeviceInfo) -> bool| infos.iter().all(|i| f(i));
    let native_if = |yes: bool| if yes { Support::Native } else { Support::None };
    let capabilities = Capabilities {
        flush: native_if(all(&|i| i.capabilities.flush.is_native())),
        // Passed through: each member's handle does FUA natively or as write + flush
        // of that member alone, cheaper than a flush of the whole volume.
        fua: native_if(all(&|i| i.capabilities.fua.available())),
        trim: native_if(all(&|i| i.capabilities.trim.is_native())),
        // Each member's handle zeroes natively or by writing zeroes.
        write_zeroes: native_if(all(&|i| i.capabilities.write_zeroes.available())),
        // All or none: a fast zero refused by one member after another zeroed its
        // part would change data although the request failed.
        fast_zero: native_if(all(&|i| i.capabilities.fast_zero.is_native())),
        extents: native_if(all(&|i| i.capabilities.extents.is_native())),
        cache: native_if(all(&|i| i.capabilities.cache.is_native())),
    };
    Ok(DeviceInfo {
        size,
        block_sizes: BlockSizes {
            minimum,
            preferred,
            maximum: (maximum.max(u64::from(minimum))) as u32,
        },
        // Each member's handle splits trims and zeroes by its own limits.
        limits: Limits::default(),
        read_only: infos.iter().any(|i| i.read_only),
        capabilities,
        rotational: infos.iter().any(|i| i.rotational),
        completes_inline: all(&|i| i.completes_inline),
        consistent_across_handles: all(&|i| i.consistent_across_handles),
        queue_wakes: false,
    })
}

impl BlockDevice for Stripe {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        if self.layout.within_one_chunk(offset, len) {
            let (m, at) = self.layout.locate(offset);
            return self.members[m]
                .read(buf, at)
                .map_err(|e| self.member_error(m, Op::Read, offset, len, e));
        }
        let mut per_member: Vec<Vec<(&mut [u8], u64)>> =
            (0..self.members.len()).map(|_| Vec::new()).collect();
        let mut rest: &mut [u8] = buf;
        for piece in self.layout.pieces(offset, len) {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(piece.len as usize);
            rest = tail;
            per_member[piece.member].push((head, piece.member_offset));
        }
        let jobs: Vec<_> = per_member
            .into_iter()
            .enumerate()
            .filter(|(_, pieces)| !pieces.is_empty())
            .collect();
        let parallel = self.parallel(jobs.len(), len);
        self.fan_out(jobs, parallel, |m, pieces| {
            for (piece, at) in pieces {
                self.members[m].read(piece, at)?;
            }
            Ok(())
        })
        .map_err(|(m, e)| self.member_error(m, Op::Read, offset, len, e))
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.write_vectored_at(&[IoSlice::new(buf)], offset, flags)
    }

    fn flush(&self) -> Result<()> {
        let jobs: Vec<(usize, ())> = (0..self.members.len()).map(|m| (m, ())).collect();
        let parallel = !self.info.completes_inline;
        self.fan_out(jobs, parallel, |m, ()| self.members[m].flush())
            .map_err(|(m, e)| self.member_error(m, Op::Flush, 0, 0, e))
    }

    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.per_member_span(Op::Trim, offset, len, |member, at, span| {
            member.trim(at, span, flags)
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.per_member_span(Op::WriteZeroes, offset, len, |member, at, span| {
            member.write_zeroes(at, span, flags)
        })
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        extents::collect(&self.members, &self.layout, offset, len, out)
            .map_err(|(m, e)| self.member_error(m, Op::Extents, offset, len, e))
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.per_member_span(Op::Cache, offset, len, |member, at, span| {
            member.cache(at, span)
        })
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        self.members_fast.then_some(self as &dyn FastPath)
    }
}

/// Cached reads and hole answers asked of each member in turn (through its handle,
/// so a member without them answers "no"), and vectored writes split into one
/// vectored write per member.
impl FastPath for Stripe {
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        // Only cached data is read here, so no thread is worth starting.
        let mut at = 0usize;
        for piece in self.layout.pieces(offset, buf.len() as u64) {
            let end = at + piece.len as usize;
            let done = self.members[piece.member]
                .try_read(&mut buf[at..end], piece.member_offset)
                .map_err(|e| {
                    self.member_error(piece.member, Op::Read, offset, buf.len() as u64, e)
                })?;
            if !done {
                return Ok(false);
            }
            at = end;
        }
        Ok(true)
    }

    fn is_hole(&self, offset: u64, len: u64) -> Option<bool> {
        for m in 0..self.members.len() {
            if let Some((at, span)) = self.layout.member_span(m, offset, len) {
                match self.members[m].is_hole(at, span) {
                    Ok(true) => {}
                    Ok(false) => return Some(false),
                    Err(_) => return None,
                }
            }
        }
        Some(true)
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if bufs.len() == 1 && self.layout.within_one_chunk(offset, len) {
            let (m, at) = self.layout.locate(offset);
            return self.members[m]
                .write(&bufs[0], at, flags)
                .map_err(|e| self.member_error(m, Op::Write, offset, len, e));
        }
        // Each member's pieces are contiguous on the member: one vectored write
        // each, of sub-slices of the caller's buffers.
        let mut per_member: Vec<(u64, Vec<IoSlice<'_>>)> =
            (0..self.members.len()).map(|_| (0, Vec::new())).collect();
        let mut source = bufs.iter().map(|b| &b[..]).filter(|b| !b.is_empty());
        let mut current: &[u8] = source.next().unwrap_or(&[]);
        for piece in self.layout.pieces(offset, len) {
            let (start, slices) = &mut per_member[piece.member];
            if slices.is_empty() {
                *start = piece.member_offset;
            }
            let mut need = piece.len as usize;
            while need > 0 {
                if current.is_empty() {
                    current = source.next().unwrap_or(&[]);
                    if current.is_empty() {
                        break;
                    }
                }
                let take = need.min(current.len());
                let (head, tail) = current.split_at(take);
                slices.push(IoSlice::new(head));
                current = tail;
                need -= take;
            }
        }
        let jobs: Vec<_> = per_member
            .into_iter()
            .enumerate()
            .filter(|(_, (_, slices))| !slices.is_empty())
            .collect();
        let parallel = self.parallel(jobs.len(), len);
        self.fan_out(jobs, parallel, |m, (at, slices)| {
            self.members[m].write_vectored(&slices, at, flags)
        })
        .map_err(|(m, e)| self.member_error(m, Op::Write, offset, len, e))
    }
}

#[cfg(test)]
mod tests;
