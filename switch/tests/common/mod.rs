//! Shared harness for the end-to-end tests (`switch/tests/e2e_*.rs`).
//!
//! The tests drive the real binaries (`oxvs-switchd`, `oxvsctl`) in fresh
//! network namespaces, with real traffic from `ping` and small `python3`
//! programs running inside "pod" namespaces.
//!
//! Invariants:
//! - Every namespace and process a test makes is owned by a guard
//!   ([`Netns`], [`Switchd`], [`Bg`]) and removed on `Drop`, so also when
//!   the test panics. Links live inside those namespaces (they are created
//!   directly there with `ip -n NS link add ... netns NS2`, never in the
//!   root namespace), so deleting the namespaces deletes them too.
//! - Names are unique per process and call (`oxe2e-<pid>-<n>-<tag>`), so
//!   tests may run in parallel and after a crashed run.
//! - Traffic goes only to addresses inside the namespaces a test made.
//! - A test skips (prints why and passes) only when it cannot run here: not
//!   root, or AF_XDP sockets unavailable, or a needed tool missing; with
//!   `OXVS_TESTS_NO_SKIP=1` (CI) it fails instead ([`oxvs_testutil`]).
//!
//! Concurrency: the guards are plain values owned by one test thread.
//!
//! Finding `oxvsctl`: Cargo only gives an integration test the paths of its
//! own package's binaries (`CARGO_BIN_EXE_oxvs-switchd`). `oxvsctl` is taken,
//! in order, from `$OXVSCTL`; else from next to `oxvs-switchd`
//! (`target/<profile>/oxvsctl`, present after `cargo build -p oxvsctl` or a
//! workspace build) when it is newer than every source file of `ctl/`,
//! `api/` and `pipeline/`; else it is built once per test binary with
//! `cargo build -p oxvsctl --target-dir target/e2e-oxvsctl` (a separate
//! target directory, because the running `cargo test` holds the lock of the
//! main one). Fastest: `cargo build -p oxvsctl && cargo test -p oxvs-switch
//! --test 'e2e_*'`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call: `oxe2e-<pid>-<n>-<tag>`.
pub fn unique(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("oxe2e-{}-{n}-{tag}", std::process::id())
}

/// The workspace root (the parent of `switch/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("switch/ has a parent")
        .to_path_buf()
}

/// A flow file under `examples/`.
pub fn example(name: &str) -> String {
    workspace_root()
        .join("examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// Why this machine cannot run the end-to-end tests, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !oxvs_testutil::is_root() {
        return Some(format!(
            "not root (euid {})",
            oxvs_testutil::euid().unwrap_or_default()
        ));
    }
    for tool in ["ip", "ping", "python3", "ethtool"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("'{tool}' is not installed (scripts/setup.sh)"));
        }
    }
    // AF_XDP = 44: can this kernel make such a socket?
    let afxdp = Command::new("python3")
        .args([
            "-c",
            "import socket; socket.socket(44, socket.SOCK_RAW).close()",
        ])
        .output();
    match afxdp {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "AF_XDP sockets unavailable: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot check AF_XDP: {e}")),
    }
}

/// Returns from the test when the machine cannot run end-to-end tests:
/// [`oxvs_testutil::skip_or_fail`] prints the reason (the test passes), or
/// fails the test with `OXVS_TESTS_NO_SKIP=1`.
#[macro_export]
macro_rules! skip_unless_capable {
    () => {
        if let Some(why) = $crate::common::skip_reason() {
            oxvs_testutil::skip_or_fail(why);
            return;
        }
    };
}

fn show(cmd: &[&str], out: &Output) -> String {
    format!(
        "`{}` -> {}\n--- stdout ---\n{}--- stderr ---\n{}",
        cmd.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a command (no namespace) and returns its output.
pub fn run(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", cmd.join(" ")))
}

/// Runs a command that must succeed; returns its stdout.
pub fn must(cmd: &[&str]) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{}", show(cmd, &out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` inside network namespace `ns`.
pub fn exec_in(ns: &str, cmd: &[&str]) -> Output {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(cmd);
    run(&full)
}

/// Runs `cmd` inside `ns`; it must succeed; returns its stdout.
pub fn must_in(ns: &str, cmd: &[&str]) -> String {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(cmd);
    must(&full)
}

/// A network namespace, deleted (with the processes still in it) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = unique(tag);
        must(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.must(&["ip", "link", "set", "lo", "up"]);
        ns
    }
    pub fn exec(&self, cmd: &[&str]) -> Output {
        exec_in(&self.name, cmd)
    }
    pub fn must(&self, cmd: &[&str]) -> String {
        must_in(&self.name, cmd)
    }
    /// Runs `sh -c script` in the namespace; it must succeed.
    pub fn sh(&self, script: &str) -> String {
        self.must(&["sh", "-c", script])
    }
    /// Starts `cmd` in the background in this namespace.
    pub fn spawn(&self, cmd: &[&str]) -> Bg {
        Bg::spawn(Some(&self.name), cmd)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Every process in the namespace was started by this test.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A background process with its output captured to files; killed on drop.
pub struct Bg {
    child: Child,
    pub cmd: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Bg {
    /// Waits (5 s at most) until the process printed `listening`; `what`
    /// names it in the error, with its stderr.
    pub fn wait_listening(&mut self, what: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.stdout_text().contains("listening") {
            if Instant::now() >= deadline || !self.running() {
                return Err(format!("{what} did not start: {}", self.stderr_text()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn spawn(ns: Option<&str>, cmd: &[&str]) -> Bg {
        let base = std::env::temp_dir().join(unique("bg"));
        let stdout = base.with_extension("out");
        let stderr = base.with_extension("err");
        let mut full: Vec<&str> = Vec::new();
        if let Some(ns) = ns {
            full.extend_from_slice(&["ip", "netns", "exec", ns]);
        }
        full.extend_from_slice(cmd);
        let child = Command::new(full[0])
            .args(&full[1..])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("temp file"))
            .stderr(std::fs::File::create(&stderr).expect("temp file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{}`: {e}", full.join(" ")));
        Bg {
            child,
            cmd: full.join(" "),
            stdout,
            stderr,
        }
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Waits up to `timeout` for the process to exit; returns its output
    /// (`None` if it is still running).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<(bool, String, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some((status.success(), self.stdout_text(), self.stderr_text()));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// Waits for exit (panics after `timeout`); returns (success, stdout, stderr).
    pub fn wait(&mut self, timeout: Duration) -> (bool, String, String) {
        match self.wait_timeout(timeout) {
            Some(r) => r,
            None => panic!(
                "`{}` still running after {timeout:?}\n--- stdout ---\n{}--- stderr ---\n{}",
                self.cmd,
                self.stdout_text(),
                self.stderr_text()
            ),
        }
    }
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
    /// SIGTERM, then SIGKILL after `grace`. Returns whether it exited on
    /// SIGTERM within the grace time.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        if !self.running() {
            return true;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .output();
        if self.wait_timeout(grace).is_some() {
            return true;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stdout);
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// A veth pair: `a` in namespace `ns_a`, `b` in `ns_b`, both up. Created
/// directly in those namespaces (never in the root namespace).
pub fn veth(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str) {
    must(&[
        "ip", "-n", &ns_a.name, "link", "add", a, "type", "veth", "peer", "name", b, "netns",
        &ns_b.name,
    ]);
    ns_a.must(&["ip", "link", "set", a, "up"]);
    ns_b.must(&["ip", "link", "set", b, "up"]);
}

/// Path of the `oxvs-switchd` binary under test (this harness is also
/// included by other packages' tests, which find it with [`workspace_bin`]).
pub fn switchd_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_oxvs-switchd") {
        Some(p) => PathBuf::from(p),
        None => workspace_bin("oxvs-switchd"),
    }
}

/// A binary of another workspace package, from the target directory this
/// test runs from (`target/<profile>/NAME`): a workspace `cargo test` (as
/// CI runs it) builds every binary first; for one package, build them
/// first (`cargo build -p oxvs-switch -p oxvs-cni -p oxvs-agent -p oxvsctl`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test binary>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is not built: run `cargo build` for the workspace (same profile) first",
        p.display()
    );
    p
}

fn newest_source_mtime(dirs: &[PathBuf]) -> SystemTime {
    fn walk(p: &Path, newest: &mut SystemTime) {
        let Ok(meta) = std::fs::metadata(p) else {
            return;
        };
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    walk(&e.path(), newest);
                }
            }
        } else if let Ok(m) = meta.modified() {
            if m > *newest {
                *newest = m;
            }
        }
    }
    let mut newest = SystemTime::UNIX_EPOCH;
    for d in dirs {
        walk(d, &mut newest);
    }
    newest
}

/// Path of the `oxvsctl` binary (see the module doc for how it is found).
pub fn oxvsctl_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("OXVSCTL") {
            return PathBuf::from(p);
        }
        let root = workspace_root();
        let sibling = switchd_bin().with_file_name("oxvsctl");
        let sources = newest_source_mtime(&[
            root.join("ctl/src"),
            root.join("ctl/Cargo.toml"),
            root.join("api/src"),
            root.join("pipeline/src"),
        ]);
        if let Ok(m) = std::fs::metadata(&sibling).and_then(|m| m.modified()) {
            if m >= sources {
                return sibling;
            }
        }
        let target = sibling
            .parent()
            .and_then(Path::parent)
            .map(|t| t.join("e2e-oxvsctl"))
            .unwrap_or_else(|| root.join("target/e2e-oxvsctl"));
        eprintln!(
            "e2e: {} is missing or older than its sources; building it into {}",
            sibling.display(),
            target.display()
        );
        let status = Command::new(env!("CARGO"))
            .current_dir(&root)
            .args(["build", "-p", "oxvsctl", "--target-dir"])
            .arg(&target)
            .status()
            .expect("cannot run cargo to build oxvsctl");
        assert!(status.success(), "cargo build -p oxvsctl failed");
        target.join("debug/oxvsctl")
    })
    .clone()
}

/// Runs `oxvsctl --socket SOCK ARGS...` (outside any namespace: the socket
/// is a file). Returns the raw output.
pub fn oxvsctl(sock: &Path, args: &[&str]) -> Output {
    let bin = oxvsctl_bin();
    Command::new(&bin)
        .arg("--socket")
        .arg(sock)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

/// A running `oxvs-switchd` inside a namespace, with a unique control
/// socket; SIGTERM (then SIGKILL) on drop. Its log is printed when the
/// test is failing.
pub struct Switchd {
    proc: Option<Bg>,
    pub sock: PathBuf,
    pub ns: String,
}

impl Switchd {
    /// Starts switchd in `ns` and waits (up to 10 s) until its control
    /// socket answers `show`.
    pub fn start(ns: &Netns) -> Switchd {
        Switchd::start_with(ns, &[])
    }

    /// [`Switchd::start`] with extra command-line arguments.
    pub fn start_with(ns: &Netns, extra: &[&str]) -> Switchd {
        Switchd::start_with_env(ns, &[], extra)
    }

    /// [`Switchd::start_with`], switchd's environment also given `env`
    /// (`NAME=VALUE` each, as `env(1)` takes them).
    pub fn start_with_env(ns: &Netns, env: &[&str], extra: &[&str]) -> Switchd {
        let sock = PathBuf::from(format!("/tmp/{}.sock", unique("sw")));
        let bin = switchd_bin();
        let bin = bin.to_string_lossy();
        let sock_s = sock.to_string_lossy().into_owned();
        let mut cmd = vec!["env", "RUST_LOG=info"];
        cmd.extend_from_slice(env);
        cmd.extend_from_slice(&[&bin, "--socket", &sock_s]);
        cmd.extend_from_slice(extra);
        let proc = Bg::spawn(Some(&ns.name), &cmd);
        let mut sw = Switchd {
            proc: Some(proc),
            sock,
            ns: ns.name.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let p = sw.proc.as_mut().expect("just started");
            if !p.running() {
                panic!(
                    "oxvs-switchd exited at start-up\n--- stderr ---\n{}--- stdout ---\n{}",
                    p.stderr_text(),
                    p.stdout_text()
                );
            }
            if sw.sock.exists() && oxvsctl(&sw.sock, &["show"]).status.success() {
                return sw;
            }
            if Instant::now() > deadline {
                panic!(
                    "oxvs-switchd did not answer `oxvsctl --socket {} show` within 10 s\n--- its stderr ---\n{}",
                    sw.sock.display(),
                    p.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map(Bg::pid).unwrap_or(0)
    }

    /// Port `name`'s entry of `dump-ports --json`.
    #[allow(dead_code)] // not every test binary reads counters
    pub fn port_json(&self, name: &str) -> serde_json::Value {
        let out = self.ctl_ok(&["--json", "dump-ports"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("dump-ports --json");
        let ports = v
            .get("ports")
            .and_then(|p| p.as_array())
            .cloned()
            .or_else(|| v.as_array().cloned())
            .unwrap_or_default();
        ports
            .into_iter()
            .find(|p| p.get("name").and_then(|n| n.as_str()) == Some(name))
            .unwrap_or_else(|| panic!("no port {name} in {out}"))
    }

    /// Port `name`'s packet and byte counters (`dump-ports`).
    #[allow(dead_code)] // not every test binary reads counters
    pub fn port_counters(&self, name: &str) -> PortCounters {
        let p = self.port_json(name);
        let stats = p.get("stats").unwrap_or(&p);
        let n = |k: &str| stats.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
        PortCounters {
            rx_packets: n("rx_packets"),
            rx_bytes: n("rx_bytes"),
            tx_packets: n("tx_packets"),
            tx_bytes: n("tx_bytes"),
            tx_moved: n("tx_moved"),
            tx_checksum_requests: n("tx_checksum_requests"),
        }
    }

    /// `oxvsctl --socket SOCK ARGS`: raw output.
    pub fn ctl(&self, args: &[&str]) -> Output {
        oxvsctl(&self.sock, args)
    }

    /// `oxvsctl --socket SOCK ARGS`, which must succeed; returns stdout.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        let mut shown = vec!["oxvsctl", "--socket"];
        let s = self.sock.to_string_lossy();
        shown.push(&s);
        shown.extend_from_slice(args);
        // (switchd's log is printed by its guard when the test fails.)
        assert!(out.status.success(), "{}", show(&shown, &out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Attaches interface `ifname` (in switchd's namespace) as an AF_XDP port.
    pub fn add_port(&self, ifname: &str, ofport: u32) {
        self.ctl_ok(&["add-port", ifname, "--ofport", &ofport.to_string()]);
    }

    /// Adds a VXLAN tunnel port.
    pub fn add_vxlan_port(&self, name: &str, ofport: u32, local_ip: &str) {
        self.ctl_ok(&[
            "add-port",
            name,
            "--ofport",
            &ofport.to_string(),
            "--type",
            "vxlan",
            "--local-ip",
            local_ip,
        ]);
    }

    pub fn add_flows(&self, file: &str) {
        self.ctl_ok(&["add-flows", file]);
    }

    pub fn log(&self) -> String {
        self.proc
            .as_ref()
            .map(|p| p.stderr_text() + &p.stdout_text())
            .unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Bg::running)
    }

    /// SIGTERM; returns whether it exited within 5 s (else it is killed).
    pub fn stop(&mut self) -> bool {
        let clean = self
            .proc
            .as_mut()
            .map(|p| p.terminate(Duration::from_secs(5)))
            .unwrap_or(true);
        let _ = std::fs::remove_file(&self.sock);
        clean
    }

    /// SIGKILL (a crash): nothing gets cleaned up by switchd itself.
    pub fn kill(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            let _ = Command::new("kill")
                .args(["-KILL", &p.pid().to_string()])
                .output();
            let _ = p.wait_timeout(Duration::from_secs(5));
        }
        let _ = std::fs::remove_file(&self.sock);
    }
}

impl Drop for Switchd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- oxvs-switchd log (ns {}, tail) ---\n{}",
                self.ns,
                self.log_tail(60)
            );
        }
        self.stop();
        self.proc = None;
        // The connection table switchd saved on SIGTERM (next to its socket).
        let _ = std::fs::remove_file(self.sock.with_extension("conntrack.state"));
    }
}

/// A pod: namespace `pod` gets `eth0` (IP `cidr`, MAC `mac`, MTU `mtu`, a
/// default route through eth0, TX checksum offload off), its peer `host_if`
/// is up in namespace `node` with MTU max(`mtu`, 1500) (so the pod's MTU
/// alone decides what it sends). Not attached to anything.
pub fn make_pod(node: &Netns, pod: &Netns, host_if: &str, cidr: &str, mac: &str, mtu: u32) {
    veth(node, host_if, pod, "eth0");
    let mtu = mtu.to_string();
    pod.must(&["ip", "link", "set", "eth0", "down"]);
    pod.must(&["ip", "link", "set", "eth0", "address", mac, "mtu", &mtu]);
    pod.must(&["ip", "link", "set", "eth0", "up"]);
    pod.must(&["ip", "addr", "add", cidr, "dev", "eth0"]);
    pod.must(&["ip", "route", "add", "default", "dev", "eth0"]);
    // TX checksum offload stays on (the veth default): the switch
    // completes the partial checksums (`e2e_checksums` shows it must).
    let host_mtu = mtu.parse::<u32>().unwrap_or(1500).max(1500).to_string();
    node.must(&["ip", "link", "set", host_if, "mtu", &host_mtu]);
}

/// Flows for pods on ports 1..=N with these MACs (port i has `macs[i-1]`):
/// ARP from a port floods to the others, IP goes to the port of its
/// destination MAC.
#[allow(dead_code)] // not every test binary builds its own flows
pub fn flood_arp_ip_by_mac_flows(macs: &[String]) -> String {
    let mut text = String::new();
    for (i, mac) in macs.iter().enumerate() {
        let n = i + 1;
        let others: Vec<String> = (1..=macs.len())
            .filter(|&j| j != n)
            .map(|j| format!("output:{j}"))
            .collect();
        text.push_str(&format!(
            "table=0,priority=100,arp,in_port={n} actions={}\n\
             table=0,priority=50,ip,dl_dst={mac} actions=output:{n}\n",
            others.join(",")
        ));
    }
    text
}

/// [`make_pod`], then attaches `host_if` to `sw` as `ofport`.
#[allow(clippy::too_many_arguments)]
pub fn add_pod(
    sw: &Switchd,
    node: &Netns,
    pod: &Netns,
    host_if: &str,
    ofport: u32,
    cidr: &str,
    mac: &str,
    mtu: u32,
) {
    make_pod(node, pod, host_if, cidr, mac, mtu);
    sw.add_port(host_if, ofport);
}

/// `count` pods on `sw`, pod `n` (from 1) on port `{port}{n}` with
/// ofport `n`, address `{net}.{n}/24` and MAC `{mac}:{n:02x}` at `mtu`,
/// and the flows that flood ARP and deliver IP by MAC among them.
pub fn flooded_pods(
    sw: &Switchd,
    node: &Netns,
    count: usize,
    port: &str,
    net: &str,
    mac: &str,
    mtu: u32,
) -> Vec<Netns> {
    let pods: Vec<Netns> = (1..=count)
        .map(|i| Netns::new(&format!("pod{i}")))
        .collect();
    let macs: Vec<String> = (1..=count).map(|n| format!("{mac}:{n:02x}")).collect();
    for (i, (pod, m)) in pods.iter().zip(&macs).enumerate() {
        let n = i + 1;
        add_pod(
            sw,
            node,
            pod,
            &format!("{port}{n}"),
            n as u32,
            &format!("{net}.{n}/24"),
            m,
            mtu,
        );
    }
    let file = std::env::temp_dir().join(unique("flooded-pods-flows"));
    std::fs::write(&file, flood_arp_ip_by_mac_flows(&macs)).expect("write flows");
    sw.add_flows(file.to_str().expect("path"));
    let _ = std::fs::remove_file(&file);
    pods
}

/// Packets port `name` lost to an empty fill ring (`dump-ports --json`).
pub fn rx_fill_empty(sw: &Switchd, name: &str) -> u64 {
    let p = sw.port_json(name);
    p["stats"]["rx_fill_empty"]
        .as_u64()
        .unwrap_or_else(|| panic!("rx_fill_empty of {name}: {p}"))
}

/// A port's packet and byte counters, as `dump-ports` reports them.
#[derive(Clone, Copy, Debug, Default)]
#[allow(dead_code)] // not every test binary reads every counter
pub struct PortCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Of `tx_packets`, sent in the frames they arrived in (no copy).
    pub tx_moved: u64,
    pub tx_checksum_requests: u64,
}

#[allow(dead_code)]
impl PortCounters {
    /// (rx_packets, rx_bytes).
    pub fn rx(&self) -> (u64, u64) {
        (self.rx_packets, self.rx_bytes)
    }

    /// (tx_packets, tx_bytes).
    pub fn tx(&self) -> (u64, u64) {
        (self.tx_packets, self.tx_bytes)
    }
}

/// Result of a `ping`: transmitted, received, full output.
#[derive(Debug)]
pub struct Ping {
    pub ok: bool,
    pub transmitted: u32,
    pub received: u32,
    pub output: String,
}

/// Parses the "N packets transmitted, M received" line of iputils ping.
pub fn parse_ping(ok: bool, output: String) -> Ping {
    let mut transmitted = 0;
    let mut received = 0;
    for line in output.lines() {
        if line.contains("packets transmitted") {
            let nums: Vec<u32> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .filter_map(|s| s.parse().ok())
                .collect();
            if nums.len() >= 2 {
                transmitted = nums[0];
                received = nums[1];
            }
        }
    }
    Ping {
        ok,
        transmitted,
        received,
        output,
    }
}

/// `ping -c count -W 1 -i interval [extra...] dst` from `ns`.
pub fn ping(ns: &Netns, dst: &str, count: u32, interval: &str, extra: &[&str]) -> Ping {
    let count = count.to_string();
    let mut cmd = vec!["ping", "-n", "-c", &count, "-W", "1", "-i", interval];
    cmd.extend_from_slice(extra);
    cmd.push(dst);
    let out = ns.exec(&cmd);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    parse_ping(out.status.success(), text)
}

/// Pings until one reply arrives (up to `secs` seconds): the path is up.
pub fn ping_until_up(ns: &Netns, dst: &str, secs: u32) -> Ping {
    let w = secs.to_string();
    let out = ns.exec(&["ping", "-n", "-c", "1", "-w", &w, "-i", "0.2", dst]);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    parse_ping(out.status.success(), text)
}

/// A python3 TCP sink: listens on ADDR:PORT, accepts one connection within
/// TIMEOUT s, reads to EOF, prints "len sha256".
pub const TCP_SINK: &str = r#"
import hashlib, socket, sys
addr, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen(1); s.settimeout(timeout)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(timeout)
h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
print(n, h.hexdigest(), flush=True)
"#;

/// A python3 TCP source: connects to ADDR:PORT (retrying for TIMEOUT s),
/// sends LEN pseudo-random bytes (seeded), prints "len sha256".
pub const TCP_SOURCE: &str = r#"
import hashlib, random, socket, sys, time
addr, port, n, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
data = random.Random(n).randbytes(n)
deadline = time.time() + timeout
while True:
    try:
        c = socket.create_connection((addr, port), timeout=2); break
    except OSError as e:
        if time.time() > deadline: print("connect failed:", e, file=sys.stderr); sys.exit(2)
        time.sleep(0.2)
c.settimeout(timeout); c.sendall(data); c.shutdown(socket.SHUT_WR)
c.recv(1)
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"#;

/// `(umem frames, free frames)` from `oxvsctl stats --json`.
pub fn umem_stats(sw: &Switchd) -> (u64, u64) {
    let v: serde_json::Value =
        serde_json::from_str(&sw.ctl_ok(&["--json", "stats"])).expect("stats JSON");
    (
        v["umem_frames"].as_u64().expect("umem_frames"),
        v["umem_free_frames"].as_u64().expect("umem_free_frames"),
    )
}

/// A python3 TCP sink: binds PORT, prints `listening`, takes one
/// connection and reads it to its end; prints the bytes read.
pub const TCP_DRAIN: &str = r#"
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[1]))); l.listen(1); l.settimeout(10)
print("listening", flush=True)
c, _ = l.accept(); c.settimeout(10); n = 0
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print(n, flush=True)
"#;

/// A python3 TCP source: sends zeros to ADDR:PORT for SECS seconds, as fast
/// as the socket takes them (the pod's kernel builds 64 KiB segments).
pub const TCP_BLAST: &str = r#"
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
buf = bytes(1 << 20); end = time.time() + float(sys.argv[3])
while time.time() < end: c.sendall(buf)
c.close()
"#;

/// `secs` of TCP from `from` to `to` (at `to_ip`); returns the bytes that
/// arrived.
pub fn blast(from: &Netns, to: &Netns, to_ip: &str, port: u16, secs: &str) -> u64 {
    blasts(from, to, to_ip, &[port], secs)
}

/// [`blast`] with one stream per port of `ports`, all at once; returns
/// the bytes that arrived on all of them.
pub fn blasts(from: &Netns, to: &Netns, to_ip: &str, ports: &[u16], secs: &str) -> u64 {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut sinks: Vec<Bg> = ports
        .iter()
        .map(|p| to.spawn(&["python3", "-c", TCP_DRAIN, p]))
        .collect();
    for s in &mut sinks {
        s.wait_listening("TCP sink").expect("sink");
    }
    let mut sources: Vec<Bg> = ports
        .iter()
        .map(|p| from.spawn(&["python3", "-c", TCP_BLAST, to_ip, p, secs]))
        .collect();
    for b in &mut sources {
        let (ok, out, err) = b.wait(Duration::from_secs(15));
        assert!(ok, "TCP source in {}: {out}{err}", from.name);
    }
    sinks
        .iter_mut()
        .map(|s| {
            let (ok, out, err) = s.wait(Duration::from_secs(15));
            assert!(ok, "TCP sink in {}: {out}{err}", to.name);
            out.lines()
                .last()
                .and_then(|l| l.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Sends `bytes` over TCP from `client` to `server_ip:port` (a sink in
/// `server`) and checks that the sink got exactly the data sent.
pub fn tcp_transfer(client: &Netns, server: &Netns, server_ip: &str, port: u16, bytes: usize) {
    if let Err(e) = try_tcp_transfer(client, server, server_ip, port, bytes, 15) {
        panic!("{e}");
    }
}

/// [`tcp_transfer`] with a deadline of `secs` for the client and the sink;
/// says what went wrong instead of panicking.
pub fn try_tcp_transfer(
    client: &Netns,
    server: &Netns,
    server_ip: &str,
    port: u16,
    bytes: usize,
    secs: u32,
) -> Result<(), String> {
    let port = port.to_string();
    let limit = secs.to_string();
    let any = if server_ip.contains(':') {
        "::"
    } else {
        "0.0.0.0"
    };
    let mut sink = server.spawn(&["python3", "-c", TCP_SINK, any, &port, &limit]);
    sink.wait_listening("TCP sink")?;
    let n = bytes.to_string();
    let src = client.exec(&["python3", "-c", TCP_SOURCE, server_ip, &port, &n, &limit]);
    let sent = String::from_utf8_lossy(&src.stdout).trim().to_owned();
    let (ok, got, err) = sink.wait(Duration::from_secs(u64::from(secs) + 5));
    if !src.status.success() {
        return Err(format!(
            "TCP client {} -> {server_ip}:{port} failed: {}{}",
            client.name,
            sent,
            String::from_utf8_lossy(&src.stderr)
        ));
    }
    if !ok {
        return Err(format!("TCP sink in {} failed: {got}{err}", server.name));
    }
    let got = got.lines().last().unwrap_or_default().trim().to_owned();
    if got != sent {
        return Err(format!(
            "TCP data {} -> {server_ip}:{port} arrived different (len sha256): sent {sent}, got {got}",
            client.name
        ));
    }
    if !sent.starts_with(&format!("{bytes} ")) {
        return Err(format!("sent {sent}"));
    }
    Ok(())
}

/// A python3 UDP echo: binds PORT (IPv6 with a third argument `6`), waits
/// TIMEOUT s for one datagram, answers it with "echo:" + data, prints what
/// it got.
pub const UDP_ECHO: &str = r#"
import socket, sys
port, timeout = int(sys.argv[1]), float(sys.argv[2])
v6 = len(sys.argv) > 3 and sys.argv[3] == "6"
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM); s.bind(("::" if v6 else "0.0.0.0", port)); s.settimeout(timeout)
print("listening", flush=True)
data, peer = s.recvfrom(65535)
s.sendto(b"echo:" + data, peer)
print(data.decode(), flush=True)
"#;

/// A python3 UDP client: sends MSG to ADDR:PORT every 0.3 s until the echo
/// comes back (TIMEOUT s); prints the echo.
pub const UDP_CLIENT: &str = r#"
import socket, sys, time
addr, port, msg, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), float(sys.argv[4])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.3)
deadline = time.time() + timeout
while time.time() < deadline:
    s.sendto(msg, (addr, port))
    try:
        data, _ = s.recvfrom(65535); print(data.decode(), flush=True); sys.exit(0)
    except socket.timeout:
        pass
print("no echo", file=sys.stderr); sys.exit(1)
"#;

/// UDP request/answer from `client` to `server_ip:port` in `server`: both
/// directions of a UDP exchange.
pub fn udp_exchange(client: &Netns, server: &Netns, server_ip: &str, port: u16) {
    let port_s = port.to_string();
    let family = if server_ip.contains(':') { "6" } else { "4" };
    let mut echo = server.spawn(&["python3", "-c", UDP_ECHO, &port_s, "10", family]);
    if let Err(e) = echo.wait_listening("UDP echo") {
        panic!("{e}");
    }
    let msg = format!("hello-from-{}", client.name);
    let out = client.exec(&["python3", "-c", UDP_CLIENT, server_ip, &port_s, &msg, "8"]);
    let (ok, got, err) = echo.wait(Duration::from_secs(12));
    assert!(
        ok && got.contains(&msg),
        "UDP {} -> {server_ip}:{port} did not arrive: server said {got:?} {err:?}",
        client.name
    );
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains(&format!("echo:{msg}")),
        "UDP answer {server_ip}:{port} -> {} did not arrive: {}{}",
        client.name,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A python3 UDP echo of one datagram of up to 64 KiB: ARGS port, df
/// ("1": DF set, IP_PMTUDISC_DO, so a too-small path fails rather than
/// fragments); prints the length it got.
const BIG_UDP_ECHO: &str = r#"
import socket, sys
port, df = int(sys.argv[1]), sys.argv[2] == "1"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port)); s.settimeout(10)
if df:
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
print("listening", flush=True)
data, peer = s.recvfrom(65535)
s.sendto(data, peer)
print(len(data), flush=True)
"#;

/// Its client: ARGS addr port n df; sends n patterned bytes until the same
/// bytes come back (8 s).
const BIG_UDP_CLIENT: &str = r#"
import socket, sys, time
addr, port, n, df = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
msg = bytes(i % 251 for i in range(n))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.3)
if df:
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
deadline = time.time() + 8
while time.time() < deadline:
    s.sendto(msg, (addr, port))
    try:
        data, _ = s.recvfrom(65535)
        print("ok" if data == msg else "different", flush=True); sys.exit(0)
    except socket.timeout:
        pass
print("no echo", file=sys.stderr); sys.exit(1)
"#;

/// One UDP datagram of `bytes` from `client` to `server_ip:port` in
/// `server` and back, compared byte for byte; `df`: sent unfragmented
/// (DF set) both ways, else the kernel fragments it at the MTU.
pub fn big_udp_exchange(
    client: &Netns,
    server: &Netns,
    server_ip: &str,
    port: u16,
    bytes: usize,
    df: bool,
) {
    let port = port.to_string();
    let df_arg = if df { "1" } else { "0" };
    let mut echo = server.spawn(&["python3", "-c", BIG_UDP_ECHO, &port, df_arg]);
    if let Err(e) = echo.wait_listening("UDP echo") {
        panic!("{e}");
    }
    let n = bytes.to_string();
    let out = client.exec(&[
        "python3",
        "-c",
        BIG_UDP_CLIENT,
        server_ip,
        &port,
        &n,
        df_arg,
    ]);
    let (_, got, _) = echo.wait(Duration::from_secs(12));
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{bytes}-byte UDP (DF {df}) {} <-> {}: server got {got:?}, client said {}{}",
        client.name,
        server.name,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sum of every `key=N` number in `text` (e.g. `n_packets=` in dump-flows).
pub fn sum_field(text: &str, key: &str) -> u64 {
    let mut total = 0;
    let mut rest = text;
    while let Some(i) = rest.find(key) {
        rest = &rest[i + key.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        total += digits.parse::<u64>().unwrap_or(0);
    }
    total
}

/// The `n_packets=` of the dump-flows line containing `needle`.
pub fn flow_packets(dump: &str, needle: &str) -> Option<u64> {
    dump.lines()
        .find(|l| l.contains(needle))
        .map(|l| sum_field(l, "n_packets="))
}

/// Sum of every numeric JSON field named `key`, anywhere in `v`.
pub fn json_sum(v: &serde_json::Value, key: &str) -> u64 {
    match v {
        serde_json::Value::Object(m) => m
            .iter()
            .map(|(k, x)| {
                if k == key {
                    x.as_u64().unwrap_or(0)
                } else {
                    json_sum(x, key)
                }
            })
            .sum(),
        serde_json::Value::Array(a) => a.iter().map(|x| json_sum(x, key)).sum(),
        _ => 0,
    }
}

/// (rx_packets, tx_packets) summed over all ports, from `dump-ports --json`.
pub fn port_packet_totals(sw: &Switchd) -> (u64, u64) {
    let text = sw.ctl_ok(&["dump-ports", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("dump-ports --json is not JSON ({e}): {text}"));
    (json_sum(&v, "rx_packets"), json_sum(&v, "tx_packets"))
}

/// Two node namespaces joined by an underlay veth `ul0` (192.0.2.1/24 in
/// `a`, 192.0.2.2/24 in `b`, MTU `mtu`), TX checksum offload off on both
/// ends (a wire computes checksums; a veth would pass partial ones on).
pub fn underlay(a: &Netns, b: &Netns, mtu: u32) {
    veth(a, "ul0", b, "ul0");
    let mtu = mtu.to_string();
    for (ns, ip) in [(a, "192.0.2.1/24"), (b, "192.0.2.2/24")] {
        ns.must(&["ip", "link", "set", "ul0", "mtu", &mtu]);
        ns.must(&["ip", "addr", "add", ip, "dev", "ul0"]);
        ns.must(&["ethtool", "-K", "ul0", "tx", "off"]);
    }
}

/// [`underlay`] over IPv6 only: `fd00:192::1/64` in `a`,
/// `fd00:192::2/64` in `b` (no DAD: usable at once), no IPv4 address.
pub fn underlay6(a: &Netns, b: &Netns, mtu: u32) {
    veth(a, "ul0", b, "ul0");
    let mtu = mtu.to_string();
    for (ns, ip) in [(a, "fd00:192::1/64"), (b, "fd00:192::2/64")] {
        ns.must(&["ip", "link", "set", "ul0", "mtu", &mtu]);
        ns.must(&["ip", "addr", "add", ip, "dev", "ul0", "nodad"]);
        ns.must(&["ethtool", "-K", "ul0", "tx", "off"]);
    }
}

/// Plain-Linux VXLAN node: in `node`, a kernel `vxlan` device `vx0`
/// (VNI `vni`, UDP 4789, local `local`, remote `remote`, over `ul0`)
/// and the pod's host end `host_if` enslaved to bridge `br0`.
pub fn kernel_vxlan_node(node: &Netns, host_if: &str, vni: u32, local: &str, remote: &str) {
    let vni = vni.to_string();
    node.must(&[
        "ip", "link", "add", "vx0", "type", "vxlan", "id", &vni, "local", local, "remote", remote,
        "dstport", "4789", "dev", "ul0",
    ]);
    node.must(&["ip", "link", "add", "br0", "type", "bridge"]);
    node.must(&["ip", "link", "set", "vx0", "master", "br0"]);
    node.must(&["ip", "link", "set", host_if, "master", "br0"]);
    node.must(&["ip", "link", "set", "vx0", "up"]);
    node.must(&["ip", "link", "set", "br0", "up"]);
}
