//! A file on an NFS server as a device: libnfs loaded at run time.
