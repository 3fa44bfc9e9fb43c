//! The `ovs-ofctl add-group` syntax (Open vSwitch 3.1's
//! `parse_ofp_group_mod_str`):
//!
//! ```text
//! group_id=6,type=select,selection_method=hash,fields(ip_src,tcp_src),bucket=weight:100,actions=output:2,bucket=output:3
//! ```
//!
//! The group's own items (`group_id`, `type`, `selection_method`,
//! `selection_method_param`, `fields(...)` or `fields=F`) come first; each
//! `bucket=` starts a bucket that runs to the next one. A bucket holds
//! `bucket_id:N`, `weight:N`, `watch_port:P`, `watch_group:G`, and its
//! actions, after `actions=` or written directly (`bucket=output:2`), in the
//! order written. Bucket actions are parsed with the flow action parser but
//! without prerequisites (a bucket runs on whatever packet reaches the
//! group: OVS accepts `bucket=actions=ct(commit,nat(dst=10.0.0.2:80))`),
//! and `goto_table` is refused there.
//!
//! Buckets without `bucket_id` are numbered as `ovs-ofctl` numbers them:
//! from 0 up, skipping the ids written on the buckets that follow the first
//! unnumbered one. Two buckets with one id are refused (as the switch
//! refuses them, `OFPGMFC_BAD_BUCKET`).
//!
//! Every refusal is a [`ParseError`] naming the token; nothing panics.

use super::actions::{parse_action, ActCtx};
use super::error::{PResult, ParseError, Src};
use super::lexer::{Item, Lexer};
use super::value::{parse_port, parse_value_mask, uint_bits};
use super::ParseContext;
use crate::field::lookup_name;
use crate::flow::{port, Action, Match};
use crate::group::{select_field, Bucket, Group, GroupType, SelectionMethod, GROUP_MAX};

/// The largest bucket id (OpenFlow 1.5's `OFPG15_BUCKET_MAX`).
pub const BUCKET_MAX: u32 = 0xffff_ff00;

/// Parses one group in `add-group` syntax.
pub fn parse_group(text: &str, ctx: &ParseContext) -> Result<Group, ParseError> {
    let src = Src { text };
    parse_group_in(&src, text, ctx)
}

/// Parses the argument of `del-groups`: nothing or `group_id=all` (every
/// group: `None`) or `group_id=N`.
pub fn parse_group_id(text: &str) -> Result<Option<u32>, ParseError> {
    let src = Src { text };
    let mut lex = Lexer::new(src, text);
    let mut id = None;
    while let Some(item) = lex.next_item()? {
        match (item.key, item.value) {
            ("group_id", Some("all")) => id = None,
            ("group_id", Some(v)) => id = Some(group_id(&src, v)?),
            _ => {
                return Err(src.err(
                    item.whole,
                    "unknown keyword (del-groups takes group_id=N or group_id=all)",
                ))
            }
        }
    }
    Ok(id)
}

fn group_id(src: &Src, v: &str) -> PResult<u32> {
    let id = uint_bits(src, v, 32, "group_id")? as u32;
    if id > GROUP_MAX {
        return Err(src.err(
            v,
            format!("invalid group id {id} (at most {GROUP_MAX}, 0xffffff00)"),
        ));
    }
    Ok(id)
}

/// A `fields(...)` entry: its rank in OVS's order, the OVS name, the key
/// field and the mask in the field's position.
type SelField = (usize, &'static str, crate::field::Field, u128);

/// A bucket as written: its `bucket=` token and its items.
struct RawBucket<'a> {
    tok: &'a str,
    items: Vec<Item<'a>>,
}

fn parse_group_in(src: &Src, text: &str, ctx: &ParseContext) -> PResult<Group> {
    let mut id = None;
    let mut kind = None;
    let mut method: Option<(&str, SelectionMethod)> = None;
    let mut basis: Option<(&str, u64)> = None;
    let mut fields: Option<(&str, Vec<SelField>)> = None;
    let mut raw: Vec<RawBucket> = Vec::new();
    let mut lex = Lexer::new(*src, text);
    while let Some(item) = lex.next_item()? {
        if item.key == "bucket" {
            let v = match (item.value, item.paren) {
                (Some(v), false) => v,
                _ => return Err(src.err(item.whole, "must specify bucket content (bucket=...)")),
            };
            let mut inner = Lexer::new(*src, v);
            let mut items = Vec::new();
            while let Some(i) = inner.next_item()? {
                items.push(i);
            }
            raw.push(RawBucket {
                tok: item.whole,
                items,
            });
            continue;
        }
        if let Some(b) = raw.last_mut() {
            b.items.push(item);
            continue;
        }
        let Some(v) = item.value else {
            return Err(src.err(item.key, "unknown keyword"));
        };
        match item.key {
            "group_id" if v == "all" => {
                return Err(src.err(v, "group_id=all is only for del-groups"))
            }
            "group_id" => id = Some(group_id(src, v)?),
            "type" => {
                kind = Some(match v {
                    "all" => GroupType::All,
                    "select" => GroupType::Select,
                    "indirect" => GroupType::Indirect,
                    "ff" | "fast_failover" => GroupType::FastFailover,
                    _ => {
                        return Err(src.err(
                            v,
                            "invalid group type (all, select, indirect, ff or fast_failover)",
                        ))
                    }
                })
            }
            "selection_method" => {
                let m = match v {
                    "hash" => SelectionMethod::Hash,
                    "dp_hash" => SelectionMethod::DpHash,
                    _ => {
                        return Err(
                            src.err(v, "selection method is not supported (hash or dp_hash)")
                        )
                    }
                };
                method = Some((item.whole, m));
            }
            "selection_method_param" => {
                basis = Some((
                    item.whole,
                    uint_bits(src, v, 64, "selection_method_param")? as u64,
                ))
            }
            "fields" => fields = Some((item.whole, parse_fields(src, v)?)),
            _ => return Err(src.err(item.key, "unknown keyword")),
        }
    }
    let end = src.end_of(text);
    let id = id.ok_or_else(|| src.err(end, "must specify a group_id"))?;
    let kind = kind.ok_or_else(|| src.err(end, "must specify a type"))?;
    let mut g = Group::new(id, kind);
    if let Some((_, m)) = method {
        g.method = m;
    }
    if let Some((tok, list)) = fields {
        if g.method != SelectionMethod::Hash {
            return Err(src.err(
                tok,
                "fields may only be specified with \"selection_method=hash\"",
            ));
        }
        for (_, name, f, mask) in list {
            g.fields.push((f, mask));
            g.field_names.push(name);
        }
    }
    if let Some((tok, b)) = basis {
        if method.is_none() && b != 0 {
            return Err(src.err(
                tok,
                "selection_method_param is only allowed with \"selection_method\"",
            ));
        }
        g.basis = b;
    }
    if method.is_some() && kind != GroupType::Select {
        // OVS keeps the property on any type; it only means something for
        // select groups, so say so rather than ignore it.
        if let Some((tok, _)) = method {
            return Err(src.err(tok, "selection_method is only for select groups"));
        }
    }
    let mut toks = Vec::with_capacity(raw.len());
    for (i, rb) in raw.iter().enumerate() {
        if kind == GroupType::Indirect && i > 0 {
            return Err(src.err(rb.tok, "indirect groups can have at most one bucket"));
        }
        let (b, explicit) = parse_bucket(src, rb, kind, ctx)?;
        g.buckets.push(b);
        toks.push((rb.tok, explicit));
    }
    number_buckets(src, &mut g.buckets, &toks)?;
    Ok(g)
}

/// `fields(...)`: each `NAME` or `NAME=MASK`, in OVS's field order.
fn parse_fields(src: &Src, text: &str) -> PResult<Vec<SelField>> {
    let mut out: Vec<SelField> = Vec::new();
    let mut lex = Lexer::new(*src, text);
    while let Some(item) = lex.next_item()? {
        let (rank, name) = select_field(item.key)
            .ok_or_else(|| src.err(item.key, "unknown field (or one fields() does not take)"))?;
        let Some(fname) = lookup_name(name) else {
            return Err(src.err(item.key, "unknown field"));
        };
        if out.iter().any(|e| e.0 == rank) {
            return Err(src.err(item.key, format!("{name}: duplicate field")));
        }
        let bits = u32::from(fname.bits);
        let full = if bits >= 128 {
            u128::MAX
        } else {
            (1u128 << bits) - 1
        };
        let mask = match item.value {
            None => full,
            Some(v) if item.paren => {
                return Err(src.err(v, "unexpected parentheses in fields"));
            }
            Some(v) => {
                let fmt = match fname.format {
                    crate::field::ValueFormat::CtState
                    | crate::field::ValueFormat::TcpFlags
                    | crate::field::ValueFormat::Frag => crate::field::ValueFormat::Hex,
                    f => f,
                };
                let (m, extra) = parse_value_mask(src, v, fmt, bits, name)?;
                if extra.is_some() {
                    return Err(src.err(v, "a fields() value is a mask: no '/' here"));
                }
                if m == 0 {
                    return Err(src.err(v, "values are wildcards here and must not be all-zeros"));
                }
                m
            }
        };
        out.push((rank, name, fname.field, mask << fname.ofs));
    }
    out.sort_by_key(|e| e.0);
    Ok(out)
}

/// One bucket; also whether its id was written.
fn parse_bucket(
    src: &Src,
    rb: &RawBucket,
    kind: GroupType,
    ctx: &ParseContext,
) -> PResult<(Bucket, bool)> {
    let mut b = Bucket {
        id: 0,
        weight: Group::default_weight(kind),
        watch_port: None,
        watch_group: None,
        actions: Vec::new(),
    };
    let mut explicit = false;
    let mut weight_tok = None;
    let mut action_items: Vec<Item> = Vec::new();
    for item in &rb.items {
        let need = || {
            item.value
                .filter(|_| !item.paren)
                .ok_or_else(|| src.err(item.whole, format!("{} needs a value", item.key)))
        };
        match item.key {
            "bucket_id" => {
                let v = need()?;
                let id = uint_bits(src, v, 32, "bucket_id")? as u32;
                if id > BUCKET_MAX {
                    return Err(src.err(v, format!("invalid bucket_id id {id}")));
                }
                b.id = id;
                explicit = true;
            }
            "weight" => {
                b.weight = uint_bits(src, need()?, 16, "weight")? as u16;
                weight_tok = Some(item.whole);
            }
            "watch_port" => {
                let v = need()?;
                let p = parse_port(src, v)?;
                if p >= 0xff00 && p != port::NONE {
                    return Err(src.err(v, "invalid watch_port"));
                }
                b.watch_port = (p != port::NONE).then_some(p);
            }
            "watch_group" => {
                let v = need()?;
                let g = uint_bits(src, v, 32, "watch_group")? as u32;
                if g == u32::MAX {
                    b.watch_group = None;
                } else if g > GROUP_MAX {
                    return Err(src.err(v, format!("invalid watch_group id {g}")));
                } else {
                    b.watch_group = Some(g);
                }
            }
            "actions" | "action" => {
                let v = need()?;
                let mut inner = Lexer::new(*src, v);
                while let Some(a) = inner.next_item()? {
                    action_items.push(a);
                }
            }
            _ => action_items.push(*item),
        }
    }
    if action_items.is_empty() {
        return Err(src.err(rb.tok, "bucket must specify actions"));
    }
    let m = Match::CATCHALL;
    let ac = ActCtx {
        m: &m,
        table: 0,
        ctx,
        any_packet: true,
    };
    let mut drop_tok = None;
    for item in &action_items {
        match item.key {
            "goto_table" => {
                return Err(src.err(item.whole, "goto_table is not allowed in a group bucket"))
            }
            "conjunction" => {
                return Err(src.err(item.whole, "conjunction is not allowed in a group bucket"))
            }
            _ => {}
        }
        let a = parse_action(src, item, &ac)?;
        if item.key == "drop" {
            drop_tok = Some(item.whole);
            continue;
        }
        b.actions.push(a);
    }
    if let (Some(d), false) = (drop_tok, b.actions.is_empty()) {
        return Err(src.err(d, "\"drop\" must not be accompanied by any other action"));
    }
    if let Some(t) = weight_tok {
        if kind != GroupType::Select && b.weight != 0 {
            return Err(src.err(t, "only select groups can have bucket weights"));
        }
    }
    if kind == GroupType::FastFailover && b.watch_port.is_none() && b.watch_group.is_none() {
        return Err(src.err(
            rb.tok,
            "fast failover bucket requires watch_port or watch_group",
        ));
    }
    debug_assert!(!b.actions.iter().any(|a| matches!(a, Action::GotoTable(_))));
    Ok((b, explicit))
}

/// Gives the unnumbered buckets ids as `ovs-ofctl` does, then refuses
/// duplicates.
fn number_buckets(src: &Src, buckets: &mut [Bucket], toks: &[(&str, bool)]) -> PResult<()> {
    if let Some(first) = toks.iter().position(|(_, explicit)| !explicit) {
        // The ids written after the first unnumbered bucket are taken;
        // those before it are not looked at (so they may collide).
        let mut taken: std::collections::BTreeSet<u32> = buckets
            .iter()
            .zip(toks)
            .skip(first)
            .filter(|(_, (_, e))| *e)
            .map(|(b, _)| b.id)
            .collect();
        let mut next = 0u32;
        for (b, (_, explicit)) in buckets.iter_mut().zip(toks).skip(first) {
            if *explicit {
                continue;
            }
            while taken.contains(&next) {
                next += 1;
            }
            b.id = next;
            taken.insert(next);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (b, (tok, _)) in buckets.iter().zip(toks) {
        if !seen.insert(b.id) {
            return Err(src.err(tok, format!("duplicate bucket id {}", b.id)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> ParseContext {
        ParseContext::default()
    }

    /// Parses and prints; the printed text parses back to a group that
    /// prints the same (and is the same group when OVS's OpenFlow 1.5
    /// rewriting of the actions changed nothing).
    fn round(text: &str) -> String {
        let g = parse_group(text, &ctx()).unwrap_or_else(|e| panic!("{text}: {e}"));
        let printed = g.to_string();
        let again = parse_group(&printed, &ctx()).unwrap_or_else(|e| panic!("{printed}: {e}"));
        assert_eq!(again.to_string(), printed);
        if of15_same(&g) {
            assert_eq!(g, again, "{printed}");
        }
        printed
    }

    fn of15_same(g: &Group) -> bool {
        g.buckets.iter().all(|b| {
            !b.actions.iter().any(|a| {
                matches!(
                    a,
                    Action::ModDlSrc(_)
                        | Action::ModDlDst(_)
                        | Action::ModNwSrc(_)
                        | Action::ModNwDst(_)
                        | Action::SetTunnel(_)
                        | Action::Load { .. }
                        | Action::Note(_)
                )
            })
        })
    }

    #[test]
    fn actions_print_as_openflow_15() {
        // What ovs-ofctl -O OpenFlow15 dump-groups printed (Open vSwitch 3.1).
        assert_eq!(
            round("group_id=1,type=all,bucket=strip_vlan,push_vlan:0x8100,set_tunnel:0x10,mod_nw_dst:1.2.3.4,mod_dl_dst:02:00:00:00:00:09,load:0x1->NXM_NX_REG0[],load:0x5->NXM_NX_REG1[0..7],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],ct(commit,exec(load:0x1->NXM_NX_CT_MARK[])),note:aa,note:01.02.03.04.05.06.07,output:1"),
            "group_id=1,type=all,bucket=bucket_id:0,actions=pop_vlan,push_vlan:0x8100,set_field:0x10->tun_id,set_field:1.2.3.4->ip_dst,set_field:02:00:00:00:00:09->eth_dst,set_field:0x1->reg0,set_field:0x5/0xff->reg1,move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],ct(commit,exec(set_field:0x1->ct_mark)),note:aa.00.00.00.00.00,note:01.02.03.04.05.06.07.00.00.00.00.00.00.00,output:1"
        );
    }

    #[test]
    fn prints_as_ovs_dump_groups() {
        // Each expected line is what ovs-ofctl -O OpenFlow15 dump-groups
        // (Open vSwitch 3.1) printed for the input.
        let cases = [
            ("group_id=6,type=select,selection_method=hash,fields(tcp_src,ip_src),bucket=bucket_id:0,weight:100,actions=output:2,bucket=bucket_id:1,actions=output:3",
             "group_id=6,type=select,selection_method=hash,fields(ip_src,tcp_src),bucket=bucket_id:0,weight:100,actions=output:2,bucket=bucket_id:1,actions=output:3"),
            ("group_id=7,type=select,bucket=output:2,bucket=weight:5,output:3",
             "group_id=7,type=select,bucket=bucket_id:0,actions=output:2,bucket=bucket_id:1,weight:5,actions=output:3"),
            ("group_id=9,type=indirect,bucket=actions=ct(commit,nat(dst=10.0.0.2:80))",
             "group_id=9,type=indirect,bucket=bucket_id:0,actions=ct(commit,nat(dst=10.0.0.2:80))"),
            ("group_id=10,type=ff,bucket=watch_port:2,output:2,bucket=watch_port:3,watch_group:7,output:3",
             "group_id=10,type=ff,bucket=bucket_id:0,watch_port:2,actions=output:2,bucket=bucket_id:1,watch_port:3,watch_group:7,actions=output:3"),
            ("group_id=11,type=select,selection_method=hash,selection_method_param=7,fields=ip_dst,bucket=output:2",
             "group_id=11,type=select,selection_method=hash,selection_method_param=7,fields=ip_dst,bucket=bucket_id:0,actions=output:2"),
            ("group_id=12,type=select,selection_method=hash,fields(ip_src=255.255.255.0,tcp_dst=0xff00,eth_src,nw_proto,udp_src),bucket=bucket_id:5,output:2,bucket=output:3",
             "group_id=12,type=select,selection_method=hash,fields(eth_src,ip_src=255.255.255.0,nw_proto,tcp_dst=65280,udp_src),bucket=bucket_id:5,actions=output:2,bucket=bucket_id:0,actions=output:3"),
            ("group_id=13,type=select,selection_method=dp_hash,bucket=output:2",
             "group_id=13,type=select,selection_method=dp_hash,bucket=bucket_id:0,actions=output:2"),
            ("group_id=14,type=all", "group_id=14,type=all"),
            ("group_id=15,type=all,bucket=weight:0,output:1,bucket=drop",
             "group_id=15,type=all,bucket=bucket_id:0,actions=output:1,bucket=bucket_id:1,actions=drop"),
            ("group_id=16,type=select,selection_method=hash,bucket=output:1",
             "group_id=16,type=select,selection_method=hash,bucket=bucket_id:0,actions=output:1"),
            ("group_id=24,type=all,bucket=output:1,dec_ttl",
             "group_id=24,type=all,bucket=bucket_id:0,actions=output:1,dec_ttl"),
            ("group_id=4294967040,type=all", "group_id=4294967040,type=all"),
            ("group_id=2,type=all,bucket=output:1,bucket=bucket_id:0,output:2",
             "group_id=2,type=all,bucket=bucket_id:1,actions=output:1,bucket=bucket_id:0,actions=output:2"),
            ("group_id=3,type=all,bucket=output:1,bucket=bucket_id:7,output:2,bucket=output:3",
             "group_id=3,type=all,bucket=bucket_id:0,actions=output:1,bucket=bucket_id:7,actions=output:2,bucket=bucket_id:1,actions=output:3"),
            ("group_id=15,type=all,bucket=output:1,group:16",
             "group_id=15,type=all,bucket=bucket_id:0,actions=output:1,group:16"),
            ("group_id=7,type=select,selection_method=hash,fields(reg0=0xff,in_port,ipv6_src=ffff::,dl_type,tp_src,nw_src),bucket=output:1",
             "group_id=7,type=select,selection_method=hash,fields(in_port,reg0=0xff,eth_type,ip_src,ipv6_src=ffff::,tcp_src),bucket=bucket_id:0,actions=output:1"),
            ("group_id=11,type=select,bucket=actions=output:1,actions=output:2",
             "group_id=11,type=select,bucket=bucket_id:0,actions=output:1,output:2"),
            ("group_id=12,type=select,bucket=weight:65535,output:1",
             "group_id=12,type=select,bucket=bucket_id:0,weight:65535,actions=output:1"),
            ("group_id=13, type=all, bucket=output:1 bucket=output:2",
             "group_id=13,type=all,bucket=bucket_id:0,actions=output:1,bucket=bucket_id:1,actions=output:2"),
            ("group_id=14,type=all,bucket=bucket_id=3,output:1",
             "group_id=14,type=all,bucket=bucket_id:3,actions=output:1"),
            ("group_id=0,type=all", "group_id=0,type=all"),
        ];
        for (input, want) in cases {
            assert_eq!(round(input), want, "{input}");
        }
    }

    #[test]
    fn fields_hash_under_their_masks() {
        let g = parse_group(
            "group_id=1,type=select,selection_method=hash,fields(ip_src=255.255.255.0,tcp_dst),bucket=output:1",
            &ctx(),
        )
        .unwrap();
        assert_eq!(
            g.fields,
            vec![
                (crate::field::Field::NwSrc, 0xffff_ff00),
                (crate::field::Field::TpDst, 0xffff)
            ]
        );
        assert_eq!(g.field_names, vec!["ip_src", "tcp_dst"]);
    }

    #[test]
    fn refusals_name_the_token() {
        let cases = [
            ("group_id=1,type=select,bucket=output:1,goto_table:3", "goto_table:3", "goto_table"),
            ("group_id=1,type=indirect,bucket=output:1,bucket=output:2", "bucket=output:2", "at most one bucket"),
            ("group_id=1,type=all,bucket=bucket_id:1,output:1,bucket=bucket_id:1,output:2", "bucket=bucket_id:1", "duplicate bucket id 1"),
            ("group_id=1,type=all,bucket=bucket_id:0,output:1,bucket=output:2", "bucket=output:2", "duplicate bucket id 0"),
            ("group_id=1,type=select,selection_method=dp_hash,fields(ip_src),bucket=output:1", "fields(ip_src)", "selection_method=hash"),
            ("group_id=1,type=select,fields(ip_src),bucket=output:1", "fields(ip_src)", "selection_method=hash"),
            ("group_id=1,type=select,selection_method_param=5,bucket=output:1", "selection_method_param=5", "only allowed with"),
            ("group_id=1,type=select,selection_method=foo,bucket=output:1", "foo", "not supported"),
            ("group_id=1,type=all,bar=1", "bar", "unknown keyword"),
            ("group_id=1,type=all,bucket=foo", "foo", "unknown action"),
            ("group_id=4294967041,type=all", "4294967041", "invalid group id"),
            ("group_id=all,type=all", "all", "del-groups"),
            ("type=all,bucket=output:1", "", "must specify a group_id"),
            ("group_id=1,bucket=output:1", "", "must specify a type"),
            ("group_id=1,type=foo", "foo", "invalid group type"),
            ("group_id=1,type=ff,bucket=output:1", "bucket=output:1", "watch_port or watch_group"),
            ("group_id=1,type=all,bucket=weight:2,output:1", "weight:2", "only select groups"),
            ("group_id=1,type=select,bucket=bucket_id:4294967041,output:1", "4294967041", "invalid bucket_id"),
            ("group_id=1,type=select,selection_method=hash,fields(ip_src,nw_src),bucket=output:1", "nw_src", "duplicate field"),
            ("group_id=1,type=select,selection_method=hash,fields(foo),bucket=output:1", "foo", "unknown field"),
            ("group_id=1,type=select,selection_method=hash,fields(ip_src=1.2.3.4.5),bucket=output:1", "1.2.3.4.5", "invalid IPv4"),
            ("group_id=1,type=select,selection_method=hash,fields(tcp_src=0),bucket=output:1", "0", "all-zeros"),
            ("group_id=1,type=all,bucket=watch_port:2", "bucket=watch_port:2", "must specify actions"),
            ("group_id=1,type=all,bucket=", "bucket=", "must specify actions"),
            ("group_id=1,type=all,bucket=output:1,drop", "drop", "\"drop\""),
            ("group_id=1,type=all,bucket=conjunction(1,1/2)", "conjunction(1,1/2)", "conjunction"),
            ("group_id=1,type=all,bucket=output:1,set_field:1->ct_mark", "ct_mark", "outside of ct"),
            ("group_id=1,type=all,bucket=output:1,(", "(", ""),
        ];
        for (input, token, msg) in cases {
            let e = parse_group(input, &ctx()).expect_err(input);
            assert_eq!(e.token, token, "{input}: {e}");
            assert!(e.msg.contains(msg), "{input}: {e}");
            assert_eq!(&input[e.pos..e.pos + e.token.len()], token, "{input}");
        }
    }

    #[test]
    fn buckets_skip_prerequisites() {
        for text in [
            "group_id=1,type=all,bucket=dec_ttl,output:1",
            "group_id=1,type=all,bucket=mod_nw_src:1.2.3.4,output:1",
            "group_id=1,type=all,bucket=set_field:80->tcp_dst,output:1",
            "group_id=1,type=all,bucket=actions=ct(commit,table=3,nat(dst=10.0.0.2:80))",
            "group_id=1,type=all,bucket=actions=ct(commit,nat(dst=[fd00::2]:80))",
            "group_id=1,type=all,bucket=resubmit(,5)",
        ] {
            round(text);
        }
        // Flows still check them.
        assert!(crate::parse::parse_flow("actions=dec_ttl", &ctx()).is_err());
    }

    #[test]
    fn del_groups_argument() {
        assert_eq!(parse_group_id("").unwrap(), None);
        assert_eq!(parse_group_id("group_id=all").unwrap(), None);
        assert_eq!(parse_group_id("group_id=5").unwrap(), Some(5));
        assert!(parse_group_id("group_id=4294967041").is_err());
        assert!(parse_group_id("type=all").is_err());
    }

    #[test]
    fn group_files_locate_errors() {
        let text = "# groups\ngroup_id=1,type=all,bucket=output:1\n\n  group_id=2,type=all,\\\n bucket=foo\n";
        let e = crate::parse::parse_group_file(text, &ctx()).unwrap_err();
        assert_eq!((e.line, e.error.token.as_str()), (5, "foo"), "{e}");
        let ok = "group_id=1,type=all,bucket=output:1\n# x\ngroup_id=2,type=indirect,\\\n bucket=output:2\n";
        let gs = crate::parse::parse_group_file(ok, &ctx()).unwrap();
        assert_eq!(gs.iter().map(|g| g.id).collect::<Vec<_>>(), vec![1, 2]);
    }

    /// Random groups from pieces of the syntax: never a panic, and what
    /// parses prints text that parses back and prints the same.
    #[test]
    fn random_groups_print_stably() {
        const PIECES: &[&str] = &[
            "group_id=1",
            "group_id=4294967040",
            "type=all",
            "type=select",
            "type=indirect",
            "type=ff",
            "selection_method=hash",
            "selection_method=dp_hash",
            "selection_method_param=9",
            "fields(ip_src,tcp_dst=0xff)",
            "fields=eth_dst",
            "fields(ipv6_src=ffff::,nw_proto)",
            "bucket=output:1",
            "bucket=bucket_id:3",
            "bucket=weight:0",
            "bucket=actions=drop",
            "bucket=watch_port:2",
            "watch_group:5",
            "weight:7",
            "bucket_id:0",
            "actions=output:2",
            "output:3",
            "mod_dl_dst:02:00:00:00:00:01",
            "load:0x1->NXM_NX_REG0[0..3]",
            "note:aa",
            "ct(commit,nat(src=10.0.0.1-10.0.0.9:1-9))",
            "group:2",
            "dec_ttl",
            "set_field:1.2.3.4->ip_dst",
            "resubmit(,3)",
            "goto_table:4",
            ",",
            " ",
            "=",
            "(",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x = crate::group::mix64(x);
            x
        };
        let mut parsed = 0;
        for _ in 0..20_000 {
            // Mostly a group id and a type first, so that many parse.
            let kinds = ["type=all", "type=select", "type=indirect", "type=ff"];
            let mut text = vec!["group_id=1", kinds[(next() % 4) as usize]];
            if next() % 8 == 0 {
                text.clear();
            }
            let n = next() % 8;
            text.extend((0..n).map(|_| PIECES[(next() % PIECES.len() as u64) as usize]));
            let text = text.join(",");
            if let Ok(g) = parse_group(&text, &ctx()) {
                parsed += 1;
                let printed = g.to_string();
                let again = parse_group(&printed, &ctx())
                    .unwrap_or_else(|e| panic!("{text} -> {printed}: {e}"));
                assert_eq!(again.to_string(), printed, "{text}");
            }
        }
        assert!(parsed > 2_000, "only {parsed} parsed");
    }

    #[test]
    fn never_panics_on_junk() {
        for text in [
            "",
            ",",
            "bucket",
            "bucket=(",
            "group_id=1,type=all,bucket=bucket=",
            "group_id=1,type=all,bucket=actions",
            "group_id=1,type=select,selection_method=hash,fields(",
            "group_id=1,type=select,selection_method=hash,fields()",
            "group_id=1,type=select,selection_method=hash,fields=",
            "group_id=ff,type=all",
            "group_id=1,type=all,bucket=weight:x,output:1",
            "group_id=1,type=all,bucket=watch_port:LOCAL,output:1",
            "ü=ü,bucket=ü",
        ] {
            let _ = parse_group(text, &ctx());
        }
    }
}
