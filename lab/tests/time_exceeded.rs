//! ICMP time exceeded from the switches, on a real dual-stack 2-node lab
//! (`up --ip-family dual`), with `ping -t` from a pod: the hops of a
//! traceroute through the pod network.
//!
//! The hop structure (the agent's L3Forwarding -> L3DecTTL flows): a pod's
//! packet to a pod on the same node is not routed at all (the two are on
//! one subnet: the pod resolves the other pod's MAC itself and the switch
//! switches the frame by MAC, as a Linux bridge would, with no `dec_ttl`);
//! to a pod on another node it is routed twice (node-1's switch, then
//! node-2's, which gets it from the tunnel, with the gateway's MAC as
//! destination). So:
//!
//! - TTL 1 to a pod on the same node: the echo reply (no hop between);
//! - TTL 1 to a pod on the other node: node-1's switch answers, from its
//!   tunnel's local address (node-1's IP; the lab gives switchd no
//!   `--icmp-src-ip`) and, for IPv6, from the EUI-64 link-local address
//!   of the gateway's MAC (the MAC the pod sent to);
//! - TTL 2 to the other node: node-2's switch answers, back through the
//!   tunnel, from node-2's IP (IPv6: the link-local address of the
//!   virtual MAC node-1 addressed the packet to in the tunnel);
//! - TTL 3 to the other node: the echo reply (the positive control).
//!
//! Without the switch's answers (the packet-in dropped, as before) no
//! "Time to live exceeded" line appears and every hop assertion fails.

mod common;

use std::net::Ipv6Addr;
use std::process::Output;

use common::paths;
use common::Lab;
use serde_json::Value;

/// `ping -n -c 1 -W 2 -t TTL [-6] DST` from pod `from`: its output, stdout
/// and stderr (ping exits non-zero when only an error came back).
fn ping(lab: &Lab, from: &str, dst: &str, ttl: u8) -> String {
    let ttl = ttl.to_string();
    let mut args = vec![
        "exec", from, "--", "ping", "-n", "-c", "1", "-W", "2", "-t", &ttl,
    ];
    if dst.contains(':') {
        args.push("-6");
    }
    args.push(dst);
    let out: Output = lab.run(&args);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The EUI-64 link-local address of `mac` (`aa:bb:..`), as ping prints it.
fn link_local(mac: &str) -> String {
    let m: Vec<u8> = mac
        .split(':')
        .map(|x| u8::from_str_radix(x, 16).expect("hex octet"))
        .collect();
    assert_eq!(m.len(), 6, "{mac}");
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 2,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
    .to_string()
}

/// The MAC pod `from` has for its IPv4 gateway `gw` (resolved by then).
fn neighbour_mac(lab: &Lab, from: &str, gw: &str) -> String {
    let out = lab.ok(&["exec", from, "--", "ip", "neigh", "show", gw]);
    out.split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .unwrap_or_else(|| panic!("no lladdr for {gw} in {from}: {out}"))
        .to_string()
}

/// `oxvsctl stats --json` of `node`: its `field`.
fn stat(lab: &Lab, node: &str, field: &str) -> u64 {
    let v: Value = serde_json::from_str(&lab.ctl(node, &["--json", "stats"])).expect("stats json");
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

fn evidence(lab: &Lab) -> String {
    paths::switch_evidence(lab, &["node-1", "node-2"], &[&["dump-flows"], &["stats"]])
}

/// `text` is a time exceeded answer from `src` (IPv4 or IPv6 wording).
fn assert_time_exceeded(lab: &Lab, what: &str, text: &str, src: &str) {
    let from = text
        .lines()
        .find(|l| l.starts_with("From "))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no ICMP error came back:\n{text}\n{}",
                evidence(lab)
            )
        });
    let kind = if src.contains(':') {
        "Time exceeded: Hop limit"
    } else {
        "Time to live exceeded"
    };
    assert!(from.contains(kind), "{what}: not a time exceeded: {from}");
    // ping prints an IPv6 link-local source with its zone (`%eth0`).
    let named = from
        .split_whitespace()
        .nth(1)
        .map(|a| a.split('%').next().unwrap_or(a))
        .unwrap_or_default();
    assert_eq!(named, src, "{what}: answered by the wrong hop: {from}");
}

/// `text` is an echo reply from `dst`.
fn assert_reply(what: &str, text: &str, dst: &str) {
    assert!(
        text.contains(&format!("bytes from {dst}")) && text.contains(" 0% packet loss"),
        "{what}: no echo reply from {dst}:\n{text}"
    );
}

#[test]
fn ping_with_a_small_ttl_is_answered_by_each_hop() {
    skip_unless_capable!();
    let lab = Lab::up_args(&["--nodes", "2", "--ip-family", "dual"]);
    let yaml = [
        paths::pod("default", "a1", "node-1", "{app: a}", false),
        paths::pod("default", "a2", "node-1", "{app: a}", false),
        paths::pod("default", "b1", "node-2", "{app: b}", false),
    ]
    .concat();
    let f = lab.file("pods.yaml", &yaml);
    lab.ok(&["apply", "-f", &f]);
    let st = lab.status();
    let ip = |name: &str, field: &str| common::pod_field(&st, "default", name, field);
    let (a2, a2_6) = (ip("a2", "ip"), ip("a2", "ip6"));
    let (b1, b1_6) = (ip("b1", "ip"), ip("b1", "ip6"));
    let nodes = st["nodes"].as_array().expect("nodes");
    let node_ip = |i: usize| nodes[i]["ip"].as_str().expect("node ip").to_string();
    let (n1, n2) = (node_ip(0), node_ip(1));

    // Positive controls first (they also resolve a1's gateway). On one
    // node there is no hop: TTL 1 arrives.
    assert_reply("a1 -> a2, TTL 1", &ping(&lab, "default/a1", &a2, 1), &a2);
    assert_reply("a1 -> b1, TTL 3", &ping(&lab, "default/a1", &b1, 3), &b1);
    assert_reply(
        "a1 -> a2 (IPv6), hop limit 1",
        &ping(&lab, "default/a1", &a2_6, 1),
        &a2_6,
    );
    assert_reply(
        "a1 -> b1 (IPv6), hop limit 3",
        &ping(&lab, "default/a1", &b1_6, 3),
        &b1_6,
    );

    // IPv4: node-1 is the first hop, node-2 the second.
    for (what, dst, ttl, hop) in [
        ("a1 -> b1 (other node), TTL 1", &b1, 1, &n1),
        ("a1 -> b1 (other node), TTL 2", &b1, 2, &n2),
    ] {
        let text = ping(&lab, "default/a1", dst, ttl);
        assert_time_exceeded(&lab, what, &text, hop);
    }

    // IPv6: the link-local address of the MAC each hop was addressed by:
    // a1's gateway's at node-1, the virtual MAC of the tunnel at node-2.
    let gw_mac = neighbour_mac(&lab, "default/a1", "10.244.1.1");
    let hop1 = link_local(&gw_mac);
    let hop2 = link_local("aa:bb:cc:dd:ee:ff");
    for (what, dst, hlim, hop) in [
        ("a1 -> b1 (IPv6, other node), hop limit 1", &b1_6, 1, &hop1),
        ("a1 -> b1 (IPv6, other node), hop limit 2", &b1_6, 2, &hop2),
    ] {
        let text = ping(&lab, "default/a1", dst, hlim);
        assert_time_exceeded(&lab, what, &text, hop);
    }

    // Counted where they were sent: node-1 answered two, node-2 two
    // (each went back through the tunnel).
    assert!(
        stat(&lab, "node-1", "time_exceeded") >= 2,
        "{}",
        evidence(&lab)
    );
    assert!(
        stat(&lab, "node-2", "time_exceeded") >= 2,
        "{}",
        evidence(&lab)
    );
    assert_eq!(stat(&lab, "node-1", "time_exceeded_limited"), 0);
}
