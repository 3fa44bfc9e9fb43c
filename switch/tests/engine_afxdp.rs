//! The engine on real interfaces: "pods" are network namespaces whose
//! `eth0` is a veth; the host ends are AF_XDP ports of an in-process
//! [`Switch`]. Needs root (skipped with a message otherwise).
//!
//! Every namespace and link is named with the test's pid and tag, and a
//! drop guard removes them even when an assertion fails.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxvs_api::{PortKind, PortSpec, XdpModeRequest};
use oxvs_pipeline::flow::{FlowMod, FlowModCommand};
use oxvs_pipeline::parse::{parse_flow_file, parse_flow_mod, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_switch::engine::{monotonic_ns, PollMode, Switch, SwitchConfig, SwitchError, UmemSharing};
use oxvs_switch::netdev;

use common::{must, run};

/// Namespaces and links of one test, removed on drop.
struct Lab {
    tag: String,
    netns: Vec<String>,
    links: Vec<String>,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        Lab {
            tag: format!("{}{}", tag, std::process::id()),
            netns: Vec::new(),
            links: Vec::new(),
        }
    }

    /// A pod: netns `oxvs-<tag>-<name>` with `eth0` = `ip`/24; returns
    /// (netns, host-side interface name).
    fn pod(&mut self, name: &str, ip: &str) -> (String, String) {
        let ns = format!("oxvs-{}-{name}", self.tag);
        let host = format!("ox{}{name}", self.tag);
        assert!(host.len() < 16, "interface name {host} too long");
        let peer = format!("{host}p");
        must(&["ip", "netns", "add", &ns]);
        self.netns.push(ns.clone());
        netdev::create_veth_pair(&host, &peer, Some(1500)).expect("veth pair");
        self.links.push(host.clone());
        must(&["ip", "link", "set", &peer, "netns", &ns]);
        must(&["ip", "-n", &ns, "link", "set", &peer, "name", "eth0"]);
        must(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip}/24"),
            "dev",
            "eth0",
        ]);
        must(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        must(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        // No IPv6 chatter from the host end.
        let _ = run(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{host}.disable_ipv6=1"),
        ]);
        netdev::set_up(&host).expect("host end up");
        (ns, host)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for l in &self.links {
            if netdev::link_exists(l) {
                let _ = netdev::delete_link(l);
            }
        }
        for ns in &self.netns {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

fn afxdp(name: &str, ofport: u32) -> PortSpec {
    PortSpec {
        name: name.into(),
        ofport: Some(ofport),
        kind: PortKind::Afxdp {
            ifname: None,
            xdp_mode: XdpModeRequest::Auto,
            n_rxq: None,
        },
    }
}

const FLOWS: &str = "
# ARP and IPv4 by destination
priority=20,arp,arp_tpa=10.77.0.1 actions=output:1
priority=20,arp,arp_tpa=10.77.0.2 actions=output:2
priority=20,arp,arp_tpa=10.77.0.3 actions=output:3
priority=20,ip,nw_dst=10.77.0.1 actions=output:1
priority=20,ip,nw_dst=10.77.0.2 actions=output:2
priority=20,ip,nw_dst=10.77.0.3 actions=output:3
";

fn load_flows(p: &Pipeline, text: &str) {
    let ctx = ParseContext::default();
    let flows = parse_flow_file(text, &ctx).expect("flows parse");
    let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
    p.apply(&mods, monotonic_ns()).expect("flows apply");
}

fn flow_mod(p: &Pipeline, text: &str, cmd: FlowModCommand) {
    let fm = parse_flow_mod(text, cmd, &ParseContext::default()).expect("flow mod parse");
    p.apply(&[fm], monotonic_ns()).expect("flow mod apply");
}

/// Pings `dst` from `ns`; returns (received, average rtt ms).
fn ping(ns: &str, dst: &str, count: u32) -> (u32, f64) {
    let out = run(&[
        "ip",
        "netns",
        "exec",
        ns,
        "ping",
        "-n",
        "-q",
        "-c",
        &count.to_string(),
        "-i",
        "0.2",
        "-W",
        "1",
        dst,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let received = text
        .lines()
        .find(|l| l.contains("received"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let avg = text
        .lines()
        .find(|l| l.starts_with("rtt") || l.starts_with("round-trip"))
        .and_then(|l| l.split(" = ").nth(1))
        .and_then(|v| v.split('/').nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    (received, avg)
}

fn spawn_in(ns: &str, script: &str, args: &[&str]) -> Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "python3", "-c", script])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("spawn python3")
}

fn wait_output(child: Child, what: &str) -> String {
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

const TCP_SERVER: &str = r#"
import socket, hashlib, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001)); s.listen(1); s.settimeout(20)
c, _ = s.accept(); c.settimeout(20)
h = hashlib.sha256(); n = 0
while True:
    d = c.recv(65536)
    if not d: break
    h.update(d); n += len(d)
c.sendall(h.hexdigest().encode()); c.close()
print(n, h.hexdigest())
"#;

const TCP_CLIENT: &str = r#"
import socket, hashlib, sys, time, random
data = random.Random(7).randbytes(int(sys.argv[2]))
for i in range(50):
    try:
        c = socket.create_connection((sys.argv[1], 5001), timeout=5); break
    except OSError:
        time.sleep(0.1)
t = time.time(); c.sendall(data); c.shutdown(socket.SHUT_WR)
got = c.recv(100).decode(); dt = time.time() - t
print(len(data), hashlib.sha256(data).hexdigest(), got, "%.1f" % (len(data) * 8 / dt / 1e6))
"#;

const UDP_SERVER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 5002)); s.settimeout(20)
d, a = s.recvfrom(2000); s.sendto(d.upper(), a); print(d.decode())
"#;

const UDP_CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)
for i in range(20):
    s.sendto(b"hello oxvs %d" % i, (sys.argv[1], 5002))
    try:
        d, _ = s.recvfrom(2000); print(d.decode()); break
    except socket.timeout:
        pass
"#;

#[test]
fn engine_two_pods_ping_udp_tcp_flow_changes_port_churn() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root");
        return;
    }
    let mut lab = Lab::new("e");
    let (ns_a, h_a) = lab.pod("a", "10.77.0.1");
    let (ns_b, h_b) = lab.pod("b", "10.77.0.2");
    let (ns_c, h_c) = lab.pod("c", "10.77.0.3");

    let pipeline = Arc::new(Pipeline::new());
    load_flows(&pipeline, FLOWS);
    let sw = Switch::start(
        SwitchConfig {
            umem_sharing: UmemSharing::per_thread_unique(),
            ..SwitchConfig::default()
        },
        Arc::clone(&pipeline),
    )
    .expect("start");
    let pa = sw.add_port(afxdp(&h_a, 1)).expect("add port a");
    let pb = sw.add_port(afxdp(&h_b, 2)).expect("add port b");
    eprintln!("ports: {} {} / {} {}", pa.name, pa.mode, pb.name, pb.mode);
    assert_eq!(pa.kind, "afxdp");
    assert!(
        pa.mode.starts_with("native/"),
        "veth supports native XDP: {}",
        pa.mode
    );
    assert!(
        netdev::has_xdp(&h_a).unwrap(),
        "XDP program attached to {h_a}"
    );

    // Bad requests are refused with a clear error.
    assert!(matches!(
        sw.add_port(afxdp(&h_a, 9)),
        Err(SwitchError::NameInUse(_))
    ));
    assert!(matches!(
        sw.add_port(afxdp(&h_c, 1)),
        Err(SwitchError::OfportInUse { ofport: 1, .. })
    ));
    assert!(matches!(
        sw.add_port(afxdp("oxvs-nonexist0", 7)),
        Err(SwitchError::PortOpen { .. })
    ));
    assert!(matches!(
        sw.del_port("nope"),
        Err(SwitchError::NoSuchPort(_))
    ));

    // Ping both ways.
    let (got, rtt_ab) = ping(&ns_a, "10.77.0.2", 5);
    assert_eq!(got, 5, "a -> b ping");
    let (got, rtt_ba) = ping(&ns_b, "10.77.0.1", 5);
    assert_eq!(got, 5, "b -> a ping");
    eprintln!("ping rtt a->b {rtt_ab:.3} ms, b->a {rtt_ba:.3} ms");

    // UDP exchange.
    let server = spawn_in(&ns_b, UDP_SERVER, &["10.77.0.2"]);
    let client = spawn_in(&ns_a, UDP_CLIENT, &["10.77.0.2"]);
    let reply = wait_output(client, "udp client");
    let _ = wait_output(server, "udp server");
    assert!(reply.starts_with("HELLO OXVS"), "udp reply: {reply:?}");

    // TCP transfer, data checked, a -> b.
    let server = spawn_in(&ns_b, TCP_SERVER, &["10.77.0.2"]);
    let client = spawn_in(&ns_a, TCP_CLIENT, &["10.77.0.2", "4000000"]);
    let c = wait_output(client, "tcp client");
    let s = wait_output(server, "tcp server");
    let cf: Vec<&str> = c.split_whitespace().collect();
    let sf: Vec<&str> = s.split_whitespace().collect();
    assert_eq!(cf.len(), 4, "client output {c:?}");
    assert_eq!(cf[1], cf[2], "server's digest equals the data sent");
    assert_eq!(sf, vec![cf[0], cf[1]], "server got every byte");
    eprintln!("tcp a->b: {} bytes intact, {} Mbit/s", cf[0], cf[3]);
    // And b -> a.
    let server = spawn_in(&ns_a, TCP_SERVER, &["10.77.0.1"]);
    let client = spawn_in(&ns_b, TCP_CLIENT, &["10.77.0.1", "1000000"]);
    let c = wait_output(client, "tcp client b");
    let _ = wait_output(server, "tcp server a");
    let cf: Vec<&str> = c.split_whitespace().collect();
    assert_eq!(cf[1], cf[2], "b -> a digest");

    // A drop flow takes effect for the next packet; removing it restores traffic.
    flow_mod(
        &pipeline,
        "priority=100,icmp,nw_dst=10.77.0.2 actions=drop",
        FlowModCommand::Add,
    );
    let (got, _) = ping(&ns_a, "10.77.0.2", 3);
    assert_eq!(got, 0, "drop flow drops pings");
    flow_mod(
        &pipeline,
        "priority=100,icmp,nw_dst=10.77.0.2",
        FlowModCommand::Delete { strict: true },
    );
    let (got, _) = ping(&ns_a, "10.77.0.2", 3);
    assert_eq!(got, 3, "pings pass again");

    // Port add/remove while a <-> b traffic flows.
    let pinger = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns_a,
            "ping",
            "-n",
            "-q",
            "-c",
            "40",
            "-i",
            "0.05",
            "-W",
            "1",
            "10.77.0.2",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("ping");
    std::thread::sleep(Duration::from_millis(300));
    let pc = sw.add_port(afxdp(&h_c, 3)).expect("add port c");
    assert_eq!(pc.ofport, 3);
    let (got, _) = ping(&ns_c, "10.77.0.1", 3);
    assert_eq!(got, 3, "c -> a after adding c");
    sw.del_port(&h_c).expect("del port c");
    assert!(!netdev::has_xdp(&h_c).unwrap(), "XDP detached from {h_c}");
    let (got, _) = ping(&ns_c, "10.77.0.1", 2);
    assert_eq!(got, 0, "c is gone");
    // Re-add c under the lowest free number.
    let pc = sw
        .add_port(PortSpec {
            ofport: None,
            ..afxdp(&h_c, 0)
        })
        .expect("re-add c");
    assert_eq!(pc.ofport, 3);
    let (got, _) = ping(&ns_c, "10.77.0.2", 2);
    assert_eq!(got, 2, "c -> b after re-adding c");
    let out = pinger.wait_with_output().expect("pinger");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" 0% packet loss"),
        "a -> b traffic undisturbed by port churn: {text}"
    );

    // The first port of the UMEM can go and come back too.
    sw.del_port(&h_a).expect("del port a");
    assert!(!netdev::has_xdp(&h_a).unwrap(), "XDP detached from {h_a}");
    let (got, _) = ping(&ns_b, "10.77.0.1", 2);
    assert_eq!(got, 0, "a is gone");
    sw.add_port(afxdp(&h_a, 1)).expect("re-add a");
    let (got, _) = ping(&ns_b, "10.77.0.1", 3);
    assert_eq!(got, 3, "b -> a after re-adding a");

    // Counters moved.
    std::thread::sleep(Duration::from_millis(100));
    let ports = sw.ports();
    assert_eq!(
        ports.iter().map(|p| p.ofport).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    // (a was re-added: fresh counters, moved by the last pings; b saw everything.)
    let a = &ports[0].stats;
    assert!(a.rx_packets >= 3 && a.tx_packets >= 3, "port a: {a:?}");
    let b = &ports[1].stats;
    assert!(b.rx_packets > 100 && b.tx_packets > 100, "port b: {b:?}");
    assert!(
        b.rx_bytes > 1_000_000 && b.tx_bytes > 1_000_000,
        "port b: {b:?}"
    );
    let st = sw.stats();
    assert!(st.datapath.packets > 200, "{st:?}");
    assert!(st.datapath.upcalls > 0 && st.datapath.emc_hits + st.datapath.megaflow_hits > 0);
    eprintln!("stats: {:?}", st);

    // Shutdown leaves the interfaces as found.
    sw.shutdown();
    for h in [&h_a, &h_b, &h_c] {
        assert!(!netdev::has_xdp(h).unwrap(), "XDP left on {h}");
    }
}

#[test]
fn engine_packet_in_and_inject() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root");
        return;
    }
    let mut lab = Lab::new("i");
    let (ns_a, h_a) = lab.pod("a", "10.77.0.1");
    let (ns_b, h_b) = lab.pod("b", "10.77.0.2");
    let pipeline = Arc::new(Pipeline::new());
    load_flows(
        &pipeline,
        "priority=20,udp,tp_dst=9999 actions=controller\n\
         priority=20,in_port=3 actions=output:2\n",
    );
    let sw = Switch::start(
        SwitchConfig {
            poll_mode: PollMode::Interrupt,
            umem_sharing: UmemSharing::per_thread_unique(),
            ..SwitchConfig::default()
        },
        Arc::clone(&pipeline),
    )
    .expect("start");
    sw.add_port(afxdp(&h_a, 1)).expect("a");
    sw.add_port(afxdp(&h_b, 2)).expect("b");

    // A UDP packet to port 9999 from a becomes a packet-in.
    let _ = run(&[
        "ip", "netns", "exec", &ns_a, "python3", "-c",
        "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'pin', ('10.77.0.9', 9999))",
    ]);
    // (ARP for 10.77.0.9 goes unanswered: use a static neighbour instead.)
    must(&[
        "ip",
        "-n",
        &ns_a,
        "neigh",
        "replace",
        "10.77.0.9",
        "lladdr",
        "02:00:00:00:00:09",
        "dev",
        "eth0",
    ]);
    let _ = run(&[
        "ip", "netns", "exec", &ns_a, "python3", "-c",
        "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'pin', ('10.77.0.9', 9999))",
    ]);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut pins = Vec::new();
    while pins.is_empty() && Instant::now() < deadline {
        pins = sw.take_packet_ins(10);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!pins.is_empty(), "packet-in queued");
    assert_eq!(pins[0].in_port, 1);
    assert!(pins[0].frame.ends_with(b"pin"));

    // inject: a frame "from port 1" matching the controller flow is a packet-in too,
    // and an unknown port is refused.
    let frame = pins[0].frame.clone();
    sw.inject(1, frame.clone()).expect("inject");
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut again = Vec::new();
    while again.is_empty() && Instant::now() < deadline {
        again = sw.take_packet_ins(10);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(again.len(), 1, "injected frame went through the pipeline");
    assert!(matches!(
        sw.inject(42, frame),
        Err(SwitchError::NoSuchOfport(42))
    ));

    // inject a real packet out of port b: capture it there.
    let catcher = spawn_in(
        &ns_b,
        r#"
import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88b5)); s.settimeout(5)
d = s.recv(2000); print(d[14:].decode())
"#,
        &[],
    );
    load_flows(
        &pipeline,
        "priority=30,in_port=1,dl_type=0x88b5 actions=output:2\n",
    );
    let mut f = vec![0xffu8; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x88, 0xb5]);
    f.extend_from_slice(b"injected");
    // The catcher's socket may not be open yet (python start-up on a busy
    // machine): inject again every 100 ms until it has caught one.
    let mut catcher = catcher;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        sw.inject(1, f.clone()).expect("inject");
        std::thread::sleep(Duration::from_millis(100));
        if catcher.try_wait().expect("try_wait").is_some() || Instant::now() > deadline {
            break;
        }
    }
    let got = wait_output(catcher, "catcher");
    assert_eq!(got, "injected");
    sw.shutdown();
    assert!(!netdev::has_xdp(&h_a).unwrap());
}

/// `learn` through the real engine: a datapath thread queues the learned
/// flow, the flow keeper thread adds it, and expires it after its hard
/// timeout; the counters say so.
#[test]
fn engine_learns_and_expires_a_flow() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root");
        return;
    }
    let mut lab = Lab::new("l");
    let (_ns_a, h_a) = lab.pod("a", "10.77.2.1");
    let pipeline = Arc::new(Pipeline::new());
    load_flows(
        &pipeline,
        "priority=20,udp,tp_dst=9999 actions=learn(table=5,hard_timeout=1,cookie=0x5,eth_type=0x800,nw_proto=17,NXM_OF_IP_SRC[],NXM_OF_UDP_DST[],output:NXM_OF_IN_PORT[])\n",
    );
    let sw = Switch::start(
        SwitchConfig {
            poll_mode: PollMode::Interrupt,
            umem_sharing: UmemSharing::per_thread_unique(),
            ..SwitchConfig::default()
        },
        Arc::clone(&pipeline),
    )
    .expect("start");
    sw.add_port(afxdp(&h_a, 1)).expect("a");
    // A UDP datagram 10.77.2.1 -> 10.77.2.9:9999, injected as from port 1.
    let mut f = vec![0x02, 0, 0, 0, 0, 9, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 32, 0, 1, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 77, 2, 1, 10, 77, 2, 9]);
    f.extend_from_slice(&[0x30, 0x39, 0x27, 0x0f, 0, 12, 0, 0]);
    f.extend_from_slice(b"lrn!");
    sw.inject(1, f).expect("inject");
    let learned = |p: &Pipeline| p.snapshot().flows_in(5).len();
    let deadline = Instant::now() + Duration::from_secs(3);
    while learned(&pipeline) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let flows = pipeline.snapshot();
    let got: Vec<String> = flows
        .flows_in(5)
        .iter()
        .map(|r| oxvs_pipeline::print::format_flow(&r.flow, None))
        .collect();
    assert_eq!(
        got,
        vec!["cookie=0x5, table=5, hard_timeout=1, udp,nw_src=10.77.2.1,tp_dst=9999 actions=output:1"]
    );
    assert_eq!(sw.stats().learn.learned, 1);
    // The datapath thread publishes its counters once per loop.
    let deadline = Instant::now() + Duration::from_secs(3);
    while sw.stats().datapath.learns == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sw.stats().datapath.learns, 1);
    // Gone within its hard timeout plus the keeper's expiry interval.
    let deadline = Instant::now() + Duration::from_secs(5);
    while learned(&pipeline) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(learned(&pipeline), 0, "expired");
    assert_eq!(sw.stats().learn.flows_expired, 1);
    sw.shutdown();
}

#[test]
fn engine_starts_and_stops_without_ports() {
    let sw = Switch::start(
        SwitchConfig {
            threads: 2,
            ..SwitchConfig::default()
        },
        Arc::new(Pipeline::new()),
    );
    let sw = match sw {
        Ok(sw) => sw,
        Err(e) => {
            oxvs_testutil::skip_or_fail(format!("cannot map a UMEM here: {e}"));
            return;
        }
    };
    assert!(sw.ports().is_empty());
    assert_eq!(sw.stats().threads, 2);
    assert!(matches!(sw.del_port("x"), Err(SwitchError::NoSuchPort(_))));
    assert!(matches!(
        sw.inject(1, vec![0; 60]),
        Err(SwitchError::NoSuchOfport(1))
    ));
    assert!(sw.take_packet_ins(10).is_empty());
    sw.shutdown();
    assert!(matches!(
        sw.add_port(afxdp("x", 1)),
        Err(SwitchError::ShutDown)
    ));
}

#[test]
fn engine_two_threads_forward_across_threads() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root");
        return;
    }
    let mut lab = Lab::new("t");
    let (ns_a, h_a) = lab.pod("a", "10.77.0.1");
    let (_ns_b, h_b) = lab.pod("b", "10.77.0.2");
    let pipeline = Arc::new(Pipeline::new());
    load_flows(&pipeline, FLOWS);
    let sw = Switch::start(
        SwitchConfig {
            threads: 2,
            umem_sharing: UmemSharing::per_thread_unique(),
            ..SwitchConfig::default()
        },
        Arc::clone(&pipeline),
    )
    .expect("start");
    sw.add_port(afxdp(&h_a, 1)).expect("a");
    sw.add_port(afxdp(&h_b, 2)).expect("b");
    let (got, rtt) = ping(&ns_a, "10.77.0.2", 5);
    assert_eq!(got, 5, "a -> b across threads");
    eprintln!("two threads: ping rtt {rtt:.3} ms");
    std::thread::sleep(Duration::from_millis(100));
    let st = sw.stats();
    assert_eq!(st.threads, 2);
    assert!(
        st.cross_thread >= 10,
        "outputs went through the inbox: {st:?}"
    );
    sw.shutdown();
    assert!(!netdev::has_xdp(&h_a).unwrap() && !netdev::has_xdp(&h_b).unwrap());
}

/// The tunnel's merge limit (`gro_max`) follows the smallest receive MTU
/// of the ports: read once per port when it is added (a veth with its
/// peer here counts the smaller end, and is read again on every port
/// change), recomputed on every port change, reread from the kernel by
/// `refresh_gro_max`.
#[test]
fn engine_gro_max_follows_the_ports_mtus() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root");
        return;
    }
    let mut lab = Lab::new("m");
    let (_ns_a, h_a) = lab.pod("a", "10.77.4.1");
    let (_ns_b, h_b) = lab.pod("b", "10.77.4.2");
    netdev::set_mtu(&h_a, 9000).expect("mtu a");
    // A gateway-like pair, both ends here: the switch's end takes what
    // the smaller end passes.
    let gw = format!("ox{}g", lab.tag);
    let gw_peer = format!("{gw}p");
    netdev::create_veth_pair(&gw, &gw_peer, Some(9000)).expect("gateway pair");
    lab.links.push(gw.clone());
    netdev::set_mtu(&gw_peer, 3000).expect("mtu gateway peer");
    netdev::set_up(&gw).expect("gw up");
    netdev::set_up(&gw_peer).expect("gw peer up");
    let sw = Switch::start(
        SwitchConfig {
            poll_mode: PollMode::Interrupt,
            umem_sharing: UmemSharing::per_thread_unique(),
            ..SwitchConfig::default()
        },
        Arc::new(Pipeline::new()),
    )
    .expect("start");
    assert_eq!(sw.gro_max(), 0, "no port");
    sw.add_port(afxdp(&h_a, 1)).expect("a");
    assert_eq!(sw.gro_max(), 9014, "a at 9000");
    sw.add_port(afxdp(&gw, 2)).expect("gw");
    assert_eq!(sw.gro_max(), 3014, "the gateway's peer at 3000");
    // The host raises its end of the gateway after the port exists (as
    // the agent does): seen at the next port change.
    netdev::set_mtu(&gw_peer, 6000).expect("mtu gateway peer 6000");
    sw.add_port(afxdp(&h_b, 3)).expect("b");
    assert_eq!(sw.gro_max(), 1514, "b at 1500");
    sw.del_port(&h_b).expect("del b");
    assert_eq!(sw.gro_max(), 6014, "a and the gateway's peer, now at 6000");
    sw.del_port(&gw).expect("del gw");
    assert_eq!(sw.gro_max(), 9014, "a alone again");
    netdev::set_mtu(&h_a, 4000).expect("mtu a 4000");
    assert_eq!(
        sw.gro_max(),
        9014,
        "an MTU change alone is seen at the next refresh"
    );
    sw.refresh_gro_max();
    assert_eq!(sw.gro_max(), 4014, "after the refresh");
    sw.shutdown();
}
