//! Printing flows in `ovs-ofctl` syntax.
//!
//! The inverse of [`crate::parse`]: matches print in the order and spelling
//! of OVS's `match_format()` (priority; metadata, conntrack and registers;
//! the protocol shorthand `ip`/`tcp`/`arp`... in place of `dl_type` and
//! `nw_proto`; in_port; VLAN; Ethernet; L3; L4), actions as
//! `ovs-ofctl dump-flows` prints them, and [`format_dump_line`] writes whole
//! `dump-flows` lines, with or without statistics.
//!
//! ## Invariant
//!
//! For every flow [`crate::parse::parse_flow`] accepts,
//! `parse_flow(format_flow(f)) == f` (checked by a property test in
//! `tests/roundtrip.rs`). Where OVS's own printing would lose information
//! or read back differently, this module prints a form that reads back
//! exactly, and says so below.
//!
//! ## Known differences from `ovs-ofctl -O OpenFlow15 dump-flows`
//!
//! - `load:` prints as `load:0x1->NXM_NX_REG0[]` (OVS's OpenFlow 1.0/NXM
//!   spelling) instead of OpenFlow 1.5's `set_field:0x1->reg0`, so that
//!   `Load` and `SetField` stay distinct.
//! - `mod_dl_src:`/`mod_nw_src:`... print as themselves (OVS 1.5 prints them
//!   as `set_field`).
//! - An `Output` to the controller port prints `output:CONTROLLER`; the
//!   `controller` action prints `CONTROLLER:65535` or `controller(...)` as OVS.
//! - `note:` prints its bytes unpadded (OVS pads to 6 bytes).
//! - `hard_age` is never printed (no modification time is tracked).
//! - Fields whose prerequisites are missing (an invalid match) still print,
//!   where OVS would hide them.

use std::fmt::Write as _;

use crate::field::{ct_state, frag, tcp_flags, Field, ValueFormat};
use crate::flow::{
    port, Action, ControllerAction, CtZoneSrc, Flow, LearnAction, LearnSpec, LearnSrc,
    LearnSubField, Match, NatAction, NatKind, OvsField, PacketInReason, SubField, DEFAULT_PRIORITY,
};
use crate::key::FlowKey;
use crate::names::TableNames;
use crate::parse::{eth_type, ip_proto, PORT_NAMES};

/// Counters and ages shown by `dump-flows`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub duration_ns: u64,
    pub n_packets: u64,
    pub n_bytes: u64,
    /// Seconds since last hit (None = never hit).
    pub idle_age_s: Option<u64>,
}

/// How `dump-flows` lines are printed.
#[derive(Clone, Debug, Default)]
pub struct DumpOptions {
    /// Print cookie, duration, n_packets, n_bytes (`--no-stats` clears it).
    pub stats: bool,
    /// Print table names (`table=SpoofGuard`) where known.
    pub names: Option<TableNames>,
}

// ---------------------------------------------------------------------------
// Small formatters

/// C's `%#x`: `0` for zero, `0x..` otherwise.
fn c_hex(out: &mut String, v: u128) {
    if v == 0 {
        out.push('0');
    } else {
        let _ = write!(out, "{v:#x}");
    }
}

fn mac(out: &mut String, v: u128) {
    let b = (v as u64).to_be_bytes();
    let _ = write!(
        out,
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[2], b[3], b[4], b[5], b[6], b[7]
    );
}

/// The prefix length if `mask` is `bits`-wide CIDR (leading ones).
fn cidr(mask: u128, bits: u32) -> Option<u32> {
    let full = if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    let inv = !mask & full;
    // Contiguous leading ones <=> the inverted mask is of the form 0..01..1.
    if inv & inv.wrapping_add(1) == 0 {
        Some(bits - inv.count_ones())
    } else {
        None
    }
}

fn ipv4_masked(out: &mut String, v: u128, m: u128) {
    let _ = write!(out, "{}", std::net::Ipv4Addr::from(v as u32));
    if m != 0xffff_ffff {
        match cidr(m, 32) {
            Some(p) => {
                let _ = write!(out, "/{p}");
            }
            None => {
                let _ = write!(out, "/{}", std::net::Ipv4Addr::from(m as u32));
            }
        }
    }
}

fn ipv6_masked(out: &mut String, v: u128, m: u128) {
    let _ = write!(out, "{}", std::net::Ipv6Addr::from(v));
    if m != u128::MAX {
        match cidr(m, 128) {
            Some(p) => {
                let _ = write!(out, "/{p}");
            }
            None => {
                let _ = write!(out, "/{}", std::net::Ipv6Addr::from(m));
            }
        }
    }
}

fn mac_masked(out: &mut String, v: u128, m: u128) {
    mac(out, v);
    if m != 0xffff_ffff_ffff {
        out.push('/');
        mac(out, m);
    }
}

/// Writes a port number the way OVS does (names for reserved ports).
pub fn write_port(out: &mut String, p: u32) {
    match PORT_NAMES.iter().find(|(_, n)| *n == p) {
        Some((name, _)) => out.push_str(name),
        None => {
            let _ = write!(out, "{p}");
        }
    }
}

fn write_table(out: &mut String, t: u8, names: Option<&TableNames>) {
    match names.and_then(|n| n.name(t)) {
        Some(name) => out.push_str(name),
        None => {
            let _ = write!(out, "{t}");
        }
    }
}

fn flag_names(format: ValueFormat) -> Vec<(&'static str, u128)> {
    if format == ValueFormat::CtState {
        ct_state::NAMES
            .iter()
            .map(|(n, b)| (*n, u128::from(*b)))
            .collect()
    } else {
        tcp_flags::NAMES
            .iter()
            .map(|(n, b)| (*n, u128::from(*b)))
            .collect()
    }
}

/// `ct_state`/`tcp_flags` values: `a|b` (exact), `+a-b` (masked), or hex
/// when bits without names are involved.
fn flags_masked(out: &mut String, field: Field, v: u128, m: u128) {
    let names = flag_names(field.format());
    let known = names.iter().fold(0u128, |a, (_, b)| a | b);
    if m == field.full_mask() && v & !known == 0 {
        if v == 0 {
            out.push('0');
        }
        let mut first = true;
        for (n, b) in &names {
            if v & b != 0 {
                if !first {
                    out.push('|');
                }
                out.push_str(n);
                first = false;
            }
        }
    } else if m & !known == 0 {
        for (n, b) in &names {
            if m & b != 0 {
                out.push(if v & b != 0 { '+' } else { '-' });
                out.push_str(n);
            }
        }
    } else {
        c_hex(out, v);
        out.push('/');
        c_hex(out, m);
    }
}

// ---------------------------------------------------------------------------
// Matches

/// Appends `name=` + C-`%#x` value (and `/%#x` mask when partial), as OVS
/// `format_uint32_masked`/`format_be64_masked`.
fn hex_field(out: &mut String, m: &Match, f: Field, name: &str) {
    let (v, mask) = m.get(f);
    if mask == 0 {
        return;
    }
    let _ = write!(out, "{name}=");
    c_hex(out, v);
    if mask != f.full_mask() {
        out.push('/');
        c_hex(out, mask);
    }
    out.push(',');
}

/// Decimal when exact, `0x../0x..` when masked (OVS `format_be16_masked`).
fn dec_field(out: &mut String, m: &Match, f: Field, name: &str, full: u128) {
    let (v, mask) = m.get(f);
    if mask == 0 {
        return;
    }
    if mask == full {
        let _ = write!(out, "{name}={v},");
    } else {
        let _ = write!(out, "{name}={v:#x}/{mask:#x},");
    }
}

fn addr_field(out: &mut String, m: &Match, f: Field, name: &str) {
    let (v, mask) = m.get(f);
    if mask == 0 {
        return;
    }
    let _ = write!(out, "{name}=");
    match f.format() {
        ValueFormat::Mac => mac_masked(out, v, mask),
        ValueFormat::Ipv6 => ipv6_masked(out, v, mask),
        _ => ipv4_masked(out, v, mask),
    }
    out.push(',');
}

/// The protocol shorthand of a match, if it has one, and whether it covers nw_proto.
fn shorthand(m: &Match) -> Option<(&'static str, bool)> {
    let (dl, dlm) = m.get(Field::DlType);
    if dlm != 0xffff {
        return None;
    }
    let (pr, prm) = m.get(Field::NwProto);
    let proto = (prm == 0xff).then_some(pr as u8);
    Some(match dl as u16 {
        eth_type::IPV4 => match proto {
            Some(ip_proto::ICMP) => ("icmp", true),
            Some(ip_proto::TCP) => ("tcp", true),
            Some(ip_proto::UDP) => ("udp", true),
            Some(ip_proto::SCTP) => ("sctp", true),
            _ => ("ip", false),
        },
        eth_type::IPV6 => match proto {
            Some(ip_proto::ICMPV6) => ("icmp6", true),
            Some(ip_proto::TCP) => ("tcp6", true),
            Some(ip_proto::UDP) => ("udp6", true),
            Some(ip_proto::SCTP) => ("sctp6", true),
            _ => ("ipv6", false),
        },
        eth_type::ARP => ("arp", false),
        eth_type::RARP => ("rarp", false),
        _ => return None,
    })
}

fn write_match(out: &mut String, m: &Match, priority: u16) {
    let start = out.len();
    if priority != DEFAULT_PRIORITY {
        let _ = write!(out, "priority={priority},");
    }
    hex_field(out, m, Field::PktMark, "pkt_mark");
    hex_field(out, m, Field::RecircId, "recirc_id");
    if m.has(Field::ConjId) {
        let (v, mask) = m.get(Field::ConjId);
        if mask == Field::ConjId.full_mask() {
            let _ = write!(out, "conj_id={v},");
        } else {
            let _ = write!(out, "conj_id={v:#x}/{mask:#x},");
        }
    }
    if m.has(Field::CtState) {
        let (v, mask) = m.get(Field::CtState);
        out.push_str("ct_state=");
        flags_masked(out, Field::CtState, v, mask);
        out.push(',');
    }
    dec_field(out, m, Field::CtZone, "ct_zone", 0xffff);
    hex_field(out, m, Field::CtMark, "ct_mark");
    if m.has(Field::CtLabel) {
        let (v, mask) = m.get(Field::CtLabel);
        let _ = write!(out, "ct_label={v:#x}");
        if mask != u128::MAX {
            let _ = write!(out, "/{mask:#x}");
        }
        out.push(',');
    }
    let sh = shorthand(m);
    if let Some((name, _)) = sh {
        let _ = write!(out, "{name},");
    }
    for r in 0..16 {
        hex_field(out, m, Field::Reg(r), Field::Reg(r).name());
    }
    hex_field(out, m, Field::TunId, "tun_id");
    addr_field(out, m, Field::TunSrc, "tun_src");
    addr_field(out, m, Field::TunDst, "tun_dst");
    addr_field(out, m, Field::TunIpv6Src, "tun_ipv6_src");
    addr_field(out, m, Field::TunIpv6Dst, "tun_ipv6_dst");
    hex_field(out, m, Field::Metadata, "metadata");
    if m.has(Field::InPort) {
        let (v, mask) = m.get(Field::InPort);
        out.push_str("in_port=");
        if mask == Field::InPort.full_mask() {
            write_port(out, v as u32);
        } else {
            let _ = write!(out, "{v:#x}/{mask:#x}");
        }
        out.push(',');
    }
    if m.has(Field::VlanTci) {
        let (v, mask) = m.get(Field::VlanTci);
        let vid = mask & 0x0fff;
        let pcp = mask & 0xe000;
        if mask & 0x1000 != 0
            && v & 0x1000 != 0
            && (vid == 0 || vid == 0x0fff)
            && (pcp == 0 || pcp == 0xe000)
            && (vid != 0 || pcp != 0)
        {
            if vid != 0 {
                let _ = write!(out, "dl_vlan={},", v & 0x0fff);
            }
            if pcp != 0 {
                let _ = write!(out, "dl_vlan_pcp={},", v >> 13);
            }
        } else if mask == 0xffff {
            let _ = write!(out, "vlan_tci={v:#06x},");
        } else {
            let _ = write!(out, "vlan_tci={v:#06x}/{mask:#06x},");
        }
    }
    addr_field(out, m, Field::DlSrc, "dl_src");
    addr_field(out, m, Field::DlDst, "dl_dst");
    let (dl, dlm) = m.get(Field::DlType);
    if sh.is_none() && dlm != 0 {
        if dlm == 0xffff {
            let _ = write!(out, "dl_type={dl:#06x},");
        } else {
            let _ = write!(out, "dl_type={dl:#06x}/{dlm:#06x},");
        }
    }
    let arp = dl as u16 == eth_type::ARP || dl as u16 == eth_type::RARP;
    let ipv6 = dl as u16 == eth_type::IPV6;
    let ipv6_fields = |out: &mut String| {
        addr_field(out, m, Field::Ipv6Src, "ipv6_src");
        addr_field(out, m, Field::Ipv6Dst, "ipv6_dst");
        let (v, mask) = m.get(Field::Ipv6Label);
        if mask == 0xfffff {
            let _ = write!(out, "ipv6_label={v:#07x},");
        } else if mask != 0 {
            let _ = write!(out, "ipv6_label={v:#07x}/{mask:#07x},");
        }
    };
    // The IPv4/ARP addresses and hardware addresses share bits with the
    // ND fields (`crate::field`, "Shared storage"): an IPv6 match has only
    // the latter.
    if ipv6 {
        ipv6_fields(out);
    } else if arp {
        addr_field(out, m, Field::NwSrc, "arp_spa");
        addr_field(out, m, Field::NwDst, "arp_tpa");
        ipv6_fields(out);
    } else {
        addr_field(out, m, Field::NwSrc, "nw_src");
        addr_field(out, m, Field::NwDst, "nw_dst");
        ipv6_fields(out);
    }
    if !sh.is_some_and(|(_, p)| p) && m.has(Field::NwProto) {
        let name = if arp { "arp_op" } else { "nw_proto" };
        dec_field(out, m, Field::NwProto, name, 0xff);
    }
    if arp {
        addr_field(out, m, Field::ArpSha, "arp_sha");
        addr_field(out, m, Field::ArpTha, "arp_tha");
    }
    let (tos, tosm) = m.get(Field::NwTos);
    if tosm & 0xfc != 0 {
        let _ = write!(out, "nw_tos={},", tos & 0xfc);
    }
    if tosm & 0x03 != 0 {
        let _ = write!(out, "nw_ecn={},", tos & 0x03);
    }
    dec_field(out, m, Field::NwTtl, "nw_ttl", 0xff);
    if m.has(Field::NwFrag) {
        let (v, mask) = m.get(Field::NwFrag);
        let (v, mask) = (v as u8, mask as u8);
        let both = frag::ANY | frag::LATER;
        let word = if mask == both {
            match v {
                0 => "no",
                x if x == frag::ANY => "first",
                x if x == both => "later",
                _ => "<error>",
            }
        } else if mask == frag::ANY {
            if v != 0 {
                "yes"
            } else {
                "no"
            }
        } else if v != 0 {
            "later"
        } else {
            "not_later"
        };
        let _ = write!(out, "nw_frag={word},");
    }
    if !arp && !ipv6 {
        addr_field(out, m, Field::ArpSha, "arp_sha");
        addr_field(out, m, Field::ArpTha, "arp_tha");
    }
    let icmp = matches!(sh, Some(("icmp", _)) | Some(("icmp6", _)));
    let (src, dst) = if icmp {
        ("icmp_type", "icmp_code")
    } else {
        ("tp_src", "tp_dst")
    };
    dec_field(out, m, Field::TpSrc, src, 0xffff);
    dec_field(out, m, Field::TpDst, dst, 0xffff);
    // ND fields: only in ICMPv6 flows (their prerequisites), in OVS's
    // order; the first three share bits with IPv4/ARP fields.
    if ipv6 {
        addr_field(out, m, Field::NdTarget, "nd_target");
        addr_field(out, m, Field::NdSll, "nd_sll");
        addr_field(out, m, Field::NdTll, "nd_tll");
    }
    dec_field(out, m, Field::NdReserved, "nd_reserved", 0xffff_ffff);
    dec_field(out, m, Field::NdOptionsType, "nd_options_type", 0xff);
    if m.has(Field::TcpFlags) {
        let (v, mask) = m.get(Field::TcpFlags);
        out.push_str("tcp_flags=");
        flags_masked(out, Field::TcpFlags, v, mask);
        out.push(',');
    }
    if out.len() > start && out.ends_with(',') {
        out.pop();
    }
}

/// The ND fields of an ND packet's key, as OVS's `flow_format` shows them:
/// target and link-layer addresses always, the flags word and option type
/// when not zero.
fn nd_key_fields(m: &mut Match, k: &FlowKey) {
    let (ty, code) = (k.get(Field::TpSrc) as u8, k.get(Field::TpDst) as u8);
    if !crate::wire::nd::is_nd(ty, code) {
        return;
    }
    for f in [Field::NdTarget, Field::NdSll, Field::NdTll] {
        m.set_exact(f, k.get(f));
    }
    for f in [Field::NdReserved, Field::NdOptionsType] {
        if k.get(f) != 0 {
            m.set_exact(f, k.get(f));
        }
    }
}

/// The match in `ovs-ofctl` order (`ip,in_port=1,nw_dst=10.0.0.0/24`); empty for catch-all.
pub fn format_match(m: &Match) -> String {
    let mut s = String::new();
    write_match(&mut s, m, DEFAULT_PRIORITY);
    s
}

/// The match with `priority=` first when it is not the default, as in dumps.
pub fn format_match_priority(m: &Match, priority: u16) -> String {
    let mut s = String::new();
    write_match(&mut s, m, priority);
    s
}

/// A packet's flow key in the shape of OVS `flow_format()` (the trace
/// "Flow:" line): non-zero metadata first, then in_port, vlan_tci, Ethernet
/// and the fields of the packet's protocol, all exact.
pub fn format_key(k: &FlowKey) -> String {
    let mut m = Match::CATCHALL;
    let exact = |m: &mut Match, f: Field| m.set_exact(f, k.get(f));
    for f in [
        Field::RecircId,
        Field::ConjId,
        Field::PktMark,
        Field::CtState,
        Field::CtZone,
        Field::CtMark,
        Field::CtLabel,
        Field::TunId,
        Field::TunSrc,
        Field::TunDst,
        Field::TunIpv6Src,
        Field::TunIpv6Dst,
        Field::Metadata,
    ] {
        if k.get(f) != 0 {
            exact(&mut m, f);
        }
    }
    for r in 0..16 {
        if k.get(Field::Reg(r)) != 0 {
            exact(&mut m, Field::Reg(r));
        }
    }
    for f in [
        Field::InPort,
        Field::VlanTci,
        Field::DlSrc,
        Field::DlDst,
        Field::DlType,
    ] {
        exact(&mut m, f);
    }
    let dl = k.get(Field::DlType) as u16;
    let proto = k.get(Field::NwProto) as u8;
    if dl == eth_type::IPV4 || dl == eth_type::IPV6 {
        if dl == eth_type::IPV4 {
            exact(&mut m, Field::NwSrc);
            exact(&mut m, Field::NwDst);
        } else {
            exact(&mut m, Field::Ipv6Src);
            exact(&mut m, Field::Ipv6Dst);
            exact(&mut m, Field::Ipv6Label);
        }
        for f in [Field::NwProto, Field::NwTos, Field::NwTtl] {
            exact(&mut m, f);
        }
        m.set(
            Field::NwFrag,
            k.get(Field::NwFrag),
            u128::from(frag::ANY | frag::LATER),
        );
        let later = k.get(Field::NwFrag) as u8 & frag::LATER != 0;
        if !later
            && matches!(
                proto,
                ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP | ip_proto::ICMP | ip_proto::ICMPV6
            )
        {
            exact(&mut m, Field::TpSrc);
            exact(&mut m, Field::TpDst);
            if proto == ip_proto::TCP {
                exact(&mut m, Field::TcpFlags);
            }
            if proto == ip_proto::ICMPV6 {
                nd_key_fields(&mut m, k);
            }
        }
    } else if dl == eth_type::ARP || dl == eth_type::RARP {
        for f in [
            Field::NwSrc,
            Field::NwDst,
            Field::NwProto,
            Field::ArpSha,
            Field::ArpTha,
        ] {
            exact(&mut m, f);
        }
    }
    let mut s = String::new();
    write_match(&mut s, &m, DEFAULT_PRIORITY);
    s
}

// ---------------------------------------------------------------------------
// Actions

fn write_subfield(out: &mut String, sf: &SubField) {
    out.push_str(sf.field.nxm_name());
    if sf.ofs == 0 && u32::from(sf.n_bits) == sf.field.bits() {
        out.push_str("[]");
    } else if sf.n_bits == 1 {
        let _ = write!(out, "[{}]", sf.ofs);
    } else {
        let _ = write!(
            out,
            "[{}..{}]",
            sf.ofs,
            u32::from(sf.ofs) + u32::from(sf.n_bits) - 1
        );
    }
}

/// The name `set_field` writes for a whole field, given the flow's match.
fn set_field_name(f: Field, m: Option<&Match>) -> &'static str {
    let (dl, proto) = match m {
        Some(m) => {
            let (dl, dlm) = m.get(Field::DlType);
            let (pr, prm) = m.get(Field::NwProto);
            (
                (dlm == 0xffff).then_some(dl as u16),
                (prm == 0xff).then_some(pr as u8),
            )
        }
        None => (None, None),
    };
    let arp = matches!(dl, Some(eth_type::ARP) | Some(eth_type::RARP));
    match f {
        Field::DlSrc => "eth_src",
        Field::DlDst => "eth_dst",
        Field::DlType => "eth_type",
        Field::NwSrc if arp => "arp_spa",
        Field::NwDst if arp => "arp_tpa",
        Field::NwSrc => "ip_src",
        Field::NwDst => "ip_dst",
        Field::NwProto if arp => "arp_op",
        Field::TpSrc | Field::TpDst => {
            let src = f == Field::TpSrc;
            match proto {
                Some(ip_proto::TCP) => {
                    if src {
                        "tcp_src"
                    } else {
                        "tcp_dst"
                    }
                }
                Some(ip_proto::UDP) => {
                    if src {
                        "udp_src"
                    } else {
                        "udp_dst"
                    }
                }
                Some(ip_proto::SCTP) => {
                    if src {
                        "sctp_src"
                    } else {
                        "sctp_dst"
                    }
                }
                Some(ip_proto::ICMP) | Some(ip_proto::ICMPV6) => {
                    if src {
                        "icmp_type"
                    } else {
                        "icmp_code"
                    }
                }
                _ => f.name(),
            }
        }
        _ => f.name(),
    }
}

/// A value (no mask) for `set_field`, in the field's own text format.
fn set_field_value(out: &mut String, format: ValueFormat, v: u128) {
    match format {
        ValueFormat::Mac => mac(out, v),
        ValueFormat::Ipv4 => {
            let _ = write!(out, "{}", std::net::Ipv4Addr::from(v as u32));
        }
        ValueFormat::Ipv6 => {
            let _ = write!(out, "{}", std::net::Ipv6Addr::from(v));
        }
        ValueFormat::Decimal => {
            let _ = write!(out, "{v}");
        }
        _ => {
            let _ = write!(out, "{v:#x}");
        }
    }
}

fn write_set_field(out: &mut String, field: Field, value: u128, mask: u128, m: Option<&Match>) {
    out.push_str("set_field:");
    let full = field.full_mask();
    let name = set_field_name(field, m);
    let is_icmp_name = matches!(name, "icmp_type" | "icmp_code");
    if field == Field::NwTos && (mask == 0xfc || mask == 0x03) {
        let _ = write!(
            out,
            "{value}->{}",
            if mask == 0xfc { "nw_tos" } else { "nw_ecn" }
        );
        return;
    }
    if field == Field::InPort && mask == full {
        write_port(out, value as u32);
        let _ = write!(out, "->{name}");
        return;
    }
    if is_icmp_name && (mask != full || value > 0xff) {
        // Not expressible with the 8-bit ICMP names.
        let _ = write!(out, "{value:#x}/{mask:#x}->{}", field.name());
        return;
    }
    let format = field.format();
    set_field_value(out, format, value);
    if mask != full {
        out.push('/');
        match format {
            ValueFormat::Mac | ValueFormat::Ipv4 | ValueFormat::Ipv6 => {
                set_field_value(out, format, mask)
            }
            _ => {
                let _ = write!(out, "{mask:#x}");
            }
        }
    }
    let _ = write!(out, "->{name}");
}

fn write_controller(out: &mut String, c: &ControllerAction) {
    if c.reason == PacketInReason::Action && c.userdata.is_empty() && c.controller_id == 0 {
        let _ = write!(out, "CONTROLLER:{}", c.max_len);
        return;
    }
    let mut parts: Vec<String> = Vec::new();
    match c.reason {
        PacketInReason::Action => {}
        PacketInReason::NoMatch => parts.push("reason=no_match".into()),
        PacketInReason::InvalidTtl => parts.push("reason=invalid_ttl".into()),
    }
    if c.max_len != u16::MAX {
        parts.push(format!("max_len={}", c.max_len));
    }
    if c.controller_id != 0 {
        parts.push(format!("id={}", c.controller_id));
    }
    if !c.userdata.is_empty() {
        parts.push(format!("userdata={}", hex_bytes(&c.userdata)));
    }
    let _ = write!(out, "controller({})", parts.join(","));
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(".")
}

fn write_action(out: &mut String, a: &Action, names: Option<&TableNames>, m: Option<&Match>) {
    match a {
        Action::Output(p) => match *p {
            port::IN_PORT | port::NORMAL | port::FLOOD | port::ALL | port::LOCAL => {
                write_port(out, *p)
            }
            _ => {
                out.push_str("output:");
                write_port(out, *p);
            }
        },
        Action::OutputReg(sf) => {
            out.push_str("output:");
            write_subfield(out, sf);
        }
        Action::Controller(c) => write_controller(out, c),
        Action::GotoTable(t) => {
            out.push_str("goto_table:");
            write_table(out, *t, names);
        }
        Action::Resubmit { in_port, table } => match (in_port, table) {
            (Some(p), None) => {
                out.push_str("resubmit:");
                write_port(out, *p);
            }
            _ => {
                out.push_str("resubmit(");
                if let Some(p) = in_port {
                    write_port(out, *p);
                }
                out.push(',');
                if let Some(t) = table {
                    write_table(out, *t, names);
                }
                out.push(')');
            }
        },
        Action::SetField { field, value, mask } => write_set_field(out, *field, *value, *mask, m),
        Action::Load { dst, value } => {
            let _ = write!(out, "load:{value:#x}->");
            write_subfield(out, dst);
        }
        Action::Move { src, dst } => {
            out.push_str("move:");
            write_subfield(out, src);
            out.push_str("->");
            write_subfield(out, dst);
        }
        Action::ModDlSrc(v) | Action::ModDlDst(v) => {
            out.push_str(if matches!(a, Action::ModDlSrc(_)) {
                "mod_dl_src:"
            } else {
                "mod_dl_dst:"
            });
            mac(out, u128::from(*v));
        }
        Action::ModNwSrc(v) | Action::ModNwDst(v) => {
            let kw = if matches!(a, Action::ModNwSrc(_)) {
                "mod_nw_src"
            } else {
                "mod_nw_dst"
            };
            let _ = write!(out, "{kw}:{}", std::net::Ipv4Addr::from(*v));
        }
        Action::DecTtl => out.push_str("dec_ttl"),
        Action::PushVlan(t) => {
            let _ = write!(out, "push_vlan:{t:#x}");
        }
        Action::PopVlan => out.push_str("pop_vlan"),
        Action::SetTunnel(id) => {
            if *id > u64::from(u32::MAX) {
                let _ = write!(out, "set_tunnel64:{id:#x}");
            } else {
                let _ = write!(out, "set_tunnel:{id:#x}");
            }
        }
        Action::Ct(ct) => {
            let mut parts: Vec<String> = Vec::new();
            if ct.commit {
                parts.push("commit".into());
            }
            if ct.force {
                parts.push("force".into());
            }
            if let Some(t) = ct.table {
                let mut s = String::from("table=");
                write_table(&mut s, t, names);
                parts.push(s);
            }
            match ct.zone {
                CtZoneSrc::Imm(0) => {}
                CtZoneSrc::Imm(z) => parts.push(format!("zone={z}")),
                CtZoneSrc::Field(sf) => {
                    let mut s = String::from("zone=");
                    write_subfield(&mut s, &sf);
                    parts.push(s);
                }
            }
            // A nat that comes first prints outside `exec`, as OVS does.
            let mut exec = &ct.exec[..];
            if let Some((Action::Nat(n), rest)) = exec.split_first() {
                let mut s = String::new();
                write_nat(&mut s, n);
                parts.push(s);
                exec = rest;
            }
            if !exec.is_empty() {
                let mut s = String::from("exec(");
                write_actions(&mut s, exec, names, m);
                s.push(')');
                parts.push(s);
            }
            let _ = write!(out, "ct({})", parts.join(","));
        }
        Action::CtClear => out.push_str("ct_clear"),
        Action::Meter(id) => {
            let _ = write!(out, "meter:{id}");
        }
        Action::Nat(n) => write_nat(out, n),
        Action::Group(id) => {
            let _ = write!(out, "group:{id}");
        }
        Action::Conjunction {
            id,
            clause,
            n_clauses,
        } => {
            let _ = write!(out, "conjunction({id},{clause}/{n_clauses})");
        }
        Action::Note(bytes) => {
            let _ = write!(out, "note:{}", hex_bytes(bytes));
        }
        Action::Learn(l) => write_learn(out, l, names),
    }
}

/// A learn sub-field as OVS prints it: `NXM_OF_TCP_DST[]`, `NXM_NX_REG0[20]`,
/// `NXM_NX_REG4[0..15]`.
fn write_learn_subfield(out: &mut String, sf: &LearnSubField) {
    out.push_str(sf.field.nxm);
    if sf.is_whole() {
        out.push_str("[]");
    } else if sf.n_bits == 1 {
        let _ = write!(out, "[{}]", sf.ofs);
    } else {
        let _ = write!(
            out,
            "[{}..{}]",
            sf.ofs,
            u32::from(sf.ofs) + u32::from(sf.n_bits) - 1
        );
    }
}

/// A learn constant as OVS's `ds_put_hex` prints it: `0x12`, `0`.
fn write_learn_hex(out: &mut String, v: u128) {
    c_hex(out, v);
}

/// `learn(...)`, as OVS's `learn_format` prints it.
fn write_learn(out: &mut String, l: &LearnAction, names: Option<&TableNames>) {
    out.push_str("learn(table=");
    write_table(out, l.table, names);
    for (v, name) in [
        (l.idle_timeout, "idle_timeout"),
        (l.hard_timeout, "hard_timeout"),
        (l.fin_idle_timeout, "fin_idle_timeout"),
        (l.fin_hard_timeout, "fin_hard_timeout"),
    ] {
        if v != 0 {
            let _ = write!(out, ",{name}={v}");
        }
    }
    if l.priority != DEFAULT_PRIORITY {
        let _ = write!(out, ",priority={}", l.priority);
    }
    if l.send_flow_rem {
        out.push_str(",send_flow_rem");
    }
    if l.delete_learned {
        out.push_str(",delete_learned");
    }
    if l.cookie != 0 {
        let _ = write!(out, ",cookie={:#x}", l.cookie);
    }
    if l.limit != 0 {
        let _ = write!(out, ",limit={}", l.limit);
    }
    if let Some(r) = &l.result_dst {
        out.push_str(",result_dst=");
        write_learn_subfield(out, r);
    }
    for spec in &l.specs {
        out.push(',');
        match spec {
            LearnSpec::Match {
                dst,
                src: LearnSrc::Imm(v),
            } => {
                if dst.is_whole() {
                    let _ = write!(out, "{}=", dst.field.name);
                    write_learn_value(out, &dst.field, *v);
                } else {
                    write_learn_subfield(out, dst);
                    out.push('=');
                    write_learn_hex(out, *v);
                }
            }
            LearnSpec::Match {
                dst,
                src: LearnSrc::Field(s),
            } => {
                write_learn_subfield(out, dst);
                if s.field.nxm != dst.field.nxm || s.ofs != dst.ofs {
                    out.push('=');
                    write_learn_subfield(out, s);
                }
            }
            LearnSpec::Load { dst, src } => {
                out.push_str("load:");
                match src {
                    LearnSrc::Imm(v) => write_learn_hex(out, *v),
                    LearnSrc::Field(s) => write_learn_subfield(out, s),
                }
                out.push_str("->");
                write_learn_subfield(out, dst);
            }
            LearnSpec::Output { src } => {
                out.push_str("output:");
                write_learn_subfield(out, src);
            }
        }
    }
    out.push(')');
}

/// A constant for a whole field, as OVS's `mf_format` writes it.
fn write_learn_value(out: &mut String, f: &OvsField, v: u128) {
    match f.format {
        _ if f.field == Field::InPort => {
            let p = if f.is_in_port16() {
                crate::learn::port_from_ofp10(v as u16)
            } else {
                v as u32
            };
            write_port(out, p);
        }
        ValueFormat::Mac => mac(out, v),
        ValueFormat::Ipv4 => {
            let _ = write!(out, "{}", std::net::Ipv4Addr::from(v as u32));
        }
        ValueFormat::Ipv6 => {
            let _ = write!(out, "{}", std::net::Ipv6Addr::from(v));
        }
        ValueFormat::Decimal => {
            let _ = write!(out, "{v}");
        }
        _ => c_hex(out, v),
    }
}

/// `nat`, `nat(dst=10.0.0.2-10.0.0.4:80-90,random)`, `nat(src=[fe80::1]:5)`:
/// OVS's format (an IPv6 address in brackets only when a port follows;
/// flags only with an address range).
pub fn write_nat(out: &mut String, n: &NatAction) {
    out.push_str("nat");
    let Some(kind) = n.kind else {
        return;
    };
    out.push('(');
    out.push_str(match kind {
        NatKind::Src => "src",
        NatKind::Dst => "dst",
    });
    if let Some(r) = n.range {
        out.push('=');
        let bracket = r.ports.is_some();
        let addr = |out: &mut String, a: std::net::IpAddr| match a {
            std::net::IpAddr::V6(v6) if bracket => {
                let _ = write!(out, "[{v6}]");
            }
            a => {
                let _ = write!(out, "{a}");
            }
        };
        addr(out, r.addr_min);
        if r.addr_max != r.addr_min {
            out.push('-');
            addr(out, r.addr_max);
        }
        if let Some((lo, hi)) = r.ports {
            let _ = write!(out, ":{lo}");
            if hi != lo {
                let _ = write!(out, "-{hi}");
            }
        }
        for (on, name) in [
            (n.persistent, ",persistent"),
            (n.hash, ",hash"),
            (n.random, ",random"),
        ] {
            if on {
                out.push_str(name);
            }
        }
    }
    out.push(')');
}

fn write_actions(
    out: &mut String,
    actions: &[Action],
    names: Option<&TableNames>,
    m: Option<&Match>,
) {
    if actions.is_empty() {
        out.push_str("drop");
        return;
    }
    for (i, a) in actions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_action(out, a, names, m);
    }
}

/// The action list (`drop` when empty).
pub fn format_actions(a: &[Action], names: Option<&TableNames>) -> String {
    let mut s = String::new();
    write_actions(&mut s, a, names, None);
    s
}

/// The action list, naming `set_field` targets for the flow's protocol
/// (`tcp_dst` in a `tcp` flow, `arp_spa` in an `arp` flow).
pub fn format_actions_for(a: &[Action], m: &Match, names: Option<&TableNames>) -> String {
    let mut s = String::new();
    write_actions(&mut s, a, names, Some(m));
    s
}

// ---------------------------------------------------------------------------
// Flows

/// Appends the parts of a flow common to dumps and `format_flow`:
/// timeouts, flags, importance (each followed by `, ` or a space as OVS).
fn write_flow_params(out: &mut String, f: &Flow) {
    if f.idle_timeout != 0 {
        let _ = write!(out, "idle_timeout={}, ", f.idle_timeout);
    }
    if f.hard_timeout != 0 {
        let _ = write!(out, "hard_timeout={}, ", f.hard_timeout);
    }
    let fl = &f.flags;
    for (on, name) in [
        (fl.send_flow_rem, "send_flow_rem"),
        (fl.check_overlap, "check_overlap"),
        (fl.reset_counts, "reset_counts"),
        (fl.no_packet_counts, "no_packet_counts"),
        (fl.no_byte_counts, "no_byte_counts"),
    ] {
        if on {
            let _ = write!(out, "{name} ");
        }
    }
    if f.importance != 0 {
        let _ = write!(out, "importance={}, ", f.importance);
    }
}

fn write_match_actions(out: &mut String, f: &Flow, names: Option<&TableNames>) {
    write_match(out, &f.matches, f.priority);
    if !out.ends_with(' ') && !out.is_empty() {
        out.push(' ');
    }
    out.push_str("actions=");
    write_actions(out, &f.actions, names, Some(&f.matches));
}

/// A flow in `add-flow` syntax (what `ovs-ofctl --no-stats dump-flows`
/// prints, without the leading space); [`crate::parse::parse_flow`] reads
/// it back to the same [`Flow`].
pub fn format_flow(f: &Flow, names: Option<&TableNames>) -> String {
    let mut s = String::new();
    if f.cookie != 0 {
        let _ = write!(s, "cookie={:#x}, ", f.cookie);
    }
    if f.table != 0 || names.and_then(|n| n.name(f.table)).is_some() {
        s.push_str("table=");
        write_table(&mut s, f.table, names);
        s.push_str(", ");
    }
    write_flow_params(&mut s, f);
    write_match_actions(&mut s, f, names);
    s
}

/// One `dump-flows` line.
pub fn format_dump_line(flow: &Flow, stats: &FlowStats, opts: &DumpOptions) -> String {
    let names = opts.names.as_ref();
    let mut s = String::from(" ");
    if opts.stats || flow.cookie != 0 {
        let _ = write!(s, "cookie={:#x}, ", flow.cookie);
    }
    if opts.stats {
        let secs = stats.duration_ns / 1_000_000_000;
        let ms = (stats.duration_ns % 1_000_000_000) / 1_000_000;
        let _ = write!(s, "duration={secs}.{ms:03}s, ");
    }
    if opts.stats || flow.table != 0 || names.and_then(|n| n.name(flow.table)).is_some() {
        s.push_str("table=");
        write_table(&mut s, flow.table, names);
        s.push_str(", ");
    }
    if opts.stats {
        let _ = write!(
            s,
            "n_packets={}, n_bytes={}, ",
            stats.n_packets, stats.n_bytes
        );
    }
    write_flow_params(&mut s, flow);
    if opts.stats {
        let age = stats
            .idle_age_s
            .unwrap_or(stats.duration_ns / 1_000_000_000);
        let _ = write!(s, "idle_age={age}, ");
    }
    write_match_actions(&mut s, flow, names);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{parse_flow, parse_packet_spec, ParseContext};

    fn flow(s: &str) -> Flow {
        parse_flow(s, &ParseContext::default()).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn no_stats(s: &str) -> String {
        format_dump_line(
            &flow(s),
            &FlowStats::default(),
            &DumpOptions {
                stats: false,
                names: None,
            },
        )
    }

    /// (input, what `ovs-ofctl -O OpenFlow15 --no-stats dump-flows` printed
    /// for it on OVS 3.1, adjusted only where the module doc says we differ).
    const GOLDEN: &[(&str, &str)] = &[
        ("table=0,priority=100,ip,nw_dst=10.0.0.1,actions=output:2", " priority=100,ip,nw_dst=10.0.0.1 actions=output:2"),
        ("table=3,ct_state=+trk,actions=conjunction(1,2/3)", " table=3, ct_state=+trk actions=conjunction(1,2/3)"),
        ("table=4,dl_vlan=5,dl_vlan_pcp=3,ip_dscp=3,ip,nw_ecn=1,actions=drop", " table=4, ip,dl_vlan=5,dl_vlan_pcp=3,nw_tos=12,nw_ecn=1 actions=drop"),
        ("table=5,udp,tp_dst=0x1000/0xf000,dl_src=00:11:22:00:00:00/ff:ff:ff:00:00:00,in_port=LOCAL,vlan_tci=0x1005/0x1fff,actions=drop",
         " table=5, udp,in_port=LOCAL,dl_vlan=5,dl_src=00:11:22:00:00:00/ff:ff:ff:00:00:00,tp_dst=0x1000/0xf000 actions=drop"),
        ("table=5,tcp6,ipv6_src=2001:db8::/64,tcp_flags=+syn-ack,actions=drop", " table=5, tcp6,ipv6_src=2001:db8::/64,tcp_flags=+syn-ack actions=drop"),
        ("table=6,ip,nw_frag=first,nw_tos=4,actions=drop", " table=6, ip,nw_tos=4,nw_frag=first actions=drop"),
        ("table=6,ip,nw_frag=not_later,actions=drop", " table=6, ip,nw_frag=not_later actions=drop"),
        ("table=6,ip,nw_frag=yes,nw_dst=10.0.0.0/255.255.0.255,actions=drop", " table=6, ip,nw_dst=10.0.0.0/255.255.0.255,nw_frag=yes actions=drop"),
        ("table=6,ipv6,ipv6_dst=2001:db8::1,ipv6_label=0x12,actions=drop", " table=6, ipv6,ipv6_dst=2001:db8::1,ipv6_label=0x00012 actions=drop"),
        ("table=7,arp,arp_op=1,arp_sha=00:11:22:33:44:55,arp_tpa=1.2.3.0/24,actions=drop", " table=7, arp,arp_tpa=1.2.3.0/24,arp_op=1,arp_sha=00:11:22:33:44:55 actions=drop"),
        // As OVS 3.1 dumps them (nd_reserved in decimal).
        ("priority=190,icmp6,icmp_type=136,nd_target=fd00:10:244:1::5,nd_tll=0a:00:00:00:00:05,actions=output:2", " priority=190,icmp6,icmp_type=136,nd_target=fd00:10:244:1::5,nd_tll=0a:00:00:00:00:05 actions=output:2"),
        ("icmp6,icmp_type=136,nd_reserved=0x60000000,nd_options_type=2,actions=drop", " icmp6,icmp_type=136,nd_reserved=1610612736,nd_options_type=2 actions=drop"),
        ("icmp6,icmp_type=135,nd_sll=0a:00:00:00:00:05,nd_target=fd00::/16,actions=drop", " icmp6,icmp_type=135,nd_target=fd00::/16,nd_sll=0a:00:00:00:00:05 actions=drop"),
        ("table=7,icmp,icmp_type=8,icmp_code=0,nw_ttl=3,actions=drop", " table=7, icmp,nw_ttl=3,icmp_type=8,icmp_code=0 actions=drop"),
        ("table=7,icmp6,icmpv6_type=135,actions=drop", " table=7, icmp6,icmp_type=135 actions=drop"),
        ("table=7,udp6,udp_dst=53,actions=drop", " table=7, udp6,tp_dst=53 actions=drop"),
        ("table=8,rarp,actions=drop", " table=8, rarp actions=drop"),
        ("table=8,dl_type=0x0800,nw_proto=6,actions=drop", " table=8, tcp actions=drop"),
        ("table=8,dl_type=0x0800,nw_proto=99,actions=drop", " table=8, ip,nw_proto=99 actions=drop"),
        ("table=8,eth,dl_type=0x1234,actions=drop", " table=8, dl_type=0x1234 actions=drop"),
        ("table=8,metadata=0x5,tun_id=0x7/0xff,tun_src=1.1.1.1,tun_dst=2.2.2.0/24,pkt_mark=0x3,ct_mark=0x5/0xf,ct_zone=5,ct_label=0x1/0x1,conj_id=7,recirc_id=0x0,xreg1=0x5,actions=drop",
         " table=8, pkt_mark=0x3,recirc_id=0,conj_id=7,ct_zone=5,ct_mark=0x5/0xf,ct_label=0x1/0x1,reg2=0,reg3=0x5,tun_id=0x7/0xff,tun_src=1.1.1.1,tun_dst=2.2.2.0/24,metadata=0x5 actions=drop"),
        ("table=9,ct_state=0x22/0x26,actions=drop", " table=9, ct_state=+est-rel+trk actions=drop"),
        // As OVS 3.1 (`ovs-ofctl -O OpenFlow15 parse-flow`) prints them.
        ("table=3,tun_ipv6_dst=fd00::1/ffff::ff,ipv6,tun_ipv6_src=fd00::/64,tun_src=1.1.1.1,actions=set_field:fd00::2->tun_ipv6_dst,move:NXM_NX_TUN_IPV6_SRC[0..31]->NXM_NX_REG0[],move:tun_ipv6_dst[64..95]->NXM_NX_REG1[]",
         " table=3, ipv6,tun_src=1.1.1.1,tun_ipv6_src=fd00::/64,tun_ipv6_dst=fd00::1/ffff::ff actions=set_field:fd00::2->tun_ipv6_dst,move:NXM_NX_TUN_IPV6_SRC[0..31]->NXM_NX_REG0[],move:NXM_NX_TUN_IPV6_DST[64..95]->NXM_NX_REG1[]"),
        ("dl_vlan=0xffff,actions=drop", " vlan_tci=0x0000/0x1fff actions=drop"),
        ("vlan_tci=0x1005,actions=drop", " dl_vlan=5,dl_vlan_pcp=0 actions=drop"),
        ("vlan_vid=5,actions=drop", " vlan_tci=0x0005/0x1fff actions=drop"),
        ("ip,nw_dst=1.2.3.0/24,nw_src=1.2.3.4/32,actions=drop", " ip,nw_src=1.2.3.4,nw_dst=1.2.3.0/24 actions=drop"),
        ("in_port=4294967295,actions=drop", " in_port=ANY actions=drop"),
        ("table=2,idle_timeout=10,hard_timeout=20,importance=3,send_flow_rem,check_overlap,reset_counts,no_packet_counts,no_byte_counts,cookie=0x5,priority=5,ip,ct_state=+trk+est-rel,reg1=0x5/0xff,actions=ct(commit,zone=5,exec(set_field:0x1/0xff->ct_mark,set_field:0x5->ct_label,load:0x3->NXM_NX_CT_MARK[0..3]))",
         " cookie=0x5, table=2, idle_timeout=10, hard_timeout=20, send_flow_rem check_overlap reset_counts no_packet_counts no_byte_counts importance=3, priority=5,ct_state=+est-rel+trk,ip,reg1=0x5/0xff actions=ct(commit,zone=5,exec(set_field:0x1/0xff->ct_mark,set_field:0x5->ct_label,set_field:0x3/0xf->ct_mark))"),
        ("table=3,arp,nw_src=10.0.0.1,actions=output:NXM_NX_REG1[],output:reg1,output:NXM_NX_REG1[0..15],in_port,LOCAL,ALL,FLOOD,CONTROLLER,controller(reason=no_match,userdata=01.02.03,max_len=100,id=3)",
         " table=3, arp,arp_spa=10.0.0.1 actions=output:NXM_NX_REG1[],output:NXM_NX_REG1[],output:NXM_NX_REG1[0..15],IN_PORT,LOCAL,ALL,FLOOD,CONTROLLER:65535,controller(reason=no_match,max_len=100,id=3,userdata=01.02.03)"),
        ("table=5,arp,actions=set_field:1->arp_op,set_field:1.2.3.4->arp_spa,move:NXM_OF_ETH_SRC[]->NXM_NX_ARP_SHA[],set_field:00:11:22:33:44:55->arp_sha",
         " table=5, arp actions=set_field:1->arp_op,set_field:1.2.3.4->arp_spa,move:NXM_OF_ETH_SRC[]->NXM_NX_ARP_SHA[],set_field:00:11:22:33:44:55->arp_sha"),
        ("table=6,ipv6,actions=set_field:2001:db8::1->ipv6_src,set_field:0x12->ipv6_label",
         " table=6, ipv6 actions=set_field:2001:db8::1->ipv6_src,set_field:0x12->ipv6_label"),
        ("table=4,dl_type=0x0800,actions=dec_ttl,set_field:1->nw_ttl,set_field:4->nw_tos,move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],move:NXM_NX_CT_LABEL[0..31]->NXM_NX_REG0[],set_field:0x1->tun_id,set_field:0x5->xreg1,goto_table:5",
         " table=4, ip actions=dec_ttl,set_field:1->nw_ttl,set_field:4->nw_tos,move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],move:NXM_NX_CT_LABEL[0..31]->NXM_NX_REG0[],set_field:0x1->tun_id,set_field:0x5->xreg1,goto_table:5"),
        ("table=7,priority=1,actions=push_vlan:0x88a8", " table=7, priority=1 actions=push_vlan:0x88a8"),
        ("table=7,priority=2,actions=output:in_port", " table=7, priority=2 actions=IN_PORT"),
        ("table=7,priority=5,actions=controller(reason=invalid_ttl)", " table=7, priority=5 actions=controller(reason=invalid_ttl)"),
        ("table=7,priority=11,ip,actions=resubmit(,8),output:NXM_NX_REG0[0..15],output:reg0[0..3]",
         " table=7, priority=11,ip actions=resubmit(,8),output:NXM_NX_REG0[0..15],output:NXM_NX_REG0[0..3]"),
        ("table=7,priority=12,ip,actions=ct(zone=5,table=8),ct(zone=reg0[0..15]),ct(commit,exec(set_field:1->ct_mark)),ct",
         " table=7, priority=12,ip actions=ct(table=8,zone=5),ct(zone=NXM_NX_REG0[0..15]),ct(commit,exec(set_field:0x1->ct_mark)),ct()"),
        // OXM names in sub-fields: `ovs-ofctl -O OpenFlow13 parse-flows`
        // (OVS 3.1; OpenFlow 1.3 still prints load as load).
        ("vlan_tci=0x1000/0x1000,actions=move:OXM_OF_VLAN_VID[]->NXM_NX_REG0[0..11],move:OXM_OF_VLAN_PCP[]->NXM_NX_REG0[12..14],load:0x5->OXM_OF_VLAN_VID[],move:NXM_NX_REG1[0..2]->OXM_OF_VLAN_PCP[]",
         " vlan_tci=0x1000/0x1000 actions=move:OXM_OF_VLAN_VID[]->NXM_NX_REG0[0..11],move:OXM_OF_VLAN_PCP[]->NXM_NX_REG0[12..14],load:0x5->OXM_OF_VLAN_VID[],move:NXM_NX_REG1[0..2]->OXM_OF_VLAN_PCP[]"),
        ("actions=move:OXM_OF_METADATA[]->OXM_OF_PKT_REG0[],move:OXM_OF_IN_PORT[]->NXM_NX_REG1[],load:0x5->OXM_OF_METADATA[0..7],move:OXM_OF_ETH_SRC[]->OXM_OF_ETH_DST[],output:OXM_OF_IN_PORT[]",
         " actions=move:OXM_OF_METADATA[]->OXM_OF_PKT_REG0[],move:OXM_OF_IN_PORT[]->NXM_NX_REG1[],load:0x5->OXM_OF_METADATA[0..7],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],output:OXM_OF_IN_PORT[]"),
        ("ip,actions=move:OXM_OF_IPV4_SRC[]->OXM_OF_IPV4_DST[],move:OXM_OF_IP_DSCP[]->NXM_NX_REG0[0..5],move:OXM_OF_IP_ECN[]->NXM_NX_REG0[6..7],move:OXM_OF_IP_PROTO[]->NXM_NX_REG3[0..7]",
         " ip actions=move:NXM_OF_IP_SRC[]->NXM_OF_IP_DST[],move:OXM_OF_IP_DSCP[]->NXM_NX_REG0[0..5],move:NXM_NX_IP_ECN[]->NXM_NX_REG0[6..7],move:NXM_OF_IP_PROTO[]->NXM_NX_REG3[0..7]"),
        ("tcp,actions=move:OXM_OF_TCP_DST[]->NXM_NX_REG2[0..15],load:80->OXM_OF_TCP_SRC[]",
         " tcp actions=move:NXM_OF_TCP_DST[]->NXM_NX_REG2[0..15],load:0x50->NXM_OF_TCP_SRC[]"),
        ("udp,actions=move:OXM_OF_UDP_SRC[]->NXM_NX_REG2[0..15],move:udp_dst[]->NXM_NX_REG3[0..15]",
         " udp actions=move:NXM_OF_UDP_SRC[]->NXM_NX_REG2[0..15],move:NXM_OF_UDP_DST[]->NXM_NX_REG3[0..15]"),
        ("sctp,actions=move:OXM_OF_SCTP_DST[]->NXM_NX_REG2[0..15]",
         " sctp actions=move:OXM_OF_SCTP_DST[]->NXM_NX_REG2[0..15]"),
        ("arp,actions=move:OXM_OF_ARP_SPA[]->OXM_OF_ARP_TPA[],move:OXM_OF_ARP_SHA[]->OXM_OF_ARP_THA[]",
         " arp actions=move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[]"),
        ("icmp,actions=move:OXM_OF_ICMPV4_TYPE[]->NXM_NX_REG0[0..7],move:OXM_OF_ICMPV4_CODE[]->NXM_NX_REG0[8..15]",
         " icmp actions=move:NXM_OF_ICMP_TYPE[]->NXM_NX_REG0[0..7],move:NXM_OF_ICMP_CODE[]->NXM_NX_REG0[8..15]"),
        ("ipv6,actions=move:OXM_OF_IPV6_SRC[]->OXM_OF_IPV6_DST[],move:OXM_OF_IPV6_FLABEL[]->NXM_NX_REG0[0..19]",
         " ipv6 actions=move:NXM_NX_IPV6_SRC[]->NXM_NX_IPV6_DST[],move:NXM_NX_IPV6_LABEL[]->NXM_NX_REG0[0..19]"),
        ("ip,actions=ct(zone=OXM_OF_METADATA[0..15]),move:OXM_OF_TUNNEL_ID[0..31]->NXM_NX_REG0[],move:OXM_OF_ETH_TYPE[]->NXM_NX_REG1[0..15]",
         " ip actions=ct(zone=OXM_OF_METADATA[0..15]),move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],move:NXM_OF_ETH_TYPE[]->NXM_NX_REG1[0..15]"),
        ("actions=learn(table=1,OXM_OF_VLAN_VID[],OXM_OF_ETH_SRC[],load:OXM_OF_METADATA[]->OXM_OF_METADATA[],load:OXM_OF_IN_PORT[]->NXM_NX_REG1[],output:OXM_OF_IN_PORT[])",
         " actions=learn(table=1,OXM_OF_VLAN_VID[],NXM_OF_ETH_SRC[],load:OXM_OF_METADATA[]->OXM_OF_METADATA[],load:OXM_OF_IN_PORT[]->NXM_NX_REG1[],output:OXM_OF_IN_PORT[])"),
        ("ip,actions=learn(table=1,eth_type=0x800,OXM_OF_IPV4_SRC[],OXM_OF_IPV4_DST[]=OXM_OF_IPV4_SRC[],load:OXM_OF_IPV4_DST[]->NXM_NX_REG0[])",
         " ip actions=learn(table=1,eth_type=0x800,NXM_OF_IP_SRC[],NXM_OF_IP_DST[]=NXM_OF_IP_SRC[],load:NXM_OF_IP_DST[]->NXM_NX_REG0[])"),
        ("tcp,actions=learn(table=1,eth_type=0x800,nw_proto=6,OXM_OF_TCP_DST[],OXM_OF_VLAN_VID[]=0x5)",
         " tcp actions=learn(table=1,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],vlan_vid=5)"),
        ("priority=500,in_port=1,actions=meter:1,output:2", " priority=500,in_port=1 actions=meter:1,output:2"),
        // ovs-ofctl -O OpenFlow15 dump-flows (OVS 3.1).
        ("table=1,priority=10,tcp actions=ct(commit,exec(move:NXM_NX_REG0[0..3]->NXM_NX_CT_MARK[0..3],move:NXM_NX_REG1[]->NXM_NX_CT_LABEL[0..31])),output:1",
         " table=1, priority=10,tcp actions=ct(commit,exec(move:NXM_NX_REG0[0..3]->NXM_NX_CT_MARK[0..3],move:NXM_NX_REG1[]->NXM_NX_CT_LABEL[0..31])),output:1"),
        ("tcp,tp_src=5,actions=set_field:5->tcp_src", " tcp,tp_src=5 actions=set_field:5->tcp_src"),
        ("actions=drop", " actions=drop"),
        // Our spellings (see the module doc): load, mod_*, resubmit, set_tunnel, note.
        ("actions=load:0x1->NXM_NX_REG0[],load:0x5->NXM_NX_REG2[0..7],load:1->NXM_NX_REG2[3]",
         " actions=load:0x1->NXM_NX_REG0[],load:0x5->NXM_NX_REG2[0..7],load:0x1->NXM_NX_REG2[3]"),
        ("ip,actions=mod_dl_src:00:11:22:33:44:55,mod_nw_dst:1.2.3.4,strip_vlan,set_tunnel:5,set_tunnel64:0x1234567890,resubmit:3,resubmit(4,5),note:00.11",
         " ip actions=mod_dl_src:00:11:22:33:44:55,mod_nw_dst:1.2.3.4,pop_vlan,set_tunnel:0x5,set_tunnel64:0x1234567890,resubmit:3,resubmit(4,5),note:00.11"),
    ];

    #[test]
    fn golden_no_stats() {
        for (input, want) in GOLDEN {
            assert_eq!(&no_stats(input), want, "{input}");
        }
    }

    #[test]
    fn dump_line_with_stats_and_names() {
        let f = flow("cookie=0x5,table=10,idle_timeout=10,send_flow_rem,importance=3,priority=5,ip,actions=goto_table:30");
        let stats = FlowStats {
            duration_ns: 1_234_000_000,
            n_packets: 7,
            n_bytes: 900,
            idle_age_s: Some(1),
        };
        let opts = DumpOptions {
            stats: true,
            names: None,
        };
        assert_eq!(
            format_dump_line(&f, &stats, &opts),
            " cookie=0x5, duration=1.234s, table=10, n_packets=7, n_bytes=900, idle_timeout=10, send_flow_rem importance=3, idle_age=1, priority=5,ip actions=goto_table:30"
        );
        let opts = DumpOptions {
            stats: true,
            names: Some(TableNames::default()),
        };
        let f0 = flow("actions=drop");
        assert_eq!(
            format_dump_line(&f0, &FlowStats { duration_ns: 5_000_000, ..Default::default() }, &opts),
            " cookie=0x0, duration=0.005s, table=Classifier, n_packets=0, n_bytes=0, idle_age=0, actions=drop"
        );
        let opts = DumpOptions {
            stats: false,
            names: Some(TableNames::default()),
        };
        let f = flow(
            "table=30,ip,actions=ct(table=31,zone=NXM_NX_REG0[0..15]),resubmit(,90),goto_table:50",
        );
        assert_eq!(
            format_dump_line(&f, &stats, &opts),
            " table=ConntrackZone, ip actions=ct(table=ConntrackState,zone=NXM_NX_REG0[0..15]),resubmit(,Output),goto_table:L3Forwarding"
        );
    }

    #[test]
    fn format_flow_reads_back() {
        let names = TableNames::default();
        let f =
            flow("cookie=0x9,table=30,hard_timeout=4,check_overlap,ip,actions=ct(table=31,zone=5)");
        assert_eq!(
            format_flow(&f, None),
            "cookie=0x9, table=30, hard_timeout=4, check_overlap ip actions=ct(table=31,zone=5)"
        );
        assert_eq!(flow(&format_flow(&f, None)), f);
        assert_eq!(flow(&format_flow(&f, Some(&names))), f);
        assert_eq!(format_flow(&flow("actions=drop"), None), "actions=drop");
    }

    #[test]
    fn actions_alone() {
        assert_eq!(format_actions(&[], None), "drop");
        let f = flow("tcp,actions=set_field:80->tp_dst,output:1");
        assert_eq!(
            format_actions(&f.actions, None),
            "set_field:80->tp_dst,output:1"
        );
        assert_eq!(
            format_actions_for(&f.actions, &f.matches, None),
            "set_field:80->tcp_dst,output:1"
        );
    }

    #[test]
    fn key_format() {
        let ctx = ParseContext::default();
        let k = parse_packet_spec(
            "in_port=1,tcp,dl_src=00:00:00:00:00:01,dl_dst=00:00:00:00:00:02,nw_src=10.0.0.1,nw_dst=10.0.0.2,nw_ttl=64,tp_src=1234,tp_dst=80",
            &ctx,
        )
        .unwrap();
        assert_eq!(
            format_key(&k),
            "tcp,in_port=1,vlan_tci=0x0000,dl_src=00:00:00:00:00:01,dl_dst=00:00:00:00:00:02,nw_src=10.0.0.1,nw_dst=10.0.0.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=1234,tp_dst=80,tcp_flags=0"
        );
        let k = parse_packet_spec(
            "ct_state=trk|new,ct_zone=5,reg0=0x1,in_port=2,arp,arp_op=1,arp_spa=10.0.0.1",
            &ctx,
        )
        .unwrap();
        assert_eq!(
            format_key(&k),
            "ct_state=new|trk,ct_zone=5,arp,reg0=0x1,in_port=2,vlan_tci=0x0000,dl_src=00:00:00:00:00:00,dl_dst=00:00:00:00:00:00,arp_spa=10.0.0.1,arp_tpa=0.0.0.0,arp_op=1,arp_sha=00:00:00:00:00:00,arp_tha=00:00:00:00:00:00"
        );
    }
}
