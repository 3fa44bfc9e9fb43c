//! `oxvsctl trace [--flows FILE] 'SPEC'`: trace a packet the way
//! `ovs-appctl ofproto/trace` does: through the switch's flows (online,
//! without `--flows`; `--inject` also sends the packet through the real
//! datapath) or through a flow file loaded in-process (offline).
//!
//! The packet is given as a packet spec (`in_port=3,tcp,nw_dst=10.244.0.4,
//! tp_dst=80`: named fields get the values, every other field is zero) or
//! as raw bytes (`--packet HEX --in-port N`). The explanation is the
//! pipeline's own ([`oxvs_pipeline::trace`]), which runs the real slow path:
//! for each pass through the tables the steps, the final flow, the megaflow
//! and a `Datapath actions:` line. A `ct(table=T)` recirculates; the next
//! pass resumes at table T with the conntrack state taken from the next
//! `--ct-next` (default `trk,new`, as in OVS).
//!
//! Offline, `--groups FILE` loads a group file with the flows (groups
//! first, in one bundle), for their `group:ID` actions.
//!
//! Offline, the switch's port list is not known: `output:ALL` and `FLOOD`
//! reach the ports given with `--ports` (none by default). With `--ports`,
//! an output to a port not listed is "Nonexistent output port" and sends
//! nothing, as in the switch and in OVS; without, only port 0 is.
//!
//! The text is the same online and offline: the pipeline's rendering of its
//! trace (online, the switch's `text`). `--json` prints the `trace` result
//! ([`oxvs_api::TraceResult`]: that text and the structured trace), online
//! as the switch sent it, offline made the same way.

use clap::Args;
use oxvs_pipeline::trace::{self as ptrace, TraceOptions};
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_pipeline::{extract, parse};

use super::online::Ctx;
use super::{emit, Reported, UsageError};
use crate::flowfile::{self, Source};
use crate::spec;

#[derive(Debug, Args)]
pub struct Trace {
    /// Offline: the flow file (`-` reads standard input). Without it the
    /// switch traces through its own flows.
    #[arg(long, value_name = "FILE")]
    flows: Option<String>,
    /// Offline: a group file (`ovs-ofctl add-groups` text) loaded with the
    /// flows, for their `group:ID` actions.
    #[arg(long, value_name = "FILE", requires = "flows")]
    groups: Option<String>,
    /// Online: also send the packet through the switch's datapath.
    #[arg(long, conflicts_with = "flows")]
    inject: bool,
    /// Conntrack state for the next recirculation after `ct` (repeatable,
    /// one per `ct`, in order): `trk,new`, `trk,est`, `est|rpl|trk`...
    #[arg(long = "ct-next", value_name = "STATE", value_parser = spec::parse_ct_state)]
    ct_next: Vec<u32>,
    /// Print table names next to table numbers.
    #[arg(long)]
    names: bool,
    /// The switch's OpenFlow ports, for `output:ALL` / `FLOOD` (`1,2,3`).
    #[arg(long, value_name = "N,N,...", value_delimiter = ',')]
    ports: Vec<u32>,
    /// The packet as hex bytes (an Ethernet frame) instead of a spec.
    #[arg(
        long,
        value_name = "HEX",
        requires = "in_port",
        conflicts_with = "spec"
    )]
    packet: Option<String>,
    /// The OpenFlow port the `--packet` arrived on.
    #[arg(long, value_name = "N", requires = "packet")]
    in_port: Option<u32>,
    /// The packet spec: `in_port=3,tcp,nw_src=10.244.0.3,nw_dst=10.244.0.4,tp_dst=80`.
    #[arg(required_unless_present = "packet", value_name = "SPEC")]
    spec: Option<String>,
}

impl Trace {
    pub fn exec(self, online: &Ctx) -> anyhow::Result<()> {
        if self.flows.is_none() {
            return self.exec_online(online);
        }
        // The packet first: it does not depend on the flows.
        let key = match (&self.spec, &self.packet, self.in_port) {
            (Some(text), _, _) => parse::parse_packet_spec(text, &flowfile::parse_context())
                .map_err(|e| anyhow::anyhow!("bad packet spec '{text}': {e}"))?,
            (None, Some(hex), Some(port)) => {
                let frame = spec::parse_hex_packet(hex)
                    .map_err(|e| anyhow::anyhow!("bad --packet: {e}"))?;
                extract::extract(&frame, port)
            }
            _ => {
                return Err(
                    UsageError("give a packet spec, or --packet HEX --in-port N".into()).into(),
                )
            }
        };
        let src = Source::read(self.flows.as_deref().unwrap_or("-"))?;
        let groups = self.groups.as_deref().map(Source::read).transpose()?;
        let loaded = match flowfile::load_with_groups(&src, groups.as_ref()) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e}");
                return Err(Reported.into());
            }
        };
        let opts = TraceOptions {
            ct_next: self.ct_next,
            names: self.names.then(|| loaded.pipeline.names().clone()),
            ..TraceOptions::default()
        };
        // Without --ports the ports are not known (a non-empty list is).
        let env = XlateEnv {
            ports: self.ports,
            ..XlateEnv::default()
        };
        let tables = loaded.pipeline.snapshot();
        let report = ptrace::trace(&*tables, &key, &env, &opts);
        if online.json {
            let r = oxvs_api::TraceResult::from_report(&report, false);
            return emit(&format!("{}\n", serde_json::to_value(&r)?));
        }
        emit(&format!("{report}\n"))
    }

    /// Asks the switch (its ports are known there: `--ports` is offline only).
    fn exec_online(self, ctx: &Ctx) -> anyhow::Result<()> {
        if !self.ports.is_empty() {
            return Err(UsageError(
                "--ports is for offline traces (--flows); the switch knows its ports".into(),
            )
            .into());
        }
        if let Some(hex) = &self.packet {
            spec::parse_hex_packet(hex).map_err(|e| anyhow::anyhow!("bad --packet: {e}"))?;
        }
        let ct_next = self.ct_next.iter().map(|s| ct_state_text(*s)).collect();
        let v = ctx.call(&oxvs_api::Request::Trace(oxvs_api::TraceRequest {
            spec: self.spec,
            packet_hex: self.packet,
            in_port: self.in_port,
            ct_next,
            names: self.names,
            inject: self.inject,
        }))?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: oxvs_api::TraceResult = serde_json::from_value(v)?;
        let mut text = format!("{}\n", r.text);
        if r.injected {
            text.push_str("\nInjected: the packet was sent through the datapath.\n");
        }
        emit(&text)
    }
}

/// `trk,new`-style text of conntrack state bits.
fn ct_state_text(state: u32) -> String {
    oxvs_pipeline::field::ct_state::NAMES
        .iter()
        .filter(|(_, bit)| state & bit != 0)
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(",")
}
