//! Shared by the pipeline's integration tests that run packets through
//! the whole Antrea-like example pipeline (`examples/antrea-like.flows`):
//! one node, its datapath and conntrack, and frame builders for its pods.
//!
//! The example's ports: 1 the gateway, 2 the tunnel, 3-5 the pods
//! client-1 (10.244.0.3), web-1 (10.244.0.4) and db-1 (10.244.0.5).
//! web-1 accepts only TCP 80 from client-1 and the remote node's pods;
//! db-1 may only send UDP 53.

#![allow(dead_code)] // each test file uses its part

use std::sync::Arc;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

pub const GW_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0, 0x01];
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const PSH_ACK: u8 = 0x18;

/// Pod `n`'s MAC and address.
pub fn pod(n: u8) -> ([u8; 6], [u8; 4]) {
    ([0x0a, 0x58, 0x0a, 0xf4, 0, n], [10, 244, 0, n])
}

/// The Internet checksum (RFC 1071) of `data` (an odd last byte padded
/// with zero).
pub fn csum16(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 frame from pod `from` to pod `to`'s address, sent to `dst_mac`.
fn ipv4_frame(from: u8, to: u8, dst_mac: [u8; 6], proto: u8, l4: &[u8]) -> Vec<u8> {
    let (smac, sip) = pod(from);
    let (_, dip) = pod(to);
    let tot = (20 + l4.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&tot.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    ip.extend_from_slice(&sip);
    ip.extend_from_slice(&dip);
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(l4);
    f
}

/// A routed TCP segment from pod `from` to pod `to` (destination MAC the
/// gateway's, as a pod sends it) with `flags` and `len` bytes of data.
#[allow(clippy::too_many_arguments)] // a TCP segment has that many fields
pub fn tcp(
    from: u8,
    sport: u16,
    to: u8,
    dport: u16,
    flags: u8,
    seq: u32,
    ack: u32,
    len: usize,
) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.extend_from_slice(&[0x50, flags]);
    t.extend_from_slice(&502u16.to_be_bytes()); // window (scaled by a shift the tracker never saw)
    t.extend_from_slice(&[0, 0, 0, 0]);
    t.extend(std::iter::repeat_n(0x5a, len));
    ipv4_frame(from, to, GW_MAC, 6, &t)
}

/// A routed TCP segment without SYN (PSH+ACK with data, else ACK).
pub fn seg(from: u8, sport: u16, to: u8, dport: u16, seq: u32, ack: u32, len: usize) -> Vec<u8> {
    let flags = if len > 0 { PSH_ACK } else { ACK };
    tcp(from, sport, to, dport, flags, seq, ack, len)
}

/// A routed UDP datagram from pod `from` to pod `to`.
pub fn udp(from: u8, sport: u16, to: u8, dport: u16) -> Vec<u8> {
    udp_to_mac(from, sport, to, dport, GW_MAC)
}

/// A UDP datagram from pod `from` to pod `to`'s address but sent to
/// `dst_mac` (a MAC no port has makes the pipeline drop it in Output,
/// after ConntrackCommit).
pub fn udp_to_mac(from: u8, sport: u16, to: u8, dport: u16, dst_mac: [u8; 6]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&sport.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&16u16.to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(&[0x5a; 8]);
    ipv4_frame(from, to, dst_mac, 17, &u)
}

/// One node running the example pipeline.
pub struct Node {
    pub dp: Datapath,
    pub ct: Conntrack,
    /// The clock given to the datapath (ns).
    pub now: u64,
}

impl Node {
    /// The example with conntrack configured by `ct`.
    pub fn with(ct: CtConfig) -> Node {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/antrea-like.flows"),
        )
        .expect("examples/antrea-like.flows");
        let flows = parse_flow_file(&text, &ParseContext::default()).expect("the example parses");
        let pipeline = Arc::new(Pipeline::new());
        let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
        pipeline.apply(&mods, 1).expect("load the example");
        Node {
            dp: Datapath::new(
                pipeline,
                XlateEnv::with_ports(vec![1, 2, 3, 4, 5]),
                DatapathConfig::default(),
            ),
            ct: Conntrack::new(ct),
            now: 1_000_000_000,
        }
    }

    /// Sends `frame` in on `port`; the ports it came out of.
    pub fn send(&mut self, frame: &[u8], port: u32) -> Vec<u32> {
        self.send_batch(&[(frame.to_vec(), port)])
    }

    /// Sends frames in one batch; the ports they came out of, in order.
    pub fn send_batch(&mut self, frames: &[(Vec<u8>, u32)]) -> Vec<u32> {
        self.now += 1_000_000;
        let mut batch: Vec<_> = frames
            .iter()
            .map(|(f, p)| DpPacket::from_frame(f, *p))
            .collect();
        let mut sink = RecordingSink::default();
        self.dp
            .process_batch(&mut batch, &mut self.ct, self.now, &mut sink);
        sink.outputs.iter().map(|(p, _, _)| *p).collect()
    }
}
