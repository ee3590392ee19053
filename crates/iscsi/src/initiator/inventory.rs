//! What a target holds, for `blockwire info iscsi://host[:port]`: its logical units
//! (REPORT LUNS) with their type, vendor strings (INQUIRY) and size (READ CAPACITY
//! (16), for disks), as `iscsi-ls -s` shows them.

use super::connect::{dial, login};
use super::connection::Connection;
use super::device::{credentials, fetch, fetch_from, IscsiOptions, DEFAULT_INITIATOR_NAME};
use super::error::InitiatorError;
use super::login::LoginOptions;
use super::scsi::{self, Inquiry};
use super::uri::IscsiUri;

/// One logical unit of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunSummary {
    pub lun: u64,
    pub inquiry: Inquiry,
    /// (blocks, block size) for a disk that answered READ CAPACITY (16).
    pub capacity: Option<(u64, u32)>,
}

/// Logs in to the target `uri` names and describes each of its logical units.
pub fn inventory(
    uri: &IscsiUri,
    options: &IscsiOptions,
) -> Result<Vec<LunSummary>, InitiatorError> {
    let address = uri.address();
    let target = uri.target.clone().ok_or_else(|| InitiatorError::Device {
        address: address.clone(),
        detail: "no target named".into(),
    })?;
    let stream = dial(&address, options.login_timeout)?;
    let login_options = LoginOptions {
        initiator_name: uri
            .initiator
            .clone()
            .unwrap_or_else(|| DEFAULT_INITIATOR_NAME.to_string()),
        target_name: Some(target.clone()),
        isid: 0x80 << 40 | u64::from(std::process::id() & 0xff_ffff) << 16 | 0xffff,
        tsih: 0,
        cid: 0,
        cmd_sn: 1,
        chap: credentials(uri)?,
        digests: uri.digest,
    };
    let params = login(&stream, &address, login_options, options.login_timeout)?;
    let connection = Connection::start(
        stream,
        params,
        0,
        format!("{target} at {address}"),
        None,
        super::device::timing(options),
    )
    .map_err(|source| InitiatorError::Io {
        address: address.clone(),
        source,
    })?;
    let failed = |what: &str, e: blockwire_blockdev::Error| InitiatorError::Device {
        address: address.clone(),
        detail: format!("{target}: {what}: {e}"),
    };
    let luns = fetch(&connection, &scsi::report_luns(4096), 4096)
        .map(|data| scsi::parse_report_luns(&data))
        .map_err(|e| failed("REPORT LUNS", e))?;
    let mut out = Vec::with_capacity(luns.len());
    for lun in luns {
        let Some(inquiry) = fetch_from(&connection, Some(lun), &scsi::inquiry(None, 96), 96)
            .ok()
            .and_then(|data| scsi::parse_inquiry(&data))
        else {
            continue;
        };
        let capacity = (inquiry.device_type == 0)
            .then(|| fetch_from(&connection, Some(lun), &scsi::read_capacity16(), 32).ok())
            .flatten()
            .and_then(|data| scsi::parse_capacity(&data))
            .map(|c| (c.blocks, c.block_size));
        out.push(LunSummary {
            lun,
            inquiry,
            capacity,
        });
    }
    Ok(out)
}
