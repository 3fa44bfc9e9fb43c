//! Regression tests for bugs the fuzz targets found (each input is also in
//! the target's corpus; these say what the bug was).

use oxvs_fuzz_harness::frames::{self, tcp, Addr};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig, CtParams, TcpState};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::ct_state::{EST, INV, NEW, RPL, TRK};

const A: Addr = Addr::V4([10, 0, 0, 1]);
const B: Addr = Addr::V4([10, 0, 0, 2]);

fn seg(src: Addr, dst: Addr, sport: u16, dport: u16, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    let l4 = frames::tcp_segment(sport, dport, seq, ack, flags, 65535, &[], &[]);
    frames::ip_frame(src, dst, frames::PROTO_TCP, &l4)
}

/// `conntrack`: the first segment seen from the reply side set up that
/// side's tracking (state SYN_SENT, sequence window) before the window
/// check, and kept it when the check then failed: an `+inv` packet (one
/// the flows drop) changed the connection, so a forged SYN-ACK with a bad
/// ack could skew the window the real one is judged by.
#[test]
fn an_invalid_first_reply_segment_changes_nothing() {
    let mut ct = Conntrack::new(CtConfig::default());
    let commit = CtParams {
        commit: true,
        ..CtParams::default()
    };
    let now = 1_000_000_000;
    let syn = seg(A, B, 40000, 80, 1000, 0, tcp::SYN);
    let v = ct.execute(&syn, &extract(&syn, 1), &commit, now);
    assert_eq!(v.state, TRK | NEW);
    let before = ct.entries();
    assert_eq!(
        before[0].tcp_states,
        Some((TcpState::SynSent, TcpState::Closed))
    );

    // Before any answer, the initiator acks 5000 (accepted loosely): that
    // sets how far the other side's first segment may be.
    let ack = seg(A, B, 40000, 80, 1001, 5000, tcp::ACK);
    let v = ct.execute(&ack, &extract(&ack, 1), &CtParams::default(), now);
    assert_eq!(v.state & INV, 0, "{v:?}");
    let before = ct.entries();

    // A SYN-ACK far behind that, with an absurd ack: invalid.
    let bad = seg(
        B,
        A,
        80,
        40000,
        5000u32.wrapping_sub(1_000_000),
        0x8000_0000,
        tcp::SYN | tcp::ACK,
    );
    let v = ct.execute(&bad, &extract(&bad, 2), &CtParams::default(), now);
    assert_eq!(v.state & INV, INV, "{v:?}");
    assert_eq!(
        ct.entries(),
        before,
        "an +inv segment changed the connection"
    );

    // The real SYN-ACK is then judged afresh.
    let good = seg(B, A, 80, 40000, 4999, 1001, tcp::SYN | tcp::ACK);
    let v = ct.execute(&good, &extract(&good, 2), &CtParams::default(), now);
    assert_eq!(v.state, TRK | EST | RPL);
}
