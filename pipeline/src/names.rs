//! The oxvs table plan: table numbers and names, in one registry.
//!
//! Flow text may say `table=SpoofGuard` instead of `table=10`, and dumps and
//! traces print the names. These are the Antrea-style stages of
//! `docs/pipeline.md`; nothing else in the project writes a table number.

/// A table of the oxvs pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableDef {
    pub id: u8,
    pub name: &'static str,
}

macro_rules! tables {
    ($($konst:ident = $id:literal, $name:literal;)*) => {
        $(
            #[doc = concat!("Table ", stringify!($id), ": `", $name, "`.")]
            pub const $konst: TableDef = TableDef { id: $id, name: $name };
        )*
        /// Every table of the plan, in pipeline order.
        pub const ALL: &[TableDef] = &[$($konst),*];
    };
}

tables! {
    CLASSIFIER = 0, "Classifier";
    SPOOF_GUARD = 10, "SpoofGuard";
    ARP_RESPONDER = 20, "ARPResponder";
    CONNTRACK_ZONE = 30, "ConntrackZone";
    CONNTRACK_STATE = 31, "ConntrackState";
    SESSION_AFFINITY = 34, "SessionAffinity";
    SERVICE_LB = 35, "ServiceLB";
    ENDPOINT_DNAT = 36, "EndpointDNAT";
    EGRESS_RULE = 40, "EgressRule";
    EGRESS_DEFAULT_RULE = 41, "EgressDefaultRule";
    EGRESS_METRIC = 45, "EgressMetric";
    L3_FORWARDING = 50, "L3Forwarding";
    L3_DEC_TTL = 55, "L3DecTTL";
    SERVICE_SNAT = 57, "ServiceSNAT";
    L2_FORWARDING_CALC = 60, "L2ForwardingCalc";
    INGRESS_RULE = 70, "IngressRule";
    INGRESS_DEFAULT_RULE = 71, "IngressDefaultRule";
    INGRESS_METRIC = 75, "IngressMetric";
    CONNTRACK_COMMIT = 80, "ConntrackCommit";
    OUTPUT = 90, "Output";
}

/// Maps table numbers to names and back.
#[derive(Clone, Debug)]
pub struct TableNames {
    names: Vec<Option<String>>,
}

impl Default for TableNames {
    /// The oxvs table plan.
    fn default() -> Self {
        let mut t = TableNames::empty();
        for d in ALL {
            t.set(d.id, d.name);
        }
        t
    }
}

impl TableNames {
    /// No names at all (tables print as numbers).
    pub fn empty() -> Self {
        TableNames {
            names: vec![None; 256],
        }
    }

    /// Names table `id`.
    pub fn set(&mut self, id: u8, name: &str) {
        self.names[id as usize] = Some(name.to_string());
    }

    /// The name of table `id`, if it has one.
    pub fn name(&self, id: u8) -> Option<&str> {
        self.names[id as usize].as_deref()
    }

    /// The number of the table called `name` (exact, case-sensitive).
    pub fn id(&self, name: &str) -> Option<u8> {
        self.names
            .iter()
            .position(|n| n.as_deref() == Some(name))
            .map(|i| i as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_is_ordered_and_unique() {
        for w in ALL.windows(2) {
            assert!(w[0].id < w[1].id);
        }
        let n = TableNames::default();
        assert_eq!(n.id("SpoofGuard"), Some(10));
        assert_eq!(n.name(90), Some("Output"));
        assert_eq!(n.name(3), None);
    }
}
