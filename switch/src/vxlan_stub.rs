//! Stand-in for the VXLAN tunnel port (`switch/src/vxlan.rs`, written on
//! another branch) with the agreed interface, so the engine compiles and
//! its integration is written against the contract. Opening fails; it is
//! deleted when the real module lands.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use oxvs_api::PortStats;
use oxvs_pipeline::datapath::TunnelMeta;

/// Why a VXLAN port could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum VxlanError {
    #[error("VXLAN ports are not built in yet")]
    NotAvailable,
}

/// Why a packet could not be queued for transmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxError {
    /// The inner packet does not fit the tunnel.
    TooBig { mtu: u32 },
    /// The send queue is full.
    Full,
}

/// A VXLAN port over a UDP socket.
#[derive(Debug)]
pub struct VxlanPort {
    bufs: Vec<Vec<u8>>,
}

impl VxlanPort {
    pub fn open(
        _local_ip: Ipv4Addr,
        _dst_port: u16,
        _underlay_mtu: Option<u32>,
    ) -> Result<VxlanPort, VxlanError> {
        Err(VxlanError::NotAvailable)
    }
    pub fn fd(&self) -> RawFd {
        -1
    }
    pub fn recv_batch(&mut self, _max: usize) -> usize {
        0
    }
    pub fn rx_packets(&mut self) -> impl Iterator<Item = (&mut [u8], TunnelMeta)> + '_ {
        self.bufs
            .iter_mut()
            .map(|b| (b.as_mut_slice(), TunnelMeta::default()))
    }
    pub fn send(&mut self, _inner: &[u8], _meta: TunnelMeta) -> Result<(), TxError> {
        Err(TxError::Full)
    }
    pub fn flush(&mut self) -> usize {
        0
    }
    pub fn stats(&self) -> PortStats {
        PortStats::default()
    }
    pub fn mode(&self) -> &'static str {
        "udp-socket"
    }
}

/// An ICMP "fragmentation needed" (or ICMPv6 "packet too big") answering
/// `original_frame`.
pub fn icmp_too_big_reply(_original_frame: &[u8], _mtu: u32, _src_ip: Ipv4Addr) -> Option<Vec<u8>> {
    None
}
