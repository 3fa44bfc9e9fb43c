//! One pod flooding new UDP flows at full speed must not stop another pod
//! on the same node from opening TCP connections.
//!
//! One node whose switch has a small connection table and per-port limit
//! (`--ct-max 4096 --ct-port-limit 1000`, so the test is quick): pod a
//! floods pod c with UDP datagrams from a raw socket, every one a new flow
//! (source and destination ports vary, nobody answers), for a bounded
//! count and time, killed with SIGKILL at the end; meanwhile pod b opens
//! TCP connections to pod c, every one of which must succeed. Then a's
//! port owns at most its limit and its refusals are counted
//! (`oxvsctl ct-get-limits`, `stats`), b's port has none refused; a
//! limit changed at run time takes effect.
//!
//! Without the limit (and without early drop) the flood fills the table
//! within milliseconds and b's SYN-ACKs find no connection: every TCP
//! connection of b fails.
//!
//! Root and AF_XDP are required; the test says SKIPPED and passes without
//! them.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Lab;
use serde_json::Value;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: ctl, labels: {ns: ctl}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: a, namespace: ctl}
  spec: {nodeName: node-1, containers: [{name: c}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: b, namespace: ctl}
  spec: {nodeName: node-1, containers: [{name: c}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: c, namespace: ctl}
  spec:
    nodeName: node-1
    containers:
    - name: c
      ports:
      - {containerPort: 80, protocol: TCP}
"#;

const LIMIT: u64 = 1000;

/// UDP from a raw socket (the kernel adds the IP header): new source and
/// destination ports every datagram, to ports nobody listens on; stops
/// after COUNT datagrams or SECS seconds; prints how many it sent. The
/// port pairs repeat every 60,000 datagrams; START shifts them.
const FLOOD: &str = r#"
import socket, struct, sys, time
dst, count, secs, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
payload = b"flood-" * 3
end = time.time() + secs
sent = 0
i = start
while sent < count and time.time() < end:
    for _ in range(256):
        i += 1
        sport = 1024 + (i * 7919) % 60000
        dport = 20000 + (i * 104729) % 20000
        try:
            s.sendto(struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload, (dst, 0))
            sent += 1
        except OSError:
            pass
print(sent)
"#;

/// N TCP connections to IP:PORT, each with a 3 s timeout and reading the
/// server's line; prints the number that succeeded.
const CONNECT: &str = r#"
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ok = 0
for _ in range(n):
    try:
        c = socket.create_connection((ip, port), timeout=3)
        if c.recv(100):
            ok += 1
        c.close()
    except OSError as e:
        print("failed:", e, file=sys.stderr)
print(ok)
"#;

/// Pod `ctl/name`'s (ip, netns) in `status --json`.
fn pod(status: &Value, name: &str) -> (String, String) {
    let p = status["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["namespace"].as_str() == Some("ctl") && p["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no pod ctl/{name} in {status}"));
    (
        p["ip"].as_str().expect("ip").to_string(),
        p["netns"].as_str().expect("netns").to_string(),
    )
}

/// `oxvsctl ARGS` against node-1's switch; stdout (panics on failure).
fn oxvsctl(lab: &Lab, args: &[&str]) -> String {
    lab.ctl("node-1", args)
}

fn json(lab: &Lab, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let text = oxvsctl(lab, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
}

/// The flood, killed (SIGKILL) when dropped if it is still running.
struct Flood(Child);

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The port that owns connections from `ip` (the owner in
/// `dump-conntrack`).
fn owner_of(lab: &Lab, ip: &str) -> Option<u64> {
    let dump = json(lab, &["dump-conntrack"]);
    let needle = format!("src={ip},");
    dump["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["orig"].as_str().is_some_and(|o| o.starts_with(&needle)))
        .and_then(|e| e["owner"].as_u64())
}

fn port_limit(lab: &Lab, ofport: u64) -> Value {
    let v = json(lab, &["ct-get-limits", &format!("port={ofport}")]);
    v["ports"][0].clone()
}

#[test]
fn a_pod_flooding_new_udp_flows_does_not_stop_another_from_connecting() {
    skip_unless_capable!();
    let lab = Lab::up_args(&[
        "--nodes",
        "1",
        "--switchd-arg=--ct-max=4096",
        &format!("--switchd-arg=--ct-port-limit={LIMIT}"),
    ]);
    let pods = lab.file("pods.yaml", PODS);
    lab.ok(&["apply", "-f", &pods]);
    let st = lab.status();
    let (a_ip, a_ns) = pod(&st, "a");
    let (b_ip, _) = pod(&st, "b");
    let (c_ip, _) = pod(&st, "c");

    let limits = json(&lab, &["ct-get-limits"]);
    assert_eq!(limits["max_entries"], 4096, "{limits}");
    assert_eq!(limits["default_limit"], LIMIT, "{limits}");

    let connect = |n: u32| -> u32 {
        let out = lab.run(&[
            "exec",
            "ctl/b",
            "--",
            "python3",
            "-c",
            CONNECT,
            &c_ip,
            "80",
            &n.to_string(),
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse().unwrap_or_else(|_| {
            panic!(
                "connect script: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    // b reaches c before the flood.
    assert_eq!(connect(3), 3, "b cannot reach c even before the flood");

    // The flood: bounded by count and time, SIGKILLed by the guard.
    let flood = Flood(
        Command::new("ip")
            .args(["netns", "exec", &a_ns, "python3", "-c", FLOOD])
            .args([c_ip.as_str(), "3000000", "20", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the flood"),
    );
    // Wait until a has hit its limit: its connections are refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    let a_port = loop {
        if let Some(p) = owner_of(&lab, &a_ip) {
            if port_limit(&lab, p)["refused"].as_u64().unwrap_or(0) > 0 {
                break p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "pod a never hit its limit: {}",
            oxvsctl(&lab, &["ct-get-limits"])
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // While a floods: b opens TCP connections, every one succeeds.
    let t0 = Instant::now();
    let n = 20;
    let ok = connect(n);
    let took = t0.elapsed();
    let a_during = port_limit(&lab, a_port);
    drop(flood);
    assert_eq!(
        ok,
        n,
        "pod b opened only {ok} of {n} TCP connections while pod a flooded\n{}\n{}",
        oxvsctl(&lab, &["ct-get-limits"]),
        oxvsctl(&lab, &["stats"])
    );
    eprintln!("b: {n} connections in {took:?} during the flood; a: {a_during}");

    // The flood's refusals are counted, against a's port only.
    let a = port_limit(&lab, a_port);
    assert!(a["count"].as_u64().unwrap() <= LIMIT, "{a}");
    assert!(a["refused"].as_u64().unwrap() > 0, "{a}");
    assert_eq!(a["limit"], LIMIT, "{a}");
    let b_port = owner_of(&lab, &b_ip).expect("b's connections have an owner");
    assert_ne!(a_port, b_port);
    let b = port_limit(&lab, b_port);
    assert_eq!(b["refused"], 0, "{b}");
    let stats = json(&lab, &["stats"]);
    assert!(
        stats["ct_limit_refused"].as_u64().unwrap() >= a["refused"].as_u64().unwrap(),
        "{stats}"
    );
    assert!(stats["ct_refused_drops"].as_u64().unwrap() > 0, "{stats}");
    // The text forms name it too.
    let text = oxvsctl(&lab, &["ct-get-limits", &format!("port={a_port}")]);
    assert!(text.contains(&format!("port={a_port}(")), "{text}");
    assert!(oxvsctl(&lab, &["stats"]).contains("over a port's limit"));

    // A limit changed at run time: a may own nothing more, b still
    // connects, and a's next new flows are refused (port pairs the flood's
    // first, admitted, datagrams did not use).
    let before = a["refused"].as_u64().unwrap();
    let set = oxvsctl(&lab, &["ct-set-limits", &format!("port={a_port},limit=1")]);
    assert!(set.contains(",limit=1,"), "{set}");
    let one = lab.run(&[
        "exec", "ctl/a", "--", "python3", "-c", FLOOD, &c_ip, "10", "5", "30000",
    ]);
    assert!(one.status.success());
    assert!(
        port_limit(&lab, a_port)["refused"].as_u64().unwrap() >= before + 10,
        "{}",
        oxvsctl(&lab, &["ct-get-limits"])
    );
    assert_eq!(connect(3), 3);
}
