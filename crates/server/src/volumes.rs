//! The `[[volume]]` tables of a config file, opened once each: exports that name
//! the same volume share one device (and one set of member connections).

use std::collections::HashMap;

use anyhow::{anyhow, Context, Result};
use blockwire_blockdev::size::parse_size;
use blockwire_blockdev::Device;

use crate::config::{ExportSection, VolumeSection};
use crate::device_spec::StripeSpec;
use crate::factory::Remote;

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

    /// Whether the volume `name` is opened read-only: no export writes to it.
    fn read_only(&self, name: &str) -> bool {
        !self.written.contains(&name)
    }

    /// Serves `device`, opened by an earlier configuration with `read_only`, as the
    /// volume `name` instead of opening its members again (a reload keeps member
    /// connections), unless the access it needs now differs.
    pub fn keep(&mut self, name: &str, device: Device, read_only: bool) {
        if self.read_only(name) == read_only {
            self.opened.insert(name.to_string(), device);
        }
    }

    /// Every volume opened (or kept) so far, and whether it is read-only.
    pub fn opened(&self) -> HashMap<String, (Device, bool)> {
        self.opened
            .iter()
            .map(|(name, device)| (name.clone(), (device.clone(), self.read_only(name))))
            .collect()
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
        let device = open_section(section, self.read_only(name))
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

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::MemoryDevice;

    fn config() -> crate::config::Config {
        toml::from_str(
            "[[volume]]\nname = \"v\"\nchunk = \"64K\"\n\
             members = [\"/nonexistent/a\", \"/nonexistent/b\"]\n\
             [[export]]\nname = \"s\"\nvolume = \"v\"\n",
        )
        .unwrap()
    }

    #[test]
    fn a_kept_volume_is_not_opened_again_unless_its_access_changed() {
        let config = config();
        let kept = Device::from_device(MemoryDevice::new(1 << 20));
        let mut volumes = Volumes::new(&config.volumes, &config.exports);
        // Export "s" writes to it: it is not read-only.
        volumes.keep("v", kept.clone(), false);
        assert_eq!(volumes.open("v").unwrap().size(), 1 << 20);
        assert!(!volumes.opened()["v"].1);

        let mut volumes = Volumes::new(&config.volumes, &config.exports);
        volumes.keep("v", kept, true);
        // Opened for writing now: its members are opened, and they do not exist.
        assert!(volumes.open("v").is_err());
    }
}
