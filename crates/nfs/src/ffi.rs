//! The only `unsafe` of the crate: libnfs loaded at run time with `dlopen`, the
//! synchronous calls we make, and a safe [`Context`] over one `struct nfs_context`.
//!
//! Loading at run time keeps the build free of libnfs headers and lets the binary
//! run without libnfs; `nfs://` then fails with one line naming the package. Each
//! signature was checked against `include/nfsc/libnfs.h` of libnfs 4.0.0 (Debian
//! bookworm's libnfs13, soname libnfs.so.13). libnfs 5 (libnfs.so.14) has the same
//! signatures; libnfs 6 (libnfs.so.16) moved `nfs_pread`/`nfs_pwrite` to the POSIX
//! order (buffer, count, offset), so both orders are kept and the soname picks one.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::OnceLock;

use libloading::Library;

/// libnfs.h: `struct nfs_url { char *server; char *path; char *file; }`.
#[repr(C)]
struct NfsUrl {
    server: *mut c_char,
    path: *mut c_char,
    file: *mut c_char,
}

/// libnfs.h: `struct nfs_stat_64`, seventeen `uint64_t` fields (unchanged to 6.0).
#[repr(C)]
#[derive(Default)]
struct NfsStat64 {
    dev: u64,
    ino: u64,
    mode: u64,
    nlink: u64,
    uid: u64,
    gid: u64,
    rdev: u64,
    size: u64,
    blksize: u64,
    blocks: u64,
    atime: u64,
    mtime: u64,
    ctime: u64,
    atime_nsec: u64,
    mtime_nsec: u64,
    ctime_nsec: u64,
    used: u64,
}

/// `struct nfs_context *` and `struct nfsfh *`, opaque.
type NfsContextT = *mut c_void;
type NfsFhT = *mut c_void;

/// The sonames tried, oldest first, with the Debian package of each.
pub const LIBRARIES: [(&str, &str); 3] = [
    ("libnfs.so.13", "libnfs13"),
    ("libnfs.so.14", "libnfs14"),
    ("libnfs.so.16", "libnfs16"),
];

/// `nfs_pread` and `nfs_pwrite` in the order of the loaded library.
#[derive(Clone, Copy)]
enum ReadWrite {
    /// libnfs 4 and 5: `(nfs, fh, uint64_t offset, uint64_t count, buf)`.
    OffsetFirst {
        pread: unsafe extern "C" fn(NfsContextT, NfsFhT, u64, u64, *mut c_void) -> c_int,
        pwrite: unsafe extern "C" fn(NfsContextT, NfsFhT, u64, u64, *const c_void) -> c_int,
    },
    /// libnfs 6: `(nfs, fh, buf, size_t count, uint64_t offset)`.
    BufferFirst {
        pread: unsafe extern "C" fn(NfsContextT, NfsFhT, *mut c_void, usize, u64) -> c_int,
        pwrite: unsafe extern "C" fn(NfsContextT, NfsFhT, *const c_void, usize, u64) -> c_int,
    },
}

/// The functions we use, resolved once.
struct Api {
    nfs_init_context: unsafe extern "C" fn() -> NfsContextT,
    nfs_destroy_context: unsafe extern "C" fn(NfsContextT),
    nfs_get_error: unsafe extern "C" fn(NfsContextT) -> *mut c_char,
    nfs_parse_url_full: unsafe extern "C" fn(NfsContextT, *const c_char) -> *mut NfsUrl,
    nfs_destroy_url: unsafe extern "C" fn(*mut NfsUrl),
    nfs_set_timeout: unsafe extern "C" fn(NfsContextT, c_int),
    nfs_mount: unsafe extern "C" fn(NfsContextT, *const c_char, *const c_char) -> c_int,
    nfs_open: unsafe extern "C" fn(NfsContextT, *const c_char, c_int, *mut NfsFhT) -> c_int,
    nfs_creat: unsafe extern "C" fn(NfsContextT, *const c_char, c_int, *mut NfsFhT) -> c_int,
    nfs_close: unsafe extern "C" fn(NfsContextT, NfsFhT) -> c_int,
    nfs_fsync: unsafe extern "C" fn(NfsContextT, NfsFhT) -> c_int,
    nfs_fstat64: unsafe extern "C" fn(NfsContextT, NfsFhT, *mut NfsStat64) -> c_int,
    nfs_ftruncate: unsafe extern "C" fn(NfsContextT, NfsFhT, u64) -> c_int,
    read_write: ReadWrite,
    /// The soname loaded.
    name: &'static str,
    // Kept loaded for as long as the process runs: the pointers above point into it.
    _library: Library,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Loads libnfs, or says in one line that it is missing and what to install.
pub fn check_loadable() -> Result<(), String> {
    api().map(|_| ())
}

/// The soname of the libnfs loaded (loading it if needed).
pub fn library_name() -> Result<&'static str, String> {
    api().map(|api| api.name)
}

fn load() -> Result<Api, String> {
    let (library, name) = LIBRARIES
        .iter()
        .find_map(|&(name, _)| {
            // SAFETY: loading libnfs runs no constructors beyond its own state's.
            unsafe { Library::new(name) }.ok().map(|lib| (lib, name))
        })
        .ok_or_else(|| "libnfs not found (install libnfs13)".to_string())?;
    macro_rules! sym {
        ($name:ident) => {
            // SAFETY: the field's type is the function's signature in libnfs.h
            // (4.0.0, unchanged to 6.0 for everything but pread/pwrite).
            *unsafe { library.get(concat!(stringify!($name), "\0").as_bytes()) }
                .map_err(|e| format!("{name} lacks {}: {e}", stringify!($name)))?
        };
    }
    let read_write = if name == "libnfs.so.16" {
        ReadWrite::BufferFirst {
            pread: sym!(nfs_pread),
            pwrite: sym!(nfs_pwrite),
        }
    } else {
        ReadWrite::OffsetFirst {
            pread: sym!(nfs_pread),
            pwrite: sym!(nfs_pwrite),
        }
    };
    Ok(Api {
        nfs_init_context: sym!(nfs_init_context),
        nfs_destroy_context: sym!(nfs_destroy_context),
        nfs_get_error: sym!(nfs_get_error),
        nfs_parse_url_full: sym!(nfs_parse_url_full),
        nfs_destroy_url: sym!(nfs_destroy_url),
        nfs_set_timeout: sym!(nfs_set_timeout),
        nfs_mount: sym!(nfs_mount),
        nfs_open: sym!(nfs_open),
        nfs_creat: sym!(nfs_creat),
        nfs_close: sym!(nfs_close),
        nfs_fsync: sym!(nfs_fsync),
        nfs_fstat64: sym!(nfs_fstat64),
        nfs_ftruncate: sym!(nfs_ftruncate),
        read_write,
        name,
        _library: library,
    })
}

/// A failed libnfs call: the function, the positive errno it returned and the
/// context's error text (libnfs says more there than the errno does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub function: &'static str,
    pub errno: i32,
    pub message: String,
}

impl CallError {
    pub fn io(&self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.function, self.io())?;
        if !self.message.is_empty() {
            write!(f, " ({})", self.message)?;
        }
        Ok(())
    }
}

fn cstring(text: &str) -> CString {
    // URLs and paths come from text the parser checked for NULs.
    CString::new(text).unwrap_or_else(|_| CString::new(text.replace('\0', "")).unwrap())
}

/// One libnfs context: one TCP connection, one mount, at most one open file. Not
/// thread-safe (libnfs' contexts are not): used by one thread at a time, which
/// `&mut self` enforces.
pub struct Context {
    api: &'static Api,
    context: NonNull<c_void>,
    file: Option<NonNull<c_void>>,
}

// SAFETY: a libnfs context has no thread affinity; it must only not be used from
// two threads at once, and every call takes `&mut self`.
unsafe impl Send for Context {}

impl Context {
    /// `nfs_init_context`.
    pub fn new() -> Result<Context, String> {
        let api = api()?;
        // SAFETY: no arguments; NULL on failure.
        let context = NonNull::new(unsafe { (api.nfs_init_context)() })
            .ok_or_else(|| "nfs_init_context failed (out of memory?)".to_string())?;
        Ok(Context {
            api,
            context,
            file: None,
        })
    }

    fn raw(&self) -> NfsContextT {
        self.context.as_ptr()
    }

    /// The context's last error text (`nfs_get_error`).
    fn error_text(&self) -> String {
        // SAFETY: a live context; the string (or NULL) belongs to it and is copied
        // at once.
        let text = unsafe { (self.api.nfs_get_error)(self.raw()) };
        if text.is_null() {
            return String::new();
        }
        // SAFETY: NUL-terminated, owned by the context, read before the next call.
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    fn check(&self, function: &'static str, ret: c_int) -> Result<c_int, CallError> {
        if ret >= 0 {
            return Ok(ret);
        }
        Err(CallError {
            function,
            errno: ret.checked_neg().unwrap_or(libc::EIO),
            message: self.error_text(),
        })
    }

    /// Applies the URL's libnfs options (`version=`, `nfsport=`, ...) to the
    /// context through `nfs_parse_url_full`; the URL must be in libnfs' own form
    /// (no port in the authority).
    pub fn apply_url_options(&mut self, url: &str) -> Result<(), CallError> {
        let url = cstring(url);
        // SAFETY: a live context and a NUL-terminated URL; the result is ours to
        // free with nfs_destroy_url.
        let parsed = unsafe { (self.api.nfs_parse_url_full)(self.raw(), url.as_ptr()) };
        if parsed.is_null() {
            return Err(CallError {
                function: "nfs_parse_url_full",
                errno: libc::EINVAL,
                message: self.error_text(),
            });
        }
        // SAFETY: returned by nfs_parse_url_full and freed once.
        unsafe { (self.api.nfs_destroy_url)(parsed) };
        Ok(())
    }

    /// `nfs_set_timeout`: how long one RPC may take, in whole seconds (libnfs'
    /// unit); `None` waits forever.
    pub fn set_timeout(&mut self, timeout: Option<std::time::Duration>) {
        let ms = match timeout {
            Some(t) => c_int::try_from(t.as_secs().max(1) * 1000).unwrap_or(c_int::MAX),
            None => -1,
        };
        // SAFETY: a live context.
        unsafe { (self.api.nfs_set_timeout)(self.raw(), ms) };
    }

    /// `nfs_mount(server, export)`.
    pub fn mount(&mut self, server: &str, export: &str) -> Result<(), CallError> {
        let (server, export) = (cstring(server), cstring(export));
        // SAFETY: a live context and NUL-terminated strings.
        let ret = unsafe { (self.api.nfs_mount)(self.raw(), server.as_ptr(), export.as_ptr()) };
        self.check("nfs_mount", ret).map(|_| ())
    }

    /// Opens `path` (relative to the mount) with `flags` (`O_RDONLY`/`O_RDWR`)
    /// as the context's file.
    pub fn open(&mut self, path: &str, flags: c_int) -> Result<(), CallError> {
        let path = cstring(path);
        let mut file = std::ptr::null_mut();
        // SAFETY: a live context, a NUL-terminated path, a valid out-pointer.
        let ret = unsafe { (self.api.nfs_open)(self.raw(), path.as_ptr(), flags, &mut file) };
        self.check("nfs_open", ret)?;
        self.set_file(file);
        Ok(())
    }

    /// Creates `path` (`nfs_creat`, truncating) with `mode` and opens it read-write.
    pub fn create(&mut self, path: &str, mode: c_int) -> Result<(), CallError> {
        let path = cstring(path);
        let mut file = std::ptr::null_mut();
        // SAFETY: as for open.
        let ret = unsafe { (self.api.nfs_creat)(self.raw(), path.as_ptr(), mode, &mut file) };
        self.check("nfs_creat", ret)?;
        self.set_file(file);
        Ok(())
    }

    fn set_file(&mut self, file: NfsFhT) {
        self.close_file();
        self.file = NonNull::new(file);
    }

    fn file(&self, function: &'static str) -> Result<NfsFhT, CallError> {
        self.file.map(NonNull::as_ptr).ok_or(CallError {
            function,
            errno: libc::EBADF,
            message: "no file open".into(),
        })
    }

    /// One `nfs_pread`: reads up to `buf.len()` bytes at `offset`; returns how
    /// many (0 at the end of the file).
    pub fn pread(&mut self, buf: &mut [u8], offset: u64) -> Result<usize, CallError> {
        let file = self.file("nfs_pread")?;
        let ptr = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: a live context and file; `buf` is valid for `buf.len()` bytes of
        // writes for the whole (synchronous) call.
        let ret = unsafe {
            match self.api.read_write {
                ReadWrite::OffsetFirst { pread, .. } => {
                    pread(self.raw(), file, offset, buf.len() as u64, ptr)
                }
                ReadWrite::BufferFirst { pread, .. } => {
                    pread(self.raw(), file, ptr, buf.len(), offset)
                }
            }
        };
        let n = self.check("nfs_pread", ret)?;
        Ok((n as usize).min(buf.len()))
    }

    /// One `nfs_pwrite`: writes up to `buf.len()` bytes at `offset`; returns how
    /// many.
    pub fn pwrite(&mut self, buf: &[u8], offset: u64) -> Result<usize, CallError> {
        let file = self.file("nfs_pwrite")?;
        let ptr = buf.as_ptr().cast::<c_void>();
        // SAFETY: a live context and file; `buf` is valid for `buf.len()` bytes of
        // reads for the whole (synchronous) call.
        let ret = unsafe {
            match self.api.read_write {
                ReadWrite::OffsetFirst { pwrite, .. } => {
                    pwrite(self.raw(), file, offset, buf.len() as u64, ptr)
                }
                ReadWrite::BufferFirst { pwrite, .. } => {
                    pwrite(self.raw(), file, ptr, buf.len(), offset)
                }
            }
        };
        let n = self.check("nfs_pwrite", ret)?;
        Ok((n as usize).min(buf.len()))
    }

    /// `nfs_fsync`: an NFS COMMIT (NFSv3) of everything written unstable.
    pub fn fsync(&mut self) -> Result<(), CallError> {
        let file = self.file("nfs_fsync")?;
        // SAFETY: a live context and file.
        let ret = unsafe { (self.api.nfs_fsync)(self.raw(), file) };
        self.check("nfs_fsync", ret).map(|_| ())
    }

    /// The open file's size and mode (`nfs_fstat64`).
    pub fn size_and_mode(&mut self) -> Result<(u64, u64), CallError> {
        let file = self.file("nfs_fstat64")?;
        let mut stat = NfsStat64::default();
        // SAFETY: a live context and file, a valid out-pointer of the header's layout.
        let ret = unsafe { (self.api.nfs_fstat64)(self.raw(), file, &mut stat) };
        self.check("nfs_fstat64", ret)?;
        Ok((stat.size, stat.mode))
    }

    /// `nfs_ftruncate`: sets the open file's size.
    pub fn truncate(&mut self, size: u64) -> Result<(), CallError> {
        let file = self.file("nfs_ftruncate")?;
        // SAFETY: a live context and file.
        let ret = unsafe { (self.api.nfs_ftruncate)(self.raw(), file, size) };
        self.check("nfs_ftruncate", ret).map(|_| ())
    }

    fn close_file(&mut self) {
        if let Some(file) = self.file.take() {
            // SAFETY: a live context and a file it opened, closed once.
            unsafe { (self.api.nfs_close)(self.raw(), file.as_ptr()) };
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.close_file();
        // SAFETY: destroyed once; closes the connection and frees the context.
        unsafe { (self.api.nfs_destroy_context)(self.raw()) };
    }
}
