//! One AF_XDP socket in copy mode, bound to one receive queue of one interface,
//! with its own UMEM: the frame area the kernel copies received frames into and
//! sends ours from, and the four rings that pass frame addresses back and forth
//! (fill and receive for frames coming in, transmit and completion going out).
//!
//! Rings are single-producer, single-consumer, so each of our ends sits behind a
//! mutex: receiving, giving frames back, and sending may happen on different
//! threads.

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::super::ring::RingFrame;
use super::context;
use crate::wire::MIN_FRAME_LEN;

/// How long a bind that finds its queue busy is retried: a socket closed just
/// before (a restarting target) holds the queue until an RCU grace period ends.
const BIND_RETRY: Duration = Duration::from_millis(500);
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_PGOFF_RX_RING: libc::off_t = 0;
const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;
const XDP_COPY: u16 = 1 << 1;

/// Bytes per UMEM frame: a page, the largest chunk an aligned UMEM takes.
pub const CHUNK: usize = 4096;
/// What the kernel keeps free in front of a received frame in its chunk.
const XDP_PACKET_HEADROOM: usize = 256;
/// The longest frame this socket receives.
pub const MAX_FRAME: usize = CHUNK - XDP_PACKET_HEADROOM;
/// Chunks we receive into: in the fill ring, the receive ring, or with us.
const RECEIVE_FRAMES: u32 = 2048;
/// Entries of the fill ring: twice the chunks. The kernel publishes what it took
/// from the fill ring only after it publishes the frames it received there, so for
/// a moment a chunk may be back with us while its old entry still counts as used;
/// with room for every chunk twice, giving one back always finds a free entry.
const FILL_ENTRIES: u32 = 2 * RECEIVE_FRAMES;
/// Frames we send from (each out until its completion comes back).
const SEND_FRAMES: u32 = 1024;
/// How long `send` keeps trying without progress before it gives up.
const SEND_STALL_LIMIT: Duration = Duration::from_secs(5);

#[repr(C)]
#[derive(Default)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fill: RingOffset,
    completion: RingOffset,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// A receive or transmit descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    options: u32,
}

/// One mapped ring: the kernel's producer and consumer indices and the entries.
struct Ring {
    map: *mut u8,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    entries: *mut u8,
    mask: u32,
    /// Our own index: the producer's if we produce, the consumer's if we consume.
    ours: u32,
}

impl Ring {
    fn map(
        fd: BorrowedFd<'_>,
        offset: &RingOffset,
        size: u32,
        entry: usize,
        page: libc::off_t,
    ) -> io::Result<Ring> {
        let map_len = offset.desc as usize + size as usize * entry;
        // SAFETY: a shared mapping of the ring the kernel made for this socket, at
        // the page offset that names it; checked below.
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                page,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = map.cast::<u8>();
        // SAFETY: the kernel's offsets lie within the mapping it sized.
        let (producer, consumer, entries) = unsafe {
            (
                map.add(offset.producer as usize).cast::<AtomicU32>(),
                map.add(offset.consumer as usize).cast::<AtomicU32>(),
                map.add(offset.desc as usize),
            )
        };
        Ok(Ring {
            map,
            map_len,
            producer,
            consumer,
            entries,
            mask: size - 1,
            // A fresh ring: the kernel starts both indices at 0.
            ours: 0,
        })
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: a naturally aligned u32 inside the mapping, which lives as long
        // as `self`; shared with the kernel only through atomics.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    fn entry<T>(&self, index: u32) -> *mut T {
        // SAFETY: `index & mask` is below the ring's size, so the entry lies in the
        // mapping.
        unsafe {
            self.entries
                .add((index & self.mask) as usize * mem::size_of::<T>())
                .cast()
        }
    }

    /// Producer side: entries pushed that the kernel has not consumed yet.
    fn ready_to_kernel(&self) -> u32 {
        self.ours
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    /// Producer side: how many entries are free.
    fn free(&self) -> u32 {
        (self.mask + 1) - self.ready_to_kernel()
    }

    /// Producer side: writes `value` in the next entry, not yet visible.
    fn push<T>(&mut self, value: T) {
        // SAFETY: the caller checked `free`, so the entry is ours to write.
        unsafe { self.entry::<T>(self.ours).write(value) };
        self.ours = self.ours.wrapping_add(1);
    }

    /// Producer side: makes the pushed entries visible to the kernel.
    fn submit(&self) {
        self.producer().store(self.ours, Ordering::Release);
    }

    /// Consumer side: how many entries wait to be read.
    fn ready(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.ours)
    }

    /// Consumer side: the `i`-th waiting entry.
    fn peek<T: Copy>(&self, i: u32) -> T {
        // SAFETY: `i < ready()`, so the kernel wrote the entry before publishing
        // the producer index we read with acquire.
        unsafe { self.entry::<T>(self.ours.wrapping_add(i)).read() }
    }

    /// Consumer side: hands `n` read entries back to the kernel.
    fn release(&mut self, n: u32) {
        self.ours = self.ours.wrapping_add(n);
        self.consumer().store(self.ours, Ordering::Release);
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`; nothing refers into it any more.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

struct Sending {
    tx: Ring,
    completion: Ring,
    /// Chunks we may send from.
    free: Vec<u64>,
}

/// The AF_XDP socket and its UMEM.
pub struct Xsk {
    fd: OwnedFd,
    umem: *mut u8,
    umem_len: usize,
    rx: Mutex<Ring>,
    fill: Mutex<Ring>,
    sending: Mutex<Sending>,
}

// SAFETY: the UMEM and rings are shared memory whose ownership passes through the
// rings' indices (acquire/release); each of our ring ends is behind a mutex.
unsafe impl Send for Xsk {}
// SAFETY: as above.
unsafe impl Sync for Xsk {}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

fn set<T>(fd: BorrowedFd<'_>, option: libc::c_int, value: &T) -> io::Result<()> {
    super::super::set_option(fd, SOL_XDP, option, value)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Xsk {
    /// Opens a socket in copy mode on queue `queue` of the interface `ifindex`,
    /// with its fill ring stocked. Frames reach it only once it is in the
    /// interface's XSKMAP ([`super::bpf::Redirect::insert`]).
    pub fn open(ifindex: u32, queue: u32) -> io::Result<Xsk> {
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let frames = (RECEIVE_FRAMES + SEND_FRAMES) as usize;
        let umem_len = frames * CHUNK;
        // SAFETY: a private anonymous mapping; checked below.
        let umem = unsafe {
            libc::mmap(
                ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let umem = umem.cast::<u8>();
        let built = Self::build(fd, umem, umem_len, ifindex, queue);
        if built.is_err() {
            // SAFETY: the mapping just made; nothing else refers to it.
            unsafe { libc::munmap(umem.cast(), umem_len) };
        }
        built
    }

    fn build(
        fd: OwnedFd,
        umem: *mut u8,
        umem_len: usize,
        ifindex: u32,
        queue: u32,
    ) -> io::Result<Xsk> {
        let reg = UmemReg {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: CHUNK as u32,
            ..UmemReg::default()
        };
        set(fd.as_fd(), XDP_UMEM_REG, &reg).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::ENOBUFS) {
                " (the UMEM's pages count against RLIMIT_MEMLOCK without CAP_IPC_LOCK)"
            } else {
                ""
            };
            context(
                e,
                &format!("registering the {} MiB UMEM{hint}", umem_len >> 20),
            )
        })?;
        let rings = [
            (XDP_UMEM_FILL_RING, FILL_ENTRIES, "fill"),
            (XDP_UMEM_COMPLETION_RING, SEND_FRAMES, "completion"),
            (XDP_RX_RING, RECEIVE_FRAMES, "receive"),
            (XDP_TX_RING, SEND_FRAMES, "transmit"),
        ];
        for (option, entries, name) in rings {
            set(fd.as_fd(), option, &(entries as libc::c_int))
                .map_err(|e| context(e, &format!("sizing the {name} ring")))?;
        }
        let mut offsets = MmapOffsets::default();
        let mut len = mem::size_of::<MmapOffsets>() as libc::socklen_t;
        // SAFETY: `offsets` is a live struct of `len` bytes the kernel fills in.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                SOL_XDP,
                XDP_MMAP_OFFSETS,
                (&mut offsets as *mut MmapOffsets).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let desc = mem::size_of::<Desc>();
        let addr = mem::size_of::<u64>();
        let rx = Ring::map(
            fd.as_fd(),
            &offsets.rx,
            RECEIVE_FRAMES,
            desc,
            XDP_PGOFF_RX_RING,
        )?;
        let tx = Ring::map(
            fd.as_fd(),
            &offsets.tx,
            SEND_FRAMES,
            desc,
            XDP_PGOFF_TX_RING,
        )?;
        let mut fill = Ring::map(
            fd.as_fd(),
            &offsets.fill,
            FILL_ENTRIES,
            addr,
            XDP_UMEM_PGOFF_FILL_RING,
        )?;
        let completion = Ring::map(
            fd.as_fd(),
            &offsets.completion,
            SEND_FRAMES,
            addr,
            XDP_UMEM_PGOFF_COMPLETION_RING,
        )?;
        for i in 0..u64::from(RECEIVE_FRAMES) {
            fill.push(i * CHUNK as u64);
        }
        fill.submit();
        let free = (u64::from(RECEIVE_FRAMES)..u64::from(RECEIVE_FRAMES + SEND_FRAMES))
            .map(|i| i * CHUNK as u64)
            .collect();
        let address = SockaddrXdp {
            family: libc::AF_XDP as u16,
            flags: XDP_COPY,
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        // The kernel frees a closed socket's hold on its queue after an RCU grace
        // period, so binding right after a previous target closed (a restart) can
        // see EBUSY for a moment: retry briefly before calling the queue taken.
        let deadline = Instant::now() + BIND_RETRY;
        loop {
            // SAFETY: a live sockaddr_xdp of the size given.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&address as *const SockaddrXdp).cast(),
                    mem::size_of::<SockaddrXdp>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= deadline {
                return Err(error);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Xsk {
            fd,
            umem,
            umem_len,
            rx: Mutex::new(rx),
            fill: Mutex::new(fill),
            sending: Mutex::new(Sending {
                tx,
                completion,
                free,
            }),
        })
    }

    /// Takes up to `max` received frames into `out` (a frame's `slot` is its UMEM
    /// address); each is the caller's until [`give_back`](Self::give_back).
    pub fn take(&self, max: usize, out: &mut Vec<RingFrame>) -> usize {
        let mut rx = lock(&self.rx);
        let n = rx.ready().min(max as u32);
        for i in 0..n {
            let desc: Desc = rx.peek(i);
            let len = desc.len as usize;
            // Copy mode puts frames within their chunk; a descriptor that does not
            // is read as an empty frame rather than trusted.
            let inside =
                len <= MAX_FRAME && (desc.addr as usize).saturating_add(len) <= self.umem_len;
            out.push(RingFrame {
                slot: desc.addr as usize,
                // SAFETY: within the UMEM when `inside` (checked just above).
                data: if inside {
                    unsafe { self.umem.add(desc.addr as usize) }
                } else {
                    self.umem
                },
                len: if inside { len } else { 0 },
                truncated: !inside,
            });
        }
        rx.release(n);
        n as usize
    }

    /// Hands received frames' chunks back to the kernel to receive into.
    pub fn give_back(&self, frames: impl IntoIterator<Item = u64>) {
        let mut fill = lock(&self.fill);
        for addr in frames {
            // Never full: it has an entry for every chunk twice (FILL_ENTRIES).
            debug_assert!(fill.free() > 0, "the fill ring is full");
            // The kernel wants the chunk's start.
            fill.push(addr - addr % CHUNK as u64);
        }
        fill.submit();
    }

    /// Sends frames each gathered from a head and a body, padded to the Ethernet
    /// minimum, copied into UMEM chunks; returns once the kernel has taken them all.
    /// A batch with a frame larger than a chunk is refused whole: nothing is sent.
    pub fn send(&self, frames: &[(&[u8], &[u8])]) -> io::Result<()> {
        if let Some((head, body)) = frames.iter().find(|(h, b)| h.len() + b.len() > CHUNK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a {}-byte frame does not fit an AF_XDP chunk",
                    head.len() + body.len()
                ),
            ));
        }
        let mut sending = lock(&self.sending);
        let mut stalled: Option<Instant> = None;
        for &(head, body) in frames {
            let len = (head.len() + body.len()).max(MIN_FRAME_LEN);
            while sending.free.is_empty() || sending.tx.free() == 0 {
                self.kick(&mut sending, &mut stalled)?;
            }
            let addr = sending.free.pop().expect("a free chunk");
            // SAFETY: the chunk is ours (not in the transmit ring, its completion
            // came back) and lies within the UMEM; we write `len <= CHUNK` bytes.
            let chunk =
                unsafe { std::slice::from_raw_parts_mut(self.umem.add(addr as usize), len) };
            chunk[..head.len()].copy_from_slice(head);
            chunk[head.len()..head.len() + body.len()].copy_from_slice(body);
            chunk[head.len() + body.len()..].fill(0);
            sending.tx.push(Desc {
                addr,
                len: len as u32,
                options: 0,
            });
        }
        sending.tx.submit();
        while sending.tx.ready_to_kernel() > 0 {
            self.kick(&mut sending, &mut stalled)?;
        }
        self.reap(&mut sending);
        Ok(())
    }

    /// Makes the kernel send what the transmit ring holds (copy mode sends only
    /// inside this call, a budget of frames at a time) and collects completions.
    /// Gives up with TimedOut after [`SEND_STALL_LIMIT`] without progress: neither
    /// a frame taken from the ring nor a completion.
    fn kick(&self, sending: &mut Sending, stalled: &mut Option<Instant>) -> io::Result<()> {
        sending.tx.submit();
        let pending = sending.tx.ready_to_kernel();
        // SAFETY: sendto with no data on our socket: the kernel's "send the ring".
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                ptr::null(),
                0,
            )
        };
        if rc < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                // More to send, the device busy, no buffer or completion room yet.
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => {}
                _ => return Err(err),
            }
        }
        let taken = sending.tx.ready_to_kernel() < pending;
        if self.reap(sending) > 0 || taken {
            *stalled = None;
            return Ok(());
        }
        if stalled.get_or_insert_with(Instant::now).elapsed() > SEND_STALL_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the interface sent no AF_XDP frame for {SEND_STALL_LIMIT:?}"),
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
        Ok(())
    }

    /// Takes completed sends' chunks back; returns how many.
    fn reap(&self, sending: &mut Sending) -> u32 {
        let n = sending.completion.ready();
        for i in 0..n {
            let addr: u64 = sending.completion.peek(i);
            sending.free.push(addr - addr % CHUNK as u64);
        }
        sending.completion.release(n);
        n
    }
}

impl Drop for Xsk {
    fn drop(&mut self) {
        // SAFETY: the UMEM mapping made in `open`, which nothing of ours refers
        // into any more. The kernel pinned its pages when the UMEM was registered
        // and keeps them until the socket (dropped after this) is closed.
        unsafe { libc::munmap(self.umem.cast(), self.umem_len) };
    }
}

impl AsRawFd for Xsk {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Xsk {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
