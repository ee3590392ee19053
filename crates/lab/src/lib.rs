//! The lab: the seeds' test beds rebuilt on one host. A target namespace and an
//! initiator namespace joined by N veth channels (each with its MTU, an optional tc
//! rate limit and its own subnet), our targets on one side and our initiators on
//! the other, and the protocol × MTU × rate × channels × workload matrix measured
//! on it, with the network baseline, both sides' CPU and the efficiency against the
//! theoretical maximum, reported beside the seeds' published tables.
//!
//! The pure parts — [`matrix`] expansion, [`preset`]s, the seeds' [`published`]
//! figures, [`results`] and their efficiency math, the [`target`] configuration and
//! URIs, and the [`report`] renderers — need no privileges and are unit-tested. The
//! bed ([`bed`] on [`netns`]: namespaces, veth, tc), the processes and the teardown
//! ([`cleanup`]) are a thin layer over `ip`, `tc` and the `blockwire` binary
//! ([`run`]); they need root (CAP_NET_ADMIN).

pub mod bed;
pub mod cleanup;
pub mod fs_bonnie;
pub mod matrix;
pub mod netns;
pub mod nfs_server;
pub mod preset;
pub mod published;
pub mod report;
pub mod results;
pub mod run;
pub mod target;

pub use matrix::{BedSpec, CellSpec, Disk, LabWorkload, Layouts, Matrix, Protocol, Rate};
pub use published::Seed;
pub use results::{CellResult, LabReport, NetworkBaseline};
pub use run::{run, Error, Event, LabOptions};
pub use target::Backing;
