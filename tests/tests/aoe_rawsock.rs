//! The AoE raw socket layer over real veth links between two network namespaces:
//! padding of short frames, batches of full-size frames at MTU 1500 and 9000, sends
//! from several threads at once, the kernel filter, receive timeouts, interface
//! lookup, the receive ring (frames in order, slots reused, the filter and the
//! timeout as without it), and the AF_XDP path (the same, plus its sends, its MTU
//! limit, one program per interface, detached when the socket goes). Needs root;
//! skipped (saying so) otherwise.

use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use blockwire_aoe::rawsock::{Interface, MacAddr, RawSocket, RecvBatch, XdpHook, AOE_ETHERTYPE};
use blockwire_tests::netns::VethLab;
use blockwire_tests::require_root;

const BUFFER_BYTES: usize = 4 << 20;
const WAIT: Option<Duration> = Some(Duration::from_secs(2));

/// A lab with one link and an AoE socket on `eth0` at each end. The sockets come
/// first so they close before the namespaces go.
struct Link {
    target: RawSocket,
    initiator: RawSocket,
    lab: VethLab,
}

fn link(short: &str, mtu: usize) -> Link {
    link_with(short, mtu, Receive::Recvmmsg)
}

/// How the target's socket receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Receive {
    Recvmmsg,
    Ring,
    /// Through the AF_XDP path (which also sends), its program at the generic hook.
    Xdp,
}

/// As [`link`]; the target's socket receives as `mode` says.
fn link_with(short: &str, mtu: usize, mode: Receive) -> Link {
    let tag = format!("{short}{}", std::process::id() % 100000);
    let lab = VethLab::new(&tag, 1, mtu).expect("build the veth lab");
    let open = |ns: &str, mode: Receive| {
        lab.run_in(ns, || {
            let eth0 = Interface::lookup("eth0").expect("eth0 in the lab namespace");
            let socket = match mode {
                Receive::Recvmmsg => RawSocket::open(&eth0, BUFFER_BYTES),
                Receive::Ring => RawSocket::open_with_ring(&eth0, BUFFER_BYTES),
                Receive::Xdp => RawSocket::open_with_xdp(&eth0, BUFFER_BYTES, XdpHook::Generic),
            };
            let socket = socket.expect("open the AoE socket");
            assert_eq!(socket.has_ring(), mode != Receive::Recvmmsg);
            assert_eq!(socket.uses_xdp(), mode == Receive::Xdp);
            socket
        })
    };
    Link {
        target: open(lab.target_ns(), mode),
        initiator: open(lab.initiator_ns(), Receive::Recvmmsg),
        lab,
    }
}

/// An AoE-typed frame of `len` bytes from `src` to `dst` whose payload is derived
/// from `seed`, so every frame of a test is distinct.
fn aoe_frame(dst: MacAddr, src: MacAddr, len: usize, seed: u32) -> Vec<u8> {
    let mut frame = Vec::with_capacity(len);
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&AOE_ETHERTYPE.to_be_bytes());
    frame.extend_from_slice(&seed.to_be_bytes());
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    while frame.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        frame.push(x as u8);
    }
    frame.truncate(len);
    frame
}

/// Receives exactly `count` frames (in as many `recv_batch` calls as it takes).
fn receive(socket: &RawSocket, count: usize, frame_bytes: usize) -> Vec<Vec<u8>> {
    let mut batch = RecvBatch::new(16, frame_bytes);
    let mut frames = Vec::new();
    while frames.len() < count {
        let n = socket.recv_batch(&mut batch, WAIT).expect("recv_batch");
        assert!(n > 0, "only {} of {count} frames arrived", frames.len());
        for i in 0..n {
            assert!(!batch.is_truncated(i), "frame {i} was truncated");
            frames.push(batch.frame(i).to_vec());
        }
    }
    assert_eq!(frames.len(), count, "more frames than were sent");
    frames
}

#[test]
fn aoe_rawsock_short_frame_arrives_padded_to_60() {
    require_root!();
    let link = link("pad", 1500);
    let dst = link.target.interface().mac;
    let src = link.initiator.interface().mac;
    let frame = aoe_frame(dst, src, 24, 1);
    link.initiator.send(&frame).expect("send");

    let got = receive(&link.target, 1, 1500 + 14 + 64);
    assert_eq!(got[0].len(), 60);
    assert_eq!(&got[0][..24], &frame[..]);
    assert!(got[0][24..].iter().all(|&b| b == 0), "padding is not zero");
}

#[test]
fn aoe_rawsock_gathered_frames_arrive_whole_and_padded() {
    require_root!();
    let link = link("gat", 9000);
    let dst = link.target.interface().mac;
    let src = link.initiator.interface().mac;
    // Full frames split at different points (a 36-byte AoE head, an empty body),
    // and a short one that must be padded to 60 bytes.
    let frames: Vec<Vec<u8>> = [9014, 1514, 600, 36, 20]
        .iter()
        .enumerate()
        .map(|(i, &len)| aoe_frame(dst, src, len, 100 + i as u32))
        .collect();
    let splits = [36, 1000, 14, 36, 20];
    let parts: Vec<(&[u8], &[u8])> = frames
        .iter()
        .zip(splits)
        .map(|(frame, at)| frame.split_at(at))
        .collect();
    link.initiator
        .send_gathered(parts.iter().copied())
        .expect("send_gathered");

    let got = receive(&link.target, frames.len(), 9000 + 14 + 64);
    for (i, (got, sent)) in got.iter().zip(&frames).enumerate() {
        let padded = sent.len().max(60);
        assert_eq!(got.len(), padded, "frame {i} length");
        assert!(got[..sent.len()] == sent[..], "frame {i} differs");
        assert!(
            got[sent.len()..].iter().all(|&b| b == 0),
            "frame {i} padding"
        );
    }
    // A head without a whole Ethernet header is refused, and nothing is sent.
    let short_head = (&frames[0][..10], &frames[0][10..]);
    assert!(link.initiator.send_gathered([short_head]).is_err());
}

fn full_size_batch(short: &str, mtu: usize, mode: Receive) {
    let link = link_with(short, mtu, mode);
    for (ns, socket) in [
        (link.lab.target_ns(), &link.target),
        (link.lab.initiator_ns(), &link.initiator),
    ] {
        let eth0 = link.lab.run_in(ns, || Interface::lookup("eth0")).unwrap();
        assert_eq!(eth0.mtu, mtu, "MTU of eth0 in {ns}");
        assert!(eth0.index > 0);
        assert_ne!(eth0.mac, [0; 6], "veth has a MAC address");
        assert_eq!(socket.interface(), &eth0);
    }

    let dst = link.target.interface().mac;
    let src = link.initiator.interface().mac;
    let frames: Vec<Vec<u8>> = (0..64).map(|i| aoe_frame(dst, src, mtu + 14, i)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    link.initiator.send_batch(&refs).expect("send_batch");

    let got = receive(&link.target, 64, mtu + 14 + 64);
    for (i, (got, sent)) in got.iter().zip(&frames).enumerate() {
        assert!(got == sent, "frame {i} differs (or arrived out of order)");
    }

    // One byte over the MTU is refused rather than sent.
    let oversize = aoe_frame(dst, src, mtu + 15, 99);
    assert!(link.initiator.send(&oversize).is_err());
}

#[test]
fn aoe_rawsock_full_size_batch_mtu_1500() {
    require_root!();
    full_size_batch("b15", 1500, Receive::Recvmmsg);
}

#[test]
fn aoe_rawsock_full_size_batch_through_a_ring_mtu_1500() {
    require_root!();
    full_size_batch("r15", 1500, Receive::Ring);
}

#[test]
fn aoe_rawsock_full_size_batch_through_a_ring_mtu_9000() {
    require_root!();
    full_size_batch("r90", 9000, Receive::Ring);
}

/// Frames of a ring are given back: many times the ring's slots pass through it,
/// each round taken whole and in order, also after a batch is dropped while it
/// holds frames.
#[test]
fn aoe_rawsock_ring_slots_are_given_back_and_reused() {
    require_root!();
    frames_are_given_back_and_reused("rgr", Receive::Ring);
}

/// The same for the AF_XDP socket, whose fill ring holds 2048 chunks: 8000 frames
/// pass through them.
#[test]
fn aoe_rawsock_xdp_chunks_are_given_back_and_reused() {
    require_root!();
    frames_are_given_back_and_reused("xgr", Receive::Xdp);
}

fn frames_are_given_back_and_reused(short: &str, mode: Receive) {
    let link = link_with(short, 1500, mode);
    let dst = link.target.interface().mac;
    let src = link.initiator.interface().mac;
    // A 4 MiB ring holds about 2500 frames at MTU 1500; 8 rounds of 1000 go round
    // it three times.
    for round in 0..8u32 {
        let frames: Vec<Vec<u8>> = (0..1000)
            .map(|i| aoe_frame(dst, src, 1514, round * 1000 + i))
            .collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        link.initiator.send_batch(&refs).expect("send_batch");
        if round % 3 == 2 {
            // Take a few frames into a batch and drop it with them held.
            let mut batch = RecvBatch::new(8, 1600);
            let n = link
                .target
                .recv_batch(&mut batch, WAIT)
                .expect("recv_batch");
            assert!(n > 0);
            let held: Vec<Vec<u8>> = batch.frames().map(<[u8]>::to_vec).collect();
            drop(batch);
            assert!(held.iter().zip(&frames).all(|(a, b)| a == b));
            let rest = receive(&link.target, frames.len() - held.len(), 1600);
            assert!(rest.iter().zip(&frames[held.len()..]).all(|(a, b)| a == b));
        } else {
            let got = receive(&link.target, frames.len(), 1600);
            assert!(
                got == frames,
                "round {round}: frames differ or out of order"
            );
        }
    }
    let mut batch = RecvBatch::new(4, 1600);
    let n = link
        .target
        .recv_batch(&mut batch, Some(Duration::from_millis(20)))
        .expect("recv_batch");
    assert_eq!(n, 0, "nothing more was sent");
}

#[test]
fn aoe_rawsock_full_size_batch_mtu_9000() {
    require_root!();
    full_size_batch("b90", 9000, Receive::Recvmmsg);
}

#[test]
fn aoe_rawsock_sends_from_many_threads_at_once() {
    require_root!();
    let link = link("thr", 1500);
    let dst = link.target.interface().mac;
    let src = link.initiator.interface().mac;
    let per_thread: Vec<Vec<Vec<u8>>> = (0..4u32)
        .map(|t| {
            (0..16)
                .map(|i| aoe_frame(dst, src, 200 + 100 * t as usize, t * 1000 + i))
                .collect()
        })
        .collect();
    std::thread::scope(|scope| {
        for (t, frames) in per_thread.iter().enumerate() {
            let socket = &link.initiator;
            scope.spawn(move || {
                for (i, frame) in frames.iter().enumerate() {
                    if (t + i) % 2 == 0 {
                        socket.send(frame).expect("send");
                    } else {
                        socket.send_batch(&[frame]).expect("send_batch");
                    }
                }
            });
        }
    });

    let got = receive(&link.target, 64, 1500 + 14 + 64);
    // Frames of one thread keep their order; threads interleave freely.
    for frames in &per_thread {
        let arrived: Vec<&Vec<u8>> = got.iter().filter(|f| frames.contains(f)).collect();
        assert_eq!(arrived.len(), frames.len());
        assert!(arrived.iter().zip(frames).all(|(a, b)| *a == b));
    }
}

#[test]
fn aoe_rawsock_other_ethertypes_are_filtered_and_timeout_returns_zero() {
    require_root!();
    filtered_and_timeout("flt", Receive::Recvmmsg);
}

#[test]
fn aoe_rawsock_ring_filters_other_ethertypes_and_times_out() {
    require_root!();
    filtered_and_timeout("rfl", Receive::Ring);
}

#[test]
fn aoe_rawsock_xdp_passes_other_ethertypes_on_and_times_out() {
    require_root!();
    filtered_and_timeout("xfl", Receive::Xdp);
}

/// The AF_XDP socket receives full-size frames whole and in order, sends gathered
/// frames whole and padded, sends 1500 in one batch (more than its 1024 send
/// chunks, so they are reclaimed as the kernel completes them), and refuses a frame
/// over the MTU, as the packet socket does.
#[test]
fn aoe_rawsock_xdp_sends_and_receives_whole_frames() {
    require_root!();
    let link = link_with("xsr", 1500, Receive::Xdp);
    let target = link.target.interface().mac;
    let initiator = link.initiator.interface().mac;

    let frames: Vec<Vec<u8>> = (0..64)
        .map(|i| aoe_frame(target, initiator, 1514, i))
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    link.initiator.send_batch(&refs).expect("send_batch");
    let got = receive(&link.target, 64, 1600);
    assert!(got == frames, "frames differ or arrived out of order");

    let frames: Vec<Vec<u8>> = [1514, 1000, 60, 36, 20]
        .iter()
        .enumerate()
        .map(|(i, &len)| aoe_frame(initiator, target, len, 500 + i as u32))
        .collect();
    let parts: Vec<(&[u8], &[u8])> = frames
        .iter()
        .zip([36, 600, 14, 36, 20])
        .map(|(frame, at)| frame.split_at(at))
        .collect();
    link.target
        .send_gathered(parts.iter().copied())
        .expect("send_gathered");
    let got = receive(&link.initiator, frames.len(), 1600);
    for (i, (got, sent)) in got.iter().zip(&frames).enumerate() {
        assert_eq!(got.len(), sent.len().max(60), "frame {i} length");
        assert!(got[..sent.len()] == sent[..], "frame {i} differs");
        assert!(
            got[sent.len()..].iter().all(|&b| b == 0),
            "frame {i} padding"
        );
    }

    // 1500 frames in one send: more than the 1024 send chunks, so the send must
    // reclaim completed ones; few enough for the receiver's 4 MiB socket buffer.
    let many: Vec<Vec<u8>> = (0..1500)
        .map(|i| aoe_frame(initiator, target, 1514, 1000 + i))
        .collect();
    let refs: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
    for round in 0..3 {
        link.target.send_batch(&refs).expect("send_batch of 1500");
        let got = receive(&link.initiator, refs.len(), 1600);
        assert!(got == many, "round {round}: the 1500 frames differ");
    }

    let oversize = aoe_frame(initiator, target, 1515, 99);
    assert!(
        link.target.send(&oversize).is_err(),
        "a frame over the MTU was sent"
    );
    assert!(link
        .target
        .send_gathered([(&oversize[..36], &oversize[36..])])
        .is_err());
}

/// The AF_XDP path refuses jumbo frames and a second program on an interface, and
/// leaves nothing attached when it fails or when its socket closes.
#[test]
fn aoe_rawsock_xdp_refuses_jumbo_frames_and_a_second_program_and_detaches() {
    require_root!();
    let tag = format!("xat{}", std::process::id() % 100000);
    let lab = VethLab::new(&tag, 1, 9000).expect("build the veth lab");
    let ns = lab.target_ns().to_string();
    let open = || {
        lab.run_in(&ns, || {
            let eth0 = Interface::lookup("eth0").expect("eth0");
            RawSocket::open_with_xdp(&eth0, BUFFER_BYTES, XdpHook::Generic)
        })
    };
    let err = open().expect_err("AF_XDP at MTU 9000");
    assert!(err.to_string().contains("MTU 9000"), "{err}");
    assert!(
        !lab.xdp_attached(&ns),
        "a failed open left a program attached"
    );

    let status = lab
        .command_in(&ns, "ip")
        .args(["link", "set", "eth0", "mtu", "1500"])
        .status()
        .expect("run ip");
    assert!(status.success());
    let first = open().expect("AF_XDP at MTU 1500");
    assert!(lab.xdp_attached(&ns));
    let err = open().expect_err("a second program on the same interface");
    assert!(err.to_string().contains("attaching"), "{err}");
    drop(first);
    assert!(!lab.xdp_attached(&ns), "the program outlived its socket");
    let again = open().expect("AF_XDP again after the first closed");
    assert!(again.uses_xdp());
}

fn filtered_and_timeout(short: &str, mode: Receive) {
    let link = link_with(short, 1500, mode);
    let dst = link.target.interface().mac;
    let src = link.initiator.interface().mac;
    let (lab, ns_t, ns_i) = (&link.lab, link.lab.target_ns(), link.lab.initiator_ns());
    let sender = lab.run_in(ns_i, || PlainSocket::open("eth0"));
    let watcher = lab.run_in(ns_t, || PlainSocket::open("eth0"));

    let mut ipv4 = aoe_frame(dst, src, 60, 7);
    ipv4[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    sender.send(&ipv4);
    let marker = aoe_frame(dst, src, 60, 8);
    link.initiator.send(&marker).expect("send");

    // The frame did reach the target's interface...
    assert!(
        watcher.saw(&ipv4, Duration::from_secs(2)),
        "IPv4 frame never arrived"
    );
    // ...but the AoE socket gets only the AoE frame sent after it.
    let got = receive(&link.target, 1, 1500 + 14 + 64);
    assert_eq!(got[0], marker);

    let mut batch = RecvBatch::new(4, 1600);
    let started = Instant::now();
    let n = link
        .target
        .recv_batch(&mut batch, Some(Duration::from_millis(50)))
        .expect("recv_batch");
    let waited = started.elapsed();
    assert_eq!(n, 0, "nothing more was sent");
    assert!(batch.is_empty());
    assert!(
        waited >= Duration::from_millis(50) && waited < Duration::from_secs(1),
        "waited {waited:?} for a 50 ms timeout"
    );
}

/// A plain AF_PACKET socket that sends and sees frames of every ethertype on one
/// interface, to check what the AoE socket leaves out.
struct PlainSocket {
    fd: OwnedFd,
}

impl PlainSocket {
    /// Opens it in the calling thread's namespace, bound to `name`.
    fn open(name: &str) -> PlainSocket {
        let interface = Interface::lookup(name).expect("interface");
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket(2) with constant arguments; the result is checked below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all)) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = all;
        addr.sll_ifindex = interface.index;
        // SAFETY: `addr` is a valid sockaddr_ll and we pass its exact size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(addr).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        PlainSocket { fd }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: `frame` is a live slice that send only reads.
        let rc = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            rc,
            frame.len() as isize,
            "send: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Whether `frame` arrives within `timeout` (other traffic is skipped).
    fn saw(&self, frame: &[u8], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 2048];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd that lives for the call.
            if unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32 + 1) } <= 0 {
                continue;
            }
            // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 && &buf[..n as usize] == frame {
                return true;
            }
        }
        false
    }
}
