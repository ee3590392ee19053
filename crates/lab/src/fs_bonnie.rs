//! bonnie++ on a real file system, as the seeds ran it: in the initiator namespace,
//! `blockwire mount URI DIR` shows the cell's device as the file `DIR/disk`
//! (FUSE), `losetup --direct-io=on` makes it a block device, `mkfs.ext4` and
//! `mount` put ext4 on it, and Debian's `bonnie++ -f` runs there; then everything
//! is undone in reverse, on success, on failure and on SIGTERM alike.
//!
//! The seeds sized bonnie's data set at twice the client's RAM so that the page
//! cache could not hold it. This host has far more RAM than a quick run moves, so
//! bonnie++ runs in a memory cgroup of its own, a child of the lab's (cgroup v1's
//! `memory.limit_in_bytes` or v2's `memory.max`), limited to half the data set,
//! and is told that RAM (`-r`): the data set is twice what it may cache, as the
//! seeds had it. (bonnie++ 2.00's `-D` opens only the writing pass O_DIRECT; its
//! rewrite and read go through the page cache, which without the limit answered
//! the reads from memory.) Where no memory cgroup can be made, `-D` is the
//! fallback and the run says so. The loop device reads and writes its backing
//! file with direct I/O, so the only cache on the path is ext4's, inside the
//! limit. A memory cgroup v1 does not throttle its writers' dirty pages: bonnie
//! wrote faster than the link drained them, filled its limit with pages reclaim
//! could not drop, and was OOM-killed; so the loop device's own dirty pages are
//! held to a quarter of the limit (its bdi's `max_bytes` with `strict_limit`,
//! restored before the device is released).
//!
//! The shell script does the work (one `ip netns exec`, so the FUSE mount, the loop
//! device and the ext4 mount share one mount namespace, which ends with it); this
//! module writes it, sizes it, and turns its output into rows. Pure but for
//! [`read_outcome`].

use std::path::Path;

use blockwire_bench::{Latency, PhaseResult};

/// The workload's name in rows and reports.
pub const WORKLOAD: &str = "bonnie-fs";

/// How the tables name its rows.
pub const LABEL: &str = "bonnie++ -f on ext4 over blockwire mount";

/// Why an NFS cell has no such row.
pub const NFS_NOT_AVAILABLE: &str =
    "n/a: no NFS client in this kernel (bonnie++ needs a mounted NFS file system; ganesha \
     and libnfs are userspace)";

/// bonnie++'s chunk (its default): the request size of its block tests.
pub const CHUNK: u64 = 8192;

/// Sizes of one run: bonnie's data set and declared RAM (MiB), and the device
/// that holds ext4 with the data set in it (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub data_mib: u64,
    pub ram_mib: u64,
    pub device_bytes: u64,
}

/// The sizes for a cell whose data set is `size` bytes: bonnie writes `size`
/// (whole MiB, at least 16), declares half of it as RAM, and the device has a
/// quarter more plus 64 MiB for ext4's metadata and journal.
pub fn sizes(size: u64) -> Sizes {
    let data_mib = (size >> 20).max(16);
    Sizes {
        data_mib,
        ram_mib: data_mib / 2,
        device_bytes: (data_mib + data_mib / 4 + 64) << 20,
    }
}

/// The shell script, run as `sh -c SCRIPT sh URI DIR DATA_MIB RAM_MIB BINARY
/// TARGET_PID CGROUP LIMIT_FILE` (the last two empty without a memory cgroup). It
/// writes `DIR/bonnie.csv` (bonnie's CSV line), `DIR/cpu.txt` (uptime and the CPU
/// ticks of the mount process and the target before and after bonnie) and tells
/// what failed on stderr.
pub const SCRIPT: &str = r#"set -u
uri=$1 dir=$2 data=$3 ram=$4 bin=$5 target=$6 cg=$7 limit=$8
fuse=$dir/fuse mnt=$dir/mnt
mkdir -p "$fuse" "$mnt" || exit 1
fusepid= loop= mounted= bonnie= cgmade= bdiset=
down() {
    trap - EXIT INT TERM
    if [ -n "$bonnie" ]; then kill "$bonnie" 2>/dev/null; wait "$bonnie" 2>/dev/null; fi
    if [ -n "$cgmade" ]; then rmdir "$cg"; fi
    if [ -n "$mounted" ]; then umount "$mnt" || umount -l "$mnt"; fi
    if [ -n "$bdiset" ]; then
        echo "$ratio" >"$bdi/max_ratio_fine"
        echo "$strict" >"$bdi/strict_limit"
    fi
    if [ -n "$loop" ]; then losetup -d "$loop"; fi
    if [ -n "$fusepid" ]; then
        kill -INT "$fusepid" 2>/dev/null
        wait "$fusepid" 2>/dev/null
    fi
}
trap down EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
fail() { echo "$*" >&2; exit 1; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
snap() { echo "$1 $(cut -d' ' -f1 /proc/uptime) $(ticks "$fusepid") $(ticks "$target")" >>"$dir/cpu.txt"; }
"$bin" mount "$uri" "$fuse" >"$dir/mount.out" 2>"$dir/mount.err" &
fusepid=$!
waited=0
while [ ! -f "$fuse/disk" ]; do
    kill -0 "$fusepid" 2>/dev/null || { fusepid=; fail "blockwire mount exited: $(tail -n 2 "$dir/mount.err")"; }
    waited=$((waited + 1))
    [ "$waited" -le 300 ] || fail "blockwire mount: no $fuse/disk after 30 s"
    sleep 0.1
done
loop=$(losetup -f --show --direct-io=on "$fuse/disk") || { loop=; fail "losetup failed"; }
bdi=/sys/class/bdi/$(cat "/sys/block/${loop#/dev/}/dev")
ratio=$(cat "$bdi/max_ratio_fine") strict=$(cat "$bdi/strict_limit") || fail "no $bdi"
bdiset=1
echo $((ram * 262144)) >"$bdi/max_bytes" && echo 1 >"$bdi/strict_limit" || fail "cannot limit $bdi's dirty bytes"
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0,nodiscard "$loop" 2>"$dir/mkfs.err" || fail "mkfs.ext4: $(tail -n 2 "$dir/mkfs.err")"
mount -t ext4 "$loop" "$mnt" 2>"$dir/mount-ext4.err" || fail "mount: $(tail -n 2 "$dir/mount-ext4.err")"
mounted=1
if [ -n "$cg" ]; then
    mkdir "$cg" || fail "cannot make the memory cgroup $cg"
    cgmade=1
    echo $((ram * 1048576)) >"$cg/$limit" || fail "cannot limit $cg to $ram MiB"
    direct=
else
    direct=-D
fi
snap start
sh -c 'if [ -n "$0" ]; then echo $$ >"$0/cgroup.procs" || exit 1; fi; exec "$@"' "$cg" \
    bonnie++ $direct -f -n 0 -u root -d "$mnt" -s "$data" -r "$ram" -q -m lab >"$dir/bonnie.csv" 2>"$dir/bonnie.txt" &
bonnie=$!
wait "$bonnie"
status=$?
bonnie=
snap end
[ "$status" -eq 0 ] || fail "bonnie++ failed ($status): $(tail -n 2 "$dir/bonnie.txt")"
"#;

/// The figures of bonnie++'s CSV line (format 1.98, as bonnie++ 2.00 writes it):
/// KiB/s and CPU% of the block write, rewrite and block read, seeks per second.
/// `None` where bonnie printed no figure ("+++++": too fast to time, or `-f`'s
/// skipped per-character tests).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BonnieCsv {
    pub write: Option<(f64, f64)>,
    pub rewrite: Option<(f64, f64)>,
    pub read: Option<(f64, f64)>,
    pub seeks: Option<(f64, f64)>,
}

/// Parses bonnie++'s CSV line. Format 1.98 (bonnie++ 1.98 and 2.0x) has two
/// fields more before the figures than 1.96 (the seeds' 1.96 lines): the number
/// of seeks and of seeking processes.
pub fn parse_csv(line: &str) -> Result<BonnieCsv, String> {
    let fields: Vec<&str> = line.trim().split(',').collect();
    let first = match fields.first().copied() {
        Some("1.98") => 9,
        Some("1.96" | "1.97") => 7,
        other => {
            return Err(format!(
                "not a bonnie++ CSV line (format {other:?}): '{}'",
                line.trim()
            ))
        }
    };
    if fields.len() < first + 12 {
        return Err(format!("a short bonnie++ CSV line: '{}'", line.trim()));
    }
    let pair = |index: usize| -> Option<(f64, f64)> {
        let value: f64 = fields[first + index].trim().parse().ok()?;
        let cpu: f64 = fields[first + index + 1].trim().parse().unwrap_or(0.0);
        Some((value, cpu))
    };
    // putc, put_block, rewrite, getc, get_block, seeks: value and CPU each.
    Ok(BonnieCsv {
        write: pair(2),
        rewrite: pair(4),
        read: pair(8),
        seeks: pair(10),
    })
}

/// CPU over bonnie's run from `cpu.txt`: (initiator %, target %) of one core, the
/// initiator being the `blockwire mount` process. `clock_ticks` is the kernel's
/// USER_HZ.
pub fn parse_cpu(text: &str, clock_ticks: f64) -> Option<(f64, f64)> {
    let line = |tag: &str| -> Option<[f64; 3]> {
        let fields: Vec<f64> = text
            .lines()
            .find(|l| l.starts_with(tag))?
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        fields.try_into().ok()
    };
    let (start, end) = (line("start ")?, line("end ")?);
    let wall = end[0] - start[0];
    if wall <= 0.0 || clock_ticks <= 0.0 {
        return None;
    }
    let pct = |k: usize| (end[k] - start[k]).max(0.0) / clock_ticks / wall * 100.0;
    Some((pct(1), pct(2)))
}

/// The rows of one run: block write, rewrite, block read (MB/s, 10^6 bytes) and
/// seeks (per second), each with bonnie's own CPU% folded into the initiator's
/// (bonnie++ and the mount process both run on the initiator). A figure bonnie
/// did not time is left out, and said in `notes`.
pub fn phases(
    csv: &BonnieCsv,
    data_bytes: u64,
    cpu: Option<(f64, f64)>,
    notes: &mut Vec<String>,
) -> Vec<PhaseResult> {
    let (initiator, target) = match cpu {
        Some((i, t)) => (i, Some(t)),
        None => (0.0, None),
    };
    let mut out = Vec::new();
    for (op, figure) in [
        ("write", csv.write),
        ("rewrite", csv.rewrite),
        ("read", csv.read),
        ("seeks", csv.seeks),
    ] {
        let Some((value, bonnie_cpu)) = figure else {
            notes.push(format!(
                "{LABEL}: bonnie++ printed no {op} figure (too fast to time: give a larger --size)"
            ));
            continue;
        };
        let (mb_per_s, iops) = if op == "seeks" {
            (0.0, value)
        } else {
            let mb = value * 1024.0 / 1e6;
            (mb, mb * 1e6 / CHUNK as f64)
        };
        let cpu_percent = initiator + bonnie_cpu;
        out.push(PhaseResult {
            workload: WORKLOAD.into(),
            op: op.into(),
            block_size: CHUNK,
            queue_depth: 1,
            bytes: if op == "seeks" { 0 } else { data_bytes },
            ops: 0,
            seconds: 0.0,
            mb_per_s,
            iops,
            latency_us: Latency::default(),
            latency_histogram: Vec::new(),
            cpu_percent,
            target_cpu_percent: target,
            mb_per_s_per_cpu_percent: (cpu_percent > 0.0 && mb_per_s > 0.0)
                .then(|| mb_per_s / cpu_percent),
        });
    }
    out
}

/// Where bonnie's memory cgroup goes: a child named `name` of this process's own
/// memory cgroup, from `/proc/self/cgroup`'s text. cgroup v1's memory hierarchy
/// (under `v1_root`) when this process is in one, else v2's (under `v2_root`) when
/// the memory controller is enabled for its children (`cgroup.subtree_control`
/// of the parent, read through `read`). Returns the directory and the name of
/// its limit file.
pub fn memory_cgroup(
    self_cgroup: &str,
    name: &str,
    v1_root: &Path,
    v2_root: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<(std::path::PathBuf, &'static str)> {
    let relative = |path: &str| path.trim_start_matches('/').to_string();
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let parent = v1_root.join(relative(path));
            return read(&parent.join("memory.limit_in_bytes"))
                .map(|_| (parent.join(name), "memory.limit_in_bytes"));
        }
    }
    let path = self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))?;
    let parent = v2_root.join(relative(path));
    let enabled = read(&parent.join("cgroup.subtree_control"))?;
    enabled
        .split_whitespace()
        .any(|c| c == "memory")
        .then(|| (parent.join(name), "memory.max"))
}

/// [`memory_cgroup`] for this process on this host.
pub fn this_memory_cgroup(name: &str) -> Option<(std::path::PathBuf, &'static str)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_cgroup(
        &text,
        name,
        Path::new("/sys/fs/cgroup/memory"),
        Path::new("/sys/fs/cgroup"),
        |p| std::fs::read_to_string(p).ok(),
    )
}

/// Reads what a finished run left in `dir`: the rows, and notes on what is
/// missing.
pub fn read_outcome(dir: &Path, sizes: Sizes) -> Result<(Vec<PhaseResult>, Vec<String>), String> {
    let text = std::fs::read_to_string(dir.join("bonnie.csv"))
        .map_err(|e| format!("bonnie++ wrote no CSV: {e}"))?;
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("bonnie++ wrote an empty CSV")?;
    let csv = parse_csv(line)?;
    // SAFETY: sysconf reads a constant of the kernel.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = std::fs::read_to_string(dir.join("cpu.txt"))
        .ok()
        .and_then(|t| parse_cpu(&t, ticks));
    let mut notes = Vec::new();
    let rows = phases(&csv, sizes.data_mib << 20, cpu, &mut notes);
    Ok((rows, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What bonnie++ 2.00a printed here for `-f -n 0 -s 64 -r 32 -q -D` on ext4.
    const FAST: &str = "1.98,2.00a,x,1,1795888695,64M,,8192,5,,,+++++,+++,+++++,+++,,,\
                        +++++,+++,+++++,+++,,,,,,,,,,,,,,,,,,,8188us,5567us,,4070us,30103us,,,,,,";

    #[test]
    fn a_198_line_gives_block_write_rewrite_read_and_seeks() {
        let line = "1.98,2.00a,lab,1,1795888695,256M,,8192,5,,,112810,6,33778,5,,,117927,8,\
                    4112,50,,,,,,,,,,,,,,,,,,,3800ms,100s,,4251us,14261us,,,,,,";
        let csv = parse_csv(line).unwrap();
        assert_eq!(csv.write, Some((112810.0, 6.0)));
        assert_eq!(csv.rewrite, Some((33778.0, 5.0)));
        assert_eq!(csv.read, Some((117927.0, 8.0)));
        assert_eq!(csv.seeks, Some((4112.0, 50.0)));
        let mut notes = Vec::new();
        let rows = phases(&csv, 256 << 20, Some((30.0, 12.0)), &mut notes);
        assert!(notes.is_empty());
        let ops: Vec<&str> = rows.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(ops, ["write", "rewrite", "read", "seeks"]);
        // KiB/s to MB/s; the seeds' 117927 K/sec over gigabit is 120.8 MB/s.
        assert!(
            (rows[2].mb_per_s - 120.757).abs() < 0.01,
            "{}",
            rows[2].mb_per_s
        );
        assert_eq!(rows[3].iops, 4112.0);
        assert_eq!(rows[3].mb_per_s, 0.0);
        // The mount process's 30% and bonnie's own 8% on the initiator.
        assert_eq!(rows[2].cpu_percent, 38.0);
        assert_eq!(rows[2].target_cpu_percent, Some(12.0));
        assert!(rows
            .iter()
            .all(|r| r.workload == WORKLOAD && r.block_size == CHUNK));
    }

    #[test]
    fn the_seeds_196_lines_parse_too() {
        // Seed 004, bonnie++ 1.96 over 10 GbE.
        let line = "1.96,1.96,mutt,1,1467952867,15736M,,1471,99,233995,11,127921,11,4294,99,\
                    280146,9,5055,54,16,,,,,6793,31";
        let csv = parse_csv(line).unwrap();
        assert_eq!(csv.write, Some((233995.0, 11.0)));
        assert_eq!(csv.read, Some((280146.0, 9.0)));
        assert_eq!(csv.seeks, Some((5055.0, 54.0)));
    }

    #[test]
    fn untimed_figures_are_left_out_with_a_note_and_garbage_is_refused() {
        let csv = parse_csv(FAST).unwrap();
        assert_eq!(csv, BonnieCsv::default());
        let mut notes = Vec::new();
        assert!(phases(&csv, 64 << 20, None, &mut notes).is_empty());
        assert_eq!(notes.len(), 4);
        assert!(notes[0].contains("no write figure"), "{notes:?}");
        assert!(parse_csv("Version 2.00a").is_err());
        assert!(parse_csv("1.98,2.00a,x").is_err());
        assert!(parse_csv("").is_err());
    }

    #[test]
    fn cpu_is_the_tick_difference_over_the_wall_time() {
        let text = "start 100.00 500 1000\nend 110.00 800 1100\n";
        // 300 ticks of 100 Hz in 10 s: 30%; the target 100 ticks: 10%.
        assert_eq!(parse_cpu(text, 100.0), Some((30.0, 10.0)));
        assert_eq!(parse_cpu("start 1 2 3\n", 100.0), None);
        assert_eq!(parse_cpu("start 5 1 1\nend 5 2 2\n", 100.0), None);
        assert_eq!(parse_cpu("start a b c\nend 1 2 3\n", 100.0), None);
    }

    #[test]
    fn the_data_set_is_twice_the_declared_ram_and_fits_the_device() {
        let s = sizes(256 << 20);
        assert_eq!((s.data_mib, s.ram_mib), (256, 128));
        assert_eq!(s.device_bytes, (256 + 64 + 64) << 20);
        assert!(s.data_mib >= 2 * s.ram_mib);
        assert_eq!(
            sizes(1 << 20).data_mib,
            16,
            "bonnie++'s smallest useful run"
        );
    }

    #[test]
    fn the_script_undoes_everything_in_reverse() {
        // The teardown runs on EXIT (TERM and INT exit through it): bonnie, the
        // ext4 mount, the loop device, the FUSE mount, in that order.
        let down =
            &SCRIPT[SCRIPT.find("down() {").unwrap()..SCRIPT.find("trap down EXIT").unwrap()];
        let order: Vec<usize> = [
            "kill \"$bonnie\"",
            "umount \"$mnt\"",
            "echo \"$strict\"",
            "losetup -d",
            "kill -INT \"$fusepid\"",
        ]
        .iter()
        .map(|step| down.find(step).unwrap_or_else(|| panic!("{step} missing")))
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        for flag in [
            "-D",
            "-f",
            "-n 0",
            "-u root",
            "-r \"$ram\"",
            "--direct-io=on",
        ] {
            assert!(SCRIPT.contains(flag), "{flag}");
        }
    }
}
