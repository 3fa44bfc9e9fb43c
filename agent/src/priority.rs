//! Flow priorities, by table: what each level of each table means.
//!
//! Within a table a packet takes the highest-priority flow that matches, so
//! a level is a statement about precedence ("the tunnel guard's drop beats
//! `+est`", "an isolation drop loses to every allow"). Every flow the agent
//! installs takes its priority from here; [`DEFAULT`] is every table's
//! last resort.

/// Every table's priority-0 flow: what a packet no other flow matched does
/// (go on to the next stage, or drop where the table is a gate).
pub const DEFAULT: u16 = 0;

/// Table `Classifier` (0): where a packet came from.
pub mod classifier {
    /// The gateway port.
    pub const GATEWAY: u16 = 200;
    /// The tunnel port, from a known node's address (one flow per node).
    pub const KNOWN_NODE: u16 = 200;
    /// A pod's port.
    pub const POD: u16 = 190;
    /// The tunnel guard: the tunnel port from any other address, dropped
    /// (below the per-node flows).
    pub const UNKNOWN_TUNNEL_SOURCE: u16 = 190;
}

/// Table `SpoofGuard` (10).
pub mod spoof_guard {
    /// IPv6 Neighbour Discovery that may pass (to the responder): the
    /// gateway's, a pod's solicitations from its own addresses and
    /// advertisements of its own addresses with its own MAC.
    pub const ND_ALLOW: u16 = 220;
    /// Any other Neighbour Discovery, router solicitation/advertisement or
    /// redirect from a pod: dropped, whatever its source address.
    pub const ND_DENY: u16 = 210;
    /// Traffic that may pass: the gateway's, a pod's own MAC and IP.
    pub const ALLOW: u16 = 200;
}

/// Table `ARPResponder` (20).
pub mod arp_responder {
    /// The IPv6 responder's answer in the making (resubmitted, marked).
    pub const ND_REPLY: u16 = 210;
    /// Requests the switch answers in place (the gateway, remote gateways).
    pub const ANSWER: u16 = 200;
    /// A pod's gratuitous ARP (target = its own address): to the host.
    pub const GRATUITOUS: u16 = 110;
    /// ARP addressed to a local pod or the gateway: to its port.
    pub const TO_PORT: u16 = 100;
}

/// Table `ConntrackZone` (30).
pub mod conntrack_zone {
    /// Hairpin answers: un-SNATed first ([`crate::proxy`]).
    pub const HAIRPIN: u16 = 210;
    /// Packets to the gateway address: un-SNATed first, if they answer a
    /// connection from outside the node SNATed to it ([`crate::proxy`]).
    pub const SNAT_REPLY: u16 = 210;
    /// IP traffic goes through conntrack.
    pub const TRACK: u16 = 200;
}

/// Table `ConntrackState` (31).
pub mod conntrack_state {
    /// The tunnel guard: a pod's datagram to a node's VXLAN port, dropped
    /// whatever its connection state.
    pub const TUNNEL_GUARD: u16 = 220;
    /// `+inv`: dropped.
    pub const INVALID: u16 = 210;
    /// `+est`, `+rel`: skip egress policy.
    pub const ESTABLISHED: u16 = 200;
}

/// Tables `EgressRule` (40) and `IngressRule` (70).
pub mod policy_rule {
    /// `+est`, `+rel` skip the ingress rules (IngressRule only); so does
    /// IPv6 Neighbour Discovery (never tracked, as ARP is not IP).
    pub const ESTABLISHED: u16 = 210;
    /// Traffic between a pod and its own node: exempt from policy.
    pub const NODE_EXEMPTION: u16 = 205;
    /// The flows of a rule with a single dimension (no conjunction).
    pub const PLAIN: u16 = 201;
    /// Conjunction clauses and `conj_id` flows.
    pub const CONJUNCTION: u16 = 200;
}

/// Tables `EgressDefaultRule` (41) and `IngressDefaultRule` (71).
pub mod policy_default_rule {
    /// The isolation drop of a pod some policy selects.
    pub const ISOLATION: u16 = 200;
}

/// Tables `EgressMetric` (45) and `IngressMetric` (75).
pub mod policy_metric {
    /// The flow of one rule, whose counters are the rule's packets.
    pub const RULE: u16 = 200;
}

/// Table `L3Forwarding` (50).
pub mod l3_forwarding {
    /// A pod reaching itself through a Service: SNATed ([`crate::proxy`]).
    pub const HAIRPIN: u16 = 205;
    /// Replies of connections that entered from the gateway: back to it.
    pub const REPLY_TO_GATEWAY: u16 = 210;
    /// Routed to a local pod or a remote node's pod CIDR.
    pub const ROUTE: u16 = 200;
}

/// Table `L3DecTTL` (55).
pub mod l3_dec_ttl {
    /// From the gateway: the host already routed it.
    pub const FROM_GATEWAY: u16 = 210;
    /// Every other IP packet loses one TTL.
    pub const DEC_TTL: u16 = 200;
}

/// Table `L2ForwardingCalc` (60).
pub mod l2_forwarding_calc {
    /// A known destination MAC: its port.
    pub const KNOWN_MAC: u16 = 200;
}

/// Table `ConntrackCommit` (80).
pub mod conntrack_commit {
    /// Hairpin packets, committed in both zones already ([`crate::proxy`]).
    pub const HAIRPIN: u16 = 220;
    /// New connections from the gateway: committed with the from-gateway mark.
    pub const FROM_GATEWAY: u16 = 210;
    /// Other new connections: committed.
    pub const COMMIT: u16 = 200;
}

/// Table `Output` (90).
pub mod output {
    /// The output port is the input port (hairpin, [`crate::proxy`]).
    pub const HAIRPIN: u16 = 210;
    /// The output port is known: output.
    pub const KNOWN_PORT: u16 = 200;
}

/// ServiceLB (the proxy).
pub mod service_lb {
    /// `externalTrafficPolicy: Local`: a connection from this node's own
    /// pods to a NodePort or external address may go to any endpoint
    /// (beats the local-endpoints flow).
    pub const FROM_LOCAL_PODS: u16 = 210;
    /// A new connection to a Service port: its group (or a drop).
    pub const SERVICE: u16 = 200;
    /// Session affinity, added to the frontend flow's priority: the
    /// client's learned endpoint (`reg7[16..18]=1`).
    pub const AFFINITY_HIT: u16 = 2;
    /// Session affinity, added: the endpoint the group just chose
    /// (`reg7[16..18]=2`), learned.
    pub const AFFINITY_LEARN: u16 = 1;
}

/// Table `SessionAffinity` (34).
pub mod session_affinity {
    /// A learned flow: this client's endpoint.
    pub const LEARNED: u16 = 200;
}

/// Table `EndpointDNAT` (36).
pub mod endpoint_dnat {
    /// The endpoint, for a connection from the gateway (marked).
    pub const FROM_GATEWAY: u16 = 210;
    /// The endpoint.
    pub const ENDPOINT: u16 = 200;
    /// A learned endpoint that is gone: choose again.
    pub const STALE: u16 = 100;
}

/// Table `ServiceSNAT` (57).
pub mod service_snat {
    /// A new connection marked for SNAT: to the gateway address.
    pub const SNAT: u16 = 200;
}
