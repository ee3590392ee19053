//! Exports: named devices a server offers.

use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Removed from the server by a reload: its connections get NBD_ESHUTDOWN.
    retired: AtomicBool,
}

impl Export {
    pub fn new(name: impl Into<String>, description: impl Into<String>, device: Device) -> Export {
        Export {
            name: name.into(),
            description: description.into(),
            device,
            retired: AtomicBool::new(false),
        }
    }

    /// Marks the export as no longer served: every request its connections send from
    /// now on is answered NBD_ESHUTDOWN, which asks the client to disconnect.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    /// Whether [`retire`](Self::retire) was called.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
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
        self.add_shared(Arc::new(export))
    }

    /// Adds an export another set holds too: a reload keeps an unchanged export
    /// (the same `Arc`) so its connections never notice.
    pub fn add_shared(&mut self, export: Arc<Export>) -> Result<(), String> {
        if self.exports.iter().any(|e| e.name == export.name) {
            return Err(format!("export name '{}' is used twice", export.name));
        }
        if self.default.is_none() {
            self.default = Some(self.exports.len());
        }
        self.exports.push(export);
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
