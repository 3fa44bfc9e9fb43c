//! Generator/sink accounting on real veths (root only; skipped otherwise):
//!
//! - a plain veth pair between two namespaces: sent == received + lost,
//!   every flow's frames accounted, nothing reordered or duplicated;
//! - `oxvs-switchd` in the middle dropping flow K (`udp,tp_src=1024+K`):
//!   the loss is exactly flow K's frames;
//! - a smoke test of the `virtual` setup with each method at tiny
//!   durations (oxvs, the Linux bridge and the kernel XDP redirect);
//! - the Antrea-like pipeline (1000 policies) on oxvs: the running switch's
//!   trace and the traffic agree that the chosen pods' frames are
//!   delivered, and a denied port is not;
//! - the two-node VXLAN setup delivers pod to pod, with oxvs and with
//!   Open vSwitch userspace (two private instances; skipped without OVS);
//! - the pacing holds a 200 kpps target on a plain veth.
//!
//! Names carry the pid; the guards of `xbench::setup` remove everything,
//! also when an assertion fails.

mod common;

use std::time::Duration;

use common::root;
use oxvs_bench::xbench::gen::GenConfig;
use oxvs_bench::xbench::methods::{self, run_trial, TrialOpts};
use oxvs_bench::xbench::pipeline::Plan;
use oxvs_bench::xbench::setup::{self, must, Endpoint, Lab, SwitchKind};

/// Two namespaces joined by one veth (`eth0` in each).
fn veth_pair(lab: &mut Lab) -> (Endpoint, Endpoint) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let a = lab.netns(&format!("tv{n}a")).expect("netns");
    let b = lab.netns(&format!("tv{n}b")).expect("netns");
    must(&[
        "ip", "-n", &a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &b,
    ])
    .expect("veth");
    for ns in [&a, &b] {
        must(&["ip", "-n", ns, "link", "set", "eth0", "up"]).expect("up");
    }
    (
        Endpoint {
            netns: Some(a),
            ifname: "eth0".into(),
            queues: 1,
        },
        Endpoint {
            netns: Some(b),
            ifname: "eth0".into(),
            queues: 1,
        },
    )
}

#[test]
fn veth_accounting_sent_equals_received_plus_loss() {
    if !root() {
        return;
    }
    let mut lab = Lab::default();
    let (g, s) = veth_pair(&mut lab);
    let cfg = GenConfig {
        flows: 37,
        rate_pps: 20_000,
        count: Some(5_000),
        duration: Duration::from_secs(5),
        ..GenConfig::default()
    };
    let t = run_trial(
        &g,
        &s,
        &cfg,
        &[],
        &TrialOpts {
            per_flow: true,
            ..Default::default()
        },
    )
    .expect("trial");
    assert_eq!(t.gen.sent, 5_000);
    assert_eq!(t.gen.sent, t.received + t.lost());
    assert_eq!(t.lost(), 0, "a plain veth at 20 kpps loses nothing");
    assert_eq!((t.reordered, t.duplicates), (0, 0));
    let per = t.per_flow_received.expect("per flow");
    for (i, r) in per.iter().enumerate() {
        assert_eq!(*r, t.gen.sent_for_flow(i as u32), "flow {i}");
    }
    assert_eq!(t.latency.count(), t.received);
    assert!(t.latency.quantile(0.5).is_some_and(|v| v > 0));
}

#[test]
fn injected_reordering_is_reported_exactly() {
    if !root() {
        return;
    }
    let mut lab = Lab::default();
    let (g, s) = veth_pair(&mut lab);
    // 4 flows x 1000 frames; per flow, the first two of every 10 sequence
    // numbers are swapped at the generator: 100 reordered arrivals a flow.
    let cfg = GenConfig {
        flows: 4,
        rate_pps: 20_000,
        count: Some(4_000),
        duration: Duration::from_secs(5),
        reorder_every: 10,
        ..GenConfig::default()
    };
    let t = run_trial(&g, &s, &cfg, &[], &TrialOpts::default()).expect("trial");
    assert_eq!(t.gen.sent, 4_000);
    assert_eq!(t.lost(), 0, "a plain veth at 20 kpps loses nothing");
    assert_eq!(t.reordered, 400, "one reordered arrival per block of 10");
    assert_eq!(t.duplicates, 0);
}

#[test]
fn oxvs_drop_every_4th_flow_is_exactly_the_loss() {
    if !root() {
        return;
    }
    let bins = setup::oxvs_bins().expect("oxvs binaries");
    // Every 4th flow is dropped: flow i has source port 1024 + i, and
    // 1024 is a multiple of 4, so `tp_src=0x3/0x3` matches flows 3, 7, 11, 15.
    const EVERY: u32 = 4;
    let flows = "priority=100,udp,tp_src=0x3/0x3 actions=drop\npriority=10,in_port=1 actions=output:2\npriority=10,in_port=2 actions=output:1\n";
    let sw = setup::start_switch(&SwitchKind::OXVS, &Plan::simple(flows), Some(&bins))
        .expect("oxvs-switchd");
    let cfg = GenConfig {
        flows: 16,
        rate_pps: 20_000,
        count: Some(4_000),
        duration: Duration::from_secs(5),
        ..GenConfig::default()
    };
    let t = run_trial(
        &sw.topo.gen,
        &sw.topo.sink,
        &cfg,
        &sw.pids,
        &TrialOpts {
            per_flow: true,
            ..Default::default()
        },
    )
    .expect("trial");
    assert_eq!(t.gen.sent, 4_000);
    let per = t.per_flow_received.clone().expect("per flow");
    let dropped = |i: u32| i % EVERY == EVERY - 1;
    let expected_loss: u64 = (0..16)
        .filter(|&i| dropped(i))
        .map(|i| t.gen.sent_for_flow(i))
        .sum();
    assert_eq!(
        expected_loss, 1_000,
        "a quarter of the frames are the dropped flows'"
    );
    assert_eq!(t.lost(), expected_loss, "loss = the dropped flows' frames");
    for (i, r) in per.iter().enumerate() {
        let want = if dropped(i as u32) {
            0
        } else {
            t.gen.sent_for_flow(i as u32)
        };
        assert_eq!(*r, want, "flow {i}");
    }
    assert_eq!((t.reordered, t.duplicates), (0, 0));
    assert!(t.cpu_ns.is_some_and(|c| c > 0), "switch CPU measured");
}

#[test]
fn virtual_setup_smoke_each_method() {
    if !root() {
        return;
    }
    let bins = setup::oxvs_bins().expect("oxvs binaries");
    let mut kinds = vec![SwitchKind::OXVS, SwitchKind::Bridge];
    match setup::xdp_redirect_unavailable() {
        None => kinds.push(SwitchKind::XdpRedirect),
        Some(why) => oxvs_testutil::skip_or_fail(format!("xdp-redirect: {why}")),
    }
    for kind in kinds {
        let sw = setup::start_switch(&kind, &Plan::simple(setup::SIMPLE_FLOWS), Some(&bins))
            .expect("switch");
        if kind == SwitchKind::XdpRedirect {
            for p in [&sw.topo.port1, &sw.topo.port2] {
                let j = must(&["ip", "-j", "link", "show", "dev", p]).expect("ip link");
                assert!(j.contains("\"xdp\""), "{p}: no XDP program attached: {j}");
            }
            assert_eq!(sw.pids, [methods::SOFTIRQ], "CPU is the softirq time");
        }
        let cfg = GenConfig {
            flows: 1000,
            rate_pps: 10_000,
            duration: Duration::from_millis(300),
            ..GenConfig::default()
        };
        let drops = || sw.oxvs_drop_counters();
        let f =
            methods::fixed(&sw.topo.gen, &sw.topo.sink, &cfg, &sw.pids, 1, &drops).expect("fixed");
        assert!(f[0].received > 0, "{}: delivered", sw.name);
        assert_eq!(f[0].gen.sent, f[0].received + f[0].lost());
        // Where losses would be: oxvs's counters are read around the
        // trial (none moved at 10 kpps), the bridge has none to read.
        match kind {
            SwitchKind::Oxvs { .. } => assert_eq!(
                f[0].switch_drops.as_ref().map(|d| d.len()),
                Some(0),
                "oxvs drop counters: {:?}",
                f[0].switch_drops
            ),
            _ => assert_eq!(f[0].switch_drops, None),
        }
        assert!(f[0].machine.is_some_and(|m| (0.0..=1.0).contains(&m.busy)));
        let s = methods::throughput(&sw.topo.gen, &sw.topo.sink, &cfg, &sw.pids, 0.01, 2)
            .unwrap_or_else(|e| panic!("throughput: {e:#}"));
        assert!(!s.steps.is_empty());
        // Scaling = fixed runs over flow counts.
        for flows in [1, 10_000] {
            let c = GenConfig {
                flows,
                ..cfg.clone()
            };
            let r = methods::fixed(&sw.topo.gen, &sw.topo.sink, &c, &sw.pids, 1, &drops)
                .expect("scaling");
            assert!(r[0].received > 0);
        }
        drop(sw);
    }
    let left: Vec<String> = std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("xb-{}-lb", std::process::id())))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// The pacing holds a 200 kpps target on a plain veth (>= 90% sent, no
/// overshoot); on a machine whose generator cannot send 220 kpps unpaced
/// (a loaded 2-core VM, a debug build), the target is lowered to what it
/// can (unpaced / 1.1) rather than the test skipped.
#[test]
fn paced_200kpps_on_veth_reaches_90_percent() {
    if !root() {
        return;
    }
    let mut lab = Lab::default();
    let (g, s) = veth_pair(&mut lab);
    let base = GenConfig {
        flows: 64,
        duration: Duration::from_millis(1500),
        ..GenConfig::default()
    };
    let unpaced = run_trial(&g, &s, &base, &[], &TrialOpts::default()).expect("unpaced");
    let top = unpaced.gen.pps();
    eprintln!("unpaced: {top:.0} pps");
    let target: f64 = (top / 1.1).min(200_000.0);
    assert!(
        target >= 20_000.0,
        "the generator does only {top:.0} pps unpaced: nothing to pace"
    );
    let cfg = GenConfig {
        rate_pps: target as u64,
        duration: Duration::from_secs(2),
        ..base
    };
    let t = run_trial(&g, &s, &cfg, &[], &TrialOpts::default()).expect("paced");
    eprintln!(
        "paced {target:.0} pps: sent {:.0} pps, delivered {:.0} pps",
        t.gen.pps(),
        t.delivered_pps()
    );
    assert!(
        t.gen.pps() >= 0.9 * target,
        "asked {target:.0} pps, sent {:.0} pps (unpaced {top:.0})",
        t.gen.pps()
    );
    assert!(
        t.gen.pps() <= 1.02 * target,
        "asked {target:.0} pps, sent {:.0} pps: pacing overshoots",
        t.gen.pps()
    );
}

#[test]
fn antrea_pipeline_on_oxvs_delivers_the_allowed_pair() {
    if !root() {
        return;
    }
    let bins = setup::oxvs_bins().expect("oxvs binaries");
    let plan = Plan::antrea(1000).expect("plan");
    // start_switch runs `oxvsctl trace` on the sample frame and fails if
    // it is not delivered.
    let sw = setup::start_switch(&SwitchKind::OXVS, &plan, Some(&bins))
        .expect("oxvs-switchd with the antrea pipeline");
    let mut cfg = GenConfig {
        flows: 100,
        rate_pps: 20_000,
        count: Some(2_000),
        duration: Duration::from_secs(5),
        ..GenConfig::default()
    };
    plan.apply(&mut cfg).expect("plan applies");
    let t = run_trial(
        &sw.topo.gen,
        &sw.topo.sink,
        &cfg,
        &sw.pids,
        &TrialOpts::default(),
    )
    .expect("trial");
    assert_eq!(t.gen.sent, 2_000);
    assert_eq!(
        t.received, 2_000,
        "{}: allowed traffic delivered",
        plan.note
    );
    // The same frames to a port no rule allows: all dropped by policy.
    let denied = GenConfig {
        dst_port: 1,
        ..cfg.clone()
    };
    let t = run_trial(
        &sw.topo.gen,
        &sw.topo.sink,
        &denied,
        &sw.pids,
        &TrialOpts::default(),
    )
    .expect("trial");
    assert_eq!(t.gen.sent, 2_000);
    assert_eq!(t.received, 0, "denied port delivered");
    // A plan whose frames are not delivered is refused before measuring.
    let mut bad = plan.clone();
    bad.dst_port = 1;
    let e = setup::start_switch(&SwitchKind::OXVS, &bad, Some(&bins))
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("not delivered"), "{e:#}");
}

#[test]
fn vxlan_two_node_setup_delivers_pod_to_pod() {
    if !root() {
        return;
    }
    let bins = setup::oxvs_bins().expect("oxvs binaries");
    let sw = setup::start_vxlan_pair(1, false, &bins).expect("two nodes");
    assert_eq!(sw.pids.len(), 2);
    let cfg = GenConfig {
        flows: 50,
        rate_pps: 20_000,
        count: Some(2_000),
        duration: Duration::from_secs(5),
        ..GenConfig::default()
    };
    let t = run_trial(
        &sw.topo.gen,
        &sw.topo.sink,
        &cfg,
        &sw.pids,
        &TrialOpts::default(),
    )
    .expect("trial");
    assert_eq!(t.gen.sent, 2_000);
    assert!(t.received >= 1_990, "received {} of 2000", t.received);
    assert!(t.cpu_ns.is_some_and(|c| c > 0));
    let ns = sw.topo.gen.netns.clone().expect("netns");
    drop(sw);
    assert!(!std::path::Path::new(&format!("/var/run/netns/{ns}")).exists());
}

#[test]
fn vxlan_two_node_setup_with_ovs_pmd_delivers_pod_to_pod() {
    if !root() {
        return;
    }
    if let Some(why) = setup::ovs_vxlan::ovs_vxlan_unavailable() {
        oxvs_testutil::skip_or_fail(why);
        return;
    }
    // start_ovs_vxlan_pair checks every step with ofproto/trace first.
    let sw = setup::ovs_vxlan::start_ovs_vxlan_pair("afxdp")
        .unwrap_or_else(|e| panic!("OVS on two nodes: {e:#}"));
    assert_eq!(sw.pids.len(), 2, "both ovs-vswitchd measured");
    for p in &sw.pids {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).expect("pid alive");
        assert_eq!(comm.trim(), "ovs-vswitchd", "pid {p}");
    }
    let cfg = GenConfig {
        flows: 50,
        rate_pps: 5_000,
        duration: Duration::from_secs(1),
        ..GenConfig::default()
    };
    let t = run_trial(
        &sw.topo.gen,
        &sw.topo.sink,
        &cfg,
        &sw.pids,
        &TrialOpts::default(),
    )
    .expect("trial");
    eprintln!(
        "ovs-pmd over VXLAN: sent {}, received {}, lost {}",
        t.gen.sent,
        t.received,
        t.lost()
    );
    assert!(t.gen.sent >= 1_000, "sent only {}", t.gen.sent);
    assert_eq!(t.gen.sent, t.received + t.lost());
    // A loaded shared VM may drop a few frames while the PMDs warm up.
    assert!(
        t.received * 100 >= t.gen.sent * 95,
        "received {} of {}",
        t.received,
        t.gen.sent
    );
    assert!(t.cpu_ns.is_some_and(|c| c > 0), "ovs-vswitchd CPU measured");
    let ns = sw.topo.gen.netns.clone().expect("netns");
    let pids = sw.pids.clone();
    drop(sw);
    assert!(!std::path::Path::new(&format!("/var/run/netns/{ns}")).exists());
    for p in pids {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        assert_ne!(comm.trim(), "ovs-vswitchd", "ovs-vswitchd {p} still runs");
    }
    let dirs: Vec<String> = std::fs::read_dir("/tmp")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.starts_with(&format!("xb-{}-", std::process::id())) && n.contains("-ovs-")
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(dirs.is_empty(), "OVS directories left: {dirs:?}");
}

#[test]
fn multi_queue_generator_and_sink_through_oxvs() {
    if !root() {
        return;
    }
    let bins = setup::oxvs_bins().expect("oxvs binaries");
    // 3 queues a veth; 7 flows: lanes of 3, 2 and 2 flows (flow i on
    // queue i % 3), every one accounted, in order.
    let topo = setup::Virtual::new("mq", 3).expect("3-queue topology");
    assert_eq!((topo.gen.queues, topo.sink.queues), (3, 3));
    let sw = setup::start_switch_on(
        &SwitchKind::OXVS,
        &Plan::simple(setup::SIMPLE_FLOWS),
        Some(&bins),
        topo,
    )
    .expect("oxvs-switchd");
    let cfg = GenConfig {
        flows: 7,
        rate_pps: 20_000,
        count: Some(7_000),
        duration: Duration::from_secs(5),
        ..GenConfig::default()
    };
    let t = run_trial(
        &sw.topo.gen,
        &sw.topo.sink,
        &cfg,
        &sw.pids,
        &TrialOpts {
            per_flow: true,
            ..Default::default()
        },
    )
    .expect("trial");
    assert_eq!(t.gen.sent, 7_000);
    assert_eq!(t.lost(), 0, "3 queues at 20 kpps lose nothing");
    assert_eq!((t.reordered, t.duplicates), (0, 0));
    let per = t.per_flow_received.clone().expect("per flow");
    for (i, r) in per.iter().enumerate() {
        assert_eq!(*r, t.gen.sent_for_flow(i as u32), "flow {i}");
    }
    // Every queue of the generator's port carried its lane.
    let q = sw.oxvs_queue_rx().expect("per-queue counters");
    let gen_port = q.split("; ").next().unwrap_or_default().to_owned();
    for k in 0..3 {
        let n: u64 = gen_port
            .split(&format!(" q{k}(thread 0)="))
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(n >= 2_000, "queue {k} of {gen_port}");
    }
}
