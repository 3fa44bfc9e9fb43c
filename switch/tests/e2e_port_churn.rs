//! End to end, port churn and restart.
//!
//! 1. While pod1 pings pod2 every 20 ms, pod3's port is added and deleted
//!    several times (pod3 reachable while attached, unreachable after):
//!    pod1 <-> pod2 must lose (almost) nothing.
//! 2. switchd restart: SIGTERM (it must exit promptly and leave no XDP
//!    program on the interfaces), start a new one, re-add the ports, reload
//!    the flow file: traffic flows again.
//! 3. The same after SIGKILL (a crash leaves the interfaces as they were):
//!    a new switchd must take them over.
//!
//! Flows: `examples/switch-three-pods.flows`.

mod common;

use std::time::Duration;

use common::*;

const IP1: &str = "10.10.0.1";
const IP2: &str = "10.10.0.2";
const FLOWS: &str = "switch-three-pods.flows";

fn attach_all(sw: &Switchd) {
    sw.add_port("p1", 1);
    sw.add_port("p2", 2);
    sw.add_flows(&example(FLOWS));
}

/// Whether `ifname` in `node` still has an XDP program attached.
fn xdp_attached(node: &Netns, ifname: &str) -> Option<String> {
    let out = node.must(&["ip", "-d", "link", "show", ifname]);
    out.contains("xdp").then_some(out)
}

#[test]
fn e2e_port_churn() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let pod3 = Netns::new("pod3");
    let mut sw = Switchd::start(&node);
    make_pod(
        &node,
        &pod1,
        "p1",
        "10.10.0.1/24",
        "02:00:0a:0a:00:01",
        1500,
    );
    make_pod(
        &node,
        &pod2,
        "p2",
        "10.10.0.2/24",
        "02:00:0a:0a:00:02",
        1500,
    );
    make_pod(
        &node,
        &pod3,
        "p3",
        "10.10.0.3/24",
        "02:00:0a:0a:00:03",
        1500,
    );
    attach_all(&sw);
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(p.ok, "pod1 -> pod2 never answered:\n{}", p.output);

    // 1. Churn pod3 while pod1 pings pod2 (300 x 20 ms = 6 s).
    let mut bg = pod1.spawn(&["ping", "-n", "-c", "300", "-i", "0.02", "-W", "1", IP2]);
    for round in 0..5 {
        sw.add_port("p3", 3);
        if round == 0 || round == 4 {
            let p = ping_until_up(&pod3, IP1, 3);
            assert!(
                p.ok,
                "pod3 -> pod1 while attached (round {round}):\n{}",
                p.output
            );
        } else {
            std::thread::sleep(Duration::from_millis(300));
        }
        sw.ctl_ok(&["del-port", "p3"]);
        std::thread::sleep(Duration::from_millis(300));
    }
    let p = ping(&pod3, IP1, 2, "0.2", &[]);
    assert_eq!(
        p.received, 0,
        "pod3 still reachable after del-port:\n{}",
        p.output
    );
    let shown = sw.ctl_ok(&["show"]);
    assert!(
        !shown.contains("p3"),
        "p3 still in show after del-port:\n{shown}"
    );
    let (_, out, err) = bg.wait(Duration::from_secs(20));
    let p = parse_ping(true, out + &err);
    assert_eq!(p.transmitted, 300, "background ping:\n{}", p.output);
    eprintln!(
        "churn: pod1 -> pod2 {} of {} pings answered",
        p.received, p.transmitted
    );
    assert!(
        p.received >= 297,
        "pod1 -> pod2 lost {} of 300 pings while pod3's port came and went",
        300 - p.received
    );

    // 2. Restart after SIGTERM.
    assert!(sw.stop(), "oxvs-switchd did not exit within 5 s of SIGTERM");
    for ifname in ["p1", "p2", "p3"] {
        if let Some(link) = xdp_attached(&node, ifname) {
            panic!("XDP program left on {ifname} after a clean shutdown:\n{link}");
        }
    }
    let p = ping(&pod1, IP2, 2, "0.2", &[]);
    assert_eq!(
        p.received, 0,
        "traffic flows with no switchd:\n{}",
        p.output
    );
    sw = Switchd::start(&node);
    attach_all(&sw);
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(
        p.ok,
        "no traffic after restart (SIGTERM) + reload:\n{}",
        p.output
    );
    tcp_transfer(&pod2, &pod1, IP1, 5001, 256 << 10);

    // 3. Restart after SIGKILL.
    sw.kill();
    sw = Switchd::start(&node);
    attach_all(&sw);
    let p = ping_until_up(&pod1, IP2, 5);
    assert!(
        p.ok,
        "no traffic after a crash (SIGKILL), restart + reload:\n{}",
        p.output
    );
    let p = ping(&pod2, IP1, 5, "0.1", &[]);
    assert_eq!(
        p.received, 5,
        "pod2 -> pod1 after crash restart:\n{}",
        p.output
    );
}
