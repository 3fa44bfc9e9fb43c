//! The tunnel is not an open door: forged VXLAN packets, sent by a pod to
//! its own node or to another node, or by a host on the underlay that is no
//! node, deliver nothing to the pods behind the switches, with and without
//! a deny-all policy, whatever inner source they claim (a pod, the victim's
//! gateway or node address, which ingress policy exempts for the node's own
//! traffic). The agents' metrics count the drops.
//!
//! Each forged packet is a whole VXLAN datagram (outer UDP to port 4789 of
//! a node's underlay address, inner Ethernet + IPv4 + UDP) sent from an
//! ordinary UDP socket, as any unprivileged process can; the victims run a
//! UDP listener that prints what reaches it. Before each forged round the
//! same listeners receive a datagram sent the honest way, so silence means
//! the guard, not a broken listener.
//!
//! Root and AF_XDP are required; the test says SKIPPED and passes without
//! them.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{pod_ip, Lab, UdpListener};
use serde_json::Value;

const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: tg, labels: {ns: tg}}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: evil, namespace: tg, labels: {role: evil}}
  spec: {nodeName: node-1, containers: [{name: c}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: v1, namespace: tg, labels: {role: victim}}
  spec: {nodeName: node-1, containers: [{name: c}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: v2, namespace: tg, labels: {role: victim}}
  spec: {nodeName: node-2, containers: [{name: c}]}
"#;

/// The victims accept nothing at all.
const DENY_VICTIMS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-victims, namespace: tg}
spec:
  podSelector: {matchLabels: {role: victim}}
  policyTypes: [Ingress]
"#;

/// The port the victims listen on.
const PORT: u16 = 7777;

/// Sends one datagram (`token`) to `ip:port` the normal way.
const SEND: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"#;

/// Sends forged VXLAN datagrams: `argv[1]` is the inner UDP port, then
/// groups of four: the node (outer destination, port 4789), the inner
/// source and destination IPv4 addresses, the payload. Each one three
/// times, 20 ms apart.
const FORGE: &str = r#"
import socket, struct, sys, time
port, rest = int(sys.argv[1]), sys.argv[2:]
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    for i in range(0, len(rest), 4):
        node, inner_src, inner_dst, token = rest[i:i + 4]
        payload = token.encode()
        udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                         socket.inet_aton(inner_src), socket.inet_aton(inner_dst))
        ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
        eth = bytes.fromhex("0a580af40001" "02deadbeef01" "0800")
        vxlan = struct.pack("!II", 0x08000000, 0)
        s.sendto(vxlan + eth + ip + udp, (node, 4789))
    time.sleep(0.02)
"#;

/// (underlay IP, gateway IP) of node `name`.
fn node_addrs(status: &Value, name: &str) -> (String, String) {
    let n = status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no node {name} in {status}"));
    let ip = n["ip"].as_str().expect("node ip").to_string();
    let cidr: ipnet::Ipv4Net = n["podCIDR"]
        .as_str()
        .expect("podCIDR")
        .parse()
        .expect("podCIDR parses");
    let gw = std::net::Ipv4Addr::from(u32::from(cidr.network()) + 1);
    (ip, gw.to_string())
}

/// A listener on PORT in pod `tg/<pod>`'s namespace.
fn listen(lab: &Lab, pod: &str) -> UdpListener {
    let st = lab.status();
    let netns = st["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["namespace"].as_str() == Some("tg") && p["name"].as_str() == Some(pod))
        .and_then(|p| p["netns"].as_str())
        .unwrap_or_else(|| panic!("no netns for tg/{pod}"))
        .to_string();
    UdpListener::start(&netns, PORT)
}

/// Runs python `script` with `args` in pod `tg/<pod>`.
fn pod_py(lab: &Lab, pod: &str, script: &str, args: &[&str]) {
    let mut all = vec!["exec", pod, "--", "python3", "-c", script];
    all.extend_from_slice(args);
    lab.ok(&all);
}

/// Runs python `script` with `args` in the lab's underlay namespace (a host
/// on the nodes' network that is no node).
fn underlay_py(lab: &Lab, script: &str, args: &[&str]) {
    let ns = format!("{}-ul", lab.name);
    let out = Command::new("ip")
        .args(["netns", "exec", &ns, "python3", "-c", script])
        .args(args)
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Packets the flows with `cookie` dropped, summed over both nodes'
/// switches (what `oxvs_agent_tunnel_drops_total` reports per node).
fn dropped_by(lab: &Lab, cookie: &str) -> u64 {
    let mut sum = 0;
    for node in ["node-1", "node-2"] {
        for l in lab.ctl(node, &["dump-flows"]).lines() {
            if l.contains(&format!("cookie={cookie},")) {
                let n = l
                    .split("n_packets=")
                    .nth(1)
                    .and_then(|r| r.split(',').next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no n_packets in {l}"));
                sum += n;
            }
        }
    }
    sum
}

/// Starts listeners in both victims, sends honest datagrams from evil to
/// both if `honest`, then runs `forge`; returns what each victim received.
fn round(lab: &Lab, honest: bool, forge: &dyn Fn()) -> (Vec<String>, Vec<String>) {
    let st = lab.status();
    let l1 = listen(lab, "v1");
    let l2 = listen(lab, "v2");
    if honest {
        for pod in ["v1", "v2"] {
            let dst = pod_ip(&st, "tg", pod);
            pod_py(lab, "tg/evil", SEND, &[&dst, &PORT.to_string(), "honest"]);
        }
    }
    forge();
    (l1.received(), l2.received())
}

/// Waits until the policy keeps evil's honest datagrams from `pod`
/// (`apply` writes the manifest; the agents install it a moment later).
fn wait_policy(lab: &Lab, pod: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let ip = pod_ip(&lab.status(), "tg", pod);
    loop {
        let l = listen(lab, pod);
        pod_py(lab, "tg/evil", SEND, &[&ip, &PORT.to_string(), "probe"]);
        if l.received().is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "the policy never took effect");
    }
}

#[test]
fn forged_vxlan_delivers_nothing() {
    skip_unless_capable!();
    let lab = Lab::up(2);
    let pods = lab.file("pods.yaml", PODS);
    lab.ok(&["apply", "-f", &pods]);
    let st = lab.status();
    let (n1, gw1) = node_addrs(&st, "node-1");
    let (n2, gw2) = node_addrs(&st, "node-2");
    let (v1, v2) = (pod_ip(&st, "tg", "v1"), pod_ip(&st, "tg", "v2"));
    let evil = pod_ip(&st, "tg", "evil");
    let port = PORT.to_string();

    // Every way in: the pod to its own node and to the other node, a host
    // on the underlay to both; inner sources: the pod itself, the victim's
    // gateway and the victim's node (the addresses policy exempts).
    let forge_all = |tag: &str| {
        let mut from_pod = vec![port.clone()];
        let mut from_underlay = vec![port.clone()];
        for (victim, node_of_victim, gw_of_victim) in [(&v1, &n1, &gw1), (&v2, &n2, &gw2)] {
            for src in [&evil, gw_of_victim, node_of_victim] {
                for node in [&n1, &n2] {
                    for (who, args) in [("pod", &mut from_pod), ("underlay", &mut from_underlay)] {
                        args.extend([
                            node.to_string(),
                            src.to_string(),
                            victim.to_string(),
                            format!("forged-{tag}-{who}-via-{node}-from-{src}"),
                        ]);
                    }
                }
            }
        }
        let args: Vec<&str> = from_pod.iter().map(String::as_str).collect();
        pod_py(&lab, "tg/evil", FORGE, &args);
        let args: Vec<&str> = from_underlay.iter().map(String::as_str).collect();
        underlay_py(&lab, FORGE, &args);
    };

    // 1. No policy: the honest datagrams arrive, no forged one does.
    let (r1, r2) = round(&lab, true, &|| forge_all("open"));
    assert!(r1.iter().any(|l| l == "honest"), "v1 got {r1:?}");
    assert!(r2.iter().any(|l| l == "honest"), "v2 got {r2:?}");
    let forged: Vec<&String> = r1
        .iter()
        .chain(&r2)
        .filter(|l| l.starts_with("forged"))
        .collect();
    assert!(forged.is_empty(), "forged VXLAN delivered: {forged:?}");

    // 2. The victims isolated: still nothing forged, whatever the source.
    let pol = lab.file("deny.yaml", DENY_VICTIMS);
    lab.ok(&["apply", "-f", &pol]);
    wait_policy(&lab, "v1");
    wait_policy(&lab, "v2");
    let (r1, r2) = round(&lab, false, &|| forge_all("isolated"));
    let forged: Vec<&String> = r1
        .iter()
        .chain(&r2)
        .filter(|l| l.starts_with("forged"))
        .collect();
    assert!(forged.is_empty(), "forged VXLAN delivered: {forged:?}");

    // Both guards counted what they dropped: the pod's datagrams to the
    // VXLAN ports in its node's pipeline (2 rounds x 12 kinds x 3 copies),
    // the underlay's in the receiving node's Classifier (as many).
    let pod_drops = dropped_by(&lab, "0x3000000000004");
    let unknown = dropped_by(&lab, "0x3000000000003");
    assert!(pod_drops >= 72, "pod -> VXLAN port drops: {pod_drops}");
    assert!(unknown >= 72, "unknown tunnel source drops: {unknown}");
}
