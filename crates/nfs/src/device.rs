//! A file on an NFS server as a [`BlockDevice`]: a pool of libnfs contexts (one TCP
//! connection and one mount each, the file open in every one), each request taking
//! one context for its synchronous libnfs calls. A context runs one call at a
//! time, so the pool's size is how many requests are in flight: the queue depth a
//! caller's worker threads give turns into that many connections' worth of
//! parallelism.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, BlockSizes, Capabilities, DeviceInfo, Error, ErrorKind, Op, Result, Support,
    WriteFlags,
};

use crate::errors::{request_error, OpenError, Stage};
use crate::ffi::{self, CallError, Context};
use crate::url::NfsUrl;

/// How long opening waits for the server's TCP handshake, and each RPC's timeout
/// when the caller gives none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the reachability probe waits for a TCP connection.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);

/// The portmapper's port: NFSv3 clients ask it where MOUNT and NFS listen.
const PORTMAPPER_PORT: u16 = 111;
/// NFS's registered port, NFSv4's only one.
const NFS_PORT: u16 = 2049;

/// The device's block size. A file takes any offset and length; 512 lets every
/// protocol target (SCSI, NVMe, NBD) and the bench address it, and files whose
/// size is not a multiple of 4096 are still whole devices.
pub const BLOCK_SIZE: u32 = 512;

/// How an NFS file is opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NfsOptions {
    /// Open the file read-only.
    pub read_only: bool,
    /// Create the file with this size when it does not exist (a missing file is
    /// an error without it).
    pub create_size: Option<u64>,
    /// Each RPC's timeout; `None` for [`DEFAULT_TIMEOUT`].
    pub timeout: Option<Duration>,
}

/// An open file on an NFS server.
pub struct NfsFile {
    url: String,
    info: DeviceInfo,
    pool: Pool,
    created: bool,
    read_only_by_server: bool,
}

impl NfsFile {
    /// Connects, mounts the export and opens the file on every connection of the
    /// pool (the first alone: it creates the file if asked; the rest in parallel).
    pub fn open(url: &NfsUrl, options: NfsOptions) -> std::result::Result<NfsFile, OpenError> {
        NfsFile::open_pool(url, options).map_err(|mut error| {
            // libnfs 4.0 documents its NFSv4 as unfinished; with ganesha 4.3 its
            // OPEN and SETATTR fail (NFS4ERR_OLD_STATEID, NFS4ERR_OPENMODE).
            let old_library = ffi::library_name() == Ok(ffi::LIBRARIES[0].0);
            if url.version == 4 && old_library && error.stage == Stage::File {
                error
                    .message
                    .push_str("; libnfs 4's NFSv4 is unfinished: try version=3");
            }
            error
        })
    }

    fn open_pool(url: &NfsUrl, options: NfsOptions) -> std::result::Result<NfsFile, OpenError> {
        let name = url.to_string();
        ffi::check_loadable().map_err(|e| OpenError::new(&name, Stage::Library, e))?;
        probe(
            url,
            options
                .timeout
                .unwrap_or(DEFAULT_TIMEOUT)
                .min(CONNECT_LIMIT),
        )
        .map_err(|e| OpenError::new(&name, Stage::Unreachable, e))?;
        let mut first = mounted(url, &name, options)?;
        let mut read_only = options.read_only;
        let mut read_only_by_server = false;
        let mut created = false;
        match first.open(&url.file, open_flags(read_only)) {
            Ok(()) => {}
            Err(e) if e.errno == libc::ENOENT && !read_only && options.create_size.is_some() => {
                let size = options.create_size.unwrap_or(0);
                first
                    .create(&url.file, 0o644)
                    .and_then(|()| first.truncate(size))
                    .map_err(|e| OpenError::file(&name, &url.file, &url.export, &e))?;
                created = true;
            }
            // The export or the file takes no writes: a read-only device.
            Err(e) if !read_only && matches!(e.errno, libc::EACCES | libc::EROFS) => {
                first
                    .open(&url.file, open_flags(true))
                    .map_err(|e| OpenError::file(&name, &url.file, &url.export, &e))?;
                read_only = true;
                read_only_by_server = true;
            }
            Err(e) => return Err(no_file(&name, url, &e)),
        }
        let (size, mode) = first
            .size_and_mode()
            .map_err(|e| OpenError::file(&name, &url.file, &url.export, &e))?;
        if mode & u64::from(libc::S_IFMT) == u64::from(libc::S_IFDIR) {
            return Err(OpenError::new(
                &name,
                Stage::File,
                format!("{} in export {} is a directory", url.file, url.export),
            ));
        }
        let rest = open_more(url, &name, options, read_only, url.connections() - 1)?;
        let mut contexts = vec![first];
        contexts.extend(rest);
        let info = device_info(size, read_only);
        tracing::debug!(
            url = %name,
            size,
            connections = contexts.len(),
            library = ffi::library_name().unwrap_or("?"),
            "nfs file open"
        );
        Ok(NfsFile {
            url: name,
            info,
            pool: Pool::new(contexts),
            created,
            read_only_by_server,
        })
    }

    /// `nfs://SERVER[:PORT]/EXPORT/FILE`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether `open` created the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Whether writing was asked for but the server allowed reading only.
    pub fn read_only_by_server(&self) -> bool {
        self.read_only_by_server
    }

    /// Connections (libnfs contexts) in the pool.
    pub fn connections(&self) -> usize {
        self.pool.size
    }

    fn failed(&self, call: &CallError, op: Op, offset: u64, len: u64) -> Error {
        request_error(call, &self.url, op, offset, len)
    }
}

impl BlockDevice for NfsFile {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut context = self.pool.take();
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let n = context
                .pread(&mut buf[done..], at)
                .map_err(|e| self.failed(&e, Op::Read, offset, buf.len() as u64))?;
            if n == 0 {
                // The file shrank under us (another client truncated it).
                return Err(
                    Error::new(ErrorKind::Io, Op::Read, offset, buf.len() as u64)
                        .with_detail(format!("{}: end of file at {at}", self.url)),
                );
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _flags: WriteFlags) -> Result<()> {
        if self.info.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                Op::Write,
                offset,
                buf.len() as u64,
            ));
        }
        let mut context = self.pool.take();
        let mut done = 0;
        while done < buf.len() {
            let n = context
                .pwrite(&buf[done..], offset + done as u64)
                .map_err(|e| self.failed(&e, Op::Write, offset, buf.len() as u64))?;
            if n == 0 {
                return Err(
                    Error::new(ErrorKind::Io, Op::Write, offset, buf.len() as u64)
                        .with_detail(format!("{}: the server wrote nothing", self.url)),
                );
            }
            done += n;
        }
        Ok(())
    }

    /// An NFS COMMIT of the file. The server commits the file, whichever
    /// connection wrote to it, so one context's COMMIT covers every write that
    /// has been answered.
    fn flush(&self) -> Result<()> {
        let mut context = self.pool.take();
        context
            .fsync()
            .map_err(|e| self.failed(&e, Op::Flush, 0, 0))
    }
}

/// The device's description: the file's size rounded down to whole blocks, flush
/// native (COMMIT); FUA, trim and write-zeroes left to the handle's emulation
/// (NFSv3 has no deallocate; libnfs 4 sends no NFSv4.2 ones).
fn device_info(size: u64, read_only: bool) -> DeviceInfo {
    let mut info = DeviceInfo::new(size - size % u64::from(BLOCK_SIZE));
    info.block_sizes = BlockSizes {
        minimum: BLOCK_SIZE,
        preferred: 4096,
        maximum: DeviceInfo::DEFAULT_MAX_TRANSFER,
    };
    info.read_only = read_only;
    info.capabilities = Capabilities {
        flush: if read_only {
            Support::None
        } else {
            Support::Native
        },
        ..Capabilities::default()
    };
    // Every connection sees the server's one file; a COMMIT covers them all.
    info.consistent_across_handles = true;
    info
}

fn open_flags(read_only: bool) -> libc::c_int {
    if read_only {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    }
}

fn no_file(name: &str, url: &NfsUrl, call: &CallError) -> OpenError {
    let mut error = OpenError::file(name, &url.file, &url.export, call);
    if call.errno == libc::ENOENT {
        error.message = format!(
            "{} does not exist in export {} (give a size to create it)",
            url.file, url.export
        );
    }
    error
}

/// A new context with the URL's options and timeout, the export mounted.
fn mounted(
    url: &NfsUrl,
    name: &str,
    options: NfsOptions,
) -> std::result::Result<Context, OpenError> {
    let mut context = Context::new().map_err(|e| OpenError::new(name, Stage::Library, e))?;
    context.set_timeout(Some(options.timeout.unwrap_or(DEFAULT_TIMEOUT)));
    context
        .apply_url_options(&url.libnfs_options_url())
        .map_err(|e| OpenError::new(name, Stage::Url, e.to_string()))?;
    context
        .mount(&url.server, &url.export)
        .map_err(|e| OpenError::export(name, &url.export, &url.host(), &e))?;
    Ok(context)
}

/// `count` more contexts with the file open, made in parallel.
fn open_more(
    url: &NfsUrl,
    name: &str,
    options: NfsOptions,
    read_only: bool,
    count: usize,
) -> std::result::Result<Vec<Context>, OpenError> {
    std::thread::scope(|scope| {
        let opening: Vec<_> = (0..count)
            .map(|_| {
                scope.spawn(move || {
                    let mut context = mounted(url, name, options)?;
                    context
                        .open(&url.file, open_flags(read_only))
                        .map_err(|e| OpenError::file(name, &url.file, &url.export, &e))?;
                    Ok(context)
                })
            })
            .collect();
        opening
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| {
                    Err(OpenError::new(
                        name,
                        Stage::File,
                        "opening a connection panicked",
                    ))
                })
            })
            .collect()
    })
}

/// Whether the server takes a TCP connection on the port the client will use
/// first: the portmapper (111) for NFSv3, 2049 for NFSv4, or the URL's port.
/// Tells "unreachable" from "export refused" before libnfs blurs the two.
fn probe(url: &NfsUrl, limit: Duration) -> std::result::Result<(), String> {
    let port = match (url.port, url.version) {
        (Some(port), 4) => port,
        (_, 4) => NFS_PORT,
        (Some(port), _) if url.options.iter().any(|(k, _)| k == "mountport") => port,
        _ => PORTMAPPER_PORT,
    };
    let addresses: Vec<_> = (url.server.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve NFS server {}: {e}", url.host()))?
        .collect();
    let mut last = None;
    for address in &addresses {
        match TcpStream::connect_timeout(address, limit) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
    Err(format!(
        "cannot reach NFS server {}:{port}: {why}",
        url.host()
    ))
}

/// The contexts not in use, and a condition to wait on for one.
struct Pool {
    idle: Mutex<Vec<Context>>,
    returned: Condvar,
    size: usize,
}

impl Pool {
    fn new(contexts: Vec<Context>) -> Pool {
        let size = contexts.len();
        Pool {
            idle: Mutex::new(contexts),
            returned: Condvar::new(),
            size,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Context>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle context, waiting for one when all are busy.
    fn take(&self) -> Taken<'_> {
        let mut idle = self.lock();
        loop {
            if let Some(context) = idle.pop() {
                return Taken {
                    pool: self,
                    context: Some(context),
                };
            }
            idle = self.returned.wait(idle).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A context taken from the pool; given back when dropped.
struct Taken<'a> {
    pool: &'a Pool,
    context: Option<Context>,
}

impl std::ops::Deref for Taken<'_> {
    type Target = Context;

    fn deref(&self) -> &Context {
        self.context.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for Taken<'_> {
    fn deref_mut(&mut self) -> &mut Context {
        self.context.as_mut().expect("held until drop")
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if let Some(context) = self.context.take() {
            self.pool.lock().push(context);
            self.pool.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_the_file_in_whole_blocks_with_a_native_flush() {
        let info = device_info(10_000, false);
        assert_eq!(info.size, 9728);
        assert_eq!(info.block_sizes.minimum, 512);
        assert_eq!(info.capabilities.flush, Support::Native);
        assert_eq!(info.capabilities.trim, Support::None);
        assert!(!info.read_only);
        let read_only = device_info(1 << 20, true);
        assert!(read_only.read_only);
        assert_eq!(read_only.capabilities.flush, Support::None);
    }

    #[test]
    fn an_unreachable_server_is_named_with_its_port() {
        // A port nothing listens on, on loopback: refused at once.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = NfsUrl::parse(&format!("nfs://127.0.0.1:{port}/e/f?version=4")).unwrap();
        let error = probe(&url, Duration::from_secs(2)).unwrap_err();
        assert!(
            error.starts_with(&format!("cannot reach NFS server 127.0.0.1:{port}")),
            "{error}"
        );
    }
}
