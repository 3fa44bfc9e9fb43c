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

mod common;

use common::{seg, Node};
use oxvs_pipeline::conntrack::CtConfig;

fn node(tcp_loose: bool) -> Node {
    Node::with(CtConfig {
        tcp_loose,
        ..CtConfig::default()
    })
}

#[test]
fn an_allowed_connection_is_picked_up_mid_stream() {
    let mut n = node(true);
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
    let mut n = node(true);
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
    let mut n = node(false);
    for i in 0..3 {
        assert_eq!(n.send(&seg(3, 40000, 4, 80, 1_000 + i, 7_000, 10), 3), []);
    }
    assert_eq!(n.ct.len(), 0);
    assert!(n.ct.stats().invalid_total >= 3);
}
