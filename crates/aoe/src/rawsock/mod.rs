//! AF_PACKET raw sockets for AoE: one socket per interface, bound to it, filtered in
//! the kernel to the AoE ethertype, with batched send (`sendmmsg`) and receive
//! (`recvmmsg`). Frames are whole Ethernet frames (destination MAC first); building
//! and parsing them is [`crate::wire`]'s business.
//!
//! - [`Interface`]: name to index, MAC address and MTU;
//! - `filter`: the BPF program admitting only ethertype 0x88A2;
//! - [`RecvBatch`]: reusable buffers for batched receive;
//! - `ring`: a receive ring (PACKET_RX_RING) that sockets on the data path use
//!   instead of `recvmmsg` ([`RawSocket::open_with_ring`]);
//! - [`xdp`]: an opt-in AF_XDP data path beside the packet socket
//!   ([`RawSocket::open_with_xdp`]).

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Destination MAC, source MAC, ethertype.
use crate::wire::ETHERNET_HEADER_LEN as ETH_HEADER_LEN;
/// The shortest Ethernet frame, without FCS. Physical NICs pad short frames, veth does
/// not, and aoetools' aoeping drops frames shorter than this.
use crate::wire::MIN_FRAME_LEN;
pub use crate::wire::{MacAddr, AOE_ETHERTYPE, BROADCAST};

/// How long `send` and `send_batch` keep retrying a full queue (ENOBUFS/EAGAIN)
/// without any progress before giving the error back.
const SEND_STALL_LIMIT: Duration = Duration::from_secs(5);

mod batch;
mod filter;
mod interface;
mod ring;
pub mod xdp;

pub use batch::RecvBatch;
pub use interface::Interface;
pub use xdp::Hook as XdpHook;

/// One AF_PACKET SOCK_RAW socket bound to one interface, receiving only AoE frames.
///
/// It is `Send + Sync`: many threads may send at once while others receive.
#[derive(Debug)]
pub struct RawSocket {
    fd: OwnedFd,
    interface: Interface,
    /// Where received frames land, when the socket has a receive ring.
    rx_ring: Option<Arc<ring::RxRing>>,
    /// The AF_XDP path, when opted into: AoE frames on receive queue 0 arrive
    /// there, and every frame is sent from there.
    xdp: Option<xdp::XdpPath>,
}

impl RawSocket {
    /// Opens an AoE socket on `interface` with receive and send buffers of
    /// `buffer_bytes` (0 keeps the system defaults).
    ///
    /// The BPF filter admits only ethertype 0x88A2, SO_RCVBUFFORCE/SO_SNDBUFFORCE are
    /// tried before SO_RCVBUF/SO_SNDBUF (the latter are capped by `net.core.*mem_max`),
    /// and PACKET_IGNORE_OUTGOING is set where the kernel has it (4.20+).
    pub fn open(interface: &Interface, buffer_bytes: usize) -> io::Result<RawSocket> {
        Self::open_inner(interface, buffer_bytes, false)
    }

    /// Like [`open`](Self::open), and frames are received through a ring of about
    /// `buffer_bytes` mapped into our memory (PACKET_RX_RING): no system call per
    /// batch while frames keep coming, and no copy out of the socket. For one
    /// receiving thread per socket, as a receive loop is. Where the kernel refuses
    /// the ring, the socket receives with `recvmmsg` as `open`'s does.
    pub fn open_with_ring(interface: &Interface, buffer_bytes: usize) -> io::Result<RawSocket> {
        Self::open_inner(interface, buffer_bytes, true)
    }

    /// Like [`open_with_ring`](Self::open_with_ring), plus an AF_XDP socket fed by
    /// an XDP program attached at `hook` ([`xdp`] says what that costs): frames
    /// are sent through it, and AoE frames arriving on the interface's receive
    /// queue 0 are received through it. Fails with the reason when the kernel,
    /// the interface (an MTU above [`xdp::MAX_MTU`], another XDP program) or the
    /// privileges do not allow it; nothing is left attached then.
    pub fn open_with_xdp(
        interface: &Interface,
        buffer_bytes: usize,
        hook: XdpHook,
    ) -> io::Result<RawSocket> {
        let mut socket = Self::open_inner(interface, buffer_bytes, true)?;
        // Frames the program passes on (other queues, the moment before the socket
        // is in the map) are read from the packet socket's ring; the AF_XDP
        // receive loop has no recvmmsg fallback.
        if socket.rx_ring.is_none() {
            return Err(io::Error::other(format!(
                "AoE AF_XDP path on {}: the packet socket's receive ring was refused",
                interface.name
            )));
        }
        let path = xdp::XdpPath::open(interface, hook)
            .map_err(|e| xdp::context(e, &format!("AoE AF_XDP path on {}", interface.name)))?;
        socket.xdp = Some(path);
        Ok(socket)
    }

    /// Whether frames arrive through a receive ring.
    pub fn has_ring(&self) -> bool {
        self.rx_ring.is_some()
    }

    /// Whether frames go through the AF_XDP path.
    pub fn uses_xdp(&self) -> bool {
        self.xdp.is_some()
    }

    fn open_inner(
        interface: &Interface,
        buffer_bytes: usize,
        with_ring: bool,
    ) -> io::Result<RawSocket> {
        let fail = |what: &str, err: io::Error| {
            io::Error::new(
                err.kind(),
                format!("AoE socket on {}: {what}: {err}", interface.name),
            )
        };
        // Protocol 0: the socket receives nothing until bind() names the ethertype
        // and the interface, so no frame from another interface, or unfiltered, is
        // queued in between.
        // SAFETY: socket(2) with constant arguments; the result is checked below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(fail("socket(AF_PACKET)", io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };

        let mut program = filter::aoe_filter();
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        set_option(fd.as_fd(), libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
            .map_err(|e| fail("SO_ATTACH_FILTER", e))?;

        if buffer_bytes > 0 {
            // The kernel doubles the value for its bookkeeping; keep it in range.
            let bytes = buffer_bytes.min(i32::MAX as usize / 2) as libc::c_int;
            let sizes = [
                (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, "SO_RCVBUF"),
                (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, "SO_SNDBUF"),
            ];
            for (forced, capped, what) in sizes {
                if set_option(fd.as_fd(), libc::SOL_SOCKET, forced, &bytes).is_err() {
                    set_option(fd.as_fd(), libc::SOL_SOCKET, capped, &bytes)
                        .map_err(|e| fail(what, e))?;
                }
            }
        }

        // Best effort: a protocol-bound packet socket does not see outgoing frames
        // anyway; this only makes it explicit where the kernel supports it.
        let _ = set_option(
            fd.as_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &(1 as libc::c_int),
        );

        // Before bind, so that no frame is queued where the ring would not see it.
        let rx_ring = if with_ring {
            // The whole frame and a VLAN tag, should one arrive untouched.
            let frame_bytes = interface.mtu + ETH_HEADER_LEN + 4;
            let ring_bytes = buffer_bytes.max(4 << 20);
            match ring::RxRing::map(fd.as_fd(), frame_bytes, ring_bytes) {
                Ok(ring) => Some(Arc::new(ring)),
                Err(e) => {
                    tracing::debug!(
                        "AoE socket on {}: no receive ring ({e}); using recvmmsg",
                        interface.name
                    );
                    None
                }
            }
        } else {
            None
        };

        // SAFETY: sockaddr_ll is plain data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = AOE_ETHERTYPE.to_be();
        addr.sll_ifindex = interface.index;
        // SAFETY: `addr` is a valid sockaddr_ll and we pass its exact size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                ptr::addr_of!(addr).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(fail("bind", io::Error::last_os_error()));
        }
        Ok(RawSocket {
            fd,
            interface: interface.clone(),
            rx_ring,
            xdp: None,
        })
    }

    /// The interface this socket is bound to.
    pub fn interface(&self) -> &Interface {
        &self.interface
    }

    /// Sends one whole Ethernet frame (destination, source, ethertype, payload).
    /// Frames shorter than 60 bytes are zero-padded to 60.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        check_frame(frame)?;
        if let Some(path) = &self.xdp {
            self.check_fits_mtu(frame.len())?;
            return path.xsk.send(&[(frame, &[][..])]);
        }
        let mut scratch = [0u8; MIN_FRAME_LEN];
        let bytes = padded(frame, &mut scratch);
        let mut stalled = None;
        loop {
            // SAFETY: `bytes` is a live slice of `bytes.len()` bytes that send only
            // reads; the socket is bound, so no address is needed.
            let rc =
                unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
            if rc >= 0 {
                return Ok(());
            }
            self.wait_to_resend(io::Error::last_os_error(), &mut stalled)?;
        }
    }

    /// Sends several frames, as few `sendmmsg` calls as the kernel allows (looping on
    /// partial sends), each padded to 60 bytes; returns once all are sent.
    ///
    /// EINTR is retried; on ENOBUFS/EAGAIN it waits briefly and retries, and gives
    /// the error back only after 5 s without progress.
    pub fn send_batch(&self, frames: &[&[u8]]) -> io::Result<()> {
        self.send_gathered(frames.iter().map(|&frame| (frame, &[][..])))
    }

    /// Sends frames each gathered from two parts, a head (at least the Ethernet
    /// header) and a body, in one `sendmmsg`: a write's data goes out straight from
    /// the caller's buffer instead of being copied into a frame first. Frames shorter
    /// than 60 bytes are padded with zeroes. Retries as [`send_batch`](Self::send_batch).
    pub fn send_gathered<'a>(
        &self,
        frames: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> io::Result<()> {
        if let Some(path) = &self.xdp {
            let frames: Vec<_> = frames.into_iter().collect();
            for (head, body) in &frames {
                check_frame(head)?;
                self.check_fits_mtu(head.len() + body.len())?;
            }
            return path.xsk.send(&frames);
        }
        let frames = frames.into_iter();
        static ZEROES: [u8; MIN_FRAME_LEN] = [0; MIN_FRAME_LEN];
        let iovec = |part: &[u8]| libc::iovec {
            iov_base: part.as_ptr() as *mut libc::c_void,
            iov_len: part.len(),
        };
        let expected = frames.size_hint().0;
        let mut iovecs: Vec<libc::iovec> = Vec::with_capacity(expected * 3);
        let mut counts: Vec<usize> = Vec::with_capacity(expected);
        for (head, body) in frames {
            check_frame(head)?;
            iovecs.push(iovec(head));
            let mut count = 1;
            if !body.is_empty() {
                iovecs.push(iovec(body));
                count += 1;
            }
            let len = head.len() + body.len();
            if len < MIN_FRAME_LEN {
                iovecs.push(iovec(&ZEROES[..MIN_FRAME_LEN - len]));
                count += 1;
            }
            counts.push(count);
        }
        let mut msgs = messages(&mut iovecs, &counts);

        let mut sent = 0;
        let mut stalled = None;
        while sent < msgs.len() {
            let rest = &mut msgs[sent..];
            // SAFETY: `rest` holds initialised mmsghdrs, each pointing at its own
            // iovecs in `iovecs`, which point into `frames` or the static zeroes;
            // all outlive the call. The kernel only reads the frames (never the
            // zeroes' memory through a write) and writes `msg_len`.
            let rc = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    rest.as_mut_ptr(),
                    rest.len().min(u32::MAX as usize) as libc::c_uint,
                    0,
                )
            };
            if rc > 0 {
                sent += rc as usize;
                stalled = None;
            } else {
                self.wait_to_resend(io::Error::last_os_error(), &mut stalled)?;
            }
        }
        Ok(())
    }

    /// Refuses a frame longer than the interface's MTU plus the Ethernet header, as
    /// a packet socket does (the AF_XDP path would hand it to the interface, which
    /// drops it without a word).
    fn check_fits_mtu(&self, len: usize) -> io::Result<()> {
        let limit = self.interface.mtu + ETH_HEADER_LEN;
        if len > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a {len}-byte frame is over the {limit} bytes MTU {} allows on {}",
                    self.interface.mtu, self.interface.name
                ),
            ));
        }
        Ok(())
    }

    /// Decides whether a failed send is retried: at once after EINTR, after a short
    /// wait on a full queue (ENOBUFS/EAGAIN) unless stalled too long; other errors
    /// are given back.
    fn wait_to_resend(&self, err: io::Error, stalled: &mut Option<Instant>) -> io::Result<()> {
        match err.raw_os_error() {
            Some(libc::EINTR) => Ok(()),
            Some(code @ (libc::ENOBUFS | libc::EAGAIN)) => {
                if stalled.get_or_insert_with(Instant::now).elapsed() > SEND_STALL_LIMIT {
                    return Err(err);
                }
                // EAGAIN: the socket buffer is full and POLLOUT says when it drains.
                // ENOBUFS: the device queue dropped the frame while the socket is
                // writable, so poll returns at once; a short sleep lets it drain.
                wait_for(self.fd.as_fd(), libc::POLLOUT, 10)?;
                if code == libc::ENOBUFS {
                    std::thread::sleep(Duration::from_micros(100));
                }
                Ok(())
            }
            _ => Err(err),
        }
    }

    /// Receives up to `batch.capacity()` frames with one `recvmmsg` call (or from
    /// the receive ring), waiting at most `timeout` (None: forever) for the first
    /// one. Returns how many arrived; 0 means the timeout passed. Frames already
    /// queued are taken without waiting. The frames of the previous call on `batch`
    /// are given up.
    pub fn recv_batch(
        &self,
        batch: &mut RecvBatch,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        if let Some(path) = &self.xdp {
            return self.recv_from_xdp(&path.xsk, batch, timeout);
        }
        if let Some(ring) = &self.rx_ring {
            return self.recv_from_ring(ring, batch, timeout);
        }
        batch.use_buffers();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let msgs = &mut batch.msgs;
        loop {
            // SAFETY: `msgs` holds initialised mmsghdrs, each pointing at one iovec
            // that covers a distinct chunk of `batch.buffer` (RecvBatch::new), all
            // owned by `batch`, which we hold mutably; the kernel writes frames there
            // and `msg_len`.
            let rc = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    msgs.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    ptr::null_mut(),
                )
            };
            if rc > 0 {
                let n = rc as usize;
                for (i, msg) in msgs[..n].iter().enumerate() {
                    batch.lens[i] = msg.msg_len as usize;
                    batch.truncated[i] = msg.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
                }
                batch.received = n;
                return Ok(n);
            }
            if rc < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) => {}
                    _ => return Err(err),
                }
            }
            if !self.wait_to_receive(timeout, deadline)? {
                return Ok(0);
            }
        }
    }

    /// `recv_batch` on a socket with a receive ring: takes the filled slots, and
    /// sleeps in poll(2) only while there are none.
    fn recv_from_ring(
        &self,
        ring: &Arc<ring::RxRing>,
        batch: &mut RecvBatch,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        // Slots still held would make poll(2) report the ring readable at once.
        batch.use_ring(ring);
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let taken = ring.take(batch.capacity(), &mut batch.lent_frames);
            if taken > 0 {
                batch.received = taken;
                return Ok(taken);
            }
            // poll(2) reports a ring readable while the slot before the kernel's
            // next one is not the kernel's: the deadline, not poll, ends the wait.
            if !self.wait_to_receive(timeout, deadline)?
                || deadline.is_some_and(|deadline| Instant::now() >= deadline)
            {
                return Ok(0);
            }
        }
    }

    /// `recv_batch` with the AF_XDP path: frames from the AF_XDP socket first, then
    /// any the XDP program passed on to the packet socket (other receive queues);
    /// sleeps in poll(2) on both while neither has any.
    fn recv_from_xdp(
        &self,
        xsk: &Arc<xdp::Xsk>,
        batch: &mut RecvBatch,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            batch.use_xsk(xsk);
            let taken = xsk.take(batch.capacity(), &mut batch.lent_frames);
            if taken > 0 {
                batch.received = taken;
                return Ok(taken);
            }
            if let Some(ring) = &self.rx_ring {
                batch.use_ring(ring);
                let taken = ring.take(batch.capacity(), &mut batch.lent_frames);
                if taken > 0 {
                    batch.received = taken;
                    return Ok(taken);
                }
            }
            if timeout == Some(Duration::ZERO)
                || deadline.is_some_and(|deadline| Instant::now() >= deadline)
            {
                return Ok(0);
            }
            wait_for_any(
                &[xsk.as_fd(), self.fd.as_fd()],
                libc::POLLIN,
                poll_ms(deadline),
            )?;
        }
    }

    /// Waits in poll(2) for a frame until `deadline`; false when the time is up
    /// (at once for a zero timeout).
    fn wait_to_receive(
        &self,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
    ) -> io::Result<bool> {
        if timeout == Some(Duration::ZERO) {
            // A poll for nothing: spare the poll(2).
            return Ok(false);
        }
        wait_for(self.fd.as_fd(), libc::POLLIN, poll_ms(deadline))
    }
}

impl AsRawFd for RawSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for RawSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Refuses frames that cannot be Ethernet frames: shorter than the header.
fn check_frame(frame: &[u8]) -> io::Result<()> {
    if frame.len() < ETH_HEADER_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} bytes is shorter than an Ethernet header",
                frame.len()
            ),
        ));
    }
    Ok(())
}

/// `frame` itself when it is at least 60 bytes long, else a copy zero-padded to 60
/// in `scratch`.
fn padded<'a>(frame: &'a [u8], scratch: &'a mut [u8; MIN_FRAME_LEN]) -> &'a [u8] {
    if frame.len() >= MIN_FRAME_LEN {
        return frame;
    }
    scratch[..frame.len()].copy_from_slice(frame);
    scratch[frame.len()..].fill(0);
    &scratch[..]
}

/// One mmsghdr per frame, each over the next `counts[i]` iovecs, without addresses
/// (the socket is bound).
fn messages(iovecs: &mut [libc::iovec], counts: &[usize]) -> Vec<libc::mmsghdr> {
    let mut rest = iovecs;
    counts
        .iter()
        .map(|&count| {
            let (group, tail) = mem::take(&mut rest).split_at_mut(count);
            rest = tail;
            // SAFETY: mmsghdr is plain data; all zeroes (null pointers, zero
            // lengths) is a valid value.
            let mut msg: libc::mmsghdr = unsafe { mem::zeroed() };
            msg.msg_hdr.msg_iov = group.as_mut_ptr();
            msg.msg_hdr.msg_iovlen = count;
            msg
        })
        .collect()
}

/// Sets one socket option to `value`.
fn set_option<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` points to a live T and we pass its exact size; the kernel
    // only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// poll(2)'s timeout for `deadline`: -1 for none, else the milliseconds left,
/// rounded up so that a sub-millisecond remainder still waits.
fn poll_ms(deadline: Option<Instant>) -> libc::c_int {
    match deadline {
        None => -1,
        Some(deadline) => {
            let left = deadline.saturating_duration_since(Instant::now());
            left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
        }
    }
}

/// Waits up to `timeout_ms` (-1: forever) for `events` on `fd`. Returns false on
/// timeout; true when ready, on error conditions (the next call reports them) and
/// after EINTR (the caller retries and recomputes its wait).
fn wait_for(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    timeout_ms: libc::c_int,
) -> io::Result<bool> {
    wait_for_any(&[fd], events, timeout_ms)
}

/// [`wait_for`] on one or two descriptors at once.
fn wait_for_any(
    fds: &[BorrowedFd<'_>],
    events: libc::c_short,
    timeout_ms: libc::c_int,
) -> io::Result<bool> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events,
        revents: 0,
    }; 2];
    assert!(
        fds.len() <= pfds.len(),
        "wait_for_any takes two descriptors at most"
    );
    for (pfd, fd) in pfds.iter_mut().zip(fds) {
        pfd.fd = fd.as_raw_fd();
    }
    // SAFETY: the first `fds.len()` entries of `pfds` are valid pollfds, alive for
    // the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINTR) {
            return Ok(true);
        }
        return Err(err);
    }
    Ok(rc > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_frames_are_padded_to_60() {
        let mut scratch = [0xee; MIN_FRAME_LEN];
        let frame = [7u8; 20];
        let out = padded(&frame, &mut scratch);
        assert_eq!(out.len(), 60);
        assert_eq!(&out[..20], &frame[..]);
        assert!(out[20..].iter().all(|&b| b == 0));
        let long = [9u8; 61];
        assert_eq!(padded(&long, &mut scratch).len(), 61);
        assert!(check_frame(&[0; 13]).is_err());
        assert!(check_frame(&[0; 14]).is_ok());
    }

    #[test]
    fn socket_is_send_and_sync() {
        fn shared<T: Send + Sync>() {}
        shared::<RawSocket>();
        shared::<Interface>();
        fn owned<T: Send>() {}
        owned::<RecvBatch>();
    }
}
