//! End to end, the switch's one XDP program (`switch/src/xdpprog.rs`).
//!
//! 1. Every port on a virtual device runs the same program (one id, named
//!    `oxvs_xsk`): it was loaded once, not per port; traffic flows.
//! 2. `del-port` detaches it from that interface only.
//! 3. An interface that still carries a program attached the old way (by
//!    libxdp, left behind by a crashed switchd started with
//!    `--xdp-program libxdp`, as an older version does) is taken over: the
//!    port falls back to libxdp and traffic flows.
//! 4. After SIGKILL no program of the switch stays on any interface (its
//!    BPF links died with it).
//!
//! Flows: `examples/switch-three-pods.flows`.

mod common;

use common::*;

const IP2: &str = "10.10.0.2";
const FLOWS: &str = "switch-three-pods.flows";

/// The XDP program attached to `ifname` in `node`: (id, name), if any.
fn xdp_prog(node: &Netns, ifname: &str) -> Option<(u64, String)> {
    let out = node.must(&["ip", "-j", "link", "show", "dev", ifname]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j link output");
    let prog = v.get(0)?.get("xdp")?.get("prog")?;
    Some((
        prog.get("id")?.as_u64()?,
        prog.get("name")?.as_str()?.to_string(),
    ))
}

fn pods(node: &Netns) -> Vec<Netns> {
    (1..=3)
        .map(|i| {
            let pod = Netns::new(&format!("pod{i}"));
            make_pod(
                node,
                &pod,
                &format!("p{i}"),
                &format!("10.10.0.{i}/24"),
                &format!("02:00:0a:0a:00:0{i}"),
                1500,
            );
            pod
        })
        .collect()
}

#[test]
fn e2e_xdp_program_shared_detached_and_taken_over() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pods = pods(&node);

    // 1. One program for all.
    let sw = Switchd::start(&node);
    for i in 1..=3u32 {
        sw.add_port(&format!("p{i}"), i);
    }
    sw.add_flows(&example(FLOWS));
    let progs: Vec<_> = ["p1", "p2", "p3"]
        .iter()
        .map(|p| xdp_prog(&node, p).unwrap_or_else(|| panic!("no XDP program on {p}")))
        .collect();
    assert!(
        progs.iter().all(|p| p == &progs[0]),
        "the ports run different programs: {progs:?}"
    );
    assert_eq!(
        progs[0].1, "oxvs_xsk",
        "not the switch's program: {progs:?}"
    );
    let p = ping_until_up(&pods[0], IP2, 5);
    assert!(p.ok, "pod1 -> pod2 never answered:\n{}", p.output);

    // 2. del-port detaches from that interface only.
    sw.ctl_ok(&["del-port", "p3"]);
    assert_eq!(
        xdp_prog(&node, "p3"),
        None,
        "program left on p3 after del-port"
    );
    assert_eq!(xdp_prog(&node, "p1").as_ref(), Some(&progs[0]));
    drop(sw);

    // 3. A program libxdp left behind is taken over.
    let mut old = Switchd::start_with(&node, &["--xdp-program", "libxdp"]);
    old.add_port("p1", 1);
    old.add_port("p2", 2);
    let left = xdp_prog(&node, "p1").expect("libxdp attached nothing to p1");
    assert_ne!(
        left.1, "oxvs_xsk",
        "--xdp-program libxdp used the switch's program"
    );
    old.kill();
    assert_eq!(
        xdp_prog(&node, "p1").as_ref(),
        Some(&left),
        "libxdp's program did not outlive its switchd (the case this test is about)"
    );
    let mut sw = Switchd::start(&node);
    sw.add_port("p1", 1);
    sw.add_port("p2", 2);
    sw.add_port("p3", 3);
    sw.add_flows(&example(FLOWS));
    let p = ping_until_up(&pods[0], IP2, 5);
    assert!(
        p.ok,
        "no traffic over ports taken over from libxdp:\n{}",
        p.output
    );
    let p3 = xdp_prog(&node, "p3").expect("no program on p3");
    assert_eq!(p3.1, "oxvs_xsk", "a free interface got libxdp's program");

    // 4. Nothing of the switch outlives it.
    sw.kill();
    assert_eq!(
        xdp_prog(&node, "p3"),
        None,
        "the switch's program stayed on p3 after SIGKILL"
    );
}
