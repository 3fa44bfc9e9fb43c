//! Self-test of the end-to-end harness with no oxvs at all: two plain-Linux
//! nodes (kernel `vxlan` + bridge each) joined by an underlay veth, one pod
//! each. If this fails, the e2e failures are the harness's or the
//! machine's, not oxvs's. It also shows the kernel's own behaviour for the
//! VXLAN tests to compare with.

mod common;

use common::*;

#[test]
fn e2e_harness_kernel_vxlan() {
    skip_unless_capable!();
    let na = Netns::new("kna");
    let nb = Netns::new("knb");
    let pa = Netns::new("kpa");
    let pb = Netns::new("kpb");
    underlay(&na, &nb, 1500);
    make_pod(&na, &pa, "pa", "10.20.0.1/24", "02:00:0a:14:00:01", 1450);
    make_pod(&nb, &pb, "pb", "10.20.0.2/24", "02:00:0a:14:00:02", 1450);
    kernel_vxlan_node(&na, "pa", 100, "192.0.2.1", "192.0.2.2");
    kernel_vxlan_node(&nb, "pb", 100, "192.0.2.2", "192.0.2.1");

    let p = ping_until_up(&pa, "10.20.0.2", 5);
    assert!(p.ok, "{}", p.output);
    let p = ping(&pb, "10.20.0.1", 3, "0.1", &[]);
    assert_eq!(p.received, 3, "{}", p.output);
    tcp_transfer(&pa, &pb, "10.20.0.2", 5001, 1 << 20);
    tcp_transfer(&pb, &pa, "10.20.0.1", 5002, 1 << 20);
    udp_exchange(&pa, &pb, "10.20.0.2", 6001);
    udp_exchange(&pb, &pa, "10.20.0.1", 6002);
    // Within the inner MTU, DF set: passes.
    let p = ping(&pa, "10.20.0.2", 2, "0.2", &["-M", "do", "-s", "1400"]);
    assert_eq!(p.received, 2, "{}", p.output);
}
