//! The `learn` action: a flow that adds flows.
//!
//! `learn(table=T,idle_timeout=..,hard_timeout=..,priority=..,cookie=..,
//! delete_learned,SPEC...)` (Open vSwitch's `ovs-actions(7)`, `lib/learn.c`)
//! builds, from the packet that executes it, a new flow for table `T`:
//!
//! - a **match spec** `FIELD[a..b]` matches the learned flow on those bits
//!   with the packet's value of them; `DST[..]=SRC[..]` matches `DST` with
//!   the packet's value of `SRC`; `FIELD=VALUE` matches a constant
//!   (prerequisites such as `eth_type=0x800,nw_proto=6` are written so);
//! - a **load spec** `load:SRC[..]->DST[..]` gives the learned flow the
//!   action `load:VALUE->DST[..]` with the packet's value of `SRC`, and
//!   `load:VALUE->DST[..]` a constant one;
//! - an **output spec** `output:SRC[..]` gives it `output:PORT`, the port
//!   number read from the packet.
//!
//! ## Field names
//!
//! A learn spec names fields as OVS does, and OVS prints them back by its
//! own field identity: `tp_dst[]` is TCP's (`NXM_OF_TCP_DST[]`), and
//! `NXM_OF_UDP_DST[]` stays UDP's although oxvs keeps one `tp_dst` slot for
//! every L4 protocol. So a spec holds an [`OvsField`] (the NXM name, the
//! OVS name, the prerequisite and the key bits it covers) rather than just a
//! [`Field`]; [`ovs_field`] resolves every name the specs accept.
//! Differences from OVS: `arp_op` is 8 bits (oxvs keeps the low byte of the
//! opcode), `NXM_OF_IN_PORT` is OVS's 16-bit OpenFlow 1.0 port (reserved
//! ports 0xfff8.. map to oxvs's 32-bit ones), partial names without an NXM
//! header nor an OXM one (`dl_vlan`, `dl_vlan_pcp`) are refused as OVS
//! refuses them; `vlan_vid` and `vlan_pcp` are OVS's OXM fields
//! (`OXM_OF_VLAN_VID`, 12 bits, and `OXM_OF_VLAN_PCP`).
//!
//! ## Semantics (as `learn_execute`, `learn_mask`)
//!
//! [`learned_flow`] evaluates the specs against the packet's key as the
//! action list has made it so far, and gives the flow to add. Learning is
//! a side effect: the translation ([`crate::xlate`]) reads every source
//! bit through the megaflow mask (as `learn_mask` un-wildcards them), so the
//! learned flow is a function of the bits a megaflow matches, and a cached
//! translation can carry the learned flow itself ([`Learned`], in
//! [`crate::odp::DpAction::Learn`]): every packet that hits the megaflow
//! would learn exactly that flow. The datapath hands it to its sink; the
//! switch adds it, or refreshes an identical one (its hard timeout starts
//! again, its counters stay: [`crate::tables::Pipeline::learn`]). A flow
//! whose `learn` has `delete_learned` takes the flows of `(T, cookie)` with
//! it when it goes (deleted, replaced by other actions, expired) and no
//! other such `learn` of the same table and cookie remains.
//!
//! Refused by the parser, with an error naming them: `limit` (other than 0),
//! `result_dst`, and `fin_idle_timeout`/`fin_hard_timeout` (other than 0:
//! the learned flow would need a `fin_timeout` action, which oxvs lacks).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::field::{Field, Prereq, ValueFormat};
use crate::flow::{port, Action, Flow, FlowFlags, Match, SubField};
use crate::key::FlowKey;

/// A field as Open vSwitch names it in `learn` specs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OvsField {
    /// The NXM/OXM name OVS prints sub-fields with (`NXM_OF_TCP_DST`).
    pub nxm: &'static str,
    /// OVS's field name, printed for constants (`tcp_dst=80`).
    pub name: &'static str,
    /// The key field holding it.
    pub field: Field,
    /// First bit of `field` it covers.
    pub ofs: u8,
    /// Its width.
    pub bits: u8,
    /// The packet kind it needs.
    pub prereq: Prereq,
    /// How its constants are written.
    pub format: ValueFormat,
}

impl OvsField {
    /// Whether this is OVS's 16-bit `NXM_OF_IN_PORT` (OpenFlow 1.0 port
    /// numbers, which map onto oxvs's 32-bit ones).
    pub fn is_in_port16(&self) -> bool {
        self.field == Field::InPort && self.bits == 16
    }
}

const fn f(
    nxm: &'static str,
    name: &'static str,
    field: Field,
    ofs: u8,
    bits: u8,
    prereq: Prereq,
    format: ValueFormat,
) -> OvsField {
    OvsField {
        nxm,
        name,
        field,
        ofs,
        bits,
        prereq,
        format,
    }
}

use Prereq as P;
use ValueFormat as V;

/// Every field a learn spec may name (registers aside: [`ovs_field`]),
/// with its other spellings.
#[rustfmt::skip]
const FIELDS: &[(OvsField, &[&str])] = &[
    (f("NXM_OF_IN_PORT", "in_port", Field::InPort, 0, 16, P::None, V::Decimal), &[]),
    (f("OXM_OF_IN_PORT", "in_port_oxm", Field::InPort, 0, 32, P::None, V::Decimal), &[]),
    (f("NXM_NX_RECIRC_ID", "recirc_id", Field::RecircId, 0, 32, P::None, V::Decimal), &[]),
    (f("OXM_OF_METADATA", "metadata", Field::Metadata, 0, 64, P::None, V::Hex), &[]),
    (f("NXM_NX_TUN_ID", "tun_id", Field::TunId, 0, 64, P::None, V::Hex), &["tunnel_id", "OXM_OF_TUNNEL_ID"]),
    (f("NXM_NX_TUN_IPV4_SRC", "tun_src", Field::TunSrc, 0, 32, P::None, V::Ipv4), &[]),
    (f("NXM_NX_TUN_IPV4_DST", "tun_dst", Field::TunDst, 0, 32, P::None, V::Ipv4), &[]),
    (f("NXM_NX_TUN_IPV6_SRC", "tun_ipv6_src", Field::TunIpv6Src, 0, 128, P::None, V::Ipv6), &[]),
    (f("NXM_NX_TUN_IPV6_DST", "tun_ipv6_dst", Field::TunIpv6Dst, 0, 128, P::None, V::Ipv6), &[]),
    (f("NXM_NX_PKT_MARK", "pkt_mark", Field::PktMark, 0, 32, P::None, V::Hex), &[]),
    (f("NXM_NX_CT_STATE", "ct_state", Field::CtState, 0, 32, P::None, V::Hex), &[]),
    (f("NXM_NX_CT_ZONE", "ct_zone", Field::CtZone, 0, 16, P::None, V::Decimal), &[]),
    (f("NXM_NX_CT_MARK", "ct_mark", Field::CtMark, 0, 32, P::None, V::Hex), &[]),
    (f("NXM_NX_CT_LABEL", "ct_label", Field::CtLabel, 0, 128, P::None, V::Hex), &[]),
    (f("NXM_NX_CONJ_ID", "conj_id", Field::ConjId, 0, 32, P::None, V::Decimal), &[]),
    (f("NXM_OF_VLAN_TCI", "vlan_tci", Field::VlanTci, 0, 16, P::None, V::Hex), &[]),
    (f("OXM_OF_VLAN_VID", "vlan_vid", Field::VlanTci, 0, 12, P::None, V::Decimal), &[]),
    (f("OXM_OF_VLAN_PCP", "vlan_pcp", Field::VlanTci, 13, 3, P::Vlan, V::Decimal), &[]),
    (f("NXM_OF_ETH_SRC", "eth_src", Field::DlSrc, 0, 48, P::None, V::Mac), &["dl_src", "OXM_OF_ETH_SRC"]),
    (f("NXM_OF_ETH_DST", "eth_dst", Field::DlDst, 0, 48, P::None, V::Mac), &["dl_dst", "OXM_OF_ETH_DST"]),
    (f("NXM_OF_ETH_TYPE", "eth_type", Field::DlType, 0, 16, P::None, V::Hex), &["dl_type", "OXM_OF_ETH_TYPE"]),
    (f("NXM_OF_IP_SRC", "ip_src", Field::NwSrc, 0, 32, P::Ipv4, V::Ipv4), &["nw_src", "OXM_OF_IPV4_SRC"]),
    (f("NXM_OF_IP_DST", "ip_dst", Field::NwDst, 0, 32, P::Ipv4, V::Ipv4), &["nw_dst", "OXM_OF_IPV4_DST"]),
    (f("NXM_OF_ARP_SPA", "arp_spa", Field::NwSrc, 0, 32, P::Arp, V::Ipv4), &["OXM_OF_ARP_SPA"]),
    (f("NXM_OF_ARP_TPA", "arp_tpa", Field::NwDst, 0, 32, P::Arp, V::Ipv4), &["OXM_OF_ARP_TPA"]),
    (f("NXM_OF_ARP_OP", "arp_op", Field::NwProto, 0, 8, P::Arp, V::Decimal), &["OXM_OF_ARP_OP"]),
    (f("NXM_NX_ARP_SHA", "arp_sha", Field::ArpSha, 0, 48, P::Arp, V::Mac), &["OXM_OF_ARP_SHA"]),
    (f("NXM_NX_ARP_THA", "arp_tha", Field::ArpTha, 0, 48, P::Arp, V::Mac), &["OXM_OF_ARP_THA"]),
    (f("NXM_NX_IPV6_SRC", "ipv6_src", Field::Ipv6Src, 0, 128, P::Ipv6, V::Ipv6), &["OXM_OF_IPV6_SRC"]),
    (f("NXM_NX_IPV6_DST", "ipv6_dst", Field::Ipv6Dst, 0, 128, P::Ipv6, V::Ipv6), &["OXM_OF_IPV6_DST"]),
    (f("NXM_NX_IPV6_LABEL", "ipv6_label", Field::Ipv6Label, 0, 20, P::Ipv6, V::Hex), &["OXM_OF_IPV6_FLABEL"]),
    (f("NXM_OF_IP_PROTO", "nw_proto", Field::NwProto, 0, 8, P::Ip, V::Decimal), &["ip_proto", "OXM_OF_IP_PROTO"]),
    (f("NXM_OF_IP_TOS", "nw_tos", Field::NwTos, 0, 8, P::Ip, V::Decimal), &[]),
    (f("OXM_OF_IP_DSCP", "ip_dscp", Field::NwTos, 2, 6, P::Ip, V::Decimal), &[]),
    (f("NXM_NX_IP_ECN", "nw_ecn", Field::NwTos, 0, 2, P::Ip, V::Decimal), &["ip_ecn", "OXM_OF_IP_ECN"]),
    (f("NXM_NX_IP_TTL", "nw_ttl", Field::NwTtl, 0, 8, P::Ip, V::Decimal), &[]),
    (f("NXM_NX_IP_FRAG", "ip_frag", Field::NwFrag, 0, 8, P::Ip, V::Hex), &["nw_frag"]),
    (f("NXM_OF_TCP_SRC", "tcp_src", Field::TpSrc, 0, 16, P::Tcp, V::Decimal), &["tp_src", "OXM_OF_TCP_SRC"]),
    (f("NXM_OF_TCP_DST", "tcp_dst", Field::TpDst, 0, 16, P::Tcp, V::Decimal), &["tp_dst", "OXM_OF_TCP_DST"]),
    (f("NXM_NX_TCP_FLAGS", "tcp_flags", Field::TcpFlags, 0, 16, P::Tcp, V::Hex), &["OXM_OF_TCP_FLAGS"]),
    (f("NXM_OF_UDP_SRC", "udp_src", Field::TpSrc, 0, 16, P::Udp, V::Decimal), &["OXM_OF_UDP_SRC"]),
    (f("NXM_OF_UDP_DST", "udp_dst", Field::TpDst, 0, 16, P::Udp, V::Decimal), &["OXM_OF_UDP_DST"]),
    (f("OXM_OF_SCTP_SRC", "sctp_src", Field::TpSrc, 0, 16, P::Sctp, V::Decimal), &[]),
    (f("OXM_OF_SCTP_DST", "sctp_dst", Field::TpDst, 0, 16, P::Sctp, V::Decimal), &[]),
    (f("NXM_OF_ICMP_TYPE", "icmp_type", Field::TpSrc, 0, 8, P::Icmp, V::Decimal), &["icmpv4_type", "OXM_OF_ICMPV4_TYPE"]),
    (f("NXM_OF_ICMP_CODE", "icmp_code", Field::TpDst, 0, 8, P::Icmp, V::Decimal), &["icmpv4_code", "OXM_OF_ICMPV4_CODE"]),
    (f("NXM_NX_ICMPV6_TYPE", "icmpv6_type", Field::TpSrc, 0, 8, P::Icmpv6, V::Decimal), &["OXM_OF_ICMPV6_TYPE"]),
    (f("NXM_NX_ICMPV6_CODE", "icmpv6_code", Field::TpDst, 0, 8, P::Icmpv6, V::Decimal), &["OXM_OF_ICMPV6_CODE"]),
    (f("NXM_NX_ND_TARGET", "nd_target", Field::NdTarget, 0, 128, P::Nd, V::Ipv6), &["OXM_OF_IPV6_ND_TARGET"]),
    (f("NXM_NX_ND_SLL", "nd_sll", Field::NdSll, 0, 48, P::NdSolicit, V::Mac), &["OXM_OF_IPV6_ND_SLL"]),
    (f("NXM_NX_ND_TLL", "nd_tll", Field::NdTll, 0, 48, P::NdAdvert, V::Mac), &["OXM_OF_IPV6_ND_TLL"]),
    (f("ERICOXM_OF_ICMPV6_ND_RESERVED", "nd_reserved", Field::NdReserved, 0, 32, P::Nd, V::Decimal), &[]),
    (f("ERICOXM_OF_ICMPV6_ND_OPTIONS_TYPE", "nd_options_type", Field::NdOptionsType, 0, 8, P::Nd, V::Decimal), &[]),
];

#[rustfmt::skip]
const REG_NXM: [&str; 16] = [
    "NXM_NX_REG0", "NXM_NX_REG1", "NXM_NX_REG2", "NXM_NX_REG3", "NXM_NX_REG4", "NXM_NX_REG5",
    "NXM_NX_REG6", "NXM_NX_REG7", "NXM_NX_REG8", "NXM_NX_REG9", "NXM_NX_REG10", "NXM_NX_REG11",
    "NXM_NX_REG12", "NXM_NX_REG13", "NXM_NX_REG14", "NXM_NX_REG15",
];

/// Resolves a field name as a learn spec writes it (`NXM_OF_IP_SRC`,
/// `ip_src`, `nw_src`, `reg3`, `NXM_NX_REG3`, `xreg1`...). NXM/OXM names
/// are case-insensitive, the others are not (as OVS).
pub fn ovs_field(name: &str) -> Option<OvsField> {
    let upper = name.to_ascii_uppercase();
    let reg = |n: &str, limit: u8| -> Option<u8> {
        if n.is_empty() || n.len() > 2 || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if n.len() == 2 && n.starts_with('0') {
            return None;
        }
        let i: u8 = n.parse().ok()?;
        (i < limit).then_some(i)
    };
    let regf = |i: u8| OvsField {
        nxm: REG_NXM[usize::from(i) & 15],
        name: Field::Reg(i).name(),
        field: Field::Reg(i),
        ofs: 0,
        bits: 32,
        prereq: P::None,
        format: V::Hex,
    };
    let xregf = |i: u8| OvsField {
        nxm: Field::Xreg(i).nxm_name(),
        name: Field::Xreg(i).name(),
        field: Field::Xreg(i),
        ofs: 0,
        bits: 64,
        prereq: P::None,
        format: V::Hex,
    };
    if let Some(n) = name.strip_prefix("reg") {
        return reg(n, 16).map(regf);
    }
    if let Some(n) = name.strip_prefix("xreg") {
        return reg(n, 8).map(xregf);
    }
    if let Some(n) = upper.strip_prefix("NXM_NX_REG") {
        return reg(n, 16).map(regf);
    }
    if let Some(n) = upper.strip_prefix("OXM_OF_PKT_REG") {
        return reg(n, 8).map(xregf);
    }
    FIELDS.iter().find_map(|(of, aliases)| {
        let hit = of.name == name
            || of.nxm == upper
            || aliases.iter().any(|a| {
                if a.starts_with("NXM_") || a.starts_with("OXM_") {
                    *a == upper
                } else {
                    *a == name
                }
            });
        hit.then_some(*of)
    })
}

/// Bits `ofs..ofs + n_bits` of an [`OvsField`] (offsets relative to it,
/// as written: `NXM_NX_REG4[0..15]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LearnSubField {
    pub field: OvsField,
    pub ofs: u8,
    pub n_bits: u8,
}

impl LearnSubField {
    /// The whole field.
    pub fn whole(field: OvsField) -> LearnSubField {
        LearnSubField {
            field,
            ofs: 0,
            n_bits: field.bits,
        }
    }

    /// Whether it is the whole field (printed `NAME[]`).
    pub fn is_whole(&self) -> bool {
        self.ofs == 0 && self.n_bits == self.field.bits
    }

    /// The key bits it names.
    pub fn key(&self) -> SubField {
        SubField {
            field: self.field.field,
            ofs: self.field.ofs.saturating_add(self.ofs),
            n_bits: self.n_bits,
        }
    }

    /// Whether it lies within its field (the translator shifts by it).
    pub fn is_valid(&self) -> bool {
        self.n_bits >= 1
            && u32::from(self.ofs) + u32::from(self.n_bits) <= u32::from(self.field.bits)
            && u32::from(self.field.ofs) + u32::from(self.field.bits) <= self.field.field.bits()
    }
}

/// Where a spec's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LearnSrc {
    /// The packet's value of these bits.
    Field(LearnSubField),
    /// A constant (right-aligned, as wide as the destination).
    Imm(u128),
}

/// One spec of a `learn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LearnSpec {
    /// The learned flow matches `dst` with the value of `src`.
    Match { dst: LearnSubField, src: LearnSrc },
    /// The learned flow loads the value of `src` into `dst`.
    Load { dst: LearnSubField, src: LearnSrc },
    /// The learned flow outputs to the port read from `src`.
    Output { src: LearnSubField },
}

/// `learn(...)`: what it learns and how the learned flow looks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LearnAction {
    /// The table the learned flow goes to (OVS's default: 1).
    pub table: u8,
    pub priority: u16,
    /// Seconds; 0 = none.
    pub idle_timeout: u16,
    /// Seconds; 0 = none.
    pub hard_timeout: u16,
    /// Kept for printing; the parser refuses values other than 0.
    pub fin_idle_timeout: u16,
    /// Kept for printing; the parser refuses values other than 0.
    pub fin_hard_timeout: u16,
    /// The learned flow's cookie.
    pub cookie: u64,
    /// The learned flow has `send_flow_rem`.
    pub send_flow_rem: bool,
    /// Deleting this flow deletes the flows of (`table`, `cookie`).
    pub delete_learned: bool,
    /// Most flows of (`table`, `cookie`); 0 = no limit. Only 0 is accepted.
    pub limit: u32,
    /// Where OVS writes whether learning succeeded. Not supported: `None`.
    pub result_dst: Option<LearnSubField>,
    pub specs: Vec<LearnSpec>,
}

impl Default for LearnAction {
    fn default() -> Self {
        LearnAction {
            table: 1,
            priority: crate::flow::DEFAULT_PRIORITY,
            idle_timeout: 0,
            hard_timeout: 0,
            fin_idle_timeout: 0,
            fin_hard_timeout: 0,
            cookie: 0,
            send_flow_rem: false,
            delete_learned: false,
            limit: 0,
            result_dst: None,
            specs: Vec::new(),
        }
    }
}

impl LearnAction {
    /// Every source sub-field it reads from the packet, in key bits.
    pub fn sources(&self) -> impl Iterator<Item = SubField> + '_ {
        self.specs.iter().filter_map(|s| match s {
            LearnSpec::Match {
                src: LearnSrc::Field(sf),
                ..
            }
            | LearnSpec::Load {
                src: LearnSrc::Field(sf),
                ..
            }
            | LearnSpec::Output { src: sf } => Some(sf.key()),
            _ => None,
        })
    }

    /// Why the tables cannot hold a flow with this action (for actions
    /// built in code rather than parsed), if they cannot.
    pub fn invalid(&self) -> Option<&'static str> {
        let subs = self.specs.iter().flat_map(|s| {
            let (a, b) = match s {
                LearnSpec::Match { dst, src } | LearnSpec::Load { dst, src } => (
                    Some(*dst),
                    match src {
                        LearnSrc::Field(sf) => Some(*sf),
                        LearnSrc::Imm(_) => None,
                    },
                ),
                LearnSpec::Output { src } => (Some(*src), None),
            };
            a.into_iter().chain(b)
        });
        let mut subs = subs;
        if usize::from(self.table) >= crate::flow::N_TABLES {
            Some("learn: table 255 is not a table")
        } else if self.limit != 0 || self.result_dst.is_some() {
            Some("learn: limit and result_dst are not supported")
        } else if self.fin_idle_timeout != 0 || self.fin_hard_timeout != 0 {
            Some("learn: fin_idle_timeout and fin_hard_timeout are not supported")
        } else if subs.any(|sf| !sf.is_valid()) {
            Some("learn: sub-field outside its field")
        } else if self.specs.iter().any(|s| match s {
            LearnSpec::Match { dst, src } | LearnSpec::Load { dst, src } => match src {
                LearnSrc::Field(sf) => sf.n_bits != dst.n_bits,
                LearnSrc::Imm(v) => dst.n_bits < 128 && v >> dst.n_bits != 0,
            },
            LearnSpec::Output { .. } => false,
        }) {
            Some("learn: source and destination widths differ")
        } else {
            None
        }
    }
}

fn ones(bits: u8) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

/// An OpenFlow 1.0 port number (16 bits) as oxvs's 32-bit one.
pub fn port_from_ofp10(p: u16) -> u32 {
    if p >= 0xff00 {
        0xffff_0000 | u32::from(p)
    } else {
        u32::from(p)
    }
}

/// The flow `learn` adds for a packet: `read` gives the packet's value of a
/// sub-field (right-aligned); the translator's reader also un-wildcards it.
pub fn learned_flow(learn: &LearnAction, mut read: impl FnMut(SubField) -> u128) -> Flow {
    let mut m = Match::CATCHALL;
    let mut actions = Vec::new();
    // A source sub-field's value; `NXM_OF_IN_PORT` reads the 32-bit port
    // as OVS's 16-bit one (0xffff, OFPP_NONE, if it has none).
    let mut get = |sf: &LearnSubField| -> u128 {
        if sf.field.is_in_port16() {
            let p = read(SubField::whole(Field::InPort)) as u32;
            let p16 = u128::from(port_to_ofp10(p).unwrap_or(0xffff));
            (p16 >> sf.ofs) & ones(sf.n_bits)
        } else {
            read(sf.key())
        }
    };
    for spec in &learn.specs {
        match spec {
            LearnSpec::Match { dst, src } => {
                let v = match src {
                    LearnSrc::Field(sf) => get(sf),
                    LearnSrc::Imm(v) => *v,
                };
                if dst.field.is_in_port16() && dst.is_whole() {
                    m.set_exact(Field::InPort, u128::from(port_from_ofp10(v as u16)));
                } else {
                    let k = dst.key();
                    m.set(k.field, v << k.ofs, k.mask());
                }
            }
            LearnSpec::Load { dst, src } => {
                let v = match src {
                    LearnSrc::Field(sf) => get(sf),
                    LearnSrc::Imm(v) => *v,
                };
                actions.push(Action::Load {
                    dst: dst.key(),
                    value: v,
                });
            }
            LearnSpec::Output { src } => {
                let v = get(src);
                // As OVS: a 16-bit OpenFlow 1.0 port; anything else outputs nothing.
                if v <= 0xffff {
                    let p = v as u16;
                    if p < 0xff00 || matches!(p, 0xfff8 | 0xfffb | 0xfffc | 0xfffe) {
                        actions.push(Action::Output(port_from_ofp10(p)));
                    }
                }
            }
        }
    }
    Flow {
        table: learn.table,
        priority: learn.priority,
        matches: m,
        actions,
        cookie: learn.cookie,
        idle_timeout: learn.idle_timeout,
        hard_timeout: learn.hard_timeout,
        importance: 0,
        flags: FlowFlags {
            send_flow_rem: learn.send_flow_rem,
            ..FlowFlags::default()
        },
    }
}

/// A learned flow as OVS's `ofproto/trace` shows it: `table=36
/// tcp,nw_src=10.0.0.5,tp_dst=80 priority=200 cookie=0x7 hard=300
/// actions=load:0x7->NXM_NX_REG3[]`.
pub fn describe(flow: &Flow) -> String {
    let mut s = format!(
        "table={} {}",
        flow.table,
        crate::print::format_match(&flow.matches)
    );
    while s.ends_with(' ') {
        s.pop();
    }
    s.push_str(&format!(" priority={}", flow.priority));
    if flow.cookie != 0 {
        s.push_str(&format!(" cookie={:#x}", flow.cookie));
    }
    if flow.idle_timeout != 0 {
        s.push_str(&format!(" idle={}", flow.idle_timeout));
    }
    if flow.hard_timeout != 0 {
        s.push_str(&format!(" hard={}", flow.hard_timeout));
    }
    if flow.flags.send_flow_rem {
        s.push_str(" send_flow_rem");
    }
    s.push_str(" actions=");
    s.push_str(&crate::print::format_actions(&flow.actions, None));
    s
}

/// [`learned_flow`] for a packet whose key is `key` (no un-wildcarding).
pub fn learned_flow_for_key(learn: &LearnAction, key: &FlowKey) -> Flow {
    learned_flow(learn, |sf| sf.get(key))
}

/// A learned flow as a cached translation carries it
/// ([`crate::odp::DpAction::Learn`]): the flow, and when a datapath last
/// handed it on, so that a busy megaflow re-learns (refreshes) it at most
/// every [`Learned::RESEND_NS`] rather than per packet.
#[derive(Debug)]
pub struct Learned {
    pub flow: Flow,
    /// Clock of the datapath (ns) at the last hand-off; 0 = never.
    sent_ns: AtomicU64,
}

impl Learned {
    /// Least time between two hand-offs of one cached learned flow. A
    /// re-learned identical flow only restarts its hard timeout, which
    /// counts in seconds.
    pub const RESEND_NS: u64 = 100_000_000;

    pub fn new(flow: Flow) -> Learned {
        Learned {
            flow,
            sent_ns: AtomicU64::new(0),
        }
    }

    /// Whether to hand the flow on now (and if so, notes it). The first
    /// call always says yes.
    pub fn due(&self, now_ns: u64) -> bool {
        let last = self.sent_ns.load(Ordering::Relaxed);
        if last != 0 && now_ns.saturating_sub(last) < Self::RESEND_NS {
            return false;
        }
        // `max(1)`: 0 means "never sent".
        self.sent_ns.store(now_ns.max(1), Ordering::Relaxed);
        true
    }
}

impl PartialEq for Learned {
    fn eq(&self, other: &Self) -> bool {
        self.flow == other.flow
    }
}

impl Eq for Learned {}

impl std::hash::Hash for Learned {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.flow.hash(state);
    }
}

/// Whether `actions` hold a `learn` with `delete_learned`.
pub fn has_delete_learned(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::Learn(l) if l.delete_learned))
}

/// The (table, cookie) of every `learn` with `delete_learned` in `actions`.
pub fn delete_learned_keys(actions: &[Action]) -> impl Iterator<Item = (u8, u64)> + '_ {
    actions.iter().filter_map(|a| match a {
        Action::Learn(l) if l.delete_learned => Some((l.table, l.cookie)),
        _ => None,
    })
}

/// The port numbers OVS gives reserved 16-bit ports, for `is_in_port16`
/// constants (`in_port=LOCAL`).
pub fn port_to_ofp10(p: u32) -> Option<u16> {
    if p < 0xff00 {
        Some(p as u16)
    } else if p >= port::MAX {
        Some((p & 0xffff) as u16)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_ovs_identities() {
        let udp = ovs_field("NXM_OF_UDP_DST").unwrap();
        assert_eq!(
            (udp.name, udp.field, udp.prereq),
            ("udp_dst", Field::TpDst, P::Udp)
        );
        assert_eq!(ovs_field("tp_dst").unwrap().nxm, "NXM_OF_TCP_DST");
        assert_eq!(ovs_field("nxm_of_ip_src").unwrap().name, "ip_src");
        assert_eq!(ovs_field("nw_src").unwrap().nxm, "NXM_OF_IP_SRC");
        assert_eq!(ovs_field("reg15").unwrap().nxm, "NXM_NX_REG15");
        assert_eq!(ovs_field("NXM_NX_REG4").unwrap().field, Field::Reg(4));
        assert_eq!(ovs_field("xreg1").unwrap().nxm, "OXM_OF_PKT_REG1");
        assert!(ovs_field("reg16").is_none());
        assert!(ovs_field("dl_vlan").is_none());
        assert!(ovs_field("IP_SRC").is_none());
        let dscp = ovs_field("ip_dscp").unwrap();
        let sf = LearnSubField {
            field: dscp,
            ofs: 1,
            n_bits: 2,
        };
        assert_eq!(sf.key().ofs, 3);
    }

    #[test]
    fn every_table_entry_fits_its_field() {
        for (of, _) in FIELDS {
            assert!(LearnSubField::whole(*of).is_valid(), "{of:?}");
            assert_eq!(ovs_field(of.nxm), Some(*of), "{}", of.nxm);
            assert_eq!(ovs_field(of.name), Some(*of), "{}", of.name);
        }
    }

    #[test]
    fn a_packet_gives_the_learned_flow() {
        let learn = LearnAction {
            table: 36,
            priority: 200,
            hard_timeout: 300,
            cookie: 7,
            specs: vec![
                LearnSpec::Match {
                    dst: LearnSubField::whole(ovs_field("eth_type").unwrap()),
                    src: LearnSrc::Imm(0x800),
                },
                LearnSpec::Match {
                    dst: LearnSubField::whole(ovs_field("ip_src").unwrap()),
                    src: LearnSrc::Field(LearnSubField::whole(ovs_field("ip_src").unwrap())),
                },
                LearnSpec::Load {
                    dst: LearnSubField::whole(ovs_field("reg3").unwrap()),
                    src: LearnSrc::Field(LearnSubField::whole(ovs_field("reg3").unwrap())),
                },
                LearnSpec::Output {
                    src: LearnSubField::whole(ovs_field("in_port").unwrap()),
                },
            ],
            ..LearnAction::default()
        };
        let mut key = FlowKey::ZERO;
        key.set(Field::NwSrc, 0x0a00_0005);
        key.set(Field::Reg(3), 9);
        key.set(Field::InPort, 4);
        let flow = learned_flow_for_key(&learn, &key);
        assert_eq!(
            (flow.table, flow.priority, flow.hard_timeout, flow.cookie),
            (36, 200, 300, 7)
        );
        assert_eq!(flow.matches.get(Field::NwSrc), (0x0a00_0005, 0xffff_ffff));
        assert_eq!(flow.matches.get(Field::DlType), (0x800, 0xffff));
        assert_eq!(
            flow.actions,
            vec![
                Action::Load {
                    dst: SubField::whole(Field::Reg(3)),
                    value: 9
                },
                Action::Output(4)
            ]
        );
        // A port that is no OpenFlow 1.0 port reads as OFPP_NONE, which
        // outputs nothing; LOCAL is LOCAL.
        key.set(Field::InPort, 0x1_0000);
        assert_eq!(learned_flow_for_key(&learn, &key).actions.len(), 1);
        key.set(Field::InPort, u128::from(port::LOCAL));
        assert_eq!(
            learned_flow_for_key(&learn, &key).actions[1],
            Action::Output(port::LOCAL)
        );
    }

    #[test]
    fn cached_learns_are_handed_on_at_most_every_resend_interval() {
        let l = Learned::new(Flow::default());
        assert!(l.due(0));
        assert!(!l.due(Learned::RESEND_NS - 1));
        assert!(l.due(Learned::RESEND_NS + 1));
        assert!(!l.due(Learned::RESEND_NS + 2));
    }
}
