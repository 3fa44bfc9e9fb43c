//! `oxvsctl traceflow` against fake agents (Unix sockets served by threads
//! of this test): how it finds the source node, follows the tunnel to the
//! next node's agent with the arrival it was given, prints, and exits.
//! No root needed.

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Arc, Mutex};

use common::{text, TempDir};
use oxvs_api::agent::{
    parse_agent_request, AgentRequest, FlowOwner, PodInfo, TraceStep, TraceflowHop, TunnelArrival,
    Verdict,
};
use oxvs_api::Response;
use serde_json::Value;

type Handler = Box<dyn Fn(&AgentRequest) -> Response + Send>;

/// A fake agent on a socket in a temp dir; records what it was asked.
struct FakeAgent {
    path: PathBuf,
    seen: Arc<Mutex<Vec<AgentRequest>>>,
    _dir: TempDir,
}

fn fake_agent(tag: &str, handler: Handler) -> FakeAgent {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("oxvsctl-tf-{}-{tag}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut line = String::new();
            let mut r = BufReader::new(stream.try_clone().unwrap());
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                let resp = match parse_agent_request(line.trim_end()) {
                    Ok(req) => {
                        let resp = handler(&req);
                        seen2.lock().unwrap().push(req);
                        resp
                    }
                    Err(e) => Response::error(e),
                };
                let _ = writeln!(stream, "{}", resp.to_line());
                line.clear();
            }
        }
    });
    FakeAgent {
        path,
        seen,
        _dir: TempDir(dir),
    }
}

fn step(pass: usize, table: u8, name: &str, cookie: u64, owner: FlowOwner, ann: &str) -> TraceStep {
    TraceStep {
        pass,
        table,
        table_name: Some(name.into()),
        matched: true,
        priority: Some(200),
        cookie,
        matches: "ip".into(),
        actions: vec!["goto_table:Next".into()],
        owner: Some(owner),
        annotation: ann.into(),
    }
}

fn hop(node: &str, verdict: Verdict, next: Option<TunnelArrival>) -> TraceflowHop {
    TraceflowHop {
        node: node.into(),
        packet: "in_port=3,tcp".into(),
        text: "Flow: tcp\nDatapath actions: 4".into(),
        steps: vec![
            step(
                0,
                0,
                "Classifier",
                0x2000000000003,
                FlowOwner::Pod {
                    ofport: 3,
                    pod: Some("x/a".into()),
                },
                "pod x/a (port 3)",
            ),
            step(
                1,
                90,
                "Output",
                0x1000000000000,
                FlowOwner::Pipeline,
                "pipeline default",
            ),
        ],
        datapath_actions: vec!["4".into()],
        verdict,
        allowed_by: vec![],
        next,
        injected: false,
    }
}

fn arrival() -> TunnelArrival {
    TunnelArrival {
        from_node: "n1".into(),
        tun_src: Ipv4Addr::new(192, 168, 9, 1).into(),
        tun_dst: Ipv4Addr::new(192, 168, 9, 2).into(),
        src_mac: "0a:58:0a:f4:00:01".into(),
        dst_mac: "aa:bb:cc:dd:ee:ff".into(),
        src_ip: Ipv4Addr::new(10, 244, 0, 3).into(),
        dst_ip: Ipv4Addr::new(10, 244, 1, 3).into(),
        ttl: 63,
    }
}

fn pod_info(node: &str, local: bool) -> PodInfo {
    PodInfo {
        namespace: "x".into(),
        name: "a".into(),
        node: node.into(),
        ip: Some(Ipv4Addr::new(10, 244, 0, 3)),
        local,
        mac: None,
        ofport: None,
        ip6: None,
    }
}

fn oxvsctl(args: &[&str]) -> Output {
    common::oxvsctl(args, None)
}

#[test]
fn one_node_delivered_exits_0_and_prints_steps() {
    let a = fake_agent(
        "one",
        Box::new(|req| match req {
            AgentRequest::Traceflow(t) if t.src == "x/a" && t.dport == Some(80) && !t.inject => {
                Response::ok(&hop(
                    "n1",
                    Verdict::Delivered {
                        ofport: 4,
                        to: "pod x/b".into(),
                    },
                    None,
                ))
            }
            other => Response::error(format!("unexpected {other:?}")),
        }),
    );
    let sock = a.path.to_string_lossy().into_owned();
    let o = oxvsctl(&[
        "traceflow",
        "--src",
        "x/a",
        "--dst",
        "x/b",
        "--dport",
        "80",
        "--agent-socket",
        &sock,
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("Traceflow x/a -> x/b (tcp 49152 -> 80)"), "{t}");
    assert!(t.contains("Node n1"), "{t}");
    assert!(t.contains("0. Classifier"), "{t}");
    assert!(t.contains("pod x/a (port 3)"), "{t}");
    assert!(t.contains("-- after conntrack (pass 1"), "{t}");
    assert!(t.contains("=> delivered to pod x/b (port 4)"), "{t}");
    assert!(
        t.contains("Result: delivered to pod x/b (port 4) on node n1"),
        "{t}"
    );
    // One request only: a single agent is asked directly.
    assert_eq!(a.seen.lock().unwrap().len(), 1);
}

#[test]
fn two_nodes_follow_the_tunnel_with_the_arrival() {
    let n1 = fake_agent(
        "n1",
        Box::new(|req| match req {
            AgentRequest::Pod { .. } => Response::ok(&pod_info("n1", true)),
            AgentRequest::Traceflow(t) if t.from_tunnel.is_none() => Response::ok(&hop(
                "n1",
                Verdict::Tunnel {
                    ofport: 9,
                    tun_dst: Some(Ipv4Addr::new(192, 168, 9, 2).into()),
                    node: Some("n2".into()),
                },
                Some(arrival()),
            )),
            other => Response::error(format!("n1: unexpected {other:?}")),
        }),
    );
    let n2 = fake_agent(
        "n2",
        Box::new(|req| match req {
            AgentRequest::Pod { .. } => Response::ok(&pod_info("n1", false)),
            AgentRequest::Traceflow(t) if t.from_tunnel == Some(arrival()) && !t.inject => {
                let mut h = hop(
                    "n2",
                    Verdict::Dropped {
                        by: "NetworkPolicy x/deny-all ingress (isolation)".into(),
                        table: Some(71),
                        table_name: Some("IngressDefaultRule".into()),
                    },
                    None,
                );
                h.allowed_by = vec![];
                Response::ok(&h)
            }
            other => Response::error(format!("n2: unexpected {other:?}")),
        }),
    );
    let s1 = format!("n1={}", n1.path.display());
    let s2 = format!("n2={}", n2.path.display());
    // n2 first: it says the pod runs on n1, so n1 is asked.
    let args = [
        "traceflow",
        "--src",
        "x/a",
        "--dst",
        "x/r",
        "--proto",
        "tcp",
        "--dport",
        "80",
        "--inject",
        "--agent-socket",
        &s2,
        "--agent-socket",
        &s1,
    ];
    let o = oxvsctl(&args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "dropped: {t}");
    assert!(t.contains("Node n1") && t.contains("Node n2"), "{t}");
    assert!(
        t.contains("sent through the tunnel (port 9) to node n2 (192.168.9.2)"),
        "{t}"
    );
    assert!(
        t.contains("Result: dropped on node n2 by NetworkPolicy x/deny-all ingress (isolation)"),
        "{t}"
    );
    // The first hop injects (asked for), the second only traces.
    let seen1 = n1.seen.lock().unwrap().clone();
    assert!(seen1
        .iter()
        .any(|r| matches!(r, AgentRequest::Traceflow(t) if t.inject)));

    // --json: the whole report.
    let mut args_json = vec!["--json"];
    args_json.extend_from_slice(&args);
    let o = oxvsctl(&args_json);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"], "dropped");
    assert_eq!(v["hops"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["hops"][0]["verdict"]["kind"], "tunnel");
    assert_eq!(
        v["hops"][1]["verdict"]["by"],
        "NetworkPolicy x/deny-all ingress (isolation)"
    );
    assert_eq!(v["hops"][0]["steps"][0]["owner"]["pod"], "x/a");
}

#[test]
fn a_node_without_a_socket_makes_the_trace_incomplete() {
    let n1 = fake_agent(
        "inc",
        Box::new(|req| match req {
            AgentRequest::Pod { .. } => Response::ok(&pod_info("n1", true)),
            AgentRequest::Traceflow(_) => Response::ok(&hop(
                "n1",
                Verdict::Tunnel {
                    ofport: 9,
                    tun_dst: Some(Ipv4Addr::new(192, 168, 9, 2).into()),
                    node: Some("n2".into()),
                },
                Some(arrival()),
            )),
            AgentRequest::Info => Response::error("no"),
        }),
    );
    let s1 = format!("n1={}", n1.path.display());
    let o = oxvsctl(&[
        "traceflow",
        "--src",
        "x/a",
        "--dst",
        "x/r",
        "--dport",
        "80",
        "--agent-socket",
        &s1,
    ]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(5), "{t}");
    assert!(t.contains("no --agent-socket n2=PATH was given"), "{t}");
}

#[test]
fn refusals_unreachable_agents_and_usage() {
    let a = fake_agent(
        "ref",
        Box::new(|_| Response::error("pod x/zz is not known to node n1")),
    );
    let sock = a.path.to_string_lossy().into_owned();
    let o = oxvsctl(&[
        "traceflow",
        "--src",
        "x/zz",
        "--dst",
        "x/b",
        "--dport",
        "80",
        "--agent-socket",
        &sock,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("pod x/zz is not known to node n1"));

    let o = oxvsctl(&[
        "traceflow",
        "--src",
        "x/a",
        "--dst",
        "x/b",
        "--dport",
        "80",
        "--agent-socket",
        "/nonexistent/oxvs-agent.sock",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("/nonexistent/oxvs-agent.sock"),
        "{}",
        text(&o)
    );

    for bad in [
        vec!["traceflow", "--src", "x/a", "--dst", "x/b"],
        vec![
            "traceflow",
            "--src",
            "x/a",
            "--dst",
            "x/b",
            "--proto",
            "icmp",
            "--dport",
            "1",
        ],
        vec![
            "traceflow",
            "--src",
            "x/a",
            "--dst",
            "x/b",
            "--proto",
            "gre",
            "--dport",
            "1",
        ],
        vec![
            "traceflow",
            "--src",
            "x/a",
            "--dst",
            "x/b",
            "--dport",
            "1",
            "--agent-socket",
            "n1=/a",
            "--agent-socket",
            "/b",
        ],
    ] {
        let o = oxvsctl(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
    }
}
