//! # `bench-report`: SVG plots from the committed benchmark results
//!
//! Reads results JSON files written by `cni-bench`, `policy-bench` and
//! `e2e` and writes their plots (`oxvs_bench::plots`) into a directory.
//!
//! ```text
//! bench-report [--root DIR] [--out DIR] [FILE.json ...]
//! ```
//!
//! Without files it reads the committed ones: `bench/results/cni-bench.json`,
//! `bench/results/policy-*.json`, `bench/results/e2e-*.json` and
//! `docs/benchmarks-e2e.json` (paths from
//! the workspace root, found from this crate's manifest directory; `--root
//! DIR` overrides it); `--out` defaults to `bench/results/plots`. A default
//! file that does not exist is skipped with a message; a file that cannot
//! be read, is not JSON, or lacks a field skips its plots with a message
//! naming the file and the field, and the exit status is then 1.
//!
//! Single-threaded; writes only under `--out`.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use oxvs_bench::plots;

/// SVG plots from the results JSON of cni-bench, policy-bench and e2e.
#[derive(Debug, Parser)]
#[command(name = "bench-report", version)]
struct Opts {
    /// The workspace root the default files are read from (default: this
    /// crate's parent directory).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Where the SVG files go (default: ROOT/bench/results/plots).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Results files (default: the committed ones).
    #[arg(value_name = "FILE.json")]
    files: Vec<PathBuf>,
}

/// The committed results files under `root` (sorted; absent ones included
/// so that the caller can say they are missing).
fn default_files(root: &Path) -> Result<Vec<PathBuf>> {
    let results = root.join("bench/results");
    let mut files = vec![results.join("cni-bench.json")];
    let mut policy: Vec<PathBuf> = match std::fs::read_dir(&results) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    (n.starts_with("policy-") || n.starts_with("e2e-")) && n.ends_with(".json")
                })
            })
            .collect(),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot list {}", results.display()));
        }
    };
    policy.sort();
    if policy.is_empty() {
        eprintln!(
            "bench-report: no policy-*.json or e2e-*.json in {}",
            results.display()
        );
    }
    files.extend(policy);
    files.push(root.join("docs/benchmarks-e2e.json"));
    Ok(files)
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bench-report: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ok(false): some file's plots were skipped because of an error.
fn real_main() -> Result<bool> {
    let o = Opts::parse();
    let root = o.root.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    });
    let explicit = !o.files.is_empty();
    let files = if explicit {
        o.files.clone()
    } else {
        default_files(&root)?
    };
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| root.join("bench/results/plots"));
    let mut ok = true;
    let mut n = 0;
    for f in &files {
        if !explicit && !f.exists() {
            eprintln!("bench-report: {} does not exist: skipped", f.display());
            continue;
        }
        match plots::plot_file(f, &out) {
            Ok(written) => {
                for w in written {
                    println!("{} -> {}", f.display(), w.display());
                    n += 1;
                }
            }
            Err(e) => {
                eprintln!("bench-report: SKIPPED plots of {e:#}");
                ok = false;
            }
        }
    }
    println!("bench-report: {n} plots in {}", out.display());
    Ok(ok)
}
