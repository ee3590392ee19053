//! An AoE lab for tests: our target (`blockwire serve ... --aoe eth0`) in one network
//! namespace, and in the other a raw client that builds frames with our codec, so
//! tests can send exactly the frames they mean (also malformed ones). [`Vblade`]
//! runs the reference target instead.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use blockwire_aoe::rawsock::{Interface, RawSocket, RecvBatch};
use blockwire_aoe::wire::{
    ata, encode_frame, AtaArgs, Body, Command, ConfigQuery, Header, MacAddr, BROADCAST,
    BROADCAST_SHELF, BROADCAST_SLOT, SECTOR_SIZE,
};

use crate::netns::VethLab;
use crate::{blockwire_bin, Served};

/// The address every lab target serves.
pub const SHELF: u16 = 1;
/// The address every lab target serves.
pub const SLOT: u8 = 2;

/// A target process and a namespace pair. Fields drop in order: the target stops
/// before its namespace goes.
pub struct AoeLab {
    pub served: Option<Served>,
    pub lab: VethLab,
    pub mtu: usize,
}

impl AoeLab {
    /// Builds the namespaces (one link of `mtu`) and starts
    /// `blockwire serve ARGS... --aoe eth0 --shelf 1 --slot 2` in the target one.
    pub fn start(short: &str, mtu: usize, args: &[&str]) -> AoeLab {
        AoeLab::start_links(short, 1, mtu, args)
    }

    /// Like [`start`](Self::start) with `links` veth pairs, the target answering on
    /// all of them (`--aoe eth0,eth1,...`).
    pub fn start_links(short: &str, links: usize, mtu: usize, args: &[&str]) -> AoeLab {
        let tag = format!("{short}{}", std::process::id() % 100000);
        let lab = VethLab::new(&tag, links, mtu).expect("build the veth lab");
        let mut lab = AoeLab {
            served: None,
            lab,
            mtu,
        };
        lab.restart(args);
        lab
    }

    /// Starts (again) the target with these arguments.
    pub fn restart(&mut self, args: &[&str]) {
        let mut command = self.lab.command_in(self.lab.target_ns(), blockwire_bin());
        let interfaces = self.lab.interfaces().join(",");
        command.arg("serve").args(args).args([
            "--aoe",
            &interfaces,
            "--shelf",
            &SHELF.to_string(),
            "--slot",
            &SLOT.to_string(),
        ]);
        self.served = Some(Served::spawn_ready(command, "aoe"));
    }

    /// Kills the target with SIGKILL (no flush, no goodbye) and reaps it.
    pub fn kill_target(&mut self) {
        if let Some(mut served) = self.served.take() {
            // SAFETY: kill(2) on our own child's PID.
            unsafe { libc::kill(served.pid(), libc::SIGKILL) };
            let _ = served.child.wait();
        }
    }

    /// Gives the target side's `eth{link}` a new MAC address (`02:..`, locally
    /// administered), as a target restarted on other hardware would have.
    pub fn set_target_mac(&self, link: usize, mac: &str) {
        let status = self
            .lab
            .command_in(self.lab.target_ns(), "ip")
            .args(["link", "set", "dev", &format!("eth{link}"), "address", mac])
            .status()
            .expect("run ip link set address");
        assert!(
            status.success(),
            "ip link set eth{link} address {mac}: {status}"
        );
    }

    /// The MAC address of the target side's `eth0`: what the lab target answers from.
    pub fn target_mac(&self) -> MacAddr {
        interface_mac(&self.lab, self.lab.target_ns(), "eth0")
    }

    /// A raw client on the initiator side's eth0, aimed at the lab target.
    pub fn client(&self) -> RawClient {
        self.lab.run_in(self.lab.initiator_ns(), || {
            let eth0 = Interface::lookup("eth0").expect("eth0 in the initiator namespace");
            RawClient::open(eth0)
        })
    }
}

/// Builds frames with the codec and sends them from a raw socket; waits for answers
/// by tag.
pub struct RawClient {
    socket: RawSocket,
    batch: RecvBatch,
    pub mac: MacAddr,
    /// The target's MAC once discovered (broadcast until then).
    pub target: MacAddr,
    /// The slot requests go to (the lab's, unless a test serves several).
    pub slot: u8,
    next_tag: u32,
}

/// How long a test waits for an answer before deciding there is none.
pub const ANSWER_WAIT: Duration = Duration::from_secs(2);

impl RawClient {
    fn open(interface: Interface) -> RawClient {
        let socket = RawSocket::open(&interface, 4 << 20).expect("open AoE socket");
        RawClient {
            batch: RecvBatch::new(16, interface.mtu + 64),
            mac: interface.mac,
            socket,
            target: BROADCAST,
            slot: SLOT,
            next_tag: 0x100,
        }
    }

    /// A request header to the lab target with a fresh tag.
    pub fn header(&mut self, command: Command) -> Header {
        self.next_tag += 1;
        Header::request(
            self.target,
            self.mac,
            SHELF,
            self.slot,
            command,
            self.next_tag,
        )
    }

    /// Sends bytes as they are.
    pub fn send_raw(&self, frame: &[u8]) {
        self.socket.send(frame).expect("send frame");
    }

    /// Sends a request and returns the whole response frame with the same tag, or
    /// None if none came within `wait`.
    pub fn exchange(
        &mut self,
        header: &Header,
        body: &Body<'_>,
        wait: Duration,
    ) -> Option<Vec<u8>> {
        let mut frame = Vec::new();
        encode_frame(header, body, &mut frame);
        self.send_raw(&frame);
        self.answer(header.tag, wait)
    }

    /// Waits for a response with this tag (other frames are dropped).
    pub fn answer(&mut self, tag: u32, wait: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let n = self
                .socket
                .recv_batch(&mut self.batch, Some(left))
                .expect("receive");
            for i in 0..n {
                let frame = self.batch.frame(i);
                if let Ok((header, _)) = Header::parse(frame) {
                    if header.response && header.tag == tag {
                        return Some(frame.to_vec());
                    }
                }
            }
        }
    }

    /// Broadcasts a config query, learns the target's MAC and returns its answer.
    pub fn discover(&mut self) -> (Header, ConfigQuery<'static>, Vec<u8>) {
        self.next_tag += 1;
        let header = Header::request(
            BROADCAST,
            self.mac,
            BROADCAST_SHELF,
            BROADCAST_SLOT,
            Command::QueryConfig,
            self.next_tag,
        );
        let query = ConfigQuery {
            buffer_count: 0,
            firmware_version: 0,
            sector_count: 0,
            aoe_version: 1,
            command: 0,
            config: b"",
        };
        let frame = self
            .exchange(&header, &Body::QueryConfig(query), ANSWER_WAIT)
            .expect("the target answers a broadcast config query");
        let (header, body) = Header::parse(&frame).unwrap();
        let answer = ConfigQuery::parse(body).expect("a well-formed config answer");
        let config = answer.config.to_vec();
        let answer = ConfigQuery {
            config: b"",
            ..answer
        };
        self.target = header.src;
        (header, answer, config)
    }

    /// Sends an ATA command; returns the response header, arguments and data.
    pub fn ata(&mut self, args: AtaArgs, data: &[u8]) -> Option<(Header, AtaArgs, Vec<u8>)> {
        let header = self.header(Command::Ata);
        let frame = self.exchange(&header, &Body::Ata(args, data), ANSWER_WAIT)?;
        let (header, body) = Header::parse(&frame).unwrap();
        if header.error().is_some() {
            return Some((header, AtaArgs::default(), Vec::new()));
        }
        let (args, data) = AtaArgs::parse(body).expect("ATA response arguments");
        Some((header, args, data.to_vec()))
    }

    /// Reads `count` sectors at `lba` (LBA48), expecting success.
    pub fn read(&mut self, lba: u64, count: u8) -> Vec<u8> {
        let (header, args, data) = self
            .ata(ata_args(ata::READ_SECTORS_EXT, lba, count, false), &[])
            .expect("an answer to READ");
        assert_eq!(header.error(), None, "READ at {lba}: AoE error");
        assert_eq!(
            args.cmd_status & ata::STATUS_ERR,
            0,
            "READ at {lba}: ATA error"
        );
        data[..usize::from(count) * SECTOR_SIZE].to_vec()
    }

    /// Writes sectors at `lba` (LBA48), expecting success.
    pub fn write(&mut self, lba: u64, data: &[u8]) {
        let count = (data.len() / SECTOR_SIZE) as u8;
        let (header, args, _) = self
            .ata(ata_args(ata::WRITE_SECTORS_EXT, lba, count, true), data)
            .expect("an answer to WRITE");
        assert_eq!(header.error(), None, "WRITE at {lba}: AoE error");
        assert_eq!(
            args.cmd_status & ata::STATUS_ERR,
            0,
            "WRITE at {lba}: ATA error"
        );
    }

    /// FLUSH CACHE EXT, expecting success.
    pub fn flush(&mut self) {
        let (header, args, _) = self
            .ata(ata_args(ata::FLUSH_CACHE_EXT, 0, 0, false), &[])
            .expect("an answer to FLUSH");
        assert_eq!(header.error(), None, "FLUSH: AoE error");
        assert_eq!(args.cmd_status & ata::STATUS_ERR, 0, "FLUSH: ATA error");
    }
}

/// LBA48 ATA arguments.
pub fn ata_args(command: u8, lba: u64, count: u8, write: bool) -> AtaArgs {
    AtaArgs {
        extended: true,
        write,
        sector_count: count,
        cmd_status: command,
        lba,
        ..AtaArgs::default()
    }
}

/// Whether a file's bytes at `offset` equal `data`.
pub fn file_has(path: &Path, offset: usize, data: &[u8]) -> bool {
    let contents = std::fs::read(path).expect("read backing file");
    contents.get(offset..offset + data.len()) == Some(data)
}

/// The MAC address of `interface` in namespace `ns` of `lab`.
pub fn interface_mac(lab: &VethLab, ns: &str, interface: &str) -> MacAddr {
    lab.run_in(ns, || {
        Interface::lookup(interface)
            .unwrap_or_else(|e| panic!("{interface} in {ns}: {e}"))
            .mac
    })
}

/// Where vblade is installed, if it is (Debian package vblade).
pub fn vblade_path() -> Option<std::path::PathBuf> {
    ["/usr/sbin/vblade", "/usr/bin/vblade", "/sbin/vblade"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
}

/// Returns early from a test, saying so, when vblade is not installed.
#[macro_export]
macro_rules! require_vblade {
    () => {
        if $crate::aoe::vblade_path().is_none() {
            eprintln!("skipped: vblade is not installed (Debian package vblade)");
            return;
        }
    };
}

/// vblade (the reference AoE target) serving a file, killed when dropped.
pub struct Vblade {
    child: Child,
}

impl Vblade {
    /// Starts `vblade SHELF SLOT INTERFACE IMAGE` in namespace `ns` of `lab`. vblade
    /// announces itself at once; callers that need it answering wait for that (it
    /// prints nothing when ready).
    pub fn start(
        lab: &VethLab,
        ns: &str,
        shelf: u16,
        slot: u8,
        interface: &str,
        image: &Path,
    ) -> Vblade {
        let vblade = vblade_path().expect("vblade is installed (check require_vblade!)");
        let child = lab
            .command_in(ns, vblade)
            .args([&shelf.to_string(), &slot.to_string(), interface])
            .arg(image)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start vblade");
        Vblade { child }
    }
}

impl Drop for Vblade {
    fn drop(&mut self) {
        // `ip netns exec` execs vblade, so the PID is vblade's own.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
