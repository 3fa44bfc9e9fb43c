//! # oxvs-agent: the node agent
//!
//! - [`agent`]: the agent's state ([`agent::Agent`]), the CNI verbs on
//!   `/run/oxvs/cni.sock` (ADD, DEL, CHECK, GC, STATUS; [`agent::cni`])
//!   and the node's convergence with the switch.
//! - [`api`]: the API socket `/run/oxvs/agent.sock` (`info`, `pod`,
//!   `traceflow`).
//! - [`socket_server`]: the one server of both line sockets (CNI, API):
//!   framing, size limits, one or many requests per connection; each
//!   socket gives only its handler.
//! - [`metrics`]: the agent's `/metrics`.
//! - [`listen`]: every listener's accept loop, connection cap, busy answer
//!   and idle timeout (the line sockets' and `/metrics`).
//! - [`source`]: where the cluster state comes from (the Kubernetes API or a
//!   manifest directory); [`model`]: that state, reduced to what decides a
//!   node's flows.
//! - [`desired`]: the node's desired flow set, one pure function of its inputs.
//! - [`flows`]: the node's and each pod's flows (pure).
//! - [`policy`]: NetworkPolicy -> flows (pure).
//! - [`cookie`]: the cookie layout: which feature and object a flow is for.
//! - [`priority`]: the flow priorities of each table, by meaning.
//! - [`nodes`]: which Node objects are believed (pure checks of podCIDR
//!   and InternalIP before they become routes and tunnel flows).
//! - [`ipam`]: addresses from the node's pod CIDR, persisted on disk;
//!   [`state`]: the records of attached pods, persisted on disk.
//! - [`podnet`]: pod interfaces over netlink (veth, netns, address, routes);
//!   [`hostnet`]: the host side of pod egress (forwarding, masquerade).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod api;
pub mod cookie;
pub mod desired;
pub mod flows;
pub mod hostnet;
pub mod ipam;
pub mod listen;
pub mod metrics;
pub mod model;
pub mod nodes;
pub mod podnet;
pub mod policy;
pub mod priority;
pub mod proxy;
pub mod socket_server;
pub mod source;
pub mod state;

#[cfg(test)]
mod golden_tests;
