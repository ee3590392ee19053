//! An NFS server for tests and the lab: nfs-ganesha (FSAL_VFS) with its own rpcbind,
//! exporting one directory over NFSv3 and NFSv4 (TCP, AUTH_SYS, no root squash).
//!
//! rpcbind listens on a unix socket at `/run/rpcbind.sock` and ganesha registers
//! its programs through that socket. `/run` is one directory for every network
//! namespace on the host, so two servers would share (and fight over) one rpcbind.
//! Each server therefore gets a mount namespace of its own with a private tmpfs on
//! `/run`: rpcbind is started in a fresh mount namespace (inside the network
//! namespace, when one is given) and ganesha joins both of its namespaces
//! (`nsenter`). Servers in different network namespaces run side by side; two in
//! the same network namespace would still clash on ports 111 and 2049.
//!
//! Everything ganesha writes (configuration, log, pid file, NFSv4 recovery
//! directory) goes under the configuration's state directory, which, like the
//! exported directory, must not be under `/run` (the private tmpfs hides it).
//! Needs root; the two processes are ours, registered for the lab's teardown and
//! stopped, by PID, on drop.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cleanup;
use crate::netns;

/// NFS's registered port; ganesha serves NFSv3 and NFSv4 on it.
pub const NFS_PORT: u16 = 2049;

/// How long `start` waits for each process to come up.
const START_LIMIT: Duration = Duration::from_secs(20);

/// The line ganesha logs once every service is up.
const READY_LINE: &str = "NFS SERVER INITIALIZED";

/// Where and what an [`NfsServer`] serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsServerConfig {
    /// The network namespace to run in (under `/run/netns`); `None` for this one.
    pub netns: Option<String>,
    /// The address ganesha listens on (rpcbind listens on every address). Must be
    /// configured on an interface other than loopback: ganesha resolves it with
    /// AI_ADDRCONFIG.
    pub listen: IpAddr,
    /// The directory exported.
    pub export_dir: PathBuf,
    /// The export's NFSv4 pseudo path, also accepted as the NFSv3 mount path, e.g.
    /// `/blockwire`.
    pub pseudo: String,
    /// Where ganesha's configuration, log, pid file and recovery directory go;
    /// created when missing, its contents removed on drop.
    pub state_dir: PathBuf,
}

/// A running ganesha and its rpcbind. Dropping it stops both and removes what it
/// wrote to the state directory.
#[derive(Debug)]
pub struct NfsServer {
    // Dropped in this order: ganesha unregisters from rpcbind as it stops.
    ganesha: Process,
    rpcbind: Process,
    listen: IpAddr,
    pseudo: String,
    state_dir: PathBuf,
    made_state_dir: bool,
}

impl NfsServer {
    /// Starts rpcbind and ganesha and returns once ganesha has logged that it is up
    /// and accepts TCP connections on port 2049. An error names what failed, with
    /// the last lines of ganesha's log when it got that far.
    pub fn start(config: &NfsServerConfig) -> Result<NfsServer, String> {
        check_config(config)?;
        let made_state_dir = !config.state_dir.exists();
        std::fs::create_dir_all(config.state_dir.join("recovery"))
            .map_err(|e| format!("cannot create {}: {e}", config.state_dir.display()))?;
        let files = StateFiles::new(&config.state_dir);
        let cleanup_state = |error: String| {
            remove_state(&config.state_dir, made_state_dir);
            error
        };
        std::fs::write(&files.config, ganesha_config(config, &files.recovery))
            .map_err(|e| cleanup_state(format!("cannot write {}: {e}", files.config.display())))?;

        let mut rpcbind = start_rpcbind(config.netns.as_deref()).map_err(&cleanup_state)?;
        if let Err(e) = rpcbind.wait_for_socket() {
            drop(rpcbind);
            return Err(cleanup_state(e));
        }
        let mut ganesha = match start_ganesha(rpcbind.pid(), &files) {
            Ok(ganesha) => ganesha,
            Err(e) => {
                drop(rpcbind);
                return Err(cleanup_state(e));
            }
        };
        if let Err(e) = ganesha.wait_until_ready(&files.log, config) {
            drop(ganesha);
            drop(rpcbind);
            return Err(cleanup_state(e));
        }
        Ok(NfsServer {
            ganesha,
            rpcbind,
            listen: config.listen,
            pseudo: config.pseudo.clone(),
            state_dir: config.state_dir.clone(),
            made_state_dir,
        })
    }

    /// The libnfs URL of `file` in the export: `nfs://ADDR/PSEUDO/FILE`.
    pub fn url(&self, file: &str) -> String {
        nfs_url(self.listen, &self.pseudo, file)
    }

    /// ganesha's and rpcbind's PIDs, for CPU accounting.
    pub fn pids(&self) -> Vec<u32> {
        vec![self.ganesha.pid(), self.rpcbind.pid()]
    }

    /// ganesha's log file.
    pub fn log_path(&self) -> PathBuf {
        StateFiles::new(&self.state_dir).log
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        self.ganesha.stop();
        self.rpcbind.stop();
        remove_state(&self.state_dir, self.made_state_dir);
    }
}

/// `nfs://ADDR/PSEUDO/FILE`, an IPv6 address in brackets.
fn nfs_url(listen: IpAddr, pseudo: &str, file: &str) -> String {
    let host = match listen {
        IpAddr::V4(addr) => addr.to_string(),
        IpAddr::V6(addr) => format!("[{addr}]"),
    };
    let pseudo = pseudo.trim_matches('/');
    let file = file.trim_start_matches('/');
    format!("nfs://{host}/{pseudo}/{file}")
}

/// The files ganesha is pointed at.
struct StateFiles {
    config: PathBuf,
    log: PathBuf,
    pid: PathBuf,
    recovery: PathBuf,
}

impl StateFiles {
    fn new(dir: &Path) -> StateFiles {
        StateFiles {
            config: dir.join("ganesha.conf"),
            log: dir.join("ganesha.log"),
            pid: dir.join("ganesha.pid"),
            recovery: dir.join("recovery"),
        }
    }
}

/// Removes what `start` wrote; the whole directory when it made it.
fn remove_state(dir: &Path, made_dir: bool) {
    if made_dir {
        let _ = std::fs::remove_dir_all(dir);
        return;
    }
    let files = StateFiles::new(dir);
    for file in [&files.config, &files.log, &files.pid] {
        let _ = std::fs::remove_file(file);
    }
    let _ = std::fs::remove_dir_all(&files.recovery);
}

/// Refuses what cannot work, before anything is started.
fn check_config(config: &NfsServerConfig) -> Result<(), String> {
    for (what, dir) in [
        ("export directory", &config.export_dir),
        ("state directory", &config.state_dir),
    ] {
        if !dir.is_absolute() {
            return Err(format!("the NFS {what} {} is not absolute", dir.display()));
        }
        // The servers' private /run hides anything under the real one.
        if dir.starts_with("/run") {
            return Err(format!(
                "the NFS {what} {} is under /run, which the server's mount namespace replaces",
                dir.display()
            ));
        }
    }
    if !config.export_dir.is_dir() {
        return Err(format!(
            "the NFS export directory {} is not a directory",
            config.export_dir.display()
        ));
    }
    let pseudo = &config.pseudo;
    if !pseudo.starts_with('/')
        || pseudo.len() < 2
        || pseudo.contains(|c: char| c == '"' || c == ';' || c.is_whitespace())
    {
        return Err(format!(
            "the NFS pseudo path '{pseudo}' must be absolute, not '/', without quotes, ';' or spaces"
        ));
    }
    // Both are written into ganesha's configuration between quotes.
    for (what, dir) in [
        ("export directory", &config.export_dir),
        ("state directory", &config.state_dir),
    ] {
        match dir.to_str() {
            Some(text) if text.contains(['"', ';']) => {
                return Err(format!("the NFS {what} {text} holds '\"' or ';'"));
            }
            Some(_) => {}
            None => return Err(format!("the NFS {what} is not UTF-8")),
        }
    }
    Ok(())
}

/// ganesha's configuration: one VFS export, NFSv3 and v4 over TCP, no grace period
/// (a fresh server has no clients to wait for), numeric owners (no idmapd here),
/// the pseudo path accepted by NFSv3's MOUNT so one URL serves both versions.
fn ganesha_config(config: &NfsServerConfig, recovery: &Path) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "NFS_CORE_PARAM {{\n\
         \tProtocols = 3, 4;\n\
         \tBind_addr = {listen};\n\
         \tNFS_Port = {NFS_PORT};\n\
         \tMount_Path_Pseudo = true;\n\
         \tEnable_NLM = false;\n\
         \tEnable_RQUOTA = false;\n\
         }}\n\
         NFSv4 {{\n\
         \tRecoveryRoot = \"{recovery}\";\n\
         \tGraceless = true;\n\
         \tAllow_Numeric_Owners = true;\n\
         \tOnly_Numeric_Owners = true;\n\
         }}\n\
         EXPORT {{\n\
         \tExport_Id = 1;\n\
         \tPath = \"{path}\";\n\
         \tPseudo = \"{pseudo}\";\n\
         \tAccess_Type = RW;\n\
         \tSquash = No_Root_Squash;\n\
         \tProtocols = 3, 4;\n\
         \tTransports = TCP;\n\
         \tSecType = sys;\n\
         \tFSAL {{ Name = VFS; }}\n\
         }}\n",
        listen = config.listen,
        recovery = recovery.display(),
        path = config.export_dir.display(),
        pseudo = config.pseudo,
    );
    out
}

/// rpcbind in the foreground, in a new mount namespace whose `/run` is a private
/// tmpfs (inside network namespace `netns` when given). `unshare` and the shell
/// exec, so the PID is rpcbind's.
fn start_rpcbind(netns: Option<&str>) -> Result<Process, String> {
    let script = "mount -t tmpfs -o mode=0755 blockwire-nfs /run && exec rpcbind -f";
    let mut command = match netns {
        Some(ns) => netns::command_in(ns, "unshare"),
        None => Command::new("unshare"),
    };
    command.args(["--mount", "--propagation", "private", "sh", "-c", script]);
    Process::spawn(command, "rpcbind")
}

/// ganesha in rpcbind's mount and network namespaces (`nsenter` execs it: the PID
/// is ganesha's).
fn start_ganesha(rpcbind: u32, files: &StateFiles) -> Result<Process, String> {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--target={rpcbind}"))
        .args(["--mount", "--net", "ganesha.nfsd", "-F", "-N", "NIV_EVENT"])
        .arg("-f")
        .arg(&files.config)
        .arg("-L")
        .arg(&files.log)
        .arg("-p")
        .arg(&files.pid);
    Process::spawn(command, "ganesha.nfsd")
}

/// A child process of ours: ends with the thread that started it, registered for
/// the lab's teardown, stopped by PID.
#[derive(Debug)]
struct Process {
    child: Child,
    name: &'static str,
    stopped: bool,
}

impl Process {
    fn spawn(mut command: Command, name: &'static str) -> Result<Process, String> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        blockwire_bench::child::die_with_parent(&mut command);
        let mut registry = cleanup::lock();
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        registry.add_child(child.id());
        Ok(Process {
            child,
            name,
            stopped: false,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error when it has ended, with what it said on stderr.
    fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                let mut said = String::new();
                if let Some(mut stderr) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
                }
                cleanup::lock().remove_child(self.pid());
                self.stopped = true;
                let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
                Err(format!("{} exited ({status}): {said}", self.name))
            }
            Err(e) => Err(format!("cannot wait for {}: {e}", self.name)),
        }
    }

    /// Waits for rpcbind's socket in its private `/run`.
    fn wait_for_socket(&mut self) -> Result<(), String> {
        let socket = PathBuf::from(format!("/proc/{}/root/run/rpcbind.sock", self.pid()));
        let deadline = Instant::now() + START_LIMIT;
        loop {
            self.check_running()?;
            if socket.exists() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("rpcbind made no socket in {START_LIMIT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for ganesha's "initialized" log line and a TCP connection to its port.
    fn wait_until_ready(&mut self, log: &Path, config: &NfsServerConfig) -> Result<(), String> {
        let deadline = Instant::now() + START_LIMIT;
        let address = SocketAddr::new(config.listen, NFS_PORT);
        loop {
            if let Err(e) = self.check_running() {
                return Err(format!("{e}; its log: {}", log_tail(log)));
            }
            let logged = std::fs::read_to_string(log).is_ok_and(|text| text.contains(READY_LINE));
            if logged && accepts(config.netns.as_deref(), address) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "ganesha did not come up on {address} in {START_LIMIT:?}; its log: {}",
                    log_tail(log)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, a grace period, SIGKILL; reaped. Once.
    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let pid = self.pid();
        let mut registry = cleanup::lock();
        if let Ok(None) = self.child.try_wait() {
            cleanup::stop_process(pid, Duration::from_secs(5));
        }
        registry.remove_child(pid);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a TCP connection to `address` succeeds from network namespace `netns`.
fn accepts(netns: Option<&str>, address: SocketAddr) -> bool {
    let connect = || TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok();
    match netns {
        Some(ns) => netns::enter_and_run(ns, connect).unwrap_or(false),
        None => connect(),
    }
}

/// The last few important lines of ganesha's log, on one line.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(":CRIT :") || l.contains(":FATAL :") || l.contains(":MAJ :"))
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        return format!("nothing critical in {}", log.display());
    }
    tail.join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn config(dir: &Path) -> NfsServerConfig {
        NfsServerConfig {
            netns: None,
            listen: IpAddr::V4(Ipv4Addr::new(10, 77, 1, 1)),
            export_dir: dir.join("export"),
            pseudo: "/blockwire".to_string(),
            state_dir: dir.join("state"),
        }
    }

    #[test]
    fn the_configuration_exports_one_directory_read_write_without_squash() {
        let config = config(Path::new("/srv/t"));
        let text = ganesha_config(&config, Path::new("/srv/t/state/recovery"));
        for wanted in [
            "Bind_addr = 10.77.1.1;",
            "Path = \"/srv/t/export\";",
            "Pseudo = \"/blockwire\";",
            "Access_Type = RW;",
            "Squash = No_Root_Squash;",
            "Protocols = 3, 4;",
            "Name = VFS;",
            "RecoveryRoot = \"/srv/t/state/recovery\";",
            "Mount_Path_Pseudo = true;",
        ] {
            assert!(text.contains(wanted), "{wanted} missing from:\n{text}");
        }
    }

    #[test]
    fn directories_under_run_and_odd_pseudo_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("export")).unwrap();
        let good = config(dir.path());
        assert_eq!(check_config(&good), Ok(()));
        let mut under_run = good.clone();
        under_run.state_dir = PathBuf::from("/run/blockwire-nfs");
        assert!(check_config(&under_run).unwrap_err().contains("/run"));
        for pseudo in ["blockwire", "/", "/a b", "/a\";"] {
            let mut odd = good.clone();
            odd.pseudo = pseudo.to_string();
            assert!(check_config(&odd).is_err(), "{pseudo} accepted");
        }
        let mut missing = good.clone();
        missing.export_dir = dir.path().join("nowhere");
        assert!(check_config(&missing)
            .unwrap_err()
            .contains("not a directory"));
    }

    #[test]
    fn urls_name_the_address_the_pseudo_path_and_the_file() {
        assert_eq!(
            nfs_url("10.77.1.1".parse().unwrap(), "/blockwire", "disk.img"),
            "nfs://10.77.1.1/blockwire/disk.img"
        );
        assert_eq!(
            nfs_url("fd00::1".parse().unwrap(), "/a/b/", "/x"),
            "nfs://[fd00::1]/a/b/x"
        );
    }

    #[test]
    fn a_server_in_a_namespace_serves_a_file_over_nfs_v3() {
        let missing: Vec<&str> = ["ganesha.nfsd", "rpcbind", "nsenter", "unshare", "nfs-cat"]
            .into_iter()
            .filter(|tool| !on_path(tool))
            .collect();
        if !netns::available() || !missing.is_empty() {
            eprintln!("skipped: needs root, network namespaces and {missing:?}");
            return;
        }
        let tag = std::process::id() % 100_000;
        let channels = netns::Channels {
            count: 1,
            mtu: 1500,
            rate_mbit: None,
            addressed: true,
        };
        let pair = netns::NamespacePair::create(
            &format!("bwnfs{tag}t"),
            &format!("bwnfs{tag}i"),
            &channels,
        )
        .expect("build the namespace pair");
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path());
        std::fs::create_dir(&config.export_dir).unwrap();
        config.netns = Some(pair.target_ns().to_string());
        config.listen = netns::target_addr(0).parse().unwrap();
        std::fs::write(config.export_dir.join("hello.txt"), b"served by ganesha\n").unwrap();

        let server = NfsServer::start(&config).expect("start ganesha");
        assert_eq!(
            server.url("hello.txt"),
            "nfs://10.77.1.1/blockwire/hello.txt"
        );
        let pids = server.pids();
        assert_eq!(pids.len(), 2);
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", pids[0])).unwrap();
        assert_eq!(comm.trim(), "ganesha.nfsd");
        let output = netns::command_in(pair.initiator_ns(), "nfs-cat")
            .arg(server.url("hello.txt"))
            .output()
            .expect("run nfs-cat");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "served by ganesha\n",
            "nfs-cat said: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        // A second server in another namespace has an rpcbind of its own.
        let pair2 = netns::NamespacePair::create(
            &format!("bwnfs{tag}u"),
            &format!("bwnfs{tag}j"),
            &channels,
        )
        .expect("build the second namespace pair");
        let mut config2 = config.clone();
        config2.netns = Some(pair2.target_ns().to_string());
        config2.state_dir = dir.path().join("state2");
        let server2 = NfsServer::start(&config2).expect("start a second ganesha");
        let output = netns::command_in(pair2.initiator_ns(), "nfs-cat")
            .arg(server2.url("hello.txt"))
            .output()
            .expect("run nfs-cat");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "served by ganesha\n"
        );

        let state_dir = config.state_dir.clone();
        drop(server);
        drop(server2);
        for pid in pids {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "{pid} still runs"
            );
        }
        assert!(!state_dir.exists());
    }

    fn on_path(tool: &str) -> bool {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
    }
}
