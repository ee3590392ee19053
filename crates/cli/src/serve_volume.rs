//! The `[[volume]]` tables of a config file, opened once each: exports that name
//! the same volume share one device (and one set of member connections).

use std::collections::HashMap;

use anyhow::{anyhow, Context, Result};
use blockwire_blockdev::size::parse_size;
use blockwire_blockdev::Device;

use crate::config::{ExportSection, VolumeSection};
use crate::open::Remote;
use crate::open_stripe::StripeSpec;

/// Volumes by name, opened on first use.
pub struct Volumes<'a> {
    sections: &'a [VolumeSection],
    /// Volumes some export writes to; the others are opened read-only.
    written: Vec<&'a str>,
    opened: HashMap<String, Device>,
}

impl<'a> Volumes<'a> {
    pub fn new(sections: &'a [VolumeSection], exports: &'a [ExportSection]) -> Volumes<'a> {
        let written = exports
            .iter()
            .filter(|e| !e.read_only)
            .filter_map(|e| e.volume.as_deref())
            .collect();
        Volumes {
            sections,
            written,
            opened: HashMap::new(),
        }
    }

    /// The volume called `name`, opening its members the first time.
    pub fn open(&mut self, name: &str) -> Result<Device> {
        if let Some(device) = self.opened.get(name) {
            return Ok(device.clone());
        }
        let section = self
            .sections
            .iter()
            .find(|v| v.name == name)
            .ok_or_else(|| anyhow!("no [[volume]] named '{name}'"))?;
        let device = open_section(section, !self.written.contains(&name))
            .with_context(|| format!("volume '{name}'"))?;
        tracing::info!(
            "volume '{name}': {} members, chunk {}, {} bytes",
            section.members.len(),
            section.chunk,
            device.size()
        );
        self.opened.insert(name.to_string(), device.clone());
        Ok(device)
    }
}

fn open_section(section: &VolumeSection, read_only: bool) -> Result<Device> {
    let chunk = parse_size(&section.chunk).map_err(|e| anyhow!("chunk: {e}"))?;
    let spec = StripeSpec::from_members(chunk, &section.members)?;
    spec.open(read_only, Remote::default())
}
