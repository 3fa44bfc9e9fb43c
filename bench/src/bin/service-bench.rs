//! # `service-bench`: Service scale with the in-pipeline proxy, against
//! kube-proxy's iptables rules
//!
//! Subcommands (model and method: `oxvs_bench::service_bench`):
//!
//! - `matrix`: in process, for every number of Services: per node, the
//!   agent's translation (`desired::compute`, proxy on), its diff, the
//!   switch's parse and one atomic install of the Services' flows and
//!   groups on a running node; the first sync (`replace_all_with_groups`
//!   of everything on an empty switch); one Service's endpoints changing;
//!   flow, group and bucket counts, text bytes and pipeline heap growth per
//!   Service (this binary's counting allocator).
//! - `datapath`: `Datapath::process_batch` on node 1 at each number of
//!   Services: established connections to ClusterIPs (and to pod IPs, the
//!   reference), and new connections (SYNs from new source ports).
//! - `lab`: end to end on a running 2-node `oxvs-lab` (root): `--mode
//!   kube-proxy` (`up --kube-proxy`: the Services and Endpoints created in
//!   the real API server with `oxvs-lab kubectl -- create -f`; node-1's
//!   `iptables-save -t nat` polled until every endpoint's DNAT rule is
//!   there; rule and chain counts; kube-proxy's sync time from its
//!   `/metrics`; its RSS), or `--mode proxy` (`up --proxy`: the same
//!   objects through `oxvs-lab apply -f`; node-1's switch polled until its
//!   ServiceLB flows and groups are all there; agent and switchd RSS). Then
//!   one Service's endpoints change, timed the same way.
//!
//! Output: a text table on stdout; `--json FILE` writes the numbers with
//! the machine and the date.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use oxvs_api::client::Client;
use oxvs_api::protocol::{DumpFlowsResult, DumpGroupsResult, Request};
use oxvs_bench::cni_bench::{table, Machine};
use oxvs_bench::service_bench::{
    established, kube_proxy_expected, lab_objects, new_connections, realise, service_name,
    to_yaml_docs, DpResult, Model, ModelSpec, Summary, Target, NAMESPACE,
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
#[command(about = "Service scale: the in-pipeline proxy against kube-proxy")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    KubeProxy,
    Proxy,
}

#[derive(clap::Args, Clone, Copy)]
struct Shape {
    /// Ready endpoints per Service.
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Pool pods per node (the endpoints are drawn from them).
    #[arg(long, default_value_t = 100)]
    pods_per_node: usize,
    /// Every n-th Service also has a UDP port (0: none).
    #[arg(long, default_value_t = 5)]
    udp_every: usize,
    /// Every n-th Service has a NodePort (0: none).
    #[arg(long, default_value_t = 10)]
    node_port_every: usize,
}

impl Shape {
    fn spec(&self, services: usize) -> ModelSpec {
        ModelSpec {
            services,
            endpoints: self.endpoints,
            nodes: self.nodes,
            pods_per_node: self.pods_per_node,
            udp_every: self.udp_every,
            node_port_every: self.node_port_every,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// In-process realisation for every number of Services.
    Matrix {
        #[arg(long, value_parser = oxvs_bench::parse_counts, default_value = "0,1000,10000")]
        services: std::vec::Vec<usize>,
        #[command(flatten)]
        shape: Shape,
        /// Nodes measured (the first ones; every node's flows are alike).
        #[arg(long, default_value_t = 10)]
        measure_nodes: usize,
        /// Repetitions per point; the fastest realisation is kept.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Per-packet cost on node 1 at every number of Services.
    Datapath {
        #[arg(long, value_parser = oxvs_bench::parse_counts, default_value = "0,1000,10000")]
        services: std::vec::Vec<usize>,
        #[command(flatten)]
        shape: Shape,
        /// Established connections (each gives 2 packets, one each way).
        #[arg(long, default_value_t = 1024)]
        conns: usize,
        /// SYNs per new-connection trial.
        #[arg(long, default_value_t = 20_000)]
        syns: usize,
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
        #[arg(long, default_value_t = 5)]
        trials: usize,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// End to end on a running 2-node oxvs-lab.
    Lab {
        #[arg(long, value_enum)]
        mode: Mode,
        #[arg(long, default_value = "lab")]
        lab: String,
        #[arg(long, default_value = "/run/oxvs-lab")]
        state_root: PathBuf,
        /// Directory of oxvs-lab.
        #[arg(long, default_value = "target/release")]
        bin_dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        services: usize,
        #[command(flatten)]
        shape: Shape,
        /// Seconds to wait for the rules or flows.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        #[arg(long, default_value = "/tmp/oxvs-service-bench")]
        work_dir: PathBuf,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

fn write_out(path: &Option<PathBuf>, mut v: Value) -> Result<()> {
    v["date"] = json!(oxvs_bench::plots::now_date());
    if let Some(p) = path {
        std::fs::write(p, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("cannot write {}", p.display()))?;
        eprintln!("wrote {}", p.display());
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
            services,
            shape,
            measure_nodes,
            reps,
            json,
        } => {
            let mut rows = Vec::new();
            let mut out = Vec::new();
            for &s in &services {
                let spec = shape.spec(s);
                let model = Model::new(spec).context("model")?;
                let mut best: Option<Summary> = None;
                for _ in 0..reps.max(1) {
                    let r = realise(&model, measure_nodes, Some(&live_bytes))?;
                    let sum = Summary { spec, nodes: r };
                    if best
                        .as_ref()
                        .is_none_or(|b| sum.bundle_max() < b.bundle_max())
                    {
                        best = Some(sum);
                    }
                }
                if let Some(b) = best {
                    eprintln!("{s} services: done");
                    rows.push(b.row());
                    out.push(b.json());
                }
            }
            println!(
                "In-process Service realisation, proxy on ({} nodes, {} measured, {} endpoints per Service; times in ms, the slowest node; best of {reps})",
                shape.nodes, measure_nodes.min(shape.nodes), shape.endpoints
            );
            print!("{}", table(&Summary::HEADER, &rows, 0));
            write_out(
                &json,
                json!({"machine": machine.json(), "loadavg_after": Machine::probe().loadavg, "matrix": out}),
            )?;
        }
        Cmd::Datapath {
            services,
            shape,
            conns,
            syns,
            secs,
            trials,
            json,
        } => {
            let dur = Duration::from_secs_f64(secs.max(0.01));
            let mut rows = Vec::new();
            let mut out = Vec::new();
            let mut row = |kind: &str, r: &DpResult, load: String| {
                let (min, max) = r.spread();
                rows.push(vec![
                    kind.to_string(),
                    r.services.to_string(),
                    r.target.name().to_string(),
                    r.flows.to_string(),
                    r.groups.to_string(),
                    format!("{:.3}", r.pps / 1e6),
                    format!("{:.3}-{:.3}", min / 1e6, max / 1e6),
                    format!("{:.0}", r.ns_per_packet()),
                    format!("{}/{}/{}", r.emc_hits, r.megaflow_hits, r.upcalls),
                    format!("{:.2}", r.local_share),
                    load.clone(),
                ]);
                let mut v = r.json(kind);
                v["loadavg"] = json!(load);
                out.push(v);
            };
            for &s in &services {
                let model = Model::new(shape.spec(s)).context("model")?;
                let targets: &[Target] = if s == 0 {
                    &[Target::PodIp]
                } else {
                    &[Target::PodIp, Target::ClusterIp]
                };
                for &t in targets {
                    let r = established(&model, t, conns, true, trials, dur)?;
                    row("established", &r, Machine::probe().loadavg);
                    let r = new_connections(&model, t, syns, trials)?;
                    row("new conns", &r, Machine::probe().loadavg);
                    eprintln!("{s} services, {}: done", t.name());
                }
            }
            println!(
                "Datapath::process_batch (32/batch) on node-1; established: {conns} connections (2 packets each, cycled), median of {trials} x {secs} s; new: {syns} SYNs from new ports per trial, median of {trials}"
            );
            print!(
                "{}",
                table(
                    &[
                        "traffic",
                        "services",
                        "to",
                        "flows",
                        "groups",
                        "Mpps",
                        "min-max",
                        "ns/pkt",
                        "emc/mf/upcall",
                        "local",
                        "load"
                    ],
                    &rows,
                    3
                )
            );
            write_out(&json, json!({"machine": machine.json(), "datapath": out}))?;
        }
        Cmd::Lab {
            mode,
            lab,
            state_root,
            bin_dir,
            services,
            shape,
            timeout,
            work_dir,
            json,
        } => {
            let a = LabArgs {
                lab,
                state_root,
                bin_dir,
                timeout: Duration::from_secs(timeout),
                work_dir,
            };
            let v = lab_run(&a, mode, shape.spec(services))?;
            write_out(&json, json!({"machine": machine.json(), "lab": v}))?;
        }
    }
    Ok(())
}

struct LabArgs {
    lab: String,
    state_root: PathBuf,
    bin_dir: PathBuf,
    timeout: Duration,
    work_dir: PathBuf,
}

fn oxvs_lab(a: &LabArgs, args: &[&str]) -> Result<(Duration, String)> {
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
            "oxvs-lab {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok((d, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// Node 1 of the running lab.
struct LabNode {
    netns: String,
    sock: PathBuf,
    agent_pid: Option<u32>,
    switchd_pid: Option<u32>,
    kube_proxy_pid: Option<u32>,
}

fn lab_node1(a: &LabArgs) -> Result<LabNode> {
    let path = a.state_root.join(&a.lab).join("state.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let pid = |x: &Value| x.as_u64().and_then(|p| u32::try_from(p).ok());
    let Some(n) = v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == "node-1")
    else {
        bail!("lab {:?} has no node-1: run `oxvs-lab up` first", a.lab);
    };
    Ok(LabNode {
        netns: n["netns"].as_str().unwrap_or_default().to_string(),
        sock: a
            .state_root
            .join(&a.lab)
            .join("node-1")
            .join("switchd.sock"),
        agent_pid: pid(&n["agent_pid"]),
        switchd_pid: pid(&n["switchd_pid"]),
        kube_proxy_pid: pid(&v["kube"]["kube_proxy"]["node-1"]),
    })
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

fn in_netns(ns: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .with_context(|| format!("cannot run {} in {ns}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "{} in {ns} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `iptables-save -t nat` of node 1, counted.
#[derive(Clone, Debug, Default)]
struct NatCounts {
    lines: usize,
    rules: usize,
    chains: usize,
    dnat: usize,
    bytes: usize,
    /// Rules in chains of the Services' namespace (`-m comment --comment
    /// "sb/...`) or their KUBE-SVC/SEP chains.
    took: Duration,
}

fn nat_counts(ns: &str) -> Result<(NatCounts, String)> {
    let t = Instant::now();
    let text = in_netns(ns, &["iptables-save", "-t", "nat"])?;
    let took = t.elapsed();
    let mut c = NatCounts {
        bytes: text.len(),
        took,
        ..NatCounts::default()
    };
    for l in text.lines() {
        c.lines += 1;
        if l.starts_with("-A ") {
            c.rules += 1;
            if l.contains("-j DNAT") && l.starts_with("-A KUBE-SEP-") {
                c.dnat += 1;
            }
        } else if l.starts_with(':') {
            c.chains += 1;
        }
    }
    Ok((c, text))
}

/// Whether the Service port whose `KUBE-SERVICES` jump carries `comment`
/// has a `KUBE-SEP-*` chain with `to` (`--to-destination IP:`) in
/// `iptables-save` text (kube-proxy 1.20 writes comments only on the
/// `KUBE-SERVICES` rules, so the chains are followed).
fn svc_has_endpoint(text: &str, comment: &str, to: &str) -> bool {
    let jump = |l: &str| l.rsplit_once("-j ").map(|(_, c)| c.trim().to_string());
    let Some(svc) = text
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SERVICES ") && l.contains(comment))
        .filter_map(jump)
        .find(|c| c.starts_with("KUBE-SVC-"))
    else {
        return false;
    };
    let prefix = format!("-A {svc} ");
    let seps: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(jump)
        .collect();
    text.lines()
        .any(|l| l.contains(to) && seps.iter().any(|s| l.starts_with(&format!("-A {s} "))))
}

/// kube-proxy's `kubeproxy_sync_proxy_rules_duration_seconds` (sum, count).
fn sync_metrics(ns: &str) -> Result<(f64, u64)> {
    let text = in_netns(
        ns,
        &[
            "curl",
            "-s",
            "--max-time",
            "10",
            "http://127.0.0.1:10249/metrics",
        ],
    )?;
    let get = |name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    let sum = get("kubeproxy_sync_proxy_rules_duration_seconds_sum")
        .context("no kubeproxy_sync_proxy_rules_duration_seconds_sum in kube-proxy's /metrics")?;
    let count = get("kubeproxy_sync_proxy_rules_duration_seconds_count").unwrap_or(0.0);
    Ok((sum, count as u64))
}

fn switch_counts(sock: &Path) -> Result<(usize, usize, String)> {
    let mut c = Client::connect(sock).with_context(|| format!("switch {}", sock.display()))?;
    c.set_timeout(Duration::from_secs(60));
    let f: DumpFlowsResult = c.call_as(&Request::DumpFlows {
        table: Some("ServiceLB".into()),
        names: false,
        stats: false,
    })?;
    let g: DumpGroupsResult = c.call_as(&Request::DumpGroups { group_id: None })?;
    Ok((f.flows.len(), g.lines.len(), g.lines.join("\n")))
}

/// Polls `probe` every `every` until it says done; the time it took from
/// `start` (None: timed out).
fn poll(
    start: Instant,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> bool,
) -> Option<Duration> {
    loop {
        if probe() {
            return Some(start.elapsed());
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(every);
    }
}

fn secs(d: Option<Duration>) -> Value {
    json!(d.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0))
}

fn lab_run(a: &LabArgs, mode: Mode, spec: ModelSpec) -> Result<Value> {
    let node = lab_node1(a)?;
    std::fs::create_dir_all(&a.work_dir)
        .with_context(|| format!("cannot create {}", a.work_dir.display()))?;
    let model = Model::new(spec)?;
    let file = a.work_dir.join(format!("services-{}.yaml", spec.services));
    std::fs::write(&file, to_yaml_docs(&lab_objects(&model)))?;
    let changed_i = model.changed_service();
    let changed = model.with_endpoint_change(changed_i);
    let key = (NAMESPACE.to_string(), service_name(changed_i));
    let new_ep = changed
        .state
        .endpoints
        .get(&key)
        .and_then(|e| e.endpoints.first())
        .map(|e| e.ip)
        .unwrap_or(Ipv4Addr::UNSPECIFIED.into());
    let change_objs: Vec<Value> = lab_objects(&changed)
        .into_iter()
        .filter(|o| o["kind"] == "Endpoints" && o["metadata"]["name"] == key.1.as_str())
        .collect();
    let change_file = a.work_dir.join("change.yaml");
    std::fs::write(&change_file, to_yaml_docs(&change_objs))?;
    let file_s = file.to_string_lossy().into_owned();
    let change_s = change_file.to_string_lossy().into_owned();
    let (tcp, udp, np) = spec.port_counts();
    let ports = tcp + udp;
    let every = Duration::from_millis(500);
    match mode {
        Mode::KubeProxy => {
            let (before, _) = nat_counts(&node.netns)?;
            let rss0 = rss_kib(node.kube_proxy_pid);
            let (sum0, count0) = sync_metrics(&node.netns)?;
            let want_dnat = before.dnat + ports * spec.endpoints;
            eprintln!(
                "creating {} Services + Endpoints in the API server; waiting for {want_dnat} DNAT rules on node-1",
                spec.services
            );
            let start = Instant::now();
            let (t_create, _) = oxvs_lab(a, &["kubectl", "--", "create", "-f", &file_s])?;
            eprintln!(
                "kubectl create returned after {:.1} s",
                t_create.as_secs_f64()
            );
            let mut last = NatCounts::default();
            let done = poll(start, a.timeout, every, || match nat_counts(&node.netns) {
                Ok((c, _)) => {
                    let ok = c.dnat >= want_dnat;
                    last = c;
                    ok
                }
                Err(_) => false,
            });
            let (sum1, count1) = sync_metrics(&node.netns)?;
            std::thread::sleep(Duration::from_secs(2));
            let (sum1b, count1b) = sync_metrics(&node.netns)?;
            let (after, _) = nat_counts(&node.netns)?;
            let rss1 = rss_kib(node.kube_proxy_pid);
            // One Service's endpoints change.
            // The new endpoint's DNAT rule in the changed Service's own
            // chain (pool pods back many Services).
            let ep_rule = format!("--to-destination {new_ep}:");
            let comment = format!("\"{}/{}:http cluster IP\"", key.0, key.1);
            let start = Instant::now();
            oxvs_lab(a, &["kubectl", "--", "apply", "-f", &change_s])?;
            let t_change = poll(start, a.timeout, Duration::from_millis(100), || {
                nat_counts(&node.netns).is_ok_and(|(_, t)| svc_has_endpoint(&t, &comment, &ep_rule))
            });
            std::thread::sleep(Duration::from_secs(2));
            let (sum2, count2) = sync_metrics(&node.netns)?;
            let (exp_rules, exp_chains) = kube_proxy_expected(&spec);
            let per_sync = |s: f64, c: u64| (c > 0).then(|| s / c as f64);
            let v = json!({
                "mode": "kube-proxy", "services": spec.services, "service_ports": ports,
                "node_ports": np, "endpoints_per_service": spec.endpoints,
                "kubectl_create_s": t_create.as_secs_f64(),
                "realised_s": secs(done),
                "nat_before": {"lines": before.lines, "rules": before.rules, "chains": before.chains, "bytes": before.bytes},
                "nat_after": {"lines": after.lines, "rules": after.rules, "chains": after.chains,
                    "dnat": after.dnat, "bytes": after.bytes, "iptables_save_s": after.took.as_secs_f64()},
                "service_rules": after.rules - before.rules,
                "service_chains": after.chains - before.chains,
                "derived_rules": exp_rules, "derived_chains": exp_chains,
                "syncs_while_creating": count1.saturating_sub(count0),
                "sync_s_mean_while_creating": per_sync(sum1 - sum0, count1.saturating_sub(count0)),
                "syncs_settling": count1b.saturating_sub(count1),
                "change_realised_s": secs(t_change),
                "change_syncs": count2.saturating_sub(count1b),
                "change_sync_s": per_sync(sum2 - sum1b, count2.saturating_sub(count1b)),
                "kube_proxy_rss_kib": [rss0, rss1],
                "last_poll_dnat": last.dnat,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(v)
        }
        Mode::Proxy => {
            let (f0, g0, _) = switch_counts(&node.sock)?;
            let rss0 = (rss_kib(node.agent_pid), rss_kib(node.switchd_pid));
            // What node-1's translator gives for these Services (the lab's
            // nodes do not change the ServiceLB flows or the groups).
            let n1 = model
                .nodes
                .first()
                .context("no node in the model")?
                .inputs(Arc::new(model.state.clone()));
            let p = oxvs_agent::proxy::proxy_flows(&model.state, &n1.node_name, &n1.node);
            let (want_f, want_g) = (f0 + p.flows.len(), g0 + p.groups.len());
            eprintln!(
                "applying {} Services + Endpoints with oxvs-lab apply; waiting for {want_f} ServiceLB flows and {want_g} groups on node-1",
                spec.services
            );
            let start = Instant::now();
            let (t_apply, _) = oxvs_lab(a, &["apply", "-f", &file_s])?;
            eprintln!(
                "oxvs-lab apply returned after {:.1} s",
                t_apply.as_secs_f64()
            );
            let mut last = (0, 0);
            let done = poll(start, a.timeout, every, || {
                match switch_counts(&node.sock) {
                    Ok((f, g, _)) => {
                        last = (f, g);
                        f == want_f && g == want_g
                    }
                    Err(_) => false,
                }
            });
            let rss1 = (rss_kib(node.agent_pid), rss_kib(node.switchd_pid));
            // The new endpoint in the changed Service's own group (pool
            // pods back many Services).
            let ep = format!("nat(dst={new_ep}:");
            let gid = oxvs_agent::proxy::service_ports(&changed.state, &n1.node_name)
                .iter()
                .find(|sp| sp.service == key && sp.port_name == "http")
                .map(|sp| sp.group_id)
                .context("the changed Service has no http port")?;
            let prefix = format!("group_id={gid},");
            let start = Instant::now();
            oxvs_lab(a, &["apply", "-f", &change_s])?;
            let t_change = poll(start, a.timeout, Duration::from_millis(100), || {
                switch_counts(&node.sock).is_ok_and(|(_, _, g)| {
                    g.lines().any(|l| l.starts_with(&prefix) && l.contains(&ep))
                })
            });
            let v = json!({
                "mode": "proxy", "services": spec.services, "service_ports": ports,
                "node_ports": np, "endpoints_per_service": spec.endpoints,
                "apply_cmd_s": t_apply.as_secs_f64(),
                "realised_s": secs(done),
                "service_lb_flows": [f0, last.0], "groups": [g0, last.1],
                "expected": [want_f, want_g],
                "change_realised_s": secs(t_change),
                "agent_rss_kib": [rss0.0, rss1.0], "switchd_rss_kib": [rss0.1, rss1.1],
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(v)
        }
    }
}
