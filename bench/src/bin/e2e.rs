//! # `e2e`: the end-to-end datapath harness
//!
//! Forwards real packets between network namespaces through each switch
//! under test, side by side in one run, on the same topology:
//!
//! ```text
//!   netns gen (eth0 10.200.0.1) --veth-- [switch] --veth-- netns sink (eth0 10.200.0.2)
//! ```
//!
//! Switches: `oxvs-switchd` (release build, interrupt mode, or busy with
//! `--oxvs-mode busy`; flows `in_port=1 actions=output:2` and back), Open
//! vSwitch userspace (`datapath_type=netdev`) with `afxdp` ports (PMD
//! threads) and with `afxdp-nonpmd` ports (polled by the main thread), and
//! a Linux bridge.
//! Each gets a fresh topology (its own namespaces and veth pairs).
//!
//! Measurements, each repeated `--trials` times (median and min-max):
//! - **max load**: 64-byte UDP frames (60 bytes + FCS) from `trafgen` on one
//!   CPU for `--duration` seconds; offered = the generator veth's
//!   `tx_packets + tx_dropped`, delivered = the sink veth's `rx_packets`,
//!   loss = offered - delivered;
//! - **fixed load** (`--rate` pps, below saturation): the switch process's
//!   CPU time (sum of its threads' `/proc/PID/task/*/schedstat` run time)
//!   per delivered packet, and the whole machine's softirq time per packet
//!   (`/proc/stat`; includes the generator's and the sink's kernel work; the
//!   only CPU figure a Linux bridge has);
//! - **TCP**: `iperf3` from gen to sink through each switch, and across two
//!   "nodes" (namespaces joined by an underlay veth) over VXLAN: two
//!   `oxvs-switchd`s with VXLAN ports, and kernel `vxlan` devices in Linux
//!   bridges as the reference; with the pods' TX checksum offload on (the
//!   kernel default; it brings GSO) and off (`--offloads`), 1 and 4
//!   streams (`--streams`); received Gbit/s and the sender's retransmits.
//!   A setting a switch cannot carry (OVS-afxdp does not complete partial
//!   checksums) is reported as failed. `--tcp-only` skips the UDP loads.
//! - **Request/response**: one 64-byte request outstanding over one TCP
//!   connection (netperf TCP_RR's pattern; this binary is both ends, run
//!   as `e2e --rr-server` / `e2e --rr-client IP SECS` in the pods):
//!   transactions per second and p50/p99 latency, per offload setting.
//!
//! Output: a table on stdout; `--json FILE` writes every trial with the
//! machine and the date; `--plots DIR` draws pps, CPU per packet and TCP
//! throughput per switch as SVG (`oxvs_bench::plots`, as `bench-report`).
//!
//! Cleanup: every namespace, link, OVS bridge, socket and child process is
//! owned by a guard whose `Drop` removes it; errors and panics unwind
//! through them. SIGINT/SIGTERM set a flag that every wait checks, so
//! Ctrl-C turns into an error that unwinds the same way. Names carry the
//! pid, so concurrent runs and leftovers of other programs do not collide.
//!
//! Single-threaded apart from child processes; needs root.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use oxvs_bench::process::{must, must_in, run, Proc};
use oxvs_bench::xbench::setup;
use serde_json::{json, Value};

/// Set by SIGINT/SIGTERM.
static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

fn stopped() -> bool {
    STOP.get().is_some_and(|s| s.load(Ordering::Relaxed))
}

/// Sleeps `d`, failing early when interrupted.
fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stopped() {
            bail!("interrupted");
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    if stopped() {
        bail!("interrupted");
    }
    Ok(())
}

// ---------------------------------------------------------------- options

/// oxvs-switchd against OVS (PMD and non-PMD), the Linux bridge and the
/// kernel's VXLAN: offered and delivered rate, loss, CPU per packet, TCP
/// throughput (needs root).
#[derive(Parser)]
#[command(name = "e2e")]
struct Opts {
    /// Seconds per trial.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,
    /// Trials per measurement.
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    trials: usize,
    /// The fixed load, in packets per second.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    rate: u64,
    /// Writes the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draws the results as SVG plots into DIR.
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// Only these setups (comma-separated): oxvs, ovs-pmd, ovs-nonpmd,
    /// bridge, vxlan-oxvs, vxlan-kernel.
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// TCP only: skip the 64-byte UDP max and fixed load measurements.
    #[arg(long)]
    tcp_only: bool,
    /// The pods' TX checksum offload (and with it GSO) during the TCP
    /// measurements, each in turn (comma-separated): `on` (the kernel's
    /// default, what pods run with) and/or `off`.
    #[arg(long, value_delimiter = ',', default_values = ["on", "off"])]
    offloads: Vec<Offload>,
    /// How the oxvs switches poll: `interrupt` (the default, against OVS
    /// non-PMD) or `busy` (a spinning datapath thread, against OVS PMD).
    #[arg(long, value_enum, default_value_t = OxvsMode::Interrupt)]
    oxvs_mode: OxvsMode,
    /// One more argument for every `oxvs-switchd` started (repeat it), as
    /// in `--switchd-arg=--poll-linger-us=50` to measure a switchd option.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    switchd_arg: Vec<String>,
    /// Parallel TCP streams (`iperf3 -P`), each count in turn.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    streams: Vec<u32>,
    /// The MTU of the two pods (and their host ends) on one node, each in
    /// turn (comma-separated; with more than one, each single-node result
    /// is named with its MTU). oxvs's two-node setup runs once per MTU:
    /// pods at that MTU when above 1500 (their TCP is segmented into the
    /// tunnel), else 1450 (a 1500-byte underlay); the kernel VXLAN keeps
    /// 1450. Above ~3.5k only switches whose XDP program is
    /// frags-aware can attach (oxvs, the bridge; OVS's libxdp program
    /// cannot).
    #[arg(long, value_delimiter = ',', default_values_t = [1500u32],
          value_parser = clap::value_parser!(u32).range(576..=65535))]
    mtu: Vec<u32>,
    /// Queues of every pod's veth (`numtxqueues`/`numrxqueues`): with more
    /// than one, a pod's flows spread over them by hash, and oxvs serves
    /// each queue with its own socket (with `--switchd-arg=--threads=N`,
    /// queue q on its own datapath thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pod_queues: u32,
    /// The root qdisc of the oxvs pods' `eth0`, as `oxvs-agent
    /// --pod-qdisc` gives it: `auto` (the node's `net.core.default_qdisc`,
    /// the agent's default), `none` (the veth's `noqueue`), or a kind. The
    /// other setups' pods keep `noqueue`, as their CNIs leave it.
    #[arg(long, value_name = "auto|none|KIND", default_value = "auto")]
    pod_qdisc: oxvs_netlink::RootQdisc,
}

/// `--pod-queues`, set once in `main` before any pod is made.
static POD_QUEUES: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
/// `--pod-qdisc` resolved (`None`: keep `noqueue`), set once in `main`.
static OXVS_POD_QDISC: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OxvsMode {
    Interrupt,
    Busy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Offload {
    On,
    Off,
}

impl Offload {
    fn name(self) -> &'static str {
        match self {
            Offload::On => "on",
            Offload::Off => "off",
        }
    }
}

// ---------------------------------------------------------------- commands

/// Waits (interruptibly) up to `limit` for `p` to exit by itself.
fn wait_exit(p: &mut Proc, limit: Duration) -> Result<bool> {
    let end = Instant::now() + limit;
    loop {
        if !p.running() {
            return Ok(true);
        }
        if Instant::now() >= end {
            return Ok(false);
        }
        sleep(Duration::from_millis(20))?;
    }
}

// ---------------------------------------------------------------- topology

/// Everything one scenario created, removed on drop (in reverse order).
#[derive(Default)]
struct Lab {
    netns: Vec<String>,
    links: Vec<String>,
    ovs_bridges: Vec<String>,
    files: Vec<PathBuf>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for br in self.ovs_bridges.iter().rev() {
            if let Err(e) = must(&["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br]) {
                eprintln!("e2e cleanup: {e}");
            }
        }
        for l in self.links.iter().rev() {
            if Path::new(&format!("/sys/class/net/{l}")).exists() {
                if let Err(e) = must(&["ip", "link", "del", l]) {
                    eprintln!("e2e cleanup: {e}");
                }
            }
        }
        for ns in self.netns.iter().rev() {
            if let Err(e) = must(&["ip", "netns", "del", ns]) {
                eprintln!("e2e cleanup: {e}");
            }
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn pid() -> u32 {
    std::process::id()
}

impl Lab {
    fn netns(&mut self, name: &str) -> Result<String> {
        let ns = format!("oxbench-{}-{name}", pid());
        must(&["ip", "netns", "add", &ns])?;
        self.netns.push(ns.clone());
        must(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        must_in(&ns, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
        must_in(
            &ns,
            &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
        )?;
        Ok(ns)
    }

    /// A pod: `eth0` in `ns` with `addr` (CIDR) and `mtu` (offloads as the
    /// kernel sets them; the TCP measurements set TX checksum offload) and
    /// root qdisc `qdisc` (`None`: the veth's `noqueue`); the host end
    /// `host` stays in `host_ns` (None: the root namespace), up, without
    /// addresses.
    fn pod(
        &mut self,
        ns: &str,
        addr: &str,
        mtu: u32,
        host: &str,
        host_ns: Option<&str>,
        qdisc: Option<&str>,
    ) -> Result<()> {
        let peer = format!("{host}p");
        let q = POD_QUEUES.get().copied().unwrap_or(1).to_string();
        must(&[
            "ip",
            "link",
            "add",
            host,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            ns,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
        ])?;
        if host_ns.is_none() {
            self.links.push(host.to_owned());
        }
        must(&["ip", "-n", ns, "link", "set", &peer, "name", "eth0"])?;
        must(&[
            "ip",
            "-n",
            ns,
            "link",
            "set",
            "eth0",
            "mtu",
            &mtu.to_string(),
        ])?;
        must(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"])?;
        must(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
        if let Some(kind) = qdisc {
            must_in(ns, &["tc", "qdisc", "replace", "dev", "eth0", "root", kind])?;
        }
        // The host end has the pod's MTU, as the agent makes it: a veth
        // drops what exceeds the receiving end's, and the switch sizes the
        // frames it merges for a port by that port's (host end's) MTU.
        let host_mtu = mtu.to_string();
        must(&["ip", "link", "set", host, "mtu", &host_mtu])?;
        match host_ns {
            None => {
                let _ = run(&[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{host}.disable_ipv6=1"),
                ]);
                must(&["ip", "link", "set", host, "up"])?;
            }
            Some(hns) => {
                must(&["ip", "link", "set", host, "netns", hns])?;
                must(&["ip", "-n", hns, "link", "set", host, "up"])?;
            }
        }
        Ok(())
    }
}

/// The single-node topology: gen and sink pods, host ends in the root
/// namespace.
struct Pair {
    lab: Lab,
    gen: String,
    sink: String,
    host_gen: String,
    host_sink: String,
}

const GEN_IP: &str = "10.200.0.1";
const SINK_IP: &str = "10.200.0.2";
/// The UDP flood's destination: on the sink's subnet but nobody's address.
const FLOOD_DST: &str = "10.200.0.3";
/// The flood's destination MAC: nobody's either, so the sink's veth counts
/// each frame (`rx_packets`) and its IP layer drops it at once as
/// `PACKET_OTHERHOST`. With the sink's own MAC, the sink would route the
/// frame, fail, and run `ip_error` for each one, and that work is charged
/// to whoever transmits into the sink veth (the switch process, for the
/// AF_XDP switches): the CPU figure would measure the sink. The switches
/// forward by in_port (oxvs, OVS) or flood the unknown unicast to the one
/// other port (bridge), so every switch does the same forwarding work.
const FLOOD_DST_MAC: &str = "02:e2:e0:00:00:03";

impl Pair {
    /// `qdisc`: the pods' root qdisc (see [`Lab::pod`]).
    fn new(tag: &str, mtu: u32, qdisc: Option<&str>) -> Result<Pair> {
        let mut lab = Lab::default();
        let gen = lab.netns(&format!("{tag}-gen"))?;
        let sink = lab.netns(&format!("{tag}-sink"))?;
        let host_gen = format!("xb{}{tag}g", pid());
        let host_sink = format!("xb{}{tag}s", pid());
        if host_gen.len() > 15 {
            bail!("interface name {host_gen} too long");
        }
        lab.pod(&gen, &format!("{GEN_IP}/24"), mtu, &host_gen, None, qdisc)?;
        lab.pod(
            &sink,
            &format!("{SINK_IP}/24"),
            mtu,
            &host_sink,
            None,
            qdisc,
        )?;
        Ok(Pair {
            lab,
            gen,
            sink,
            host_gen,
            host_sink,
        })
    }
}

/// The oxvs pods' root qdisc (`--pod-qdisc`, resolved).
fn oxvs_pod_qdisc() -> Option<&'static str> {
    OXVS_POD_QDISC.get().and_then(|q| q.as_deref())
}

// ---------------------------------------------------------------- counters

#[derive(Clone, Copy, Default)]
struct LinkStats {
    rx_packets: u64,
    tx_packets: u64,
    tx_dropped: u64,
}

/// The TX drops of both pods' `eth0`, summed.
fn pods_tx_dropped(pods: [&str; 2]) -> Result<u64> {
    let mut n = 0;
    for ns in pods {
        n += link_stats(ns, "eth0")?.tx_dropped;
    }
    Ok(n)
}

fn link_stats(ns: &str, dev: &str) -> Result<LinkStats> {
    let out = must(&["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev])?;
    let v: Value = serde_json::from_str(&out).context("ip -j -s link output")?;
    let s = &v[0]["stats64"];
    let get = |dir: &str, f: &str| s[dir][f].as_u64().unwrap_or(0);
    Ok(LinkStats {
        rx_packets: get("rx", "packets"),
        tx_packets: get("tx", "packets"),
        tx_dropped: get("tx", "dropped"),
    })
}

fn mac_of(ns: &str, dev: &str) -> Result<String> {
    let out = must(&["ip", "-n", ns, "-j", "link", "show", "dev", dev])?;
    let v: Value = serde_json::from_str(&out).context("ip -j link output")?;
    v[0]["address"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no MAC address for {dev} in {ns}"))
}

/// Run time of all threads of `pid`, in ns (`/proc/PID/task/*/schedstat`).
fn proc_cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0u64;
    let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("process {pid} is gone"))?;
    for t in dir.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
            total += s
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// Machine-wide softirq time in ns (`/proc/stat`, USER_HZ = 100).
fn softirq_ns() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("cpu "))
                .and_then(|l| l.split_whitespace().nth(7))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |ticks| ticks * 10_000_000)
}

// ---------------------------------------------------------------- load

/// Writes the trafgen configuration: one 60-byte UDP frame (64 with FCS).
fn trafgen_conf(lab: &mut Lab, src_mac: &str) -> Result<PathBuf> {
    let dst_mac = FLOOD_DST_MAC;
    let path = PathBuf::from(format!("/tmp/oxbench-{}.trafgen", pid()));
    let text = format!(
        "{{\n  eth(da={dst_mac}, sa={src_mac}),\n  ipv4(saddr={GEN_IP}, daddr={FLOOD_DST}, ttl=64),\n  udp(sport=9, dport=9),\n  fill(0x00, 18)\n}}\n"
    );
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    lab.files.push(path.clone());
    Ok(path)
}

#[derive(Clone, Copy, Default)]
struct LoadTrial {
    secs: f64,
    offered: u64,
    delivered: u64,
    /// Switch process CPU (ns); None for the Linux bridge.
    cpu_ns: Option<u64>,
    softirq_ns: u64,
}

impl LoadTrial {
    fn offered_pps(&self) -> f64 {
        self.offered as f64 / self.secs
    }
    fn delivered_pps(&self) -> f64 {
        self.delivered as f64 / self.secs
    }
    fn loss(&self) -> f64 {
        if self.offered == 0 {
            0.0
        } else {
            self.offered.saturating_sub(self.delivered) as f64 / self.offered as f64
        }
    }
    fn cpu_per_pkt(&self) -> Option<f64> {
        self.cpu_ns.map(|c| c as f64 / self.delivered.max(1) as f64)
    }
    fn softirq_per_pkt(&self) -> f64 {
        self.softirq_ns as f64 / self.delivered.max(1) as f64
    }
}

/// One trafgen run of `secs` seconds; `rate` None = as fast as it goes.
///
/// trafgen gives up ("Flushing TX_RING failed: Resource temporarily
/// unavailable") when the veth pushes back (its peer's XDP ring is full)
/// at the wrong moment; such a run is retried, up to three times.
fn load_trial(
    p: &Pair,
    conf: &Path,
    secs: u64,
    rate: Option<u64>,
    switch_pid: Option<u32>,
) -> Result<LoadTrial> {
    let mut attempt = 1;
    loop {
        match load_trial_once(p, conf, secs, rate, switch_pid) {
            Err(e)
                if attempt < 3
                    && !stopped()
                    && format!("{e:#}").contains("trafgen exited early") =>
            {
                eprintln!("e2e: retrying: {e:#}");
                attempt += 1;
            }
            r => return r,
        }
    }
}

fn load_trial_once(
    p: &Pair,
    conf: &Path,
    secs: u64,
    rate: Option<u64>,
    switch_pid: Option<u32>,
) -> Result<LoadTrial> {
    let conf = conf.to_string_lossy().into_owned();
    // Bound: more than one CPU can send in `secs`.
    let count = (secs * 20_000_000).to_string();
    // A gap, not `--rate`: trafgen's `--rate` sends in bursts (thousands
    // of frames back to back, then a pause), which measures ring depth,
    // not per-packet cost; `--gap` spaces the frames out.
    let gap_arg = rate.map(|r| format!("{}ns", 1_000_000_000 / r.max(1)));
    let mut args = vec![
        "ip",
        "netns",
        "exec",
        &p.gen,
        "trafgen",
        "--dev",
        "eth0",
        "--conf",
        &conf,
        "--cpus",
        "1",
        "--no-sock-mem",
        "-n",
        &count,
    ];
    if let Some(g) = &gap_arg {
        args.extend_from_slice(&["--gap", g]);
    }
    let g0 = link_stats(&p.gen, "eth0")?;
    let s0 = link_stats(&p.sink, "eth0")?;
    let c0 = switch_pid.map(proc_cpu_ns).transpose()?;
    let q0 = softirq_ns();
    let t0 = Instant::now();
    let mut tg = Proc::spawn_piped(&args, "trafgen", false)?;
    if wait_exit(&mut tg, Duration::from_secs(secs))? {
        let (out, err) = tg.finish();
        let last = |t: &str| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_owned()
        };
        bail!("trafgen exited early: {} {}", last(&out), last(&err));
    }
    tg.finish();
    let secs = t0.elapsed().as_secs_f64();
    // Let what is in flight arrive.
    sleep(Duration::from_millis(300))?;
    let g1 = link_stats(&p.gen, "eth0")?;
    let s1 = link_stats(&p.sink, "eth0")?;
    let c1 = switch_pid.map(proc_cpu_ns).transpose()?;
    let q1 = softirq_ns();
    Ok(LoadTrial {
        secs,
        offered: (g1.tx_packets + g1.tx_dropped).saturating_sub(g0.tx_packets + g0.tx_dropped),
        delivered: s1.rx_packets.saturating_sub(s0.rx_packets),
        cpu_ns: c0.zip(c1).map(|(a, b)| b.saturating_sub(a)),
        softirq_ns: q1.saturating_sub(q0),
    })
}

/// Starts `server` (argv, in its namespace), waits `settle`, runs `client`
/// until it exits (at most `secs` + 15 s), then gives the server 2 s to
/// exit; the client's stdout and stderr. `what` names the pair in errors.
fn client_server(
    what: &str,
    server: &[&str],
    settle: Duration,
    client: &[&str],
    secs: u64,
) -> Result<(String, String)> {
    let mut server = Proc::spawn_piped(server, &format!("{what} server"), false)?;
    sleep(settle)?;
    let mut client = Proc::spawn_piped(client, &format!("{what} client"), false)?;
    let done = wait_exit(&mut client, Duration::from_secs(secs + 15))?;
    let (out, err) = client.finish();
    let _ = wait_exit(&mut server, Duration::from_secs(2));
    if !done {
        bail!("{what} client did not finish");
    }
    Ok((out, err))
}

/// One iperf3 TCP run.
struct TcpTrial {
    gbps: f64,
    retransmits: u64,
}

/// One iperf3 TCP run of `streams` streams from `client_ns` to
/// `server_ip` in `server_ns`: received Gbit/s and the sender's
/// retransmitted segments.
fn tcp_trial(
    client_ns: &str,
    server_ns: &str,
    server_ip: &str,
    secs: u64,
    streams: u32,
) -> Result<TcpTrial> {
    let t = secs.to_string();
    let p = streams.to_string();
    let (out, err) = client_server(
        "iperf3",
        &[
            "ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5201",
        ],
        Duration::from_millis(500),
        &[
            "ip",
            "netns",
            "exec",
            client_ns,
            "iperf3",
            "-c",
            server_ip,
            "-p",
            "5201",
            "-t",
            &t,
            "-P",
            &p,
            "-J",
            "--connect-timeout",
            "3000",
        ],
        secs,
    )?;
    let v: Value = serde_json::from_str(&out)
        .with_context(|| format!("iperf3 output not JSON: {}", err.trim()))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let gbps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .ok_or_else(|| anyhow!("iperf3 JSON without end.sum_received"))?;
    Ok(TcpTrial {
        gbps,
        retransmits: v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
    })
}

/// `n` trials of one measurement, run by [`Trials::each`]: they stop at
/// the first failure, which [`Trials::ended`] reports (an interruption is
/// an error; any other failure is the setting's recorded error).
struct Trials<F> {
    n: usize,
    trial: F,
    failed: Option<anyhow::Error>,
}

fn trials<T, F: FnMut() -> Result<T>>(n: usize, trial: F) -> Trials<F> {
    Trials {
        n,
        trial,
        failed: None,
    }
}

impl<T, F: FnMut() -> Result<T>> Trials<F> {
    /// Runs the trials, handing each result and its number to `keep`.
    fn each(mut self, mut keep: impl FnMut(usize, T)) -> Self {
        for i in 0..self.n {
            match (self.trial)() {
                Ok(t) => keep(i, t),
                Err(e) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        self
    }

    /// `Ok(None)`: every trial ran; `Ok(Some(why))`: one failed (printed
    /// under `what`); `Err`: interrupted.
    fn ended(self, what: &str) -> Result<Option<String>> {
        match self.failed {
            None => Ok(None),
            Some(e) if stopped() => Err(e),
            Some(e) => {
                eprintln!("e2e: {what}: {e:#}");
                Ok(Some(format!("{e:#}")))
            }
        }
    }
}

/// The TCP measurements of one setup: for each offload setting of the
/// pods and each stream count, `trials` iperf3 runs. A setting whose
/// first run fails (no connection, say) is recorded with its error and
/// not retried.
fn tcp_runs(
    o: &Opts,
    name: &str,
    pods: [&str; 2],
    server_ip: &str,
    switches: Option<&Switches>,
) -> Result<Vec<TcpRun>> {
    let mut runs = Vec::new();
    for &offload in &o.offloads {
        for pod in pods {
            must_in(pod, &["ethtool", "-K", "eth0", "tx", offload.name()])?;
        }
        for &streams in &o.streams {
            let mut run = TcpRun {
                offload: Some(offload),
                streams,
                ..Default::default()
            };
            run.error = trials(o.trials, || {
                let before = switches.and_then(Switches::drops);
                let veth_before = pods_tx_dropped(pods)?;
                let t = tcp_trial(pods[0], pods[1], server_ip, o.duration, streams)?;
                let veth = pods_tx_dropped(pods)?.saturating_sub(veth_before);
                let after = switches.and_then(Switches::drops);
                Ok((t, before.zip(after).map(|(b, a)| a.since(&b)), veth))
            })
            .each(|i, (t, dropped, veth)| {
                let in_switch = dropped.map_or(String::new(), |d| format!(", {}", d.describe()));
                eprintln!(
                    "e2e: {name} tcp offload {} x{streams} #{i}: {:.2} Gbit/s, {} retransmits{in_switch}, {veth} dropped by the pods' veths",
                    offload.name(),
                    t.gbps,
                    t.retransmits
                );
                run.gbps.push(t.gbps);
                run.retransmits.push(t.retransmits as f64);
                if let Some(d) = dropped {
                    run.switch_drops.push(d.total as f64);
                    for (i, n) in d.by_reason.iter().enumerate() {
                        run.switch_drop_reasons[i].push(*n as f64);
                    }
                }
                run.veth_drops.push(veth as f64);
            })
            .ended(&format!("{name} tcp offload {} x{streams}", offload.name()))?;
            if streams == o.streams.first().copied().unwrap_or(1) {
                run.rr_error = trials(o.trials, || {
                    rr_trial(pods[0], pods[1], server_ip, o.duration)
                })
                .each(|i, t| {
                    eprintln!(
                        "e2e: {name} request/response offload {} #{i}: {:.0}/s, p50 {:.1} us, p99 {:.1} us",
                        offload.name(),
                        t.tps,
                        t.p50_us,
                        t.p99_us
                    );
                    run.rr_tps.push(t.tps);
                    run.rr_p50_us.push(t.p50_us);
                    run.rr_p99_us.push(t.p99_us);
                })
                .ended(&format!("{name} request/response offload {}", offload.name()))?;
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

// ---------------------------------------------------------------- request/response

/// The port of the request/response server.
const RR_PORT: u16 = 5202;
/// Bytes per request and per response (netperf TCP_RR's default is 1).
const RR_BYTES: usize = 64;

/// `e2e --rr-server`: accepts one TCP connection on [`RR_PORT`] (10 s at
/// most) and echoes [`RR_BYTES`]-byte requests until the client closes.
fn rr_server() -> Result<()> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind(("0.0.0.0", RR_PORT)).context("bind")?;
    println!("listening");
    let (mut c, _) = l.accept().context("accept")?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = [0u8; RR_BYTES];
    loop {
        match c.read_exact(&mut buf) {
            Ok(()) => c.write_all(&buf)?,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e).context("read"),
        }
    }
}

/// `e2e --rr-client IP SECS`: one request outstanding at a time for SECS
/// seconds; prints JSON: transactions per second and latency percentiles
/// in microseconds.
fn rr_client(ip: &str, secs: &str) -> Result<()> {
    use std::io::{Read, Write};
    let secs: f64 = secs.parse().context("seconds")?;
    let mut c = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{RR_PORT}").parse().context("address")?,
        Duration::from_secs(3),
    )
    .context("connect")?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = [0x5au8; RR_BYTES];
    let mut resp = [0u8; RR_BYTES];
    let mut lat_ns: Vec<u64> = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        let t = Instant::now();
        c.write_all(&req).context("write")?;
        c.read_exact(&mut resp).context("read")?;
        lat_ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    let took = start.elapsed().as_secs_f64();
    lat_ns.sort_unstable();
    let pct = |p: f64| -> f64 {
        let i = ((lat_ns.len() as f64 - 1.0) * p).round() as usize;
        lat_ns.get(i).map_or(0.0, |v| *v as f64 / 1e3)
    };
    println!(
        "{}",
        json!({
            "transactions": lat_ns.len(),
            "tps": lat_ns.len() as f64 / took,
            "p50_us": pct(0.5),
            "p99_us": pct(0.99),
        })
    );
    Ok(())
}

/// One request/response run from `client_ns` to `server_ip` in
/// `server_ns` (this binary as both ends): transactions/s, p50, p99 µs.
fn rr_trial(client_ns: &str, server_ns: &str, server_ip: &str, secs: u64) -> Result<RrTrial> {
    let exe = std::env::current_exe().context("current_exe")?;
    let exe = exe.to_string_lossy().into_owned();
    let t = secs.to_string();
    let (out, err) = client_server(
        "request/response",
        &["ip", "netns", "exec", server_ns, &exe, "--rr-server"],
        Duration::from_millis(300),
        &[
            "ip",
            "netns",
            "exec",
            client_ns,
            &exe,
            "--rr-client",
            server_ip,
            &t,
        ],
        secs,
    )?;
    // The client's error, without the backtrace RUST_BACKTRACE may add.
    let why = err
        .split("Stack backtrace")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let v: Value = serde_json::from_str(out.trim())
        .with_context(|| format!("request/response client: {why}"))?;
    let num = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| anyhow!("request/response output without {k}"))
    };
    Ok(RrTrial {
        tps: num("tps")?,
        p50_us: num("p50_us")?,
        p99_us: num("p99_us")?,
    })
}

/// One request/response run.
struct RrTrial {
    tps: f64,
    p50_us: f64,
    p99_us: f64,
}

fn ping_ok(ns: &str, dst: &str) -> bool {
    run(&[
        "ip", "netns", "exec", ns, "ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1", dst,
    ])
    .map(|o| o.status.success())
    .unwrap_or(false)
}

// ---------------------------------------------------------------- switches

/// A running switch under test; dropping it stops it.
struct Running {
    /// Process whose CPU time is the switch's (None: kernel bridge).
    pid: Option<u32>,
    /// How each port moves packets (XDP mode etc.).
    port_modes: BTreeMap<String, String>,
    /// The oxvs switchds' control sockets (None: not oxvs).
    switches: Option<Switches>,
    _proc: Option<Proc>,
}

/// oxvs switchds whose drop counters a TCP trial reads before and after,
/// so that a retransmit can be told from a segment the switch dropped.
struct Switches {
    ctl: PathBuf,
    /// Control socket, and the namespace to reach it from.
    socks: Vec<(String, Option<String>)>,
}

/// The drop reasons `dump-ports` counts per port (each also counted in
/// `rx_dropped` or `tx_dropped`).
const DROP_REASONS: [&str; 5] = [
    "rx_ring_full",
    "rx_fill_empty",
    "rx_other",
    "tx_no_frame",
    "tx_ring_full",
];

/// Packets the switchds dropped: the total (received and sent) and per
/// reason ([`DROP_REASONS`]), summed over every port.
#[derive(Clone, Copy, Default)]
struct SwitchDrops {
    total: u64,
    by_reason: [u64; DROP_REASONS.len()],
}

impl SwitchDrops {
    /// What happened between `before` and `self`.
    fn since(&self, before: &SwitchDrops) -> SwitchDrops {
        let mut d = SwitchDrops {
            total: self.total.saturating_sub(before.total),
            ..Default::default()
        };
        for (i, r) in d.by_reason.iter_mut().enumerate() {
            *r = self.by_reason[i].saturating_sub(before.by_reason[i]);
        }
        d
    }

    /// "N dropped in the switch", with the reasons when there are any.
    fn describe(&self) -> String {
        let reasons: Vec<String> = DROP_REASONS
            .iter()
            .zip(self.by_reason)
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        if reasons.is_empty() {
            format!("{} dropped in the switch", self.total)
        } else {
            format!(
                "{} dropped in the switch ({})",
                self.total,
                reasons.join(", ")
            )
        }
    }
}

impl Switches {
    /// Packets every port of every switchd dropped so far; None when a
    /// switchd does not answer.
    fn drops(&self) -> Option<SwitchDrops> {
        let c = self.ctl.to_string_lossy();
        let mut sum = SwitchDrops::default();
        for (sock, ns) in &self.socks {
            let mut v: Vec<&str> = Vec::new();
            if let Some(ns) = ns {
                v.extend_from_slice(&["ip", "netns", "exec", ns]);
            }
            v.extend_from_slice(&[&c, "--socket", sock, "--json", "dump-ports"]);
            let out = must(&v).ok()?;
            let doc: Value = serde_json::from_str(&out).ok()?;
            let ports = doc.as_array().or_else(|| doc["ports"].as_array())?;
            for p in ports {
                for k in ["rx_dropped", "tx_dropped"] {
                    sum.total += p["stats"][k].as_u64()?;
                }
                for (i, k) in DROP_REASONS.iter().enumerate() {
                    sum.by_reason[i] += p["stats"][k].as_u64().unwrap_or(0);
                }
            }
        }
        Some(sum)
    }
}

struct Bins {
    switchd: PathBuf,
    ctl: PathBuf,
    /// `--mode` of every oxvs-switchd started.
    mode: &'static str,
    /// More arguments for every oxvs-switchd started.
    extra: Vec<String>,
}

/// Finds (building if needed) the release `oxvs-switchd` and `oxvsctl`.
fn oxvs_bins() -> Result<Bins> {
    let exe = std::env::current_exe().context("current_exe")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("exe has no directory"))?;
    let bins = Bins {
        switchd: dir.join("oxvs-switchd"),
        ctl: dir.join("oxvsctl"),
        mode: "interrupt",
        extra: Vec::new(),
    };
    if !bins.switchd.exists() || !bins.ctl.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        eprintln!("e2e: building oxvs-switchd and oxvsctl (release)");
        let st = Command::new(cargo)
            .args(["build", "--release", "-p", "oxvs-switch", "-p", "oxvsctl"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .status()
            .context("cargo build")?;
        if !st.success() || !bins.switchd.exists() {
            bail!(
                "could not build {}; run `cargo build --release -p oxvs-switch -p oxvsctl`",
                bins.switchd.display()
            );
        }
    }
    Ok(bins)
}

fn ctl(bins: &Bins, sock: &str, ns: Option<&str>, args: &[&str]) -> Result<String> {
    let c = bins.ctl.to_string_lossy().into_owned();
    let mut v: Vec<&str> = Vec::new();
    if let Some(ns) = ns {
        v.extend_from_slice(&["ip", "netns", "exec", ns]);
    }
    v.extend_from_slice(&[&c, "--socket", sock]);
    v.extend_from_slice(args);
    must(&v)
}

/// Starts `oxvs-switchd` (in `ns`, or the root namespace) with a control
/// socket at `sock`, waiting until it answers.
fn start_switchd(bins: &Bins, lab: &mut Lab, ns: Option<&str>, sock: &str) -> Result<Proc> {
    lab.files.push(PathBuf::from(sock));
    let d = bins.switchd.to_string_lossy().into_owned();
    let mut v: Vec<&str> = Vec::new();
    if let Some(ns) = ns {
        v.extend_from_slice(&["ip", "netns", "exec", ns]);
    }
    v.extend_from_slice(&[
        &d,
        "--socket",
        sock,
        "--mode",
        bins.mode,
        "--log-level",
        "warn",
        // Benchmarks need no connection table across restarts.
        "--ct-state-file",
        "",
    ]);
    v.extend(bins.extra.iter().map(String::as_str));
    let mut p = Proc::spawn_piped(&v, "oxvs-switchd", true)?;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if ctl(bins, sock, ns, &["dump-ports"]).is_ok() {
            return Ok(p);
        }
        if wait_exit(&mut p, Duration::from_millis(100))? {
            let (_, err) = p.finish();
            bail!("oxvs-switchd exited: {}", err.trim());
        }
        if Instant::now() > end {
            bail!("oxvs-switchd did not answer on {sock}");
        }
    }
}

fn oxvs_port_modes(bins: &Bins, sock: &str, ns: Option<&str>) -> Result<BTreeMap<String, String>> {
    let out = ctl(bins, sock, ns, &["--json", "dump-ports"])?;
    let v: Value = serde_json::from_str(&out).context("dump-ports --json")?;
    let list = v
        .as_array()
        .or_else(|| v["ports"].as_array())
        .cloned()
        .unwrap_or_default();
    Ok(list
        .iter()
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_owned(),
                p["mode"].as_str()?.to_owned(),
            ))
        })
        .collect())
}

fn write_flows(lab: &mut Lab, name: &str, text: &str) -> Result<String> {
    let path = PathBuf::from(format!("/tmp/oxbench-{}-{name}.flows", pid()));
    std::fs::write(&path, text)?;
    lab.files.push(path.clone());
    Ok(path.to_string_lossy().into_owned())
}

fn start_oxvs(bins: &Bins, p: &mut Pair) -> Result<Running> {
    let sock = format!("/tmp/oxbench-{}.sock", pid());
    let proc_ = start_switchd(bins, &mut p.lab, None, &sock)?;
    ctl(
        bins,
        &sock,
        None,
        &["add-port", &p.host_gen, "--ofport", "1"],
    )?;
    ctl(
        bins,
        &sock,
        None,
        &["add-port", &p.host_sink, "--ofport", "2"],
    )?;
    let flows = write_flows(
        &mut p.lab,
        "oxvs",
        "in_port=1 actions=output:2\nin_port=2 actions=output:1\n",
    )?;
    ctl(bins, &sock, None, &["add-flows", &flows])?;
    Ok(Running {
        pid: Some(proc_.pid()),
        port_modes: oxvs_port_modes(bins, &sock, None)?,
        switches: Some(Switches {
            ctl: bins.ctl.clone(),
            socks: vec![(sock, None)],
        }),
        _proc: Some(proc_),
    })
}

/// Makes sure ovs-vswitchd runs; returns its pid, or why OVS is unusable.
fn ovs_ready() -> Result<u32> {
    if run(&["ovs-vsctl", "--version"]).is_err() {
        bail!("Open vSwitch is not installed (no ovs-vsctl)");
    }
    if run(&["ovs-vsctl", "--timeout=3", "show"])
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        must(&["/usr/share/openvswitch/scripts/ovs-ctl", "start"]).context("ovs-ctl start")?;
    }
    let pid = std::fs::read_to_string("/var/run/openvswitch/ovs-vswitchd.pid")
        .context("ovs-vswitchd pid file")?;
    pid.trim().parse().context("ovs-vswitchd pid")
}

fn start_ovs(p: &mut Pair, port_type: &str) -> Result<Running> {
    let pid_ = ovs_ready()?;
    let br = format!("oxbench{}", pid());
    p.lab.ovs_bridges.push(br.clone());
    must(&[
        "ovs-vsctl",
        "--timeout=10",
        "add-br",
        &br,
        "--",
        "set",
        "bridge",
        &br,
        "datapath_type=netdev",
        "fail_mode=secure",
    ])?;
    let mut modes = BTreeMap::new();
    for (host, ofport) in [(p.host_gen.clone(), "1"), (p.host_sink.clone(), "2")] {
        // Zero-copy first; veth has none, so the best the driver offers.
        let got = setup::ovs_add_afxdp_port(&br, &host, port_type, ofport, 1)?;
        modes.insert(host, got);
    }
    must(&["ovs-ofctl", "del-flows", &br])?;
    must(&["ovs-ofctl", "add-flow", &br, "in_port=1,actions=output:2"])?;
    must(&["ovs-ofctl", "add-flow", &br, "in_port=2,actions=output:1"])?;
    Ok(Running {
        pid: Some(pid_),
        port_modes: modes,
        switches: None,
        _proc: None,
    })
}

fn start_bridge(p: &mut Pair) -> Result<Running> {
    let br = format!("xb{}br", pid());
    must(&["ip", "link", "add", &br, "type", "bridge"])?;
    p.lab.links.push(br.clone());
    let _ = run(&[
        "sysctl",
        "-qw",
        &format!("net.ipv6.conf.{br}.disable_ipv6=1"),
    ]);
    for h in [&p.host_gen, &p.host_sink] {
        must(&["ip", "link", "set", h, "master", &br])?;
    }
    must(&["ip", "link", "set", &br, "up"])?;
    Ok(Running {
        pid: None,
        switches: None,
        port_modes: [
            (p.host_gen.clone(), "kernel bridge".to_owned()),
            (p.host_sink.clone(), "kernel bridge".to_owned()),
        ]
        .into(),
        _proc: None,
    })
}

// ---------------------------------------------------------------- stats

fn median_min_max(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((med, v[0], v[n - 1]))
}

fn summary(v: Vec<f64>) -> Value {
    match median_min_max(v.clone()) {
        Some((m, lo, hi)) => json!({"median": m, "min": lo, "max": hi, "trials": v}),
        None => Value::Null,
    }
}

fn fmt3(v: &[f64], scale: f64, prec: usize) -> String {
    match median_min_max(v.to_vec()) {
        Some((m, lo, hi)) => format!(
            "{:.p$} [{:.p$}-{:.p$}]",
            m / scale,
            lo / scale,
            hi / scale,
            p = prec
        ),
        None => "n/a".into(),
    }
}

// ---------------------------------------------------------------- scenarios

/// The TCP trials of one (offload, streams) setting.
#[derive(Default)]
struct TcpRun {
    offload: Option<Offload>,
    streams: u32,
    gbps: Vec<f64>,
    retransmits: Vec<f64>,
    /// Packets oxvs's switchds dropped during each trial (empty for other
    /// switches).
    switch_drops: Vec<f64>,
    /// The same per reason ([`DROP_REASONS`]), per trial.
    switch_drop_reasons: [Vec<f64>; DROP_REASONS.len()],
    /// Frames the two pods' `eth0` dropped on transmit during each trial
    /// (the peer's XDP ring full, without a qdisc to hold them).
    veth_drops: Vec<f64>,
    error: Option<String>,
    /// Request/response (one 64-byte request outstanding), measured once
    /// per offload setting (on its 1-stream run).
    rr_tps: Vec<f64>,
    rr_p50_us: Vec<f64>,
    rr_p99_us: Vec<f64>,
    rr_error: Option<String>,
}

impl TcpRun {
    fn to_json(&self) -> Value {
        json!({
            "pod_tx_offload": self.offload.map(Offload::name),
            "streams": self.streams,
            "gbps": summary(self.gbps.clone()),
            "retransmits": summary(self.retransmits.clone()),
            "switch_drops": if self.switch_drops.is_empty() {
                Value::Null
            } else {
                summary(self.switch_drops.clone())
            },
            "switch_drop_reasons": if self.switch_drops.is_empty() {
                Value::Null
            } else {
                DROP_REASONS
                    .iter()
                    .zip(&self.switch_drop_reasons)
                    .map(|(r, v)| (r.to_string(), summary(v.clone())))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            },
            "pod_veth_tx_drops": summary(self.veth_drops.clone()),
            "error": self.error,
            "rr": if self.rr_tps.is_empty() && self.rr_error.is_none() {
                Value::Null
            } else {
                json!({
                    "request_bytes": RR_BYTES,
                    "transactions_per_s": summary(self.rr_tps.clone()),
                    "p50_us": summary(self.rr_p50_us.clone()),
                    "p99_us": summary(self.rr_p99_us.clone()),
                    "error": self.rr_error,
                })
            },
        })
    }

    fn label(&self) -> String {
        format!(
            "offload {}, {} stream{}",
            self.offload.map_or("?", Offload::name),
            self.streams,
            if self.streams == 1 { "" } else { "s" }
        )
    }
}

#[derive(Default)]
struct SwitchResult {
    name: String,
    skipped: Option<String>,
    port_modes: BTreeMap<String, String>,
    max: Vec<LoadTrial>,
    fixed: Vec<LoadTrial>,
    tcp: Vec<TcpRun>,
    /// `/proc/loadavg` (1, 5, 15 min) before and after the scenario: other
    /// work on the machine skews everything here.
    loadavg: (String, String),
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

impl SwitchResult {
    fn headline_tcp(&self) -> Option<&TcpRun> {
        self.tcp
            .iter()
            .find(|r| r.offload == Some(Offload::On) && r.streams == 1)
            .or(self.tcp.first())
    }

    fn to_json(&self) -> Value {
        let max = |f: fn(&LoadTrial) -> f64| summary(self.max.iter().map(f).collect());
        let fixed = |f: fn(&LoadTrial) -> f64| summary(self.fixed.iter().map(f).collect());
        json!({
            "switch": self.name,
            "skipped": self.skipped,
            "port_modes": self.port_modes,
            "max_load": {
                "offered_pps": max(LoadTrial::offered_pps),
                "delivered_pps": max(LoadTrial::delivered_pps),
                "loss_fraction": max(LoadTrial::loss),
                "raw": self.max.iter().map(|t| json!({"secs": t.secs, "offered": t.offered, "delivered": t.delivered})).collect::<Vec<_>>(),
            },
            "fixed_load": {
                "offered_pps": fixed(LoadTrial::offered_pps),
                "delivered_pps": fixed(LoadTrial::delivered_pps),
                "switch_cpu_ns_per_pkt": summary(self.fixed.iter().filter_map(LoadTrial::cpu_per_pkt).collect()),
                "softirq_ns_per_pkt_machine": fixed(LoadTrial::softirq_per_pkt),
                "raw": self.fixed.iter().map(|t| json!({"secs": t.secs, "offered": t.offered, "delivered": t.delivered, "switch_cpu_ns": t.cpu_ns, "softirq_ns": t.softirq_ns})).collect::<Vec<_>>(),
            },
            // The headline (plots): the pods' defaults, offload on, one
            // stream (else the first setting measured).
            "tcp_gbps": summary(self.headline_tcp().map(|r| r.gbps.clone()).unwrap_or_default()),
            "tcp": self.tcp.iter().map(TcpRun::to_json).collect::<Vec<_>>(),
            "loadavg_before": self.loadavg.0,
            "loadavg_after": self.loadavg.1,
        })
    }
}

fn single_node(
    o: &Opts,
    mtu: u32,
    name: &str,
    tag: &str,
    qdisc: Option<&str>,
    start: impl FnOnce(&mut Pair) -> Result<Running>,
) -> Result<SwitchResult> {
    eprintln!("e2e: == {name} == (load average {})", loadavg());
    let load0 = loadavg();
    let mut p = Pair::new(tag, mtu, qdisc)?;
    let sw = start(&mut p)?;
    let mut r = SwitchResult {
        name: name.into(),
        port_modes: sw.port_modes.clone(),
        ..Default::default()
    };
    // Connectivity (also teaches a learning bridge where the sink is).
    let _ = ping_ok(&p.sink, GEN_IP);
    if !ping_ok(&p.gen, SINK_IP) {
        bail!("{name}: gen cannot ping sink through the switch");
    }
    let conf = trafgen_conf(&mut p.lab, &mac_of(&p.gen, "eth0")?)?;
    let load_trials = if o.tcp_only { 0 } else { o.trials };
    for i in 0..load_trials {
        let t = load_trial(&p, &conf, o.duration, None, sw.pid)?;
        eprintln!(
            "e2e: {name} max load #{i}: offered {:.0} pps, delivered {:.0} pps",
            t.offered_pps(),
            t.delivered_pps()
        );
        r.max.push(t);
    }
    for i in 0..load_trials {
        let t = load_trial(&p, &conf, o.duration, Some(o.rate), sw.pid)?;
        eprintln!(
            "e2e: {name} fixed load #{i}: delivered {:.0} pps, switch cpu {} ns/pkt, softirq {:.0} ns/pkt",
            t.delivered_pps(),
            t.cpu_per_pkt().map_or("n/a".into(), |c| format!("{c:.0}")),
            t.softirq_per_pkt()
        );
        r.fixed.push(t);
    }
    r.tcp = tcp_runs(o, name, [&p.gen, &p.sink], SINK_IP, sw.switches.as_ref())?;
    drop(sw);
    drop(p);
    r.loadavg = (load0, loadavg());
    Ok(r)
}

/// Two nodes (namespaces) joined by an underlay veth (192.0.2.1/2), one
/// pod each (10.201.0.1/2, MTU 1450) on a veth whose host end is in the
/// node; `oxvs` = switchds with VXLAN ports, else kernel vxlan + bridge.
fn vxlan(o: &Opts, bins: Option<&Bins>, name: &str, pod_mtu: u32) -> Result<SwitchResult> {
    eprintln!("e2e: == {name} == (load average {})", loadavg());
    let load0 = loadavg();
    let tag = if bins.is_some() { "vo" } else { "vk" };
    let mut lab = Lab::default();
    let na = lab.netns(&format!("{tag}-nodea"))?;
    let nb = lab.netns(&format!("{tag}-nodeb"))?;
    let pa = lab.netns(&format!("{tag}-poda"))?;
    let pb = lab.netns(&format!("{tag}-podb"))?;
    must(&[
        "ip", "-n", &na, "link", "add", "under", "type", "veth", "peer", "name", "under", "netns",
        &nb,
    ])?;
    for (ns, ip) in [(&na, "192.0.2.1/24"), (&nb, "192.0.2.2/24")] {
        must(&["ip", "-n", ns, "addr", "add", ip, "dev", "under"])?;
        must(&["ip", "-n", ns, "link", "set", "under", "up"])?;
    }
    let ha = format!("xb{}{tag}a", pid());
    let hb = format!("xb{}{tag}b", pid());
    let qdisc = if bins.is_some() {
        oxvs_pod_qdisc()
    } else {
        None
    };
    lab.pod(&pa, "10.201.0.1/24", pod_mtu, &ha, Some(&na), qdisc)?;
    lab.pod(&pb, "10.201.0.2/24", pod_mtu, &hb, Some(&nb), qdisc)?;
    let mut modes = BTreeMap::new();
    let mut procs = Vec::new();
    let mut switches = bins.map(|b| Switches {
        ctl: b.ctl.clone(),
        socks: Vec::new(),
    });
    let nodes = [
        (&na, &ha, "192.0.2.1", "192.0.2.2"),
        (&nb, &hb, "192.0.2.2", "192.0.2.1"),
    ];
    for (i, (ns, host, local, remote)) in nodes.into_iter().enumerate() {
        if let Some(bins) = bins {
            let sock = format!("/tmp/oxbench-{}-node{i}.sock", pid());
            procs.push(start_switchd(bins, &mut lab, Some(ns), &sock)?);
            if let Some(sw) = switches.as_mut() {
                sw.socks.push((sock.clone(), Some(ns.to_string())));
            }
            ctl(bins, &sock, Some(ns), &["add-port", host, "--ofport", "1"])?;
            ctl(
                bins,
                &sock,
                Some(ns),
                &[
                    "add-port",
                    "vx",
                    "--ofport",
                    "2",
                    "--type",
                    "vxlan",
                    "--local-ip",
                    local,
                ],
            )?;
            let flows = write_flows(
                &mut lab,
                &format!("node{i}"),
                &format!(
                    "in_port=1 actions=set_field:{remote}->tun_dst,output:2\nin_port=2 actions=output:1\n"
                ),
            )?;
            ctl(bins, &sock, Some(ns), &["add-flows", &flows])?;
            for (k, v) in oxvs_port_modes(bins, &sock, Some(ns))? {
                modes.insert(format!("node{i}/{k}"), v);
            }
        } else {
            must(&[
                "ip", "-n", ns, "link", "add", "vx0", "type", "vxlan", "id", "42", "local", local,
                "remote", remote, "dstport", "4789", "dev", "under",
            ])?;
            must(&["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])?;
            for dev in ["vx0", host.as_str()] {
                must(&["ip", "-n", ns, "link", "set", dev, "master", "br0"])?;
            }
            must(&["ip", "-n", ns, "link", "set", "vx0", "up"])?;
            must(&["ip", "-n", ns, "link", "set", "br0", "up"])?;
            modes.insert(format!("node{i}/vx0"), "kernel vxlan".into());
        }
    }
    let mut r = SwitchResult {
        name: name.into(),
        port_modes: modes,
        ..Default::default()
    };
    if !ping_ok(&pa, "10.201.0.2") {
        bail!("{name}: pod A cannot ping pod B");
    }
    r.tcp = tcp_runs(o, name, [&pa, &pb], "10.201.0.2", switches.as_ref())?;
    drop(procs);
    drop(lab);
    r.loadavg = (load0, loadavg());
    Ok(r)
}

// ---------------------------------------------------------------- main

/// The machine (oxvs-bench's description) plus the traffic tools' versions.
fn machine() -> Value {
    let ver = |args: &[&str]| {
        run(args).ok().map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
    };
    let mut m = oxvs_bench::xbench::report::machine(&[]);
    if let Value::Object(o) = &mut m {
        o.insert("trafgen".into(), json!(ver(&["trafgen", "--version"])));
        o.insert("iperf3".into(), json!(ver(&["iperf3", "--version"])));
    }
    m
}

fn want(o: &Opts, key: &str) -> bool {
    o.only.as_ref().is_none_or(|l| l.iter().any(|k| k == key))
}

fn main() -> Result<()> {
    // The two ends of the request/response test run this binary in the
    // pods' namespaces.
    let argv: Vec<String> = std::env::args().collect();
    match argv.get(1).map(String::as_str) {
        Some("--rr-server") => return rr_server(),
        Some("--rr-client") => {
            return rr_client(
                argv.get(2).map_or("", String::as_str),
                argv.get(3).map_or("5", String::as_str),
            )
        }
        _ => {}
    }
    let o = Opts::parse();
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag)).context("signal handler")?;
    }
    let _ = STOP.set(flag);
    let _ = POD_QUEUES.set(o.pod_queues);
    let qdisc = o
        .pod_qdisc
        .resolve()
        .map_err(|e| anyhow!("--pod-qdisc: {e}"))?;
    eprintln!(
        "e2e: oxvs pods' root qdisc: {}",
        qdisc.as_deref().unwrap_or("noqueue (none set)")
    );
    let _ = OXVS_POD_QDISC.set(qdisc);
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        });
    if uid.as_deref() != Some("0") {
        bail!("e2e needs root (network namespaces, XDP)");
    }
    for tool in ["ip", "trafgen", "iperf3", "ethtool", "ping"] {
        if run(&["sh", "-c", &format!("command -v {tool}")])
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            bail!("{tool} not found (scripts/bench-e2e.sh installs netsniff-ng and iperf3)");
        }
    }
    let mut bins = oxvs_bins()?;
    if o.oxvs_mode == OxvsMode::Busy {
        bins.mode = "busy";
    }
    bins.extra = o.switchd_arg.clone();
    let mach = machine();
    eprintln!("e2e: machine {mach}");
    let started = Instant::now();

    let mut results: Vec<SwitchResult> = Vec::new();
    let mut record = |name: &str, r: Result<SwitchResult>| -> Result<()> {
        match r {
            Ok(r) => results.push(r),
            Err(e) if stopped() => return Err(e),
            Err(e) => {
                eprintln!("e2e: {name}: SKIPPED: {e:#}");
                results.push(SwitchResult {
                    name: name.into(),
                    skipped: Some(format!("{e:#}")),
                    ..Default::default()
                });
            }
        }
        Ok(())
    };
    let busy = o.oxvs_mode == OxvsMode::Busy;
    for &mtu in &o.mtu {
        let named = |n: &str| -> String {
            if o.mtu.len() > 1 {
                format!("{n} (MTU {mtu})")
            } else {
                n.to_string()
            }
        };
        if want(&o, "oxvs") {
            let name = named(if busy {
                "oxvs-switchd (busy)"
            } else {
                "oxvs-switchd"
            });
            let r = single_node(&o, mtu, &name, "ox", oxvs_pod_qdisc(), |p| {
                start_oxvs(&bins, p)
            });
            record(&name, r)?;
        }
        if want(&o, "ovs-nonpmd") {
            let name = named("OVS afxdp-nonpmd");
            let r = single_node(&o, mtu, &name, "on", None, |p| start_ovs(p, "afxdp-nonpmd"));
            record(&name, r)?;
        }
        if want(&o, "ovs-pmd") {
            let name = named("OVS afxdp (PMD)");
            let r = single_node(&o, mtu, &name, "op", None, |p| start_ovs(p, "afxdp"));
            record(&name, r)?;
        }
        if want(&o, "bridge") {
            let name = named("Linux bridge");
            let r = single_node(&o, mtu, &name, "lb", None, start_bridge);
            record(&name, r)?;
        }
        // Pods of large frames on both nodes (oxvs segments their TCP
        // into the tunnel); otherwise the tunnel's 1450.
        if want(&o, "vxlan-oxvs") {
            let pod_mtu = if mtu > 1500 { mtu } else { 1450 };
            let name = named(if busy {
                "oxvs VXLAN (2 nodes, busy)"
            } else {
                "oxvs VXLAN (2 nodes)"
            });
            let r = vxlan(&o, Some(&bins), &name, pod_mtu);
            record(&name, r)?;
        }
    }
    if want(&o, "vxlan-kernel") {
        let r = vxlan(&o, None, "kernel VXLAN + bridge (2 nodes)", 1450);
        record("kernel VXLAN + bridge (2 nodes)", r)?;
    }

    // Human table.
    println!();
    println!(
        "64-byte UDP, trafgen on 1 CPU, {} s per trial, {} trials: median [min-max]; \
         fixed load: trafgen --gap for {} pps (achieves less)",
        o.duration, o.trials, o.rate
    );
    println!(
        "{:<32} {:>22} {:>22} {:>18} {:>30} {:>22} {:>20}",
        "switch",
        "max: offered kpps",
        "max: delivered kpps",
        "max: loss %",
        "fixed: kpps / switch ns/pkt",
        "softirq ns/pkt (all)",
        "TCP Gbit/s (offload on, 1)"
    );
    for r in &results {
        if let Some(why) = &r.skipped {
            println!("{:<32} skipped: {why}", r.name);
            continue;
        }
        let f = |v: &[LoadTrial], g: fn(&LoadTrial) -> f64| v.iter().map(g).collect::<Vec<_>>();
        let cpu: Vec<f64> = r.fixed.iter().filter_map(LoadTrial::cpu_per_pkt).collect();
        let loss: Vec<f64> = r.max.iter().map(|t| t.loss() * 100.0).collect();
        println!(
            "{:<32} {:>22} {:>22} {:>18} {:>30} {:>22} {:>20}",
            r.name,
            fmt3(&f(&r.max, LoadTrial::offered_pps), 1e3, 0),
            fmt3(&f(&r.max, LoadTrial::delivered_pps), 1e3, 0),
            fmt3(&loss, 1.0, 1),
            if r.fixed.is_empty() {
                "-".into()
            } else {
                let kpps = median_min_max(f(&r.fixed, LoadTrial::delivered_pps));
                format!(
                    "{:.0} / {}",
                    kpps.map_or(0.0, |m| m.0 / 1e3),
                    fmt3(&cpu, 1.0, 0)
                )
            },
            if r.fixed.is_empty() {
                "-".into()
            } else {
                fmt3(&f(&r.fixed, LoadTrial::softirq_per_pkt), 1.0, 0)
            },
            fmt3(r.headline_tcp().map_or(&[][..], |t| &t.gbps[..]), 1.0, 2),
        );
    }
    println!();
    println!(
        "TCP (iperf3, {} s per trial, {} trials): Gbit/s and sender retransmits, median [min-max]",
        o.duration, o.trials
    );
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        for t in &r.tcp {
            match &t.error {
                Some(e) if t.gbps.is_empty() => {
                    println!("{:<32} {:<24} failed: {e}", r.name, t.label());
                }
                _ => println!(
                    "{:<32} {:<24} {:>20} Gbit/s {:>26} retransmits{}, {} dropped by the pods' veths",
                    r.name,
                    t.label(),
                    fmt3(&t.gbps, 1.0, 2),
                    fmt3(&t.retransmits, 1.0, 0),
                    if t.switch_drops.is_empty() {
                        String::new()
                    } else {
                        format!(", {} dropped in the switch", fmt3(&t.switch_drops, 1.0, 0))
                    },
                    fmt3(&t.veth_drops, 1.0, 0)
                ),
            }
        }
    }
    println!();
    println!(
        "TCP request/response ({RR_BYTES} bytes each way, one outstanding, {} s per trial): median [min-max]",
        o.duration
    );
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        for t in r
            .tcp
            .iter()
            .filter(|t| !t.rr_tps.is_empty() || t.rr_error.is_some())
        {
            let off = t.offload.map_or("?", Offload::name);
            match &t.rr_error {
                Some(e) if t.rr_tps.is_empty() => {
                    println!("{:<32} offload {off:<4} failed: {e}", r.name);
                }
                _ => println!(
                    "{:<32} offload {off:<4} {:>22} transactions/s   p50 {:>20} us   p99 {:>22} us",
                    r.name,
                    fmt3(&t.rr_tps, 1.0, 0),
                    fmt3(&t.rr_p50_us, 1.0, 1),
                    fmt3(&t.rr_p99_us, 1.0, 1)
                ),
            }
        }
    }
    println!();
    for r in &results {
        if r.skipped.is_none() {
            println!(
                "{:<32} load average before {} / after {}",
                r.name, r.loadavg.0, r.loadavg.1
            );
        }
        for (port, mode) in &r.port_modes {
            println!("{:<32} port {port}: {mode}", r.name);
        }
    }
    if o.json.is_some() || o.plots.is_some() {
        let doc = json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "date": oxvs_bench::plots::now_date(),
            "machine": mach,
            "duration_s": o.duration,
            "trials": o.trials,
            "fixed_rate_pps": o.rate,
            "tcp_only": o.tcp_only,
            "pod_mtu": o.mtu,
            "pod_queues": o.pod_queues,
            "elapsed_s": started.elapsed().as_secs_f64(),
            "results": results.iter().map(SwitchResult::to_json).collect::<Vec<_>>(),
        });
        if let Some(path) = &o.json {
            std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
                .with_context(|| format!("write {}", path.display()))?;
            eprintln!("e2e: wrote {}", path.display());
        }
        if let Some(dir) = &o.plots {
            let stem = o
                .json
                .as_deref()
                .and_then(Path::file_stem)
                .and_then(|s| s.to_str())
                .unwrap_or("e2e");
            for f in oxvs_bench::plots::e2e_plots(&doc, dir, stem).context("plots")? {
                eprintln!("e2e: plot {}", f.display());
            }
        }
    }
    Ok(())
}
