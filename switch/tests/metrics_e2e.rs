//! End to end: oxvs-switchd's `/metrics` before and during traffic.
//!
//! Two pods on one switch (flows of `examples/switch-two-pods.flows`); the
//! test scrapes `http://127.0.0.1:PORT/metrics` inside the node namespace
//! before any traffic, while a ping runs, and after it, and checks that the
//! page is a valid exposition every time and that the port counters, the
//! cache hits, the upcalls and the table counters move. Runs as root only
//! (skips otherwise); everything lives in fresh namespaces removed on drop.

mod common;
mod metrics_support;

use std::time::Duration;

use common::*;
use metrics_support::scrape;

/// Inside the test's own namespace: no other test listens there.
const ADDR: &str = "127.0.0.1:19530";

#[test]
fn switchd_metrics_move_with_traffic() {
    skip_unless_capable!();
    let node = Netns::new("mnode");
    let pod1 = Netns::new("mpod1");
    let pod2 = Netns::new("mpod2");
    let sw = Switchd::start_with(&node, &["--metrics-addr", ADDR]);
    add_pod(
        &sw,
        &node,
        &pod1,
        "p1",
        1,
        "10.10.0.1/24",
        "02:00:0a:0a:00:01",
        1500,
    );
    add_pod(
        &sw,
        &node,
        &pod2,
        "p2",
        2,
        "10.10.0.2/24",
        "02:00:0a:0a:00:02",
        1500,
    );
    sw.add_flows(&example("switch-two-pods.flows"));

    let before = scrape(&node, ADDR);
    assert_eq!(before.value("oxvs_ports", &[]), 2.0);
    assert_eq!(
        before.value(
            "oxvs_port_info",
            &[
                ("port", "p1"),
                ("ofport", "1"),
                ("kind", "afxdp"),
                ("mode", &port_mode(&sw, "p1"))
            ]
        ),
        1.0
    );
    assert!(before.value("oxvs_pipeline_flows", &[("table", "Classifier")]) >= 4.0);
    assert_eq!(before.value("oxvs_conntrack_entries", &[]), 0.0);
    assert_eq!(
        before.value("oxvs_conntrack_table_full_drops_total", &[]),
        0.0
    );

    // During traffic: a ping runs in the background while we scrape.
    let mut bg = pod1.spawn(&[
        "ping",
        "-n",
        "-c",
        "40",
        "-i",
        "0.05",
        "-W",
        "1",
        "10.10.0.2",
    ]);
    std::thread::sleep(Duration::from_millis(800));
    let during = scrape(&node, ADDR);
    let (ok, out, err) = bg.wait(Duration::from_secs(20));
    assert!(
        ok,
        "ping pod1 -> pod2 failed:\n{out}{err}\n{}",
        sw.log_tail(20)
    );
    let after = scrape(&node, ADDR);

    let rx = |s: &metrics_support::Scrape, p: &str| {
        s.value("oxvs_port_rx_packets_total", &[("port", p)])
    };
    let tx = |s: &metrics_support::Scrape, p: &str| {
        s.value("oxvs_port_tx_packets_total", &[("port", p)])
    };
    let hits = |s: &metrics_support::Scrape| s.sum("oxvs_datapath_cache_hits_total", &[]);
    eprintln!(
        "p1 rx {} -> {} -> {}; p2 tx {} -> {} -> {}; cache hits {} -> {} -> {}",
        rx(&before, "p1"),
        rx(&during, "p1"),
        rx(&after, "p1"),
        tx(&before, "p2"),
        tx(&during, "p2"),
        tx(&after, "p2"),
        hits(&before),
        hits(&during),
        hits(&after)
    );
    // Counters moved while the ping ran, and kept moving until it ended.
    for (a, b) in [(&before, &during), (&during, &after)] {
        assert!(rx(b, "p1") > rx(a, "p1"), "p1 rx did not move:\n{}", b.text);
        assert!(tx(b, "p2") > tx(a, "p2"), "p2 tx did not move:\n{}", b.text);
        assert!(hits(b) > hits(a), "cache hits did not move:\n{}", b.text);
    }
    // 40 requests in, 40 replies back (ARP on top).
    assert!(rx(&after, "p1") - rx(&before, "p1") >= 40.0);
    assert!(rx(&after, "p2") - rx(&before, "p2") >= 40.0);
    assert!(after.value("oxvs_port_rx_bytes_total", &[("port", "p1")]) >= 40.0 * 98.0);
    // Few distinct flows: most passes are cache hits; the first went up.
    assert!(after.value("oxvs_datapath_upcalls_total", &[]) >= 1.0);
    assert!(hits(&after) - hits(&before) >= 60.0, "{}", after.text);
    assert!(after.value("oxvs_datapath_megaflow_inserts_total", &[]) >= 1.0);
    assert!(
        after.value("oxvs_pipeline_flow_packets", &[("table", "Classifier")])
            >= before.value("oxvs_pipeline_flow_packets", &[("table", "Classifier")]) + 80.0
    );
    assert!(after.value("oxvs_datapath_busy_seconds_total", &[]) > 0.0);
    assert!(after.value("oxvs_datapath_packets_total", &[]) >= 80.0);
    // Nothing dropped here.
    assert_eq!(
        after.sum("oxvs_port_tx_drops_total", &[]),
        0.0,
        "{}",
        after.text
    );
}

#[test]
fn metrics_can_be_turned_off() {
    skip_unless_capable!();
    let node = Netns::new("moff");
    let _sw = Switchd::start_with(&node, &["--metrics-addr", "none"]);
    // The default address is not served either.
    let out = node.exec(&[
        "python3",
        "-c",
        "import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', 9530), timeout=2)\nexcept OSError: sys.exit(0)\nsys.exit(1)",
    ]);
    assert!(
        out.status.success(),
        "something listens on 127.0.0.1:9530 with --metrics-addr none"
    );
}

/// The `mode` of port `name` as `dump-ports --json` reports it.
fn port_mode(sw: &Switchd, name: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&sw.ctl_ok(&["dump-ports", "--json"])).expect("dump-ports --json");
    v["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .and_then(|p| p["mode"].as_str())
        .unwrap_or_default()
        .to_owned()
}
