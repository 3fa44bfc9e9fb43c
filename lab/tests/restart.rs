//! Established TCP connections survive a switch restart, an agent restart
//! and `flush-conntrack`, with real packets on a real
//! 2-node oxvs-lab (root + AF_XDP, real binaries; SKIPPED otherwise).
//!
//! ## The streams
//!
//! Namespace x, pods `srv` and `c1` on node-1, `c2` on node-2. A Python
//! receiver in `srv` (TCP 5001) counts the bytes of every connection it
//! accepts and whether it ended; Python senders in `c1` (same node) and
//! `c2` (across nodes, VXLAN) each open **one** connection to it and send
//! 2 MB/s for the whole test, never reconnecting: any error (reset,
//! timeout) ends the sender and fails the test. Both write their counters
//! to JSON files every 100 ms.
//!
//! After each disruption the test waits until both connections have moved
//! at least 1 MB further (20 s at most) and checks that neither side saw an
//! error or an end, and that the receiver still has exactly the two
//! connections it started with (same peer addresses).
//!
//! ## Disruptions, in order
//!
//! 1. `oxvs-lab switch restart node-1` (both streams cross node-1's
//!    switch): the old switchd saves its connection table on SIGTERM and the
//!    new one restores it (`conntrack state restored: N connections`, N >= 2
//!    asserted); the reattach time the command measured is printed.
//! 2. `oxvs-lab switch restart node-2` (c2's node).
//! 3. `oxvs-lab agent restart node-1` (SIGTERM) and `node-2` (SIGKILL).
//! 4. `oxvsctl flush-conntrack` on both nodes: no entry left, the next
//!    segments are picked up mid-stream (loose TCP, on by default) and the
//!    entries are back.
//! 5. NetworkPolicy still decides: `deny-all-ingress` in namespace x. The
//!    running connections go on (established connections bypass policy);
//!    then node-1's table is flushed: the same-node stream c1 -> srv is now
//!    a new connection neither side's ingress allows, and stops (no byte for
//!    3 s, asserted); node-2 is flushed too. Deleting the policy lets the
//!    next retransmission be picked up and the stream resumes, still the
//!    same connection. (The cross-node stream is not asserted stopped: its
//!    two nodes each see one direction's policy, and a pickup from the
//!    server's side on node-1 is judged as a connection srv -> c2, which
//!    node-1 allows; see docs/operations.md.)
//!
//! The reattach times of the two switch restarts are printed
//! (`--nocapture`), and so are the command outputs.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{lab_bin, Lab};
use serde_json::Value;

/// Sender and receiver, one script (`recv PORT OUT` / `send HOST PORT OUT RATE`).
const STREAM_PY: &str = r#"
import json, os, socket, sys, threading, time

def dump(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)

if sys.argv[1] == "recv":
    port, out = int(sys.argv[2]), sys.argv[3]
    conns, lock = {}, threading.Lock()
    def serve(c, peer):
        key = "%s:%d" % peer
        with lock:
            conns[key] = {"bytes": 0, "end": None}
        try:
            while True:
                b = c.recv(1 << 16)
                if not b:
                    with lock:
                        conns[key]["end"] = "eof"
                    return
                with lock:
                    conns[key]["bytes"] += len(b)
        except Exception as e:
            with lock:
                conns[key]["end"] = repr(e)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    def accept():
        while True:
            c, peer = s.accept()
            threading.Thread(target=serve, args=(c, peer), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    while True:
        with lock:
            dump(out, conns)
        time.sleep(0.1)
else:
    host, port, out, rate = sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    s = socket.create_connection((host, port), timeout=10)
    s.settimeout(None)
    local = "%s:%d" % s.getsockname()
    sent, buf, t0, last = 0, b"x" * 16384, time.time(), 0.0
    try:
        while True:
            s.sendall(buf)
            sent += len(buf)
            now = time.time()
            ahead = sent / rate - (now - t0)
            if ahead > 0:
                time.sleep(ahead)
            if now - last > 0.1:
                dump(out, {"local": local, "sent": sent, "error": None})
                last = now
    except Exception as e:
        dump(out, {"local": local, "sent": sent, "error": repr(e)})
"#;

const PORT: u16 = 5001;
const RATE: u64 = 2_000_000;

fn pods_yaml() -> String {
    let mut y = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {ns: x}}\n---\napiVersion: v1\nkind: List\nitems:\n",
    );
    for (name, node) in [("srv", "node-1"), ("c1", "node-1"), ("c2", "node-2")] {
        y.push_str(&format!(
            "- apiVersion: v1
  kind: Pod
  metadata: {{name: {name}, namespace: x, labels: {{pod: {name}}}}}
  spec:
    nodeName: {node}
    containers:
    - name: c
      ports:
      - {{containerPort: 80, protocol: TCP}}
"
        ));
    }
    y
}

const DENY: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-ingress, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
";

/// The Python processes; killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_in(netns: &str, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", netns, "python3", "-c", STREAM_PY])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start python3")
}

fn read_json(p: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

struct Streams<'a> {
    recv: std::path::PathBuf,
    senders: Vec<(&'static str, std::path::PathBuf)>,
    /// What to print when the streams stall (the nodes' conntrack tables).
    diag: Box<dyn Fn() -> String + 'a>,
}

impl Streams<'_> {
    /// `(sender, its local address, bytes the receiver got)`; panics on any
    /// error or end, or when the receiver's connections are not exactly the
    /// senders'.
    fn progress(&self) -> Vec<(&'static str, String, u64)> {
        let recv = read_json(&self.recv).unwrap_or(Value::Null);
        let conns = recv.as_object().cloned().unwrap_or_default();
        let mut out = Vec::new();
        for (name, path) in &self.senders {
            let s = read_json(path).unwrap_or(Value::Null);
            assert!(
                s["error"].is_null(),
                "sender {name}: the connection failed: {s}"
            );
            let local = s["local"].as_str().unwrap_or_default().to_string();
            let got = &conns.get(&local).cloned().unwrap_or(Value::Null);
            assert!(
                got["end"].is_null(),
                "receiver: the connection from {name} ({local}) ended: {got}"
            );
            out.push((*name, local, got["bytes"].as_u64().unwrap_or(0)));
        }
        assert_eq!(
            conns.len(),
            self.senders.len(),
            "the receiver has other connections than the senders' (a reconnect?): {recv}"
        );
        out
    }

    /// Waits until every stream moved `by` bytes past `from` (or panics
    /// after `within`), checking for errors all along; returns how long it
    /// took.
    fn moves(&self, what: &str, by: u64, within: Duration) -> Duration {
        let t0 = Instant::now();
        let start: Vec<u64> = self.progress().iter().map(|p| p.2).collect();
        loop {
            let now = self.progress();
            if now.iter().zip(&start).all(|(p, s)| p.2 >= s + by) {
                eprintln!(
                    "{what}: streams moved {} MB in {:?} ({:?})",
                    by / 1_000_000,
                    t0.elapsed(),
                    now
                );
                return t0.elapsed();
            }
            if t0.elapsed() > within {
                let diag = (self.diag)();
                panic!(
                    "{what}: the streams did not move {by} bytes in {within:?}: {start:?} -> {now:?}\n{diag}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The receiver's bytes from `name`.
    fn bytes(&self, name: &str) -> u64 {
        self.progress()
            .into_iter()
            .find(|p| p.0 == name)
            .map_or(0, |p| p.2)
    }
}

/// `oxvsctl` on node `node`: its stdout and stderr, whatever the status.
fn oxvsctl_out(lab: &Lab, node: u32, args: &[&str]) -> String {
    let ctl = lab_bin().with_file_name("oxvsctl");
    let sock = lab.root().join(format!("node-{node}/switchd.sock"));
    match Command::new(&ctl)
        .arg("--socket")
        .arg(&sock)
        .args(args)
        .output()
    {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("cannot run {}: {e}\n", ctl.display()),
    }
}

fn oxvsctl(lab: &Lab, node: u32, args: &[&str]) -> String {
    lab.ctl(&format!("node-{node}"), args)
}

/// Conntrack entries of node `node` for TCP port [`PORT`].
fn ct_entries(lab: &Lab, node: u32) -> Vec<String> {
    oxvsctl(lab, node, &["dump-conntrack"])
        .lines()
        .filter(|l| l.contains(&format!("port={PORT}")))
        .map(str::to_string)
        .collect()
}

fn switch_restart(lab: &Lab, node: &str) -> (u64, u64) {
    let out = lab.ok(&["switch", "restart", node]);
    eprint!("{out}");
    let num_after = |needle: &str| -> Option<u64> {
        let i = out.find(needle)? + needle.len();
        out[i..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let reattach = num_after("reattach time ")
        .unwrap_or_else(|| panic!("no reattach time in the output:\n{out}"));
    let restored = num_after("conntrack state restored: ")
        .unwrap_or_else(|| panic!("no restored conntrack state in the output:\n{out}"));
    (reattach, restored)
}

#[test]
fn tcp_streams_survive_switch_and_agent_restarts_and_conntrack_flushes() {
    skip_unless_capable!();
    let lab = Lab::up(2);
    let f = lab.file("pods.yaml", &pods_yaml());
    lab.ok(&["apply", "-f", &f]);
    let st = lab.status();
    let pod = |name: &str| -> (String, String) {
        let p = st["pods"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .unwrap_or_else(|| panic!("no pod {name}: {st}"));
        (
            p["netns"].as_str().unwrap_or_default().to_string(),
            p["ip"].as_str().unwrap_or_default().to_string(),
        )
    };
    let dir = lab.dir.path();
    let streams = Streams {
        recv: dir.join("recv.json"),
        senders: vec![("c1", dir.join("c1.json")), ("c2", dir.join("c2.json"))],
        diag: Box::new(|| {
            let mut d = String::new();
            for n in [1, 2] {
                for cmd in ["dump-conntrack", "stats"] {
                    d.push_str(&format!("--- node-{n}: oxvsctl {cmd} ---\n"));
                    d.push_str(&oxvsctl_out(&lab, n, &[cmd]));
                }
            }
            d
        }),
    };
    let (srv_ns, srv_ip) = pod("srv");
    let mut procs = Procs(vec![spawn_in(
        &srv_ns,
        &[
            "recv",
            &PORT.to_string(),
            &streams.recv.display().to_string(),
        ],
    )]);
    // The receiver listens before the senders connect.
    let t0 = Instant::now();
    while read_json(&streams.recv).is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the receiver did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for (name, path) in &streams.senders {
        let (ns, _) = pod(name);
        procs.0.push(spawn_in(
            &ns,
            &[
                "send",
                &srv_ip,
                &PORT.to_string(),
                &path.display().to_string(),
                &RATE.to_string(),
            ],
        ));
    }
    // Both connected, and the receiver lists both.
    let t0 = Instant::now();
    loop {
        let locals: Vec<String> = streams
            .senders
            .iter()
            .filter_map(|(_, p)| read_json(p)?["local"].as_str().map(str::to_string))
            .collect();
        let recv = read_json(&streams.recv).unwrap_or(Value::Null);
        if locals.len() == 2 && locals.iter().all(|l| recv.get(l).is_some()) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the senders did not connect: {locals:?}, receiver {recv}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    streams.moves("start", 1_000_000, Duration::from_secs(20));
    assert_eq!(ct_entries(&lab, 1).len(), 2, "{:?}", ct_entries(&lab, 1));

    // 1, 2: switch restarts.
    let mut reattach = Vec::new();
    for (node, min_restored) in [("node-1", 2), ("node-2", 1)] {
        let (ms, restored) = switch_restart(&lab, node);
        assert!(
            restored >= min_restored,
            "{node}: {restored} connections restored, want >= {min_restored}"
        );
        reattach.push(ms);
        streams.moves(
            &format!("switch restart {node}"),
            1_000_000,
            Duration::from_secs(20),
        );
    }
    eprintln!("reattach times: {reattach:?} ms");

    // 3: agent restarts.
    eprint!("{}", lab.ok(&["agent", "restart", "node-1"]));
    streams.moves("agent restart node-1", 1_000_000, Duration::from_secs(20));
    eprint!("{}", lab.ok(&["agent", "restart", "node-2", "--kill"]));
    streams.moves(
        "agent restart node-2 (SIGKILL)",
        1_000_000,
        Duration::from_secs(20),
    );

    // 4: flush-conntrack: picked up mid-stream.
    for n in [1, 2] {
        oxvsctl(&lab, n, &["flush-conntrack"]);
    }
    streams.moves("flush-conntrack", 1_000_000, Duration::from_secs(20));
    assert_eq!(ct_entries(&lab, 1).len(), 2, "{:?}", ct_entries(&lab, 1));

    // 5: a policy decides about picked-up connections.
    let deny = lab.file("deny.yaml", DENY);
    lab.ok(&["apply", "-f", &deny]);
    std::thread::sleep(Duration::from_millis(500));
    streams.moves(
        "deny-all-ingress applied (established connections go on)",
        1_000_000,
        Duration::from_secs(20),
    );
    oxvsctl(&lab, 1, &["flush-conntrack"]);
    oxvsctl(&lab, 2, &["flush-conntrack"]);
    // Whatever was in flight lands; then nothing for 3 s.
    std::thread::sleep(Duration::from_millis(500));
    let before = streams.bytes("c1");
    std::thread::sleep(Duration::from_secs(3));
    let after = streams.bytes("c1");
    assert_eq!(
        before, after,
        "c1 -> srv went on after the flush although deny-all-ingress denies it as a new connection"
    );
    let left: Vec<String> = ct_entries(&lab, 1)
        .into_iter()
        .filter(|l| {
            l.contains(&format!("src={}", pod("c1").1))
                || l.contains(&format!("dst={}", pod("c1").1))
        })
        .collect();
    assert!(left.is_empty(), "a denied pickup was committed: {left:?}");
    lab.ok(&["delete", "-f", &deny]);
    streams.moves(
        "deny-all-ingress deleted",
        1_000_000,
        Duration::from_secs(30),
    );
    drop(procs);
}
