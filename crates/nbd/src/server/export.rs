//! Exports: named devices a server offers.

use std::sync::Arc;

use blockwire_blockdev::Device;

/// One exported device.
#[derive(Debug)]
pub struct Export {
    /// The name clients ask for (may be empty).
    pub name: String,
    /// Free text shown by `nbdinfo --list` and NBD_INFO_DESCRIPTION.
    pub description: String,
    /// The device, already read-only if the export is.
    pub device: Device,
}

impl Export {
    pub fn new(name: impl Into<String>, description: impl Into<String>, device: Device) -> Export {
        Export {
            name: name.into(),
            description: description.into(),
            device,
        }
    }
}

/// The exports of a server, and which one the empty name selects.
#[derive(Debug, Default)]
pub struct ExportSet {
    exports: Vec<Arc<Export>>,
    default: Option<usize>,
}

impl ExportSet {
    pub fn new() -> ExportSet {
        ExportSet::default()
    }

    /// Adds an export; names must be unique. The first export added becomes the
    /// default unless [`set_default`](Self::set_default) says otherwise.
    pub fn add(&mut self, export: Export) -> Result<(), String> {
        if self.exports.iter().any(|e| e.name == export.name) {
            return Err(format!("export name '{}' is used twice", export.name));
        }
        if self.default.is_none() {
            self.default = Some(self.exports.len());
        }
        self.exports.push(Arc::new(export));
        Ok(())
    }

    /// Makes the export called `name` the default.
    pub fn set_default(&mut self, name: &str) -> Result<(), String> {
        let index = self
            .exports
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| format!("default export '{name}' does not exist"))?;
        self.default = Some(index);
        Ok(())
    }

    /// The export a client's name selects: an exact match, else the default for "".
    pub fn find(&self, name: &str) -> Option<&Arc<Export>> {
        self.exports.iter().find(|e| e.name == name).or_else(|| {
            name.is_empty()
                .then(|| self.default.map(|i| &self.exports[i]))
                .flatten()
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.exports.iter()
    }

    pub fn default_export(&self) -> Option<&Arc<Export>> {
        self.default.map(|i| &self.exports[i])
    }

    pub fn is_empty(&self) -> bool {
        self.exports.is_empty()
    }
}
