//! Setups: where the generator and the sink send and receive, and the
//! switch under test between them.
//!
//! ## `virtual`
//!
//! ```text
//!   netns gen (eth0) --veth-- [switch under test] --veth-- netns sink (eth0)
//! ```
//!
//! The generator's and the sink's `eth0` have no addresses (AF_XDP needs
//! none, and the kernel then sends nothing of its own); the host ends of
//! the veths (`xb<pid><tag>g`, `xb<pid><tag>s`) are ports 1 and 2 of the
//! switch. They stay in the root namespace, because `ovs-vswitchd` runs
//! there and opens its AF_XDP ports by name in its own namespace; every
//! switch gets the same topology. Switches: `oxvs-switchd` (started here,
//! flows loaded with `oxvsctl add-flows`), Open vSwitch userspace
//! (`datapath_type=netdev`, ports `afxdp` = PMD threads or `afxdp-nonpmd`,
//! flows with `ovs-ofctl add-flows`: the same flow file), a Linux bridge,
//! and the kernel XDP redirect (`bench/xdp/redirect.c`, compiled with
//! clang at run time with the two ports' ifindexes and attached natively
//! on both with `ip link set ... xdpdrv obj`: every frame is redirected
//! to the other port; the veth's peer -- the sink's `eth0` -- receives it
//! because the sink's AF_XDP program is attached there natively). Its CPU
//! figure is the softirq time of all CPUs ([`super::methods::SOFTIRQ`]).
//!
//! The pipeline ([`super::pipeline::Plan`]) decides the flows and the
//! OpenFlow numbers of the two ports (1 and 2 for the simple pipeline, the
//! two chosen pods' ports for the Antrea-like one); for oxvs the sample
//! frame is traced through the running switch before measuring.
//!
//! ## `virtual-vxlan`
//!
//! Two lab nodes, each a namespace with its own switch, joined by a VXLAN
//! tunnel over a veth underlay; the generator is a pod on node A, the sink
//! a pod on node B ([`vxlan_nodes`]). Switches: `oxvs-switchd` per node
//! ([`start_vxlan_pair`]; the tunnel goes through the node's kernel UDP
//! socket on the underlay veth) or a private Open vSwitch userspace
//! instance per node ([`ovs_vxlan`]; `br-int` with the same flows and port
//! numbers, the underlay veth an `afxdp` port of `br-phy` which carries
//! the node's underlay address).
//!
//! ## `ports`
//!
//! The generator and the sink on physical interfaces the user names (in
//! the root namespace), the device under test between them (cabled):
//! either an external device, or the switches of the virtual setup run on
//! this host on two more ports P1 and P2 ([`Virtual::ports`]; P1 cabled to
//! the generator's port, P2 to the sink's), one after the other. oxvs
//! opens its ports with zero-copy AF_XDP first where the device is a NIC
//! (`oxvs_switch::afxdp`), OVS with `xdp-mode=native-with-zerocopy` first;
//! each port's mode is reported. Before touching them,
//! [`check_port_safety`] refuses an interface that carries a default route
//! or has an address (the test has none of its own) unless forced. Each
//! switch's run restores the ports: XDP programs detached, bridges
//! deleted, interfaces that were down set down again.
//!
//! ## Cleanup
//!
//! Everything made here is owned by a guard ([`Lab`], [`Proc`]) whose
//! `Drop` removes it (XDP programs, namespaces, links, OVS bridges, files,
//! directories, processes; and sets down what it set up);
//! errors, panics and SIGINT/SIGTERM (a flag every wait checks, see
//! [`stopped`]) unwind through them. Names carry the pid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::pipeline::{trace_text_delivers, Plan};

#[path = "ovs_vxlan.rs"]
pub mod ovs_vxlan;

static STOP: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Makes SIGINT/SIGTERM set the stop flag instead of killing the process.
pub fn install_signal_flag() -> Result<()> {
    let flag = STOP.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(flag)).context("signal handler")?;
    }
    Ok(())
}

/// The stop flag (set by SIGINT/SIGTERM once [`install_signal_flag`] ran).
pub fn stop_flag() -> Arc<AtomicBool> {
    Arc::clone(STOP.get_or_init(|| Arc::new(AtomicBool::new(false))))
}

/// Whether SIGINT/SIGTERM arrived.
pub fn stopped() -> bool {
    STOP.get().is_some_and(|s| s.load(Ordering::Relaxed))
}

/// Sleeps `d`, failing early when interrupted.
pub fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stopped() {
            bail!("interrupted");
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

pub use crate::process::{must, run, Proc};

static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A number unique in this process, for names.
fn next_seq() -> u32 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Everything a setup created, removed on drop (in reverse order).
#[derive(Default)]
pub struct Lab {
    netns: Vec<String>,
    links: Vec<String>,
    ovs_bridges: Vec<String>,
    files: Vec<PathBuf>,
    /// Directories (removed with their contents).
    dirs: Vec<PathBuf>,
    /// Interfaces with an XDP program of ours attached in native mode.
    xdp: Vec<String>,
    /// Interfaces that were down before we set them up.
    restore_down: Vec<String>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for l in self.xdp.iter().rev() {
            if Path::new(&format!("/sys/class/net/{l}")).exists() {
                if let Err(e) = must(&["ip", "link", "set", "dev", l, "xdpdrv", "off"]) {
                    eprintln!("oxvs-bench cleanup: {e}");
                }
            }
        }
        for br in self.ovs_bridges.iter().rev() {
            if let Err(e) = must(&["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", br]) {
                eprintln!("oxvs-bench cleanup: {e}");
            }
        }
        for l in self.links.iter().rev() {
            if Path::new(&format!("/sys/class/net/{l}")).exists() {
                if let Err(e) = must(&["ip", "link", "del", l]) {
                    eprintln!("oxvs-bench cleanup: {e}");
                }
            }
        }
        for ns in self.netns.iter().rev() {
            if let Err(e) = must(&["ip", "netns", "del", ns]) {
                eprintln!("oxvs-bench cleanup: {e}");
            }
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        for l in self.restore_down.iter().rev() {
            if Path::new(&format!("/sys/class/net/{l}")).exists() {
                if let Err(e) = must(&["ip", "link", "set", "dev", l, "down"]) {
                    eprintln!("oxvs-bench cleanup: {e}");
                }
            }
        }
    }
}

impl Lab {
    /// A namespace `xb-<pid>-<name>`, lo up, IPv6 off.
    pub fn netns(&mut self, name: &str) -> Result<String> {
        let ns = format!("xb-{}-{name}", std::process::id());
        must(&["ip", "netns", "add", &ns])?;
        self.netns.push(ns.clone());
        must(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        for k in ["all", "default"] {
            must(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{k}.disable_ipv6=1"),
            ])?;
        }
        Ok(ns)
    }

    /// A veth pair `a` <-> `b` in the root namespace, both up, IPv6 off
    /// (no neighbour discovery of the kernel's own on them); deleted on
    /// drop.
    pub fn veth(&mut self, a: &str, b: &str) -> Result<()> {
        must(&["ip", "link", "add", a, "type", "veth", "peer", "name", b])?;
        self.links.push(a.to_owned());
        for l in [a, b] {
            let _ = run(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{l}.disable_ipv6=1"),
            ]);
            must(&["ip", "link", "set", l, "up"])?;
        }
        Ok(())
    }

    /// Sets `ifname` up; if it was down, it is set down again on drop.
    pub fn set_up(&mut self, ifname: &str) -> Result<()> {
        let flags = std::fs::read_to_string(format!("/sys/class/net/{ifname}/flags"))
            .with_context(|| format!("interface {ifname} does not exist"))?;
        let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16)
            .with_context(|| format!("flags of {ifname}: {flags}"))?;
        if flags & 1 == 0 {
            must(&["ip", "link", "set", "dev", ifname, "up"])?;
            self.restore_down.push(ifname.to_owned());
        }
        Ok(())
    }

    /// A fresh directory `/tmp/xb-<pid>-<n>-<name>` removed on drop.
    pub fn dir(&mut self, name: &str) -> Result<PathBuf> {
        let p = PathBuf::from(format!(
            "/tmp/xb-{}-{}-{name}",
            std::process::id(),
            next_seq()
        ));
        std::fs::create_dir_all(&p).with_context(|| format!("mkdir {}", p.display()))?;
        self.dirs.push(p.clone());
        Ok(p)
    }

    /// A file path `/tmp/xb-<pid>-<name>` removed on drop.
    pub fn file(&mut self, name: &str, text: &str) -> Result<String> {
        let p = PathBuf::from(format!("/tmp/xb-{}-{name}", std::process::id()));
        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
        self.files.push(p.clone());
        Ok(p.to_string_lossy().into_owned())
    }
}

/// Where the generator or the sink runs.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// None: the root namespace.
    pub netns: Option<String>,
    pub ifname: String,
    /// Receive queues it uses, from 0 (a socket each; the generator sends
    /// flow `i` on queue `i % queues`, as RSS keeps a flow on a queue).
    pub queues: u32,
}

/// The `virtual` topology (see the module doc).
pub struct Virtual {
    pub lab: Lab,
    /// Queues of every veth (1 but with `--queues`).
    pub queues: u32,
    pub gen: Endpoint,
    pub sink: Endpoint,
    /// Host ends: switch ports 1 (gen side) and 2 (sink side).
    pub port1: String,
    pub port2: String,
}

/// Source MAC of generated frames in the virtual setup.
pub const GEN_MAC: [u8; 6] = [0x02, 0x0b, 0x5e, 0x00, 0x00, 0x01];
/// Destination MAC: nobody's, so a learning bridge floods it to the one
/// other port and the switches forwarding by in_port do the same work.
pub const DST_MAC: [u8; 6] = [0x02, 0x0b, 0x5e, 0x00, 0x00, 0x02];

impl Virtual {
    /// The topology with `queues` receive and transmit queues on every
    /// veth (a multi-queue NIC's RSS: the generator spreads its flows
    /// over them, each switch serves all of them).
    pub fn new(tag: &str, queues: u32) -> Result<Virtual> {
        if !(1..=64).contains(&queues) {
            bail!("--queues must be 1 to 64, got {queues}");
        }
        let q = queues.to_string();
        let mut lab = Lab::default();
        let pid = std::process::id();
        // Several topologies may exist at once in one process (tests).
        let n = next_seq() % 100;
        let port1 = format!("xb{pid}{tag}{n}g");
        let port2 = format!("xb{pid}{tag}{n}s");
        if port1.len() > 15 {
            bail!("interface name {port1} is too long (tag '{tag}')");
        }
        let mut eps = Vec::new();
        for (role, host, mac) in [("gen", &port1, Some(GEN_MAC)), ("sink", &port2, None)] {
            let ns = lab.netns(&format!("{tag}{n}-{role}"))?;
            let peer = format!("{host}p");
            // One queue: the kernel's default pair, as before `--queues`.
            let mut cmd = vec!["ip", "link", "add", host.as_str()];
            if queues > 1 {
                cmd.extend(["numtxqueues", &q, "numrxqueues", &q]);
            }
            cmd.extend(["type", "veth", "peer", "name", &peer]);
            if queues > 1 {
                cmd.extend(["numtxqueues", &q, "numrxqueues", &q]);
            }
            cmd.extend(["netns", &ns]);
            must(&cmd)?;
            lab.links.push(host.clone());
            must(&["ip", "-n", &ns, "link", "set", &peer, "name", "eth0"])?;
            if let Some(m) = mac {
                must(&[
                    "ip",
                    "-n",
                    &ns,
                    "link",
                    "set",
                    "eth0",
                    "address",
                    &crate::fmt_mac(m),
                ])?;
            }
            must(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            let _ = run(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{host}.disable_ipv6=1"),
            ]);
            must(&["ip", "link", "set", host, "up"])?;
            eps.push(Endpoint {
                netns: Some(ns),
                ifname: "eth0".into(),
                queues,
            });
        }
        let sink = eps.pop().ok_or_else(|| anyhow!("no sink endpoint"))?;
        let gen = eps.pop().ok_or_else(|| anyhow!("no gen endpoint"))?;
        Ok(Virtual {
            lab,
            queues,
            gen,
            sink,
            port1,
            port2,
        })
    }
}

impl Virtual {
    /// The `ports` setup with the switch under test on this host: the
    /// generator on `gen_if` (cabled to `p1`), the sink on `sink_if`
    /// (cabled to `p2`), all in the root namespace. Interfaces that were
    /// down are set up, and down again when the topology is dropped;
    /// nothing else of them is changed. The caller checks their safety
    /// first ([`check_port_safety`]).
    pub fn ports(gen_if: &str, sink_if: &str, p1: &str, p2: &str) -> Result<Virtual> {
        let names = [gen_if, sink_if, p1, p2];
        for (i, a) in names.iter().enumerate() {
            if names[i + 1..].contains(a) {
                bail!(
                    "interface {a} is named twice (--gen-if, --sink-if, --dut-ports must differ)"
                );
            }
        }
        let mut lab = Lab::default();
        for i in names {
            lab.set_up(i)?;
        }
        let ep = |i: &str| Endpoint {
            netns: None,
            ifname: i.to_owned(),
            queues: device_queues(i),
        };
        Ok(Virtual {
            lab,
            queues: device_queues(gen_if),
            gen: ep(gen_if),
            sink: ep(sink_if),
            port1: p1.to_owned(),
            port2: p2.to_owned(),
        })
    }
}

/// The receive queues of `ifname` (1 when unknown, at most 64): what a
/// socket per queue serves.
pub fn device_queues(ifname: &str) -> u32 {
    oxvs_switch::netdev::rx_queue_count(ifname)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(1)
        .clamp(1, 64)
}

/// The switch under test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwitchKind {
    /// `oxvs-switchd` with this many datapath threads, polling in
    /// interrupt mode (`oxvs`: sleeps in `poll(2)` when idle, compared
    /// with OVS non-PMD) or busy mode (`oxvs-busy`: spins, compared with
    /// OVS PMD).
    Oxvs { threads: u16, busy: bool },
    /// OVS userspace, `afxdp` ports (PMD threads).
    OvsPmd,
    /// OVS userspace, `afxdp-nonpmd` ports.
    OvsNonPmd,
    /// Linux bridge (no flows).
    Bridge,
    /// The kernel XDP ceiling: a native XDP program on both ports
    /// redirecting every frame to the other (`bench/xdp/redirect.c`).
    XdpRedirect,
}

/// `base`, or `base(N threads)` for more than one datapath thread.
fn with_threads(base: &str, threads: u16) -> String {
    if threads == 1 {
        base.into()
    } else {
        format!("{base}({threads} threads)")
    }
}

impl SwitchKind {
    /// `oxvs-switchd` with one datapath thread in interrupt mode.
    pub const OXVS: SwitchKind = SwitchKind::Oxvs {
        threads: 1,
        busy: false,
    };

    pub fn parse(s: &str) -> Result<SwitchKind> {
        Ok(match s {
            "oxvs" => SwitchKind::OXVS,
            "oxvs-busy" => SwitchKind::Oxvs {
                threads: 1,
                busy: true,
            },
            "ovs-pmd" => SwitchKind::OvsPmd,
            "ovs-nonpmd" => SwitchKind::OvsNonPmd,
            "bridge" => SwitchKind::Bridge,
            "xdp-redirect" => SwitchKind::XdpRedirect,
            _ => bail!(
                "unknown switch '{s}' (oxvs, oxvs-busy, ovs-pmd, ovs-nonpmd, bridge, xdp-redirect)"
            ),
        })
    }

    pub fn name(&self) -> String {
        match self {
            SwitchKind::Oxvs { threads, busy } => {
                with_threads(if *busy { "oxvs-busy" } else { "oxvs" }, *threads)
            }
            SwitchKind::OvsPmd => "ovs-afxdp-pmd".into(),
            SwitchKind::OvsNonPmd => "ovs-afxdp-nonpmd".into(),
            SwitchKind::Bridge => "linux-bridge".into(),
            SwitchKind::XdpRedirect => "xdp-redirect".into(),
        }
    }

    pub fn tag(&self) -> &'static str {
        match self {
            SwitchKind::Oxvs { busy: false, .. } => "ox",
            SwitchKind::Oxvs { busy: true, .. } => "ob",
            SwitchKind::OvsPmd => "op",
            SwitchKind::OvsNonPmd => "on",
            SwitchKind::Bridge => "lb",
            SwitchKind::XdpRedirect => "xr",
        }
    }
}

/// The simple forwarding pipeline: port 1 <-> port 2.
pub const SIMPLE_FLOWS: &str = "in_port=1 actions=output:2\nin_port=2 actions=output:1\n";

/// A running switch on a topology; dropping it stops the switch and then
/// removes the topology.
pub struct Running {
    pub name: String,
    /// Processes whose CPU time is the switch's (empty: kernel bridge).
    pub pids: Vec<u32>,
    /// How each port moves packets.
    pub port_modes: BTreeMap<String, String>,
    /// Flows loaded (0 for the bridge).
    pub flows: usize,
    /// The pipeline's description (pods, why allowed), or the setup's.
    pub note: String,
    _procs: Vec<Proc>,
    pub topo: Virtual,
    /// oxvs-switchd's control socket (with the binaries), to read its
    /// counters.
    pub oxvs_ctl: Option<(Bins, String)>,
}

impl Running {
    /// The received packets of each receive queue of each oxvs port that
    /// serves several (`port q0=N q1=N ...`), or None (not oxvs, or no
    /// such port).
    pub fn oxvs_queue_rx(&self) -> Option<String> {
        let (bins, sock) = self.oxvs_ctl.as_ref()?;
        let out = ctl(bins, sock, &["--json", "dump-ports"]).ok()?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let mut parts = Vec::new();
        for p in v.get("ports")?.as_array()? {
            let Some(qs) = p.get("queues").and_then(|q| q.as_array()) else {
                continue;
            };
            let mut s = p.get("name")?.as_str()?.to_owned();
            for q in qs {
                s.push_str(&format!(
                    " q{}(thread {})={}",
                    q.get("queue")?.as_u64()?,
                    q.get("thread")?.as_u64()?,
                    q.get("stats")?.get("rx_packets")?.as_u64()?
                ));
            }
            parts.push(s);
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// oxvs's drop counters, cumulative: `port.counter` -> count for every
    /// AF_XDP port (None: not oxvs, or its socket did not answer). Two
    /// reads around a trial say where that trial's losses were
    /// ([`drop_delta`]).
    pub fn oxvs_drop_counters(&self) -> Option<BTreeMap<String, u64>> {
        let (bins, sock) = self.oxvs_ctl.as_ref()?;
        let out = ctl(bins, sock, &["--json", "dump-ports"]).ok()?;
        let mut v: Value = serde_json::from_str(&out).ok()?;
        let ports: Vec<oxvs_api::PortInfo> =
            serde_json::from_value(v.get_mut("ports")?.take()).ok()?;
        let mut m = BTreeMap::new();
        for p in &ports {
            for (reason, n) in drop_reasons(&p.stats) {
                m.insert(format!("{}.{reason}", p.name), n);
            }
        }
        Some(m)
    }
}

/// The counters of a port that count a lost packet: an RX drop is under
/// exactly one of its three reasons (so `rx_dropped` is left out), and
/// `tx_dropped` is the TX total, kept because not every TX drop has a
/// reason counter of its own (a VXLAN port's have none).
fn drop_reasons(s: &oxvs_api::PortStats) -> [(&'static str, u64); 8] {
    [
        ("rx_ring_full", s.rx_ring_full),
        ("rx_fill_empty", s.rx_fill_empty),
        ("rx_other", s.rx_other),
        ("tx_no_frame", s.tx_no_frame),
        ("tx_ring_full", s.tx_ring_full),
        ("tx_dropped", s.tx_dropped),
        ("rx_errors", s.rx_errors),
        ("tx_errors", s.tx_errors),
    ]
}

/// What moved between two reads of [`Running::oxvs_drop_counters`]: the
/// counters that grew, by how much.
pub fn drop_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Paths of `oxvs-switchd` and `oxvsctl`.
#[derive(Clone, Debug)]
pub struct Bins {
    pub switchd: PathBuf,
    pub ctl: PathBuf,
    /// Extra arguments for every `oxvs-switchd` started.
    pub switchd_args: Vec<String>,
    /// Nice level `oxvs-switchd` starts with (0: not changed).
    pub nice: i8,
}

impl Bins {
    /// The same binaries, starting `oxvs-switchd` with `args` added.
    pub fn with_switchd_args(mut self, args: &[String]) -> Bins {
        self.switchd_args = args.to_vec();
        self
    }

    /// The same binaries, starting `oxvs-switchd` under `nice -n nice`.
    pub fn with_nice(mut self, nice: i8) -> Bins {
        self.nice = nice;
        self
    }
}

/// Finds `oxvs-switchd` and `oxvsctl`: `$OXVS_BIN_DIR`, else next to this
/// executable (or its parent: test binaries live in `deps/`), building
/// them with cargo (same profile) when missing.
pub fn oxvs_bins() -> Result<Bins> {
    let exe = std::env::current_exe().context("current_exe")?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(d) = std::env::var("OXVS_BIN_DIR") {
        dirs.push(d.into());
    }
    if let Some(d) = exe.parent() {
        dirs.push(d.to_path_buf());
        if let Some(p) = d.parent() {
            dirs.push(p.to_path_buf());
        }
    }
    let find = |dirs: &[PathBuf]| {
        dirs.iter()
            .map(|d| Bins {
                switchd: d.join("oxvs-switchd"),
                switchd_args: Vec::new(),
                nice: 0,
                ctl: d.join("oxvsctl"),
            })
            .find(|b| b.switchd.exists() && b.ctl.exists())
    };
    if let Some(b) = find(&dirs) {
        return Ok(b);
    }
    let release = exe.components().any(|c| c.as_os_str() == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("oxvs-bench: building oxvs-switchd and oxvsctl");
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "oxvs-switch", "-p", "oxvsctl"]);
    if release {
        cmd.arg("--release");
    }
    let st = cmd
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .status()
        .context("cargo build")?;
    if !st.success() {
        bail!("could not build oxvs-switchd/oxvsctl");
    }
    find(&dirs).ok_or_else(|| anyhow!("oxvs-switchd/oxvsctl not found in {dirs:?}"))
}

fn ctl(bins: &Bins, sock: &str, args: &[&str]) -> Result<String> {
    let c = bins.ctl.to_string_lossy().into_owned();
    let mut v: Vec<&str> = vec![&c, "--socket", sock];
    v.extend_from_slice(args);
    must(&v)
}

/// Starts `oxvs-switchd` (in `netns` if given) and waits until it answers
/// on its control socket `sock` (a file of `lab`); `busy`: `--mode busy`.
fn spawn_switchd(
    bins: &Bins,
    lab: &mut Lab,
    netns: Option<&str>,
    sock: &str,
    threads: u16,
    busy: bool,
) -> Result<Proc> {
    lab.files.push(PathBuf::from(sock));
    let d = bins.switchd.to_string_lossy().into_owned();
    let t = threads.to_string();
    let nice = bins.nice.to_string();
    let mut args: Vec<&str> = Vec::new();
    if let Some(ns) = netns {
        args.extend_from_slice(&["ip", "netns", "exec", ns]);
    }
    if bins.nice != 0 {
        // `nice` execs the switch: the pid stays the switch's.
        args.extend_from_slice(&["nice", "-n", &nice]);
    }
    args.extend_from_slice(&[
        &d,
        "--socket",
        sock,
        "--mode",
        if busy { "busy" } else { "interrupt" },
        "--threads",
        &t,
        "--log-level",
        "warn",
        // Benchmarks need no connection table across restarts.
        "--ct-state-file",
        "",
        // The generator is one port sending up to 1M flows: the per-pod
        // connection limit (a quarter of the table) would drop most of
        // them, which is not what a forwarding benchmark measures.
        "--ct-port-limit",
        "0",
    ]);
    args.extend(bins.switchd_args.iter().map(String::as_str));
    let mut p = Proc::spawn(&args, "oxvs-switchd", true)?;
    let end = Instant::now() + Duration::from_secs(10);
    while ctl(bins, sock, &["dump-ports"]).is_err() {
        if let Some(err) = p.exited() {
            bail!("oxvs-switchd exited: {}", err.trim());
        }
        if Instant::now() > end {
            bail!("oxvs-switchd did not answer on {sock}");
        }
        sleep(Duration::from_millis(100))?;
    }
    Ok(p)
}

/// `oxvsctl dump-ports --json` as name -> mode.
fn oxvs_port_modes(bins: &Bins, sock: &str) -> Result<BTreeMap<String, String>> {
    let out = ctl(bins, sock, &["--json", "dump-ports"])?;
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

/// Asks the running switch (`oxvsctl trace --packet`) where `plan`'s
/// sample frame goes; fails unless it is output on the sink's port.
pub fn oxvs_trace_check(bins: &Bins, sock: &str, plan: &Plan) -> Result<()> {
    let hex: String = plan
        .sample_frame()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let text = ctl(
        bins,
        sock,
        &[
            "trace",
            "--packet",
            &hex,
            "--in-port",
            &plan.gen_ofport.to_string(),
        ],
    )?;
    if !trace_text_delivers(&text, plan.sink_ofport) {
        bail!(
            "{}: oxvsctl trace says the generator's frames are not delivered to the sink's \
             port {} ({}):\n{text}",
            plan.kind.name(),
            plan.sink_ofport,
            plan.note
        );
    }
    Ok(())
}

/// Builds the virtual topology and starts `kind` on it with `plan`'s
/// flows and port numbers (the bridge and XDP redirect ignore both).
pub fn start_switch(kind: &SwitchKind, plan: &Plan, bins: Option<&Bins>) -> Result<Running> {
    start_switch_on(kind, plan, bins, Virtual::new(kind.tag(), 1)?)
}

/// The XDP redirect program's source (`bench/xdp/redirect.c`), compiled
/// at run time with the two ports' ifindexes.
pub const XDP_REDIRECT_C: &str = include_str!("../../xdp/redirect.c");

/// Why the `xdp-redirect` kind cannot run here (no clang, no `ip` with
/// libbpf), or None.
pub fn xdp_redirect_unavailable() -> Option<String> {
    if run(&["clang", "--version"]).map_or(true, |o| !o.status.success()) {
        return Some("clang is not installed (needed to compile bench/xdp/redirect.c)".into());
    }
    match run(&["ip", "-V"]) {
        Ok(o) if String::from_utf8_lossy(&o.stdout).contains("libbpf") => None,
        _ => Some("`ip` (iproute2) is not built with libbpf: cannot load an XDP object".into()),
    }
}

fn ifindex(ifname: &str) -> Result<u32> {
    let p = format!("/sys/class/net/{ifname}/ifindex");
    let s = std::fs::read_to_string(&p).with_context(|| format!("interface {ifname}: {p}"))?;
    s.trim()
        .parse()
        .with_context(|| format!("ifindex of {ifname}: {s}"))
}

/// Compiles `bench/xdp/redirect.c` for the topology's two ports into a
/// directory of its lab and attaches it natively on both (detached by the
/// lab's guard). Returns the port modes.
fn attach_xdp_redirect(topo: &mut Virtual) -> Result<BTreeMap<String, String>> {
    if let Some(why) = xdp_redirect_unavailable() {
        bail!("{why}");
    }
    let (a, b) = (ifindex(&topo.port1)?, ifindex(&topo.port2)?);
    let dir = topo.lab.dir("xdp")?;
    let src = dir.join("redirect.c");
    let obj = dir.join("redirect.o");
    std::fs::write(&src, XDP_REDIRECT_C).with_context(|| format!("write {}", src.display()))?;
    let (src_s, obj_s) = (
        src.to_string_lossy().into_owned(),
        obj.to_string_lossy().into_owned(),
    );
    must(&[
        "clang",
        "-O2",
        "-target",
        "bpf",
        &format!("-DIFINDEX_A={a}"),
        &format!("-DIFINDEX_B={b}"),
        "-c",
        &src_s,
        "-o",
        &obj_s,
    ])
    .context("compiling the XDP redirect program")?;
    let mut modes = BTreeMap::new();
    for (p, peer) in [(topo.port1.clone(), b), (topo.port2.clone(), a)] {
        must(&[
            "ip", "link", "set", "dev", &p, "xdpdrv", "obj", &obj_s, "sec", "xdp",
        ])
        .with_context(|| format!("attaching the XDP redirect program to {p} (native mode)"))?;
        topo.lab.xdp.push(p.clone());
        modes.insert(p, format!("native XDP, bpf_redirect to ifindex {peer}"));
    }
    Ok(modes)
}

/// The switch's threads as `oxvsctl stats` reports them.
fn oxvs_threads(bins: &Bins, sock: &str) -> Result<u64> {
    let out = ctl(bins, sock, &["--json", "stats"])?;
    let v: Value = serde_json::from_str(&out).context("stats --json")?;
    v["threads"]
        .as_u64()
        .ok_or_else(|| anyhow!("oxvsctl stats has no thread count: {out}"))
}

/// Starts `kind` on `topo` (virtual or ports) with `plan`'s flows and
/// port numbers (the bridge and XDP redirect ignore both).
pub fn start_switch_on(
    kind: &SwitchKind,
    plan: &Plan,
    bins: Option<&Bins>,
    mut topo: Virtual,
) -> Result<Running> {
    let flows = plan.flows.as_str();
    let nflows = crate::count_flows(flows);
    let (gp, sp) = (plan.gen_ofport.to_string(), plan.sink_ofport.to_string());
    let mut oxvs_ctl = None;
    let (pids, modes, proc_) = match kind {
        SwitchKind::Oxvs { threads, busy } => {
            let bins = bins.ok_or_else(|| anyhow!("oxvs binaries not given"))?;
            let sock = format!("/tmp/xb-{}-{}.sock", std::process::id(), next_seq());
            let p = spawn_switchd(bins, &mut topo.lab, None, &sock, *threads, *busy)?;
            let got = oxvs_threads(bins, &sock)?;
            if got != u64::from(*threads) {
                bail!("oxvs-switchd --threads {threads} runs {got} datapath threads");
            }
            ctl(bins, &sock, &["add-port", &topo.port1, "--ofport", &gp])?;
            ctl(bins, &sock, &["add-port", &topo.port2, "--ofport", &sp])?;
            let f = topo.lab.file("oxvs.flows", flows)?;
            ctl(bins, &sock, &["add-flows", &f])?;
            oxvs_trace_check(bins, &sock, plan)?;
            let modes = oxvs_port_modes(bins, &sock)?;
            oxvs_ctl = Some((bins.clone(), sock));
            (vec![p.pid()], modes, Some(p))
        }
        SwitchKind::OvsPmd | SwitchKind::OvsNonPmd => {
            let pid = ovs_ready()?;
            let ty = if *kind == SwitchKind::OvsPmd {
                "afxdp"
            } else {
                "afxdp-nonpmd"
            };
            let modes = start_ovs(&mut topo, ty, flows, [&gp, &sp])?;
            (vec![pid], modes, None)
        }
        SwitchKind::Bridge => {
            let br = format!("xb{}br", std::process::id());
            must(&["ip", "link", "add", &br, "type", "bridge"])?;
            topo.lab.links.push(br.clone());
            let _ = run(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{br}.disable_ipv6=1"),
            ]);
            for h in [&topo.port1, &topo.port2] {
                must(&["ip", "link", "set", h, "master", &br])?;
            }
            must(&["ip", "link", "set", &br, "up"])?;
            let modes = [&topo.port1, &topo.port2]
                .iter()
                .map(|p| ((*p).clone(), "kernel bridge".to_owned()))
                .collect();
            (Vec::new(), modes, None)
        }
        SwitchKind::XdpRedirect => {
            let modes = attach_xdp_redirect(&mut topo)?;
            (vec![crate::xbench::methods::SOFTIRQ], modes, None)
        }
    };
    let note = match kind {
        SwitchKind::Bridge => "kernel bridge (no flows)".into(),
        SwitchKind::XdpRedirect => XDP_REDIRECT_NOTE.into(),
        _ => plan.note.clone(),
    };
    let flowless = matches!(kind, SwitchKind::Bridge | SwitchKind::XdpRedirect);
    Ok(Running {
        name: kind.name(),
        pids,
        port_modes: modes,
        flows: if flowless { 0 } else { nflows },
        note,
        _procs: proc_.into_iter().collect(),
        topo,
        oxvs_ctl,
    })
}

/// The case note of the `xdp-redirect` kind: what its CPU figure is.
pub const XDP_REDIRECT_NOTE: &str = "kernel XDP redirect port <-> port (no flows); CPU = \
softirq time of ALL CPUs during the trial (/proc/stat), so it also counts the sink's \
veth/NIC receive and any other softirq work on the machine (an upper bound of the redirect's \
cost); without CONFIG_IRQ_TIME_ACCOUNTING that time is tick-sampled (reads 0 at low rates)";

/// Node A's flows of the two-node VXLAN setup: the pod (port 1) to node
/// B through the tunnel (port 10, VNI 100), and back
/// (`examples/switch-node-a.flows`).
pub const VXLAN_NODE_A_FLOWS: &str = "table=0,priority=100,in_port=1 actions=set_field:192.0.2.2->tun_dst,set_field:100->tun_id,output:10\n\
table=0,priority=100,in_port=10,tun_id=100 actions=output:1\n";
/// Node B's (`examples/switch-node-b.flows`).
pub const VXLAN_NODE_B_FLOWS: &str = "table=0,priority=100,in_port=1 actions=set_field:192.0.2.1->tun_dst,set_field:100->tun_id,output:10\n\
table=0,priority=100,in_port=10,tun_id=100 actions=output:1\n";

/// The two-node topology of `virtual-vxlan` without its switches:
///
/// ```text
///  netns gen (eth0) -- pod port (host end in node A)   [node A]
///        -- underlay veth `ul0` 192.0.2.1/24 <-> 192.0.2.2/24 --
///  [node B]   pod port (host end in node B) -- netns sink (eth0)
/// ```
///
/// Made by [`vxlan_nodes`]; the namespaces own every link (deleted with
/// them by the lab's guard).
pub(crate) struct VxlanNodes {
    pub lab: Lab,
    /// Node A's and node B's namespaces.
    pub nodes: [String; 2],
    /// The pod ports' host ends (in node A, node B).
    pub hosts: [String; 2],
    pub gen: Endpoint,
    pub sink: Endpoint,
}

/// The nodes' underlay addresses (node A, node B).
pub const VXLAN_UNDERLAY: [&str; 2] = ["192.0.2.1", "192.0.2.2"];

/// Builds [`VxlanNodes`] (`tag` goes into the names). The underlay
/// addresses go on `ul0` when `addr_on_ul0` (oxvs: the kernel's UDP
/// socket sends), else nowhere (OVS moves them onto its `br-phy`).
pub(crate) fn vxlan_nodes(tag: &str, addr_on_ul0: bool) -> Result<VxlanNodes> {
    let mut lab = Lab::default();
    let pid = std::process::id();
    let n = next_seq() % 100;
    let na = lab.netns(&format!("{tag}{n}-na"))?;
    let nb = lab.netns(&format!("{tag}{n}-nb"))?;
    // The underlay, created inside node A and moved into B: the namespaces
    // own it (deleted with them).
    must(&[
        "ip", "-n", &na, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", &nb,
    ])?;
    for (ns, ip) in [(&na, VXLAN_UNDERLAY[0]), (&nb, VXLAN_UNDERLAY[1])] {
        if addr_on_ul0 {
            must(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                "ul0",
            ])?;
        }
        must(&["ip", "-n", ns, "link", "set", "ul0", "up"])?;
        // As switch/tests/common: no TX checksum offload on the underlay.
        let _ = run(&[
            "ip", "netns", "exec", ns, "ethtool", "-K", "ul0", "tx", "off",
        ]);
    }
    let mut eps = Vec::new();
    let mut hosts = Vec::new();
    for (role, node, mac) in [("gen", &na, Some(GEN_MAC)), ("sink", &nb, None)] {
        let ns = lab.netns(&format!("{tag}{n}-{role}"))?;
        let host = format!("xb{pid}{tag}{n}{}", &role[..1]);
        if host.len() > 15 {
            bail!("interface name {host} is too long (tag '{tag}')");
        }
        must(&[
            "ip", "-n", node, "link", "add", &host, "type", "veth", "peer", "name", "eth0",
            "netns", &ns,
        ])?;
        if let Some(m) = mac {
            must(&[
                "ip",
                "-n",
                &ns,
                "link",
                "set",
                "eth0",
                "address",
                &crate::fmt_mac(m),
            ])?;
        }
        must(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        must(&["ip", "-n", node, "link", "set", &host, "up"])?;
        hosts.push(host);
        eps.push(Endpoint {
            netns: Some(ns),
            ifname: "eth0".into(),
            queues: 1,
        });
    }
    let sink = eps.pop().ok_or_else(|| anyhow!("no sink endpoint"))?;
    let gen = eps.pop().ok_or_else(|| anyhow!("no gen endpoint"))?;
    let hb = hosts.pop().ok_or_else(|| anyhow!("no node B pod port"))?;
    let ha = hosts.pop().ok_or_else(|| anyhow!("no node A pod port"))?;
    Ok(VxlanNodes {
        lab,
        nodes: [na, nb],
        hosts: [ha, hb],
        gen,
        sink,
    })
}

/// The pid of a switch started as `ip netns exec NS SWITCH ...`: `ip`
/// execs the switch in place; should it ever fork instead, the switch is
/// its child.
fn exec_pid(p: u32) -> u32 {
    let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
    if comm.trim() == "ip" {
        child_of(p).unwrap_or(p)
    } else {
        p
    }
}

/// The two-node pod-to-pod setup over VXLAN with oxvs
/// ([`ovs_vxlan::start_ovs_vxlan_pair`] is the same with Open vSwitch):
///
/// ```text
///  netns gen (eth0) -- [node A: oxvs-switchd, pod port 1, vxlan port 10]
///        -- underlay veth 192.0.2.1/24 <-> 192.0.2.2/24 --
///  [node B: oxvs-switchd, vxlan port 10, pod port 1] -- netns sink (eth0)
/// ```
///
/// Each node is a namespace with its own `oxvs-switchd` (its control
/// socket in `/tmp`); the VXLAN ports send and receive through the
/// nodes' kernel sockets on the underlay (see `switch/src/vxlan.rs`). The
/// CPU measured is both switches'. `busy`: both in `--mode busy`.
pub fn start_vxlan_pair(threads: u16, busy: bool, bins: &Bins) -> Result<Running> {
    let VxlanNodes {
        mut lab,
        nodes: [na, nb],
        hosts,
        gen,
        sink,
    } = vxlan_nodes("vx", true)?;
    let pid = std::process::id();
    let n = next_seq();
    let mut procs = Vec::new();
    let mut pids = Vec::new();
    let mut modes = BTreeMap::new();
    let nodes = [
        (&na, "a", VXLAN_UNDERLAY[0], VXLAN_NODE_A_FLOWS, &hosts[0]),
        (&nb, "b", VXLAN_UNDERLAY[1], VXLAN_NODE_B_FLOWS, &hosts[1]),
    ];
    for (ns, tag, ip, flows, host) in nodes {
        let sock = format!("/tmp/xb-{pid}-vx{n}{tag}.sock");
        let p = spawn_switchd(bins, &mut lab, Some(ns), &sock, threads, busy)?;
        pids.push(p.pid());
        procs.push(p);
        ctl(bins, &sock, &["add-port", host, "--ofport", "1"])?;
        ctl(
            bins,
            &sock,
            &[
                "add-port",
                "tun0",
                "--ofport",
                "10",
                "--type",
                "vxlan",
                "--local-ip",
                ip,
            ],
        )?;
        let f = lab.file(&format!("vx{n}{tag}.flows"), flows)?;
        ctl(bins, &sock, &["add-flows", &f])?;
        for (k, v) in oxvs_port_modes(bins, &sock)? {
            modes.insert(format!("node-{tag}:{k}"), v);
        }
    }
    let pids = pids.into_iter().map(exec_pid).collect();
    Ok(Running {
        name: with_threads(
            if busy {
                "oxvs-busy-vxlan-2node"
            } else {
                "oxvs-vxlan-2node"
            },
            threads,
        ),
        pids,
        port_modes: modes,
        flows: 4,
        note: "pod on node A -> VXLAN (VNI 100) over a veth underlay -> pod on node B; \
               oxvs-switchd per node, tunnel through the node's kernel UDP socket on ul0"
            .into(),
        _procs: procs,
        topo: Virtual {
            lab,
            queues: 1,
            gen,
            sink,
            port1: hosts[0].clone(),
            port2: hosts[1].clone(),
        },
        oxvs_ctl: None,
    })
}

/// The first child of process `pid` (`/proc/PID/task/PID/children`).
fn child_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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

fn start_ovs(
    topo: &mut Virtual,
    port_type: &str,
    flows: &str,
    ofports: [&str; 2],
) -> Result<BTreeMap<String, String>> {
    let br = format!("xb{}ovs", std::process::id());
    topo.lab.ovs_bridges.push(br.clone());
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
        "protocols=OpenFlow10,OpenFlow13,OpenFlow15",
    ])?;
    let mut modes = BTreeMap::new();
    for (host, ofport) in [
        (topo.port1.clone(), ofports[0]),
        (topo.port2.clone(), ofports[1]),
    ] {
        let got = ovs_add_afxdp_port(&br, &host, port_type, ofport, device_queues(&host))?;
        modes.insert(host, format!("{port_type} {got}"));
    }
    // OpenFlow 1.5: goto_table, conjunctions and register loads of the
    // Antrea-like pipeline all have a wire form there.
    must(&["ovs-ofctl", "-O", "OpenFlow15", "del-flows", &br])?;
    let f = topo.lab.file("ovs.flows", flows)?;
    must(&["ovs-ofctl", "-O", "OpenFlow15", "add-flows", &br, &f])?;
    Ok(modes)
}

/// Adds `host` to OVS bridge `br` as a `port_type` (`afxdp`,
/// `afxdp-nonpmd`) port numbered `ofport`, asking for zero-copy first and
/// falling back to the best the driver offers; returns the mode it got
/// (`native XDP (requested best-effort)`: OVS logs the mode, the database
/// does not show it).
pub fn ovs_add_afxdp_port(
    br: &str,
    host: &str,
    port_type: &str,
    ofport: &str,
    n_rxq: u32,
) -> Result<String> {
    for mode in ["native-with-zerocopy", "best-effort"] {
        let _ = run(&[
            "ovs-vsctl",
            "--timeout=10",
            "--if-exists",
            "del-port",
            br,
            host,
        ]);
        must(&[
            "ovs-vsctl",
            "--timeout=10",
            "add-port",
            br,
            host,
            "--",
            "set",
            "interface",
            host,
            &format!("type={port_type}"),
            &format!("options:xdp-mode={mode}"),
            &format!("options:n_rxq={n_rxq}"),
            &format!("ofport_request={ofport}"),
        ])?;
        sleep(Duration::from_millis(500))?;
        let err = must(&["ovs-vsctl", "get", "interface", host, "error"])?;
        let ofp = must(&["ovs-vsctl", "get", "interface", host, "ofport"])?;
        if err.trim() == "[]" && ofp.trim() == ofport {
            let xdp = afxdp_mode_in_log(
                &std::fs::read_to_string("/var/log/openvswitch/ovs-vswitchd.log")
                    .unwrap_or_default(),
                host,
            );
            return Ok(format!("{xdp} (requested {mode})"));
        }
    }
    bail!("OVS could not open {host} as {port_type}")
}

/// The XDP mode `ovs-vswitchd`'s log last reported for `ifname`
/// (`IF: native XDP mode will be in use.`), or `unknown`.
fn afxdp_mode_in_log(log: &str, ifname: &str) -> String {
    let prefix = format!("{ifname}: ");
    log.lines()
        .rev()
        .filter_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
        .find_map(|rest| rest.strip_suffix(" mode will be in use."))
        .unwrap_or("unknown")
        .to_owned()
}

/// Facts about an interface the `ports` setup would use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortFacts {
    /// It carries a default route (IPv4 or IPv6).
    pub default_route: bool,
    /// Its addresses other than IPv6 link-local ones.
    pub addresses: Vec<String>,
}

/// Refuses `ifname` if it carries the host's default route or any address
/// (the test has no addresses of its own), unless `force`.
pub fn check_port_safety(ifname: &str, f: &PortFacts, force: bool) -> Result<()> {
    let mut why = Vec::new();
    if f.default_route {
        why.push("it carries the default route".to_owned());
    }
    if !f.addresses.is_empty() {
        why.push(format!("it has addresses {}", f.addresses.join(", ")));
    }
    if why.is_empty() || force {
        if !why.is_empty() {
            eprintln!(
                "oxvs-bench: WARNING: using {ifname} although {} (--force)",
                why.join(" and ")
            );
        }
        return Ok(());
    }
    bail!(
        "refusing to send on {ifname}: {}; the benchmark would disturb the host's traffic \
         (pass --force to override)",
        why.join(" and ")
    )
}

/// Parses `ip -j route show default` and `ip -j addr show dev IF` output.
pub fn port_facts_from(ifname: &str, routes_json: &[&str], addr_json: &str) -> Result<PortFacts> {
    let mut f = PortFacts::default();
    for r in routes_json {
        let v: Value = serde_json::from_str(r).context("ip -j route output")?;
        for route in v.as_array().into_iter().flatten() {
            let dev = route["dev"].as_str();
            let via_nexthops = route["nexthops"]
                .as_array()
                .is_some_and(|n| n.iter().any(|h| h["dev"].as_str() == Some(ifname)));
            if dev == Some(ifname) || via_nexthops {
                f.default_route = true;
            }
        }
    }
    let v: Value = serde_json::from_str(addr_json).context("ip -j addr output")?;
    for link in v.as_array().into_iter().flatten() {
        for a in link["addr_info"].as_array().into_iter().flatten() {
            let local = a["local"].as_str().unwrap_or("");
            let link_local = a["scope"].as_str() == Some("link") && a["family"] == "inet6";
            if !local.is_empty() && !link_local {
                f.addresses
                    .push(format!("{local}/{}", a["prefixlen"].as_u64().unwrap_or(0)));
            }
        }
    }
    Ok(f)
}

/// Reads [`PortFacts`] of `ifname` from the system.
pub fn port_facts(ifname: &str) -> Result<PortFacts> {
    if !Path::new("/sys/class/net").join(ifname).exists() {
        bail!("interface {ifname} does not exist");
    }
    let r4 = must(&["ip", "-j", "-4", "route", "show", "default"])?;
    let r6 = must(&["ip", "-j", "-6", "route", "show", "default"])?;
    let a = must(&["ip", "-j", "addr", "show", "dev", ifname])?;
    port_facts_from(ifname, &[&r4, &r6], &a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oxvs_kinds_name_their_polling_mode() {
        let i = SwitchKind::parse("oxvs").expect("oxvs");
        let b = SwitchKind::parse("oxvs-busy").expect("oxvs-busy");
        assert_eq!(i, SwitchKind::OXVS);
        assert_eq!(
            b,
            SwitchKind::Oxvs {
                threads: 1,
                busy: true
            }
        );
        assert_eq!((i.name(), i.tag()), ("oxvs".to_owned(), "ox"));
        assert_eq!((b.name(), b.tag()), ("oxvs-busy".to_owned(), "ob"));
        let b2 = SwitchKind::Oxvs {
            threads: 2,
            busy: true,
        };
        assert_eq!(b2.name(), "oxvs-busy(2 threads)");
        let e = SwitchKind::parse("oxvs-spin").expect_err("unknown");
        assert!(format!("{e}").contains("oxvs-busy"), "{e}");
    }

    #[test]
    fn safety_refuses_default_route_and_addresses() {
        let routes = r#"[{"dst":"default","gateway":"10.0.0.1","dev":"eth0","protocol":"dhcp"}]"#;
        let addr = r#"[{"ifname":"eth0","addr_info":[{"family":"inet","local":"10.0.0.5","prefixlen":24,"scope":"global"},{"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]}]"#;
        let f = port_facts_from("eth0", &[routes, "[]"], addr).expect("parses");
        assert!(f.default_route);
        assert_eq!(f.addresses, ["10.0.0.5/24"]);
        let e = check_port_safety("eth0", &f, false).expect_err("refused");
        assert!(format!("{e}").contains("default route"), "{e}");
        assert!(check_port_safety("eth0", &f, true).is_ok());

        // Another NIC without addresses, only link-local: allowed.
        let addr2 = r#"[{"ifname":"ens2f0","addr_info":[{"family":"inet6","local":"fe80::2","prefixlen":64,"scope":"link"}]}]"#;
        let g = port_facts_from("ens2f0", &[routes], addr2).expect("parses");
        assert_eq!(g, PortFacts::default());
        assert!(check_port_safety("ens2f0", &g, false).is_ok());

        // An address alone is enough to refuse; so is an ECMP nexthop.
        let addr3 = r#"[{"ifname":"ens2f1","addr_info":[{"family":"inet","local":"192.168.5.1","prefixlen":24,"scope":"global"}]}]"#;
        let h = port_facts_from("ens2f1", &["[]"], addr3).expect("parses");
        assert!(check_port_safety("ens2f1", &h, false).is_err());
        let ecmp = r#"[{"dst":"default","nexthops":[{"gateway":"10.1.0.1","dev":"ens2f1"}]}]"#;
        let k = port_facts_from("ens2f1", &[ecmp], "[]").expect("parses");
        assert!(k.default_route);
        assert!(port_facts_from("x", &["not json"], "[]").is_err());
    }
}
