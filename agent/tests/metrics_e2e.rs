//! End to end: oxvs-agent's and oxvs-switchd's `/metrics` on a real node.
//!
//! A node (switchd with its gateway, the agent; see `node/mod.rs`) serves
//! metrics on the node namespace's loopback at the default addresses
//! (agent 127.0.0.1:9531, switchd 127.0.0.1:9530; the namespace is the
//! test's own, so parallel tests do not collide). Pods are made by the real
//! `oxvs-cni`. Checks: the pages parse; after CNI ADDs the agent counts
//! them (`oxvs_cni_requests_total{verb="ADD",result="success"}`), the
//! latency histogram's `_count` equals the request count for every series
//! and its sum is positive; pods and flows are counted; a ping between the
//! pods moves the switch's port counters and cache hits; a DEL is counted.

#[path = "../../switch/tests/common/mod.rs"]
mod common;
#[path = "../../switch/tests/metrics_support/mod.rs"]
mod metrics_support;
mod node;

use common::{ping, ping_until_up};
use metrics_support::{scrape, Scrape};
use node::Node;

const AGENT: &str = "127.0.0.1:9531";
const SWITCHD: &str = "127.0.0.1:9530";

fn requests(s: &Scrape, verb: &str, result: &str) -> f64 {
    s.value(
        "oxvs_cni_requests_total",
        &[("verb", verb), ("result", result)],
    )
}

/// Every (verb, result) series: `_count` == requests == `+Inf` bucket.
fn histogram_consistent(s: &Scrape) {
    for verb in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
        for result in ["success", "error"] {
            let l = [("verb", verb), ("result", result)];
            let n = requests(s, verb, result);
            let count = s.value("oxvs_cni_request_duration_seconds_count", &l);
            let inf = s.value(
                "oxvs_cni_request_duration_seconds_bucket",
                &[("verb", verb), ("result", result), ("le", "+Inf")],
            );
            assert_eq!((count, inf), (n, n), "{verb}/{result}:\n{}", s.text);
            let sum = s.value("oxvs_cni_request_duration_seconds_sum", &l);
            assert!(
                n == 0.0 || sum > 0.0,
                "{verb}/{result}: sum {sum} for {n} requests"
            );
        }
    }
}

#[test]
fn agent_metrics_count_cni_requests_and_pods() {
    skip_unless_capable!();
    let node = Node::start("mag", "10.237.1.0/24");
    let before = scrape(&node.ns, AGENT);
    histogram_consistent(&before);
    assert_eq!(requests(&before, "ADD", "success"), 0.0);
    // start_agent waits for STATUS to succeed.
    assert!(
        requests(&before, "STATUS", "success") >= 1.0,
        "{}",
        before.text
    );
    assert_eq!(before.value("oxvs_agent_pods", &[("state", "ready")]), 0.0);
    assert_eq!(
        before.value("oxvs_agent_switch_up", &[]),
        1.0,
        "{}",
        before.text
    );
    let sw_before = scrape(&node.ns, SWITCHD);

    let a = node.add_pod("a");
    let b = node.add_pod("b");
    let added = scrape(&node.ns, AGENT);
    histogram_consistent(&added);
    assert_eq!(requests(&added, "ADD", "success"), 2.0, "{}", added.text);
    // An ADD does real work (netlink, a switch port, flows): > 1 ms each.
    let sum = added.value(
        "oxvs_cni_request_duration_seconds_sum",
        &[("verb", "ADD"), ("result", "success")],
    );
    assert!(sum > 0.002, "ADD latency sum {sum}");
    assert_eq!(
        added.value(
            "oxvs_cni_request_duration_seconds_bucket",
            &[("verb", "ADD"), ("result", "success"), ("le", "0.001")]
        ),
        0.0
    );
    assert_eq!(added.value("oxvs_agent_pods", &[("state", "ready")]), 2.0);
    assert!(
        added.value("oxvs_agent_flows", &[("feature", "pod")]) > 0.0,
        "{}",
        added.text
    );
    assert!(added.value("oxvs_agent_flows", &[("feature", "pipeline")]) > 0.0);
    assert_eq!(
        added.value("oxvs_agent_flows", &[("feature", "pod")]),
        added.sum("oxvs_agent_flows", &[("feature", "pod")])
    );

    // Traffic between the pods moves the switch's counters.
    let p = ping_until_up(&a.ns, &b.ip, 5);
    assert!(p.ok, "a -> b never answered:\n{}", p.output);
    let p = ping(&a.ns, &b.ip, 10, "0.05", &[]);
    assert_eq!(p.received, 10, "{}", p.output);
    let sw_after = scrape(&node.ns, SWITCHD);
    let rx = |s: &Scrape| s.sum("oxvs_port_rx_packets_total", &[]);
    let hits = |s: &Scrape| s.sum("oxvs_datapath_cache_hits_total", &[]);
    assert!(rx(&sw_after) >= rx(&sw_before) + 20.0, "{}", sw_after.text);
    assert!(hits(&sw_after) > hits(&sw_before), "{}", sw_after.text);
    assert_eq!(
        sw_after.value("oxvs_ports", &[]),
        3.0,
        "gateway + 2 pods:\n{}",
        sw_after.text
    );

    let out = node.del_pod(&a);
    assert!(out.ok, "DEL failed: {out:?}");
    let deleted = scrape(&node.ns, AGENT);
    histogram_consistent(&deleted);
    assert_eq!(requests(&deleted, "DEL", "success"), 1.0);
    assert_eq!(requests(&deleted, "ADD", "success"), 2.0);
    assert_eq!(deleted.value("oxvs_agent_pods", &[("state", "ready")]), 1.0);
}
