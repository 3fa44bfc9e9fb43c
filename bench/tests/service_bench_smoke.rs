//! Smoke tests of `service-bench` (`oxvs_bench::service_bench`): a small
//! model through the in-process realisation (counts checked against the
//! model), the datapath measurements (every packet forwarded, ClusterIP
//! connections really translated, a new connection through a Service an
//! upcall), and the lab objects read back by the agent's own manifest
//! parser as the model's Services and Endpoints. No timing assertions.

use std::time::Duration;

use oxvs_agent::source::{parse_manifest, Object};
use oxvs_bench::service_bench::{
    established, kube_proxy_expected, lab_objects, new_connections, realise, to_yaml_docs, Model,
    ModelSpec, Summary, Target,
};

fn small(services: usize) -> Model {
    Model::new(ModelSpec {
        services,
        endpoints: 4,
        nodes: 3,
        pods_per_node: 8,
        udp_every: 5,
        node_port_every: 10,
    })
    .expect("small model")
}

#[test]
fn realises_services_with_their_flows_and_groups() {
    let none = realise(&small(0), 3, None).expect("realise without Services");
    assert!(
        none.iter()
            .all(|n| n.groups == 0 && n.flows == n.base_flows && n.bundle.mods == 0),
        "{none:?}"
    );
    let m = small(20);
    let live = || 0i64;
    let r = realise(&m, 3, Some(&live)).expect("realise");
    assert_eq!(r.len(), 3);
    let (tcp, udp, np) = m.spec.port_counts();
    assert_eq!((tcp, udp, np), (20, 4, 4));
    for n in &r {
        // One ServiceLB flow per Service port and NodePort.
        assert_eq!(n.flows - n.base_flows, tcp + udp + np, "{n:?}");
        // A group per Service port, one more per NodePort; a bucket per endpoint.
        assert_eq!(n.groups, tcp + udp + np, "{n:?}");
        assert_eq!(n.buckets, 4 * n.groups, "{n:?}");
        assert_eq!(n.bundle.mods, n.groups + (n.flows - n.base_flows));
        // The change replaces one endpoint of a one-port Service: its group.
        assert_eq!(n.change.mods, 1, "{n:?}");
        assert!(n.group_text_bytes > 100 * n.groups, "{n:?}");
        assert_eq!(n.heap_bytes, Some(0));
    }
    let s = Summary {
        spec: m.spec,
        nodes: r,
    };
    assert_eq!(s.row().len(), Summary::HEADER.len());
    // kube-proxy: 2 + 3 rules per endpoint per port, 2 per NodePort.
    assert_eq!(kube_proxy_expected(&m.spec), (24 * (2 + 12) + 8, 24 * 5));
}

#[test]
fn datapath_translates_and_forwards_everything() {
    let m = small(20);
    let dur = Duration::from_millis(10);
    let pod = established(&m, Target::PodIp, 24, true, 1, dur).expect("to pod IPs");
    assert_eq!(pod.outputs, 48, "{pod:?}");
    assert_eq!(pod.upcalls, 0, "steady state: {pod:?}");
    let svc = established(&m, Target::ClusterIp, 24, true, 1, dur).expect("to ClusterIPs");
    assert_eq!(svc.outputs, 48, "{svc:?}");
    assert_eq!(svc.upcalls, 0, "steady state: {svc:?}");
    assert!(svc.groups > 0 && svc.pps > 0.0);
    // New connections: through a Service each is an upcall (the group
    // hashes the 5-tuple); every SYN forwarded, to an endpoint.
    let new = new_connections(&m, Target::ClusterIp, 64, 2).expect("new conns");
    assert_eq!(new.outputs, 64, "{new:?}");
    assert!(new.upcalls >= 64, "{new:?}");
    assert!(new.local_share > 0.0 && new.local_share < 1.0, "{new:?}");
    let direct = new_connections(&m, Target::PodIp, 64, 2).expect("new conns, pod IPs");
    assert_eq!(direct.outputs, 64, "{direct:?}");
    // No Services: no ClusterIP traffic to make.
    assert!(new_connections(&small(0), Target::ClusterIp, 8, 1).is_err());
}

#[test]
fn lab_objects_read_back_as_the_model() {
    let m = small(12);
    let objs = lab_objects(&m);
    let (parsed, warnings) = parse_manifest(&to_yaml_docs(&objs), false).expect("objects parse");
    assert!(warnings.is_empty(), "{warnings:?}");
    let (mut svcs, mut eps) = (0, 0);
    for o in parsed {
        match o {
            Object::Service(s) => {
                assert_eq!(Some(&s), m.state.services.get(&s.key()));
                svcs += 1;
            }
            Object::Endpoints(e) => {
                let want = m.state.endpoints.get(&e.service).expect("known Service");
                // The same endpoints, each with its ports in any order.
                let norm = |v: &[oxvs_agent::model::Endpoint]| {
                    let mut v = v.to_vec();
                    for e in &mut v {
                        e.ports.sort();
                    }
                    v.sort();
                    v
                };
                let (got, want) = (norm(&e.endpoints), norm(&want.endpoints));
                assert_eq!(got, want);
                eps += 1;
            }
            Object::Namespace(_) => {}
            other => panic!("unexpected {}", other.describe()),
        }
    }
    assert_eq!((svcs, eps), (12, 12));
}
