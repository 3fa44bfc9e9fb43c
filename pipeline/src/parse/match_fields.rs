//! The match: `name=value[/mask]` items and protocol shorthands into a
//! canonical [`Match`], and the prerequisite check once the whole match is
//! read.

use super::error::{PResult, Src};
use super::value::{ones, parse_flags, parse_port, parse_value_mask, uint_bits};
use super::{eth_type, ip_proto, SHORTHANDS};
use crate::field::{ct_state, frag, tcp_flags, Field, FieldName, Prereq, ValueFormat};
use crate::flow::Match;

/// The 802.1Q "tag present" bit of `vlan_tci`.
pub(super) const VLAN_CFI: u128 = 0x1000;

/// Fields OVS cannot mask (only an all-ones mask is accepted).
pub(super) fn maskable(name: &FieldName) -> bool {
    if name.ofs != 0 || name.bits as u32 != name.field.bits() {
        // Partial names: only vlan_vid is maskable.
        return name.name == "vlan_vid";
    }
    !matches!(
        name.field,
        Field::InPort
            | Field::DlType
            | Field::NwProto
            | Field::NwTtl
            | Field::CtZone
            | Field::ConjId
            | Field::RecircId
            | Field::NdReserved
            | Field::NdOptionsType
    )
}

/// A field name written in a match, remembered for the prerequisite check.
pub(super) struct Used<'a> {
    pub(super) name: FieldName,
    pub(super) tok: &'a str,
}

/// The packet kind pinned by a match: exact `dl_type`, exact `nw_proto`.
pub(super) fn pinned(m: &Match) -> (Option<u16>, Option<u8>) {
    let (dl, dlm) = m.get(Field::DlType);
    let (pr, prm) = m.get(Field::NwProto);
    (
        (dlm == 0xffff).then_some(dl as u16),
        (prm == 0xff).then_some(pr as u8),
    )
}

/// Whether the match satisfies the prerequisite of a name (with the OVS
/// aliases: `nw_src`/`nw_dst` also mean `arp_spa`/`arp_tpa` and `nw_proto`
/// means `arp_op` in ARP flows; `icmp_type`/`icmp_code` also serve ICMPv6).
pub(crate) fn prereq_ok(m: &Match, name: &FieldName) -> bool {
    let (dl, proto) = pinned(m);
    let ip4 = dl == Some(eth_type::IPV4);
    let ip6 = dl == Some(eth_type::IPV6);
    let ip = ip4 || ip6;
    let arp = dl == Some(eth_type::ARP) || dl == Some(eth_type::RARP);
    // NXM names resolve with the field's own prerequisite; the IPv4/ARP
    // shared fields have none there, so give them the OVS one.
    let prereq = match (name.prereq, name.field) {
        (Prereq::None, Field::NwSrc | Field::NwDst) => Prereq::Ipv4,
        (Prereq::None, Field::NwProto) => Prereq::Ip,
        (p, _) => p,
    };
    let arp_alias = matches!(
        name.name,
        "nw_src" | "nw_dst" | "ip_src" | "ip_dst" | "nw_proto" | "ip_proto"
    ) || matches!(name.field, Field::NwSrc | Field::NwDst | Field::NwProto)
        && name.name == name.field.name();
    match prereq {
        Prereq::None => true,
        Prereq::Ip => ip || (arp && arp_alias),
        Prereq::Ipv4 => ip4 || (arp && arp_alias),
        Prereq::Ipv6 => ip6,
        Prereq::Arp => arp,
        Prereq::Tcp => ip && proto == Some(ip_proto::TCP),
        Prereq::Udp => ip && proto == Some(ip_proto::UDP),
        Prereq::Sctp => ip && proto == Some(ip_proto::SCTP),
        Prereq::Icmp => {
            (ip4 && proto == Some(ip_proto::ICMP))
                || (matches!(name.name, "icmp_type" | "icmp_code")
                    && ip6
                    && proto == Some(ip_proto::ICMPV6))
        }
        Prereq::Icmpv6 => ip6 && proto == Some(ip_proto::ICMPV6),
        Prereq::L4Ports => {
            ip && matches!(
                proto,
                Some(ip_proto::TCP) | Some(ip_proto::UDP) | Some(ip_proto::SCTP)
            )
        }
        Prereq::Vlan => {
            let (v, mask) = m.get(Field::VlanTci);
            mask & VLAN_CFI != 0 && v & VLAN_CFI != 0
        }
        Prereq::Nd | Prereq::NdSolicit | Prereq::NdAdvert => {
            let icmp6 = ip6 && proto == Some(ip_proto::ICMPV6);
            icmp6 && nd_type_ok(m, prereq)
        }
    }
}

/// ICMPv6 types of Neighbour Discovery messages.
const ND_SOLICIT: u128 = 135;
const ND_ADVERT: u128 = 136;

/// The ND part of OVS's `is_nd()` on a match: OVS reads the match's
/// *values* (a field not matched reads as 0), so `icmp_code` must be 0 or
/// not matched, and `icmp_type` must be 135/136 (or the one the
/// prerequisite names).
pub(super) fn nd_type_ok(m: &Match, prereq: Prereq) -> bool {
    let (ty, _) = m.get(Field::TpSrc);
    let (code, _) = m.get(Field::TpDst);
    code == 0
        && match prereq {
            Prereq::NdSolicit => ty == ND_SOLICIT,
            Prereq::NdAdvert => ty == ND_ADVERT,
            _ => ty == ND_SOLICIT || ty == ND_ADVERT,
        }
}

/// Parses `name=value[/mask]` into (field, value, mask) in field units.
/// `exact` (packet specs) rejects masks and reads flag sets as "these bits set".
pub(super) fn parse_field_value(
    src: &Src,
    name: &FieldName,
    vtok: &str,
    exact: bool,
) -> PResult<(Field, u128, u128)> {
    let f = name.field;
    let what = name.name;
    if exact && vtok.contains('/') && !matches!(name.format, ValueFormat::Ipv4 | ValueFormat::Ipv6)
    {
        return Err(src.err(
            vtok,
            format!("masks are not allowed in a packet spec ({what})"),
        ));
    }
    match name.name {
        "dl_vlan" => {
            let v = uint_bits(src, vtok, 16, what)?;
            return if v == 0xffff {
                Ok((f, 0, 0x1fff))
            } else if v < 4096 {
                Ok((f, v | VLAN_CFI, 0x1fff))
            } else {
                Err(src.err(vtok, "dl_vlan must be 0..4095 or 0xffff (no tag)"))
            };
        }
        "dl_vlan_pcp" | "vlan_pcp" => {
            let v = uint_bits(src, vtok, 3, what)?;
            return Ok((f, (v << 13) | VLAN_CFI, 0xf000));
        }
        "nw_tos" => {
            let v = uint_bits(src, vtok, 8, what)?;
            if v & 3 != 0 {
                return Err(src.err(
                    vtok,
                    "nw_tos must be a multiple of 4 (the ECN bits are nw_ecn)",
                ));
            }
            return Ok((f, v, 0xfc));
        }
        _ => {}
    }
    match name.format {
        ValueFormat::CtState | ValueFormat::TcpFlags => {
            let names: Vec<(&str, u128)> = if name.format == ValueFormat::CtState {
                ct_state::NAMES
                    .iter()
                    .map(|(n, b)| (*n, u128::from(*b)))
                    .collect()
            } else {
                tcp_flags::NAMES
                    .iter()
                    .map(|(n, b)| (*n, u128::from(*b)))
                    .collect()
            };
            let (v, m) = if exact {
                // Packet specs: `trk|new`, `+trk+new`, or a number; every named bit is set.
                let (v, _) = parse_flags(src, vtok, &names, f.bits(), what)?;
                (v, f.full_mask())
            } else {
                parse_flags(src, vtok, &names, f.bits(), what)?
            };
            Ok((f, v & m, m))
        }
        ValueFormat::Frag => {
            let (v, m) = match vtok {
                "no" => (0, frag::ANY),
                "yes" => (frag::ANY, frag::ANY),
                "first" => (frag::ANY, frag::ANY | frag::LATER),
                "later" => (frag::ANY | frag::LATER, frag::ANY | frag::LATER),
                "not_later" => (0, frag::LATER),
                _ => {
                    return Err(src.err(vtok, "nw_frag must be no, yes, first, later or not_later"))
                }
            };
            Ok((f, u128::from(v), u128::from(m)))
        }
        _ if f == Field::InPort => {
            if vtok.contains('/') {
                return Err(src.err(vtok, "in_port cannot be masked"));
            }
            let p = parse_port(src, vtok)?;
            Ok((f, u128::from(p), f.full_mask()))
        }
        format => {
            let bits = u32::from(name.bits);
            let (v, m) = parse_value_mask(src, vtok, format, bits, what)?;
            let full = ones(bits);
            let m = match m {
                Some(m) if m != full && !maskable(name) => {
                    let mtok = vtok.find('/').map_or(vtok, |i| &vtok[i..]);
                    return Err(src.err(mtok, format!("field {what} cannot be masked")));
                }
                Some(m) => m,
                None => full,
            };
            // icmp_type/icmp_code are 8-bit views of the 16-bit tp_src/tp_dst:
            // the upper byte is always zero, so match it too (as OVS does).
            let (v, m) = if matches!(f, Field::TpSrc | Field::TpDst) && bits == 8 {
                (v, if m == full { 0xffff } else { m })
            } else {
                (v << name.ofs, m << name.ofs)
            };
            Ok((f, v & m, m))
        }
    }
}

/// Applies a protocol shorthand (`tcp`...). Returns false if `key` is not one.
pub(super) fn apply_shorthand(m: &mut Match, key: &str) -> bool {
    if key == "eth" {
        return true;
    }
    match SHORTHANDS.iter().find(|(n, _, _)| *n == key) {
        Some((_, dl, proto)) => {
            m.set_exact(Field::DlType, u128::from(*dl));
            if let Some(p) = proto {
                m.set_exact(Field::NwProto, u128::from(*p));
            }
            true
        }
        None => false,
    }
}

pub(super) fn check_prereqs(src: &Src, m: &Match, used: &[Used]) -> PResult<()> {
    for u in used {
        if !prereq_ok(m, &u.name) {
            return Err(src.err(
                u.tok,
                format!("prerequisites not met for setting {}", u.name.name),
            ));
        }
    }
    Ok(())
}
