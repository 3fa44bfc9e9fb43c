//! The control server in-process: a `Switch` (no ports needed) served on a
//! temporary socket, driven with `oxvs_api::Client`.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxvs_api::{
    Client, ClientError, DumpConntrackResult, DumpFlowsResult, FlowModResult, PacketInResult,
    Request, ShowResult, StatsResult, TraceRequest, TraceResult, VersionResult,
};
use oxvs_pipeline::tables::Pipeline;
use oxvs_switch::control::{ControlError, ControlServer};
use oxvs_switch::engine::{Switch, SwitchConfig};

/// A unique directory per test (removed on drop), holding the socket.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "oxvs-ctl-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
    fn sock(&self) -> PathBuf {
        self.0.join("sub/switchd.sock")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn switch() -> Arc<Switch> {
    Arc::new(Switch::start(SwitchConfig::default(), Arc::new(Pipeline::new())).unwrap())
}

fn serve(tag: &str) -> (TempDir, ControlServer, Client) {
    let dir = TempDir::new(tag);
    let server = ControlServer::start(dir.sock(), switch()).unwrap();
    let client = Client::connect(dir.sock()).unwrap();
    (dir, server, client)
}

const FLOWS: &str = "\
# the example
table=0, priority=10, ip actions=drop
table=0 actions=goto_table:10
table=10, priority=5, tcp, tp_dst=80 actions=output:1
";

fn dump(c: &mut Client) -> Vec<String> {
    let r: DumpFlowsResult = c
        .call_as(&Request::DumpFlows {
            table: None,
            names: false,
            stats: false,
        })
        .unwrap();
    r.lines
}

#[test]
fn socket_is_0600_in_a_created_directory_and_removed_on_stop() {
    let dir = TempDir::new("mode");
    let mut server = ControlServer::start(dir.sock(), switch()).unwrap();
    let meta = std::fs::metadata(dir.sock()).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    server.stop();
    assert!(!dir.sock().exists());
    let e = Client::connect(dir.sock()).unwrap_err();
    assert!(e.is_unreachable());
}

/// `stop` returns when the socket's directory is gone (deleted under a
/// running switchd, as a test harness or an operator may): it used to
/// wake its accept thread by connecting to the path, and hung for ever.
/// Also a path taken over by another socket is not connected to.
#[test]
fn stop_returns_when_the_socket_path_is_gone_or_someone_elses() {
    for takeover in [false, true] {
        let dir = TempDir::new("gone");
        let server = ControlServer::start(dir.sock(), switch()).unwrap();
        std::fs::remove_dir_all(&dir.0).unwrap();
        let _other = takeover.then(|| {
            std::fs::create_dir_all(dir.sock().parent().unwrap()).unwrap();
            std::os::unix::net::UnixListener::bind(dir.sock()).unwrap()
        });
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut server = server;
            server.stop();
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "stop() hung (path taken over: {takeover})"
        );
        if takeover {
            assert!(dir.sock().exists(), "another's socket is left alone");
        }
    }
}

#[test]
fn flows_add_dump_delete_replace() {
    let (_d, _s, mut c) = serve("flows");
    let r: FlowModResult = c
        .call_as(&Request::AddFlows {
            flows: FLOWS.into(),
        })
        .unwrap();
    assert_eq!((r.added, r.n_flows), (3, 3));
    assert_eq!(
        dump(&mut c),
        vec![
            " actions=goto_table:10",
            " priority=10,ip actions=drop",
            " table=10, priority=5,tcp,tp_dst=80 actions=output:1",
        ]
    );
    // Structured entries and table names; table filter by name.
    let r: DumpFlowsResult = c
        .call_as(&Request::DumpFlows {
            table: Some("SpoofGuard".into()),
            names: true,
            stats: true,
        })
        .unwrap();
    assert_eq!(r.flows.len(), 1);
    let f = &r.flows[0];
    assert_eq!((f.table, f.priority), (10, 5));
    assert_eq!(f.table_name.as_deref(), Some("SpoofGuard"));
    assert_eq!(f.matches, "tcp,tp_dst=80");
    assert_eq!(f.actions, "output:1");
    assert!(
        r.lines[0].contains("table=SpoofGuard, n_packets=0"),
        "{}",
        r.lines[0]
    );

    // mod-flows changes actions only.
    let r: FlowModResult = c
        .call_as(&Request::ModFlows {
            flows: "table=10,tcp actions=output:2".into(),
            strict: false,
        })
        .unwrap();
    assert_eq!(r.modified, 1);
    assert!(dump(&mut c)[2].ends_with("actions=output:2"));

    // del-flows strict needs the exact match and priority.
    let r: FlowModResult = c
        .call_as(&Request::DelFlows {
            spec: Some("table=0,ip".into()),
            strict: true,
        })
        .unwrap();
    assert_eq!(r.deleted, 0);
    let r: FlowModResult = c
        .call_as(&Request::DelFlows {
            spec: Some("table=0,ip,priority=10".into()),
            strict: true,
        })
        .unwrap();
    assert_eq!((r.deleted, r.n_flows), (1, 2));

    // replace-flows: exactly the file.
    let r: FlowModResult = c
        .call_as(&Request::ReplaceFlows {
            flows: "table=0 actions=goto_table:10\ntable=20 actions=drop\n".into(),
        })
        .unwrap();
    assert_eq!((r.added, r.deleted, r.n_flows), (1, 1, 2));
    assert_eq!(
        dump(&mut c),
        vec![" actions=goto_table:10", " table=20, actions=drop"]
    );

    // del-flows without a spec: everything.
    let r: FlowModResult = c
        .call_as(&Request::DelFlows {
            spec: None,
            strict: false,
        })
        .unwrap();
    assert_eq!(r.n_flows, 0);
    assert!(dump(&mut c).is_empty());
}

#[test]
fn a_bundle_with_one_bad_flow_changes_nothing() {
    let (_d, _s, mut c) = serve("atomic");
    c.call(&Request::AddFlows {
        flows: FLOWS.into(),
    })
    .unwrap();
    let before = dump(&mut c);
    // Syntax error on line 3: line, column and token.
    let e = c
        .call(&Request::AddFlows {
            flows: "table=1 actions=drop\n\ntable=2,nw_dts=1 actions=drop\n".into(),
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ClientError::Refused(_)));
    assert!(msg.starts_with("line 3, column 9:"), "{msg}");
    assert!(msg.contains("'nw_dts'"), "{msg}");
    // Table error on line 2 (a goto backwards).
    let e = c
        .call(&Request::ReplaceFlows {
            flows: "table=1 actions=drop\ntable=5 actions=goto_table:1\n".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 2"), "{e}");
    assert!(e.contains("goto_table"), "{e}");
    let e = c
        .call(&Request::AddFlows {
            flows: "table=1 actions=drop\ntable=1, priority=1, actions=drop\ntable=6 actions=conjunction(1,3/2)\n"
                .into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 3"), "{e}");
    assert_eq!(dump(&mut c), before);
    // Bad specs and tables.
    for req in [
        Request::DelFlows {
            spec: Some("nw_dts=1".into()),
            strict: false,
        },
        Request::ModFlows {
            flows: "\n\nbogus actions=drop".into(),
            strict: false,
        },
        Request::DumpFlows {
            table: Some("Nope".into()),
            names: false,
            stats: true,
        },
        Request::DumpFlows {
            table: Some("255".into()),
            names: false,
            stats: true,
        },
    ] {
        let e = c.call(&req).unwrap_err().to_string();
        assert!(
            e.contains("nw_dts")
                || e.contains("line 3")
                || e.contains("'Nope'")
                || e.contains("255"),
            "{e}"
        );
    }
    assert_eq!(dump(&mut c), before);
}

#[test]
fn trace_by_spec_and_by_packet() {
    let (_d, _s, mut c) = serve("trace");
    c.call(&Request::AddFlows {
        flows: FLOWS.into(),
    })
    .unwrap();
    let r: TraceResult = c
        .call_as(&Request::Trace(TraceRequest {
            spec: Some("in_port=1,tcp,tp_dst=80".into()),
            names: true,
            ..TraceRequest::default()
        }))
        .unwrap();
    assert!(!r.injected);
    assert!(r.text.contains("SpoofGuard"), "{}", r.text);
    assert!(r.text.contains("Datapath actions:"), "{}", r.text);
    // A raw frame: Ethernet + IPv4 + UDP.
    let frame =
        "0a00000000020a0000000001080045000020000000004011000a0a0000010a0000020035003500080000";
    let r: TraceResult = c
        .call_as(&Request::Trace(TraceRequest {
            packet_hex: Some(frame.into()),
            in_port: Some(3),
            ..TraceRequest::default()
        }))
        .unwrap();
    assert!(r.text.contains("in_port=3"), "{}", r.text);
    assert!(r.text.contains("Datapath actions: drop"), "{}", r.text);
    // ct_next is parsed; errors name the bad value.
    let bad = [
        TraceRequest {
            spec: Some("in_port=1,tcp".into()),
            ct_next: vec!["bogus".into()],
            ..TraceRequest::default()
        },
        TraceRequest {
            spec: Some("in_port=1,tpc".into()),
            ..TraceRequest::default()
        },
        TraceRequest {
            packet_hex: Some("zz".into()),
            in_port: Some(1),
            ..TraceRequest::default()
        },
        TraceRequest {
            packet_hex: Some("00".into()),
            ..TraceRequest::default()
        },
        TraceRequest::default(),
    ];
    let wants = ["'bogus'", "tpc", "'zz'", "in_port", "give a packet"];
    for (t, want) in bad.into_iter().zip(wants) {
        let e = c.call(&Request::Trace(t)).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// The result carries the trace twice: the text and its structure, made
/// from one report, so they agree. An output to a port the switch does not
/// have sends nothing ("Nonexistent output port", as OVS says); port 0
/// never exists, and once the switch has ports any number not among them
/// does not either.
#[test]
fn trace_is_structured_and_outputs_to_missing_ports_send_nothing() {
    use oxvs_api::{PortKind, PortSpec, TraceDropReason, TraceNoteKind};
    let (_d, _s, mut c) = serve("trace-typed");
    c.call(&Request::AddFlows {
        flows: "table=0, priority=10, in_port=1, tcp actions=output:7,output:0,output:5\n\
                table=0, priority=5, in_port=1 actions=resubmit(,3),output:0\n\
                table=3, priority=1, cookie=0x33 actions=load:0x1->NXM_NX_REG0[]\n"
            .into(),
    })
    .unwrap();
    let trace = |c: &mut Client, spec: &str| -> TraceResult {
        c.call_as(&Request::Trace(TraceRequest {
            spec: Some(spec.into()),
            ..TraceRequest::default()
        }))
        .unwrap()
    };
    // No port at all: port 0 still does not exist.
    let r = trace(&mut c, "in_port=1,udp");
    assert!(
        r.text
            .contains("    output:0\n     >> Nonexistent output port\n"),
        "{}",
        r.text
    );
    assert!(r.text.contains("Datapath actions: drop"), "{}", r.text);
    let t = r.trace.as_ref().expect("a structured trace");
    assert_eq!(t.passes.len(), 1);
    let p = &t.passes[0];
    assert_eq!(p.datapath_actions, "drop");
    let tables: Vec<(u8, Option<usize>)> = p.steps.iter().map(|s| (s.table, s.parent)).collect();
    assert_eq!(tables, vec![(0, None), (3, Some(0))]);
    let first = &p.steps[0];
    let flow = first.flow.as_ref().unwrap();
    assert_eq!((flow.priority, flow.matches.as_str()), (5, "in_port=1"));
    assert_eq!(flow.actions, "resubmit(,3),output:0");
    let acts: Vec<&str> = first.actions.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(acts, vec!["resubmit(,3)", "output:0"]);
    assert_eq!(first.actions[0].lookup, Some(1));
    assert_eq!(first.actions[1].notes[0].kind, TraceNoteKind::Warning);
    assert_eq!(first.actions[1].notes[0].text, "Nonexistent output port");
    assert_eq!(p.steps[1].flow.as_ref().unwrap().cookie, 0x33);
    let drop = p.verdict.drop.as_ref().expect("dropped");
    assert_eq!(drop.reason, TraceDropReason::NonexistentPort);
    assert_eq!((drop.step, drop.port), (Some(0), Some(0)));
    assert!(p.verdict.outputs.is_empty());

    // With ports (a VXLAN port needs a raw socket: root).
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("adding a VXLAN port needs root (CAP_NET_RAW)");
        return;
    }
    c.call(&Request::AddPort(PortSpec {
        name: "tun".into(),
        ofport: Some(5),
        kind: PortKind::Vxlan {
            local_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            dst_port: Some(0),
            underlay_mtu: Some(1500),
        },
    }))
    .unwrap();
    let r = trace(&mut c, "in_port=1,tcp,nw_dst=10.0.0.2,tp_dst=80");
    assert_eq!(
        r.text.matches(" >> Nonexistent output port\n").count(),
        2,
        "{}",
        r.text
    );
    assert!(r.text.ends_with("Datapath actions: 5"), "{}", r.text);
    let v = &r.trace.as_ref().unwrap().passes[0].verdict;
    assert_eq!(v.drop, None);
    let ports: Vec<u32> = v.outputs.iter().map(|o| o.port).collect();
    assert_eq!(ports, vec![5]);
    assert_eq!(
        v.outputs[0].headers.nw_dst,
        Some("10.0.0.2".parse().unwrap())
    );
}

#[test]
fn bad_lines_get_an_answer_and_the_connection_lives_on() {
    let (_d, _s, mut c) = serve("bad");
    let cases = [
        ("this is not json", "not valid JSON"),
        ("{\"v\":1,\"op\":\"frobnicate\"}", "unknown op 'frobnicate'"),
        (
            "{\"v\":9,\"op\":\"show\"}",
            "unsupported protocol version 9",
        ),
        ("{\"op\":\"show\"}", "no \"v\""),
        ("[]", "JSON object"),
        ("", "not valid JSON"),
        ("{\"v\":1,\"op\":\"del-port\",\"nme\":\"x\"}", "del-port"),
    ];
    for (line, want) in cases {
        let r = c.call_raw(line).unwrap();
        assert!(!r.ok, "{line}");
        let e = r.error.unwrap();
        assert!(e.contains(want), "{line}: {e}");
    }
    let v: VersionResult = c.call_as(&Request::Version).unwrap();
    assert_eq!(v.protocol, 1);
    // Port operations reach the engine and its error comes back.
    let e = c
        .call(&Request::DelPort {
            name: "nope".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("'nope'"), "{e}");
}

#[test]
fn show_stats_conntrack_packet_in() {
    let (_d, _s, mut c) = serve("misc");
    let s: ShowResult = c.call_as(&Request::Show).unwrap();
    assert_eq!(s.n_flows, 0);
    let st: StatsResult = c.call_as(&Request::Stats).unwrap();
    assert_eq!(st.packets, 0);
    assert_eq!(st.ns_per_packet, None);
    let ct: DumpConntrackResult = c
        .call_as(&Request::DumpConntrack { zone: Some(1) })
        .unwrap();
    assert!(ct.entries.is_empty());
    c.call(&Request::FlushConntrack {
        zone: None,
        proto: None,
        reply_src: None,
        reply_sport: None,
    })
    .unwrap();
    let t0 = Instant::now();
    let p: PacketInResult = c
        .call_as(&Request::PacketIn {
            max: 10,
            wait_ms: 150,
        })
        .unwrap();
    assert!(p.packets.is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(150));
}

#[test]
fn a_live_socket_is_refused_a_stale_one_replaced_a_file_kept() {
    let dir = TempDir::new("claim");
    let mut first = ControlServer::start(dir.sock(), switch()).unwrap();
    let e = ControlServer::start(dir.sock(), switch()).unwrap_err();
    assert!(matches!(e, ControlError::AlreadyServing(_)), "{e}");
    assert_eq!(
        e.to_string(),
        format!("another oxvs-switchd is serving {}", dir.sock().display())
    );
    // The first keeps serving.
    Client::connect(dir.sock())
        .unwrap()
        .call(&Request::Version)
        .unwrap();
    first.stop();

    // A stale socket (bound, nobody listening) is replaced.
    drop(std::os::unix::net::UnixListener::bind(dir.sock()).unwrap());
    assert!(dir.sock().exists());
    let mut second = ControlServer::start(dir.sock(), switch()).unwrap();
    Client::connect(dir.sock())
        .unwrap()
        .call(&Request::Version)
        .unwrap();
    second.stop();

    // A regular file is never removed.
    std::fs::write(dir.sock(), "keep me").unwrap();
    let e = ControlServer::start(dir.sock(), switch()).unwrap_err();
    assert!(matches!(e, ControlError::NotASocket(_)), "{e}");
    assert_eq!(std::fs::read_to_string(dir.sock()).unwrap(), "keep me");
}

#[test]
fn concurrent_clients_and_stop_with_open_connections() {
    let (dir, mut server, _idle) = serve("conc");
    let path = dir.sock();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&path).unwrap();
                for j in 0..20 {
                    let flows = format!("table={i}, priority={j}, ip actions=drop");
                    c.call(&Request::AddFlows { flows }).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = Client::connect(&path).unwrap();
    assert_eq!(dump(&mut c).len(), 160);
    // Stop returns although `_idle` and `c` are still connected.
    server.stop();
    assert!(!path.exists());
    assert!(c.call(&Request::Version).is_err());
}

#[test]
fn bundle_deletes_and_adds_in_one_version() {
    let (_d, _s, mut c) = serve("bundle");
    c.call(&Request::AddFlows {
        flows: FLOWS.into(),
    })
    .unwrap();
    let r: FlowModResult = c
        .call_as(&Request::Bundle {
            mods: "delete_strict table=10, priority=5, tcp, tp_dst=80\n\
                   add table=10, priority=5, tcp, tp_dst=81 actions=output:2\n\
                   table=10, priority=6, udp actions=drop\n"
                .into(),
        })
        .unwrap();
    assert_eq!((r.deleted, r.added), (1, 2), "{r:?}");
    let lines = dump(&mut c).join("\n");
    assert!(!lines.contains("tp_dst=80"), "{lines}");
    assert!(lines.contains("tp_dst=81 actions=output:2"), "{lines}");
    // A bad line anywhere: nothing changes, and the error names the line
    // and column (past the command word).
    let before = dump(&mut c);
    let e = c
        .call(&Request::Bundle {
            mods: "delete table=10\nadd table=10, nw_dts=1 actions=drop\n".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 2, column 15:"), "{e}");
    assert_eq!(dump(&mut c), before);
}

fn groups(c: &mut Client) -> Vec<String> {
    let r: oxvs_api::DumpGroupsResult = c.call_as(&Request::DumpGroups { group_id: None }).unwrap();
    r.lines
}

#[test]
fn groups_in_bundles_with_flows() {
    let (_d, _s, mut c) = serve("groups");
    // A flow and the group it names, in one bundle, the group after it.
    let r: FlowModResult = c
        .call_as(&Request::Bundle {
            mods: "flow add table=0, priority=5, in_port=1 actions=group:1\n\
                   group add group_id=1,type=all,bucket=output:2,bucket=output:3\n"
                .into(),
        })
        .unwrap();
    assert_eq!(r.added, 1, "{r:?}");
    assert_eq!(
        groups(&mut c),
        vec!["group_id=1,type=all,bucket=bucket_id:0,actions=output:2,bucket=bucket_id:1,actions=output:3"]
    );
    // A flow naming a missing group fails the whole bundle, naming its line.
    let before = (dump(&mut c), groups(&mut c));
    let e = c
        .call(&Request::Bundle {
            mods: "group add group_id=2,type=indirect,bucket=output:4\n\
                   add table=0, priority=6, in_port=2 actions=group:3\n"
                .into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 2: ") && e.contains("group 3"), "{e}");
    assert_eq!((dump(&mut c), groups(&mut c)), before);
    // A bad group line: its line and column (past `group add `).
    let e = c
        .call(&Request::Bundle {
            mods: "group add group_id=2,type=bogus\n".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("line 1, column 27:"), "{e}");
    // add-groups: an existing id refuses the file; mod-groups replaces.
    let e = c
        .call(&Request::AddGroups {
            groups: "group_id=5,type=all\ngroup_id=1,type=all\n".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("line 2: ") && e.contains("already exists"),
        "{e}"
    );
    let r: oxvs_api::GroupModResult = c
        .call_as(&Request::ModGroups {
            groups: "group_id=1,type=indirect,bucket=output:4\n".into(),
            may_create: false,
        })
        .unwrap();
    assert_eq!((r.modified, r.n_groups), (1, 1));
    // Deleting it deletes its flow; `group delete` in a bundle too.
    c.call(&Request::Bundle {
        mods: "group add group_id=7,type=all\nadd table=0, in_port=7 actions=group:7\n".into(),
    })
    .unwrap();
    let r: oxvs_api::GroupModResult = c
        .call_as(&Request::DelGroups {
            spec: Some("group_id=1".into()),
        })
        .unwrap();
    assert_eq!((r.deleted, r.flows_deleted, r.n_groups), (1, 1, 1));
    c.call(&Request::Bundle {
        mods: "group delete group_id=7\n".into(),
    })
    .unwrap();
    assert!(groups(&mut c).is_empty());
    assert!(dump(&mut c).is_empty());
    let e = c
        .call(&Request::DelGroups {
            spec: Some("group_id=x".into()),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad group spec"), "{e}");
}

/// Meters through the control socket: add, a flow naming a missing meter
/// refused (OFPMMFC_INVALID_METER), dump-meters and meter-stats as
/// `ovs-ofctl` prints them, the trace's `meter:1`, mod-meter, and
/// del-meters taking the flow with it.
#[test]
fn meters_add_dump_stats_delete() {
    use oxvs_api::{DumpMetersResult, MeterModResult, MeterStatsResult};
    let (_d, _s, mut c) = serve("meters");
    let e = c
        .call(&Request::AddFlows {
            flows: "table=0,priority=10,udp actions=meter:1,controller".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("OFPMMFC_INVALID_METER"), "{e}");
    let r: MeterModResult = c
        .call_as(&Request::AddMeters {
            meters: "meter=1,pktps,burst,stats,band=type=drop,rate=10,burst_size=10".into(),
        })
        .unwrap();
    assert_eq!((r.added, r.n_meters), (1, 1));
    let e = c
        .call(&Request::AddMeters {
            meters: "meter=1,pktps,band=type=drop,rate=10".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("OFPMMFC_METER_EXISTS"), "{e}");
    let e = c
        .call(&Request::AddMeters {
            meters: "meter=2,pktps,band=type=drop,rate=10,burst_size=5".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("only when 'burst' flag is set"), "{e}");
    c.call(&Request::AddFlows {
        flows: "table=0,priority=10,udp actions=meter:1,controller".into(),
    })
    .unwrap();
    let r: DumpMetersResult = c.call_as(&Request::DumpMeters { meter_id: None }).unwrap();
    assert_eq!(
        r.lines,
        vec!["meter=1 pktps burst stats bands=\ntype=drop rate=10 burst_size=10"]
    );
    assert_eq!(r.meters[0].n_flows, 1);
    // The trace shows the meter (the flood itself is metered in the
    // pipeline's tests/meters.rs: injecting needs a real port).
    let r: TraceResult = c
        .call_as(&Request::Trace(TraceRequest {
            spec: Some("in_port=3,udp,nw_src=10.0.0.1,nw_dst=10.0.0.2".into()),
            ..TraceRequest::default()
        }))
        .unwrap();
    assert!(r.text.contains("\n    meter:1\n"), "{}", r.text);
    assert!(
        r.text.contains("Datapath actions: meter(1),userspace("),
        "{}",
        r.text
    );
    let st: MeterStatsResult = c
        .call_as(&Request::MeterStats { meter_id: Some(1) })
        .unwrap();
    assert!(
        st.lines[0].starts_with("meter:1 flow_count:1 packet_in_count:0 byte_in_count:0 duration:"),
        "{}",
        st.lines[0]
    );
    assert!(
        st.lines[0].ends_with("s bands:\n0: packet_count:0 byte_count:0"),
        "{}",
        st.lines[0]
    );
    let r: MeterModResult = c
        .call_as(&Request::ModMeters {
            meters: "meter=1,kbps,band=type=drop,rate=1000".into(),
        })
        .unwrap();
    assert_eq!(r.modified, 1);
    let e = c
        .call(&Request::ModMeters {
            meters: "meter=9,kbps,band=type=drop,rate=1000".into(),
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("OFPMMFC_UNKNOWN_METER"), "{e}");
    let r: MeterModResult = c
        .call_as(&Request::DelMeters {
            spec: Some("meter=1".into()),
        })
        .unwrap();
    assert_eq!((r.deleted, r.flows_deleted, r.n_meters), (1, 1, 0));
    assert!(dump(&mut c).is_empty());
}
