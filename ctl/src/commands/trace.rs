//! `oxvsctl trace --flows FILE 'SPEC'`: trace a packet through a flow file,
//! the way `ovs-appctl ofproto/trace` does.
//!
//! The packet is given as a packet spec (`in_port=3,tcp,nw_dst=10.244.0.4,
//! tp_dst=80`: named fields get the values, every other field is zero) or
//! as raw bytes (`--packet HEX --in-port N`). The output ends, for each pass
//! through the tables, in a `Datapath actions:` line; a `ct(table=T)`
//! recirculates, and the next pass resumes at table T with the conntrack
//! state taken from the next `--ct-next` (default `trk,new`, as in OVS).
//!
//! The per-pass explanation comes from the pipeline's slow path
//! ([`xlate::translate`]): the flows that matched, in order, then the
//! megaflow and the datapath actions.

use std::fmt::Write as _;

use clap::Args;
use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::Match;
use oxvs_pipeline::names::TableNames;
use oxvs_pipeline::odp::{self, DpAction};
use oxvs_pipeline::tables::TableSet;
use oxvs_pipeline::xlate::{self, XlateEnv};
use oxvs_pipeline::{extract, parse, print, FlowKey};

use super::{Reported, UsageError};
use crate::flowfile::{self, Source};
use crate::spec;

/// Most passes through the tables one trace follows (a flow file that
/// recirculates forever stops here).
const MAX_PASSES: usize = 16;

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
        let names = self.names.then(|| loaded.pipeline.names().clone());
        let tables = loaded.pipeline.snapshot();
        print!("{}", trace(&tables, key, &self.ct_next, names.as_ref()));
        Ok(())
    }
}

/// The whole trace of `key`: one section per pass through the tables.
fn trace(tables: &TableSet, key: FlowKey, ct_next: &[u32], names: Option<&TableNames>) -> String {
    let env = XlateEnv::default();
    let mut out = String::new();
    let mut key = key;
    let mut ct_states = ct_next.iter().copied();
    for pass in 0..MAX_PASSES {
        let t = xlate::translate(tables, &key, &env);
        let _ = writeln!(out, "Flow: {}", format_key(&key));
        out.push('\n');
        let _ = writeln!(out, "bridge(\"oxvs\")\n-------------------");
        for rule in &t.rules {
            let f = &rule.flow;
            let table = match names.and_then(|n| n.name(f.table)) {
                Some(name) => format!("{}. {name}", f.table),
                None => format!("{}.", f.table),
            };
            let m = print::format_match(&f.matches);
            let _ = writeln!(
                out,
                "{table:>3} {m}{}priority {}, cookie {:#x}",
                if m.is_empty() { "" } else { ", " },
                f.priority,
                f.cookie
            );
            let _ = writeln!(out, "    {}", print::format_actions(&f.actions, names));
        }
        out.push('\n');
        let megaflow = Match {
            value: key.and(&t.wildcards),
            mask: t.wildcards,
        };
        let _ = writeln!(out, "Megaflow: {}", print::format_match(&megaflow));
        let _ = writeln!(
            out,
            "Datapath actions: {}",
            odp::format_dp_actions(&t.actions)
        );
        let Some(next) = next_pass(&key, &t.actions, &mut ct_states) else {
            break;
        };
        if pass + 1 == MAX_PASSES {
            let _ = writeln!(out, "\n(stopped after {MAX_PASSES} recirculations)");
            break;
        }
        let state = next.get(Field::CtState) as u32;
        let _ = writeln!(
            out,
            "\n{bar}\nrecirc({:#x}) - resume conntrack with ct_state={}\n{bar}\n",
            next.get(Field::RecircId),
            ct_state_text(state),
            bar = "=".repeat(79)
        );
        key = next;
    }
    out
}

/// The key the recirculated copy of the packet starts with, if `actions`
/// recirculate: header and metadata writes applied, `recirc_id` set, and
/// the conntrack fields as the tracker would have set them.
fn next_pass(
    key: &FlowKey,
    actions: &[DpAction],
    ct_states: &mut impl Iterator<Item = u32>,
) -> Option<FlowKey> {
    let mut next = *key;
    let mut zone = 0u16;
    for a in actions {
        match a {
            DpAction::Set { field, value } | DpAction::LoadMeta { field, value } => {
                next.set(*field, *value)
            }
            DpAction::Ct { zone: z, .. } => zone = *z,
            DpAction::CtClear => {
                next.set(Field::CtState, 0);
                next.set(Field::CtZone, 0);
            }
            DpAction::Recirc(id) => {
                next.set(Field::RecircId, u128::from(*id));
                let state = ct_states.next().unwrap_or(ct_state::TRK | ct_state::NEW);
                next.set(Field::CtState, u128::from(state));
                next.set(Field::CtZone, u128::from(zone));
                return Some(next);
            }
            _ => {}
        }
    }
    None
}

/// A key's nonzero fields as a match (`tcp,in_port=3,nw_dst=...`).
fn format_key(key: &FlowKey) -> String {
    let mut mask = FlowKey::ZERO;
    for f in Field::ALL {
        if key.get(*f) != 0 {
            mask.set(*f, f.full_mask());
        }
    }
    print::format_match(&Match {
        value: key.and(&mask),
        mask,
    })
}

/// `new|trk`, as OVS prints a conntrack state in trace headings.
fn ct_state_text(state: u32) -> String {
    let names: Vec<&str> = ct_state::NAMES
        .iter()
        .filter(|(_, bit)| state & bit != 0)
        .map(|(name, _)| *name)
        .collect();
    names.join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_pass_applies_writes_and_ct_state() {
        let mut key = FlowKey::ZERO;
        key.set(Field::InPort, 3);
        let actions = [
            DpAction::Set {
                field: Field::NwTtl,
                value: 63,
            },
            DpAction::LoadMeta {
                field: Field::Reg(0),
                value: 0x3,
            },
            DpAction::Ct {
                zone: 65520,
                commit: false,
                force: false,
                mark: None,
                label: None,
            },
            DpAction::Recirc(32),
        ];
        let mut states = [ct_state::TRK | ct_state::EST].into_iter();
        let next = next_pass(&key, &actions, &mut states).expect("recirculates");
        assert_eq!(next.get(Field::NwTtl), 63);
        assert_eq!(next.get(Field::Reg(0)), 3);
        assert_eq!(next.get(Field::RecircId), 32);
        assert_eq!(next.get(Field::CtZone), 65520);
        assert_eq!(
            next.get(Field::CtState),
            u128::from(ct_state::TRK | ct_state::EST)
        );
        // The default state after the given ones run out is trk|new.
        let next = next_pass(&key, &actions, &mut states).expect("recirculates");
        assert_eq!(
            next.get(Field::CtState),
            u128::from(ct_state::TRK | ct_state::NEW)
        );
        assert!(next_pass(&key, &[DpAction::Output(1)], &mut states).is_none());
    }

    #[test]
    fn ct_state_headings() {
        assert_eq!(ct_state_text(ct_state::TRK | ct_state::NEW), "new|trk");
        assert_eq!(ct_state_text(0), "");
    }
}
