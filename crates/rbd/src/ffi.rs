//! The only `unsafe` of the crate: librados and librbd loaded at run time with
//! `dlopen`, the few functions we call, and safe handles over them.
//!
//! Loading at run time keeps the default build free of Ceph headers and lets the
//! binary run where Ceph is not installed; `rbd:` then fails with one line naming
//! the Debian package. Each signature below was checked against the C headers of
//! Ceph 16.2 (librbd API 1.16): `rados/librados.h` and `rbd/librbd.h`, named beside
//! each function. Newer calls (compare-and-write, `rbd_diff_iterate3`) are not used.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::marker::PhantomData;
use std::ptr;
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};

use blockwire_blockdev::IoBuf;
use libloading::Library;

/// `rados_t` (librados.h: `typedef void *rados_t;`).
type RadosT = *mut c_void;
/// `rados_ioctx_t` (librados.h: `typedef void *rados_ioctx_t;`).
type IoctxT = *mut c_void;
/// `rbd_image_t` (librbd.h: `typedef void *rbd_image_t;`).
type ImageT = *mut c_void;
/// `rbd_completion_t` (librbd.h: `typedef void *rbd_completion_t;`).
type CompletionT = *mut c_void;
/// `rbd_callback_t` (librbd.h: `void (*)(rbd_completion_t cb, void *arg)`).
type CallbackT = Option<unsafe extern "C" fn(CompletionT, *mut c_void)>;
/// The extent callback of `rbd_diff_iterate2`:
/// `int (*cb)(uint64_t, size_t, int, void *)`.
type DiffCallbackT = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// librbd.h: `EVENT_TYPE_EVENTFD = 2` (enum of `rbd_set_image_notification`).
const EVENT_TYPE_EVENTFD: c_int = 2;
/// librbd.h: `RBD_LOCK_MODE_EXCLUSIVE = 0` (`rbd_lock_mode_t`).
const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;
/// librbd.h: `RBD_MAX_BLOCK_NAME_SIZE 24`.
const RBD_MAX_BLOCK_NAME_SIZE: usize = 24;
/// librbd.h: `RBD_MAX_IMAGE_NAME_SIZE 96`.
const RBD_MAX_IMAGE_NAME_SIZE: usize = 96;

/// librbd.h: `rbd_image_info_t`.
#[repr(C)]
struct RbdImageInfo {
    size: u64,
    obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; RBD_MAX_BLOCK_NAME_SIZE],
    parent_pool: i64,
    parent_name: [c_char; RBD_MAX_IMAGE_NAME_SIZE],
}

/// librbd.h: `rbd_snap_info_t`.
#[repr(C)]
struct RbdSnapInfo {
    id: u64,
    size: u64,
    name: *const c_char,
}

/// The library names, as Debian installs them (packages librados2 and librbd1).
pub const LIBRADOS: &str = "librados.so.2";
pub const LIBRBD: &str = "librbd.so.1";

/// The functions we use, resolved once.
struct Api {
    // librados.h
    rados_create: unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int,
    rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    rados_shutdown: unsafe extern "C" fn(RadosT),
    rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
    rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
    rados_ioctx_set_namespace: unsafe extern "C" fn(IoctxT, *const c_char),
    // librbd.h
    rbd_version: unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int),
    rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_open_read_only:
        unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
    rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
    rbd_stat: unsafe extern "C" fn(ImageT, *mut RbdImageInfo, usize) -> c_int,
    rbd_get_features: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
    rbd_snap_list: unsafe extern "C" fn(ImageT, *mut RbdSnapInfo, *mut c_int) -> c_int,
    rbd_snap_list_end: unsafe extern "C" fn(*mut RbdSnapInfo),
    rbd_lock_acquire: unsafe extern "C" fn(ImageT, c_int) -> c_int,
    rbd_set_image_notification: unsafe extern "C" fn(ImageT, c_int, c_int) -> c_int,
    rbd_poll_io_events: unsafe extern "C" fn(ImageT, *mut CompletionT, c_int) -> c_int,
    rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, CallbackT, *mut CompletionT) -> c_int,
    rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    rbd_aio_get_arg: unsafe extern "C" fn(CompletionT) -> *mut c_void,
    rbd_aio_release: unsafe extern "C" fn(CompletionT),
    rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    rbd_aio_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
    rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
    rbd_aio_discard: unsafe extern "C" fn(ImageT, u64, u64, CompletionT) -> c_int,
    rbd_aio_write_zeroes:
        unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int,
    rbd_diff_iterate2: unsafe extern "C" fn(
        ImageT,
        *const c_char,
        u64,
        u64,
        u8,
        u8,
        DiffCallbackT,
        *mut c_void,
    ) -> c_int,
    // Kept loaded for as long as the process runs: the pointers above point into them.
    _rados: Library,
    _rbd: Library,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Loads librados and librbd, or says in one line why not (which package is missing).
pub fn check_loadable() -> Result<(), String> {
    api().map(|_| ())
}

/// Loads one library, or says in one line which Debian package provides it.
fn open_library(name: &str, package: &str) -> Result<Library, String> {
    // SAFETY: loading librados/librbd runs their static constructors, which only
    // initialise the libraries' own state.
    unsafe { Library::new(name) }
        .map_err(|e| format!("cannot load {name} (install the Debian package {package}): {e}"))
}

fn load() -> Result<Api, String> {
    let rados = open_library(LIBRADOS, "librados2")?;
    let rbd = open_library(LIBRBD, "librbd1")?;
    macro_rules! sym {
        ($lib:expr, $name:ident) => {
            // SAFETY: the field's type is the function's signature in the header
            // named in the comment at the field (Ceph 16.2).
            *unsafe { $lib.get(concat!(stringify!($name), "\0").as_bytes()) }.map_err(|e| {
                format!(
                    "{} lacks {} (librbd older than Ceph 16?): {e}",
                    LIBRBD,
                    stringify!($name)
                )
            })?
        };
    }
    Ok(Api {
        rados_create: sym!(rados, rados_create),
        rados_conf_read_file: sym!(rados, rados_conf_read_file),
        rados_conf_parse_env: sym!(rados, rados_conf_parse_env),
        rados_conf_set: sym!(rados, rados_conf_set),
        rados_connect: sym!(rados, rados_connect),
        rados_shutdown: sym!(rados, rados_shutdown),
        rados_ioctx_create: sym!(rados, rados_ioctx_create),
        rados_ioctx_destroy: sym!(rados, rados_ioctx_destroy),
        rados_ioctx_set_namespace: sym!(rados, rados_ioctx_set_namespace),
        rbd_version: sym!(rbd, rbd_version),
        rbd_open: sym!(rbd, rbd_open),
        rbd_open_read_only: sym!(rbd, rbd_open_read_only),
        rbd_close: sym!(rbd, rbd_close),
        rbd_stat: sym!(rbd, rbd_stat),
        rbd_get_features: sym!(rbd, rbd_get_features),
        rbd_snap_list: sym!(rbd, rbd_snap_list),
        rbd_snap_list_end: sym!(rbd, rbd_snap_list_end),
        rbd_lock_acquire: sym!(rbd, rbd_lock_acquire),
        rbd_set_image_notification: sym!(rbd, rbd_set_image_notification),
        rbd_poll_io_events: sym!(rbd, rbd_poll_io_events),
        rbd_aio_create_completion: sym!(rbd, rbd_aio_create_completion),
        rbd_aio_get_return_value: sym!(rbd, rbd_aio_get_return_value),
        rbd_aio_get_arg: sym!(rbd, rbd_aio_get_arg),
        rbd_aio_release: sym!(rbd, rbd_aio_release),
        rbd_aio_read: sym!(rbd, rbd_aio_read),
        rbd_aio_write: sym!(rbd, rbd_aio_write),
        rbd_aio_flush: sym!(rbd, rbd_aio_flush),
        rbd_aio_discard: sym!(rbd, rbd_aio_discard),
        rbd_aio_write_zeroes: sym!(rbd, rbd_aio_write_zeroes),
        rbd_diff_iterate2: sym!(rbd, rbd_diff_iterate2),
        _rados: rados,
        _rbd: rbd,
    })
}

/// A negative errno from librados/librbd, with the function that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallError {
    pub function: &'static str,
    /// Positive errno.
    pub errno: i32,
}

impl CallError {
    pub fn io(&self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.function, self.io())
    }
}

fn check(function: &'static str, ret: c_int) -> Result<c_int, CallError> {
    if ret < 0 {
        Err(CallError {
            function,
            errno: -ret,
        })
    } else {
        Ok(ret)
    }
}

fn cstring(text: &str) -> CString {
    // Specs and config values come from text without NULs (the parser refuses them).
    CString::new(text).unwrap_or_else(|_| CString::new(text.replace('\0', "")).unwrap())
}

/// librbd's version (`rbd_version`): (major, minor, extra); 1.16 for Ceph 16.
pub fn rbd_version() -> Result<(i32, i32, i32), String> {
    let api = api()?;
    let (mut major, mut minor, mut extra) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    unsafe { (api.rbd_version)(&mut major, &mut minor, &mut extra) };
    Ok((major, minor, extra))
}

/// A cluster connection (`rados_t`), shut down when dropped.
pub struct Rados {
    api: &'static Api,
    handle: RadosT,
}

// SAFETY: librados cluster handles are thread-safe (librados.h: "thread-safe").
unsafe impl Send for Rados {}
// SAFETY: as above.
unsafe impl Sync for Rados {}

impl Rados {
    /// `rados_create` for client `id` (without the "client." prefix).
    pub fn create(id: &str) -> Result<Rados, String> {
        let api = api()?;
        let id = cstring(id);
        let mut handle = ptr::null_mut();
        // SAFETY: a valid out-pointer and a NUL-terminated id.
        check("rados_create", unsafe {
            (api.rados_create)(&mut handle, id.as_ptr())
        })
        .map_err(|e| e.to_string())?;
        Ok(Rados { api, handle })
    }

    /// `rados_conf_read_file`; `None` searches Ceph's default places ($CEPH_CONF,
    /// /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
    pub fn read_conf(&self, path: Option<&str>) -> Result<(), CallError> {
        let path = path.map(cstring);
        let ptr = path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        // SAFETY: a live handle, not yet connected; NULL or a NUL-terminated path.
        check("rados_conf_read_file", unsafe {
            (self.api.rados_conf_read_file)(self.handle, ptr)
        })
        .map(|_| ())
    }

    /// `rados_conf_parse_env` with the default variable (CEPH_ARGS).
    pub fn parse_env(&self) -> Result<(), CallError> {
        // SAFETY: a live handle; NULL selects CEPH_ARGS.
        check("rados_conf_parse_env", unsafe {
            (self.api.rados_conf_parse_env)(self.handle, ptr::null())
        })
        .map(|_| ())
    }

    /// `rados_conf_set`.
    pub fn set(&self, option: &str, value: &str) -> Result<(), CallError> {
        let (option, value) = (cstring(option), cstring(value));
        // SAFETY: a live handle and two NUL-terminated strings.
        check("rados_conf_set", unsafe {
            (self.api.rados_conf_set)(self.handle, option.as_ptr(), value.as_ptr())
        })
        .map(|_| ())
    }

    /// `rados_connect`.
    pub fn connect(&self) -> Result<(), CallError> {
        // SAFETY: a live, configured handle.
        check("rados_connect", unsafe {
            (self.api.rados_connect)(self.handle)
        })
        .map(|_| ())
    }

    /// `rados_ioctx_create` for `pool`, then `rados_ioctx_set_namespace`.
    pub fn ioctx(self: &Arc<Self>, pool: &str, namespace: &str) -> Result<Ioctx, CallError> {
        let pool = cstring(pool);
        let mut handle = ptr::null_mut();
        // SAFETY: a connected handle, a NUL-terminated pool name, a valid out-pointer.
        check("rados_ioctx_create", unsafe {
            (self.api.rados_ioctx_create)(self.handle, pool.as_ptr(), &mut handle)
        })?;
        let namespace = cstring(namespace);
        // SAFETY: the I/O context just created; a NUL-terminated namespace ("" is
        // the default namespace).
        unsafe { (self.api.rados_ioctx_set_namespace)(handle, namespace.as_ptr()) };
        Ok(Ioctx {
            api: self.api,
            handle,
            _cluster: self.clone(),
        })
    }
}

impl Drop for Rados {
    fn drop(&mut self) {
        // SAFETY: the handle is live; every I/O context of it is gone (they hold an
        // Arc of the cluster). rados_shutdown also frees a handle that never
        // connected.
        unsafe { (self.api.rados_shutdown)(self.handle) };
    }
}

/// A pool I/O context (`rados_ioctx_t`), destroyed when dropped.
pub struct Ioctx {
    api: &'static Api,
    handle: IoctxT,
    /// The cluster outlives every I/O context of it.
    _cluster: Arc<Rados>,
}

// SAFETY: librados I/O contexts are thread-safe; we only pass this one to rbd_open.
unsafe impl Send for Ioctx {}
// SAFETY: as above.
unsafe impl Sync for Ioctx {}

impl Drop for Ioctx {
    fn drop(&mut self) {
        // SAFETY: a live I/O context; every image opened with it is closed (images
        // hold an Arc of their I/O context).
        unsafe { (self.api.rados_ioctx_destroy)(self.handle) };
    }
}

/// Basic facts from `rbd_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub size: u64,
    pub object_size: u64,
    pub objects: u64,
    pub order: i32,
}

/// A snapshot from `rbd_snap_list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub id: u64,
    pub size: u64,
    pub name: String,
}

/// What an asynchronous request does; reads and writes use the request's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AioKind {
    Read { offset: u64 },
    Write { offset: u64 },
    Flush,
    Discard { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64 },
}

impl AioKind {
    /// The librbd function that runs it, for messages.
    pub fn function(self) -> &'static str {
        match self {
            AioKind::Read { .. } => "rbd_aio_read",
            AioKind::Write { .. } => "rbd_aio_write",
            AioKind::Flush => "rbd_aio_flush",
            AioKind::Discard { .. } => "rbd_aio_discard",
            AioKind::WriteZeroes { .. } => "rbd_aio_write_zeroes",
        }
    }
}

/// An asynchronous request: what to do, the buffer it reads into or writes from
/// (owned, so it stays valid while librbd uses it), and the submitter's state.
pub struct AioRequest<T> {
    pub kind: AioKind,
    pub buf: Option<IoBuf>,
    pub state: T,
}

/// An open image (`rbd_image_t`), closed when dropped.
/// `T` is the state submitters attach to their [`AioRequest`]s.
pub struct Image<T> {
    api: &'static Api,
    handle: ImageT,
    /// Whether the handle is still open: [`close`](Image::close) may end it while
    /// others hold the image, so every call takes this shared and finds out.
    open: RwLock<bool>,
    /// The pool (and through it the cluster) outlives the image.
    _ioctx: Arc<Ioctx>,
    _requests: PhantomData<fn(T) -> T>,
}

// SAFETY: librbd image handles may be used from several threads at once for
// asynchronous I/O (qemu and SPDK submit from one thread and complete on another);
// requests in flight are owned by librbd, and their state T is Send.
unsafe impl<T: Send> Send for Image<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Image<T> {}

impl<T: Send> Image<T> {
    /// `rbd_open` (or `rbd_open_read_only`) of `name` at `snapshot` (None: the head).
    pub fn open(
        ioctx: &Arc<Ioctx>,
        name: &str,
        snapshot: Option<&str>,
        read_only: bool,
    ) -> Result<Image<T>, CallError> {
        let api = ioctx.api;
        let name = cstring(name);
        let snapshot = snapshot.map(cstring);
        let snap_ptr = snapshot.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let mut handle = ptr::null_mut();
        let (function, open) = if read_only {
            ("rbd_open_read_only", api.rbd_open_read_only)
        } else {
            ("rbd_open", api.rbd_open)
        };
        // SAFETY: a live I/O context, NUL-terminated name, NULL or NUL-terminated
        // snapshot name, a valid out-pointer.
        check(function, unsafe {
            open(ioctx.handle, name.as_ptr(), &mut handle, snap_ptr)
        })?;
        Ok(Image {
            api,
            handle,
            open: RwLock::new(true),
            _ioctx: ioctx.clone(),
            _requests: PhantomData,
        })
    }

    /// The handle for one call of `function`, held open for the call; an error
    /// once the image was closed.
    fn live(&self, function: &'static str) -> Result<RwLockReadGuard<'_, bool>, CallError> {
        let open = self.open.read().unwrap_or_else(|e| e.into_inner());
        if *open {
            Ok(open)
        } else {
            Err(CallError {
                function,
                errno: libc::ESHUTDOWN,
            })
        }
    }

    /// `rbd_close` now, while others may still hold the image: it waits for the
    /// requests librbd has in flight, gives back the exclusive lock and the watch,
    /// and every later call fails with ESHUTDOWN. Requests finished but not yet
    /// polled are not handed back.
    pub fn close(&self) {
        let mut open = self.open.write().unwrap_or_else(|e| e.into_inner());
        if std::mem::replace(&mut *open, false) {
            // SAFETY: a live image, and no call on it runs (we hold the gate).
            unsafe { (self.api.rbd_close)(self.handle) };
        }
    }

    /// `rbd_stat`.
    pub fn stat(&self) -> Result<Stat, CallError> {
        let _open = self.live("rbd_stat")?;
        let mut info = std::mem::MaybeUninit::<RbdImageInfo>::zeroed();
        // SAFETY: a live image and a buffer of the size we pass.
        check("rbd_stat", unsafe {
            (self.api.rbd_stat)(
                self.handle,
                info.as_mut_ptr(),
                std::mem::size_of::<RbdImageInfo>(),
            )
        })?;
        // SAFETY: rbd_stat filled it (and it was zeroed, a valid bit pattern).
        let info = unsafe { info.assume_init() };
        Ok(Stat {
            size: info.size,
            object_size: info.obj_size,
            objects: info.num_objs,
            order: info.order,
        })
    }

    /// `rbd_get_features`: the RBD_FEATURE_* bits.
    pub fn features(&self) -> Result<u64, CallError> {
        let _open = self.live("rbd_get_features")?;
        let mut features = 0;
        // SAFETY: a live image and a valid out-pointer.
        check("rbd_get_features", unsafe {
            (self.api.rbd_get_features)(self.handle, &mut features)
        })?;
        Ok(features)
    }

    /// `rbd_snap_list`, growing the array while librbd asks for more (-ERANGE).
    pub fn snapshots(&self) -> Result<Vec<Snapshot>, CallError> {
        let _open = self.live("rbd_snap_list")?;
        let mut capacity: c_int = 16;
        loop {
            let mut snaps: Vec<RbdSnapInfo> = (0..capacity)
                .map(|_| RbdSnapInfo {
                    id: 0,
                    size: 0,
                    name: ptr::null(),
                })
                .collect();
            let mut max = capacity;
            // SAFETY: a live image; an array of `max` entries and its length.
            let ret =
                unsafe { (self.api.rbd_snap_list)(self.handle, snaps.as_mut_ptr(), &mut max) };
            if ret == -libc::ERANGE {
                capacity = max.max(capacity * 2);
                continue;
            }
            let count = check("rbd_snap_list", ret)? as usize;
            let list = snaps[..count]
                .iter()
                .map(|s| Snapshot {
                    id: s.id,
                    size: s.size,
                    // SAFETY: librbd filled `count` entries with NUL-terminated names,
                    // valid until rbd_snap_list_end.
                    name: unsafe { CStr::from_ptr(s.name) }
                        .to_string_lossy()
                        .into_owned(),
                })
                .collect();
            // SAFETY: frees the names librbd allocated into this array.
            unsafe { (self.api.rbd_snap_list_end)(snaps.as_mut_ptr()) };
            return Ok(list);
        }
    }

    /// `rbd_lock_acquire` in exclusive mode: librbd then keeps the lock instead of
    /// handing it to another client that asks.
    pub fn lock_exclusive(&self) -> Result<(), CallError> {
        let _open = self.live("rbd_lock_acquire")?;
        // SAFETY: a live image.
        check("rbd_lock_acquire", unsafe {
            (self.api.rbd_lock_acquire)(self.handle, RBD_LOCK_MODE_EXCLUSIVE)
        })
        .map(|_| ())
    }

    /// `rbd_set_image_notification` with an eventfd: librbd then queues finished
    /// completions for [`poll`](Self::poll) and bumps the eventfd.
    pub fn notify_eventfd(&self, fd: i32) -> Result<(), CallError> {
        let _open = self.live("rbd_set_image_notification")?;
        // SAFETY: a live image and an open eventfd that outlives the image.
        check("rbd_set_image_notification", unsafe {
            (self.api.rbd_set_image_notification)(self.handle, fd, EVENT_TYPE_EVENTFD)
        })
        .map(|_| ())
    }

    /// Starts `request`; it comes back from [`poll`](Self::poll) with its result.
    /// When librbd refuses it at once, it comes back here with the error.
    pub fn submit(
        &self,
        mut request: Box<AioRequest<T>>,
    ) -> Result<(), (CallError, Box<AioRequest<T>>)> {
        let _open = match self.live(request.kind.function()) {
            Ok(open) => open,
            Err(error) => return Err((error, request)),
        };
        let (ptr, len) = match request.buf.as_mut() {
            Some(buf) => (buf.as_mut_ptr(), buf.len()),
            None => (ptr::null_mut(), 0),
        };
        let kind = request.kind;
        let needs_buffer = matches!(kind, AioKind::Read { .. } | AioKind::Write { .. });
        if needs_buffer && ptr.is_null() {
            let error = CallError {
                function: kind.function(),
                errno: libc::EINVAL,
            };
            return Err((error, request));
        }
        let arg = Box::into_raw(request);
        let mut c = ptr::null_mut();
        // SAFETY: no callback (completions are collected with rbd_poll_io_events);
        // `arg` is opaque to librbd.
        let created = unsafe { (self.api.rbd_aio_create_completion)(arg.cast(), None, &mut c) };
        let h = self.handle;
        let ret = if created < 0 {
            created
        } else {
            // SAFETY: a live image and a fresh completion. The buffer belongs to
            // the request, which stays leaked (and its heap buffer in place) until
            // poll() takes it back after librbd finished with it.
            unsafe {
                match kind {
                    AioKind::Read { offset } => {
                        (self.api.rbd_aio_read)(h, offset, len, ptr.cast(), c)
                    }
                    AioKind::Write { offset } => {
                        (self.api.rbd_aio_write)(h, offset, len, ptr.cast_const().cast(), c)
                    }
                    AioKind::Flush => (self.api.rbd_aio_flush)(h, c),
                    AioKind::Discard { offset, len } => {
                        (self.api.rbd_aio_discard)(h, offset, len, c)
                    }
                    AioKind::WriteZeroes { offset, len } => {
                        (self.api.rbd_aio_write_zeroes)(h, offset, len as usize, c, 0, 0)
                    }
                }
            }
        };
        if ret < 0 {
            if created >= 0 {
                // SAFETY: librbd refused the request, so the completion is ours.
                unsafe { (self.api.rbd_aio_release)(c) };
            }
            // SAFETY: `arg` came from Box::into_raw above and librbd did not keep it.
            let request = unsafe { Box::from_raw(arg) };
            let function = if created < 0 {
                "rbd_aio_create_completion"
            } else {
                kind.function()
            };
            return Err((
                CallError {
                    function,
                    errno: -ret,
                },
                request,
            ));
        }
        Ok(())
    }

    /// Takes back finished requests (`rbd_poll_io_events`) with their results
    /// (the operation's return value: a negative errno on failure).
    pub fn poll(&self, out: &mut Vec<(Box<AioRequest<T>>, isize)>) -> usize {
        const BATCH: usize = 64;
        let Ok(_open) = self.live("rbd_poll_io_events") else {
            return 0;
        };
        let mut total = 0;
        loop {
            let mut completions: [CompletionT; BATCH] = [ptr::null_mut(); BATCH];
            // SAFETY: a live image and an array of BATCH completion slots.
            let n = unsafe {
                (self.api.rbd_poll_io_events)(self.handle, completions.as_mut_ptr(), BATCH as c_int)
            };
            if n <= 0 {
                return total;
            }
            for &c in &completions[..n as usize] {
                // SAFETY: a finished completion librbd handed us; we release it
                // exactly once, after reading its result and argument.
                let (arg, ret) = unsafe {
                    let ret = (self.api.rbd_aio_get_return_value)(c);
                    let arg = (self.api.rbd_aio_get_arg)(c);
                    (self.api.rbd_aio_release)(c);
                    (arg, ret)
                };
                if !arg.is_null() {
                    // SAFETY: every completion of this image was created by submit()
                    // with an `arg` from Box::into_raw of an AioRequest<T>, and
                    // librbd hands each completion back once.
                    out.push((unsafe { Box::from_raw(arg.cast::<AioRequest<T>>()) }, ret));
                }
            }
            total += n as usize;
            if (n as usize) < BATCH {
                return total;
            }
        }
    }

    /// The allocated extents of `offset..offset+len` (`rbd_diff_iterate2` from the
    /// image's creation, whole objects, parent included): (offset, len) pairs in
    /// the order librbd reports them.
    pub fn allocated(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, CallError> {
        let _open = self.live("rbd_diff_iterate2")?;
        unsafe extern "C" fn collect(
            offset: u64,
            len: usize,
            exists: c_int,
            arg: *mut c_void,
        ) -> c_int {
            // SAFETY: `arg` is the &mut Vec passed below, alive for the call.
            let out = unsafe { &mut *arg.cast::<Vec<(u64, u64)>>() };
            if exists != 0 {
                out.push((offset, len as u64));
            }
            0
        }
        let mut out: Vec<(u64, u64)> = Vec::new();
        // SAFETY: a live image; NULL from-snapshot (since creation); the callback
        // only touches `out`, which outlives this synchronous call.
        check("rbd_diff_iterate2", unsafe {
            (self.api.rbd_diff_iterate2)(
                self.handle,
                ptr::null(),
                offset,
                len,
                1,
                1,
                collect,
                (&mut out as *mut Vec<(u64, u64)>).cast(),
            )
        })?;
        Ok(out)
    }
}

impl<T> Drop for Image<T> {
    fn drop(&mut self) {
        let open = self.open.get_mut().unwrap_or_else(|e| e.into_inner());
        if *open {
            // SAFETY: a live image; rbd_close waits for its operations in flight.
            unsafe { (self.api.rbd_close)(self.handle) };
        }
    }
}

/// An eventfd that librbd bumps when requests finish, and that we bump to wake the
/// poller for shutdown. Closed when dropped.
pub struct EventFd(i32);

impl EventFd {
    pub fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd(2) with valid flags; we own the returned descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(EventFd(fd))
    }

    pub fn raw(&self) -> i32 {
        self.0
    }

    /// Waits until the counter is non-zero or `timeout_ms` passes, then resets it.
    pub fn wait(&self, timeout_ms: i32) {
        let mut pollfd = libc::pollfd {
            fd: self.0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pollfd, 1, timeout_ms) };
        let mut value = 0u64;
        // SAFETY: reads 8 bytes into a u64 from our non-blocking eventfd (EAGAIN
        // when it is zero is fine).
        unsafe { libc::read(self.0, (&mut value as *mut u64).cast(), 8) };
    }

    /// Adds one to the counter, waking [`wait`](Self::wait).
    pub fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a u64 to our eventfd.
        unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor and close it once.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_library_names_the_package_in_one_line() {
        let error = super::open_library("libblockwire-absent.so.1", "librbd1")
            .expect_err("an absent library loaded");
        assert!(
            error.starts_with(
                "cannot load libblockwire-absent.so.1 (install the Debian package librbd1)"
            ),
            "{error}"
        );
        assert!(!error.contains('\n'), "{error}");
    }
}
