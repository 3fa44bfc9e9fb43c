//! Datapath actions: what the slow path compiles a packet's trip through the
//! flow tables into, and what the caches store and the datapath executes.
//!
//! A translation ([`crate::xlate`]) ends in a short list of [`DpAction`]s,
//! the same idea as OVS's ODP actions. Header writes are accumulated during
//! translation and emitted right before the action that needs them (an
//! output, a `ct`, a recirculation), so a list reads like OVS's
//! `Datapath actions:` line: `set(eth(src=..,dst=..)),set(ipv4(ttl=63)),3`.
//!
//! Recirculation: `ct(table=T)` compiles to `Ct{..}` then `Recirc(id)`. The
//! recirculated copy of the packet starts over with `recirc_id = id` in its
//! key (and the connection tracker's verdict in `ct_state`/`ct_mark`/...), and
//! the slow path resumes at table `id - 1` (see [`recirc_id_for_table`]).
//! Registers and other metadata the first pass wrote are carried to the next
//! pass by `LoadMeta` actions placed just before `Recirc` (they change only
//! the key, never the packet, and are not printed in the OVS format).
//!
//! ## Printing
//!
//! [`format_dp_actions`] prints a list like OVS 3.1's `ofproto/trace`
//! `Datapath actions:` line: `set(eth(src=..,dst=..))`,
//! `set(ipv4(src=..,ttl=63))` (consecutive `Set`s of one header grouped into
//! one `set(...)`, fields in OVS's order), `push_vlan(vid=5,pcp=0)`,
//! `pop_vlan`, `ct(commit,zone=5,mark=0x1/0xffffffff)`, `ct_clear`,
//! `recirc(0x1f)`, `userspace(...)`, and output ports as bare numbers.
//! Where oxvs intentionally differs from OVS:
//!
//! - Output ports are our OpenFlow port numbers; OVS prints datapath port
//!   numbers (which differ from the OpenFlow numbers).
//! - OVS prints partial header writes as masked sets (`tos=0x10/0xfc`);
//!   we print only the fields written, unmasked (`tos=0x10`). ICMP type
//!   and code are committed together, as OVS does
//!   (`set(icmpv6(type=136,code=0))`).
//! - Tunnel metadata prints as `set(tunnel(tun_id=..,src=..,dst=..))`; OVS's
//!   userspace datapath prints a full `tnl_push(...)` header instead, its
//!   kernel datapath a `set(tunnel(...))` with more fields.
//! - `userspace(...)` prints `pid=0,controller(reason=N,table=T,
//!   rule_cookie=C[,userdata=..])`: our packet-in needs the table and cookie,
//!   OVS's continuation/recirc bookkeeping does not apply.
//! - `LoadMeta` (metadata carried across a recirculation) is never printed
//!   by [`format_dp_actions`]; OVS keeps that state in its recirculation
//!   context instead. Its standalone `Display` is `load(FIELD=VALUE)`.
//! - A `PushVlan` directly followed by a `Set` of the VLAN TCI prints as
//!   one `push_vlan(...)` with the final TCI (OVS commits only the final
//!   VLAN state); the datapath executes both, with the same result.
//! - Recirculation ids are `table + 1` (see [`recirc_id_for_table`]), so
//!   `ct(table=7)` prints `recirc(0x8)`; OVS allocates ids dynamically.
//!
//! Whether `nw_src`/`nw_tos`/`tp_src`... belong to IPv4, IPv6, ARP, TCP,
//! UDP, SCTP or ICMP is not in the action itself: [`format_dp_actions_for_key`]
//! takes it from the packet's key; [`format_dp_actions`] guesses from the
//! other fields of the group (ARP if `arp_sha`/`arp_tha` are written, IPv6 if
//! an IPv6 address or label is, else IPv4; ports print as `tp(...)`).

use std::fmt;
use std::sync::Arc;

use crate::field::{format_value, Field, ValueFormat};
use crate::flow::{port, NatAction, PacketInReason};
use crate::key::FlowKey;
use crate::learn::Learned;
use crate::meter::Meter;
use crate::wire::{ethertype, ip_proto};

/// The recirculation id used for `ct(table=T)`: `T + 1` (0 means "from a port").
pub const fn recirc_id_for_table(table: u8) -> u32 {
    table as u32 + 1
}

/// The table a recirculated packet resumes in, for a nonzero recirculation id.
pub const fn table_for_recirc_id(id: u32) -> Option<u8> {
    if id == 0 || id > 255 {
        None
    } else {
        Some((id - 1) as u8)
    }
}

/// One datapath action.
/// The tunnel metadata fields of a key ([`Field::TUNNEL`]), as
/// [`DpAction::SetTunnel`] writes them: both families' addresses, as Open
/// vSwitch's `struct flow_tnl` has them (which one an output uses:
/// [`crate::datapath::TunnelMeta::from_key`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct TunnelFields {
    /// `tun_id`.
    pub tun_id: u64,
    /// `tun_src`.
    pub src: u32,
    /// `tun_dst`.
    pub dst: u32,
    /// `tun_ipv6_src`.
    pub ipv6_src: u128,
    /// `tun_ipv6_dst`.
    pub ipv6_dst: u128,
}

impl TunnelFields {
    /// The tunnel fields of `key`.
    #[inline]
    pub fn of_key(key: &FlowKey) -> TunnelFields {
        TunnelFields {
            tun_id: key.get(Field::TunId) as u64,
            src: key.get(Field::TunSrc) as u32,
            dst: key.get(Field::TunDst) as u32,
            ipv6_src: key.get(Field::TunIpv6Src),
            ipv6_dst: key.get(Field::TunIpv6Dst),
        }
    }

    /// Writes every tunnel field of `key`.
    #[inline]
    pub fn write_to(&self, key: &mut FlowKey) {
        key.set(Field::TunId, u128::from(self.tun_id));
        key.set(Field::TunSrc, u128::from(self.src));
        key.set(Field::TunDst, u128::from(self.dst));
        key.set(Field::TunIpv6Src, self.ipv6_src);
        key.set(Field::TunIpv6Dst, self.ipv6_dst);
    }
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum DpAction {
    /// Transmit a copy of the packet (as modified so far) on an OpenFlow port.
    Output(u32),
    /// Write a header field of the packet (and the key). Only fields with
    /// [`Field::is_header`] appear here.
    Set { field: Field, value: u128 },
    /// Push an 802.1Q tag.
    PushVlan { tpid: u16, tci: u16 },
    /// Remove the outermost 802.1Q tag.
    PopVlan,
    /// Tunnel metadata for the next output to a tunnel port.
    SetTunnel(TunnelFields),
    /// Run the packet through the connection tracker.
    Ct {
        zone: u16,
        commit: bool,
        force: bool,
        /// `(value, mask)` to store as ct_mark on commit.
        mark: Option<(u32, u32)>,
        /// `(value, mask)` to store as ct_label on commit.
        label: Option<(u128, u128)>,
        /// `nat(...)`: translate (boxed: rare, and it keeps actions small).
        nat: Option<Box<NatAction>>,
    },
    /// Clear the packet's conntrack state (`ct_clear`).
    CtClear,
    /// Write a metadata field of the key (registers, metadata, pkt_mark,
    /// tunnel fields) so that it survives a recirculation. Not printed.
    LoadMeta { field: Field, value: u128 },
    /// Re-inject a copy of the packet into the pipeline with this recirc_id.
    Recirc(u32),
    /// A `learn` action's flow, to be added (or refreshed) by the switch
    /// ([`crate::learn`]). Not printed: it changes neither the packet nor
    /// the key (OVS executes learns during translation; its datapath never
    /// sees them).
    Learn(Arc<Learned>),
    /// Meter the packet ([`crate::meter`]): over the meter's rate, the
    /// packet is dropped here and the actions after this one do not run.
    /// Printed `meter(ID)` with the OpenFlow meter id (OVS prints its
    /// datapath meter id).
    Meter(Arc<Meter>),
    /// Send the packet to the controller's packet-in queue.
    Userspace {
        reason: PacketInReason,
        userdata: Vec<u8>,
        /// Table and cookie of the flow that sent it (for the packet-in).
        table: u8,
        cookie: u64,
    },
}

/// Formats a datapath action list the way OVS prints `Datapath actions:`
/// (`drop` when empty). Header kinds are guessed (see the module doc).
pub fn format_dp_actions(actions: &[DpAction]) -> String {
    format_actions(actions, None)
}

/// Like [`format_dp_actions`], with header kinds (IPv4/IPv6/ARP,
/// TCP/UDP/SCTP/ICMP, VLAN present) taken from `key`, the key of the packet
/// the actions apply to.
pub fn format_dp_actions_for_key(actions: &[DpAction], key: &FlowKey) -> String {
    format_actions(actions, Some(key))
}

/// Which header a `Set` field belongs to, for grouping.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hdr {
    Eth,
    Vlan,
    L3,
    /// OVS's `nd_ext`: `nd_reserved`, `nd_options_type`.
    NdExt,
    /// OVS's `nd`: target and link-layer addresses.
    Nd,
    L4,
}

fn hdr_of(field: Field) -> Hdr {
    match field {
        Field::DlSrc | Field::DlDst => Hdr::Eth,
        Field::VlanTci => Hdr::Vlan,
        Field::NdReserved | Field::NdOptionsType => Hdr::NdExt,
        Field::NdTarget | Field::NdSll | Field::NdTll => Hdr::Nd,
        Field::TpSrc | Field::TpDst => Hdr::L4,
        _ => Hdr::L3,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum L3Kind {
    Ipv4,
    Ipv6,
    Arp,
}

fn format_actions(actions: &[DpAction], key: Option<&FlowKey>) -> String {
    let mut out = String::new();
    let mut vlan = key.map(|k| k.get(Field::VlanTci) & 0x1000 != 0);
    let mut i = 0;
    while i < actions.len() {
        let a = &actions[i];
        match a {
            DpAction::LoadMeta { .. } | DpAction::Learn(_) => {
                i += 1;
                continue;
            }
            DpAction::Set { field, .. } if hdr_of(*field) != Hdr::Vlan => {
                let h = hdr_of(*field);
                let mut j = i;
                while j < actions.len() {
                    match &actions[j] {
                        DpAction::Set { field, .. } if hdr_of(*field) == h => j += 1,
                        _ => break,
                    }
                }
                sep(&mut out);
                write_set_group(&mut out, h, &actions[i..j], key);
                i = j;
                continue;
            }
            DpAction::Set { value, .. } => {
                // VLAN TCI: OVS replaces a tag by pop+push.
                let tci = *value as u16;
                sep(&mut out);
                if vlan != Some(false) {
                    out.push_str("pop_vlan");
                    if tci & 0x1000 != 0 {
                        out.push(',');
                    }
                }
                if tci & 0x1000 != 0 {
                    write_push_vlan(&mut out, ethertype::VLAN, tci);
                }
                vlan = vlan.map(|_| tci & 0x1000 != 0);
            }
            DpAction::PushVlan { tpid, tci } => {
                vlan = vlan.map(|_| true);
                sep(&mut out);
                // A push directly followed by a write of the new tag's TCI
                // (how `push_vlan,set_field:..->vlan_vid` translates) prints
                // as one push with the final TCI, as OVS prints it.
                match actions.get(i + 1) {
                    Some(DpAction::Set {
                        field: Field::VlanTci,
                        value,
                    }) if *value as u16 & 0x1000 != 0 => {
                        write_push_vlan(&mut out, *tpid, *value as u16);
                        i += 1;
                    }
                    _ => write_push_vlan(&mut out, *tpid, *tci),
                }
            }
            DpAction::PopVlan => {
                // Only one tag is modelled in the key.
                vlan = vlan.map(|_| false);
                sep(&mut out);
                out.push_str(&a.to_string());
            }
            _ => {
                sep(&mut out);
                out.push_str(&a.to_string());
            }
        }
        i += 1;
    }
    if out.is_empty() {
        out.push_str("drop");
    }
    out
}

fn sep(out: &mut String) {
    if !out.is_empty() {
        out.push(',');
    }
}

fn write_push_vlan(out: &mut String, tpid: u16, tci: u16) {
    use fmt::Write as _;
    if tpid != ethertype::VLAN {
        let _ = write!(out, "push_vlan(tpid={tpid:#x},");
    } else {
        out.push_str("push_vlan(");
    }
    let _ = write!(out, "vid={},pcp={})", tci & 0x0fff, tci >> 13);
}

/// `set(eth(...))`, `set(ipv4(...))`... for a run of `Set`s of one header.
fn write_set_group(out: &mut String, h: Hdr, group: &[DpAction], key: Option<&FlowKey>) {
    let fields = || {
        group.iter().filter_map(|a| match a {
            DpAction::Set { field, value } => Some((*field, *value)),
            _ => None,
        })
    };
    let has = |f: Field| fields().any(|(g, _)| g == f);
    let (name, order): (&str, &[(Field, &str, ValueFormat)]) = match h {
        Hdr::Eth => (
            "eth",
            &[
                (Field::DlSrc, "src", ValueFormat::Mac),
                (Field::DlDst, "dst", ValueFormat::Mac),
            ],
        ),
        Hdr::NdExt => (
            "nd_ext",
            &[
                (Field::NdReserved, "nd_reserved", ValueFormat::Hex),
                (
                    Field::NdOptionsType,
                    "nd_options_type",
                    ValueFormat::Decimal,
                ),
            ],
        ),
        Hdr::Nd => (
            "nd",
            &[
                (Field::NdTarget, "target", ValueFormat::Ipv6),
                (Field::NdSll, "sll", ValueFormat::Mac),
                (Field::NdTll, "tll", ValueFormat::Mac),
            ],
        ),
        Hdr::L3 => {
            let kind = match key.map(|k| k.get(Field::DlType) as u16) {
                Some(ethertype::IPV6) => L3Kind::Ipv6,
                Some(ethertype::ARP) => L3Kind::Arp,
                Some(_) => L3Kind::Ipv4,
                None if has(Field::ArpSha) || has(Field::ArpTha) => L3Kind::Arp,
                None if has(Field::Ipv6Src) || has(Field::Ipv6Dst) || has(Field::Ipv6Label) => {
                    L3Kind::Ipv6
                }
                None => L3Kind::Ipv4,
            };
            match kind {
                L3Kind::Ipv4 => (
                    "ipv4",
                    &[
                        (Field::NwSrc, "src", ValueFormat::Ipv4),
                        (Field::NwDst, "dst", ValueFormat::Ipv4),
                        (Field::NwProto, "proto", ValueFormat::Decimal),
                        (Field::NwTos, "tos", ValueFormat::Hex),
                        (Field::NwTtl, "ttl", ValueFormat::Decimal),
                    ],
                ),
                L3Kind::Ipv6 => (
                    "ipv6",
                    &[
                        (Field::Ipv6Src, "src", ValueFormat::Ipv6),
                        (Field::Ipv6Dst, "dst", ValueFormat::Ipv6),
                        (Field::Ipv6Label, "label", ValueFormat::Hex),
                        (Field::NwProto, "proto", ValueFormat::Decimal),
                        (Field::NwTos, "tclass", ValueFormat::Hex),
                        (Field::NwTtl, "hlimit", ValueFormat::Decimal),
                    ],
                ),
                L3Kind::Arp => (
                    "arp",
                    &[
                        (Field::NwSrc, "sip", ValueFormat::Ipv4),
                        (Field::NwDst, "tip", ValueFormat::Ipv4),
                        (Field::NwProto, "op", ValueFormat::Decimal),
                        (Field::ArpSha, "sha", ValueFormat::Mac),
                        (Field::ArpTha, "tha", ValueFormat::Mac),
                    ],
                ),
            }
        }
        _ => {
            let proto = key.map(|k| (k.get(Field::DlType) as u16, k.get(Field::NwProto) as u8));
            // ICMP only in IPv4 and ICMPv6 only in IPv6, as the key reads
            // them (the datapath writes no type or code in the others).
            let icmp = match proto {
                Some((ethertype::IPV4, ip_proto::ICMP)) => Some("icmp"),
                Some((ethertype::IPV6, ip_proto::ICMPV6)) => Some("icmpv6"),
                _ => None,
            };
            let name = match (icmp, proto) {
                (Some(name), _) => name,
                (None, Some((_, ip_proto::TCP))) => "tcp",
                (None, Some((_, ip_proto::UDP))) => "udp",
                (None, Some((_, ip_proto::SCTP))) => "sctp",
                _ => "tp",
            };
            if icmp.is_some() {
                (
                    name,
                    &[
                        (Field::TpSrc, "type", ValueFormat::Decimal),
                        (Field::TpDst, "code", ValueFormat::Decimal),
                    ],
                )
            } else {
                (
                    name,
                    &[
                        (Field::TpSrc, "src", ValueFormat::Decimal),
                        (Field::TpDst, "dst", ValueFormat::Decimal),
                    ],
                )
            }
        }
    };
    out.push_str("set(");
    out.push_str(name);
    out.push('(');
    let mut first = true;
    for (field, label, format) in order {
        // The last write of a field in the group wins, as in the datapath.
        if let Some((_, v)) = fields().rfind(|(f, _)| f == field) {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(label);
            out.push('=');
            out.push_str(&format_value(*format, v));
        }
    }
    // Fields with no place in this header's order (should not happen).
    for (f, v) in fields() {
        if !order.iter().any(|(g, _, _)| *g == f) {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(f.name());
            out.push('=');
            out.push_str(&format_value(f.format(), v));
        }
    }
    out.push_str("))");
}

fn write_port(f: &mut fmt::Formatter<'_>, p: u32) -> fmt::Result {
    let name = match p {
        port::IN_PORT => "in_port",
        port::LOCAL => "LOCAL",
        port::CONTROLLER => "CONTROLLER",
        port::ALL => "ALL",
        port::FLOOD => "FLOOD",
        port::NORMAL => "NORMAL",
        _ => return write!(f, "{p}"),
    };
    f.write_str(name)
}

impl fmt::Display for DpAction {
    /// One action in the `Datapath actions:` syntax; a `Set` prints alone as
    /// `set(HDR(FIELD=VALUE))` with the header guessed as in
    /// [`format_dp_actions`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DpAction::Output(p) => write_port(f, *p),
            DpAction::Set { .. } => {
                let s = format_dp_actions(std::slice::from_ref(self));
                f.write_str(&s)
            }
            DpAction::PushVlan { tpid, tci } => {
                let mut s = String::new();
                write_push_vlan(&mut s, *tpid, *tci);
                f.write_str(&s)
            }
            DpAction::PopVlan => f.write_str("pop_vlan"),
            DpAction::SetTunnel(t) => {
                // OVS's odp-util order: tun_id, src, dst, ipv6_src, ipv6_dst;
                // an unset address is not printed (but an IPv4 tunnel
                // always prints its dst).
                write!(f, "set(tunnel(tun_id={:#x}", t.tun_id)?;
                if t.src != 0 {
                    write!(f, ",src={}", std::net::Ipv4Addr::from(t.src))?;
                }
                if t.dst != 0 || t.ipv6_dst == 0 {
                    write!(f, ",dst={}", std::net::Ipv4Addr::from(t.dst))?;
                }
                if t.ipv6_src != 0 {
                    write!(f, ",ipv6_src={}", std::net::Ipv6Addr::from(t.ipv6_src))?;
                }
                if t.ipv6_dst != 0 {
                    write!(f, ",ipv6_dst={}", std::net::Ipv6Addr::from(t.ipv6_dst))?;
                }
                f.write_str("))")
            }
            DpAction::Ct {
                zone,
                commit,
                force,
                mark,
                label,
                nat,
            } => {
                f.write_str("ct")?;
                let mut parts: Vec<String> = Vec::new();
                if *force {
                    parts.push("force_commit".into());
                } else if *commit {
                    parts.push("commit".into());
                }
                if *zone != 0 {
                    parts.push(format!("zone={zone}"));
                }
                if let Some((v, m)) = mark {
                    parts.push(format!("mark={v:#x}/{m:#x}"));
                }
                if let Some((v, m)) = label {
                    parts.push(format!("label={v:#x}/{m:#x}"));
                }
                if let Some(n) = nat {
                    let mut s = String::new();
                    crate::print::write_nat(&mut s, n);
                    parts.push(s);
                }
                if !parts.is_empty() {
                    write!(f, "({})", parts.join(","))?;
                }
                Ok(())
            }
            DpAction::CtClear => f.write_str("ct_clear"),
            DpAction::LoadMeta { field, value } => {
                write!(
                    f,
                    "load({}={})",
                    field.name(),
                    format_value(field.format(), *value)
                )
            }
            DpAction::Recirc(id) => write!(f, "recirc({id:#x})"),
            DpAction::Meter(m) => write!(f, "meter({})", m.config.id),
            DpAction::Learn(l) => write!(f, "learn({})", crate::print::format_flow(&l.flow, None)),
            DpAction::Userspace {
                reason,
                userdata,
                table,
                cookie,
            } => {
                let r = match reason {
                    PacketInReason::NoMatch => 0,
                    PacketInReason::Action => 1,
                    PacketInReason::InvalidTtl => 2,
                };
                write!(
                    f,
                    "userspace(pid=0,controller(reason={r},table={table},rule_cookie={cookie:#x}"
                )?;
                if !userdata.is_empty() {
                    f.write_str(",userdata=")?;
                    for (i, b) in userdata.iter().enumerate() {
                        if i > 0 {
                            f.write_str(".")?;
                        }
                        write!(f, "{b:02x}")?;
                    }
                }
                f.write_str("))")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(field: Field, value: u128) -> DpAction {
        DpAction::Set { field, value }
    }

    #[test]
    fn recirc_ids_roundtrip() {
        assert_eq!(recirc_id_for_table(31), 32);
        assert_eq!(table_for_recirc_id(32), Some(31));
        assert_eq!(table_for_recirc_id(0), None);
        assert_eq!(table_for_recirc_id(256), None);
    }

    #[test]
    fn groups_sets_like_ovs() {
        // OVS 3.1: set(eth(src=00:00:00:00:00:11,dst=00:00:00:00:00:22)),
        // set(ipv4(dst=10.0.0.9,ttl=63)),set(tcp(dst=8080)),1
        let mut key = FlowKey::ZERO;
        key.set(Field::DlType, 0x0800);
        key.set(Field::NwProto, 6);
        let a = vec![
            set(Field::DlSrc, 0x11),
            set(Field::DlDst, 0x22),
            set(Field::NwTtl, 63),
            set(Field::NwDst, 0x0a00_0009),
            set(Field::TpDst, 8080),
            DpAction::Output(2),
        ];
        assert_eq!(
            format_dp_actions_for_key(&a, &key),
            "set(eth(src=00:00:00:00:00:11,dst=00:00:00:00:00:22)),\
             set(ipv4(dst=10.0.0.9,ttl=63)),set(tcp(dst=8080)),2"
        );
        assert_eq!(
            format_dp_actions(&a),
            "set(eth(src=00:00:00:00:00:11,dst=00:00:00:00:00:22)),\
             set(ipv4(dst=10.0.0.9,ttl=63)),set(tp(dst=8080)),2"
        );
        // Not consecutive: two groups.
        let b = vec![
            set(Field::DlSrc, 1),
            DpAction::Output(1),
            set(Field::DlSrc, 2),
            DpAction::Output(1),
        ];
        assert_eq!(
            format_dp_actions(&b),
            "set(eth(src=00:00:00:00:00:01)),1,set(eth(src=00:00:00:00:00:02)),1"
        );
    }

    #[test]
    fn ipv6_arp_icmp_headers() {
        let mut key = FlowKey::ZERO;
        key.set(Field::DlType, 0x86dd);
        key.set(Field::NwProto, 17);
        let a = vec![
            set(Field::NwTtl, 63),
            set(Field::Ipv6Dst, 1),
            set(Field::Ipv6Src, 3),
            set(Field::NwTos, 8),
            set(Field::Ipv6Label, 5),
            set(Field::TpSrc, 99),
            DpAction::Output(1),
        ];
        // OVS: set(ipv6(src=::3,dst=::1,label=0x5,tclass=0x8/0xfc,hlimit=63)),set(udp(src=99)),1
        assert_eq!(
            format_dp_actions_for_key(&a, &key),
            "set(ipv6(src=::3,dst=::1,label=0x5,tclass=0x8,hlimit=63)),set(udp(src=99)),1"
        );
        let arp = vec![
            set(Field::NwSrc, 0x0101_0102),
            set(Field::NwDst, 0x0101_0101),
            set(Field::ArpTha, 0x33),
            DpAction::Output(1),
        ];
        assert_eq!(
            format_dp_actions(&arp),
            "set(arp(sip=1.1.1.2,tip=1.1.1.1,tha=00:00:00:00:00:33)),1"
        );
        let mut icmp = FlowKey::ZERO;
        icmp.set(Field::DlType, 0x0800);
        icmp.set(Field::NwProto, 1);
        assert_eq!(
            format_dp_actions_for_key(&[set(Field::TpSrc, 1), DpAction::Output(2)], &icmp),
            "set(icmp(type=1)),2"
        );
        let mut icmp6 = icmp;
        icmp6.set(Field::DlType, 0x86dd);
        icmp6.set(Field::NwProto, 58);
        assert_eq!(
            format_dp_actions_for_key(&[set(Field::TpDst, 4), DpAction::Output(2)], &icmp6),
            "set(icmpv6(code=4)),2"
        );
        // ICMPv6 in IPv4 and ICMP in IPv6 are not ICMP to the key.
        for (dl_type, proto) in [(0x0800, 58), (0x86dd, 1)] {
            let mut k = FlowKey::ZERO;
            k.set(Field::DlType, dl_type);
            k.set(Field::NwProto, proto);
            assert_eq!(
                format_dp_actions_for_key(&[set(Field::TpSrc, 1), DpAction::Output(2)], &k),
                "set(tp(src=1)),2"
            );
        }
    }

    #[test]
    fn vlan_ct_recirc_userspace() {
        let a = vec![
            DpAction::PushVlan {
                tpid: 0x8100,
                tci: 0x1005,
            },
            DpAction::Output(2),
            DpAction::PopVlan,
            DpAction::Output(2),
        ];
        assert_eq!(format_dp_actions(&a), "push_vlan(vid=5,pcp=0),2,pop_vlan,2");
        // push_vlan,set_field:0x1005->vlan_vid as xlate compiles it.
        let b = vec![
            DpAction::PushVlan {
                tpid: 0x8100,
                tci: 0,
            },
            set(Field::VlanTci, 0x1005),
            DpAction::Output(1),
        ];
        assert_eq!(format_dp_actions(&b), "push_vlan(vid=5,pcp=0),1");
        let ct = vec![
            DpAction::Ct {
                zone: 5,
                commit: true,
                force: false,
                mark: Some((1, 0xffff_ffff)),
                label: None,
                nat: None,
            },
            DpAction::LoadMeta {
                field: Field::Reg(0),
                value: 7,
            },
            DpAction::Ct {
                zone: 5,
                commit: false,
                force: false,
                mark: None,
                label: None,
                nat: None,
            },
            DpAction::Recirc(0x1f),
        ];
        assert_eq!(
            format_dp_actions(&ct),
            "ct(commit,zone=5,mark=0x1/0xffffffff),ct(zone=5),recirc(0x1f)"
        );
        let ct2 = vec![
            DpAction::Ct {
                zone: 0,
                commit: true,
                force: true,
                mark: None,
                label: Some((5, 0xff)),
                nat: None,
            },
            DpAction::Ct {
                zone: 0,
                commit: false,
                force: false,
                mark: None,
                label: None,
                nat: None,
            },
            DpAction::CtClear,
        ];
        assert_eq!(
            format_dp_actions(&ct2),
            "ct(force_commit,label=0x5/0xff),ct,ct_clear"
        );
        let up = DpAction::Userspace {
            reason: PacketInReason::Action,
            userdata: vec![1, 2],
            table: 7,
            cookie: 0x10,
        };
        assert_eq!(
            up.to_string(),
            "userspace(pid=0,controller(reason=1,table=7,rule_cookie=0x10,userdata=01.02))"
        );
        let tun = DpAction::SetTunnel(TunnelFields {
            tun_id: 0x10,
            dst: 0x0a01_0101,
            ..TunnelFields::default()
        });
        assert_eq!(tun.to_string(), "set(tunnel(tun_id=0x10,dst=10.1.1.1))");
        let tun6 = DpAction::SetTunnel(TunnelFields {
            tun_id: 0x10,
            ipv6_src: 0xfd00_0000_0000_0000_0000_0000_0000_0001,
            ipv6_dst: 0xfd00_0000_0000_0000_0000_0000_0000_0002,
            ..TunnelFields::default()
        });
        assert_eq!(
            tun6.to_string(),
            "set(tunnel(tun_id=0x10,ipv6_src=fd00::1,ipv6_dst=fd00::2))"
        );
        assert_eq!(DpAction::Output(port::LOCAL).to_string(), "LOCAL");
        assert_eq!(
            DpAction::LoadMeta {
                field: Field::Reg(1),
                value: 5
            }
            .to_string(),
            "load(reg1=0x5)"
        );
    }

    #[test]
    fn vlan_tci_set_is_pop_push() {
        let mut key = FlowKey::ZERO;
        key.set(Field::VlanTci, 0x1001);
        let a = vec![
            set(Field::VlanTci, 0x1000 | 0x2009),
            DpAction::Output(1),
            set(Field::VlanTci, 0),
        ];
        assert_eq!(
            format_dp_actions_for_key(&a, &key),
            "pop_vlan,push_vlan(vid=9,pcp=1),1,pop_vlan"
        );
        assert_eq!(
            format_dp_actions_for_key(&a, &FlowKey::ZERO),
            "push_vlan(vid=9,pcp=1),1,pop_vlan"
        );
    }

    #[test]
    fn empty_and_meta_only_is_drop() {
        assert_eq!(format_dp_actions(&[]), "drop");
        assert_eq!(
            format_dp_actions(&[DpAction::LoadMeta {
                field: Field::Reg(0),
                value: 1
            }]),
            "drop"
        );
    }
}
