//! Services for a lab started with `up --proxy`: the agents load-balance
//! them in the switch (`oxvs-agent --proxy`) and no kube-proxy runs. There
//! is no API server either: the lab writes each Service (with its
//! ClusterIP) and the Endpoints it computes for it (the endpoints
//! controller's role, [`crate::service::endpoints_object`]) into the
//! manifest directory the agents watch.
//!
//! ClusterIPs: `spec.clusterIP` if given (inside [`SERVICE_CIDR`], not
//! taken), else the lowest free address from `10.96.0.10` (an
//! allocator's job in Kubernetes); NodePorts likewise, from 30000. A
//! LoadBalancer Service gets its `spec.loadBalancerIP` as its load
//! balancer address (`status.loadBalancer.ingress`), as MetalLB would
//! give it. A Service without a selector gets the Endpoints the user
//! applies.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use anyhow::Context;
use serde_json::{json, Value};

use super::kube::{apply_word_local, SERVICE_CIDR};
use super::Ctx;
use crate::manifest::{self, Object};
use crate::service::{self, Backend};
use crate::state::{LabState, ProxyState};

fn proxy(st: &LabState) -> anyhow::Result<&ProxyState> {
    st.proxy.as_ref().with_context(|| {
        format!(
            "lab {} runs no Service proxy: start it with `oxvs-lab up --proxy` (or `--kube-proxy`)",
            st.name
        )
    })
}

/// Whether `st` is a lab whose Services the lab itself serves.
pub fn serves_services(st: &LabState) -> bool {
    st.kube.is_none() && st.proxy.is_some()
}

/// An IPv4 prefix (`10.96.0.0/16`).
struct ServiceRange {
    base: u32,
    len: u32,
}

impl ServiceRange {
    fn parse(s: &str) -> Option<ServiceRange> {
        let (a, l) = s.split_once('/')?;
        let base = u32::from(a.parse::<Ipv4Addr>().ok()?);
        let len: u32 = l.parse().ok().filter(|l| (8..=30).contains(l))?;
        Some(ServiceRange { base, len })
    }

    fn contains(&self, ip: &Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.len);
        u32::from(*ip) & mask == self.base & mask
    }

    /// Every address but the network and broadcast ones.
    fn hosts(&self) -> impl Iterator<Item = Ipv4Addr> {
        let n = 1u32 << (32 - self.len);
        let base = self.base & (u32::MAX << (32 - self.len));
        (1..n - 1).map(move |i| Ipv4Addr::from(base + i))
    }
}

impl std::fmt::Display for ServiceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.len)
    }
}

fn cluster_ip_of(body: &Value) -> Option<Ipv4Addr> {
    body.pointer("/spec/clusterIP")?.as_str()?.parse().ok()
}

/// `apply` of a Service: checked, a ClusterIP given, written with its
/// Endpoints.
pub fn apply_service(ctx: &Ctx, st: &mut LabState, obj: &Object) -> anyhow::Result<&'static str> {
    let spec = service::parse_service(obj)?;
    if spec.families.contains(&service::Family::Ipv6) {
        anyhow::bail!(
            "{}: asks for an IPv6 ClusterIP, which the in-pipeline proxy (`up --proxy`) does not serve yet: use `up --kube-proxy --ip-family dual`",
            obj.display_name()
        );
    }
    let p = proxy(st)?.clone();
    let key = spec.key();
    let range = ServiceRange::parse(SERVICE_CIDR).context("the lab's Service range")?;
    let taken: BTreeSet<Ipv4Addr> = p
        .services
        .iter()
        .filter(|(k, _)| **k != key)
        .filter_map(|(_, b)| cluster_ip_of(b))
        .collect();
    let mut body = obj.body.clone();
    let ip = match body.pointer("/spec/clusterIP").and_then(Value::as_str) {
        Some(s) if !s.is_empty() && s != "None" => {
            let ip: Ipv4Addr = s.parse().with_context(|| {
                format!(
                    "{}: spec.clusterIP {s:?} is not an IPv4 address",
                    obj.display_name()
                )
            })?;
            if !range.contains(&ip) {
                anyhow::bail!(
                    "{}: spec.clusterIP {ip} is outside the lab's Service range {range}",
                    obj.display_name()
                );
            }
            if taken.contains(&ip) {
                anyhow::bail!(
                    "{}: spec.clusterIP {ip} is already allocated",
                    obj.display_name()
                );
            }
            ip
        }
        Some("None") => anyhow::bail!("{}: headless Services are not proxied", obj.display_name()),
        _ => match p.services.get(&key).and_then(cluster_ip_of) {
            // A re-apply keeps the address, as the API server does.
            Some(ip) => ip,
            None => range
                .hosts()
                .skip(9)
                .find(|a| !taken.contains(a))
                .context("the lab's Service range is full")?,
        },
    };
    if let Some(spec) = body.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("clusterIP".into(), json!(ip.to_string()));
    }
    allocate_node_ports(&spec, &mut body, &p, &key)?;
    // The lab's load balancer: it gives a LoadBalancer Service the address
    // asked for in spec.loadBalancerIP (as MetalLB does); without one the
    // Service waits for an address, as on a cluster without a controller.
    if let Some(lb) = spec.load_balancer_ip {
        if let Some(o) = body.as_object_mut() {
            o.insert(
                "status".into(),
                json!({"loadBalancer": {"ingress": [{"ip": lb.to_string()}]}}),
            );
        }
    }
    if let Some(md) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("namespace".into(), json!(obj.namespace));
    }
    let dir = ctx.paths.manifests();
    let file = manifest::object_file_name("Service", &obj.namespace, &obj.name);
    let existed = p.services.contains_key(&key);
    let unchanged = p.services.get(&key) == Some(&body);
    manifest::write(&dir, &file, &body)?;
    if let Some(p) = st.proxy.as_mut() {
        p.services.insert(key.clone(), body);
        if spec.selector.is_none() {
            // The user's Endpoints from now on.
            p.endpoints.remove(&key);
        }
    }
    ctx.paths.save(st)?;
    Ok(apply_word_local(existed, unchanged))
}

fn node_ports_of(body: &Value) -> Vec<u64> {
    body.pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
        .collect()
}

/// Gives each port of a NodePort or LoadBalancer Service without a
/// `nodePort` the lowest free one of the range (the API server's
/// allocator's job); a re-apply keeps those allocated before. A `nodePort`
/// another Service holds is refused.
fn allocate_node_ports(
    spec: &service::ServiceSpec,
    body: &mut Value,
    p: &ProxyState,
    key: &str,
) -> anyhow::Result<()> {
    if !spec.has_node_ports() {
        return Ok(());
    }
    let mut taken: BTreeSet<u64> = p
        .services
        .iter()
        .filter(|(k, _)| k.as_str() != key)
        .flat_map(|(_, b)| node_ports_of(b))
        .collect();
    let before: Vec<Value> = p
        .services
        .get(key)
        .and_then(|b| b.pointer("/spec/ports"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let Some(ports) = body
        .pointer_mut("/spec/ports")
        .and_then(Value::as_array_mut)
    else {
        return Ok(());
    };
    for port in ports.iter() {
        if let Some(n) = port.get("nodePort").and_then(Value::as_u64) {
            if taken.contains(&n) {
                anyhow::bail!("{key}: nodePort {n} is already allocated to another Service");
            }
        }
    }
    let given: Vec<u64> = ports
        .iter()
        .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
        .collect();
    taken.extend(given);
    for port in ports.iter_mut() {
        if port.get("nodePort").is_some_and(|n| !n.is_null()) {
            continue;
        }
        // The same port (number and protocol) applied before keeps its NodePort.
        let same = |b: &&Value| {
            b.get("port") == port.get("port") && b.get("protocol") == port.get("protocol")
        };
        let kept = before
            .iter()
            .find(same)
            .and_then(|b| b.get("nodePort").and_then(Value::as_u64))
            .filter(|n| !taken.contains(n));
        let n = match kept {
            Some(n) => n,
            None => service::NODE_PORT_RANGE
                .clone()
                .find(|n| !taken.contains(n))
                .context("the lab's NodePort range is full")?,
        };
        taken.insert(n);
        if let Some(o) = port.as_object_mut() {
            o.insert("nodePort".into(), json!(n));
        }
    }
    Ok(())
}

/// `apply` of an Endpoints object, for a Service without a selector.
pub fn apply_endpoints(ctx: &Ctx, st: &mut LabState, obj: &Object) -> anyhow::Result<&'static str> {
    service::check_endpoints(obj, false)?;
    let p = proxy(st)?;
    let key = format!("{}/{}", obj.namespace, obj.name);
    if p.endpoints.contains_key(&key) {
        anyhow::bail!(
            "{}: Service {key} has a selector, so the lab keeps its Endpoints (apply Endpoints only for a Service without a selector)",
            obj.display_name()
        );
    }
    let dir = ctx.paths.manifests();
    let file = manifest::object_file_name("Endpoints", &obj.namespace, &obj.name);
    let existed = dir.join(&file).exists();
    let mut body = obj.body.clone();
    if let Some(md) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("namespace".into(), json!(obj.namespace));
    }
    let unchanged = existed && manifest::read(&dir, &file).ok().as_ref() == Some(&body);
    manifest::write(&dir, &file, &body)?;
    Ok(apply_word_local(existed, unchanged))
}

/// `delete` of a Service and its Endpoints. Whether it existed.
pub fn delete_service(ctx: &Ctx, st: &mut LabState, ns: &str, name: &str) -> anyhow::Result<bool> {
    let dir = ctx.paths.manifests();
    let key = format!("{ns}/{name}");
    manifest::remove(&dir, &manifest::object_file_name("Service", ns, name))?;
    manifest::remove(&dir, &manifest::object_file_name("Endpoints", ns, name))?;
    let known = st
        .proxy
        .as_mut()
        .map(|p| {
            p.endpoints.remove(&key);
            p.services.remove(&key).is_some()
        })
        .unwrap_or(false);
    ctx.paths.save(st)?;
    Ok(known)
}

/// `delete` of an Endpoints object. Whether it existed.
pub fn delete_endpoints(ctx: &Ctx, ns: &str, name: &str) -> anyhow::Result<bool> {
    let dir = ctx.paths.manifests();
    let file = manifest::object_file_name("Endpoints", ns, name);
    let found = dir.join(&file).exists();
    manifest::remove(&dir, &file)?;
    Ok(found)
}

/// The keys (`ns/name`) of the Services in namespace `ns`.
pub fn namespace_services(st: &LabState, ns: &str) -> Vec<String> {
    st.proxy
        .as_ref()
        .map(|p| service::keys_in_namespace(&p.services, ns))
        .unwrap_or_default()
}

/// The endpoints controller's pass: recomputes the Endpoints of every
/// Service with a selector and writes those that changed. Each changed
/// Service (`ns/name`) with its number of addresses.
pub fn sync_endpoints(
    ctx: &Ctx,
    st: &mut LabState,
    pods: &[Backend],
) -> anyhow::Result<Vec<(String, usize)>> {
    let Some(p) = st.proxy.clone() else {
        return Ok(Vec::new());
    };
    let dir = ctx.paths.manifests();
    let mut out = Vec::new();
    for (key, ep) in
        service::changed_endpoints(&p.services, &p.endpoints, pods, service::Family::Ipv4)
    {
        let Some((ns, name)) = key.split_once('/') else {
            continue;
        };
        manifest::write(
            &dir,
            &manifest::object_file_name("Endpoints", ns, name),
            &ep,
        )?;
        out.push((key.clone(), service::address_count(&ep)));
        if let Some(pp) = st.proxy.as_mut() {
            pp.endpoints.insert(key, ep);
        }
    }
    if !out.is_empty() {
        ctx.paths.save(st)?;
    }
    Ok(out)
}
