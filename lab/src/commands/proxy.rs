//! Services for a lab started with `up --proxy`: the agents load-balance
//! them in the switch (`oxvs-agent --proxy`) and no kube-proxy runs. There
//! is no API server either: the lab writes each Service (with its
//! ClusterIP) and the Endpoints it computes for it (the endpoints
//! controller's role, [`crate::service::endpoints_object`]) into the
//! manifest directory the agents watch.
//!
//! ClusterIPs, one per family the Service asks for (IPv6 in a dual-stack
//! lab: `spec.clusterIPs`, `spec.ipFamilies` written back as a dual-stack
//! API server does): the one given if any (inside [`SERVICE_CIDR`] or
//! [`SERVICE_CIDR6`], not taken), else the lowest free address from
//! `10.96.0.10` or `fd00:10:96::a` (an allocator's job in Kubernetes); NodePorts likewise, from 30000. A
//! LoadBalancer Service gets its `spec.loadBalancerIP` as its load
//! balancer address (`status.loadBalancer.ingress`), as MetalLB would
//! give it. A Service without a selector gets the Endpoints the user
//! applies.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Context;
use serde_json::{json, Value};

use super::kube::{apply_word_local, SERVICE_CIDR, SERVICE_CIDR6};
use super::Ctx;
use crate::manifest::{self, Object};
use crate::service::{self, Backend, Family, SliceApi};
use crate::state::{IpFamily, LabState, ProxyState};

fn proxy(st: &LabState) -> anyhow::Result<&ProxyState> {
    st.proxy.as_ref().with_context(|| {
        format!(
            "lab {} runs no Service proxy: start it with `oxvs-lab up --proxy` (or `--kube-proxy`)",
            st.name
        )
    })
}

/// The lab's primary address family: its Services' (and Endpoints
/// objects') first family, IPv6 in an IPv6-only lab.
fn primary_family(st: &LabState) -> Family {
    Family::primary(st.ip_family)
}

/// Whether `st` is a lab whose Services the lab itself serves.
pub fn serves_services(st: &LabState) -> bool {
    st.kube.is_none() && st.proxy.is_some()
}

/// A ClusterIP range of either family (`10.96.0.0/16`,
/// `fd00:10:96::/108`), addresses as integers.
struct ServiceRange {
    base: u128,
    /// Address width: 32 or 128.
    width: u32,
    len: u32,
}

impl ServiceRange {
    fn parse(s: &str) -> Option<ServiceRange> {
        let (a, l) = s.split_once('/')?;
        let (base, width) = match a.parse::<IpAddr>().ok()? {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let len: u32 = l.parse().ok().filter(|l| (8..=width - 2).contains(l))?;
        Some(ServiceRange { base, width, len })
    }

    /// The range of `family`'s ClusterIPs.
    fn of(family: Family) -> anyhow::Result<ServiceRange> {
        let cidr = match family {
            Family::Ipv4 => SERVICE_CIDR,
            Family::Ipv6 => SERVICE_CIDR6,
        };
        ServiceRange::parse(cidr).with_context(|| format!("the lab's Service range {cidr}"))
    }

    fn mask(&self) -> u128 {
        let host_bits = self.width - self.len;
        let all = if self.width == 128 {
            u128::MAX
        } else {
            (1u128 << self.width) - 1
        };
        all & !((1u128 << host_bits) - 1)
    }

    fn contains(&self, ip: &IpAddr) -> bool {
        let (n, width) = match ip {
            IpAddr::V4(a) => (u128::from(u32::from(*a)), 32),
            IpAddr::V6(a) => (u128::from(*a), 128),
        };
        width == self.width && n & self.mask() == self.base & self.mask()
    }

    /// Every address but the network and broadcast ones; of a large
    /// IPv6 range the first 65536 only (as the v1.20 API server).
    fn hosts(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let n = (1u128 << (self.width - self.len)).min(1 << 16);
        let base = self.base & self.mask();
        (1..n - 1).map(move |i| match self.width {
            32 => IpAddr::V4(Ipv4Addr::from(u32::try_from(base + i).unwrap_or(0))),
            _ => IpAddr::V6(Ipv6Addr::from(base + i)),
        })
    }
}

impl std::fmt::Display for ServiceRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.width {
            32 => write!(
                f,
                "{}/{}",
                Ipv4Addr::from(u32::try_from(self.base).unwrap_or(0)),
                self.len
            ),
            _ => write!(f, "{}/{}", Ipv6Addr::from(self.base), self.len),
        }
    }
}

/// A Service's ClusterIPs as written (`spec.clusterIPs`, else
/// `spec.clusterIP`).
fn cluster_ips_of(body: &Value) -> Vec<IpAddr> {
    let listed: Vec<IpAddr> = body
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str()?.parse().ok())
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    body.pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .into_iter()
        .collect()
}

/// What the API server of lab `st` does to a Service, then the lab's
/// checks of its families, for `--proxy` and `--kube-proxy` (`flag`)
/// alike: an IPv6-only lab defaults it to IPv6 and refuses IPv4 families
/// and addresses and `RequireDualStack`, naming the field
/// ([`service::default_ipv6_only`]); an IPv4-only lab refuses IPv6; external
/// and load balancer addresses must be of the lab's primary family. The
/// object as defaulted, and its spec.
pub fn check_service(
    st: &LabState,
    obj: &Object,
    flag: &str,
) -> anyhow::Result<(Object, service::ServiceSpec)> {
    // An IPv6-only lab's API server defaults the family to IPv6.
    let mut obj = obj.clone();
    if st.ip_family == IpFamily::Ipv6 {
        service::default_ipv6_only(&mut obj.body)
            .map_err(|e| anyhow::anyhow!("{} ({}): {e}", obj.display_name(), obj.source))?;
    }
    let spec = service::parse_service(&obj)?;
    if spec.families.contains(&Family::Ipv6) && !st.ip_family.has_ipv6() {
        anyhow::bail!(
            "{}: asks for an IPv6 ClusterIP (spec.ipFamilies, spec.ipFamilyPolicy or spec.clusterIP), and lab {} is IPv4-only (`oxvs-lab up {flag} --ip-family dual` has IPv6 Services)",
            obj.display_name(),
            st.name
        );
    }
    // External and load balancer addresses: of the lab's primary family
    // (IPv4 in a dual-stack lab).
    let outside = primary_family(st);
    if let Some(ip) = spec
        .external_ips
        .iter()
        .chain(&spec.load_balancer_ip)
        .find(|ip| Family::of(**ip) != outside)
    {
        anyhow::bail!(
            "{}: external or load balancer address {ip} is not {}: the lab's are {} ({})",
            obj.display_name(),
            outside.api_name(),
            outside.api_name(),
            match st.ip_family {
                IpFamily::Ipv6 => "an IPv6-only lab",
                _ => "IPv4 in a dual-stack lab too",
            }
        );
    }
    Ok((obj, spec))
}

/// `apply` of a Service: checked ([`check_service`]), a ClusterIP given
/// per family it asks for (an IPv6 one in a dual-stack lab), written with
/// its Endpoints.
pub fn apply_service(ctx: &Ctx, st: &mut LabState, obj: &Object) -> anyhow::Result<&'static str> {
    let (obj, spec) = check_service(st, obj, "--proxy")?;
    let obj = &obj;
    let p = proxy(st)?.clone();
    let key = spec.key();
    let mut body = obj.body.clone();
    if body.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None") {
        anyhow::bail!("{}: headless Services are not proxied", obj.display_name());
    }
    let given = cluster_ips_of(&body);
    let before = p.services.get(&key).map(cluster_ips_of).unwrap_or_default();
    let taken: BTreeSet<IpAddr> = p
        .services
        .iter()
        .filter(|(k, _)| **k != key)
        .flat_map(|(_, b)| cluster_ips_of(b))
        .collect();
    let mut ips: Vec<IpAddr> = Vec::new();
    for (i, family) in spec.families.iter().enumerate() {
        let range = ServiceRange::of(*family)?;
        let ip = match given.get(i) {
            Some(ip) => {
                if !range.contains(ip) {
                    anyhow::bail!(
                        "{}: ClusterIP {ip} is outside the lab's Service range {range}",
                        obj.display_name()
                    );
                }
                if taken.contains(ip) {
                    anyhow::bail!(
                        "{}: ClusterIP {ip} is already allocated",
                        obj.display_name()
                    );
                }
                *ip
            }
            // A re-apply keeps the address, as the API server does.
            None => match before.iter().find(|b| Family::of(**b) == *family) {
                Some(ip) => *ip,
                None => range
                    .hosts()
                    .skip(9)
                    .find(|a| !taken.contains(a))
                    .with_context(|| format!("the lab's Service range {range} is full"))?,
            },
        };
        ips.push(ip);
    }
    if let Some(s) = body.get_mut("spec").and_then(Value::as_object_mut) {
        s.insert(
            "clusterIP".into(),
            json!(ips.first().map(IpAddr::to_string)),
        );
        if st.ip_family.has_ipv6() {
            // What a dual-stack (or IPv6-only) API server writes back.
            s.insert(
                "clusterIPs".into(),
                json!(ips.iter().map(IpAddr::to_string).collect::<Vec<_>>()),
            );
            s.insert(
                "ipFamilies".into(),
                json!(spec
                    .families
                    .iter()
                    .map(|f| f.api_name())
                    .collect::<Vec<_>>()),
            );
        }
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
    if spec.selector.is_none() {
        // The slices of an earlier version with a selector would hide the
        // user's Endpoints from the agents.
        for f in slice_files(&p, &key) {
            manifest::remove(&dir, &f)?;
        }
    }
    if let Some(p) = st.proxy.as_mut() {
        p.services.insert(key.clone(), body);
        if spec.selector.is_none() {
            // The user's Endpoints from now on.
            p.endpoints.remove(&key);
            p.endpoints6.remove(&key);
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
    service::check_endpoints(obj, st.ip_family)?;
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
    if let Some(p) = &st.proxy {
        for f in slice_files(p, &key) {
            manifest::remove(&dir, &f)?;
        }
    }
    let known = st
        .proxy
        .as_mut()
        .map(|p| {
            p.endpoints.remove(&key);
            p.endpoints6.remove(&key);
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
    let dual = st.ip_family == IpFamily::Dual;
    let dir = ctx.paths.manifests();
    // The Endpoints object holds the primary family's addresses (IPv6
    // ones in an IPv6-only lab; the agents read it when there are no
    // EndpointSlices).
    let changed = service::changed_endpoints(&p.services, &p.endpoints, pods, primary_family(st));
    let changed6 = match dual {
        true => service::changed_endpoints(&p.services, &p.endpoints6, pods, Family::Ipv6),
        false => Vec::new(),
    };
    let mut out = Vec::new();
    for (key, ep) in &changed {
        let Some((ns, name)) = key.split_once('/') else {
            continue;
        };
        manifest::write(&dir, &manifest::object_file_name("Endpoints", ns, name), ep)?;
        out.push((key.clone(), service::address_count(ep)));
    }
    if dual {
        // The agents read EndpointSlices before Endpoints: one per family,
        // as a dual-stack cluster's EndpointSlice controller writes them.
        for (family, list, old) in [
            (Family::Ipv4, &changed, &p.endpoints),
            (Family::Ipv6, &changed6, &p.endpoints6),
        ] {
            for (key, ep) in list {
                let Some((ns, _)) = key.split_once('/') else {
                    continue;
                };
                let now = service::endpoint_slices(ep, family, SliceApi::V1);
                for b in old
                    .get(key)
                    .map(|e| service::endpoint_slices(e, family, SliceApi::V1))
                    .unwrap_or_default()
                {
                    if !now.iter().any(|n| n["metadata"] == b["metadata"]) {
                        manifest::remove(&dir, &slice_file(ns, &b))?;
                    }
                }
                for slice in &now {
                    manifest::write(&dir, &slice_file(ns, slice), slice)?;
                }
                if family == Family::Ipv6 && !out.iter().any(|(k, _)| k == key) {
                    let n = p.endpoints.get(key).map_or(0, service::address_count);
                    out.push((key.clone(), n));
                }
            }
        }
    }
    if let Some(pp) = st.proxy.as_mut() {
        pp.endpoints.extend(changed);
        pp.endpoints6.extend(changed6);
    }
    if !out.is_empty() {
        ctx.paths.save(st)?;
    }
    Ok(out)
}

/// The manifest file of an EndpointSlice in namespace `ns`.
fn slice_file(ns: &str, slice: &Value) -> String {
    let name = slice
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    manifest::object_file_name("EndpointSlice", ns, name)
}

/// The EndpointSlice files the lab wrote for Service `key` (both
/// families, from the Endpoints it last computed).
fn slice_files(p: &ProxyState, key: &str) -> Vec<String> {
    let ns = key.split_once('/').map_or("", |(ns, _)| ns);
    [
        (Family::Ipv4, p.endpoints.get(key)),
        (Family::Ipv6, p.endpoints6.get(key)),
    ]
    .into_iter()
    .filter_map(|(f, e)| e.map(|e| (f, e)))
    .flat_map(|(f, e)| service::endpoint_slices(e, f, SliceApi::V1))
    .map(|s| slice_file(ns, &s))
    .collect()
}
