//! OpenFlow groups (`add-group`, `group:ID`), with Open vSwitch's
//! semantics and syntax.
//!
//! A group is a list of buckets, each an action list. What `group:ID` does
//! depends on the group's type:
//!
//! - **all**: every bucket runs, each on its own copy of the packet as it
//!   was at the `group` action (flooding, mirroring);
//! - **select**: one bucket runs, chosen by a hash of the packet: the
//!   load-balancing group (a Service's endpoints);
//! - **indirect**: the one bucket runs (a shared next hop);
//! - **fast_failover**: the first live bucket runs (every bucket is live
//!   here: oxvs does not watch ports).
//!
//! After the group the packet continues with the state it had before it:
//! what a bucket writes is seen only by that bucket (OVS translates each
//! bucket as a clone).
//!
//! ## Choosing a bucket
//!
//! A select group hashes the packet: with `selection_method=hash`, the
//! `fields(...)` it lists (under their masks), else (the default, and
//! `dp_hash`) the symmetric 5-tuple (addresses, protocol, ports: both
//! directions of a connection hash alike). The translation reads those
//! fields, so they are exact in the megaflow. The bucket is chosen by
//! weighted rendezvous hashing ([`select_bucket`]): every bucket scores
//! `weight / -ln(u)`, `u` a uniform number from the hash and the bucket's
//! id, and the highest score wins. A packet's choice therefore depends only
//! on its hash and the bucket ids and weights: adding or removing a bucket
//! moves only the packets that it wins or that were on it, and the others
//! keep theirs (what OVS's `hash` method does with its own scoring; a
//! Service's existing connections are kept by conntrack anyway). A bucket
//! with weight 0 is never chosen; a group whose buckets all weigh 0, or
//! that has none, drops.
//!
//! Differences from OVS: the default method hashes in the slow path, where
//! OVS's userspace datapath computes a `dp_hash` and recirculates (so its
//! megaflows match hash bits, ours the 5-tuple), and the bucket a given
//! packet gets differs from OVS's (another hash function); which bucket
//! is chosen is never part of OpenFlow's contract.

use crate::field::Field;
use crate::flow::Action;
use crate::key::FlowKey;

/// The largest group id (OpenFlow `OFPG_MAX`); above are reserved.
pub const GROUP_MAX: u32 = 0xffff_ff00;

/// A group's type (`type=`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum GroupType {
    All,
    Select,
    Indirect,
    FastFailover,
}

/// How a select group hashes (`selection_method=`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum SelectionMethod {
    /// Not given: the symmetric 5-tuple.
    #[default]
    Default,
    /// `selection_method=hash`: the listed `fields(...)`.
    Hash,
    /// `selection_method=dp_hash`: as the default here.
    DpHash,
}

/// One bucket of a group.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Bucket {
    /// `bucket_id:` (OVS numbers them 0, 1, ... when not given).
    pub id: u32,
    /// `weight:` (select groups; OVS's default is 1).
    pub weight: u16,
    /// `watch_port:` (kept and printed; every bucket counts as live).
    pub watch_port: Option<u32>,
    /// `watch_group:` (kept and printed).
    pub watch_group: Option<u32>,
    /// What the bucket does (empty: drop).
    pub actions: Vec<Action>,
}

/// A group as `add-group` gives it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Group {
    /// `group_id=` (1..=[`GROUP_MAX`]; 0 is valid in OpenFlow too).
    pub id: u32,
    pub kind: GroupType,
    pub method: SelectionMethod,
    /// `selection_method_param=` (the hash basis).
    pub basis: u64,
    /// `fields(...)` of `selection_method=hash`: each field with its mask
    /// (the whole field when no mask was given), in Open vSwitch's field
    /// order (the order it prints them in).
    pub fields: Vec<(Field, u128)>,
    /// The OVS name of each of `fields` (`ip_src` for `nw_src`, `tcp_src`
    /// for `tp_src`), same order: what a dump prints (a field without a
    /// name prints as the key field's own name).
    pub field_names: Vec<&'static str>,
    pub buckets: Vec<Bucket>,
}

impl Group {
    /// A group with no buckets.
    pub fn new(id: u32, kind: GroupType) -> Group {
        Group {
            id,
            kind,
            method: SelectionMethod::Default,
            basis: 0,
            fields: Vec::new(),
            field_names: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// A bucket's weight when `weight:` is not given: 1 in a select group,
    /// 0 in the others (as OVS, which prints a weight only when it differs).
    pub fn default_weight(kind: GroupType) -> u16 {
        match kind {
            GroupType::Select => 1,
            _ => 0,
        }
    }

    /// Every group id the buckets name (`group:ID` in a bucket).
    pub fn chained(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for b in &self.buckets {
            Group::referenced(&b.actions, &mut out);
        }
        out
    }

    /// Every group id a flow's (or bucket's) actions name, nested `ct`
    /// actions included.
    pub fn referenced(actions: &[Action], out: &mut Vec<u32>) {
        for a in actions {
            match a {
                Action::Group(id) => out.push(*id),
                Action::Ct(ct) => Group::referenced(&ct.exec, out),
                _ => {}
            }
        }
    }
}

impl GroupType {
    /// The name `dump-groups` prints (`ff` for fast failover, as OVS).
    pub fn name(self) -> &'static str {
        match self {
            GroupType::All => "all",
            GroupType::Select => "select",
            GroupType::Indirect => "indirect",
            GroupType::FastFailover => "ff",
        }
    }
}

/// The fields `fields(...)` accepts, in Open vSwitch's field order (its
/// `mf_field_id`, which is the order it prints them in): the name OVS
/// prints, then the other names it accepts.
pub const SELECT_FIELDS: &[(&str, &[&str])] = &[
    ("tun_id", &["tunnel_id"]),
    ("tun_src", &[]),
    ("tun_dst", &[]),
    ("tun_ipv6_src", &[]),
    ("tun_ipv6_dst", &[]),
    ("metadata", &[]),
    ("in_port", &[]),
    ("pkt_mark", &[]),
    ("ct_state", &[]),
    ("ct_zone", &[]),
    ("ct_mark", &[]),
    ("ct_label", &[]),
    ("reg0", &[]),
    ("reg1", &[]),
    ("reg2", &[]),
    ("reg3", &[]),
    ("reg4", &[]),
    ("reg5", &[]),
    ("reg6", &[]),
    ("reg7", &[]),
    ("reg8", &[]),
    ("reg9", &[]),
    ("reg10", &[]),
    ("reg11", &[]),
    ("reg12", &[]),
    ("reg13", &[]),
    ("reg14", &[]),
    ("reg15", &[]),
    ("xreg0", &[]),
    ("xreg1", &[]),
    ("xreg2", &[]),
    ("xreg3", &[]),
    ("xreg4", &[]),
    ("xreg5", &[]),
    ("xreg6", &[]),
    ("xreg7", &[]),
    ("eth_src", &["dl_src"]),
    ("eth_dst", &["dl_dst"]),
    ("eth_type", &["dl_type"]),
    ("vlan_tci", &[]),
    ("dl_vlan", &[]),
    ("vlan_vid", &[]),
    ("dl_vlan_pcp", &[]),
    ("vlan_pcp", &[]),
    ("ip_src", &["nw_src"]),
    ("ip_dst", &["nw_dst"]),
    ("ipv6_src", &[]),
    ("ipv6_dst", &[]),
    ("ipv6_label", &[]),
    ("nw_proto", &["ip_proto"]),
    ("nw_tos", &[]),
    ("ip_dscp", &[]),
    ("nw_ecn", &["ip_ecn"]),
    ("nw_ttl", &[]),
    ("ip_frag", &["nw_frag"]),
    ("arp_op", &[]),
    ("arp_spa", &[]),
    ("arp_tpa", &[]),
    ("arp_sha", &[]),
    ("arp_tha", &[]),
    ("tcp_src", &["tp_src"]),
    ("tcp_dst", &["tp_dst"]),
    ("tcp_flags", &[]),
    ("udp_src", &[]),
    ("udp_dst", &[]),
    ("sctp_src", &[]),
    ("sctp_dst", &[]),
    ("icmp_type", &["icmpv4_type"]),
    ("icmp_code", &["icmpv4_code"]),
    ("icmpv6_type", &[]),
    ("icmpv6_code", &[]),
];

/// The position of a `fields(...)` name in [`SELECT_FIELDS`] and the name
/// OVS prints for it.
pub fn select_field(name: &str) -> Option<(usize, &'static str)> {
    SELECT_FIELDS
        .iter()
        .position(|(n, aliases)| *n == name || aliases.contains(&name))
        .map(|i| (i, SELECT_FIELDS[i].0))
}

impl std::fmt::Display for Group {
    /// The group as `ovs-ofctl -O OpenFlow15 dump-groups` prints it (without
    /// the leading space): `group_id=6,type=select,selection_method=hash,
    /// fields(ip_src,tcp_src),bucket=bucket_id:0,weight:100,actions=output:2`.
    /// A bucket's weight is printed only when it is not the type's default,
    /// `selection_method_param` only when not 0, `fields=F` for one field.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let mut s = format!("group_id={},type={}", self.id, self.kind.name());
        let method = match self.method {
            SelectionMethod::Default => None,
            SelectionMethod::Hash => Some("hash"),
            SelectionMethod::DpHash => Some("dp_hash"),
        };
        if let Some(m) = method {
            let _ = write!(s, ",selection_method={m}");
            if self.basis != 0 {
                let _ = write!(s, ",selection_method_param={}", self.basis);
            }
            // A group built in code may leave the names out: the key
            // field's own name then.
            let fields: Vec<String> = self
                .fields
                .iter()
                .enumerate()
                .map(|(i, &(f, mask))| {
                    let name = self.field_names.get(i).copied().unwrap_or_else(|| f.name());
                    select_field_text(name, mask)
                })
                .collect();
            match fields.len() {
                0 => {}
                1 => {
                    let _ = write!(s, ",fields={}", fields[0]);
                }
                _ => {
                    let _ = write!(s, ",fields({})", fields.join(","));
                }
            }
        }
        for b in &self.buckets {
            let _ = write!(s, ",bucket=bucket_id:{},", b.id);
            if b.weight != Group::default_weight(self.kind) {
                let _ = write!(s, "weight:{},", b.weight);
            }
            if let Some(p) = b.watch_port {
                s.push_str("watch_port:");
                crate::print::write_port(&mut s, p);
                s.push(',');
            }
            if let Some(g) = b.watch_group {
                let _ = write!(s, "watch_group:{g},");
            }
            s.push_str("actions=");
            s.push_str(&crate::print::format_actions(
                &of15_actions(&b.actions),
                None,
            ));
        }
        f.write_str(&s)
    }
}

/// Bucket actions as OVS prints them after a round trip through OpenFlow
/// 1.5 (a group mod needs OpenFlow 1.1+): the OpenFlow 1.0 and Nicira
/// header writes become `set_field` (`mod_dl_dst:M` is
/// `set_field:M->eth_dst`, `mod_nw_src`, `set_tunnel` and `load` likewise)
/// and a `note` is padded with zeros as its encoding is (to 6 bytes, then
/// by 8). One difference remains: a write to an L4 port is named `tp_src`/
/// `tp_dst` where OVS knows which protocol's (`tcp_dst`), since a bucket has
/// no match to tell.
fn of15_actions(actions: &[Action]) -> Vec<Action> {
    let set = |field: Field, value: u128| Action::SetField {
        field,
        value,
        mask: field.full_mask(),
    };
    actions
        .iter()
        .map(|a| match a {
            Action::ModDlSrc(m) => set(Field::DlSrc, u128::from(*m)),
            Action::ModDlDst(m) => set(Field::DlDst, u128::from(*m)),
            Action::ModNwSrc(ip) => set(Field::NwSrc, u128::from(*ip)),
            Action::ModNwDst(ip) => set(Field::NwDst, u128::from(*ip)),
            Action::SetTunnel(id) => set(Field::TunId, u128::from(*id)),
            Action::Load { dst, value } => Action::SetField {
                field: dst.field,
                value: value << dst.ofs,
                mask: dst.mask(),
            },
            Action::Note(bytes) => {
                // NXAST_NOTE: a 10-byte header, then the bytes, padded to 8.
                let len = (bytes.len() + 10).div_ceil(8) * 8 - 10;
                let mut padded = bytes.clone();
                padded.resize(len, 0);
                Action::Note(padded)
            }
            other => other.clone(),
        })
        .collect()
}

/// One `fields(...)` entry as OVS prints it: the name, and `=MASK` (in the
/// field's own format) unless the mask is the whole field.
fn select_field_text(name: &'static str, mask: u128) -> String {
    use crate::field::ValueFormat;
    let Some(n) = crate::field::lookup_name(name) else {
        return name.to_string();
    };
    let bits = u32::from(n.bits);
    let full = if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    };
    let m = (mask >> n.ofs) & full;
    if m == full {
        return name.to_string();
    }
    let v = match n.format {
        ValueFormat::Mac => {
            let b = (m as u64).to_be_bytes();
            format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                b[2], b[3], b[4], b[5], b[6], b[7]
            )
        }
        ValueFormat::Ipv4 => std::net::Ipv4Addr::from(m as u32).to_string(),
        ValueFormat::Ipv6 => std::net::Ipv6Addr::from(m).to_string(),
        ValueFormat::Decimal => m.to_string(),
        _ => format!("{m:#x}"),
    };
    format!("{name}={v}")
}

/// A change to the group table (`add-group`, `mod-group`, `del-groups`),
/// applied by [`crate::tables::Pipeline::apply_bundle`] alone or with flow
/// mods in one atomic bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupMod {
    /// `add-group`: refused if the id exists (OpenFlow's
    /// `OFPGMFC_GROUP_EXISTS`).
    Add(Group),
    /// `mod-group`: replaces the group of this id; refused if there is none
    /// (`OFPGMFC_UNKNOWN_GROUP`) unless `may_create` (`--may-create`,
    /// OpenFlow's `ADD_OR_MOD`), which adds it.
    Modify { group: Group, may_create: bool },
    /// `del-groups`: one group (`Some`, nothing if it does not exist) or
    /// every group (`None`); every flow whose actions name a deleted group
    /// is deleted with it, as OVS does.
    Delete(Option<u32>),
}

/// A 64-bit mix (the SplitMix64 finaliser): deterministic across runs,
/// processes and machines.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn mix_u128(h: u64, v: u128) -> u64 {
    mix64(mix64(h ^ (v as u64)) ^ ((v >> 64) as u64))
}

/// The default method's hash: dl_type, protocol, and the two (address,
/// port) endpoints combined so that both directions hash alike. Every key
/// bit it reads is OR-ed into `wc`.
pub fn hash_symmetric_l4(key: &FlowKey, basis: u64, wc: &mut FlowKey) -> u64 {
    let mut read = |f: Field| {
        wc.mask_field(f);
        key.get(f)
    };
    let dl_type = read(Field::DlType);
    let mut h = mix64(basis ^ (dl_type as u64));
    let (a, b) = match dl_type as u16 {
        crate::wire::ethertype::IPV4 => (read(Field::NwSrc), read(Field::NwDst)),
        crate::wire::ethertype::IPV6 => (read(Field::Ipv6Src), read(Field::Ipv6Dst)),
        _ => return h,
    };
    let proto = read(Field::NwProto);
    h = mix64(h ^ proto as u64);
    let (pa, pb) = match proto as u8 {
        crate::wire::ip_proto::TCP | crate::wire::ip_proto::UDP | crate::wire::ip_proto::SCTP => {
            (read(Field::TpSrc), read(Field::TpDst))
        }
        _ => (0, 0),
    };
    // Symmetric: the smaller endpoint first.
    let (lo, hi) = if (a, pa) <= (b, pb) {
        ((a, pa), (b, pb))
    } else {
        ((b, pb), (a, pa))
    };
    h = mix_u128(h, lo.0);
    h = mix64(h ^ lo.1 as u64);
    h = mix_u128(h, hi.0);
    mix64(h ^ hi.1 as u64)
}

/// The `hash` method's hash: the listed fields under their masks, in
/// order. Every bit read is OR-ed into `wc`.
pub fn hash_fields(key: &FlowKey, fields: &[(Field, u128)], basis: u64, wc: &mut FlowKey) -> u64 {
    let mut h = mix64(basis);
    for &(f, mask) in fields {
        // A field whose bits the packet's kind does not own (shared
        // storage, `crate::field`) hashes as 0; the decision reads dl_type.
        let owned = key.owns(f);
        if f.shares_storage() {
            wc.mask_field(Field::DlType);
        }
        let m = if owned { mask & f.full_mask() } else { 0 };
        let old = wc.get(f);
        wc.set(f, old | m);
        h = mix_u128(h, key.get(f) & m);
    }
    h
}

/// The bucket a packet with `hash` goes to (weighted rendezvous hashing,
/// module doc), or `None` when no bucket has a weight.
pub fn select_bucket(buckets: &[Bucket], hash: u64) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for (i, b) in buckets.iter().enumerate() {
        if b.weight == 0 {
            continue;
        }
        let r = mix64(hash ^ mix64(u64::from(b.id)));
        // A uniform number in (0, 1): 53 bits, never 0 or 1.
        let u = ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let score = f64::from(b.weight) / -u.ln();
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(weights: &[(u32, u16)]) -> Vec<Bucket> {
        weights
            .iter()
            .map(|&(id, weight)| Bucket {
                id,
                weight,
                watch_port: None,
                watch_group: None,
                actions: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn selection_follows_weights_and_is_stable() {
        let three = buckets(&[(0, 1), (1, 1), (2, 2)]);
        let mut counts = [0usize; 3];
        for h in 0..40_000u64 {
            counts[select_bucket(&three, mix64(h)).unwrap()] += 1;
        }
        // Weights 1:1:2 within a few percent.
        for (i, want) in [(0, 10_000.0), (1, 10_000.0), (2, 20_000.0)] {
            let got = counts[i] as f64;
            assert!((got - want).abs() < want * 0.05, "bucket {i}: {counts:?}");
        }
        // Removing bucket 1 moves only what bucket 1 had.
        let two = buckets(&[(0, 1), (2, 2)]);
        for h in 0..10_000u64 {
            let h = mix64(h);
            let before = three[select_bucket(&three, h).unwrap()].id;
            let after = two[select_bucket(&two, h).unwrap()].id;
            if before != 1 {
                assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn a_group_built_in_code_prints() {
        let mut g = Group::new(3, GroupType::Select);
        g.method = SelectionMethod::Hash;
        g.fields = vec![(Field::NwSrc, 0xffff_ff00), (Field::TpDst, 0xffff)];
        g.buckets = buckets(&[(0, 1), (4, 2)]);
        assert_eq!(
            g.to_string(),
            "group_id=3,type=select,selection_method=hash,fields(nw_src=255.255.255.0,tp_dst),\
             bucket=bucket_id:0,actions=drop,bucket=bucket_id:4,weight:2,actions=drop"
        );
    }

    #[test]
    fn weightless_groups_choose_nothing() {
        assert_eq!(select_bucket(&[], 5), None);
        assert_eq!(select_bucket(&buckets(&[(0, 0), (1, 0)]), 5), None);
        assert_eq!(select_bucket(&buckets(&[(0, 0), (7, 3)]), 5), Some(1));
    }

    #[test]
    fn symmetric_hash_reads_the_five_tuple_both_ways_alike() {
        let mut k = FlowKey::ZERO;
        k.set(Field::DlType, 0x0800);
        k.set(Field::NwProto, 6);
        k.set(Field::NwSrc, 0x0a00_0001);
        k.set(Field::NwDst, 0x0a00_0002);
        k.set(Field::TpSrc, 1000);
        k.set(Field::TpDst, 80);
        let mut r = k;
        r.set(Field::NwSrc, 0x0a00_0002);
        r.set(Field::NwDst, 0x0a00_0001);
        r.set(Field::TpSrc, 80);
        r.set(Field::TpDst, 1000);
        let mut wc = FlowKey::ZERO;
        let h = hash_symmetric_l4(&k, 0, &mut wc);
        assert_eq!(h, hash_symmetric_l4(&r, 0, &mut { FlowKey::ZERO }));
        assert_ne!(h, hash_symmetric_l4(&k, 1, &mut { FlowKey::ZERO }));
        for f in [Field::NwSrc, Field::NwDst, Field::TpSrc, Field::TpDst] {
            assert_eq!(wc.get(f), f.full_mask(), "{f:?}");
        }
        let mut other = k;
        other.set(Field::TpSrc, 1001);
        assert_ne!(h, hash_symmetric_l4(&other, 0, &mut { FlowKey::ZERO }));
    }
}
