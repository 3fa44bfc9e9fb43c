//! NetworkPolicy -> flows (pure). CONTRACT, implementation pending.
//!
//! See `policy_flows`. Tables, registers and cookies follow `crate::flows`.

use std::net::Ipv4Addr;

use crate::model::{ClusterState, ObjKey};

/// A pod attached to this node (the policies' "applied-to" candidates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPod {
    pub namespace: String,
    pub name: String,
    pub ip: Ipv4Addr,
    pub ofport: u32,
}

/// Ingress or egress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

/// What a rule id (conjunction id, cookie low bits, reg3/reg5 value) stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleRef {
    pub id: u32,
    pub policy: ObjKey,
    pub uid: String,
    pub direction: Direction,
    /// Index of the rule in `spec.ingress` / `spec.egress`.
    pub index: usize,
}

/// The policy part of a node's flows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyFlows {
    /// Flow lines (tables EgressRule..EgressMetric, IngressRule..IngressMetric).
    pub flows: Vec<String>,
    /// Every rule that has an id, by id.
    pub rules: Vec<RuleRef>,
}

/// The flows that enforce every NetworkPolicy of `state` on the `local` pods.
pub fn policy_flows(state: &ClusterState, local: &[LocalPod]) -> PolicyFlows {
    let _ = (state, local);
    PolicyFlows::default()
}
