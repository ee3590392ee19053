//! Files a start created, removed again when the start fails: a refused start
//! leaves nothing behind.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The sparse files created so far by a start (or a reload) that has not finished.
#[derive(Debug, Default)]
pub struct CreatedFiles(Mutex<Vec<PathBuf>>);

impl CreatedFiles {
    /// Records a file this start created.
    pub fn add(&self, path: &Path) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path.to_path_buf());
    }

    /// The start failed: removes every file it created, saying so.
    pub fn remove_all(&self) {
        let files = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for path in files {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!("removed {} (created by this start)", path.display()),
                Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
            }
        }
    }

    /// The start succeeded: the files stay.
    pub fn keep(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_start_removes_only_what_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let (made, kept) = (dir.path().join("made"), dir.path().join("kept"));
        std::fs::write(&made, b"").unwrap();
        std::fs::write(&kept, b"").unwrap();
        let created = CreatedFiles::default();
        created.add(&made);
        created.remove_all();
        assert!(!made.exists() && kept.exists());
        std::fs::write(&made, b"").unwrap();
        created.add(&made);
        created.keep();
        created.remove_all();
        assert!(made.exists());
    }
}
