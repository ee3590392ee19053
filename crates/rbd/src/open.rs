//! Connecting to a cluster and opening an image as a spec says: configuration,
//! user, keyring and our timeouts set before connecting (Ceph's own defaults wait
//! forever), then the pool, the namespace, the image and, if asked, its lock.

use std::sync::Arc;

use crate::errors::{OpenError, Stage};
use crate::ffi::{self, Image, Rados};
use crate::spec::RbdSpec;

/// Connects to the cluster `spec` names and opens its image (read-only for a
/// snapshot or when `read_only`).
pub fn open_image<T: Send>(spec: &RbdSpec, read_only: bool) -> Result<Image<T>, OpenError> {
    let name = spec.to_string();
    ffi::check_loadable().map_err(|e| OpenError::new(&name, e))?;
    let rados = Rados::create(&spec.id).map_err(|e| OpenError::new(&name, e))?;
    match rados.read_conf(spec.conf.as_deref()) {
        Ok(()) => {}
        // Without conf=, no file found is fine when CEPH_ARGS says everything.
        Err(e) if spec.conf.is_none() && e.errno == libc::ENOENT => {}
        Err(e) => {
            let subject = spec.conf.as_deref().unwrap_or("(Ceph's default search)");
            return Err(OpenError::from_call(&name, Stage::Config, e, subject));
        }
    }
    rados
        .parse_env()
        .map_err(|e| OpenError::from_call(&name, Stage::Config, e, "CEPH_ARGS"))?;
    if let Some(keyring) = &spec.keyring {
        rados
            .set("keyring", keyring)
            .map_err(|e| OpenError::from_call(&name, Stage::Config, e, "keyring"))?;
    }
    // No librbd cache, as qemu with cache=none: after the first flush its default
    // write-around policy answers writes before they reach an OSD and hands a failed
    // one's error to whichever flush finishes next, librbd's own internal ones
    // included, so a FUA write could succeed with the OSD gone (docs/ceph.md). Our
    // clients cache themselves and flush when they mean it.
    rados
        .set("rbd_cache", "false")
        .map_err(|e| OpenError::from_call(&name, Stage::Config, e, "rbd_cache"))?;
    if let Some(timeout) = spec.timeout {
        // Whole seconds: Ceph 16 parses these options as integers.
        let secs = timeout.as_secs_f64().ceil().max(1.0).to_string();
        for option in [
            "rados_osd_op_timeout",
            "rados_mon_op_timeout",
            "client_mount_timeout",
        ] {
            rados
                .set(option, &secs)
                .map_err(|e| OpenError::from_call(&name, Stage::Config, e, option))?;
        }
    }
    rados
        .connect()
        .map_err(|e| OpenError::from_call(&name, Stage::Connect, e, "the cluster"))?;
    let rados = Arc::new(rados);
    let ioctx = rados
        .ioctx(&spec.pool, &spec.namespace)
        .map_err(|e| OpenError::from_call(&name, Stage::Pool, e, &spec.pool))?;
    let ioctx = Arc::new(ioctx);
    let read_only = read_only || spec.snapshot.is_some();
    let image = Image::open(&ioctx, &spec.image, spec.snapshot.as_deref(), read_only)
        .map_err(|e| OpenError::from_call(&name, Stage::Image, e, &spec.name()))?;
    if spec.exclusive && !read_only {
        image
            .lock_exclusive()
            .map_err(|e| OpenError::from_call(&name, Stage::Lock, e, &spec.name()))?;
    }
    Ok(image)
}
