//! SCSI semantics on a block device (being written).
