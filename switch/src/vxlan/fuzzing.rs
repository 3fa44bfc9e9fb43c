//! Hooks for the fuzz harnesses (`fuzz/harness`), not an API: they reach
//! into a [`VxlanPort`] so a harness can drive the real receive and send
//! code without putting anything on the wire.
//!
//! - [`rx_addr`]: where the port's RX socket listens, so a harness can send
//!   it datagrams over loopback and read them back with
//!   [`VxlanPort::recv_batch`].
//! - [`set_underlay_mtu`]: another MTU for the next [`VxlanPort::send`]
//!   (clamped to what [`VxlanPort::open`] accepts).
//! - [`queued`] / [`discard_queued`]: the outer IP packets `send` queued,
//!   and forgetting them instead of [`VxlanPort::flush`]ing them.
//! - [`tso_gro_roundtrip`]: an IPv4 frame cut as the TSO path cuts it, and
//!   the pieces merged again as the GRO path merges them;
//!   [`tso_gro_roundtrip_any`] the same for IPv4 and IPv6 frames.

use std::net::SocketAddr;

use super::VxlanPort;

/// The local address of the port's RX socket.
pub fn rx_addr(port: &VxlanPort) -> Option<SocketAddr> {
    port.rx_sock.local_addr().ok()
}

/// Sets the underlay MTU, clamped as `open` requires (576..=65535 over
/// IPv4, 1280..=65535 over IPv6).
pub fn set_underlay_mtu(port: &mut VxlanPort, mtu: u32) {
    let min = if port.local_ip.is_ipv6() {
        super::MIN_MTU6
    } else {
        super::MIN_MTU4
    };
    port.underlay_mtu = mtu.clamp(min, 65535);
}

/// The outer IP packets queued by `send` and not flushed yet, in order.
pub fn queued(port: &VxlanPort) -> Vec<&[u8]> {
    port.tx_buf
        .chunks_exact(super::TX_SLOT)
        .zip(port.tx_desc[..port.tx_n].iter())
        .map(|(slot, d)| &slot[..d.len])
        .collect()
}

/// Forgets every queued packet without sending it.
pub fn discard_queued(port: &mut VxlanPort) {
    port.tx_n = 0;
}

/// [`tso_gro_roundtrip_any`] for IPv4 frames only (`None` for others):
/// the harness that calls it reads the pieces as IPv4 (`fuzz/harness`,
/// `vxlan_tx`), which TSO cut only before it took IPv6 too.
pub fn tso_gro_roundtrip(frame: &[u8], inner_mtu: usize, gro_max: usize) -> Option<Roundtrip> {
    let l2 = oxvs_pipeline::wire::ethernet::l2_of(frame)?;
    if l2.ethertype != oxvs_pipeline::wire::ethertype::IPV4 {
        return None;
    }
    tso_gro_roundtrip_any(frame, inner_mtu, gro_max)
}

/// Cuts `frame` into pieces for `inner_mtu` as [`VxlanPort::send`]'s TSO
/// path does (`None` if it does not cut it), and merges the pieces' inner
/// frames again as [`VxlanPort::recv_batch`]'s GRO path does (frames up to
/// `gro_max`). IPv4 and IPv6 frames alike.
pub fn tso_gro_roundtrip_any(frame: &[u8], inner_mtu: usize, gro_max: usize) -> Option<Roundtrip> {
    let cut = super::tso::TcpCut::of(frame, inner_mtu)?;
    let mut out = vec![0u8; cut.pieces() * cut.datagram_len()];
    let n = cut.write(frame, 42, 0, cut.pieces(), &mut out)?;
    let mut pieces = Vec::new();
    let mut descs = Vec::new();
    for (k, d) in out[..n].chunks(cut.datagram_len()).enumerate() {
        pieces.push(d[super::VXLAN_HLEN..].to_vec());
        descs.push(super::RxDesc {
            off: k * cut.datagram_len() + super::VXLAN_HLEN,
            len: d.len() - super::VXLAN_HLEN,
            meta: oxvs_pipeline::datapath::TunnelMeta::default(),
            verified: false,
        });
    }
    super::gro::coalesce(&mut out, &mut descs, gro_max);
    let merged = descs
        .iter()
        .map(|d| out[d.off..d.off + d.len].to_vec())
        .collect();
    Some(Roundtrip { pieces, merged })
}

/// What [`tso_gro_roundtrip_any`] made.
#[derive(Debug)]
pub struct Roundtrip {
    /// The pieces' inner frames, in order.
    pub pieces: Vec<Vec<u8>>,
    /// The frames the pieces were merged into, in order.
    pub merged: Vec<Vec<u8>>,
}
