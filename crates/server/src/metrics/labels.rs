//! The label sets of blockwire's metrics and the label values of its enums.

use blockwire_blockdev::{ErrorKind, Op};
use prometheus_client::encoding::EncodeLabelSet;

/// The protocol an export is served over (the `protocol` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Nbd,
    Aoe,
    Iscsi,
    Nvme,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Nbd => "nbd",
            Protocol::Aoe => "aoe",
            Protocol::Iscsi => "iscsi",
            Protocol::Nvme => "nvme",
        }
    }
}

/// The `operation` label of a device operation.
pub fn operation_label(op: Op) -> &'static str {
    match op {
        Op::Open => "open",
        Op::Read => "read",
        Op::Write => "write",
        Op::Flush => "flush",
        Op::Trim => "trim",
        Op::WriteZeroes => "write_zeroes",
        Op::Extents => "block_status",
        Op::Cache => "cache",
    }
}

/// The `kind` label of an error: the neutral kind, in snake case.
pub fn error_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::OutOfRange => "out_of_range",
        ErrorKind::Misaligned => "misaligned",
        ErrorKind::TooLarge => "too_large",
        ErrorKind::ReadOnly => "read_only",
        ErrorKind::Unsupported => "unsupported",
        ErrorKind::NoSpace => "no_space",
        ErrorKind::InvalidArgument => "invalid_argument",
        ErrorKind::Io => "io",
        ErrorKind::NoMemory => "no_memory",
        ErrorKind::TimedOut => "timed_out",
        ErrorKind::Disconnected => "disconnected",
        ErrorKind::ShuttingDown => "shutting_down",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExportLabels {
    pub export: String,
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub export: String,
    pub protocol: &'static str,
    pub operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub export: String,
    pub protocol: &'static str,
    pub kind: &'static str,
}

/// A refused connection has no export yet: only the protocol and the limit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub protocol: &'static str,
    pub limit: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
}
