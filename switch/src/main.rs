//! `oxvs-switchd`: the datapath daemon.
//!
//! Thin by design: parse the flags, set up logging, start the engine
//! ([`oxvs_switch::engine::Switch`]) with an empty pipeline (nothing is
//! forwarded until flows are loaded), serve the control socket
//! ([`oxvs_switch::control`]), optionally create the gateway interface, then
//! wait for SIGTERM/SIGINT and tear everything down: control socket removed,
//! engine stopped (XDP programs detached), the connection table saved to the
//! conntrack state file, the gateway veth it created deleted. Teardown runs
//! every step and reports every failure.
//!
//! Conntrack across restarts: at start the table saved by the previous
//! switchd is restored (`--ct-state-file`, default next to the control
//! socket and named after it, `/run/oxvs/switchd.conntrack.state`; the file
//! is consumed, see [`oxvs_switch::ctstate`]), and TCP connections without
//! an entry are
//! picked up from mid-stream (`--ct-tcp-loose`, on by default, as Linux's
//! `nf_conntrack_tcp_loose`), so an established connection survives a
//! restart, `flush-conntrack` or an idle expiry as long as the flows allow
//! it as a new one.
//!
//! Conntrack limits: `--ct-max` connections in all; each port (pod) may
//! own at most `--ct-port-limit` of them (default a quarter of the table;
//! none for the gateway and VXLAN ports), changed at run time with
//! `oxvsctl ct-set-limits`. See `docs/pipeline.md`, "Conntrack limits".
//!
//! Signals: SIGTERM and SIGINT are blocked in every thread (the mask is set
//! before any thread starts and inherited) and taken synchronously by the
//! main thread with `sigwait`, so no handler runs in a random thread.
//!
//! Exit codes: 0 after a clean shutdown, 1 when startup or teardown failed,
//! 2 for bad flags.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use nix::sys::signal::{SigSet, Signal};
use oxvs_api::listen::Limits;
use oxvs_api::{PortKind, PortSpec, XdpModeRequest, DEFAULT_SWITCHD_SOCKET};
use oxvs_pipeline::conntrack::CtConfig;
use oxvs_pipeline::tables::Pipeline;
use oxvs_switch::control::ControlServer;
use oxvs_switch::ctstate;
use oxvs_switch::engine::{PollMode, Switch, SwitchConfig, UmemSharing};
use oxvs_switch::netdev;

/// The oxvs AF_XDP datapath daemon.
#[derive(Debug, Parser)]
#[command(name = "oxvs-switchd", version, about)]
struct Args {
    /// Control socket path.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SWITCHD_SOCKET)]
    socket: PathBuf,
    /// How datapath threads wait for packets.
    #[arg(long, value_enum, default_value_t = Mode::Interrupt)]
    mode: Mode,
    /// Datapath threads.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// `--mode interrupt`: microseconds a datapath thread keeps polling
    /// its rings after its last packet before it sleeps in `poll(2)`
    /// (adaptive polling: a burst right after work costs no wake-up; an
    /// idle switch still sleeps). 0: sleep at once.
    #[arg(long, value_name = "US", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    poll_linger_us: u64,
    /// CPUs to pin the datapath threads to, one each in order (`2,3`;
    /// thread i takes the i-th, wrapping around), as OVS's
    /// `pmd-cpu-mask`; put the NIC queues' interrupts elsewhere
    /// (docs/operations.md, "Multi-queue NICs"). Default: not pinned.
    #[arg(long, value_name = "CPU,...", value_delimiter = ',')]
    datapath_cpus: Vec<usize>,
    /// UMEM frames (4 KiB each, pinned) per UMEM: each datapath thread has
    /// `--umems-per-thread` of them, which its ports on virtual devices
    /// (veth) share; a port on a physical NIC, or every port with
    /// `--umem-sharing port`, has its own. The kernel also takes ~128 B
    /// per frame for every port on the UMEM (docs/operations.md, "Memory").
    #[arg(long, value_name = "N", default_value_t = 16384,
          value_parser = clap::value_parser!(u32).range(64..=MAX_UMEM_FRAMES as i64))]
    umem_frames: u32,
    /// Shared UMEMs per datapath thread: each new port goes to the one
    /// with the fewest ports and uses only that one's frames. Several
    /// small UMEMs make each port's bind and kernel memory smaller, one
    /// large one gives a busy port more frames to borrow under bursts
    /// (docs/operations.md, "Memory"). A thread pins all of them: at most
    /// 1048576 frames (4 GiB) in all.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    umems_per_thread: u16,
    /// Which AF_XDP ports share a UMEM: the ports of each datapath
    /// `thread`, or none (`port`: 16 MiB or more pinned per port).
    #[arg(long, value_enum, default_value_t = Sharing::Thread)]
    umem_sharing: Sharing,
    /// The device switchd creates (a dummy, else a veth pair NAME/NAMEp;
    /// replacing one of that name) so that each thread's shared UMEM has
    /// a first socket no port owns; it carries no traffic and is deleted
    /// when switchd stops.
    #[arg(long, value_name = "NAME", default_value = "oxvs-umem")]
    umem_anchor: String,
    /// Which XDP program serves the ports on virtual devices: the
    /// `switch`'s own, loaded once at start and attached to each port (a
    /// BPF link; no program load per port), or one `libxdp` loads per
    /// port. Ports on physical NICs always use libxdp's.
    #[arg(long, value_enum, default_value_t = XdpProgramArg::Switch)]
    xdp_program: XdpProgramArg,
    /// Do not complete the TCP/UDP checksums of frames from virtual
    /// interfaces and tunnels. By default the switch completes them, as a
    /// NIC does, so that pods and the host keep TX checksum offload (and
    /// with it GSO) on. With this flag the gateway's TX checksum offload is
    /// turned off, and pods must run with theirs off (the agent's
    /// `--pod-tx-checksum-off`), or their TCP and UDP is dropped as
    /// corrupt by the receiver.
    #[arg(long)]
    trust_checksums: bool,
    /// Complete the checksums of frames from pods in the switch, on
    /// receive, instead of on output: by default a frame out of a pod's
    /// or the gateway's port asks the kernel to finish its checksum (AF_XDP
    /// TX metadata, Linux 6.11+; the receiving stack then trusts it, as it
    /// trusts a segment a Linux bridge hands on), one cut by the tunnel's
    /// TSO gets each piece's own, and the switch completes the rest.
    #[arg(long)]
    software_checksums: bool,
    /// Forward a packet to a port sharing its UMEM (pods' and the
    /// gateway's ports on one datapath thread) by moving the frames it
    /// arrived in to that port's TX ring, not by copying it (`dump-ports`
    /// counts them as `moved`).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    tx_move: bool,
    /// Whether the VXLAN port segments inner TCP frames larger than the
    /// tunnel's inner MTU (userspace TSO: pods on nodes with large frames
    /// then send TCP to other nodes in 64 KiB segments; `show` says
    /// `tunnel_tso`). `off`: such frames get "fragmentation needed".
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    tunnel_tso: bool,
    /// Source address of the ICMP errors the switch sends to IPv4 senders
    /// ("fragmentation needed" for packets too big for the tunnel, time
    /// exceeded for packets whose TTL a `dec_ttl` found at 0 or 1): the
    /// gateway's address, as a Linux router would answer. Default: the
    /// tunnel port's local IP (with no tunnel port and no address, time
    /// exceeded is not answered).
    #[arg(long, value_name = "IPV4")]
    icmp_src_ip: Option<std::net::Ipv4Addr>,
    /// Frames per RX/TX batch (64: against 32, OVS's burst, 5-12 % more
    /// packet rate through the Antrea-like pipeline; docs/benchmarks.md).
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    batch: u16,
    /// Most connections tracked (default 262144). A commit into a full
    /// table drops an unreplied connection early, or is refused.
    #[arg(long, value_name = "N", value_parser = parse_ct_max)]
    ct_max: Option<usize>,
    /// Most connections one port (pod) may own, so that one pod cannot
    /// fill the table; 0: no limit. Default: a quarter of --ct-max (65536).
    /// The gateway and VXLAN ports have none. Change it at run time with
    /// `oxvsctl ct-set-limits default=N` (or per port).
    #[arg(long, value_name = "N")]
    ct_port_limit: Option<u32>,
    /// Pick up TCP connections from a mid-stream packet (no SYN seen) as
    /// new ones, as Linux's nf_conntrack_tcp_loose: connections survive a
    /// restart without a state file, `flush-conntrack` or an idle expiry
    /// (the flows still decide, the packet being +new). `false`: only a SYN
    /// starts a TCP connection.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    ct_tcp_loose: bool,
    /// Conntrack state file: the connection table is saved there on
    /// SIGTERM/SIGINT and restored from it at start (then removed; a
    /// refused file is renamed PATH.rejected). Default: next to --socket,
    /// named after it (/run/oxvs/switchd.conntrack.state); '' disables
    /// saving and restoring.
    // An OsString, not a PathBuf: clap refuses an empty PathBuf.
    #[arg(long, value_name = "PATH")]
    ct_state_file: Option<std::ffi::OsString>,
    /// Create a gateway interface NAME (a veth pair NAME <-> NAME-p, the
    /// `-p` end a switch port) for the host stack; at most 13 characters.
    #[arg(long, value_name = "NAME", value_parser = parse_gateway_name)]
    gateway: Option<String>,
    /// OpenFlow port number of the gateway port.
    #[arg(long, value_name = "N", default_value_t = 2, requires = "gateway")]
    gateway_ofport: u32,
    /// Address (CIDR) to put on the gateway interface, e.g. 10.244.0.1/24.
    #[arg(long, value_name = "CIDR", requires = "gateway", value_parser = parse_cidr)]
    gateway_ip: Option<String>,
    /// Root qdisc of the gateway interface (the host's end): `auto` (the
    /// node's net.core.default_qdisc), `none` (the veth's noqueue), or a
    /// kind. With one, the veth (Linux 6.16+) pauses the host's sending
    /// while the switch's receive ring is full, where noqueue drops.
    #[arg(
        long,
        value_name = "auto|none|KIND",
        default_value = "auto",
        requires = "gateway"
    )]
    gateway_qdisc: oxvs_netlink::RootQdisc,
    /// Log filter (`info`, `debug`, `oxvs_switch=debug,warn`...).
    #[arg(long, value_name = "FILTER", default_value = "info")]
    log_level: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (`none`: do not).
    #[arg(long, value_name = "ADDR", default_value = oxvs_switch::metrics::DEFAULT_METRICS_ADDR,
          value_parser = parse_metrics_addr)]
    metrics_addr: MetricsAddr,
    /// Most control socket connections served at once; one more is
    /// answered "busy" and its client retries.
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    control_max_connections: u32,
    /// Close a control connection that sends no request (or reads no
    /// response) for this long: 500ms, 30s, 2m.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_idle)]
    control_idle_timeout: std::time::Duration,
    /// Most /metrics connections served at once; one more is answered 503
    /// with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    metrics_max_connections: u32,
    /// Close a /metrics connection that sends no complete request for this long.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_idle)]
    metrics_idle_timeout: std::time::Duration,
}

/// An idle timeout: a duration with a unit, not zero.
fn parse_idle(s: &str) -> Result<std::time::Duration, String> {
    let d = oxvs_api::listen::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "'{s}': an idle timeout of 0 would close every connection at once"
        ));
    }
    Ok(d)
}

/// `--metrics-addr`: an address, or `none`.
#[derive(Clone, Debug)]
struct MetricsAddr(Option<std::net::SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "none" {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|_| format!("'{s}' is not IP:PORT (e.g. 127.0.0.1:9530) or 'none'"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Sharing {
    /// One UMEM per datapath thread.
    Thread,
    /// One UMEM per port.
    Port,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum XdpProgramArg {
    /// The switch's own program, shared by every port.
    Switch,
    /// A program libxdp loads for each port.
    Libxdp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    /// `poll(2)` on the sockets (sleeps when idle).
    Interrupt,
    /// Spin on the rings (dedicated cores).
    Busy,
}

/// `--ct-max`: at least 1.
fn parse_ct_max(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 connections: the table must hold at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a number of connections")),
    }
}

fn parse_gateway_name(s: &str) -> Result<String, String> {
    let ok_chars = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if s.is_empty() || s.len() > 13 || !ok_chars {
        return Err(format!(
            "'{s}' is not a usable gateway name (1-13 characters of [A-Za-z0-9._-], so that '{s}-p' fits the 15-character interface name limit)"
        ));
    }
    Ok(s.to_owned())
}

fn parse_cidr(s: &str) -> Result<String, String> {
    let (addr, len) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not ADDRESS/PREFIX"))?;
    let max = match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => 32,
        Ok(std::net::IpAddr::V6(_)) => 128,
        Err(_) => return Err(format!("'{addr}' is not an IP address")),
    };
    match len.parse::<u8>() {
        Ok(l) if l <= max => Ok(s.to_owned()),
        _ => Err(format!("'{len}' is not a prefix length (0..={max})")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = match tracing_subscriber::EnvFilter::try_new(&args.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("oxvs-switchd: bad --log-level '{}': {e}", args.log_level);
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// The most UMEM frames one datapath thread pins, over all its UMEMs
/// (4 GiB), and the largest `--umem-frames`.
const MAX_UMEM_FRAMES: u64 = 1 << 20;

/// Says so where each port's AF_XDP bind will fault its buffer pool in
/// from the hypervisor (a VM with free page reporting, a pool block of
/// the reported size): 5 ms per pod on the VMs measured, which smaller
/// UMEMs avoid (docs/operations.md, "Memory").
fn note_free_page_reporting(config: &SwitchConfig) {
    let Some(reported) = oxvs_switch::afxdp::free_page_reporting_order() else {
        return;
    };
    let order = oxvs_switch::afxdp::pool_order(config.umem_frames);
    if order >= reported {
        tracing::info!(
            umem_frames = config.umem_frames,
            pool_kib = u64::from(config.umem_frames) * oxvs_switch::afxdp::POOL_BYTES_PER_FRAME / 1024,
            reported_order = reported,
            "this VM hands free memory blocks back to its hypervisor (free page reporting), and each \
             port's AF_XDP socket takes a block that large at bind: adding a pod costs host page \
             faults (about 5 ms per 2 MiB measured); --umems-per-thread 2 --umem-frames 8192 avoids \
             them, with less burst headroom per port (docs/operations.md, \"Memory\")"
        );
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    // Before any thread exists, so every thread inherits the mask.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .context("cannot block SIGTERM/SIGINT")?;

    // A thread pins all its UMEMs at start: no more than the largest one
    // --umem-frames allows (4 GiB).
    let per_thread = u64::from(args.umems_per_thread) * u64::from(args.umem_frames);
    if per_thread > MAX_UMEM_FRAMES {
        anyhow::bail!(
            "--umems-per-thread {} x --umem-frames {} is {per_thread} frames ({} MiB pinned) per \
             datapath thread, more than the {MAX_UMEM_FRAMES} one thread may pin",
            args.umems_per_thread,
            args.umem_frames,
            per_thread * 4 / 1024
        );
    }
    if !args.datapath_cpus.is_empty() {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .context("cannot read the CPUs this process may run on")?;
        let ok: Vec<usize> = (0..nix::sched::CpuSet::count())
            .filter(|&c| allowed.is_set(c).unwrap_or(false))
            .collect();
        if let Some(bad) = args.datapath_cpus.iter().find(|c| !ok.contains(c)) {
            anyhow::bail!("--datapath-cpus: CPU {bad} is not one this process may run on ({ok:?})");
        }
    }
    let mut conntrack = CtConfig::default();
    if let Some(n) = args.ct_max {
        conntrack.max_entries = n;
    }
    conntrack.port_limit = args
        .ct_port_limit
        .unwrap_or_else(|| CtConfig::default_port_limit(conntrack.max_entries));
    conntrack.tcp_loose = args.ct_tcp_loose;
    let ct_state_file = match &args.ct_state_file {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Some(ctstate::default_path(&args.socket)),
    };
    let config = SwitchConfig {
        threads: usize::from(args.threads),
        datapath_cpus: args.datapath_cpus.clone(),
        poll_linger: std::time::Duration::from_micros(args.poll_linger_us),
        poll_mode: match args.mode {
            Mode::Interrupt => PollMode::Interrupt,
            Mode::Busy => PollMode::Busy,
        },
        umem_frames: args.umem_frames,
        umems_per_thread: usize::from(args.umems_per_thread),
        umem_sharing: match args.umem_sharing {
            Sharing::Thread => UmemSharing::PerThread {
                anchor: args.umem_anchor.clone(),
            },
            Sharing::Port => UmemSharing::PerPort,
        },
        batch: usize::from(args.batch),
        conntrack,
        shared_xdp_program: args.xdp_program == XdpProgramArg::Switch,
        complete_checksums: !args.trust_checksums,
        tunnel_tso: args.tunnel_tso,
        tx_move: args.tx_move,
        kernel_checksums: !args.software_checksums,
        icmp_src_ip: args.icmp_src_ip,
        ..SwitchConfig::default()
    };
    tracing::info!(?config, socket = %args.socket.display(), "starting oxvs-switchd");
    note_free_page_reporting(&config);
    let switch = Arc::new(
        Switch::start(config, Arc::new(Pipeline::new())).context("cannot start the datapath")?,
    );
    // Before any port exists, so no packet meets an empty table.
    if let Some(path) = &ct_state_file {
        restore_conntrack(&switch, path);
    }
    // The gateway before the control socket: once the socket answers, the
    // gateway port is there (the agent and tests rely on that).
    let gateway = match &args.gateway {
        None => None,
        Some(name) => match args
            .gateway_qdisc
            .resolve()
            .map_err(|e| anyhow::anyhow!("--gateway-qdisc: {e}"))
            .and_then(|qdisc| {
                Gateway::create(
                    &switch,
                    name,
                    args.gateway_ofport,
                    args.gateway_ip.as_deref(),
                    !args.trust_checksums,
                    qdisc.as_deref(),
                )
            }) {
            Ok(g) => {
                // The host is trusted, and its own conntrack saw the
                // connection first: no per-port limit for the gateway.
                switch.with_conntrack(|ct| ct.set_port_limit(args.gateway_ofport, Some(0)));
                Some(g)
            }
            Err(e) => {
                switch.shutdown();
                return Err(e);
            }
        },
    };
    let control_limits = Limits {
        max_connections: args.control_max_connections as usize,
        idle_timeout: args.control_idle_timeout,
    };
    let mut server =
        match ControlServer::start_with(args.socket.clone(), switch.clone(), control_limits) {
            Ok(s) => s,
            Err(e) => {
                switch.shutdown();
                if let Some(g) = gateway {
                    if let Err(ge) = g.delete() {
                        tracing::error!("{ge:#}");
                    }
                }
                return Err(e.into());
            }
        };
    // Auxiliary: without it the switch still forwards, so a bind failure is logged, not fatal.
    let metrics = args.metrics_addr.0.and_then(|addr| {
        let limits = Limits {
            max_connections: args.metrics_max_connections as usize,
            idle_timeout: args.metrics_idle_timeout,
        };
        oxvs_switch::metrics::MetricsServer::start_with(
            addr,
            switch.clone(),
            limits,
            vec![("control", server.stats())],
        )
        .map_err(|e| tracing::error!("no metrics: {e}"))
        .ok()
    });
    // Interface MTUs also change outside port changes (an operator, the
    // agent raising its gateway's): the tunnel's coalescing limit follows
    // within seconds (one link dump each time).
    {
        let sw = Arc::downgrade(&switch);
        let spawned = std::thread::Builder::new()
            .name("oxvs-mtu".into())
            .spawn(move || {
                while let Some(s) = sw.upgrade() {
                    s.refresh_gro_max();
                    drop(s);
                    std::thread::sleep(std::time::Duration::from_secs(5));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("MTU changes outside port changes are not followed: {e}");
        }
    }
    tracing::info!("ready: empty pipeline, nothing is forwarded until flows are loaded");

    let sig = signals.wait().context("waiting for a signal failed")?;
    tracing::info!(signal = %sig, "shutting down");

    let mut failures = Vec::new();
    drop(metrics);
    server.stop();
    switch.shutdown();
    // The threads are stopped: the table no longer changes.
    if let Some(path) = &ct_state_file {
        match ctstate::save(&switch, path) {
            Ok(s) if s.entries == 0 => {
                tracing::info!("no connections: conntrack state not saved")
            }
            Ok(s) => tracing::info!(
                path = %path.display(),
                connections = s.entries,
                bytes = s.bytes,
                ms = s.elapsed.as_secs_f64() * 1e3,
                "conntrack state saved"
            ),
            Err(e) => failures.push(format!("conntrack state not saved: {e}")),
        }
    }
    if let Some(g) = gateway {
        if let Err(e) = g.delete() {
            failures.push(format!("{e:#}"));
        }
    }
    if failures.is_empty() {
        tracing::info!("stopped");
        Ok(())
    } else {
        anyhow::bail!("shutdown incomplete: {}", failures.join("; "))
    }
}

/// Restores the connection table the previous switchd saved; a missing or
/// refused file is logged and leaves the table empty (loose TCP pickup
/// then covers established connections).
fn restore_conntrack(switch: &Switch, path: &std::path::Path) {
    match ctstate::restore(switch, path) {
        Ok(None) => tracing::info!(path = %path.display(), "no conntrack state to restore"),
        Ok(Some(r)) => tracing::info!(
            path = %path.display(),
            restored = r.result.restored,
            expired = r.result.expired,
            downtime_ms = r.result.downtime_ns / 1_000_000,
            bytes = r.bytes,
            ms = r.elapsed.as_secs_f64() * 1e3,
            "conntrack state restored: {} connections in {:.1} ms",
            r.result.restored,
            r.elapsed.as_secs_f64() * 1e3
        ),
        Err(e) => tracing::warn!("conntrack state not restored, starting with an empty table: {e}"),
    }
}

/// The gateway veth pair this process created.
struct Gateway {
    name: String,
}

impl Gateway {
    /// Creates `name` <-> `name-p`, brings both up, puts `ip` on `name`, and
    /// adds `name-p` as switch port `ofport` (named `name`); turns TX
    /// checksum offload off on `name` unless the switch completes
    /// checksums, and gives `name` the root qdisc `qdisc` (`None`: the
    /// veth's `noqueue`). Undoes what it
    /// did on failure. Refuses an interface that already exists: the
    /// daemon leaves interfaces it did not create alone.
    fn create(
        switch: &Switch,
        name: &str,
        ofport: u32,
        ip: Option<&str>,
        complete_checksums: bool,
        qdisc: Option<&str>,
    ) -> anyhow::Result<Gateway> {
        let peer = format!("{name}-p");
        for n in [name, peer.as_str()] {
            if netdev::link_exists(n) {
                anyhow::bail!(
                    "cannot create the gateway: interface '{n}' already exists (left untouched)"
                );
            }
        }
        netdev::create_veth_pair(name, &peer, None)
            .with_context(|| format!("cannot create the gateway veth pair {name} <-> {peer}"))?;
        let gw = Gateway { name: name.into() };
        let setup = || -> anyhow::Result<()> {
            if let Some(ip) = ip {
                netdev::add_address(name, ip)
                    .with_context(|| format!("cannot add {ip} to {name}"))?;
            }
            netdev::set_up(name)?;
            netdev::set_up(&peer)?;
            // Frames from the host wait on the switch end's XDP ring: with
            // a qdisc the veth holds them back while it is full.
            if let Some(kind) = qdisc {
                netdev::set_root_qdisc(name, kind)?;
            }
            // The host stack hands the switch TCP/UDP packets with partial
            // checksums (TX offload) and AF_XDP sees the raw frame: the
            // switch completes them, unless told not to, and then the host
            // must finish them itself.
            if !complete_checksums {
                if let Err(e) = netdev::tx_checksum_off(name) {
                    tracing::warn!(gateway = %name, "{e:#}; host TCP/UDP to pods may carry bad checksums");
                }
            }
            let info = switch
                .add_port(PortSpec {
                    name: name.into(),
                    ofport: Some(ofport),
                    kind: PortKind::Afxdp {
                        ifname: Some(peer.clone()),
                        xdp_mode: XdpModeRequest::Auto,
                        n_rxq: None,
                    },
                })
                .with_context(|| {
                    format!("cannot add the gateway port {name} ({peer}) as ofport {ofport}")
                })?;
            // The switch's end takes whatever the host end's MTU lets the
            // host send (the agent raises it for large frames on the node);
            // the host end's MTU alone decides what the switch may send.
            let max_mtu = u32::try_from(switch.max_frame_len().saturating_sub(14))
                .unwrap_or(65_535)
                .min(65_535);
            if max_mtu > 1500 {
                if let Err(e) = netdev::set_mtu(&peer, max_mtu) {
                    tracing::warn!(gateway = %name, "{e:#}; the host cannot send the switch frames above 1500 bytes");
                }
            }
            switch.refresh_gro_max();
            tracing::info!(gateway = %name, port = %peer, ofport = info.ofport, mode = %info.mode, max_mtu, qdisc = qdisc.unwrap_or("noqueue"), "gateway ready");
            Ok(())
        };
        match setup() {
            Ok(()) => Ok(gw),
            Err(e) => {
                if let Err(e2) = gw.delete() {
                    tracing::warn!("{e2:#}");
                }
                Err(e)
            }
        }
    }

    /// Deletes the pair (deleting one end deletes both).
    fn delete(self) -> anyhow::Result<()> {
        netdev::delete_link(&self.name)
            .with_context(|| format!("cannot delete the gateway interface {}", self.name))?;
        tracing::info!(gateway = %self.name, "gateway deleted");
        Ok(())
    }
}
