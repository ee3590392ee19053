//! The classic BPF program that keeps everything but AoE out of our sockets.

use super::AOE_ETHERTYPE;

/// The classic BPF program attached to every AoE socket: accept the whole frame when
/// the ethertype (bytes 12..14) is 0x88A2, otherwise drop it before it is copied to
/// the socket. The socket sees frames with their Ethernet header (SOCK_RAW).
pub(super) fn aoe_filter() -> [libc::sock_filter; 4] {
    let insn = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    [
        // A = the 16-bit ethertype at byte 12.
        insn(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS, 0, 0, 12),
        // A == AoE: go on to accept; otherwise skip one, to drop.
        insn(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            u32::from(AOE_ETHERTYPE),
        ),
        // Accept: keep up to u32::MAX bytes, i.e. the whole frame.
        insn(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
        // Drop.
        insn(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the subset of classic BPF our filter uses, as the kernel would.
    fn run_filter(program: &[libc::sock_filter], frame: &[u8]) -> u32 {
        let mut a = 0u32;
        let mut pc = 0;
        loop {
            let insn = program[pc];
            let code = u32::from(insn.code);
            if code == libc::BPF_LD | libc::BPF_H | libc::BPF_ABS {
                let at = insn.k as usize;
                let Some(half) = frame.get(at..at + 2) else {
                    return 0; // the kernel drops on an out-of-bounds load
                };
                a = u32::from(u16::from_be_bytes([half[0], half[1]]));
                pc += 1;
            } else if code == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K {
                let skip = if a == insn.k { insn.jt } else { insn.jf };
                pc += 1 + usize::from(skip);
            } else if code == libc::BPF_RET | libc::BPF_K {
                return insn.k;
            } else {
                panic!("instruction {code:#x} not expected in the AoE filter");
            }
        }
    }

    fn frame_with_ethertype(ethertype: u16, len: usize) -> Vec<u8> {
        let mut frame = vec![0x5a; len];
        frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
        frame
    }

    #[test]
    fn filter_shape() {
        let program = aoe_filter();
        assert_eq!(program.len(), 4);
        assert_eq!(
            u32::from(program[0].code),
            libc::BPF_LD | libc::BPF_H | libc::BPF_ABS
        );
        assert_eq!(program[0].k, 12);
        assert_eq!(
            u32::from(program[1].code),
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K
        );
        assert_eq!((program[1].jt, program[1].jf, program[1].k), (0, 1, 0x88A2));
        assert_eq!(u32::from(program[2].code), libc::BPF_RET | libc::BPF_K);
        assert_eq!(program[2].k, u32::MAX);
        assert_eq!(u32::from(program[3].code), libc::BPF_RET | libc::BPF_K);
        assert_eq!(program[3].k, 0);
    }

    #[test]
    fn filter_accepts_only_aoe() {
        let program = aoe_filter();
        assert_eq!(
            run_filter(&program, &frame_with_ethertype(0x88A2, 60)),
            u32::MAX
        );
        assert_eq!(
            run_filter(&program, &frame_with_ethertype(0x88A2, 9014)),
            u32::MAX
        );
        assert_eq!(run_filter(&program, &frame_with_ethertype(0x0800, 60)), 0);
        assert_eq!(run_filter(&program, &frame_with_ethertype(0x86DD, 1514)), 0);
        assert_eq!(run_filter(&program, &frame_with_ethertype(0xA288, 60)), 0);
        assert_eq!(run_filter(&program, &[0x88; 13]), 0);
    }
}
