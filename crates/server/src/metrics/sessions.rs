//! The connection meter of one protocol's target.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use blockwire_blockdev::SessionMeter;

use super::labels::{ExportLabels, RefusalLabels};
use super::{Families, Protocol};

/// Counts a target's connections (NBD) or sessions (iSCSI) per export, and the
/// connections its limits refused.
pub struct ProtocolSessions {
    families: Arc<Families>,
    protocol: Protocol,
    /// The export behind each name the target reports, where they differ (an iSCSI
    /// target reports its IQN); a reload adds to it.
    exports: RwLock<HashMap<String, String>>,
}

impl std::fmt::Debug for ProtocolSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtocolSessions")
            .field("protocol", &self.protocol)
            .finish()
    }
}

impl ProtocolSessions {
    pub(super) fn new(
        families: Arc<Families>,
        protocol: Protocol,
        exports: HashMap<String, String>,
    ) -> ProtocolSessions {
        ProtocolSessions {
            families,
            protocol,
            exports: RwLock::new(exports),
        }
    }

    fn labels(&self, name: &str) -> ExportLabels {
        let exports = self.exports.read().unwrap_or_else(|e| e.into_inner());
        let export = exports.get(name).map_or(name, String::as_str);
        ExportLabels {
            export: export.to_string(),
            protocol: self.protocol.label(),
        }
    }

    /// [`serve_export`](Self::serve_export) for a target that reports itself as
    /// `reported` (an iSCSI target added by a reload: its IQN).
    pub fn serve_target(&self, reported: &str, export: &str) {
        self.exports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(reported.to_string(), export.to_string());
        self.serve_export(reported);
    }

    /// Shows the export's connection series at zero before any client comes, so a
    /// dashboard can tell "no clients" from "not served".
    pub fn serve_export(&self, export: &str) {
        let labels = self.labels(export);
        self.families.connections_open.get_or_create_owned(&labels);
        self.families
            .connections_accepted
            .get_or_create_owned(&labels);
    }
}

impl SessionMeter for ProtocolSessions {
    fn opened(&self, export: &str) {
        let labels = self.labels(export);
        self.families.connections_open.get_or_create(&labels).inc();
        self.families
            .connections_accepted
            .get_or_create(&labels)
            .inc();
    }

    fn closed(&self, export: &str) {
        self.families
            .connections_open
            .get_or_create(&self.labels(export))
            .dec();
    }

    fn refused(&self, limit: &str) {
        let labels = RefusalLabels {
            protocol: self.protocol.label(),
            limit: limit.to_string(),
        };
        self.families
            .connections_refused
            .get_or_create(&labels)
            .inc();
    }
}
