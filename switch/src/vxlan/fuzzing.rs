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

use std::net::SocketAddrV4;

use super::VxlanPort;

/// The local address of the port's RX socket.
pub fn rx_addr(port: &VxlanPort) -> Option<SocketAddrV4> {
    match port.rx_sock.local_addr().ok()? {
        std::net::SocketAddr::V4(a) => Some(a),
        std::net::SocketAddr::V6(_) => None,
    }
}

/// Sets the underlay MTU, clamped to 576..=65535 as `open` requires.
pub fn set_underlay_mtu(port: &mut VxlanPort, mtu: u32) {
    port.underlay_mtu = mtu.clamp(576, 65535);
}

/// The outer IPv4 packets queued by `send` and not flushed yet, in order.
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
