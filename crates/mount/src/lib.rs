//! `blockwire mount`: any device blockwire can open, exposed as one file through FUSE.
