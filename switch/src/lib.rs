//! # oxvs-switch: the datapath daemon's library
//!
//! `oxvs-switchd` moves real packets: it owns the ports (AF_XDP sockets on
//! veth/NIC interfaces, a VXLAN tunnel port), runs datapath threads that
//! feed batches through [`oxvs_pipeline::datapath::Datapath`] and transmit
//! what it decides, and serves the control socket. Everything that decides
//! what happens to a packet lives in `oxvs-pipeline`; this crate moves
//! bytes.
//!
//! | module | what |
//! |---|---|
//! | [`control`] | the control socket server |
//! | [`ctstate`] | the conntrack state file (saved at stop, restored at start) |
//! | [`engine`] | the switch: datapath threads, port add/remove, packet-ins, inject, stats |
//! | [`icmp_error`] | the ICMP errors the switch sends itself (port unreachable, too big, time exceeded): one builder |
//! | [`learn`] | learned flows from the datapath to the tables; the flow keeper (learning, expiry) |
//! | [`afxdp`] | AF_XDP sockets, each with its UMEM and frame pool (the crate's only `unsafe`) |
//! | [`metrics`] | `/metrics`: the switch's counters in the Prometheus text format |
//! | [`netdev`] | interface helpers (veth pairs, up, MTU, delete) |
//! | [`reject`] | the answer to a rejected packet (port unreachable) and the per-thread budget of answers |
//! | [`vxlan`] | the VXLAN tunnel port |
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod afxdp;
pub mod control;
pub mod ctstate;
pub mod engine;
pub mod icmp_error;
pub mod learn;
pub mod metrics;
pub mod netdev;
pub mod reject;
pub mod vxlan;
pub mod xdpprog;
