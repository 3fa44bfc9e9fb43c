//! End to end, a busy AF_XDP port among many quiet ones on one datapath
//! thread: its fill ring borrows spare UMEM frames beyond its small share
//! (`Frames::room_to_grow` in `switch/src/afxdp.rs`). The only test in its
//! binary, so no other test's traffic shares the machine's CPUs with its
//! TCP (test binaries run one after another, a binary's tests in
//! parallel).

mod common;

use common::*;

/// A busy port among many quiet ones borrows beyond its share: 24 pods at
/// MTU 65535 on the default UMEM make a share of 512 frames a port (30
/// segments of 64 KiB), while most of the UMEM sits free. One pod sends
/// TCP as fast as it can to another, twice: nothing of the second burst
/// may be lost to an empty fill ring (with the ports capped at their
/// share, one stream lost about a thousand segments in 4 s on a node of
/// 30 pods; `docs/benchmarks.md`, "Many pods on a node").
#[test]
fn e2e_a_busy_port_among_many_borrows() {
    skip_unless_capable!();
    const PODS: usize = 24;
    let node = Netns::new("node");
    let sw = Switchd::start_with(&node, &[]);
    let pods = flooded_pods(&sw, &node, PODS, "m", "10.13.0", "02:00:0a:0d:00", 65535);
    let p = ping_until_up(&pods[0], "10.13.0.2", 5);
    assert!(p.ok, "pod1 -> pod2 never answered:\n{}", p.output);
    let fill_empty = || rx_fill_empty(&sw, "m1");
    let (frames, free) = umem_stats(&sw);
    eprintln!("{PODS} ports: {free} of {frames} UMEM frames free");
    let first = blast(&pods[0], &pods[1], "10.13.0.2", 5001, "2");
    let before = fill_empty();
    eprintln!("first burst: {first} bytes, {before} lost to an empty fill ring");
    let got = blast(&pods[0], &pods[1], "10.13.0.2", 5002, "3");
    let lost = fill_empty() - before;
    eprintln!("second burst: {got} bytes, {lost} lost to an empty fill ring");
    assert!(
        got > 100 << 20,
        "only {got} bytes of TCP in 3 s: the burst tested nothing"
    );
    assert_eq!(
        lost, 0,
        "pod1's port lost {lost} packets to an empty fill ring with most of the UMEM free"
    );
    // It got there by borrowing: its ring is topped up beyond its share.
    let share = (16384 - 4096) / PODS as u64;
    let st = &sw.port_json("m1")["stats"];
    let target = st["rx_fill_target"]
        .as_u64()
        .unwrap_or_else(|| panic!("rx_fill_target of m1: {st}"));
    assert!(
        target > share,
        "m1's fill ring is topped up to {target}, not beyond its share of {share}: {st}"
    );
    assert!(
        st["rx_fill_frames"].as_u64().is_some_and(|n| n <= target),
        "m1's fill ring gauge: {st}"
    );
}
