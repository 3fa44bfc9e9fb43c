//! `oxvs-bench` end to end (the binary, root only; skipped otherwise):
//!
//! - the `ports` setup with the switch under test on this host
//!   (`--dut-ports`): veth pairs stand in for the cables (gen-if <-> P1,
//!   P2 <-> sink-if, root namespace); oxvs, the Linux bridge and (when
//!   clang/libbpf are there) the XDP redirect each forward a 1 s run at a
//!   low rate, the JSON reports every port's mode and the generator's and
//!   sink's socket modes, and afterwards the ports carry no XDP program
//!   and no bridge;
//! - the refusal of a DUT port that has an address (no `--force`);
//! - a scaling smoke: oxvs with 1 and 100,000 flows, 1 and 2 datapath
//!   threads.
//!
//! Names carry the pid; the test's `Lab` removes the veths also when an
//! assertion fails.

mod common;

use std::process::Command;

use common::root;
use oxvs_bench::xbench::setup::{self, must, Lab};
use serde_json::Value;

/// The four "cabled" interfaces: (gen-if, sink-if, P1, P2).
fn cables(lab: &mut Lab, tag: &str) -> [String; 4] {
    let pid = std::process::id();
    let n = |s: &str| format!("xp{pid}{tag}{s}");
    let (g, p1, p2, s) = (n("g"), n("a"), n("b"), n("s"));
    lab.veth(&g, &p1).expect("veth gen-if <-> P1");
    lab.veth(&p2, &s).expect("veth P2 <-> sink-if");
    [g, s, p1, p2]
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oxvs-bench"))
        .args(args)
        .output()
        .expect("run oxvs-bench")
}

fn run_json(args: &[&str], tag: &str) -> Value {
    let json = format!("/tmp/xp-{}-{tag}.json", std::process::id());
    let mut v: Vec<&str> = args.to_vec();
    v.extend_from_slice(&["--json", &json]);
    let out = bench(&v);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "oxvs-bench {args:?} failed:\n{err}");
    let text = std::fs::read_to_string(&json).expect("json written");
    let _ = std::fs::remove_file(&json);
    serde_json::from_str(&text).expect("valid json")
}

#[test]
fn ports_setup_with_the_switch_on_this_host() {
    if !root() {
        return;
    }
    let mut lab = Lab::default();
    let [g, s, p1, p2] = cables(&mut lab, "d");
    let dut = format!("{p1},{p2}");
    let mut switches = "oxvs,bridge".to_owned();
    if setup::xdp_redirect_unavailable().is_none() {
        switches.push_str(",xdp-redirect");
    }
    let doc = run_json(
        &[
            "fixed",
            "--setup",
            "ports",
            "--gen-if",
            &g,
            "--sink-if",
            &s,
            "--dut-ports",
            &dut,
            "--switches",
            &switches,
            "--flows",
            "10",
            "--rate",
            "5000",
            "--duration",
            "1",
            "--trials",
            "1",
        ],
        "ports",
    );
    assert_eq!(doc["skipped"], serde_json::json!([]), "{doc:#}");
    let cases = doc["cases"].as_array().expect("cases");
    let names: Vec<&str> = cases.iter().filter_map(|c| c["switch"].as_str()).collect();
    let want: Vec<&str> = switches
        .split(',')
        .map(|k| match k {
            "bridge" => "linux-bridge",
            other => other,
        })
        .collect();
    assert_eq!(names, want);
    for c in cases {
        let name = c["switch"].as_str().unwrap_or("?");
        let raw = &c["fixed"]["raw"][0];
        let sent = raw["sent"].as_u64().expect("sent");
        let recv = raw["received"].as_u64().expect("received");
        assert!(sent >= 4000, "{name}: sent {sent}");
        assert!(recv * 10 >= sent * 9, "{name}: {recv} of {sent} delivered");
        let modes = c["port_modes"].as_object().expect("port modes");
        for p in [&p1, &p2] {
            let m = modes.get(p.as_str()).and_then(Value::as_str);
            assert!(
                m.is_some_and(|m| !m.is_empty()),
                "{name}: mode of {p}: {modes:?}"
            );
        }
        if name == "oxvs" {
            // veth: native XDP, copy mode (zero-copy is tried on NICs).
            assert!(
                modes
                    .values()
                    .all(|m| m.as_str().is_some_and(|m| m.contains("native"))),
                "{modes:?}"
            );
        }
        for k in ["gen_xdp_mode", "sink_xdp_mode"] {
            assert!(
                raw[k].as_str().is_some_and(|m| m.contains('/')),
                "{name}: {k} = {}",
                raw[k]
            );
        }
    }
    // Restored: no XDP program and no bridge on the DUT ports.
    for p in [&p1, &p2] {
        let j = must(&["ip", "-j", "-d", "link", "show", "dev", p]).expect("ip link");
        assert!(!j.contains("\"xdp\""), "{p} still has XDP: {j}");
        assert!(!j.contains("\"master\""), "{p} still enslaved: {j}");
    }
}

#[test]
fn ports_setup_refuses_an_addressed_dut_port() {
    if !root() {
        return;
    }
    let mut lab = Lab::default();
    let [g, s, p1, p2] = cables(&mut lab, "r");
    // A documentation address (RFC 5737) on P2, in no route of the host's.
    must(&["ip", "addr", "add", "198.51.100.77/32", "dev", &p2]).expect("addr");
    let dut = format!("{p1},{p2}");
    let out = bench(&[
        "fixed",
        "--setup",
        "ports",
        "--gen-if",
        &g,
        "--sink-if",
        &s,
        "--dut-ports",
        &dut,
        "--switches",
        "bridge",
        "--duration",
        "1",
        "--trials",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must refuse: {err}");
    assert!(
        err.contains(&format!("refusing to send on {p2}")) && err.contains("198.51.100.77"),
        "{err}"
    );
    // Nothing was touched: P1 not enslaved, no XDP.
    let j = must(&["ip", "-j", "link", "show", "dev", &p1]).expect("ip link");
    assert!(!j.contains("\"master\"") && !j.contains("\"xdp\""), "{j}");
}

#[test]
fn scaling_smoke_flows_and_threads() {
    if !root() {
        return;
    }
    let doc = run_json(
        &[
            "scaling",
            "--switches",
            "oxvs",
            "--flows",
            "1,100000",
            "--threads",
            "1,2",
            "--rate",
            "5000",
            "--duration",
            "1",
            "--trials",
            "1",
        ],
        "scaling",
    );
    assert_eq!(doc["skipped"], serde_json::json!([]), "{doc:#}");
    let cases = doc["cases"].as_array().expect("cases");
    let got: Vec<(u64, u64)> = cases
        .iter()
        .map(|c| {
            (
                c["threads"].as_u64().unwrap_or(0),
                c["flows"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(got, [(1, 1), (1, 100_000), (2, 1), (2, 100_000)]);
    for c in cases {
        let raw = &c["fixed"]["raw"][0];
        let sent = raw["sent"].as_u64().unwrap_or(0);
        let recv = raw["received"].as_u64().unwrap_or(0);
        assert!(sent >= 4000, "{c:#}");
        assert!(recv * 10 >= sent * 9, "{} of {sent} delivered: {c:#}", recv);
        assert!(raw["switch_cpu_ns"].as_u64().is_some_and(|n| n > 0));
    }
}
