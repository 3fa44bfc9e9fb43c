//! Shared harness of the lab's end-to-end tests: a [`Lab`] guard that runs
//! `down` when it drops (also on failure, printing the node logs when the
//! test panicked), and the capability check. Root and AF_XDP are required;
//! tests say SKIPPED and pass without them, or fail with
//! `OXVS_TESTS_NO_SKIP=1` (CI; [`oxvs_testutil::skip_or_fail`]).
#![allow(dead_code)] // each test binary uses a different subset

pub mod kube;
pub mod paths;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn lab_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_oxvs-lab"))
}

/// `oxvsctl`, next to `oxvs-lab`.
pub fn oxvsctl() -> PathBuf {
    lab_bin().parent().expect("bin dir").join("oxvsctl")
}

/// The IP of pod `ns/name` in `status --json`.
pub fn pod_ip(status: &Value, ns: &str, name: &str) -> String {
    pod_field(status, ns, name, "ip")
}

/// The string `field` (`ip`, `ip6`, `netns`...) of pod `ns/name` in
/// `status --json`.
pub fn pod_field(status: &Value, ns: &str, name: &str, field: &str) -> String {
    status["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["namespace"].as_str() == Some(ns) && p["name"].as_str() == Some(name))
        .and_then(|p| p[field].as_str())
        .unwrap_or_else(|| panic!("no {field} for {ns}/{name} in {status}"))
        .to_string()
}

pub fn skip_reason() -> Option<String> {
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        })
        .unwrap_or_default();
    if euid != "0" {
        return Some(format!("not root (euid {euid:?})"));
    }
    let afxdp = Command::new("python3")
        .args([
            "-c",
            "import socket; socket.socket(44, socket.SOCK_RAW).close()",
        ])
        .output();
    match afxdp {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return Some(format!(
                "AF_XDP sockets unavailable: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => return Some(format!("cannot check AF_XDP (python3): {e}")),
    }
    let dir = lab_bin()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    for b in ["oxvs-switchd", "oxvs-agent", "oxvs-cni"] {
        assert!(
            dir.join(b).exists(),
            "{} is not built: run `cargo build --workspace` (same profile) first",
            dir.join(b).display()
        );
    }
    None
}

#[macro_export]
macro_rules! skip_unless_capable {
    () => {
        if let Some(why) = $crate::common::skip_reason() {
            oxvs_testutil::skip_or_fail(why);
            return;
        }
    };
}

/// A lab that goes `down` on drop.
pub struct Lab {
    pub name: String,
    pub dir: tempfile::TempDir,
}

pub fn show(args: &[&str], out: &Output) -> String {
    format!(
        "`oxvs-lab {}` -> {}\n--- stdout ---\n{}--- stderr ---\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Lab {
    pub fn up(nodes: u32) -> Lab {
        Lab::up_args(&["--nodes", &nodes.to_string()])
    }

    /// `up` with these arguments (e.g. `--nodes 2 --kube-proxy`).
    pub fn up_args(args: &[&str]) -> Lab {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let lab = Lab {
            name: format!("t{}-{n}", std::process::id()),
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let mut all = vec!["up"];
        all.extend_from_slice(args);
        lab.ok(&all);
        lab
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(lab_bin())
            .args(["--name", &self.name])
            .args(args)
            .env_remove("OXVS_LAB")
            .output()
            .expect("run oxvs-lab")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "{}", show(args, &out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `oxvsctl --socket <node's switchd.sock> ARGS`; stdout (panics on
    /// failure, with oxvsctl's stderr).
    pub fn ctl(&self, node: &str, args: &[&str]) -> String {
        let sock = self.root().join(node).join("switchd.sock");
        let out = Command::new(oxvsctl())
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .expect("run oxvsctl");
        assert!(
            out.status.success(),
            "oxvsctl {args:?} on {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Packets of `node`'s flows whose `dump-flows` line holds every one
    /// of `needles`, summed.
    pub fn flow_packets(&self, node: &str, needles: &[&str]) -> u64 {
        self.ctl(node, &["dump-flows"])
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .filter_map(|l| {
                l.split("n_packets=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Sends one `size`-byte UDP datagram from pod `from` (`ns/name`) to
    /// `ip:port` and waits for the echo (the lab's pod server echoes UDP):
    /// the echoed length, `corrupt N` or `timeout`.
    #[allow(dead_code)] // not every test binary sends UDP
    pub fn udp_echo(&self, from: &str, ip: &str, port: u16, size: usize) -> String {
        let out = self.run(&[
            "exec",
            from,
            "--",
            "python3",
            "-c",
            UDP_ECHO,
            ip,
            &port.to_string(),
            &size.to_string(),
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn root(&self) -> PathBuf {
        PathBuf::from("/run/oxvs-lab").join(&self.name)
    }

    /// Writes `yaml` to a file in the test's temp dir.
    pub fn file(&self, name: &str, yaml: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, yaml).expect("write yaml");
        p.display().to_string()
    }

    pub fn status(&self) -> Value {
        let out = self.run(&["status", "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", show(&["status"], &out)))
    }

    pub fn probe(&self, proto: &str, port: u16) -> Vec<Value> {
        let out = self.ok(&[
            "probe",
            "--protocol",
            proto,
            "--port",
            &port.to_string(),
            "--timeout-ms",
            "1000",
            "--json",
        ]);
        serde_json::from_str::<Value>(&out)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_else(|| panic!("probe --json: {out}"))
    }

    /// Namespaces whose name starts with the lab's.
    pub fn namespaces(&self) -> Vec<String> {
        let prefix = format!("{}-", self.name);
        std::fs::read_dir("/var/run/netns")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 1..=4 {
                let d = self.root().join(format!("node-{i}"));
                for f in ["agent.log", "switchd.log", "kube-proxy.log"] {
                    if let Ok(t) = std::fs::read_to_string(d.join(f)) {
                        let tail: Vec<&str> = t.lines().rev().take(40).collect();
                        eprintln!("--- node-{i}/{f} (tail) ---");
                        for l in tail.iter().rev() {
                            eprintln!("{l}");
                        }
                    }
                }
            }
        }
        let out = self.run(&["down", "--grace", "2"]);
        if !out.status.success() {
            eprintln!("{}", show(&["down"], &out));
        }
    }
}

/// See [`Lab::udp_echo`].
const UDP_ECHO: &str = r#"
import socket, sys
ip, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
data = bytes((i * 7 + 3) % 256 for i in range(size))
for _ in range(3):
    s.sendto(data, (ip, port))
    try:
        got, _ = s.recvfrom(65536)
        print(len(got) if got == data else "corrupt %d" % len(got))
        sys.exit(0)
    except socket.timeout:
        pass
print("timeout")
"#;

/// The nodes' IPv6 underlay addresses (`up --ip-family dual`).
pub const N1_V6: &str = "fd00:192:168:77::11";
pub const N2_V6: &str = "fd00:192:168:77::12";

/// Why the kube-proxy tests cannot run here (no kube-proxy build in
/// `$OXVS_K8S_CACHE`), or `None`.
pub fn kube_proxy_build() -> Option<String> {
    let cache = std::env::var("OXVS_K8S_CACHE").unwrap_or_else(|_| "/var/cache/oxvs-k8s".into());
    let kp = std::path::Path::new(&cache).join("bin/kube-proxy");
    if kp.is_file() {
        None
    } else {
        Some(format!(
            "no kube-proxy build ({} missing; `OXVS_K8S_EXTRA_COMPONENTS=\"kube-proxy\" k8s-local.sh build`)",
            kp.display()
        ))
    }
}

/// Prints every datagram received on UDP `argv[1]` (IPv4), one per line,
/// until killed; `ready` first, once bound.
const UDP_LISTEN: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
while True:
    data, _ = s.recvfrom(65536)
    print(data.decode(errors="replace"), flush=True)
"#;

/// A UDP listener (IPv4) in a network namespace, killed on drop: what
/// reaches a pod, for tests that check what must not.
pub struct UdpListener {
    child: std::process::Child,
    out: std::sync::mpsc::Receiver<String>,
}

impl UdpListener {
    /// Starts it in `netns` on `port`; returns once it is bound.
    pub fn start(netns: &str, port: u16) -> UdpListener {
        use std::io::{BufRead, BufReader, Read};
        use std::process::Stdio;
        // `ip netns exec` execs the command: the child is python itself.
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "python3", "-c", UDP_LISTEN])
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn listener");
        let mut r = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        let _ = r.read_line(&mut first);
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = r.read_to_string(&mut rest);
            let _ = tx.send(rest);
        });
        let l = UdpListener { child, out };
        assert_eq!(
            first.trim(),
            "ready",
            "the listener in {netns} did not start"
        );
        l
    }

    /// Every datagram received, one per line, after a grace period for
    /// packets in flight.
    pub fn received(mut self) -> Vec<String> {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.out
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for UdpListener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
