//! Support for the agent's end-to-end test against a real kube-apiserver
//! (`e2e_kube.rs`): a private etcd + kube-apiserver 1.20 started by
//! `shared/tools/k8s-local.sh up` in a run dir of its own on free ports
//! ([`Cluster`], torn down with `down --purge` on drop, also on failure),
//! and a TCP forwarder that makes the apiserver's loopback address
//! reachable from inside a node's network namespace ([`ApiProxy`]).
//!
//! The cluster part follows `source_kube.rs` (same prerequisites, same way
//! of restarting the apiserver with its recorded command line).
//!
//! Concurrency: [`Cluster`] is owned by the test thread. [`ApiProxy`] runs
//! one accept thread plus two copy threads per connection; the accept
//! thread stops when the proxy drops, copy threads end with their
//! connections (when either end closes).
#![allow(dead_code)]

use std::fs::File;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tools_dir() -> Option<PathBuf> {
    oxvs_testutil::shared_tools_dir("k8s-local.sh")
}

fn on_path(bin: &str) -> bool {
    oxvs_testutil::find_on_path(bin).is_some()
}

/// The tools directory, or why the apiserver cannot be run here: not
/// root, no `k8s-local.sh`, no cached build (never started from a test:
/// it takes ~10 min), no `etcd` or `kubectl`.
pub fn prerequisites() -> Result<PathBuf, String> {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if uid != 0 {
        return Err("not root".into());
    }
    let tools = tools_dir().ok_or("k8s-local.sh not found (set OXVS_SHARED_TOOLS)")?;
    let cache = std::env::var_os("OXVS_K8S_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/oxvs-k8s"));
    if !cache.join("bin/kube-apiserver").is_file() {
        return Err(format!(
            "no cached Kubernetes build in {} (run k8s-local.sh build)",
            cache.display()
        ));
    }
    if !on_path("etcd") {
        return Err("etcd not installed (run k8s-local.sh build)".into());
    }
    if !on_path("kubectl") && !cache.join("bin/kubectl").is_file() {
        return Err("no kubectl".into());
    }
    Ok(tools)
}

use oxvs_testutil::free_port;

/// A private etcd + apiserver; `down --purge` on drop.
pub struct Cluster {
    tools: PathBuf,
    run_dir: PathBuf,
    env: Vec<(&'static str, String)>,
    pub api_port: u16,
    /// The apiserver this test restarted itself (stopped by us on drop).
    restarted: Option<Child>,
}

impl Cluster {
    /// `k8s-local.sh up` (apiserver only, no controllers) in a run dir
    /// of this process, on free ports; panics if it fails.
    pub fn up(tools: PathBuf) -> Cluster {
        let run_dir = std::env::temp_dir().join(format!("oxvs-e2e-kube-{}", std::process::id()));
        let api_port = free_port();
        let env = vec![
            ("OXVS_K8S_ETCD_PORT", free_port().to_string()),
            ("OXVS_K8S_ETCD_PEER_PORT", free_port().to_string()),
            ("OXVS_K8S_API_PORT", api_port.to_string()),
            ("OXVS_K8S_CONTROLLERS", "0".to_string()),
        ];
        let c = Cluster {
            tools,
            run_dir,
            env,
            api_port,
            restarted: None,
        };
        let out = c.script(&["up"]).output().expect("run k8s-local.sh up");
        assert!(
            out.status.success(),
            "k8s-local.sh up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.tools.join("k8s-local.sh"));
        cmd.args(args).arg("--run-dir").arg(&self.run_dir);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.run_dir.join("admin.kubeconfig")
    }

    /// The recorded apiserver: (pid, start time).
    fn recorded_apiserver(&self) -> (i32, String) {
        let pid_file = self.run_dir.join("pids/kube-apiserver");
        let rec = std::fs::read_to_string(&pid_file).expect("apiserver pid file");
        let mut it = rec.split_whitespace();
        let pid: i32 = it.next().and_then(|p| p.parse().ok()).expect("pid");
        let start = it.next().expect("start time").to_string();
        (pid, start)
    }

    /// Kills the apiserver (SIGKILL: a graceful 1.20 shutdown waits on
    /// open watches) and waits until it is gone. Returns its command line
    /// for [`Cluster::start_apiserver`].
    pub fn kill_apiserver(&mut self) -> Vec<String> {
        let (pid, start) = self.recorded_apiserver();
        assert_eq!(
            starttime(pid).as_deref(),
            Some(start.as_str()),
            "recorded apiserver not running"
        );
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert!(signal(pid as u32, "KILL"), "kill apiserver {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while starttime(pid).as_deref() == Some(start.as_str()) {
            assert!(Instant::now() < deadline, "apiserver did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(mut c) = self.restarted.take() {
            let _ = c.wait();
        }
        argv
    }

    /// Starts the apiserver again with `argv` (from
    /// [`Cluster::kill_apiserver`]), recording its pid for `down`.
    pub fn start_apiserver(&mut self, argv: &[String]) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.run_dir.join("logs/kube-apiserver.log"))
            .expect("log");
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("restart apiserver");
        let new_pid = child.id() as i32;
        self.restarted = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        let st = loop {
            if let Some(st) = starttime(new_pid) {
                break st;
            }
            assert!(Instant::now() < deadline, "restarted apiserver not running");
            std::thread::sleep(Duration::from_millis(20));
        };
        std::fs::write(
            self.run_dir.join("pids/kube-apiserver"),
            format!("{new_pid} {st}\n"),
        )
        .expect("pid file");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.restarted.take() {
            signal(c.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.run_dir.join("logs/kube-apiserver.log")) {
                let tail: Vec<_> = log.lines().rev().take(30).collect();
                eprintln!("--- kube-apiserver.log (tail) ---");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        match self.script(&["down", "--purge"]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "k8s-local.sh down failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("k8s-local.sh down: {e}"),
        }
    }
}

/// Sends signal `sig` to `pid` (a process this test started or recorded).
fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Field 22 of /proc/PID/stat (start time), as the scripts record it;
/// `None` once the process is gone (or a zombie).
fn starttime(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let st = rest.split_whitespace().nth(19)?.to_string();
    (rest.split_whitespace().next()? != "Z").then_some(st)
}

/// Forwards TCP `127.0.0.1:PORT` inside a network namespace to
/// `127.0.0.1:PORT` of the test's own namespace, so an agent in a node
/// namespace reaches the apiserver with the kubeconfig unchanged (same
/// URL, so the certificate's name matches). While the apiserver is down,
/// connections are accepted and closed at once (as a refused connect).
pub struct ApiProxy {
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl ApiProxy {
    /// Listens in namespace `netns` (a name under /var/run/netns).
    pub fn start(netns: &str, port: u16) -> ApiProxy {
        let home = File::open("/proc/thread-self/ns/net").expect("own network namespace");
        let target = File::open(format!("/var/run/netns/{netns}")).expect("node namespace");
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<Result<(), String>>();
        let stop2 = stop.clone();
        let accept = std::thread::spawn(move || {
            // Only this thread moves; the listener stays in `target`.
            let bound = (|| -> Result<TcpListener, String> {
                setns(&target, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("setns into the node: {e}"))?;
                let l = TcpListener::bind(("127.0.0.1", port));
                setns(&home, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns back: {e}"))?;
                let l = l.map_err(|e| format!("bind 127.0.0.1:{port} in the node: {e}"))?;
                l.set_nonblocking(true)
                    .map_err(|e| format!("nonblocking: {e}"))?;
                Ok(l)
            })();
            let listener = match bound {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        std::thread::spawn(move || forward(client, port));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("API proxy: {e}"),
            Err(e) => panic!("API proxy did not start: {e}"),
        }
        ApiProxy {
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// One proxied connection: both directions until either end closes.
fn forward(client: TcpStream, port: u16) {
    let _ = client.set_nonblocking(false);
    let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
        return; // apiserver away: the client sees the connection close
    };
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || copy(client, server));
    copy(s2, c2);
    let _ = up.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16384];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
