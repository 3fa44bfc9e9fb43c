//! The switch engine: ports, datapath threads, shared state.
//!
//! ## Threads and ownership
//!
//! [`Switch::start`] spawns `threads` datapath threads. Each owns, and alone
//! touches: its ports (an AF_XDP socket with its own UMEM and frame pool --
//! see [`crate::afxdp`] for why not one UMEM per thread -- or a VXLAN
//! socket), and an
//! [`oxvs_pipeline::datapath::Datapath`] (exact-match and megaflow caches are
//! per thread). Ports are assigned to the thread with the fewest ports
//! (round-robin as long as none is removed). The control side (the
//! [`Switch`] methods, all `&self`) talks to a thread through its command
//! channel plus a wakeup socket the thread polls, and waits for the reply;
//! sockets are created and deleted on the owning thread (a few ms during
//! which that thread's other ports wait; other threads are not affected).
//!
//! ## The loop (per thread)
//!
//! 1. commands (port add/del, port table, inject) and the cross-thread inbox;
//! 2. for each port: receive a batch (`SwitchConfig::batch` frames); AF_XDP
//!    frames are processed **in place** in the UMEM ([`PacketRef`] over the
//!    frame, with 256 bytes of headroom), VXLAN packets in the port's own
//!    buffers; `process_batch` runs with the conntrack lock taken once and
//!    `now_ns` read once; every output is copied once into a free frame of
//!    the output port's TX ring (or the tunnel's send queue); the RX frames
//!    go straight back to that port's fill ring;
//! 3. flush every port (one `sendto` per port when the ring asks for a
//!    wakeup), drain completions, top fill rings up, publish counters;
//! 4. if nothing happened: `poll(2)` on all sockets + the wakeup socket
//!    (100 ms) in [`PollMode::Interrupt`] (after lingering
//!    [`SwitchConfig::poll_linger`] since the last packet); spin in [`PollMode::Busy`].
//!
//! An output to a port owned by another thread is copied into a buffer and
//! handed over through that thread's inbox (one lock per batch); that path
//! costs a second copy, which is why one thread (the default) is best on a
//! small machine.
//!
//! ## Shared state and locks
//!
//! - flow tables: `Arc<Pipeline>`, a lock-free snapshot per batch;
//! - conntrack: one `Mutex<Conntrack>`, taken once per batch;
//! - packet-ins: a bounded `Mutex<VecDeque>`, one lock per batch that has any;
//! - learned flows: a bounded queue ([`crate::learn::LearnQueue`]), one lock
//!   per batch that learned anything; the flow keeper thread (`oxvs-flows`)
//!   applies them to the tables and expires flows by their timeouts;
//! - per-thread stats: a `Mutex` updated once per loop; port counters are
//!   atomics added once per loop;
//! - the port registry (`Mutex<BTreeMap>`), only on the control side.
//!
//! Lock order: registry -> (thread reply wait); a datapath thread never takes
//! the registry, and holds at most one of conntrack / packet-in / inbox /
//! stats at a time.
//!
//! ## Answers the switch sends itself
//!
//! Some packets are answered by the datapath thread that holds them, out
//! of their input port, with an ICMP error ([`crate::icmp_error`]): a
//! packet too big for the tunnel, a packet a flow rejected, a packet whose
//! TTL (hop limit) a `dec_ttl` found at 0 or 1. For the last two the
//! switch is its own controller: their packet-ins (userdata `reject`,
//! reason `invalid_ttl`) are answered and not queued for `packet-in`
//! (OVS's default asynchronous configuration sends a controller no
//! `invalid_ttl` packet-ins either), within one per-thread budget of
//! answers ([`crate::reject::RejectBudget`]).
//!
//! A too-big and a time exceeded answer quote the packet as it was
//! received, before the flows rewrote its addresses: a thread that may
//! have to answer (one serving a tunnel port, or any with
//! [`SwitchConfig::icmp_src_ip`]) keeps the first
//! [`vxlan::TOO_BIG_HEAD`] bytes of each packet it receives (one copy,
//! no allocation; threads that cannot answer skip it). Time exceeded
//! answers come from `icmp_src_ip`, else the thread's tunnel's local
//! address (IPv4), and from the EUI-64 link-local address of the MAC
//! the sender addressed (IPv6). A packet that came in through the
//! tunnel is answered back into it, toward the node that sent it (outer
//! destination = its outer source, same VNI): that is how the second
//! node of a pod-to-pod path shows up in a traceroute. The tunnel port
//! is lent to the batch it received, so those answers wait in the
//! thread's scratch until the batch is done.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxvs_api::{PortInfo, PortKind, PortSpec, PortStats, QueueInfo};
use oxvs_pipeline::checksum;
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{
    Datapath, DatapathConfig, DatapathSink, DatapathStats, DpPacket, PacketIn as DpPacketIn,
    TunnelMeta,
};
use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::PacketInReason;
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::learn::Learned;

use crate::learn::{FlowKeeper, LearnQueue, LearnStats};
use oxvs_pipeline::packet::PacketRef;
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

use crate::afxdp::{self, PreparedXsk, ThreadUmem, UmemMem, XskPort};
use crate::vxlan::{self, TxError, VxlanPort};
use crate::xdpprog::XdpProgram;

/// How datapath threads wait for packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// `poll(2)` on the ports' sockets: sleeps when idle (the default, for small machines).
    #[default]
    Interrupt,
    /// Spin on the rings (dedicated cores).
    Busy,
}

/// Which AF_XDP ports share a UMEM (see `afxdp`'s module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UmemSharing {
    /// The ports of each datapath thread on virtual devices share one;
    /// its first socket is bound to the thread's queue of this device
    /// (a dummy, else a veth pair), which the switch creates (replacing
    /// one of that name) and deletes when it stops.
    PerThread { anchor: String },
    /// Every port has its own.
    PerPort,
}

impl UmemSharing {
    /// Per thread, anchored on a device name no other switch of this
    /// process or of another process uses (`oxu<pid>.<n>`, hex); starting
    /// a switch with one deletes the ones of processes that are gone.
    pub fn per_thread_unique() -> UmemSharing {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        UmemSharing::PerThread {
            anchor: format!("oxu{:x}.{:x}", std::process::id(), n & 0xffff),
        }
    }
}

/// Deletes the anchor devices [`UmemSharing::per_thread_unique`] made for
/// processes that no longer exist (killed before they could delete them).
fn delete_stale_unique_anchors() {
    let Ok(names) = crate::netdev::link_names() else {
        return;
    };
    for name in names {
        let Some(rest) = name.strip_prefix("oxu") else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('.') else {
            continue;
        };
        let n = n.strip_suffix('p').unwrap_or(n);
        let (Ok(pid), true) = (
            u32::from_str_radix(pid, 16),
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_hexdigit()),
        ) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = crate::netdev::delete_link(&name);
        }
    }
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// Number of datapath threads (ports are spread across them).
    pub threads: usize,
    pub poll_mode: PollMode,
    /// UMEM frames (4 KiB each) per UMEM: each of a datapath thread's
    /// shared ones, and each port's own.
    pub umem_frames: u32,
    /// Whether the ports of a thread share UMEMs.
    pub umem_sharing: UmemSharing,
    /// Shared UMEMs per datapath thread ([`UmemSharing::PerThread`]): a
    /// new port goes to the one with the fewest ports and uses only its
    /// frames. The kernel gives every socket on a UMEM a table of about
    /// 128 bytes per frame of that UMEM, so more, smaller UMEMs make each
    /// port's bind cheaper and its kernel memory smaller, while one large
    /// UMEM lends a busy port more frames (`afxdp`'s module
    /// documentation).
    pub umems_per_thread: usize,
    /// Frames per RX/TX batch (32-64).
    pub batch: usize,
    pub conntrack: CtConfig,
    /// Source address of the ICMP errors the switch sends to IPv4 senders
    /// ("too big" for packets that do not fit a tunnel, time exceeded for
    /// packets a `dec_ttl` stopped): the gateway's address, say. Default:
    /// the local IP of the tunnel port (of the thread that answers). A
    /// thread with neither cannot answer time exceeded, and does not keep
    /// packets' heads for it (module doc, "Answers").
    pub icmp_src_ip: Option<Ipv4Addr>,
    /// Most packet-ins queued for the controller (more are dropped and counted).
    pub packet_in_queue: usize,
    /// Most learned flows queued for the flow keeper (more are dropped
    /// and counted; [`crate::learn`]).
    pub learn_queue: usize,
    /// Serve ports on virtual devices with the switch's one XDP program
    /// ([`crate::xdpprog`], loaded at start) instead of a program libxdp
    /// loads per port.
    pub shared_xdp_program: bool,
    /// Complete the TCP/UDP checksums of frames from virtual interfaces
    /// (pods, the gateway) and from VXLAN tunnels, so that their kernels
    /// may keep TX checksum offload on
    /// ([`oxvs_pipeline::checksum`] says why and what is covered).
    /// Frames from physical NICs arrive complete and are never touched.
    pub complete_checksums: bool,
    /// Tunnel ports segment inner TCP frames larger than the tunnel's
    /// inner MTU (userspace TSO, `vxlan/tso.rs`) instead of answering
    /// "fragmentation needed".
    pub tunnel_tso: bool,
    /// In [`PollMode::Interrupt`], how long a thread keeps polling its
    /// rings after its last packet before it sleeps in `poll(2)` (zero:
    /// sleep at once). A burst that follows within it is taken without a
    /// wake-up; an idle switch still sleeps.
    pub poll_linger: Duration,
    /// CPUs the datapath threads are pinned to: thread `i` to
    /// `datapath_cpus[i % len]` (empty: not pinned, the scheduler's choice).
    pub datapath_cpus: Vec<usize>,
    /// Forward a packet's last output to an AF_XDP port sharing its UMEM
    /// by moving its frames' descriptors to that port's TX ring instead of
    /// copying it (`Sink::move_out`).
    pub tx_move: bool,
    /// With [`SwitchConfig::complete_checksums`], finish the checksums of
    /// frames from ports on a UMEM with TX metadata (pods, the gateway, on
    /// Linux 6.11+) on output rather than on receive: out of such a port
    /// the kernel is asked to (`afxdp::txmd`: nothing sums the payload,
    /// the receiving stack trusts it as it trusts a bridged pod's
    /// segment), into the tunnel its TSO computes each piece's own;
    /// elsewhere the switch completes it. Off (or with `tx_move`, or
    /// without TX metadata, or for a VLAN-tagged frame), they are
    /// completed on receive.
    pub kernel_checksums: bool,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            threads: 1,
            poll_mode: PollMode::Interrupt,
            umem_frames: 2048,
            // No device created as a side effect of a default config (the
            // daemon's default, `--umem-sharing thread`, sets its own).
            umem_sharing: UmemSharing::PerPort,
            umems_per_thread: 1,
            batch: 64,
            conntrack: CtConfig::default(),
            icmp_src_ip: None,
            packet_in_queue: 1024,
            learn_queue: crate::learn::DEFAULT_LEARN_QUEUE,
            shared_xdp_program: true,
            complete_checksums: true,
            tunnel_tso: true,
            poll_linger: Duration::ZERO,
            datapath_cpus: Vec::new(),
            tx_move: false,
            kernel_checksums: true,
        }
    }
}

/// Why an engine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("no port named '{0}'")]
    NoSuchPort(String),
    #[error("no port with ofport {0}")]
    NoSuchOfport(u32),
    #[error("a port named '{0}' already exists")]
    NameInUse(String),
    #[error("ofport {ofport} is already used by port '{name}'")]
    OfportInUse { ofport: u32, name: String },
    #[error("ofport {0} is not a valid port number (1..=65279)")]
    BadOfport(u32),
    #[error("cannot open port '{name}': {reason}")]
    PortOpen { name: String, reason: String },
    #[error("the switch is shut down")]
    ShutDown,
    #[error("{0}")]
    Other(String),
}

/// A packet sent to the controller by a flow.
#[derive(Clone, Debug)]
pub struct PacketIn {
    pub in_port: u32,
    pub table: u8,
    pub cookie: u64,
    pub reason: String,
    pub userdata: Vec<u8>,
    pub frame: Vec<u8>,
}

/// Datapath statistics summed over threads.
#[derive(Clone, Debug, Default)]
pub struct SwitchStats {
    pub datapath: DatapathStats,
    pub threads: usize,
    /// Time spent processing packets (ns), for ns-per-packet.
    pub busy_ns: u64,
    /// Packet-ins dropped because the queue was full.
    pub packet_in_dropped: u64,
    /// ICMP "fragmentation needed" / "packet too big" replies sent for
    /// packets that did not fit a tunnel.
    pub icmp_too_big: u64,
    /// ICMP "port unreachable" answers to rejected packets
    /// ([`crate::reject`]).
    pub rejects: u64,
    /// Rejected packets not answered: over the rate limit.
    pub rejects_limited: u64,
    /// ICMP time exceeded answers to packets whose TTL (hop limit) a
    /// `dec_ttl` found at 0 or 1 (`invalid_ttl` packet-ins).
    pub time_exceeded: u64,
    /// `invalid_ttl` packet-ins not answered: over the rate limit (the
    /// budget rejects share).
    pub time_exceeded_limited: u64,
    /// `invalid_ttl` packet-ins not answered because they must not or
    /// cannot be: an ICMP error, a later fragment, a source or destination
    /// that is not unicast, a malformed header
    /// ([`crate::icmp_error`]), or a thread with no address to answer
    /// from.
    pub time_exceeded_unanswered: u64,
    /// Outputs to a port number no port has (dropped).
    pub output_no_port: u64,
    /// Outputs handed to another datapath thread.
    pub cross_thread: u64,
    /// Received frames whose descriptor was unusable (dropped).
    pub bad_frames: u64,
    /// Frames from tunnels dropped because their TCP/UDP checksum failed
    /// (corrupted on the way; `checksum::verify_or_complete_l4`).
    pub tunnel_bad_checksums: u64,
    /// Inner TCP frames the tunnel cut into pieces (userspace TSO).
    pub tunnel_tso_frames: u64,
    /// Received tunnel segments merged into the frame before them
    /// (userspace GRO).
    pub tunnel_gro_merged: u64,
    /// Frames of the threads' shared UMEMs, and how many are free (not
    /// on a ring, not being processed).
    pub umem_frames: u64,
    pub umem_free_frames: u64,
    /// Learned flows (`learn` actions) and flow expiry.
    pub learn: LearnStats,
}

/// Nanoseconds on the engine's monotonic clock (the clock the datapath
/// hands the pipeline as `now_ns`; use it for flow mods too).
pub fn monotonic_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Highest port number a port may have (OFPP_MAX).
const OFPP_MAX: u32 = 0xff00;
/// How long the control side waits for a datapath thread's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle `poll(2)` timeout in interrupt mode.
const POLL_TIMEOUT_MS: i32 = 100;
/// Most recycled cross-thread buffers kept.
const MAX_SPARES: usize = 4096;

/// Live counters of one port (updated by its thread once per loop).
#[derive(Debug, Default)]
struct AtomicPortStats {
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    rx_dropped: AtomicU64,
    rx_errors: AtomicU64,
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
    tx_dropped: AtomicU64,
    tx_errors: AtomicU64,
    rx_ring_full: AtomicU64,
    rx_fill_empty: AtomicU64,
    rx_other: AtomicU64,
    tx_no_frame: AtomicU64,
    tx_ring_full: AtomicU64,
    tx_moved: AtomicU64,
    tx_checksum_requests: AtomicU64,
    rx_fill_frames: AtomicU64,
    rx_fill_target: AtomicU64,
}

impl AtomicPortStats {
    /// Called once per loop with work: only counters that moved cost an
    /// atomic add (drops and errors are nearly always zero).
    fn add(&self, c: &afxdp::PortCounters) {
        let r = Ordering::Relaxed;
        let add = |a: &AtomicU64, n: u64| {
            if n != 0 {
                a.fetch_add(n, r);
            }
        };
        add(&self.rx_packets, c.rx_packets);
        add(&self.rx_bytes, c.rx_bytes);
        add(&self.tx_packets, c.tx_packets);
        add(&self.tx_bytes, c.tx_bytes);
        add(&self.tx_moved, c.tx_moved);
        add(&self.tx_checksum_requests, c.tx_checksum_requests);
        if c.rx_dropped | c.tx_dropped | c.tx_errors != 0 {
            add(&self.rx_dropped, c.rx_dropped);
            add(&self.tx_dropped, c.tx_dropped);
            add(&self.tx_errors, c.tx_errors);
            add(&self.rx_ring_full, c.rx_ring_full);
            add(&self.rx_fill_empty, c.rx_fill_empty);
            add(&self.rx_other, c.rx_other);
            add(&self.tx_no_frame, c.tx_no_frame);
            add(&self.tx_ring_full, c.tx_ring_full);
        }
    }
    /// The fill ring's gauges ([`PortStats::rx_fill_frames`], `_target`).
    fn set_fill(&self, frames: usize, target: usize) {
        let r = Ordering::Relaxed;
        self.rx_fill_frames.store(frames as u64, r);
        self.rx_fill_target.store(target as u64, r);
    }
    fn store(&self, s: &PortStats) {
        let r = Ordering::Relaxed;
        self.rx_packets.store(s.rx_packets, r);
        self.rx_bytes.store(s.rx_bytes, r);
        self.rx_dropped.store(s.rx_dropped, r);
        self.rx_errors.store(s.rx_errors, r);
        self.tx_packets.store(s.tx_packets, r);
        self.tx_bytes.store(s.tx_bytes, r);
        self.tx_dropped.store(s.tx_dropped, r);
        self.tx_errors.store(s.tx_errors, r);
        self.rx_ring_full.store(s.rx_ring_full, r);
        self.rx_fill_empty.store(s.rx_fill_empty, r);
        self.rx_other.store(s.rx_other, r);
        self.tx_no_frame.store(s.tx_no_frame, r);
        self.tx_ring_full.store(s.tx_ring_full, r);
        self.tx_moved.store(s.tx_moved, r);
        self.tx_checksum_requests.store(s.tx_checksum_requests, r);
    }
    fn get(&self) -> PortStats {
        let r = Ordering::Relaxed;
        PortStats {
            rx_packets: self.rx_packets.load(r),
            rx_bytes: self.rx_bytes.load(r),
            rx_dropped: self.rx_dropped.load(r),
            rx_errors: self.rx_errors.load(r),
            tx_packets: self.tx_packets.load(r),
            tx_bytes: self.tx_bytes.load(r),
            tx_dropped: self.tx_dropped.load(r),
            tx_errors: self.tx_errors.load(r),
            rx_ring_full: self.rx_ring_full.load(r),
            rx_fill_empty: self.rx_fill_empty.load(r),
            rx_other: self.rx_other.load(r),
            tx_no_frame: self.tx_no_frame.load(r),
            tx_ring_full: self.tx_ring_full.load(r),
            tx_moved: self.tx_moved.load(r),
            tx_checksum_requests: self.tx_checksum_requests.load(r),
            rx_fill_frames: self.rx_fill_frames.load(r),
            rx_fill_target: self.rx_fill_target.load(r),
        }
    }
}

/// A frame handed to another thread for output.
#[derive(Debug)]
struct Handoff {
    ofport: u32,
    tunnel: Option<TunnelMeta>,
    buf: Vec<u8>,
}

/// What the control side asks a datapath thread.
enum Cmd {
    AddPort {
        spec: PortSpec,
        /// The AF_XDP socket, made by the caller (off the datapath thread).
        prepared: Option<Box<PreparedXsk>>,
        /// Which of the thread's shared UMEMs the socket is on (`None`:
        /// its own, or no socket).
        umem: Option<usize>,
        ofport: u32,
        stats: Arc<AtomicPortStats>,
        reply: Sender<Result<String, SwitchError>>,
    },
    DelPort {
        ofport: u32,
        reply: Sender<()>,
    },
    /// Every port number with a thread serving one of its queues (a port
    /// with several queues on several threads is listed once per queue).
    Topology(Vec<(u32, usize)>),
    Inject {
        in_port: u32,
        frame: Vec<u8>,
    },
    /// A closed port's socket is gone: its frames go back to the shared
    /// UMEM (the thread's `umem`-th).
    Reclaim {
        umem: usize,
        slot: u16,
    },
}

/// Engine-wide counters.
#[derive(Debug, Default)]
struct Counters {
    packet_in_dropped: AtomicU64,
    icmp_too_big: AtomicU64,
    rejects: AtomicU64,
    rejects_limited: AtomicU64,
    time_exceeded: AtomicU64,
    time_exceeded_limited: AtomicU64,
    time_exceeded_unanswered: AtomicU64,
    output_no_port: AtomicU64,
    cross_thread: AtomicU64,
    bad_frames: AtomicU64,
    tunnel_bad_checksums: AtomicU64,
    tunnel_tso_frames: AtomicU64,
    tunnel_gro_merged: AtomicU64,
}

/// What every thread and the control side share.
struct Shared {
    conntrack: Mutex<Conntrack>,
    stop: AtomicBool,
    packet_ins: Mutex<VecDeque<PacketIn>>,
    packet_in_max: usize,
    /// Learned flows on their way to the flow keeper.
    learns: Arc<LearnQueue>,
    spares: Mutex<Vec<Vec<u8>>>,
    counters: Counters,
    /// UMEM frames per AF_XDP port.
    umem_frames: u32,
    /// The largest frame a tunnel port merges received TCP segments into
    /// (see [`Switch::gro_max`]; 0: none).
    gro_max: AtomicUsize,
}

/// The part of a datapath thread others can reach.
struct ThreadShared {
    /// Written to wake the thread.
    waker: UnixDatagram,
    inbox: Mutex<Vec<Handoff>>,
    stats: Mutex<DatapathStats>,
    busy_ns: AtomicU64,
    /// What sockets on the thread's shared UMEMs are made from (set once
    /// the thread has made them; empty if it could not).
    umems: OnceLock<Vec<xsk_rs::Umem>>,
    /// Ports (queues) placed on each shared UMEM, counted when placed
    /// ([`ThreadShared::place`]), before the socket is made.
    umem_ports: Box<[AtomicUsize]>,
    /// The shared UMEMs' frames and free frames (published with the stats).
    umem_frames: AtomicU64,
    umem_free: AtomicU64,
    /// Whether every shared UMEM takes packets in several descriptors.
    umem_sg: AtomicBool,
    /// Whether the thread's last tunnel port segments large TCP frames.
    tunnel_tso: AtomicBool,
}

impl ThreadShared {
    fn wake(&self) {
        // A full buffer means a wakeup is already pending.
        let _ = self.waker.send(&[1]);
    }
}

/// A registered port (control side).
#[derive(Debug)]
struct PortEntry {
    name: String,
    kind: &'static str,
    mode: String,
    /// The interface (AF_XDP ports).
    ifname: Option<String>,
    /// What the interface can receive from the port side
    /// ([`crate::netdev::receive_mtu`]): read when the port is added (and
    /// on every port change where `rx_mtu_peer_here`), refreshed by
    /// [`Switch::refresh_gro_max`]; 0 when it could not be read. Unused
    /// for VXLAN ports.
    rx_mtu: u32,
    /// The interface is a veth whose peer is in this namespace too (the
    /// gateway): the peer's MTU counts, and the host may change it after
    /// the port is added (the agent raises its gateway's).
    rx_mtu_peer_here: bool,
    /// The tunnel's local address and UDP port (VXLAN ports).
    local: Option<String>,
    /// The receive queues it serves (one socket each; a VXLAN port has
    /// one), in queue order.
    queues: Vec<QueueEntry>,
}

/// One receive queue of a port: the thread serving it and its counters.
#[derive(Debug)]
struct QueueEntry {
    queue: u32,
    thread: usize,
    stats: Arc<AtomicPortStats>,
    /// Its place on one of the thread's shared UMEMs, held for its count
    /// (given up when the entry goes).
    place: Option<UmemPlace>,
}

impl ThreadShared {
    /// Places a new port's socket on the thread's shared UMEM with the
    /// fewest ports (the first of those); `None` when the thread has none.
    fn place(self: &Arc<Self>) -> Option<UmemPlace> {
        let n = self.umems.get()?.len();
        let umem = fewest(&self.umem_ports, n)?;
        self.umem_ports[umem].fetch_add(1, Ordering::Relaxed);
        Some(UmemPlace {
            thread: Arc::clone(self),
            umem,
        })
    }

    /// What a socket on the `umem`-th shared UMEM is made from.
    fn umem(&self, umem: usize) -> Option<&xsk_rs::Umem> {
        self.umems.get()?.get(umem)
    }
}

/// The first of the first `n` counters with the smallest count.
fn fewest(counts: &[AtomicUsize], n: usize) -> Option<usize> {
    counts
        .iter()
        .take(n)
        .enumerate()
        .min_by_key(|&(i, c)| (c.load(Ordering::Relaxed), i))
        .map(|(i, _)| i)
}

/// A port's socket counted on one of a thread's shared UMEMs
/// ([`ThreadShared::place`]); the count drops with it.
struct UmemPlace {
    thread: Arc<ThreadShared>,
    umem: usize,
}

impl std::fmt::Debug for UmemPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmemPlace")
            .field("umem", &self.umem)
            .finish()
    }
}

impl Drop for UmemPlace {
    fn drop(&mut self) {
        if let Some(c) = self.thread.umem_ports.get(self.umem) {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }
}

impl PortEntry {
    /// The thread of its first queue (where injected packets enter).
    fn thread(&self) -> usize {
        self.queues.first().map_or(0, |q| q.thread)
    }

    /// The threads serving it, each once.
    fn threads(&self) -> Vec<usize> {
        let mut t: Vec<usize> = self.queues.iter().map(|q| q.thread).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    fn info(&self, ofport: u32) -> PortInfo {
        let mut stats = PortStats::default();
        let mut queues = Vec::new();
        for q in &self.queues {
            let s = q.stats.get();
            stats += &s;
            if self.queues.len() > 1 {
                queues.push(QueueInfo {
                    queue: q.queue,
                    thread: q.thread,
                    stats: s,
                    umem: q.umem(),
                });
            }
        }
        PortInfo {
            name: self.name.clone(),
            ofport,
            kind: self.kind.into(),
            mode: self.mode.clone(),
            state: "up".into(),
            local: self.local.clone(),
            stats,
            queues,
            umem: self.queues.first().and_then(QueueEntry::umem),
        }
    }
}

impl QueueEntry {
    /// Its shared UMEM's index, where its thread has more than one.
    fn umem(&self) -> Option<u32> {
        let p = self.place.as_ref()?;
        (p.thread.umem_ports.len() > 1).then_some(p.umem as u32)
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(|e| e.to_string())?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| e.to_string())
}

/// Most receive queues one port serves (a socket each; on a physical
/// device each with its own UMEM).
pub const MAX_PORT_QUEUES: u32 = 64;

/// How many receive queues of `ifname` a port serves: `n_rxq`, else all
/// the interface has (at most [`MAX_PORT_QUEUES`], with a warning when
/// that leaves some out).
fn port_queues(ifname: &str, n_rxq: Option<u32>) -> Result<u32, String> {
    let have = crate::netdev::rx_queue_count(ifname)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0);
    match (n_rxq, have) {
        (Some(0), _) => Err("n_rxq must be at least 1".into()),
        (Some(n), _) if n > MAX_PORT_QUEUES => Err(format!(
            "n_rxq {n} is more than the {MAX_PORT_QUEUES} queues a port serves"
        )),
        (Some(n), Some(have)) if n > have => Err(format!(
            "n_rxq {n}: interface '{ifname}' has {have} receive queue{}",
            if have == 1 { "" } else { "s" }
        )),
        (Some(n), Some(have)) => {
            if n < have {
                tracing::warn!(
                    ifname,
                    n_rxq = n,
                    rx_queues = have,
                    "receive queues {n} to {} are not served: traffic the NIC steers there \
                     bypasses the switch (`ethtool -L {ifname} combined {n}`, or steer it away)",
                    have - 1
                );
            }
            Ok(n)
        }
        // The queue count is unknown (no sysfs): what was asked for.
        (Some(n), None) => Ok(n),
        (None, None) => Ok(1),
        (None, Some(have)) if have > MAX_PORT_QUEUES => {
            tracing::warn!(
                ifname,
                rx_queues = have,
                "only the first {MAX_PORT_QUEUES} receive queues are served: traffic the NIC \
                 steers to the others bypasses the switch (`ethtool -L {ifname} combined {MAX_PORT_QUEUES}`)"
            );
            Ok(MAX_PORT_QUEUES)
        }
        (None, Some(have)) => Ok(have),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running switch (shared by the control server; all methods take `&self`).
pub struct Switch {
    pipeline: Arc<Pipeline>,
    shared: Arc<Shared>,
    threads: Vec<Arc<ThreadShared>>,
    cmds: Vec<Mutex<Sender<Cmd>>>,
    joins: Mutex<Vec<JoinHandle<()>>>,
    ports: Mutex<BTreeMap<u32, PortEntry>>,
    /// The device anchoring the threads' shared UMEMs.
    anchor: Option<String>,
    /// The XDP program ports on virtual devices share.
    xdp_prog: Option<Arc<XdpProgram>>,
    /// [`SwitchConfig::complete_checksums`].
    config_complete_checksums: bool,
    /// The flow keeper thread ([`crate::learn`]).
    keeper: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Switch {
    /// Starts the datapath threads with no ports.
    pub fn start(config: SwitchConfig, pipeline: Arc<Pipeline>) -> Result<Switch, SwitchError> {
        let nthreads = config.threads.max(1);
        let batch = config.batch.clamp(1, 256);
        let shared = Arc::new(Shared {
            conntrack: Mutex::new(Conntrack::new(config.conntrack.clone())),
            stop: AtomicBool::new(false),
            packet_ins: Mutex::new(VecDeque::new()),
            packet_in_max: config.packet_in_queue,
            learns: Arc::new(LearnQueue::new(config.learn_queue)),
            spares: Mutex::new(Vec::new()),
            counters: Counters::default(),
            umem_frames: config.umem_frames,
            gro_max: AtomicUsize::new(0),
        });
        let mut threads = Vec::new();
        let mut wake_rx = Vec::new();
        for i in 0..nthreads {
            let (a, b) = UnixDatagram::pair()
                .map_err(|e| SwitchError::Other(format!("wakeup socket for thread {i}: {e}")))?;
            for s in [&a, &b] {
                s.set_nonblocking(true)
                    .map_err(|e| SwitchError::Other(format!("wakeup socket: {e}")))?;
            }
            threads.push(Arc::new(ThreadShared {
                waker: a,
                inbox: Mutex::new(Vec::new()),
                stats: Mutex::new(DatapathStats::default()),
                busy_ns: AtomicU64::new(0),
                umems: OnceLock::new(),
                umem_ports: (0..config.umems_per_thread.max(1))
                    .map(|_| AtomicUsize::new(0))
                    .collect(),
                umem_frames: AtomicU64::new(0),
                umem_free: AtomicU64::new(0),
                umem_sg: AtomicBool::new(false),
                tunnel_tso: AtomicBool::new(false),
            }));
            wake_rx.push(b);
        }
        // Made last before the switch exists, so every later failure goes
        // through `shutdown`, which deletes it.
        let anchor = match &config.umem_sharing {
            UmemSharing::PerThread { anchor } => {
                if anchor.starts_with("oxu") {
                    delete_stale_unique_anchors();
                }
                let queues = nthreads * config.umems_per_thread.max(1);
                match crate::netdev::create_quiet_device(anchor, queues as u32) {
                    Ok(kind) => {
                        tracing::debug!(anchor = %anchor, kind, "UMEM anchor device created");
                        Some(anchor.clone())
                    }
                    Err(e) => {
                        tracing::warn!(
                            anchor = %anchor,
                            "cannot create the UMEM anchor device; every port gets its own UMEM: {e}"
                        );
                        None
                    }
                }
            }
            UmemSharing::PerPort => None,
        };
        let xdp_prog = if config.shared_xdp_program {
            match XdpProgram::load() {
                Ok(p) => Some(Arc::new(p)),
                Err(e) => {
                    tracing::warn!(
                        "cannot load the switch's XDP program; libxdp loads one per port: {e}"
                    );
                    None
                }
            }
        } else {
            None
        };
        let sw = Switch {
            pipeline: Arc::clone(&pipeline),
            shared: Arc::clone(&shared),
            threads: threads.clone(),
            cmds: Vec::new(),
            joins: Mutex::new(Vec::new()),
            ports: Mutex::new(BTreeMap::new()),
            anchor: anchor.clone(),
            xdp_prog,
            config_complete_checksums: config.complete_checksums,
            keeper: Mutex::new(None),
        };
        let mut sw = sw;
        {
            let keeper = FlowKeeper::new(Arc::clone(&shared.learns), Arc::clone(&pipeline));
            let h = std::thread::Builder::new()
                .name("oxvs-flows".into())
                .spawn(move || keeper.run(monotonic_ns))
                .map_err(|e| SwitchError::Other(format!("cannot spawn the flow keeper: {e}")))?;
            *lock(&sw.keeper) = Some(h);
        }
        for (idx, wake) in wake_rx.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let (ready_tx, ready_rx) = mpsc::channel();
            let w = WorkerInit {
                idx,
                shared: Arc::clone(&shared),
                peers: threads.clone(),
                anchor: anchor.clone(),
                self_tx: tx.clone(),
                cmds: rx,
                wake,
                pipeline: Arc::clone(&pipeline),
                config: config.clone(),
                batch,
            };
            let h = std::thread::Builder::new()
                .name(format!("oxvs-dp{idx}"))
                .spawn(move || w.run(ready_tx))
                .map_err(|e| SwitchError::Other(format!("cannot spawn datapath thread: {e}")))?;
            lock(&sw.joins).push(h);
            sw.cmds.push(Mutex::new(tx));
            match ready_rx.recv_timeout(REPLY_TIMEOUT) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    sw.shutdown();
                    return Err(e);
                }
                Err(_) => {
                    sw.shutdown();
                    return Err(SwitchError::Other(format!(
                        "datapath thread {idx} did not start"
                    )));
                }
            }
        }
        tracing::info!(threads = nthreads, mode = ?config.poll_mode, batch, "switch started");
        Ok(sw)
    }

    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }

    /// The largest frame a pod port (a veth on the shared XDP program and
    /// a thread's shared UMEM) takes and sends whole:
    /// [`afxdp::MAX_FRAME_LEN`] when the program is frags-aware and every
    /// thread's UMEM is multi-buffer, else a 1500-byte MTU's frame (a veth
    /// with a program that is not frags-aware refuses an MTU much above
    /// 3.5k, so what one UMEM frame holds is not a safe promise). Pods and
    /// the gateway may have an MTU up to this less 14.
    pub fn max_frame_len(&self) -> usize {
        let frags = self.xdp_prog.as_ref().is_some_and(|p| p.frags());
        let sg = self.threads.iter().all(|t| {
            t.umems.get().is_some_and(|u| !u.is_empty()) && t.umem_sg.load(Ordering::Relaxed)
        });
        if frags && sg {
            afxdp::MAX_FRAME_LEN
        } else {
            1514
        }
    }

    /// Whether the tunnel port (if any) segments inner TCP frames larger
    /// than its inner MTU ([`SwitchConfig::tunnel_tso`]): pods may then
    /// send TCP to other nodes in frames as large as their MTU.
    pub fn tunnel_tso(&self) -> bool {
        let ports = lock(&self.ports);
        let tunnels: Vec<usize> = ports
            .values()
            .filter(|p| p.kind == "vxlan")
            .map(|p| p.thread())
            .collect();
        !tunnels.is_empty()
            && tunnels.iter().all(|&t| {
                self.threads
                    .get(t)
                    .is_some_and(|t| t.tunnel_tso.load(Ordering::Relaxed))
            })
    }

    fn send(&self, thread: usize, cmd: Cmd) -> Result<(), SwitchError> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(SwitchError::ShutDown);
        }
        let tx = self.cmds.get(thread).ok_or(SwitchError::ShutDown)?;
        lock(tx).send(cmd).map_err(|_| SwitchError::ShutDown)?;
        if let Some(t) = self.threads.get(thread) {
            t.wake();
        }
        Ok(())
    }

    /// The thread with the fewest port queues (a socket is prepared on
    /// its shared UMEM, so the choice is made before).
    fn least_loaded(&self, ports: &BTreeMap<u32, PortEntry>) -> usize {
        let mut load = vec![0usize; self.threads.len()];
        for q in ports.values().flat_map(|e| &e.queues) {
            if let Some(l) = load.get_mut(q.thread) {
                *l += 1;
            }
        }
        (0..load.len()).min_by_key(|&i| (load[i], i)).unwrap_or(0)
    }

    /// Received tunnel TCP is merged into frames every AF_XDP port takes
    /// (the smallest MTU + 14 of the ports' interfaces and, for a veth
    /// with its peer here such as the gateway, of that peer), and only
    /// when the engine completes checksums (merged frames need theirs
    /// computed). Pods of the agent's default MTU 65535 get 64 KiB frames;
    /// one port of MTU 1500 keeps every frame as received. Recomputed on
    /// every port change from the MTUs read when each port was added, the
    /// ports with a peer here read again (a link dump per change, under
    /// the port table's lock, made a burst of ADDs quadratic in the
    /// node's links), and from a fresh link dump by
    /// [`Switch::refresh_gro_max`] (switchd: every 5 s).
    fn set_gro_max(&self, ports: &mut BTreeMap<u32, PortEntry>) {
        for p in ports.values_mut().filter(|p| p.rx_mtu_peer_here) {
            if let Some(n) = &p.ifname {
                p.rx_mtu = crate::netdev::receive_mtu(n).map_or(0, |(m, _)| m);
            }
        }
        self.compute_gro_max(ports);
    }

    /// [`Switch::set_gro_max`] from the MTUs as they are in `ports`.
    fn compute_gro_max(&self, ports: &BTreeMap<u32, PortEntry>) {
        let min_mtu = ports
            .values()
            .filter(|p| p.ifname.is_some())
            .map(|p| p.rx_mtu)
            .min();
        let max = match min_mtu {
            // 0: a port whose MTU could not be read.
            Some(m) if m > 0 && self.config_complete_checksums => {
                (m as usize + 14).min(afxdp::MAX_FRAME_LEN)
            }
            _ => 0,
        };
        self.shared.gro_max.store(max, Ordering::Relaxed);
    }

    /// Rereads every port's receive MTU (one link dump, before taking the
    /// port table) and recomputes [`gro_max`](Self::gro_max): after an
    /// interface MTU changed outside a port change (switchd after raising
    /// its gateway's, and every 5 s).
    pub fn refresh_gro_max(&self) {
        let mtus = crate::netdev::receive_mtus().unwrap_or_default();
        let mut ports = lock(&self.ports);
        for p in ports.values_mut() {
            // A port added since the dump began keeps what its add read
            // (one whose interface is gone is being deleted).
            if let Some(m) = p.ifname.as_ref().and_then(|n| mtus.get(n)) {
                p.rx_mtu = *m;
            }
        }
        self.compute_gro_max(&ports);
    }

    /// The largest frame the tunnel port merges received TCP segments
    /// into (0: it does not merge).
    pub fn gro_max(&self) -> usize {
        self.shared.gro_max.load(Ordering::Relaxed)
    }

    fn broadcast_topology(&self, ports: &BTreeMap<u32, PortEntry>) {
        let topo: Vec<(u32, usize)> = ports
            .iter()
            .flat_map(|(o, e)| e.queues.iter().map(|q| (*o, q.thread)))
            .collect();
        for t in 0..self.cmds.len() {
            let _ = self.send(t, Cmd::Topology(topo.clone()));
        }
    }

    /// Adds a port at run time without disturbing the others.
    ///
    /// An AF_XDP port on an interface with several receive queues gets a
    /// socket per queue served (`n_rxq`, default all), spread over the
    /// datapath threads from the least loaded one on: each thread receives
    /// its queues and sends the port's frames on its own queue's socket
    /// (threads without one hand them over).
    pub fn add_port(&self, spec: PortSpec) -> Result<PortInfo, SwitchError> {
        if self.shared.stop.load(Ordering::Relaxed) {
            return Err(SwitchError::ShutDown);
        }
        if spec.name.is_empty() {
            return Err(SwitchError::PortOpen {
                name: spec.name,
                reason: "empty name".into(),
            });
        }
        let open_err = |reason: String| SwitchError::PortOpen {
            name: spec.name.clone(),
            reason,
        };
        // The slow part (UMEM, XDP program, sockets) on the caller's
        // thread, before taking the port table: datapath threads keep
        // forwarding and other callers keep adding ports meanwhile.
        let first = self.least_loaded(&lock(&self.ports));
        let nthreads = self.threads.len().max(1);
        let (prepared, queue_threads, rx_mtu, places) = match &spec.kind {
            PortKind::Afxdp {
                ifname,
                xdp_mode,
                n_rxq,
            } => {
                let ifname = ifname.as_deref().unwrap_or(&spec.name);
                let ports = lock(&self.ports);
                if ports.values().any(|p| p.name == spec.name) {
                    return Err(SwitchError::NameInUse(spec.name));
                }
                let taken = ports
                    .values()
                    .any(|p| p.mode != "udp-socket" && p.name == ifname);
                drop(ports);
                if taken {
                    return Err(open_err(format!("interface '{ifname}' is already a port")));
                }
                let n = port_queues(ifname, *n_rxq).map_err(open_err)?;
                let threads: Vec<usize> = (0..n as usize).map(|q| (first + q) % nthreads).collect();
                // Counted before the sockets are made, so that ports added
                // at the same time spread over the UMEMs too; given up
                // (dropped) on any failure.
                let mut places: Vec<Option<UmemPlace>> = threads
                    .iter()
                    .map(|&t| self.threads.get(t).and_then(|t| t.place()))
                    .collect();
                let targets: Vec<afxdp::QueueTarget<'_>> = places
                    .iter()
                    .enumerate()
                    .map(|(q, place)| afxdp::QueueTarget {
                        queue: q as u32,
                        shared: place.as_ref().and_then(|p| p.thread.umem(p.umem)),
                    })
                    .collect();
                let socks = XskPort::prepare_queues(
                    ifname,
                    *xdp_mode,
                    self.shared.umem_frames,
                    &targets,
                    self.xdp_prog.as_ref(),
                )
                .map_err(|e| open_err(e.to_string()))?;
                // 0 (no merging) until the next refresh if unreadable.
                let rx_mtu = crate::netdev::receive_mtu(ifname).unwrap_or_else(|e| {
                    tracing::warn!(port = %spec.name, "{e}; the tunnel merges no segments until it reads the MTU");
                    (0, false)
                });
                // A socket that fell back to its own UMEM takes no place.
                for (place, sock) in places.iter_mut().zip(&socks) {
                    if !sock.is_shared() {
                        *place = None;
                    }
                }
                (
                    socks.into_iter().map(|p| Some(Box::new(p))).collect(),
                    threads,
                    rx_mtu,
                    places,
                )
            }
            PortKind::Vxlan { .. } => (vec![None], vec![first], (0, false), vec![None]),
        };
        let mut ports = lock(&self.ports);
        if ports.values().any(|p| p.name == spec.name) {
            return Err(SwitchError::NameInUse(spec.name));
        }
        let ofport = match spec.ofport {
            Some(o) if o == 0 || o > OFPP_MAX => return Err(SwitchError::BadOfport(o)),
            Some(o) => {
                if let Some(e) = ports.get(&o) {
                    return Err(SwitchError::OfportInUse {
                        ofport: o,
                        name: e.name.clone(),
                    });
                }
                o
            }
            None => (1..=OFPP_MAX)
                .find(|o| !ports.contains_key(o))
                .ok_or_else(|| SwitchError::Other("no free port number".into()))?,
        };
        if let PortKind::Afxdp { ifname, .. } = &spec.kind {
            let ifname = ifname.as_deref().unwrap_or(&spec.name);
            if ports
                .values()
                .any(|p| p.mode != "udp-socket" && p.name == ifname)
            {
                return Err(open_err(format!("interface '{ifname}' is already a port")));
            }
        }
        let name = spec.name.clone();
        let (kind, ifname) = match &spec.kind {
            PortKind::Afxdp { ifname, .. } => (
                "afxdp",
                Some(ifname.clone().unwrap_or_else(|| spec.name.clone())),
            ),
            PortKind::Vxlan { .. } => ("vxlan", None),
        };
        let local = match &spec.kind {
            PortKind::Vxlan {
                local_ip, dst_port, ..
            } => Some(std::net::SocketAddr::new(*local_ip, dst_port.unwrap_or(4789)).to_string()),
            PortKind::Afxdp { .. } => None,
        };
        // Every queue to its thread, then every answer: all or none.
        let mut queues = Vec::with_capacity(prepared.len());
        let mut pending = Vec::with_capacity(prepared.len());
        let mut failure = None;
        for (((q, prepared), &thread), place) in prepared
            .into_iter()
            .enumerate()
            .zip(&queue_threads)
            .zip(places)
        {
            let stats = Arc::new(AtomicPortStats::default());
            let (reply_tx, reply_rx) = mpsc::channel();
            let sent = self.send(
                thread,
                Cmd::AddPort {
                    spec: spec.clone(),
                    prepared,
                    umem: place.as_ref().map(|p| p.umem),
                    ofport,
                    stats: Arc::clone(&stats),
                    reply: reply_tx,
                },
            );
            if let Err(e) = sent {
                failure = Some(e);
                break;
            }
            queues.push(QueueEntry {
                queue: q as u32,
                thread,
                stats,
                place,
            });
            pending.push((thread, reply_rx));
        }
        let mut mode = String::new();
        let mut opened = Vec::new();
        for (thread, reply) in pending {
            match reply.recv_timeout(REPLY_TIMEOUT) {
                Ok(Ok(m)) => {
                    mode = m;
                    opened.push(thread);
                }
                Ok(Err(e)) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure.get_or_insert(SwitchError::Other(format!(
                        "datapath thread {thread} did not answer"
                    )));
                }
            }
        }
        if let Some(e) = failure {
            // The queues opened so far are closed again (a thread that
            // did not answer closes its own once its reply goes unheard).
            opened.sort_unstable();
            opened.dedup();
            if let Err(c) = self.close_on(&opened, ofport) {
                tracing::warn!(port = %name, ofport, "closing the queues opened: {c}");
            }
            return Err(e);
        }
        let entry = PortEntry {
            name: name.clone(),
            kind,
            mode,
            ifname,
            rx_mtu: rx_mtu.0,
            rx_mtu_peer_here: rx_mtu.1,
            local,
            queues,
        };
        let info = entry.info(ofport);
        let threads = entry.threads();
        ports.insert(ofport, entry);
        self.broadcast_topology(&ports);
        self.set_gro_max(&mut ports);
        tracing::info!(port = %name, ofport, kind, mode = %info.mode, ?threads, queues = queue_threads.len(), "port added");
        Ok(info)
    }

    /// Has `threads` close their sockets of `ofport` and waits for them.
    fn close_on(&self, threads: &[usize], ofport: u32) -> Result<(), SwitchError> {
        let mut replies = Vec::with_capacity(threads.len());
        let mut sent = Ok(());
        for &thread in threads {
            let (reply_tx, reply_rx) = mpsc::channel();
            match self.send(
                thread,
                Cmd::DelPort {
                    ofport,
                    reply: reply_tx,
                },
            ) {
                Ok(()) => replies.push((thread, reply_rx)),
                Err(e) => sent = Err(e),
            }
        }
        for (thread, reply) in replies {
            reply.recv_timeout(REPLY_TIMEOUT).map_err(|_| {
                SwitchError::Other(format!("datapath thread {thread} did not answer"))
            })?;
        }
        sent
    }

    /// Removes a port (its XDP program is detached).
    pub fn del_port(&self, name: &str) -> Result<(), SwitchError> {
        let mut ports = lock(&self.ports);
        let (&ofport, entry) = ports
            .iter()
            .find(|(_, e)| e.name == name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.into()))?;
        let threads = entry.threads();
        ports.remove(&ofport);
        self.broadcast_topology(&ports);
        self.set_gro_max(&mut ports);
        self.close_on(&threads, ofport)?;
        tracing::info!(port = %name, ofport, "port removed");
        Ok(())
    }

    /// Every port with its counters, by ofport.
    pub fn ports(&self) -> Vec<PortInfo> {
        lock(&self.ports)
            .iter()
            .map(|(&ofport, e)| e.info(ofport))
            .collect()
    }

    /// Runs `f` with the connection tracker locked (dump, flush).
    pub fn with_conntrack<R>(&self, f: impl FnOnce(&mut Conntrack) -> R) -> R {
        f(&mut lock(&self.shared.conntrack))
    }

    pub fn stats(&self) -> SwitchStats {
        let mut s = SwitchStats {
            threads: self.threads.len(),
            ..SwitchStats::default()
        };
        for t in &self.threads {
            add_stats(&mut s.datapath, &lock(&t.stats));
            s.busy_ns += t.busy_ns.load(Ordering::Relaxed);
            s.umem_frames += t.umem_frames.load(Ordering::Relaxed);
            s.umem_free_frames += t.umem_free.load(Ordering::Relaxed);
        }
        let c = &self.shared.counters;
        let r = Ordering::Relaxed;
        s.packet_in_dropped = c.packet_in_dropped.load(r);
        s.icmp_too_big = c.icmp_too_big.load(r);
        s.rejects = c.rejects.load(r);
        s.rejects_limited = c.rejects_limited.load(r);
        s.time_exceeded = c.time_exceeded.load(r);
        s.time_exceeded_limited = c.time_exceeded_limited.load(r);
        s.time_exceeded_unanswered = c.time_exceeded_unanswered.load(r);
        s.output_no_port = c.output_no_port.load(r);
        s.cross_thread = c.cross_thread.load(r);
        s.bad_frames = c.bad_frames.load(r);
        s.tunnel_bad_checksums = c.tunnel_bad_checksums.load(r);
        s.tunnel_tso_frames = c.tunnel_tso_frames.load(r);
        s.tunnel_gro_merged = c.tunnel_gro_merged.load(r);
        s.learn = self.shared.learns.stats();
        s
    }

    /// Takes up to `max` queued packet-ins.
    pub fn take_packet_ins(&self, max: usize) -> Vec<PacketIn> {
        let mut q = lock(&self.shared.packet_ins);
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    /// Injects a frame as if it arrived on `in_port`: it goes through the
    /// pipeline and out for real.
    pub fn inject(&self, in_port: u32, frame: Vec<u8>) -> Result<(), SwitchError> {
        let thread = lock(&self.ports)
            .get(&in_port)
            .map(|e| e.thread())
            .ok_or(SwitchError::NoSuchOfport(in_port))?;
        self.send(thread, Cmd::Inject { in_port, frame })
    }

    /// Stops the threads, detaches XDP programs, removes ports.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.learns.stop();
        if let Some(k) = lock(&self.keeper).take() {
            if k.join().is_err() {
                tracing::error!("the flow keeper thread panicked");
            }
        }
        for t in &self.threads {
            t.wake();
        }
        let joins: Vec<_> = lock(&self.joins).drain(..).collect();
        for j in joins {
            if j.join().is_err() {
                tracing::error!("a datapath thread panicked");
            }
        }
        let mut ports = lock(&self.ports);
        if !ports.is_empty() {
            tracing::info!(ports = ports.len(), "switch stopped; ports removed");
        }
        ports.clear();
        drop(ports);
        if let Some(a) = &self.anchor {
            if let Err(e) = crate::netdev::delete_link(a) {
                tracing::debug!(anchor = %a, "cannot delete the UMEM anchor device: {e}");
            }
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn add_stats(a: &mut DatapathStats, b: &DatapathStats) {
    a.packets += b.packets;
    a.bytes += b.bytes;
    a.emc_hits += b.emc_hits;
    a.megaflow_hits += b.megaflow_hits;
    a.upcalls += b.upcalls;
    a.megaflow_inserts += b.megaflow_inserts;
    a.xlate_errors += b.xlate_errors;
    a.cache_flushes += b.cache_flushes;
    a.recirculations += b.recirculations;
    a.drops += b.drops;
    a.recirc_limit_drops += b.recirc_limit_drops;
    a.write_errors += b.write_errors;
    a.outputs += b.outputs;
    a.packet_ins += b.packet_ins;
    a.frags_held += b.frags_held;
    a.frag_drops += b.frag_drops;
    a.reassembled += b.reassembled;
    a.ct_refused_drops += b.ct_refused_drops;
    a.learns += b.learns;
    a.meter_drops += b.meter_drops;
}

// ---------------------------------------------------------------------------
// The datapath thread.

struct WorkerInit {
    idx: usize,
    shared: Arc<Shared>,
    peers: Vec<Arc<ThreadShared>>,
    /// The device whose queue `idx` anchors this thread's shared UMEM.
    anchor: Option<String>,
    /// This thread's own command channel (for port-close threads).
    self_tx: Sender<Cmd>,
    cmds: Receiver<Cmd>,
    wake: UnixDatagram,
    pipeline: Arc<Pipeline>,
    config: SwitchConfig,
    batch: usize,
}

#[allow(clippy::large_enum_variant)] // few ports; the AF_XDP one is the hot variant
enum PortIo {
    Xsk(XskPort),
    /// With its local IP (either family).
    Vxlan(Box<VxlanPort>, IpAddr),
    /// Taken out for the duration of its own batch (VXLAN).
    Busy,
}

struct LocalPort {
    ofport: u32,
    name: String,
    io: PortIo,
    stats: Arc<AtomicPortStats>,
    /// Its frames' TCP/UDP checksums may be partial (a kernel with TX
    /// offload on sent them): complete them on receive.
    complete_checksums: bool,
    /// Instead of completing them on receive, leave them to the outputs
    /// (`SwitchConfig::kernel_checksums`, `Sink::unfinished`).
    defer_checksums: bool,
}

#[derive(Clone, Copy, Debug)]
enum Route {
    Local(usize),
    Remote(usize),
}

/// Per-loop scratch of the sink, kept across batches (no allocation per packet).
#[derive(Default)]
struct SinkScratch {
    /// Cross-thread outputs, per destination thread.
    remote: Vec<Vec<Handoff>>,
    spares: Vec<Vec<u8>>,
    packet_ins: Vec<PacketIn>,
    /// Learned flows of the batch (moved to the learn queue after it).
    learns: Vec<Arc<Learned>>,
    /// The first bytes of the current packet as received (only on a
    /// thread that may answer it: what an ICMP "too big" or time exceeded
    /// answer needs, at most [`vxlan::TOO_BIG_HEAD`]), and its whole
    /// length.
    cur_frame: Vec<u8>,
    cur_len: usize,
    icmp_too_big: u64,
    rejects: u64,
    rejects_limited: u64,
    time_exceeded: u64,
    time_exceeded_limited: u64,
    time_exceeded_unanswered: u64,
    /// The thread's budget of answers to packet-ins (rejects and time
    /// exceeded together).
    answer_budget: crate::reject::RejectBudget,
    /// Answers to packets of a batch from a tunnel port, for that port:
    /// sent when the batch is done (the port lends its buffers to the
    /// batch meanwhile).
    tunnel_answers: Vec<(Vec<u8>, TunnelMeta)>,
    output_no_port: u64,
    cross_thread: u64,
    /// The AF_XDP batch being processed, for outputs that move its frames
    /// instead of copying them (`Sink::move_out`).
    rx: RxBatch,
    /// A frame whose checksum the switch completes on its way into a
    /// tunnel (`Sink::transmit_as`), reused.
    finished: Vec<u8>,
}

/// An AF_XDP RX batch as the sink sees it: which of its packets may leave
/// in the frames they arrived in, and which frames did.
#[derive(Debug, Default)]
struct RxBatch {
    /// The UMEM the batch's frames are in (`None` without
    /// `SwitchConfig::tx_move`, and outside an AF_XDP batch: tunnel
    /// batches, cross-thread outputs, injected packets).
    mem: Option<std::rc::Rc<UmemMem>>,
    /// The batch's descriptors as received (copies: the packets borrow
    /// the originals).
    descs: Vec<xsk_rs::FrameDesc>,
    /// The packets handed to the pipeline, in its order.
    packets: Vec<Movable>,
    /// Per descriptor: now on a port's TX ring (not to be recycled).
    moved: Vec<bool>,
    /// Index in `packets` of the packet being processed (advanced by
    /// `begin_packet`, from `usize::MAX`).
    cur: usize,
}

/// A received packet as the pipeline sees it: where its data starts and
/// how long it is (an output of exactly this is the packet unchanged in
/// place), and its descriptors in [`RxBatch::descs`].
#[derive(Clone, Copy, Debug)]
struct Movable {
    ptr: usize,
    len: usize,
    descs: (usize, usize),
}

struct Worker {
    idx: usize,
    shared: Arc<Shared>,
    /// The UMEMs this thread's ports share, each by a group of them
    /// (empty: each has its own).
    umems: Vec<ThreadUmem>,
    self_tx: Sender<Cmd>,
    me: Arc<ThreadShared>,
    peers: Vec<Arc<ThreadShared>>,
    cmds: Receiver<Cmd>,
    wake: UnixDatagram,
    config: SwitchConfig,
    batch: usize,
    ports: Vec<LocalPort>,
    routes: HashMap<u32, Route>,
    dp: Datapath,
    /// One RX batch's descriptors, with room to finish the packet the
    /// batch ends in ([`afxdp::MAX_CHAIN`]).
    rx_descs: Vec<xsk_rs::FrameDesc>,
    /// The packets of an RX batch (ranges of `rx_descs`).
    rx_packets: Vec<std::ops::Range<usize>>,
    /// Buffers a packet received in several descriptors is gathered into
    /// (one per such packet of a batch; grown on demand, at most a batch).
    jumbo: Vec<Box<[u8]>>,
    pollfds: Vec<libc::pollfd>,
    pollfds_dirty: bool,
    scratch: SinkScratch,
    /// Where this thread's IPv4 time exceeded answers come from
    /// ([`SwitchConfig::icmp_src_ip`], else its first IPv4 tunnel port's
    /// local IP; `0.0.0.0` with only IPv6 tunnel ports: it answers IPv6
    /// packets, from link-local addresses, and no IPv4 ones); `None`: it
    /// cannot answer, and keeps no packet heads for answers.
    answer_src4: Option<Ipv4Addr>,
    /// While a batch from a tunnel port is processed: that port's local
    /// IP (its answers go back into it, `SinkScratch::tunnel_answers`).
    rx_tunnel: Option<IpAddr>,
    bad_frames: u64,
    tunnel_bad_checksums: u64,
    busy_ns: u64,
}

impl WorkerInit {
    /// The thread's shared UMEMs ([`SwitchConfig::umems_per_thread`]),
    /// the `u`-th anchored on queue `idx * umems_per_thread + u` of the
    /// anchor device; as many as could be made (none: every port gets
    /// its own). Published in `me` for the control side.
    fn make_umems(&self, me: &ThreadShared) -> Vec<ThreadUmem> {
        let Some(anchor) = self.anchor.as_deref() else {
            let _ = me.umems.set(Vec::new());
            return Vec::new();
        };
        let tx_metadata =
            self.config.complete_checksums && self.config.kernel_checksums && !self.config.tx_move;
        let per = self.config.umems_per_thread.max(1);
        let mut umems = Vec::with_capacity(per);
        for u in 0..per {
            let queue = (self.idx * per + u) as u32;
            match ThreadUmem::new(anchor, queue, self.config.umem_frames, tx_metadata) {
                Ok(m) => umems.push(m),
                Err(e) => {
                    tracing::warn!(
                        thread = self.idx,
                        umem = u,
                        "cannot set up a shared UMEM of the thread; its ports go to the others \
                         (to their own UMEMs if none): {e}"
                    );
                    break;
                }
            }
        }
        let sg = !umems.is_empty() && umems.iter().all(|u| u.mem().multi_buffer());
        me.umem_sg.store(sg, Ordering::Relaxed);
        if let (true, Some(u)) = (tx_metadata, umems.first()) {
            match u.mem().tx_metadata() {
                true => tracing::info!(thread = self.idx, "the kernel finishes the checksums of pods' frames out of their ports (AF_XDP TX metadata)"),
                false => tracing::info!(thread = self.idx, "no AF_XDP TX metadata (Linux 6.11+): the switch completes the checksums of pods' frames"),
            }
        }
        let _ = me.umems.set(umems.iter().map(|u| u.handle()).collect());
        umems
    }

    fn run(self, ready: Sender<Result<(), SwitchError>>) {
        let nthreads = self.peers.len();
        let cpus = &self.config.datapath_cpus;
        if !cpus.is_empty() {
            let cpu = cpus[self.idx % cpus.len()];
            if let Err(e) = pin_to_cpu(cpu) {
                // switchd checks its list at start; this catches a
                // library caller's bad CPU, or one gone offline since.
                let _ = ready.send(Err(SwitchError::Other(format!(
                    "cannot pin datapath thread {} to CPU {cpu}: {e}",
                    self.idx
                ))));
                return;
            }
            tracing::info!(thread = self.idx, cpu, "datapath thread pinned");
        }
        let me = Arc::clone(&self.peers[self.idx]);
        let umems = self.make_umems(&me);
        tracing::debug!(
            thread = self.idx,
            umems = umems.len(),
            frames = self.config.umem_frames,
            "shared UMEMs"
        );
        let dp = Datapath::new(
            self.pipeline,
            XlateEnv::with_ports(Vec::new()),
            DatapathConfig::default(),
        );
        let mut w = Worker {
            idx: self.idx,
            shared: self.shared,
            umems,
            self_tx: self.self_tx,
            me,
            peers: self.peers,
            cmds: self.cmds,
            wake: self.wake,
            batch: self.batch,
            config: self.config,
            ports: Vec::new(),
            routes: HashMap::new(),
            dp,
            rx_descs: vec![xsk_rs::FrameDesc::default(); self.batch + afxdp::MAX_CHAIN],
            rx_packets: Vec::with_capacity(self.batch + afxdp::MAX_CHAIN),
            jumbo: Vec::new(),
            pollfds: Vec::new(),
            pollfds_dirty: true,
            scratch: SinkScratch {
                remote: (0..nthreads).map(|_| Vec::new()).collect(),
                ..SinkScratch::default()
            },
            answer_src4: None,
            rx_tunnel: None,
            bad_frames: 0,
            tunnel_bad_checksums: 0,
            busy_ns: 0,
        };
        let _ = ready.send(Ok(()));
        w.run();
        // Drop order: sockets (XDP programs detached), then the UMEMs.
        let n = w.ports.len();
        w.ports.clear();
        w.umems.clear();
        tracing::debug!(thread = w.idx, ports = n, "datapath thread stopped");
    }
}

impl Worker {
    fn run(&mut self) {
        let mut last_publish = Instant::now();
        let linger = self.config.poll_linger;
        let mut last_work = Instant::now();
        while !self.shared.stop.load(Ordering::Acquire) {
            self.commands();
            let t0 = Instant::now();
            let mut work = self.drain_inbox();
            let now_ns = monotonic_ns();
            for i in 0..self.ports.len() {
                work += self.rx_port(i, now_ns);
            }
            self.flush_all();
            if work > 0 {
                self.busy_ns += t0.elapsed().as_nanos() as u64;
            }
            let due = last_publish.elapsed() > Duration::from_millis(50);
            if work > 0 || due {
                self.publish(due);
                if due {
                    last_publish = Instant::now();
                }
            }
            if work > 0 {
                if !linger.is_zero() {
                    last_work = Instant::now();
                }
            } else if !linger.is_zero() && last_work.elapsed() < linger {
                // Adaptive polling: spin a while after work (as busy mode
                // does), then sleep.
                self.spin_once();
            } else {
                self.idle();
            }
        }
        self.publish(true);
    }

    /// One idle round of busy polling: kick the fill rings that ask for it.
    fn spin_once(&mut self) {
        for p in &mut self.ports {
            if let PortIo::Xsk(x) = &mut p.io {
                if x.fill_needs_wakeup() {
                    x.wake_fill();
                }
            }
        }
        std::hint::spin_loop();
    }

    fn idle(&mut self) {
        match self.config.poll_mode {
            PollMode::Busy => self.spin_once(),
            PollMode::Interrupt => {
                if self.pollfds_dirty {
                    self.pollfds.clear();
                    let mut fds: Vec<RawFd> = vec![self.wake.as_raw_fd()];
                    for p in &self.ports {
                        match &p.io {
                            PortIo::Xsk(x) => fds.push(x.fd()),
                            PortIo::Vxlan(v, _) => fds.push(v.fd()),
                            PortIo::Busy => {}
                        }
                    }
                    self.pollfds.extend(fds.into_iter().map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                    self.pollfds_dirty = false;
                }
                if let Err(e) = afxdp::poll_readable(&mut self.pollfds, POLL_TIMEOUT_MS) {
                    tracing::warn!(thread = self.idx, error = %e, "poll failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                let mut b = [0u8; 64];
                while self.wake.recv(&mut b).is_ok() {}
            }
        }
    }

    fn commands(&mut self) {
        while let Ok(cmd) = self.cmds.try_recv() {
            match cmd {
                Cmd::AddPort {
                    spec,
                    prepared,
                    umem,
                    ofport,
                    stats,
                    reply,
                } => {
                    let r = self.open_port(spec, prepared, umem, ofport, stats);
                    let opened = r.is_ok();
                    if reply.send(r).is_err() && opened {
                        // The control side gave up waiting (it reported a
                        // failure): do not keep a port nobody registered.
                        self.close_port(ofport);
                    }
                }
                Cmd::DelPort { ofport, reply } => self.close_port_then(ofport, Some(reply)),
                Cmd::Topology(t) => self.set_topology(&t),
                Cmd::Inject { in_port, frame } => self.inject(in_port, &frame),
                Cmd::Reclaim { umem, slot } => self.reclaim(umem, slot),
            }
        }
    }

    fn open_port(
        &mut self,
        spec: PortSpec,
        prepared: Option<Box<PreparedXsk>>,
        umem: Option<usize>,
        ofport: u32,
        stats: Arc<AtomicPortStats>,
    ) -> Result<String, SwitchError> {
        let err = |reason: String| SwitchError::PortOpen {
            name: spec.name.clone(),
            reason,
        };
        let mut complete_checksums = self.config.complete_checksums;
        let io = match &spec.kind {
            PortKind::Afxdp {
                ifname, xdp_mode, ..
            } => {
                let ifname = ifname.as_deref().unwrap_or(&spec.name);
                let x = match prepared {
                    Some(p) => XskPort::from_prepared(
                        *p,
                        self.batch,
                        umem.and_then(|i| self.umems.get(i)).map(|u| u.mem()),
                    ),
                    None => XskPort::open(ifname, *xdp_mode, self.config.umem_frames, self.batch),
                }
                .map_err(|e| err(e.to_string()))?;
                if x.filled() == 0 {
                    let usage = x.mem().usage();
                    tracing::warn!(
                        port = %spec.name,
                        thread = self.idx,
                        ports = usage.ports,
                        frames = usage.frames,
                        free = usage.free,
                        "the UMEM has no frame to spare for this port's fill ring: it receives \
                         nothing until other ports give frames back; raise --umem-frames or --threads"
                    );
                }
                complete_checksums =
                    self.config.complete_checksums && !crate::netdev::is_physical(ifname);
                PortIo::Xsk(x)
            }
            PortKind::Vxlan {
                local_ip,
                dst_port,
                underlay_mtu,
            } => {
                let mut v = VxlanPort::open(*local_ip, dst_port.unwrap_or(4789), *underlay_mtu)
                    .map_err(|e| err(e.to_string()))?;
                if self.config.tunnel_tso {
                    if let Err(e) = v.enable_tso() {
                        tracing::warn!(
                            port = %spec.name,
                            "cannot open the tunnel's segmentation sockets; large TCP frames \
                             get \"fragmentation needed\": {e}"
                        );
                    }
                }
                self.me.tunnel_tso.store(v.tso(), Ordering::Relaxed);
                PortIo::Vxlan(Box::new(v), *local_ip)
            }
        };
        let mode = match &io {
            PortIo::Xsk(x) => x.mode().name().to_string(),
            PortIo::Vxlan(v, _) => v.mode().to_string(),
            PortIo::Busy => String::new(),
        };
        // Only where the kernel can finish them on the way out (elsewhere
        // a sum per output would replace one per packet).
        let defer_checksums = complete_checksums
            && matches!(&io, PortIo::Xsk(x) if x.mem().tx_metadata())
            && self.config.kernel_checksums
            && !self.config.tx_move;
        self.ports.push(LocalPort {
            ofport,
            name: spec.name,
            io,
            stats,
            complete_checksums,
            defer_checksums,
        });
        self.ports_changed();
        // Until the topology broadcast arrives, route to it locally.
        self.routes
            .insert(ofport, Route::Local(self.ports.len() - 1));
        Ok(mode)
    }

    fn close_port(&mut self, ofport: u32) {
        self.close_port_then(ofport, None);
    }

    /// Removes the port (every queue of it this thread serves); `done` is
    /// told once its sockets are closed (XDP program detached, UMEM
    /// unmapped), so the interface can be bound again.
    fn close_port_then(&mut self, ofport: u32, done: Option<Sender<()>>) {
        let mut closing = Vec::new();
        while let Some(i) = self.ports.iter().position(|p| p.ofport == ofport) {
            let mut p = self.ports.remove(i);
            self.publish_port(&mut p, true);
            tracing::debug!(port = %p.name, ofport, "port closed");
            if let PortIo::Xsk(x) = std::mem::replace(&mut p.io, PortIo::Busy) {
                let umem = self.umems.iter().position(|u| x.uses(u.mem()));
                closing.push((umem, x.into_closing()));
            }
        }
        self.routes.remove(&ofport);
        self.ports_changed();
        if closing.is_empty() {
            if let Some(d) = done {
                let _ = d.send(());
            }
            return;
        }
        // Dropping a socket deletes it (the XDP program is detached with
        // the interface's last) and unmaps an own UMEM: tens of
        // milliseconds, done on a short-lived thread so this one keeps
        // forwarding.
        let slots: Vec<(usize, u16)> = closing
            .iter()
            .filter_map(|(umem, c)| Some(((*umem)?, c.reclaim_slot()?)))
            .collect();
        let tx = self.self_tx.clone();
        let me = Arc::clone(&self.me);
        // `done` goes into the closure: if the thread cannot start, the
        // closure (sockets and reply) is dropped right here, which closes
        // the sockets and tells the waiting side (its reply channel hangs
        // up) -- then the frames are reclaimed here.
        let spawned = std::thread::Builder::new()
            .name("oxvs-port-close".into())
            .spawn({
                let slots = slots.clone();
                move || {
                    drop(closing);
                    for (umem, slot) in slots {
                        if tx.send(Cmd::Reclaim { umem, slot }).is_ok() {
                            me.wake();
                        }
                    }
                    if let Some(d) = done {
                        let _ = d.send(());
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(
                ofport,
                "cannot close the sockets off the datapath thread: {e}"
            );
            for (umem, slot) in slots {
                self.reclaim(umem, slot);
            }
        }
    }

    /// Takes back the frames of a closed port's socket (see
    /// [`Cmd::Reclaim`]).
    fn reclaim(&mut self, umem: usize, slot: u16) {
        if let Some(u) = self.umems.get(umem) {
            let n = u.mem().reclaim(slot);
            tracing::debug!(
                thread = self.idx,
                umem,
                slot,
                frames = n,
                "frames of a closed port reclaimed"
            );
        }
    }

    fn ports_changed(&mut self) {
        self.pollfds_dirty = true;
        let tunnel_ip4 = self.ports.iter().find_map(|p| match p.io {
            PortIo::Vxlan(_, IpAddr::V4(ip)) => Some(ip),
            _ => None,
        });
        let tunnel = self.ports.iter().any(|p| matches!(p.io, PortIo::Vxlan(..)));
        self.answer_src4 = self
            .config
            .icmp_src_ip
            .or(tunnel_ip4)
            .or(tunnel.then_some(Ipv4Addr::UNSPECIFIED));
        // Local indexes moved: rebuild local routes.
        let local: Vec<(u32, usize)> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| (p.ofport, i))
            .collect();
        self.routes.retain(|_, r| matches!(r, Route::Remote(_)));
        for (o, i) in local {
            self.routes.insert(o, Route::Local(i));
        }
    }

    fn set_topology(&mut self, topo: &[(u32, usize)]) {
        self.routes.clear();
        // A port served by several threads: this thread hands its frames
        // to one of them, threads picking different ones (a thread
        // serving a queue of it sends on that queue: `ports_changed`).
        let mut serving: HashMap<u32, Vec<usize>> = HashMap::new();
        for &(ofport, thread) in topo {
            serving.entry(ofport).or_default().push(thread);
        }
        for (ofport, mut threads) in serving {
            threads.sort_unstable();
            threads.dedup();
            threads.retain(|&t| t != self.idx);
            if let Some(&t) = threads.get(self.idx % threads.len().max(1)) {
                self.routes.insert(ofport, Route::Remote(t));
            }
        }
        self.ports_changed();
        let mut all: Vec<u32> = topo.iter().map(|(o, _)| *o).collect();
        all.sort_unstable();
        all.dedup();
        if self.dp.env().ports != all {
            self.dp.set_env(XlateEnv::with_ports(all));
        }
    }

    fn inject(&mut self, in_port: u32, frame: &[u8]) {
        let mut pkts = [DpPacket::from_frame(frame, in_port)];
        let now_ns = monotonic_ns();
        self.process(&mut pkts, now_ns);
    }

    /// Runs `pkts` through the datapath with this thread's sink.
    fn process<B: AsRef<[u8]> + AsMut<[u8]>>(&mut self, pkts: &mut [DpPacket<B>], now_ns: u64) {
        let Worker {
            ports,
            routes,
            dp,
            scratch,
            shared,
            config,
            answer_src4,
            rx_tunnel,
            ..
        } = self;
        let mut sink = Sink::new(ports, routes, scratch, *answer_src4, config, now_ns);
        sink.rx_tunnel = *rx_tunnel;
        run_batch(dp, shared, pkts, now_ns, &mut sink);
    }

    /// Receives and processes one batch from port `i`; returns its size.
    fn rx_port(&mut self, i: usize, now_ns: u64) -> usize {
        let batch = self.batch;
        let in_port = self.ports[i].ofport;
        let complete_checksums = self.ports[i].complete_checksums;
        let defer_checksums = self.ports[i].defer_checksums;
        match &mut self.ports[i].io {
            PortIo::Xsk(x) => {
                let n = x.recv(&mut self.rx_descs[..batch + afxdp::MAX_CHAIN]);
                if n == 0 {
                    // A zero-copy driver that found the fill ring empty waits
                    // for a kick; `idle()` kicks only when the whole thread
                    // is idle, so kick here (a syscall only when asked for).
                    if x.mode().zero_copy && x.fill_needs_wakeup() {
                        x.wake_fill();
                    }
                    return 0;
                }
                let mem = x.mem();
                x.packets(&self.rx_descs[..n], &mut self.rx_packets);
                let rx = &mut self.scratch.rx;
                rx.cur = usize::MAX;
                if self.config.tx_move {
                    rx.descs.clear();
                    rx.descs.extend_from_slice(&self.rx_descs[..n]);
                    rx.moved.clear();
                    rx.moved.resize(n, false);
                    rx.packets.clear();
                    rx.mem = Some(std::rc::Rc::clone(&mem));
                }
                let multi = self.rx_packets.iter().filter(|r| r.len() > 1).count();
                while self.jumbo.len() < multi {
                    // At most a batch's worth, once (pages are touched only
                    // when used).
                    self.jumbo
                        .push(vec![0u8; JUMBO_HEADROOM + afxdp::MAX_FRAME_LEN].into_boxed_slice());
                }
                {
                    let Worker {
                        ports,
                        routes,
                        dp,
                        scratch,
                        shared,
                        config,
                        answer_src4,
                        rx_descs,
                        rx_packets,
                        jumbo,
                        bad_frames,
                        ..
                    } = self;
                    // One allocation per batch (the packets borrow the frames).
                    let mut pkts: Vec<DpPacket<&mut [u8]>> = Vec::with_capacity(rx_packets.len());
                    let mut descs = rx_descs[..n].iter_mut();
                    let mut jumbo = jumbo.iter_mut();
                    let mut at = 0;
                    for r in rx_packets.iter() {
                        // Skip the descriptors of dropped packets.
                        let skip = r.start - at;
                        at = r.end;
                        let p = if r.len() == 1 {
                            descs.nth(skip).and_then(|d| mem.packet(d))
                        } else {
                            let mut parts = descs.by_ref().skip(skip).take(r.len());
                            match jumbo.next() {
                                Some(buf) => gather(&mem, parts, buf),
                                None => {
                                    parts.by_ref().for_each(drop);
                                    None
                                }
                            }
                        };
                        match p {
                            Some(mut p) => {
                                // A tagged frame is completed now: a flow
                                // pushing more tags would leave it beyond
                                // what the outputs parse (two).
                                if complete_checksums && (!defer_checksums || vlan_tagged(p.data()))
                                {
                                    checksum::complete_l4(p.data_mut());
                                }
                                if scratch.rx.mem.is_some() {
                                    scratch.rx.packets.push(Movable {
                                        ptr: p.data().as_ptr() as usize,
                                        len: p.len(),
                                        descs: (r.start, r.end),
                                    });
                                }
                                pkts.push(DpPacket {
                                    packet: p,
                                    in_port,
                                    tunnel: None,
                                })
                            }
                            None => *bad_frames += 1,
                        }
                    }
                    let mut sink = Sink::new(ports, routes, scratch, *answer_src4, config, now_ns);
                    sink.unfinished = complete_checksums && defer_checksums;
                    run_batch(dp, shared, &mut pkts, now_ns, &mut sink);
                }
                // Frames that left on a port's TX ring are not the fill
                // ring's any more.
                let rx = &mut self.scratch.rx;
                rx.packets.clear();
                let mut keep = n;
                if rx.mem.take().is_some() && rx.moved.iter().any(|&m| m) {
                    keep = 0;
                    for (j, &moved) in rx.moved.iter().enumerate() {
                        if !moved {
                            self.rx_descs.swap(keep, j);
                            keep += 1;
                        }
                    }
                }
                if let PortIo::Xsk(x) = &mut self.ports[i].io {
                    x.recycle(&self.rx_descs[..keep]);
                }
                n
            }
            PortIo::Vxlan(..) => {
                let PortIo::Vxlan(mut v, ip) =
                    std::mem::replace(&mut self.ports[i].io, PortIo::Busy)
                else {
                    return 0;
                };
                v.set_gro_max(self.shared.gro_max.load(Ordering::Relaxed));
                let n = v.recv_batch(batch);
                if n > 0 {
                    let mut pkts: Vec<DpPacket<&mut [u8]>> = Vec::with_capacity(n);
                    for (buf, meta, verified) in v.rx_packets() {
                        let len = buf.len();
                        // From a wire: a checksum that fails is corruption,
                        // dropped, not corrected.
                        if complete_checksums
                            && !verified
                            && checksum::verify_or_complete_l4(buf) == checksum::Completion::Bad
                        {
                            self.tunnel_bad_checksums += 1;
                            continue;
                        }
                        if let Some(p) = PacketRef::new(buf, 0, len) {
                            pkts.push(DpPacket {
                                packet: p,
                                in_port,
                                tunnel: Some(meta),
                            });
                        }
                    }
                    self.rx_tunnel = Some(ip);
                    self.process(&mut pkts, now_ns);
                    self.rx_tunnel = None;
                }
                // Answers to the batch's packets, back into the tunnel (a
                // refused send is counted by the port).
                for (answer, meta) in self.scratch.tunnel_answers.drain(..) {
                    let _ = v.send(&answer, meta);
                }
                self.ports[i].io = PortIo::Vxlan(v, ip);
                n
            }
            PortIo::Busy => 0,
        }
    }

    /// Cross-thread outputs addressed to this thread.
    fn drain_inbox(&mut self) -> usize {
        let items: Vec<Handoff> = std::mem::take(&mut *lock(&self.me.inbox));
        if items.is_empty() {
            return 0;
        }
        let n = items.len();
        let mut bufs = Vec::with_capacity(n);
        for h in items {
            match self.routes.get(&h.ofport) {
                Some(Route::Local(j)) => {
                    if let Some(p) = self.ports.get_mut(*j) {
                        match &mut p.io {
                            PortIo::Xsk(x) => x.send(&h.buf),
                            PortIo::Vxlan(v, _) => {
                                let _ = v.send(&h.buf, h.tunnel.unwrap_or_default());
                            }
                            PortIo::Busy => {}
                        }
                    }
                }
                _ => self.scratch.output_no_port += 1,
            }
            bufs.push(h.buf);
        }
        let mut spares = lock(&self.shared.spares);
        for mut b in bufs {
            if spares.len() < MAX_SPARES {
                b.clear();
                spares.push(b);
            }
        }
        n
    }

    fn flush_all(&mut self) {
        for p in &mut self.ports {
            match &mut p.io {
                PortIo::Xsk(x) => x.flush(),
                PortIo::Vxlan(v, _) => {
                    v.flush();
                }
                PortIo::Busy => {}
            }
        }
        // Cross-thread handoffs: one lock and one wakeup per destination.
        for (t, out) in self.scratch.remote.iter_mut().enumerate() {
            if out.is_empty() {
                continue;
            }
            if let Some(peer) = self.peers.get(t) {
                lock(&peer.inbox).append(out);
                peer.wake();
            }
            out.clear();
        }
        // Recycled cross-thread buffers: one lock per refill, not per packet.
        if self.peers.len() > 1 && self.scratch.spares.len() < 64 {
            let mut spares = lock(&self.shared.spares);
            let take = spares.len().min(256);
            let at = spares.len() - take;
            self.scratch.spares.extend(spares.drain(at..));
        }
        // Learned flows: one lock per loop that learned anything.
        self.shared.learns.push_batch(&mut self.scratch.learns);
        if !self.scratch.packet_ins.is_empty() {
            let mut q = lock(&self.shared.packet_ins);
            for p in self.scratch.packet_ins.drain(..) {
                if q.len() >= self.shared.packet_in_max {
                    self.shared
                        .counters
                        .packet_in_dropped
                        .fetch_add(1, Ordering::Relaxed);
                } else {
                    q.push_back(p);
                }
            }
        }
    }

    fn publish_port(&mut self, p: &mut LocalPort, kernel: bool) {
        match &mut p.io {
            PortIo::Xsk(x) => {
                p.stats.add(&x.take_counters(kernel));
                if kernel {
                    p.stats.set_fill(x.filled(), x.fill_target());
                }
            }
            PortIo::Vxlan(v, _) => {
                p.stats.store(&v.stats());
                let (merged, cut) = v.take_offload_counters();
                let c = &self.shared.counters;
                if merged > 0 {
                    c.tunnel_gro_merged.fetch_add(merged, Ordering::Relaxed);
                }
                if cut > 0 {
                    c.tunnel_tso_frames.fetch_add(cut, Ordering::Relaxed);
                }
            }
            PortIo::Busy => {}
        }
    }

    /// Publishes counters (once per loop with work, else every 50 ms);
    /// `kernel`: also read the kernel's per-socket drop counters (a
    /// syscall per port, so at most every 50 ms).
    fn publish(&mut self, kernel: bool) {
        let mut ports = std::mem::take(&mut self.ports);
        for p in &mut ports {
            self.publish_port(p, kernel);
        }
        self.ports = ports;
        *lock(&self.me.stats) = self.dp.stats();
        self.me.busy_ns.store(self.busy_ns, Ordering::Relaxed);
        // Read by the control side only: every publish with the kernel
        // counters (~50 ms) is fresh enough.
        if kernel && !self.umems.is_empty() {
            let (frames, free) = self.umems.iter().fold((0, 0), |(n, f), u| {
                let usage = u.mem().usage();
                (n + usage.frames as u64, f + usage.free as u64)
            });
            self.me.umem_frames.store(frames, Ordering::Relaxed);
            self.me.umem_free.store(free, Ordering::Relaxed);
        }
        let c = &self.shared.counters;
        let r = Ordering::Relaxed;
        let s = &mut self.scratch;
        c.icmp_too_big
            .fetch_add(std::mem::take(&mut s.icmp_too_big), r);
        c.rejects.fetch_add(std::mem::take(&mut s.rejects), r);
        c.rejects_limited
            .fetch_add(std::mem::take(&mut s.rejects_limited), r);
        c.time_exceeded
            .fetch_add(std::mem::take(&mut s.time_exceeded), r);
        c.time_exceeded_limited
            .fetch_add(std::mem::take(&mut s.time_exceeded_limited), r);
        c.time_exceeded_unanswered
            .fetch_add(std::mem::take(&mut s.time_exceeded_unanswered), r);
        c.output_no_port
            .fetch_add(std::mem::take(&mut s.output_no_port), r);
        c.cross_thread
            .fetch_add(std::mem::take(&mut s.cross_thread), r);
        c.bad_frames
            .fetch_add(std::mem::take(&mut self.bad_frames), r);
        c.tunnel_bad_checksums
            .fetch_add(std::mem::take(&mut self.tunnel_bad_checksums), r);
    }
}

/// Where a batch's outputs go: copied once into the output port's TX frames.
struct Sink<'a> {
    ports: &'a mut [LocalPort],
    routes: &'a HashMap<u32, Route>,
    scratch: &'a mut SinkScratch,
    /// Whether to remember the current packet (for ICMP too-big and time
    /// exceeded answers): the thread can answer.
    keep_frame: bool,
    cur_in_port: u32,
    icmp_src: Option<Ipv4Addr>,
    /// Source of IPv4 time exceeded answers (see `Worker::answer_src4`).
    answer_src4: Option<Ipv4Addr>,
    /// The batch is from a tunnel port with this local IP (see
    /// `Worker::rx_tunnel`).
    rx_tunnel: Option<IpAddr>,
    /// The batch's time (the reject rate limit's clock).
    now_ns: u64,
    /// The batch's TCP/UDP checksums may be partial (from a port that
    /// leaves them to the outputs, `LocalPort::defer_checksums`): every
    /// output finishes them ([`Sink::transmit`]).
    unfinished: bool,
}

impl<'a> Sink<'a> {
    fn new(
        ports: &'a mut [LocalPort],
        routes: &'a HashMap<u32, Route>,
        scratch: &'a mut SinkScratch,
        answer_src4: Option<Ipv4Addr>,
        config: &SwitchConfig,
        now_ns: u64,
    ) -> Sink<'a> {
        Sink {
            ports,
            routes,
            scratch,
            // A thread with a tunnel port has its address: every thread
            // that may answer (too big, time exceeded) has one.
            keep_frame: answer_src4.is_some(),
            cur_in_port: 0,
            icmp_src: config.icmp_src_ip,
            answer_src4,
            rx_tunnel: None,
            now_ns,
            unfinished: false,
        }
    }
}

/// Whether every byte the pipeline may have rewritten in `frame` lies in
/// its first `first` bytes (a gathered packet's first frame): Ethernet and
/// VLAN headers, an IPv4 header with options, or an IPv6 header followed
/// directly by TCP, UDP or ICMPv6 (no extension header), the L4 header,
/// and the headers an ICMP error quotes, well within [`HEAD_REWRITTEN`]
/// bytes. Anything else is copied.
fn head_in_first(frame: &[u8], first: usize) -> bool {
    if first < HEAD_REWRITTEN {
        return false;
    }
    let Some(l2) = oxvs_pipeline::wire::ethernet::l2_of(frame) else {
        return false;
    };
    match l2.ethertype {
        oxvs_pipeline::wire::ethertype::IPV4 => true,
        oxvs_pipeline::wire::ethertype::IPV6 => {
            use oxvs_pipeline::wire::ip_proto;
            matches!(
                l2.payload.get(6).copied(),
                Some(ip_proto::TCP | ip_proto::UDP | ip_proto::ICMPV6)
            )
        }
        _ => false,
    }
}

/// Bytes from a frame's start that hold every header the pipeline
/// rewrites (Ethernet + two VLAN tags 22, IPv4 with options 60, TCP with
/// options 60, and an ICMP error's 8 + quoted IPv4 60 + L4 8: 218).
const HEAD_REWRITTEN: usize = 512;

/// Bytes in front of a gathered packet (see [`gather`]), so headers can be
/// pushed in place as in a UMEM frame.
const JUMBO_HEADROOM: usize = 256;

/// Copies the parts of a packet received in several descriptors into
/// `buf`, as one packet; `None` (and the packet is dropped) if a part is
/// not a frame of `mem` or the whole does not fit.
fn gather<'a, 'd>(
    mem: &UmemMem,
    parts: impl Iterator<Item = &'d mut xsk_rs::FrameDesc>,
    buf: &'a mut [u8],
) -> Option<PacketRef<'a>> {
    let mut len = 0;
    let mut whole = true;
    // Every part is taken from `parts`, even after a failure: the caller's
    // iterator must end up past this packet.
    for d in parts {
        let dst = mem.packet(d).and_then(|p| {
            let part = p.data();
            let dst = buf.get_mut(JUMBO_HEADROOM + len..JUMBO_HEADROOM + len + part.len())?;
            dst.copy_from_slice(part);
            Some(part.len())
        });
        match dst {
            Some(n) => len += n,
            None => whole = false,
        }
    }
    if !whole {
        return None;
    }
    PacketRef::new(buf, JUMBO_HEADROOM, len)
}

/// One batch through the datapath, the conntrack lock held for the batch.
fn run_batch<B: AsRef<[u8]> + AsMut<[u8]>>(
    dp: &mut Datapath,
    shared: &Shared,
    pkts: &mut [DpPacket<B>],
    now_ns: u64,
    sink: &mut Sink<'_>,
) {
    let mut ct = lock(&shared.conntrack);
    dp.process_batch(pkts, &mut ct, now_ns, sink);
}

impl Sink<'_> {
    /// Sends the current packet's last output by moving the frames it
    /// arrived in to `port`'s TX ring, no copy: when `frame` is the
    /// received packet itself (same start and length: rewritten in place
    /// at most) and `port` is a local AF_XDP port on the same UMEM. A
    /// packet that arrived in several frames was gathered into a buffer of
    /// the thread's: its first frame takes the buffer's head back (every
    /// header the pipeline may have rewritten lies there, see
    /// [`head_in_first`]), the payload frames go as they came. False if it
    /// cannot (then it is copied as any output).
    #[inline]
    fn move_out(&mut self, port: u32, frame: &[u8]) -> bool {
        let rx = &mut self.scratch.rx;
        let Some(m) = rx.packets.get(rx.cur).copied() else {
            return false;
        };
        if m.ptr != frame.as_ptr() as usize || m.len != frame.len() {
            return false;
        }
        let (Some(mem), Some(Route::Local(j))) = (&rx.mem, self.routes.get(&port)) else {
            return false;
        };
        let Some(LocalPort {
            io: PortIo::Xsk(x), ..
        }) = self.ports.get_mut(*j)
        else {
            return false;
        };
        let (start, end) = m.descs;
        let (Some(descs), Some(moved)) = (rx.descs.get(start..end), rx.moved.get_mut(start..end))
        else {
            return false;
        };
        if !x.uses(mem) || moved.iter().any(|&m| m) {
            return false;
        }
        let head = match descs {
            [] => return false,
            [_] => None,
            [first, ..] => {
                let n = first.lengths().data();
                if !head_in_first(frame, n) {
                    return false;
                }
                frame.get(..n)
            }
        };
        if !x.send_moved(descs, head) {
            return false;
        }
        moved.fill(true);
        true
    }

    /// Transmits `frame` on local or remote port `port`.
    fn transmit(&mut self, port: u32, frame: &[u8], tunnel: Option<TunnelMeta>) {
        self.transmit_as(port, frame, tunnel, false);
    }

    /// [`Sink::transmit`] of a frame whose TCP/UDP checksum may be
    /// partial when `unfinished`: finished on the way out, by the kernel
    /// out of an AF_XDP port that can ask it to, by the tunnel's TSO for
    /// a segment it cuts, and by the switch anywhere else.
    fn transmit_as(
        &mut self,
        port: u32,
        frame: &[u8],
        tunnel: Option<TunnelMeta>,
        unfinished: bool,
    ) {
        match self.routes.get(&port) {
            Some(Route::Local(j)) => {
                let Some(p) = self.ports.get_mut(*j) else {
                    self.scratch.output_no_port += 1;
                    return;
                };
                match &mut p.io {
                    PortIo::Xsk(x) if unfinished => x.send_unfinished(frame),
                    PortIo::Xsk(x) => x.send(frame),
                    PortIo::Vxlan(v, local_ip) => {
                        let local_ip = *local_ip;
                        let meta = tunnel.unwrap_or_default();
                        let sent = if unfinished && !v.cuts(frame) {
                            let mut buf = std::mem::take(&mut self.scratch.finished);
                            buf.clear();
                            buf.extend_from_slice(frame);
                            checksum::complete_l4(&mut buf);
                            let sent = v.send(&buf, meta);
                            self.scratch.finished = buf;
                            sent
                        } else {
                            v.send(frame, meta)
                        };
                        match sent {
                            Ok(()) => {}
                            Err(TxError::TooBig { mtu }) => self.too_big(mtu, local_ip),
                            Err(_) => {}
                        }
                    }
                    PortIo::Busy => self.scratch.output_no_port += 1,
                }
            }
            Some(Route::Remote(t)) => {
                let t = *t;
                let mut buf = self.scratch.spares.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(frame);
                if unfinished {
                    // The other thread sends it as it is.
                    checksum::complete_l4(&mut buf);
                }
                if let Some(out) = self.scratch.remote.get_mut(t) {
                    out.push(Handoff {
                        ofport: port,
                        tunnel,
                        buf,
                    });
                    self.scratch.cross_thread += 1;
                }
            }
            None => self.scratch.output_no_port += 1,
        }
    }

    /// A flow rejected the current packet: answer its sender with an ICMP
    /// "port unreachable" out of its input port, within the rate limit.
    fn reject(&mut self, frame: &[u8]) {
        if !self.scratch.answer_budget.take(self.now_ns) {
            self.scratch.rejects_limited += 1;
            return;
        }
        if let Some(reply) = crate::reject::port_unreachable(frame) {
            let in_port = self.cur_in_port;
            self.transmit(in_port, &reply, None);
            self.scratch.rejects += 1;
        }
    }

    /// A `dec_ttl` found the current packet's TTL (hop limit) at 0 or 1:
    /// answer its sender with an ICMP time exceeded, quoting the packet
    /// as it was received, out of its input port; into the tunnel toward
    /// the node that sent it if it came from there (queued for the tunnel
    /// port, which is lent to the batch: `SinkScratch::tunnel_answers`).
    /// `key` is the packet's key at the packet-in (its tunnel metadata is
    /// the received one: the flows only write `tun_dst`, and only on the
    /// way out).
    fn time_exceeded(&mut self, key: &FlowKey) {
        // An unspecified IPv4 source answers only IPv6 packets
        // (`icmp_error` answers no IPv4 packet from 0.0.0.0).
        let src4 = match self.rx_tunnel {
            Some(ip) => Some(
                self.icmp_src
                    .or(ipv4_of(ip))
                    .unwrap_or(Ipv4Addr::UNSPECIFIED),
            ),
            None => self.answer_src4,
        };
        let Some(src4) = src4.filter(|_| self.keep_frame) else {
            self.scratch.time_exceeded_unanswered += 1;
            return;
        };
        let tunnel = match self.rx_tunnel {
            None => None,
            Some(_) => match back_to_sender(key) {
                Some(meta) => Some(meta),
                None => {
                    self.scratch.time_exceeded_unanswered += 1;
                    return;
                }
            },
        };
        if !self.scratch.answer_budget.take(self.now_ns) {
            self.scratch.time_exceeded_limited += 1;
            return;
        }
        let frame = std::mem::take(&mut self.scratch.cur_frame);
        match crate::icmp_error::time_exceeded(&frame, self.scratch.cur_len, src4) {
            Some(reply) => {
                match tunnel {
                    Some(meta) => self.scratch.tunnel_answers.push((reply, meta)),
                    None => self.transmit(self.cur_in_port, &reply, None),
                }
                self.scratch.time_exceeded += 1;
            }
            None => self.scratch.time_exceeded_unanswered += 1,
        }
        self.scratch.cur_frame = frame;
    }

    /// The current packet does not fit a tunnel: answer its sender.
    fn too_big(&mut self, mtu: u32, local_ip: IpAddr) {
        if !self.keep_frame {
            return;
        }
        // Over an IPv6 underlay without `icmp_src_ip`, only IPv6 packets
        // are answered (from link-local addresses).
        let src = self
            .icmp_src
            .or(ipv4_of(local_ip))
            .unwrap_or(Ipv4Addr::UNSPECIFIED);
        let frame = std::mem::take(&mut self.scratch.cur_frame);
        if let Some(reply) = vxlan::icmp_too_big_reply_head(&frame, self.scratch.cur_len, mtu, src)
        {
            let in_port = self.cur_in_port;
            self.transmit(in_port, &reply, None);
            self.scratch.icmp_too_big += 1;
        }
        self.scratch.cur_frame = frame;
    }
}

/// Whether `frame` carries a VLAN tag (its first ethertype is a TPID).
#[inline]
fn vlan_tagged(frame: &[u8]) -> bool {
    match frame.get(12..14) {
        Some(&[a, b]) => oxvs_pipeline::wire::ethernet::is_vlan_tpid(u16::from_be_bytes([a, b])),
        _ => false,
    }
}

/// The IPv4 address, if `ip` is one.
fn ipv4_of(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

/// The tunnel metadata that sends an answer back to the node a packet
/// came from: its received outer source (`tun_src`, or `tun_ipv6_src`
/// over an IPv6 underlay) as the destination, the same VNI. `None` if
/// the key has no outer source.
fn back_to_sender(key: &FlowKey) -> Option<TunnelMeta> {
    let tun_id = u64::try_from(key.get(Field::TunId)).unwrap_or(0);
    match u32::try_from(key.get(Field::TunSrc)).unwrap_or(0) {
        0 => match key.get(Field::TunIpv6Src) {
            0 => None,
            src6 => Some(TunnelMeta::v6(
                tun_id,
                Ipv6Addr::UNSPECIFIED,
                Ipv6Addr::from(src6),
            )),
        },
        src => Some(TunnelMeta::v4(tun_id, 0, src)),
    }
}

impl DatapathSink for Sink<'_> {
    fn output(&mut self, port: u32, frame: &[u8], tunnel: Option<TunnelMeta>) {
        self.transmit_as(port, frame, tunnel, self.unfinished);
    }

    fn output_last(&mut self, port: u32, frame: &[u8], tunnel: Option<TunnelMeta>) {
        // Moves happen only where checksums are completed on receive
        // (`LocalPort::defer_checksums` is off with `tx_move`).
        if self.unfinished || !self.move_out(port, frame) {
            self.transmit_as(port, frame, tunnel, self.unfinished);
        }
    }

    fn packet_in(&mut self, p: DpPacketIn<'_>) {
        if p.userdata == oxvs_pipeline::flow::REJECT_USERDATA {
            self.reject(p.frame);
            return;
        }
        if p.reason == PacketInReason::InvalidTtl {
            self.time_exceeded(p.key);
            return;
        }
        self.scratch.packet_ins.push(PacketIn {
            in_port: self.cur_in_port,
            table: p.table,
            cookie: p.cookie,
            reason: match p.reason {
                PacketInReason::NoMatch => "no_match",
                PacketInReason::Action => "action",
                PacketInReason::InvalidTtl => "invalid_ttl",
            }
            .to_string(),
            userdata: p.userdata.to_vec(),
            frame: {
                let mut f = p.frame.to_vec();
                if self.unfinished {
                    // What the controller sees (and may send back) is whole.
                    checksum::complete_l4(&mut f);
                }
                f
            },
        });
    }

    fn learn(&mut self, flow: &Arc<Learned>) {
        self.scratch.learns.push(Arc::clone(flow));
    }

    fn begin_packet(&mut self, in_port: u32, frame: &[u8]) {
        self.cur_in_port = in_port;
        self.scratch.rx.cur = self.scratch.rx.cur.wrapping_add(1);
        if self.keep_frame {
            self.scratch.cur_frame.clear();
            self.scratch
                .cur_frame
                .extend_from_slice(frame.get(..vxlan::TOO_BIG_HEAD).unwrap_or(frame));
            self.scratch.cur_len = frame.len();
        }
    }
}

// The control server shares one `Switch` between its connection threads.
const _: fn() = || {
    fn is<T: Send + Sync>() {}
    is::<Switch>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_goes_to_the_umem_with_the_fewest_ports() {
        let counts: Vec<AtomicUsize> = [2, 1, 1, 0].into_iter().map(AtomicUsize::new).collect();
        // The first of the fewest, among the UMEMs the thread made.
        assert_eq!(fewest(&counts, 3), Some(1));
        assert_eq!(fewest(&counts, 4), Some(3));
        assert_eq!(fewest(&counts, 1), Some(0));
        assert_eq!(fewest(&counts, 0), None);
        // More UMEMs asked for than counted: the counted ones.
        assert_eq!(fewest(&counts[..2], 4), Some(1));
    }

    #[test]
    fn port_queues_refuses_what_cannot_be_served() {
        // No such interface: its queue count is unknown.
        let none = "oxvs-no-such0";
        assert_eq!(port_queues(none, None), Ok(1));
        assert_eq!(port_queues(none, Some(3)), Ok(3));
        assert!(port_queues(none, Some(0))
            .unwrap_err()
            .contains("at least 1"));
        assert!(port_queues(none, Some(MAX_PORT_QUEUES + 1))
            .unwrap_err()
            .contains("more than the 64 queues"));
        // The loopback device has one receive queue.
        if crate::netdev::rx_queue_count("lo") == Some(1) {
            assert_eq!(port_queues("lo", None), Ok(1));
            let e = port_queues("lo", Some(2)).unwrap_err();
            assert!(e.contains("'lo' has 1 receive queue"), "{e}");
        }
    }
}
