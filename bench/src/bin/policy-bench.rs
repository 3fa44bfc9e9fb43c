//! # `policy-bench`: NetworkPolicy realisation time, flow count, memory, and
//! datapath throughput with policies
//!
//! Subcommands (model and method: `oxvs_bench::policy_bench`):
//!
//! - `matrix`: in process, for every (pods, policies) pair: per node, the
//!   agent's translation, its diff, parsing and one atomic install of the
//!   policy flows on a pipeline holding the node's base flows; flow counts,
//!   flow-text bytes and pipeline heap growth per policy (this binary's
//!   counting allocator, as `memflow`).
//! - `datapath`: `Datapath::process_batch` throughput of node 1 with its
//!   base flows plus the flows of 0 and of N policies, EMC on (EMC hits) and
//!   off (megaflow hits), same packets.
//! - `lab`: end to end on a running `oxvs-lab` (root; `oxvs-lab up` first):
//!   creates the model's pods (real netns + veth + AF_XDP ports), then for
//!   each N applies N policies with `oxvs-lab apply -f` and polls every
//!   node's switch (`show`, n_flows) until it holds its base flows plus the
//!   policy flows the translator gives for the lab's real addresses; checks
//!   the policy-cookie count with `dump-flows`; agent and switchd VmRSS
//!   before and after; then deletes the policies and times the removal too.
//!
//! Output: a text table on stdout; `--json FILE` writes the numbers (with
//! the machine and the date), `--plots DIR` draws them as SVG
//! (`oxvs_bench::plots`, the same charts as `bench-report`).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use oxvs_api::client::Client;
use oxvs_api::protocol::{DumpFlowsResult, Request, ShowResult};
use oxvs_bench::cni_bench::{table, Machine};
use oxvs_bench::policy_bench::{
    allowed_traffic, datapath_pps, expected_policy_flows, is_policy_cookie, lab_objects, realise,
    to_yaml_docs, traffic, LabFacts, Model, ModelSpec, Summary,
};
use serde_json::{json, Value};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live_bytes() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

#[derive(Parser)]
#[command(about = "NetworkPolicy realisation and datapath benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// In-process realisation for every (pods, policies) pair.
    Matrix {
        #[arg(long, value_parser = oxvs_bench::parse_counts, default_value = "100,1000")]
        pods: std::vec::Vec<usize>,
        #[arg(long, value_parser = oxvs_bench::parse_counts, default_value = "10,100,1000")]
        policies: std::vec::Vec<usize>,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 20)]
        pods_per_namespace: usize,
        /// Repetitions per point; the fastest cluster realisation is kept.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write SVG plots of the results into this directory.
        #[arg(long)]
        plots: Option<PathBuf>,
    },
    /// Datapath pps of node 1 with 0 and N policies.
    Datapath {
        #[arg(long, default_value_t = 1000)]
        pods: usize,
        #[arg(long, default_value_t = 1000)]
        policies: usize,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 20)]
        pods_per_namespace: usize,
        /// Distinct packets (5-tuples) cycled through.
        #[arg(long, default_value_t = 2048)]
        packets: usize,
        #[arg(long, default_value_t = 2.0)]
        secs: f64,
        #[arg(long, default_value_t = 5)]
        trials: usize,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write SVG plots of the results into this directory.
        #[arg(long)]
        plots: Option<PathBuf>,
        /// Leave the tunnel guard's flows out (to measure their cost).
        #[arg(long)]
        no_tunnel_guard: bool,
    },
    /// End to end on a running oxvs-lab.
    Lab {
        #[arg(long, default_value = "lab")]
        lab: String,
        #[arg(long, default_value = "/run/oxvs-lab")]
        state_root: PathBuf,
        /// Directory of oxvs-lab.
        #[arg(long, default_value = "target/debug")]
        bin_dir: PathBuf,
        #[arg(long, default_value_t = 40)]
        pods: usize,
        #[arg(long, value_parser = oxvs_bench::parse_counts, default_value = "10,100,1000")]
        policies: std::vec::Vec<usize>,
        #[arg(long, default_value_t = 20)]
        pods_per_namespace: usize,
        /// Seconds to wait for a node's flows.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Where the manifests are written.
        #[arg(long, default_value = "/tmp/oxvs-policy-bench")]
        work_dir: PathBuf,
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write SVG plots of the results into this directory.
        #[arg(long)]
        plots: Option<PathBuf>,
    },
}

/// Writes `v` (plus the date) to `--json`, and its plots to `--plots`
/// (file names from the JSON file's stem, else `default_stem`).
fn write_out(
    path: &Option<PathBuf>,
    plots: &Option<PathBuf>,
    default_stem: &str,
    mut v: Value,
) -> Result<()> {
    v["date"] = json!(oxvs_bench::plots::now_date());
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("cannot write {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(dir) = plots {
        let stem = path
            .as_deref()
            .and_then(Path::file_stem)
            .and_then(|s| s.to_str())
            .unwrap_or(default_stem);
        for f in oxvs_bench::plots::policy_plots(&v, dir, stem).context("plots")? {
            eprintln!("plot {}", f.display());
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let machine = Machine::probe();
    eprintln!(
        "machine: {} x{} cores, kernel {}, load {}",
        machine.cpu_model, machine.cores, machine.kernel, machine.loadavg
    );
    match cli.cmd {
        Cmd::Matrix {
            pods,
            policies,
            nodes,
            pods_per_namespace,
            reps,
            json,
            plots,
        } => {
            let mut rows = Vec::new();
            let mut out = Vec::new();
            for &p in &pods {
                for &n in &policies {
                    let spec = ModelSpec {
                        pods: p,
                        policies: n,
                        nodes,
                        pods_per_namespace,
                    };
                    let model = Model::new(spec).context("model")?;
                    let mut best: Option<Summary> = None;
                    for _ in 0..reps.max(1) {
                        let r = realise(&model, Some(&live_bytes))?;
                        let s = Summary { spec, nodes: r };
                        if best
                            .as_ref()
                            .is_none_or(|b| s.realise_max() < b.realise_max())
                        {
                            best = Some(s);
                        }
                    }
                    if let Some(s) = best {
                        eprintln!("pods {p} policies {n}: done");
                        rows.push(s.row());
                        out.push(s.json());
                    }
                }
            }
            println!(
                "In-process policy realisation ({nodes} nodes; times in ms, the slowest node; best of {reps})"
            );
            print!("{}", table(&Summary::HEADER, &rows, 0));
            write_out(
                &json,
                &plots,
                "policy-matrix",
                json!({"machine": machine.json(), "matrix": out}),
            )?;
        }
        Cmd::Datapath {
            pods,
            policies,
            nodes,
            pods_per_namespace,
            packets,
            secs,
            trials,
            json,
            plots,
            no_tunnel_guard,
        } => {
            let spec = ModelSpec {
                pods,
                policies,
                nodes,
                pods_per_namespace,
            };
            let mut with = Model::new(spec).context("model")?;
            if no_tunnel_guard {
                with = with.without_tunnel_guard();
            }
            let without = with.without_policies();
            let dur = Duration::from_secs_f64(secs.max(0.01));
            let mut rows = Vec::new();
            let mut out = Vec::new();
            let mut base_pps = BTreeMap::new();
            let mixed = traffic(&with, packets);
            let allowed = allowed_traffic(&with, packets)?;
            for (mix, pkts) in [("mixed", &mixed), ("allowed", &allowed)] {
                for emc in [true, false] {
                    for m in [&without, &with] {
                        let r = datapath_pps(m, pkts, emc, trials, dur)?;
                        let tier = format!("{mix}/{}", if emc { "emc" } else { "megaflow" });
                        let rel = match base_pps.get(&tier) {
                            Some(b) => format!("{:+.1}%", (r.pps / b - 1.0) * 100.0),
                            None => {
                                base_pps.insert(tier.clone(), r.pps);
                                "-".into()
                            }
                        };
                        rows.push(vec![
                            tier.clone(),
                            r.policies.to_string(),
                            r.flows.to_string(),
                            format!("{:.3}", r.pps / 1e6),
                            rel,
                            format!("{:.0}", 1e9 / r.pps.max(1.0)),
                            format!("{}/{}/{}", r.emc_hits, r.megaflow_hits, r.upcalls),
                            format!("{}/{}", r.outputs, r.drops),
                            r.megaflows.to_string(),
                        ]);
                        out.push(json!({
                            "tier": tier, "policies": r.policies, "flows": r.flows,
                            "packets": r.packets, "pps": r.pps, "trials_pps": r.trials,
                            "emc_hits": r.emc_hits, "megaflow_hits": r.megaflow_hits,
                            "upcalls": r.upcalls, "outputs": r.outputs, "drops": r.drops,
                            "megaflows": r.megaflows,
                        }));
                    }
                }
            }
            println!(
                "Datapath::process_batch (32/batch), node-1 of {pods} pods / {nodes} nodes, {} mixed / {} allowed-only packets, median of {trials} x {secs} s", mixed.len(), allowed.len()
            );
            print!(
                "{}",
                table(
                    &[
                        "traffic/cache",
                        "policies",
                        "flows",
                        "Mpps",
                        "vs none",
                        "ns/pkt",
                        "passes emc/mf/upcall",
                        "out/drop",
                        "megaflows"
                    ],
                    &rows,
                    1
                )
            );
            write_out(
                &json,
                &plots,
                "policy-datapath",
                json!({"machine": machine.json(), "datapath": out}),
            )?;
        }
        Cmd::Lab {
            lab,
            state_root,
            bin_dir,
            pods,
            policies,
            pods_per_namespace,
            timeout,
            work_dir,
            json,
            plots,
        } => lab_run(LabArgs {
            lab,
            state_root,
            bin_dir,
            pods,
            policies,
            pods_per_namespace,
            timeout: Duration::from_secs(timeout),
            work_dir,
            json,
            plots,
            machine: machine.json(),
        })?,
    }
    Ok(())
}

struct LabArgs {
    lab: String,
    state_root: PathBuf,
    bin_dir: PathBuf,
    pods: usize,
    policies: Vec<usize>,
    pods_per_namespace: usize,
    timeout: Duration,
    work_dir: PathBuf,
    json: Option<PathBuf>,
    plots: Option<PathBuf>,
    machine: Value,
}

fn oxvs_lab(a: &LabArgs, args: &[&str]) -> Result<Duration> {
    let bin = a.bin_dir.join("oxvs-lab");
    let t = Instant::now();
    let out = Command::new(&bin)
        .arg("--name")
        .arg(&a.lab)
        .arg("--state-root")
        .arg(&a.state_root)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let d = t.elapsed();
    if !out.status.success() {
        bail!(
            "oxvs-lab {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(d)
}

/// A node of the running lab.
struct LabNode {
    name: String,
    sock: PathBuf,
    agent_pid: Option<u32>,
    switchd_pid: Option<u32>,
}

fn lab_state(a: &LabArgs) -> Result<(Vec<LabNode>, LabFacts)> {
    let path = a.state_root.join(&a.lab).join("state.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let mut facts = LabFacts::default();
    let mut nodes = Vec::new();
    for n in v["nodes"].as_array().into_iter().flatten() {
        let name = n["name"].as_str().unwrap_or_default().to_string();
        let cidr = n["pod_cidr"].as_str().unwrap_or_default();
        let ip = n["ip"].as_str().unwrap_or_default();
        let (Ok(cidr), Ok(ip)) = (cidr.parse(), ip.parse::<Ipv4Addr>()) else {
            bail!(
                "node {name:?} in {}: bad pod_cidr {cidr:?} or ip {ip:?}",
                path.display()
            );
        };
        facts.nodes.insert(name.clone(), (cidr, ip));
        nodes.push(LabNode {
            sock: a.state_root.join(&a.lab).join(&name).join("switchd.sock"),
            agent_pid: n["agent_pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            switchd_pid: n["switchd_pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok()),
            name,
        });
    }
    for p in v["pods"].as_array().into_iter().flatten() {
        let (Some(ns), Some(name), Some(node)) = (
            p["namespace"].as_str(),
            p["name"].as_str(),
            p["node"].as_str(),
        ) else {
            continue;
        };
        if let Some(ip) = p["ip"].as_str().and_then(|s| s.parse().ok()) {
            facts
                .pods
                .insert((ns.to_string(), name.to_string()), (node.to_string(), ip));
        }
    }
    Ok((nodes, facts))
}

fn rss_kib(pid: Option<u32>) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn n_flows(sock: &Path) -> Result<usize> {
    let mut c = Client::connect(sock).with_context(|| format!("switch {}", sock.display()))?;
    let s: ShowResult = c.call_as(&Request::Show)?;
    Ok(s.n_flows)
}

fn policy_flow_count(sock: &Path) -> Result<usize> {
    let mut c = Client::connect(sock).with_context(|| format!("switch {}", sock.display()))?;
    c.set_timeout(Duration::from_secs(30));
    let d: DumpFlowsResult = c.call_as(&Request::DumpFlows {
        table: None,
        names: false,
        stats: true,
    })?;
    Ok(d.flows
        .iter()
        .filter(|f| is_policy_cookie(f.cookie))
        .count())
}

/// Polls every node until its flow count is `want[node]`; returns the
/// time each node got there (None: timed out), measured from `start`.
fn wait_counts(
    nodes: &[LabNode],
    want: &BTreeMap<String, usize>,
    start: Instant,
    timeout: Duration,
) -> BTreeMap<String, Option<Duration>> {
    let mut done: BTreeMap<String, Option<Duration>> =
        nodes.iter().map(|n| (n.name.clone(), None)).collect();
    while start.elapsed() < timeout {
        let mut all = true;
        for n in nodes {
            if done.get(&n.name).is_some_and(Option::is_some) {
                continue;
            }
            match n_flows(&n.sock) {
                Ok(c) if Some(&c) == want.get(&n.name) => {
                    done.insert(n.name.clone(), Some(start.elapsed()));
                }
                _ => all = false,
            }
        }
        if all {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done
}

fn lab_run(a: LabArgs) -> Result<()> {
    let (nodes0, _) = lab_state(&a)?;
    if nodes0.is_empty() {
        bail!("lab {:?} has no nodes: run `oxvs-lab up` first", a.lab);
    }
    std::fs::create_dir_all(&a.work_dir)
        .with_context(|| format!("cannot create {}", a.work_dir.display()))?;
    let spec0 = ModelSpec {
        pods: a.pods,
        policies: 0,
        nodes: nodes0.len(),
        pods_per_namespace: a.pods_per_namespace,
    };
    let base_model = Model::new(spec0)?;
    let (base_objs, _) = lab_objects(&base_model);
    let base_file = a.work_dir.join("pods.yaml");
    std::fs::write(&base_file, to_yaml_docs(&base_objs))?;
    eprintln!("creating {} pods on {} nodes ...", a.pods, nodes0.len());
    let t_pods = oxvs_lab(&a, &["apply", "-f", &base_file.to_string_lossy()])?;
    eprintln!("pods ready in {:.1} s", t_pods.as_secs_f64());

    let mut rows = Vec::new();
    let mut out = Vec::new();
    for &n in &a.policies {
        let (nodes, facts) = lab_state(&a)?;
        if facts.pods.len() < a.pods {
            bail!("only {} of {} pods have an IP", facts.pods.len(), a.pods);
        }
        let model = Model::new(ModelSpec {
            policies: n,
            ..spec0
        })?;
        let expected = expected_policy_flows(&model, &facts);
        let (_, pols) = lab_objects(&model);
        let pol_file = a.work_dir.join(format!("policies-{n}.yaml"));
        std::fs::write(&pol_file, to_yaml_docs(&pols))?;
        let mut before = BTreeMap::new();
        let mut rss0 = BTreeMap::new();
        for nd in &nodes {
            before.insert(nd.name.clone(), n_flows(&nd.sock)?);
            rss0.insert(
                nd.name.clone(),
                (rss_kib(nd.agent_pid), rss_kib(nd.switchd_pid)),
            );
        }
        let want: BTreeMap<String, usize> = before
            .iter()
            .map(|(k, b)| (k.clone(), b + expected.get(k).copied().unwrap_or(0)))
            .collect();
        let start = Instant::now();
        let t_apply = oxvs_lab(&a, &["apply", "-f", &pol_file.to_string_lossy()])?;
        let done = wait_counts(&nodes, &want, start, a.timeout);
        // Let the agents settle, then check what the switches hold.
        std::thread::sleep(Duration::from_millis(500));
        let mut node_rows = Vec::new();
        for nd in &nodes {
            let got = policy_flow_count(&nd.sock).unwrap_or(usize::MAX);
            let exp = expected.get(&nd.name).copied().unwrap_or(0);
            let (a0, s0) = rss0.get(&nd.name).copied().unwrap_or((None, None));
            let (a1, s1) = (rss_kib(nd.agent_pid), rss_kib(nd.switchd_pid));
            let t = done.get(&nd.name).copied().flatten();
            let delta = |x: Option<u64>, y: Option<u64>| match (x, y) {
                (Some(x), Some(y)) => Some(y as i64 - x as i64),
                _ => None,
            };
            let per_pol = |d: Option<i64>| {
                d.map_or("-".to_string(), |d| {
                    format!("{:.1}", d as f64 * 1024.0 / n.max(1) as f64)
                })
            };
            rows.push(vec![
                n.to_string(),
                nd.name.clone(),
                exp.to_string(),
                if got == exp {
                    got.to_string()
                } else {
                    format!("{got} (!)")
                },
                format!("{:.2}", t_apply.as_secs_f64()),
                t.map_or("timeout".into(), |t| format!("{:.2}", t.as_secs_f64())),
                format!(
                    "{} -> {}",
                    a0.map_or("-".into(), |x| x.to_string()),
                    a1.map_or("-".into(), |x| x.to_string())
                ),
                per_pol(delta(a0, a1)),
                format!(
                    "{} -> {}",
                    s0.map_or("-".into(), |x| x.to_string()),
                    s1.map_or("-".into(), |x| x.to_string())
                ),
                per_pol(delta(s0, s1)),
            ]);
            node_rows.push(json!({
                "node": nd.name, "expected_policy_flows": exp, "policy_flows": got,
                "realised_s": t.map(|t| t.as_secs_f64()),
                "agent_rss_kib": [a0, a1], "switchd_rss_kib": [s0, s1],
            }));
        }
        // Remove them again, timed the same way.
        let start = Instant::now();
        oxvs_lab(&a, &["delete", "-f", &pol_file.to_string_lossy()])?;
        let gone = wait_counts(&nodes, &before, start, a.timeout);
        let removed = gone
            .values()
            .copied()
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().max().unwrap_or_default().as_secs_f64());
        eprintln!(
            "{n} policies: realised {:?}, removed in {removed:?} s",
            done.values().collect::<Vec<_>>()
        );
        out.push(json!({
            "policies": n, "pods": a.pods, "apply_cmd_s": t_apply.as_secs_f64(),
            "nodes": node_rows, "removed_s": removed,
        }));
    }
    println!(
        "oxvs-lab end to end: {} nodes, {} real pods; time from `oxvs-lab apply -f` to the expected flows on the switch",
        nodes0.len(),
        a.pods
    );
    print!(
        "{}",
        table(
            &[
                "policies",
                "node",
                "expected",
                "installed",
                "apply cmd s",
                "realised s",
                "agent RSS KiB",
                "B/pol",
                "switchd RSS KiB",
                "B/pol"
            ],
            &rows,
            2
        )
    );
    write_out(
        &a.json,
        &a.plots,
        "policy-lab",
        json!({"machine": a.machine, "pods_apply_s": t_pods.as_secs_f64(), "lab": out}),
    )?;
    Ok(())
}
