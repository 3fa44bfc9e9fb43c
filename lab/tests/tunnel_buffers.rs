//! The tunnel's socket buffers on a node with the kernel's stock limits.
//!
//! A stock kernel caps `SO_RCVBUF`/`SO_SNDBUF` at `net.core.rmem_max` /
//! `wmem_max`, 212,992 bytes: room for three 64 KiB trains of VXLAN
//! datagrams. A switch that only asks, as it did, loses datagrams under
//! one TCP stream across nodes whenever its datapath thread is busy a few
//! hundred microseconds (measured: ~5,600 retransmits in 5 s, and 9,400
//! with four streams; `docs/benchmarks.md`, "The tunnel's socket buffers").
//! switchd sets them with `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE`, above the
//! limits. Checked here through the real agents and switches of a two-node
//! lab started while the limits are the stock ones (the buffers are sized
//! when the tunnel port opens; the limits are restored as soon as both
//! nodes have theirs): two TCP streams from a pod on node-1 to one on
//! node-2 for three seconds, and not one datagram may be lost at either
//! tunnel port (the receiver's `rx_dropped`: its kernel's `SO_RXQ_OVFL`
//! count; the sender's `tx_dropped`: sends refused for a full buffer).
//!
//! This test changes two machine-wide sysctls for the seconds the lab
//! takes to start (nothing else runs in this test binary) and puts them
//! back, also when it fails. Root and AF_XDP are required; the test says
//! SKIPPED and passes without them.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{pod_field, pod_ip, Lab};
use serde_json::Value;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: tb, labels: {ns: tb}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: a, namespace: tb}
  spec:
    nodeName: node-1
    containers:
    - name: c
- apiVersion: v1
  kind: Pod
  metadata: {name: c, namespace: tb}
  spec:
    nodeName: node-2
    containers:
    - name: c
"#;

/// The stock `net.core.rmem_max` and `wmem_max`.
const STOCK_LIMIT: u64 = 212_992;
const PORT: u16 = 7712;
const STREAMS: usize = 2;
const SECONDS: f64 = 3.0;

/// Reads every connection to the end (one thread each) and prints the
/// total once `streams` have closed.
const SINK: &str = r#"
import socket, sys, threading
port, streams = int(sys.argv[1]), int(sys.argv[2])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", port))
l.listen(streams)
print("ready", flush=True)
total = [0]
lock = threading.Lock()
def drain(c):
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    with lock:
        total[0] += n
ts = []
for _ in range(streams):
    c, _ = l.accept()
    t = threading.Thread(target=drain, args=(c,))
    t.start()
    ts.append(t)
for t in ts:
    t.join()
print(total[0], flush=True)
"#;

/// `streams` connections sending flat out for `seconds`.
const BLAST: &str = r#"
import socket, sys, threading, time
ip, port, streams, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
block = bytes(1 << 20)
def blast():
    s = socket.create_connection((ip, port), timeout=20)
    end = time.time() + seconds
    while time.time() < end:
        s.sendall(block)
    s.close()
ts = [threading.Thread(target=blast) for _ in range(streams)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("sent", flush=True)
"#;

/// Sets `net.core.rmem_max` and `wmem_max` to the stock limit and puts
/// the previous values back on drop.
struct StockLimits(Vec<(&'static str, String)>);

impl StockLimits {
    fn set() -> StockLimits {
        let mut saved = Vec::new();
        for name in ["rmem_max", "wmem_max"] {
            let path = format!("/proc/sys/net/core/{name}");
            let old = std::fs::read_to_string(&path).expect("read sysctl");
            saved.push((name, old.trim().to_string()));
            std::fs::write(&path, STOCK_LIMIT.to_string()).expect("write sysctl");
        }
        StockLimits(saved)
    }
}

impl Drop for StockLimits {
    fn drop(&mut self) {
        for (name, old) in &self.0 {
            let _ = std::fs::write(format!("/proc/sys/net/core/{name}"), old);
        }
    }
}

/// A process killed on drop (also when the test fails).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tunnel port's stats on `node`, if it has one yet.
fn tunnel_stats(lab: &Lab, node: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(&lab.ctl(node, &["show", "--json"])).expect("show json");
    v["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["kind"].as_str() == Some("vxlan"))
        .map(|p| p["stats"].clone())
}

fn stat(s: &Value, field: &str) -> u64 {
    s[field].as_u64().unwrap_or(0)
}

#[test]
fn tunnel_keeps_up_with_tcp_on_a_node_with_stock_buffer_limits() {
    skip_unless_capable!();
    let limits = StockLimits::set();
    let lab = Lab::up(2);
    let pods = lab.file("pods.yaml", PODS);
    lab.ok(&["apply", "-f", &pods]);
    // Both tunnel ports open (their buffers sized) before the limits go back.
    let deadline = Instant::now() + Duration::from_secs(30);
    while ["node-1", "node-2"]
        .iter()
        .any(|n| tunnel_stats(&lab, n).is_none())
    {
        assert!(Instant::now() < deadline, "no tunnel port after 30 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(limits);

    let st = lab.status();
    let (a_ns, c_ns) = (
        pod_field(&st, "tb", "a", "netns"),
        pod_field(&st, "tb", "c", "netns"),
    );
    let c_ip = pod_ip(&st, "tb", "c");
    let mut sink = Command::new("ip")
        .args(["netns", "exec", &c_ns, "python3", "-c", SINK])
        .args([PORT.to_string(), STREAMS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sink");
    let mut out = std::io::BufReader::new(sink.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("sink output");
    let _sink = Killed(sink);
    assert_eq!(line.trim(), "ready", "the sink did not start");

    let before = [
        tunnel_stats(&lab, "node-1").expect("node-1 tunnel"),
        tunnel_stats(&lab, "node-2").expect("node-2 tunnel"),
    ];
    let blast = Command::new("ip")
        .args(["netns", "exec", &a_ns, "python3", "-c", BLAST])
        .args([
            c_ip.as_str(),
            &PORT.to_string(),
            &STREAMS.to_string(),
            &SECONDS.to_string(),
        ])
        .output()
        .expect("run blast");
    assert!(
        blast.status.success(),
        "blast: {}",
        String::from_utf8_lossy(&blast.stderr)
    );
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).expect("sink total");
    let received: u64 = line.trim().parse().expect("sink total");
    let after = [
        tunnel_stats(&lab, "node-1").expect("node-1 tunnel"),
        tunnel_stats(&lab, "node-2").expect("node-2 tunnel"),
    ];
    let delta = |i: usize, f: &str| stat(&after[i], f).saturating_sub(stat(&before[i], f));
    eprintln!(
        "{received} bytes in {SECONDS} s; node-1 tunnel tx {} packets, tx_dropped {}; node-2 tunnel rx {} packets, rx_dropped {}",
        delta(0, "tx_packets"),
        delta(0, "tx_dropped"),
        delta(1, "rx_packets"),
        delta(1, "rx_dropped"),
    );
    // Real load: at least 100 MB (a few Gbit/s on a quiet machine).
    assert!(received > 100 << 20, "only {received} bytes arrived");
    assert_eq!(
        delta(1, "rx_dropped"),
        0,
        "the receiving node's tunnel socket dropped datagrams (full receive buffer)"
    );
    assert_eq!(
        delta(0, "tx_dropped"),
        0,
        "the sending node's tunnel refused sends (full send buffer)"
    );
}
