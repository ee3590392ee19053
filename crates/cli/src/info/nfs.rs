//! `blockwire info nfs://SERVER[:PORT]/EXPORT/FILE`: what a file on an NFS server
//! is as a device — size, block sizes, whether the server takes writes, which
//! operations it offers and which the handle emulates — and where it is (server,
//! export, NFS version). Opened as `copy` and `bench` open it, with one connection
//! and without creating anything: a missing file is an error.

use std::fmt::Write as _;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::{Capabilities, Device, DeviceInfo, Support};
use blockwire_server::device_spec::Target;
use blockwire_server::factory::{self, Remote};

use crate::info_format::human;

/// The file's location as the URL gives it.
struct Place {
    url: String,
    server: String,
    port: Option<u16>,
    export: String,
    file: String,
    version: u8,
}

pub fn run(uri: &str, list: bool, map: bool, json: bool) -> Result<()> {
    if list {
        bail!("--list lists a server's exports; for NFS, `showmount -e SERVER` does");
    }
    if map {
        bail!("--map needs an allocation map; an NFS file has none (NFSv3 has no SEEK_DATA)");
    }
    let Target::Nfs(mut url) = Target::parse(uri)? else {
        bail!("'{uri}': not an nfs:// URL");
    };
    // One connection is enough to describe the file (the default pool has four).
    url.connections.get_or_insert(1);
    let place = Place {
        url: url.to_string(),
        server: url.server.clone(),
        port: url.port,
        export: url.export.clone(),
        file: url.file.clone(),
        version: url.version,
    };
    let target = Target::Nfs(url);
    let (device, read_only_by_server) = open(&target)?;
    let info = *device.info();
    let text = if json {
        details_json(&place, &info, read_only_by_server)
    } else {
        details_text(&place, &info, read_only_by_server)
    };
    print!("{text}");
    Ok(())
}

/// Opens the file for writing, to learn whether the server takes writes; where it
/// allows reading only, opens it read-only. Nothing is written either way.
fn open(target: &Target) -> Result<(Device, bool)> {
    let remote = Remote {
        reconnect: None,
        ..Remote::default()
    };
    match factory::open(target, false, remote) {
        Ok(device) => Ok((device, false)),
        Err(e) if e.to_string().ends_with("the server allows reading only") => {
            Ok((factory::open(target, true, remote)?, true))
        }
        // info takes no size: the hint to give one (to create the file) is not for it.
        Err(e) => Err(anyhow!(e
            .to_string()
            .replace(" (give a size to create it)", ""))),
    }
}

/// The operations a device offers, each marked where the handle emulates it.
fn operations(caps: &Capabilities) -> Vec<String> {
    [
        ("flush", caps.flush),
        ("fua", caps.fua),
        ("trim", caps.trim),
        ("zero", caps.write_zeroes),
        ("fast-zero", caps.fast_zero),
        ("extents", caps.extents),
        ("cache", caps.cache),
    ]
    .into_iter()
    .filter_map(|(word, support)| match support {
        Support::None => None,
        Support::Emulated => Some(format!("{word} (emulated)")),
        Support::Native => Some(word.to_string()),
    })
    .collect()
}

fn server_text(place: &Place) -> String {
    let host = if place.server.contains(':') {
        format!("[{}]", place.server)
    } else {
        place.server.clone()
    };
    match place.port {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

fn details_text(place: &Place, info: &DeviceInfo, read_only_by_server: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "file: {}", place.url);
    let _ = writeln!(out, "server: {}", server_text(place));
    let _ = writeln!(out, "export: {}", place.export);
    let _ = writeln!(out, "path in export: {}", place.file);
    let _ = writeln!(out, "NFS version: {}", place.version);
    let _ = writeln!(out, "size: {} ({})", info.size, human(info.size));
    let sizes = info.block_sizes;
    let _ = writeln!(
        out,
        "block sizes: minimum {}, preferred {}, maximum {}",
        sizes.minimum, sizes.preferred, sizes.maximum
    );
    let read_only = match (info.read_only, read_only_by_server) {
        (_, true) => "yes (the server allows reading only)",
        (true, false) => "yes",
        (false, false) => "no",
    };
    let _ = writeln!(out, "read-only: {read_only}");
    let mut words = vec![if info.read_only { "read" } else { "read write" }.to_string()];
    words.extend(operations(&info.capabilities));
    let _ = writeln!(out, "operations: {}", words.join(" "));
    let _ = writeln!(
        out,
        "note: an NFS file: flush is an NFS COMMIT; no trim and no allocation map"
    );
    out
}

fn details_json(place: &Place, info: &DeviceInfo, read_only_by_server: bool) -> String {
    let value = serde_json::json!({
        "file": place.url,
        "server": place.server,
        "port": place.port,
        "export": place.export,
        "path": place.file,
        "nfs_version": place.version,
        "size": info.size,
        "block_size_minimum": info.block_sizes.minimum,
        "block_size_preferred": info.block_sizes.preferred,
        "block_size_maximum": info.block_sizes.maximum,
        "read_only": info.read_only,
        "read_only_by_server": read_only_by_server,
        "operations": operations(&info.capabilities),
    });
    format!("{value:#}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::BlockSizes;

    fn place(server: &str, port: Option<u16>) -> Place {
        Place {
            url: format!("nfs://{server}/srv/disk.img"),
            server: server.into(),
            port,
            export: "/srv".into(),
            file: "/disk.img".into(),
            version: 3,
        }
    }

    fn nfs_info(read_only: bool) -> DeviceInfo {
        let mut info = DeviceInfo::new(3 << 20);
        info.block_sizes = BlockSizes {
            minimum: 512,
            preferred: 4096,
            maximum: 32 << 20,
        };
        info.read_only = read_only;
        info.capabilities = Capabilities {
            flush: Support::Native,
            fua: Support::Emulated,
            write_zeroes: Support::Emulated,
            ..Capabilities::default()
        };
        info
    }

    #[test]
    fn the_text_names_the_place_the_size_and_the_operations() {
        let text = details_text(&place("10.0.0.5", None), &nfs_info(false), false);
        for line in [
            "server: 10.0.0.5\n",
            "export: /srv\n",
            "path in export: /disk.img\n",
            "NFS version: 3\n",
            "size: 3145728 (3M)\n",
            "block sizes: minimum 512, preferred 4096, maximum 33554432\n",
            "read-only: no\n",
            "operations: read write flush fua (emulated) zero (emulated)\n",
        ] {
            assert!(text.contains(line), "no '{line}' in:\n{text}");
        }
    }

    #[test]
    fn a_file_the_server_keeps_from_writes_says_so() {
        let mut info = nfs_info(true);
        info.capabilities = Capabilities::default();
        let text = details_text(&place("fd00::5", Some(2050)), &info, true);
        assert!(text.contains("server: [fd00::5]:2050\n"), "{text}");
        assert!(
            text.contains("read-only: yes (the server allows reading only)\n"),
            "{text}"
        );
        assert!(text.contains("operations: read\n"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&details_json(&place("h", None), &info, true)).unwrap();
        assert_eq!(json["read_only_by_server"], true);
        assert_eq!(json["nfs_version"], 3);
        assert_eq!(json["size"], 3 << 20);
        assert!(json["port"].is_null());
    }
}
