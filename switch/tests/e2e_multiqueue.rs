//! End to end, a port on an interface with several receive queues (what a
//! NIC with RSS is; here a veth pair made with 4 queues a side, where the
//! sending side picks a queue per socket by its flow hash, as RSS does per
//! flow).
//!
//! 1. switchd (`--threads 2 --datapath-cpus 1,0`: each thread pinned to
//!    its CPU) serves every queue by default: `dump-ports`
//!    lists 4 queues on both threads. From pod1 (behind the 4-queue
//!    port), 64 UDP sockets exchange 20 rounds of datagrams with pod2
//!    through the switch: every datagram and every answer arrives (none
//!    lost in the switch), every queue received some, and the queues'
//!    counters add up to the port's. TCP both ways arrives intact.
//! 2. `--n-rxq` above the interface's queues or 0 is refused with a
//!    reason; `--n-rxq 2` serves queues 0 and 1; deleting the port
//!    detaches the XDP program (no `xdp` left on the interface) and it
//!    can be added again.
//!
//! Flows: `examples/switch-three-pods.flows` (port 3 absent).

mod common;

use common::*;

const QUEUES: usize = 4;
const SOCKETS: usize = 64;
const ROUNDS: usize = 20;

/// Sends ROUNDS rounds: each of SOCKETS sockets sends one numbered
/// datagram, then waits (up to 2 s) for every answer of the round; prints
/// "sent N answered M".
const CLIENT: &str = r#"
import select, socket, sys, time
addr, port, nsock, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
socks = []
for i in range(nsock):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    s.connect((addr, port))
    socks.append(s)
sent = answered = 0
for r in range(rounds):
    for i, s in enumerate(socks):
        s.send(f"{i}:{r}".encode()); sent += 1
    want = {f"{i}:{r}" for i in range(nsock)}
    deadline = time.time() + 2
    while want and time.time() < deadline:
        ready, _, _ = select.select(socks, [], [], 0.2)
        for s in ready:
            try:
                want.discard(s.recv(100).decode().removeprefix("echo:"))
                answered += 1
            except BlockingIOError:
                pass
print(f"sent {sent} answered {answered}", flush=True)
"#;

/// Answers every datagram with "echo:" + data until killed.
const ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.bind(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
while True:
    data, peer = s.recvfrom(100)
    s.sendto(b"echo:" + data, peer)
"#;

/// `Cpus_allowed_list` of the thread named `name` of process `pid`.
fn cpus_allowed(pid: u32, name: &str) -> Option<String> {
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_owned());
        }
    }
    None
}

/// (queue, thread, rx_packets) of each queue the port lists.
fn queues(port: &serde_json::Value) -> Vec<(u64, u64, u64)> {
    port.get("queues")
        .and_then(|q| q.as_array())
        .map(|qs| {
            qs.iter()
                .map(|q| {
                    let n = |k: &str| q.get(k).and_then(|x| x.as_u64()).unwrap_or(u64::MAX);
                    let rx = q
                        .get("stats")
                        .and_then(|s| s.get("rx_packets"))
                        .and_then(|x| x.as_u64())
                        .unwrap_or(u64::MAX);
                    (n("queue"), n("thread"), rx)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A veth pair with QUEUES queues each way (native XDP on a veth needs
/// as many receive queues as its peer has transmit queues): `name` in
/// `node`, up, and `eth0` in `pod`.
fn queues_veth(node: &Netns, pod: &Netns, name: &str) {
    let q = QUEUES.to_string();
    must(&[
        "ip",
        "-n",
        &node.name,
        "link",
        "add",
        name,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "netns",
        &pod.name,
    ]);
    node.must(&["ip", "link", "set", name, "up"]);
}

#[test]
fn e2e_multiqueue_port() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let sw = Switchd::start_with(&node, &["--threads", "2", "--datapath-cpus", "1,0"]);
    sw.add_flows(&example("switch-three-pods.flows"));
    // Thread i runs on the i-th CPU of --datapath-cpus.
    for (thread, cpu) in [("oxvs-dp0", "1"), ("oxvs-dp1", "0")] {
        assert_eq!(
            cpus_allowed(sw.pid(), thread).as_deref(),
            Some(cpu),
            "{thread} pinned to CPU {cpu}"
        );
    }

    // pod1 behind a 4-queue veth pair.
    queues_veth(&node, &pod1, "mq1");
    pod1.sh(
        "ip link set eth0 address 02:00:0a:0a:00:01 && ip addr add 10.10.0.1/24 dev eth0 \
         && ip link set eth0 up",
    );
    sw.add_port("mq1", 1);
    add_pod(
        &sw,
        &node,
        &pod2,
        "mq2",
        2,
        "10.10.0.2/24",
        "02:00:0a:0a:00:02",
        1500,
    );

    // 1. Every queue served, spread over both threads.
    let port = sw.port_json("mq1");
    let qs = queues(&port);
    assert_eq!(
        qs.iter().map(|q| q.0).collect::<Vec<_>>(),
        (0..QUEUES as u64).collect::<Vec<_>>(),
        "a socket per receive queue: {port}"
    );
    let mut threads: Vec<u64> = qs.iter().map(|q| q.1).collect();
    threads.sort_unstable();
    threads.dedup();
    assert_eq!(threads, vec![0, 1], "the queues on both threads: {port}");

    let ping = ping_until_up(&pod1, "10.10.0.2", 10);
    assert!(ping.received > 0, "pod1 -> pod2: {}", ping.output);

    let mut echo = pod2.spawn(&["python3", "-c", ECHO, "9000"]);
    echo.wait_listening("UDP echo").expect("echo");
    let before = sw.port_json("mq1");
    let out = pod1.must(&[
        "python3",
        "-c",
        CLIENT,
        "10.10.0.2",
        "9000",
        &SOCKETS.to_string(),
        &ROUNDS.to_string(),
    ]);
    let total = SOCKETS * ROUNDS;
    assert_eq!(
        out.trim(),
        format!("sent {total} answered {total}"),
        "every datagram through the 4-queue port and back\n{}",
        sw.ctl_ok(&["dump-ports"])
    );
    let after = sw.port_json("mq1");
    let (qb, qa) = (queues(&before), queues(&after));
    eprintln!("queue rx packets before {qb:?} after {qa:?}");
    for (b, a) in qb.iter().zip(&qa) {
        assert!(
            a.2 > b.2,
            "queue {} received nothing from {SOCKETS} sockets: {after}",
            a.0
        );
    }
    let port_rx = after["stats"]["rx_packets"].as_u64().unwrap_or(0);
    assert_eq!(
        qa.iter().map(|q| q.2).sum::<u64>(),
        port_rx,
        "the queues add up to the port: {after}"
    );
    let drops = after["stats"]["rx_dropped"].as_u64().unwrap_or(u64::MAX)
        + after["stats"]["tx_dropped"].as_u64().unwrap_or(u64::MAX);
    assert_eq!(drops, 0, "no drop on the 4-queue port: {after}");
    drop(echo);

    tcp_transfer(&pod1, &pod2, "10.10.0.2", 9100, 8 << 20);
    tcp_transfer(&pod2, &pod1, "10.10.0.1", 9101, 8 << 20);

    let metrics = sw.ctl_ok(&["dump-ports"]);
    assert!(
        metrics.contains("queue 3 (thread"),
        "dump-ports shows the queues: {metrics}"
    );

    // 2. n_rxq.
    sw.ctl_ok(&["del-port", "mq1"]);
    for (n, why) in [("5", "has 4 receive queues"), ("0", "at least 1")] {
        let out = sw.ctl(&["add-port", "mq1", "--ofport", "1", "--n-rxq", n]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "--n-rxq {n} refused ({why}): {err}"
        );
    }
    sw.ctl_ok(&["add-port", "mq1", "--ofport", "1", "--n-rxq", "2"]);
    let port = sw.port_json("mq1");
    assert_eq!(
        queues(&port).iter().map(|q| q.0).collect::<Vec<_>>(),
        vec![0, 1],
        "--n-rxq 2: {port}"
    );
    sw.ctl_ok(&["del-port", "mq1"]);
    let link = node.must(&["ip", "-d", "link", "show", "mq1"]);
    assert!(
        !link.contains("prog/xdp"),
        "the XDP program is detached with the port's last queue: {link}"
    );
    sw.add_port("mq1", 1);
    assert_eq!(queues(&sw.port_json("mq1")).len(), QUEUES);
    let ping = ping_until_up(&pod1, "10.10.0.2", 10);
    assert!(ping.received > 0, "pod1 -> pod2 again: {}", ping.output);
}

/// CPU time (user + system, in clock ticks) of process `pid`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0)
}

/// Adaptive polling (`--poll-linger-us`): traffic passes, and once it
/// stops the switch sleeps again (a thread that kept spinning would burn
/// a whole core in the idle second measured).
#[test]
fn e2e_poll_linger_then_sleep() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let sw = Switchd::start_with(&node, &["--poll-linger-us", "500"]);
    sw.add_flows(&example("switch-three-pods.flows"));
    add_pod(
        &sw,
        &node,
        &pod1,
        "pl1",
        1,
        "10.10.0.1/24",
        "02:00:0a:0a:00:01",
        1500,
    );
    add_pod(
        &sw,
        &node,
        &pod2,
        "pl2",
        2,
        "10.10.0.2/24",
        "02:00:0a:0a:00:02",
        1500,
    );
    let up = ping_until_up(&pod1, "10.10.0.2", 10);
    assert!(up.received > 0, "{}", up.output);
    let p = ping(&pod1, "10.10.0.2", 50, "0.01", &[]);
    assert_eq!(p.received, 50, "{}", p.output);
    tcp_transfer(&pod1, &pod2, "10.10.0.2", 9200, 4 << 20);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let t0 = cpu_ticks(sw.pid());
    std::thread::sleep(std::time::Duration::from_secs(1));
    let used = cpu_ticks(sw.pid()) - t0;
    // 100 ticks a second on one core: spinning would take ~100.
    assert!(used <= 10, "idle switch used {used} ticks in 1 s");
}

/// `--datapath-cpus` naming a CPU this process cannot run on is refused at
/// start, naming the CPU.
#[test]
fn e2e_datapath_cpus_bad_cpu_refused() {
    skip_unless_capable!();
    let sock = format!("/tmp/{}.sock", unique("sw"));
    let out = std::process::Command::new(switchd_bin())
        .args(["--socket", &sock, "--datapath-cpus", "0,4095"])
        .output()
        .expect("run oxvs-switchd");
    let _ = std::fs::remove_file(&sock);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--datapath-cpus: CPU 4095"),
        "refused with the CPU named: {err}"
    );
}

/// Sends one datagram every `gap` seconds to ADDR:PORT, cycling over 64
/// source ports (so the flows spread over every receive queue), until
/// killed.
const STEADY: &str = r#"
import socket, sys, time
addr, port, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(64)]
print("listening", flush=True)
i = 0
while True:
    socks[i % 64].sendto(b"x", (addr, port))
    i += 1
    time.sleep(gap)
"#;

/// A port added while its pod already sends (a steady ~2000 packets a
/// second over every queue) loses nothing to an empty fill ring: the
/// switch's program redirects to a queue's socket only once the thread
/// that owns it has filled its fill ring (a packet in between once cost
/// this suite a drop).
#[test]
fn e2e_port_added_under_traffic_no_fill_ring_drop() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let sw = Switchd::start_with(&node, &["--threads", "2"]);
    sw.add_flows(&example("switch-three-pods.flows"));
    queues_veth(&node, &pod1, "fq1");
    pod1.sh(
        "ip link set eth0 address 02:00:0a:0a:00:01 && ip addr add 10.10.0.1/24 dev eth0 \
         && ip link set eth0 up && ip neigh replace 10.10.0.2 lladdr 02:00:0a:0a:00:02 dev eth0",
    );
    let mut sender = pod1.spawn(&["python3", "-c", STEADY, "10.10.0.2", "9300", "0.0005"]);
    sender.wait_listening("steady sender").expect("sender");
    for round in 0..3 {
        sw.add_port("fq1", 1);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let port = sw.port_json("fq1");
        let rx = port["stats"]["rx_packets"].as_u64().unwrap_or(0);
        let empty = port["stats"]["rx_fill_empty"].as_u64().unwrap_or(u64::MAX);
        assert!(
            rx > 0,
            "round {round}: the pod's packets reach the port: {port}"
        );
        assert_eq!(
            empty, 0,
            "round {round}: nothing lost to an empty fill ring: {port}"
        );
        sw.ctl_ok(&["del-port", "fq1"]);
    }
    drop(sender);
}
