//! # oxvs-agent: the node agent
//!
//! - [`ipam`]: addresses from the node's pod CIDR, persisted on disk.
//! - [`podnet`]: pod interfaces over netlink (veth, netns, address, routes).
//! - [`cookie`]: the cookie layout: which feature and object a flow is for.
//! - [`desired`]: the node's desired flow set, one pure function of its inputs.
//! - [`flows`]: the node's and each pod's flows (pure).
//! - [`priority`]: the flow priorities of each table, by meaning.
//! - [`nodes`]: which Node objects are believed (pure checks of podCIDR
//!   and InternalIP before they become routes and tunnel flows).
//! - [`listen`]: the listeners' connection cap, busy answer and idle timeout.
//! - [`server`]: the CNI server on `/run/oxvs/cni.sock` (ADD, DEL, CHECK,
//!   GC, STATUS) and the state it keeps.

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
pub mod server;
pub mod source;
pub mod state;

#[cfg(test)]
mod golden_tests;
