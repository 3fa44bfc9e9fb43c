//! Pipelines under test: what flows the switch gets, which OpenFlow ports
//! the generator's and the sink's links are, and what the generated frames
//! look like so that the pipeline delivers them.
//!
//! - [`Plan::simple`]: `in_port=1 -> 2` and back; frames between two
//!   addresses nobody owns.
//! - [`Plan::antrea`]: the Antrea-like node pipeline of this crate
//!   ([`crate::Cluster`], the shape of [`crate::antrea_like_flows`]: 30
//!   local pods, 16 remote nodes of 60 pods, 4 pods per policy, 16 peers
//!   per rule, seed 1) with N NetworkPolicies. The generator's link is the
//!   OpenFlow port of local pod G, the sink's that of local pod S, and the
//!   frames are G's: source MAC and IP of G, destination MAC the gateway's
//!   (routed by `L3Forwarding` to S's port, as `Cluster::packet` does),
//!   destination IP of S, UDP to a port the policies allow.
//!   [`find_allowed_pair`] picks G, S and the port from the cluster model
//!   with the NetworkPolicy semantics (a pod selected by a policy is
//!   isolated; an isolated pod's traffic must match a rule), preferring a
//!   pair where *both* directions are allowed by a rule (the packets then
//!   match conjunctions in `EgressRule` and `IngressRule`, after conntrack),
//!   then one, then none. [`check_offline`] traces a sample frame through
//!   the flows with `oxvs_pipeline` (conntrack assumed `+trk+new`); the
//!   benchmark also asks the running oxvs-switchd (`oxvsctl trace`) before
//!   measuring.
//!
//! The generator varies only the UDP source port (flow `i`: `1024 + i`),
//! so at most 64000 flows stay on the allowed 5-tuple shape.

use anyhow::{bail, Result};
use oxvs_pipeline::odp::DpAction;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::trace::{trace_packet, TraceOptions};
use oxvs_pipeline::xlate::XlateEnv;

use super::gen::{GenConfig, Proto};
use super::setup::{DST_MAC, GEN_MAC, SIMPLE_FLOWS};
use crate::{fmt_ip, Cluster, ClusterSpec, GATEWAY_MAC};

/// Most flows the antrea plan supports (only the source port varies).
pub const ANTREA_MAX_FLOWS: u32 = 64_000;

/// Which pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineKind {
    Simple,
    Antrea { policies: usize },
}

impl PipelineKind {
    pub fn name(&self) -> String {
        match self {
            PipelineKind::Simple => "simple".into(),
            PipelineKind::Antrea { policies } => format!("antrea({policies} policies)"),
        }
    }
}

/// How one direction of the chosen pair is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// The pod is not selected by any policy (in that direction).
    Unisolated,
    /// This rule (its conjunction id) allows it.
    Rule(u32),
}

/// A flow set with the ports and frame fields that go through it.
#[derive(Clone, Debug)]
pub struct Plan {
    pub kind: PipelineKind,
    pub flows: String,
    /// OpenFlow port of the generator's link.
    pub gen_ofport: u32,
    /// OpenFlow port of the sink's link: where the frames must come out.
    pub sink_ofport: u32,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub dst_port: u16,
    /// Which pods and why the policies allow them (for the report).
    pub note: String,
}

impl Plan {
    pub fn simple(flows: &str) -> Plan {
        let d = GenConfig::default();
        Plan {
            kind: PipelineKind::Simple,
            flows: flows.to_owned(),
            gen_ofport: 1,
            sink_ofport: 2,
            src_mac: GEN_MAC,
            dst_mac: DST_MAC,
            src_ip: d.src_ip,
            dst_ip: d.dst_ip,
            dst_port: d.dst_port,
            note: if flows == SIMPLE_FLOWS {
                "in_port=1 -> output:2".into()
            } else {
                "user flow file, ports 1 -> 2".into()
            },
        }
    }

    /// The Antrea-like pipeline with `policies` NetworkPolicies.
    pub fn antrea(policies: usize) -> Result<Plan> {
        let c = antrea_cluster(policies);
        let Some(Pair {
            gen: g,
            sink: s,
            port,
            egress: eg,
            ingress: ing,
        }) = find_allowed_pair(&c)
        else {
            bail!(
                "no two local pods of the Antrea-like cluster with {policies} policies \
                 that the policies allow to talk over UDP"
            );
        };
        let (gp, sp) = (c.pods[g], c.pods[s]);
        let via = |v: Via| match v {
            Via::Unisolated => "not isolated".to_owned(),
            Via::Rule(id) => format!("rule {id}"),
        };
        let plan = Plan {
            kind: PipelineKind::Antrea { policies },
            flows: c.flows(),
            gen_ofport: gp.ofport,
            sink_ofport: sp.ofport,
            src_mac: gp.mac,
            dst_mac: GATEWAY_MAC,
            src_ip: gp.ip,
            dst_ip: sp.ip,
            dst_port: port,
            note: format!(
                "pod {} (ofport {}) -> pod {} (ofport {}) udp/{port}: egress {}, ingress {}",
                fmt_ip(gp.ip),
                gp.ofport,
                fmt_ip(sp.ip),
                sp.ofport,
                via(eg),
                via(ing)
            ),
        };
        check_offline(&plan)?;
        Ok(plan)
    }

    /// Applies the plan's frame fields to a generator configuration.
    pub fn apply(&self, cfg: &mut GenConfig) -> Result<()> {
        if self.kind != PipelineKind::Simple {
            if cfg.flows > ANTREA_MAX_FLOWS {
                bail!(
                    "{} flows: the {} plan supports at most {ANTREA_MAX_FLOWS} (only the source port varies)",
                    cfg.flows,
                    self.kind.name()
                );
            }
            if cfg.vxlan.is_some() || cfg.proto != Proto::Udp {
                bail!("the {} plan sends plain UDP", self.kind.name());
            }
            cfg.src_ips = 1;
            cfg.dst_ips = 1;
        }
        cfg.src_mac = self.src_mac;
        cfg.dst_mac = self.dst_mac;
        cfg.src_ip = self.src_ip;
        cfg.dst_ip = self.dst_ip;
        cfg.dst_port = self.dst_port;
        Ok(())
    }

    /// A sample frame (flow 0) as the generator sends it.
    pub fn sample_frame(&self) -> Result<Vec<u8>> {
        let mut cfg = GenConfig::default();
        self.apply(&mut cfg)?;
        let mut fb = super::gen::FrameBuilder::new(&cfg)?;
        Ok(fb.frame(0, 0, 0).to_vec())
    }
}

/// The cluster behind [`Plan::antrea`] (the shape of
/// [`crate::antrea_like_flows`]`(30, policies, 16)`).
pub fn antrea_cluster(policies: usize) -> Cluster {
    Cluster::new(ClusterSpec {
        n_pods: 30,
        n_remote_nodes: 16,
        pods_per_remote_node: 60,
        n_policies: policies,
        pods_per_policy: 4,
        peers_per_rule: 16,
        max_ports_per_rule: 3,
        seed: 1,
    })
}

fn in_cidr(ip: [u8; 4], cidr: Option<([u8; 4], u8)>) -> bool {
    cidr.is_some_and(|(net, len)| {
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        u32::from_be_bytes(ip) & mask == u32::from_be_bytes(net) & mask
    })
}

/// How `src -> dst` on UDP `port` is allowed, if it is:
/// (egress of `src`, ingress of `dst`).
pub fn allowed(c: &Cluster, src: usize, dst: usize, port: u16) -> Option<(Via, Via)> {
    let udp = |r: &crate::Rule| r.ports.iter().any(|p| p.proto == 17 && p.port == port);
    let mut eg_iso = false;
    let mut eg = None;
    let mut in_iso = false;
    let mut ing = None;
    for pol in &c.policies {
        if pol.applied_to.contains(&src) {
            eg_iso = true;
            let r = &pol.egress;
            if eg.is_none() && udp(r) && (r.peers.contains(&dst) || in_cidr(c.pods[dst].ip, r.cidr))
            {
                eg = Some(Via::Rule(r.conj_id));
            }
        }
        if pol.applied_to.contains(&dst) {
            in_iso = true;
            let r = &pol.ingress;
            if ing.is_none()
                && udp(r)
                && (r.peers.contains(&src) || in_cidr(c.pods[src].ip, r.cidr))
            {
                ing = Some(Via::Rule(r.conj_id));
            }
        }
    }
    let eg = if eg_iso { eg? } else { Via::Unisolated };
    let ing = if in_iso { ing? } else { Via::Unisolated };
    Some((eg, ing))
}

/// Two local pods (indices into [`Cluster::pods`]) and a UDP port the
/// policies allow from `gen` to `sink`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    pub gen: usize,
    pub sink: usize,
    pub port: u16,
    pub egress: Via,
    pub ingress: Via,
}

/// Picks a [`Pair`] among the local pods, preferring both directions
/// allowed by rules, then one, then none.
pub fn find_allowed_pair(c: &Cluster) -> Option<Pair> {
    let n = c.local_pods().len();
    let mut ports: Vec<u16> = c
        .policies
        .iter()
        .flat_map(|p| p.ingress.ports.iter().chain(p.egress.ports.iter()))
        .filter(|p| p.proto == 17)
        .map(|p| p.port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    // A port no rule names: allowed only between unisolated pods.
    ports.push(5000);
    let mut best: Option<(usize, Pair)> = None;
    for g in 0..n {
        for s in 0..n {
            if g == s {
                continue;
            }
            for &port in &ports {
                if let Some((e, i)) = allowed(c, g, s, port) {
                    let score = usize::from(matches!(e, Via::Rule(_)))
                        + usize::from(matches!(i, Via::Rule(_)));
                    if best.as_ref().is_none_or(|(b, _)| score > *b) {
                        best = Some((
                            score,
                            Pair {
                                gen: g,
                                sink: s,
                                port,
                                egress: e,
                                ingress: i,
                            },
                        ));
                    }
                    if score == 2 {
                        return best.map(|b| b.1);
                    }
                }
            }
        }
    }
    best.map(|b| b.1)
}

/// Traces the plan's sample frame through its flows (offline,
/// `oxvs_pipeline`, conntrack `+trk+new`): it must come out of the sink's
/// port and only there.
pub fn check_offline(plan: &Plan) -> Result<()> {
    let flows = parse_flow_file(&plan.flows, &ParseContext::default())
        .map_err(|e| anyhow::anyhow!("{} flows do not parse: {e}", plan.kind.name()))?;
    let mods: Vec<_> = flows
        .into_iter()
        .map(oxvs_pipeline::flow::FlowMod::add)
        .collect();
    let p = Pipeline::new();
    p.apply(&mods, 0)
        .map_err(|e| anyhow::anyhow!("{} flows do not install: {e:?}", plan.kind.name()))?;
    let frame = plan.sample_frame()?;
    let env = XlateEnv::with_ports(vec![plan.gen_ofport, plan.sink_ofport]);
    let r = trace_packet(
        &*p.snapshot(),
        &frame,
        plan.gen_ofport,
        &env,
        &TraceOptions::default(),
    );
    let outs: Vec<u32> = r
        .passes
        .iter()
        .flat_map(|pass| pass.actions.iter())
        .filter_map(|a| match a {
            DpAction::Output(p) => Some(*p),
            _ => None,
        })
        .collect();
    if outs != [plan.sink_ofport] {
        bail!(
            "{}: the sample frame ({}) goes to ports {outs:?}, not [{}]:\n{r}",
            plan.kind.name(),
            plan.note,
            plan.sink_ofport
        );
    }
    Ok(())
}

/// Whether `oxvsctl trace` text says the frame is output on `port`: its
/// last `Datapath actions:` line lists `port` as an output.
pub fn trace_text_delivers(text: &str, port: u32) -> bool {
    let Some(last) = text
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Datapath actions:"))
    else {
        return false;
    };
    let p = port.to_string();
    last.split(',').any(|t| t.trim() == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn antrea_plans_deliver_through_rules() {
        for n in [1usize, 1000] {
            let plan = Plan::antrea(n).expect("plan");
            assert_ne!(plan.gen_ofport, plan.sink_ofport);
            assert!(plan.flows.lines().count() > 100, "{n}: a real pipeline");
            if n == 1000 {
                // Every local pod is isolated: both directions are rules.
                assert!(plan.note.contains("egress rule"), "{}", plan.note);
                assert!(plan.note.contains("ingress rule"), "{}", plan.note);
            }
        }
    }

    #[test]
    fn the_check_catches_a_denied_frame() {
        let mut plan = Plan::antrea(1000).expect("plan");
        // Another port: no rule allows it and every pod is isolated.
        plan.dst_port = 1;
        let e = check_offline(&plan).expect_err("denied");
        assert!(format!("{e}").contains("goes to ports []"), "{e}");
        let mut plan = Plan::antrea(1000).expect("plan");
        plan.src_ip = [10, 64, 0, 250]; // spoofed source: SpoofGuard drops it
        assert!(check_offline(&plan).is_err());
    }

    #[test]
    fn policy_semantics() {
        let c = antrea_cluster(1000);
        let p = find_allowed_pair(&c).expect("pair");
        assert_eq!(
            allowed(&c, p.gen, p.sink, p.port),
            Some((p.egress, p.ingress))
        );
        assert!(allowed(&c, p.gen, p.sink, 1).is_none());
        // With one policy most pods are not isolated.
        let c1 = antrea_cluster(1);
        let free: Vec<usize> = (0..30)
            .filter(|i| !c1.policies[0].applied_to.contains(i))
            .collect();
        assert_eq!(
            allowed(&c1, free[0], free[1], 4242),
            Some((Via::Unisolated, Via::Unisolated))
        );
        assert!(Plan::simple(SIMPLE_FLOWS).sample_frame().is_ok());
        assert!(in_cidr([192, 168, 3, 9], Some(([192, 168, 3, 0], 24))));
        assert!(!in_cidr([192, 168, 4, 9], Some(([192, 168, 3, 0], 24))));
        let text = "Datapath actions: ct(zone=65520),recirc(0x1)\n\nDatapath actions: set(eth(src=0a:58:0a:40:00:01,dst=0a:58:0a:40:00:07)),set(ipv4(ttl=63)),7\n";
        assert!(trace_text_delivers(text, 7));
        assert!(!trace_text_delivers(text, 1));
        assert!(!trace_text_delivers("Datapath actions: drop\n", 7));
    }
}
