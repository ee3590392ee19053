//! NVM command set I/O: Read, Write (FUA), Flush, Write Zeroes, Dataset
//! Management (deallocate), Compare. Parsing checks everything the command says;
//! executing only calls the device, so a transport may run it on any thread.

use std::sync::Arc;

use blockwire_blockdev::{Device, IoBuf, MappedRange, WriteFlags, ZeroFlags};

use super::ctrl::Controller;
use super::health::{CommandError, IoStats};
use super::queue::Reply;
use super::status_map::status_for;
use super::subsystem::NSID;
use crate::cqe::{Cqe, Status};
use crate::opcodes::io;
use crate::sqe::Sqe;

/// Largest number of ranges one Dataset Management command carries.
const DSM_MAX_RANGES: usize = 256;

/// What an I/O command does to the device, in bytes. Data is the host's, in the
/// buffer the transport received it into.
#[derive(Debug)]
pub enum IoOp {
    Read {
        offset: u64,
        len: u64,
    },
    Write {
        offset: u64,
        data: IoBuf,
        fua: bool,
    },
    Flush,
    WriteZeroes {
        offset: u64,
        len: u64,
        fua: bool,
        deallocate: bool,
    },
    /// Dataset Management with the deallocate attribute: trim each range.
    Deallocate {
        ranges: Vec<(u64, u64)>,
    },
    /// Dataset Management without it: nothing to do.
    Nothing,
    Compare {
        offset: u64,
        data: IoBuf,
    },
}

/// A parsed I/O command, ready to run.
#[derive(Debug)]
pub struct IoCommand {
    pub op: IoOp,
    /// The completion, filled but for the status and result.
    pub cqe: Cqe,
    device: Device,
    accounting: Accounting,
}

/// What a command's outcome updates: the namespace's counts when it succeeds,
/// its controller's error log when it fails. Kept by a transport that runs the
/// command elsewhere (a device's own queue) and answers it later.
#[derive(Debug, Clone)]
pub struct Accounting {
    controller: Arc<Controller>,
    stats: Arc<IoStats>,
    counted: Counted,
    nsid: u32,
    slba: u64,
}

/// Which SMART counts a command adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counted {
    Read,
    Write,
    Neither,
}

impl Accounting {
    /// The command answered with `cqe` (whose CID and SQID are filled), having
    /// moved `bytes` when it succeeded.
    pub fn finished(&self, cqe: &Cqe, bytes: u64) {
        if !cqe.status.is_success() {
            self.controller.record_error(CommandError {
                sqid: cqe.sq_id,
                cid: cqe.cid,
                status: cqe.status,
                lba: self.slba,
                nsid: self.nsid,
            });
            return;
        }
        match self.counted {
            Counted::Read => self.stats.read(bytes),
            Counted::Write => self.stats.wrote(bytes),
            Counted::Neither => {}
        }
    }
}

impl IoCommand {
    /// Whether the command reads from the device (data goes to the host).
    pub fn is_read(&self) -> bool {
        matches!(self.op, IoOp::Read { .. })
    }

    /// Bytes the command moves (for scheduling and metrics).
    pub fn len(&self) -> u64 {
        match &self.op {
            IoOp::Read { len, .. } | IoOp::WriteZeroes { len, .. } => *len,
            IoOp::Write { data, .. } | IoOp::Compare { data, .. } => data.len() as u64,
            IoOp::Deallocate { ranges } => ranges.iter().map(|r| r.1).sum(),
            IoOp::Flush | IoOp::Nothing => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device the command runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// What the command's answer must update, for a transport that answers it
    /// itself ([`execute`](Self::execute) and [`try_inline`](Self::try_inline)
    /// do it).
    pub fn accounting(&self) -> Accounting {
        self.accounting.clone()
    }

    /// Runs the command here if that cannot wait for hardware: a read the device
    /// serves without blocking (the page cache, memory), anything else only on a
    /// device that completes inline and without FUA. Otherwise gives the command
    /// back, for a worker.
    pub fn try_inline(self) -> Result<Reply, Box<IoCommand>> {
        let info = self.device.info();
        match &self.op {
            IoOp::Read { offset, len } => {
                // Not zeroed: the device fills all of it or the read fails.
                let mut buf = IoBuf::new(*len as usize);
                match self.device.try_read(&mut buf, *offset) {
                    Ok(true) => {
                        self.accounting.finished(&self.cqe, *len);
                        Ok(Reply {
                            cqe: self.cqe,
                            data: buf,
                        })
                    }
                    Ok(false) => Err(Box::new(self)),
                    Err(e) => {
                        let mut cqe = self.cqe;
                        cqe.status = status_for(&e);
                        self.accounting.finished(&cqe, 0);
                        Ok(Reply {
                            cqe,
                            data: IoBuf::new(0),
                        })
                    }
                }
            }
            IoOp::Write { fua: true, .. } | IoOp::WriteZeroes { fua: true, .. } => {
                Err(Box::new(self))
            }
            _ if !info.completes_inline => Err(Box::new(self)),
            _ => Ok(self.execute()),
        }
    }

    /// A read whose range is all in the page cache of a file the device maps:
    /// that range of the mapping, for the transport to send without a copy of its
    /// own (the read counts as served). None otherwise: run the command as usual.
    pub fn mapped_read(&self) -> Option<MappedRange> {
        let IoOp::Read { offset, len } = self.op else {
            return None;
        };
        let range = self.device.mapped_cached(offset, len).ok()??;
        self.accounting.finished(&self.cqe, len);
        Some(range)
    }

    /// Runs the command on the device.
    pub fn execute(self) -> Reply {
        let mut cqe = self.cqe;
        let bytes = self.len();
        let result = match self.op {
            IoOp::Read { offset, len } => {
                let mut buf = IoBuf::new(len as usize);
                match self.device.read(&mut buf, offset) {
                    Ok(()) => {
                        self.accounting.finished(&cqe, len);
                        return Reply { cqe, data: buf };
                    }
                    Err(e) => Err(e),
                }
            }
            IoOp::Write { offset, data, fua } => {
                self.device.write(&data, offset, WriteFlags { fua })
            }
            IoOp::Flush => match self.device.flush() {
                // A device with no cache has nothing to flush.
                Err(e) if e.kind() == blockwire_blockdev::ErrorKind::Unsupported => Ok(()),
                other => other,
            },
            IoOp::WriteZeroes {
                offset,
                len,
                fua,
                deallocate,
            } => self.device.write_zeroes(
                offset,
                len,
                ZeroFlags {
                    fua,
                    no_hole: !deallocate,
                    fast: false,
                },
            ),
            IoOp::Deallocate { ranges } => ranges
                .iter()
                .try_for_each(|&(offset, len)| self.device.trim(offset, len, WriteFlags::NONE)),
            IoOp::Nothing => Ok(()),
            IoOp::Compare { offset, data } => {
                let mut buf = IoBuf::new(data.len());
                match self.device.read(&mut buf, offset) {
                    Ok(()) if buf[..] == data[..] => Ok(()),
                    Ok(()) => {
                        cqe.status = Status::COMPARE_FAILURE;
                        self.accounting.finished(&cqe, 0);
                        return Reply {
                            cqe,
                            data: IoBuf::new(0),
                        };
                    }
                    Err(e) => Err(e),
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!("NVMe I/O failed: {e}");
            cqe.status = status_for(&e);
        }
        self.accounting.finished(&cqe, bytes);
        Reply {
            cqe,
            data: IoBuf::new(0),
        }
    }
}

/// Whether an I/O command's dwords 10-11 hold a starting LBA.
pub(crate) fn has_lba(opcode: u8) -> bool {
    matches!(
        opcode,
        io::READ | io::WRITE | io::COMPARE | io::WRITE_ZEROES
    )
}

/// Checks an I/O command and turns it into an [`IoCommand`]. `data` is what the
/// host sent (in the capsule or by H2CData): a write's data must be exactly the
/// blocks it names.
pub(crate) fn parse(
    controller: &Arc<Controller>,
    sqe: &Sqe,
    data: IoBuf,
) -> Result<IoCommand, Status> {
    let nsid = sqe.nsid();
    let flush_all = sqe.opcode() == io::FLUSH && nsid == 0xffff_ffff;
    if nsid != NSID && !flush_all {
        return Err(Status::INVALID_NAMESPACE);
    }
    let subsystem = controller.subsystem().ok_or(Status::INVALID_NAMESPACE)?;
    let block = u64::from(subsystem.block_size());
    let blocks = subsystem.blocks();
    let slba = sqe.cdw10_11();
    let nlb = u64::from(sqe.cdw(12) & 0xffff) + 1;
    let fua = sqe.cdw(12) & (1 << 30) != 0;
    let transfer = u64::from(sqe.sgl().length);
    let range = || -> Result<(u64, u64), Status> {
        match slba.checked_add(nlb) {
            Some(end) if end <= blocks => Ok((slba * block, nlb * block)),
            _ => Err(Status::LBA_OUT_OF_RANGE),
        }
    };
    let read_only = subsystem.device.info().read_only;
    let op = match sqe.opcode() {
        io::READ => {
            let (offset, len) = range()?;
            if transfer != len {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            IoOp::Read { offset, len }
        }
        io::WRITE | io::COMPARE => {
            let (offset, len) = range()?;
            if transfer != len || data.len() as u64 != len {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            if sqe.opcode() == io::COMPARE {
                IoOp::Compare { offset, data }
            } else {
                if read_only {
                    return Err(Status::NAMESPACE_WRITE_PROTECTED);
                }
                // With the volatile write cache off, every write is durable.
                let fua = fua || !controller.write_cache();
                IoOp::Write { offset, data, fua }
            }
        }
        io::FLUSH => IoOp::Flush,
        io::WRITE_ZEROES => {
            if read_only {
                return Err(Status::NAMESPACE_WRITE_PROTECTED);
            }
            let (offset, len) = range()?;
            IoOp::WriteZeroes {
                offset,
                len,
                fua: fua || !controller.write_cache(),
                deallocate: sqe.cdw(12) & (1 << 25) != 0,
            }
        }
        io::DATASET_MANAGEMENT => {
            let count = (sqe.cdw(10) & 0xff) as usize + 1;
            if count > DSM_MAX_RANGES || data.len() < count * 16 {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            let deallocate = sqe.cdw(11) & (1 << 2) != 0;
            if !deallocate {
                IoOp::Nothing
            } else {
                if read_only {
                    return Err(Status::NAMESPACE_WRITE_PROTECTED);
                }
                let mut ranges = Vec::with_capacity(count);
                for r in data.chunks_exact(16).take(count) {
                    // Context attributes (4), length in blocks (4), start LBA (8);
                    // this length is not 0's based.
                    let len = u64::from(u32::from_le_bytes(r[4..8].try_into().expect("4")));
                    let start = u64::from_le_bytes(r[8..16].try_into().expect("8"));
                    if len == 0 {
                        continue;
                    }
                    match start.checked_add(len) {
                        Some(end) if end <= blocks => ranges.push((start * block, len * block)),
                        _ => return Err(Status::LBA_OUT_OF_RANGE),
                    }
                }
                IoOp::Deallocate { ranges }
            }
        }
        _ => return Err(Status::INVALID_OPCODE),
    };
    let counted = match op {
        IoOp::Read { .. } => Counted::Read,
        IoOp::Write { .. } => Counted::Write,
        _ => Counted::Neither,
    };
    Ok(IoCommand {
        op,
        cqe: Cqe::default(),
        device: subsystem.device.clone(),
        accounting: Accounting {
            controller: controller.clone(),
            stats: subsystem.stats.clone(),
            counted,
            nsid,
            slba: if has_lba(sqe.opcode()) { slba } else { 0 },
        },
    })
}
