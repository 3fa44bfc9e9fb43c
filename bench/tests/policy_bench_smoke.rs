//! Smoke tests of `policy-bench` (`oxvs_bench::policy_bench`): a tiny model
//! through the in-process realisation and the datapath measurement, the
//! lab manifests read back by the agent's own manifest parser, and (root
//! only, else skipped with a message; a failure with `OXVS_TESTS_NO_SKIP=1`)
//! the end-to-end `policy-bench lab` on a 2-node `oxvs-lab` of 4 pods, with
//! the lab binaries of the same build (`cargo build --workspace`).

use std::time::Duration;

use oxvs_agent::source::{parse_manifest, Object};
use oxvs_bench::policy_bench::{
    allowed_traffic, datapath_pps, lab_objects, realise, to_yaml_docs, traffic, Model, ModelSpec,
    Summary,
};

fn tiny(policies: usize) -> Model {
    Model::new(ModelSpec {
        pods: 24,
        policies,
        nodes: 2,
        pods_per_namespace: 12,
    })
    .expect("tiny model")
}

#[test]
fn realises_policies_on_every_node() {
    let none = realise(&tiny(0), None).expect("realise without policies");
    assert!(none.iter().all(|n| n.policy_flows == 0), "{none:?}");

    let m = tiny(6);
    let live = || 0i64;
    let r = realise(&m, Some(&live)).expect("realise");
    assert_eq!(r.len(), 2);
    for n in &r {
        assert_eq!(n.local_pods, 12);
        assert!(n.base_flows > 30, "{n:?}");
        // Every policy selects pods on both nodes (pods alternate nodes).
        assert!(n.policy_flows > 6 && n.rules >= 6, "{n:?}");
        assert!(n.text_bytes > 50 * n.policy_flows, "{n:?}");
        assert_eq!(n.heap_bytes, Some(0));
    }
    // More policies, more flows (union, merged clauses).
    let r12 = realise(&tiny(12), None).expect("realise 12");
    assert!(r12[0].policy_flows > r[0].policy_flows);
    let s = Summary {
        spec: m.spec,
        nodes: r,
    };
    assert_eq!(s.row().len(), Summary::HEADER.len());
    assert!(s.realise_sum() >= s.realise_max());
}

#[test]
fn datapath_forwards_and_policies_drop_some() {
    let m = tiny(12);
    let dur = Duration::from_millis(20);
    let pkts = traffic(&m, 128);
    let open = datapath_pps(&m.without_policies(), &pkts, true, 1, dur).expect("no policies");
    assert_eq!(open.drops, 0, "{open:?}");
    assert_eq!(open.outputs, 128, "every packet forwarded: {open:?}");
    assert_eq!(open.upcalls, 0, "steady state: {open:?}");
    assert!(open.pps > 0.0);
    let closed = datapath_pps(&m, &pkts, false, 1, dur).expect("with policies");
    assert!(closed.flows > open.flows);
    assert_eq!(closed.emc_hits, 0, "EMC off: {closed:?}");
    assert!(
        closed.megaflow_hits > 0 && closed.upcalls == 0,
        "{closed:?}"
    );
    assert!(
        closed.drops > 0 && closed.outputs > 0,
        "some traffic allowed, some denied: {closed:?}"
    );
    let ok = allowed_traffic(&m, 64).expect("allowed");
    assert_eq!(ok.len(), 64);
    let r = datapath_pps(&m, &ok, true, 1, dur).expect("allowed only");
    assert_eq!((r.outputs, r.drops), (64, 0), "{r:?}");
}

#[test]
fn lab_manifests_read_back_as_the_model() {
    let m = tiny(9);
    let (base, pols) = lab_objects(&m);
    let (objs, warnings) = parse_manifest(&to_yaml_docs(&pols), false).expect("policies parse");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(objs.len(), 9);
    for o in objs {
        let Object::NetworkPolicy(mut p) = o else {
            panic!("not a policy: {}", o.describe());
        };
        let want = m.state.policies.get(&p.key()).expect("known policy");
        p.uid = want.uid.clone();
        assert_eq!(&p, want);
    }
    let (objs, warnings) = parse_manifest(&to_yaml_docs(&base), false).expect("pods parse");
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut pods = 0;
    for o in objs {
        match o {
            Object::Pod(p) => {
                let want = m.state.pods.get(&p.key()).expect("known pod");
                assert_eq!(
                    (&p.labels, &p.ports, &p.node_name),
                    (&want.labels, &want.ports, &want.node_name)
                );
                pods += 1;
            }
            Object::Namespace(n) => {
                // The lab (like the API server) adds kubernetes.io/metadata.name.
                let mut want = m
                    .state
                    .namespaces
                    .get(&n.name)
                    .expect("known ns")
                    .labels
                    .clone();
                want.remove("kubernetes.io/metadata.name");
                assert_eq!(want, n.labels);
            }
            other => panic!("unexpected {}", other.describe()),
        }
    }
    assert_eq!(pods, 24);
}

/// Removes the lab on drop (also when the test fails).
struct LabGuard {
    bin: std::path::PathBuf,
    name: String,
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new(&self.bin)
            .args(["--name", &self.name, "down"])
            .status();
    }
}

#[test]
fn lab_end_to_end_tiny() {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("needs root (a 2-node oxvs-lab)");
        return;
    }
    let bench = std::path::PathBuf::from(env!("CARGO_BIN_EXE_policy-bench"));
    let dir = bench
        .parent()
        .expect("the bench binary has a directory")
        .to_path_buf();
    let lab_bin = dir.join("oxvs-lab");
    for b in ["oxvs-lab", "oxvs-switchd", "oxvs-agent", "oxvs-cni"] {
        assert!(
            dir.join(b).exists(),
            "{} missing: cargo build --workspace (same profile) first",
            dir.join(b).display()
        );
    }
    let name = format!("pbs{}", std::process::id() % 100_000);
    let guard = LabGuard {
        bin: lab_bin.clone(),
        name: name.clone(),
    };
    let up = std::process::Command::new(&lab_bin)
        .args(["--name", &name, "up", "--nodes", "2"])
        .status()
        .expect("oxvs-lab up");
    assert!(up.success(), "oxvs-lab up failed");
    let work = std::env::temp_dir().join(format!("oxvs-pbs-{}", std::process::id()));
    let json = work.join("lab.json");
    std::fs::create_dir_all(&work).expect("work dir");
    let st = std::process::Command::new(&bench)
        .args([
            "lab",
            "--lab",
            &name,
            "--pods",
            "4",
            "--policies",
            "2",
            "--timeout",
            "60",
        ])
        .arg("--bin-dir")
        .arg(&dir)
        .arg("--work-dir")
        .arg(&work)
        .arg("--json")
        .arg(&json)
        .status()
        .expect("policy-bench lab");
    assert!(st.success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("json");
    for n in v["lab"][0]["nodes"].as_array().expect("nodes") {
        assert_eq!(n["policy_flows"], n["expected_policy_flows"], "{n}");
        assert!(n["realised_s"].is_number(), "{n}");
    }
    drop(guard);
    let _ = std::fs::remove_dir_all(&work);
}
