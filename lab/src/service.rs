//! Services and their Endpoints: what the lab checks in a Service the user
//! applies, and the Endpoints object it computes for it, playing
//! Kubernetes' endpoints controller (v1.20) for a lab started with
//! `up --kube-proxy`. Pure: no processes, no files.
//!
//! Checked here (each error names the field and the offending value):
//! `spec.type` (ClusterIP, NodePort or LoadBalancer), `spec.clusterIP`,
//! `spec.selector`, `spec.ports[]` (`port`, `protocol`, `name`,
//! `targetPort`, `nodePort`), `spec.sessionAffinity`,
//! `spec.externalTrafficPolicy`, `spec.internalTrafficPolicy`,
//! `spec.externalIPs`, `spec.loadBalancerIP`, and the families
//! (`spec.ipFamilies`, `spec.ipFamilyPolicy`, `spec.clusterIPs`, resolved
//! as the API server does: [`ServiceSpec::families`]). Everything else
//! is passed to the API server unchanged, which validates it again.
//!
//! Endpoints, as the endpoints controller makes them: the ready pods (the
//! lab's pods that have an address) in the Service's namespace whose labels
//! match `spec.selector`; per Service port, `targetPort` a number is used as
//! is, a name is looked up among the pod's declared container ports of the
//! same protocol (a pod without it is left out for that port); addresses
//! with the same resolved ports share one subset. Every address carries its
//! `nodeName` (kube-proxy's `externalTrafficPolicy: Local` picks local
//! endpoints by it) and a `targetRef` to its Pod. A Service without a
//! selector gets no Endpoints from the lab: the user applies them, as in
//! Kubernetes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::{json, Map, Value};

use crate::manifest::Object;
use crate::state::{IpFamily, PortState};

/// `spec.ports[].targetPort`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    /// A container port name (IANA service name).
    Name(String),
}

/// One entry of `spec.ports`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
    pub target: TargetPort,
    pub node_port: Option<u16>,
}

/// What the lab needs to know of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    pub namespace: String,
    pub name: String,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`.
    pub service_type: String,
    /// `None` when the Service has no selector (the user's Endpoints).
    pub selector: Option<BTreeMap<String, String>>,
    pub ports: Vec<ServicePort>,
    /// `spec.externalIPs` (of the lab's primary family: the caller
    /// checks).
    pub external_ips: Vec<IpAddr>,
    /// `spec.loadBalancerIP` (LoadBalancer only).
    pub load_balancer_ip: Option<IpAddr>,
    /// The address families the Service asks for, primary first
    /// ([`requested_families`]).
    pub families: Vec<Family>,
}

/// An address family of a Service, an Endpoints address or an
/// EndpointSlice (`spec.ipFamilies`, `addressType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    Ipv4,
    Ipv6,
}

impl Family {
    /// The API's name (`IPv4`, `IPv6`).
    pub fn api_name(self) -> &'static str {
        match self {
            Family::Ipv4 => "IPv4",
            Family::Ipv6 => "IPv6",
        }
    }

    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        }
    }

    /// The primary family of a lab of `lab`'s families: its Services'
    /// (and Endpoints objects') first family, IPv6 in an IPv6-only lab.
    pub fn primary(lab: IpFamily) -> Family {
        match lab {
            IpFamily::Ipv6 => Family::Ipv6,
            IpFamily::Ipv4 | IpFamily::Dual => Family::Ipv4,
        }
    }

    /// Every family a lab of `lab`'s families has, the primary first.
    pub fn all(lab: IpFamily) -> Vec<Family> {
        match lab {
            IpFamily::Ipv4 => vec![Family::Ipv4],
            IpFamily::Dual => vec![Family::Ipv4, Family::Ipv6],
            IpFamily::Ipv6 => vec![Family::Ipv6],
        }
    }

    /// Lower case, for object names (`ipv4`, `ipv6`).
    fn suffix(self) -> &'static str {
        match self {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        }
    }
}

impl ServiceSpec {
    /// Whether its ports get NodePorts (NodePort and LoadBalancer).
    pub fn has_node_ports(&self) -> bool {
        matches!(self.service_type.as_str(), "NodePort" | "LoadBalancer")
    }
}

impl ServiceSpec {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl Backend {
    /// Its address of `family`, if it has one.
    fn address(&self, family: Family) -> Option<&str> {
        match family {
            Family::Ipv4 => self.ip.as_deref(),
            Family::Ipv6 => self.ip6.as_deref(),
        }
    }
}

/// A pod as an endpoint candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    /// `None` while the pod has no address (not ready).
    pub ip: Option<String>,
    /// Its IPv6 address (a dual-stack lab).
    pub ip6: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub ports: Vec<PortState>,
}

/// The API server's default NodePort range.
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<u64> = 30000..=32767;

/// A DNS-1035 label (Service names, port names): 1-63 of `[a-z0-9-]`,
/// starting with a letter, ending alphanumeric.
fn is_dns1035_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| alnum(c) || c == '-')
        && s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars().last().is_some_and(alnum)
}

/// An IANA service name (named target ports): 1-15 of `[a-z0-9-]`, at
/// least one letter, no `-` at either end or twice in a row.
pub fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.chars().any(|c| c.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

fn port_number(v: &Value) -> Option<u16> {
    v.as_u64()
        .filter(|n| (1..=65535).contains(n))
        .and_then(|n| u16::try_from(n).ok())
}

fn string_map(v: &Value) -> Option<BTreeMap<String, String>> {
    v.as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// Checks a Service the user applies and extracts what the lab needs.
pub fn parse_service(obj: &Object) -> anyhow::Result<ServiceSpec> {
    let what = format!("{} ({})", obj.display_name(), obj.source);
    let bad = |msg: String| anyhow::anyhow!("{what}: {msg}");
    if !is_dns1035_label(&obj.name) {
        return Err(bad(format!(
            "a Service name must be a DNS-1035 label (1-63 of a-z, 0-9 and '-', starting with a letter), got {:?}",
            obj.name
        )));
    }
    let spec = match obj.body.get("spec") {
        Some(s) if s.is_object() => s,
        Some(s) => return Err(bad(format!("spec must be a mapping, got {s}"))),
        None => return Err(bad("spec is missing (spec.ports is required)".into())),
    };
    let str_field = |key: &str| -> anyhow::Result<Option<String>> {
        match spec.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(bad(format!("spec.{key} must be a string, got {v}"))),
        }
    };
    let service_type = str_field("type")?.unwrap_or_else(|| "ClusterIP".into());
    if !matches!(
        service_type.as_str(),
        "ClusterIP" | "NodePort" | "LoadBalancer"
    ) {
        return Err(bad(format!(
            "spec.type {service_type:?} is not supported by the lab (ClusterIP, NodePort or LoadBalancer; there is no external DNS)"
        )));
    }
    let node_ports = matches!(service_type.as_str(), "NodePort" | "LoadBalancer");
    let external_ips = match spec.get("externalIPs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .and_then(|s| s.parse::<IpAddr>().ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "spec.externalIPs[{i}] must be an IP address, got {v}"
                        ))
                    })
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
        Some(v) => return Err(bad(format!("spec.externalIPs must be a list, got {v}"))),
    };
    let load_balancer_ip = match str_field("loadBalancerIP")? {
        None => None,
        Some(s) if s.is_empty() => None,
        Some(s) => {
            if service_type != "LoadBalancer" {
                return Err(bad(format!(
                    "spec.loadBalancerIP applies to LoadBalancer Services only (this one is {service_type})"
                )));
            }
            Some(s.parse::<IpAddr>().map_err(|_| {
                bad(format!(
                    "spec.loadBalancerIP must be an IP address, got {s:?}"
                ))
            })?)
        }
    };
    if let Some(p) = str_field("internalTrafficPolicy")? {
        if !matches!(p.as_str(), "Cluster" | "Local") {
            return Err(bad(format!(
                "spec.internalTrafficPolicy must be Cluster or Local, got {p:?}"
            )));
        }
    }
    let cluster_ip = match str_field("clusterIP")? {
        None => None,
        Some(ip) if ip.is_empty() || ip == "None" => None,
        Some(ip) => Some(ip.parse::<IpAddr>().map_err(|_| {
            bad(format!(
                "spec.clusterIP must be an IP address, \"None\" or empty, got {ip:?}"
            ))
        })?),
    };
    let families = requested_families(spec, cluster_ip).map_err(bad)?;
    let selector = match spec.get("selector") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let m = string_map(v).ok_or_else(|| {
                bad(format!(
                    "spec.selector must map label keys to string values, got {v}"
                ))
            })?;
            // An empty selector selects nothing in the endpoints controller
            // (it treats it as "no selector"), as here.
            (!m.is_empty()).then_some(m)
        }
    };
    if let Some(a) = str_field("sessionAffinity")? {
        if !matches!(a.as_str(), "None" | "ClientIP") {
            return Err(bad(format!(
                "spec.sessionAffinity must be None or ClientIP, got {a:?}"
            )));
        }
    }
    if let Some(p) = str_field("externalTrafficPolicy")? {
        if !matches!(p.as_str(), "Cluster" | "Local") {
            return Err(bad(format!(
                "spec.externalTrafficPolicy must be Cluster or Local, got {p:?}"
            )));
        }
        if !node_ports && external_ips.is_empty() {
            return Err(bad(format!(
                "spec.externalTrafficPolicy applies to traffic from outside only: NodePort and LoadBalancer Services, or with spec.externalIPs (this one is {service_type})"
            )));
        }
    }
    let ports = match spec.get("ports") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            return Err(bad("spec.ports must list at least one port".into()))
        }
        Some(v) => return Err(bad(format!("spec.ports must be a list, got {v}"))),
    };
    let mut out: Vec<ServicePort> = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let f = format!("spec.ports[{i}]");
        if !p.is_object() {
            return Err(bad(format!("{f} must be a mapping, got {p}")));
        }
        let port = p.get("port").and_then(port_number).ok_or_else(|| {
            bad(format!(
                "{f}.port must be a number 1-65535, got {}",
                p.get("port").unwrap_or(&Value::Null)
            ))
        })?;
        let protocol = match p.get("protocol") {
            None | Some(Value::Null) => "TCP".to_string(),
            Some(Value::String(s)) if matches!(s.as_str(), "TCP" | "UDP" | "SCTP") => s.clone(),
            Some(v) => {
                return Err(bad(format!(
                    "{f}.protocol must be TCP, UDP or SCTP, got {v}"
                )))
            }
        };
        let name = match p.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if is_dns1035_label(s) => Some(s.clone()),
            Some(v) => {
                return Err(bad(format!(
                    "{f}.name must be a DNS-1035 label (a-z, 0-9, '-', starting with a letter), got {v}"
                )))
            }
        };
        if name.is_none() && ports.len() > 1 {
            return Err(bad(format!(
                "{f}.name is required when a Service has more than one port"
            )));
        }
        let target = match p.get("targetPort") {
            None | Some(Value::Null) => TargetPort::Number(port),
            Some(Value::String(s)) if is_port_name(s) => TargetPort::Name(s.clone()),
            Some(v) => match port_number(v) {
                Some(n) => TargetPort::Number(n),
                None => {
                    return Err(bad(format!(
                        "{f}.targetPort must be a number 1-65535 or a container port name (1-15 of a-z, 0-9, '-', with a letter), got {v}"
                    )))
                }
            },
        };
        let node_port = match p.get("nodePort") {
            None | Some(Value::Null) => None,
            Some(v) => {
                if !node_ports {
                    return Err(bad(format!(
                        "{f}.nodePort needs spec.type NodePort or LoadBalancer (this one is {service_type})"
                    )));
                }
                let n = v
                    .as_u64()
                    .filter(|n| NODE_PORT_RANGE.contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                        "{f}.nodePort must be in {}-{} (the API server's NodePort range), got {v}",
                        NODE_PORT_RANGE.start(),
                        NODE_PORT_RANGE.end()
                    ))
                    })?;
                u16::try_from(n).ok()
            }
        };
        if let Some(dup) = out
            .iter()
            .find(|o| o.port == port && o.protocol == protocol)
        {
            return Err(bad(format!(
                "{f}: port {port}/{protocol} is listed twice (also as {:?})",
                dup.name.as_deref().unwrap_or("")
            )));
        }
        if name.is_some() && out.iter().any(|o| o.name == name) {
            return Err(bad(format!(
                "{f}.name {:?} is used by another port",
                name.as_deref().unwrap_or("")
            )));
        }
        out.push(ServicePort {
            name,
            protocol,
            port,
            target,
            node_port,
        });
    }
    Ok(ServiceSpec {
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        service_type,
        selector,
        ports: out,
        external_ips,
        load_balancer_ip,
        families,
    })
}

/// The families a Service asks for, primary first, as the API server
/// (v1.20 with `IPv6DualStack`, the lab's primary family IPv4) resolves
/// them: `spec.ipFamilies` when given; otherwise both for
/// `ipFamilyPolicy` `PreferDualStack`/`RequireDualStack`; otherwise the
/// family of `spec.clusterIP` (or `spec.clusterIPs[0]`), else IPv4.
/// The errors name the field.
fn requested_families(spec: &Value, cluster_ip: Option<IpAddr>) -> Result<Vec<Family>, String> {
    let policy = match spec.get("ipFamilyPolicy") {
        None | Some(Value::Null) => None,
        Some(Value::String(p))
            if matches!(
                p.as_str(),
                "SingleStack" | "PreferDualStack" | "RequireDualStack"
            ) =>
        {
            Some(p.as_str())
        }
        Some(v) => {
            return Err(format!(
            "spec.ipFamilyPolicy must be SingleStack, PreferDualStack or RequireDualStack, got {v}"
        ))
        }
    };
    let mut families: Vec<Family> = Vec::new();
    match spec.get("ipFamilies") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, v) in a.iter().enumerate() {
                let f = match v.as_str() {
                    Some("IPv4") => Family::Ipv4,
                    Some("IPv6") => Family::Ipv6,
                    _ => {
                        return Err(format!(
                            "spec.ipFamilies[{i}] must be IPv4 or IPv6, got {v}"
                        ))
                    }
                };
                if families.contains(&f) {
                    return Err(format!("spec.ipFamilies lists {} twice", f.api_name()));
                }
                families.push(f);
            }
        }
        Some(v) => return Err(format!("spec.ipFamilies must be a list, got {v}")),
    }
    let mut cluster_ips: Vec<IpAddr> = cluster_ip.into_iter().collect();
    match spec.get("clusterIPs") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            let first = a.first().and_then(Value::as_str).unwrap_or("");
            let named = spec.get("clusterIP").and_then(Value::as_str).unwrap_or("");
            if !a.is_empty() && first != named {
                return Err(format!(
                    "spec.clusterIP must be spec.clusterIPs[0] ({first:?}) when spec.clusterIPs is given, got {named:?}"
                ));
            }
            cluster_ips.clear();
            for (i, v) in a.iter().enumerate() {
                match v.as_str() {
                    Some("None") if a.len() == 1 => {}
                    Some(s) => cluster_ips.push(s.parse().map_err(|_| {
                        format!("spec.clusterIPs[{i}] must be an IP address, got {v}")
                    })?),
                    None => return Err(format!("spec.clusterIPs[{i}] must be a string, got {v}")),
                }
            }
        }
        Some(v) => return Err(format!("spec.clusterIPs must be a list, got {v}")),
    }
    if families.is_empty() {
        families = match (policy, cluster_ips.first()) {
            (Some("PreferDualStack" | "RequireDualStack"), _) => {
                let first = cluster_ips
                    .first()
                    .map_or(Family::Ipv4, |ip| Family::of(*ip));
                let other = if first == Family::Ipv4 {
                    Family::Ipv6
                } else {
                    Family::Ipv4
                };
                vec![first, other]
            }
            (_, Some(_)) => {
                let mut v: Vec<Family> = Vec::new();
                for f in cluster_ips.iter().map(|ip| Family::of(*ip)) {
                    if !v.contains(&f) {
                        v.push(f);
                    }
                }
                v
            }
            (_, None) => vec![Family::Ipv4],
        };
    }
    if policy == Some("SingleStack") && families.len() > 1 {
        return Err("spec.ipFamilyPolicy SingleStack allows one family, and spec.ipFamilies (or spec.clusterIPs) has two".into());
    }
    if policy == Some("RequireDualStack") && families.len() < 2 {
        return Err("spec.ipFamilyPolicy RequireDualStack needs both families, and spec.ipFamilies names one".into());
    }
    for (i, ip) in cluster_ips.iter().enumerate() {
        if families.get(i) != Some(&Family::of(*ip)) {
            return Err(format!(
                "spec.clusterIPs[{i}] {ip} is not of the family spec.ipFamilies[{i}] asks for"
            ));
        }
    }
    Ok(families)
}

/// Checks an Endpoints object the user applies (for a Service without a
/// selector): `subsets[].addresses[].ip` of a family the lab's pods have
/// (`lab`: IPv4, either in a dual-stack lab, IPv6 in an IPv6-only one),
/// `subsets[].ports[]` with a port number. The API server checks the
/// rest.
pub fn check_endpoints(obj: &Object, lab: IpFamily) -> anyhow::Result<()> {
    let what = format!("{} ({})", obj.display_name(), obj.source);
    let subsets = match obj.body.get("subsets") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(a)) => a,
        Some(v) => anyhow::bail!("{what}: subsets must be a list, got {v}"),
    };
    for (i, s) in subsets.iter().enumerate() {
        for (j, a) in s
            .get("addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let ip = a.get("ip").and_then(Value::as_str).unwrap_or("");
            let ok = match ip.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => lab.has_ipv4(),
                Ok(IpAddr::V6(_)) => lab.has_ipv6(),
                Err(_) => false,
            };
            if !ok {
                anyhow::bail!(
                    "{what}: subsets[{i}].addresses[{j}].ip must be an {} address, got {}",
                    match lab {
                        IpFamily::Ipv4 => "IPv4 (the lab is IPv4-only)",
                        IpFamily::Dual => "IP",
                        IpFamily::Ipv6 => "IPv6 (the lab is IPv6-only)",
                    },
                    a.get("ip").unwrap_or(&Value::Null)
                );
            }
        }
        for (j, p) in s
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if p.get("port").and_then(port_number).is_none() {
                anyhow::bail!(
                    "{what}: subsets[{i}].ports[{j}].port must be a number 1-65535, got {}",
                    p.get("port").unwrap_or(&Value::Null)
                );
            }
        }
    }
    Ok(())
}

/// What an IPv6-only API server (its one Service range IPv6) does to a
/// Service before the lab parses it: a Service naming no family
/// (`spec.ipFamilies`) gets `[IPv6]`, as does `PreferDualStack` (a
/// single-stack cluster gives it the one family it has); a Service asking
/// for IPv4 (`spec.ipFamilies`, an IPv4 `spec.clusterIP(s)`), or for both
/// (`RequireDualStack`), is refused, naming the field. `spec.externalIPs`
/// and `spec.loadBalancerIP` must be IPv6.
pub fn default_ipv6_only(body: &mut Value) -> Result<(), String> {
    let Some(spec) = body.get_mut("spec").and_then(Value::as_object_mut) else {
        // parse_service names what is missing.
        return Ok(());
    };
    if spec.get("ipFamilyPolicy").and_then(Value::as_str) == Some("RequireDualStack") {
        return Err(
            "spec.ipFamilyPolicy RequireDualStack needs a dual-stack cluster, and the lab is IPv6-only"
                .into(),
        );
    }
    let v4 = |v: &Value| {
        v.as_str()
            .and_then(|s| s.parse::<IpAddr>().ok())
            .is_some_and(|ip| ip.is_ipv4())
    };
    if let Some(a) = spec.get("ipFamilies").and_then(Value::as_array) {
        if let Some(i) = a.iter().position(|f| f.as_str() == Some("IPv4")) {
            return Err(format!(
                "spec.ipFamilies[{i}] IPv4: the lab is IPv6-only (its Services are IPv6)"
            ));
        }
    }
    for key in ["clusterIP", "loadBalancerIP"] {
        if spec.get(key).is_some_and(v4) {
            return Err(format!(
                "spec.{key} {}: the lab is IPv6-only (its Services are IPv6)",
                spec[key]
            ));
        }
    }
    for key in ["clusterIPs", "externalIPs"] {
        if let Some(i) = spec
            .get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().position(v4))
        {
            return Err(format!(
                "spec.{key}[{i}] {}: the lab is IPv6-only (its Services are IPv6)",
                spec[key][i]
            ));
        }
    }
    let named = spec
        .get("ipFamilies")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if !named {
        spec.insert("ipFamilies".into(), json!(["IPv6"]));
    }
    Ok(())
}

/// Whether `labels` match every `selector` entry.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The port a backend serves `p` on, if it has it.
fn resolve(p: &ServicePort, b: &Backend) -> Option<u16> {
    match &p.target {
        TargetPort::Number(n) => Some(*n),
        TargetPort::Name(n) => b
            .ports
            .iter()
            .find(|c| c.name.as_deref() == Some(n.as_str()) && c.protocol == p.protocol)
            .map(|c| c.port),
    }
}

/// The Endpoints object of `svc` (which has a selector) given every pod of
/// the lab, with the pods' addresses of `family`; deterministic (subsets
/// and addresses sorted). IPv4 is the Endpoints object the API holds (the
/// endpoints controller lists the Service's primary family, IPv4 in the
/// lab); IPv6 has the same shape and becomes EndpointSlices only
/// ([`endpoint_slices`]).
pub fn endpoints_object(svc: &ServiceSpec, backends: &[Backend], family: Family) -> Value {
    let empty = BTreeMap::new();
    let selector = svc.selector.as_ref().unwrap_or(&empty);
    // Resolved ports (name, port, protocol) -> addresses.
    type PortKey = Vec<(Option<String>, u16, String)>;
    let mut groups: BTreeMap<PortKey, Vec<Value>> = BTreeMap::new();
    let mut chosen: Vec<&Backend> = backends
        .iter()
        .filter(|b| {
            b.namespace == svc.namespace && b.address(family).is_some() && !selector.is_empty()
        })
        .filter(|b| selects(selector, &b.labels))
        .collect();
    chosen.sort_by(|a, b| {
        let ip = |x: &Backend| x.address(family).and_then(|s| s.parse::<IpAddr>().ok());
        ip(a).cmp(&ip(b)).then(a.name.cmp(&b.name))
    });
    for b in chosen {
        let key: PortKey = svc
            .ports
            .iter()
            .filter_map(|p| resolve(p, b).map(|n| (p.name.clone(), n, p.protocol.clone())))
            .collect();
        if key.is_empty() {
            continue;
        }
        groups.entry(key).or_default().push(json!({
            "ip": b.address(family),
            "nodeName": b.node,
            "targetRef": {
                "kind": "Pod",
                "namespace": b.namespace,
                "name": b.name,
                "uid": b.uid,
            },
        }));
    }
    let subsets: Vec<Value> = groups
        .into_iter()
        .map(|(ports, addresses)| {
            let ports: Vec<Value> = ports
                .into_iter()
                .map(|(name, port, protocol)| {
                    let mut m = Map::new();
                    if let Some(n) = name {
                        m.insert("name".into(), json!(n));
                    }
                    m.insert("port".into(), json!(port));
                    m.insert("protocol".into(), json!(protocol));
                    Value::Object(m)
                })
                .collect();
            json!({ "addresses": addresses, "ports": ports })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {
            "name": svc.name,
            "namespace": svc.namespace,
            "labels": { "app.kubernetes.io/managed-by": "oxvs-lab" },
        },
        "subsets": subsets,
    })
}

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label that says who manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The lab's value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY_LAB: &str = "oxvs-lab";

/// The EndpointSlice API version the lab writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SliceApi {
    /// `discovery.k8s.io/v1beta1`, what kube-proxy 1.20 reads: an
    /// endpoint's node in `topology` `kubernetes.io/hostname`.
    V1beta1,
    /// `discovery.k8s.io/v1` (the agents' manifest source): the node in
    /// `nodeName`.
    V1,
}

/// The EndpointSlices (of `api`'s version) of an Endpoints-shaped object
/// `ep` for `family`: one slice per subset that has addresses of that
/// family, named `<service>-<ipv4|ipv6>-<i>`, each address ready and
/// carrying its node (kube-proxy reads it for `externalTrafficPolicy:
/// Local`) and `targetRef`. This is what Kubernetes' EndpointSlice
/// controller (a Service with a selector) or mirroring controller (the
/// user's Endpoints) would write.
pub fn endpoint_slices(ep: &Value, family: Family, api: SliceApi) -> Vec<Value> {
    let name = ep.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
    let namespace = ep
        .pointer("/metadata/namespace")
        .cloned()
        .unwrap_or(Value::Null);
    let service = name.as_str().unwrap_or("");
    let mut out = Vec::new();
    for subset in ep
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let endpoints: Vec<Value> = subset
            .get("addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|a| {
                a.get("ip")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse::<IpAddr>().ok())
                    .is_some_and(|ip| Family::of(ip) == family)
            })
            .map(|a| {
                let mut e = Map::new();
                e.insert("addresses".into(), json!([a["ip"]]));
                e.insert("conditions".into(), json!({ "ready": true }));
                if let Some(node) = a.get("nodeName").and_then(Value::as_str) {
                    match api {
                        SliceApi::V1beta1 => {
                            e.insert("topology".into(), json!({ "kubernetes.io/hostname": node }))
                        }
                        SliceApi::V1 => e.insert("nodeName".into(), json!(node)),
                    };
                }
                if let Some(r) = a.get("targetRef") {
                    e.insert("targetRef".into(), r.clone());
                }
                Value::Object(e)
            })
            .collect();
        if endpoints.is_empty() {
            continue;
        }
        let ports = subset.get("ports").cloned().unwrap_or_else(|| json!([]));
        out.push(json!({
            "apiVersion": match api {
                SliceApi::V1beta1 => "discovery.k8s.io/v1beta1",
                SliceApi::V1 => "discovery.k8s.io/v1",
            },
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{service}-{}-{}", family.suffix(), out.len()),
                "namespace": namespace,
                "labels": {
                    SERVICE_NAME_LABEL: service,
                    MANAGED_BY_LABEL: MANAGED_BY_LAB,
                },
            },
            "addressType": family.api_name(),
            "endpoints": endpoints,
            "ports": ports,
        }));
    }
    out
}

/// The number of addresses in an Endpoints object.
pub fn address_count(endpoints: &Value) -> usize {
    endpoints
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("addresses").and_then(Value::as_array))
        .map(Vec::len)
        .sum()
}

/// The endpoints controller's pass over `services` (`ns/name` -> the
/// Service as stored): the Endpoints object ([`endpoints_object`] of
/// `family`) of every Service with a selector that asks for `family`
/// whose computed Endpoints differ from `current`'s, by key.
pub fn changed_endpoints(
    services: &BTreeMap<String, Value>,
    current: &BTreeMap<String, Value>,
    backends: &[Backend],
    family: Family,
) -> Vec<(String, Value)> {
    let mut changed = Vec::new();
    for (key, body) in services {
        let Some((ns, name)) = key.split_once('/') else {
            continue;
        };
        let obj = Object {
            kind: crate::manifest::Kind::Service,
            namespace: ns.to_string(),
            name: name.to_string(),
            body: body.clone(),
            source: format!("Service {key}"),
        };
        let Ok(spec) = parse_service(&obj) else {
            continue;
        };
        if spec.selector.is_none() || !spec.families.contains(&family) {
            continue;
        }
        let ep = endpoints_object(&spec, backends, family);
        if current.get(key) != Some(&ep) {
            changed.push((key.clone(), ep));
        }
    }
    changed
}

/// The keys (`ns/name`) of `services` in namespace `ns`.
pub fn keys_in_namespace(services: &BTreeMap<String, Value>, ns: &str) -> Vec<String> {
    services
        .keys()
        .filter(|key| key.split_once('/').is_some_and(|(n, _)| n == ns))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse_documents;

    fn svc(yaml: &str) -> anyhow::Result<ServiceSpec> {
        let objs = parse_documents(yaml, "s.yaml")?;
        parse_service(&objs[0])
    }

    fn backend(name: &str, node: &str, ip: Option<&str>, labels: &[(&str, &str)]) -> Backend {
        Backend {
            namespace: "web".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: node.into(),
            ip: ip.map(str::to_string),
            ip6: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ports: vec![
                PortState {
                    protocol: "TCP".into(),
                    port: 8080,
                    name: Some("http".into()),
                },
                PortState {
                    protocol: "UDP".into(),
                    port: 8081,
                    name: Some("http".into()),
                },
            ],
        }
    }

    const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: web}
spec:
  type: NodePort
  selector: {app: a}
  sessionAffinity: ClientIP
  externalTrafficPolicy: Local
  ports:
  - {name: http, port: 80, targetPort: http, nodePort: 30080}
  - {name: udp, port: 80, protocol: UDP, targetPort: http}
  - {name: raw, port: 81, targetPort: 9000}
"#;

    #[test]
    fn a_good_service_parses() {
        let s = svc(GOOD).expect("parses");
        assert_eq!(s.key(), "web/web");
        assert_eq!(s.service_type, "NodePort");
        assert_eq!(
            s.selector,
            Some(BTreeMap::from([("app".to_string(), "a".to_string())]))
        );
        assert_eq!(s.ports.len(), 3);
        assert_eq!(s.ports[0].target, TargetPort::Name("http".into()));
        assert_eq!(s.ports[0].node_port, Some(30080));
        assert_eq!(s.ports[1].protocol, "UDP");
        assert_eq!(s.ports[2].target, TargetPort::Number(9000));
        // targetPort defaults to port; no selector is "the user's Endpoints".
        let s = svc("apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 53, protocol: UDP}]}\n")
            .expect("parses");
        assert_eq!(s.ports[0].target, TargetPort::Number(53));
        assert_eq!(s.selector, None);
        assert_eq!(s.service_type, "ClusterIP");
    }

    #[test]
    fn bad_services_are_refused_with_the_field_named() {
        let base = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n";
        for (spec, want) in [
            ("", "spec is missing"),
            ("spec: 3\n", "spec must be a mapping"),
            ("spec: {}\n", "spec.ports must list"),
            ("spec: {ports: []}\n", "spec.ports must list"),
            ("spec: {ports: {port: 80}}\n", "spec.ports must be a list"),
            ("spec: {ports: [80]}\n", "spec.ports[0] must be a mapping"),
            ("spec: {ports: [{port: 0}]}\n", "spec.ports[0].port"),
            ("spec: {ports: [{port: \"80\"}]}\n", "spec.ports[0].port"),
            ("spec: {ports: [{port: 70000}]}\n", "70000"),
            (
                "spec: {ports: [{port: 80, protocol: ICMP}]}\n",
                "spec.ports[0].protocol",
            ),
            (
                "spec: {ports: [{port: 80, targetPort: -1}]}\n",
                "spec.ports[0].targetPort",
            ),
            (
                "spec: {ports: [{port: 80, targetPort: \"8080\"}]}\n",
                "targetPort",
            ),
            (
                "spec: {ports: [{port: 80, targetPort: Http_Port}]}\n",
                "targetPort",
            ),
            (
                "spec: {ports: [{port: 80, name: a}, {port: 81}]}\n",
                "spec.ports[1].name is required",
            ),
            (
                "spec: {ports: [{port: 80, name: a}, {port: 81, name: a}]}\n",
                "used by another port",
            ),
            (
                "spec: {ports: [{port: 80, name: a}, {port: 80, name: b}]}\n",
                "listed twice",
            ),
            (
                "spec: {ports: [{port: 80, name: A}]}\n",
                "spec.ports[0].name",
            ),
            (
                "spec: {ports: [{port: 80, nodePort: 30080}]}\n",
                "needs spec.type NodePort",
            ),
            (
                "spec: {type: NodePort, ports: [{port: 80, nodePort: 80}]}\n",
                "30000-32767",
            ),
            (
                "spec: {type: ExternalName, ports: [{port: 80}]}\n",
                "not supported",
            ),
            (
                "spec: {externalIPs: [192.0.2.300], ports: [{port: 80}]}\n",
                "spec.externalIPs[0]",
            ),
            (
                "spec: {externalIPs: 192.0.2.3, ports: [{port: 80}]}\n",
                "spec.externalIPs must be a list",
            ),
            (
                "spec: {loadBalancerIP: 192.0.2.3, ports: [{port: 80}]}\n",
                "LoadBalancer Services only",
            ),
            (
                "spec: {type: LoadBalancer, loadBalancerIP: x, ports: [{port: 80}]}\n",
                "spec.loadBalancerIP",
            ),
            (
                "spec: {internalTrafficPolicy: Near, ports: [{port: 80}]}\n",
                "spec.internalTrafficPolicy",
            ),
            (
                "spec: {type: [x], ports: [{port: 80}]}\n",
                "spec.type must be a string",
            ),
            (
                "spec: {selector: [a], ports: [{port: 80}]}\n",
                "spec.selector",
            ),
            (
                "spec: {selector: {a: 1}, ports: [{port: 80}]}\n",
                "spec.selector",
            ),
            (
                "spec: {clusterIP: 10.0.0.300, ports: [{port: 80}]}\n",
                "spec.clusterIP",
            ),
            (
                "spec: {sessionAffinity: Sticky, ports: [{port: 80}]}\n",
                "spec.sessionAffinity",
            ),
            (
                "spec: {type: NodePort, externalTrafficPolicy: Nearby, ports: [{port: 80}]}\n",
                "externalTrafficPolicy",
            ),
            (
                "spec: {externalTrafficPolicy: Local, ports: [{port: 80}]}\n",
                "traffic from outside only",
            ),
        ] {
            let e = svc(&format!("{base}{spec}")).expect_err(spec).to_string();
            assert!(e.contains(want), "{spec}: {e}");
            assert!(
                e.contains("Service default/s") && e.contains("s.yaml#1"),
                "{e}"
            );
        }
        let e = svc(
            "apiVersion: v1\nkind: Service\nmetadata: {name: 1web}\nspec: {ports: [{port: 80}]}\n",
        )
        .expect_err("name")
        .to_string();
        assert!(e.contains("DNS-1035"), "{e}");
    }

    #[test]
    fn bad_endpoints_are_refused() {
        let base = "apiVersion: v1\nkind: Endpoints\nmetadata: {name: s}\n";
        let ok = parse_documents(
            &format!(
                "{base}subsets: [{{addresses: [{{ip: 192.168.77.12}}], ports: [{{port: 80}}]}}]\n"
            ),
            "e",
        )
        .expect("parse");
        check_endpoints(&ok[0], IpFamily::Ipv4).expect("valid");
        check_endpoints(&ok[0], IpFamily::Dual).expect("valid");
        let e = check_endpoints(&ok[0], IpFamily::Ipv6)
            .expect_err("IPv4 in an IPv6-only lab")
            .to_string();
        assert!(e.contains("IPv6 (the lab is IPv6-only)"), "{e}");
        let v6 = parse_documents(
            &format!("{base}subsets: [{{addresses: [{{ip: 'fd00:192:168:77::12'}}]}}]\n"),
            "e",
        )
        .expect("parse");
        check_endpoints(&v6[0], IpFamily::Ipv6).expect("valid");
        check_endpoints(&v6[0], IpFamily::Dual).expect("valid");
        assert!(check_endpoints(&v6[0], IpFamily::Ipv4).is_err());
        for (body, want) in [
            ("subsets: 3\n", "subsets must be a list"),
            (
                "subsets: [{addresses: [{ip: node-2}]}]\n",
                "addresses[0].ip",
            ),
            ("subsets: [{ports: [{port: x}]}]\n", "ports[0].port"),
        ] {
            let o = parse_documents(&format!("{base}{body}"), "e").expect("parse");
            let e = check_endpoints(&o[0], IpFamily::Ipv4)
                .expect_err(body)
                .to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn endpoints_follow_the_selector_named_ports_and_readiness() {
        let s = svc(GOOD).expect("parses");
        let pods = vec![
            backend("a2", "node-2", Some("10.244.2.5"), &[("app", "a")]),
            backend(
                "a1",
                "node-1",
                Some("10.244.1.9"),
                &[("app", "a"), ("x", "y")],
            ),
            // Not ready, wrong labels, other namespace: left out.
            backend("a3", "node-1", None, &[("app", "a")]),
            backend("b1", "node-1", Some("10.244.1.10"), &[("app", "b")]),
            Backend {
                namespace: "other".into(),
                ..backend("a4", "node-1", Some("10.244.1.11"), &[("app", "a")])
            },
            // No port named http: only the numeric port resolves.
            Backend {
                ports: vec![],
                ..backend("a5", "node-2", Some("10.244.2.6"), &[("app", "a")])
            },
        ];
        let ep = endpoints_object(&s, &pods, Family::Ipv4);
        assert_eq!(ep["metadata"]["name"], "web");
        assert_eq!(ep["metadata"]["namespace"], "web");
        let subsets = ep["subsets"].as_array().expect("subsets");
        assert_eq!(subsets.len(), 2, "{ep}");
        assert_eq!(address_count(&ep), 3);
        let full = subsets
            .iter()
            .find(|s| s["ports"].as_array().is_some_and(|p| p.len() == 3))
            .expect("a subset with all three ports");
        let ips: Vec<&str> = full["addresses"]
            .as_array()
            .expect("addresses")
            .iter()
            .filter_map(|a| a["ip"].as_str())
            .collect();
        assert_eq!(ips, vec!["10.244.1.9", "10.244.2.5"]);
        assert_eq!(full["addresses"][0]["nodeName"], "node-1");
        assert_eq!(full["addresses"][0]["targetRef"]["name"], "a1");
        assert_eq!(full["addresses"][0]["targetRef"]["uid"], "uid-a1");
        let ports = full["ports"].as_array().expect("ports");
        assert!(ports.contains(&json!({"name": "http", "port": 8080, "protocol": "TCP"})));
        assert!(ports.contains(&json!({"name": "udp", "port": 8081, "protocol": "UDP"})));
        assert!(ports.contains(&json!({"name": "raw", "port": 9000, "protocol": "TCP"})));
        let partial = subsets
            .iter()
            .find(|s| s["ports"].as_array().is_some_and(|p| p.len() == 1))
            .expect("a5's subset");
        assert_eq!(partial["addresses"][0]["ip"], "10.244.2.6");
        // Deterministic; and no match gives an empty subset list.
        assert_eq!(ep, endpoints_object(&s, &pods, Family::Ipv4));
        let none = endpoints_object(&s, &pods[2..4], Family::Ipv4);
        assert_eq!(none["subsets"], json!([]));
        assert_eq!(address_count(&none), 0);
    }

    #[test]
    fn families_follow_the_api_servers_rules() {
        let fam = |spec: &str| {
            svc(&format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: s, namespace: web}}\nspec: {{ports: [{{port: 80}}], {spec}}}\n"
            ))
            .map(|s| s.families)
        };
        use Family::*;
        assert_eq!(fam("type: ClusterIP").expect("ok"), vec![Ipv4]);
        assert_eq!(
            fam("ipFamilyPolicy: PreferDualStack").expect("ok"),
            vec![Ipv4, Ipv6]
        );
        assert_eq!(
            fam("ipFamilyPolicy: RequireDualStack").expect("ok"),
            vec![Ipv4, Ipv6]
        );
        assert_eq!(fam("ipFamilies: [IPv6]").expect("ok"), vec![Ipv6]);
        assert_eq!(
            fam("ipFamilies: [IPv6, IPv4]").expect("ok"),
            vec![Ipv6, Ipv4]
        );
        assert_eq!(fam("clusterIP: 'fd00:10:96::10'").expect("ok"), vec![Ipv6]);
        assert_eq!(
            fam("ipFamilyPolicy: PreferDualStack, clusterIP: 'fd00:10:96::10'").expect("ok"),
            vec![Ipv6, Ipv4]
        );
        assert_eq!(
            fam("clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10, 'fd00:10:96::10']").expect("ok"),
            vec![Ipv4, Ipv6]
        );
        for (spec, needle) in [
            ("ipFamilyPolicy: Both", "spec.ipFamilyPolicy"),
            ("ipFamilies: [IPv5]", "spec.ipFamilies[0]"),
            ("ipFamilies: [IPv4, IPv4]", "twice"),
            ("ipFamilies: IPv4", "spec.ipFamilies must be a list"),
            (
                "ipFamilyPolicy: SingleStack, ipFamilies: [IPv4, IPv6]",
                "SingleStack",
            ),
            (
                "ipFamilyPolicy: RequireDualStack, ipFamilies: [IPv6]",
                "RequireDualStack",
            ),
            ("clusterIPs: [10.96.0.300]", "spec.clusterIPs[0]"),
            (
                "ipFamilies: [IPv6], clusterIP: 10.96.0.10",
                "spec.clusterIPs[0]",
            ),
            ("clusterIP: 'fd00::zz'", "spec.clusterIP"),
        ] {
            let e = fam(spec).expect_err(spec).to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }

    #[test]
    fn endpoint_slices_carry_one_family_each() {
        let s = svc(GOOD).expect("parses");
        let pods = vec![
            Backend {
                ip6: Some("fd00:10:244:2::5".into()),
                ..backend("a2", "node-2", Some("10.244.2.5"), &[("app", "a")])
            },
            Backend {
                ip6: Some("fd00:10:244:1::9".into()),
                ..backend("a1", "node-1", Some("10.244.1.9"), &[("app", "a")])
            },
            // IPv4 only: in the IPv4 slice only.
            backend("a3", "node-1", Some("10.244.1.10"), &[("app", "a")]),
        ];
        let ep4 = endpoints_object(&s, &pods, Family::Ipv4);
        let ep6 = endpoints_object(&s, &pods, Family::Ipv6);
        assert_eq!(address_count(&ep4), 3);
        assert_eq!(address_count(&ep6), 2);
        let v4 = endpoint_slices(&ep4, Family::Ipv4, SliceApi::V1beta1);
        assert_eq!(v4.len(), 1, "{v4:?}");
        assert_eq!(v4[0]["addressType"], "IPv4");
        assert_eq!(v4[0]["metadata"]["name"], "web-ipv4-0");
        assert_eq!(v4[0]["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
        assert_eq!(v4[0]["endpoints"].as_array().map(Vec::len), Some(3));
        // An IPv6 object gives no IPv4 slice, and the other way round.
        assert!(endpoint_slices(&ep6, Family::Ipv4, SliceApi::V1beta1).is_empty());
        assert!(endpoint_slices(&ep4, Family::Ipv6, SliceApi::V1beta1).is_empty());
        let v6 = endpoint_slices(&ep6, Family::Ipv6, SliceApi::V1beta1);
        assert_eq!(v6.len(), 1, "{v6:?}");
        assert_eq!(v6[0]["addressType"], "IPv6");
        assert_eq!(v6[0]["metadata"]["name"], "web-ipv6-0");
        let e0 = &v6[0]["endpoints"][0];
        assert_eq!(e0["addresses"], json!(["fd00:10:244:1::9"]));
        assert_eq!(e0["conditions"]["ready"], true);
        assert_eq!(e0["topology"]["kubernetes.io/hostname"], "node-1");
        assert_eq!(e0["targetRef"]["name"], "a1");
        assert_eq!(v6[0]["ports"], ep6["subsets"][0]["ports"]);
        // v1: the node in nodeName.
        let v1 = endpoint_slices(&ep6, Family::Ipv6, SliceApi::V1);
        assert_eq!(v1[0]["apiVersion"], "discovery.k8s.io/v1");
        assert_eq!(v1[0]["endpoints"][0]["nodeName"], "node-1");
        assert!(v1[0]["endpoints"][0].get("topology").is_none());
        // A user's Endpoints with both families: mirrored per family.
        let user = json!({
            "metadata": {"name": "ext", "namespace": "web"},
            "subsets": [{"addresses": [{"ip": "192.0.2.1"}, {"ip": "2001:db8::1"}],
                         "ports": [{"port": 80, "protocol": "TCP"}]}],
        });
        assert_eq!(
            endpoint_slices(&user, Family::Ipv4, SliceApi::V1beta1)[0]["endpoints"][0]["addresses"],
            json!(["192.0.2.1"])
        );
        assert_eq!(
            endpoint_slices(&user, Family::Ipv6, SliceApi::V1beta1)[0]["endpoints"][0]["addresses"],
            json!(["2001:db8::1"])
        );
    }

    #[test]
    fn port_names() {
        for ok in ["http", "dns-tcp", "a1", "h-t-t-p"] {
            assert!(is_port_name(ok), "{ok}");
        }
        for bad in [
            "",
            "8080",
            "-a",
            "a-",
            "a--b",
            "HTTP",
            "a_b",
            "abcdefghijklmnop",
        ] {
            assert!(!is_port_name(bad), "{bad}");
        }
    }

    #[test]
    fn an_ipv6_only_api_server_defaults_services_to_ipv6() {
        let parsed = |spec: &str| -> Result<Vec<Family>, String> {
            let mut o = parse_documents(
                &format!("apiVersion: v1\nkind: Service\nmetadata: {{name: s}}\nspec: {spec}\n"),
                "s.yaml",
            )
            .expect("yaml")
            .remove(0);
            default_ipv6_only(&mut o.body)?;
            let spec = parse_service(&o).map_err(|e| e.to_string())?;
            assert_eq!(o.body["spec"]["ipFamilies"], json!(["IPv6"]));
            Ok(spec.families)
        };
        let v6 = Ok(vec![Family::Ipv6]);
        assert_eq!(parsed("{ports: [{port: 80}]}"), v6);
        assert_eq!(
            parsed("{ipFamilyPolicy: SingleStack, ports: [{port: 80}]}"),
            v6
        );
        assert_eq!(
            parsed("{ipFamilyPolicy: PreferDualStack, ports: [{port: 80}]}"),
            v6
        );
        assert_eq!(
            parsed("{clusterIP: 'fd00:10:96::20', ports: [{port: 80}]}"),
            v6
        );
        assert_eq!(parsed("{ipFamilies: [IPv6], ports: [{port: 80}]}"), v6);
        assert_eq!(
            parsed("{type: LoadBalancer, loadBalancerIP: '2001:db8::20', externalIPs: ['2001:db8::21'], ports: [{port: 80}]}"),
            v6
        );
        for (spec, want) in [
            ("{ipFamilyPolicy: RequireDualStack, ports: [{port: 80}]}", "RequireDualStack needs a dual-stack cluster"),
            ("{ipFamilies: [IPv6, IPv4], ports: [{port: 80}]}", "spec.ipFamilies[1] IPv4"),
            ("{clusterIP: 10.96.0.20, ports: [{port: 80}]}", "spec.clusterIP \"10.96.0.20\""),
            ("{clusterIP: 'fd00:10:96::20', clusterIPs: ['fd00:10:96::20', 10.96.0.20], ports: [{port: 80}]}", "spec.clusterIPs[1]"),
            ("{externalIPs: [192.0.2.20], ports: [{port: 80}]}", "spec.externalIPs[0]"),
            ("{type: LoadBalancer, loadBalancerIP: 192.0.2.20, ports: [{port: 80}]}", "spec.loadBalancerIP"),
        ] {
            let e = parsed(spec).expect_err(spec);
            assert!(e.contains(want) && e.contains("IPv6-only"), "{spec}: {e}");
        }
    }
}
