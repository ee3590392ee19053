//! Facts about this machine: host name, CPUs, memory, kernel, free space.

use std::path::Path;

use crate::results::Machine;

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The machine the benchmark runs on.
pub fn this_machine() -> Machine {
    Machine {
        hostname: read_trimmed("/proc/sys/kernel/hostname").unwrap_or_else(|| "localhost".into()),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        memory_bytes: memory_bytes(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default(),
    }
}

/// Total RAM in bytes (MemTotal of /proc/meminfo); 0 when unknown.
pub fn memory_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return 0;
    };
    text.lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Bytes an unprivileged user may still write on the file system holding `path`
/// (`u64::MAX` where the file system reports no size, as ramfs does).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs fills the zeroed struct; c_path is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if stat.f_blocks == 0 {
        // A file system that reports no size at all (ramfs, some pseudo file
        // systems) has no limit to report either: it grows until memory runs out.
        return Ok(u64::MAX);
    }
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_facts_are_plausible() {
        let machine = this_machine();
        assert!(machine.cpus >= 1);
        assert!(machine.memory_bytes > 0);
        assert!(!machine.hostname.is_empty());
        assert!(free_bytes(Path::new("/")).is_ok());
    }
}
