//! `learn(...)`, as OVS's `learn_parse` reads it and `learn_check` checks
//! it (the model and its semantics: [`crate::learn`]).
//!
//! Checks, each an error naming the token: unknown keywords and fields,
//! a table that is not 0..=254 (or a known name), numbers that do not fit
//! (OVS's `atoi` takes anything; oxvs refuses), `DST=SRC` and `load` of
//! two widths, a constant too wide for its destination, a source field
//! whose prerequisites the flow's match does not pin, a learned match
//! field or load destination whose prerequisites the learn's own constants
//! before it do not pin (`eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[]`),
//! a read-only load destination. Refused as unsupported: `limit` other than
//! 0, `result_dst`, `fin_idle_timeout`/`fin_hard_timeout` other than 0.

use super::actions::ActCtx;
use super::error::{PResult, Src};
use super::eth_type;
use super::ip_proto;
use super::lexer::Lexer;
use super::match_fields::{nd_type_ok, pinned, VLAN_CFI};
use super::value::{ones, parse_one_value, parse_port, parse_table, parse_uint, uint_bits};
use crate::field::{Field, Prereq, ValueFormat};
use crate::flow::{Action, Match};
use crate::learn::{
    ovs_field, port_to_ofp10, LearnAction, LearnSpec, LearnSrc, LearnSubField, OvsField,
};

/// Whether `m` pins what `prereq` needs (OVS's `mf_are_prereqs_ok`).
fn prereq_ok(m: &Match, prereq: Prereq) -> bool {
    let (dl, proto) = pinned(m);
    let ip4 = dl == Some(eth_type::IPV4);
    let ip6 = dl == Some(eth_type::IPV6);
    let ip = ip4 || ip6;
    match prereq {
        Prereq::None => true,
        Prereq::Ip => ip,
        Prereq::Ipv4 => ip4,
        Prereq::Ipv6 => ip6,
        Prereq::Arp => dl == Some(eth_type::ARP) || dl == Some(eth_type::RARP),
        Prereq::Tcp => ip && proto == Some(ip_proto::TCP),
        Prereq::Udp => ip && proto == Some(ip_proto::UDP),
        Prereq::Sctp => ip && proto == Some(ip_proto::SCTP),
        Prereq::Icmp => ip4 && proto == Some(ip_proto::ICMP),
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
            ip6 && proto == Some(ip_proto::ICMPV6) && nd_type_ok(m, prereq)
        }
    }
}

/// `NAME`, `NAME[]`, `NAME[n]`, `NAME[a..b]`, offsets relative to the field.
fn parse_learn_subfield(src: &Src, tok: &str) -> PResult<LearnSubField> {
    let (name_tok, range) = match tok.find('[') {
        Some(i) => {
            let inner = tok[i + 1..]
                .strip_suffix(']')
                .ok_or_else(|| src.err(tok, "missing ']' in sub-field"))?;
            (&tok[..i], Some(inner))
        }
        None => (tok, None),
    };
    let field = match ovs_field(name_tok) {
        Some(f) => f,
        None if crate::field::lookup_name(name_tok).is_some() => {
            return Err(src.err(
                name_tok,
                "this field has no NXM/OXM header; learn cannot use it (as in OVS)",
            ))
        }
        None => return Err(src.err(name_tok, "unknown field")),
    };
    let fbits = u32::from(field.bits);
    let (ofs, n) = match range {
        None | Some("") => (0u32, fbits),
        Some(r) => {
            let (a, b) = r.split_once("..").unwrap_or((r, r));
            let a: u32 = a.parse().map_err(|_| src.err(r, "invalid bit range"))?;
            let b: u32 = b.parse().map_err(|_| src.err(r, "invalid bit range"))?;
            if b < a {
                return Err(src.err(r, "bit range ends before it starts"));
            }
            if b >= fbits {
                return Err(src.err(
                    tok,
                    format!(
                        "ending bit {b} is not valid because field {} is only {fbits} bits wide",
                        field.name
                    ),
                ));
            }
            (a, b - a + 1)
        }
    };
    Ok(LearnSubField {
        field,
        ofs: ofs as u8,
        n_bits: n as u8,
    })
}

/// A constant for a whole field, in the field's own syntax (`10.0.0.1`,
/// `aa:bb:..`, `0x800`, `LOCAL` for `in_port`).
fn parse_whole_value(src: &Src, tok: &str, f: &OvsField) -> PResult<u128> {
    if f.field == Field::InPort {
        let p = parse_port(src, tok)?;
        if f.is_in_port16() {
            return port_to_ofp10(p)
                .map(u128::from)
                .ok_or_else(|| src.err(tok, "port number does not fit NXM_OF_IN_PORT (16 bits)"));
        }
        return Ok(u128::from(p));
    }
    if tok.contains('/') {
        return Err(src.err(tok, format!("{}: masks are not allowed in learn", f.name)));
    }
    let format = match f.format {
        ValueFormat::Mac | ValueFormat::Ipv4 | ValueFormat::Ipv6 => f.format,
        _ => ValueFormat::Hex,
    };
    parse_one_value(src, tok, format, u32::from(f.bits), f.name)
}

/// Parses the arguments of `learn(...)` for a flow with match `ac.m`.
pub(super) fn parse_learn(src: &Src, args: &str, ac: &ActCtx) -> PResult<Action> {
    let mut l = LearnAction::default();
    // The learned flow's match as its constants make it so far
    // (`learn_check`'s `dst_match`).
    let mut dst_match = Match::CATCHALL;
    let mut lex = Lexer::new(*src, args);
    let u16_arg = |v: &str, what: &str| -> PResult<u16> { Ok(uint_bits(src, v, 16, what)? as u16) };
    while let Some(item) = lex.next_item()? {
        let v = item.value;
        let need = |what: &str| {
            v.ok_or_else(|| {
                src.err(
                    item.whole,
                    format!("learn: {} needs a value ({what})", item.key),
                )
            })
        };
        match item.key {
            "table" => {
                let t = need("table")?;
                l.table = parse_table(src, t, ac.ctx)?;
            }
            "priority" => l.priority = u16_arg(need("0..65535")?, "learn priority")?,
            "idle_timeout" => l.idle_timeout = u16_arg(need("seconds")?, "learn idle_timeout")?,
            "hard_timeout" => l.hard_timeout = u16_arg(need("seconds")?, "learn hard_timeout")?,
            "fin_idle_timeout" | "fin_hard_timeout" => {
                let t = u16_arg(need("seconds")?, item.key)?;
                if t != 0 {
                    return Err(src.err(
                        item.whole,
                        format!(
                            "learn: {} is not supported (the learned flow would need fin_timeout, which oxvs lacks)",
                            item.key
                        ),
                    ));
                }
            }
            "cookie" => l.cookie = uint_bits(src, need("number")?, 64, "learn cookie")? as u64,
            "send_flow_rem" | "delete_learned" if v.is_some() => {
                return Err(src.err(item.whole, format!("learn: {} takes no value", item.key)))
            }
            "send_flow_rem" => l.send_flow_rem = true,
            "delete_learned" => l.delete_learned = true,
            "limit" => {
                let n = uint_bits(src, need("number")?, 32, "learn limit")? as u32;
                if n != 0 {
                    return Err(src.err(
                        item.whole,
                        "learn: limit is not supported by oxvs (only limit=0, no limit)",
                    ));
                }
            }
            "result_dst" => {
                return Err(src.err(item.whole, "learn: result_dst is not supported by oxvs"))
            }
            "load" => l
                .specs
                .push(parse_load_spec(src, need("SRC->DST")?, ac, &dst_match)?),
            "output" => {
                let sf = parse_learn_subfield(src, need("sub-field")?)?;
                check_src(src, item.whole, &sf, ac)?;
                l.specs.push(LearnSpec::Output { src: sf });
            }
            _ => {
                let dst = parse_learn_subfield(src, item.key).map_err(|e| {
                    if item.key.contains('[') || ovs_field(item.key).is_some() {
                        e
                    } else {
                        src.err(item.key, format!("learn: unknown keyword {}", item.key))
                    }
                })?;
                let spec = parse_match_spec(src, &item, dst, ac)?;
                if !prereq_ok(&dst_match, dst.field.prereq) {
                    return Err(src.err(
                        item.whole,
                        format!(
                            "learn: the learned flow matches {} without its prerequisites \
                             (put them first, e.g. eth_type=0x800,nw_proto=6)",
                            dst.field.name
                        ),
                    ));
                }
                if let LearnSpec::Match {
                    src: LearnSrc::Imm(v),
                    ..
                } = spec
                {
                    let k = dst.key();
                    dst_match.set(k.field, v << k.ofs, k.mask());
                }
                l.specs.push(spec);
            }
        }
    }
    Ok(Action::Learn(Box::new(l)))
}

/// A source field must have its prerequisites in the flow's match.
fn check_src(src: &Src, tok: &str, sf: &LearnSubField, ac: &ActCtx) -> PResult<()> {
    if ac.any_packet || prereq_ok(ac.m, sf.field.prereq) {
        Ok(())
    } else {
        Err(src.err(
            tok,
            format!(
                "learn: source field {} lacks correct prerequisites in the flow's match",
                sf.field.name
            ),
        ))
    }
}

/// `DST`, `DST=SRC`, `DST=VALUE`.
fn parse_match_spec(
    src: &Src,
    item: &super::lexer::Item,
    dst: LearnSubField,
    ac: &ActCtx,
) -> PResult<LearnSpec> {
    let Some(v) = item.value else {
        check_src(src, item.whole, &dst, ac)?;
        return Ok(LearnSpec::Match {
            dst,
            src: LearnSrc::Field(dst),
        });
    };
    let looks_like_field = v.contains('[') || ovs_field(v).is_some();
    if looks_like_field {
        let s = parse_learn_subfield(src, v)?;
        if s.n_bits != dst.n_bits {
            return Err(src.err(
                item.whole,
                format!(
                    "learn: bit widths of {} ({}) and {} ({}) differ",
                    item.key, dst.n_bits, v, s.n_bits
                ),
            ));
        }
        check_src(src, item.whole, &s, ac)?;
        return Ok(LearnSpec::Match {
            dst,
            src: LearnSrc::Field(s),
        });
    }
    let imm = if dst.is_whole() {
        parse_whole_value(src, v, &dst.field)?
    } else {
        let n = parse_uint(v).ok_or_else(|| {
            src.err(
                v,
                format!(
                    "learn: {} value {v} is neither a sub-field nor a number",
                    item.key
                ),
            )
        })?;
        if n > ones(u32::from(dst.n_bits)) {
            return Err(src.err(
                v,
                format!("learn: value {n:#x} does not fit into {} bits", dst.n_bits),
            ));
        }
        n
    };
    Ok(LearnSpec::Match {
        dst,
        src: LearnSrc::Imm(imm),
    })
}

/// `load:VALUE->DST` or `load:SRC->DST`.
fn parse_load_spec(src: &Src, arg: &str, ac: &ActCtx, dst_match: &Match) -> PResult<LearnSpec> {
    let (stok, dtok) = arg
        .split_once("->")
        .ok_or_else(|| src.err(arg, "learn: load needs SRC->DST"))?;
    if stok.is_empty() {
        return Err(src.err(arg, "learn: load is missing its source before '->'"));
    }
    let dst = parse_learn_subfield(src, dtok)?;
    let f = dst.field.field;
    if matches!(f, Field::CtMark | Field::CtLabel) {
        return Err(src.err(
            dtok,
            format!(
                "learn: cannot set CT fields outside of ct action ({})",
                dst.field.name
            ),
        ));
    }
    if !f.writable() {
        return Err(src.err(dtok, format!("learn: {} is read-only", dst.field.name)));
    }
    if !prereq_ok(dst_match, dst.field.prereq) {
        return Err(src.err(
            dtok,
            format!(
                "learn: the learned flow writes {} without its prerequisites in its match",
                dst.field.name
            ),
        ));
    }
    let s = if stok.starts_with(|c: char| c.is_ascii_digit()) {
        let n = parse_uint(stok).ok_or_else(|| src.err(stok, "learn: invalid value for load"))?;
        if n > ones(u32::from(dst.n_bits)) {
            return Err(src.err(
                arg,
                format!("learn: value {n:#x} does not fit into {} bits", dst.n_bits),
            ));
        }
        LearnSrc::Imm(n)
    } else {
        let s = parse_learn_subfield(src, stok)?;
        if s.n_bits != dst.n_bits {
            return Err(src.err(
                arg,
                format!(
                    "learn: source field is {} bits wide but destination is {} bits wide",
                    s.n_bits, dst.n_bits
                ),
            ));
        }
        check_src(src, stok, &s, ac)?;
        LearnSrc::Field(s)
    };
    Ok(LearnSpec::Load { dst, src: s })
}

#[cfg(test)]
mod tests {
    use crate::parse::{parse_flow, ParseContext};
    use crate::print::format_actions_for;

    /// (flow, its actions as `ovs-ofctl parse-flows` (Open vSwitch 3.1)
    /// prints them).
    const OVS: &[(&str, &str)] = &[
        (
            "tcp actions=learn(table=36,hard_timeout=300,priority=200,delete_learned,cookie=0x7000000000001,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x1->NXM_NX_REG0[20])",
            "learn(table=36,hard_timeout=300,priority=200,delete_learned,cookie=0x7000000000001,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x1->NXM_NX_REG0[20])",
        ),
        (
            "udp actions=learn(table=36,idle_timeout=10800,priority=200,delete_learned,cookie=0x7000000000002,eth_type=0x800,nw_proto=17,NXM_OF_UDP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x2->NXM_NX_REG4[16..18])",
            "learn(table=36,idle_timeout=10800,priority=200,delete_learned,cookie=0x7000000000002,eth_type=0x800,nw_proto=17,NXM_OF_UDP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x2->NXM_NX_REG4[16..18])",
        ),
        (
            "priority=5 actions=learn(table=1,OXM_OF_VLAN_VID[],OXM_OF_ETH_SRC[],load:OXM_OF_METADATA[]->OXM_OF_METADATA[],load:OXM_OF_IN_PORT[]->NXM_NX_REG1[],output:OXM_OF_IN_PORT[])",
            "learn(table=1,OXM_OF_VLAN_VID[],NXM_OF_ETH_SRC[],load:OXM_OF_METADATA[]->OXM_OF_METADATA[],load:OXM_OF_IN_PORT[]->NXM_NX_REG1[],output:OXM_OF_IN_PORT[])",
        ),
        (
            "ip actions=learn(table=1,eth_type=0x800,OXM_OF_IPV4_SRC[],OXM_OF_IPV4_DST[]=OXM_OF_IPV4_SRC[],load:OXM_OF_IPV4_DST[]->NXM_NX_REG0[])",
            "learn(table=1,eth_type=0x800,NXM_OF_IP_SRC[],NXM_OF_IP_DST[]=NXM_OF_IP_SRC[],load:NXM_OF_IP_DST[]->NXM_NX_REG0[])",
        ),
        (
            "tcp actions=learn(table=1,eth_type=0x800,nw_proto=6,OXM_OF_TCP_DST[],OXM_OF_VLAN_VID[]=0x5)",
            "learn(table=1,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],vlan_vid=5)",
        ),
        (
            "priority=5 actions=learn(table=1,OXM_OF_VLAN_VID[0..3]=0x5,load:0x5->OXM_OF_VLAN_VID[])",
            "learn(table=1,OXM_OF_VLAN_VID[0..3]=0x5,load:0x5->OXM_OF_VLAN_VID[])",
        ),
        (
            "sctp actions=learn(table=36,eth_type=0x800,nw_proto=132,OXM_OF_SCTP_DST[],ip_src[])",
            "learn(table=36,eth_type=0x800,nw_proto=132,OXM_OF_SCTP_DST[],NXM_OF_IP_SRC[])",
        ),
        (
            "tcp actions=learn(table=1,dl_type=0x800,ip_proto=6,tp_dst[],nw_src[],ip_dst[]=nw_src[],reg3=5,reg4[0..7]=0x12,eth_src=00:11:22:33:44:55,in_port=3)",
            "learn(table=1,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],NXM_OF_IP_SRC[],NXM_OF_IP_DST[]=NXM_OF_IP_SRC[],reg3=0x5,NXM_NX_REG4[0..7]=0x12,eth_src=00:11:22:33:44:55,in_port=3)",
        ),
        (
            "ip actions=learn()",
            "learn(table=1)",
        ),
        (
            "ip actions=learn(table=10,NXM_OF_VLAN_TCI[0..11],NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[],load:NXM_OF_IN_PORT[]->NXM_NX_REG0[0..15])",
            "learn(table=10,NXM_OF_VLAN_TCI[0..11],NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[],load:NXM_OF_IN_PORT[]->NXM_NX_REG0[0..15])",
        ),
        (
            "ip actions=learn(table=1,priority=5,idle_timeout=10,hard_timeout=20,send_flow_rem,cookie=0x5,output:NXM_NX_REG1[],load:NXM_NX_REG2[0..3]->NXM_NX_REG5[4..7],load:0xff->reg6[],load:0->reg7[0..7])",
            "learn(table=1,idle_timeout=10,hard_timeout=20,priority=5,send_flow_rem,cookie=0x5,output:NXM_NX_REG1[],load:NXM_NX_REG2[0..3]->NXM_NX_REG5[4..7],load:0xff->NXM_NX_REG6[],load:0->NXM_NX_REG7[0..7])",
        ),
        (
            "arp actions=learn(table=1,eth_type=0x806,arp_op=1,arp_spa[],NXM_OF_ARP_TPA[],arp_sha[],load:0->reg0[0..7],load:0x00ff->reg2[0..15])",
            "learn(table=1,eth_type=0x806,arp_op=1,NXM_OF_ARP_SPA[],NXM_OF_ARP_TPA[],NXM_NX_ARP_SHA[],load:0->NXM_NX_REG0[0..7],load:0xff->NXM_NX_REG2[0..15])",
        ),
        (
            "icmp actions=learn(table=1,eth_type=0x800,nw_proto=1,icmp_type[],icmp_code=3,nw_ttl=5,nw_ecn=1)",
            "learn(table=1,eth_type=0x800,nw_proto=1,NXM_OF_ICMP_TYPE[],icmp_code=3,nw_ttl=5,nw_ecn=1)",
        ),
        (
            "ipv6 actions=learn(table=1,eth_type=0x86dd,ipv6_src[],ipv6_dst=::1,ipv6_label[])",
            "learn(table=1,eth_type=0x86dd,NXM_NX_IPV6_SRC[],ipv6_dst=::1,NXM_NX_IPV6_LABEL[])",
        ),
        (
            "ip actions=learn(table=1,vlan_tci[],dl_src[],eth_dst=aa:bb:cc:dd:ee:ff,metadata=0x5,tun_id=0x10,tun_src=1.2.3.4,tun_dst[],in_port=LOCAL,pkt_mark=3,ct_label[],ct_zone[],conj_id[])",
            "learn(table=1,NXM_OF_VLAN_TCI[],NXM_OF_ETH_SRC[],eth_dst=aa:bb:cc:dd:ee:ff,metadata=0x5,tun_id=0x10,tun_src=1.2.3.4,NXM_NX_TUN_IPV4_DST[],in_port=LOCAL,pkt_mark=0x3,NXM_NX_CT_LABEL[],NXM_NX_CT_ZONE[],NXM_NX_CONJ_ID[])",
        ),
        (
            "ip actions=learn(table=1,eth_type=0x800,ip_src[0..7],ip_src[8..15]=NXM_NX_REG0[0..7],load:0x12345678->NXM_OF_IP_SRC[],load:1->ip_dst[0])",
            "learn(table=1,eth_type=0x800,NXM_OF_IP_SRC[0..7],NXM_OF_IP_SRC[8..15]=NXM_NX_REG0[0..7],load:0x12345678->NXM_OF_IP_SRC[],load:0x1->NXM_OF_IP_DST[0])",
        ),
        (
            "ip actions=learn(table=1,tun_id[],metadata[],xreg1[],ct_state[],ct_mark[],pkt_mark[],output:NXM_OF_IN_PORT[]),learn(table=2,reg0=NXM_OF_IP_SRC[]),output:1",
            "learn(table=1,NXM_NX_TUN_ID[],OXM_OF_METADATA[],OXM_OF_PKT_REG1[],NXM_NX_CT_STATE[],NXM_NX_CT_MARK[],NXM_NX_PKT_MARK[],output:NXM_OF_IN_PORT[]),learn(table=2,NXM_NX_REG0[]=NXM_OF_IP_SRC[]),output:1",
        ),
        (
            "ip actions=learn(table=1,load:0x1->NXM_NX_REG0[],load:ct_state[]->reg0[],load:0x1->in_port[])",
            "learn(table=1,load:0x1->NXM_NX_REG0[],load:NXM_NX_CT_STATE[]->NXM_NX_REG0[],load:0x1->NXM_OF_IN_PORT[])",
        ),
    ];

    #[test]
    fn learn_prints_as_ovs_prints_it() {
        let ctx = ParseContext::default();
        for (text, ovs) in OVS {
            let f = parse_flow(text, &ctx).unwrap_or_else(|e| panic!("{text}: {e}"));
            let printed = format_actions_for(&f.actions, &f.matches, None);
            assert_eq!(&printed, ovs, "{text}");
            // And what is printed reads back the same.
            let again = parse_flow(
                &format!("{} actions={printed}", &text[..text.find(' ').unwrap()]),
                &ctx,
            )
            .unwrap_or_else(|e| panic!("{printed}: {e}"));
            assert_eq!(again.actions, f.actions, "{printed}");
        }
    }

    #[test]
    fn bad_learns_are_refused_with_the_reason() {
        let ctx = ParseContext::default();
        for (text, why) in [
            (
                "tcp actions=learn(table=1,NXM_OF_TCP_DST[])",
                "without its prerequisites",
            ),
            (
                "ip actions=learn(table=1,load:ip_src[]->ip_dst[])",
                "without its prerequisites",
            ),
            (
                "udp actions=learn(table=1,eth_type=0x800,nw_proto=17,tcp_dst[])",
                "source field tcp_dst lacks",
            ),
            (
                "ip actions=learn(table=1,NXM_OF_IP_SRC[]=NXM_NX_REG0[0..15])",
                "bit widths of NXM_OF_IP_SRC[] (32) and NXM_NX_REG0[0..15] (16) differ",
            ),
            (
                "ip actions=learn(table=1,load:reg1[0..3]->reg0[0..7])",
                "source field is 4 bits wide but destination is 8",
            ),
            (
                "ip actions=learn(table=1,load:0x1ff->reg0[0..7])",
                "does not fit into 8 bits",
            ),
            (
                "ip actions=learn(table=1,reg0[0..7]=256)",
                "does not fit into 8 bits",
            ),
            (
                "ip actions=learn(table=1,reg0=10.0.0.1)",
                "invalid value for reg0",
            ),
            (
                "ip actions=learn(table=1,eth_type=0x800,ip_src=10.0.0.0/8)",
                "masks are not allowed",
            ),
            (
                "ip actions=learn(table=255,reg0[])",
                "table number out of range",
            ),
            (
                "ip actions=learn(table=Nowhere,reg0[])",
                "unknown table name",
            ),
            ("ip actions=learn(table=1,foo[])", "unknown field"),
            ("ip actions=learn(table=1,foo)", "unknown keyword foo"),
            ("ip actions=learn(table=1,dl_vlan[])", "no NXM/OXM header"),
            ("ip actions=learn(table=1,reg0[0..32])", "only 32 bits wide"),
            (
                "ip actions=learn(table=1,priority=abc)",
                "invalid number for learn priority",
            ),
            (
                "ip actions=learn(table=1,hard_timeout=65536)",
                "value too large",
            ),
            (
                "ip actions=learn(table=1,cookie=foo)",
                "invalid number for learn cookie",
            ),
            (
                "ip actions=learn(table=1,limit=10,reg0[])",
                "limit is not supported",
            ),
            (
                "ip actions=learn(table=1,result_dst=reg0[1],reg0[])",
                "result_dst is not supported",
            ),
            (
                "ip actions=learn(table=1,fin_idle_timeout=3)",
                "fin_idle_timeout is not supported",
            ),
            (
                "ip actions=learn(table=1,load:reg0[]->ct_state[])",
                "ct_state is read-only",
            ),
            (
                "ip actions=learn(table=1,load:1->ct_mark[])",
                "cannot set CT fields",
            ),
            (
                "ip actions=learn(table=1,load:reg0[])",
                "load needs SRC->DST",
            ),
            (
                "ip actions=learn(table=1,load:->reg0[])",
                "missing its source",
            ),
            ("ip actions=learn(table=1,output)", "output needs a value"),
            (
                "ip actions=learn(table=1,delete_learned=1)",
                "takes no value",
            ),
            ("ip actions=learn:1", "learn arguments go in parentheses"),
            ("ip actions=learn(table=1,reg0[)", "missing ']'"),
        ] {
            let e = parse_flow(text, &ctx).expect_err(text);
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn learn_needs_no_source_prerequisites_in_a_group_bucket() {
        let g = crate::parse::parse_group(
            "group_id=1,type=all,bucket=actions=learn(table=1,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[])",
            &ParseContext::default(),
        );
        assert!(g.is_ok(), "{g:?}");
    }
}
