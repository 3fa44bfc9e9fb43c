//! Agent restarts and NetworkPolicy churn under live traffic (allowed
//! traffic is never dropped beyond the documented window, denied traffic
//! never passes), on a real 2-node oxvs-lab (root + AF_XDP, real binaries).
//!
//! ## The cluster
//!
//! Namespaces x, y, z (label `ns: <name>`), pods serving TCP and UDP 80:
//! x/a and y/c and z/e on node-1, x/b and y/d on node-2. Policy
//! `y/isolate` (ingress only from namespace y) is in force throughout, so
//! the **denied pairs** x/a -> y/d (node-1 -> node-2) and x/b -> y/c
//! (node-2 -> node-1) must never connect. The **allowed pair** is x/a ->
//! x/b (node-1 -> node-2).
//!
//! ## Traffic (threads that `setns` into the source pod's namespace)
//!
//! - allowed TCP: a new connection x/a -> x/b:80 every 50 ms (1 s timeout);
//! - allowed UDP: one datagram every 20 ms x/a -> x/b:80, each from a
//!   fresh socket, so every datagram is a new connection for conntrack and
//!   goes through the policy tables (an established flow would not show a
//!   policy hole or a wrong deny); an echo within 1 s counts;
//! - denied, the same two kinds towards each denied pair (TCP with a 200 ms
//!   timeout, retried at once). A single TCP handshake or UDP echo on a
//!   denied pair fails the test.
//!
//! The allowed pair's **outage** is the longest time from a failed
//! attempt to the next successful one (a lost handshake counts from its
//! start, so one lost SYN is an outage of at least the 1 s connect
//! timeout; a lost datagram about 20 ms). Stalls of the sender itself (a
//! loaded 2-core machine) are printed apart and are not outages.
//!
//! **Documented window** ([`WINDOW`], asserted): allowed traffic is lost for
//! at most 500 ms (TCP: 500 ms + the connect timeout, its resolution), for
//! an agent restart and under policy churn. The design says nothing is
//! lost at all, and that is what was measured (0 failed attempts, every
//! run): while no agent runs the switch keeps forwarding with the flows it
//! has, the new agent converges only with a complete cluster snapshot and
//! its first `replace-flows` is a diff against identical flows; every
//! policy change is one atomic bundle per node. The window is slack for
//! scheduling on a shared machine, not an expected loss.
//!
//! The measured outages, sender stalls and attempt counts are printed
//! (`--nocapture`).
//!
//! ## Agent restart (`agent_restart_under_traffic`)
//!
//! Policies `y/isolate` and `x/allow-a-to-b` (x/b isolated: also y/c ->
//! x/b, node-1 -> node-2, is denied). With traffic running: node-2's
//! agent restarted with SIGTERM, node-1's with SIGKILL, node-2's with
//! SIGKILL (`oxvs-lab agent restart`, which re-runs the exact command line:
//! checked here from `/proc/PID/cmdline`, pids from `status --json`).
//! During each restart (and 1 s after the new agent is ready) a thread
//! dumps the restarted node's flows back to back (about 100 dumps): every
//! dump must equal the flows before, and so must both nodes' flows at the
//! end. (This caught an agent that converged with an empty cluster before
//! its source's first snapshot: policy and remote-node flows gone for
//! ~20 ms per restart, denied UDP passing, an allowed SYN lost.)
//!
//! ## Policy churn (`policy_churn_under_traffic`)
//!
//! For `OXVS_CHURN_SECS` seconds (default 60), one policy at a time is
//! applied or deleted (random pick among those that keep the invariant,
//! 50-400 ms apart; seed from `OXVS_CHURN_SEED` or the clock, printed):
//! a deny-all in z; allow x/a -> x/b by podSelector; by namespaceSelector
//! AND podSelector (matchExpressions); by ipBlock x/a/32 with ports; a
//! deny-all in x (only while some allow is in force, and the last allow is
//! not removed while it is); an egress policy on x/a allowing only x/b;
//! and in y an allow from namespace x on TCP 81 only (it selects the denied
//! pairs but not port 80). After every change the test checks, with the
//! API interpreter (`oxvs_agent::policy::allowed`) on the lab's manifests,
//! that the set in force allows x/a -> x/b and denies both denied pairs.

mod common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{oxvsctl, Lab};
use nix::sched::{setns, CloneFlags};
use oxvs_agent::model::Protocol;
use oxvs_agent::policy::{allowed, Endpoint};
use serde_json::Value;

/// The documented window: the longest time allowed traffic may be lost,
/// for an agent restart and under policy churn alike (measured: 0, nothing
/// is lost; see the module doc).
const WINDOW: Duration = Duration::from_millis(500);
/// The allowed pair's TCP connect timeout: a lost handshake is only seen
/// after it, so TCP outages are allowed `WINDOW + ALLOWED_TCP_TIMEOUT`.
const ALLOWED_TCP_TIMEOUT: Duration = Duration::from_secs(1);

/// The windows of [`Traffic::start`]'s allowed series (TCP, then UDP).
fn windows() -> [Duration; 2] {
    [WINDOW + ALLOWED_TCP_TIMEOUT, WINDOW]
}

/// The two tests are timing-sensitive: one lab at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const PODS: &str = "
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {ns: x}}
---
apiVersion: v1
kind: Namespace
metadata: {name: y, labels: {ns: y}}
---
apiVersion: v1
kind: Namespace
metadata: {name: z, labels: {ns: z}}
";

fn pod(ns: &str, name: &str, node: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {ns}, labels: {{pod: {name}}}}}
spec:
  nodeName: {node}
  containers:
  - name: serve
    image: oxvs-lab/serve
    ports: [{{containerPort: 80, protocol: TCP}}, {{containerPort: 80, protocol: UDP}}]
"
    )
}

const Y_ISOLATE: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: y}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {}}]}]
";

const ALLOW_A_TO_B: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-a-to-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: a}}}]}]
";

/// A pod as the tests see it.
#[derive(Clone, Debug)]
struct PodInfo {
    netns: String,
    ip: Ipv4Addr,
}

fn pods(lab: &Lab) -> BTreeMap<String, PodInfo> {
    let st = lab.status();
    st["pods"]
        .as_array()
        .expect("pods")
        .iter()
        .map(|p| {
            let key = format!(
                "{}/{}",
                p["namespace"].as_str().unwrap_or_default(),
                p["name"].as_str().unwrap_or_default()
            );
            let ip = p["ip"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("pod {key} has no IP: {p}"));
            let netns = p["netns"].as_str().unwrap_or_default().to_string();
            (key, PodInfo { netns, ip })
        })
        .collect()
}

fn setup(lab: &Lab, policies: &[&str]) -> BTreeMap<String, PodInfo> {
    let mut y = PODS.to_string();
    for (ns, name, node) in [
        ("x", "a", "node-1"),
        ("x", "b", "node-2"),
        ("y", "c", "node-1"),
        ("y", "d", "node-2"),
        ("z", "e", "node-1"),
    ] {
        y.push_str(&pod(ns, name, node));
    }
    for p in policies {
        y.push_str("---\n");
        y.push_str(p);
    }
    let f = lab.file("setup.yaml", &y);
    lab.ok(&["apply", "-f", &f]);
    pods(lab)
}

/// `from -> to` on TCP/80 as the lab's prober sees it.
fn probe_matrix(lab: &Lab) -> BTreeMap<(String, String), bool> {
    let out = lab.ok(&[
        "probe",
        "--protocol",
        "tcp",
        "--port",
        "80",
        "--timeout-ms",
        "500",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).expect("probe --json");
    v.as_array()
        .expect("list")
        .iter()
        .map(|p| {
            (
                (
                    p["from"].as_str().unwrap_or_default().to_string(),
                    p["to"].as_str().unwrap_or_default().to_string(),
                ),
                p["reachable"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// Waits (<= 5 s) until the probed matrix has `want` for every listed pair.
fn converge(lab: &Lab, want: &[(&str, &str, bool)]) {
    let t0 = Instant::now();
    loop {
        let m = probe_matrix(lab);
        let bad: Vec<String> = want
            .iter()
            .filter(|(f, t, w)| m.get(&(f.to_string(), t.to_string())) != Some(w))
            .map(|(f, t, w)| {
                format!(
                    "{f} -> {t} should be {}",
                    if *w { "reachable" } else { "blocked" }
                )
            })
            .collect();
        if bad.is_empty() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "not converged: {bad:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `f` on a new thread that first enters namespace `netns`.
fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let path = format!("/var/run/netns/{netns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        setns(&fd, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
}

/// What one traffic thread saw: when each attempt started and whether it
/// succeeded (a completed handshake, an echo).
#[derive(Debug, Default)]
struct Series {
    what: String,
    attempts: Vec<(Instant, bool)>,
}

impl Series {
    fn ok(&self) -> usize {
        self.attempts.iter().filter(|(_, ok)| *ok).count()
    }
    fn failed(&self) -> usize {
        self.attempts.len() - self.ok()
    }
    /// The longest outage: from the start of a failed attempt to the start
    /// of the next successful one (or the end of the series), and when it
    /// began. Zero when nothing failed. A lost TCP handshake costs at least
    /// its timeout, a lost datagram about one send interval.
    fn outage(&self) -> (Duration, Option<Instant>) {
        let mut worst = (Duration::ZERO, None);
        let mut down_since: Option<Instant> = None;
        for (t, ok) in &self.attempts {
            match (ok, down_since) {
                (false, None) => down_since = Some(*t),
                (true, Some(d)) => {
                    if t.duration_since(d) > worst.0 {
                        worst = (t.duration_since(d), Some(d));
                    }
                    down_since = None;
                }
                _ => {}
            }
        }
        if let (Some(d), Some((last, _))) = (down_since, self.attempts.last()) {
            let span = last.duration_since(d).max(Duration::from_millis(1));
            if span > worst.0 {
                worst = (span, Some(d));
            }
        }
        worst
    }
    /// The longest time between two attempts' starts: the sender's own
    /// stalls (a loaded machine), which are not outages.
    fn max_interval(&self) -> Duration {
        self.attempts
            .windows(2)
            .map(|w| w[1].0.duration_since(w[0].0))
            .max()
            .unwrap_or_default()
    }
    /// Start times of successful attempts.
    fn successes(&self) -> Vec<Instant> {
        self.attempts
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(t, _)| *t)
            .collect()
    }
}

/// New TCP connections to `dst:80` until `stop`, one every `every` (or at
/// once after a failure that took longer).
fn tcp_loop(
    netns: &str,
    what: String,
    dst: Ipv4Addr,
    every: Duration,
    timeout: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Series> {
    in_netns(netns, move || {
        let mut s = Series {
            what,
            ..Series::default()
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(dst, 80));
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let ok = TcpStream::connect_timeout(&addr, timeout).is_ok();
            s.attempts.push((t, ok));
            if let Some(rest) = every.checked_sub(t.elapsed()) {
                std::thread::sleep(rest);
            }
        }
        s
    })
}

/// One UDP datagram to `dst:80` every `every`, each from a fresh socket;
/// an echo within 1 s is a success.
fn udp_loop(
    netns: &str,
    what: String,
    dst: Ipv4Addr,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Series> {
    in_netns(netns, move || {
        let mut s = Series {
            what,
            ..Series::default()
        };
        let addr = SocketAddr::V4(SocketAddrV4::new(dst, 80));
        // (index in attempts, socket, sent at)
        let mut pending: Vec<(usize, UdpSocket, Instant)> = Vec::new();
        let mut buf = [0u8; 64];
        let mut next = Instant::now();
        let mut stopping: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if stopping.is_none() && stop.load(Ordering::Relaxed) {
                stopping = Some(now);
            }
            if stopping.is_none() && now >= next {
                next += every;
                let i = s.attempts.len();
                s.attempts.push((now, false));
                let sock = UdpSocket::bind("0.0.0.0:0").expect("udp socket");
                sock.set_nonblocking(true).expect("nonblocking");
                if sock.send_to(format!("{i}").as_bytes(), addr).is_ok() {
                    pending.push((i, sock, now));
                }
            }
            pending.retain(|(i, sock, sent)| match sock.recv_from(&mut buf) {
                Ok(_) => {
                    s.attempts[*i].1 = true;
                    false
                }
                Err(_) => sent.elapsed() < Duration::from_secs(1),
            });
            if let Some(t) = stopping {
                if pending.is_empty() || t.elapsed() > Duration::from_secs(1) {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        s
    })
}

/// The traffic of both tests: allowed x/a -> x/b, and every denied pair.
struct Traffic {
    stop: Arc<AtomicBool>,
    allowed: Vec<JoinHandle<Series>>,
    denied: Vec<JoinHandle<Series>>,
}

impl Traffic {
    fn start(p: &BTreeMap<String, PodInfo>, denied: &[(&str, &str)]) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let (a, b) = (&p["x/a"], &p["x/b"]);
        let allowed = vec![
            tcp_loop(
                &a.netns,
                "allowed TCP x/a -> x/b".into(),
                b.ip,
                Duration::from_millis(50),
                ALLOWED_TCP_TIMEOUT,
                stop.clone(),
            ),
            udp_loop(
                &a.netns,
                "allowed UDP x/a -> x/b".into(),
                b.ip,
                Duration::from_millis(20),
                stop.clone(),
            ),
        ];
        let mut d = Vec::new();
        for (from, to) in denied {
            let (f, t) = (&p[*from], &p[*to]);
            d.push(tcp_loop(
                &f.netns,
                format!("denied TCP {from} -> {to}"),
                t.ip,
                Duration::ZERO,
                Duration::from_millis(200),
                stop.clone(),
            ));
            d.push(udp_loop(
                &f.netns,
                format!("denied UDP {from} -> {to}"),
                t.ip,
                Duration::from_millis(20),
                stop.clone(),
            ));
        }
        Traffic {
            stop,
            allowed,
            denied: d,
        }
    }

    fn finish(self) -> (Vec<Series>, Vec<Series>) {
        self.stop.store(true, Ordering::Relaxed);
        let join = |v: Vec<JoinHandle<Series>>| -> Vec<Series> {
            v.into_iter()
                .map(|h| h.join().expect("traffic thread"))
                .collect()
        };
        (join(self.allowed), join(self.denied))
    }
}

/// Prints and checks what the traffic saw; `t0` for relative times.
/// `windows[i]` is the longest outage allowed for `allowed[i]`.
fn check_traffic(allowed: &[Series], denied: &[Series], windows: &[Duration], t0: Instant) {
    let rel = |t: Instant| t.duration_since(t0).as_secs_f64();
    let mut problems = Vec::new();
    for (s, window) in allowed.iter().zip(windows) {
        let (outage, at) = s.outage();
        eprintln!(
            "{}: {} attempts, {} ok, {} failed, longest outage {:.0} ms{}, longest send interval {:.0} ms",
            s.what,
            s.attempts.len(),
            s.ok(),
            s.failed(),
            outage.as_secs_f64() * 1e3,
            at.map_or(String::new(), |t| format!(" (from t={:.2} s)", rel(t))),
            s.max_interval().as_secs_f64() * 1e3,
        );
        assert!(s.ok() > 0, "{}: no attempt succeeded", s.what);
        if outage > *window {
            problems.push(format!(
                "{}: allowed traffic dropped for {outage:?} (from t={:.2} s), beyond the documented {window:?}",
                s.what,
                at.map_or(0.0, rel)
            ));
        }
    }
    for s in denied {
        let leaks = s.successes();
        eprintln!(
            "{}: {} attempts, {} got through",
            s.what,
            s.attempts.len(),
            leaks.len()
        );
        assert!(s.attempts.len() > 10, "{}: too few attempts", s.what);
        if !leaks.is_empty() {
            let at: Vec<String> = leaks
                .iter()
                .take(10)
                .map(|t| format!("{:.2}", rel(*t)))
                .collect();
            problems.push(format!(
                "{}: DENIED traffic passed {} time(s), at t = {} s",
                s.what,
                leaks.len(),
                at.join(", ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The flows of the switch at `sock`, without statistics, sorted.
fn flows_at(sock: &std::path::Path) -> Result<Vec<String>, String> {
    let out = std::process::Command::new(oxvsctl())
        .args(["dump-flows", "--no-stats", "--socket"])
        .arg(sock)
        .output()
        .map_err(|e| format!("cannot run oxvsctl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    Ok(v)
}

/// `node`'s flows, without statistics, sorted.
fn flows(lab: &Lab, node: &str) -> Vec<String> {
    flows_at(&lab.root().join(node).join("switchd.sock"))
        .unwrap_or_else(|e| panic!("dump-flows on {node}: {e}"))
}

/// A dump that differed: when, the flows missing, the flows extra.
type FlowDiff = (Instant, Vec<String>, Vec<String>);

/// Dumps `node`'s flows back to back until `stop`; every dump that differs
/// from `want`, as (when, flows missing, flows extra).
fn watch_flows(
    lab: &Lab,
    node: &str,
    want: Vec<String>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(usize, Vec<FlowDiff>)> {
    let sock = lab.root().join(node).join("switchd.sock");
    std::thread::spawn(move || {
        let mut n = 0;
        let mut bad = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            match flows_at(&sock) {
                Ok(got) => {
                    n += 1;
                    if got != want {
                        let missing = want.iter().filter(|l| !got.contains(l)).cloned().collect();
                        let extra = got.iter().filter(|l| !want.contains(l)).cloned().collect();
                        bad.push((t, missing, extra));
                    }
                }
                Err(e) => bad.push((t, vec![format!("dump-flows failed: {e}")], Vec::new())),
            }
        }
        (n, bad)
    })
}

fn agent_pid(lab: &Lab, node: &str) -> u32 {
    let st = lab.status();
    st["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == node)
        .and_then(|n| n["agent"]["pid"].as_u64())
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("no agent pid for {node}: {st}"))
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_else(|e| panic!("/proc/{pid}/cmdline: {e}"))
}

#[test]
fn agent_restart_under_traffic() {
    skip_unless_capable!();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lab = Lab::up(2);
    let p = setup(&lab, &[Y_ISOLATE, ALLOW_A_TO_B]);
    let denied = [("x/a", "y/d"), ("x/b", "y/c"), ("y/c", "x/b")];
    let mut want: Vec<(&str, &str, bool)> = vec![("x/a", "x/b", true)];
    want.extend(denied.iter().map(|(f, t)| (*f, *t, false)));
    converge(&lab, &want);
    let before: Vec<Vec<String>> = ["node-1", "node-2"]
        .iter()
        .map(|n| flows(&lab, n))
        .collect();

    let t0 = Instant::now();
    let traffic = Traffic::start(&p, &denied);
    std::thread::sleep(Duration::from_secs(2));
    let mut restarts = Vec::new();
    let mut changed_flows = Vec::new();
    for (node, kill) in [("node-2", false), ("node-1", true), ("node-2", true)] {
        let old = agent_pid(&lab, node);
        let old_cmd = cmdline(old);
        let t = Instant::now();
        let mut args = vec!["agent", "restart", node];
        if kill {
            args.push("--kill");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let i = usize::from(node == "node-2");
        let watcher = watch_flows(&lab, node, before[i].clone(), stop.clone());
        let out = lab.ok(&args);
        let took = t.elapsed();
        // Keep watching past the new agent's first convergence.
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        let (dumps, bad) = watcher.join().expect("flow watcher");
        if let Some((at, missing, extra)) = bad.first() {
            changed_flows.push(format!(
                "{node} ({}): {} of {dumps} dumps during the restart differ from the flows before; first at t={:.3} s: {} missing {missing:#?}, {} extra {extra:#?}",
                if kill { "SIGKILL" } else { "SIGTERM" },
                bad.len(),
                at.duration_since(t0).as_secs_f64(),
                missing.len(),
                extra.len()
            ));
        }
        let new = agent_pid(&lab, node);
        assert_ne!(old, new, "{out}");
        assert_eq!(
            cmdline(new),
            old_cmd,
            "{node}: the agent must restart with the same command line"
        );
        restarts.push(format!(
            "{node} {} at t={:.2} s: ready after {took:?} ({})",
            if kill { "SIGKILL" } else { "SIGTERM" },
            t.duration_since(t0).as_secs_f64(),
            out.trim()
        ));
        std::thread::sleep(Duration::from_secs(2));
    }
    let (allowed_s, denied_s) = traffic.finish();
    for r in &restarts {
        eprintln!("restart: {r}");
    }
    let traffic_result =
        std::panic::catch_unwind(|| check_traffic(&allowed_s, &denied_s, &windows(), t0));
    assert!(
        changed_flows.is_empty(),
        "a restarting agent changed the switch's flows:\n{}",
        changed_flows.join("\n")
    );
    if let Err(e) = traffic_result {
        std::panic::resume_unwind(e);
    }

    for (i, node) in ["node-1", "node-2"].iter().enumerate() {
        let after = flows(&lab, node);
        let gone: Vec<&String> = before[i].iter().filter(|l| !after.contains(l)).collect();
        let new: Vec<&String> = after.iter().filter(|l| !before[i].contains(l)).collect();
        assert!(
            gone.is_empty() && new.is_empty(),
            "{node}: flows after the restarts differ from before\n--- gone ---\n{gone:#?}\n--- new ---\n{new:#?}"
        );
    }
    assert_eq!(lab.status()["healthy"], true);
}

/// A churned policy: its name (for messages) and YAML.
struct Pol {
    name: &'static str,
    yaml: String,
    /// Allows x/a -> x/b (and isolates x/b).
    allow: bool,
    /// The deny-all in x (isolates x/b, allows nothing).
    deny_x: bool,
}

fn churn_policies(a_ip: Ipv4Addr) -> Vec<Pol> {
    let p = |name, yaml: &str, allow, deny_x| Pol {
        name,
        yaml: yaml.to_string(),
        allow,
        deny_x,
    };
    vec![
        p(
            "z/deny-all",
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: z}
spec: {podSelector: {}, policyTypes: [Ingress]}
",
            false,
            false,
        ),
        p("x/allow-a-to-b", ALLOW_A_TO_B, true, false),
        p(
            "x/allow-b-from-ns-x-pod-a",
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-b-from-ns-x-pod-a, namespace: x}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: In, values: [b]}]}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: x}}
      podSelector: {matchExpressions: [{key: pod, operator: In, values: [a, nobody]}]}
",
            true,
            false,
        ),
        Pol {
            name: "x/allow-b-from-ipblock-a",
            yaml: format!(
                "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: allow-b-from-ipblock-a, namespace: x}}
spec:
  podSelector: {{matchLabels: {{pod: b}}}}
  ingress:
  - from: [{{ipBlock: {{cidr: {a_ip}/32}}}}]
    ports: [{{protocol: TCP, port: 80}}, {{protocol: UDP, port: 80}}]
"
            ),
            allow: true,
            deny_x: false,
        },
        p(
            "x/deny-all",
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
",
            false,
            true,
        ),
        p(
            "x/a-egress-only-to-b",
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-egress-only-to-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress: [{to: [{podSelector: {matchLabels: {pod: b}}}]}]
",
            false,
            false,
        ),
        p(
            "y/allow-81-from-x",
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-81-from-x, namespace: y}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: x}}}]
    ports: [{protocol: TCP, port: 81}]
",
            false,
            false,
        ),
    ]
}

/// xorshift64*: reproducible choices from a printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The interpreter's verdict on the lab's manifests: `(from, to) -> allowed`
/// for TCP and UDP 80.
fn verdict(lab: &Lab, from: &str, to: &str) -> (bool, bool) {
    let (state, warnings) =
        oxvs_agent::source::load_manifest_dir(&lab.root().join("manifests")).expect("manifests");
    assert!(warnings.is_empty(), "manifest warnings: {warnings:?}");
    let ep = |s: &str| {
        let (ns, n) = s.split_once('/').expect("ns/pod");
        Endpoint::Pod((ns.to_string(), n.to_string()))
    };
    (
        allowed(&state, ep(from), ep(to), Protocol::Tcp, 80),
        allowed(&state, ep(from), ep(to), Protocol::Udp, 80),
    )
}

#[test]
fn policy_churn_under_traffic() {
    skip_unless_capable!();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let secs: u64 = std::env::var("OXVS_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("OXVS_CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
        | 1;
    eprintln!("policy churn: {secs} s, seed {seed} (OXVS_CHURN_SECS, OXVS_CHURN_SEED)");
    let lab = Lab::up(2);
    let p = setup(&lab, &[Y_ISOLATE]);
    let denied = [("x/a", "y/d"), ("x/b", "y/c")];
    converge(
        &lab,
        &[
            ("x/a", "x/b", true),
            ("x/a", "y/d", false),
            ("x/b", "y/c", false),
        ],
    );
    let pols = churn_policies(p["x/a"].ip);
    let files: Vec<String> = pols
        .iter()
        .enumerate()
        .map(|(i, pol)| lab.file(&format!("churn{i}.yaml"), &pol.yaml))
        .collect();
    let mut on = vec![false; pols.len()];
    let mut rng = Rng(seed);

    let t0 = Instant::now();
    let traffic = Traffic::start(&p, &denied);
    std::thread::sleep(Duration::from_secs(1));
    let (mut applied, mut deleted) = (0u32, 0u32);
    let mut max_in_force = 0;
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        // Toggles that keep x/a -> x/b allowed: the deny-all in x only with
        // an allow in force, and never removing the last allow under it.
        let allows_on = pols.iter().zip(&on).filter(|(p, o)| p.allow && **o).count();
        let deny_on = pols.iter().zip(&on).any(|(p, o)| p.deny_x && *o);
        let ok: Vec<usize> = (0..pols.len())
            .filter(|&i| {
                let pol = &pols[i];
                if on[i] {
                    !(pol.allow && deny_on && allows_on == 1)
                } else {
                    !(pol.deny_x && allows_on == 0)
                }
            })
            .collect();
        let i = ok[rng.below(ok.len() as u64) as usize];
        if on[i] {
            lab.ok(&["delete", "-f", &files[i]]);
            deleted += 1;
        } else {
            lab.ok(&["apply", "-f", &files[i]]);
            applied += 1;
        }
        on[i] = !on[i];
        max_in_force = max_in_force.max(on.iter().filter(|o| **o).count());
        let in_force: Vec<&str> = pols
            .iter()
            .zip(&on)
            .filter(|(_, o)| **o)
            .map(|(p, _)| p.name)
            .collect();
        // The test's own invariant, held to the API's semantics.
        assert_eq!(
            verdict(&lab, "x/a", "x/b"),
            (true, true),
            "the churn itself broke x/a -> x/b; in force: {in_force:?}"
        );
        for (f, t) in denied {
            assert_eq!(
                verdict(&lab, f, t),
                (false, false),
                "{f} -> {t} allowed by {in_force:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50 + rng.below(350)));
    }
    // Let the last change settle under traffic, then stop.
    std::thread::sleep(Duration::from_secs(1));
    let (allowed_s, denied_s) = traffic.finish();
    eprintln!(
        "policy churn: {applied} applies, {deleted} deletes in {:.1} s, at most {max_in_force} of {} policies in force at once",
        t0.elapsed().as_secs_f64(),
        pols.len()
    );
    check_traffic(&allowed_s, &denied_s, &windows(), t0);
    assert!(applied + deleted >= secs.min(10) as u32, "too few changes");
}
