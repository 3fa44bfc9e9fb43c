//! Services, Endpoints and EndpointSlices into the model (what the
//! in-pipeline proxy needs), with the API server's defaulting: port
//! `protocol` TCP, `sessionAffinityConfig.clientIP.timeoutSeconds` 10800,
//! an endpoint's `conditions.ready` unset counting as ready. IPv6 cluster
//! IPs and endpoint addresses are skipped (the model is IPv4).

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;

use super::{namespaced_name, parse_ip, protocol, ConvertError, Errs};
use crate::model::{Endpoint, EndpointPort, EndpointSet, Service, ServicePort};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

fn port_number(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p != 0)
}

/// Converts a Service: its IPv4 cluster IP (none for headless and
/// `ExternalName` Services), ports and session affinity.
pub fn service(svc: &core::Service) -> Result<Service, ConvertError> {
    let (namespace, name) = namespaced_name("Service", &svc.metadata)?;
    let mut errs = Errs::default();
    let spec = svc.spec.clone().unwrap_or_default();
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let mut cluster_ip = None;
    match spec.cluster_ip.as_deref() {
        None | Some("") | Some("None") => {}
        Some(_) if external_name => {}
        Some(ip) => match parse_ip(ip) {
            Ok(a) => cluster_ip = a,
            Err(m) => errs.push("spec.clusterIP", m),
        },
    }
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
            node_port,
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
    let object = format!("{namespace}/{name}");
    errs.finish(
        "Service",
        object,
        Service {
            namespace,
            name,
            cluster_ip,
            ports,
            affinity_timeout,
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
                match parse_ip(&a.ip) {
                    Ok(Some(ip)) => out.push(Endpoint {
                        ip,
                        ready,
                        node_name: a.node_name.clone(),
                        ports: ports.clone(),
                    }),
                    Ok(None) => {}
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

/// Converts an EndpointSlice (IPv4 ones; an IPv6 or FQDN slice has no
/// endpoint here): its Service from the `kubernetes.io/service-name`
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
    if slice.address_type == "IPv4" {
        for (ei, e) in slice.endpoints.iter().flatten().enumerate() {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            for (ai, a) in e.addresses.iter().enumerate() {
                match parse_ip(a) {
                    Ok(Some(ip)) => out.push(Endpoint {
                        ip,
                        ready,
                        node_name: e.node_name.clone(),
                        ports: ports.clone(),
                    }),
                    Ok(None) => {}
                    Err(m) => errs.push(format!("endpoints[{ei}].addresses[{ai}]"), m),
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
        assert_eq!(set.endpoints.len(), 2, "IPv6 skipped");
        assert!(set.endpoints[0].ready && !set.endpoints[1].ready);
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
    }
}
