//! The action list: every action the flow model holds, checked against the
//! flow's match and table (field writability, prerequisites) and against
//! each other (`goto_table` last, `conjunction` only with `note`, `drop`
//! alone).

use super::error::{PResult, ParseError, Src};
use super::lexer::{Item, Lexer};
use super::match_fields::{pinned, prereq_ok, VLAN_CFI};
use super::value::{
    ones, parse_ipv4, parse_mac, parse_port, parse_table, parse_uint, parse_value_mask, uint_bits,
};
use super::{eth_type, ParseContext};
use crate::field::{is_nxm_name, lookup_name, lookup_subfield_name, Field, FieldName, ValueFormat};
use crate::flow::{
    port, Action, ControllerAction, CtAction, CtZoneSrc, Match, NatAction, NatKind, NatRange,
    PacketInReason, SubField,
};
use crate::group::GROUP_MAX;

/// Parses a sub-field: `NAME`, `NAME[]`, `NAME[n]`, `NAME[a..b]`.
pub(super) fn parse_subfield(src: &Src, tok: &str) -> PResult<(SubField, FieldName)> {
    let (name_tok, range) = match tok.find('[') {
        Some(i) => {
            let inner = tok[i + 1..]
                .strip_suffix(']')
                .ok_or_else(|| src.err(tok, "missing ']' in sub-field"))?;
            (&tok[..i], Some(inner))
        }
        None => (tok, None),
    };
    let name = lookup_subfield_name(name_tok).ok_or_else(|| {
        if is_nxm_name(name_tok) {
            src.err(
                name_tok,
                "unknown field (or an NXM/OXM field oxvs does not have)",
            )
        } else {
            src.err(name_tok, "unknown field")
        }
    })?;
    let fbits = u32::from(name.bits);
    let (ofs, n) = match range {
        None | Some("") => (0u32, fbits),
        Some(r) => {
            let (a, b) = match r.split_once("..") {
                Some((a, b)) => (a, b),
                None => (r, r),
            };
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
                        name.name
                    ),
                ));
            }
            (a, b - a + 1)
        }
    };
    Ok((
        SubField {
            field: name.field,
            ofs: (u32::from(name.ofs) + ofs) as u8,
            n_bits: n as u8,
        },
        name,
    ))
}

/// State while checking an action list against its flow.
pub(super) struct ActCtx<'m, 'c> {
    pub(super) m: &'m Match,
    pub(super) table: u8,
    pub(super) ctx: &'c ParseContext,
    /// A group bucket's actions: they run on whatever packet reaches the
    /// group, so no prerequisite is checked (as OVS).
    pub(super) any_packet: bool,
}

impl ActCtx<'_, '_> {
    pub(super) fn check_prereq(
        &self,
        src: &Src,
        tok: &str,
        name: &FieldName,
        verb: &str,
    ) -> PResult<()> {
        if self.any_packet || prereq_ok(self.m, name) {
            Ok(())
        } else {
            Err(src.err(
                tok,
                format!(
                    "{verb} {} lacks correct prerequisites in the match",
                    name.name
                ),
            ))
        }
    }

    pub(super) fn check_writable(
        &self,
        src: &Src,
        tok: &str,
        name: &FieldName,
        in_ct: bool,
    ) -> PResult<()> {
        let f = name.field;
        if matches!(f, Field::CtMark | Field::CtLabel) {
            if in_ct {
                return Ok(());
            }
            return Err(src.err(
                tok,
                format!("cannot set CT fields outside of ct action ({})", name.name),
            ));
        }
        if in_ct {
            return Err(src.err(
                tok,
                format!(
                    "ct action doesn't support nested modification of {}",
                    name.name
                ),
            ));
        }
        if !f.writable() {
            return Err(src.err(tok, format!("{} is read-only", name.name)));
        }
        Ok(())
    }
}

/// Parses `VALUE[/MASK]->FIELD` for `set_field`.
pub(super) fn parse_set_field(src: &Src, arg: &str, ac: &ActCtx, in_ct: bool) -> PResult<Action> {
    let (vtok, ftok) = arg
        .split_once("->")
        .ok_or_else(|| src.err(arg, "set_field needs VALUE->FIELD"))?;
    // OVS's set_field takes field names (`vlan_vid`, `reg0`), not NXM/OXM
    // names, and says so in these words.
    if is_nxm_name(ftok) {
        return Err(src.err(
            ftok,
            format!(
                "{ftok} is not a valid OXM field name (set_field takes a field name such as \
                 reg0 or eth_src; NXM/OXM names go in load and move)"
            ),
        ));
    }
    let name = lookup_name(ftok).ok_or_else(|| src.err(ftok, "unknown field"))?;
    ac.check_writable(src, ftok, &name, in_ct)?;
    ac.check_prereq(src, ftok, &name, "set_field")?;
    let f = name.field;
    let bits = u32::from(name.bits);
    let (v, m) = match name.format {
        ValueFormat::CtState | ValueFormat::TcpFlags | ValueFormat::Frag => {
            let (v, m) = parse_value_mask(src, vtok, ValueFormat::Hex, bits, name.name)?;
            (v, m.unwrap_or(ones(bits)))
        }
        _ if f == Field::InPort => (u128::from(parse_port(src, vtok)?), ones(bits)),
        fmt => {
            let (v, m) = parse_value_mask(src, vtok, fmt, bits, name.name)?;
            match (name.name, m) {
                // `nw_tos` is the DSCP bits in place (as OVS): the ECN bits are kept.
                ("nw_tos", None) if v & 3 != 0 => {
                    return Err(src.err(
                        vtok,
                        "nw_tos must be a multiple of 4 (the ECN bits are nw_ecn)",
                    ))
                }
                ("nw_tos", None) => (v, 0xfc),
                // `vlan_vid` is OXM's VID with "tag present" (0x1000): setting
                // it rewrites the VID of the existing tag and keeps the tag
                // (OVS prints it as `mod_vlan_vid`); it never strips it.
                ("vlan_vid", None) => (v | VLAN_CFI, ones(bits)),
                // icmp_type/icmp_code: 8-bit views of 16-bit tp_src/tp_dst.
                (_, None) if matches!(f, Field::TpSrc | Field::TpDst) && bits == 8 => (v, 0xffff),
                _ => (v, m.unwrap_or(ones(bits))),
            }
        }
    };
    Ok(Action::SetField {
        field: f,
        value: (v & m) << name.ofs,
        mask: m << name.ofs,
    })
}

/// Parses `VALUE->DST` for `load`.
pub(super) fn parse_load(src: &Src, arg: &str, ac: &ActCtx, in_ct: bool) -> PResult<Action> {
    let (vtok, dtok) = arg
        .split_once("->")
        .ok_or_else(|| src.err(arg, "load needs VALUE->DST"))?;
    let (dst, name) = parse_subfield(src, dtok)?;
    ac.check_writable(src, dtok, &name, in_ct)?;
    ac.check_prereq(src, dtok, &name, "load")?;
    let v = parse_uint(vtok).ok_or_else(|| src.err(vtok, "invalid value for load"))?;
    if v > ones(u32::from(dst.n_bits)) {
        return Err(src.err(
            vtok,
            format!("value {v:#x} does not fit into {} bits", dst.n_bits),
        ));
    }
    if in_ct {
        return Ok(Action::SetField {
            field: dst.field,
            value: v << dst.ofs,
            mask: dst.mask(),
        });
    }
    Ok(Action::Load { dst, value: v })
}

/// Parses `SRC[a..b]->DST[c..d]` for `move`. Inside `ct(exec(...))`
/// (`in_ct`) the destination must be `ct_mark` or `ct_label`, as in OVS.
pub(super) fn parse_move(src: &Src, arg: &str, ac: &ActCtx, in_ct: bool) -> PResult<Action> {
    let (stok, dtok) = arg
        .split_once("->")
        .ok_or_else(|| src.err(arg, "move needs SRC->DST"))?;
    let (s, sname) = parse_subfield(src, stok)?;
    let (d, dname) = parse_subfield(src, dtok)?;
    ac.check_writable(src, dtok, &dname, in_ct)?;
    ac.check_prereq(src, stok, &sname, "move")?;
    ac.check_prereq(src, dtok, &dname, "move")?;
    if s.n_bits != d.n_bits {
        return Err(src.err(
            arg,
            format!(
                "source field is {} bits wide but destination is {} bits wide",
                s.n_bits, d.n_bits
            ),
        ));
    }
    Ok(Action::Move { src: s, dst: d })
}

pub(super) fn parse_ct(src: &Src, args: &str, ac: &ActCtx) -> PResult<Action> {
    let mut ct = CtAction {
        commit: false,
        force: false,
        zone: CtZoneSrc::Imm(0),
        table: None,
        exec: Vec::new(),
    };
    let mut lex = Lexer::new(*src, args);
    let mut force_tok = None;
    while let Some(item) = lex.next_item()? {
        match (item.key, item.value) {
            ("commit", None) => ct.commit = true,
            ("force", None) => {
                ct.force = true;
                force_tok = Some(item.key);
            }
            ("zone", Some(v)) => {
                ct.zone = if let Some(n) = parse_uint(v) {
                    CtZoneSrc::Imm(
                        u16::try_from(n).map_err(|_| src.err(v, "ct zone must fit in 16 bits"))?,
                    )
                } else {
                    let (sf, _) = parse_subfield(src, v)?;
                    if sf.n_bits != 16 {
                        return Err(src.err(
                            v,
                            format!("ct zone sub-field must be 16 bits wide, not {}", sf.n_bits),
                        ));
                    }
                    CtZoneSrc::Field(sf)
                };
            }
            ("table", Some(v)) => ct.table = Some(parse_table(src, v, ac.ctx)?),
            ("exec", Some(v)) if item.paren => {
                let mut l2 = Lexer::new(*src, v);
                while let Some(a) = l2.next_item()? {
                    let arg = a.value.unwrap_or("");
                    let act = match a.key {
                        "set_field" => parse_set_field(src, arg, ac, true)?,
                        "load" => parse_load(src, arg, ac, true)?,
                        "move" => parse_move(src, arg, ac, true)?,
                        "nat" => parse_nat(src, &a, ac)?,
                        _ => {
                            return Err(src.err(
                                a.whole,
                                format!(
                                    "ct action doesn't support nested action {} \
                                 (only set_field, load and move to ct_mark or ct_label, and nat)",
                                    a.key
                                ),
                            ))
                        }
                    };
                    if matches!(act, Action::Nat(_)) && ct.nat().is_some() {
                        return Err(src.err(a.whole, "only one nat action per ct"));
                    }
                    ct.exec.push(act);
                }
            }
            ("nat", _) => {
                if ct.nat().is_some() {
                    return Err(src.err(item.whole, "only one nat action per ct"));
                }
                ct.exec.push(parse_nat(src, &item, ac)?);
            }
            _ => return Err(src.err(item.whole, "unknown or unsupported ct argument")),
        }
    }
    if let Some(t) = force_tok {
        if !ct.commit {
            return Err(src.err(t, "\"force\" flag requires \"commit\" flag"));
        }
    }
    if ct.exec.iter().any(|a| !matches!(a, Action::Nat(_))) && !ct.commit {
        return Err(src.err(args, "ct exec requires commit"));
    }
    Ok(Action::Ct(ct))
}

/// Parses `nat`, `nat(src|dst[=ADDR[-ADDR][:PORT[-PORT]]][,persistent][,hash|random])`
/// (an IPv6 address in brackets when a port follows), as OVS's `parse_NAT`.
pub(super) fn parse_nat(src: &Src, item: &Item, ac: &ActCtx) -> PResult<Action> {
    let mut nat = NatAction::default();
    let args = match (item.value, item.paren) {
        (None, _) => return Ok(Action::Nat(nat)),
        (Some(v), true) => v,
        (Some(_), false) => return Err(src.err(item.whole, "nat arguments go in parentheses")),
    };
    let mut lex = Lexer::new(*src, args);
    while let Some(a) = lex.next_item()? {
        match (a.key, a.value) {
            ("src" | "dst", v) => {
                if nat.kind.is_some() {
                    return Err(src.err(a.whole, "nat: only one of src or dst"));
                }
                nat.kind = Some(if a.key == "src" {
                    NatKind::Src
                } else {
                    NatKind::Dst
                });
                if let Some(v) = v {
                    nat.range = Some(parse_nat_range(src, v, ac)?);
                }
            }
            ("persistent", None) => nat.persistent = true,
            ("hash", None) => nat.hash = true,
            ("random", None) => nat.random = true,
            _ => return Err(src.err(a.whole, "unknown nat argument")),
        }
    }
    if nat.hash && nat.random {
        return Err(src.err(args, "nat: hash and random are mutually exclusive"));
    }
    if nat.kind.is_none() && (nat.persistent || nat.hash || nat.random) {
        return Err(src.err(args, "nat: flags need src or dst"));
    }
    Ok(Action::Nat(nat))
}

/// `ADDR[-ADDR][:PORT[-PORT]]`, IPv6 addresses in brackets if a port follows.
fn parse_nat_range(src: &Src, v: &str, ac: &ActCtx) -> PResult<NatRange> {
    use std::net::IpAddr;
    // Split off the ports: after the last ']' for bracketed IPv6, else
    // after the only ':' (an unbracketed IPv6 address has several).
    let (addrs, ports) = if v.starts_with('[') {
        match v.rfind(']') {
            Some(close) => match v[close + 1..].strip_prefix(':') {
                Some(p) => (&v[..=close], Some(p)),
                None if close + 1 == v.len() => (v, None),
                None => return Err(src.err(v, "nat: expected ':PORT' after the address")),
            },
            None => return Err(src.err(v, "nat: missing ']'")),
        }
    } else if v.matches(':').count() == 1 {
        let (a, p) = v.split_once(':').unwrap_or((v, ""));
        (a, Some(p))
    } else {
        (v, None)
    };
    let addr = |t: &str| -> PResult<IpAddr> {
        let t = t.trim_start_matches('[').trim_end_matches(']');
        t.parse::<IpAddr>()
            .map_err(|_| src.err(t, "nat: invalid IP address"))
    };
    // A '-' between addresses: for IPv6 it cannot be inside an address.
    let (min, max) = match addrs.split_once('-') {
        Some((a, b)) => (addr(a)?, addr(b)?),
        None => {
            let a = addr(addrs)?;
            (a, a)
        }
    };
    if min.is_ipv4() != max.is_ipv4() {
        return Err(src.err(addrs, "nat: the range mixes IPv4 and IPv6"));
    }
    if max < min {
        return Err(src.err(addrs, "nat: the range ends before it starts"));
    }
    let (dl, _) = pinned(ac.m);
    let want_v4 = match dl {
        Some(eth_type::IPV4) => Some(true),
        Some(eth_type::IPV6) => Some(false),
        _ => None,
    };
    if want_v4.is_some_and(|v4| v4 != min.is_ipv4()) {
        return Err(src.err(
            addrs,
            "nat: the address family does not match the flow's (ip or ipv6)",
        ));
    }
    let ports = match ports {
        None => None,
        Some(p) => {
            let port = |t: &str| -> PResult<u16> {
                match parse_uint(t) {
                    Some(n @ 1..=0xffff) => Ok(n as u16),
                    _ => Err(src.err(t, "nat: invalid port (1-65535)")),
                }
            };
            let (a, b) = match p.split_once('-') {
                Some((a, b)) => (port(a)?, port(b)?),
                None => {
                    let a = port(p)?;
                    (a, a)
                }
            };
            if b < a {
                return Err(src.err(p, "nat: the port range ends before it starts"));
            }
            Some((a, b))
        }
    };
    Ok(NatRange {
        addr_min: min,
        addr_max: max,
        ports,
    })
}

pub(super) fn parse_controller(src: &Src, item: &Item) -> PResult<ControllerAction> {
    let mut c = ControllerAction {
        reason: PacketInReason::Action,
        userdata: Vec::new(),
        max_len: u16::MAX,
        controller_id: 0,
    };
    match (item.value, item.paren) {
        (None, _) => {}
        (Some(v), false) => c.max_len = uint_bits(src, v, 16, "controller max_len")? as u16,
        (Some(args), true) => {
            let mut lex = Lexer::new(*src, args);
            while let Some(a) = lex.next_item()? {
                let v = a
                    .value
                    .ok_or_else(|| src.err(a.key, "unknown controller argument"))?;
                match a.key {
                    "reason" => {
                        c.reason = match v {
                            "no_match" => PacketInReason::NoMatch,
                            "action" => PacketInReason::Action,
                            "invalid_ttl" => PacketInReason::InvalidTtl,
                            _ => return Err(src.err(v, "unknown or unsupported controller reason")),
                        }
                    }
                    "max_len" => c.max_len = uint_bits(src, v, 16, "max_len")? as u16,
                    "id" => c.controller_id = uint_bits(src, v, 16, "controller id")? as u16,
                    "userdata" => c.userdata = parse_hex_bytes(src, v)?,
                    _ => return Err(src.err(a.key, "unknown controller argument")),
                }
            }
        }
    }
    Ok(c)
}

/// Hex bytes with optional `.` separators (`00.11.22` or `001122`).
pub(super) fn parse_hex_bytes(src: &Src, tok: &str) -> PResult<Vec<u8>> {
    let mut out = Vec::new();
    let b = tok.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'.' {
            i += 1;
            continue;
        }
        if i + 1 >= b.len() || !b[i].is_ascii_hexdigit() || !b[i + 1].is_ascii_hexdigit() {
            return Err(src.err(&tok[i..], "bad hex digit"));
        }
        let byte = u8::from_str_radix(&tok[i..i + 2], 16)
            .map_err(|_| src.err(&tok[i..], "bad hex digit"))?;
        out.push(byte);
        i += 2;
    }
    Ok(out)
}

pub(super) fn output_port(src: &Src, tok: &str, p: u32) -> PResult<Action> {
    if p == port::NONE || p == port::TABLE || p == port::MAX {
        return Err(src.err(tok, "output to unsupported port"));
    }
    Ok(Action::Output(p))
}

pub(super) fn parse_action(src: &Src, item: &Item, ac: &ActCtx) -> PResult<Action> {
    let key = item.key;
    let need = |what: &str| -> PResult<&str> {
        item.value
            .ok_or_else(|| src.err(key, format!("{key} needs an argument ({what})")))
    };
    let no_arg = |a: Action| -> PResult<Action> {
        match item.value {
            None => Ok(a),
            Some(_) => Err(src.err(item.whole, format!("{key} takes no argument"))),
        }
    };
    Ok(match key {
        "output" => {
            let v = need("port or sub-field")?;
            let port = if v.contains('[') {
                None
            } else {
                parse_port(src, v).ok()
            };
            if let Some(p) = port {
                output_port(src, v, p)?
            } else if v.contains('[') || lookup_subfield_name(v).is_some() {
                let (sf, _) = parse_subfield(src, v)?;
                if sf.n_bits > 32 {
                    return Err(src.err(v, "output sub-field must be at most 32 bits wide"));
                }
                Action::OutputReg(sf)
            } else {
                output_port(src, v, parse_port(src, v)?)?
            }
        }
        "controller" | "CONTROLLER" => Action::Controller(parse_controller(src, item)?),
        "drop" => no_arg(Action::Output(port::NONE))?, // placeholder checked by the caller
        "goto_table" => {
            let v = need("table")?;
            let t = parse_table(src, v, ac.ctx)?;
            if t <= ac.table {
                return Err(src.err(
                    v,
                    format!("goto_table must go to a later table than {}", ac.table),
                ));
            }
            Action::GotoTable(t)
        }
        "resubmit" => {
            let v = need("port and/or table")?;
            if item.paren {
                let mut parts = v.split(',');
                let p = parts.next().unwrap_or("").trim();
                let t = parts.next().unwrap_or("").trim();
                if let Some(extra) = parts.next() {
                    return Err(src.err(extra, "unsupported resubmit argument"));
                }
                let in_port = match p {
                    "" => None,
                    _ => match parse_port(src, p)? {
                        port::IN_PORT => None,
                        n => Some(n),
                    },
                };
                let table = match t {
                    "" => None,
                    _ => Some(parse_table(src, t, ac.ctx)?),
                };
                if in_port.is_none() && table.is_none() {
                    return Err(src.err(
                        item.whole,
                        "at least one of in_port and table must be specified",
                    ));
                }
                Action::Resubmit { in_port, table }
            } else {
                match parse_port(src, v)? {
                    port::IN_PORT => {
                        return Err(
                            src.err(v, "resubmit:IN_PORT does nothing; give a port or a table")
                        )
                    }
                    p => Action::Resubmit {
                        in_port: Some(p),
                        table: None,
                    },
                }
            }
        }
        "set_field" => parse_set_field(src, need("VALUE->FIELD")?, ac, false)?,
        "load" => parse_load(src, need("VALUE->DST")?, ac, false)?,
        "move" => parse_move(src, need("SRC->DST")?, ac, false)?,
        "mod_dl_src" | "mod_dl_dst" => {
            let v = need("MAC")?;
            let mac = parse_mac(v).ok_or_else(|| src.err(v, "invalid Ethernet address"))? as u64;
            if key == "mod_dl_src" {
                Action::ModDlSrc(mac)
            } else {
                Action::ModDlDst(mac)
            }
        }
        "mod_nw_src" | "mod_nw_dst" => {
            let v = need("IP")?;
            let ip = parse_ipv4(v).ok_or_else(|| src.err(v, "invalid IPv4 address"))? as u32;
            let (dl, _) = pinned(ac.m);
            if dl != Some(eth_type::IPV4) && !ac.any_packet {
                return Err(src.err(key, format!("{key} needs an IPv4 match (ip)")));
            }
            if key == "mod_nw_src" {
                Action::ModNwSrc(ip)
            } else {
                Action::ModNwDst(ip)
            }
        }
        "dec_ttl" => {
            let (dl, _) = pinned(ac.m);
            if !matches!(dl, Some(eth_type::IPV4) | Some(eth_type::IPV6)) && !ac.any_packet {
                return Err(src.err(key, "dec_ttl needs an IP match (ip or ipv6)"));
            }
            no_arg(Action::DecTtl)?
        }
        "push_vlan" => {
            let v = need("ethertype")?;
            match parse_uint(v) {
                Some(0x8100) => Action::PushVlan(0x8100),
                Some(0x88a8) => Action::PushVlan(0x88a8),
                _ => return Err(src.err(v, "push_vlan ethertype must be 0x8100 or 0x88a8")),
            }
        }
        "pop_vlan" | "strip_vlan" => no_arg(Action::PopVlan)?,
        "set_tunnel" | "set_tunnel64" => {
            let v = need("tunnel id")?;
            Action::SetTunnel(uint_bits(src, v, 64, key)? as u64)
        }
        "ct" => {
            let (dl, _) = pinned(ac.m);
            if !matches!(dl, Some(eth_type::IPV4) | Some(eth_type::IPV6)) && !ac.any_packet {
                return Err(src.err(key, "ct needs an IP match (ip or ipv6)"));
            }
            match item.value {
                None => parse_ct(src, "", ac)?,
                Some(v) if item.paren => parse_ct(src, v, ac)?,
                Some(_) => return Err(src.err(item.whole, "ct arguments go in parentheses")),
            }
        }
        "ct_clear" => no_arg(Action::CtClear)?,
        "learn" => match item.value {
            Some(v) if item.paren => super::learn::parse_learn(src, v, ac)?,
            None => super::learn::parse_learn(src, "", ac)?,
            Some(_) => return Err(src.err(item.whole, "learn arguments go in parentheses")),
        },
        "nat" => return Err(src.err(key, "nat is only allowed inside ct")),
        "group" => {
            let v = need("group id")?;
            let id = uint_bits(src, v, 32, "group id")? as u32;
            if id > GROUP_MAX {
                return Err(src.err(v, format!("group id must be at most {GROUP_MAX:#x}")));
            }
            Action::Group(id)
        }
        "meter" => {
            if ac.any_packet {
                return Err(src.err(key, "meter is not allowed in a group bucket"));
            }
            Action::Meter(super::meter::meter_action(src, need("meter id")?)?)
        }
        "conjunction" => {
            let v = need("ID,K/N")?;
            let (id_tok, kn) = v
                .split_once(',')
                .ok_or_else(|| src.err(v, "conjunction needs (ID,K/N)"))?;
            let (k_tok, n_tok) = kn
                .split_once('/')
                .ok_or_else(|| src.err(kn, "conjunction needs (ID,K/N)"))?;
            let id = uint_bits(src, id_tok.trim(), 32, "conjunction id")? as u32;
            let k =
                parse_uint(k_tok.trim()).ok_or_else(|| src.err(k_tok, "invalid clause index"))?;
            let n = parse_uint(n_tok.trim())
                .ok_or_else(|| src.err(n_tok, "invalid number of clauses"))?;
            if n < 2 {
                return Err(src.err(n_tok, "conjunction must have at least 2 clauses"));
            }
            if n > 64 {
                return Err(src.err(n_tok, "conjunction must have at most 64 clauses"));
            }
            if k == 0 {
                return Err(src.err(k_tok, "clause index must be positive"));
            }
            if k > n {
                return Err(src.err(
                    k_tok,
                    "clause index must be less than or equal to number of clauses",
                ));
            }
            Action::Conjunction {
                id,
                clause: k as u8,
                n_clauses: n as u8,
            }
        }
        "note" => Action::Note(parse_hex_bytes(src, item.value.unwrap_or(""))?),
        "in_port" => no_arg(Action::Output(port::IN_PORT))?,
        _ => {
            // A bare port: number or reserved name.
            if item.value.is_some() {
                return Err(src.err(key, "unknown action"));
            }
            match parse_port(src, key) {
                Ok(p) => output_port(src, key, p)?,
                Err(_) => return Err(src.err(key, "unknown action")),
            }
        }
    })
}

/// Parses an action list (the part after `actions=`), checked against the
/// flow's match and table.
pub(super) fn parse_actions_in(
    src: &Src,
    text: &str,
    m: &Match,
    table: u8,
    ctx: &ParseContext,
) -> PResult<Vec<Action>> {
    let ac = ActCtx {
        m,
        table,
        ctx,
        any_packet: false,
    };
    let mut out = Vec::new();
    let mut toks: Vec<&str> = Vec::new();
    let mut drop_tok = None;
    let mut lex = Lexer::new(*src, text);
    while let Some(item) = lex.next_item()? {
        let a = parse_action(src, &item, &ac)?;
        if item.key == "drop" {
            drop_tok = Some(item.key);
            continue;
        }
        out.push(a);
        toks.push(item.whole);
    }
    if let Some(d) = drop_tok {
        if !out.is_empty() {
            return Err(src.err(
                d,
                "\"drop\" must not be accompanied by any other action or instruction",
            ));
        }
    }
    let mut conj = false;
    let mut other = None;
    for (i, a) in out.iter().enumerate() {
        let tok = toks.get(i).copied().unwrap_or(text);
        match a {
            Action::GotoTable(_) if i + 1 != out.len() => {
                return Err(src.err(tok, "goto_table must be the last action"));
            }
            Action::Conjunction { .. } => conj = true,
            Action::Note(_) => {}
            _ => {
                if other.is_none() {
                    other = Some(tok);
                }
            }
        }
    }
    if conj {
        if let Some(tok) = other {
            return Err(src.err(
                tok,
                "\"conjunction\" actions may be used along with \"note\" but not any other kind of action",
            ));
        }
    }
    Ok(out)
}

/// Parses an action list alone (as after `actions=`), for a flow in `table`
/// with match `m`. Useful for tools that build the match separately.
pub fn parse_actions(
    text: &str,
    m: &Match,
    table: u8,
    ctx: &ParseContext,
) -> Result<Vec<Action>, ParseError> {
    let src = Src { text };
    parse_actions_in(&src, text, m, table, ctx)
}
