//! `oxvs-lab status`: nodes (namespace, IP, pod CIDR, daemons alive), pods
//! (node, IP, namespace, server alive); `--json` for scripts. A lab
//! started with `up --kube-proxy` also shows each node's kube-proxy, the
//! API server, and the Services with their ClusterIP, ports and number of
//! endpoint addresses (read from the API server).

use serde_json::{json, Value};

use super::runtime::SERVER_NEEDLE;
use super::{Ctx, Global};
use crate::netns;
use crate::procs;
use crate::state::{AgentMode, LabState, PortState};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn alive(pid: Option<u32>, needle: &str) -> bool {
    pid.is_some_and(|p| procs::alive(p, needle))
}

/// Every node daemon that is not running, as `node-N/oxvs-agent`.
pub fn dead_daemons(st: &LabState) -> Vec<String> {
    let mut v = Vec::new();
    for n in &st.nodes {
        if !alive(n.switchd_pid, "oxvs-switchd") {
            v.push(format!("{}/oxvs-switchd", n.name));
        }
        if !alive(n.agent_pid, "oxvs-agent") {
            v.push(format!("{}/oxvs-agent", n.name));
        }
    }
    if st.nodes.is_empty() {
        v.push("no nodes".to_string());
    }
    v.extend(super::kube::dead(st));
    v
}

/// `TCP:80,81 UDP:80` (protocols in TCP, UDP, SCTP order).
pub fn ports_summary(ports: &[PortState]) -> String {
    let mut parts = Vec::new();
    for proto in ["TCP", "UDP", "SCTP"] {
        let nums: Vec<String> = ports
            .iter()
            .filter(|p| p.protocol == proto)
            .map(|p| p.port.to_string())
            .collect();
        if !nums.is_empty() {
            parts.push(format!("{proto}:{}", nums.join(",")));
        }
    }
    parts.join(" ")
}

fn word(ok: bool) -> &'static str {
    if ok {
        "running"
    } else {
        "DEAD"
    }
}

pub fn run_status(global: &Global, args: &StatusArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let _lock = ctx.paths.lock(false)?;
    let st = ctx.paths.load()?;
    let nodes: Vec<_> = st
        .nodes
        .iter()
        .map(|n| {
            let mut v = json!({
                "name": n.name, "netns": n.netns, "ip": n.ip, "ip6": n.ip6,
                "internalIPs": n.internal_ips(),
                "podCIDR": n.pod_cidrs().first(), "podCIDRs": n.pod_cidrs(),
                "netnsExists": netns::exists(&n.netns),
                "switchd": {"pid": n.switchd_pid, "running": alive(n.switchd_pid, "oxvs-switchd")},
                "agent": {"pid": n.agent_pid, "running": alive(n.agent_pid, "oxvs-agent")},
            });
            if let Some((pid, running)) = super::kube::kube_proxy_status(&st, &n.name) {
                v["kubeProxy"] = json!({"pid": pid, "running": running});
            }
            v
        })
        .collect();
    // The API server and its Services (one kubectl call), with --kube-proxy.
    let kube = st.kube.as_ref().map(|k| {
        let services = super::kube::services_json(&ctx, &st);
        json!({
            "server": k.server,
            "runDir": k.run_dir,
            "services": services.as_ref().ok(),
            "error": services.as_ref().err().map(|e| format!("{e:#}")),
        })
    });
    let pods: Vec<_> = st
        .pods
        .iter()
        .map(|p| {
            json!({
                "namespace": p.namespace, "name": p.name, "node": p.node, "ip": p.ip,
                "ip6": p.ip6,
                "netns": p.netns, "netnsExists": netns::exists(&p.netns),
                "ports": p.ports.iter().map(|x| format!("{}/{}", x.port, x.protocol)).collect::<Vec<_>>(),
                "server": {"pid": p.server_pid, "running": alive(p.server_pid, SERVER_NEEDLE)},
            })
        })
        .collect();
    let healthy = dead_daemons(&st).is_empty();
    if args.json {
        let v = json!({
            "name": st.name,
            "ipFamily": st.ip_family.flag(),
            "agentMode": match st.agent_mode { AgentMode::Manifests => "manifests", AgentMode::Legacy => "legacy" },
            "healthy": healthy,
            "stateDir": ctx.paths.root.display().to_string(),
            "nodes": nodes,
            "pods": pods,
            "kube": kube,
        });
        crate::say!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(if healthy { 0 } else { 1 });
    }
    crate::say!(
        "lab {} ({}), state in {}",
        st.name,
        if healthy { "healthy" } else { "NOT healthy" },
        ctx.paths.root.display()
    );
    let kp = if st.kube.is_some() {
        "    KUBE-PROXY"
    } else {
        ""
    };
    // An IPv6 address or CIDR is wider than the IPv4 columns.
    let (w_ip, w_cidr) = if st.ip_family.has_ipv6() {
        (22, 22)
    } else {
        (16, 16)
    };
    crate::say!(
        "{:<10} {:<26} {:<w_ip$} {:<w_cidr$} SWITCHD  AGENT{kp}",
        "NODE",
        "NETNS",
        "IP",
        "POD CIDR"
    );
    for n in &st.nodes {
        let agent = word(alive(n.agent_pid, "oxvs-agent"));
        let agent = match super::kube::kube_proxy_status(&st, &n.name) {
            Some((_, running)) => format!("{agent:<8} {}", word(running)),
            None => agent.to_string(),
        };
        // The first InternalIP and pod CIDR (IPv4 first), as Kubernetes
        // shows a node's.
        crate::say!(
            "{:<10} {:<26} {:<w_ip$} {:<w_cidr$} {:<8} {}",
            n.name,
            n.netns,
            n.primary_ip(),
            n.pod_cidrs().first().copied().unwrap_or("-"),
            word(alive(n.switchd_pid, "oxvs-switchd")),
            agent
        );
    }
    if st.pods.is_empty() {
        crate::say!("no pods");
    } else {
        crate::say!("POD                  NODE       IP               SERVER   PORTS");
        for p in &st.pods {
            let ports = ports_summary(&p.ports);
            let server = if p.ports.is_empty() {
                "-"
            } else {
                word(alive(p.server_pid, SERVER_NEEDLE))
            };
            let ip = p.ips_display();
            crate::say!(
                "{:<20} {:<10} {:<16} {:<8} {}",
                p.key(),
                p.node,
                ip,
                server,
                ports
            );
        }
    }
    if let (Some(k), Some(kube)) = (&st.kube, &kube) {
        let dead = super::kube::dead(&st);
        crate::say!(
            "kube-apiserver {} ({}), kubectl: `oxvs-lab --name {} kubectl ...`",
            k.server,
            if dead.iter().any(|d| d == "kube-apiserver" || d == "etcd") {
                "DEAD"
            } else {
                "running"
            },
            st.name
        );
        match kube["services"].as_array() {
            Some(svcs) if !svcs.is_empty() => {
                crate::say!(
                    "SERVICE                        TYPE       CLUSTER-IP       ENDPOINTS  PORTS"
                );
                for s in svcs {
                    let ports: Vec<&str> = s["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    crate::say!(
                        "{:<30} {:<10} {:<16} {:<10} {}",
                        format!(
                            "{}/{}",
                            s["namespace"].as_str().unwrap_or(""),
                            s["name"].as_str().unwrap_or("")
                        ),
                        s["type"].as_str().unwrap_or(""),
                        // Both families' ClusterIPs of a dual-stack Service.
                        s["clusterIPs"]
                            .as_array()
                            .map(|a| a
                                .iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(","))
                            .unwrap_or_else(|| s["clusterIP"].as_str().unwrap_or("").to_string()),
                        s["endpoints"].as_u64().unwrap_or(0),
                        ports.join(" ")
                    );
                }
            }
            Some(_) => crate::say!("no services"),
            None => crate::say!(
                "services: {}",
                kube["error"].as_str().unwrap_or("cannot read them")
            ),
        }
    }
    Ok(if healthy { 0 } else { 1 })
}
