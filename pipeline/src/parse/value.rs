//! Values as the `ovs-ofctl` dialect writes them: numbers, MAC and IP
//! addresses, masks and prefixes, flag sets, ports and tables.

use super::error::{PResult, ParseError, Src};
use super::{ParseContext, PORT_NAMES};
use crate::field::ValueFormat;
use crate::flow::port;

/// Parses a decimal or `0x` hexadecimal unsigned integer.
pub(super) fn parse_uint(s: &str) -> Option<u128> {
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

pub(super) fn ones(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

pub(super) fn uint_bits(src: &Src, tok: &str, bits: u32, what: &str) -> PResult<u128> {
    let v = parse_uint(tok).ok_or_else(|| src.err(tok, format!("invalid number for {what}")))?;
    if v > ones(bits) {
        return Err(src.err(tok, format!("value too large for {bits}-bit {what}")));
    }
    Ok(v)
}

pub(super) fn parse_mac(s: &str) -> Option<u128> {
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

pub(super) fn parse_ipv4(s: &str) -> Option<u128> {
    s.parse::<std::net::Ipv4Addr>()
        .ok()
        .map(|a| u128::from(u32::from(a)))
}

pub(super) fn parse_ipv6(s: &str) -> Option<u128> {
    s.parse::<std::net::Ipv6Addr>().ok().map(u128::from)
}

/// A mask of `prefix` leading one bits in a `bits`-wide field.
pub(super) fn prefix_mask(prefix: u32, bits: u32) -> u128 {
    if prefix == 0 {
        0
    } else {
        ones(bits) & !ones(bits - prefix)
    }
}

/// Parses a `value[/mask]` for a plain (non-flag) format. Returns the value
/// and the mask (`None` if not written), both right-aligned to `bits`.
pub(super) fn parse_value_mask(
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

pub(super) fn parse_one_value(
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
pub(super) fn parse_flags(
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
pub(super) fn parse_port(src: &Src, tok: &str) -> PResult<u32> {
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

pub(super) fn parse_table(src: &Src, tok: &str, ctx: &ParseContext) -> PResult<u8> {
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
