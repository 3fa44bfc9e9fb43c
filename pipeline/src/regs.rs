//! The registers and marks of the oxvs table plan, declared once by name.
//!
//! The tables are named in [`crate::names`]; what the flows of those tables
//! remember about a packet between tables (registers) and about a
//! connection between packets (`ct_mark`) is named here, Antrea-style
//! (`fields.go`: a field is a bit range of a register, a mark is a value of
//! a field). Nothing else in the project spells `reg0[0..3]` or
//! `NXM_NX_REG3[]`: flow builders ask a field or a mark for the text of a
//! match or a load.
//!
//! | item | what |
//! |---|---|
//! | [`RegField`] | a named bit range of a register or of `ct_mark` |
//! | [`RegField::matching`], [`RegField::load`] | the match (`reg3=0x7`, `reg0=0x2/0xf`) and the action (`load:0x7->NXM_NX_REG3[]`) for a value |
//! | [`RegMark`] | a named value of a field (`FROM_GATEWAY`: `reg0[0..3]` = 2) |
//! | [`FIELDS`], [`MARKS`] | every declaration, in register order |
//! | [`markdown_table`] | the register table of `docs/pipeline.md`, which a test keeps equal to these declarations |

use std::fmt::Write as _;

/// Where a field lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// The 32-bit packet register `regN`.
    Reg(u8),
    /// The connection's 32-bit `ct_mark` (in the pod traffic's zone).
    CtMark,
}

/// How a field's value is written in a `load` action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadFormat {
    /// `load:0x7->...`
    Hex,
    /// `load:3->...`: small enumerations (the packet source).
    Decimal,
}

/// A named bit range `[lo..=hi]` of a register or of `ct_mark`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegField {
    /// The name code uses (`PKT_SOURCE`).
    pub name: &'static str,
    pub store: Store,
    /// Lowest bit.
    pub lo: u8,
    /// Highest bit (inclusive).
    pub hi: u8,
    /// What the field holds, for people (`docs/pipeline.md`).
    pub doc: &'static str,
    pub load_format: LoadFormat,
}

impl RegField {
    /// The whole store, not a part of it.
    pub const fn is_whole(&self) -> bool {
        self.lo == 0 && self.hi == 31
    }

    /// The field's bits, in place.
    pub const fn mask(&self) -> u32 {
        let width = self.hi - self.lo + 1;
        let ones = if width >= 32 {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        ones << self.lo
    }

    /// The match field name: `reg3`, `ct_mark`.
    pub fn match_name(&self) -> String {
        match self.store {
            Store::Reg(n) => format!("reg{n}"),
            Store::CtMark => "ct_mark".into(),
        }
    }

    /// The NXM name with the bit range: `NXM_NX_REG0[0..3]`,
    /// `NXM_NX_REG0[16]`, `NXM_NX_REG1[]`, `NXM_NX_CT_MARK[0]`.
    pub fn nxm(&self) -> String {
        let base = match self.store {
            Store::Reg(n) => format!("NXM_NX_REG{n}"),
            Store::CtMark => "NXM_NX_CT_MARK".into(),
        };
        if self.is_whole() {
            format!("{base}[]")
        } else if self.lo == self.hi {
            format!("{base}[{}]", self.lo)
        } else {
            format!("{base}[{}..{}]", self.lo, self.hi)
        }
    }

    /// The field as `docs/pipeline.md` writes it: `reg0[0..3]`, `reg1`,
    /// `ct_mark[0]`.
    pub fn doc_name(&self) -> String {
        let base = self.match_name();
        if self.is_whole() {
            base
        } else if self.lo == self.hi {
            format!("{base}[{}]", self.lo)
        } else {
            format!("{base}[{}..{}]", self.lo, self.hi)
        }
    }

    /// The match on the field holding `value`: `reg3=0x7` for a whole
    /// register, `reg0=0x2/0xf` (value and mask in place) for a part.
    pub fn matching(&self, value: u32) -> String {
        let name = self.match_name();
        if self.is_whole() {
            format!("{name}={value:#x}")
        } else {
            let v = (value << self.lo) & self.mask();
            format!("{name}={v:#x}/{:#x}", self.mask())
        }
    }

    /// The action that writes `value` into the field:
    /// `load:0x7->NXM_NX_REG3[]`.
    pub fn load(&self, value: u32) -> String {
        match self.load_format {
            LoadFormat::Hex => format!("load:{value:#x}->{}", self.nxm()),
            LoadFormat::Decimal => format!("load:{value}->{}", self.nxm()),
        }
    }
}

/// A named value of a field (Antrea's `RegMark`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegMark {
    /// The name code uses (`FROM_GATEWAY`).
    pub name: &'static str,
    pub field: RegField,
    pub value: u32,
    /// What the value means, for people.
    pub doc: &'static str,
}

impl RegMark {
    /// The match on this mark: `reg0=0x2/0xf`.
    pub fn matching(&self) -> String {
        self.field.matching(self.value)
    }

    /// The action that sets this mark: `load:2->NXM_NX_REG0[0..3]`.
    pub fn load(&self) -> String {
        self.field.load(self.value)
    }
}

/// `reg0[0..3]`: where the packet entered the switch (the Classifier sets it).
pub const PKT_SOURCE: RegField = RegField {
    name: "PKT_SOURCE",
    store: Store::Reg(0),
    lo: 0,
    hi: 3,
    doc: "where the packet came from",
    load_format: LoadFormat::Decimal,
};
/// [`PKT_SOURCE`] = 1: from the tunnel (a remote node).
pub const FROM_TUNNEL: RegMark = RegMark {
    name: "FROM_TUNNEL",
    field: PKT_SOURCE,
    value: 1,
    doc: "tunnel",
};
/// [`PKT_SOURCE`] = 2: from the gateway (the host).
pub const FROM_GATEWAY: RegMark = RegMark {
    name: "FROM_GATEWAY",
    field: PKT_SOURCE,
    value: 2,
    doc: "gateway",
};
/// [`PKT_SOURCE`] = 3: from a local pod's port.
pub const FROM_POD: RegMark = RegMark {
    name: "FROM_POD",
    field: PKT_SOURCE,
    value: 3,
    doc: "local pod",
};

/// `reg0[16]`: the output port is known (in [`TARGET_OFPORT`]).
pub const OFPORT_FOUND: RegField = RegField {
    name: "OFPORT_FOUND",
    store: Store::Reg(0),
    lo: 16,
    hi: 16,
    doc: "the output port is known (in `reg1`)",
    load_format: LoadFormat::Hex,
};
/// [`OFPORT_FOUND`] = 1 (L2ForwardingCalc sets it, Output matches it).
pub const OFPORT_FOUND_MARK: RegMark = RegMark {
    name: "OFPORT_FOUND_MARK",
    field: OFPORT_FOUND,
    value: 1,
    doc: "known",
};

/// `reg0[19]`: the packet was routed (its MACs rewritten), so L3DecTTL
/// decrements its TTL. The agent's pipeline decides that by source
/// instead and never sets it; the Antrea-shaped benchmark workload
/// (`oxvs-bench`) does.
pub const REWRITE_MAC: RegField = RegField {
    name: "REWRITE_MAC",
    store: Store::Reg(0),
    lo: 19,
    hi: 19,
    doc:
        "the packet was routed, decrement its TTL (only the benchmark workload of `bench/` sets it)",
    load_format: LoadFormat::Hex,
};
/// [`REWRITE_MAC`] = 1.
pub const REWRITE_MAC_MARK: RegMark = RegMark {
    name: "REWRITE_MAC_MARK",
    field: REWRITE_MAC,
    value: 1,
    doc: "routed",
};

/// `reg0[20]`: the packet opens a connection to a Service from outside
/// the node's pods (a NodePort, external or load balancer address with
/// `externalTrafficPolicy: Cluster`): ServiceSNAT SNATs it to the node's
/// gateway address, so that the endpoint's reply comes back through this
/// node (the Service proxy's, `agent/src/proxy.rs`).
pub const SERVICE_SNAT: RegField = RegField {
    name: "SERVICE_SNAT",
    store: Store::Reg(0),
    lo: 20,
    hi: 20,
    doc: "a new Service connection from outside the node that ServiceSNAT SNATs to the gateway address",
    load_format: LoadFormat::Hex,
};
/// [`SERVICE_SNAT`] = 1 (ServiceLB sets it, ServiceSNAT matches it).
pub const SERVICE_SNAT_MARK: RegMark = RegMark {
    name: "SERVICE_SNAT_MARK",
    field: SERVICE_SNAT,
    value: 1,
    doc: "SNAT it",
};

/// `reg0[21]`: the IPv6 neighbour responder is turning a solicitation
/// into its answer (ARPResponder rewrites the packet into an
/// advertisement and resubmits it to itself to write the target
/// link-layer address, which OVS lets a flow set only on an
/// advertisement).
pub const ND_REPLY: RegField = RegField {
    name: "ND_REPLY",
    store: Store::Reg(0),
    lo: 21,
    hi: 21,
    doc: "the neighbour responder's advertisement in the making",
    load_format: LoadFormat::Hex,
};
/// [`ND_REPLY`] = 1.
pub const ND_REPLY_MARK: RegMark = RegMark {
    name: "ND_REPLY_MARK",
    field: ND_REPLY,
    value: 1,
    doc: "answering",
};

/// `reg1`: the output port (L2ForwardingCalc writes it, Output reads it).
pub const TARGET_OFPORT: RegField = RegField {
    name: "TARGET_OFPORT",
    store: Store::Reg(1),
    lo: 0,
    hi: 31,
    doc: "the output port",
    load_format: LoadFormat::Hex,
};

/// `reg3`: the NetworkPolicy ingress rule that allowed the packet (its id).
pub const INGRESS_RULE: RegField = RegField {
    name: "INGRESS_RULE",
    store: Store::Reg(3),
    lo: 0,
    hi: 31,
    doc: "the ingress NetworkPolicy rule that allowed the packet (0: none)",
    load_format: LoadFormat::Hex,
};

/// `reg5`: the NetworkPolicy egress rule that allowed the packet (its id).
pub const EGRESS_RULE: RegField = RegField {
    name: "EGRESS_RULE",
    store: Store::Reg(5),
    lo: 0,
    hi: 31,
    doc: "the egress NetworkPolicy rule that allowed the packet (0: none)",
    load_format: LoadFormat::Hex,
};

/// `ct_mark[0]`: the connection entered the switch from the gateway.
pub const CT_FROM_GATEWAY: RegField = RegField {
    name: "CT_FROM_GATEWAY",
    store: Store::CtMark,
    lo: 0,
    hi: 0,
    doc: "the connection entered the switch from the gateway (the host): its replies go back there",
    load_format: LoadFormat::Hex,
};
/// [`CT_FROM_GATEWAY`] = 1 (ConntrackCommit sets it, L3Forwarding
/// matches it on replies).
pub const FROM_GATEWAY_CT_MARK: RegMark = RegMark {
    name: "FROM_GATEWAY_CT_MARK",
    field: CT_FROM_GATEWAY,
    value: 1,
    doc: "from the gateway",
};

/// `reg6`: the endpoint address a Service connection goes to (the Service
/// proxy's session affinity: a group bucket or a learned SessionAffinity
/// flow writes it, EndpointDNAT reads it).
pub const ENDPOINT_IP: RegField = RegField {
    name: "ENDPOINT_IP",
    store: Store::Reg(6),
    lo: 0,
    hi: 31,
    doc: "the endpoint address a Service connection goes to (session affinity)",
    load_format: LoadFormat::Hex,
};

/// `reg7[0..15]`: the endpoint port, with [`ENDPOINT_IP`].
pub const ENDPOINT_PORT: RegField = RegField {
    name: "ENDPOINT_PORT",
    store: Store::Reg(7),
    lo: 0,
    hi: 15,
    doc: "the endpoint port a Service connection goes to (session affinity)",
    load_format: LoadFormat::Hex,
};

/// `reg7[16..18]`: where session affinity stands for the packet.
pub const AFFINITY: RegField = RegField {
    name: "AFFINITY",
    store: Store::Reg(7),
    lo: 16,
    hi: 18,
    doc: "session affinity: the client's endpoint is known, or just chosen",
    load_format: LoadFormat::Hex,
};
/// [`AFFINITY`] = 1: a learned SessionAffinity flow knew the endpoint.
pub const AFFINITY_HIT: RegMark = RegMark {
    name: "AFFINITY_HIT",
    field: AFFINITY,
    value: 1,
    doc: "the client's endpoint was learned",
};
/// [`AFFINITY`] = 2: a group bucket chose the endpoint; ServiceLB learns it.
pub const AFFINITY_LEARN: RegMark = RegMark {
    name: "AFFINITY_LEARN",
    field: AFFINITY,
    value: 2,
    doc: "the endpoint was just chosen: learn it",
};

/// `reg8`-`reg11`: an IPv6 endpoint address a Service connection goes
/// to (session affinity, as [`ENDPOINT_IP`] for IPv4), most significant
/// 32 bits in `reg8`.
pub const ENDPOINT_IP6: [RegField; 4] = [
    endpoint_ip6_word(
        "ENDPOINT_IP6_0",
        8,
        "the IPv6 endpoint address a Service connection goes to, bits 127-96 (session affinity)",
    ),
    endpoint_ip6_word("ENDPOINT_IP6_1", 9, "the IPv6 endpoint address, bits 95-64"),
    endpoint_ip6_word(
        "ENDPOINT_IP6_2",
        10,
        "the IPv6 endpoint address, bits 63-32",
    ),
    endpoint_ip6_word("ENDPOINT_IP6_3", 11, "the IPv6 endpoint address, bits 31-0"),
];

/// One whole register of [`ENDPOINT_IP6`].
const fn endpoint_ip6_word(name: &'static str, reg: u8, doc: &'static str) -> RegField {
    RegField {
        name,
        store: Store::Reg(reg),
        lo: 0,
        hi: 31,
        doc,
        load_format: LoadFormat::Hex,
    }
}

/// `ct_mark[1]`: the connection is SNATed in the SNAT zone (the Service
/// proxy's ServiceSNAT sets it on the pod traffic zone's connection, so
/// that every later packet of the connection is SNATed too).
pub const CT_SERVICE_SNAT: RegField = RegField {
    name: "CT_SERVICE_SNAT",
    store: Store::CtMark,
    lo: 1,
    hi: 1,
    doc: "the connection is SNATed by ServiceSNAT (its later packets are too)",
    load_format: LoadFormat::Hex,
};
/// [`CT_SERVICE_SNAT`] = 1.
pub const SERVICE_SNAT_CT_MARK: RegMark = RegMark {
    name: "SERVICE_SNAT_CT_MARK",
    field: CT_SERVICE_SNAT,
    value: 1,
    doc: "SNATed",
};

/// Every field, in register order.
pub const FIELDS: &[RegField] = &[
    PKT_SOURCE,
    OFPORT_FOUND,
    REWRITE_MAC,
    SERVICE_SNAT,
    ND_REPLY,
    TARGET_OFPORT,
    INGRESS_RULE,
    EGRESS_RULE,
    ENDPOINT_IP,
    ENDPOINT_PORT,
    AFFINITY,
    ENDPOINT_IP6[0],
    ENDPOINT_IP6[1],
    ENDPOINT_IP6[2],
    ENDPOINT_IP6[3],
    CT_FROM_GATEWAY,
    CT_SERVICE_SNAT,
];

/// Every mark, in field order.
pub const MARKS: &[RegMark] = &[
    FROM_TUNNEL,
    FROM_GATEWAY,
    FROM_POD,
    OFPORT_FOUND_MARK,
    REWRITE_MAC_MARK,
    SERVICE_SNAT_MARK,
    ND_REPLY_MARK,
    AFFINITY_HIT,
    AFFINITY_LEARN,
    FROM_GATEWAY_CT_MARK,
    SERVICE_SNAT_CT_MARK,
];

/// The register table of `docs/pipeline.md`: one row per field, with its
/// marks.
pub fn markdown_table() -> String {
    let mut s = String::from("| field | name | meaning | marks |\n|---|---|---|---|\n");
    for f in FIELDS {
        let marks: Vec<String> = MARKS
            .iter()
            .filter(|m| m.field == *f)
            .map(|m| format!("`{}` = {} ({})", m.name, m.value, m.doc))
            .collect();
        let _ = writeln!(
            s,
            "| `{}` | `{}` | {} | {} |",
            f.doc_name(),
            f.name,
            f.doc,
            marks.join(", ")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_of_matches_and_loads() {
        assert_eq!(FROM_GATEWAY.matching(), "reg0=0x2/0xf");
        assert_eq!(FROM_POD.load(), "load:3->NXM_NX_REG0[0..3]");
        assert_eq!(OFPORT_FOUND_MARK.matching(), "reg0=0x10000/0x10000");
        assert_eq!(OFPORT_FOUND_MARK.load(), "load:0x1->NXM_NX_REG0[16]");
        assert_eq!(TARGET_OFPORT.load(4), "load:0x4->NXM_NX_REG1[]");
        assert_eq!(TARGET_OFPORT.nxm(), "NXM_NX_REG1[]");
        assert_eq!(INGRESS_RULE.matching(7), "reg3=0x7");
        assert_eq!(EGRESS_RULE.load(7), "load:0x7->NXM_NX_REG5[]");
        assert_eq!(FROM_GATEWAY_CT_MARK.matching(), "ct_mark=0x1/0x1");
        assert_eq!(FROM_GATEWAY_CT_MARK.load(), "load:0x1->NXM_NX_CT_MARK[0]");
        assert_eq!(REWRITE_MAC_MARK.matching(), "reg0=0x80000/0x80000");
    }

    #[test]
    fn fields_do_not_overlap_and_marks_fit() {
        for (i, a) in FIELDS.iter().enumerate() {
            for b in &FIELDS[i + 1..] {
                assert!(
                    a.store != b.store || a.mask() & b.mask() == 0,
                    "{} and {} overlap",
                    a.name,
                    b.name
                );
            }
        }
        for m in MARKS {
            assert!(FIELDS.contains(&m.field), "{}: undeclared field", m.name);
            assert_eq!(
                (m.value << m.field.lo) & !m.field.mask(),
                0,
                "{} does not fit",
                m.name
            );
        }
    }

    /// `docs/pipeline.md` shows exactly these declarations.
    #[test]
    fn docs_pipeline_register_table_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/pipeline.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let table = markdown_table();
        assert!(
            doc.contains(&table),
            "docs/pipeline.md, \"Registers\", must hold this table (from pipeline/src/regs.rs):\n{table}"
        );
    }
}
