//! # `oxvs-bench`: datapath benchmark
//!
//! Generator and sink on AF_XDP (`oxvs_bench::xbench`), switches under test
//! side by side on the same topology, methods `fixed`, `throughput`
//! (RFC 2544-style search) and `scaling`, a human table (median
//! [min-max] over `--trials`), a JSON results file with the machine, and
//! SVG plots. See `bench/scripts/oxvs-bench.sh` for the committed run.
//!
//! Needs root. Everything it creates is removed on exit, on errors and on
//! SIGINT/SIGTERM (guards; see `xbench::setup`).
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use oxvs_bench::xbench::gen::{GenConfig, Proto, SeqMode, Vxlan};
use oxvs_bench::xbench::hist::Histogram;
use oxvs_bench::xbench::methods::{self, Search, Trial};
use oxvs_bench::xbench::pipeline::{PipelineKind, Plan};
use oxvs_bench::xbench::report::{self, fmt3, summary, trial_json};
use oxvs_bench::xbench::setup::{self, Endpoint, SwitchKind, SIMPLE_FLOWS};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Method {
    /// Run at `--rate`: achieved rate, loss, latency, switch CPU per packet.
    Fixed,
    /// Binary search for the highest rate with loss <= `--loss`.
    Throughput,
    /// Fixed runs over `--flows` x `--threads` (oxvs) x `--frame-sizes`.
    Scaling,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SetupKind {
    /// Namespaces and veths around each switch (self-contained).
    Virtual,
    /// Two lab nodes (namespaces), each with its own switch (oxvs-switchd,
    /// or a private Open vSwitch userspace instance) and a VXLAN port over
    /// a veth underlay; generator pod on node A, sink pod on node B (the
    /// same pod <-> tunnel flows for both; switches oxvs, ovs-pmd,
    /// ovs-nonpmd).
    VirtualVxlan,
    /// Physical interfaces `--gen-if`/`--sink-if`; the device under test
    /// is whatever connects them.
    Ports,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PipelineArg {
    /// Port 1 <-> port 2 (or `--flows-file`).
    Simple,
    /// The Antrea-like node pipeline with `--policies` NetworkPolicies;
    /// the generator and sink are two pods the policies allow.
    Antrea,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ProtoArg {
    Udp,
    Tcp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum SeqArg {
    PerFlow,
    Global,
}

/// Datapath benchmark: AF_XDP generator and sink around a switch under test.
#[derive(Debug, Parser)]
#[command(name = "oxvs-bench", version, about)]
struct Args {
    method: Method,
    #[arg(long, value_enum, default_value_t = SetupKind::Virtual)]
    setup: SetupKind,
    /// Switches under test (`virtual`, and `ports` with `--dut-ports`):
    /// oxvs (interrupt mode: like with like against ovs-nonpmd),
    /// oxvs-busy (`oxvs-switchd --mode busy`, a spinning datapath thread:
    /// like with like against ovs-pmd), ovs-pmd, ovs-nonpmd, bridge,
    /// xdp-redirect (the kernel XDP ceiling; needs clang and `ip` with
    /// libbpf, else skipped); default all of them but oxvs-busy.
    /// `virtual-vxlan`: oxvs, oxvs-busy, ovs-pmd, ovs-nonpmd; default
    /// oxvs,ovs-pmd. OVS is skipped (with why) when not installed.
    #[arg(long, value_delimiter = ',')]
    switches: Option<Vec<String>>,
    /// Flow file loaded into oxvs and OVS for the simple pipeline
    /// (default: port 1 <-> port 2).
    #[arg(long, value_name = "FILE")]
    flows_file: Option<PathBuf>,
    /// Pipelines (list: one case each). The Linux bridge runs only with
    /// `simple`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "simple")]
    pipeline: Vec<PipelineArg>,
    /// NetworkPolicies of the `antrea` pipeline.
    #[arg(long, default_value_t = 1000)]
    policies: usize,
    /// Frame sizes incl. FCS (list: one case each).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    frame_sizes: Vec<usize>,
    /// Distinct flows (list: one case each).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    flows: Vec<u32>,
    /// oxvs datapath threads (list; `scaling`).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<u16>,
    /// `virtual`: receive and transmit queues of every veth, as a
    /// multi-queue NIC has (the generator spreads its flows over them,
    /// flow `i` on queue `i % N`; the sink and every switch serve all).
    /// `ports` uses every queue the interfaces have.
    #[arg(long, default_value_t = 1)]
    queues: u32,
    #[arg(long, value_enum, default_value_t = ProtoArg::Udp)]
    proto: ProtoArg,
    /// VXLAN-encapsulate the generated frames (outer UDP 4789, VNI 42).
    #[arg(long)]
    vxlan: bool,
    #[arg(long, value_enum, default_value_t = SeqArg::PerFlow)]
    seq: SeqArg,
    /// Distinct source addresses (the flows cycle through them).
    #[arg(long, default_value_t = 1)]
    src_ips: u32,
    /// Target rate in pps for `fixed`/`scaling` (0 = as fast as possible).
    #[arg(long, default_value_t = 100_000)]
    rate: u64,
    /// Seconds per trial.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    #[arg(long, default_value_t = 3)]
    trials: usize,
    /// Loss allowed by `throughput`, in percent.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Steps of the throughput search.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Self-check of the sink: swap the first two of every N sequence
    /// numbers at the generator (0: off); the sink must then report
    /// sent / N reordered arrivals.
    #[arg(long, default_value_t = 0, value_name = "N")]
    inject_reorder: u32,
    /// Frames per TX batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// `ports`: the generator's interface.
    #[arg(long)]
    gen_if: Option<String>,
    /// `ports`: the sink's interface.
    #[arg(long)]
    sink_if: Option<String>,
    /// `ports`: run the switches of `--switches` on this host, on ports
    /// P1 (cabled to `--gen-if`) and P2 (cabled to `--sink-if`), one
    /// after the other. Without it, the device under test is external.
    #[arg(long, value_delimiter = ',', value_name = "P1,P2")]
    dut_ports: Vec<String>,
    /// `ports`: use interfaces even if they carry the default route or
    /// addresses.
    #[arg(long)]
    force: bool,
    /// One more argument for every `oxvs-switchd` started (repeat it), as
    /// in `--switchd-arg=--trust-checksums` to measure a switchd option.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    switchd_arg: Vec<String>,
    /// Nice level of every `oxvs-switchd` started (`nice -n N`), -20 to
    /// 19. `ovs-ctl start` runs ovs-vswitchd at -10 by default, so with
    /// the generator and the sink on the same CPUs `-10` gives oxvs the
    /// same share; 0 (the default) leaves it at the benchmark's own.
    #[arg(long, value_name = "N", default_value_t = 0, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i8).range(-20..=19))]
    oxvs_nice: i8,
}

/// One measured case.
struct Case {
    switch: String,
    pipeline: String,
    note: String,
    port_modes: Value,
    flows_loaded: usize,
    frame_size: usize,
    flows: u32,
    threads: u16,
    queues: u32,
    /// Per receive queue of oxvs's multi-queue ports, what each received.
    queue_rx: Option<String>,
    trials: Vec<Trial>,
    searches: Vec<Search>,
}

impl Case {
    /// Switch and pipeline (`oxvs`, `oxvs antrea(1000 policies)`).
    fn label(&self) -> String {
        let mut l = if self.pipeline == "simple" {
            self.switch.clone()
        } else {
            format!("{} {}", self.switch, self.pipeline)
        };
        if self.queues > 1 {
            l.push_str(&format!(" {}q", self.queues));
        }
        l
    }

    fn latency(&self) -> Histogram {
        let mut h = Histogram::new();
        for t in &self.trials {
            h.merge(&t.latency);
        }
        for s in &self.searches {
            if let Some(b) = &s.best {
                h.merge(&b.latency);
            }
        }
        h
    }

    fn to_json(&self) -> Value {
        let f = |g: fn(&Trial) -> f64| summary(&self.trials.iter().map(g).collect::<Vec<_>>());
        let lat: serde_json::Map<String, Value> = report::QUANTILES
            .iter()
            .map(|(k, q)| {
                let per: Vec<f64> = self
                    .trials
                    .iter()
                    .filter_map(|t| t.latency.quantile(*q).map(|v| v as f64))
                    .collect();
                ((*k).to_owned(), summary(&per))
            })
            .collect();
        json!({
            "switch": self.switch,
            "pipeline": self.pipeline,
            "note": self.note,
            "port_modes": self.port_modes,
            "flows_loaded": self.flows_loaded,
            "frame_size": self.frame_size,
            "flows": self.flows,
            "threads": self.threads,
            "queues": self.queues,
            "queue_rx_packets": self.queue_rx,
            "fixed": if self.trials.is_empty() { Value::Null } else { json!({
                "sent_pps": f(|t| t.gen.pps()),
                "delivered_pps": f(Trial::delivered_pps),
                "loss_fraction": f(Trial::loss_fraction),
                "switch_cpu_ns_per_pkt": summary(&self.trials.iter().filter_map(Trial::cpu_ns_per_pkt).collect::<Vec<_>>()),
                "latency_ns": lat,
                "raw": self.trials.iter().map(trial_json).collect::<Vec<_>>(),
            })},
            "throughput": if self.searches.is_empty() { Value::Null } else { json!({
                "rate_pps": summary(&self.searches.iter().map(|s| s.rate_pps).collect::<Vec<_>>()),
                "generator_bound": self.searches.iter().any(|s| s.generator_bound),
                "raw": self.searches.iter().map(|s| json!({
                    "rate_pps": s.rate_pps,
                    "generator_bound": s.generator_bound,
                    "steps": s.steps.iter().map(|(o, a, l)| json!({"target_pps": o, "sent_pps": a, "loss_fraction": l})).collect::<Vec<_>>(),
                    "best": s.best.as_ref().map(trial_json),
                })).collect::<Vec<_>>(),
            })},
        })
    }
}

fn main() -> Result<()> {
    let a = Args::parse();
    setup::install_signal_flag()?;
    if a.trials == 0 || a.duration.is_nan() || a.duration <= 0.0 || !(0.0..=100.0).contains(&a.loss)
    {
        bail!("--trials and --duration must be positive and --loss within 0..=100");
    }
    if !nix_is_root() {
        bail!("oxvs-bench needs root (network namespaces, XDP)");
    }
    let flows_text = match &a.flows_file {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?,
        None => SIMPLE_FLOWS.to_owned(),
    };
    if !a.dut_ports.is_empty() && a.setup != SetupKind::Ports {
        bail!("--dut-ports is for --setup ports");
    }
    let started = Instant::now();
    let mut cases: Vec<Case> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut ifaces = Vec::new();

    match a.setup {
        SetupKind::Ports => {
            let (Some(gi), Some(si)) = (&a.gen_if, &a.sink_if) else {
                bail!("--setup ports needs --gen-if and --sink-if");
            };
            if gi == si {
                bail!("--gen-if and --sink-if must differ");
            }
            if !a.dut_ports.is_empty() && a.dut_ports.len() != 2 {
                bail!(
                    "--dut-ports needs exactly two interfaces P1,P2, got {:?}",
                    a.dut_ports
                );
            }
            ifaces = vec![gi.clone(), si.clone()];
            ifaces.extend(a.dut_ports.iter().cloned());
            for (i, x) in ifaces.iter().enumerate() {
                if ifaces[i + 1..].contains(x) {
                    bail!("interface {x} is named twice (--gen-if, --sink-if, --dut-ports)");
                }
            }
            for i in &ifaces {
                setup::check_port_safety(i, &setup::port_facts(i)?, a.force)?;
            }
            if let [p1, p2] = a.dut_ports.as_slice() {
                let plans = plans_of(&a, &flows_text)?;
                let (gi, si, p1, p2) = (gi.clone(), si.clone(), p1.clone(), p2.clone());
                run_switches(
                    &a,
                    &plans,
                    &|_k| setup::Virtual::ports(&gi, &si, &p1, &p2),
                    &mut cases,
                    &mut skipped,
                )?;
                return finish(&a, &cases, &skipped, &ifaces, started);
            }
            let g = Endpoint {
                netns: None,
                ifname: gi.clone(),
                queues: setup::device_queues(gi),
            };
            let s = Endpoint {
                netns: None,
                ifname: si.clone(),
                queues: setup::device_queues(si),
            };
            let plan = Plan::simple(&flows_text);
            let info = SwitchInfo {
                name: "external",
                running: None,
                queues: g.queues,
                modes: json!({}),
                flows_loaded: 0,
                threads: 0,
                plan: &plan,
                note: "external device under test",
            };
            run_cases(&a, &info, &g, &s, &[], &mut cases)?;
        }
        SetupKind::VirtualVxlan => {
            if a.pipeline != [PipelineArg::Simple] || a.flows_file.is_some() {
                bail!("--setup virtual-vxlan has its own flows (pod <-> tunnel); no --pipeline/--flows-file");
            }
            run_vxlan(&a, &mut cases, &mut skipped)?;
        }
        SetupKind::Virtual => {
            let plans = plans_of(&a, &flows_text)?;
            run_switches(
                &a,
                &plans,
                &|k| setup::Virtual::new(k.tag(), a.queues),
                &mut cases,
                &mut skipped,
            )?;
        }
    }
    finish(&a, &cases, &skipped, &ifaces, started)
}

/// The `virtual-vxlan` setup: every switch of `--switches` (oxvs once per
/// `--threads`) on its own fresh two-node topology. A switch that cannot
/// run is skipped with why.
fn run_vxlan(a: &Args, cases: &mut Vec<Case>, skipped: &mut Vec<(String, String)>) -> Result<()> {
    let kinds: Vec<SwitchKind> = match &a.switches {
        None => vec![SwitchKind::OXVS, SwitchKind::OvsPmd],
        Some(v) => v
            .iter()
            .map(|s| SwitchKind::parse(s))
            .collect::<Result<_>>()?,
    };
    if let Some(k) = kinds.iter().find(|k| {
        !matches!(
            k,
            SwitchKind::Oxvs { .. } | SwitchKind::OvsPmd | SwitchKind::OvsNonPmd
        )
    }) {
        bail!(
            "--setup virtual-vxlan runs oxvs, oxvs-busy, ovs-pmd and ovs-nonpmd, not {}",
            k.name()
        );
    }
    let plan = Plan::simple(setup::SIMPLE_FLOWS);
    let bins = if kinds.iter().any(|k| matches!(k, SwitchKind::Oxvs { .. })) {
        Some(
            setup::oxvs_bins()?
                .with_switchd_args(&a.switchd_arg)
                .with_nice(a.oxvs_nice),
        )
    } else {
        None
    };
    for k in &kinds {
        for kind in thread_variants(k, &a.threads) {
            eprintln!("oxvs-bench: == {} / virtual-vxlan ==", kind.name());
            let r = (|| -> Result<()> {
                let (sw, threads) = match (&kind, &bins) {
                    (SwitchKind::Oxvs { threads, busy }, Some(b)) => {
                        (setup::start_vxlan_pair(*threads, *busy, b)?, *threads)
                    }
                    (SwitchKind::OvsPmd, _) => {
                        (setup::ovs_vxlan::start_ovs_vxlan_pair("afxdp")?, 0)
                    }
                    (SwitchKind::OvsNonPmd, _) => {
                        (setup::ovs_vxlan::start_ovs_vxlan_pair("afxdp-nonpmd")?, 0)
                    }
                    _ => bail!("{} does not run on virtual-vxlan", kind.name()),
                };
                let info = SwitchInfo {
                    name: &sw.name,
                    running: Some(&sw),
                    queues: sw.topo.queues,
                    modes: json!(sw.port_modes),
                    flows_loaded: sw.flows,
                    threads,
                    plan: &plan,
                    note: &sw.note,
                };
                run_cases(a, &info, &sw.topo.gen, &sw.topo.sink, &sw.pids, cases)
            })();
            if let Err(e) = r {
                if setup::stopped() {
                    return Err(e);
                }
                let n = format!("{} / virtual-vxlan", kind.name());
                eprintln!("oxvs-bench: {n}: SKIPPED: {e:#}");
                skipped.push((n, format!("{e:#}")));
            }
        }
    }
    Ok(())
}

/// The pipelines of `--pipeline`.
fn plans_of(a: &Args, flows_text: &str) -> Result<Vec<Plan>> {
    let mut plans = Vec::new();
    for p in &a.pipeline {
        plans.push(match p {
            PipelineArg::Simple => Plan::simple(flows_text),
            PipelineArg::Antrea => Plan::antrea(a.policies)?,
        });
    }
    Ok(plans)
}

/// Runs every switch of `--switches` (oxvs once per `--threads`) with
/// every plan, each on a fresh topology from `topo` (dropped, i.e.
/// restored, after it). A switch that cannot run is skipped with why.
fn run_switches(
    a: &Args,
    plans: &[Plan],
    topo: &dyn Fn(&SwitchKind) -> Result<setup::Virtual>,
    cases: &mut Vec<Case>,
    skipped: &mut Vec<(String, String)>,
) -> Result<()> {
    let default = ["oxvs", "ovs-pmd", "ovs-nonpmd", "bridge", "xdp-redirect"].map(String::from);
    let kinds: Vec<SwitchKind> = a
        .switches
        .as_deref()
        .unwrap_or(&default)
        .iter()
        .map(|s| SwitchKind::parse(s))
        .collect::<Result<_>>()?;
    let bins = if kinds.iter().any(|k| matches!(k, SwitchKind::Oxvs { .. })) {
        Some(
            setup::oxvs_bins()?
                .with_switchd_args(&a.switchd_arg)
                .with_nice(a.oxvs_nice),
        )
    } else {
        None
    };
    for plan in plans {
        eprintln!(
            "oxvs-bench: pipeline {}: {} flows; {}",
            plan.kind.name(),
            oxvs_bench::count_flows(&plan.flows),
            plan.note
        );
        for k in &kinds {
            if matches!(k, SwitchKind::Bridge | SwitchKind::XdpRedirect)
                && plan.kind != PipelineKind::Simple
            {
                eprintln!(
                    "oxvs-bench: {} has no flow pipeline: measured with `simple` only",
                    k.name()
                );
                continue;
            }
            for kind in thread_variants(k, &a.threads) {
                eprintln!("oxvs-bench: == {} / {} ==", kind.name(), plan.kind.name());
                let r = (|| -> Result<()> {
                    let sw = setup::start_switch_on(&kind, plan, bins.as_ref(), topo(&kind)?)?;
                    let threads = match kind {
                        SwitchKind::Oxvs { threads, .. } => threads,
                        _ => 0,
                    };
                    let info = SwitchInfo {
                        name: &sw.name,
                        running: Some(&sw),
                        queues: sw.topo.queues,
                        modes: json!(sw.port_modes),
                        flows_loaded: sw.flows,
                        threads,
                        plan,
                        note: &sw.note,
                    };
                    run_cases(a, &info, &sw.topo.gen, &sw.topo.sink, &sw.pids, cases)
                })();
                if let Err(e) = r {
                    if setup::stopped() {
                        return Err(e);
                    }
                    let n = format!("{} / {}", kind.name(), plan.kind.name());
                    eprintln!("oxvs-bench: {n}: SKIPPED: {e:#}");
                    skipped.push((n, format!("{e:#}")));
                }
            }
        }
    }
    Ok(())
}

/// Prints the table and writes the plots and the JSON.
fn finish(
    a: &Args,
    cases: &[Case],
    skipped: &[(String, String)],
    ifaces: &[String],
    started: Instant,
) -> Result<()> {
    print_table(a, cases, skipped);
    let mach = report::machine(ifaces);
    if let Some(dir) = &a.plots {
        std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
        for p in plots(a, cases, dir) {
            match p {
                Ok(f) => eprintln!("oxvs-bench: wrote {}", f.display()),
                Err(e) => eprintln!("oxvs-bench: plot: {e:#}"),
            }
        }
    }
    if let Some(path) = &a.json {
        let doc = json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "method": format!("{:?}", a.method).to_lowercase(),
            "setup": format!("{:?}", a.setup).to_lowercase(),
            "machine": mach,
            "duration_s": a.duration,
            "trials": a.trials,
            "rate_pps": a.rate,
            "max_loss_percent": a.loss,
            "load_average": load_average(),
            "proto": format!("{:?}", a.proto).to_lowercase(),
            "vxlan": a.vxlan,
            "elapsed_s": started.elapsed().as_secs_f64(),
            "skipped": skipped.iter().map(|(n, w)| json!({"switch": n, "why": w})).collect::<Vec<_>>(),
            "cases": cases.iter().map(Case::to_json).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("write {}", path.display()))?;
        eprintln!("oxvs-bench: wrote {}", path.display());
    }
    Ok(())
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `/proc/loadavg`'s first three fields (the machine is shared).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The switch under test and its pipeline, for [`run_cases`].
struct SwitchInfo<'a> {
    name: &'a str,
    /// The running switch (None: an external device under test).
    running: Option<&'a setup::Running>,
    /// Queues of the generator's and the sink's interfaces.
    queues: u32,
    modes: Value,
    flows_loaded: usize,
    threads: u16,
    plan: &'a Plan,
    note: &'a str,
}

fn gen_config(a: &Args, frame_size: usize, flows: u32) -> GenConfig {
    GenConfig {
        frame_size,
        flows,
        proto: match a.proto {
            ProtoArg::Udp => Proto::Udp,
            ProtoArg::Tcp => Proto::TcpSyn,
        },
        vxlan: a.vxlan.then_some(Vxlan {
            src_mac: setup::GEN_MAC,
            dst_mac: setup::DST_MAC,
            src_ip: [192, 0, 2, 1],
            dst_ip: [192, 0, 2, 2],
            vni: 42,
        }),
        src_mac: setup::GEN_MAC,
        dst_mac: setup::DST_MAC,
        src_ips: a.src_ips.max(1),
        rate_pps: a.rate,
        batch: a.batch,
        seq: match a.seq {
            SeqArg::PerFlow => SeqMode::PerFlow,
            SeqArg::Global => SeqMode::Global,
        },
        duration: Duration::from_secs_f64(a.duration),
        reorder_every: a.inject_reorder,
        ..GenConfig::default()
    }
}

fn run_cases(
    a: &Args,
    sw: &SwitchInfo,
    g: &Endpoint,
    s: &Endpoint,
    pids: &[u32],
    out: &mut Vec<Case>,
) -> Result<()> {
    let name = sw.name;
    for &size in &a.frame_sizes {
        for &flows in &a.flows {
            let mut cfg = gen_config(a, size, flows);
            sw.plan.apply(&mut cfg)?;
            let mut case = Case {
                switch: name.to_owned(),
                pipeline: sw.plan.kind.name(),
                note: sw.note.to_owned(),
                port_modes: sw.modes.clone(),
                flows_loaded: sw.flows_loaded,
                frame_size: size,
                flows,
                threads: sw.threads,
                queues: sw.queues,
                queue_rx: None,
                trials: Vec::new(),
                searches: Vec::new(),
            };
            eprintln!("oxvs-bench: {name}: {size}-byte frames, {flows} flows");
            methods::probe(g, s, &cfg, pids)
                .with_context(|| format!("{name} / {}: {}", sw.plan.kind.name(), sw.note))?;
            match a.method {
                Method::Fixed | Method::Scaling => {
                    let drops = || sw.running.and_then(setup::Running::oxvs_drop_counters);
                    case.trials = methods::fixed(g, s, &cfg, pids, a.trials, &drops)?;
                }
                Method::Throughput => {
                    for _ in 0..a.trials {
                        case.searches.push(methods::throughput(
                            g,
                            s,
                            &cfg,
                            pids,
                            a.loss / 100.0,
                            a.steps,
                        )?);
                    }
                }
            }
            // How the switch's multi-queue ports spread what they received
            // (cumulative since the switch started).
            case.queue_rx = sw.running.and_then(setup::Running::oxvs_queue_rx);
            if let Some(q) = &case.queue_rx {
                eprintln!("oxvs-bench: {name}: received per queue: {q}");
            }
            out.push(case);
        }
    }
    Ok(())
}

fn print_table(a: &Args, cases: &[Case], skipped: &[(String, String)]) {
    println!();
    println!(
        "{:?}, {} s per trial, {} trials: median [min-max]",
        a.method, a.duration, a.trials
    );
    match a.method {
        Method::Throughput => {
            println!(
                "{:<40} {:>5} {:>6} {:>24} {:>9} {:>22} {:>22}",
                "switch / pipeline",
                "size",
                "flows",
                "throughput kpps",
                "",
                "p99 us at that rate",
                "CPU ns/pkt there"
            );
            for c in cases {
                let r: Vec<f64> = c.searches.iter().map(|s| s.rate_pps).collect();
                let p99: Vec<f64> = c
                    .searches
                    .iter()
                    .filter_map(|s| s.best.as_ref()?.latency.quantile(0.99))
                    .map(|v| v as f64)
                    .collect();
                let cpu: Vec<f64> = c
                    .searches
                    .iter()
                    .filter_map(|s| s.best.as_ref()?.cpu_ns_per_pkt())
                    .collect();
                let bound = if c.searches.iter().any(|s| s.generator_bound) {
                    "gen-bound"
                } else {
                    ""
                };
                println!(
                    "{:<40} {:>5} {:>6} {:>24} {:>9} {:>22} {:>22}",
                    c.label(),
                    c.frame_size,
                    c.flows,
                    fmt3(&r, 1e3, 1),
                    bound,
                    fmt3(&p99, 1e3, 1),
                    fmt3(&cpu, 1.0, 0)
                );
            }
        }
        Method::Fixed | Method::Scaling => {
            println!(
                "{:<40} {:>4} {:>5} {:>7} {:>22} {:>22} {:>20} {:>18} {:>18} {:>18} {:>20}",
                "switch / pipeline",
                "thr",
                "size",
                "flows",
                "sent kpps",
                "delivered kpps",
                "loss %",
                "p50 us",
                "p99 us",
                "p99.9 us",
                "switch CPU ns/pkt"
            );
            for c in cases {
                let v = |f: fn(&Trial) -> f64| c.trials.iter().map(f).collect::<Vec<_>>();
                let q = |q: f64| {
                    c.trials
                        .iter()
                        .filter_map(|t| t.latency.quantile(q))
                        .map(|v| v as f64)
                        .collect::<Vec<_>>()
                };
                let cpu: Vec<f64> = c.trials.iter().filter_map(Trial::cpu_ns_per_pkt).collect();
                let loss: Vec<f64> = c.trials.iter().map(|t| t.loss_fraction() * 100.0).collect();
                println!(
                    "{:<40} {:>4} {:>5} {:>7} {:>22} {:>22} {:>20} {:>18} {:>18} {:>18} {:>20}",
                    c.label(),
                    c.threads,
                    c.frame_size,
                    c.flows,
                    fmt3(&v(|t| t.gen.pps()), 1e3, 1),
                    fmt3(&v(Trial::delivered_pps), 1e3, 1),
                    fmt3(&loss, 1.0, 3),
                    fmt3(&q(0.5), 1e3, 1),
                    fmt3(&q(0.99), 1e3, 1),
                    fmt3(&q(0.999), 1e3, 1),
                    fmt3(&cpu, 1.0, 0),
                );
            }
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for c in cases {
        if seen.insert(c.label()) {
            let gm = c
                .trials
                .first()
                .map(|t| (t.gen.mode.clone(), t.sink.mode.clone()))
                .or_else(|| {
                    c.searches
                        .iter()
                        .find_map(|s| s.best.as_ref())
                        .map(|t| (t.gen.mode.clone(), t.sink.mode.clone()))
                });
            println!(
                "{:<40} {}; ports {}; generator/sink AF_XDP {}",
                c.label(),
                c.note,
                c.port_modes,
                gm.map_or("-".into(), |(g, s)| format!("{g} / {s}"))
            );
        }
    }
    for (n, why) in skipped {
        println!("{n:<22} skipped: {why}");
    }
}

fn median(v: &[f64]) -> f64 {
    report::median_min_max(v).map_or(0.0, |m| m.0)
}

fn plots(a: &Args, cases: &[Case], dir: &std::path::Path) -> Vec<Result<PathBuf>> {
    let mut out = Vec::new();
    let names: Vec<String> = {
        let mut v: Vec<String> = cases.iter().map(Case::label).collect();
        v.dedup();
        v
    };
    let per_switch = |f: &dyn Fn(&Case) -> Option<(f64, f64)>| -> Vec<(String, Vec<(f64, f64)>)> {
        names
            .iter()
            .map(|n| {
                let mut p: Vec<(f64, f64)> = cases
                    .iter()
                    .filter(|c| &c.label() == n)
                    .filter_map(f)
                    .collect();
                p.sort_by(|x, y| x.0.total_cmp(&y.0));
                (n.clone(), p)
            })
            .filter(|(_, p)| !p.is_empty())
            .collect()
    };
    if a.method == Method::Throughput {
        let f = dir.join("throughput-vs-frame-size.svg");
        let s = per_switch(&|c| {
            let r: Vec<f64> = c.searches.iter().map(|s| s.rate_pps / 1e3).collect();
            Some((c.frame_size as f64, median(&r)))
        });
        out.push(
            report::line_plot(
                &f,
                "Throughput (loss target) vs frame size",
                "frame size (bytes)",
                "kpps",
                &s,
                false,
            )
            .map(|_| f),
        );
    }
    // Latency CDF of each switch's first case.
    let f = dir.join("latency-cdf.svg");
    let mut s = Vec::new();
    for n in &names {
        if let Some(c) = cases.iter().find(|c| &c.label() == n) {
            let h = c.latency();
            let p: Vec<(f64, f64)> = h
                .cdf()
                .into_iter()
                .map(|(v, q)| (v as f64 / 1e3, q))
                .collect();
            if !p.is_empty() {
                s.push((n.clone(), p));
            }
        }
    }
    out.push(report::line_plot(&f, "Latency CDF", "latency (us)", "fraction", &s, true).map(|_| f));
    if a.method == Method::Throughput {
        let f = dir.join("throughput-vs-flows.svg");
        let s = per_switch(&|c| {
            let r: Vec<f64> = c.searches.iter().map(|s| s.rate_pps / 1e3).collect();
            Some((f64::from(c.flows), median(&r)))
        });
        out.push(
            report::line_plot(
                &f,
                "Throughput at the loss target vs flows",
                "flows",
                "kpps",
                &s,
                true,
            )
            .map(|_| f),
        );
    }
    if a.method != Method::Throughput {
        let f = dir.join("scaling-flows.svg");
        let s = per_switch(&|c| {
            let v: Vec<f64> = c.trials.iter().filter_map(Trial::cpu_ns_per_pkt).collect();
            (!v.is_empty()).then(|| (f64::from(c.flows), median(&v)))
        });
        out.push(
            report::line_plot(
                &f,
                "Switch CPU per packet vs flows",
                "flows",
                "ns/packet",
                &s,
                true,
            )
            .map(|_| f),
        );
        let f = dir.join("scaling-delivered.svg");
        let s = per_switch(&|c| {
            let v: Vec<f64> = c.trials.iter().map(|t| t.delivered_pps() / 1e3).collect();
            Some((f64::from(c.flows), median(&v)))
        });
        out.push(
            report::line_plot(&f, "Delivered rate vs flows", "flows", "kpps", &s, true).map(|_| f),
        );
    }
    out
}

/// The cases of one switch kind: oxvs once per `--threads` value, any
/// other switch once.
fn thread_variants(k: &SwitchKind, threads: &[u16]) -> Vec<SwitchKind> {
    match k {
        SwitchKind::Oxvs { busy, .. } => threads
            .iter()
            .map(|&t| SwitchKind::Oxvs {
                threads: t.max(1),
                busy: *busy,
            })
            .collect(),
        other => vec![other.clone()],
    }
}
