//! blockwire's control plane as a library (issue 32): what `blockwire serve`,
//! `check-config`, `bench`, `copy` and `info` share, with the binary (`crates/cli`)
//! left to parse arguments and print.
//!
//! Modules depend one way only, each on those listed before it:
//!
//! 1. [`defaults`]: listen addresses, target names and secret sources used where
//!    nothing is configured;
//! 2. [`config`], [`config_error`]: the TOML model of `serve --config FILE` and its
//!    errors, located at their line; [`throttle`]: the disk-like rate and latency
//!    limits an export may carry;
//! 3. [`device_spec`]: a device description (path, URI, `rbd:`, `stripe:`) parsed,
//!    not opened;
//! 4. [`config_validate`]: the one validation, for `check-config`, `serve` and
//!    reload;
//! 5. [`created_files`], [`factory`], [`volumes`]: the device factory, the one place
//!    where a description becomes a device: [`factory::open`] for what a command
//!    names, [`factory::open_source`] for an export's file (created on request),
//!    memory or remote device, whether a config table or serve's flags describe
//!    it, and the `[[volume]]` tables, opened once each and shared;
//! 6. [`metrics`]: the Prometheus registry, its counters and the HTTP endpoint;
//! 7. orchestration: [`serve_export`] builds an export's device from its table; one
//!    module per protocol ([`serve_nbd`], [`serve_iscsi`], [`serve_aoe`],
//!    [`serve_nvme`], with [`serve_tls`] for NBD's TLS) plans, binds and announces
//!    that protocol's target; [`serve_plan`] gathers them into a [`serve_plan::Plan`],
//!    [`serve_metrics`] counts what a plan serves, [`netserve`] adds the bench's
//!    network test, [`serve_start`] binds it all or nothing;
//! 8. reload: [`reload_diff`] compares two configurations into a list of changes per
//!    export and protocol, with no I/O; [`reload_apply`] builds what the new
//!    configuration needs and hands it to the running targets (tested in-process
//!    with memory devices, no `blockwire` process);
//! 9. running: [`stop_signals`], [`service`] (systemd), [`serve_reload`] (SIGHUP),
//!    [`serve_status`] (SIGUSR1) and [`serve_run`], which announces and serves a
//!    start until it is told to stop.
//!
//! A new protocol is one more `serve_*` module beside [`serve_nbd`],
//! [`serve_iscsi`], [`serve_aoe`] and [`serve_nvme`] (NVMe/TCP, wired in this way),
//! holding everything about that protocol's target: its plan from a [`config::Config`] (`plan_from_file`, as
//! [`serve_iscsi::plan_from_file`]), its bind and its announcement. The rest only
//! wires it in: a field in [`serve_plan::Plan`] filled by
//! [`serve_plan::plan_from_config`], its bind in [`serve_start::start`] (with
//! [`serve_start::busy_hint`] naming its flag and key), its thread and shutdown in
//! [`serve_run::run`], its label in [`metrics::Protocol`] (which
//! [`reload_diff`] walks) and its reload handle in [`reload_apply::Live`]; its
//! keys in [`config`] and their checks in [`config_validate`].
//!
//! The bench (`blockwire-bench`) stays below this crate: it measures any `Device`
//! it is handed and opens only paths itself, so the CLI opens remote targets
//! through [`factory::open`] and passes the device in
//! (`blockwire_bench::RunRequest::remote_device`). That keeps one factory without a
//! dependency from the bench up to the control plane, and lets this crate use the
//! bench's network server for `serve --netserve`.

pub mod config;
pub mod config_error;
pub mod config_validate;
pub mod created_files;
pub mod defaults;
pub mod device_spec;
pub mod factory;
pub mod metrics;
pub mod netserve;
pub mod reload_apply;
pub mod reload_diff;
#[cfg(test)]
mod reload_tests;
pub mod serve_aoe;
pub mod serve_export;
pub mod serve_iscsi;
pub mod serve_metrics;
pub mod serve_nbd;
pub mod serve_nvme;
pub mod serve_plan;
pub mod serve_reload;
pub mod serve_run;
pub mod serve_start;
pub mod serve_status;
pub mod serve_tls;
pub mod service;
pub mod stop_signals;
pub mod throttle;
pub mod volumes;
