//! A pipeline trace as a `trace` result: the text and the structure, made
//! together from one [`oxvs_pipeline::trace::TraceReport`].
//!
//! The text is the report's own rendering (its `Display`, the only place
//! the text is made); the structure is the same report's typed form
//! ([`TracePass::steps`](oxvs_pipeline::trace::TracePass::steps),
//! [`TracePass::outcome`](oxvs_pipeline::trace::TracePass::outcome)) with
//! flows, keys and actions printed in the `ovs-ofctl` syntax the text uses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use oxvs_pipeline::datapath::TunnelMeta;
use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::PacketInReason;
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::odp::{format_dp_actions_for_key, table_for_recirc_id};
use oxvs_pipeline::print::{format_key, format_match};
use oxvs_pipeline::trace as pt;

use crate::protocol::{
    TraceAction, TraceController, TraceDrop, TraceDropReason, TraceFlow, TraceHeaders, TraceLookup,
    TraceNote, TraceNoteKind, TraceOutput, TracePass, TraceRecirc, TraceReport, TraceResult,
    TraceTunnel, TraceVerdict,
};

const ETH_TYPE_IPV4: u16 = 0x0800;
const ETH_TYPE_IPV6: u16 = 0x86dd;
const VLAN_CFI: u16 = 0x1000;

impl TraceResult {
    /// The result for `report`: its text and its structure.
    pub fn from_report(report: &pt::TraceReport, injected: bool) -> TraceResult {
        TraceResult {
            text: report.to_string(),
            injected,
            trace: Some(TraceReport::from(report)),
        }
    }
}

impl From<&pt::TraceReport> for TraceReport {
    fn from(r: &pt::TraceReport) -> TraceReport {
        TraceReport {
            passes: r.passes.iter().map(pass).collect(),
            unprocessed: r.unprocessed,
        }
    }
}

fn pass(p: &pt::TracePass) -> TracePass {
    let steps = p.steps();
    let outcome = p.outcome();
    TracePass {
        recirc: p.recirc.map(|r| TraceRecirc {
            id: r.id,
            table: table_for_recirc_id(r.id),
            ct_state: pt::ct_state_text(r.ct_state),
            default_state: r.default_state,
        }),
        flow: format_key(&p.flow),
        verdict: verdict(&outcome, &steps.steps),
        steps: steps.steps.iter().map(step).collect(),
        notes: notes(&steps.notes),
        final_flow: format_key(&p.final_flow),
        megaflow: format_match(&p.megaflow),
        datapath_actions: format_dp_actions_for_key(&p.actions, &p.flow),
        error: p.error.map(|e| e.to_string()),
    }
}

fn notes(n: &[pt::Note]) -> Vec<TraceNote> {
    n.iter()
        .map(|n| TraceNote {
            kind: match n.kind {
                pt::NoteKind::Detail => TraceNoteKind::Detail,
                pt::NoteKind::Warn => TraceNoteKind::Warning,
                pt::NoteKind::Error => TraceNoteKind::Error,
            },
            text: n.text.clone(),
        })
        .collect()
}

fn step(s: &pt::Step) -> TraceLookup {
    let l = &s.lookup;
    TraceLookup {
        table: l.table,
        table_name: l.table_name.clone(),
        parent: s.parent,
        flow: l.rule.as_ref().map(|r| TraceFlow {
            cookie: r.flow.cookie,
            priority: r.flow.priority,
            matches: l.match_text(),
            actions: l.actions_text.clone(),
        }),
        actions: s
            .actions
            .iter()
            .map(|a| TraceAction {
                action: a.text.clone(),
                notes: notes(&a.notes),
                lookup: a.lookup,
            })
            .collect(),
        notes: notes(&s.notes),
    }
}

fn verdict(o: &pt::PassOutcome, steps: &[pt::Step]) -> TraceVerdict {
    TraceVerdict {
        outputs: o
            .outputs
            .iter()
            .map(|out| TraceOutput {
                port: out.port,
                packet: format_key(&out.packet),
                headers: headers(&out.packet),
                tunnel: tunnel(&out.packet),
            })
            .collect(),
        controller: o
            .controller
            .iter()
            .map(|c| TraceController {
                reason: match c.reason {
                    PacketInReason::NoMatch => "no_match",
                    PacketInReason::Action => "action",
                    PacketInReason::InvalidTtl => "invalid_ttl",
                }
                .into(),
                table: c.table,
                cookie: c.cookie,
            })
            .collect(),
        recirculations: o.recirculations.clone(),
        drop: o.drop.as_ref().map(|d| drop(d, steps)),
    }
}

/// `table 10` or `table 10 (SpoofGuard)`.
fn table_of(s: &pt::Step) -> String {
    match &s.lookup.table_name {
        Some(n) => format!("table {} ({n})", s.lookup.table),
        None => format!("table {}", s.lookup.table),
    }
}

fn drop(d: &pt::Dropped, steps: &[pt::Step]) -> TraceDrop {
    let at = d.step.and_then(|i| steps.get(i));
    let port_text = |p: Option<u32>| p.map(|p| format!(" (port {p})")).unwrap_or_default();
    let (reason, port, detail) = match &d.reason {
        pt::DropReason::Error(e) => (TraceDropReason::Error, None, e.to_string()),
        pt::DropReason::NonexistentPort { port } => (
            TraceDropReason::NonexistentPort,
            *port,
            match port {
                Some(p) => format!("output to nonexistent port {p}"),
                None => "output to a nonexistent port".into(),
            },
        ),
        pt::DropReason::OutputSkipped { port, why } => (
            TraceDropReason::OutputSkipped,
            *port,
            format!("{why}{}", port_text(*port)),
        ),
        pt::DropReason::NoMatch => (
            TraceDropReason::NoMatch,
            None,
            match at {
                Some(s) => format!("no flow matched in {}", table_of(s)),
                None => "no flow matched".into(),
            },
        ),
        pt::DropReason::NoOutput => (
            TraceDropReason::NoOutput,
            None,
            match at {
                Some(s) => format!("no output action (the last flow is in {})", table_of(s)),
                None => "no output action".into(),
            },
        ),
    };
    TraceDrop {
        reason,
        step: d.step,
        port,
        detail,
    }
}

fn mac(v: u128) -> String {
    let b = (v as u64).to_be_bytes();
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn headers(k: &FlowKey) -> TraceHeaders {
    let dl_type = k.get(Field::DlType) as u16;
    let tci = k.get(Field::VlanTci) as u16;
    let (nw_src, nw_dst) = match dl_type {
        ETH_TYPE_IPV4 => (
            Some(IpAddr::V4(Ipv4Addr::from(k.get(Field::NwSrc) as u32))),
            Some(IpAddr::V4(Ipv4Addr::from(k.get(Field::NwDst) as u32))),
        ),
        ETH_TYPE_IPV6 => (
            Some(IpAddr::V6(Ipv6Addr::from(k.get(Field::Ipv6Src)))),
            Some(IpAddr::V6(Ipv6Addr::from(k.get(Field::Ipv6Dst)))),
        ),
        _ => (None, None),
    };
    let ip = nw_src.is_some();
    let if_ip = |f: Field| if ip { k.get(f) } else { 0 };
    TraceHeaders {
        dl_src: mac(k.get(Field::DlSrc)),
        dl_dst: mac(k.get(Field::DlDst)),
        dl_type,
        vlan: (tci & VLAN_CFI != 0).then_some(tci & 0x0fff),
        nw_src,
        nw_dst,
        nw_proto: if_ip(Field::NwProto) as u8,
        nw_ttl: if_ip(Field::NwTtl) as u8,
        tp_src: if_ip(Field::TpSrc) as u16,
        tp_dst: if_ip(Field::TpDst) as u16,
    }
}

/// The outer addresses an output encapsulates with, as the datapath reads
/// them ([`TunnelMeta::from_key`]: IPv4 when `tun_dst` is set, else IPv6).
fn tunnel(k: &FlowKey) -> Option<TraceTunnel> {
    let m = TunnelMeta::from_key(k)?;
    Some(TraceTunnel {
        tun_id: m.tun_id,
        src: (!m.src.is_unspecified()).then_some(m.src),
        dst: m.dst,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::names::TableNames;
    use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
    use oxvs_pipeline::tables::Pipeline;
    use oxvs_pipeline::xlate::XlateEnv;

    fn result(flows: &str, spec: &str, ports: &[u32]) -> (pt::TraceReport, TraceResult) {
        let ctx = ParseContext::default();
        let p = Pipeline::new();
        p.replace_all(&parse_flow_file(flows, &ctx).unwrap(), 0)
            .unwrap();
        let key = parse_packet_spec(spec, &ctx).unwrap();
        let opts = pt::TraceOptions {
            names: Some(TableNames::default()),
            ..pt::TraceOptions::default()
        };
        let env = XlateEnv {
            ports: ports.to_vec(),
            ..XlateEnv::default()
        };
        let report = pt::trace(&*p.snapshot(), &key, &env, &opts);
        let r = TraceResult::from_report(&report, false);
        (report, r)
    }

    #[test]
    fn the_text_is_the_reports_and_the_structure_says_the_same() {
        let (report, r) = result(
            "table=0,priority=10,cookie=0x2000000000003,in_port=3,ip actions=goto_table:10
             table=10,priority=5,ip actions=mod_dl_src:0a:58:0a:f4:00:01,dec_ttl,set_field:192.168.9.2->tun_dst,set_field:0x0->tun_id,output:9",
            "in_port=3,tcp,nw_src=10.244.0.3,nw_dst=10.244.1.7,nw_ttl=64,tp_src=49152,tp_dst=80",
            &[3, 9],
        );
        assert_eq!(r.text, report.to_string());
        let t = r.trace.unwrap();
        let p = &t.passes[0];
        assert_eq!(p.flow, format_key(&report.passes[0].flow));
        assert_eq!(
            p.datapath_actions,
            r.text.rsplit("Datapath actions: ").next().unwrap()
        );
        let s: Vec<(u8, Option<&str>, Option<usize>)> = p
            .steps
            .iter()
            .map(|s| (s.table, s.table_name.as_deref(), s.parent))
            .collect();
        assert_eq!(
            s,
            vec![
                (0, Some("Classifier"), None),
                (10, Some("SpoofGuard"), Some(0))
            ]
        );
        assert_eq!(p.steps[0].actions[0].action, "goto_table:SpoofGuard");
        assert_eq!(p.steps[0].actions[0].lookup, Some(1));
        assert_eq!(p.steps[0].flow.as_ref().unwrap().cookie, 0x2000000000003);
        let out = &p.verdict.outputs[0];
        assert_eq!(out.port, 9);
        assert_eq!(out.headers.dl_src, "0a:58:0a:f4:00:01");
        assert_eq!(out.headers.nw_ttl, 63);
        assert_eq!(out.headers.nw_dst, Some("10.244.1.7".parse().unwrap()));
        assert_eq!((out.headers.tp_src, out.headers.tp_dst), (49152, 80));
        assert_eq!(
            out.tunnel,
            Some(TraceTunnel {
                tun_id: 0,
                src: None,
                dst: "192.168.9.2".parse().unwrap()
            })
        );
        assert_eq!(p.verdict.drop, None);
        assert_eq!(t.first_output().map(|(i, o)| (i, o.port)), Some((0, 9)));
    }

    #[test]
    fn drops_are_explained() {
        let (_, r) = result(
            "table=0,priority=1 actions=output:7",
            "in_port=3,tcp",
            &[3, 9],
        );
        let d = r.trace.as_ref().unwrap().passes[0]
            .verdict
            .drop
            .clone()
            .unwrap();
        assert_eq!(
            (d.reason, d.step, d.port, d.detail.as_str()),
            (
                TraceDropReason::NonexistentPort,
                Some(0),
                Some(7),
                "output to nonexistent port 7"
            )
        );
        let (_, r) = result(
            "table=0,priority=1 actions=goto_table:10",
            "in_port=3,tcp",
            &[3],
        );
        let t = r.trace.unwrap();
        let (pass, d) = t.last_drop().unwrap();
        assert_eq!(pass, 0);
        assert_eq!(
            (d.reason, d.step, d.detail.as_str()),
            (
                TraceDropReason::NoMatch,
                Some(1),
                "no flow matched in table 10 (SpoofGuard)"
            )
        );
        assert!(t.passes[0].steps[1].flow.is_none());
    }
}
