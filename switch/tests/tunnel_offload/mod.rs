//! The userspace TSO/GRO checks of the kernel interop tests
//! (`e2e_kernel_interop.rs` over an IPv4 underlay,
//! `e2e_kernel_interop_ipv6.rs` over an IPv6 one): a large TCP transfer
//! from oxvs's pod must leave the tunnel port cut, one from the kernel's
//! pod must reach oxvs's pod merged, both seen in the port counters and
//! switchd's metrics (served on [`METRICS`] inside node A's namespace).

use crate::common::*;
use crate::metrics_support::scrape;

/// /metrics inside node A's namespace (counts the cut and the merges).
pub const METRICS: &str = "127.0.0.1:9481";

/// oxvs's pod (`pa`, MTU 65535) sends 8 MB to `to` (B's pod, which
/// advertises a large MSS): its large segments must leave the tunnel port
/// cut (the port counts inner frames far larger than the tunnel's, and
/// switchd's TSO metric grows), and the kernel's vxlan and pod take every
/// piece (the transfer's SHA-256 checks it).
pub fn cut_into_the_tunnel(swa: &Switchd, na: &Netns, pa: &Netns, pb: &Netns, to: &str, port: u16) {
    let (p0, b0) = swa.port_counters("tun0").tx();
    let cut0 = scrape(na, METRICS).sum("oxvs_datapath_tunnel_tso_frames_total", &[]);
    tcp_transfer(pa, pb, to, port, 8 << 20);
    let (p1, b1) = swa.port_counters("tun0").tx();
    let avg = (b1 - b0) / (p1 - p0).max(1);
    assert!(
        b1 - b0 >= 8 << 20 && avg > 4000,
        "{} inner frames of {avg} bytes to {to} into the tunnel: not cut by oxvs",
        p1 - p0
    );
    // switchd counts the frames it cut (not every one was larger than
    // the tunnel: ACK-clocked tails are sent whole).
    std::thread::sleep(std::time::Duration::from_millis(200));
    let cut = scrape(na, METRICS).sum("oxvs_datapath_tunnel_tso_frames_total", &[]) - cut0;
    eprintln!(
        "to {to}: {} inner frames of {avg} bytes into the tunnel, {cut} cut",
        p1 - p0
    );
    assert!(cut >= 64.0, "only {cut} frames to {to} counted as cut");
}

/// B's pod sends 8 MB to `to` (oxvs's pod) in tunnel-sized segments: oxvs
/// must merge them into large frames for its pod (its port's average
/// frame far beyond a segment, switchd's GRO metric growing).
pub fn merged_from_the_tunnel(
    swa: &Switchd,
    na: &Netns,
    pa: &Netns,
    pb: &Netns,
    to: &str,
    port: u16,
) {
    let (r0, rb0) = swa.port_counters("pa").tx();
    let merged0 = scrape(na, METRICS).sum("oxvs_datapath_tunnel_gro_merged_total", &[]);
    tcp_transfer(pb, pa, to, port, 8 << 20);
    let (r1, rb1) = swa.port_counters("pa").tx();
    let avg = (rb1 - rb0) / (r1 - r0).max(1);
    assert!(
        rb1 - rb0 >= 8 << 20 && avg > 4000,
        "{} frames of {avg} bytes to {to}: the kernel's segments were not merged",
        r1 - r0
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let merged = scrape(na, METRICS).sum("oxvs_datapath_tunnel_gro_merged_total", &[]) - merged0;
    eprintln!(
        "to {to}: {} frames of {avg} bytes to the pod, {merged} segments merged",
        r1 - r0
    );
    assert!(
        merged >= 1000.0,
        "only {merged} segments to {to} counted as merged"
    );
}
