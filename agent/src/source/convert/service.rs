//! Services, Endpoints and EndpointSlices into the model (what the
//! in-pipeline proxy needs), with the API server's defaulting: port
//! `protocol` TCP, `sessionAffinityConfig.clientIP.timeoutSeconds` 10800,
//! an endpoint's `conditions.ready` unset counting as ready,
//! `externalTrafficPolicy` and `internalTrafficPolicy` Cluster. A
//! Service has a ClusterIP per family (`spec.clusterIPs`, else
//! `spec.clusterIP`), endpoints of both families are kept (Endpoints
//! addresses, IPv4 and IPv6 EndpointSlices); IPv6 external and load
//! balancer addresses are skipped (NodePorts and external addresses are
//! served over IPv4 only).

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;

use std::net::IpAddr;

use super::{namespaced_name, protocol, ConvertError, Errs};
use crate::model::{Endpoint, EndpointPort, EndpointSet, Service, ServicePort};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

fn port_number(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p != 0)
}

/// Parses an address of either family.
fn parse_any_ip(s: &str) -> Result<IpAddr, String> {
    s.parse::<IpAddr>()
        .map_err(|_| format!("invalid IP address {s:?}"))
}

/// Converts a Service: its ClusterIP of each family (none for headless
/// and `ExternalName` Services), ports and session affinity.
pub fn service(svc: &core::Service) -> Result<Service, ConvertError> {
    let (namespace, name) = namespaced_name("Service", &svc.metadata)?;
    let mut errs = Errs::default();
    let spec = svc.spec.clone().unwrap_or_default();
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let (mut cluster_ip, mut cluster_ip6) = (None, None);
    // `spec.clusterIPs` (dual-stack, primary first; `clusterIP` is its
    // first entry), else `spec.clusterIP`.
    let listed: Vec<(String, &str)> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
            .collect(),
        _ => spec
            .cluster_ip
            .as_deref()
            .map(|ip| ("spec.clusterIP".to_string(), ip))
            .into_iter()
            .collect(),
    };
    for (field, ip) in listed {
        if external_name || ip.is_empty() || ip == "None" {
            continue;
        }
        match parse_any_ip(ip) {
            Ok(IpAddr::V4(a)) if cluster_ip.is_none() => cluster_ip = Some(a),
            Ok(IpAddr::V6(a)) if cluster_ip6.is_none() => cluster_ip6 = Some(a),
            Ok(_) => errs.push(
                field,
                format!("a second ClusterIP of the same family ({ip})"),
            ),
            Err(m) => errs.push(field, m),
        }
    }
    // NodePorts are allocated for NodePort and LoadBalancer Services only
    // (a `nodePort` elsewhere is left over from an earlier type).
    let has_node_ports = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let Some(port) = port_number(p.port) else {
            errs.push(
                format!("spec.ports[{i}].port"),
                format!("must be 1-65535, not {}", p.port),
            );
            continue;
        };
        let node_port = match p.node_port {
            None | Some(0) => None,
            Some(n) => match port_number(n) {
                Some(n) => Some(n),
                None => {
                    errs.push(
                        format!("spec.ports[{i}].nodePort"),
                        format!("must be 1-65535, not {n}"),
                    );
                    None
                }
            },
        };
        let proto = protocol(
            format!("spec.ports[{i}].protocol"),
            p.protocol.as_deref(),
            &mut errs,
        );
        ports.push(ServicePort {
            name: p.name.clone().unwrap_or_default(),
            protocol: proto,
            port,
            node_port: node_port.filter(|_| has_node_ports),
        });
    }
    let affinity_timeout = match spec.session_affinity.as_deref() {
        None | Some("None") => None,
        Some("ClientIP") => {
            let t = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            match t {
                None => Some(DEFAULT_AFFINITY_TIMEOUT),
                Some(t @ 1..=86_400) => Some(t as u32),
                Some(t) => {
                    errs.push(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("must be 1-86400, not {t}"),
                    );
                    None
                }
            }
        }
        Some(other) => {
            errs.push(
                "spec.sessionAffinity",
                format!("unsupported value {other:?} (None or ClientIP)"),
            );
            None
        }
    };
    let mut external_ips = Vec::new();
    if !external_name {
        for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
            match parse_any_ip(ip) {
                Ok(a) => external_ips.push(a),
                Err(m) => errs.push(format!("spec.externalIPs[{i}]"), m),
            }
        }
        // The load balancer's addresses (its controller writes them).
        if spec.type_.as_deref() == Some("LoadBalancer") {
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref());
            for (i, ing) in ingress.into_iter().flatten().enumerate() {
                let Some(ip) = ing.ip.as_deref() else {
                    continue; // a hostname: nothing to match on
                };
                match parse_any_ip(ip) {
                    Ok(a) => external_ips.push(a),
                    Err(m) => errs.push(format!("status.loadBalancer.ingress[{i}].ip"), m),
                }
            }
        }
    }
    external_ips.sort();
    external_ips.dedup();
    let local_policy = |field: &str, v: Option<&str>, errs: &mut Errs| match v {
        None | Some("Cluster") => false,
        Some("Local") => true,
        Some(other) => {
            errs.push(
                format!("spec.{field}"),
                format!("unsupported value {other:?} (Cluster or Local)"),
            );
            false
        }
    };
    let external_local = local_policy(
        "externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
        &mut errs,
    );
    let internal_local = local_policy(
        "internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
        &mut errs,
    );
    let object = format!("{namespace}/{name}");
    errs.finish(
        "Service",
        object,
        Service {
            namespace,
            name,
            cluster_ip,
            cluster_ip6,
            ports,
            affinity_timeout,
            external_ips,
            external_local,
            internal_local,
        },
    )
}

/// Converts an Endpoints object: every subset's addresses (ready) and
/// `notReadyAddresses` (not ready), each with the subset's ports.
pub fn endpoints(ep: &core::Endpoints) -> Result<EndpointSet, ConvertError> {
    let (namespace, name) = namespaced_name("Endpoints", &ep.metadata)?;
    let mut errs = Errs::default();
    let mut out = Vec::new();
    for (si, s) in ep.subsets.iter().flatten().enumerate() {
        let mut ports = Vec::new();
        for (pi, p) in s.ports.iter().flatten().enumerate() {
            let field = format!("subsets[{si}].ports[{pi}]");
            let proto = protocol(
                format!("{field}.protocol"),
                p.protocol.as_deref(),
                &mut errs,
            );
            match port_number(p.port) {
                Some(port) => ports.push(EndpointPort {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: proto,
                    port,
                }),
                None => errs.push(
                    format!("{field}.port"),
                    format!("must be 1-65535, not {}", p.port),
                ),
            }
        }
        ports.sort();
        let lists = [
            ("addresses", true, s.addresses.as_deref()),
            ("notReadyAddresses", false, s.not_ready_addresses.as_deref()),
        ];
        for (list, ready, addrs) in lists {
            for (ai, a) in addrs.unwrap_or_default().iter().enumerate() {
                match parse_any_ip(&a.ip) {
                    Ok(ip) => out.push(Endpoint {
                        ip,
                        ready,
                        node_name: a.node_name.clone(),
                        ports: ports.clone(),
                    }),
                    Err(m) => errs.push(format!("subsets[{si}].{list}[{ai}].ip"), m),
                }
            }
        }
    }
    let object = format!("{namespace}/{name}");
    errs.finish(
        "Endpoints",
        object,
        EndpointSet {
            service: (namespace, name),
            endpoints: out,
        },
    )
}

/// Converts an EndpointSlice (IPv4 and IPv6 ones; an FQDN slice has no
/// endpoint here; an address of the other family than `addressType`
/// says is refused): its Service from the `kubernetes.io/service-name`
/// label, every address of every endpoint with the slice's ports.
pub fn endpoint_slice(slice: &discovery::EndpointSlice) -> Result<EndpointSet, ConvertError> {
    let (namespace, name) = namespaced_name("EndpointSlice", &slice.metadata)?;
    let object = format!("{namespace}/{name}");
    let mut errs = Errs::default();
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|s| !s.is_empty())
        .cloned();
    let Some(service) = service else {
        errs.push(
            format!("metadata.labels[{SERVICE_NAME_LABEL}]"),
            "required (the Service the slice belongs to)",
        );
        return errs.finish(
            "EndpointSlice",
            object,
            EndpointSet {
                service: (namespace, String::new()),
                endpoints: Vec::new(),
            },
        );
    };
    let mut ports = Vec::new();
    for (pi, p) in slice.ports.iter().flatten().enumerate() {
        let field = format!("ports[{pi}]");
        let proto = protocol(
            format!("{field}.protocol"),
            p.protocol.as_deref(),
            &mut errs,
        );
        match p.port.and_then(port_number) {
            Some(port) => ports.push(EndpointPort {
                name: p.name.clone().unwrap_or_default(),
                protocol: proto,
                port,
            }),
            // A port without a number: every port (not used by Services).
            None => errs.push(format!("{field}.port"), "required for a Service's slice"),
        }
    }
    ports.sort();
    let mut out = Vec::new();
    let v6 = match slice.address_type.as_str() {
        "IPv4" => Some(false),
        "IPv6" => Some(true),
        _ => None,
    };
    if let Some(v6) = v6 {
        for (ei, e) in slice.endpoints.iter().flatten().enumerate() {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            for (ai, a) in e.addresses.iter().enumerate() {
                let field = format!("endpoints[{ei}].addresses[{ai}]");
                match parse_any_ip(a) {
                    Ok(ip) if ip.is_ipv6() == v6 => out.push(Endpoint {
                        ip,
                        ready,
                        node_name: e.node_name.clone(),
                        ports: ports.clone(),
                    }),
                    Ok(_) => errs.push(
                        field,
                        format!("{a} is not an {} address", slice.address_type),
                    ),
                    Err(m) => errs.push(field, m),
                }
            }
        }
    }
    errs.finish(
        "EndpointSlice",
        object,
        EndpointSet {
            service: (namespace, service),
            endpoints: out,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> core::Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn services_are_defaulted_and_bad_fields_named() {
        let s = service(&svc(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.20", "sessionAffinity": "ClientIP",
                     "ports": [{"port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}
        })))
        .unwrap();
        assert_eq!(s.cluster_ip, Some("10.96.0.20".parse().unwrap()));
        assert_eq!(s.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
        assert_eq!(
            (s.ports[0].protocol, s.ports[0].name.as_str()),
            (Protocol::Tcp, "")
        );
        // Headless and ExternalName Services are not proxied, not errors.
        for spec in [
            json!({"clusterIP": "None", "ports": [{"port": 80}]}),
            json!({"type": "ExternalName", "externalName": "x.example", "clusterIP": "1.2.3.4"}),
        ] {
            let s = service(&svc(json!({"metadata": {"name": "h"}, "spec": spec}))).unwrap();
            assert_eq!(s.cluster_ip, None);
        }
        for (spec, field) in [
            (json!({"clusterIP": "10.96.0.x"}), "spec.clusterIP"),
            (json!({"ports": [{"port": 0}]}), "spec.ports[0].port"),
            (json!({"ports": [{"port": 70000}]}), "spec.ports[0].port"),
            (
                json!({"ports": [{"port": 80, "protocol": "ICMP"}]}),
                "spec.ports[0].protocol",
            ),
            (
                json!({"ports": [{"port": 80, "nodePort": -1}]}),
                "spec.ports[0].nodePort",
            ),
            (json!({"sessionAffinity": "Cookie"}), "spec.sessionAffinity"),
            (
                json!({"sessionAffinity": "ClientIP",
                       "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}),
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            ),
        ] {
            let e = service(&svc(
                json!({"metadata": {"name": "b", "namespace": "n"}, "spec": spec}),
            ))
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("Service n/b: ") && e.contains(field), "{e}");
        }
    }

    #[test]
    fn traffic_from_outside_fields() {
        let s = service(&svc(json!({
            "metadata": {"name": "lb", "namespace": "shop"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.30",
                     "externalIPs": ["192.0.2.9", "2001:db8::1", "192.0.2.5"],
                     "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
                     "ports": [{"port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.5"}, {"hostname": "lb.example"}, {"ip": "198.51.100.7"}]}}
        })))
        .unwrap();
        let ips: Vec<String> = s.external_ips.iter().map(|i| i.to_string()).collect();
        assert_eq!(
            ips,
            ["192.0.2.5", "192.0.2.9", "198.51.100.7", "2001:db8::1"]
        );
        assert!(s.external_local && s.internal_local);
        assert_eq!(s.ports[0].node_port, Some(30080));
        // A ClusterIP Service has no NodePort (a leftover nodePort is
        // ignored) and no load balancer address; policies default to Cluster.
        let s = service(&svc(json!({
            "metadata": {"name": "c", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.31", "ports": [{"port": 80, "nodePort": 30081}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.5"}]}}
        })))
        .unwrap();
        assert_eq!(s.ports[0].node_port, None);
        assert!(s.external_ips.is_empty() && !s.external_local && !s.internal_local);
        for (spec, field) in [
            (
                json!({"externalIPs": ["192.0.2.300"]}),
                "spec.externalIPs[0]",
            ),
            (
                json!({"externalTrafficPolicy": "Nearest"}),
                "spec.externalTrafficPolicy",
            ),
            (
                json!({"internalTrafficPolicy": "Node"}),
                "spec.internalTrafficPolicy",
            ),
        ] {
            let e = service(&svc(
                json!({"metadata": {"name": "b", "namespace": "n"}, "spec": spec}),
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn endpoints_and_slices_keep_readiness_and_refuse_bad_fields() {
        let ep: core::Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "subsets": [{"addresses": [{"ip": "10.244.0.3", "nodeName": "n1"}, {"ip": "fd00::1"}],
                         "notReadyAddresses": [{"ip": "10.244.0.4"}],
                         "ports": [{"name": "http", "port": 8080}]}]
        }))
        .unwrap();
        let set = endpoints(&ep).unwrap();
        assert_eq!(set.service, ("shop".into(), "web".into()));
        assert_eq!(set.endpoints.len(), 3, "IPv6 kept");
        assert!(set.endpoints[0].ready && set.endpoints[1].ready && !set.endpoints[2].ready);
        assert_eq!(set.endpoints[1].ip, "fd00::1".parse::<IpAddr>().unwrap());
        let bad: core::Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "subsets": [{"addresses": [{"ip": "10.244.0.300"}], "ports": [{"port": 0}]}]
        }))
        .unwrap();
        let e = endpoints(&bad).unwrap_err().to_string();
        assert!(
            e.contains("subsets[0].ports[0].port") && e.contains("subsets[0].addresses[0].ip"),
            "{e}"
        );

        let slice = |labels: serde_json::Value| -> discovery::EndpointSlice {
            serde_json::from_value(json!({
                "metadata": {"name": "web-abc", "namespace": "shop", "labels": labels},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.244.0.3"]},
                              {"addresses": ["10.244.0.4"], "conditions": {"ready": false}}],
                "ports": [{"name": "http", "port": 8080}]
            }))
            .unwrap()
        };
        let set = endpoint_slice(&slice(json!({SERVICE_NAME_LABEL: "web"}))).unwrap();
        assert_eq!(set.service, ("shop".into(), "web".into()));
        assert!(set.endpoints[0].ready, "unset ready counts as ready");
        assert!(!set.endpoints[1].ready);
        let e = endpoint_slice(&slice(json!({}))).unwrap_err().to_string();
        assert!(e.contains(SERVICE_NAME_LABEL), "{e}");

        // An IPv6 slice: its addresses kept; one of the wrong family named.
        let v6 = |addr: &str| -> discovery::EndpointSlice {
            serde_json::from_value(json!({
                "metadata": {"name": "web-v6", "namespace": "shop",
                             "labels": {SERVICE_NAME_LABEL: "web"}},
                "addressType": "IPv6",
                "endpoints": [{"addresses": [addr], "nodeName": "n1"}],
                "ports": [{"name": "http", "port": 8080}]
            }))
            .unwrap()
        };
        let set = endpoint_slice(&v6("fd00:10:244:1::5")).unwrap();
        assert_eq!(set.endpoints.len(), 1);
        assert_eq!(
            set.endpoints[0].ip,
            "fd00:10:244:1::5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(set.endpoints[0].node_name.as_deref(), Some("n1"));
        let e = endpoint_slice(&v6("10.244.1.5")).unwrap_err().to_string();
        assert!(
            e.contains("endpoints[0].addresses[0]") && e.contains("not an IPv6"),
            "{e}"
        );
    }

    #[test]
    fn a_dual_stack_service_has_a_cluster_ip_per_family() {
        let conv = |spec: serde_json::Value| {
            service(&svc(
                json!({"metadata": {"name": "d", "namespace": "n"}, "spec": spec}),
            ))
        };
        let s = conv(json!({"clusterIP": "10.96.0.10",
                            "clusterIPs": ["10.96.0.10", "fd00:10:96::a"],
                            "ports": [{"port": 53}]}))
        .unwrap();
        assert_eq!(s.cluster_ip, Some("10.96.0.10".parse().unwrap()));
        assert_eq!(s.cluster_ip6, Some("fd00:10:96::a".parse().unwrap()));
        // IPv6 primary, and IPv6 only.
        let s = conv(json!({"clusterIP": "fd00:10:96::a",
                            "clusterIPs": ["fd00:10:96::a", "10.96.0.10"],
                            "ports": [{"port": 53}]}))
        .unwrap();
        assert_eq!(s.cluster_ip, Some("10.96.0.10".parse().unwrap()));
        assert_eq!(s.cluster_ip6, Some("fd00:10:96::a".parse().unwrap()));
        let s = conv(json!({"clusterIP": "fd00:10:96::a", "ports": [{"port": 53}]})).unwrap();
        assert_eq!((s.cluster_ip, s.cluster_ip6.is_some()), (None, true));
        // Two of a family, a bad address: named.
        let e = conv(json!({"clusterIPs": ["10.96.0.10", "10.96.0.11"], "ports": [{"port": 53}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.clusterIPs[1]"), "{e}");
        let e = conv(json!({"clusterIPs": ["fd00::zz"], "ports": [{"port": 53}]}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.clusterIPs[0]"), "{e}");
    }
}
