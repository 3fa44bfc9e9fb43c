//! # `bench-report`: SVG plots from the committed benchmark results
//!
//! Reads results JSON files written by `cni-bench`, `policy-bench` and
//! `e2e` and writes their plots (`oxvs_bench::plots`) into a directory.
//!
//! ```text
//! bench-report [--out DIR] [FILE.json ...]
//! ```
//!
//! Without files it reads the committed ones: `bench/results/cni-bench.json`,
//! `bench/results/policy-*.json` and `docs/benchmarks-e2e.json` (paths from
//! the workspace root, found from this crate's manifest directory; `--root
//! DIR` overrides it); `--out` defaults to `bench/results/plots`. A default
//! file that does not exist is skipped with a message; a file that cannot
//! be read, is not JSON, or lacks a field skips its plots with a message
//! naming the file and the field, and the exit status is then 1.
//!
//! Single-threaded; writes only under `--out`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use oxvs_bench::plots;

const USAGE: &str = "usage: bench-report [--root DIR] [--out DIR] [FILE.json ...]";

struct Opts {
    root: PathBuf,
    out: Option<PathBuf>,
    files: Vec<PathBuf>,
}

fn parse_opts() -> Result<Opts> {
    let mut o = Opts {
        root: Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        out: None,
        files: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .ok_or_else(|| anyhow!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--root" => o.root = val()?.into(),
            "--out" => o.out = Some(val()?.into()),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            f if f.starts_with("--") => bail!("unknown argument {f}\n{USAGE}"),
            f => o.files.push(f.into()),
        }
    }
    Ok(o)
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
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("policy-") && n.ends_with(".json"))
            })
            .collect(),
        Err(e) => {
            return Err(e).with_context(|| format!("cannot list {}", results.display()));
        }
    };
    policy.sort();
    if policy.is_empty() {
        eprintln!(
            "bench-report: no policy-*.json in {}: no NetworkPolicy plots",
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
    let o = parse_opts()?;
    let explicit = !o.files.is_empty();
    let files = if explicit {
        o.files.clone()
    } else {
        default_files(&o.root)?
    };
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| o.root.join("bench/results/plots"));
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
