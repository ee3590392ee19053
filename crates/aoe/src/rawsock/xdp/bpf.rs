//! The XDP side of the AF_XDP path, through bpf(2) directly: an XSKMAP, a
//! fifteen-instruction program that hands AoE frames (ethertype 0x88A2) to the
//! socket in the map at the frame's receive queue and lets every other frame pass
//! to the kernel's stack, and a BPF link that attaches it to the interface.
//!
//! A link, not the older netlink attachment: the kernel detaches the program when
//! the link's last descriptor closes, so a crashed or killed process never leaves
//! its program behind on the interface.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::context;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// The attach type of an XDP link.
const BPF_XDP: u32 = 37;
/// `ld_imm64`'s source register value saying "the immediate is a map's fd".
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// The helper `bpf_redirect_map(map, key, flags)`.
const HELPER_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;

/// Where the XDP program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    /// In the generic receive path (`XDP_FLAGS_SKB_MODE`): any interface; on a veth
    /// pair the faster of the two (`bench/aoe-frame-ceiling.sh`).
    Generic,
    /// In the driver (`XDP_FLAGS_DRV_MODE`), where the driver supports it.
    Driver,
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hook::Generic => "generic",
            Hook::Driver => "driver",
        })
    }
}

impl Hook {
    fn flags(self) -> u32 {
        match self {
            Hook::Generic => 1 << 1,
            Hook::Driver => 1 << 2,
        }
    }
}

/// bpf(2) with `attr`, its result as the kernel returns it.
fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialised repr(C) struct of the layout the
    // command expects (its leading fields; the kernel zero-extends a shorter
    // attribute), borrowed mutably for the call; pointers inside it point to
    // memory the caller keeps alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            (attr as *mut T).cast::<libc::c_void>(),
            mem::size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// bpf(2) for a command that creates an object: its new descriptor.
fn bpf_fd<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(command, attr)?;
    // SAFETY: the creating commands return a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// One eBPF instruction, as the kernel reads it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u8,
    /// Destination register in the low nibble, source in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    // The kernel's `dst_reg:4, src_reg:4` bitfield: the low nibble first on a
    // little-endian machine, the high one on a big-endian one.
    #[cfg(target_endian = "little")]
    let regs = (src << 4) | dst;
    #[cfg(target_endian = "big")]
    let regs = (dst << 4) | src;
    Insn {
        code,
        regs,
        off,
        imm,
    }
}

// Opcodes used below (class | size/op | source).
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const LDX_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const MOV64_REG: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const MOV64_IMM: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const ADD64_IMM: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
const JGT_REG: u8 = 0x2d; // BPF_JMP | BPF_JGT | BPF_X
const JNE_IMM: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_DW | BPF_IMM
const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// The program, for the XSKMAP `map_fd`. Registers: r1 is the `xdp_md` context
/// (data at +0, data_end at +4, rx_queue_index at +16).
fn program(map_fd: i32) -> [Insn; 15] {
    // The ethertype's bytes 0x88 0xA2 as the program's native-endian load sees them.
    let aoe = i32::from(u16::from_ne_bytes(crate::wire::AOE_ETHERTYPE.to_be_bytes()));
    [
        insn(LDX_W, 2, 1, 0, 0),                         // r2 = data
        insn(LDX_W, 3, 1, 4, 0),                         // r3 = data_end
        insn(MOV64_REG, 4, 2, 0, 0),                     // r4 = data
        insn(ADD64_IMM, 4, 0, 0, 14),                    // r4 += Ethernet header
        insn(JGT_REG, 4, 3, 8, 0),                       // shorter than a header: pass
        insn(LDX_H, 4, 2, 12, 0),                        // r4 = ethertype
        insn(JNE_IMM, 4, 0, 6, aoe),                     // not AoE: pass
        insn(LDX_W, 2, 1, 16, 0),                        // r2 = rx_queue_index (the key)
        insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = the map
        insn(0, 0, 0, 0, 0),                             // (ld_imm64's upper half)
        insn(MOV64_IMM, 3, 0, 0, XDP_PASS),              // no socket at that key: pass
        insn(CALL, 0, 0, 0, HELPER_REDIRECT_MAP),        // r0 = bpf_redirect_map(r1, r2, r3)
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV64_IMM, 0, 0, 0, XDP_PASS), // pass:
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// The kernel objects of one interface's AoE redirect, alive as long as this is.
#[derive(Debug)]
pub struct Redirect {
    map: OwnedFd,
    _program: OwnedFd,
    /// Closing it (with the program's and the map's) detaches the program.
    _link: OwnedFd,
}

impl Redirect {
    /// Creates the map (one entry: receive queue 0), loads the program and attaches
    /// it to the interface `ifindex` at `hook`. Fails (EBUSY, or EEXIST for the
    /// other hook) when another XDP program holds the interface.
    pub fn attach(ifindex: u32, hook: Hook) -> io::Result<Redirect> {
        let mut create = MapCreate {
            map_type: BPF_MAP_TYPE_XSKMAP,
            key_size: 4,
            value_size: 4,
            max_entries: 1,
            map_flags: 0,
        };
        let map =
            bpf_fd(BPF_MAP_CREATE, &mut create).map_err(|e| context(e, "creating the XSKMAP"))?;
        let instructions = program(map.as_raw_fd());
        // Without a verifier log first (a log too small for some kernel's verbosity
        // would fail a good program); with one only to say why it failed.
        let program = load(&instructions, None).or_else(|e| {
            let mut log = vec![0u8; 64 << 10];
            match load(&instructions, Some(&mut log)) {
                Ok(program) => Ok(program),
                Err(_) => {
                    let verifier = String::from_utf8_lossy(&log);
                    let verifier = verifier.trim_end_matches('\0').trim();
                    Err(context(
                        e,
                        &format!("loading the XDP program (verifier: {verifier})"),
                    ))
                }
            }
        })?;
        let mut link = LinkCreate {
            prog_fd: program.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: hook.flags(),
        };
        let link = bpf_fd(BPF_LINK_CREATE, &mut link)
            .map_err(|e| context(e, "attaching the XDP program to the interface"))?;
        Ok(Redirect {
            map,
            _program: program,
            _link: link,
        })
    }

    /// Puts the AF_XDP socket `socket` in the map at queue 0: from now on the
    /// interface's AoE frames arriving on that queue go to it.
    pub fn feed(&self, socket: &impl AsRawFd) -> io::Result<()> {
        let key = 0u32;
        let value = socket.as_raw_fd() as u32;
        let mut update = MapUpdate {
            map_fd: self.map.as_raw_fd() as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags: 0,
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut update)
            .map_err(|e| context(e, "adding the socket to the XSKMAP"))?;
        Ok(())
    }
}

/// Loads the XDP program; with `log`, the verifier writes its account there.
fn load(instructions: &[Insn], log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    let license = c"Dual MIT/GPL";
    let mut name = [0u8; 16];
    name[..9].copy_from_slice(b"blockwire");
    let (log_level, log_size, log_buf) = match log {
        Some(log) => (1, log.len() as u32, log.as_mut_ptr() as u64),
        None => (0, 0, 0),
    };
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: instructions.len() as u32,
        insns: instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level,
        log_size,
        log_buf,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
    };
    bpf_fd(BPF_PROG_LOAD, &mut attr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_eight_bytes_and_jumps_land_on_the_pass_exit() {
        assert_eq!(mem::size_of::<Insn>(), 8);
        let program = program(7);
        // Both conditional jumps go to `r0 = XDP_PASS; exit` at the end.
        for (at, target) in [(4usize, 13usize), (6, 13)] {
            assert_eq!(
                at as i16 + 1 + program[at].off,
                target as i16,
                "jump at {at}"
            );
        }
        assert_eq!(program[13].code, MOV64_IMM);
        assert_eq!(program[13].imm, XDP_PASS);
        // The ethertype compare: 0x88A2 as a little-endian load sees it.
        #[cfg(target_endian = "little")]
        assert_eq!(program[6].imm, 0xA288);
        // ld_imm64 carries the map fd and marks it as one (the source register,
        // the high nibble on a little-endian machine).
        assert_eq!(program[8].imm, 7);
        #[cfg(target_endian = "little")]
        assert_eq!(program[8].regs >> 4, BPF_PSEUDO_MAP_FD);
    }
}
