//! Our AoE initiator rides out restarts of our AoE target (issue 18): a
//! `blockwire copy --verify` of a file of random bytes to the lab target while the
//! target is killed with SIGKILL and restarted on the same file twice, a few seconds
//! apart and inside the initiator's 10 s timeout — at the same MAC, and at a new MAC
//! each time (the initiator finds it again with a config query). And a target that
//! comes back on another file (another size) is not used. Needs root.

use std::io::Write;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use blockwire_tests::aoe::{AoeLab, SHELF, SLOT};
use blockwire_tests::{blockwire_bin, path_str, require_root, text, MIB};

const SIZE: u64 = 256 * MIB;
/// Killed target to restarted: seconds, well inside the 10 s timeout.
const DOWN: Duration = Duration::from_millis(2500);

fn uri() -> String {
    format!("aoe://eth0/e{SHELF}.{SLOT}")
}

fn sparse_file(dir: &tempfile::TempDir, name: &str, size: u64) -> String {
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    path_str(&path).to_string()
}

/// `size` bytes from a xorshift generator seeded from the clock: data no pattern or
/// stale copy could pass for.
fn random_file(dir: &tempfile::TempDir, name: &str, size: u64) -> String {
    let path = dir.path().join(name);
    let mut state = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..size / block.len() as u64 {
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        file.write_all(&block).unwrap();
    }
    file.flush().unwrap();
    path_str(&path).to_string()
}

/// `blockwire copy SOURCE aoe://eth0/e1.2 --verify` in the initiator namespace.
fn start_copy(lab: &AoeLab, source: &str) -> Child {
    lab.lab
        .command_in(lab.lab.initiator_ns(), blockwire_bin())
        .args([
            "copy",
            source,
            &uri(),
            "--verify",
            "--quiet",
            "--timeout",
            "10",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start blockwire copy")
}

/// Kills the target under a running copy, waits `DOWN`, runs `meanwhile` (a new
/// MAC, say) and restarts it with `args`.
fn restart_under(
    lab: &mut AoeLab,
    copy: &mut Child,
    args: &[&str],
    meanwhile: impl FnOnce(&AoeLab),
) {
    assert!(
        copy.try_wait().unwrap().is_none(),
        "the copy ended before the target was killed: nothing tested"
    );
    lab.kill_target();
    meanwhile(lab);
    std::thread::sleep(DOWN);
    lab.restart(args);
}

/// Waits for the copy, at most a minute (then kills it, by its PID).
fn finish(mut copy: Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(60);
    while copy.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = copy.kill();
            let output = copy.wait_with_output().unwrap();
            panic!("the copy hung: {}", text(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    copy.wait_with_output().unwrap()
}

/// A copy with --verify through two SIGKILLs and restarts of the target; with
/// `new_macs`, the target's interface has another MAC after each.
fn copy_through_two_restarts(short: &str, new_macs: bool) {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let file = sparse_file(&dir, "aoe.img", SIZE);
    let source = random_file(&dir, "source.img", SIZE);
    let mut lab = AoeLab::start(short, 1500, &[&file]);
    let mut copy = start_copy(&lab, &source);
    // The first kill while it writes, the second soon after the first restart
    // (while it writes or verifies).
    std::thread::sleep(Duration::from_millis(400));
    for round in 1..=2u8 {
        restart_under(&mut lab, &mut copy, &[&file], |lab| {
            if new_macs {
                lab.set_target_mac(0, &format!("02:00:00:00:{round:02x}:{:02x}", short.len()));
            }
        });
        if round == 1 {
            std::thread::sleep(Duration::from_millis(700));
        }
    }
    let output = finish(copy);
    assert!(
        output.status.success(),
        "copy through restarts: {}\n{}",
        output.status,
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).contains("verified: destination matches source"),
        "{}",
        text(&output.stdout)
    );
    let served = lab.served.take().expect("the restarted target");
    served.terminate();
    let written = std::fs::read(&file).unwrap();
    let expected = std::fs::read(&source).unwrap();
    assert!(
        written == expected,
        "the target's file differs from the source"
    );
    if new_macs {
        let stderr = text(&output.stderr);
        assert!(stderr.contains("the target moved from"), "{stderr}");
    }
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn copy_with_verify_rides_out_two_target_restarts() {
    require_root!();
    copy_through_two_restarts("rr", false);
}

#[test]
fn copy_with_verify_rides_out_two_target_restarts_at_new_macs() {
    require_root!();
    copy_through_two_restarts("rm", true);
}

/// A target restarted at the same address on a smaller file is another device:
/// the copy fails, saying so, rather than writing to it.
#[test]
fn a_target_back_on_a_file_of_another_size_fails_the_copy() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let file = sparse_file(&dir, "aoe.img", SIZE);
    // Larger than what the copy wrote by then: its writes stay in range there, so
    // only the identity check can tell.
    let other = sparse_file(&dir, "other.img", SIZE / 4 * 3);
    let source = random_file(&dir, "source.img", SIZE);
    let mut lab = AoeLab::start("rz", 1500, &[&file]);
    let mut copy = start_copy(&lab, &source);
    std::thread::sleep(Duration::from_millis(400));
    restart_under(&mut lab, &mut copy, &[&other], |_| {});
    let output = finish(copy);
    let stderr = text(&output.stderr);
    assert!(
        !output.status.success(),
        "copied to another device: {stderr}"
    );
    assert!(
        stderr.contains("is not the device opened any more")
            && stderr.contains("393216 sectors")
            && stderr.contains("524288"),
        "{stderr}"
    );
}
