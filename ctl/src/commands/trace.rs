//! `oxvsctl trace --flows FILE 'SPEC'`: trace a packet through a flow file,
//! the way `ovs-appctl ofproto/trace` does.
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
//! Offline, the switch's port list is not known: `output:ALL` and `FLOOD`
//! reach the ports given with `--ports` (none by default).

use clap::Args;
use oxvs_pipeline::trace::{self as ptrace, TraceOptions};
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_pipeline::{extract, parse};

use super::{emit, Reported, UsageError};
use crate::flowfile::{self, Source};
use crate::spec;

#[derive(Debug, Args)]
pub struct Trace {
    /// The flow file; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    flows: String,
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
    pub fn exec(self) -> anyhow::Result<()> {
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
        let src = Source::read(&self.flows)?;
        let loaded = match flowfile::load(&src) {
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
        let env = XlateEnv { ports: self.ports };
        let tables = loaded.pipeline.snapshot();
        let report = ptrace::trace(&*tables, &key, &env, &opts);
        emit(&format!("{report}\n"))
    }
}
