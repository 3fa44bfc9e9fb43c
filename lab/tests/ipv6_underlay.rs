//! The tunnel over an IPv6 underlay (`up --ip-family dual --underlay
//! ipv6`): the agents get the nodes' IPv6 addresses as `--node-ip`, so
//! the switches carry VXLAN between fd00:192:168:77::11 and ::12.
//!
//! - Pods on different nodes talk over IPv4 and IPv6, TCP and UDP, hosts
//!   reach pods on the other node, and datagrams up to the pod MTU (1430:
//!   VXLAN over IPv6 takes 70 bytes) pass whole, larger ones as fragments;
//! - the receiving switch classified those packets by their IPv6 outer
//!   source (the counter of node-2's flow for `tun_ipv6_src` of node-1
//!   moved), not through an IPv4 tunnel;
//! - `oxvsctl traceflow` follows a packet of either family through the
//!   IPv6 tunnel into the other node (the remote node named by its IPv6
//!   address);
//! - a restarted agent that finds its tunnel port on another address
//!   (the switch outlived it; the node moved to the IPv6 underlay) makes
//!   the port again on the node's address;
//! - the tunnel guard holds over IPv6: a VXLAN datagram forged by a host
//!   on the underlay that is no node delivers nothing (the honest
//!   datagram before it does) and is counted as dropped, and a pod's
//!   datagram to a node's IPv6 VXLAN port is dropped in its own switch.
//!
//! Root and AF_XDP are required; the test says SKIPPED and passes without
//! them.

mod common;

use std::process::Command;

use common::paths::{self, path, Proto, Report, Want};
use common::{Lab, UdpListener};
use serde_json::Value;

const NODE1_IP6: &str = "fd00:192:168:77::11";
const NODE2_IP6: &str = "fd00:192:168:77::12";
const PORT: u16 = 7777;

/// Sends `argv[3]` three times to `argv[1]:argv[2]` (either family).
const SEND: &str = r#"
import socket, sys
ip, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    s.sendto(token.encode(), (ip, port))
"#;

/// Sends a forged VXLAN datagram three times to `[argv[1]]:4789`: inner
/// Ethernet + IPv4 (`argv[2]` -> `argv[3]`) + UDP to port `argv[4]`
/// carrying `argv[5]`.
const FORGE: &str = r#"
import socket, struct, sys, time
node, inner_src, inner_dst, port, token = sys.argv[1:6]
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff
payload = token.encode()
udp = struct.pack("!HHHH", 40000, int(port), 8 + len(payload), 0) + payload
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton(inner_src), socket.inet_aton(inner_dst))
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
eth = bytes.fromhex("0a580af40001" "02deadbeef01" "0800")
vxlan = struct.pack("!II", 0x08000000, 0)
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
for _ in range(3):
    s.sendto(vxlan + eth + ip + udp, (node, 4789))
    time.sleep(0.02)
"#;

/// Runs python `script` with `args` in namespace `netns`.
fn py(netns: &str, script: &str, args: &[&str]) {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "python3", "-c", script])
        .args(args)
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn evidence(lab: &Lab) -> String {
    paths::switch_evidence(lab, &["node-1", "node-2"], &[&["dump-flows"], &["show"]])
}

#[test]
fn vxlan_over_an_ipv6_underlay() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--ip-family", "dual", "--underlay", "ipv6"]);
    let yaml = [
        paths::pod("default", "a1", "node-1", "{app: a}", true),
        paths::pod("default", "b1", "node-2", "{app: b}", true),
    ]
    .concat();
    let f = lab.file("pods.yaml", &yaml);
    lab.ok(&["apply", "-f", &f]);
    let st: Value = lab.status();
    let field = |name: &str, f: &str| common::pod_field(&st, "default", name, f);
    let (a1, a1_6, b1, b1_6) = (
        field("a1", "ip"),
        field("a1", "ip6"),
        field("b1", "ip"),
        field("b1", "ip6"),
    );
    let nodes = st["nodes"].as_array().expect("nodes");
    let node_ns = |i: usize| nodes[i]["netns"].as_str().expect("node netns").to_string();
    let (na1, nb1) = (field("a1", "netns"), field("b1", "netns"));

    // The tunnel port is on the node's IPv6 address (`oxvsctl show`),
    // and so is its socket.
    let show = lab.ctl("node-1", &["show"]);
    let local = format!("local=[{NODE1_IP6}]:4789");
    assert!(
        show.lines()
            .any(|l| l.contains("type=vxlan") && l.contains(&local)),
        "node-1's tunnel port {local}:\n{show}"
    );
    let ss = Command::new("ip")
        .args(["netns", "exec", &node_ns(0), "ss", "-Hnul"])
        .output()
        .expect("ss");
    let ss = String::from_utf8_lossy(&ss.stdout);
    assert!(
        ss.contains(&format!("[{NODE1_IP6}]:4789")),
        "node-1's tunnel listens on [{NODE1_IP6}]:4789:\n{ss}"
    );
    let before = lab.flow_packets("node-2", &[&format!("tun_ipv6_src={NODE1_IP6}")]);

    let mut report = Report::new(evidence);
    let ans = |who: &'static str| Want::Answer(vec![who]);
    report.check(
        &lab,
        "across the IPv6 underlay",
        &[
            path(
                "a1 -> b1 IPv4",
                &na1,
                (&b1, 8080),
                Proto::Tcp,
                ans("default/b1"),
            ),
            path(
                "a1 -> b1 IPv6",
                &na1,
                (&b1_6, 8080),
                Proto::Tcp,
                ans("default/b1"),
            ),
            path(
                "b1 -> a1 IPv4",
                &nb1,
                (&a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "b1 -> a1 IPv6",
                &nb1,
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "a1 -> b1 UDP IPv4",
                &na1,
                (&b1, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "a1 -> b1 UDP IPv6",
                &na1,
                (&b1_6, 8080),
                Proto::Udp,
                Want::Answer(vec![]),
            ),
            path(
                "node-2 -> a1 IPv4",
                &node_ns(1),
                (&a1, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
            path(
                "node-2 -> a1 IPv6",
                &node_ns(1),
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
        ],
    );
    report.finish();
    // The pods' routes leaving the node carry the IPv6 tunnel's MTU
    // (1500 - 70), not IPv4's 1450.
    for (v, dst) in [("-4", &b1), ("-6", &b1_6)] {
        let r = lab.ok(&["exec", "default/a1", "--", "ip", v, "route", "get", dst]);
        assert!(r.contains("mtu 1430"), "a1's route to {dst}: {r}");
    }
    // Whole up to the pod MTU (1430 - 28 and - 48 bytes of headers),
    // fragmented beyond.
    for (dst, whole) in [(&b1, 1402), (&b1_6, 1382)] {
        for size in [whole, 3000] {
            assert_eq!(
                lab.udp_echo("default/a1", dst, 8080, size),
                size.to_string(),
                "{size} bytes to {dst}"
            );
        }
    }
    let after = lab.flow_packets("node-2", &[&format!("tun_ipv6_src={NODE1_IP6}")]);
    assert!(
        after > before + 10,
        "node-2 classified node-1's packets by their IPv6 outer source ({before} -> {after}):\n{}",
        evidence(&lab)
    );

    // A switch that outlived its agent with the tunnel on another address
    // (here: the node's IPv4 one, as before a move to the IPv6 underlay):
    // the restarted agent makes the port again on the node's address,
    // same port number, and traffic across flows again.
    lab.ctl("node-1", &["del-port", "oxvs-tun0"]);
    lab.ctl(
        "node-1",
        &[
            "add-port",
            "oxvs-tun0",
            "--ofport",
            "1",
            "--type",
            "vxlan",
            "--local-ip",
            "192.168.77.11",
        ],
    );
    assert!(lab
        .ctl("node-1", &["show"])
        .contains("local=192.168.77.11:4789"));
    lab.ok(&["agent", "restart", "node-1"]);
    let show = lab.ctl("node-1", &["show"]);
    assert!(
        show.contains(&format!(
            " 1(oxvs-tun0): type=vxlan, mode=udp-socket, {local}"
        )),
        "the restarted agent moved the tunnel back to {local}:\n{show}"
    );
    let mut report = Report::new(evidence);
    report.check(
        &lab,
        "after the tunnel moved back",
        &[
            path(
                "a1 -> b1 IPv4",
                &na1,
                (&b1, 8080),
                Proto::Tcp,
                ans("default/b1"),
            ),
            path(
                "b1 -> a1 IPv6",
                &nb1,
                (&a1_6, 8080),
                Proto::Tcp,
                ans("default/a1"),
            ),
        ],
    );
    report.finish();

    // traceflow follows a1's packet through the IPv6 tunnel into node-2.
    let sock = |n: &str| {
        format!(
            "{n}={}",
            lab.root().join(n).join("agent-api.sock").display()
        )
    };
    for v6 in [false, true] {
        let mut args = vec![
            "traceflow".to_string(),
            "--src".into(),
            "default/a1".into(),
            "--dst".into(),
            "default/b1".into(),
            "--dport".into(),
            "8080".into(),
            "--agent-socket".into(),
            sock("node-1"),
            "--agent-socket".into(),
            sock("node-2"),
        ];
        if v6 {
            args.push("--ipv6".into());
        }
        let out = Command::new(common::oxvsctl())
            .args(&args)
            .output()
            .expect("oxvsctl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(NODE2_IP6) && text.contains("pod default/b1"),
            "traceflow (ipv6: {v6}) through the tunnel to [{NODE2_IP6}] and into b1:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The guard: an honest datagram b1 -> a1 arrives; the same forged by
    // the underlay's host (fd00:192:168:77::1, no node) does not.
    let unknown = |lab: &Lab| lab.flow_packets("node-1", &["cookie=0x3000000000003,"]);
    let dropped_before = unknown(&lab);
    let l = UdpListener::start(&na1, PORT);
    py(&nb1, SEND, &[&a1, &PORT.to_string(), "honest"]);
    py(
        &format!("{}-ul", lab.name),
        FORGE,
        &[NODE1_IP6, &b1, &a1, &PORT.to_string(), "forged"],
    );
    let got = l.received();
    assert!(
        got.iter().any(|g| g == "honest"),
        "the honest datagram arrived: {got:?}"
    );
    assert!(
        !got.iter().any(|g| g == "forged"),
        "a forged datagram arrived: {got:?}"
    );
    assert!(
        unknown(&lab) >= dropped_before + 3,
        "the guard counted the forged datagrams:\n{}",
        evidence(&lab)
    );
    // A pod's datagram to the other node's IPv6 VXLAN port: dropped in its
    // own switch.
    let to_tunnel = |lab: &Lab| lab.flow_packets("node-1", &["cookie=0x3000000000004,", NODE2_IP6]);
    let t0 = to_tunnel(&lab);
    py(&na1, SEND, &[NODE2_IP6, "4789", "to-the-tunnel"]);
    assert!(
        to_tunnel(&lab) >= t0 + 3,
        "a1's datagrams to [{NODE2_IP6}]:4789 dropped by the guard:\n{}",
        evidence(&lab)
    );
}
