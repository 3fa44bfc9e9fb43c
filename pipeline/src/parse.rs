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
//!   (the only nested action [`CtAction::exec`](crate::flow::CtAction::exec)
//!   holds).
//!
//! ## Layout
//!
//! This file holds the entry points (flows, flow mods, flow files, matches
//! alone, packet specs) and the flow-level checks; the parts they are made
//! of are submodules: `error` (errors and byte positions), `lexer` (items),
//! `value` (numbers, addresses, masks, ports, tables), `match_fields` (the
//! match and its prerequisites) and `actions` (the action list).

mod actions;
mod error;
mod group;
mod learn;
mod lexer;
mod match_fields;
mod meter;
#[cfg(test)]
mod tests;
mod value;

pub use actions::parse_actions;
pub use error::{FileError, ParseError};
pub use group::{parse_group, parse_group_id, BUCKET_MAX};
pub use meter::{parse_meter, parse_meter_id};

use self::actions::parse_actions_in;
use self::error::{PResult, Src};
use self::lexer::{is_delim, Lexer};
use self::match_fields::{apply_shorthand, check_prereqs, parse_field_value, Used};
use self::value::{parse_port, parse_table, uint_bits};
use crate::field::lookup_name;
use crate::flow::{port, Flow, FlowMod, FlowModCommand, Match};
use crate::key::FlowKey;
use crate::names::TableNames;

/// Names the parser resolves (table names).
#[derive(Clone, Debug, Default)]
pub struct ParseContext {
    pub tables: TableNames,
}

/// Ethertypes and IP protocol numbers used by the protocol shorthands and
/// prerequisites: the wire layer's.
pub(crate) use crate::wire::{ethertype as eth_type, ip_proto};

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
    parse_lines(text, |line| parse_flow(line, ctx))
}

/// Parses a group file (`ovs-ofctl add-groups`): one group per line in
/// [`parse_group`] syntax, comments and continuations as in a flow file.
pub fn parse_group_file(
    text: &str,
    ctx: &ParseContext,
) -> Result<Vec<crate::group::Group>, FileError> {
    parse_lines(text, |line| parse_group(line, ctx))
}

/// Parses a meter file (`oxvsctl add-meters`): one meter per line in
/// [`parse_meter`] syntax, comments and continuations as in a flow file.
pub fn parse_meter_file(text: &str) -> Result<Vec<crate::meter::MeterConfig>, FileError> {
    parse_lines(text, parse_meter)
}

/// Parses each logical line of a file with `parse`, turning an error's byte
/// offset into the physical line and column it is on.
fn parse_lines<T>(
    text: &str,
    mut parse: impl FnMut(&str) -> Result<T, ParseError>,
) -> Result<Vec<T>, FileError> {
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
            match parse(&joined) {
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
