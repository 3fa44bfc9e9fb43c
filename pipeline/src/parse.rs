//! The `ovs-ofctl` flow text parser.
//!
//! Reads the dialect of `ovs-ofctl add-flow` / `mod-flows` / `del-flows`
//! (Open vSwitch 3.1) for everything the flow model in [`crate::flow`] can
//! hold, so one flow file loads into both Open vSwitch and oxvs:
//!
//! ```text
//! table=50, priority=200, ip, nw_dst=10.244.1.0/24 actions=set_field:10.0.0.2->tun_dst,output:3
//! ```
//!
//! ## Shape of the input
//!
//! A flow is a list of `key[=value]` items separated by commas and/or
//! whitespace, then `actions=` and the action list (everything after it).
//! Items are split by [`Lexer`], which knows about parentheses so that
//! `ct(commit,exec(set_field:1->ct_mark))` stays one item. Every token the
//! parser looks at is a sub-slice of the caller's text, so an error's byte
//! position is simply the token's offset in that text.
//!
//! ## What is checked (as Open vSwitch does, or stricter)
//!
//! - Field values and masks must fit the field (`tp_dst=65536` is an error);
//!   fields that OVS cannot mask (`in_port`, `nw_proto`, `nw_ttl`, ...) reject
//!   masks other than all-ones.
//! - Prerequisites: a field whose protocol is not pinned by the match's
//!   `dl_type`/`nw_proto` (`tp_dst` without `tcp`/`udp`/`sctp`) is an error
//!   naming the field. OVS itself silently drops such fields; an error is
//!   safer. The check runs after the whole match is read, so order does not
//!   matter (`tp_dst=80,tcp` is fine), as in OVS.
//! - Actions are validated against the match (writing `nw_src` needs `ip` or
//!   `arp`, `ct` and `dec_ttl` need IP), against each other (`goto_table`
//!   last and forward only, `conjunction` only with `note`, `drop` alone), and
//!   for field writability (`ct_mark`/`ct_label` only inside `ct(exec(...))`).
//!
//! ## Invariants
//!
//! - Never panics on any input: every slice index is at a char boundary found
//!   by scanning, numbers are parsed with overflow checks.
//! - The [`Match`] produced is canonical (value bits outside the mask are zero)
//!   because it is only built through [`Match::set`].
//! - `load:` inside `ct(exec(...))` is stored as the equivalent `SetField`
//!   (the only nested action [`CtAction::exec`] holds).

use crate::field::{ct_state, frag, lookup_name, tcp_flags, Field, FieldName, Prereq, ValueFormat};
use crate::flow::{
    port, Action, ControllerAction, CtAction, CtZoneSrc, Flow, FlowMod, FlowModCommand, Match,
    PacketInReason, SubField,
};
use crate::key::FlowKey;
use crate::names::TableNames;

/// A parse error: what was wrong, the offending token and its byte position.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg} at byte {pos}: '{token}'")]
pub struct ParseError {
    /// Byte offset of `token` in the parsed text.
    pub pos: usize,
    pub token: String,
    pub msg: String,
}

/// A parse error in a flow file, with its 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {error}")]
pub struct FileError {
    pub line: usize,
    pub column: usize,
    pub error: ParseError,
}

/// Names the parser resolves (table names; port names later).
#[derive(Clone, Debug, Default)]
pub struct ParseContext {
    pub tables: TableNames,
}

/// Ethertypes used by the protocol shorthands and prerequisites.
pub(crate) mod eth_type {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const RARP: u16 = 0x8035;
    pub const IPV6: u16 = 0x86dd;
}

/// IP protocol numbers used by the shorthands and prerequisites.
pub(crate) mod ip_proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
    pub const SCTP: u8 = 132;
}

/// The protocol shorthands (`tcp` = `dl_type=0x0800,nw_proto=6`).
pub(crate) const SHORTHANDS: &[(&str, u16, Option<u8>)] = &[
    ("ip", eth_type::IPV4, None),
    ("ipv6", eth_type::IPV6, None),
    ("icmp", eth_type::IPV4, Some(ip_proto::ICMP)),
    ("icmp6", eth_type::IPV6, Some(ip_proto::ICMPV6)),
    ("tcp", eth_type::IPV4, Some(ip_proto::TCP)),
    ("tcp6", eth_type::IPV6, Some(ip_proto::TCP)),
    ("udp", eth_type::IPV4, Some(ip_proto::UDP)),
    ("udp6", eth_type::IPV6, Some(ip_proto::UDP)),
    ("sctp", eth_type::IPV4, Some(ip_proto::SCTP)),
    ("sctp6", eth_type::IPV6, Some(ip_proto::SCTP)),
    ("arp", eth_type::ARP, None),
    ("rarp", eth_type::RARP, None),
];

/// Reserved port names, as printed (parsing ignores case).
pub(crate) const PORT_NAMES: &[(&str, u32)] = &[
    ("IN_PORT", port::IN_PORT),
    ("TABLE", port::TABLE),
    ("NORMAL", port::NORMAL),
    ("FLOOD", port::FLOOD),
    ("ALL", port::ALL),
    ("CONTROLLER", port::CONTROLLER),
    ("LOCAL", port::LOCAL),
    ("ANY", port::NONE),
    ("NONE", port::NONE),
];

// ---------------------------------------------------------------------------
// Errors and positions

/// The whole text being parsed; turns sub-slices into byte offsets.
#[derive(Clone, Copy)]
struct Src<'a> {
    text: &'a str,
}

impl<'a> Src<'a> {
    /// Byte offset of `tok` (a sub-slice of the source) in the source.
    fn pos(&self, tok: &str) -> usize {
        let start = self.text.as_ptr() as usize;
        let p = tok.as_ptr() as usize;
        if p >= start && p <= start + self.text.len() {
            p - start
        } else {
            0
        }
    }

    fn err(&self, tok: &str, msg: impl Into<String>) -> ParseError {
        ParseError {
            pos: self.pos(tok),
            token: tok.to_string(),
            msg: msg.into(),
        }
    }

    /// An empty token at the end of `tok` (for "missing X" errors).
    fn end_of(&self, tok: &'a str) -> &'a str {
        &tok[tok.len()..]
    }
}

type PResult<T> = Result<T, ParseError>;

// ---------------------------------------------------------------------------
// Lexer

fn is_delim(b: u8) -> bool {
    matches!(b, b',' | b' ' | b'\t' | b'\r' | b'\n')
}

/// One `key`, `key=value`, `key:value` or `key(args)` item.
#[derive(Clone, Copy, Debug)]
struct Item<'a> {
    key: &'a str,
    /// The value (`None` for a bare key).
    value: Option<&'a str>,
    /// Whether the value was written in parentheses.
    paren: bool,
    /// The whole item as written (for error tokens).
    whole: &'a str,
}

/// Splits text into items the way `ofputil_parse_key_value` does: items are
/// separated by commas/whitespace, a value ends at a top-level delimiter,
/// parentheses nest.
struct Lexer<'a> {
    src: Src<'a>,
    s: &'a str,
    i: usize,
}

impl<'a> Lexer<'a> {
    fn new(src: Src<'a>, s: &'a str) -> Self {
        Lexer { src, s, i: 0 }
    }

    fn next_item(&mut self) -> PResult<Option<Item<'a>>> {
        let b = self.s.as_bytes();
        while self.i < b.len() && is_delim(b[self.i]) {
            self.i += 1;
        }
        if self.i >= b.len() {
            return Ok(None);
        }
        let start = self.i;
        while self.i < b.len()
            && !matches!(b[self.i], b'=' | b':' | b'(' | b')')
            && !is_delim(b[self.i])
        {
            self.i += 1;
        }
        let key = &self.s[start..self.i];
        if key.is_empty() {
            let tok = &self.s[start..(start + 1).min(b.len())];
            return Err(self.src.err(tok, "expected a keyword"));
        }
        if self.i >= b.len() || is_delim(b[self.i]) {
            return Ok(Some(Item {
                key,
                value: None,
                paren: false,
                whole: key,
            }));
        }
        match b[self.i] {
            b'(' => {
                let open = self.i;
                let mut depth = 0usize;
                while self.i < b.len() {
                    match b[self.i] {
                        b'(' => depth += 1,
                        b')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                if self.i >= b.len() {
                    return Err(self.src.err(&self.s[start..], "unbalanced parentheses"));
                }
                let value = &self.s[open + 1..self.i];
                self.i += 1;
                let whole = &self.s[start..self.i];
                if self.i < b.len() && !is_delim(b[self.i]) {
                    let rest_end = self.s[self.i..]
                        .find(|c: char| c == ',' || c.is_whitespace())
                        .map_or(b.len(), |e| self.i + e);
                    return Err(self
                        .src
                        .err(&self.s[self.i..rest_end], "unexpected text after ')'"));
                }
                Ok(Some(Item {
                    key,
                    value: Some(value),
                    paren: true,
                    whole,
                }))
            }
            b')' => Err(self
                .src
                .err(&self.s[self.i..self.i + 1], "unbalanced parentheses")),
            _ => {
                self.i += 1; // '=' or ':'
                let vstart = self.i;
                let mut depth = 0usize;
                while self.i < b.len() {
                    match b[self.i] {
                        b'(' => depth += 1,
                        b')' => {
                            if depth == 0 {
                                return Err(self
                                    .src
                                    .err(&self.s[self.i..self.i + 1], "unbalanced parentheses"));
                            }
                            depth -= 1;
                        }
                        c if depth == 0 && is_delim(c) => break,
                        _ => {}
                    }
                    self.i += 1;
                }
                if depth != 0 {
                    return Err(self
                        .src
                        .err(&self.s[vstart..self.i], "unbalanced parentheses"));
                }
                Ok(Some(Item {
                    key,
                    value: Some(&self.s[vstart..self.i]),
                    paren: false,
                    whole: &self.s[start..self.i],
                }))
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Numbers and addresses

/// Parses a decimal or `0x` hexadecimal unsigned integer.
fn parse_uint(s: &str) -> Option<u128> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if h.is_empty() || !h.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(h, 16).ok()
    } else {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }
}

fn ones(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

fn uint_bits(src: &Src, tok: &str, bits: u32, what: &str) -> PResult<u128> {
    let v = parse_uint(tok).ok_or_else(|| src.err(tok, format!("invalid number for {what}")))?;
    if v > ones(bits) {
        return Err(src.err(tok, format!("value too large for {bits}-bit {what}")));
    }
    Ok(v)
}

fn parse_mac(s: &str) -> Option<u128> {
    let mut v: u128 = 0;
    let mut n = 0;
    for part in s.split(':') {
        if part.is_empty() || part.len() > 2 || !part.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        v = (v << 8) | u128::from(u8::from_str_radix(part, 16).ok()?);
        n += 1;
    }
    (n == 6).then_some(v)
}

fn parse_ipv4(s: &str) -> Option<u128> {
    s.parse::<std::net::Ipv4Addr>()
        .ok()
        .map(|a| u128::from(u32::from(a)))
}

fn parse_ipv6(s: &str) -> Option<u128> {
    s.parse::<std::net::Ipv6Addr>().ok().map(u128::from)
}

/// A mask of `prefix` leading one bits in a `bits`-wide field.
fn prefix_mask(prefix: u32, bits: u32) -> u128 {
    if prefix == 0 {
        0
    } else {
        ones(bits) & !ones(bits - prefix)
    }
}

/// Parses a `value[/mask]` for a plain (non-flag) format. Returns the value
/// and the mask (`None` if not written), both right-aligned to `bits`.
fn parse_value_mask(
    src: &Src,
    tok: &str,
    format: ValueFormat,
    bits: u32,
    what: &str,
) -> PResult<(u128, Option<u128>)> {
    let (vtok, mtok) = match tok.find('/') {
        Some(i) => (&tok[..i], Some(&tok[i + 1..])),
        None => (tok, None),
    };
    let value = parse_one_value(src, vtok, format, bits, what)?;
    let mask = match mtok {
        None => None,
        Some(m) => Some(match format {
            ValueFormat::Ipv4 | ValueFormat::Ipv6
                if !m.is_empty() && m.bytes().all(|c| c.is_ascii_digit()) =>
            {
                let full = if format == ValueFormat::Ipv4 { 32 } else { 128 };
                let p: u32 = m
                    .parse()
                    .map_err(|_| src.err(m, format!("invalid prefix length for {what}")))?;
                if p > full {
                    return Err(src.err(m, format!("prefix length {p} too long for {what}")));
                }
                prefix_mask(p, full)
            }
            _ => parse_one_value(src, m, format, bits, what).map_err(|e| ParseError {
                msg: e.msg.replace("value", "mask"),
                ..e
            })?,
        }),
    };
    Ok((value, mask))
}

fn parse_one_value(
    src: &Src,
    tok: &str,
    format: ValueFormat,
    bits: u32,
    what: &str,
) -> PResult<u128> {
    let v = match format {
        ValueFormat::Mac => parse_mac(tok)
            .ok_or_else(|| src.err(tok, format!("invalid Ethernet address for {what}")))?,
        ValueFormat::Ipv4 => parse_ipv4(tok)
            .ok_or_else(|| src.err(tok, format!("invalid IPv4 address for {what}")))?,
        ValueFormat::Ipv6 => parse_ipv6(tok)
            .ok_or_else(|| src.err(tok, format!("invalid IPv6 address for {what}")))?,
        _ => parse_uint(tok).ok_or_else(|| src.err(tok, format!("invalid value for {what}")))?,
    };
    if v > ones(bits) {
        return Err(src.err(tok, format!("value too large for {bits}-bit field {what}")));
    }
    Ok(v)
}

/// Parses flags for `ct_state` / `tcp_flags`: `+a-b`, `a|b`, or a number
/// with optional mask. Returns (value, mask). `known` is the set of named bits.
fn parse_flags(
    src: &Src,
    tok: &str,
    names: &[(&str, u128)],
    bits: u32,
    what: &str,
) -> PResult<(u128, u128)> {
    if tok.starts_with('+') || tok.starts_with('-') {
        let (mut value, mut mask) = (0u128, 0u128);
        let mut rest = tok;
        while !rest.is_empty() {
            let plus = rest.starts_with('+');
            let body = &rest[1..];
            let end = body.find(['+', '-']).unwrap_or(body.len());
            let name = &body[..end];
            let bit = names
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| *b)
                .ok_or_else(|| src.err(name, format!("unknown {what} flag")))?;
            if mask & bit != 0 {
                return Err(src.err(name, format!("{what} flag specified more than once")));
            }
            mask |= bit;
            if plus {
                value |= bit;
            }
            rest = &body[end..];
            if !rest.is_empty() && !rest.starts_with(['+', '-']) {
                return Err(src.err(rest, format!("invalid {what} flags")));
            }
        }
        return Ok((value, mask));
    }
    if tok.starts_with(|c: char| c.is_ascii_alphabetic()) {
        let mut value = 0u128;
        for name in tok.split('|') {
            let bit = names
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| *b)
                .ok_or_else(|| src.err(name, format!("unknown {what} flag")))?;
            value |= bit;
        }
        // `a|b` names the exact state: every other bit must be clear.
        return Ok((value, ones(bits)));
    }
    let (v, m) = parse_value_mask(src, tok, ValueFormat::Hex, bits, what)?;
    Ok((v, m.unwrap_or(ones(bits))))
}

/// Parses a port: a number (up to [`port::MAX`], or a reserved number) or a
/// reserved name (`LOCAL`, `in_port`, ...; case-insensitive).
fn parse_port(src: &Src, tok: &str) -> PResult<u32> {
    if let Some((_, p)) = PORT_NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(tok)) {
        return Ok(*p);
    }
    let v = parse_uint(tok).ok_or_else(|| src.err(tok, "invalid or unknown port"))?;
    match u32::try_from(v) {
        Ok(p) if p <= port::MAX || PORT_NAMES.iter().any(|(_, r)| *r == p) => Ok(p),
        _ => Err(src.err(
            tok,
            format!("port number out of range (max {:#x})", port::MAX),
        )),
    }
}

fn parse_table(src: &Src, tok: &str, ctx: &ParseContext) -> PResult<u8> {
    if let Some(v) = parse_uint(tok) {
        return match u8::try_from(v) {
            Ok(t) if t < 255 => Ok(t),
            _ => Err(src.err(tok, "table number out of range (0..254)")),
        };
    }
    ctx.tables
        .id(tok)
        .ok_or_else(|| src.err(tok, "unknown table name"))
}

// ---------------------------------------------------------------------------
// Matches

/// The 802.1Q "tag present" bit of `vlan_tci`.
const VLAN_CFI: u128 = 0x1000;

/// Fields OVS cannot mask (only an all-ones mask is accepted).
fn maskable(name: &FieldName) -> bool {
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
    )
}

/// A field name written in a match, remembered for the prerequisite check.
struct Used<'a> {
    name: FieldName,
    tok: &'a str,
}

/// The packet kind pinned by a match: exact `dl_type`, exact `nw_proto`.
fn pinned(m: &Match) -> (Option<u16>, Option<u8>) {
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
    }
}

/// Parses `name=value[/mask]` into (field, value, mask) in field units.
/// `exact` (packet specs) rejects masks and reads flag sets as "these bits set".
fn parse_field_value(
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
fn apply_shorthand(m: &mut Match, key: &str) -> bool {
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

fn check_prereqs(src: &Src, m: &Match, used: &[Used]) -> PResult<()> {
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

// ---------------------------------------------------------------------------
// Flows

/// Which flow-mod parts a command accepts (as `ovs-ofctl`'s `F_*` bits).
#[derive(Clone, Copy)]
struct Allowed {
    actions: bool,
    timeouts: bool,
    out_port: bool,
    cookie_mask: bool,
    set_cookie: bool,
}

fn allowed(command: FlowModCommand) -> Allowed {
    match command {
        FlowModCommand::Add => Allowed {
            actions: true,
            timeouts: true,
            out_port: false,
            cookie_mask: false,
            set_cookie: true,
        },
        FlowModCommand::Modify { .. } => Allowed {
            actions: true,
            timeouts: true,
            out_port: false,
            cookie_mask: true,
            set_cookie: true,
        },
        FlowModCommand::Delete { .. } => Allowed {
            actions: false,
            timeouts: false,
            out_port: true,
            cookie_mask: true,
            set_cookie: false,
        },
    }
}

/// Finds `actions=` (or `action=`) at an item boundary; returns (match part, action list).
fn split_actions(text: &str) -> Option<(&str, &str, &str)> {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find("action") {
        let at = from + i;
        let boundary = at == 0 || is_delim(b[at - 1]);
        let rest = &text[at + 6..];
        let skip = if rest.starts_with("s=") {
            2
        } else if rest.starts_with('=') {
            1
        } else {
            0
        };
        if boundary && skip > 0 {
            let kw = &text[at..at + 6 + skip];
            return Some((&text[..at], kw, &text[at + 6 + skip..]));
        }
        from = at + 6;
    }
    None
}

fn parse_flow_inner(
    src: &Src,
    text: &str,
    command: FlowModCommand,
    ctx: &ParseContext,
) -> PResult<FlowMod> {
    let ok = allowed(command);
    let (match_part, actions) = match split_actions(text) {
        Some((m, kw, a)) => {
            if !ok.actions {
                return Err(src.err(
                    kw.trim_end_matches('='),
                    "unknown keyword (actions are not allowed here)",
                ));
            }
            (m, Some(a))
        }
        None => {
            if ok.actions {
                return Err(src.err(src.end_of(text), "must specify an action"));
            }
            (text, None)
        }
    };
    let mut fm = FlowMod {
        command,
        flow: Flow::default(),
        table: None,
        cookie_mask: 0,
        out_port: None,
    };
    let mut used = Vec::new();
    let mut lex = Lexer::new(*src, match_part);
    while let Some(item) = lex.next_item()? {
        let key = item.key;
        let Some(value) = item.value else {
            if apply_shorthand(&mut fm.flow.matches, key) {
                continue;
            }
            let flags = &mut fm.flow.flags;
            let flag = match key {
                "send_flow_rem" => &mut flags.send_flow_rem,
                "check_overlap" => &mut flags.check_overlap,
                "reset_counts" => &mut flags.reset_counts,
                "no_packet_counts" => &mut flags.no_packet_counts,
                "no_byte_counts" => &mut flags.no_byte_counts,
                _ => return Err(src.err(key, "unknown keyword")),
            };
            if !ok.timeouts {
                return Err(src.err(key, "flow flags are not allowed here"));
            }
            *flag = true;
            continue;
        };
        if item.paren {
            return Err(src.err(item.whole, "unexpected parentheses in match"));
        }
        match key {
            "table" => {
                let t = parse_table(src, value, ctx)?;
                fm.table = Some(t);
                fm.flow.table = t;
            }
            "priority" => fm.flow.priority = uint_bits(src, value, 16, "priority")? as u16,
            "idle_timeout" | "hard_timeout" | "importance" => {
                if !ok.timeouts {
                    return Err(src.err(key, "unknown keyword (not allowed here)"));
                }
                let v = uint_bits(src, value, 16, key)? as u16;
                match key {
                    "idle_timeout" => fm.flow.idle_timeout = v,
                    "hard_timeout" => fm.flow.hard_timeout = v,
                    _ => fm.flow.importance = v,
                }
            }
            "cookie" => {
                if let Some(i) = value.find('/') {
                    if !ok.cookie_mask {
                        return Err(src.err(value, "flow additions cannot use a cookie mask"));
                    }
                    fm.flow.cookie = uint_bits(src, &value[..i], 64, "cookie")? as u64;
                    let mtok = &value[i + 1..];
                    fm.cookie_mask = if mtok == "-1" {
                        u64::MAX
                    } else {
                        uint_bits(src, mtok, 64, "cookie mask")? as u64
                    };
                    fm.flow.cookie &= fm.cookie_mask;
                } else {
                    if !ok.set_cookie {
                        return Err(src.err(value, "cannot set cookie (to match on a cookie, specify a mask, e.g. cookie=0x1/-1)"));
                    }
                    fm.flow.cookie = uint_bits(src, value, 64, "cookie")? as u64;
                }
            }
            "out_port" => {
                if !ok.out_port {
                    return Err(src.err(key, "unknown keyword (out_port is only for del-flows)"));
                }
                fm.out_port = Some(parse_port(src, value)?);
            }
            // Statistics printed by dump-flows: ignored, so dumps read back (as OVS does).
            "duration" | "n_packets" | "n_bytes" | "idle_age" | "hard_age" => {}
            _ => {
                let name = lookup_name(key).ok_or_else(|| src.err(key, "unknown keyword"))?;
                let (f, v, m) = parse_field_value(src, &name, value, false)?;
                fm.flow.matches.set(f, v, m);
                used.push(Used { name, tok: key });
            }
        }
    }
    check_prereqs(src, &fm.flow.matches, &used)?;
    if let Some(a) = actions {
        fm.flow.actions = parse_actions_in(src, a, &fm.flow.matches, fm.flow.table, ctx)?;
    }
    Ok(fm)
}

/// Parses one flow in `add-flow` syntax.
pub fn parse_flow(text: &str, ctx: &ParseContext) -> Result<Flow, ParseError> {
    let src = Src { text };
    parse_flow_inner(&src, text, FlowModCommand::Add, ctx).map(|fm| fm.flow)
}

/// Parses a flow mod (`mod-flows` / `del-flows` syntax; `Add` = `add-flow`).
pub fn parse_flow_mod(
    text: &str,
    command: FlowModCommand,
    ctx: &ParseContext,
) -> Result<FlowMod, ParseError> {
    let src = Src { text };
    let mut fm = parse_flow_inner(&src, text, command, ctx)?;
    if command == FlowModCommand::Add {
        fm.table = Some(fm.flow.table);
    }
    Ok(fm)
}

/// The logical lines of a flow file, as [`parse_flow_file`] reads them: a
/// trailing `\` joins a line with the next; blank lines and `#` comments are
/// skipped. Each is (1-based line where it starts, its text).
pub fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (idx, raw) in text.lines().enumerate() {
        let (body, cont) = match raw.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (raw, false),
        };
        let (start, mut joined) = current.take().unwrap_or((idx + 1, String::new()));
        joined.push_str(body);
        if cont {
            joined.push(' ');
            current = Some((start, joined));
            continue;
        }
        let t = joined.trim();
        if !t.is_empty() && !t.starts_with('#') {
            out.push((start, joined));
        }
    }
    if let Some((start, joined)) = current {
        let t = joined.trim();
        if !t.is_empty() && !t.starts_with('#') {
            out.push((start, joined));
        }
    }
    out
}

/// The 1-based line where each flow of a flow file starts, in order (see
/// [`logical_lines`]): flow `i` of a bundle built from the file is on line
/// `flow_lines(text)[i]`.
pub fn flow_lines(text: &str) -> Vec<usize> {
    logical_lines(text).into_iter().map(|(l, _)| l).collect()
}

/// Parses a flow file: one flow per line, `#` comments and blank lines
/// ignored, a trailing `\` joins a line with the next.
pub fn parse_flow_file(text: &str, ctx: &ParseContext) -> Result<Vec<Flow>, FileError> {
    let mut flows = Vec::new();
    // The logical line being built: text plus (offset in it, line no, column offset) per piece.
    let mut joined = String::new();
    let mut pieces: Vec<(usize, usize, usize)> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        let (body, cont) = match raw.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (raw, false),
        };
        if pieces.is_empty() {
            let t = body.trim_start();
            if !cont && (t.is_empty() || t.starts_with('#')) {
                continue;
            }
        }
        pieces.push((joined.len(), line_no, 0));
        joined.push_str(body);
        if cont {
            joined.push(' ');
            continue;
        }
        let t = joined.trim_start();
        if !t.is_empty() && !t.starts_with('#') {
            match parse_flow(&joined, ctx) {
                Ok(f) => flows.push(f),
                Err(error) => {
                    let (start, line, _) = pieces
                        .iter()
                        .rev()
                        .find(|(s, _, _)| *s <= error.pos)
                        .copied()
                        .unwrap_or((0, line_no, 0));
                    let column = joined
                        .get(start..error.pos.max(start))
                        .map_or(1, |s| s.chars().count() + 1);
                    return Err(FileError {
                        line,
                        column,
                        error,
                    });
                }
            }
        }
        joined.clear();
        pieces.clear();
    }
    Ok(flows)
}

/// Parses a match alone (`in_port=1,tcp,tp_dst=80`), with an optional
/// `priority=`. Prerequisites are checked.
pub fn parse_match(text: &str, _ctx: &ParseContext) -> Result<Match, ParseError> {
    let src = Src { text };
    parse_match_only(&src, text, false).map(|(m, _)| m)
}

fn parse_match_only(src: &Src, text: &str, exact: bool) -> PResult<(Match, Option<u16>)> {
    let mut m = Match::CATCHALL;
    let mut used = Vec::new();
    let mut priority = None;
    let mut lex = Lexer::new(*src, text);
    while let Some(item) = lex.next_item()? {
        let key = item.key;
        let Some(value) = item.value else {
            if apply_shorthand(&mut m, key) {
                continue;
            }
            return Err(src.err(key, "unknown keyword"));
        };
        if item.paren {
            return Err(src.err(item.whole, "unexpected parentheses in match"));
        }
        if key == "priority" && !exact {
            priority = Some(uint_bits(src, value, 16, "priority")? as u16);
            continue;
        }
        let name = lookup_name(key).ok_or_else(|| src.err(key, "unknown field"))?;
        let (f, v, mask) = parse_field_value(src, &name, value, exact)?;
        m.set(f, v, mask);
        used.push(Used { name, tok: key });
    }
    check_prereqs(src, &m, &used)?;
    Ok((m, priority))
}

/// Parses a packet spec for trace (`in_port=2,tcp,nw_src=10.0.0.1,tp_dst=80`):
/// the named fields get the given values, every other field is zero. Masks
/// are rejected; `ct_state` accepts `trk|new` and `+trk+new`.
pub fn parse_packet_spec(text: &str, _ctx: &ParseContext) -> Result<FlowKey, ParseError> {
    let src = Src { text };
    // IPv4/IPv6 values in a spec must be plain addresses.
    let mut lex = Lexer::new(src, text);
    while let Some(item) = lex.next_item()? {
        if let Some(v) = item.value {
            if v.contains('/') {
                return Err(src.err(
                    v,
                    format!("masks are not allowed in a packet spec ({})", item.key),
                ));
            }
        }
    }
    parse_match_only(&src, text, true).map(|(m, _)| m.value)
}

// ---------------------------------------------------------------------------
// Actions

/// Parses a sub-field: `NAME`, `NAME[]`, `NAME[n]`, `NAME[a..b]`.
fn parse_subfield(src: &Src, tok: &str) -> PResult<(SubField, FieldName)> {
    let (name_tok, range) = match tok.find('[') {
        Some(i) => {
            let inner = tok[i + 1..]
                .strip_suffix(']')
                .ok_or_else(|| src.err(tok, "missing ']' in sub-field"))?;
            (&tok[..i], Some(inner))
        }
        None => (tok, None),
    };
    let name = lookup_name(name_tok).ok_or_else(|| src.err(name_tok, "unknown field"))?;
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
struct ActCtx<'m, 'c> {
    m: &'m Match,
    table: u8,
    ctx: &'c ParseContext,
}

impl ActCtx<'_, '_> {
    fn check_prereq(&self, src: &Src, tok: &str, name: &FieldName, verb: &str) -> PResult<()> {
        if prereq_ok(self.m, name) {
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

    fn check_writable(&self, src: &Src, tok: &str, name: &FieldName, in_ct: bool) -> PResult<()> {
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
fn parse_set_field(src: &Src, arg: &str, ac: &ActCtx, in_ct: bool) -> PResult<Action> {
    let (vtok, ftok) = arg
        .split_once("->")
        .ok_or_else(|| src.err(arg, "set_field needs VALUE->FIELD"))?;
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
fn parse_load(src: &Src, arg: &str, ac: &ActCtx, in_ct: bool) -> PResult<Action> {
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

fn parse_ct(src: &Src, args: &str, ac: &ActCtx) -> PResult<Action> {
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
                        _ => {
                            return Err(src.err(
                                a.whole,
                                "ct exec only supports set_field/load to ct_mark or ct_label",
                            ))
                        }
                    };
                    ct.exec.push(act);
                }
            }
            _ => return Err(src.err(item.whole, "unknown or unsupported ct argument")),
        }
    }
    if let Some(t) = force_tok {
        if !ct.commit {
            return Err(src.err(t, "\"force\" flag requires \"commit\" flag"));
        }
    }
    if !ct.exec.is_empty() && !ct.commit {
        return Err(src.err(args, "ct exec requires commit"));
    }
    Ok(Action::Ct(ct))
}

fn parse_controller(src: &Src, item: &Item) -> PResult<ControllerAction> {
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
fn parse_hex_bytes(src: &Src, tok: &str) -> PResult<Vec<u8>> {
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

fn output_port(src: &Src, tok: &str, p: u32) -> PResult<Action> {
    if p == port::NONE || p == port::TABLE || p == port::MAX {
        return Err(src.err(tok, "output to unsupported port"));
    }
    Ok(Action::Output(p))
}

fn parse_action(src: &Src, item: &Item, ac: &ActCtx) -> PResult<Action> {
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
            } else if v.contains('[') || lookup_name(v).is_some() {
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
        "move" => {
            let arg = need("SRC->DST")?;
            let (stok, dtok) = arg
                .split_once("->")
                .ok_or_else(|| src.err(arg, "move needs SRC->DST"))?;
            let (s, sname) = parse_subfield(src, stok)?;
            let (d, dname) = parse_subfield(src, dtok)?;
            ac.check_writable(src, dtok, &dname, false)?;
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
            Action::Move { src: s, dst: d }
        }
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
            if dl != Some(eth_type::IPV4) {
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
            if !matches!(dl, Some(eth_type::IPV4) | Some(eth_type::IPV6)) {
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
            if !matches!(dl, Some(eth_type::IPV4) | Some(eth_type::IPV6)) {
                return Err(src.err(key, "ct needs an IP match (ip or ipv6)"));
            }
            match item.value {
                None => parse_ct(src, "", ac)?,
                Some(v) if item.paren => parse_ct(src, v, ac)?,
                Some(_) => return Err(src.err(item.whole, "ct arguments go in parentheses")),
            }
        }
        "ct_clear" => no_arg(Action::CtClear)?,
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
fn parse_actions_in(
    src: &Src,
    text: &str,
    m: &Match,
    table: u8,
    ctx: &ParseContext,
) -> PResult<Vec<Action>> {
    let ac = ActCtx { m, table, ctx };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_lines_skip_comments_and_blanks() {
        let text =
            "# header\n\ntable=0 actions=drop\n  # indented comment\n   \ntable=1 actions=drop\n";
        assert_eq!(flow_lines(text), vec![3, 6]);
        assert!(flow_lines("").is_empty());
        let joined = "table=0, \\\n  actions=drop\n# c \\\n still comment\ntable=1 actions=drop";
        assert_eq!(flow_lines(joined), vec![1, 5]);
    }

    fn ctx() -> ParseContext {
        ParseContext::default()
    }

    fn flow(s: &str) -> Flow {
        parse_flow(s, &ctx()).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn acts(s: &str) -> Vec<Action> {
        flow(s).actions
    }

    /// Asserts `s` fails with an error on `token` at the position where `token` first occurs at or after `from`.
    #[track_caller]
    fn err_at(s: &str, token: &str, msg_part: &str) {
        let e = match parse_flow(s, &ctx()) {
            Ok(f) => panic!("{s}: parsed as {f:?}"),
            Err(e) => e,
        };
        assert_eq!(e.token, token, "{s}: {e}");
        assert_eq!(&s[e.pos..e.pos + e.token.len()], token, "{s}: {e}");
        assert!(e.msg.contains(msg_part), "{s}: {e}");
    }

    fn sf(field: Field, ofs: u8, n_bits: u8) -> SubField {
        SubField { field, ofs, n_bits }
    }

    #[test]
    fn flow_params() {
        let f = flow(
            "table=50, priority=200, cookie=0x7 idle_timeout=10 hard_timeout=20 importance=3 \
             send_flow_rem check_overlap reset_counts no_packet_counts no_byte_counts ip actions=drop",
        );
        assert_eq!((f.table, f.priority, f.cookie), (50, 200, 7));
        assert_eq!((f.idle_timeout, f.hard_timeout, f.importance), (10, 20, 3));
        let fl = f.flags;
        assert!(
            fl.send_flow_rem
                && fl.check_overlap
                && fl.reset_counts
                && fl.no_packet_counts
                && fl.no_byte_counts
        );
        assert!(f.actions.is_empty());
        assert_eq!(flow("table=SpoofGuard,actions=drop").table, 10);
        assert_eq!(flow("actions=drop").priority, crate::flow::DEFAULT_PRIORITY);
        // dump-flows statistics are ignored so that dumps read back.
        let f = flow(" cookie=0x5, duration=1.5s, table=2, n_packets=3, n_bytes=4, idle_age=1, priority=5,ip actions=drop");
        assert_eq!((f.cookie, f.table, f.priority), (5, 2, 5));
    }

    #[test]
    fn match_values() {
        let m = flow("ip,nw_src=10.0.0.0/8,nw_dst=1.2.3.4/255.0.255.0,actions=drop").matches;
        assert_eq!(m.get(Field::NwSrc), (0x0a00_0000, 0xff00_0000));
        assert_eq!(m.get(Field::NwDst), (0x0100_0300, 0xff00_ff00));
        assert_eq!(m.get(Field::DlType), (0x800, 0xffff));
        let m = flow(
            "dl_src=00:11:22:00:00:00/ff:ff:ff:00:00:00,eth_dst=aa:bb:cc:dd:ee:ff,actions=drop",
        )
        .matches;
        assert_eq!(m.get(Field::DlSrc), (0x0011_2200_0000, 0xffff_ff00_0000));
        assert_eq!(m.get(Field::DlDst), (0xaabb_ccdd_eeff, 0xffff_ffff_ffff));
        let m = flow("ipv6,ipv6_src=2001:db8::/32,ipv6_label=0x12,actions=drop").matches;
        assert_eq!(m.get(Field::Ipv6Src).1, u128::MAX << 96);
        assert_eq!(m.get(Field::Ipv6Label), (0x12, 0xfffff));
        let m = flow("reg3=0x5/0xff,NXM_NX_REG4=7,xreg2=0x100000002,metadata=0x1,tun_id=0x10,pkt_mark=1,actions=drop").matches;
        assert_eq!(m.get(Field::Reg(3)), (5, 0xff));
        // xreg2 (written after reg4) is reg4:reg5.
        assert_eq!(
            (m.get(Field::Reg(4)), m.get(Field::Reg(5)).0),
            ((1, 0xffff_ffff), 2)
        );
        assert_eq!(m.get(Field::Xreg(2)).1, u64::MAX as u128);
        let m = flow("in_port=LOCAL,actions=drop").matches;
        assert_eq!(m.get(Field::InPort).0, u128::from(port::LOCAL));
        let m = flow("in_port=0xffffff00,actions=drop").matches;
        assert_eq!(m.get(Field::InPort).0, u128::from(port::MAX));
        let m = flow("tcp,tp_dst=0x1000/0xf000,tcp_flags=+syn-ack,actions=drop").matches;
        assert_eq!(m.get(Field::TpDst), (0x1000, 0xf000));
        assert_eq!(m.get(Field::TcpFlags), (0x2, 0x12));
        let m = flow("tcp,tcp_flags=0x2/0x12,actions=drop").matches;
        assert_eq!(m.get(Field::TcpFlags), (0x2, 0x12));
        let m = flow("ct_state=+trk+est-rel,actions=drop").matches;
        assert_eq!(m.get(Field::CtState), (0x22, 0x26));
        assert_eq!(
            flow("ct_state=0x22/0x26,actions=drop")
                .matches
                .get(Field::CtState),
            (0x22, 0x26)
        );
        assert_eq!(
            flow("ct_state=trk|est,actions=drop")
                .matches
                .get(Field::CtState),
            (0x22, 0xffff_ffff)
        );
        let m =
            flow("ct_zone=5,ct_mark=0x1/0x3,ct_label=0x1/0x1,conj_id=9,recirc_id=2,actions=drop")
                .matches;
        assert_eq!(m.get(Field::CtZone), (5, 0xffff));
        assert_eq!(m.get(Field::CtMark), (1, 3));
        assert_eq!(m.get(Field::CtLabel), (1, 1));
        assert_eq!(m.get(Field::ConjId), (9, 0xffff_ffff));
        assert_eq!(m.get(Field::RecircId), (2, 0xffff_ffff));
        let m = flow("tun_src=1.1.1.1,tun_dst=2.2.2.0/24,actions=drop").matches;
        assert_eq!(m.get(Field::TunDst), (0x0202_0200, 0xffff_ff00));
    }

    #[test]
    fn match_partial_fields() {
        let get = |s: &str, f| flow(s).matches.get(f);
        assert_eq!(
            get("dl_vlan=5,actions=drop", Field::VlanTci),
            (0x1005, 0x1fff)
        );
        assert_eq!(
            get("dl_vlan=0xffff,actions=drop", Field::VlanTci),
            (0, 0x1fff)
        );
        assert_eq!(
            get("dl_vlan_pcp=3,actions=drop", Field::VlanTci),
            (0x7000, 0xf000)
        );
        assert_eq!(
            get("dl_vlan=5,dl_vlan_pcp=3,actions=drop", Field::VlanTci),
            (0x7005, 0xffff)
        );
        assert_eq!(
            get("vlan_tci=0x1005/0x1fff,actions=drop", Field::VlanTci),
            (0x1005, 0x1fff)
        );
        assert_eq!(
            get("vlan_vid=0x1005,actions=drop", Field::VlanTci),
            (0x1005, 0x1fff)
        );
        assert_eq!(get("ip,ip_dscp=3,actions=drop", Field::NwTos), (12, 0xfc));
        assert_eq!(
            get("ip,nw_tos=12,nw_ecn=1,actions=drop", Field::NwTos),
            (13, 0xff)
        );
        assert_eq!(
            get("icmp,icmp_type=8,actions=drop", Field::TpSrc),
            (8, 0xffff)
        );
        assert_eq!(
            get("icmp6,icmp_type=135,actions=drop", Field::TpSrc),
            (135, 0xffff)
        );
        assert_eq!(get("arp,arp_op=2,actions=drop", Field::NwProto), (2, 0xff));
        assert_eq!(
            get("arp,nw_src=1.2.3.4,actions=drop", Field::NwSrc),
            (0x0102_0304, 0xffff_ffff)
        );
        for (s, v, m) in [
            ("no", 0, 1),
            ("yes", 1, 1),
            ("first", 1, 3),
            ("later", 3, 3),
            ("not_later", 0, 2),
        ] {
            assert_eq!(
                get(&format!("ip,nw_frag={s},actions=drop"), Field::NwFrag),
                (v, m),
                "{s}"
            );
        }
    }

    #[test]
    fn shorthands() {
        for (name, dl, proto) in SHORTHANDS {
            let m = flow(&format!("{name},actions=drop")).matches;
            assert_eq!(m.get(Field::DlType), (u128::from(*dl), 0xffff));
            assert_eq!(m.get(Field::NwProto).0, u128::from(proto.unwrap_or(0)));
        }
        assert_eq!(flow("eth,actions=drop").matches, Match::CATCHALL);
        assert_eq!(
            flow("rarp,actions=drop").matches.get(Field::DlType).0,
            0x8035
        );
        // Order does not matter for prerequisites.
        assert_eq!(
            flow("tp_dst=80,tcp,actions=drop")
                .matches
                .get(Field::TpDst)
                .0,
            80
        );
    }

    #[test]
    fn separators() {
        let a = flow("priority=100,ip,nw_dst=1.2.3.4,actions=drop");
        assert_eq!(flow("priority=100 ip nw_dst=1.2.3.4 actions=drop"), a);
        assert_eq!(flow("priority=100, ip, nw_dst=1.2.3.4, actions=drop"), a);
        assert_eq!(flow("  priority=100,\tip ,nw_dst=1.2.3.4   action=drop"), a);
    }

    #[test]
    fn actions_output() {
        use Action::*;
        assert_eq!(
            acts("actions=output:2,3,in_port,output:in_port,LOCAL,ALL,FLOOD,NORMAL,output:0xfffffeff"),
            vec![
                Output(2),
                Output(3),
                Output(port::IN_PORT),
                Output(port::IN_PORT),
                Output(port::LOCAL),
                Output(port::ALL),
                Output(port::FLOOD),
                Output(port::NORMAL),
                Output(port::MAX - 1)
            ]
        );
        assert_eq!(
            acts(
                "actions=output:NXM_NX_REG1[],output:reg1,output:NXM_NX_REG1[0..15],output:reg2[3]"
            ),
            vec![
                OutputReg(SubField::whole(Field::Reg(1))),
                OutputReg(SubField::whole(Field::Reg(1))),
                OutputReg(sf(Field::Reg(1), 0, 16)),
                OutputReg(sf(Field::Reg(2), 3, 1)),
            ]
        );
        assert_eq!(
            acts("actions=output:CONTROLLER"),
            vec![Output(port::CONTROLLER)]
        );
    }

    #[test]
    fn actions_controller() {
        let c = |reason, userdata: &[u8], max_len, controller_id| {
            Action::Controller(ControllerAction {
                reason,
                userdata: userdata.to_vec(),
                max_len,
                controller_id,
            })
        };
        assert_eq!(
            acts("actions=CONTROLLER,controller,controller:100,controller(reason=no_match,userdata=01.02.03,max_len=100,id=3)"),
            vec![
                c(PacketInReason::Action, &[], 65535, 0),
                c(PacketInReason::Action, &[], 65535, 0),
                c(PacketInReason::Action, &[], 100, 0),
                c(PacketInReason::NoMatch, &[1, 2, 3], 100, 3),
            ]
        );
        assert_eq!(
            acts("actions=controller(reason=invalid_ttl)"),
            vec![c(PacketInReason::InvalidTtl, &[], 65535, 0)]
        );
    }

    #[test]
    fn actions_tables() {
        use Action::*;
        assert_eq!(acts("table=3,actions=goto_table:4"), vec![GotoTable(4)]);
        assert_eq!(
            acts("table=SpoofGuard,actions=goto_table:ConntrackZone"),
            vec![GotoTable(30)]
        );
        assert_eq!(
            acts("actions=resubmit(,10),resubmit:3,resubmit(4,5),resubmit(LOCAL),resubmit(in_port,7),resubmit(,Output)"),
            vec![
                Resubmit { in_port: None, table: Some(10) },
                Resubmit { in_port: Some(3), table: None },
                Resubmit { in_port: Some(4), table: Some(5) },
                Resubmit { in_port: Some(port::LOCAL), table: None },
                Resubmit { in_port: None, table: Some(7) },
                Resubmit { in_port: None, table: Some(90) },
            ]
        );
    }

    #[test]
    fn actions_fields() {
        use Action::*;
        assert_eq!(
            acts("tcp,actions=set_field:10.0.0.2->tun_dst,set_field:0x5/0xf->reg4,set_field:5->tcp_dst,set_field:00:11:22:33:44:55->eth_src,set_field:LOCAL->in_port"),
            vec![
                SetField { field: Field::TunDst, value: 0x0a00_0002, mask: 0xffff_ffff },
                SetField { field: Field::Reg(4), value: 5, mask: 0xf },
                SetField { field: Field::TpDst, value: 5, mask: 0xffff },
                SetField { field: Field::DlSrc, value: 0x0011_2233_4455, mask: 0xffff_ffff_ffff },
                SetField { field: Field::InPort, value: u128::from(port::LOCAL), mask: 0xffff_ffff },
            ]
        );
        assert_eq!(
            acts("ip,actions=set_field:4->nw_tos,set_field:8->ip_dscp,set_field:1->nw_ecn"),
            vec![
                SetField {
                    field: Field::NwTos,
                    value: 4,
                    mask: 0xfc
                },
                SetField {
                    field: Field::NwTos,
                    value: 32,
                    mask: 0xfc
                },
                SetField {
                    field: Field::NwTos,
                    value: 1,
                    mask: 0x3
                },
            ]
        );
        assert_eq!(
            acts("actions=load:0x1->NXM_NX_REG0[],load:0x5->NXM_NX_REG2[0..7],load:1->NXM_NX_REG2[3],load:2->reg3"),
            vec![
                Load { dst: SubField::whole(Field::Reg(0)), value: 1 },
                Load { dst: sf(Field::Reg(2), 0, 8), value: 5 },
                Load { dst: sf(Field::Reg(2), 3, 1), value: 1 },
                Load { dst: SubField::whole(Field::Reg(3)), value: 2 },
            ]
        );
        assert_eq!(
            acts("actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],move:NXM_NX_REG0[0..7]->NXM_NX_REG1[8..15]"),
            vec![
                Move { src: SubField::whole(Field::DlSrc), dst: SubField::whole(Field::DlDst) },
                Move { src: sf(Field::Reg(0), 0, 8), dst: sf(Field::Reg(1), 8, 8) },
            ]
        );
    }

    #[test]
    fn actions_misc() {
        use Action::*;
        assert_eq!(
            acts("ip,actions=mod_dl_src:00:11:22:33:44:55,mod_dl_dst:00:11:22:33:44:56,mod_nw_src:1.2.3.4,mod_nw_dst:1.2.3.5,dec_ttl,push_vlan:0x8100,pop_vlan,strip_vlan,set_tunnel:5,set_tunnel64:0x1234567890,ct_clear,note:00.11.22,note:aabb,note:"),
            vec![
                ModDlSrc(0x0011_2233_4455),
                ModDlDst(0x0011_2233_4456),
                ModNwSrc(0x0102_0304),
                ModNwDst(0x0102_0305),
                DecTtl,
                PushVlan(0x8100),
                PopVlan,
                PopVlan,
                SetTunnel(5),
                SetTunnel(0x12_3456_7890),
                CtClear,
                Note(vec![0, 0x11, 0x22]),
                Note(vec![0xaa, 0xbb]),
                Note(vec![]),
            ]
        );
        assert_eq!(
            acts("actions=note:01,conjunction(7,2/3)"),
            vec![
                Note(vec![1]),
                Conjunction {
                    id: 7,
                    clause: 2,
                    n_clauses: 3
                }
            ]
        );
    }

    #[test]
    fn actions_ct() {
        let a = acts(
            "ip,actions=ct(commit,force,zone=5,table=7,exec(set_field:0x1/0xff->ct_mark,set_field:0x5->ct_label,load:0x3->NXM_NX_CT_MARK[0..3])),ct(zone=NXM_NX_REG0[0..15]),ct,ct(table=ConntrackState)",
        );
        assert_eq!(
            a,
            vec![
                Action::Ct(CtAction {
                    commit: true,
                    force: true,
                    zone: CtZoneSrc::Imm(5),
                    table: Some(7),
                    exec: vec![
                        Action::SetField {
                            field: Field::CtMark,
                            value: 1,
                            mask: 0xff
                        },
                        Action::SetField {
                            field: Field::CtLabel,
                            value: 5,
                            mask: u128::MAX
                        },
                        Action::SetField {
                            field: Field::CtMark,
                            value: 3,
                            mask: 0xf
                        },
                    ],
                }),
                Action::Ct(CtAction {
                    commit: false,
                    force: false,
                    zone: CtZoneSrc::Field(sf(Field::Reg(0), 0, 16)),
                    table: None,
                    exec: vec![],
                }),
                Action::Ct(CtAction {
                    commit: false,
                    force: false,
                    zone: CtZoneSrc::Imm(0),
                    table: None,
                    exec: vec![]
                }),
                Action::Ct(CtAction {
                    commit: false,
                    force: false,
                    zone: CtZoneSrc::Imm(0),
                    table: Some(31),
                    exec: vec![]
                }),
            ]
        );
    }

    #[test]
    fn match_errors() {
        err_at("table=255,actions=drop", "255", "table number out of range");
        err_at("table=256,actions=drop", "256", "table number out of range");
        err_at("table=-1,actions=drop", "-1", "unknown table");
        err_at(
            "in_port=0xffffffff/0xff,actions=drop",
            "0xffffffff/0xff",
            "cannot be masked",
        );
        err_at(
            "reg0=1/0x100000000,actions=drop",
            "0x100000000",
            "mask too large",
        );
        err_at(
            "ip,nw_src=1.2.3.4/1.2.3.4.5,actions=drop",
            "1.2.3.4.5",
            "IPv4",
        );
        err_at("table=Nope,actions=drop", "Nope", "unknown table");
        err_at("ip,reg16=1,actions=drop", "reg16", "unknown keyword");
        err_at("bogus=1,actions=drop", "bogus", "unknown keyword");
        err_at("ip,bogus,actions=drop", "bogus", "unknown keyword");
        err_at("tcp,tp_dst=65536,actions=drop", "65536", "too large");
        err_at(
            "tcp,tp_dst=0x10/0x10000,actions=drop",
            "0x10000",
            "too large",
        );
        err_at("reg0=0x100000000,actions=drop", "0x100000000", "too large");
        err_at(
            "in_port=0xffffff01,actions=drop",
            "0xffffff01",
            "out of range",
        );
        err_at("in_port=1/1,actions=drop", "1/1", "cannot be masked");
        err_at("ip,nw_ttl=3/0xf,actions=drop", "/0xf", "cannot be masked");
        err_at("ip,nw_tos=5,actions=drop", "5", "multiple of 4");
        err_at("ip,ip_dscp=64,actions=drop", "64", "too large");
        err_at("dl_vlan=4096,actions=drop", "4096", "dl_vlan");
        err_at("ip,nw_src=1.2.3.256,actions=drop", "1.2.3.256", "IPv4");
        err_at("ip,nw_src=1.2.3.4/33,actions=drop", "33", "prefix");
        err_at(
            "dl_src=00:11:22:33:44,actions=drop",
            "00:11:22:33:44",
            "Ethernet",
        );
        err_at(
            "ct_state=+trk+bogus,actions=drop",
            "bogus",
            "unknown ct_state flag",
        );
        err_at("ip,nw_frag=maybe,actions=drop", "maybe", "nw_frag");
        err_at("priority=65536,actions=drop", "65536", "too large");
        err_at("cookie=0x1/0xff,actions=drop", "0x1/0xff", "cookie mask");
        err_at("ip", "", "must specify an action");
        err_at("ip,nw_src=(1,actions=drop", "(1,", "unbalanced");
    }

    #[test]
    fn prerequisite_errors() {
        err_at(
            "tp_dst=80,actions=drop",
            "tp_dst",
            "prerequisites not met for setting tp_dst",
        );
        err_at("ip,tp_dst=80,actions=drop", "tp_dst", "prerequisites");
        err_at(
            "nw_src=1.2.3.4,actions=drop",
            "nw_src",
            "prerequisites not met for setting nw_src",
        );
        err_at(
            "ip,arp_spa=1.2.3.4,actions=drop",
            "arp_spa",
            "prerequisites",
        );
        err_at("ip,ipv6_src=::1,actions=drop", "ipv6_src", "prerequisites");
        err_at("udp,tcp_dst=1,actions=drop", "tcp_dst", "prerequisites");
        err_at(
            "udp,tcp_flags=+syn,actions=drop",
            "tcp_flags",
            "prerequisites",
        );
        err_at("tcp,icmp_type=1,actions=drop", "icmp_type", "prerequisites");
        err_at("nw_ttl=1,actions=drop", "nw_ttl", "prerequisites");
        err_at(
            "ipv6,nw_src=1.2.3.4,actions=drop",
            "nw_src",
            "prerequisites",
        );
    }

    #[test]
    fn action_errors() {
        err_at("actions=bogus", "bogus", "unknown action");
        err_at("actions=bogus:1", "bogus", "unknown action");
        err_at("actions=output:0xffffff01", "0xffffff01", "out of range");
        err_at("actions=output:4294967296", "4294967296", "out of range");
        // 0xffffff00 is OFPP_MAX: a valid in_port value, never an output (as OVS).
        err_at(
            "actions=output:0xffffff00",
            "0xffffff00",
            "unsupported port",
        );
        err_at(
            "actions=output:4294967040",
            "4294967040",
            "unsupported port",
        );
        err_at("actions=output:ANY", "ANY", "unsupported port");
        err_at("actions=load:1->reg16", "reg16", "unknown field");
        err_at("actions=set_field:1->reg16", "reg16", "unknown field");
        err_at("actions=move:reg16[]->reg0[]", "reg16", "unknown field");
        err_at("actions=goto_table:256", "256", "table number out of range");
        err_at("actions=resubmit(,256)", "256", "table number out of range");
        err_at(
            "ip,actions=ct(table=256)",
            "256",
            "table number out of range",
        );
        err_at("actions=conjunction(1,1/1)", "1", "at least 2");
        err_at("actions=conjunction(1,2/65)", "65", "at most 64");
        err_at("actions=conjunction(1,0/2)", "0", "positive");
        err_at("actions=conjunction(1,3/2)", "3", "less than or equal");
        err_at(
            "ip,actions=conjunction(1,1/2),output:1",
            "output:1",
            "conjunction",
        );
        err_at(
            "ip,actions=dec_ttl,conjunction(1,1/2)",
            "dec_ttl",
            "conjunction",
        );
        err_at("table=3,actions=goto_table:3", "3", "later table");
        err_at("table=3,actions=goto_table:2", "2", "later table");
        err_at(
            "table=3,actions=goto_table:4,output:1",
            "goto_table:4",
            "last",
        );
        err_at("actions=set_field:1->ct_state", "ct_state", "read-only");
        err_at("actions=set_field:1->ct_zone", "ct_zone", "read-only");
        err_at(
            "actions=load:1->NXM_NX_CONJ_ID[]",
            "NXM_NX_CONJ_ID[]",
            "read-only",
        );
        err_at(
            "actions=move:reg0[]->NXM_NX_CT_STATE[]",
            "NXM_NX_CT_STATE[]",
            "read-only",
        );
        err_at("actions=set_field:1->ct_mark", "ct_mark", "outside of ct");
        err_at(
            "actions=load:1->NXM_NX_CT_LABEL[]",
            "NXM_NX_CT_LABEL[]",
            "outside of ct",
        );
        err_at(
            "ip,actions=ct(commit,exec(set_field:1->reg0))",
            "reg0",
            "nested modification",
        );
        err_at(
            "ip,actions=ct(commit,exec(output:1))",
            "output:1",
            "ct exec",
        );
        err_at("ip,actions=ct(force)", "force", "requires \"commit\"");
        err_at(
            "ip,actions=ct(commit,zone=reg0[0..7])",
            "reg0[0..7]",
            "16 bits",
        );
        err_at("ip,actions=ct(nat)", "nat", "ct argument");
        err_at("actions=ct(commit)", "ct", "IP match");
        err_at("actions=dec_ttl", "dec_ttl", "IP match");
        err_at("actions=mod_nw_src:1.2.3.4", "mod_nw_src", "IPv4");
        err_at(
            "actions=move:NXM_NX_REG0[0..3]->NXM_NX_REG1[0..4]",
            "NXM_NX_REG0[0..3]->NXM_NX_REG1[0..4]",
            "4 bits wide",
        );
        err_at(
            "actions=move:NXM_NX_REG0[0..32]->NXM_NX_REG1[]",
            "NXM_NX_REG0[0..32]",
            "ending bit 32",
        );
        err_at(
            "actions=load:0x100->NXM_NX_REG0[0..7]",
            "0x100",
            "does not fit into 8 bits",
        );
        err_at("actions=load:1->NXM_NX_REG0[5..3]", "5..3", "bit range");
        err_at(
            "actions=set_field:0x100000000->reg0",
            "0x100000000",
            "too large",
        );
        err_at(
            "actions=set_field:1.2.3.4->nw_src",
            "nw_src",
            "prerequisites",
        );
        err_at(
            "arp,actions=set_field:5->tcp_dst",
            "tcp_dst",
            "prerequisites",
        );
        err_at(
            "actions=move:NXM_OF_IP_SRC[]->NXM_NX_REG0[]",
            "NXM_OF_IP_SRC[]",
            "prerequisites",
        );
        err_at("actions=drop,output:1", "drop", "must not be accompanied");
        err_at("actions=push_vlan:0x800", "0x800", "push_vlan");
        err_at("actions=note:1", "1", "hex");
        err_at("actions=resubmit(,)", "resubmit(,)", "at least one");
        err_at("actions=resubmit(,255)", "255", "out of range");
        err_at("actions=goto_table:255", "255", "out of range");
        err_at("actions=controller(reason=bogus)", "bogus", "reason");
        err_at("actions=output:bogus[]", "bogus", "unknown field");
    }

    #[test]
    fn flow_mods() {
        let c = ctx();
        let d = parse_flow_mod(
            "cookie=0x10/0xff,table=3,out_port=2,ip",
            FlowModCommand::Delete { strict: false },
            &c,
        )
        .unwrap();
        assert_eq!(
            (d.flow.cookie, d.cookie_mask, d.table, d.out_port),
            (0x10, 0xff, Some(3), Some(2))
        );
        let d = parse_flow_mod(
            "cookie=0x10/-1",
            FlowModCommand::Delete { strict: true },
            &c,
        )
        .unwrap();
        assert_eq!((d.cookie_mask, d.table), (u64::MAX, None));
        let e = parse_flow_mod(
            "ip,actions=drop",
            FlowModCommand::Delete { strict: false },
            &c,
        )
        .unwrap_err();
        assert_eq!((e.pos, e.token.as_str()), (3, "actions"));
        let e = parse_flow_mod(
            "cookie=0x1,ip",
            FlowModCommand::Delete { strict: false },
            &c,
        )
        .unwrap_err();
        assert!(e.msg.contains("cannot set cookie"), "{e}");
        let e = parse_flow_mod(
            "idle_timeout=5",
            FlowModCommand::Delete { strict: false },
            &c,
        )
        .unwrap_err();
        assert_eq!(e.token, "idle_timeout");
        let m = parse_flow_mod(
            "cookie=0x1/0x1,ip,actions=output:1",
            FlowModCommand::Modify { strict: true },
            &c,
        )
        .unwrap();
        assert_eq!((m.cookie_mask, m.flow.actions.len()), (1, 1));
        let e = parse_flow_mod("ip", FlowModCommand::Modify { strict: false }, &c).unwrap_err();
        assert!(e.msg.contains("must specify an action"));
        let e = parse_flow_mod("out_port=1,actions=drop", FlowModCommand::Add, &c).unwrap_err();
        assert_eq!(e.token, "out_port");
        let a = parse_flow_mod("table=4,actions=drop", FlowModCommand::Add, &c).unwrap();
        assert_eq!(a.table, Some(4));
    }

    #[test]
    fn flow_file() {
        let text = "# comment\n\n  table=1,actions=drop\n  # indented comment\ntable=2,\\\n ip,actions=drop\ntable=3, ip, bogus=1, actions=drop\n";
        let e = parse_flow_file(text, &ctx()).unwrap_err();
        assert_eq!((e.line, e.column, e.error.token.as_str()), (7, 14, "bogus"));
        let flows = parse_flow_file(&text.replace("bogus=1, ", ""), &ctx()).unwrap();
        assert_eq!(
            flows.iter().map(|f| f.table).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        let e =
            parse_flow_file("table=1,\\\n ip,\\\n   nw_dst=x,actions=drop", &ctx()).unwrap_err();
        assert_eq!((e.line, e.column), (3, 11));
    }

    #[test]
    fn match_and_spec() {
        let m = parse_match("priority=5,tcp,tp_dst=80", &ctx()).unwrap();
        assert_eq!(m.get(Field::TpDst), (80, 0xffff));
        assert!(parse_match("tp_dst=80", &ctx()).is_err());
        let k = parse_packet_spec(
            "in_port=2,tcp,nw_src=10.0.0.1,tp_dst=80,ct_state=trk|new,dl_vlan=5",
            &ctx(),
        )
        .unwrap();
        assert_eq!(k.get(Field::InPort), 2);
        assert_eq!(k.get(Field::NwSrc), 0x0a00_0001);
        assert_eq!(k.get(Field::TpDst), 80);
        assert_eq!(k.get(Field::CtState), 0x21);
        assert_eq!(k.get(Field::VlanTci), 0x1005);
        assert_eq!(k.get(Field::NwTtl), 0);
        let k2 = parse_packet_spec(
            "in_port=2,tcp,nw_src=10.0.0.1,tp_dst=80,ct_state=+trk+new,dl_vlan=5",
            &ctx(),
        )
        .unwrap();
        assert_eq!(k, k2);
        let e = parse_packet_spec("ip,nw_src=10.0.0.0/8", &ctx()).unwrap_err();
        assert_eq!((e.pos, e.token.as_str()), (10, "10.0.0.0/8"));
        let e = parse_packet_spec("reg0=1/1", &ctx()).unwrap_err();
        assert!(e.msg.contains("masks are not allowed"));
    }

    #[test]
    fn never_panics_on_garbage() {
        for s in [
            "",
            "(",
            ")",
            "=",
            ",,,",
            "actions=",
            "actions=(",
            "actions=ct(",
            "a=b=c",
            "é=ü,actions=ü",
            "actions=load:->",
            "actions=move:->",
            "actions=set_field:->",
            "reg1=/",
            "ct_state=+",
            "ct_state=-",
            "actions=output:reg1[",
            "actions=output:reg1[..]",
            "actions=output:reg1[1..]",
            "actions=conjunction(,/)",
            "\\",
            "actions=note:.",
            "actions=resubmit(1,2,3)",
        ] {
            let _ = parse_flow(s, &ctx());
            let _ = parse_packet_spec(s, &ctx());
            let _ = parse_flow_file(s, &ctx());
        }
    }
}
