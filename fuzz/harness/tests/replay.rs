//! Replays every committed fuzz corpus through its harness, on stable, as
//! part of `cargo test`: `fuzz/corpus/<target>/*`, each file one input to
//! the same function libFuzzer runs (`oxvs_fuzz_harness::TARGETS`).
//!
//! A test fails when a harness panics on a file (all failing files are
//! named), when a target's corpus directory is missing or holds no file,
//! and when the targets of `fuzz/Cargo.toml`, the files of
//! `fuzz/fuzz_targets/`, the corpus directories and `TARGETS` disagree, so
//! a new target cannot be added without a corpus that CI replays.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use oxvs_fuzz_harness::{harness, TARGETS};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join("corpus").join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} missing: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("read the corpus directory").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "corpus directory {} holds no input",
        dir.display()
    );
    files
}

fn replay(target: &str) {
    let h = harness(target).unwrap_or_else(|| panic!("no harness for {target}"));
    let files = corpus_files(target);
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("read {}: {e}", f.display()));
        if std::panic::catch_unwind(|| h(&data)).is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: the harness panicked on {} of {} corpus files (reproduce with `cargo +nightly fuzz run {target} FILE` from the repository root):\n  {}",
        failed.len(),
        files.len(),
        failed.join("\n  ")
    );
    eprintln!("{target}: {} corpus files replayed", files.len());
}

macro_rules! replay_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                replay(stringify!($name));
            }
        )*

        /// The tests above are exactly the targets.
        #[test]
        fn every_target_is_replayed() {
            let tested: BTreeSet<&str> = [$(stringify!($name)),*].into();
            let targets: BTreeSet<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
            assert_eq!(tested, targets);
        }
    };
}

replay_tests!(
    extract,
    parse_flow,
    datapath,
    ipf,
    conntrack,
    vxlan_rx,
    vxlan_tx,
    control,
    agent_api,
    cni,
    metrics_http,
    ipblock,
);

/// `[[bin]]` names of `fuzz/Cargo.toml`.
fn cargo_fuzz_bins() -> BTreeSet<String> {
    let text = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut bins = BTreeSet::new();
    let mut in_bin = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin {
            if let Some(v) = line.strip_prefix("name") {
                let v = v
                    .trim_start()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"');
                bins.insert(v.to_string());
            }
        }
    }
    bins
}

#[test]
fn fuzz_targets_corpora_and_harnesses_agree() {
    let targets: BTreeSet<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        cargo_fuzz_bins(),
        targets,
        "fuzz/Cargo.toml [[bin]]s vs TARGETS"
    );
    for t in &targets {
        let src = fuzz_dir().join("fuzz_targets").join(format!("{t}.rs"));
        let body =
            std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        assert!(
            body.contains("oxvs_fuzz_harness::"),
            "{} does not call its harness",
            src.display()
        );
    }
    let dirs: BTreeSet<String> = std::fs::read_dir(fuzz_dir().join("corpus"))
        .expect("fuzz/corpus")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs, targets, "fuzz/corpus/* vs TARGETS");
}
