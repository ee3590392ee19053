//! Interface lookup: name to index, MAC address and MTU.

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::MacAddr;

/// A network interface as AoE sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Kernel name, e.g. `eth0`.
    pub name: String,
    /// Kernel interface index (what AF_PACKET binds to).
    pub index: i32,
    /// Hardware address (all zero for `lo`).
    pub mac: MacAddr,
    /// Maximum payload of one frame, without the 14-byte Ethernet header.
    pub mtu: usize,
}

impl Interface {
    /// Looks an interface up by name in the calling thread's network namespace
    /// (SIOCGIFINDEX, SIOCGIFHWADDR, SIOCGIFMTU). A missing interface gives a
    /// [`io::ErrorKind::NotFound`] error naming it.
    pub fn lookup(name: &str) -> io::Result<Interface> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("network interface name {name:?} is invalid (1 to 15 bytes, no NUL)"),
            ));
        }
        // Any socket will do for the SIOCGIF* getters; they look the name up in the
        // namespace the socket was created in.
        // SAFETY: socket(2) with constant arguments; the result is checked below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(interface_error(name, "socket", io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };

        let req = interface_ioctl(sock.as_fd(), name, libc::SIOCGIFINDEX, "SIOCGIFINDEX")?;
        // SAFETY: SIOCGIFINDEX filled `ifru_ifindex`; any int is a valid value.
        let index = unsafe { req.ifr_ifru.ifru_ifindex };
        let req = interface_ioctl(sock.as_fd(), name, libc::SIOCGIFHWADDR, "SIOCGIFHWADDR")?;
        // SAFETY: SIOCGIFHWADDR filled `ifru_hwaddr`, a plain sockaddr.
        let hwaddr = unsafe { req.ifr_ifru.ifru_hwaddr };
        let mut mac = [0u8; 6];
        for (byte, raw) in mac.iter_mut().zip(hwaddr.sa_data.iter()) {
            *byte = *raw as u8;
        }
        let req = interface_ioctl(sock.as_fd(), name, libc::SIOCGIFMTU, "SIOCGIFMTU")?;
        // SAFETY: SIOCGIFMTU filled `ifru_mtu`; any int is a valid value.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu };
        Ok(Interface {
            name: name.to_string(),
            index,
            mac,
            mtu: usize::try_from(mtu).unwrap_or(0),
        })
    }
}

/// Runs one SIOCGIF* getter for `name` and returns the filled request.
fn interface_ioctl(
    sock: BorrowedFd<'_>,
    name: &str,
    request: libc::c_ulong,
    what: &str,
) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data (a byte array and a union of ints and sockaddrs),
    // for which all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    // The caller checked the length, so the name stays NUL-terminated.
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: the SIOCGIF* getters read `ifr_name` and write one field of the ifreq
    // that `req` points to, which lives for the whole call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), request as _, &mut req) };
    if rc < 0 {
        return Err(interface_error(name, what, io::Error::last_os_error()));
    }
    Ok(req)
}

fn interface_error(name: &str, what: &str, err: io::Error) -> io::Error {
    if err.raw_os_error() == Some(libc::ENODEV) {
        return io::Error::new(
            io::ErrorKind::NotFound,
            format!("network interface {name:?} not found"),
        );
    }
    io::Error::new(
        err.kind(),
        format!("network interface {name:?}: {what}: {err}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_loopback() {
        let lo = Interface::lookup("lo").expect("lo exists in every namespace");
        assert_eq!(lo.name, "lo");
        assert!(lo.index > 0);
        assert_eq!(lo.mac, [0; 6]);
        assert_eq!(lo.mtu, 65536);
    }

    #[test]
    fn lookup_missing_interface_names_it() {
        let err = Interface::lookup("bwnosuch0").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("bwnosuch0"), "{err}");

        let err = Interface::lookup("a-name-longer-than-15").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("a-name-longer-than-15"), "{err}");
        assert!(Interface::lookup("").is_err());
    }
}
