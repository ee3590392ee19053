//! The initiator against vblade, a real AoE target, over veth pairs between two
//! network namespaces of our own: discovery, IDENTIFY, the device conformance suite,
//! sequential 1 MiB throughput at MTU 1500 and 9000, two paths (two vblade processes
//! serving one image on two links) with one of them dying, and a target that goes
//! silent.
//!
//! Needs root (namespaces, raw sockets) and vblade (`/usr/sbin/vblade`, Debian
//! package vblade); skipped with a message otherwise.

mod initiator_lab;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_aoe::initiator::{discover_by_name, AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{Device, ErrorKind, WriteFlags};
use initiator_lab::Lab;

const SIZE: u64 = 64 << 20;
const SHELF: u16 = 1;
const SLOT: u8 = 2;

fn vblade() -> Option<PathBuf> {
    ["/usr/sbin/vblade", "/usr/bin/vblade", "/sbin/vblade"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Why this test cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    initiator_lab::unavailable().or_else(|| {
        vblade()
            .is_none()
            .then(|| "vblade is not installed (Debian package vblade)".to_string())
    })
}

/// A lab with vblade serving one image as e1.2 on every link.
fn vblade_lab(tag: &str, links: usize, mtu: usize) -> Lab {
    let mut lab = Lab::new(tag, links, mtu);
    let image = lab.image("vblade.img", SIZE);
    let image = image.to_str().unwrap().to_string();
    for i in 0..links {
        let interface = format!("tgt{i}");
        lab.spawn_in_target(
            &vblade().unwrap(),
            &[&SHELF.to_string(), &SLOT.to_string(), &interface, &image],
        );
    }
    lab
}

/// Opens the target, retrying while vblade starts up.
fn open(uri: &AoeUri, options: AoeOptions) -> AoeClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match AoeClient::open(uri, options) {
            Ok(client) if client.paths().len() == uri.interfaces.len() => return client,
            Ok(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
            Ok(client) => panic!("{uri}: only {} paths", client.paths().len()),
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for vblade: {e}");
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("open {uri}: {e}"),
        }
    }
}

/// MB/s of sequential 1 MiB requests over the whole device.
fn sequential(device: &Device, write: bool) -> f64 {
    let chunk = 1 << 20;
    let mut buf = pattern(5, 0, chunk);
    let start = Instant::now();
    for offset in (0..SIZE).step_by(chunk) {
        if write {
            device.write(&buf, offset, WriteFlags::NONE).unwrap();
        } else {
            device.read(&mut buf, offset).unwrap();
        }
    }
    if write {
        device.flush().unwrap();
    }
    SIZE as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn against_vblade(tag: &str, mtu: usize, per_frame: u8) {
    if let Some(reason) = unavailable() {
        eprintln!("skipped: {reason}");
        return;
    }
    let mut lab = vblade_lab(tag, 1, mtu);
    let uri = AoeUri::new("ini0", SHELF, SLOT);
    lab.in_initiator(|| {
        let client = open(&uri, AoeOptions::default());
        let found = discover_by_name(&["ini0"], 0xffff, 0xff, Duration::from_millis(300))
            .expect("discover");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].shelf, found[0].slot), (SHELF, SLOT));
        assert_eq!(found[0].target_mac, client.paths()[0].target_mac);
        assert_eq!(found[0].sector_count, per_frame);

        let identity = client.identity().clone();
        assert_eq!(identity.sectors, SIZE / 512);
        assert!(identity.lba48);
        assert!(identity.model.contains("vblade"), "{identity:?}");
        // vblade has FLUSH CACHE but not FLUSH CACHE EXT.
        assert!(!client.flush_ext());
        assert_eq!(client.sectors_per_frame(), per_frame);
        assert_eq!(client.paths().len(), 1);
        assert_eq!(client.paths()[0].interface.name, "ini0");
        eprintln!(
            "MTU {mtu}: {} sectors ({}), buffer count {}, window {}, {} sectors per frame, firmware {:#x}",
            identity.sectors,
            identity.model,
            client.buffer_count(),
            client.window(),
            client.sectors_per_frame(),
            client.firmware_version()
        );

        let client = Arc::new(client);
        let device = Device::new(client.clone());
        assert_eq!(device.size(), SIZE);
        assert_eq!(device.info().block_sizes.minimum, 512);
        conformance::run_all(&device);
        eprintln!("MTU {mtu}: after conformance: {:?}", client.stats());

        let write = sequential(&device, true);
        let read = sequential(&device, false);
        let (srtt, rto) = client.timing();
        eprintln!(
            "MTU {mtu}: sequential 1 MiB requests: write {write:.0} MB/s, read {read:.0} MB/s \
             ({:?}; srtt {srtt:?}, rto {rto:?})",
            client.stats()
        );
    });

    // A target that stops answering fails requests after the timeout.
    let options = AoeOptions {
        timeout: Duration::from_secs(1),
        ..AoeOptions::default()
    };
    let client = lab.in_initiator(|| open(&uri, options));
    let device = Device::new(Arc::new(client));
    let mut block = vec![0u8; 4096];
    device.read(&mut block, 0).unwrap();
    lab.kill(0);
    let start = Instant::now();
    let error = device.read(&mut block, 8192).unwrap_err();
    let waited = start.elapsed();
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    let text = error.to_string();
    assert!(text.contains("e1.2") && text.contains("ini0"), "{text}");
    eprintln!("silent target: {text}");
}

#[test]
fn vblade_at_mtu_1500() {
    against_vblade("a", 1500, 2);
}

#[test]
fn vblade_at_mtu_9000() {
    against_vblade("b", 9000, 17);
}

#[test]
fn vblade_on_two_paths_one_of_which_dies() {
    if let Some(reason) = unavailable() {
        eprintln!("skipped: {reason}");
        return;
    }
    let mut lab = vblade_lab("c", 2, 1500);
    let uri: AoeUri = "aoe://ini0,ini1/e1.2".parse().unwrap();
    let client = lab.in_initiator(|| open(&uri, AoeOptions::default()));
    assert_eq!(client.paths().len(), 2);
    assert_ne!(client.paths()[0].target_mac, client.paths()[1].target_mac);
    let client = Arc::new(client);
    let device = Device::new(client.clone());
    conformance::run_all(&device);
    let write = sequential(&device, true);
    let read = sequential(&device, false);
    eprintln!(
        "two paths at MTU 1500: write {write:.0} MB/s, read {read:.0} MB/s ({:?})",
        client.stats()
    );

    // One vblade dies: frames sent its way are retransmitted on the other path, and
    // the dead path is then avoided.
    lab.kill(1);
    let data = pattern(11, 0, 4 << 20);
    let start = Instant::now();
    device.write(&data, 0, WriteFlags::NONE).unwrap();
    let mut back = vec![0u8; data.len()];
    device.read(&mut back, 0).unwrap();
    assert!(back == data, "data differs after losing a path");
    let before = client.stats();
    let again = Instant::now();
    device.read(&mut back, 0).unwrap();
    let after = client.stats();
    eprintln!(
        "one path dead: 8 MiB in {:?}, then 4 MiB in {:?} with {} retransmissions",
        again - start,
        again.elapsed(),
        after.retransmits - before.retransmits
    );
    // Only probes of the dead path (one per 100 ms) and the odd spurious one.
    assert!(
        after.retransmits - before.retransmits < 64,
        "{before:?} then {after:?}"
    );
}
