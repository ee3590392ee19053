//! The 64-byte submission queue entry (NVMe base specification, figure "Common
//! Command Format") with typed accessors, and its SGL descriptor.

/// Length of a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Length of an SGL descriptor.
pub const SGL_LEN: usize = 16;

/// SGL descriptor type byte: a data block with an offset into the capsule
/// (in-capsule data, NVMe/TCP section 3.3.2).
pub const SGL_IN_CAPSULE: u8 = 0x01;
/// SGL descriptor type byte: a transport data block, transport-specific subtype
/// (data moved by R2T/H2CData or C2HData).
pub const SGL_TRANSPORT: u8 = 0x5A;

/// Which way a command's data moves (opcode bits 1:0; a fabrics command's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    None,
    /// Host to controller (a write).
    ToController,
    /// Controller to host (a read).
    ToHost,
    /// Both ways: not used by any command this crate knows.
    Both,
}

/// A 64-byte submission queue entry. Multi-byte fields are little-endian.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("sgl", &self.sgl())
            .field("cdw10", &format_args!("{:#x}", self.cdw(10)))
            .field("cdw11", &format_args!("{:#x}", self.cdw(11)))
            .field("cdw12", &format_args!("{:#x}", self.cdw(12)))
            .finish()
    }
}

impl Default for Sqe {
    fn default() -> Sqe {
        Sqe([0; SQE_LEN])
    }
}

impl Sqe {
    /// A zeroed entry with this opcode and command identifier.
    pub fn new(opcode: u8, cid: u16) -> Sqe {
        let mut sqe = Sqe::default();
        sqe.0[0] = opcode;
        sqe.set_cid(cid);
        sqe
    }

    /// Reads an entry from the first 64 bytes of `bytes` (None when shorter).
    pub fn from_slice(bytes: &[u8]) -> Option<Sqe> {
        let raw: [u8; SQE_LEN] = bytes.get(..SQE_LEN)?.try_into().ok()?;
        Some(Sqe(raw))
    }

    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    /// Byte 1: FUSE (bits 1:0) and PSDT (bits 7:6).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    pub fn set_flags(&mut self, flags: u8) {
        self.0[1] = flags;
    }

    /// Fused operation bits (0: a normal command).
    pub fn fuse(&self) -> u8 {
        self.0[1] & 0x03
    }

    /// PRP or SGL for data transfer: fabrics require SGLs (value 2).
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }

    pub fn cid(&self) -> u16 {
        self.u16_at(2)
    }

    pub fn set_cid(&mut self, cid: u16) {
        self.0[2..4].copy_from_slice(&cid.to_le_bytes());
    }

    pub fn nsid(&self) -> u32 {
        self.u32_at(4)
    }

    pub fn set_nsid(&mut self, nsid: u32) {
        self.0[4..8].copy_from_slice(&nsid.to_le_bytes());
    }

    /// Fabrics commands (opcode 0x7F) keep their type where the NSID would be.
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    pub fn set_fctype(&mut self, fctype: u8) {
        self.0[4] = fctype;
    }

    /// Which way this command's data moves. Fabrics commands (opcode 0x7F) encode it
    /// in their type, every other command in its opcode.
    pub fn direction(&self) -> Direction {
        let code = if self.opcode() == 0x7f {
            self.fctype()
        } else {
            self.opcode()
        };
        match code & 0x3 {
            0 => Direction::None,
            1 => Direction::ToController,
            2 => Direction::ToHost,
            _ => Direction::Both,
        }
    }

    /// The data pointer as an SGL descriptor (bytes 24..40).
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor::parse(&self.0[24..40])
    }

    pub fn set_sgl(&mut self, sgl: SglDescriptor) {
        sgl.write(&mut self.0[24..40]);
        // Fabrics describe data with SGLs only: PSDT 01b, as Linux's host sets it.
        self.0[1] = (self.0[1] & 0x3f) | 0x40;
    }

    /// Command dword `n` (0..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        self.u32_at(n * 4)
    }

    pub fn set_cdw(&mut self, n: usize, value: u32) {
        self.0[n * 4..n * 4 + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// CDW10 and CDW11 as one 64-bit value (the starting LBA of I/O commands).
    pub fn cdw10_11(&self) -> u64 {
        u64::from(self.cdw(10)) | (u64::from(self.cdw(11)) << 32)
    }

    pub fn set_cdw10_11(&mut self, value: u64) {
        self.set_cdw(10, value as u32);
        self.set_cdw(11, (value >> 32) as u32);
    }

    /// Two consecutive dwords from dword `n` as one 64-bit value.
    pub fn cdw_pair(&self, n: usize) -> u64 {
        u64::from(self.cdw(n)) | (u64::from(self.cdw(n + 1)) << 32)
    }

    pub fn u16_at(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.0[at], self.0[at + 1]])
    }

    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }

    pub fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// An SGL descriptor: address (or offset), length, and its type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SglDescriptor {
    pub address: u64,
    pub length: u32,
    /// Type (bits 7:4) and subtype (bits 3:0).
    pub kind: u8,
}

impl SglDescriptor {
    /// In-capsule data of `length` bytes at offset 0 of the capsule's data.
    pub fn in_capsule(length: u32) -> SglDescriptor {
        SglDescriptor {
            address: 0,
            length,
            kind: SGL_IN_CAPSULE,
        }
    }

    /// Data of `length` bytes moved by the transport (R2T/H2CData or C2HData).
    pub fn transport(length: u32) -> SglDescriptor {
        SglDescriptor {
            address: 0,
            length,
            kind: SGL_TRANSPORT,
        }
    }

    /// Reads 16 bytes.
    pub fn parse(bytes: &[u8]) -> SglDescriptor {
        SglDescriptor {
            address: u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes")),
            length: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
            kind: bytes[15],
        }
    }

    /// Writes 16 bytes.
    pub fn write(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.address.to_le_bytes());
        out[8..12].copy_from_slice(&self.length.to_le_bytes());
        out[12..15].fill(0);
        out[15] = self.kind;
    }

    pub fn is_in_capsule(&self) -> bool {
        self.kind == SGL_IN_CAPSULE
    }

    pub fn is_transport(&self) -> bool {
        self.kind == SGL_TRANSPORT
    }
}
