//! The controller driven the way a host drives it, with a memory device and a
//! clock passed in.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, MemoryDevice};

use super::*;
use crate::cqe::{Cqe, Status};
use crate::fabrics::{Connect, ConnectData, PropertyCommand, DISCOVERY_NQN, DYNAMIC_CNTLID};
use crate::opcodes::{admin, cns, feature, io, log, property};
use crate::sqe::{SglDescriptor, Sqe};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:test-host";
const DEVICE_SIZE: u64 = 1 << 20;

fn subsystem(name: &str) -> Arc<Subsystem> {
    Arc::new(Subsystem::new(
        name,
        Device::from_device(MemoryDevice::new(DEVICE_SIZE)),
    ))
}

fn core_with(subsystems: Vec<Arc<Subsystem>>) -> Arc<Core> {
    let core = Arc::new(Core::new(Settings::default(), subsystems));
    core.set_ports(vec!["0.0.0.0:4420".parse().unwrap()]);
    core
}

fn complete(action: Action) -> Reply {
    match action {
        Action::Complete(reply) => reply,
        other => panic!("expected a completion, got {other:?}"),
    }
}

fn run(action: Action) -> Reply {
    match action {
        Action::Complete(reply) => reply,
        Action::Io(io) => io.execute(),
        Action::Deferred => panic!("deferred"),
    }
}

fn connect_sqe(qid: u16, kato: u32) -> Sqe {
    Connect {
        cid: 1,
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato,
    }
    .to_sqe()
}

fn connect_data(subnqn: &str, cntlid: u16) -> Vec<u8> {
    ConnectData {
        host_id: [7; 16],
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: HOST.into(),
    }
    .to_bytes()
}

/// A connected admin queue, enabled (CC.EN = 1 and CSTS.RDY seen).
fn admin_queue(core: &Arc<Core>, subnqn: &str, now: Instant) -> (Queue, u16) {
    let mut q = Queue::new(core.clone(), "127.0.0.1:4420".parse().ok(), false);
    let reply = complete(q.submit(
        &connect_sqe(0, 10_000),
        connect_data(subnqn, DYNAMIC_CNTLID),
        now,
    ));
    assert!(reply.cqe.status.is_success(), "{:?}", reply.cqe.status);
    let cntlid = reply.cqe.result as u16;
    assert_ne!(cntlid, 0);
    set_property(&mut q, property::CC, 0x0046_0001, now);
    assert_eq!(get_property(&mut q, property::CSTS, now) & 1, 1);
    (q, cntlid)
}

fn io_queue(core: &Arc<Core>, subnqn: &str, cntlid: u16, qid: u16, now: Instant) -> Queue {
    let mut q = Queue::new(core.clone(), None, false);
    let reply = complete(q.submit(&connect_sqe(qid, 0), connect_data(subnqn, cntlid), now));
    assert!(reply.cqe.status.is_success(), "{:?}", reply.cqe.status);
    q
}

fn set_property(q: &mut Queue, offset: u32, value: u64, now: Instant) {
    let sqe = PropertyCommand::Set {
        offset,
        eight_bytes: false,
        value,
    }
    .to_sqe(2);
    let reply = complete(q.submit(&sqe, Vec::new(), now));
    assert!(reply.cqe.status.is_success());
}

fn get_property(q: &mut Queue, offset: u32, now: Instant) -> u64 {
    let sqe = PropertyCommand::Get {
        offset,
        eight_bytes: offset == property::CAP,
    }
    .to_sqe(3);
    let reply = complete(q.submit(&sqe, Vec::new(), now));
    assert!(reply.cqe.status.is_success());
    reply.cqe.result
}

fn identify(q: &mut Queue, cns_value: u8, nsid: u32, now: Instant) -> Reply {
    let mut sqe = Sqe::new(admin::IDENTIFY, 4);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, u32::from(cns_value));
    sqe.set_sgl(SglDescriptor::transport(4096));
    complete(q.submit(&sqe, Vec::new(), now))
}

fn log_page(q: &mut Queue, lid: u8, len: u32, offset: u64, now: Instant) -> Reply {
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 5);
    let numd = len / 4 - 1;
    sqe.set_cdw(10, u32::from(lid) | ((numd & 0xffff) << 16));
    sqe.set_cdw(11, numd >> 16);
    sqe.set_cdw(12, offset as u32);
    sqe.set_cdw(13, (offset >> 32) as u32);
    complete(q.submit(&sqe, Vec::new(), now))
}

fn features(q: &mut Queue, opcode: u8, fid: u8, value: u32, now: Instant) -> Cqe {
    let mut sqe = Sqe::new(opcode, 6);
    sqe.set_cdw(10, u32::from(fid));
    sqe.set_cdw(11, value);
    complete(q.submit(&sqe, Vec::new(), now)).cqe
}

fn rw(opcode: u8, slba: u64, blocks: u32, data: Vec<u8>, fua: bool) -> (Sqe, Vec<u8>) {
    let mut sqe = Sqe::new(opcode, 9);
    sqe.set_nsid(NSID);
    sqe.set_cdw10_11(slba);
    sqe.set_cdw(12, (blocks - 1) | if fua { 1 << 30 } else { 0 });
    sqe.set_sgl(SglDescriptor::transport(blocks * 512));
    (sqe, data)
}

#[test]
fn commands_before_connect_are_out_of_sequence() {
    let core = core_with(vec![subsystem("a")]);
    let mut q = Queue::new(core, None, false);
    let reply = complete(q.submit(&Sqe::new(admin::IDENTIFY, 1), Vec::new(), Instant::now()));
    assert_eq!(reply.cqe.status, Status::COMMAND_SEQUENCE_ERROR);
    assert_eq!(reply.cqe.cid, 1);
}

#[test]
fn connect_gives_dynamic_controller_ids() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let (_q1, c1) = admin_queue(&core, &default_nqn("a"), now);
    let (_q2, c2) = admin_queue(&core, &default_nqn("a"), now);
    assert_ne!(c1, c2);
    assert_eq!(core.controllers().len(), 2);
}

#[test]
fn connect_refusals() {
    let a = Arc::new(
        Subsystem::new("a", Device::from_device(MemoryDevice::new(DEVICE_SIZE)))
            .with_allowed_hosts(vec!["nqn.other".into()]),
    );
    let core = core_with(vec![a, subsystem("b")]);
    let now = Instant::now();
    let try_connect = |qid: u16, subnqn: &str, cntlid: u16| {
        let mut q = Queue::new(core.clone(), None, false);
        complete(q.submit(&connect_sqe(qid, 0), connect_data(subnqn, cntlid), now)).cqe
    };
    let unknown = try_connect(0, "nqn.nope", DYNAMIC_CNTLID);
    assert_eq!(unknown.status, Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(unknown.result, (1 << 16) | 256);
    let denied = try_connect(0, &default_nqn("a"), DYNAMIC_CNTLID);
    assert_eq!(denied.status, Status::CONNECT_INVALID_HOST);
    let static_id = try_connect(0, &default_nqn("b"), 5);
    assert_eq!(static_id.status, Status::CONNECT_INVALID_PARAMETERS);
    let no_controller = try_connect(1, &default_nqn("b"), 5);
    assert_eq!(no_controller.status, Status::CONNECT_INVALID_PARAMETERS);
    // Discovery port: only discovery.
    let mut q = Queue::new(core.clone(), None, true);
    let reply = complete(q.submit(
        &connect_sqe(0, 0),
        connect_data(&default_nqn("b"), DYNAMIC_CNTLID),
        now,
    ));
    assert_eq!(reply.cqe.status, Status::CONNECT_INVALID_PARAMETERS);
}

#[test]
fn io_queue_needs_an_enabled_controller_and_a_free_granted_qid() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let nqn = default_nqn("a");
    let mut admin = Queue::new(core.clone(), None, false);
    let cntlid = complete(admin.submit(&connect_sqe(0, 0), connect_data(&nqn, DYNAMIC_CNTLID), now))
        .cqe
        .result as u16;
    let mut early = Queue::new(core.clone(), None, false);
    let cqe = complete(early.submit(&connect_sqe(1, 0), connect_data(&nqn, cntlid), now)).cqe;
    assert_eq!(cqe.status, Status::COMMAND_SEQUENCE_ERROR);
    set_property(&mut admin, property::CC, 0x0046_0001, now);
    // Two queues asked (0's based 1), two granted.
    let granted = features(
        &mut admin,
        admin::SET_FEATURES,
        feature::NUMBER_OF_QUEUES,
        0x0001_0001,
        now,
    );
    assert_eq!(granted.result, 0x0001_0001);
    let _q1 = io_queue(&core, &nqn, cntlid, 1, now);
    let mut again = Queue::new(core.clone(), None, false);
    let dup = complete(again.submit(&connect_sqe(1, 0), connect_data(&nqn, cntlid), now)).cqe;
    assert_eq!(dup.status, Status::CONNECT_INVALID_PARAMETERS);
    let mut third = Queue::new(core.clone(), None, false);
    let over = complete(third.submit(&connect_sqe(3, 0), connect_data(&nqn, cntlid), now)).cqe;
    assert_eq!(over.status, Status::CONNECT_INVALID_PARAMETERS);
}

#[test]
fn properties_enable_ready_and_shutdown() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let (mut q, _) = admin_queue(&core, &default_nqn("a"), now);
    let cap = get_property(&mut q, property::CAP, now);
    assert_eq!(cap & 0xffff, 1023);
    assert_ne!(cap & (1 << 37), 0);
    assert_eq!(get_property(&mut q, property::VS, now), 0x0002_0000);
    set_property(&mut q, property::CC, 0x0046_4001, now);
    assert_eq!((get_property(&mut q, property::CSTS, now) >> 2) & 3, 2);
    set_property(&mut q, property::CC, 0x0046_0000, now);
    assert_eq!(get_property(&mut q, property::CSTS, now) & 1, 0);
    // Wrong entry sizes: controller fatal status.
    set_property(&mut q, property::CC, 0x0055_0001, now);
    assert_eq!(get_property(&mut q, property::CSTS, now) & 3, 2);
}

#[test]
fn identify_controller_and_namespace() {
    let core = core_with(vec![subsystem("disk")]);
    let now = Instant::now();
    let (mut q, cntlid) = admin_queue(&core, &default_nqn("disk"), now);
    let ctrl = identify(&mut q, cns::CONTROLLER, 0, now).data;
    assert_eq!(ctrl.len(), 4096);
    assert_eq!(u16::from_le_bytes([ctrl[78], ctrl[79]]), cntlid);
    assert_eq!(ctrl[111], 1);
    assert_eq!(&ctrl[24..33], b"blockwire");
    assert_eq!(ctrl[512], 0x66);
    assert_eq!(u32::from_le_bytes(ctrl[516..520].try_into().unwrap()), 1);
    assert_eq!(
        u32::from_le_bytes(ctrl[1792..1796].try_into().unwrap()),
        (64 + 16384) / 16
    );
    assert_eq!(ctrl[536] & 3, 1);
    let nqn = default_nqn("disk");
    assert_eq!(&ctrl[768..768 + nqn.len()], nqn.as_bytes());
    assert_eq!(ctrl[768 + nqn.len()], 0);

    let ns = identify(&mut q, cns::NAMESPACE, NSID, now).data;
    assert_eq!(
        u64::from_le_bytes(ns[0..8].try_into().unwrap()),
        DEVICE_SIZE / 512
    );
    assert_eq!(ns[130], 9);
    assert_eq!(ns[104..120], core.subsystems()[0].nguid());
    let bad = identify(&mut q, cns::NAMESPACE, 2, now);
    assert_eq!(bad.cqe.status, Status::INVALID_NAMESPACE);

    let list = identify(&mut q, cns::ACTIVE_NAMESPACES, 0, now).data;
    assert_eq!(&list[0..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let after = identify(&mut q, cns::ACTIVE_NAMESPACES, 1, now).data;
    assert!(after.iter().all(|&b| b == 0));

    let descs = identify(&mut q, cns::NS_DESCRIPTORS, NSID, now).data;
    assert_eq!((descs[0], descs[1]), (2, 16));
    assert_eq!(descs[4..20], core.subsystems()[0].nguid());
    assert_eq!((descs[20], descs[21]), (3, 16));
    assert_eq!(descs[24..40], core.subsystems()[0].uuid());
    assert_eq!((descs[40], descs[41], descs[44]), (4, 1, 0));
}

#[test]
fn features_round_trip() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let (mut q, _) = admin_queue(&core, &default_nqn("a"), now);
    let kato = features(
        &mut q,
        admin::SET_FEATURES,
        feature::KEEP_ALIVE_TIMER,
        5000,
        now,
    );
    assert!(kato.status.is_success());
    assert_eq!(
        features(
            &mut q,
            admin::GET_FEATURES,
            feature::KEEP_ALIVE_TIMER,
            0,
            now
        )
        .result,
        5000
    );
    features(
        &mut q,
        admin::SET_FEATURES,
        feature::VOLATILE_WRITE_CACHE,
        0,
        now,
    );
    assert_eq!(
        features(
            &mut q,
            admin::GET_FEATURES,
            feature::VOLATILE_WRITE_CACHE,
            0,
            now
        )
        .result,
        0
    );
    features(
        &mut q,
        admin::SET_FEATURES,
        feature::ASYNC_EVENT_CONFIG,
        u32::MAX,
        now,
    );
    assert_eq!(
        features(
            &mut q,
            admin::GET_FEATURES,
            feature::ASYNC_EVENT_CONFIG,
            0,
            now
        )
        .result,
        (1 << 8) | (1 << 11)
    );
    let many = features(
        &mut q,
        admin::SET_FEATURES,
        feature::NUMBER_OF_QUEUES,
        0xfffe_fffe,
        now,
    );
    assert_eq!(many.result, 0x007f_007f);
    let unknown = features(&mut q, admin::GET_FEATURES, 0x42, 0, now);
    assert_eq!(unknown.status, Status::INVALID_FIELD);
}

#[test]
fn write_cache_off_makes_writes_durable() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let nqn = default_nqn("a");
    let (mut admin, cntlid) = admin_queue(&core, &nqn, now);
    features(
        &mut admin,
        admin::SET_FEATURES,
        feature::VOLATILE_WRITE_CACHE,
        0,
        now,
    );
    let mut q = io_queue(&core, &nqn, cntlid, 1, now);
    let (sqe, data) = rw(io::WRITE, 0, 1, vec![1; 512], false);
    match q.submit(&sqe, data, now) {
        Action::Io(cmd) => assert!(matches!(cmd.op, IoOp::Write { fua: true, .. })),
        other => panic!("{other:?}"),
    }
}

#[test]
fn log_pages() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let (mut q, _) = admin_queue(&core, &default_nqn("a"), now);
    let smart = log_page(&mut q, log::SMART, 512, 0, now);
    assert!(smart.cqe.status.is_success());
    assert_eq!(smart.data[3], 100);
    let error = log_page(&mut q, log::ERROR, 64, 0, now);
    assert!(error.data.iter().all(|&b| b == 0));
    let ana = log_page(&mut q, log::ANA, 4096, 0, now).data;
    assert_eq!(u16::from_le_bytes([ana[8], ana[9]]), 1);
    assert_eq!(u32::from_le_bytes(ana[16..20].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(ana[20..24].try_into().unwrap()), 1);
    assert_eq!(ana[32], 1);
    assert_eq!(u32::from_le_bytes(ana[48..52].try_into().unwrap()), NSID);
    // A window past the page's start.
    let window = log_page(&mut q, log::ANA, 4, 16, now).data;
    assert_eq!(window[..], 1u32.to_le_bytes());
    let effects = log_page(&mut q, log::COMMANDS_EFFECTS, 4096, 0, now).data;
    assert_eq!(effects[1024 + 4 * usize::from(io::WRITE)], 0b11);
    let unknown = log_page(&mut q, 0x7f, 512, 0, now);
    assert_eq!(unknown.cqe.status, Status::INVALID_LOG_PAGE);
    let discovery_on_nvm = log_page(&mut q, log::DISCOVERY, 1024, 0, now);
    assert_eq!(discovery_on_nvm.cqe.status, Status::INVALID_LOG_PAGE);
}

/// Failed commands land in the error log, newest first with a rising count, and
/// SMART counts them; the namespace's reads and writes show in SMART's data
/// units and command counts; there is no temperature sensor (0, as nvmet).
#[test]
fn errors_and_io_show_in_the_error_and_smart_logs() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let nqn = default_nqn("a");
    let (mut admin, cntlid) = admin_queue(&core, &nqn, now);
    let ctrl = identify(&mut admin, cns::CONTROLLER, 0, now).data;
    assert_eq!(usize::from(ctrl[262]) + 1, health::ERROR_LOG_ENTRIES);
    let mut q = io_queue(&core, &nqn, cntlid, 1, now);
    let (write, data) = rw(io::WRITE, 2, 2, vec![5; 1024], false);
    assert!(run(q.submit(&write, data, now)).cqe.status.is_success());
    let (read, _) = rw(io::READ, 2, 2, Vec::new(), false);
    assert!(run(q.submit(&read, Vec::new(), now))
        .cqe
        .status
        .is_success());
    // Past the end, on I/O queue 1 ...
    let past_end = DEVICE_SIZE / 512;
    let (mut bad, _) = rw(io::READ, past_end, 1, Vec::new(), false);
    bad.set_cid(41);
    let failed = run(q.submit(&bad, Vec::new(), now)).cqe;
    assert_eq!(failed.status, Status::LBA_OUT_OF_RANGE);
    // ... then an unknown log page on the admin queue.
    assert_eq!(
        log_page(&mut admin, 0x7f, 512, 0, now).cqe.status,
        Status::INVALID_LOG_PAGE
    );
    let page = log_page(&mut admin, log::ERROR, 128, 0, now).data;
    let entry = |i: usize| &page[i * 64..(i + 1) * 64];
    let u16_at = |e: &[u8], at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
    let newest = entry(0);
    assert_eq!(u64::from_le_bytes(newest[0..8].try_into().unwrap()), 2);
    assert_eq!(u16_at(newest, 8), 0, "the admin queue");
    assert_eq!(u16_at(newest, 12) >> 1, Status::INVALID_LOG_PAGE.0);
    let older = entry(1);
    assert_eq!(u64::from_le_bytes(older[0..8].try_into().unwrap()), 1);
    assert_eq!(u16_at(older, 8), 1, "I/O queue 1");
    assert_eq!(u16_at(older, 10), 41);
    assert_eq!(u16_at(older, 12) >> 1, Status::LBA_OUT_OF_RANGE.0);
    assert_eq!(
        u64::from_le_bytes(older[16..24].try_into().unwrap()),
        past_end
    );
    assert_eq!(u32::from_le_bytes(older[24..28].try_into().unwrap()), NSID);
    let smart = log_page(&mut admin, log::SMART, 512, 0, now).data;
    let u64_at = |at: usize| u64::from_le_bytes(smart[at..at + 8].try_into().unwrap());
    assert_eq!(u16::from_le_bytes([smart[1], smart[2]]), 0, "no sensor");
    assert_eq!((u64_at(32), u64_at(48)), (1, 1), "data units read, written");
    assert_eq!((u64_at(64), u64_at(80)), (1, 1), "read and write commands");
    assert_eq!(u64_at(176), 2, "error log entries");
    // The counts are the namespace's: a second controller sees them too.
    let (mut other, _) = admin_queue(&core, &nqn, now);
    let smart = log_page(&mut other, log::SMART, 512, 0, now).data;
    assert_eq!(u64::from_le_bytes(smart[64..72].try_into().unwrap()), 1);
    assert_eq!(u64::from_le_bytes(smart[176..184].try_into().unwrap()), 0);
}

#[test]
fn discovery_lists_every_allowed_subsystem_and_port() {
    let hidden = Arc::new(
        Subsystem::new(
            "hidden",
            Device::from_device(MemoryDevice::new(DEVICE_SIZE)),
        )
        .with_allowed_hosts(vec!["nqn.someone-else".into()]),
    );
    let core = core_with(vec![subsystem("a"), subsystem("b"), hidden]);
    let now = Instant::now();
    let mut q = Queue::new(core.clone(), "10.1.2.3:8009".parse().ok(), true);
    let reply = complete(q.submit(
        &connect_sqe(0, 0),
        connect_data(DISCOVERY_NQN, DYNAMIC_CNTLID),
        now,
    ));
    assert!(reply.cqe.status.is_success());
    let ctrl = identify(&mut q, cns::CONTROLLER, 0, now).data;
    assert_eq!(ctrl[111], 2);
    let page = log_page(&mut q, log::DISCOVERY, 4096, 0, now).data;
    assert_eq!(u64::from_le_bytes(page[8..16].try_into().unwrap()), 2);
    let e = &page[1024..2048];
    assert_eq!((e[0], e[1], e[2]), (3, 1, 2));
    assert_eq!(&e[32..36], b"4420");
    // The wildcard listener is reported as the address the host reached.
    // SUBNQN at 256, TRADDR at 512 (struct nvmf_disc_rsp_page_entry).
    assert_eq!(&e[512..520], b"10.1.2.3");
    let nqn = default_nqn("a");
    assert_eq!(&e[256..256 + nqn.len()], nqn.as_bytes());
    let e2 = &page[2048..3072];
    assert_eq!(&e2[256..256 + nqn.len()], default_nqn("b").as_bytes());
    // An advertised address replaces the listeners' (NAT).
    core.set_advertised(Some("10.0.2.2".parse().unwrap()));
    let page = log_page(&mut q, log::DISCOVERY, 2048, 0, now).data;
    assert_eq!(&page[1024 + 512..1024 + 521], b"10.0.2.2\0");
    // Namespaces are not the discovery controller's business.
    assert_eq!(
        identify(&mut q, cns::NAMESPACE, 1, now).cqe.status,
        Status::INVALID_FIELD
    );
}

#[test]
fn reload_raises_events_on_outstanding_requests() {
    let a = subsystem("a");
    let core = core_with(vec![a.clone()]);
    let now = Instant::now();
    let (mut q, _) = admin_queue(&core, &default_nqn("a"), now);
    let delivered: Arc<Mutex<Vec<Cqe>>> = Arc::default();
    let sink = delivered.clone();
    q.controller()
        .unwrap()
        .set_notifier(Box::new(move |cqe| sink.lock().unwrap().push(cqe)));
    features(
        &mut q,
        admin::SET_FEATURES,
        feature::ASYNC_EVENT_CONFIG,
        1 << 8,
        now,
    );
    let aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, 77);
    assert!(matches!(q.submit(&aer, Vec::new(), now), Action::Deferred));

    // The same subsystem again: nothing changes.
    core.replace_subsystems(vec![a.clone()]);
    assert!(delivered.lock().unwrap().is_empty());

    // A changed definition under the same NQN: namespace changed.
    let a2 = subsystem("a");
    assert!(core.replace_subsystems(vec![a2]).is_empty());
    let events = delivered.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].cid, 77);
    assert_eq!(events[0].result, 0x0004_0002);
    let changed = log_page(&mut q, log::CHANGED_NAMESPACES, 4096, 0, now).data;
    assert_eq!(&changed[0..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    let again = log_page(&mut q, log::CHANGED_NAMESPACES, 4096, 0, now).data;
    assert!(again.iter().all(|&b| b == 0));

    // Removed: the event waits for the next request, the namespace is gone.
    assert_eq!(core.replace_subsystems(vec![]), vec![default_nqn("a")]);
    match q.submit(&aer, Vec::new(), now) {
        Action::Complete(reply) => assert_eq!(reply.cqe.result, 0x0004_0002),
        other => panic!("{other:?}"),
    }
    let ns = identify(&mut q, cns::NAMESPACE, NSID, now).data;
    assert!(ns.iter().all(|&b| b == 0));
}

#[test]
fn too_many_event_requests_are_refused() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let (mut q, _) = admin_queue(&core, &default_nqn("a"), now);
    for cid in 0..4 {
        let aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, cid);
        assert!(matches!(q.submit(&aer, Vec::new(), now), Action::Deferred));
    }
    let aer = Sqe::new(admin::ASYNC_EVENT_REQUEST, 9);
    let reply = complete(q.submit(&aer, Vec::new(), now));
    assert_eq!(reply.cqe.status, Status::ASYNC_EVENT_LIMIT_EXCEEDED);
}

#[test]
fn keep_alive_timeout_ends_the_controller() {
    let core = core_with(vec![subsystem("a")]);
    let start = Instant::now();
    let nqn = default_nqn("a");
    let (mut admin, cntlid) = admin_queue(&core, &nqn, start);
    let io = io_queue(&core, &nqn, cntlid, 1, start);
    // KATO is 10 s: a keep alive at 8 s keeps it going past 12 s.
    let at = |s| start + Duration::from_secs(s);
    assert!(!admin.must_close(at(8)));
    let ka = Sqe::new(admin::KEEP_ALIVE, 3);
    assert!(complete(admin.submit(&ka, Vec::new(), at(8)))
        .cqe
        .status
        .is_success());
    assert!(!admin.must_close(at(12)));
    assert!(admin.must_close(at(19)));
    assert!(io.must_close(at(19)));
    drop(admin);
    assert!(core.controllers().is_empty());
}

#[test]
fn dropping_the_admin_queue_ends_its_io_queues() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let nqn = default_nqn("a");
    let (admin, cntlid) = admin_queue(&core, &nqn, now);
    let io = io_queue(&core, &nqn, cntlid, 1, now);
    assert!(!io.must_close(now));
    drop(admin);
    assert!(io.must_close(now));
}

#[test]
fn io_commands() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let nqn = default_nqn("a");
    let (_admin, cntlid) = admin_queue(&core, &nqn, now);
    let mut q = io_queue(&core, &nqn, cntlid, 1, now);
    let pattern: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();

    let (sqe, data) = rw(io::WRITE, 4, 2, pattern.clone(), true);
    let reply = run(q.submit(&sqe, data, now));
    assert!(reply.cqe.status.is_success());
    assert_eq!(reply.cqe.cid, 9);
    assert_eq!(reply.cqe.sq_id, 1);

    let (sqe, _) = rw(io::READ, 4, 2, Vec::new(), false);
    let reply = run(q.submit(&sqe, Vec::new(), now));
    assert_eq!(&reply.data[..], &pattern[..]);

    let (sqe, data) = rw(io::COMPARE, 4, 2, pattern.clone(), false);
    assert!(run(q.submit(&sqe, data, now)).cqe.status.is_success());
    let mut other = pattern.clone();
    other[100] ^= 1;
    let (sqe, data) = rw(io::COMPARE, 4, 2, other, false);
    assert_eq!(
        run(q.submit(&sqe, data, now)).cqe.status,
        Status::COMPARE_FAILURE
    );

    let mut flush = Sqe::new(io::FLUSH, 10);
    flush.set_nsid(NSID);
    assert!(run(q.submit(&flush, Vec::new(), now))
        .cqe
        .status
        .is_success());

    // Write Zeroes over the second block.
    let (mut sqe, _) = rw(io::WRITE_ZEROES, 5, 1, Vec::new(), false);
    sqe.set_sgl(SglDescriptor::default());
    assert!(run(q.submit(&sqe, Vec::new(), now)).cqe.status.is_success());
    let (sqe, _) = rw(io::READ, 4, 2, Vec::new(), false);
    let data = run(q.submit(&sqe, Vec::new(), now)).data;
    assert_eq!(&data[..512], &pattern[..512]);
    assert!(data[512..].iter().all(|&b| b == 0));

    // Deallocate the first block.
    let mut dsm = Sqe::new(io::DATASET_MANAGEMENT, 11);
    dsm.set_nsid(NSID);
    dsm.set_cdw(10, 0);
    dsm.set_cdw(11, 1 << 2);
    dsm.set_sgl(SglDescriptor::in_capsule(16));
    let mut range = vec![0u8; 16];
    range[4..8].copy_from_slice(&1u32.to_le_bytes());
    range[8..16].copy_from_slice(&4u64.to_le_bytes());
    assert!(run(q.submit(&dsm, range, now)).cqe.status.is_success());
    let (sqe, _) = rw(io::READ, 4, 1, Vec::new(), false);
    assert!(run(q.submit(&sqe, Vec::new(), now))
        .data
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn io_errors() {
    let core = core_with(vec![subsystem("a")]);
    let now = Instant::now();
    let nqn = default_nqn("a");
    let (_admin, cntlid) = admin_queue(&core, &nqn, now);
    let mut q = io_queue(&core, &nqn, cntlid, 1, now);
    let blocks = DEVICE_SIZE / 512;
    let (sqe, _) = rw(io::READ, blocks - 1, 2, Vec::new(), false);
    assert_eq!(
        complete(q.submit(&sqe, Vec::new(), now)).cqe.status,
        Status::LBA_OUT_OF_RANGE
    );
    let (sqe, _) = rw(io::READ, u64::MAX, 2, Vec::new(), false);
    assert_eq!(
        complete(q.submit(&sqe, Vec::new(), now)).cqe.status,
        Status::LBA_OUT_OF_RANGE
    );
    let (mut sqe, _) = rw(io::READ, 0, 1, Vec::new(), false);
    sqe.set_nsid(2);
    assert_eq!(
        complete(q.submit(&sqe, Vec::new(), now)).cqe.status,
        Status::INVALID_NAMESPACE
    );
    let (sqe, data) = rw(io::WRITE, 0, 2, vec![0; 512], false);
    assert_eq!(
        complete(q.submit(&sqe, data, now)).cqe.status,
        Status::DATA_SGL_LENGTH_INVALID
    );
    let unknown = {
        let mut s = Sqe::new(0x7e, 1);
        s.set_nsid(NSID);
        s
    };
    assert_eq!(
        complete(q.submit(&unknown, Vec::new(), now)).cqe.status,
        Status::INVALID_OPCODE
    );
}

#[test]
fn read_only_export_refuses_writes() {
    let device = Device::from_device(MemoryDevice::new(DEVICE_SIZE)).read_only();
    let core = core_with(vec![Arc::new(Subsystem::new("ro", device))]);
    let now = Instant::now();
    let nqn = default_nqn("ro");
    let (mut admin, cntlid) = admin_queue(&core, &nqn, now);
    let ns = identify(&mut admin, cns::NAMESPACE, NSID, now).data;
    assert_eq!(ns[99], 1);
    let mut q = io_queue(&core, &nqn, cntlid, 1, now);
    let (sqe, data) = rw(io::WRITE, 0, 1, vec![0; 512], false);
    assert_eq!(
        complete(q.submit(&sqe, data, now)).cqe.status,
        Status::NAMESPACE_WRITE_PROTECTED
    );
}
