//! An export as a `[[export]]` table describes it: its device opened (or created)
//! through the factory, made read-only and throttled as the table asks. Every
//! protocol module serves the device made here.

use anyhow::{anyhow, bail, Context, Result};
use blockwire_blockdev::size::parse_size;
use blockwire_blockdev::write_behind::DEFAULT_WRITE_BEHIND;
use blockwire_blockdev::{Device, FileOptions, Throttle, ThrottleConfig};
use blockwire_nbd::Export;

use crate::config::ExportSection;
use crate::created_files::CreatedFiles;
use crate::device_spec::Target;
use crate::factory::{open_source, Remote, Source};
use crate::throttle;
use crate::volumes::Volumes;

/// Wraps an export's device in the throttle its settings ask for, saying so.
pub fn throttled(name: &str, device: Device, config: ThrottleConfig) -> Device {
    if config.is_active() {
        tracing::info!(
            "export '{name}': throttled to {}",
            throttle::describe(&config)
        );
    }
    Throttle::wrap(device, config)
}

/// The export a `[[export]]` table describes, its device opened (or created).
pub fn export_from_section(
    section: &ExportSection,
    volumes: &mut Volumes,
    created: &CreatedFiles,
) -> Result<Export> {
    let throttle = throttle::from_config(&section.name, section.disk_rate, section.disk_latency)?;
    let device = match (&section.path, &section.memory) {
        _ if section.volume.is_some() => {
            let name = section.volume.as_deref().unwrap_or_default();
            let device = volumes
                .open(name)
                .with_context(|| format!("export '{}'", section.name))?;
            if section.read_only {
                device.read_only()
            } else {
                device
            }
        }
        // A Ceph RBD image: `path = "rbd:POOL/IMAGE[@SNAP][:conf=...]"`, and its
        // options from an `rbd` table.
        _ if section.rbd_spec().is_some() => {
            let spec = section
                .rbd_spec()
                .expect("checked above")
                .map_err(|e| anyhow!(e))?;
            let source = Source::Remote(Box::new(Target::Rbd(spec)), Remote::default());
            open_source(&source, section.read_only, created)
                .with_context(|| format!("export '{}'", section.name))?
        }
        (Some(path), _) => {
            let size = section
                .size
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(|e| anyhow!(e))?;
            let write_behind = match section.write_behind.as_deref() {
                Some(text) => parse_size(text)
                    .map_err(|e| anyhow!("export '{}': write_behind: {e}", section.name))?,
                None => DEFAULT_WRITE_BEHIND,
            };
            let options = FileOptions {
                read_only: section.read_only,
                direct: section.direct,
                write_behind,
            };
            // A file, or (as check-config describes it) a remote device or a
            // striped volume served again.
            let source = Source::from_path(path, size, options)
                .with_context(|| format!("export '{}'", section.name))?;
            open_source(&source, section.read_only, created)
                .with_context(|| format!("export '{}'", section.name))?
        }
        (None, Some(memory)) => {
            let size = parse_size(memory).map_err(|e| anyhow!("export '{}': {e}", section.name))?;
            open_source(&Source::Memory(size), section.read_only, created)?
        }
        (None, None) => bail!("export '{}' has neither path nor memory", section.name),
    };
    let device = throttled(&section.name, device, throttle);
    Ok(Export::new(&section.name, &section.description, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> ExportSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn memory_exports_are_sized_and_read_only_as_asked() {
        let mut volumes = Volumes::new(&[], &[]);
        let created = CreatedFiles::default();
        let table = section("name = \"m\"\nmemory = \"2M\"\nread_only = true\n");
        let export = export_from_section(&table, &mut volumes, &created).unwrap();
        assert_eq!(export.name, "m");
        assert_eq!(export.device.size(), 2 << 20);
        assert!(export.device.info().read_only);
    }

    #[test]
    fn a_missing_file_is_named_with_its_export() {
        let mut volumes = Volumes::new(&[], &[]);
        let created = CreatedFiles::default();
        let table = section("name = \"f\"\npath = \"/nonexistent/f.img\"\n");
        let error = export_from_section(&table, &mut volumes, &created).unwrap_err();
        let text = format!("{error:#}");
        assert!(
            text.contains("export 'f'") && text.contains("/nonexistent/f.img"),
            "{text}"
        );
    }

    #[test]
    fn a_path_that_names_a_stripe_is_opened_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        std::fs::File::create(&a).unwrap().set_len(1 << 20).unwrap();
        std::fs::File::create(&b).unwrap().set_len(1 << 20).unwrap();
        let text = format!(
            "name = \"s\"\npath = \"stripe:64K:{},{}\"\nread_only = true\n",
            a.display(),
            b.display()
        );
        let mut volumes = Volumes::new(&[], &[]);
        let export =
            export_from_section(&section(&text), &mut volumes, &CreatedFiles::default()).unwrap();
        assert_eq!(export.device.size(), 2 << 20);
        assert!(export.device.info().read_only);
    }
}
