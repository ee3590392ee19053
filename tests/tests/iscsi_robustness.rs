//! Robustness of the iSCSI target against initiators that misbehave: connections
//! that never log in, from the address a good initiator logs in from.
//!
//! Issue 31: 300 idle connections from 127.0.0.1 kept a good initiator on 127.0.0.1
//! out (every connection past 16 unfinished logins was refused at once), where tgtd
//! serves it. Now a new connection closes its address's oldest unfinished login.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::Device;
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_tests::iscsi::tool_ok;
use blockwire_tests::{path_str, require, sparse_file, text, Served, MIB};

/// Unfinished logins the target holds per address (`max_logins_per_address`).
const LOGINS_PER_ADDRESS: usize = 16;

/// Serves a 16 MiB sparse file over iSCSI.
fn serve(dir: &std::path::Path) -> Served {
    let image = sparse_file(dir, "disk.img", 16 * MIB);
    Served::start_iscsi(&[path_str(&image)], "disk")
}

/// `count` TCP connections to the portal from 127.0.0.1 that never log in.
fn idle_connections(served: &Served, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|i| {
            TcpStream::connect(served.iscsi_portal())
                .unwrap_or_else(|e| panic!("idle connection {i}: {e}"))
        })
        .collect()
}

/// How many of `streams` the target still holds open: a read finds nothing yet
/// rather than the end.
fn still_open(streams: &[TcpStream]) -> usize {
    let mut open = 0;
    for mut stream in streams {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let result = loop {
            match stream.read(&mut byte) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                result => break result,
            }
        };
        if matches!(&result, Err(e) if e.kind() == ErrorKind::WouldBlock) {
            open += 1;
        }
        stream.set_nonblocking(false).unwrap();
    }
    open
}

/// Waits until the target has taken every one of `idle` (all but the newest
/// unfinished logins are closed), so the timing that follows is the good client's.
fn settled(idle: &[TcpStream]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = still_open(idle);
        if open <= LOGINS_PER_ADDRESS {
            assert_eq!(open, LOGINS_PER_ADDRESS, "idle logins held for one address");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} idle connections still open after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn our_initiator_is_served_beside_300_idle_connections_from_its_own_address() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path());
    let idle = idle_connections(&served, 300);
    settled(&idle);

    let started = Instant::now();
    let uri: IscsiUri = served.iscsi_url().parse().expect("an iscsi:// URL");
    let client = IscsiClient::connect(&uri, IscsiOptions::default())
        .unwrap_or_else(|e| panic!("{uri:?}: {e}"));
    let device = Device::new(Arc::new(client));
    let mut block = vec![0xffu8; 4096];
    device.read(&mut block, 0).expect("read the first block");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "logged in and read after {took:?} beside 300 idle connections"
    );
    assert!(block.iter().all(|&b| b == 0));
    // The initiator's connection took the place of the oldest idle one; the logged
    // in session is never closed to make room for later ones.
    assert_eq!(still_open(&idle), LOGINS_PER_ADDRESS - 1);
    let more = idle_connections(&served, 2 * LOGINS_PER_ADDRESS);
    settled(&more);
    device
        .read(&mut block, 4096)
        .expect("a read after more idle ones");
    drop(idle);
}

#[test]
fn iscsi_inq_is_served_beside_300_idle_connections_from_its_own_address() {
    require!("iscsi-inq");
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path());
    let idle = idle_connections(&served, 300);
    settled(&idle);

    let started = Instant::now();
    let output = tool_ok("iscsi-inq", &[served.iscsi_url()]);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "iscsi-inq took {took:?} beside 300 idle connections"
    );
    assert!(
        text(&output.stdout).contains("Peripheral Device Type"),
        "iscsi-inq printed:\n{}",
        text(&output.stdout)
    );
    drop(idle);
}
