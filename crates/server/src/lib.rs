//! blockwire's control plane as a library (issue 32): what `blockwire serve`,
//! `check-config`, `bench`, `copy` and `info` share, with the binary (`crates/cli`)
//! left to parse arguments and print.
//!
//! Modules depend one way only, each on those listed before it:
//!
//! - [`defaults`]: listen addresses, target names and secret sources used where
//!   nothing is configured;
//! - [`config`], [`config_error`]: the TOML model of `serve --config FILE` and its
//!   errors, located at their line; [`throttle`]: the disk-like rate and latency
//!   limits an export may carry;
//! - [`device_spec`]: a device description (path, URI, `rbd:`, `stripe:`) parsed,
//!   not opened;
//! - [`config_validate`]: the one validation, for `check-config`, `serve` and reload;
//! - [`created_files`], [`factory`], [`volumes`]: the device factory, the one place
//!   where a description becomes a device (and the `[[volume]]` tables opened once
//!   each).
//!
//! The bench (`blockwire-bench`) stays below this crate: it measures any `Device`
//! it is handed and opens only paths itself, so the CLI opens remote targets
//! through [`factory::open`] and passes the device in
//! (`blockwire_bench::RunRequest::remote_device`). That keeps one factory without a
//! dependency from the bench up to the control plane.

pub mod config;
pub mod config_error;
pub mod config_validate;
pub mod created_files;
pub mod defaults;
pub mod device_spec;
pub mod factory;
pub mod throttle;
pub mod volumes;
