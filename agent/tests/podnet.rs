//! Root tests of `oxvs_agent::podnet` against the real kernel.
//!
//! Isolation: every test makes its own "host" namespace (`oxvs-pn<pid>-...-h`)
//! and runs the code under test on a thread that entered it, so the
//! machine's own namespace is never touched: the host ends, the addresses
//! given to them and all traffic stay inside namespaces made here. Pod
//! namespaces are made with `ip netns add` (tests only) and removed by Drop
//! guards, also when a test fails (deleting a namespace deletes its links).

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use nix::sched::{setns, CloneFlags};
use oxvs_agent::podnet::{self, PodIfaceSpec, PodnetError};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A named network namespace made with `ip netns add`, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Self {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("oxvs-pn{}-{n}-{tag}", std::process::id());
        run("ip", &["netns", "add", &name]);
        Netns { name }
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs `ip -n <ns> args...`, panicking on failure; returns stdout.
    fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// Runs `ip netns exec <ns> cmd...`; returns (success, stdout+stderr).
    fn exec(&self, cmd: &[&str]) -> (bool, String) {
        let mut a = vec!["netns", "exec", self.name.as_str()];
        a.extend_from_slice(cmd);
        let out = Command::new("ip").args(&a).output().expect("spawn ip");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn has_link(&self, name: &str) -> bool {
        self.exec(&["ip", "link", "show", "dev", name]).0
    }

    /// Runs `f` on a fresh thread inside this namespace (panics propagate).
    fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = File::open(self.path()).expect("open netns");
        std::thread::scope(|s| {
            s.spawn(move || {
                setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn spec(pod: &Netns, n: u8, host_ifname: &str) -> PodIfaceSpec {
    PodIfaceSpec {
        netns: pod.path(),
        ifname: "eth0".into(),
        host_ifname: host_ifname.into(),
        mac: [0x0a, 0x58, 10, 250, n, 2],
        ipv4: Some(oxvs_agent::state::PodIpv4 {
            ip: Ipv4Addr::new(10, 250, n, 2),
            prefix_len: 24,
            gateway: Ipv4Addr::new(10, 250, n, 1),
        }),
        mtu: 1450,
        route_mtu: None,
        tcp_full_mtu: false,
        tx_checksum_off: true,
        ipv6: None,
        qdisc: None,
    }
}

#[test]
fn setup_check_ping_and_delete() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let host_if = podnet::host_ifname("default", "web-0", "cid-1", "eth0");
    let s = spec(&pod, 1, &host_if);

    let made = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup");
    assert_eq!(made.host_ifname, host_if);

    // Host end: index, MAC, MTU, up, as reported.
    let hl = host.ip(&["-o", "link", "show", "dev", &host_if]);
    assert!(hl.starts_with(&format!("{}: ", made.host_ifindex)), "{hl}");
    let mac = made
        .host_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    assert!(hl.contains(&format!("link/ether {mac}")), "{hl}");
    assert!(hl.contains("mtu 1450") && hl.contains(",UP"), "{hl}");
    assert_eq!(
        host.run_in(|| podnet::link_mac(&host_if)).expect("mac"),
        made.host_mac
    );
    assert_eq!(
        host.run_in(|| podnet::link_mtu(&host_if)).expect("mtu"),
        1450
    );
    assert!(host
        .run_in(|| podnet::link_exists(&host_if))
        .expect("exists"));

    // Pod end, seen with iproute2 and ethtool from inside.
    let pl = pod.ip(&["-o", "link", "show", "dev", "eth0"]);
    assert!(pl.contains("link/ether 0a:58:0a:fa:01:02"), "{pl}");
    assert!(pl.contains("mtu 1450") && pl.contains(",UP"), "{pl}");
    let lo = pod.ip(&["-o", "link", "show", "dev", "lo"]);
    assert!(lo.contains(",UP"), "{lo}");
    let addr = pod.ip(&["-o", "-4", "addr", "show", "dev", "eth0"]);
    assert!(addr.contains("inet 10.250.1.2/24"), "{addr}");
    let route = pod.ip(&["-4", "route", "show", "default"]);
    assert!(route.contains("default via 10.250.1.1 dev eth0"), "{route}");
    let (ok, k) = pod.exec(&["ethtool", "-k", "eth0"]);
    assert!(ok, "{k}");
    assert!(k.contains("tx-checksum-ip-generic: off"), "{k}");

    // Traffic both ways between the host end and the pod.
    host.ip(&["addr", "add", "10.250.1.1/24", "dev", &host_if]);
    let (ok, out) = host.exec(&["ping", "-c", "1", "-W", "2", "10.250.1.2"]);
    assert!(ok, "host -> pod: {out}");
    let (ok, out) = pod.exec(&["ping", "-c", "1", "-W", "2", "10.250.1.1"]);
    assert!(ok, "pod -> host: {out}");

    // Check passes, then lists every difference.
    host.run_in(|| podnet::check_pod_interface(&s))
        .expect("check");
    pod.ip(&["link", "set", "dev", "eth0", "mtu", "1400"]);
    pod.ip(&["addr", "del", "10.250.1.2/24", "dev", "eth0"]);
    let err = host
        .run_in(|| podnet::check_pod_interface(&s))
        .expect_err("check after changes");
    let msg = err.to_string();
    assert!(msg.contains("MTU is 1400, want 1450"), "{msg}");
    assert!(msg.contains("lacks address 10.250.1.2/24"), "{msg}");
    // The address held the connected route the default route depended on.
    assert!(msg.contains("lacks default route via 10.250.1.1"), "{msg}");
    assert!(!msg.contains("MAC"), "{msg}");

    // Delete removes both ends; a second delete reports absence.
    assert!(host
        .run_in(|| podnet::delete_host_link(&host_if))
        .expect("delete"));
    assert!(!host.has_link(&host_if));
    assert!(!pod.has_link("eth0"));
    assert!(!host
        .run_in(|| podnet::delete_host_link(&host_if))
        .expect("delete again"));
    assert!(!host
        .run_in(|| podnet::link_exists(&host_if))
        .expect("exists"));
    let err = host
        .run_in(|| podnet::check_pod_interface(&s))
        .expect_err("check after delete");
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
fn tx_checksum_left_on_when_not_asked() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let mut s = spec(&pod, 2, "csum-on");
    s.tx_checksum_off = false;
    host.run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup");
    let (_, k) = pod.exec(&["ethtool", "-k", "eth0"]);
    assert!(k.contains("tx-checksum-ip-generic: on"), "{k}");
    host.run_in(|| podnet::check_pod_interface(&s))
        .expect("check");
    // Asked for off on a pod end that has it on: check reports it.
    s.tx_checksum_off = true;
    let err = host
        .run_in(|| podnet::check_pod_interface(&s))
        .expect_err("check");
    assert!(
        err.to_string().contains("TX checksum offload is on"),
        "{err}"
    );
}

#[test]
fn pod_end_gets_the_root_qdisc_asked_for() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let mut s = spec(&pod, 8, "qdisc-pf");
    // Without one, the veth keeps noqueue; check does not look.
    host.run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup");
    let q = pod.exec(&["tc", "qdisc", "show", "dev", "eth0"]).1;
    assert!(q.contains("qdisc noqueue"), "{q}");
    host.run_in(|| podnet::check_pod_interface(&s))
        .expect("check");
    // Asked for one that the pod end lacks: check reports it.
    s.qdisc = Some("pfifo_fast".into());
    let err = host
        .run_in(|| podnet::check_pod_interface(&s))
        .expect_err("check");
    assert!(
        err.to_string()
            .contains("root qdisc is noqueue, want pfifo_fast"),
        "{err}"
    );
    host.run_in(|| podnet::delete_host_link("qdisc-pf"))
        .expect("delete");

    // Made with it: the pod end has it (seen with tc from inside).
    host.run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup");
    let q = pod.exec(&["tc", "qdisc", "show", "dev", "eth0"]).1;
    assert!(q.contains("qdisc pfifo_fast") && q.contains("root"), "{q}");
    host.run_in(|| podnet::check_pod_interface(&s))
        .expect("check");
    host.run_in(|| podnet::delete_host_link("qdisc-pf"))
        .expect("delete");

    // A kind this kernel lacks fails the setup, names the step, and leaves
    // nothing behind.
    s.qdisc = Some("no_such_qdisc".into());
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("setup with an unknown qdisc");
    assert!(
        err.to_string()
            .contains("set root qdisc 'no_such_qdisc' on 'eth0'"),
        "{err}"
    );
    assert!(!host.has_link("qdisc-pf"));
    assert!(!pod.has_link("eth0"));
}

#[test]
fn tcp_takes_the_interface_mtu_by_its_own_table() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let mut s = spec(&pod, 3, "tcp-table");
    s.mtu = 9000;
    s.route_mtu = Some(1450);
    s.tcp_full_mtu = true;
    host.run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup");
    let route = pod.ip(&["-4", "route", "show", "default"]);
    assert!(route.contains("mtu 1450"), "{route}");
    let rules = pod.ip(&["-4", "rule", "show"]);
    assert!(
        rules.contains("100:\tfrom all ipproto tcp lookup 100"),
        "{rules}"
    );
    let table = pod.ip(&["-4", "route", "show", "table", "100"]);
    assert!(
        table.contains("default via 10.250.3.1 dev eth0")
            && table.contains("10.250.3.0/24 dev eth0")
            && !table.contains("mtu"),
        "{table}"
    );
    // TCP to another node's pod: no route MTU; UDP: the tunnel's.
    let tcp = pod.ip(&["-4", "route", "get", "10.9.9.9", "ipproto", "tcp"]);
    assert!(!tcp.contains("mtu"), "{tcp}");
    let udp = pod.ip(&["-4", "route", "get", "10.9.9.9", "ipproto", "udp"]);
    assert!(udp.contains("mtu 1450"), "{udp}");
    // The pod's own subnet stays on the link for TCP too.
    let near = pod.ip(&["-4", "route", "get", "10.250.3.7", "ipproto", "tcp"]);
    assert!(!near.contains("via"), "{near}");
    // The rule stays in the namespace when the veth goes (a DEL, a failed
    // ADD): an ADD in the same namespace again (podman's network reload is
    // a DEL and an ADD) finds it and succeeds, and it is there once.
    host.ip(&["link", "del", "tcp-table"]);
    host.run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup again in the same namespace");
    let rules = pod.ip(&["-4", "rule", "show"]);
    assert_eq!(rules.matches("ipproto tcp").count(), 1, "{rules}");
    let table = pod.ip(&["-4", "route", "show", "table", "100"]);
    assert!(table.contains("default via 10.250.3.1 dev eth0"), "{table}");

    // Without a route MTU there is nothing to split: no rule.
    let pod2 = Netns::new("p");
    let mut s2 = spec(&pod2, 4, "tcp-none");
    s2.tcp_full_mtu = true;
    host.run_in(|| podnet::setup_pod_interface(&s2))
        .expect("setup");
    let rules = pod2.ip(&["-4", "rule", "show"]);
    assert!(!rules.contains("ipproto tcp"), "{rules}");
}

/// A dual-stack pod: both addresses, a default route per family, its
/// link-local address the EUI-64 of its MAC, no DAD, no router
/// advertisements; CHECK sees a missing IPv6 address.
#[test]
fn dual_stack_pod_interface() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let mut s = spec(&pod, 5, "dual-if");
    s.ipv6 = Some(oxvs_agent::state::PodIpv6 {
        ip: "fd00:250:5::2".parse().unwrap(),
        prefix_len: 64,
        gateway: "fd00:250:5::1".parse().unwrap(),
    });
    host.run_in(|| podnet::setup_pod_interface(&s))
        .expect("setup");
    // The kernel adds the link-local address once the link has carrier,
    // and (DAD off) completes it at once from a work queue.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let addrs = loop {
        let a = pod.ip(&["-6", "addr", "show", "dev", "eth0"]);
        // Without DAD, tentative only until the kernel's DAD work runs.
        let settled = a.contains("scope link") && !a.contains("tentative");
        if settled || std::time::Instant::now() > deadline {
            break a;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        addrs.contains("inet6 fd00:250:5::2/64 scope global nodad"),
        "{addrs}"
    );
    assert!(
        addrs.contains("inet6 fe80::858:aff:fefa:502/64 scope link"),
        "link-local is the MAC's EUI-64: {addrs}"
    );
    assert!(!addrs.contains("tentative"), "{addrs}");
    let route = pod.ip(&["-6", "route", "show", "default"]);
    assert!(
        route.contains("default via fd00:250:5::1 dev eth0"),
        "{route}"
    );
    for (knob, want) in [
        ("accept_ra", "0"),
        ("accept_dad", "0"),
        ("addr_gen_mode", "0"),
    ] {
        let (_, v) = pod.exec(&["cat", &format!("/proc/sys/net/ipv6/conf/eth0/{knob}")]);
        assert_eq!(v.trim(), want, "{knob}");
    }
    host.run_in(|| podnet::check_pod_interface(&s))
        .expect("CHECK of a dual-stack pod");
    pod.ip(&["-6", "addr", "del", "fd00:250:5::2/64", "dev", "eth0"]);
    let e = host
        .run_in(|| podnet::check_pod_interface(&s))
        .expect_err("CHECK without the IPv6 address");
    assert!(
        e.to_string().contains("lacks address fd00:250:5::2/64"),
        "{e}"
    );
    // With the TCP table: its IPv6 twin (the switch cuts IPv6 TCP into the
    // tunnel too).
    let pod2 = Netns::new("p");
    let mut s2 = spec(&pod2, 6, "dual-tcp");
    s2.mtu = 9000;
    s2.route_mtu = Some(1450);
    s2.tcp_full_mtu = true;
    s2.ipv6 = Some(oxvs_agent::state::PodIpv6 {
        ip: "fd00:250:6::2".parse().unwrap(),
        prefix_len: 64,
        gateway: "fd00:250:6::1".parse().unwrap(),
    });
    host.run_in(|| podnet::setup_pod_interface(&s2))
        .expect("setup");
    let rules = pod2.ip(&["-6", "rule", "show"]);
    assert!(
        rules.contains("100:\tfrom all ipproto tcp lookup 100"),
        "{rules}"
    );
    let table = pod2.ip(&["-6", "route", "show", "table", "100"]);
    assert!(
        table.contains("default via fd00:250:6::1 dev eth0")
            && table.contains("fd00:250:6::/64 dev eth0")
            && !table.contains("mtu"),
        "{table}"
    );
    let udp = pod2.ip(&["-6", "route", "get", "fd00:9::9", "ipproto", "udp"]);
    assert!(udp.contains("mtu 1450"), "{udp}");
    let tcp = pod2.ip(&["-6", "route", "get", "fd00:9::9", "ipproto", "tcp"]);
    assert!(!tcp.contains("mtu"), "{tcp}");
    // Set up again in the same namespace (its rules stay when the veth
    // goes): both families' rules are found as they are, once each.
    host.ip(&["link", "del", "dual-tcp"]);
    host.run_in(|| podnet::setup_pod_interface(&s2))
        .expect("setup again in the same namespace");
    for family in ["-4", "-6"] {
        let rules = pod2.ip(&[family, "rule", "show"]);
        assert_eq!(rules.matches("ipproto tcp").count(), 1, "{family}: {rules}");
    }
}

#[test]
fn missing_netns_is_no_netns_and_leaves_nothing() {
    let host = Netns::new("h");
    let mut s = spec(&host, 3, "nonetns0");
    s.netns = PathBuf::from(format!("/run/netns/oxvs-pn{}-absent", std::process::id()));
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("setup");
    assert!(
        matches!(err, PodnetError::NoNetns(ref p) if *p == s.netns),
        "{err:?}"
    );
    assert!(!host.has_link("nonetns0"));
    // A file that is not a namespace is refused the same way.
    let f = tempfile::NamedTempFile::new().expect("tempfile");
    s.netns = f.path().to_path_buf();
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("setup");
    assert!(matches!(err, PodnetError::NoNetns(_)), "{err:?}");
    assert!(!host.has_link("nonetns0"));
    assert!(!podnet::netns_exists(f.path()));
    assert!(podnet::netns_exists(&host.path()));
}

#[test]
fn existing_pod_ifname_is_exists_and_leaves_nothing() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    // (The test kernel may lack the dummy driver: a veth pair will do.)
    pod.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let s = spec(&pod, 4, "exists-pod");
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("setup");
    match &err {
        PodnetError::Exists(name, ns) => {
            assert_eq!(name, "eth0");
            assert_eq!(*ns, s.netns.display().to_string());
        }
        other => panic!("want Exists, got {other:?}"),
    }
    assert!(!host.has_link("exists-pod"));
    let l = pod.ip(&["-o", "link", "show", "dev", "eth0"]);
    assert!(
        l.contains("eth0@other0"),
        "the pod's own eth0 must be untouched: {l}"
    );
}

#[test]
fn existing_host_ifname_is_exists_and_leaves_nothing() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    host.ip(&[
        "link",
        "add",
        "exists-host",
        "type",
        "veth",
        "peer",
        "name",
        "other0",
    ]);
    let s = spec(&pod, 5, "exists-host");
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("setup");
    assert!(
        matches!(err, PodnetError::Exists(ref n, _) if n == "exists-host"),
        "{err:?}"
    );
    assert!(!pod.has_link("eth0"));
    let l = host.ip(&["-o", "link", "show", "dev", "exists-host"]);
    assert!(l.contains("exists-host@other0"), "{l}");
}

#[test]
fn failure_after_creation_removes_both_ends() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let mut s = spec(&pod, 6, "midfail0");
    // The broadcast address is no valid gateway: the route step fails after
    // the veth pair and the address were made.
    s.ipv4.as_mut().unwrap().gateway = Ipv4Addr::BROADCAST;
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("setup");
    let msg = err.to_string();
    assert!(msg.contains("default route via 255.255.255.255"), "{msg}");
    assert!(!host.has_link("midfail0"));
    assert!(!pod.has_link("eth0"));
}

#[test]
fn invalid_spec_is_refused_before_anything() {
    let host = Netns::new("h");
    let pod = Netns::new("p");
    let mut s = spec(&pod, 7, "this-name-is-too-long");
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("long");
    assert!(err.to_string().contains("this-name-is-too-long"), "{err}");
    s.host_ifname = "badmac0".into();
    s.mac = [0x01, 0, 0x5e, 0, 0, 1];
    let err = host
        .run_in(|| podnet::setup_pod_interface(&s))
        .expect_err("mac");
    assert!(err.to_string().contains("01:00:5e:00:00:01"), "{err}");
    assert!(!host.has_link("badmac0"));
    assert!(!pod.has_link("eth0"));
}

#[test]
fn concurrent_setups_in_many_namespaces() {
    const N: u8 = 20;
    let host = Netns::new("h");
    let pods: Vec<Netns> = (0..N).map(|i| Netns::new(&format!("c{i}"))).collect();
    let specs: Vec<PodIfaceSpec> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let name = podnet::host_ifname("ns", "conc", &format!("cid{i}"), "eth0");
            spec(p, 100 + i as u8, &name)
        })
        .collect();
    let results: Vec<Result<podnet::PodIface, PodnetError>> = std::thread::scope(|s| {
        let handles: Vec<_> = specs
            .iter()
            .map(|sp| s.spawn(|| host.run_in(|| podnet::setup_pod_interface(sp))))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut indexes = std::collections::HashSet::new();
    for (r, sp) in results.iter().zip(&specs) {
        let made = r
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: {e}", sp.host_ifname));
        assert!(indexes.insert(made.host_ifindex));
        host.run_in(|| podnet::check_pod_interface(sp))
            .unwrap_or_else(|e| panic!("{}: {e}", sp.host_ifname));
    }
    for sp in &specs {
        assert!(host
            .run_in(|| podnet::delete_host_link(&sp.host_ifname))
            .expect("delete"));
    }
    for p in &pods {
        assert!(!p.has_link("eth0"));
    }
}

#[test]
fn ensure_address_and_default_route_interface() {
    let host = Netns::new("h");
    host.ip(&[
        "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
    ]);
    assert_eq!(
        host.run_in(podnet::default_route_interface).expect("none"),
        None
    );
    let ip = Ipv4Addr::new(10, 251, 0, 1);
    host.run_in(|| podnet::ensure_address("uplink0", ip, 24))
        .expect("ensure");
    host.run_in(|| podnet::ensure_address("uplink0", ip, 24))
        .expect("ensure again");
    let a = host.ip(&["-o", "-4", "addr", "show", "dev", "uplink0"]);
    assert_eq!(a.matches("inet 10.251.0.1/24").count(), 1, "{a}");
    let l = host.ip(&["-o", "link", "show", "dev", "uplink0"]);
    assert!(l.contains(",UP"), "{l}");
    host.ip(&[
        "route",
        "add",
        "default",
        "via",
        "10.251.0.254",
        "dev",
        "uplink0",
    ]);
    assert_eq!(
        host.run_in(podnet::default_route_interface).expect("some"),
        Some("uplink0".to_string())
    );
    let err = host
        .run_in(|| podnet::ensure_address("absent0", ip, 24))
        .expect_err("absent");
    assert!(err.to_string().contains("absent0"), "{err}");
}

/// Latency of `setup_pod_interface` and `delete_host_link` (run with
/// `--ignored --nocapture`).
#[test]
#[ignore]
fn bench_setup_and_delete() {
    const ITERS: usize = 50;
    let host = Netns::new("h");
    let pods: Vec<Netns> = (0..ITERS).map(|i| Netns::new(&format!("b{i}"))).collect();
    let (mut setup, mut delete) = (Vec::new(), Vec::new());
    host.run_in(|| {
        for (i, p) in pods.iter().enumerate() {
            let s = spec(p, (i % 250) as u8, &format!("bench{i}"));
            let t = Instant::now();
            podnet::setup_pod_interface(&s).expect("setup");
            setup.push(t.elapsed());
            let t = Instant::now();
            assert!(podnet::delete_host_link(&s.host_ifname).expect("delete"));
            delete.push(t.elapsed());
        }
    });
    for (what, v) in [
        ("setup_pod_interface", &mut setup),
        ("delete_host_link", &mut delete),
    ] {
        v.sort();
        println!(
            "{what}: p50 {:?} p90 {:?} max {:?} over {ITERS}",
            v[ITERS / 2],
            v[ITERS * 9 / 10],
            v[ITERS - 1]
        );
    }
}
