//! A file on an NFS server as a blockwire device: libnfs loaded at run time.
//!
//! `nfs://SERVER[:PORT]/EXPORT/FILE[?version=3|4&connections=N]` ([`NfsUrl`]) opens
//! as an [`NfsFile`]: a [`BlockDevice`](blockwire_blockdev::BlockDevice) whose size
//! is the file's, flush an NFS COMMIT. NFS serves files, not block devices: there
//! is no trim, no allocation map and no device of fixed size behind it, only what
//! a file on the server allows (read, write, commit, truncate at open).
//!
//! libnfs is loaded with `dlopen` ([`ffi`](crate::ffi), the crate's only `unsafe`),
//! so the build needs no libnfs headers and the binary runs without libnfs; then
//! `nfs://` fails in one line naming the package. Its synchronous API is used from
//! a pool of contexts, one request per context at a time.

mod device;
mod errors;
mod ffi;
mod url;

pub use device::{NfsFile, NfsOptions, BLOCK_SIZE, DEFAULT_TIMEOUT};
pub use errors::{kind_of, OpenError, Stage};
pub use ffi::{check_loadable, library_name, LIBRARIES};
pub use url::{NfsUrl, DEFAULT_CONNECTIONS, MAX_CONNECTIONS};

/// The scheme of the URLs this crate opens.
pub const SCHEME: &str = "nfs";
