//! Routing, the inline measurement and the worker hand-off.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;

const MIB: usize = 1 << 20;

#[test]
fn small_and_lone_requests_stay_inline() {
    let engine: Engine = Engine::new(EngineConfig::default());
    assert_eq!(engine.route(Request::read(4096), || true), Route::Inline);
    assert_eq!(engine.route(Request::write(MIB), || false), Route::Inline);
    assert_eq!(engine.route(Request::flush(), || true), Route::Inline);
    assert_eq!(engine.route(Request::other(), || true), Route::Inline);
}

#[test]
fn large_requests_with_more_waiting_go_to_workers() {
    let engine: Engine = Engine::new(EngineConfig::default());
    assert_eq!(engine.route(Request::read(MIB), || true), Route::Worker);
    assert_eq!(engine.route(Request::write(MIB), || true), Route::Worker);
}

#[test]
fn more_waiting_is_only_asked_of_large_requests() {
    let engine: Engine = Engine::new(EngineConfig::default());
    let asked = AtomicUsize::new(0);
    let ask = || {
        asked.fetch_add(1, Ordering::Relaxed);
        true
    };
    engine.route(Request::read(4096), ask);
    engine.route(Request::flush(), ask);
    assert_eq!(asked.load(Ordering::Relaxed), 0);
    engine.route(Request::read(MIB), ask);
    assert_eq!(asked.load(Ordering::Relaxed), 1);
}

#[test]
fn inline_runs_teach_the_policy() {
    let engine: Engine = Engine::new(EngineConfig::default());
    // Cheap copies measured inline: large writes stay here.
    for _ in 0..64 {
        let ran: Result<(), ()> = engine.inline(Request::write(MIB), || Ok(()));
        assert!(ran.is_ok());
    }
    let estimate = engine.offload_policy().ns_per_kib(Transfer::Write);
    assert!(estimate < 200, "{estimate} ns/KiB");
    // An attempt that would block is not a measurement.
    let before = engine.offload_policy().ns_per_kib(Transfer::Read);
    let blocked: Result<(), &str> = engine.inline(Request::read(MIB), || {
        std::thread::sleep(Duration::from_millis(5));
        Err("would block")
    });
    assert!(blocked.is_err());
    assert_eq!(engine.offload_policy().ns_per_kib(Transfer::Read), before);
}

#[test]
fn by_device_routes_by_the_device_alone() {
    let inline: Engine = Engine::new(EngineConfig {
        policy: Policy::ByDevice {
            completes_inline: true,
        },
        ..EngineConfig::default()
    });
    assert_eq!(inline.route(Request::read(MIB), || true), Route::Inline);
    assert_eq!(inline.route(Request::flush(), || true), Route::Inline);
    let direct: Engine = Engine::new(EngineConfig {
        policy: Policy::ByDevice {
            completes_inline: false,
        },
        ..EngineConfig::default()
    });
    assert_eq!(direct.route(Request::read(512), || false), Route::Worker);
}

#[test]
fn offloaded_bytes_count_until_the_slot_is_dropped() {
    let pool = WorkerPool::new("engine-test", 2);
    let engine: Engine = Engine::new(EngineConfig::default());
    let (slots_to, slots) = std::sync::mpsc::channel();
    for _ in 0..OFFLOAD_BYTES / MIB {
        assert_eq!(engine.route(Request::write(MIB), || true), Route::Worker);
        let to = slots_to.clone();
        engine.offload(&pool, Request::write(MIB), move |slot| {
            slot.run(|| ());
            // The answer has not left yet: the slot is held.
            to.send(slot).unwrap();
        });
    }
    let held: Vec<Slot> = slots.iter().take(OFFLOAD_BYTES / MIB).collect();
    assert_eq!(engine.offload_policy().offloaded_bytes(), OFFLOAD_BYTES);
    // Enough is on the workers: the next one runs here.
    assert_eq!(engine.route(Request::write(MIB), || true), Route::Inline);
    drop(held);
    assert_eq!(engine.offload_policy().offloaded_bytes(), 0);
    engine.wait_idle();
}

#[test]
fn workers_are_bounded_and_drain() {
    let pool = WorkerPool::new("engine-test", 6);
    let engine: Engine = Engine::new(EngineConfig {
        max_in_flight: 3,
        ..EngineConfig::default()
    });
    let (running, most, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    for _ in 0..500 {
        let (running, most, done) = (running.clone(), most.clone(), done.clone());
        engine.offload(&pool, Request::flush(), move |slot| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::yield_now();
            running.fetch_sub(1, Ordering::SeqCst);
            done.fetch_add(1, Ordering::SeqCst);
            drop(slot);
        });
    }
    engine.wait_idle();
    assert_eq!(done.load(Ordering::SeqCst), 500);
    assert!(most.load(Ordering::SeqCst) <= 3);
    assert!(!engine.workers_full());
}

#[test]
fn without_a_queue_submit_gives_the_work_back() {
    let engine: Engine<u32> = Engine::new(EngineConfig::default());
    let back = engine.submit(Request::read(4096), QueueWork::read(0, 4096), 7);
    assert!(matches!(back, Err((_, 7))));
    assert!(!engine.queue_full());
}
