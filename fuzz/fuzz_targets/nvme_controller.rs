//! The NVMe controller's session on arbitrary commands: an admin queue and an I/O
//! queue, connected and enabled the way a host does it, then any sequence of
//! 64-byte SQEs with data, on either queue, against an in-memory namespace. Nothing
//! may panic; every command is answered, now, by device work, or (an event request)
//! later.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_nvme::controller::{Action, Core, Queue, Settings, Subsystem};
use blockwire_nvme::fabrics::{Connect, ConnectData, PropertyCommand, DYNAMIC_CNTLID};
use blockwire_nvme::Sqe;
use libfuzzer_sys::fuzz_target;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz";

fn connect(core: &Arc<Core>, qid: u16, cntlid: u16, now: Instant) -> (Queue, u16) {
    let mut queue = Queue::new(core.clone(), None, false);
    let sqe = Connect {
        cid: 1,
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato: 0,
    }
    .to_sqe();
    let data = ConnectData {
        host_id: [1; 16],
        cntlid,
        subnqn: blockwire_nvme::default_nqn("fuzz"),
        hostnqn: HOST.into(),
    }
    .to_bytes();
    let cntlid = match queue.submit(&sqe, data, now) {
        Action::Complete(reply) => reply.cqe.result as u16,
        _ => unreachable!("Connect answers at once"),
    };
    (queue, cntlid)
}

fuzz_target!(|input: &[u8]| {
    let device = Device::from_device(MemoryDevice::new(1 << 20));
    let subsystem = Arc::new(Subsystem::new("fuzz", device));
    let core = Arc::new(Core::new(Settings::default(), vec![subsystem.clone()]));
    let mut now = Instant::now();
    let (mut admin, cntlid) = connect(&core, 0, DYNAMIC_CNTLID, now);
    let enable = PropertyCommand::Set {
        offset: 0x14,
        eight_bytes: false,
        value: 0x0046_0001,
    }
    .to_sqe(2);
    let _ = admin.submit(&enable, Vec::new(), now);
    let (mut io, _) = connect(&core, 1, cntlid, now);

    // Each record: a selector byte, a data length byte (× 16), the SQE, the data.
    let mut rest = input;
    while let Some((&selector, after)) = rest.split_first() {
        let Some((&len, after)) = after.split_first() else {
            break;
        };
        let Some(sqe) = Sqe::from_slice(after) else {
            break;
        };
        let after = &after[64..];
        let n = (usize::from(len) * 16).min(after.len());
        let data = after[..n].to_vec();
        rest = &after[n..];
        now += Duration::from_millis(u64::from(selector >> 4) * 100);
        let queue = if selector & 1 == 0 {
            &mut admin
        } else {
            &mut io
        };
        match queue.submit(&sqe, data, now) {
            Action::Complete(_) | Action::Deferred => {}
            Action::Io(cmd) => {
                let _ = cmd.execute();
            }
        }
        if selector & 2 != 0 {
            // A reload, now and then: the same subsystem or a new one.
            let next = if selector & 4 != 0 {
                subsystem.clone()
            } else {
                Arc::new(Subsystem::new(
                    "fuzz",
                    Device::from_device(MemoryDevice::new(1 << 16)),
                ))
            };
            core.replace_subsystems(vec![next]);
        }
        let _ = admin.must_close(now);
    }
});
