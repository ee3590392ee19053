//! `blockwire mount URI DIR`: a device as the one file `DIR/disk` through FUSE.
//! Data written through the file lands on the device and the other way round; the
//! file behaves as a block device does at its end; a loop device over an NBD export
//! mounted this way carries ext4 (mkfs, files, fsck clean), rides out a restart of
//! the target, and SIGINT unmounts and exits 0 (once no loop device uses the
//! file any more). Needs root, /dev/fuse and fusermount; skipped, saying why,
//! without them.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::{conformance, Device, FileDevice, FileOptions};
use blockwire_tests::{
    blockwire_bin, free_port, have, path_str, patterned_file, sparse_file, text, Served, MIB,
};

/// Returns early, saying why, unless FUSE mounts can be made here.
macro_rules! require_fuse {
    () => {
        if let Some(why) = missing_fuse() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// Returns early, saying why, unless loop devices and ext4 tools are at hand.
macro_rules! require_loop {
    () => {
        for program in ["losetup", "mkfs.ext4", "e2fsck", "mount", "umount"] {
            if !have(program) {
                eprintln!("skipped: {program} is not installed");
                return;
            }
        }
        if !Path::new("/dev/loop-control").exists() {
            eprintln!("skipped: no loop devices (/dev/loop-control is missing)");
            return;
        }
    };
}

fn missing_fuse() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (FUSE mounts, loop devices)");
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing (no FUSE in this kernel)");
    }
    if !have("fusermount") && !have("fusermount3") {
        return Some("fusermount is not installed (Debian's fuse package)");
    }
    None
}

/// Whether `dir` is a mount point now, by /proc/self/mountinfo.
fn is_mounted(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(path_str(&dir)))
}

/// A running `blockwire mount`: stopped (SIGTERM) on drop, and its directory
/// unmounted lazily should the process have left it mounted.
struct FuseMount {
    child: Child,
    dir: PathBuf,
    file: PathBuf,
}

impl FuseMount {
    /// Starts `blockwire mount URI DIR ARGS...` and waits until it says where the
    /// file is.
    fn start(uri: &str, dir: &Path, args: &[&str]) -> FuseMount {
        let mut child = Command::new(blockwire_bin())
            .arg("mount")
            .arg(uri)
            .arg(dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start blockwire mount");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("blockwire mount {uri} did not come up ({e}); exit {status:?}");
            }
        };
        let name = args
            .iter()
            .position(|a| *a == "--name")
            .map(|i| args[i + 1])
            .unwrap_or("disk");
        let file = dir.canonicalize().unwrap().join(name);
        assert!(line.contains(path_str(&file)), "{line}");
        assert!(line.contains("losetup -f --show"), "{line}");
        assert!(is_mounted(dir), "{} is not mounted: {line}", dir.display());
        FuseMount {
            child,
            dir: dir.to_path_buf(),
            file,
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits up to `limit` for the process to end; its exit code.
    fn wait_exit(&mut self, limit: Duration) -> Option<Option<i32>> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status.code());
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGTERM);
            if self.wait_exit(Duration::from_secs(10)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// A loop device over a file, detached on drop.
struct LoopDevice {
    device: String,
}

impl LoopDevice {
    fn attach(file: &Path) -> LoopDevice {
        let output = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(file)
            .output()
            .unwrap();
        assert!(output.status.success(), "losetup: {}", text(&output.stderr));
        LoopDevice {
            device: text(&output.stdout).trim().to_string(),
        }
    }

    fn detach(&mut self) {
        if !self.device.is_empty() {
            let status = Command::new("losetup")
                .arg("-d")
                .arg(&self.device)
                .status()
                .unwrap();
            assert!(status.success(), "losetup -d {}", self.device);
            self.device.clear();
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if !self.device.is_empty() {
            let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        }
    }
}

/// A file system mounted on a directory, unmounted on drop.
struct FsMount {
    dir: PathBuf,
    mounted: bool,
}

impl FsMount {
    fn mount(device: &str, dir: &Path, options: &str) -> FsMount {
        std::fs::create_dir_all(dir).unwrap();
        run_ok(Command::new("mount").args(["-o", options, device]).arg(dir));
        FsMount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    fn unmount(&mut self) {
        run_ok(Command::new("umount").arg(&self.dir));
        self.mounted = false;
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

fn run_ok(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: exit {:?}\n{}\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

fn read_all_at(file: &File, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, offset).unwrap();
    buf
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

#[test]
fn data_goes_through_to_the_backing_file_and_back() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let image = patterned_file(tmp.path(), "image", (16 * MIB) as usize, 3);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(path_str(&image), &dir, &[]);

    // Reading the whole file gives the image.
    assert!(std::fs::read(&mount.file).unwrap() == std::fs::read(&image).unwrap());

    // Written through FUSE, read from the backing file.
    let fuse = open_rw(&mount.file);
    let data: Vec<u8> = (0..3 * MIB as usize).map(|i| (i % 251) as u8).collect();
    fuse.write_all_at(&data, 5 * MIB + 7).unwrap();
    fuse.sync_all().unwrap();
    drop(fuse);
    let backing = File::open(&image).unwrap();
    assert!(read_all_at(&backing, 5 * MIB + 7, data.len()) == data);

    // Written to the backing file, read through FUSE by the next open.
    let other: Vec<u8> = (0..MIB as usize).map(|i| (i % 13) as u8 ^ 0x5a).collect();
    open_rw(&image).write_all_at(&other, 9 * MIB).unwrap();
    let fuse = File::open(&mount.file).unwrap();
    assert!(read_all_at(&fuse, 9 * MIB, other.len()) == other);
}

/// The device conformance suite every backend and initiator passes, run on the
/// FUSE file opened as a file device: what a program that takes a path (qemu, a
/// loop device, blockwire serve itself) sees through the mount.
#[test]
fn the_conformance_suite_passes_through_the_fuse_file() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_file(tmp.path(), "image", 16 * MIB);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(path_str(&image), &dir, &[]);
    let file = FileDevice::open(&mount.file, FileOptions::default()).unwrap();
    // The FUSE file answers no SEEK_DATA/SEEK_HOLE of the device behind it, so a
    // zeroed range may be reported as data: a correct, if less precise, answer.
    conformance::run_all_expecting(
        &Device::from_device(file),
        conformance::Expect {
            zeroed_reported_as_zero: false,
        },
    );
}

#[test]
fn the_file_behaves_like_a_block_device_at_any_offset_and_at_its_end() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    // Not a multiple of the page size: the last page is partly past the end.
    let size = MIB + 512;
    let image = sparse_file(tmp.path(), "image", size);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(path_str(&image), &dir, &["--name", "vol"]);
    assert_eq!(std::fs::metadata(&mount.file).unwrap().len(), size);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["vol"]);

    let fuse = open_rw(&mount.file);
    let backing = File::open(&image).unwrap();
    // Unaligned writes, one across a page boundary, land exactly.
    for (offset, len, fill) in [(1, 1, 0x11u8), (4095, 3, 0x22), (12345, 10_000, 0x33)] {
        let data = vec![fill; len];
        assert_eq!(fuse.write_at(&data, offset).unwrap(), len);
        assert!(read_all_at(&fuse, offset, len) == data);
        assert!(read_all_at(&backing, offset, len) == data);
    }
    assert_eq!(read_all_at(&backing, 0, 2), [0, 0x11]);
    assert_eq!(read_all_at(&backing, 4094, 5), [0, 0x22, 0x22, 0x22, 0]);

    // A write across the end is short, one at the end is refused (ENOSPC).
    assert_eq!(fuse.write_at(&[0x44; 4096], size - 100).unwrap(), 100);
    assert_eq!(read_all_at(&backing, size - 100, 100), vec![0x44; 100]);
    let err = fuse.write_at(&[1], size).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), size);
    assert_eq!(std::fs::metadata(&mount.file).unwrap().len(), size);

    // Reads stop at the end.
    let mut buf = vec![0; 8192];
    assert_eq!(fuse.read_at(&mut buf, size - 100).unwrap(), 100);
    assert_eq!(fuse.read_at(&mut buf, size).unwrap(), 0);

    // The size is the device's: truncating is refused.
    let err = fuse.set_len(4096).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");

    // Punching a hole zeroes the range, partial pages included.
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open descriptor we own.
    let punched = unsafe { libc::fallocate(fuse.as_raw_fd(), mode, 12000, 5000) };
    assert_eq!(punched, 0, "{}", std::io::Error::last_os_error());
    assert!(read_all_at(&fuse, 12345, 4655) == vec![0; 4655]);
    assert!(read_all_at(&backing, 12345, 4655) == vec![0; 4655]);
    assert!(read_all_at(&backing, 17000, 5345) == vec![0x33; 5345]);

    // fsync reaches the device.
    fuse.sync_all().unwrap();
}

#[test]
fn unaligned_writes_over_4k_iscsi_blocks_keep_their_neighbours() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let size = 8 * MIB;
    let image = patterned_file(tmp.path(), "lun.img", size as usize, 21);
    let served = Served::start_iscsi(&[path_str(&image), "--block-size", "4096"], "lun");
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(served.iscsi_url(), &dir, &[]);
    let mut expected = std::fs::read(&image).unwrap();
    let fuse = open_rw(&mount.file);

    // Partial 4 KiB blocks are read, merged and written whole.
    for (offset, len, fill) in [
        (1u64, 1usize, 0x11u8),
        (4095, 3, 0x22),
        (12345, 10_000, 0x33),
    ] {
        assert_eq!(fuse.write_at(&vec![fill; len], offset).unwrap(), len);
        expected[offset as usize..offset as usize + len].fill(fill);
    }
    // Eight writers, each on its own bytes of the same few blocks, at once.
    thread::scope(|s| {
        for writer in 0..8u64 {
            let fuse = &fuse;
            s.spawn(move || {
                for round in 0..32u64 {
                    let offset = 40_000 + round * 1000 + writer * 100;
                    fuse.write_all_at(&[0x80 | writer as u8; 100], offset)
                        .unwrap();
                }
            });
        }
    });
    for writer in 0..8u64 {
        for round in 0..32u64 {
            let at = (40_000 + round * 1000 + writer * 100) as usize;
            expected[at..at + 100].fill(0x80 | writer as u8);
        }
    }
    // A hole punched with unaligned edges: the whole blocks by the device, the
    // edges by writing zeroes.
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on an open descriptor we own.
    let punched = unsafe { libc::fallocate(fuse.as_raw_fd(), mode, 100_000, 20_000) };
    assert_eq!(punched, 0, "{}", std::io::Error::last_os_error());
    expected[100_000..120_000].fill(0);
    fuse.sync_all().unwrap();
    drop(fuse);

    let through_fuse = std::fs::read(&mount.file).unwrap();
    let first_difference = |got: &[u8]| got.iter().zip(&expected).position(|(a, b)| a != b);
    assert_eq!(first_difference(&through_fuse), None, "through FUSE");
    assert_eq!(
        first_difference(&std::fs::read(&image).unwrap()),
        None,
        "in the image"
    );
}

#[test]
fn an_nvme_tcp_namespace_reads_and_writes_through_the_file() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let image = patterned_file(tmp.path(), "ns.img", (8 * MIB) as usize, 17);
    let served = Served::start_nvme(&[path_str(&image)], "ns");
    let uri = served
        .nvme
        .first()
        .expect("an NVMe/TCP subsystem announced")
        .clone();
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(&uri, &dir, &[]);
    assert!(std::fs::read(&mount.file).unwrap() == std::fs::read(&image).unwrap());
    let fuse = open_rw(&mount.file);
    let data: Vec<u8> = (0..300_000).map(|i| (i % 199) as u8).collect();
    fuse.write_all_at(&data, 777).unwrap();
    fuse.sync_all().unwrap();
    assert!(read_all_at(&File::open(&image).unwrap(), 777, data.len()) == data);
}

#[test]
fn a_striped_volume_is_one_file_across_its_members() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let a = sparse_file(tmp.path(), "a.img", 4 * MIB);
    let b = sparse_file(tmp.path(), "b.img", 4 * MIB);
    let uri = format!("stripe:64K:{},{}", path_str(&a), path_str(&b));
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(&uri, &dir, &[]);
    assert_eq!(std::fs::metadata(&mount.file).unwrap().len(), 8 * MIB);
    // 256 KiB from offset 0: chunks 0 and 2 on a, 1 and 3 on b.
    let data: Vec<u8> = (0..256 * 1024).map(|i| (i / 1000) as u8 | 1).collect();
    let fuse = open_rw(&mount.file);
    fuse.write_all_at(&data, 0).unwrap();
    fuse.sync_all().unwrap();
    let chunk = 64 * 1024;
    let (a, b) = (File::open(&a).unwrap(), File::open(&b).unwrap());
    assert!(read_all_at(&a, 0, chunk) == data[..chunk]);
    assert!(read_all_at(&b, 0, chunk) == data[chunk..2 * chunk]);
    assert!(read_all_at(&a, chunk as u64, chunk) == data[2 * chunk..3 * chunk]);
    assert!(read_all_at(&b, chunk as u64, chunk) == data[3 * chunk..]);
}

#[test]
fn a_read_only_mount_refuses_writes() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let image = patterned_file(tmp.path(), "image", MIB as usize, 9);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = FuseMount::start(path_str(&image), &dir, &["--read-only"]);
    let meta = std::fs::metadata(&mount.file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o400);
    let err = OpenOptions::new()
        .write(true)
        .open(&mount.file)
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert!(std::fs::read(&mount.file).unwrap() == std::fs::read(&image).unwrap());
}

#[test]
fn refusals_come_in_one_line_before_anything_is_mounted() {
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_file(tmp.path(), "image", MIB);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let cases: [(&str, PathBuf, &str); 4] = [
        ("bogus://x/y", empty.clone(), "unknown URI scheme"),
        (
            path_str(&image),
            tmp.path().join("missing"),
            "no such directory",
        ),
        (path_str(&image), image.clone(), "not a directory"),
        (path_str(&image), tmp.path().to_path_buf(), "not empty"),
    ];
    for (uri, dir, expected) in cases {
        let output = Command::new(blockwire_bin())
            .arg("mount")
            .arg(uri)
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{uri} {dir:?}: {stderr}");
        assert!(stderr.contains(expected), "{uri} {dir:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(!is_mounted(&dir));
    }
}

/// Files of several sizes under a few directories; their contents, for checking.
fn fill_with_files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for d in 0..4 {
        let dir = root.join(format!("dir{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..12 {
            let len = 1000 + (d * 12 + f) * 37_001;
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + d * 3 + f) as u8).collect();
            let path = dir.join(format!("file{f}"));
            std::fs::write(&path, &data).unwrap();
            files.push((path, data));
        }
    }
    files
}

fn e2fsck_clean(device: &str) {
    let output = Command::new("e2fsck")
        .args(["-f", "-n", device])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "e2fsck -f -n {device}:\n{}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

#[test]
fn ext4_on_a_loop_device_over_an_nbd_export() {
    require_fuse!();
    require_loop!();
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_file(tmp.path(), "export.img", 256 * MIB);
    let served = Served::start(&[path_str(&image)], "export.img");
    let dir = tmp.path().join("fuse");
    std::fs::create_dir(&dir).unwrap();
    let mut mount = FuseMount::start(&served.uri(), &dir, &[]);
    let mut device = LoopDevice::attach(&mount.file);
    run_ok(Command::new("mkfs.ext4").args(["-q", "-F", &device.device]));
    let fs_dir = tmp.path().join("ext4");
    let mut fs = FsMount::mount(&device.device, &fs_dir, "rw");
    let files = fill_with_files(&fs_dir);
    run_ok(&mut Command::new("sync"));
    fs.unmount();
    e2fsck_clean(&device.device);

    // Mounted again, every file reads back as written.
    let mut fs = FsMount::mount(&device.device, &fs_dir, "ro");
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }
    fs.unmount();

    // SIGINT while the loop device holds the file: still mounted and served, and
    // unmounted (exit 0) once the loop device lets go.
    mount.signal(libc::SIGINT);
    assert_eq!(mount.wait_exit(Duration::from_secs(3)), None);
    assert!(is_mounted(&dir));
    e2fsck_clean(&device.device);
    device.detach();
    assert_eq!(mount.wait_exit(Duration::from_secs(20)), Some(Some(0)));
    assert!(!is_mounted(&dir));
    drop(served);
    // The export holds the file system, checked without FUSE or NBD.
    e2fsck_clean(path_str(&image));
}

/// `blockwire serve IMAGE --listen 127.0.0.1:PORT`, up and announced.
fn serve_on(image: &Path, port: u16) -> Served {
    let mut command = Command::new(blockwire_bin());
    command
        .arg("serve")
        .arg(image)
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    Served::spawn_ready(command, image.file_name().unwrap().to_str().unwrap())
}

#[test]
fn ext4_rides_out_a_target_restart() {
    require_fuse!();
    require_loop!();
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_file(tmp.path(), "restart.img", 128 * MIB);
    let port = free_port();
    let served = serve_on(&image, port);
    let dir = tmp.path().join("fuse");
    std::fs::create_dir(&dir).unwrap();
    let mut mount = FuseMount::start(&served.uri(), &dir, &[]);
    let mut device = LoopDevice::attach(&mount.file);
    run_ok(Command::new("mkfs.ext4").args(["-q", "-F", &device.device]));
    let fs_dir = tmp.path().join("ext4");
    let mut fs = FsMount::mount(&device.device, &fs_dir, "rw");
    std::fs::write(fs_dir.join("before"), vec![1u8; 300_000]).unwrap();
    run_ok(&mut Command::new("sync"));

    // The target dies; a write and fsync made while it is down wait for it.
    served.kill_hard();
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
    let path = fs_dir.join("during");
    let writer = {
        let (path, data) = (path.clone(), data.clone());
        thread::spawn(move || -> std::io::Result<()> {
            let file = File::create(&path)?;
            file.write_all_at(&data, 0)?;
            file.sync_all()
        })
    };
    thread::sleep(Duration::from_millis(1500));
    assert!(
        !writer.is_finished(),
        "the fsync returned with the target down"
    );
    let served = serve_on(&image, port);
    writer
        .join()
        .unwrap()
        .expect("write + fsync across the restart");

    // And afterwards.
    let after = fs_dir.join("after");
    let file = File::create(&after).unwrap();
    file.write_all_at(&data, 0).unwrap();
    file.sync_all().unwrap();
    drop(file);
    fs.unmount();
    e2fsck_clean(&device.device);
    let mut fs = FsMount::mount(&device.device, &fs_dir, "ro");
    assert!(std::fs::read(&path).unwrap() == data);
    assert!(std::fs::read(&after).unwrap() == data);
    fs.unmount();
    device.detach();
    mount.signal(libc::SIGTERM);
    assert_eq!(mount.wait_exit(Duration::from_secs(20)), Some(Some(0)));
    drop(served);
}

#[test]
fn sigint_unmounts_and_exits_zero() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let image = sparse_file(tmp.path(), "image", 4 * MIB);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mut mount = FuseMount::start(path_str(&image), &dir, &[]);
    open_rw(&mount.file).write_all_at(&[7u8; 4096], 0).unwrap();
    mount.signal(libc::SIGINT);
    assert_eq!(mount.wait_exit(Duration::from_secs(20)), Some(Some(0)));
    assert!(
        !is_mounted(&dir),
        "a stale mount is left on {}",
        dir.display()
    );
    // The directory is usable again, and empty.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let again = FuseMount::start(path_str(&image), &dir, &[]);
    assert_eq!(std::fs::metadata(&again.file).unwrap().len(), 4 * MIB);
}
