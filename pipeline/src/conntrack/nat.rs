//! NAT for the tracker: choosing a new connection's translation, and what
//! a packet of a translated connection becomes (module doc, "NAT").

use std::net::IpAddr;

use super::state::ConnKey;
use super::table::{Conntrack, CtRefusal};
use super::CtRewrite;
use crate::field::ct_state;
use crate::flow::{NatAction, NatKind};
use crate::group::mix64;
use crate::wire::ip_proto;

/// Most addresses of a range a new connection tries.
const ADDR_TRIES: u128 = 8;
/// Most ports per address a new connection tries.
const PORT_TRIES: u32 = 32;
/// Where SNAT looks for a free port when the rule gives none and the
/// packet's own is taken (OVS and Linux use the unprivileged range).
const SNAT_EPHEMERAL: (u16, u16) = (1024, 65535);

fn has_ports(proto: u8) -> bool {
    matches!(proto, ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP)
}

/// An address as a number in its family (IPv4 in the low 32 bits).
fn addr_num(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// A number back into a connection key's 16 address bytes.
fn addr_bytes(v6: bool, n: u128) -> [u8; 16] {
    if v6 {
        n.to_be_bytes()
    } else {
        super::packet::v4_mapped(n as u32)
    }
}

fn bytes_num(v6: bool, b: &[u8; 16]) -> u128 {
    if v6 {
        u128::from_be_bytes(*b)
    } else {
        u128::from(u32::from_be_bytes([b[12], b[13], b[14], b[15]]))
    }
}

/// The rewrite that makes a packet look like `target` (a key in the
/// packet's direction).
pub(super) fn rewrite_to(target: &ConnKey) -> CtRewrite {
    CtRewrite {
        v6: target.v6,
        src: bytes_num(target.v6, &target.src),
        dst: bytes_num(target.v6, &target.dst),
        ports: has_ports(target.proto),
        sport: target.sport,
        dport: target.dport,
    }
}

/// The `ct_state` NAT bits for a packet with key `from` rewritten to
/// `to`: `+snat` if its source changes, `+dnat` if its destination does
/// (so the reply of a DNATed connection, whose source is restored, is
/// `+snat`, as OVS marks it).
pub(super) fn nat_flags(from: &ConnKey, to: &ConnKey) -> u32 {
    let ports = has_ports(from.proto);
    let mut f = 0;
    if from.src != to.src || (ports && from.sport != to.sport) {
        f |= ct_state::SNAT;
    }
    if from.dst != to.dst || (ports && from.dport != to.dport) {
        f |= ct_state::DNAT;
    }
    f
}

impl Conntrack {
    /// The reply-direction key of a new connection `key` translated by
    /// `nat`, or `None` when it is not translated (no range, a range of
    /// the other family, or the translation is the identity). Tries a
    /// bounded number of addresses and ports for one whose reply key is
    /// not in use (module doc, "NAT": the range; for DNAT then the
    /// client's source port; last, a connection that is over gives up its
    /// tuple); `Err` when none is free.
    pub(super) fn nat_choose(
        &mut self,
        key: &ConnKey,
        nat: &NatAction,
        now_ns: u64,
    ) -> Result<Option<ConnKey>, CtRefusal> {
        let (Some(kind), Some(range)) = (nat.kind, nat.range) else {
            return Ok(None);
        };
        if range.addr_min.is_ipv6() != key.v6 {
            return Ok(None);
        }
        let (amin, amax) = (addr_num(range.addr_min), addr_num(range.addr_max));
        let n_addr = amax.saturating_sub(amin).saturating_add(1);
        let ports = has_ports(key.proto);
        let own_port = match kind {
            NatKind::Src => key.sport,
            NatKind::Dst => key.dport,
        };
        // Where to start: a hash of the connection (`persistent`: of the
        // addresses only, so a client keeps its address), or a fresh
        // number (`random`).
        let h = if nat.random {
            self.nat_seed = mix64(self.nat_seed);
            self.nat_seed
        } else {
            let mut h = mix64(u64::from(key.proto) ^ u64::from(key.zone) << 8);
            h = mix64(h ^ u64::from_be_bytes(key.src[8..16].try_into().unwrap_or([0; 8])));
            h = mix64(h ^ u64::from_be_bytes(key.dst[8..16].try_into().unwrap_or([0; 8])));
            if !nat.persistent {
                h = mix64(h ^ (u64::from(key.sport) << 16 | u64::from(key.dport)));
            }
            h
        };
        // Ports to try: the rule's range; else the packet's own, then (SNAT
        // only, when it is taken) the ephemeral range.
        let port_ranges: [(u16, u16); 2] = match (range.ports, kind) {
            _ if !ports => [(own_port, own_port), (own_port, own_port)],
            (Some(r), _) => [r, r],
            (None, NatKind::Dst) => [(own_port, own_port), (own_port, own_port)],
            (None, NatKind::Src) => [(own_port, own_port), SNAT_EPHEMERAL],
        };
        let addr_at = |a: u128| amin + (u128::from(h) % n_addr + a) % n_addr;
        let port_at = |(plo, phi): (u16, u16), p: u32| {
            let n_port = u32::from(phi - plo) + 1;
            plo + (((h >> 32) as u32 % n_port + p) % n_port) as u16
        };
        let translated = |addr: u128, port: u16| {
            let mut fwd = *key;
            match kind {
                NatKind::Src => {
                    fwd.src = addr_bytes(key.v6, addr);
                    fwd.sport = port;
                }
                NatKind::Dst => {
                    fwd.dst = addr_bytes(key.v6, addr);
                    fwd.dport = port;
                }
            }
            fwd
        };
        // A held tuple is first avoided; only when every candidate is held
        // does a connection that is over give its tuple up (Linux's NAT
        // evicts a TIME_WAIT entry only in its last attempts too).
        for evict in [false, true] {
            for a in 0..n_addr.min(ADDR_TRIES) {
                let addr = addr_at(a);
                for (i, &r) in port_ranges.iter().enumerate() {
                    if i == 1 && port_ranges[1] == port_ranges[0] {
                        break;
                    }
                    for p in 0..(u32::from(r.1 - r.0) + 1).min(PORT_TRIES) {
                        let fwd = translated(addr, port_at(r, p));
                        if fwd == *key {
                            return Ok(None);
                        }
                        let rev = fwd.reverse();
                        if self.take_key(&rev, evict, now_ns) {
                            return Ok(Some(rev));
                        }
                    }
                }
            }
            if evict || kind != NatKind::Dst || !ports {
                continue;
            }
            // DNAT whose every endpoint tuple is held (the client reused a
            // port it had used towards another frontend of the same
            // endpoint): the client's source port changes too, as OVS
            // does and Linux's implicit source NAT does. Taking the held
            // tuple instead would hand the endpoint a SYN on a 4-tuple it
            // may still hold in TIME_WAIT, which it answers with an ACK of
            // the old connection.
            for a in 0..n_addr.min(ADDR_TRIES) {
                let mut fwd = translated(addr_at(a), port_at(port_ranges[0], 0));
                for p in 0..PORT_TRIES {
                    fwd.sport = port_at(SNAT_EPHEMERAL, p);
                    if fwd.sport == key.sport {
                        continue;
                    }
                    let rev = fwd.reverse();
                    if self.take_key(&rev, false, now_ns) {
                        return Ok(Some(rev));
                    }
                }
            }
        }
        self.stats.nat_exhausted_total += 1;
        Err(CtRefusal::NatExhausted)
    }

    /// Whether `k` (either way) is free for a new connection: no staged
    /// connection uses it, and the stored one that does, if any, has
    /// expired or (with `evict`) is over (closed TCP), and is then
    /// removed: the ends reuse ports as soon as their own stacks let them,
    /// and Linux's NAT, short of free tuples, evicts such an entry too.
    fn take_key(&mut self, k: &ConnKey, evict: bool, now_ns: u64) -> bool {
        let canon = k.canonical();
        if self.staged[..self.n_staged].iter().flatten().any(|s| {
            s.pkt.key.canonical() == canon || s.rev.is_some_and(|r| r.canonical() == canon)
        }) {
            return false;
        }
        let Some(&idx) = self.map.get(&canon) else {
            return true;
        };
        match self.slots.get(idx as usize) {
            Some(Some(c)) if (evict && c.closed()) || now_ns >= c.expiration_ns => {
                self.remove(idx);
                self.stats.deleted_total += 1;
                true
            }
            _ => false,
        }
    }
}
