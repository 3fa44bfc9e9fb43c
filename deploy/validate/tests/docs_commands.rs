//! Every command the documentation shows must still be one the project's
//! binaries accept, and every repository path it names must exist, so the
//! docs cannot rot silently: every command shown in the docs is one a test
//! or the demo can run.
//!
//! What is read: `README.md`, every `docs/*.md` and every `*/README.md`;
//! in them, the lines of fenced code blocks (a `$ ` prompt stripped,
//! `\`-continued lines joined, shell comments dropped) and inline code
//! spans. A command is a word naming one of the workspace's binaries
//! (bare, `target/<profile>/NAME`, or `cargo run ... --bin NAME -- ARGS`);
//! its arguments run to the first shell operator. For each: the
//! subcommand path (`oxvs-lab node add`) must exist in the binary's own
//! `--help` (a placeholder in capitals is accepted), and each `--flag`
//! must be listed by the `--help` of that subcommand or of its parents.
//! Paths: a word that starts with one of the repository's top-level
//! directories and has a `/` must exist (scripts also executable).
//!
//! What runs them for real: `scripts/demo.sh` (the lab, dump-flows,
//! traceflow; CI runs it after the tests), the lab, CLI and benchmark
//! smoke tests, and `daemonset_e2e.rs` for the `kubectl` commands of
//! docs/operations.md. This test is the net under all of them: a renamed
//! flag or subcommand, a moved script or example fails here, naming the
//! file and line.
//!
//! Needs the workspace built with the test's profile (`cargo test` builds
//! every binary); prints SKIPPED otherwise (a failure with
//! `OXVS_TESTS_NO_SKIP=1`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use oxvs_deploy_validate::built_binaries_dir;

/// Binaries whose `--help` describes their command line (clap).
const CLI: [&str; 9] = [
    "oxvsctl",
    "oxvs-lab",
    "oxvs-bench",
    "policy-bench",
    "cni-bench",
    "oxvs-agent",
    "oxvs-switchd",
    "e2e",
    "bench-report",
];
/// Binaries that take only positional arguments (no `--help`): checked to
/// exist, not parsed.
const POSITIONAL: [&str; 3] = ["memflow", "genflows", "oxvs-cni"];
/// Names too generic to recognise bare in prose (only as
/// `target/*/NAME` or `--bin NAME`).
const ONLY_QUALIFIED: [&str; 1] = ["e2e"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The markdown files checked, relative to the repository.
fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut out = vec![PathBuf::from("README.md")];
    let mut push_dir = |dir: &str, only: Option<&str>| {
        let Ok(rd) = std::fs::read_dir(root.join(dir)) else {
            return;
        };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .filter(|p| only.is_none_or(|o| p.file_name().is_some_and(|n| n == o)))
            .filter_map(|p| p.strip_prefix(&root).ok().map(Path::to_path_buf))
            .collect();
        v.sort();
        out.extend(v);
    };
    push_dir("docs", None);
    for d in top_dirs() {
        if d != "docs" {
            push_dir(&d, Some("README.md"));
        }
    }
    out
}

/// The repository's top-level directories (not hidden, not `target`).
fn top_dirs() -> BTreeSet<String> {
    std::fs::read_dir(repo())
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.') && n != "target")
                .collect()
        })
        .unwrap_or_default()
}

/// (line number, text) of every command-bearing snippet of a markdown
/// document: code-block lines (continuations joined) and inline spans.
fn snippets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    // Blocks labelled as something else than a shell (text, json, yaml)
    // hold output, diagrams or data, not commands.
    let mut shell = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let t = line.trim_start();
        if let Some(lang) = t.strip_prefix("```") {
            in_block = !in_block;
            shell = matches!(lang.trim(), "" | "sh" | "bash" | "console" | "shell");
            if let Some(p) = pending.take() {
                out.push(p);
            }
            continue;
        }
        if in_block && !shell {
            continue;
        }
        if in_block {
            let body = t.strip_prefix("$ ").unwrap_or(t);
            let (start, mut acc) = pending.take().unwrap_or((n, String::new()));
            if body.starts_with('#') && acc.is_empty() {
                continue;
            }
            if let Some(head) = body.trim_end().strip_suffix('\\') {
                acc.push_str(head);
                acc.push(' ');
                pending = Some((start, acc));
            } else {
                acc.push_str(body);
                out.push((start, acc));
            }
            continue;
        }
        // Inline code spans of prose lines.
        let mut parts = line.split('`');
        parts.next();
        while let Some(code) = parts.next() {
            out.push((n, code.to_string()));
            parts.next();
        }
    }
    if let Some(p) = pending {
        out.push(p);
    }
    out
}

/// Shell-ish words: whitespace-separated, quotes removed, up to a
/// comment (a word starting with `#`).
fn words(s: &str) -> Vec<String> {
    s.split_whitespace()
        .take_while(|w| !w.starts_with('#'))
        .map(|w| w.trim_matches(|c| c == '\'' || c == '"').to_string())
        .collect()
}

fn is_operator(w: &str) -> bool {
    matches!(w, "|" | "||" | "&&" | ";" | "&" | "#" | ")" | "2>&1")
        || w.starts_with('>')
        || w.starts_with("2>")
        || w.starts_with('<')
        || w.starts_with('|')
        || w.ends_with(';')
}

/// The binary named by word `w`, if any.
fn binary_of(w: &str) -> Option<&'static str> {
    let base = w.rsplit('/').next().unwrap_or(w);
    let qualified = w.contains("target/");
    CLI.iter()
        .chain(POSITIONAL.iter())
        .copied()
        .find(|b| *b == base && (qualified || !ONLY_QUALIFIED.contains(b)))
}

/// Commands in a snippet: (binary, its arguments up to a shell operator).
fn commands(snippet: &str) -> Vec<(&'static str, Vec<String>)> {
    let ws = words(snippet);
    let mut out = Vec::new();
    let mut i = 0;
    while i < ws.len() {
        let w = &ws[i];
        // `cargo run ... --bin NAME [-- ARGS]`
        if w == "--bin" && ws.get(i + 1).is_some() && ws[..i].iter().any(|x| x == "cargo") {
            let is_run = ws[..i].iter().any(|x| x == "run");
            if let Some(b) = binary_of(&format!("target/x/{}", ws[i + 1])) {
                let mut j = i + 2;
                while j < ws.len() && ws[j] != "--" && !is_operator(&ws[j]) {
                    j += 1;
                }
                let args: Vec<String> = if is_run && ws.get(j).is_some_and(|x| x == "--") {
                    ws[j + 1..]
                        .iter()
                        .take_while(|x| !is_operator(x))
                        .cloned()
                        .collect()
                } else {
                    Vec::new()
                };
                out.push((b, args));
            }
            i += 2;
            continue;
        }
        if let Some(b) = binary_of(w) {
            // A word in a sentence ("oxvs-agent's", "the oxvs-lab") is not
            // a command: only a binary at the start of the snippet or after
            // an operator, `sudo`, `exec`, `--` or an env assignment.
            let prev = if i == 0 {
                None
            } else {
                Some(ws[i - 1].as_str())
            };
            let starts = prev.is_none_or(|p| {
                is_operator(p)
                    || matches!(p, "sudo" | "exec" | "--" | "$" | "time")
                    || p.contains('=')
            });
            if starts {
                let args: Vec<String> = ws[i + 1..]
                    .iter()
                    .take_while(|x| !is_operator(x))
                    .cloned()
                    .collect();
                out.push((b, args));
            }
        }
        i += 1;
    }
    out
}

/// One subcommand level's help: its flags (and whether each takes a
/// value) and its subcommands.
struct Help {
    flags: BTreeMap<String, bool>,
    subcommands: BTreeSet<String>,
}

fn help_of(
    bin: &Path,
    path: &[String],
    cache: &mut BTreeMap<(PathBuf, Vec<String>), Help>,
) -> Result<(), String> {
    let key = (bin.to_path_buf(), path.to_vec());
    if cache.contains_key(&key) {
        return Ok(());
    }
    let out = Command::new(bin)
        .args(path)
        .arg("--help")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {} --help failed: {}",
            bin.display(),
            path.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    // Hand-written usages may go to stderr.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut flags = BTreeMap::new();
    for f in oxvs_deploy_validate::help_flags(&text) {
        // clap: `--flag <VALUE>` or `--flag=<VALUE>` takes a value.
        let takes = text.match_indices(&f).any(|(at, _)| {
            let rest = &text[at + f.len()..];
            rest.starts_with(" <") || rest.starts_with("=<") || rest.starts_with(" [<")
        });
        flags.insert(f, takes);
    }
    let mut subcommands = BTreeSet::new();
    let mut in_cmds = false;
    for l in text.lines() {
        if l.starts_with("Commands:") {
            in_cmds = true;
            continue;
        }
        if in_cmds {
            if !l.starts_with("  ") {
                in_cmds = false;
                continue;
            }
            if let Some(name) = l.split_whitespace().next() {
                subcommands.insert(name.to_string());
            }
        }
    }
    cache.insert(key, Help { flags, subcommands });
    Ok(())
}

/// Checks one command; Err names what is wrong.
fn check_command(
    dir: &Path,
    bin: &str,
    args: &[String],
    cache: &mut BTreeMap<(PathBuf, Vec<String>), Help>,
) -> Result<(), String> {
    let exe = dir.join(bin);
    if !exe.is_file() {
        return Err(format!(
            "{bin} is not a binary of the workspace (not in {})",
            dir.display()
        ));
    }
    if POSITIONAL.contains(&bin) {
        return Ok(());
    }
    let mut path: Vec<String> = Vec::new();
    let mut known: BTreeMap<String, bool> = BTreeMap::new();
    help_of(&exe, &path, cache)?;
    known.extend(cache[&(exe.clone(), path.clone())].flags.clone());
    let mut i = 0;
    let mut positional_seen = false;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            break;
        }
        if let Some(flag) = a
            .strip_prefix("--")
            .map(|_| a.split('=').next().unwrap_or(a))
        {
            let Some(&takes) = known.get(flag) else {
                return Err(format!(
                    "{bin} {} has no flag {flag} (its --help lists {:?})",
                    path.join(" "),
                    known.keys().collect::<Vec<_>>()
                ));
            };
            i += if takes && !a.contains('=') { 2 } else { 1 };
            continue;
        }
        if a.starts_with('-') {
            i += 1; // a short flag: not checked
            continue;
        }
        let subs = &cache[&(exe.clone(), path.clone())].subcommands;
        if !positional_seen && !subs.is_empty() {
            if subs.contains(a.as_str()) {
                path.push(a.clone());
                help_of(&exe, &path, cache)?;
                known.extend(cache[&(exe.clone(), path.clone())].flags.clone());
            } else if a.chars().any(|c| c.is_ascii_uppercase())
                || a.starts_with('<')
                || a.starts_with('$')
                || a == "..."
            {
                positional_seen = true; // a placeholder (`oxvsctl CMD --help`)
            } else {
                return Err(format!(
                    "{bin} {} has no subcommand {a:?} (it has {subs:?})",
                    path.join(" ")
                ));
            }
        } else {
            positional_seen = true;
        }
        i += 1;
    }
    Ok(())
}

/// Repository paths a snippet names (`scripts/demo.sh`, `examples/lab/x.yaml`).
fn repo_paths(snippet: &str, dirs: &BTreeSet<String>) -> Vec<String> {
    snippet
        .split(|c: char| {
            c.is_whitespace() || matches!(c, '(' | ')' | '[' | ']' | '"' | '\'' | ',' | '`')
        })
        .map(|w| w.trim_end_matches(['.', ':', ';']))
        .map(|w| w.strip_prefix("./").unwrap_or(w))
        .filter(|w| {
            w.split('/')
                .next()
                .is_some_and(|first| dirs.contains(first))
                && w.contains('/')
                && !w.contains(['*', '<', '>', '{', '$', '='])
        })
        .map(|w| w.split(':').next().unwrap_or(w).to_string())
        .collect()
}

#[test]
fn every_command_and_path_in_the_docs_exists() {
    let Some(dir) = built_binaries_dir() else {
        oxvs_testutil::skip_or_fail("cannot find the built binaries");
        return;
    };
    if !dir.join("oxvsctl").is_file() || !dir.join("oxvs-lab").is_file() {
        oxvs_testutil::skip_or_fail(format!(
            "the workspace's binaries are not built in {}",
            dir.display()
        ));
        return;
    }
    let root = repo();
    let dirs = top_dirs();
    let mut cache = BTreeMap::new();
    let mut problems = Vec::new();
    let mut checked_cmds = 0;
    let mut checked_paths = 0;
    let mut per_binary: BTreeMap<&str, usize> = BTreeMap::new();
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc))
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc.display()));
        for (line, snip) in snippets(&text) {
            for (bin, args) in commands(&snip) {
                checked_cmds += 1;
                *per_binary.entry(bin).or_default() += 1;
                if let Err(e) = check_command(&dir, bin, &args, &mut cache) {
                    problems.push(format!(
                        "{}:{line}: {e}\n    in: {}",
                        doc.display(),
                        snip.trim()
                    ));
                }
            }
            for p in repo_paths(&snip, &dirs) {
                // Build outputs and files the reader creates are not in the tree.
                if p.starts_with("target/")
                    || p.contains("/results/")
                        && p.ends_with(".json")
                        && !root.join(&p).exists()
                        && snip.contains("--json")
                {
                    continue;
                }
                checked_paths += 1;
                let full = root.join(&p);
                if !full.exists() {
                    problems.push(format!(
                        "{}:{line}: {p} does not exist\n    in: {}",
                        doc.display(),
                        snip.trim()
                    ));
                } else if p.ends_with(".sh")
                    && full
                        .metadata()
                        .map(|m| m.permissions().mode() & 0o111 == 0)
                        .unwrap_or(true)
                {
                    problems.push(format!("{}:{line}: {p} is not executable", doc.display()));
                }
            }
        }
    }
    println!("checked {checked_cmds} commands ({per_binary:?}) and {checked_paths} paths");
    assert!(
        problems.is_empty(),
        "{} problem(s) in the docs:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(
        checked_cmds >= 60,
        "only {checked_cmds} commands found: is the extraction broken?"
    );
    assert!(
        per_binary.get("oxvsctl").copied().unwrap_or(0) >= 10,
        "{per_binary:?}"
    );
    assert!(
        per_binary.get("oxvs-lab").copied().unwrap_or(0) >= 5,
        "{per_binary:?}"
    );
    assert!(checked_paths >= 20, "only {checked_paths} paths found");
}

#[test]
fn the_extraction_finds_commands_and_rejects_unknown_flags() {
    let cmds = commands("target/release/oxvs-lab --name demo probe --protocol tcp | head");
    assert_eq!(cmds.len(), 1);
    assert_eq!(cmds[0].0, "oxvs-lab");
    assert_eq!(cmds[0].1, ["--name", "demo", "probe", "--protocol", "tcp"]);
    let cmds = commands("cargo run --release -p oxvs-bench --bin e2e -- --duration 5 > x");
    assert_eq!(
        cmds,
        vec![("e2e", vec!["--duration".to_string(), "5".to_string()])]
    );
    assert!(commands("the e2e harness and oxvs-agent's flags").is_empty());
    let s =
        snippets("a `oxvsctl show` b\n```sh\n$ oxvsctl dump-flows \\\n  --names\n# comment\n```\n");
    assert_eq!(
        s,
        vec![
            (1, "oxvsctl show".to_string()),
            (3, "oxvsctl dump-flows  --names".to_string())
        ]
    );
    let dirs: BTreeSet<String> = ["scripts", "docs"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        repo_paths("run scripts/demo.sh, see docs/cni.md:12.", &dirs),
        ["scripts/demo.sh", "docs/cni.md"]
    );

    let Some(dir) = built_binaries_dir().filter(|d| d.join("oxvsctl").is_file()) else {
        oxvs_testutil::skip_or_fail("oxvsctl not built");
        return;
    };
    let mut cache = BTreeMap::new();
    let ok = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    check_command(
        &dir,
        "oxvsctl",
        &ok(&["--socket", "/x", "dump-flows", "--names"]),
        &mut cache,
    )
    .unwrap();
    check_command(&dir, "oxvsctl", &ok(&["--json", "show"]), &mut cache).unwrap();
    let e = check_command(
        &dir,
        "oxvsctl",
        &ok(&["dump-flows", "--no-such-flag"]),
        &mut cache,
    )
    .unwrap_err();
    assert!(e.contains("--no-such-flag"), "{e}");
    let e = check_command(&dir, "oxvsctl", &ok(&["dump-flowz"]), &mut cache).unwrap_err();
    assert!(e.contains("dump-flowz"), "{e}");
}
