//! Wire interoperability of [`VxlanPort`] with the Linux kernel's `vxlan`
//! device (root only).
//!
//! Each test builds two fresh network namespaces, A and B, joined by a veth
//! pair (the "underlay", 192.0.2.0/24 inside the namespaces only). B holds a
//! kernel `vxlan` device (`vx0`, VNI 42, remote A, 10.99.0.2/24); A holds
//! our port, opened on a thread that entered A with `setns` (it changes only
//! the calling thread; the sockets stay in A wherever they are used after).
//! The [`Lab`] guard deletes both namespaces — and with them the veth and
//! `vx0` — also when a test fails.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use oxvs_pipeline::datapath::TunnelMeta;
use oxvs_switch::vxlan::{TxError, VxlanPort};

const A_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const INNER_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const VX0_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const INNER_A: [u8; 4] = [10, 99, 0, 1];
const INNER_B: [u8; 4] = [10, 99, 0, 2];
const VNI: u64 = 42;

/// `ip <args>`, which must succeed.
fn ip(args: &[&str]) {
    let mut cmd = vec!["ip"];
    cmd.extend_from_slice(args);
    common::must(&cmd);
}

/// Two namespaces joined by a veth pair, with a kernel `vxlan` in B.
struct Lab {
    a: String,
    b: String,
}

impl Lab {
    fn new(tag: &str) -> Lab {
        let pid = std::process::id();
        let lab = Lab {
            a: format!("oxvs-vx{tag}a-{pid}"),
            b: format!("oxvs-vx{tag}b-{pid}"),
        };
        let (a, b) = (lab.a.as_str(), lab.b.as_str());
        let (va, vb) = (format!("vx{tag}a{pid}"), format!("vx{tag}b{pid}"));
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&[
            "link", "add", &va, "netns", a, "type", "veth", "peer", "name", &vb, "netns", b,
        ]);
        for (ns, dev, addr) in [(a, &va, "192.0.2.1/24"), (b, &vb, "192.0.2.2/24")] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        ip(&[
            "-n",
            b,
            "link",
            "add",
            "vx0",
            "type",
            "vxlan",
            "id",
            "42",
            "remote",
            "192.0.2.1",
            "local",
            "192.0.2.2",
            "dstport",
            "4789",
            "dev",
            &vb,
        ]);
        ip(&[
            "-n",
            b,
            "link",
            "set",
            "vx0",
            "address",
            "02:00:00:00:00:02",
        ]);
        ip(&["-n", b, "link", "set", "vx0", "addrgenmode", "none"]);
        ip(&["-n", b, "addr", "add", "10.99.0.2/24", "dev", "vx0"]);
        ip(&["-n", b, "link", "set", "vx0", "up"]);
        ip(&[
            "-n",
            b,
            "neigh",
            "add",
            "10.99.0.1",
            "lladdr",
            "02:00:00:00:00:01",
            "dev",
            "vx0",
            "nud",
            "permanent",
        ]);
        lab
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Every step runs, whatever failed before.
        for ns in [&self.a, &self.b] {
            let ok = common::run(&["ip", "netns", "del", ns]).status.success();
            if !ok {
                eprintln!("cleanup: could not delete netns {ns}");
            }
        }
    }
}

/// Runs `f` on a fresh thread inside namespace `ns`.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread panicked")
}

/// An inner Ethernet frame from 10.99.0.1 to vx0 (10.99.0.2): ICMP echo
/// request with `ident`, padded to `frame_len` bytes.
fn echo_request(ident: u16, frame_len: usize, df: bool) -> Vec<u8> {
    let mut f = vec![0u8; frame_len];
    f[0..6].copy_from_slice(&VX0_MAC);
    f[6..12].copy_from_slice(&INNER_A_MAC);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = frame_len - 14;
    let ip = &mut f[14..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    ip[6] = if df { 0x40 } else { 0 };
    ip[8] = 64;
    ip[9] = 1;
    ip[12..16].copy_from_slice(&INNER_A);
    ip[16..20].copy_from_slice(&INNER_B);
    let c = checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let icmp = &mut ip[20..];
    icmp[0] = 8;
    icmp[4..6].copy_from_slice(&ident.to_be_bytes());
    icmp[6..8].copy_from_slice(&1u16.to_be_bytes());
    for (i, b) in icmp[8..].iter_mut().enumerate() {
        *b = i as u8;
    }
    let c = checksum(icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    f
}

fn checksum(data: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// What we learn from one received inner frame.
#[derive(Debug, Clone)]
struct Seen {
    frame: Vec<u8>,
    meta: TunnelMeta,
}

/// Receives until `done` says so or `timeout` passes.
fn receive_until(
    port: &mut VxlanPort,
    timeout: Duration,
    mut done: impl FnMut(&[Seen]) -> bool,
) -> Vec<Seen> {
    let mut seen = Vec::new();
    let start = Instant::now();
    while start.elapsed() < timeout {
        if port.recv_batch(64) > 0 {
            for (frame, meta, _) in port.rx_packets() {
                seen.push(Seen {
                    frame: frame.to_vec(),
                    meta,
                });
            }
            if done(&seen) {
                break;
            }
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    seen
}

/// The inner echo reply (or its first fragment) with `ident`, if `s` is one.
fn is_echo_reply(s: &Seen, ident: u16) -> bool {
    let f = &s.frame;
    f.len() >= 42
        && f[12..14] == [0x08, 0x00]
        && f[14 + 9] == 1
        && f[14 + 6] & 0x1f == 0
        && f[14 + 7] == 0
        && f[34] == 0
        && f[38..40] == ident.to_be_bytes()
}

#[test]
fn kernel_vxlan_answers_our_packets() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root (network namespaces)");
        return;
    }
    let lab = Lab::new("e");
    let mut port = in_netns(&lab.a, || VxlanPort::open(A_IP, 4789, None)).expect("open port in A");
    assert_eq!(port.mode(), "udp-socket");
    // The veth's MTU; it is not visible in this /sys, so the default applies.
    assert_eq!(port.underlay_mtu(), 1500);
    let meta = TunnelMeta::v4(VNI, u32::from(A_IP), u32::from(B_IP));

    // 1. A ping through the tunnel: the kernel decapsulates, answers, and
    //    encapsulates the reply back to us.
    port.send(&echo_request(0x4242, 98, true), meta)
        .expect("queue echo");
    assert_eq!(port.flush(), 1);
    let seen = receive_until(&mut port, Duration::from_secs(3), |s| {
        s.iter().any(|x| is_echo_reply(x, 0x4242))
    });
    let reply = seen
        .iter()
        .find(|x| is_echo_reply(x, 0x4242))
        .unwrap_or_else(|| panic!("no echo reply; got {seen:?}; stats {:?}", port.stats()));
    assert_eq!(reply.meta.tun_id, VNI);
    assert_eq!(reply.meta.src, B_IP);
    assert_eq!(reply.meta.dst, A_IP);
    assert_eq!(&reply.frame[0..6], &INNER_A_MAC);
    assert_eq!(&reply.frame[6..12], &VX0_MAC);
    assert_eq!(reply.frame.len(), 98);
    assert_eq!(&reply.frame[42..], &echo_request(0x4242, 98, true)[42..]);

    // 2. Too big with DF: refused with the inner MTU, nothing sent.
    let before = port.stats();
    let big = echo_request(0x4343, 1514, true);
    assert_eq!(port.send(&big, meta), Err(TxError::TooBig { mtu: 1450 }));
    assert_eq!(port.stats().tx_dropped, before.tx_dropped + 1);
    // Exactly at the limit it goes (1464 + 36 = 1500).
    port.send(&echo_request(0x4444, 1464, true), meta)
        .expect("fits");
    assert_eq!(port.flush(), 1);
    let seen = receive_until(&mut port, Duration::from_secs(3), |s| {
        s.iter().any(|x| is_echo_reply(x, 0x4444))
    });
    assert!(
        seen.iter().any(|x| is_echo_reply(x, 0x4444)),
        "no reply to the 1464-byte frame"
    );

    // 3. Too big without DF: we fragment the outer packet, the kernel
    //    reassembles it and answers (its reply, larger than vx0's MTU 1450,
    //    comes back as inner fragments).
    let big = echo_request(0x4545, 1514, false);
    port.send(&big, meta).expect("fragmentable");
    assert_eq!(port.flush(), 1);
    let seen = receive_until(&mut port, Duration::from_secs(3), |s| {
        s.iter().any(|x| is_echo_reply(x, 0x4545))
    });
    let first = seen
        .iter()
        .find(|x| is_echo_reply(x, 0x4545))
        .unwrap_or_else(|| panic!("no reply to the fragmented frame; stats {:?}", port.stats()));
    assert_eq!(
        first.frame[14 + 6] & 0x20,
        0x20,
        "inner reply fragmented by vx0"
    );

    // 4. No destination.
    let no_dst = TunnelMeta::v4(VNI, u32::from(A_IP), 0);
    assert_eq!(port.send(&big, no_dst), Err(TxError::NoDestination));

    let st = port.stats();
    assert_eq!(st.tx_packets, 3);
    assert_eq!(st.tx_errors, 0);
    assert!(st.rx_packets >= 3);
    assert_eq!(st.rx_errors, 0);
    drop(port);
    drop(lab);
}

#[test]
fn other_underlay_traffic_stays_with_the_kernel() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root (network namespaces)");
        return;
    }
    let lab = Lab::new("k");
    let (mut port, other) = in_netns(&lab.a, || {
        let port = VxlanPort::open(A_IP, 4789, Some(1500)).expect("open port in A");
        let other = UdpSocket::bind((A_IP, 5555)).expect("bind 5555 in A");
        (port, other)
    });
    let sender = in_netns(&lab.b, || UdpSocket::bind((B_IP, 0)).expect("bind in B"));

    // A datagram to another port reaches the ordinary socket, not us.
    sender
        .send_to(b"hello underlay", SocketAddrV4::new(A_IP, 5555))
        .unwrap();
    other
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = other.recv_from(&mut buf).expect("kernel delivers it");
    assert_eq!(&buf[..n], b"hello underlay");
    assert_eq!(from.ip(), std::net::IpAddr::V4(B_IP));

    // To the VXLAN port: a malformed datagram is counted and skipped; a
    // hand-made valid one (VNI 77) comes through with its metadata.
    sender
        .send_to(&[0u8; 40], SocketAddrV4::new(A_IP, 4789))
        .unwrap();
    let mut valid = vec![0x08, 0, 0, 0, 0, 0, 77, 0];
    let inner = echo_request(7, 60, true);
    valid.extend_from_slice(&inner);
    sender
        .send_to(&valid, SocketAddrV4::new(A_IP, 4789))
        .unwrap();
    let seen = receive_until(&mut port, Duration::from_secs(3), |s| !s.is_empty());
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].meta.tun_id, 77);
    assert_eq!(seen[0].meta.src, B_IP);
    assert_eq!(seen[0].frame, inner);
    assert_eq!(port.stats().rx_errors, 1);
    assert_eq!(port.stats().rx_packets, 1);
    // Nothing else for us: no stray datagrams.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(port.recv_batch(64), 0);

    // Overflowing the socket's receive buffer shows up in rx_dropped (the
    // kernel reports its drop count on the datagrams queued after them).
    let mut bulk = valid.clone();
    bulk.resize(1400, 0);
    for _ in 0..20000 {
        let _ = sender.send_to(&bulk, SocketAddrV4::new(A_IP, 4789));
    }
    std::thread::sleep(Duration::from_millis(100));
    while port.recv_batch(64) > 0 {}
    sender
        .send_to(&valid, SocketAddrV4::new(A_IP, 4789))
        .unwrap();
    receive_until(&mut port, Duration::from_secs(3), |s| !s.is_empty());
    assert!(port.stats().rx_dropped > 0, "{:?}", port.stats());

    // The underlay itself still works for the kernel (ICMP between A and B).
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.b,
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            "192.0.2.1",
        ])
        .output()
        .expect("run ping");
    assert!(ping.status.success(), "underlay ping failed");
}
