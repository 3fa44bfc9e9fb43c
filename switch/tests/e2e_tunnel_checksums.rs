//! End to end, checksums of frames from a tunnel: the switch verifies
//! them, and drops what was corrupted on the way instead of correcting
//! it.
//!
//! Frames from a pod cross memory only, so the switch completes their
//! partial checksums whatever the field holds (`e2e_checksums`). Frames
//! from a VXLAN tunnel crossed a wire, where the inner TCP/UDP checksum is
//! the only end-to-end check (the outer UDP checksum is 0 over IPv4): a
//! switch that recomputed it would deliver corrupted data under a
//! checksum made to fit. Node A runs oxvs-switchd with a VXLAN port and
//! one pod; a host on the underlay (`wire`) sends VXLAN datagrams by hand
//! (a UDP socket, so they carry exactly the bytes written) holding inner
//! UDP datagrams to the pod:
//!
//! 1. a complete, right checksum: delivered as it is;
//! 2. a partial one (the field holds the pseudo-header's sum, what a
//!    kernel peer over a veth leaves): completed, delivered;
//! 3. a complete checksum, one payload bit flipped after it was computed:
//!    dropped (the pod's socket gets nothing, its kernel would have
//!    dropped it too; before this, the switch "corrected" it and the pod
//!    read the corrupted bytes), counted in
//!    `oxvs_datapath_tunnel_bad_checksum_drops_total`;
//! 4. the same with a flipped bit in a TCP segment's payload from the
//!    middle of a train the switch may merge (GRO): the corrupted segment
//!    is dropped, the others are delivered, merged or not (what GRO does
//!    with a corrupted piece is unit-tested in `vxlan/gro.rs`).
//!
//! Runs as root only (skips otherwise); everything lives in fresh
//! namespaces removed on drop.

mod common;
mod metrics_support;

use common::*;
use metrics_support::scrape;

const METRICS: &str = "127.0.0.1:9482";

/// What both senders share (Python, put in front of each): the one's
/// complement sum `s16` (folded, not inverted) and the inner addresses.
const PY_SUM: &str = r#"
import socket, struct
def s16(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return s
src, dst = socket.inet_aton("10.21.0.9"), socket.inet_aton("10.21.0.2")
"#;

/// Sends VXLAN datagrams (VNI 100) from `wire` to node A's tunnel
/// (192.0.2.1:4789), each holding an inner Ethernet + IPv4 + UDP frame to
/// the pod's port 7000 with payload `payload` and its checksum as `how`
/// says: `good`, `partial`, or `flipped` (complete, then a payload bit
/// flipped).
const SEND_UDP: &str = r#"
import socket, struct, sys
how, payload = sys.argv[1], sys.argv[2].encode()
ulen = 8 + len(payload)
pseudo = s16(src + dst + struct.pack("!BBH", 0, 17, ulen))
udp = struct.pack("!HHHH", 40000, 7000, ulen, 0) + payload
if how == "partial":
    csum = pseudo
else:
    csum = 0xffff - s16(src + dst + struct.pack("!BBH", 0, 17, ulen) + udp) or 0xffff
udp = udp[:6] + struct.pack("!H", csum) + udp[8:]
if how == "flipped":
    udp = udp[:-1] + bytes([udp[-1] ^ 0x08])
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + ulen, 1, 0x4000, 64, 17, 0, src, dst)
ip = ip[:10] + struct.pack("!H", 0xffff - s16(ip)) + ip[12:]
eth = bytes.fromhex("02000a150002" "02000a150009" "0800")
vxlan = struct.pack("!II", 0x08000000, 100 << 8)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(vxlan + eth + ip + udp, ("192.0.2.1", 4789))
"#;

/// Sends a train of 8 inner TCP segments (1000-byte payloads, one flow,
/// consecutive sequence numbers, complete checksums) in one VXLAN
/// datagram each, back to back, with a payload bit of segment `bad`
/// flipped after its checksum was computed (none if `bad` is 8).
const SEND_TRAIN: &str = r#"
import socket, struct, sys
bad = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
out = []
for k in range(8):
    payload = bytes((k * 1000 + i) % 251 for i in range(1000))
    tcp = struct.pack("!HHIIBBHHH", 40001, 7001, 1000 + k * 1000, 1, 5 << 4, 0x10, 512, 0, 0) + payload
    pseudo = src + dst + struct.pack("!BBH", 0, 6, len(tcp))
    csum = 0xffff - s16(pseudo + tcp) or 0xffff
    tcp = tcp[:16] + struct.pack("!H", csum) + tcp[18:]
    if k == bad:
        tcp = tcp[:-3] + bytes([tcp[-3] ^ 0x40]) + tcp[-2:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), k, 0x4000, 64, 6, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", 0xffff - s16(ip)) + ip[12:]
    eth = bytes.fromhex("02000a150002" "02000a150009" "0800")
    out.append(struct.pack("!II", 0x08000000, 100 << 8) + eth + ip + tcp)
for d in out:
    s.sendto(d, ("192.0.2.1", 4789))
"#;

/// Listens on UDP 7000 in the pod for `secs` seconds and prints every
/// payload received, one per line.
const LISTEN_UDP: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7000))
s.settimeout(0.2)
print("listening", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    try:
        print(s.recv(65535).decode(), flush=True)
    except socket.timeout:
        pass
"#;

fn bad_checksum_drops(node: &Netns) -> f64 {
    scrape(node, METRICS).sum("oxvs_datapath_tunnel_bad_checksum_drops_total", &[])
}

#[test]
fn e2e_tunnel_checksums() {
    skip_unless_capable!();
    let na = Netns::new("tca");
    let wire = Netns::new("tcw");
    let pod = Netns::new("tcp");
    underlay(&na, &wire, 1500);
    let sw = Switchd::start_with(&na, &["--metrics-addr", METRICS]);
    na.must(&["ip", "link", "set", "lo", "up"]);
    sw.add_vxlan_port("tun0", 10, "192.0.2.1");
    add_pod(
        &sw,
        &na,
        &pod,
        "tp",
        1,
        "10.21.0.2/24",
        "02:00:0a:15:00:02",
        // Large frames on the node: the tunnel merges segments (GRO).
        65535,
    );
    pod.must(&[
        "ip",
        "neigh",
        "replace",
        "10.21.0.9",
        "lladdr",
        "02:00:0a:15:00:09",
        "dev",
        "eth0",
    ]);
    let flows = std::env::temp_dir().join(unique("tunnel-checksum-flows"));
    std::fs::write(&flows, "table=0,priority=10,in_port=10 actions=output:1\n")
        .expect("write flows");
    sw.add_flows(flows.to_str().expect("path"));
    let _ = std::fs::remove_file(&flows);

    // 1-3: single datagrams; the pod's socket reports what it read.
    let mut listener = pod.spawn(&["python3", "-c", LISTEN_UDP, "6"]);
    listener
        .wait_listening("the pod's UDP listener")
        .expect("listener");
    let before = bad_checksum_drops(&na);
    for (how, text) in [
        ("good", "complete-and-right"),
        ("partial", "partial-from-a-veth"),
        ("flipped", "corrupted-on-the-way"),
        ("good", "complete-again"),
    ] {
        wire.must(&["python3", "-c", &format!("{PY_SUM}{SEND_UDP}"), how, text]);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (_, got, err) = listener.wait(std::time::Duration::from_secs(10));
    for want in [
        "complete-and-right",
        "partial-from-a-veth",
        "complete-again",
    ] {
        assert!(
            got.lines().any(|l| l == want),
            "{want:?} not delivered to the pod; it read:\n{got}\n{err}\n{}",
            sw.log_tail(30)
        );
    }
    // The corrupted one: flipped bit 0x08 of the last byte ('y' -> 'q').
    assert!(
        !got.contains("corrupted-on-the-wa"),
        "a datagram corrupted on the way reached the pod's socket:\n{got}"
    );
    let dropped = bad_checksum_drops(&na) - before;
    assert_eq!(
        dropped, 1.0,
        "tunnel frames dropped for a bad checksum: {dropped}, want 1"
    );

    // 4: a train of TCP segments the switch may merge, one corrupted. The
    // pod's kernel has no socket for them: the port's counters say what
    // left the switch.
    let before = bad_checksum_drops(&na);
    let (p0, b0) = sw.port_counters("tp").tx();
    wire.must(&["python3", "-c", &format!("{PY_SUM}{SEND_TRAIN}"), "3"]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (p1, b1) = sw.port_counters("tp").tx();
    let dropped = bad_checksum_drops(&na) - before;
    assert_eq!(
        dropped, 1.0,
        "the corrupted segment of the train was not dropped ({dropped})"
    );
    // Frames of 54 bytes of headers each (merged or not) and the 7 good
    // segments' payloads, nothing of the bad one's.
    let frames = p1 - p0;
    assert_eq!(
        (b1 - b0).checked_sub(frames * 54),
        Some(7000),
        "the pod's port sent {frames} frames, {} bytes: want the 7 good segments' payloads",
        b1 - b0
    );
    eprintln!("7 good segments of 8 left in {frames} frames (merged by the tunnel's GRO)");
}
