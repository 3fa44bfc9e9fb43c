//! Loose TCP pickup (`CtConfig::tcp_loose`) through a whole Antrea-like
//! pipeline (`examples/antrea-like.flows`): a mid-stream segment with no
//! conntrack entry (after a switch restart, `flush-conntrack`, an idle
//! expiry) is `+new`, so it goes through the NetworkPolicy tables as a new
//! connection would, and is committed only if they let it through. A
//! connection the policies would not allow as new stays dropped and leaves
//! nothing in the table.
//!
//! The example's policies: web-1 (port 4, 10.244.0.4) accepts only TCP 80
//! from client-1 (port 3, 10.244.0.3) and the remote node's pods; db-1
//! (port 5, 10.244.0.5) may only send UDP 53.

use std::sync::Arc;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

const GW_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0, 0x01];
const ACK: u8 = 0x10;
const PSH_ACK: u8 = 0x18;

fn pod(n: u8) -> ([u8; 6], [u8; 4]) {
    ([0x0a, 0x58, 0x0a, 0xf4, 0, n], [10, 244, 0, n])
}

/// A routed TCP segment from pod `from` to pod `to` (destination MAC the
/// gateway's, as a pod sends it), no SYN.
fn seg(from: u8, sport: u16, to: u8, dport: u16, seq: u32, ack: u32, len: usize) -> Vec<u8> {
    let (smac, sip) = pod(from);
    let (_, dip) = pod(to);
    let mut tcp = Vec::new();
    tcp.extend_from_slice(&sport.to_be_bytes());
    tcp.extend_from_slice(&dport.to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.extend_from_slice(&[0x50, if len > 0 { PSH_ACK } else { ACK }]);
    tcp.extend_from_slice(&502u16.to_be_bytes()); // window (scaled by a shift the tracker never saw)
    tcp.extend_from_slice(&[0, 0, 0, 0]);
    tcp.extend(std::iter::repeat_n(0x5a, len));
    let tot = (20 + tcp.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&tot.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0]);
    ip.extend_from_slice(&sip);
    ip.extend_from_slice(&dip);
    let mut f = Vec::new();
    f.extend_from_slice(&GW_MAC);
    f.extend_from_slice(&smac);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&tcp);
    f
}

struct Node {
    dp: Datapath,
    ct: Conntrack,
    now: u64,
}

impl Node {
    fn new(tcp_loose: bool) -> Node {
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
                XlateEnv {
                    ports: vec![1, 2, 3, 4, 5],
                },
                DatapathConfig::default(),
            ),
            ct: Conntrack::new(CtConfig {
                tcp_loose,
                ..CtConfig::default()
            }),
            now: 1_000_000_000,
        }
    }

    /// Sends `frame` in on `port`; the ports it came out of.
    fn send(&mut self, frame: &[u8], port: u32) -> Vec<u32> {
        self.now += 1_000_000;
        let mut batch = vec![DpPacket::from_frame(frame, port)];
        let mut sink = RecordingSink::default();
        self.dp
            .process_batch(&mut batch, &mut self.ct, self.now, &mut sink);
        sink.outputs.iter().map(|(p, _, _)| *p).collect()
    }
}

#[test]
fn an_allowed_connection_is_picked_up_mid_stream() {
    let mut n = Node::new(true);
    // client-1 -> web-1:80, allowed by allow-client-to-web: the segment is
    // +new, passes the ingress rule, is committed and forwarded.
    assert_eq!(n.send(&seg(3, 40000, 4, 80, 1_000, 7_000, 100), 3), [4]);
    assert_eq!(n.ct.len(), 1);
    // The stream goes on both ways, as +est (+rpl) traffic.
    let (mut sa, sb) = (1_100u32, 7_000u32);
    for _ in 0..20 {
        assert_eq!(n.send(&seg(4, 80, 3, 40000, sb, sa, 0), 4), [3]);
        assert_eq!(n.send(&seg(3, 40000, 4, 80, sa, sb, 1000), 3), [4]);
        sa += 1000;
    }
    assert_eq!(n.ct.len(), 1);
    let e = n.ct.entries()[0];
    assert_eq!(
        e.orig.to_string(),
        "src=10.244.0.3,dst=10.244.0.4,sport=40000,dport=80"
    );
}

#[test]
fn a_denied_connection_stays_dropped_and_uncommitted() {
    let mut n = Node::new(true);
    // client-1 -> web-1:81: no rule allows it; web-1 is isolated for
    // ingress. Every segment is dropped and nothing is committed.
    for i in 0..5 {
        assert_eq!(n.send(&seg(3, 40001, 4, 81, 1_000 + i, 7_000, 10), 3), []);
        assert_eq!(n.ct.len(), 0);
    }
    // db-1 -> client-1, TCP: db-1 may only send UDP 53 (egress isolated).
    assert_eq!(n.send(&seg(5, 5432, 3, 40002, 5, 6, 10), 5), []);
    assert_eq!(n.ct.len(), 0);
    // ... and client-1's answers, which would be replies had it been
    // allowed, are new connections into web-1 / to db-1 in their own
    // right: client -> db is allowed (nothing isolates db-1 for ingress),
    // so it is picked up in that direction; then db-1's segments of it
    // are replies (as they would be after a SYN from client-1).
    assert_eq!(n.send(&seg(3, 40002, 5, 5432, 6, 15, 0), 3), [5]);
    assert_eq!(n.send(&seg(5, 5432, 3, 40002, 15, 6, 10), 5), [3]);
    assert_eq!(n.ct.len(), 1);
}

#[test]
fn without_loose_pickup_mid_stream_segments_are_invalid() {
    let mut n = Node::new(false);
    for i in 0..3 {
        assert_eq!(n.send(&seg(3, 40000, 4, 80, 1_000 + i, 7_000, 10), 3), []);
    }
    assert_eq!(n.ct.len(), 0);
    assert!(n.ct.stats().invalid_total >= 3);
}
