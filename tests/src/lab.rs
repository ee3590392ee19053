//! What a `blockwire lab` run leaves behind, for the lab tests to check that it is
//! nothing.

use std::process::Command;

use crate::text;

/// The names and paths a lab run of process `pid` makes all start with this.
pub fn prefix(pid: u32) -> String {
    format!("bwlab-{pid}-")
}

/// What a lab run of `pid` left: namespaces, processes whose command line names
/// its work directory, loop devices backed by a file in it, memory cgroups (bonnie's),
/// and the directory. Each line says what it is, e.g. `namespace bwlab-…`.
pub fn leftovers(pid: u32) -> Vec<String> {
    let prefix = prefix(pid);
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                found.push(format!("namespace {name}"));
            }
        }
    }
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&prefix) {
            found.push(format!("process {:?}: {cmdline}", entry.file_name()));
        }
    }
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    for line in text(&loops.stdout).lines() {
        if line.contains(&prefix) {
            found.push(format!("loop device {line}"));
        }
    }
    // bonnie's memory cgroup is a child of the lab's, which is this test's.
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    if let Some(path) = cgroups
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
    {
        let dir = format!("/sys/fs/cgroup/memory{path}");
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                found.push(format!("memory cgroup {name}"));
            }
        }
    }
    for entry in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) {
            found.push(format!("directory {name}"));
        }
    }
    found
}
