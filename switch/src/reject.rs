//! Reject: the switch's answer to a packet a flow sent to the controller
//! with the userdata [`oxvs_pipeline::flow::REJECT_USERDATA`]
//! (`controller(userdata=72.65.6a.65.63.74)`): an ICMP "port unreachable"
//! back to its sender, out of the port it came in by, as kube-proxy's
//! `REJECT` answers a connection to a Service without endpoints (a Linux
//! client's `connect` fails at once with `ECONNREFUSED`, a UDP client's
//! next `recv` too, instead of waiting for a timeout).
//!
//! The switch is its own controller for these packet-ins (Antrea's agent
//! plays that role over OpenFlow): the answer is built on the datapath
//! thread, for the rejected packets only, and bounded by a per-thread
//! token bucket ([`RejectBudget`]) so that a flood of SYNs to an empty
//! Service costs at most [`REJECTS_PER_SEC`] answers a second per thread
//! (as Linux rate-limits its ICMP errors). The same bucket bounds the
//! switch's other answers to packet-ins, ICMP time exceeded
//! ([`crate::icmp_error`]): one budget of answers per thread.
//!
//! The packet is untrusted (a pod wrote it): every header is read through
//! the wire layer's checked views; nothing here panics on any input.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::icmp_error::{self, From4, IcmpError};

/// Most answers a second, per datapath thread.
pub const REJECTS_PER_SEC: u64 = 1000;
/// The bucket's depth: a burst of this many is answered at once.
pub const REJECT_BURST: u64 = 100;

/// A token bucket of answers (one per datapath thread: no lock).
#[derive(Clone, Debug)]
pub struct RejectBudget {
    tokens: u64,
    /// When the bucket was last refilled (ns, the datapath's clock).
    at_ns: u64,
}

impl Default for RejectBudget {
    fn default() -> Self {
        RejectBudget {
            tokens: REJECT_BURST,
            at_ns: 0,
        }
    }
}

impl RejectBudget {
    /// Takes one answer's token at `now_ns`; `false`: over the rate.
    pub fn take(&mut self, now_ns: u64) -> bool {
        let per_token = 1_000_000_000 / REJECTS_PER_SEC;
        let earned = now_ns.saturating_sub(self.at_ns) / per_token;
        if earned > 0 {
            self.tokens = (self.tokens + earned).min(REJECT_BURST);
            self.at_ns = now_ns;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// The ICMP "port unreachable" answering `frame` (Ethernet, IPv4 or
/// IPv6): from the address the packet was sent to, to its source,
/// quoting its IP header and first 8 payload bytes (RFC 792; IPv6: as
/// much as fits 1280 bytes, ICMPv6 type 1 code 4), TTL 64, the Ethernet
/// addresses swapped (VLAN tags kept); built by [`crate::icmp_error`].
///
/// `None` for what must not be answered (RFC 1122 3.2.2, RFC 4443 2.4):
/// non-IP frames, truncated or inconsistent headers, ICMP errors,
/// fragments but the first, and sources or destinations that are not
/// unicast.
pub fn port_unreachable(frame: &[u8]) -> Option<Vec<u8>> {
    icmp_error::answer(
        frame,
        frame.len(),
        IcmpError::PortUnreachable,
        From4::Destination,
    )
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;
    use smoltcp::wire::{
        EthernetAddress, EthernetFrame as SmolEth, Icmpv4Message, Icmpv4Packet,
        Ipv4Packet as SmolIpv4,
    };

    /// A TCP SYN 10.244.1.3:40000 -> 10.96.0.10:80 (with 4 option bytes).
    fn syn() -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 24];
        f[0..6].copy_from_slice(&[0x0a, 0x58, 10, 244, 1, 1]);
        f[6..12].copy_from_slice(&[0x0a, 0x58, 10, 244, 1, 3]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&44u16.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 244, 1, 3]);
        ip[16..20].copy_from_slice(&[10, 96, 0, 10]);
        ip[20..22].copy_from_slice(&40000u16.to_be_bytes());
        ip[22..24].copy_from_slice(&80u16.to_be_bytes());
        ip[32] = 0x60; // data offset 6
        ip[33] = 0x02; // SYN
        f
    }

    #[test]
    fn a_syn_is_answered_port_unreachable_from_the_service() {
        let f = syn();
        let r = port_unreachable(&f).expect("answered");
        let eth = SmolEth::new_checked(&r[..]).unwrap();
        assert_eq!(eth.dst_addr(), EthernetAddress([0x0a, 0x58, 10, 244, 1, 3]));
        assert_eq!(eth.src_addr(), EthernetAddress([0x0a, 0x58, 10, 244, 1, 1]));
        let ip = SmolIpv4::new_checked(eth.payload()).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.src_addr().octets(), [10, 96, 0, 10]);
        assert_eq!(ip.dst_addr().octets(), [10, 244, 1, 3]);
        assert_eq!(ip.hop_limit(), 64);
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum());
        assert_eq!(icmp.msg_type(), Icmpv4Message::DstUnreachable);
        assert_eq!(icmp.msg_code(), 3, "port unreachable");
        // The quote: IP header + 8 bytes (the ports and sequence number).
        assert_eq!(icmp.data(), &f[14..14 + 28]);
    }

    #[test]
    fn what_must_not_be_answered_is_not() {
        let base = syn();
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut f = base.clone();
        f[6] |= 1; // multicast source MAC
        cases.push(("multicast source MAC", f));
        let mut f = base.clone();
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        cases.push(("an IPv4 packet labelled IPv6", f));
        let mut f = base.clone();
        f[14 + 6..14 + 8].copy_from_slice(&[0x00, 0x10]); // offset 16*8
        cases.push(("a later fragment", f));
        let mut f = base.clone();
        f[14 + 12..14 + 16].copy_from_slice(&[255, 255, 255, 255]);
        cases.push(("broadcast source", f));
        let mut f = base.clone();
        f[14 + 16..14 + 20].copy_from_slice(&[224, 0, 0, 1]);
        cases.push(("multicast destination", f));
        let mut f = base.clone();
        f[14 + 2..14 + 4].copy_from_slice(&400u16.to_be_bytes());
        cases.push(("total length past the frame", f));
        let mut f = base.clone();
        f[14] = 0x44;
        cases.push(("IHL 16", f));
        let mut f = base.clone();
        f[14 + 9] = 1; // ICMP
        f[14 + 20] = 3; // destination unreachable: an error
        cases.push(("an ICMP error", f));
        cases.push(("truncated", base[..30].to_vec()));
        for (what, f) in cases {
            assert!(port_unreachable(&f).is_none(), "{what} was answered");
        }
        // Every prefix of a good frame: no panic.
        for n in 0..base.len() {
            let _ = port_unreachable(&base[..n]);
        }
    }

    #[test]
    fn the_budget_refills_at_the_rate_and_caps_the_burst() {
        let mut b = RejectBudget::default();
        let t0 = 5_000_000_000;
        let taken = (0..1000).filter(|_| b.take(t0)).count() as u64;
        // The first call refills a full bucket (capped at the burst).
        assert_eq!(taken, REJECT_BURST);
        // 10 ms later: 10 more.
        let taken = (0..1000).filter(|_| b.take(t0 + 10_000_000)).count();
        assert_eq!(taken, 10);
    }
}
