//! `control`: the switch's control-socket protocol, as `oxvs-switchd`
//! answers it: request lines through [`protocol::parse_request`] and
//! [`control::handle_line`] against a running [`Switch`] (no ports) that
//! holds the example pipeline.
//!
//! The input is a list of lines: raw text, or a request built from the
//! input (flow text, specs, table names, zones, trace requests) and put on
//! the wire with [`Request::to_line`]. Two requests are never sent, since
//! they act outside the process or wait: `add-port` (it would attach
//! AF_XDP to a host interface) and `packet-in` with a wait (it is sent with
//! `wait_ms` 0 instead).
//!
//! Checked for every line: the response is one line of JSON that decodes
//! back to the same [`Response`], with the protocol version; a line the
//! protocol refuses gets `ok: false`; no handler panicked (the server turns
//! a panic into an "internal error" answer, which the harness treats as
//! the bug it is); a built request survives `to_line` then `parse_request`
//! unchanged. Before each input the switch is reset to the example flows
//! and an empty conntrack, so every input starts from the same state.

use std::sync::{Mutex, OnceLock};

use oxvs_api::protocol::{self, Request, Response, TraceRequest};
use oxvs_pipeline::tables::Pipeline;
use oxvs_switch::control;
use oxvs_switch::engine::Switch;

use crate::input::Input;

fn switch() -> &'static Mutex<Switch> {
    static S: OnceLock<Mutex<Switch>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(crate::common::start_switch()))
}

fn reset(switch: &Switch) {
    let p: &Pipeline = switch.pipeline();
    p.replace_all(&crate::common::antrea_flows(), 0)
        .expect("the example flows install");
    switch.with_conntrack(|ct| ct.flush(None));
}

/// Pieces of flow text the structured requests are made of.
const FLOW_BITS: &[&str] = &[
    "table=0,priority=10,ip,actions=drop",
    "table=ConntrackZone,priority=5,tcp,tp_dst=80,actions=ct(zone=7,table=31)",
    "priority=1,in_port=3,dl_src=0a:58:0a:f4:00:03,actions=output:4",
    "table=50,cookie=0x4000000000001/-1,ip,nw_dst=10.244.0.0/24,actions=dec_ttl,goto_table:60",
    "table=90,priority=0,actions=controller(reason=action,userdata=01.02)",
    "table=31,ct_state=+trk+est-rpl,actions=conjunction(5,1/2)",
    "table=40,conj_id=5,ip,actions=load:0x5->NXM_NX_REG5[],goto_table:45",
    "add table=0,priority=1 actions=drop",
    "modify_strict table=90,priority=200,reg1=0x4 actions=output:4",
    "delete table=70",
    "table=0",
    "cookie=0x3000000000002/0xffff000000000000",
    "in_port=3,tcp,nw_src=10.244.0.3,nw_dst=10.244.0.4,tp_dst=80,tcp_flags=+syn",
    "in_port=2,ip,tun_src=192.168.77.12,nw_src=10.244.1.7,nw_dst=10.244.0.4,dl_dst=0a:58:0a:f4:00:04",
    "arp,in_port=3,arp_tpa=10.244.0.1,arp_op=1",
    "group_id=1,type=select,selection_method=hash,fields(ip_src,tcp_dst),bucket=weight:3,output:2,bucket=output:3",
    "group add group_id=2,type=indirect,bucket=actions=ct(commit,nat(dst=10.0.0.2:80))",
    "group delete group_id=1",
    "table=0,priority=3,in_port=1,actions=group:1",
    "group_id=all",
    "\n",
    " # comment\n",
    "\\\n",
];

fn text(i: &mut Input<'_>) -> String {
    let mut s = String::new();
    let n = i.below(6);
    for _ in 0..n {
        if i.u8() < 200 {
            s.push_str(i.pick::<&str>(FLOW_BITS));
            if i.bool() {
                s.push('\n');
            }
        } else {
            s.push_str(&String::from_utf8_lossy(i.short_bytes()));
        }
    }
    s
}

fn opt_text(i: &mut Input<'_>) -> Option<String> {
    i.bool().then(|| text(i))
}

fn built_request(i: &mut Input<'_>) -> Request {
    match i.u8() % 20 {
        0 => Request::Show,
        1 => Request::DelPort { name: text(i) },
        2 => Request::AddFlows { flows: text(i) },
        3 => Request::DelFlows {
            spec: opt_text(i),
            strict: i.bool(),
        },
        4 => Request::ModFlows {
            flows: text(i),
            strict: i.bool(),
        },
        5 => Request::ReplaceFlows { flows: text(i) },
        6 => Request::Bundle { mods: text(i) },
        7 => Request::DumpFlows {
            table: i.bool().then(|| {
                i.pick(&[
                    "0",
                    "31",
                    "ConntrackState",
                    "Output",
                    "254",
                    "255",
                    "-1",
                    "x",
                ])
                .to_string()
            }),
            names: i.bool(),
            stats: i.bool(),
        },
        8 => Request::DumpPorts,
        9 => {
            let ct_states = ["trk,new", "+trk+est", "trk,rel,rpl", "inv", "", "trk,bogus"];
            let hex = i.bool();
            Request::Trace(TraceRequest {
                spec: (!hex || i.bool()).then(|| text(i)),
                packet_hex: hex.then(|| oxvs_api::protocol::to_hex(i.short_bytes())),
                in_port: i.bool().then(|| u32::from(i.u8() % 8)),
                ct_next: (0..i.below(3))
                    .map(|_| i.pick(&ct_states).to_string())
                    .collect(),
                names: i.bool(),
                inject: i.bool(),
            })
        }
        10 => Request::DumpConntrack {
            zone: i.bool().then(|| i.u16()),
        },
        11 => Request::FlushConntrack {
            zone: i.bool().then(|| i.u16()),
            proto: i.bool().then(|| i.u8()),
            reply_src: i
                .bool()
                .then(|| std::net::IpAddr::V4(std::net::Ipv4Addr::from(i.u32()))),
            reply_sport: i.bool().then(|| i.u16()),
        },
        12 => Request::Stats,
        13 => Request::PacketIn {
            max: i.below(4),
            wait_ms: 0,
        },
        14 => Request::AddGroups { groups: text(i) },
        15 => Request::ModGroups {
            groups: text(i),
            may_create: i.bool(),
        },
        16 => Request::DelGroups { spec: opt_text(i) },
        18 => Request::ReplaceGroups {
            groups: text(i),
            flows: text(i),
        },
        17 => Request::DumpGroups {
            group_id: i.bool().then(|| u32::from(i.u8() % 4)),
        },
        _ => Request::Version,
    }
}

/// Whether the harness may send `req` (see the module doc).
fn allowed(req: &Request) -> bool {
    match req {
        Request::AddPort(_) => false,
        Request::PacketIn { wait_ms, .. } => *wait_ms == 0,
        _ => true,
    }
}

pub fn run(data: &[u8]) {
    let mut i = Input::new(data);
    let mut lines = Vec::new();
    while !i.is_empty() && lines.len() < 16 {
        if i.bool() {
            let req = built_request(&mut i);
            let line = req.to_line();
            assert_eq!(
                protocol::parse_request(&line).as_ref(),
                Ok(&req),
                "request does not survive the wire: {line}"
            );
            lines.push(line);
        } else if let Ok(s) = std::str::from_utf8(i.long_bytes()) {
            // The server answers each line separately; it never sees '\n'.
            for l in s.split('\n') {
                lines.push(l.trim_end_matches('\r').to_string());
            }
        }
    }
    let guard = switch().lock().unwrap_or_else(|e| e.into_inner());
    let switch = &*guard;
    reset(switch);
    for line in &lines {
        let parsed = protocol::parse_request(line);
        if let Ok(req) = &parsed {
            if !allowed(req) {
                continue;
            }
        }
        let r = control::handle_line(switch, line);
        let wire = r.to_line();
        assert!(!wire.contains('\n'), "a response spans lines");
        let back: Response = serde_json::from_str(&wire).expect("the response is JSON");
        assert_eq!(back, r, "the response does not survive the wire");
        assert_eq!(r.v, oxvs_api::VERSION);
        assert_eq!(r.ok, r.error.is_none());
        if parsed.is_err() {
            assert!(!r.ok, "a refused request line was answered ok: {line}");
        }
        if let Some(e) = &r.error {
            assert!(
                !e.starts_with("internal error"),
                "a control handler panicked on {line}: {e}"
            );
        }
    }
}
