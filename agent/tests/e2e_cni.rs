//! End-to-end: pods made by the real `oxvs-cni` -> `oxvs-agent` ->
//! `oxvs-switchd`, with real traffic between real namespaces.
//!
//! Each test runs a node (a namespace with switchd + agent, see
//! `node/mod.rs`) on its own pod CIDR, so tests can run in parallel.

#[path = "../../switch/tests/common/mod.rs"]
mod common;
mod node;

use std::time::{Duration, Instant};

use common::{ping, ping_until_up, tcp_transfer, udp_exchange};
use node::{Node, GW};
use serde_json::json;

fn base_links() -> Vec<String> {
    let mut v = vec!["lo".to_string(), GW.to_string(), format!("{GW}-p")];
    v.sort();
    v
}

/// The node's links, sorted, without switchd's UMEM anchor device
/// (`oxvs-umem`, a dummy or a veth pair `oxvs-umem`/`oxvs-umemp`,
/// which is there whatever the pods do).
fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.retain(|l| !l.starts_with("oxvs-umem"));
    v.sort();
    v
}

#[test]
fn pods_reach_each_other_and_the_node_and_del_leaves_nothing() {
    skip_unless_capable!();
    let node = Node::start("n1", "10.231.1.0/24");
    let base_flows = node.n_flows();
    let a = node.add_pod("a");
    let b = node.add_pod("b");
    assert_ne!(a.ip, b.ip);
    for ip in [&a.ip, &b.ip] {
        assert!(ip.starts_with("10.231.1.") && ip != "10.231.1.1", "{ip}");
    }
    // Result shape (1.0.0): interface 0 is eth0 in the sandbox, with the IP on it.
    assert_eq!(a.result["cniVersion"], "1.0.0");
    assert_eq!(a.result["interfaces"][0]["name"], "eth0");
    assert_eq!(a.result["interfaces"][0]["sandbox"], a.netns_path());
    assert_eq!(a.result["ips"][0]["interface"], 0);
    assert_eq!(a.result["ips"][0]["gateway"], "10.231.1.1");
    // The pod sees the address others see, with TX csum on (the switch
    // completes checksums), and MTU 65535 on the node (`--local-mtu auto`:
    // the switch takes large frames whole) while its default route, the
    // way off the node, keeps the agent's --mtu 1450.
    let addr = a.ns.must(&["ip", "-4", "-o", "addr", "show", "eth0"]);
    assert!(addr.contains(&format!("{}/24", a.ip)), "{addr}");
    let link = a.ns.must(&["ip", "link", "show", "eth0"]);
    assert!(link.contains("mtu 65535"), "{link}");
    let route = a.ns.must(&["ip", "-4", "route", "show", "default"]);
    assert!(
        route.contains("via 10.231.1.1") && route.contains("mtu 1450"),
        "{route}"
    );
    let gw = node.ns.must(&["ip", "link", "show", GW]);
    assert!(gw.contains("mtu 65535"), "{gw}");
    let k = a.ns.must(&["ethtool", "-k", "eth0"]);
    assert!(k.contains("tx-checksumming: on"), "{k}");

    // Pod <-> pod, pod -> node (gateway), node -> pod.
    assert!(ping_until_up(&a.ns, &b.ip, 5).ok, "a -> b");
    assert_eq!(ping(&a.ns, &b.ip, 3, "0.2", &[]).received, 3);
    assert_eq!(ping(&b.ns, &a.ip, 3, "0.2", &[]).received, 3);
    assert_eq!(ping(&a.ns, "10.231.1.1", 3, "0.2", &[]).received, 3);
    assert_eq!(ping(&node.ns, &b.ip, 3, "0.2", &[]).received, 3);
    tcp_transfer(&a.ns, &b.ns, &b.ip, 5001, 2_000_000);
    tcp_transfer(&node.ns, &a.ns, &a.ip, 5002, 1_000_000);
    tcp_transfer(&a.ns, &node.ns, "10.231.1.1", 5003, 1_000_000);
    udp_exchange(&b.ns, &a.ns, &a.ip, 5004);
    // Whole 60000-byte frames (DF) pod -> pod, pod -> node, node -> pod.
    let big = ["-M", "do", "-s", "60000", "-W", "2"];
    assert_eq!(
        ping(&a.ns, &b.ip, 2, "0.2", &big).received,
        2,
        "a -> b, 60000 DF"
    );
    assert_eq!(
        ping(&a.ns, "10.231.1.1", 2, "0.2", &big).received,
        2,
        "a -> node, 60000 DF"
    );
    assert_eq!(
        ping(&node.ns, &a.ip, 2, "0.2", &big).received,
        2,
        "node -> a, 60000 DF"
    );

    // CHECK with the ADD result as prevResult.
    let mut cfg = node.config("1.0.0");
    cfg["prevResult"] = a.result.clone();
    let c = node.cni("CHECK", &a.cid, &a.netns_path(), "eth0", "", &cfg);
    assert!(c.ok, "CHECK: {c:?}");

    // DEL, twice, and once more with an empty netns (as containerd does).
    for netns in [a.netns_path(), a.netns_path(), String::new()] {
        let d = node.cni("DEL", &a.cid, &netns, "eth0", "", &node.config("1.0.0"));
        assert!(d.ok, "DEL: {d:?}");
    }
    let d = node.del_pod(&b);
    assert!(d.ok, "DEL b: {d:?}");
    assert_eq!(sorted(node.links()), base_links());
    assert_eq!(node.ports(), vec![GW.to_string()]);
    assert_eq!(node.n_flows(), base_flows);
    assert!(node.ipam_records().is_empty(), "{:?}", node.ipam_records());
    // The pod's interface went with the host end.
    assert!(a.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0));
    // DEL of a container the agent never saw succeeds.
    let d = node.cni("DEL", "never-seen", "", "eth0", "", &node.config("1.0.0"));
    assert!(d.ok, "{d:?}");
}

/// An IPv6-only node (`--pod-cidr` IPv6 alone): pods get one IPv6
/// address, no IPv4 at all, and reach each other and the node over IPv6
/// through the switch; CHECK and DEL work as on an IPv4 node.
#[test]
fn an_ipv6_only_node_attaches_pods_with_ipv6_alone() {
    skip_unless_capable!();
    let node = Node::start("n6", "fd00:231:6::/64");
    let base_flows = node.n_flows();
    let a = node.add_pod("a6");
    let b = node.add_pod("b6");
    assert_ne!(a.ip, b.ip);
    for (p, ip) in [(&a, &a.ip), (&b, &b.ip)] {
        assert!(ip.starts_with("fd00:231:6::"), "{ip}");
        let ips = p.result["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 1, "one address: {}", p.result);
        assert_eq!(ips[0]["gateway"], "fd00:231:6::1");
        let routes = p.result["routes"].as_array().unwrap();
        assert_eq!(routes.len(), 1, "{}", p.result);
        assert_eq!(routes[0]["dst"], "::/0");
        // The MAC: 0a:58 and the address's last four bytes.
        let mac = p.result["interfaces"][0]["mac"].as_str().unwrap();
        assert!(mac.starts_with("0a:58:00:00:00:"), "{mac}");
        // No IPv4 in the pod, the IPv6 address others see.
        let v4 = p.ns.must(&["ip", "-4", "-o", "addr", "show", "eth0"]);
        assert!(v4.trim().is_empty(), "no IPv4 address: {v4}");
        let v6 = p.ns.must(&["ip", "-6", "-o", "addr", "show", "eth0"]);
        assert!(v6.contains(&format!("{ip}/64")), "{v6}");
    }
    let gw = node.ns.must(&["ip", "-o", "addr", "show", GW]);
    assert!(
        gw.contains("fd00:231:6::1/64") && !gw.contains("inet "),
        "the gateway has the IPv6 address only: {gw}"
    );
    assert!(ping_until_up(&a.ns, &b.ip, 5).ok, "a -> b");
    assert_eq!(ping(&a.ns, &b.ip, 3, "0.2", &[]).received, 3);
    assert_eq!(ping(&a.ns, "fd00:231:6::1", 3, "0.2", &[]).received, 3);
    assert_eq!(ping(&node.ns, &b.ip, 3, "0.2", &[]).received, 3);
    tcp_transfer(&a.ns, &b.ns, &b.ip, 5101, 2_000_000);
    tcp_transfer(&node.ns, &a.ns, &a.ip, 5102, 1_000_000);
    udp_exchange(&b.ns, &a.ns, &a.ip, 5103);
    // IPv4 goes nowhere: the pod has no route, and the switch drops what
    // the host would send.
    let p4 = a.ns.exec(&["ping", "-n", "-c", "1", "-W", "1", "10.0.0.1"]);
    assert!(!p4.status.success());

    let mut cfg = node.config("1.0.0");
    cfg["prevResult"] = a.result.clone();
    let c = node.cni("CHECK", &a.cid, &a.netns_path(), "eth0", "", &cfg);
    assert!(c.ok, "CHECK: {c:?}");
    assert_eq!(node.ipam_records().len(), 2, "{:?}", node.ipam_records());
    for p in [&a, &b] {
        let d = node.del_pod(p);
        assert!(d.ok, "DEL: {d:?}");
    }
    assert_eq!(sorted(node.links()), base_links());
    assert_eq!(node.ports(), vec![GW.to_string()]);
    assert_eq!(node.n_flows(), base_flows);
    assert!(node.ipam_records().is_empty(), "{:?}", node.ipam_records());
}

/// Without `--mtu`, the pod MTU is sized from the link holding the
/// tunnel's address less the tunnel's overhead of its family: here an
/// IPv6 `--node-ip` on a 9000-byte link, so pods' routes off the node get
/// 9000 - 70 (not the default-route interface's MTU).
#[test]
fn without_mtu_the_pod_mtu_follows_the_tunnel_address_link() {
    skip_unless_capable!();
    let node = Node::start_prepared(
        "mt",
        "fd00:231:7::/64",
        &["--node-ip", "fd00:231:77::11"],
        false,
        |ns| {
            // No dummy driver here (no modules): a veth pair, both ends up.
            ns.must(&[
                "ip", "link", "add", "oxul0", "mtu", "9000", "type", "veth", "peer", "name",
                "oxul1", "mtu", "9000",
            ]);
            ns.must(&["ip", "link", "set", "oxul1", "up"]);
            ns.must(&["ip", "link", "set", "oxul0", "up"]);
            ns.must(&[
                "ip",
                "-6",
                "addr",
                "add",
                "fd00:231:77::11/64",
                "dev",
                "oxul0",
                "nodad",
            ]);
        },
    );
    let a = node.add_pod("m6");
    let route = a.ns.must(&["ip", "-6", "route", "show", "default"]);
    assert!(route.contains("mtu 8930"), "{route}\n{}", node.agent_log());
    assert!(node
        .agent_log()
        .contains("pod MTU sized for the tunnel's address"));
    assert!(node.del_pod(&a).ok);
}

#[test]
fn fifty_concurrent_adds_then_dels_leave_no_leak_and_no_duplicate() {
    skip_unless_capable!();
    let node = Node::start("n50", "10.231.2.0/24");
    let base_flows = node.n_flows();
    let nss: Vec<common::Netns> = (0..50)
        .map(|i| common::Netns::new(&format!("p{i}")))
        .collect();
    let started = Instant::now();
    let results: Vec<node::CniOut> = std::thread::scope(|s| {
        let handles: Vec<_> = nss
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let node = &node;
                s.spawn(move || {
                    node.cni(
                        "ADD",
                        &format!("c{i}"),
                        &format!("/var/run/netns/{}", ns.name),
                        "eth0",
                        &format!("K8S_POD_NAMESPACE=t;K8S_POD_NAME=p{i}"),
                        &node.config("1.1.0"),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    eprintln!("50 concurrent ADDs took {:?}", started.elapsed());
    let mut ips = Vec::new();
    for (i, r) in results.iter().enumerate() {
        assert!(r.ok, "ADD c{i}: {r:?}\n{}", node.agent_log());
        ips.push(
            r.json["ips"][0]["address"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
    }
    let mut uniq = ips.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 50, "duplicate addresses: {ips:?}");
    assert_eq!(node.ports().len(), 51);
    assert_eq!(node.ipam_records().len(), 50);
    // A sample of pods really forward.
    let ip7 = ips[7].split('/').next().unwrap_or_default().to_string();
    assert!(ping_until_up(&nss[3], &ip7, 5).ok);

    std::thread::scope(|s| {
        for (i, ns) in nss.iter().enumerate() {
            let node = &node;
            s.spawn(move || {
                // Two DELs close together, as kubelet sends them.
                for _ in 0..2 {
                    let d = node.cni(
                        "DEL",
                        &format!("c{i}"),
                        &format!("/var/run/netns/{}", ns.name),
                        "eth0",
                        "",
                        &node.config("1.1.0"),
                    );
                    assert!(d.ok, "DEL c{i}: {d:?}");
                }
            });
        }
    });
    assert_eq!(sorted(node.links()), base_links());
    assert_eq!(node.ports(), vec![GW.to_string()]);
    assert_eq!(node.n_flows(), base_flows);
    assert!(node.ipam_records().is_empty());
}

#[test]
fn agent_restart_keeps_pods_forwarding_and_converges() {
    skip_unless_capable!();
    let mut node = Node::start("nr", "10.231.3.0/24");
    let a = node.add_pod("a");
    let b = node.add_pod("b");
    assert!(ping_until_up(&a.ns, &b.ip, 5).ok);
    let flows_before = node.n_flows();
    // 60 pings over ~6 s while the agent stops and comes back.
    let mut pinger =
        a.ns.spawn(&["ping", "-n", "-c", "60", "-i", "0.1", "-W", "1", &b.ip]);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(node.stop_agent(), "agent did not stop cleanly on SIGTERM");
    std::thread::sleep(Duration::from_millis(1500));
    node.start_agent();
    let (_, out, _) = pinger.wait(Duration::from_secs(20));
    let received: u32 = out
        .lines()
        .find(|l| l.contains("received"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        received >= 57,
        "lost more than 3 of 60 pings across the restart:\n{out}"
    );
    assert_eq!(node.n_flows(), flows_before, "restart changed the flows");
    // New ADDs work, and the old pods are still known (CHECK, DEL).
    let c = node.add_pod("c");
    assert_eq!(ping(&c.ns, &a.ip, 2, "0.2", &[]).received, 2);
    let mut cfg = node.config("1.0.0");
    cfg["prevResult"] = b.result.clone();
    let chk = node.cni("CHECK", &b.cid, &b.netns_path(), "eth0", "", &cfg);
    assert!(chk.ok, "{chk:?}");
    for p in [&a, &b, &c] {
        assert!(node.del_pod(p).ok);
    }
    assert_eq!(sorted(node.links()), base_links());
}

#[test]
fn pods_gone_while_the_agent_was_down_are_released_on_start() {
    skip_unless_capable!();
    let mut node = Node::start("ng", "10.231.4.0/24");
    let a = node.add_pod("a");
    let b = node.add_pod("b");
    node.stop_agent();
    let a_ip = a.ip.clone();
    let a_link = node
        .ports()
        .into_iter()
        .find(|p| p.starts_with("a-"))
        .expect("a's port");
    // The sandbox goes, and its veth pair with it. The kernel tears a
    // network namespace down in the background: the sandbox is gone once
    // its veth is (an agent started before that rightly keeps the pod,
    // whose DEL then comes from the runtime).
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while node.links().contains(&a_link) {
        assert!(
            Instant::now() < deadline,
            "{a_link} outlived its namespace by 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    node.start_agent();
    // The agent forgot a (port and address released), kept b.
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.ports().len() != 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(node.ports().len(), 2, "{:?}", node.ports());
    assert_eq!(
        node.ipam_records(),
        vec![b.ip.clone()],
        "{a_ip} should be released"
    );
    assert!(node.del_pod(&b).ok);
}

#[test]
fn switch_drift_is_repaired_and_check_reports_it() {
    skip_unless_capable!();
    let node = Node::start("nd", "10.231.5.0/24");
    let a = node.add_pod("a");
    let b = node.add_pod("b");
    let want = node.n_flows();
    // Someone deletes a pod's flows: the agent puts them back.
    node.sw.ctl_ok(&["del-flows", "table=SpoofGuard"]);
    let deadline = Instant::now() + Duration::from_secs(6);
    while node.n_flows() != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(node.n_flows(), want, "agent did not restore the flows");
    assert!(ping_until_up(&a.ns, &b.ip, 5).ok);
    // CHECK against a wrong prevResult fails, naming the difference.
    let mut cfg = node.config("1.0.0");
    let mut prev = a.result.clone();
    prev["ips"][0]["address"] = json!("10.231.5.200/24");
    cfg["prevResult"] = prev;
    let c = node.cni("CHECK", &a.cid, &a.netns_path(), "eth0", "", &cfg);
    assert!(!c.ok);
    assert!(c.msg().contains(&a.ip), "{c:?}");
    // ADD gave b's interface a qdisc (pfifo_fast: the agent runs in a
    // namespace without the host's default_qdisc); CHECK passes, and
    // reports it once someone removes it.
    let mut cfg = node.config("1.0.0");
    cfg["prevResult"] = b.result.clone();
    let c = node.cni("CHECK", &b.cid, &b.netns_path(), "eth0", "", &cfg);
    assert!(c.ok, "{c:?}");
    let tc = b.ns.exec(&["tc", "qdisc", "del", "dev", "eth0", "root"]);
    assert!(tc.status.success(), "{tc:?}");
    let c = node.cni("CHECK", &b.cid, &b.netns_path(), "eth0", "", &cfg);
    assert!(!c.ok);
    assert!(
        c.msg().contains("root qdisc is noqueue, want pfifo_fast"),
        "{c:?}"
    );
    // GC keeping only a: b goes.
    let mut gc = node.config("1.1.0");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": a.cid, "ifname": "eth0"}]);
    let g = node.cni("GC", "", "", "", "", &gc);
    assert!(g.ok, "{g:?}");
    assert_eq!(node.ports().len(), 2);
    assert_eq!(node.ipam_records(), vec![a.ip.clone()]);
    assert!(b.ns.exec(&["ip", "link", "show", "eth0"]).status.code() != Some(0));
    assert!(node.del_pod(&a).ok);
}

#[test]
fn bad_calls_get_clear_errors_and_leak_nothing() {
    skip_unless_capable!();
    let node = Node::start("nb", "10.231.6.0/24");
    let a = node.add_pod("a");
    // ADD again for the same (container, ifname).
    let again = node.cni(
        "ADD",
        &a.cid,
        &a.netns_path(),
        "eth0",
        "",
        &node.config("1.0.0"),
    );
    assert!(!again.ok);
    assert_eq!(again.code(), 100, "{again:?}");
    assert!(again.msg().contains("already attached"), "{again:?}");
    // A netns that does not exist.
    let gone = node.cni(
        "ADD",
        "c-x",
        "/var/run/netns/oxvs-no-such-ns",
        "eth0",
        "",
        &node.config("1.0.0"),
    );
    assert!(!gone.ok);
    assert!(gone.msg().contains("oxvs-no-such-ns"), "{gone:?}");
    // An interface name that is too long.
    let long = node.cni(
        "ADD",
        "c-y",
        &a.netns_path(),
        "0123456789abcdef",
        "",
        &node.config("1.0.0"),
    );
    assert!(!long.ok);
    assert_eq!(long.code(), 4, "{long:?}");
    // A namespace that has a default route already: configuring the pod
    // end fails after the veth exists, while the switch binds the port on
    // its host end (the two run at once); both are undone.
    let taken = common::Netns::new("r");
    taken.must(&[
        "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1",
    ]);
    taken.must(&["ip", "link", "set", "d0", "up"]);
    taken.must(&["ip", "addr", "add", "192.0.2.2/24", "dev", "d0"]);
    taken.must(&["ip", "route", "add", "default", "via", "192.0.2.1"]);
    let routed = node.try_add("c-z", &taken, "");
    assert!(!routed.ok);
    assert_eq!(routed.code(), 103, "{routed:?}");
    assert!(
        routed.msg().contains("cannot set up the pod interface") && routed.msg().contains("route"),
        "{routed:?}"
    );
    let left = taken.must(&["ip", "-o", "link", "show"]);
    assert!(!left.contains("eth0"), "the pod end is gone: {left}");
    // The port was bound meanwhile (the two halves run at once) and is gone.
    let host = oxvs_agent::podnet::host_ifname("", "", "c-z", "eth0");
    let log = node.sw.log();
    assert!(
        log.contains(&format!("port added port={host}"))
            && log.contains(&format!("port deleted port={host}")),
        "switch log: {}",
        node.sw.log_tail(20)
    );
    // A host link with the name this ADD's would get (a clash of the
    // 28-bit names, or a link someone else made): the ADD fails, and
    // that link, someone else's, stays.
    let clash = oxvs_agent::podnet::host_ifname("test", "q", "c-q", "eth0");
    node.ns.must(&[
        "ip", "link", "add", &clash, "type", "veth", "peer", "name", "q-peer",
    ]);
    let q = common::Netns::new("q");
    let clashed = node.try_add("c-q", &q, "K8S_POD_NAMESPACE=test;K8S_POD_NAME=q");
    assert!(!clashed.ok);
    assert!(
        clashed.msg().contains(&clash) && clashed.msg().contains("exists"),
        "{clashed:?}"
    );
    assert!(
        node.links().contains(&clash),
        "the other link stays: {:?}",
        node.links()
    );
    node.ns.must(&["ip", "link", "del", &clash]);
    // Nothing leaked: still one pod.
    assert_eq!(sorted(node.links()).len(), base_links().len() + 1);
    assert_eq!(node.ports().len(), 2);
    assert_eq!(node.ipam_records(), vec![a.ip.clone()]);
    // The pod still works after all that.
    let b = node.add_pod("b");
    assert!(ping_until_up(&a.ns, &b.ip, 5).ok);
}

/// A pod's host link deleted behind the agent's back, and another link
/// (another owner's alias, no switch port on it) made with its name: the
/// pod's DEL releases its address and record, removes the pod's switch
/// port (bound to the gone link), and leaves that link alone.
#[test]
fn del_leaves_a_link_that_took_the_pods_name() {
    skip_unless_capable!();
    let node = Node::start("nt", "10.231.7.0/24");
    let a = node.add_pod("a");
    let host = oxvs_agent::podnet::host_ifname("test", "a", &a.cid, "eth0");
    assert!(node.links().contains(&host), "{:?}", node.links());
    node.ns.must(&["ip", "link", "del", &host]);
    node.ns.must(&[
        "ip", "link", "add", &host, "type", "veth", "peer", "name", "t-peer",
    ]);
    node.ns.must(&[
        "ip",
        "link",
        "set",
        &host,
        "alias",
        "oxvs:eth0:someone-else",
    ]);
    let d = node.del_pod(&a);
    assert!(d.ok, "DEL: {d:?}");
    assert!(
        node.links().contains(&host),
        "the other owner's link stays: {:?}",
        node.links()
    );
    assert!(node.ipam_records().is_empty(), "{:?}", node.ipam_records());
    assert!(
        !node.ports().contains(&host),
        "the pod's own port goes: {:?}",
        node.ports()
    );
    assert!(
        node.agent_log().contains("another owner's alias"),
        "{}",
        node.agent_log()
    );
    node.ns.must(&["ip", "link", "del", &host]);
}

#[test]
fn chained_with_portmap_a_host_port_reaches_the_pod() {
    skip_unless_capable!();
    if !std::path::Path::new("/usr/lib/cni/portmap").exists() {
        oxvs_testutil::skip_or_fail(
            "/usr/lib/cni/portmap missing (Debian containernetworking-plugins)",
        );
        return;
    }
    let node = Node::start("npm", "10.231.7.0/24");
    // A client outside the node, on an underlay link.
    let client = common::Netns::new("cl");
    common::veth(&node.ns, "ul0", &client, "eth0");
    node.ns
        .must(&["ip", "addr", "add", "192.168.231.1/24", "dev", "ul0"]);
    client.must(&["ip", "addr", "add", "192.168.231.2/24", "dev", "eth0"]);
    node.ns.must(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);

    // The chain as libcni runs it: oxvs ADD, then portmap ADD with prevResult.
    let pod = common::Netns::new("pm");
    let netns = format!("/var/run/netns/{}", pod.name);
    let cid = format!("{}-c0", pod.name);
    let conf = |plugin: serde_json::Value, prev: Option<&serde_json::Value>| {
        let mut c = json!({"cniVersion": "1.0.0", "name": "oxvs-chain"});
        for (k, v) in plugin.as_object().unwrap() {
            c[k] = v.clone();
        }
        if let Some(p) = prev {
            c["prevResult"] = p.clone();
        }
        c
    };
    let oxvs = json!({"type": "oxvs", "agentSocket": node.cni_socket()});
    let portmap = json!({
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [{"hostPort": 18080, "containerPort": 8080, "protocol": "tcp"}]}
    });
    let run = |verb: &str, plugin: &serde_json::Value, prev: Option<&serde_json::Value>| {
        let bin = match plugin["type"].as_str() {
            Some("oxvs") => common::workspace_bin("oxvs-cni")
                .to_string_lossy()
                .into_owned(),
            _ => "/usr/lib/cni/portmap".to_string(),
        };
        node::run_plugin(
            &node.ns.name,
            &bin,
            &[
                ("CNI_COMMAND", verb),
                ("CNI_CONTAINERID", cid.as_str()),
                ("CNI_NETNS", netns.as_str()),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            &conf(plugin.clone(), prev),
        )
    };
    let r1 = run("ADD", &oxvs, None);
    assert!(r1.ok, "oxvs ADD: {r1:?}");
    let r2 = run("ADD", &portmap, Some(&r1.json));
    assert!(r2.ok, "portmap ADD: {r2:?}");
    // portmap passes the result through unchanged.
    assert_eq!(r2.json["ips"], r1.json["ips"], "{r2:?}");
    let pod_ip = r1.json["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();

    let mut sink = pod.spawn(&["python3", "-c", common::TCP_SINK, "0.0.0.0", "8080", "15"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sink.stdout_text().contains("listening") {
        assert!(Instant::now() < deadline, "sink did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let src = client.exec(&[
        "python3",
        "-c",
        common::TCP_SOURCE,
        "192.168.231.1",
        "18080",
        "100000",
        "10",
    ]);
    let sent = String::from_utf8_lossy(&src.stdout).trim().to_string();
    let (_, got, _) = sink.wait(Duration::from_secs(15));
    assert!(
        !sent.is_empty() && got.lines().last() == Some(sent.as_str()),
        "host port 18080 -> {pod_ip}:8080: sent {sent:?}, pod got {got:?}\n{}",
        String::from_utf8_lossy(&src.stderr)
    );

    // DEL in reverse order, with the final result as prevResult.
    let d2 = run("DEL", &portmap, Some(&r2.json));
    assert!(d2.ok, "portmap DEL: {d2:?}");
    let d1 = run("DEL", &oxvs, Some(&r2.json));
    assert!(d1.ok, "oxvs DEL: {d1:?}");
    assert!(node.ipam_records().is_empty());
}

#[test]
fn pods_reach_outside_the_cluster_through_the_gateway_with_masquerade() {
    skip_unless_capable!();
    let node = Node::start("nout", "10.231.8.0/24");
    // "Outside": a host on the node's uplink that knows no pod route.
    let outside = common::Netns::new("out");
    common::veth(&node.ns, "up0", &outside, "eth0");
    node.ns
        .must(&["ip", "addr", "add", "192.168.232.1/24", "dev", "up0"]);
    outside.must(&["ip", "addr", "add", "192.168.232.2/24", "dev", "eth0"]);
    let a = node.add_pod("a");
    // The outside has no route to the pod CIDR: replies only come back
    // because the node masqueraded the pod's traffic.
    let p = ping_until_up(&a.ns, "192.168.232.2", 5);
    assert!(p.ok, "pod -> outside: {}", p.output);
    let mut sink = outside.spawn(&["python3", "-c", common::TCP_SINK, "0.0.0.0", "7001", "10"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sink.stdout_text().contains("listening") {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let src = a.ns.exec(&[
        "python3",
        "-c",
        common::TCP_SOURCE,
        "192.168.232.2",
        "7001",
        "1000",
        "5",
    ]);
    assert!(
        src.status.success(),
        "{}",
        String::from_utf8_lossy(&src.stderr)
    );
    let _ = sink.wait(Duration::from_secs(5));
    let rules = node
        .ns
        .must(&["iptables", "-t", "nat", "-S", "POSTROUTING"]);
    assert!(
        rules.contains("10.231.8.0/24") && rules.contains("MASQUERADE"),
        "{rules}"
    );
    // Pod to pod stays un-NATed: the peer sees the pod's own address.
    let b = node.add_pod("b");
    let mut peer = b.ns.spawn(&["python3", "-c", "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 7002)); s.listen(1)\nprint('listening', flush=True)\nc, addr = s.accept(); print(addr[0], flush=True)"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !peer.stdout_text().contains("listening") {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = a.ns.exec(&[
        "python3",
        "-c",
        &format!(
            "import socket; socket.create_connection(('{}', 7002), timeout=5).close()",
            b.ip
        ),
    ]);
    let (_, out, _) = peer.wait(Duration::from_secs(5));
    assert!(
        out.lines().last() == Some(a.ip.as_str()),
        "b saw {out:?}, a is {}",
        a.ip
    );
}
