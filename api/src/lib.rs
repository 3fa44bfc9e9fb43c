//! # oxvs-api: what travels between the oxvs processes
//!
//! Newline-delimited JSON over Unix sockets (mode 0600). On oxvs-switchd's
//! control socket (default [`DEFAULT_SWITCHD_SOCKET`]) every request carries
//! `"v": 1`; flows travel as text in the `ovs-ofctl` syntax. A session on
//! that socket is any number of request lines, each answered by exactly one
//! response line, in order.
//!
//! - This file: the shared data types (ports and their counters).
//! - [`protocol`]: the switch's request/response envelope ([`Request`],
//!   [`Response`]), one typed result per operation, and the strict request
//!   parser the server uses ([`parse_request`]): bad JSON, a wrong version
//!   or an unknown operation become a [`ProtocolError`] that the server
//!   answers with, never a dropped connection.
//! - [`client`]: a blocking [`Client`] of the switch with a deadline per
//!   call, used by `oxvsctl` and the tests.
//! - [`agent`]: oxvs-agent's API socket (the same envelope): the node
//!   (`info`), where a pod is (`pod`) and one node's hop of a traceflow,
//!   for `oxvsctl traceflow`.
//! - [`cni`]: the agent's CNI socket, between `oxvs-cni` and `oxvs-agent`
//!   (one request per connection, results in the CNI 1.1.0 shape).
//! - [`metrics`]: the Prometheus text format both daemons serve on
//!   `/metrics`, a writer and a strict reader, and the tiny HTTP exchange.
//! - [`listen`]: how the daemons listen: socket files private from the
//!   first instant, connection caps answered "busy, retry", idle timeouts.
//! - `trace` (feature `pipeline`): a pipeline trace as a [`TraceResult`]
//!   (`TraceResult::from_report`): its text and its structured
//!   [`TraceReport`], made together. oxvs-switchd and oxvsctl use it;
//!   readers of the structure need only [`protocol`].
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod client;
pub mod cni;
pub mod listen;
pub mod metrics;
pub mod protocol;
#[cfg(feature = "pipeline")]
pub mod trace;

pub use client::{Client, ClientError};
pub use protocol::*;

use serde::{Deserialize, Serialize};

/// Protocol version spoken by this build.
pub const VERSION: u32 = 1;

/// Default path of oxvs-switchd's control socket.
pub const DEFAULT_SWITCHD_SOCKET: &str = "/run/oxvs/switchd.sock";

/// Per-port counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_errors: u64,
    /// Why received packets were dropped (AF_XDP ports; each is also in
    /// `rx_dropped`): the RX ring was full (the switch did not drain it
    /// in time), the fill ring was empty (no free frame), or another
    /// reason (too big for a frame).
    #[serde(default)]
    pub rx_ring_full: u64,
    #[serde(default)]
    pub rx_fill_empty: u64,
    #[serde(default)]
    pub rx_other: u64,
    /// Why packets to send were dropped (each is also in `tx_dropped`):
    /// no free frame in the UMEM, or the TX ring was full.
    #[serde(default)]
    pub tx_no_frame: u64,
    #[serde(default)]
    pub tx_ring_full: u64,
    /// Packets queued to send without a copy (`oxvs-switchd --tx-move`):
    /// received on a port sharing this port's UMEM, they go out in the
    /// frames they arrived in (AF_XDP descriptors moved between the
    /// ports). Counted when queued, as `tx_packets` is when submitted: one
    /// the TX ring then refuses is also in `tx_dropped`.
    #[serde(default)]
    pub tx_moved: u64,
    /// Packets queued asking the kernel to finish their TCP/UDP checksum
    /// (AF_XDP TX metadata: a pod's frame whose checksum its kernel left
    /// partial; `oxvs-switchd --software-checksums` turns it off). Counted
    /// when queued, as `tx_moved`: one the TX ring then refuses is also in
    /// `tx_dropped`.
    #[serde(default)]
    pub tx_checksum_requests: u64,
    /// Frames on the port's fill ring (AF_XDP ports, summed over the
    /// port's queues; sampled every ~50 ms): what it can
    /// receive before the switch gives it more. A gauge, not a counter.
    #[serde(default)]
    pub rx_fill_frames: u64,
    /// What the switch tops that ring up to now: it grows while the port
    /// is busy, up to the port's share of the UMEM (beyond, borrowing,
    /// where the share is small), and decays while it is idle. A port
    /// with `rx_fill_empty` drops at a target below the 4096-entry ring
    /// wants a larger UMEM (`oxvs-switchd --umem-frames`).
    #[serde(default)]
    pub rx_fill_target: u64,
}

impl std::ops::AddAssign<&PortStats> for PortStats {
    fn add_assign(&mut self, o: &PortStats) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_dropped += o.rx_dropped;
        self.rx_errors += o.rx_errors;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_dropped += o.tx_dropped;
        self.tx_errors += o.tx_errors;
        self.rx_ring_full += o.rx_ring_full;
        self.rx_fill_empty += o.rx_fill_empty;
        self.rx_other += o.rx_other;
        self.tx_no_frame += o.tx_no_frame;
        self.tx_ring_full += o.tx_ring_full;
        self.tx_moved += o.tx_moved;
        self.tx_checksum_requests += o.tx_checksum_requests;
        self.rx_fill_frames += o.rx_fill_frames;
        self.rx_fill_target += o.rx_fill_target;
    }
}

/// What kind of port to add.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum PortKind {
    /// An AF_XDP socket on an existing interface (`ifname` defaults to the port name).
    Afxdp {
        #[serde(default)]
        ifname: Option<String>,
        /// `auto` (native, falling back to generic), `native` or `generic`.
        #[serde(default)]
        xdp_mode: XdpModeRequest,
        /// Receive queues served, from queue 0 (OVS's `options:n_rxq`):
        /// a socket per queue, spread over the datapath threads. Default:
        /// every receive queue the interface has.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        n_rxq: Option<u32>,
    },
    /// A VXLAN tunnel port (RFC 7348) over the node's underlay.
    Vxlan {
        /// Local underlay address (outer source), IPv4 or IPv6: the
        /// family of the port's underlay. An IPv6 address makes the port
        /// encapsulate in IPv6 (inner MTU = underlay − 70) and send only
        /// to `tun_ipv6_dst`; an IPv4 one in IPv4 (underlay − 50), to
        /// `tun_dst`. JSON: the address as a string, as before
        /// (`"192.168.1.1"` or `"fd00::1"`).
        local_ip: std::net::IpAddr,
        /// UDP destination port (default 4789).
        #[serde(default)]
        dst_port: Option<u16>,
        /// Underlay MTU (default: read from the interface holding `local_ip`, else 1500).
        #[serde(default)]
        underlay_mtu: Option<u32>,
    },
}

/// The XDP attach mode asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum XdpModeRequest {
    #[default]
    Auto,
    Native,
    Generic,
}

/// A port to add.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    pub name: String,
    /// Requested OpenFlow port number (`None`: the lowest free one >= 1).
    #[serde(default)]
    pub ofport: Option<u32>,
    pub kind: PortKind,
}

/// A port as `show` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    pub name: String,
    pub ofport: u32,
    /// `afxdp` or `vxlan`.
    pub kind: String,
    /// How the port moves packets, e.g. `native/copy`, `generic/copy`,
    /// `native/zerocopy`, or `udp-socket` for VXLAN.
    pub mode: String,
    /// `up`, or what is wrong.
    pub state: String,
    /// A tunnel port's local address and UDP port (`192.0.2.1:4789`,
    /// `[fd00::1]:4789`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<String>,
    pub stats: PortStats,
    /// Per receive queue, for a port serving more than one (their
    /// counters add up to `stats`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueInfo>,
    /// Which of its datapath thread's shared UMEMs the port (its first
    /// queue) is on, where threads have several (`oxvs-switchd
    /// --umems-per-thread`): its frames, and the spare frames it may
    /// borrow, are that UMEM's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub umem: Option<u32>,
}

/// One receive queue of a multi-queue port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub queue: u32,
    /// The datapath thread serving it.
    pub thread: usize,
    pub stats: PortStats,
    /// Which of that thread's shared UMEMs it is on, as
    /// [`PortInfo::umem`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub umem: Option<u32>,
}
