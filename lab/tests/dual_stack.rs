//! Dual-stack pods on a real 2-node lab (`up --ip-family dual`): every pod
//! gets an IPv4 and an IPv6 address from its node's two pod CIDRs, and
//! IPv6 works as IPv4 does, through the same switch and tunnel:
//!
//! - TCP and UDP over IPv6 between pods on one node and across nodes
//!   (VXLAN over the IPv4 underlay), between hosts and pods, and a UDP
//!   datagram larger than the tunnel's MTU (IPv6 fragments);
//! - Neighbour Discovery: the switch answers a pod's solicitation for its
//!   gateway (the pod learns the gateway's MAC, flagged as a router);
//! - SpoofGuard for IPv6 and ND, with forged frames sent from a pod's own
//!   namespace: a packet from another pod's IPv6 address is dropped (no
//!   answer reaches the pod it names, while the same frame from the pod's
//!   own address is answered; without the source check the test fails), a Neighbour Advertisement claiming another
//!   pod's address does not reach the host's neighbour table, and a
//!   router advertisement is dropped.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::paths::{self, path, Proto, Report, Want};
use common::Lab;
use serde_json::Value;

/// Sends hand-made Ethernet frames from the current namespace and
/// listens for ICMPv6 echo replies. Modes:
/// - `echo IFACE SRC_MAC DST_MAC SRC_IP DST_IP ID`: an echo request;
/// - `na IFACE SRC_MAC DST_MAC SRC_IP TARGET`: an unsolicited Neighbour
///   Advertisement (override) for TARGET with SRC_MAC as its link-layer
///   address, to all nodes (ff02::1);
/// - `ra IFACE SRC_MAC SRC_IP`: a router advertisement (router lifetime
///   1800 s) to all nodes;
/// - `listen ID SECONDS`: prints how many echo replies with identifier ID
///   arrive in SECONDS.
const FRAMES: &str = r#"
import socket, struct, sys, time
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff
def mac(m): return bytes.fromhex(m.replace(":", ""))
def ip6(a): return socket.inet_pton(socket.AF_INET6, a)
def icmp6(src, dst, body):
    pseudo = ip6(src) + ip6(dst) + struct.pack("!I3xB", len(body), 58)
    c = csum(pseudo + body)
    return body[:2] + struct.pack("!H", c) + body[4:]
def frame(smac, dmac, src, dst, body, hops=64):
    hdr = struct.pack("!IHBB", 6 << 28, len(body), 58, hops) + ip6(src) + ip6(dst)
    return mac(dmac) + mac(smac) + b"\x86\xdd" + hdr + icmp6(src, dst, body)
def send(iface, f):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    s.send(f)
mode = sys.argv[1]
if mode == "echo":
    iface, smac, dmac, src, dst, ident = sys.argv[2:8]
    body = struct.pack("!BBHHH", 128, 0, 0, int(ident), 1) + b"oxvs-spoof"
    send(iface, frame(smac, dmac, src, dst, body))
elif mode == "na":
    iface, smac, dmac, src, target = sys.argv[2:7]
    body = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + ip6(target) + bytes([2, 1]) + mac(smac)
    send(iface, frame(smac, dmac, src, "ff02::1", body, 255))
elif mode == "ra":
    iface, smac, src = sys.argv[2:5]
    body = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0) + bytes([1, 1]) + mac(smac)
    send(iface, frame(smac, "33:33:00:00:00:01", src, "ff02::1", body, 255))
elif mode == "listen":
    ident, secs = int(sys.argv[2]), float(sys.argv[3])
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    s.settimeout(0.2)
    print("ready", flush=True)
    n, end = 0, time.time() + secs
    while time.time() < end:
        try:
            b = s.recv(2048)
        except socket.timeout:
            continue
        if len(b) >= 8 and b[0] == 129 and struct.unpack("!H", b[4:6])[0] == ident:
            n += 1
    print(n)
"#;

/// The MAC oxvs gives the pod holding IPv4 address `ip` (`0a:58:` + it).
fn pod_mac(ip: &str) -> String {
    let o: Vec<u8> = ip.split('.').map(|x| x.parse().expect("octet")).collect();
    format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

/// The pod's `(ip, ip6)` from `status --json` (pods of `default`).
fn addrs(status: &Value, name: &str) -> (String, String) {
    (
        common::pod_field(status, "default", name, "ip"),
        common::pod_field(status, "default", name, "ip6"),
    )
}

/// Runs the frame tool in pod `key`'s namespace.
fn frames(lab: &Lab, key: &str, args: &[&str]) -> String {
    let mut all = vec!["exec", key, "--", "python3", "-c", FRAMES];
    all.extend_from_slice(args);
    lab.ok(&all).trim().to_string()
}

/// How many echo replies with identifier `id` reach pod `listener` while
/// `send` runs.
fn replies_seen(lab: &Lab, listener: &str, id: u16, send: impl FnOnce()) -> u32 {
    let child = Command::new(common::lab_bin())
        .args([
            "--name", &lab.name, "exec", listener, "--", "python3", "-c", FRAMES, "listen",
        ])
        .arg(id.to_string())
        .arg("2.5")
        .stdout(Stdio::piped())
        .spawn()
        .expect("listener");
    // Wait for the listener's socket.
    std::thread::sleep(Duration::from_millis(700));
    send();
    let out = child.wait_with_output().expect("listener output");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("listener printed {text:?}"))
}

fn evidence(lab: &Lab) -> String {
    paths::switch_evidence(lab, &["node-1", "node-2"], &[&["dump-flows"]])
}

#[test]
fn dual_stack_pods_on_two_nodes() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--ip-family", "dual"]);
    let yaml = [
        paths::pod("default", "a1", "node-1", "{app: a}", true),
        paths::pod("default", "a2", "node-1", "{app: a}", true),
        paths::pod("default", "b1", "node-2", "{app: b}", true),
        paths::pod("default", "a3", "node-1", "{app: c}", false),
    ]
    .concat();
    let f = lab.file("pods.yaml", &yaml);
    lab.ok(&["apply", "-f", &f]);
    let st = lab.status();
    let (a1, a1_6) = addrs(&st, "a1");
    let (a2, a2_6) = addrs(&st, "a2");
    let (b1, b1_6) = addrs(&st, "b1");
    let (_, a3_6) = addrs(&st, "a3");
    assert!(a1_6.starts_with("fd00:10:244:1::"), "{a1_6}");
    assert!(b1_6.starts_with("fd00:10:244:2::"), "{b1_6}");
    let nodes = st["nodes"].as_array().expect("nodes");
    assert_eq!(
        nodes[0]["podCIDRs"],
        serde_json::json!(["10.244.1.0/24", "fd00:10:244:1::/64"])
    );

    // Connectivity over IPv6, TCP and UDP, pods and hosts.
    let netns = |name: &str| common::pod_field(&st, "default", name, "netns");
    let (na1, na2, nb1) = (netns("a1"), netns("a2"), netns("b1"));
    let node = |i: usize| nodes[i]["netns"].as_str().expect("node netns").to_string();
    let mut report = Report::new(evidence);
    let ans = |who: &'static str| Want::Answer(vec![who]);
    report.check(
        &lab,
        "IPv6",
        &[
            path(
                "a2 -> a1 (same node)",
                &na2,
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "b1 -> a1 (across nodes)",
                &nb1,
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "a1 -> b1 (across nodes)",
                &na1,
                (&b1_6, 8080),
                Proto::Tcp,
                ans("default/b1"),
            ),
            path(
                "a2 -> a1 UDP",
                &na2,
                (&a1_6, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "a1 -> b1 UDP",
                &na1,
                (&b1_6, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "node-1 -> a1",
                &node(0),
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "node-2 -> a1",
                &node(1),
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "a1 -> b1 over IPv4 still",
                &na1,
                (&b1, 8080),
                Proto::Tcp,
                ans("default/b1"),
            ),
        ],
    );
    report.finish();
    // Larger than the tunnel's MTU: the pod fragments it (IPv6 has no
    // on-path fragmentation), the switches carry the fragments.
    assert_eq!(lab.udp_echo("default/a1", &b1_6, 8080, 3000), "3000");

    // The switch answered a1's solicitation for its gateway: the
    // gateway's MAC, flagged as a router. An entry the kernel made from a
    // message that carries no router flag (the gateway's own solicitation)
    // gets it from the switch's answer to a1's next probe, which follows
    // within seconds (DELAY, then PROBE): waited for, up to 10 s.
    let show_neigh = || {
        lab.ok(&[
            "exec",
            "default/a1",
            "--",
            "ip",
            "-6",
            "neigh",
            "show",
            "fd00:10:244:1::1",
        ])
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut neigh = show_neigh();
    while !neigh.contains("router") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(250));
        neigh = show_neigh();
    }
    assert!(
        neigh.contains("router"),
        "a1's neighbour entry for its gateway: {neigh}"
    );
    assert!(
        lab.flow_packets(
            "node-1",
            &[
                "table=20,",
                "reg0=0x200000/0x200000",
                "nd_target=fd00:10:244:1::1 "
            ]
        ) > 0,
        "the responder's flow answered nothing:\n{}",
        evidence(&lab)
    );

    // SpoofGuard. Positive control first: a2's echo request from its own
    // address reaches a1 and a1 answers a2.
    let (m_a1, m_a2) = (pod_mac(&a1), pod_mac(&a2));
    let own = replies_seen(&lab, "default/a2", 4242, || {
        frames(
            &lab,
            "default/a2",
            &["echo", "eth0", &m_a2, &m_a1, &a2_6, &a1_6, "4242"],
        );
    });
    assert!(
        own >= 1,
        "a hand-made echo request from a2's own address got no reply"
    );
    // The same frame claiming a3's address (a pod on the same node, so
    // that a reply would reach it through this switch alone): dropped
    // before a1, so no reply reaches a3.
    let forged = replies_seen(&lab, "default/a3", 4343, || {
        frames(
            &lab,
            "default/a2",
            &["echo", "eth0", &m_a2, &m_a1, &a3_6, &a1_6, "4343"],
        );
    });
    assert_eq!(
        forged, 0,
        "a packet from a forged IPv6 source passed SpoofGuard"
    );

    // An advertisement claiming a1's address with a2's MAC: the host's
    // neighbour entry for a1 keeps a1's MAC.
    let host_neigh = || {
        let out = Command::new("ip")
            .args(["-n", &node(0), "-6", "neigh", "show", &a1_6])
            .output()
            .expect("ip neigh");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        host_neigh().contains(&m_a1),
        "the host knows a1: {}",
        host_neigh()
    );
    let dropped_before = lab.flow_packets("node-1", &["reg0=0x3/0xf,icmp_type=136 actions=drop"]);
    for _ in 0..3 {
        frames(
            &lab,
            "default/a2",
            &["na", "eth0", &m_a2, "33:33:00:00:00:01", &a2_6, &a1_6],
        );
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while lab.flow_packets("node-1", &["reg0=0x3/0xf,icmp_type=136 actions=drop"])
        < dropped_before + 3
    {
        assert!(
            Instant::now() < deadline,
            "the forged advertisements were not dropped by the ND guard:\n{}",
            evidence(&lab)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = host_neigh();
    assert!(
        after.contains(&m_a1) && !after.contains(&m_a2),
        "a forged advertisement changed the host's entry for a1: {after}"
    );
    // A router advertisement from a pod is dropped.
    let ra_before = lab.flow_packets("node-1", &["reg0=0x3/0xf,icmp_type=134 actions=drop"]);
    frames(&lab, "default/a2", &["ra", "eth0", &m_a2, "fe80::bad"]);
    let deadline = Instant::now() + Duration::from_secs(2);
    while lab.flow_packets("node-1", &["reg0=0x3/0xf,icmp_type=134 actions=drop"]) <= ra_before {
        assert!(
            Instant::now() < deadline,
            "the router advertisement was not dropped:\n{}",
            evidence(&lab)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
