//! `bench-report` on the committed results: every committed results file
//! still parses and gives its plots (so a format change in a benchmark that
//! forgets the plots fails here), and a broken file makes it exit 1 with a
//! message naming the file and the field while the other plots are still
//! written. Writes only into scratch directories under the temp dir, removed
//! on drop. No root needed.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("bench-report-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench_report() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bench-report"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

#[test]
fn committed_results_give_every_plot() {
    let s = Scratch::new("committed");
    let out = bench_report()
        .arg("--root")
        .arg(root())
        .arg("--out")
        .arg(&s.0)
        .output()
        .expect("run bench-report");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench-report failed:\n{stderr}");
    for (file, labels) in [
        (
            "cni-bench-sequential.svg",
            &["oxvs", "bridge + host-local", "ADD p50", "DEL p99", "cores"][..],
        ),
        ("cni-bench-concurrent.svg", &["oxvs", "bridge + host-local"]),
        ("cni-bench-probe.svg", &["add-port"]),
        (
            "policy-matrix-realisation.svg",
            &["100 pods: slowest node", "1000 pods: slowest node"],
        ),
        ("policy-datapath-pps.svg", &["0 policies", "1000 policies"]),
        (
            "benchmarks-e2e-pps.svg",
            &[
                "oxvs-switchd",
                "Linux bridge",
                "OVS afxdp (PMD)",
                "delivered",
            ],
        ),
        (
            "benchmarks-e2e-cpu.svg",
            &["switch process CPU", "OVS afxdp-nonpmd"],
        ),
        (
            "benchmarks-e2e-tcp.svg",
            &["TCP Gbit/s", "oxvs VXLAN (2 nodes)"],
        ),
    ] {
        let p = s.0.join(file);
        let svg = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{} not written: {e}\n{stderr}", p.display()));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for l in labels {
            assert!(svg.contains(l), "{file}: no {l:?}");
        }
        // The committed plots are what this run makes (regenerate with
        // `cargo run -p oxvs-bench --bin bench-report` when this fails).
        let committed = root().join("bench/results/plots").join(file);
        let c = std::fs::read_to_string(&committed)
            .unwrap_or_else(|e| panic!("{} not committed: {e}", committed.display()));
        assert!(
            c == svg,
            "{} is stale: run `cargo run -p oxvs-bench --bin bench-report`",
            committed.display()
        );
    }
}

#[test]
fn broken_file_is_named_and_others_still_plotted() {
    let s = Scratch::new("broken");
    let bad = s.0.join("policy-old.json");
    std::fs::write(&bad, r#"{"matrix": [{"pods": 100, "policies": 10}]}"#).expect("write");
    let good = root().join("bench/results/cni-bench.json");
    let out_dir = s.0.join("plots");
    let out = bench_report()
        .arg("--out")
        .arg(&out_dir)
        .arg(&bad)
        .arg(&good)
        .output()
        .expect("run bench-report");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("policy-old.json") && stderr.contains("matrix[0].realise_max_ms"),
        "{stderr}"
    );
    assert!(
        out_dir.join("cni-bench-sequential.svg").exists(),
        "{stderr}"
    );
    let out = bench_report()
        .arg("--bogus")
        .output()
        .expect("run bench-report");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unexpected argument") && stderr.contains("--bogus"),
        "{stderr}"
    );
}
