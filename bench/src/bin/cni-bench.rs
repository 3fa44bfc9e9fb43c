//! # `cni-bench`: CNI ADD/DEL latency, oxvs against the reference plugins
//!
//! Times CNI ADD and DEL of `--n` pods, sequentially and `--concurrency`-way
//! concurrently, for `oxvs-cni` (with `oxvs-agent` and `oxvs-switchd`) and
//! for the reference `bridge` + `host-local` plugins, side by side in one
//! run. Each call is the plugin binary spawned exactly as a container
//! runtime spawns it: a clean environment with `CNI_COMMAND`,
//! `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_PATH`, `CNI_ARGS`
//! (`IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..`, as containerd
//! passes them) and the network configuration on stdin; the time is from
//! spawn to exit (`wait`), output read.
//!
//! ## Setup
//!
//! Everything happens in a dedicated "node" network namespace
//! (`oxcnib-<pid>-node`) that the bench creates and then enters
//! (`setns`, main thread, before any other thread exists, so every thread
//! and child inherits it): `oxvs-switchd --gateway oxgw0` and `oxvs-agent`
//! (pod CIDR 10.240.0.0/16, MTU 1450) run there (started through
//! `ip netns exec`, as the agent's tests do), the bridge plugin makes
//! `refbr0` there. Pods are namespaces `oxcnib-<pid>-pI`, made before any
//! timing and shared by the plugins (a DEL leaves the namespace empty).
//! One untimed ADD+DEL per plugin warms up (the bridge plugin creates its
//! bridge on the first ADD). Order: sequential oxvs ADD all, DEL all,
//! bridge ADD all, DEL all; then the same concurrently. After every DEL
//! batch the node must have as many links as before it (no leak).
//!
//! ## Output
//!
//! Tables on stdout; `--json FILE` writes every summary with the machine and
//! the date; `--plots DIR` draws them as SVG (`oxvs_bench::plots`, the same
//! charts as `bench-report`).
//!
//! ## Where oxvs's time goes
//!
//! - the agent's own time per request, from its debug log
//!   (`CNI request served ... ms=`);
//! - plugin process cost: `VERSION` (exec only) and `STATUS` (exec, the
//!   agent's socket, a `show` to switchd) round trips;
//! - a probe (after the agent is stopped, so that its resync does not undo
//!   the probe's ports) that runs the agent's ADD and DEL steps one after
//!   another (the agent runs the switch's add-port while it configures the
//!   pod end, and does not wait for the gratuitous ARP) with the agent's
//!   own code (`oxvs_agent::{ipam, state, podnet, flows}`)
//!   and the switch client, timing each: IPAM allocate, record save
//!   (write + fsync), netlink veth setup, switch add-port (XDP attach + UMEM
//!   and rings), add-flows, gratuitous ARP inject, and for DEL del-flows,
//!   del-port, veth delete, IPAM release, record remove.
//!
//! ## Cleanup
//!
//! Every namespace, the temporary directory and each daemon is owned by a
//! guard whose `Drop` removes it (daemons first, then pod namespaces, then
//! the node namespace, which takes every remaining link with it); errors
//! and panics unwind through them. SIGINT/SIGTERM set a flag the batches
//! and waits check, so Ctrl-C unwinds the same way.
//!
//! Concurrency: the batch runner uses `--concurrency` scoped threads that
//! take pod indices from an atomic counter; nothing else is shared. Needs
//! root.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use oxvs_bench::cni_bench::{
    loadavg, parse_agent_log, parse_attached, parse_switch_log, summary_cells, table, Machine,
    Summary,
};
use oxvs_bench::process::{must, Proc};
use serde_json::{json, Value};

/// Set by SIGINT/SIGTERM.
static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

fn stopped() -> bool {
    STOP.get().is_some_and(|s| s.load(Ordering::Relaxed))
}

const GATEWAY: &str = "oxgw0";
const OXVS_CIDR: &str = "10.240.0.0/16";
const REF_CIDR: &str = "10.241.0.0/16";
const PROBE_CIDR: &str = "10.242.0.0/16";

// ---------------------------------------------------------------- options

/// CNI ADD/DEL latency of oxvs-cni against bridge + host-local (needs root).
#[derive(Parser)]
#[command(name = "cni-bench")]
struct Opts {
    /// Pods per batch (at most 10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    n: u64,
    /// Concurrent calls in the concurrent batches.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Pods the step-by-step probe runs (at most --n).
    #[arg(long, default_value_t = 30)]
    probe_n: usize,
    /// Writes every summary, the machine and the date as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draws the summaries as SVG plots into DIR.
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// Where oxvs-cni, oxvs-agent and oxvs-switchd are (default: next to
    /// cni-bench).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Where the reference plugins are.
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/cni")]
    cni_path: PathBuf,
    /// Keeps the daemons' logs (their directory is printed).
    #[arg(long)]
    keep_logs: bool,
    /// An extra argument for oxvs-switchd (repeat for more), e.g.
    /// `--switchd-arg=--xdp-program --switchd-arg=libxdp`.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    switchd_arg: Vec<String>,
    /// An extra argument for oxvs-agent (repeat for more), e.g.
    /// `--agent-arg=--pod-qdisc=none`.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    agent_arg: Vec<String>,
}

// ---------------------------------------------------------------- commands

/// A daemon (a [`Proc`] logging to `log`, stopped gently on drop) and its
/// log, for start-up failures.
struct Daemon {
    proc_: Proc,
    log: PathBuf,
}

impl Daemon {
    fn spawn(args: &[&str], what: &str, log: &Path) -> Result<Daemon> {
        Ok(Daemon {
            proc_: Proc::spawn_logged(args, &[("NO_COLOR", "1")], what, log)?,
            log: log.to_owned(),
        })
    }

    fn running(&mut self) -> bool {
        self.proc_.running()
    }

    fn log_tail(&self, lines: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = s.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, then SIGKILL if it does not stop; reaps.
    fn stop(&mut self) {
        self.proc_.stop();
    }
}

/// The namespaces and the temporary directory of one run, removed on drop
/// (namespaces in reverse order of creation: pods, then the node).
struct Lab {
    netns: Vec<String>,
    dir: PathBuf,
    keep_dir: bool,
}

impl Lab {
    fn new(keep_dir: bool) -> Result<Lab> {
        let dir = std::env::temp_dir().join(format!("oxcnib-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Lab {
            netns: Vec::new(),
            dir,
            keep_dir,
        })
    }

    fn netns(&mut self, tag: &str) -> Result<String> {
        let ns = format!("oxcnib-{}-{tag}", std::process::id());
        must(&["ip", "netns", "add", &ns])?;
        self.netns.push(ns.clone());
        must(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.netns.iter().rev() {
            if let Err(e) = must(&["ip", "netns", "del", ns]) {
                eprintln!("cni-bench cleanup: {e}");
            }
        }
        if self.keep_dir {
            eprintln!("cni-bench: logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Enters network namespace `ns` (this thread; call before starting threads).
fn enter_netns(ns: &str) -> Result<()> {
    let path = format!("/var/run/netns/{ns}");
    let f = File::open(&path).with_context(|| format!("cannot open {path}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("cannot enter network namespace {ns}"))
}

/// Number of links in the current (node) namespace.
fn n_links() -> Result<usize> {
    Ok(must(&["ip", "-o", "link", "show"])?.lines().count())
}

// ---------------------------------------------------------------- plugins

/// A CNI plugin as a runtime sees it: a binary, `CNI_PATH` and a config.
struct Plugin {
    /// `oxvs` or `bridge` (the report's name).
    name: &'static str,
    bin: PathBuf,
    cni_path: String,
    config: Vec<u8>,
    /// The same configuration as `cniVersion` 1.1.0, for STATUS (which
    /// older versions do not have).
    config_v11: Vec<u8>,
}

/// One plugin call.
struct Call {
    took: Duration,
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Call {
    fn describe(&self) -> String {
        format!(
            "stdout: {} stderr: {}",
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

impl Plugin {
    /// Spawns the plugin with exactly the CNI environment (plus PATH) and
    /// the config on stdin; the time is spawn to exit.
    fn call(&self, verb: &str, cid: &str, netns: &str, args: &str) -> Result<Call> {
        let mut cmd = Command::new(&self.bin);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", cid)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let t = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot run {}", self.bin.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A plugin that exits without reading its config closes the pipe.
            let config = if verb == "STATUS" {
                &self.config_v11
            } else {
                &self.config
            };
            let _ = stdin.write_all(config);
        }
        let out = child
            .wait_with_output()
            .with_context(|| format!("waiting for {}", self.bin.display()))?;
        let took = t.elapsed();
        Ok(Call {
            took,
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// The pod address in an ADD result, if there is one.
fn result_ip(stdout: &str) -> Option<String> {
    let v: Value = serde_json::from_str(stdout).ok()?;
    v["ips"][0]["address"].as_str().map(str::to_string)
}

#[derive(Clone, Copy)]
struct Mode {
    name: &'static str,
    concurrency: usize,
}

fn container_id(p: &Plugin, mode: &Mode, i: usize) -> String {
    format!("cnib-{}-{}-{}-{i}", std::process::id(), p.name, mode.name)
}

fn cni_args(mode: &Mode, i: usize) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{}-{i}",
        mode.name
    )
}

/// The host-end names the agent gives the pods of `mode` (its switch ports).
fn host_ifnames(p: &Plugin, mode: &Mode, n: usize) -> std::collections::HashSet<String> {
    (0..n)
        .map(|i| {
            oxvs_agent::podnet::host_ifname(
                "bench",
                &format!("pod-{}-{i}", mode.name),
                &container_id(p, mode, i),
                "eth0",
            )
        })
        .collect()
}

/// Runs `verb` for every pod with `mode.concurrency` workers; the latencies
/// in ms. Fails (after the batch) if any call failed or an ADD gave no address.
fn batch(p: &Plugin, verb: &str, pods: &[String], mode: &Mode) -> Result<Vec<f64>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<Call>)>> = Mutex::new(Vec::with_capacity(pods.len()));
    std::thread::scope(|s| {
        for _ in 0..mode.concurrency.min(pods.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pods.len() || stopped() {
                    break;
                }
                let r = p.call(
                    verb,
                    &container_id(p, mode, i),
                    &format!("/var/run/netns/{}", pods[i]),
                    &cni_args(mode, i),
                );
                if let Ok(mut v) = results.lock() {
                    v.push((i, r));
                }
            });
        }
    });
    if stopped() {
        bail!("interrupted");
    }
    let results = results
        .into_inner()
        .map_err(|_| anyhow!("a batch worker panicked"))?;
    let mut ms = Vec::with_capacity(results.len());
    for (i, r) in results {
        let c = r?;
        if !c.ok {
            bail!(
                "{} {verb} of pod {i} ({}) failed: {}",
                p.name,
                mode.name,
                c.describe()
            );
        }
        if verb == "ADD" && result_ip(&c.stdout).is_none() {
            bail!(
                "{} ADD of pod {i} gave no address: {}",
                p.name,
                c.describe()
            );
        }
        ms.push(c.took.as_secs_f64() * 1e3);
    }
    if ms.len() != pods.len() {
        bail!(
            "{} {verb}: {} of {} calls ran",
            p.name,
            ms.len(),
            pods.len()
        );
    }
    Ok(ms)
}

/// `k` sequential calls of a verb that needs no pod (VERSION, STATUS).
fn repeat(p: &Plugin, verb: &str, k: usize) -> Result<Vec<f64>> {
    let mut v = Vec::with_capacity(k);
    for _ in 0..k {
        if stopped() {
            bail!("interrupted");
        }
        let c = p.call(verb, "", "", "")?;
        if !c.ok {
            bail!("{} {verb} failed: {}", p.name, c.describe());
        }
        v.push(c.took.as_secs_f64() * 1e3);
    }
    Ok(v)
}

// ---------------------------------------------------------------- binaries

fn find_bin(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    if !p.is_file() {
        bail!(
            "{} not found: build it (`cargo build --release -p oxvs-cni -p oxvs-agent -p oxvs-switch`) \
             or pass --bin-dir",
            p.display()
        );
    }
    Ok(p)
}

// ---------------------------------------------------------------- the probe

/// The agent's ADD and DEL, step by step, each step timed (see the module doc).
struct Probe {
    steps: Vec<(&'static str, &'static str, Vec<Duration>)>,
}

impl Probe {
    fn push(&mut self, verb: &'static str, step: &'static str, d: Duration) {
        match self
            .steps
            .iter_mut()
            .find(|(v, s, _)| *v == verb && *s == step)
        {
            Some((_, _, v)) => v.push(d),
            None => self.steps.push((verb, step, vec![d])),
        }
    }
}

/// Times `f`, recording it as `verb`/`step`.
fn timed<T>(
    probe: &mut Probe,
    verb: &'static str,
    step: &'static str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let t = Instant::now();
    let r = f()?;
    probe.push(verb, step, t.elapsed());
    Ok(r)
}

fn switch_call(sock: &Path, req: &oxvs_api::Request) -> Result<Value> {
    let mut c = oxvs_api::Client::connect(sock)
        .with_context(|| format!("cannot connect to switchd at {}", sock.display()))?;
    c.set_timeout(Duration::from_secs(10));
    c.call(req)
        .map_err(|e| anyhow!("switchd refused {req:?}: {e}"))
}

fn run_probe(dir: &Path, switch_sock: &Path, pods: &[String]) -> Result<Probe> {
    use oxvs_agent::{flows, ipam::Ipam, podnet, state};
    use oxvs_api::{PortKind, PortSpec, Request, TraceRequest, XdpModeRequest};

    let cidr: ipnet::Ipv4Net = PROBE_CIDR.parse().context("probe CIDR")?;
    let mut ipam = Ipam::open(&dir.join("probe-ipam"), cidr).context("probe IPAM")?;
    let (store, _) = state::Store::open(&dir.join("probe-state")).context("probe state")?;
    let ports: oxvs_api::DumpPortsResult =
        serde_json::from_value(switch_call(switch_sock, &Request::DumpPorts)?)
            .context("dump-ports answer")?;
    let gw_ofport = ports
        .ports
        .iter()
        .find(|p| p.name == GATEWAY)
        .map_or(1, |p| p.ofport);
    let gateway_ip = Ipv4Addr::new(10, 242, 0, 1);
    let node = flows::NodeNet {
        ipv4: Some(flows::NodeNet4 {
            pod_cidr: cidr,
            gateway_ip,
        }),
        gateway_mac: flows::pod_mac(gateway_ip),
        gateway_ofport: gw_ofport,
        ipv6: None,
    };
    let mut probe = Probe { steps: Vec::new() };
    for (i, pod) in pods.iter().enumerate() {
        if stopped() {
            bail!("interrupted");
        }
        let cid = format!("cnib-{}-probe-{i}", std::process::id());
        let host = podnet::host_ifname("bench", &format!("probe-{i}"), &cid, "eth0");
        let ip = timed(&mut probe, "ADD", "IPAM allocate (fsync)", || {
            ipam.allocate(&cid, "eth0").context("probe allocate")
        })?;
        let mac = flows::pod_mac(ip);
        let v4 = state::PodIpv4 {
            ip,
            prefix_len: cidr.prefix_len(),
            gateway: gateway_ip,
        };
        let mut rec = state::Attachment {
            container_id: cid.clone(),
            ifname: "eth0".into(),
            netns: format!("/var/run/netns/{pod}"),
            host_ifname: host.clone(),
            pod_namespace: "bench".into(),
            pod_name: format!("probe-{i}"),
            ipv4: Some(v4),
            mac: flows::mac_str(&mac),
            mtu: 1450,
            ofport: None,
            state: state::AttachState::Pending,
            ipv6: None,
            qdisc: None,
        };
        timed(&mut probe, "ADD", "record save x2 (fsync)", || {
            store.save(&rec).context("probe save")
        })?;
        let spec = podnet::PodIfaceSpec {
            netns: PathBuf::from(&rec.netns),
            ifname: "eth0".into(),
            host_ifname: host.clone(),
            mac,
            ipv4: Some(v4),
            mtu: 1450,
            route_mtu: None,
            tcp_full_mtu: false,
            // As the agent does by default (the switch completes checksums).
            tx_checksum_off: false,
            ipv6: None,
            // As the agent does by default: the node's default qdisc.
            qdisc: oxvs_netlink::RootQdisc::Auto.resolve().ok().flatten(),
        };
        timed(
            &mut probe,
            "ADD",
            "netlink: veth, move, addr, route",
            || podnet::setup_pod_interface(&spec).map_err(|e| anyhow!("probe pod interface: {e}")),
        )?;
        let info: oxvs_api::PortInfo = timed(
            &mut probe,
            "ADD",
            "switch add-port (XDP attach, UMEM)",
            || {
                let v = switch_call(
                    switch_sock,
                    &Request::AddPort(PortSpec {
                        name: host.clone(),
                        ofport: None,
                        kind: PortKind::Afxdp {
                            ifname: None,
                            xdp_mode: XdpModeRequest::Auto,
                            n_rxq: None,
                        },
                    }),
                )?;
                serde_json::from_value(v).context("add-port answer")
            },
        )?;
        rec.ofport = Some(info.ofport);
        rec.state = state::AttachState::Ready;
        let t = Instant::now();
        store.save(&rec).context("probe save")?;
        let save2 = t.elapsed();
        let pod_port = flows::PodPort {
            ofport: info.ofport,
            ip: Some(ip),
            mac,
            ip6: None,
        };
        let text = flows::pod_flows(&node, &pod_port).join("\n");
        timed(&mut probe, "ADD", "switch add-flows (pod flows)", || {
            switch_call(switch_sock, &Request::AddFlows { flows: text })
        })?;
        let garp: String = flows::gratuitous_arp(mac, ip)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        timed(
            &mut probe,
            "ADD",
            "switch trace-inject (gratuitous ARP)",
            || {
                switch_call(
                    switch_sock,
                    &Request::Trace(TraceRequest {
                        packet_hex: Some(garp),
                        in_port: Some(info.ofport),
                        inject: true,
                        ..TraceRequest::default()
                    }),
                )
            },
        )?;
        // The agent saves the record twice (pending, then ready with the
        // port); both saves count as one step.
        if let Some((_, _, v)) = probe
            .steps
            .iter_mut()
            .find(|(v, s, _)| *v == "ADD" && s.starts_with("record save"))
        {
            if let Some(last) = v.last_mut() {
                *last += save2;
            }
        }

        // DEL, in the agent's teardown order.
        let spec = format!("cookie={:#x}/-1", oxvs_agent::cookie::pod(info.ofport));
        timed(&mut probe, "DEL", "switch del-flows (by cookie)", || {
            switch_call(
                switch_sock,
                &Request::DelFlows {
                    spec: Some(spec),
                    strict: false,
                },
            )
        })?;
        timed(&mut probe, "DEL", "switch del-port (XDP detach)", || {
            switch_call(switch_sock, &Request::DelPort { name: host.clone() })
        })?;
        timed(&mut probe, "DEL", "netlink: delete veth", || {
            podnet::delete_host_link(&host).map_err(|e| anyhow!("probe delete {host}: {e}"))
        })?;
        timed(&mut probe, "DEL", "IPAM release (unlink)", || {
            ipam.release(&cid, "eth0").context("probe release")
        })?;
        timed(&mut probe, "DEL", "record remove", || {
            store.remove(&cid, "eth0").context("probe remove")
        })?;
    }
    Ok(probe)
}

// ---------------------------------------------------------------- main

/// The plots' file-name stem: the `--json` file's, or `default`.
fn plot_stem(json: Option<&Path>, default: &str) -> String {
    json.and_then(|p| p.file_stem())
        .and_then(|s| s.to_str())
        .unwrap_or(default)
        .to_owned()
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<()> {
    let o = Opts::parse();
    // Bounded by clap (1..=10000, 1..): both fit a usize.
    let (n, concurrency) = (o.n as usize, o.concurrency as usize);
    let probe_n = o.probe_n.min(n);
    if !nix::unistd::geteuid().is_root() {
        bail!("needs root (network namespaces, veth, XDP)");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("signal handler")?;
    }
    let _ = STOP.set(stop);

    let bin_dir = match &o.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .context("own path")?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| anyhow!("the bench binary has no directory"))?,
    };
    let cni_bin = find_bin(&bin_dir, "oxvs-cni")?;
    let agent_bin = find_bin(&bin_dir, "oxvs-agent")?;
    let switchd_bin = find_bin(&bin_dir, "oxvs-switchd")?;
    let bridge_bin = find_bin(&o.cni_path, "bridge")?;
    find_bin(&o.cni_path, "host-local")?;

    let machine = Machine::probe();
    println!(
        "cni-bench: {} pods, concurrency {}; {} ({} CPUs), kernel {}, load {}",
        n, concurrency, machine.cpu_model, machine.cores, machine.kernel, machine.loadavg
    );

    // Declared first: dropped last (after the daemons).
    let mut lab = Lab::new(o.keep_logs)?;
    let node = lab.netns("node")?;
    enter_netns(&node)?;
    let dir = lab.dir.clone();
    let s = |p: &str| dir.join(p).to_string_lossy().into_owned();
    let (sw_sock, cni_sock, state_dir, ref_data) = (
        s("switchd.sock"),
        s("cni.sock"),
        s("state"),
        s("host-local"),
    );

    let mut switchd = start_switchd(&node, &switchd_bin, &sw_sock, &dir, &o.switchd_arg)?;

    let agent_log = dir.join("agent.log");
    let mut agent = start_agent(
        &node,
        &agent_bin,
        &cni_sock,
        &sw_sock,
        &state_dir,
        &agent_log,
        &o.agent_arg,
    )?;
    let oxvs_conf = |v: &str| {
        serde_json::to_vec(&json!({
            "cniVersion": v, "name": "oxvs-bench", "type": "oxvs", "agentSocket": cni_sock
        }))
    };
    let oxvs = Plugin {
        name: "oxvs",
        bin: cni_bin,
        cni_path: o.cni_path.to_string_lossy().into_owned(),
        config: oxvs_conf("1.0.0")?,
        config_v11: oxvs_conf("1.1.0")?,
    };
    let ref_conf = |v: &str| {
        serde_json::to_vec(&json!({
            "cniVersion": v, "name": "ref-bench", "type": "bridge", "bridge": "refbr0",
            "isGateway": true,
            "ipam": {"type": "host-local", "subnet": REF_CIDR, "dataDir": ref_data}
        }))
    };
    let reference = Plugin {
        name: "bridge",
        bin: bridge_bin,
        cni_path: o.cni_path.to_string_lossy().into_owned(),
        config: ref_conf("1.0.0")?,
        config_v11: ref_conf("1.1.0")?,
    };
    wait_agent_ready(&oxvs, &mut agent)?;

    // Pods, before any timing.
    let t = Instant::now();
    let mut pods = Vec::with_capacity(n);
    for i in 0..n {
        if stopped() {
            bail!("interrupted");
        }
        pods.push(lab.netns(&format!("p{i}"))?);
    }
    let warm = lab.netns("warm")?;
    println!("{} pod namespaces in {:.1} s", n, t.elapsed().as_secs_f64());

    // Warm-up: one untimed ADD + DEL each.
    let warm_mode = Mode {
        name: "warm",
        concurrency: 1,
    };
    for p in [&oxvs, &reference] {
        batch(p, "ADD", std::slice::from_ref(&warm), &warm_mode)?;
        batch(p, "DEL", std::slice::from_ref(&warm), &warm_mode)?;
    }
    let base_links = n_links()?;

    let modes = [
        Mode {
            name: "sequential",
            concurrency: 1,
        },
        Mode {
            name: "concurrent",
            concurrency,
        },
    ];
    let mut results = Vec::new();
    for mode in &modes {
        for p in [&oxvs, &reference] {
            let t = Instant::now();
            let add = batch(p, "ADD", &pods, mode)?;
            let add_wall = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let del = batch(p, "DEL", &pods, mode)?;
            let del_wall = t.elapsed().as_secs_f64();
            let links = n_links()?;
            if links != base_links {
                bail!(
                    "{} ({}) left links behind: {links} links in the node after DEL, {base_links} before",
                    p.name,
                    mode.name
                );
            }
            for (verb, v, wall) in [("ADD", add, add_wall), ("DEL", del, del_wall)] {
                let s = Summary::of_ms(&v);
                eprintln!(
                    "  {:<6} {verb} {:<10} p50 {:.2} ms, all {n} in {wall:.2} s",
                    p.name, mode.name, s.p50
                );
                results.push((p.name, verb, *mode, s, wall));
            }
        }
    }

    // Plugin process costs.
    let k = n.min(100);
    let baselines = vec![
        (
            "oxvs-cni VERSION (exec only)",
            Summary::of_ms(&repeat(&oxvs, "VERSION", k)?),
        ),
        (
            "bridge VERSION (exec only)",
            Summary::of_ms(&repeat(&reference, "VERSION", k)?),
        ),
        (
            "oxvs-cni STATUS (exec + agent socket + switchd show)",
            Summary::of_ms(&repeat(&oxvs, "STATUS", k)?),
        ),
    ];

    // The agent's own time per request, then stop it (see the probe).
    agent.stop();
    let log = std::fs::read_to_string(&agent_log).unwrap_or_default();
    let agent_side = agent_side(&log, &modes);
    let agent_steps = agent_steps(&log, &oxvs, &modes, n);
    let sw_log = std::fs::read_to_string(dir.join("switchd.log")).unwrap_or_default();
    let switch_side = switch_side(&sw_log, &oxvs, &modes, n);

    let probe = run_probe(&dir, Path::new(&sw_sock), &pods[..probe_n])?;
    if !switchd.running() {
        bail!(
            "oxvs-switchd died during the run:\n{}",
            switchd.log_tail(30)
        );
    }

    let measured = Measured {
        results,
        baselines,
        agent_side,
        agent_steps,
        switch_side,
        probe,
    };
    let load_end = loadavg();
    print_report(&measured, &machine, &load_end);
    if o.json.is_some() || o.plots.is_some() {
        write_outputs(&o, &measured, &machine, &load_end, n, concurrency)?;
    }
    drop(agent);
    drop(switchd);
    drop(lab);
    Ok(())
}

/// Starts oxvs-switchd in the node namespace and waits (20 s at most) until
/// it answers on its socket.
fn start_switchd(
    node: &str,
    bin: &Path,
    sock: &str,
    dir: &Path,
    extra: &[String],
) -> Result<Daemon> {
    let sw_bin = bin.to_string_lossy().into_owned();
    let mut argv = vec![
        "ip",
        "netns",
        "exec",
        node,
        &sw_bin,
        "--socket",
        sock,
        "--gateway",
        GATEWAY,
        "--log-level",
        "info,oxvs_switch::afxdp=debug",
    ];
    argv.extend(extra.iter().map(String::as_str));
    let mut switchd = Daemon::spawn(&argv, "oxvs-switchd", &dir.join("switchd.log"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if Path::new(sock).exists()
            && switch_call(Path::new(sock), &oxvs_api::Request::Show).is_ok()
        {
            return Ok(switchd);
        }
        if !switchd.running() {
            bail!("oxvs-switchd exited at start-up:\n{}", switchd.log_tail(30));
        }
        if Instant::now() > deadline || stopped() {
            bail!(
                "oxvs-switchd not answering within 20 s:\n{}",
                switchd.log_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts oxvs-agent in the node namespace (debug log to `log`, for the
/// agent-side times), with the `extra` arguments (`--agent-arg`).
fn start_agent(
    node: &str,
    bin: &Path,
    cni_sock: &str,
    sw_sock: &str,
    state_dir: &str,
    log: &Path,
    extra: &[String],
) -> Result<Daemon> {
    let ag_bin = bin.to_string_lossy().into_owned();
    let mut argv = vec![
        "ip",
        "netns",
        "exec",
        node,
        &ag_bin,
        "--pod-cidr",
        OXVS_CIDR,
        "--cni-socket",
        cni_sock,
        "--switchd-socket",
        sw_sock,
        "--state-dir",
        state_dir,
        "--gateway",
        GATEWAY,
        "--mtu",
        "1450",
        "--log-level",
        "oxvs_agent=debug,info",
    ];
    argv.extend(extra.iter().map(String::as_str));
    Daemon::spawn(&argv, "oxvs-agent", log)
}

/// Waits (30 s at most) until the plugin's STATUS succeeds, i.e. the agent
/// is ready.
fn wait_agent_ready(oxvs: &Plugin, agent: &mut Daemon) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = oxvs.call("STATUS", "", "", "")?;
        if st.ok {
            return Ok(());
        }
        if !agent.running() {
            bail!("oxvs-agent exited at start-up:\n{}", agent.log_tail(30));
        }
        if Instant::now() > deadline || stopped() {
            bail!(
                "oxvs-agent not ready within 30 s ({}):\n{}",
                st.describe(),
                agent.log_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Everything one run measured, for the report and the JSON.
struct Measured {
    /// (plugin, verb, mode, latency from spawn to exit).
    /// Plugin, verb, mode, latencies, and the batch's wall-clock seconds
    /// (every pod's call, first spawn to last exit).
    results: Vec<(&'static str, &'static str, Mode, Summary, f64)>,
    /// Plugin process costs: (what, latency).
    baselines: Vec<(&'static str, Summary)>,
    /// The agent's own time per request: (verb, mode, time).
    agent_side: Vec<(&'static str, Mode, Summary)>,
    /// The agent's ADD steps: (mode, step, time).
    agent_steps: Vec<(Mode, &'static str, Summary)>,
    /// switchd per port: (mode, socket attempts, XDP modes used, UMEM map
    /// time, XDP socket time).
    switch_side: Vec<(Mode, usize, String, Summary, Summary)>,
    probe: Probe,
}

/// The agent's own time per request (`CNI request served ... ms=` in its
/// log), per mode and verb.
fn agent_side(log: &str, modes: &[Mode]) -> Vec<(&'static str, Mode, Summary)> {
    let served = parse_agent_log(log);
    let mut out = Vec::new();
    for mode in modes {
        let prefix = format!("cnib-{}-oxvs-{}-", std::process::id(), mode.name);
        for verb in ["ADD", "DEL"] {
            let ms: Vec<f64> = served
                .iter()
                .filter(|r| r.verb == verb && r.container.starts_with(&prefix))
                .map(|r| r.ms)
                .collect();
            out.push((verb, *mode, Summary::of_ms(&ms)));
        }
    }
    out
}

/// The agent's ADD steps ("pod attached" netlink_ms, port_ms, flows_ms),
/// per mode, for the timed pods of `oxvs`.
fn agent_steps(
    log: &str,
    oxvs: &Plugin,
    modes: &[Mode],
    n: usize,
) -> Vec<(Mode, &'static str, Summary)> {
    let attached = parse_attached(log);
    let mut out = Vec::new();
    for mode in modes {
        let names = host_ifnames(oxvs, mode, n);
        let mine: Vec<_> = attached
            .iter()
            .filter(|a| names.contains(&a.port))
            .collect();
        let col = |f: fn(&oxvs_bench::cni_bench::Attached) -> f64| {
            Summary::of_ms(&mine.iter().map(|a| f(a)).collect::<Vec<_>>())
        };
        out.push((*mode, "netlink (veth)", col(|a| a.netlink_ms)));
        out.push((
            *mode,
            "switch add-port (pod end configured meanwhile)",
            col(|a| a.port_ms),
        ));
        out.push((*mode, "record save + flow sync", col(|a| a.flows_ms)));
        out.push((*mode, "attach total", col(|a| a.total_ms)));
    }
    out
}

/// switchd's own time per port from its log: UMEM mapping and AF_XDP
/// socket (XDP program load + attach, rings), for the timed pods' ports.
fn switch_side(
    sw_log: &str,
    oxvs: &Plugin,
    modes: &[Mode],
    n: usize,
) -> Vec<(Mode, usize, String, Summary, Summary)> {
    let attempts = parse_switch_log(sw_log);
    let mut out = Vec::new();
    for mode in modes {
        let names = host_ifnames(oxvs, mode, n);
        let mine: Vec<_> = attempts
            .iter()
            .filter(|a| names.contains(&a.ifname))
            .collect();
        let ok: Vec<_> = mine.iter().filter(|a| a.ok).collect();
        let modes_used: std::collections::BTreeSet<&str> =
            ok.iter().map(|a| a.mode.as_str()).collect();
        out.push((
            *mode,
            mine.len(),
            modes_used.into_iter().collect::<Vec<_>>().join(","),
            Summary::of_ms(&ok.iter().map(|a| a.umem_ms).collect::<Vec<_>>()),
            Summary::of_ms(&ok.iter().map(|a| a.socket_ms).collect::<Vec<_>>()),
        ));
    }
    out
}

/// The tables on stdout.
fn print_report(m: &Measured, machine: &Machine, load_end: &str) {
    let mut rows = Vec::new();
    for (plugin, verb, mode, s, wall) in &m.results {
        let mut r = vec![
            plugin.to_string(),
            verb.to_string(),
            format!("{} ({})", mode.name, mode.concurrency),
            s.n.to_string(),
        ];
        r.extend(summary_cells(s));
        r.push(format!("{wall:.2}"));
        rows.push(r);
    }
    println!(
        "\nCNI latency, spawn to exit (ms):\n{}",
        table(
            &["plugin", "verb", "mode", "n", "p50", "p90", "p99", "max", "all (s)"],
            &rows,
            3
        )
    );
    let mut rows = Vec::new();
    for (verb, mode, s) in &m.agent_side {
        let mut r = vec![format!("agent {verb} {}", mode.name), s.n.to_string()];
        r.extend(summary_cells(s));
        rows.push(r);
    }
    for (mode, step, s) in &m.agent_steps {
        let mut r = vec![format!("agent ADD {}: {step}", mode.name), s.n.to_string()];
        r.extend(summary_cells(s));
        rows.push(r);
    }
    for (mode, n_attempts, xdp_modes, umem, sock) in &m.switch_side {
        for (what, s) in [
            ("UMEM map", umem),
            ("XDP socket: prog load, attach, rings", sock),
        ] {
            let mut r = vec![
                format!(
                    "switchd {what} ({}; {xdp_modes}; {n_attempts} attempts)",
                    mode.name
                ),
                s.n.to_string(),
            ];
            r.extend(summary_cells(s));
            rows.push(r);
        }
    }
    for (what, s) in &m.baselines {
        let mut r = vec![what.to_string(), s.n.to_string()];
        r.extend(summary_cells(s));
        rows.push(r);
    }
    for (verb, step, v) in &m.probe.steps {
        let s = Summary::of(v);
        let mut r = vec![format!("probe {verb}: {step}"), s.n.to_string()];
        r.extend(summary_cells(&s));
        rows.push(r);
    }
    println!(
        "Where oxvs's time goes (ms):\n{}",
        table(&["what", "n", "p50", "p90", "p99", "max"], &rows, 1)
    );
    println!(
        "load average: {} at start, {load_end} at end",
        machine.loadavg
    );
}

/// `--json FILE` and `--plots DIR`.
fn write_outputs(
    o: &Opts,
    m: &Measured,
    machine: &Machine,
    load_end: &str,
    n: usize,
    concurrency: usize,
) -> Result<()> {
    let mut mach = machine.json();
    mach["loadavg_at_end"] = json!(load_end);
    let doc = json!({
        "bench": "cni-latency",
        "date": oxvs_bench::plots::now_date(),
        "bench_pid": std::process::id(),
        "pods": n,
        "concurrency": concurrency,
        "machine": mach,
        "timing": "plugin spawn to exit, ms",
        "results": m.results.iter().map(|(plugin, verb, mode, s, wall)| {
            let mut v = s.json();
            v["batch_wall_s"] = json!(wall);
            v["plugin"] = json!(plugin);
            v["verb"] = json!(verb);
            v["mode"] = json!(mode.name);
            v["concurrency"] = json!(mode.concurrency);
            v
        }).collect::<Vec<_>>(),
        "agent_side": m.agent_side.iter().map(|(verb, mode, s)| {
            let mut v = s.json();
            v["verb"] = json!(verb);
            v["mode"] = json!(mode.name);
            v
        }).collect::<Vec<_>>(),
        "agent_add_steps": m.agent_steps.iter().map(|(mode, step, s)| {
            let mut v = s.json();
            v["mode"] = json!(mode.name);
            v["step"] = json!(step);
            v
        }).collect::<Vec<_>>(),
        "switch_side": m.switch_side.iter().map(|(mode, n_attempts, xdp_modes, umem, sock)| json!({
            "mode": mode.name,
            "socket_attempts": n_attempts,
            "xdp_modes": xdp_modes,
            "umem_map": umem.json(),
            "xdp_socket": sock.json(),
        })).collect::<Vec<_>>(),
        "baselines": m.baselines.iter().map(|(what, s)| {
            let mut v = s.json();
            v["what"] = json!(what);
            v
        }).collect::<Vec<_>>(),
        "probe": m.probe.steps.iter().map(|(verb, step, d)| {
            let mut v = Summary::of(d).json();
            v["verb"] = json!(verb);
            v["step"] = json!(step);
            v
        }).collect::<Vec<_>>(),
    });
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("results: {}", path.display());
    }
    if let Some(dir) = &o.plots {
        let stem = plot_stem(o.json.as_deref(), "cni-bench");
        for f in oxvs_bench::plots::cni_plots(&doc, dir, &stem).context("plots")? {
            println!("plot: {}", f.display());
        }
    }
    Ok(())
}
