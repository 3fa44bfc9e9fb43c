//! End to end, the UMEM a datapath thread's ports share (or the UMEMs,
//! with `--umems-per-thread`: each port on one of them).
//!
//! 1. Memory does not grow with ports: two switchds side by side, one
//!    sharing (the default) and one with `--umem-sharing port`, each gets
//!    the same 12 pod ports; the sharing one's resident memory grows by
//!    the ports' rings only, the other's by one UMEM per port (which shows
//!    the measurement sees UMEMs at all). The last two ports, added after
//!    ten idle ones, still receive (idle ports do not hoard frames).
//! 2. The frames of a closed port come back: while pod1 pings pod2, pod3's
//!    port is added (with traffic) and deleted 16 times on a UMEM far too
//!    small to lose its fill ring each time; pod3 is reachable each time,
//!    pod1 <-> pod2 loses (almost) nothing, and once every port is gone
//!    every frame of the UMEMs is free again. With two UMEMs per thread:
//!    pod1 and pod3 share one, pod2 has the other, so pod3's frames come
//!    back to the right one.
//! 3. The anchor device exists while switchd runs and is gone after it
//!    stops.
//!
//! Flows: `examples/switch-three-pods.flows`.

mod common;

use std::time::{Duration, Instant};

use common::*;

const FLOWS: &str = "switch-three-pods.flows";
const PORTS: usize = 12;
/// UMEM frames of every switchd here (8 MiB per UMEM).
const FRAMES: &str = "2048";
const UMEM_BYTES: u64 = 2048 * 4096;

/// Held by the tests that push TCP at full speed and may lose nothing to
/// an empty fill ring: run side by side (the test harness's threads) on a
/// 2-CPU machine, one would starve the other's switchd.
static FULL_SPEED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn full_speed() -> std::sync::MutexGuard<'static, ()> {
    FULL_SPEED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("switchd status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// Starts a switchd in a new node with `extra` arguments, makes `PORTS`
/// pods, and returns the resident memory growth from adding their ports
/// (with everything kept alive until the caller drops it).
fn rss_growth(extra: &[&str]) -> (u64, Netns, Vec<Netns>, Switchd) {
    let node = Netns::new("node");
    let mut args = vec!["--umem-frames", FRAMES];
    args.extend_from_slice(extra);
    let sw = Switchd::start_with(&node, &args);
    let mut pods = Vec::new();
    for i in 0..PORTS {
        let pod = Netns::new("pod");
        make_pod(
            &node,
            &pod,
            &format!("q{i}"),
            &format!("10.11.0.{}/24", i + 1),
            &format!("02:00:0a:0b:00:{:02x}", i + 1),
            1500,
        );
        pods.push(pod);
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_bytes(sw.pid());
    for i in 0..PORTS {
        sw.add_port(&format!("q{i}"), i as u32 + 1);
    }
    std::thread::sleep(Duration::from_millis(200));
    let after = rss_bytes(sw.pid());
    (after.saturating_sub(before), node, pods, sw)
}

#[test]
fn e2e_umem_sharing() {
    skip_unless_capable!();

    // 1. Memory.
    let (shared, _n1, pods1, sw1) = rss_growth(&[]);
    let (own, _n2, _p2, _sw2) = rss_growth(&["--umem-sharing", "port"]);
    eprintln!(
        "resident memory for {PORTS} ports: shared UMEM +{:.1} MiB, a UMEM per port +{:.1} MiB",
        shared as f64 / (1 << 20) as f64,
        own as f64 / (1 << 20) as f64
    );
    assert!(
        own >= UMEM_BYTES * PORTS as u64 * 9 / 10,
        "a UMEM per port should cost {PORTS} x 8 MiB: +{own} bytes"
    );
    assert!(
        shared < UMEM_BYTES * 2,
        "{PORTS} ports on a shared UMEM should cost their rings only: +{shared} bytes"
    );
    let (frames, _) = umem_stats(&sw1);
    assert_eq!(frames, 2048, "one shared UMEM (one thread)");
    assert!(
        sw1.port_json("q0").get("umem").is_none(),
        "no UMEM index where a thread has one"
    );
    // The last two ports, added after ten idle ones, still get frames to
    // receive into: the idle ports hold only their minimum.
    sw1.ctl_ok(&["add-flow", "priority=10,in_port=11,actions=output:12"]);
    sw1.ctl_ok(&["add-flow", "priority=10,in_port=12,actions=output:11"]);
    let p = ping_until_up(&pods1[10], "10.11.0.12", 5);
    assert!(
        p.ok,
        "pods on the last ports of a shared UMEM ({:?} frames/free) cannot talk:\n{}",
        umem_stats(&sw1),
        p.output
    );
    drop(sw1);

    // 2. Frames of closed ports come back.
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let pod3 = Netns::new("pod3");
    let mut sw = Switchd::start_with(&node, &["--umem-frames", "256", "--umems-per-thread", "2"]);
    let anchor = node.exec(&["ip", "-d", "link", "show", "oxvs-umem"]);
    assert!(
        anchor.status.success(),
        "the anchor device exists while switchd runs: {anchor:?}"
    );
    let shown = String::from_utf8_lossy(&anchor.stdout);
    assert!(
        shown.contains("numrxqueues 2 "),
        "one anchor queue per UMEM (one thread, two UMEMs):
{shown}"
    );
    for (pod, ifname, ip, mac) in [
        (&pod1, "p1", "10.10.0.1/24", "02:00:0a:0a:00:01"),
        (&pod2, "p2", "10.10.0.2/24", "02:00:0a:0a:00:02"),
        (&pod3, "p3", "10.10.0.3/24", "02:00:0a:0a:00:03"),
    ] {
        make_pod(&node, pod, ifname, ip, mac, 1500);
    }
    sw.add_port("p1", 1);
    sw.add_port("p2", 2);
    sw.add_flows(&example(FLOWS));
    let p = ping_until_up(&pod1, "10.10.0.2", 5);
    assert!(p.ok, "pod1 -> pod2 never answered:\n{}", p.output);
    std::thread::sleep(Duration::from_millis(300));
    let (total, free_before) = umem_stats(&sw);
    assert_eq!(total, 2 * 256, "two shared UMEMs");
    // Each on the UMEM with the fewest ports, as dump-ports says.
    let umem = |port: &str| sw.port_json(port)["umem"].as_u64();
    assert_eq!((umem("p1"), umem("p2")), (Some(0), Some(1)));

    let mut bg = pod1.spawn(&[
        "ping",
        "-n",
        "-c",
        "250",
        "-i",
        "0.02",
        "-W",
        "1",
        "10.10.0.2",
    ]);
    for round in 0..16 {
        sw.add_port("p3", 3);
        assert_eq!(umem("p3"), Some(0), "p3 beside p1 (round {round})");
        let p = ping_until_up(&pod3, "10.10.0.1", 3);
        assert!(
            p.ok,
            "pod3 -> pod1 while attached (round {round}, {:?} of the UMEM free):\n{}",
            umem_stats(&sw),
            p.output
        );
        sw.ctl_ok(&["del-port", "p3"]);
    }
    let (ok, out, _) = bg.wait(Duration::from_secs(30));
    let p = parse_ping(ok, out);
    assert!(
        p.received + 5 >= p.transmitted,
        "pod1 -> pod2 during the churn lost more than 5:\n{}",
        p.output
    );

    // With no port left, every frame is back (the last ports' frames come
    // back once their sockets are closed, on another thread: wait).
    sw.ctl_ok(&["del-port", "p1"]);
    sw.ctl_ok(&["del-port", "p2"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let free_after = loop {
        let (_, free) = umem_stats(&sw);
        if free == total || Instant::now() > deadline {
            break free;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        free_after, total,
        "free frames with no port left, after 16 add/delete rounds of a port \
         ({free_before} free with two ports before)"
    );

    // 3. The anchor goes with switchd.
    assert!(sw.stop(), "switchd exits on SIGTERM");
    let anchor = node.exec(&["ip", "link", "show", "oxvs-umem"]);
    assert!(
        !anchor.status.success(),
        "the anchor device is deleted when switchd stops"
    );
}

/// Every dropped frame is counted once in `drop=` and once under its
/// reason: a pod bursts UDP at a port whose fill ring (on a 256-frame
/// UMEM) cannot hold the burst.
#[test]
fn e2e_port_drops_by_reason() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let sw = Switchd::start_with(&node, &["--umem-frames", "256"]);
    make_pod(
        &node,
        &pod1,
        "p1",
        "10.10.0.1/24",
        "02:00:0a:0a:00:01",
        1500,
    );
    make_pod(
        &node,
        &pod2,
        "p2",
        "10.10.0.2/24",
        "02:00:0a:0a:00:02",
        1500,
    );
    sw.add_port("p1", 1);
    sw.add_port("p2", 2);
    sw.add_flows(&example(FLOWS));
    let p = ping_until_up(&pod1, "10.10.0.2", 5);
    assert!(p.ok, "pod1 -> pod2 never answered:\n{}", p.output);
    // 20 bursts of 2000 datagrams, as fast as the socket sends them.
    pod1.must(&[
        "python3",
        "-c",
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)\n\
         for _ in range(20):\n\
         \x20   for _ in range(2000):\n\
         \x20       try: s.sendto(b'x' * 64, ('10.10.0.2', 9))\n\
         \x20       except OSError: pass\n",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let v: serde_json::Value =
        serde_json::from_str(&sw.ctl_ok(&["--json", "dump-ports"])).expect("dump-ports JSON");
    let port1 = v["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["ofport"] == 1))
        .expect("port 1")
        .clone();
    let st = &port1["stats"];
    let n = |k: &str| st[k].as_u64().unwrap_or_else(|| panic!("{k} in {st}"));
    eprintln!("port 1 after the burst: {st}");
    assert!(
        n("rx_dropped") > 0,
        "a 40000-datagram burst into a 64-128-frame fill ring drops some: {st}"
    );
    assert_eq!(
        n("rx_dropped"),
        n("rx_ring_full") + n("rx_fill_empty") + n("rx_other"),
        "each dropped frame counted once, under one reason: {st}"
    );
    assert_eq!(
        n("tx_dropped"),
        n("tx_no_frame") + n("tx_ring_full"),
        "each dropped frame to send counted once, under one reason: {st}"
    );
    let text = sw.ctl_ok(&["dump-ports"]);
    assert!(
        text.contains("drops: rx ring full="),
        "dump-ports shows the reasons of a port that dropped:\n{text}"
    );
    // ... and, as it lost frames to an empty fill ring, what that ring is
    // topped up to.
    assert!(
        n("rx_fill_target") > 0 && text.contains("fill ring: "),
        "the fill ring's size of a port that lost frames to it empty: {st}\n{text}"
    );
}

/// A port idle for seconds keeps its share of the UMEM on its fill ring:
/// pods at MTU 65535 send TCP as fast as they can (64 KiB segments, 17
/// frames each), go quiet for longer than it takes an idle port's fill
/// ring to decay (a quarter per second), and send again. Nothing of the
/// second bursts is lost to an empty fill ring. (The ring used to decay
/// to 64 frames, and the first 4 MiB a pod's TCP sends after a pause
/// drained it before the datapath thread grew it back: tens of 64 KiB
/// segments lost per connection, `docs/benchmarks.md`, "An idle pod's
/// first burst".)
#[test]
fn e2e_idle_port_keeps_its_share() {
    skip_unless_capable!();
    let _one_at_a_time = full_speed();
    let node = Netns::new("node");
    // The default UMEM (16384 frames): four ports, a share of 3072 each.
    let sw = Switchd::start_with(&node, &[]);
    let pods = flooded_pods(&sw, &node, 4, "q", "10.12.0", "02:00:0a:0c:00", 65535);
    let sink = &pods[3];
    for pod in &pods[..2] {
        let p = ping_until_up(pod, "10.12.0.4", 5);
        assert!(p.ok, "{} -> pod4 never answered:\n{}", pod.name, p.output);
    }
    let fill_empty = |port: &str| rx_fill_empty(&sw, port);

    // Two pods busy: their ports grow.
    for pod in &pods[..2] {
        blast(pod, sink, "10.12.0.4", 5001, "2");
    }
    // Quiet for longer than a decay from a full ring to 64 frames (15 s).
    std::thread::sleep(Duration::from_secs(16));
    for (pod, port) in pods[..2].iter().zip(["q1", "q2"]) {
        let before = fill_empty(port);
        let got = blast(pod, sink, "10.12.0.4", 5002, "2");
        let lost = fill_empty(port) - before;
        eprintln!(
            "{}: {got} bytes after 16 s idle, {lost} lost to an empty fill ring",
            pod.name
        );
        assert!(
            got > 100 << 20,
            "{}: only {got} bytes of TCP in 2 s: the burst tested nothing",
            pod.name
        );
        assert_eq!(
            lost, 0,
            "{}: the first burst after 16 s idle lost {lost} packets to an empty fill ring",
            pod.name
        );
    }
}

/// A fresh pod's first burst: the first two ports of a switchd start with
/// a deep fill ring (`afxdp::start_fill`), so four TCP streams at once
/// from a pod at MTU 65535, right after its port was added, lose nothing
/// to an empty fill ring. (Ports used to start with 512 frames: such a
/// burst drained them before the datapath thread grew them, 12-200 64 KiB
/// segments lost in `e2e --streams 4`, `docs/benchmarks.md`, "A fresh
/// pod's first burst".)
#[test]
fn e2e_fresh_pods_first_burst() {
    skip_unless_capable!();
    let _one_at_a_time = full_speed();
    let node = Netns::new("node");
    let sw = Switchd::start_with(&node, &[]);
    let pods = flooded_pods(&sw, &node, 2, "f", "10.13.0", "02:00:0a:0d:00", 65535);
    let (src, sink) = (&pods[0], &pods[1]);
    let p = ping_until_up(src, "10.13.0.2", 5);
    assert!(p.ok, "pod1 -> pod2 never answered:\n{}", p.output);
    let before = rx_fill_empty(&sw, "f1");
    let got = blasts(src, sink, "10.13.0.2", &[5101, 5102, 5103, 5104], "2");
    let lost = rx_fill_empty(&sw, "f1") - before;
    eprintln!("four fresh streams: {got} bytes in 2 s, {lost} lost to an empty fill ring");
    assert!(
        got > 100 << 20,
        "only {got} bytes of TCP in 2 s: the burst tested nothing"
    );
    assert_eq!(
        lost, 0,
        "a fresh pod's first burst lost {lost} packets to its empty fill ring"
    );
}

/// UMEMs a thread would pin beyond 4 GiB in all are refused at start,
/// naming both flags, before anything is mapped.
#[test]
fn e2e_too_many_umem_frames_refused() {
    skip_unless_capable!();
    let sock = format!("/tmp/{}.sock", unique("sw"));
    let out = std::process::Command::new(switchd_bin())
        .args([
            "--socket",
            &sock,
            "--umems-per-thread",
            "3",
            "--umem-frames",
            "1048576",
        ])
        .output()
        .expect("run oxvs-switchd");
    let _ = std::fs::remove_file(&sock);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("--umems-per-thread 3 x --umem-frames 1048576 is 3145728 frames"),
        "refused with both flags named: {err}"
    );
}
