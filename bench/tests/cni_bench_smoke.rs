//! Smoke test of `cni-bench`: runs the real binary end to end with 3 pods
//! (oxvs-cni + oxvs-agent + oxvs-switchd against bridge + host-local) and
//! checks that its JSON has both plugins, both verbs, both modes, the
//! agent-side times and the probe steps, and that it left no namespace.
//!
//! Root only; prints SKIPPED and passes (fails with `OXVS_TESTS_NO_SKIP=1`)
//! when not root or when the reference plugins (`/usr/lib/cni/bridge`) are
//! missing. Needs `oxvs-cni`,
//! `oxvs-agent` and `oxvs-switchd` built in the same target directory
//! (`cargo build -p oxvs-cni -p oxvs-agent -p oxvs-switch`; a workspace
//! `cargo test` builds them).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn skip_reason() -> Option<String> {
    if !oxvs_testutil::is_root() {
        return Some("not root".into());
    }
    if !Path::new("/usr/lib/cni/bridge").exists() || !Path::new("/usr/lib/cni/host-local").exists()
    {
        return Some(
            "/usr/lib/cni/bridge or host-local missing (containernetworking-plugins)".into(),
        );
    }
    None
}

#[test]
fn cni_bench_runs_end_to_end() {
    if let Some(why) = skip_reason() {
        oxvs_testutil::skip_or_fail(why);
        return;
    }
    let bench = Path::new(env!("CARGO_BIN_EXE_cni-bench"));
    let dir = bench.parent().expect("the bench binary has a directory");
    for b in ["oxvs-cni", "oxvs-agent", "oxvs-switchd"] {
        assert!(
            dir.join(b).exists(),
            "{} is not built: `cargo build -p oxvs-cni -p oxvs-agent -p oxvs-switch` (same profile) first",
            dir.join(b).display()
        );
    }
    let json = std::env::temp_dir().join(format!("cni-bench-smoke-{}.json", std::process::id()));
    let out = Command::new(bench)
        .args(["--n", "3", "--probe-n", "2", "--json"])
        .arg(&json)
        .output()
        .expect("run cni-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cni-bench failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    let text = std::fs::read_to_string(&json).expect("cni-bench wrote its JSON");
    let _ = std::fs::remove_file(&json);
    let v: Value = serde_json::from_str(&text).expect("valid JSON");

    let results = v["results"].as_array().expect("results array");
    for plugin in ["oxvs", "bridge"] {
        for verb in ["ADD", "DEL"] {
            for mode in ["sequential", "concurrent"] {
                let r = results
                    .iter()
                    .find(|r| r["plugin"] == plugin && r["verb"] == verb && r["mode"] == mode)
                    .unwrap_or_else(|| panic!("no {plugin} {verb} {mode} in {text}"));
                assert_eq!(r["n"], 3, "{r}");
                let p50 = r["p50_ms"].as_f64().expect("p50_ms");
                let max = r["max_ms"].as_f64().expect("max_ms");
                assert!(p50 > 0.0 && p50 <= max, "{r}");
            }
        }
    }
    // The agent served (and logged) every oxvs request.
    for a in v["agent_side"].as_array().expect("agent_side array") {
        assert_eq!(a["n"], 3, "agent-side times missing: {a}");
    }
    let probe = v["probe"].as_array().expect("probe array");
    assert!(
        probe
            .iter()
            .any(|p| p["step"].as_str().is_some_and(|s| s.contains("add-port"))),
        "no add-port step in the probe: {text}"
    );
    for k in ["cpu_model", "cores", "kernel"] {
        assert!(!v["machine"][k].is_null(), "machine.{k} missing: {text}");
    }
    // Nothing left behind.
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let left = String::from_utf8_lossy(&ns.stdout);
    let mine = format!("oxcnib-{}", v["bench_pid"].as_u64().unwrap_or(0));
    assert!(
        !left.lines().any(|l| l.starts_with(&format!("{mine}-"))),
        "namespaces left behind:\n{left}"
    );
}
