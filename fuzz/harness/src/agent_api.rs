//! `agent_api`: the agent's API socket (`/run/oxvs/agent.sock`): request
//! lines through [`parse_agent_request`], then what `oxvs-agent` does with
//! each (`agent/src/api.rs`): [`api::info`], [`api::pod_info`], and for
//! `traceflow` [`api::build_packet`], the switch's `trace` (a real control
//! request to a running [`Switch`] holding this node's flows, made by the
//! agent's own flow builders and policy translator) and [`api::hop_of`],
//! which reads the structured trace and annotates each step from its
//! cookie. Only the socket and the tokio glue of `api::handle_line` are
//! left out (it needs a whole `Agent`).
//!
//! Inputs starting with 0xff give [`api::hop_of`] an arbitrary switch
//! answer instead (JSON read as a `TraceResult`: step and pass indices
//! out of range, missing parts; the switch's answer is not trusted either).
//!
//! Checked: every answer encodes as one line of JSON; a request built by
//! the harness survives `to_line` then `parse_agent_request`; the packet
//! spec `build_packet` makes always parses in the switch, and arrives on
//! the port it names (the requesting pod's, or the tunnel's), so no field
//! of the request can inject a match; the switch's trace of it succeeds.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, OnceLock};

use oxvs_agent::api::{self, NodeView};
use oxvs_agent::desired::{self, Inputs, Tunnel};
use oxvs_agent::flows::{self, NodeNet, RemoteNode};
use oxvs_agent::model::{ClusterState, LabelSelector, NetworkPolicy, Node, Peer, Pod, Rule};
use oxvs_agent::state::{AttachState, Attachment};
use oxvs_api::agent::{parse_agent_request, AgentRequest, Proto, TraceflowRequest, TunnelArrival};
use oxvs_api::protocol::{Request, Response, TraceRequest, TraceResult};
use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
use oxvs_pipeline::Field;
use oxvs_switch::control;
use oxvs_switch::engine::Switch;

use crate::input::Input;

const TUN: u32 = 9;
const NODE_IP: [u8; 4] = [192, 168, 77, 11];

fn node_net() -> NodeNet {
    NodeNet {
        ipv4: Some(oxvs_agent::flows::NodeNet4::of(
            "10.244.0.0/24".parse().expect("cidr"),
        )),
        gateway_mac: [0x0a, 0x58, 10, 244, 0, 1],
        gateway_ofport: 2,
        ipv6: None,
    }
}

fn attachment(name: &str, ofport: u32, last: u8) -> Attachment {
    let ip = Ipv4Addr::new(10, 244, 0, last);
    Attachment {
        container_id: format!("c-{name}"),
        ifname: "eth0".into(),
        netns: String::new(),
        host_ifname: format!("veth{name}"),
        pod_namespace: "x".into(),
        pod_name: name.into(),
        ipv4: Some(oxvs_agent::state::PodIpv4 {
            ip,
            prefix_len: 24,
            gateway: Ipv4Addr::new(10, 244, 0, 1),
        }),
        mac: flows::mac_str(&flows::pod_mac(ip)),
        mtu: 1450,
        ofport: Some(ofport),
        state: AttachState::Ready,
        ipv6: None,
        qdisc: None,
    }
}

fn pod(name: &str, node: &str, ip: &str, app: &str) -> Pod {
    Pod {
        namespace: "x".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: [("app".to_string(), app.to_string())].into(),
        node_name: node.into(),
        ip: Some(ip.parse().expect("ip")),
        host_network: false,
        ports: vec![],
        ip6: None,
    }
}

fn selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: [("app".to_string(), app.to_string())].into(),
        match_expressions: vec![],
    }
}

/// Node n1 with pods a (port 3) and b (port 4); pod r on node n2; b
/// accepts from a, and from 10.244.1.0/24 except 10.244.1.128/25; a may
/// only talk to b.
fn cluster() -> ClusterState {
    let mut c = ClusterState::default();
    for p in [
        pod("a", "n1", "10.244.0.3", "a"),
        pod("b", "n1", "10.244.0.4", "b"),
        pod("r", "n2", "10.244.1.7", "r"),
    ] {
        c.pods.insert(p.key(), p);
    }
    let ingress = NetworkPolicy {
        namespace: "x".into(),
        name: "allow-a".into(),
        uid: "uid-allow-a".into(),
        pod_selector: selector("b"),
        ingress_isolation: true,
        egress_isolation: false,
        ingress: vec![Rule {
            peers: vec![
                Peer::Pods {
                    namespace_selector: None,
                    pod_selector: Some(selector("a")),
                },
                Peer::IpBlock {
                    cidr: "10.244.1.0/24".parse().expect("cidr"),
                    except: vec!["10.244.1.128/25".parse().expect("cidr")],
                },
            ],
            ports: vec![],
        }],
        egress: vec![],
    };
    let egress = NetworkPolicy {
        namespace: "x".into(),
        name: "a-to-b".into(),
        uid: "uid-a-to-b".into(),
        pod_selector: selector("a"),
        ingress_isolation: false,
        egress_isolation: true,
        ingress: vec![],
        egress: vec![Rule {
            peers: vec![Peer::Pods {
                namespace_selector: None,
                pod_selector: Some(selector("b")),
            }],
            ports: vec![],
        }],
    };
    for p in [ingress, egress] {
        c.policies.insert(p.key(), p);
    }
    for (n, ip, cidr) in [
        ("n1", "192.168.77.11", "10.244.0.0/24"),
        ("n2", "192.168.77.12", "10.244.1.0/24"),
    ] {
        c.nodes.insert(
            n.into(),
            Node {
                name: n.into(),
                pod_cidr: Some(cidr.parse().expect("cidr")),
                pod_cidr6: None,
                internal_ip: Some(ip.parse().expect("ip")),
                internal_ip6: None,
            },
        );
    }
    c
}

struct Fixture {
    view: NodeView,
    switch: Mutex<Switch>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let cluster = cluster();
        let attachments = vec![attachment("a", 3, 3), attachment("b", 4, 4)];
        let remotes = vec![RemoteNode {
            name: "n2".into(),
            pod_cidr: Some("10.244.1.0/24".parse().expect("cidr")),
            ip: Ipv4Addr::new(192, 168, 77, 12).into(),
            pod_cidr6: None,
        }];
        let node = node_net();
        let cluster = Arc::new(cluster);
        let desired = desired::compute(&Inputs {
            pods: desired::pod_ports(&attachments),
            tunnel: Some(Tunnel {
                ofport: TUN,
                remotes: remotes.clone(),
                node_ip: None,
                guard: false,
            }),
            state: Arc::clone(&cluster),
            local: desired::local_pods(&attachments),
            ..Inputs::for_node(node.clone())
        });
        let text = desired.text();
        let switch = crate::common::start_switch();
        let parsed =
            parse_flow_file(&text, &ParseContext::default()).expect("the agent's flows parse");
        switch
            .pipeline()
            .replace_all(&parsed, 0)
            .expect("the agent's flows install");
        let view = NodeView {
            node_name: "n1".into(),
            node_ip: Some(Ipv4Addr::from(NODE_IP).into()),
            gateway_name: "oxvs-gw0".into(),
            node: Some(node),
            tunnel_ofport: Some(TUN),
            switchd_socket: "/nonexistent/switchd.sock".into(),
            attachments,
            cluster,
            rules: desired.rules,
            remotes,
        };
        Fixture {
            view,
            switch: Mutex::new(switch),
        }
    })
}

const SRCS: &[&str] = &[
    "x/a", "x/b", "x/r", "x/zz", "y/a", "a", "", "x/", "/a", "x/a/b",
];
const DSTS: &[&str] = &[
    "x/b",
    "x/a",
    "x/r",
    "10.244.0.4",
    "10.244.1.7",
    "10.244.1.200",
    "8.8.8.8",
    "x/zz",
    "bad",
    "10.244.0.256",
];
const MACS: &[&str] = &[
    "0a:58:0a:f4:01:07",
    "aa:bb:cc:dd:ee:ff",
    "0A:58:0A:F4:00:04",
    "0a:58:0a:f4:00:04,in_port=3",
    "zz:zz:zz:zz:zz:zz",
    "",
];

fn text(i: &mut Input<'_>, choices: &[&str]) -> String {
    if i.u8() < 224 {
        i.pick(choices).to_string()
    } else {
        String::from_utf8_lossy(i.short_bytes()).into_owned()
    }
}

fn built_request(i: &mut Input<'_>) -> AgentRequest {
    match i.u8() % 3 {
        0 => AgentRequest::Info,
        1 => AgentRequest::Pod {
            namespace: text(i, &["x", "y", ""]),
            name: text(i, &["a", "b", "r", "zz"]),
        },
        _ => AgentRequest::Traceflow(TraceflowRequest {
            src: text(i, SRCS),
            dst: text(i, DSTS),
            proto: *i.pick(&[Proto::Tcp, Proto::Udp, Proto::Sctp, Proto::Icmp]),
            sport: i.bool().then(|| i.u16()),
            dport: i.bool().then(|| *i.pick(&[80, 53, 0, 65535])),
            inject: false,
            from_tunnel: i.bool().then(|| TunnelArrival {
                from_node: text(i, &["n2", ""]),
                tun_src: Ipv4Addr::new(192, 168, 77, 12).into(),
                tun_dst: Ipv4Addr::from(NODE_IP).into(),
                src_mac: text(i, MACS),
                dst_mac: text(i, MACS),
                src_ip: Ipv4Addr::from(i.u32()).into(),
                dst_ip: (*i.pick(&[Ipv4Addr::new(10, 244, 0, 4), Ipv4Addr::new(10, 244, 0, 3)]))
                    .into(),
                ttl: i.u8(),
            }),
            ipv6: i.bool(),
        }),
    }
}

fn json_line(r: &Response) {
    let wire = r.to_line();
    assert!(!wire.contains('\n'));
    let back: Response = serde_json::from_str(&wire).expect("the answer is JSON");
    assert_eq!(&back, r);
}

/// What the agent answers to `line`, minus the socket.
fn answer(f: &Fixture, line: &str) -> Response {
    let req = match parse_agent_request(line) {
        Ok(r) => r,
        Err(e) => return Response::error(e),
    };
    let r = match req {
        AgentRequest::Info => Ok(Response::ok(&api::info(&f.view))),
        AgentRequest::Pod { namespace, name } => {
            api::pod_info(&f.view, &namespace, &name).map(|p| Response::ok(&p))
        }
        AgentRequest::Traceflow(t) => api::build_packet(&f.view, &t).map(|packet| {
            let tr = switch_trace(f, &t, &packet);
            let h = api::hop_of(&f.view, &packet, &tr)
                .unwrap_or_else(|e| panic!("the switch's trace of {packet:?}: {e}"));
            Response::ok(&h)
        }),
    };
    r.unwrap_or_else(|e| Response::error(e.to_string()))
}

/// The switch's trace of the packet spec `build_packet` made.
fn switch_trace(f: &Fixture, t: &TraceflowRequest, packet: &str) -> TraceResult {
    let key = parse_packet_spec(packet, &ParseContext::default())
        .unwrap_or_else(|e| panic!("build_packet made a bad spec {packet:?}: {}", e.msg));
    let want_port = match &t.from_tunnel {
        Some(_) => TUN,
        None => {
            let (ns, name) = t.src.split_once('/').expect("a local source is NS/NAME");
            f.view
                .attachments
                .iter()
                .find(|a| a.pod_namespace == ns && a.pod_name == name)
                .and_then(|a| a.ofport)
                .expect("the source is attached here")
        }
    };
    assert_eq!(key.get(Field::InPort), u128::from(want_port), "{packet}");
    let req = Request::Trace(TraceRequest {
        spec: Some(packet.to_string()),
        ct_next: vec!["trk,new".into()],
        names: true,
        ..TraceRequest::default()
    });
    let sw = f.switch.lock().unwrap_or_else(|e| e.into_inner());
    let r = control::handle(&sw, req);
    let v = r
        .clone()
        .into_result()
        .unwrap_or_else(|e| panic!("the switch refused the trace of {packet:?}: {e}"));
    serde_json::from_value(v).expect("a trace result")
}

pub fn run(data: &[u8]) {
    let f = fixture();
    let mut i = Input::new(data);
    if data.first() == Some(&0xff) {
        i.u8();
        if let Ok(tr) = serde_json::from_slice::<TraceResult>(i.rest()) {
            let r = match api::hop_of(&f.view, "in_port=3,tcp", &tr) {
                Ok(h) => Response::ok(&h),
                Err(e) => Response::error(e.to_string()),
            };
            json_line(&r);
        }
        return;
    }
    let mut n = 0;
    while !i.is_empty() && n < 8 {
        n += 1;
        let line = if i.bool() {
            let req = built_request(&mut i);
            let line = req.to_line();
            assert_eq!(
                parse_agent_request(&line).as_ref(),
                Ok(&req),
                "request does not survive the wire: {line}"
            );
            line
        } else {
            match std::str::from_utf8(i.long_bytes()) {
                Ok(s) => s.trim_end().to_string(),
                Err(_) => continue,
            }
        };
        json_line(&answer(f, &line));
    }
}
