//! Writes the hand-made seed inputs of the fuzz targets into
//! `fuzz/corpus/<target>/seed-*` (run from anywhere:
//! `cargo run -p oxvs-fuzz-harness --example seeds`). Each seed is built in
//! the byte layout its harness reads (see the harness modules); the
//! fuzzer grows the corpus from them.

use std::path::Path;

use oxvs_api::agent::{AgentRequest, Proto, TraceflowRequest};
use oxvs_api::protocol::{Request, TraceRequest};

fn write(target: &str, seeds: &[Vec<u8>]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../corpus")
        .join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus directory");
    for (k, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{k:02}")), s).expect("write a seed");
    }
    println!("{target}: {} seeds", seeds.len());
}

/// Conntrack ops (layout of `conntrack::run`).
mod ct {
    /// TCP op: `op` 0, direction bytes, then `tcp_packet` and `direct`.
    /// `first`: the harness has not seen this direction yet (it reads the
    /// initial sequence numbers).
    pub fn tcp(out: &mut Vec<u8>, reply: bool, flags_sel: u8, new_dirs: u8, commit: bool) {
        out.push(0); // op: TCP, direct
                     // a: v4, src idx, dst idx; b: sport idx 0 / dport idx 1 (or swapped).
        if reply {
            out.extend_from_slice(&[0b0000_0010, 0b0000_0001]);
        } else {
            out.extend_from_slice(&[0b0000_1000, 0b0000_0100]);
        }
        out.push(flags_sel << 2); // mode: tracked seq/ack, flag choice
        for _ in 0..new_dirs {
            out.extend_from_slice(&[0x10, 0x00, 0x00, 0x00]);
        }
        out.push(0); // window 65535
        out.push(0); // data length 0
        out.push(u8::from(commit)); // ct params
    }

    pub fn udp(out: &mut Vec<u8>, reply: bool, commit: bool) {
        out.push(3);
        if reply {
            out.extend_from_slice(&[0b0000_0010, 0b0000_1010]);
        } else {
            out.extend_from_slice(&[0b0000_1000, 0b0000_1010]);
        }
        out.push(10);
        out.push(u8::from(commit));
    }

    pub fn wait(out: &mut Vec<u8>, sel: u8, expire: u8) {
        out.extend_from_slice(&[6, sel, expire]);
    }
}

fn conntrack() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    // Handshake, data, FIN both ways, expiry.
    let mut s = vec![0x03];
    ct::tcp(&mut s, false, 0, 2, true); // SYN
    ct::tcp(&mut s, true, 1, 0, true); // SYN-ACK
    ct::tcp(&mut s, false, 2, 0, true); // ACK
    ct::tcp(&mut s, false, 4, 0, true); // PSH-ACK
    ct::tcp(&mut s, false, 5, 0, true); // FIN
    ct::tcp(&mut s, true, 2, 0, true); // ACK
    ct::tcp(&mut s, true, 5, 0, true); // FIN
    ct::tcp(&mut s, false, 2, 0, true); // ACK
    ct::wait(&mut s, 2, 1);
    seeds.push(s);
    // The same, loose pickup, mid-stream.
    let mut s = vec![0x13];
    ct::tcp(&mut s, false, 4, 2, true);
    ct::tcp(&mut s, true, 2, 0, true);
    ct::wait(&mut s, 4, 1);
    ct::tcp(&mut s, false, 4, 0, true);
    seeds.push(s);
    // UDP both ways, a full table (max 1), time steps.
    let mut s = vec![0x00];
    ct::udp(&mut s, false, true);
    ct::udp(&mut s, true, true);
    ct::wait(&mut s, 2, 2);
    ct::udp(&mut s, false, false);
    seeds.push(s);
    // Through the datapath, fragmented (op 0xc0: TCP, datapath, chunks).
    let mut s = vec![
        0x07,
        0xc0,
        0b0000_1000,
        0b0000_0100,
        0x40,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        2,
        0,
        200,
        2,
        1,
    ];
    s.extend_from_slice(&[0xc3, 0b0000_1000, 0b0000_1010, 200, 3, 0]);
    seeds.push(s);
    // ICMP echo, then an error quoting the connection.
    let mut s = vec![0x03, 5, 0b0000_1000, 0, 0, 1, 7, 1];
    s.extend_from_slice(&[5, 0b0000_0010, 0, 1, 1, 7, 1]);
    s.extend_from_slice(&[5, 0b0000_0010, 0, 2, 0, 0, 0, 0, 0]);
    seeds.push(s);
    // A state file (mode 0xff): an empty table, then junk.
    let mut ct = oxvs_pipeline::conntrack::Conntrack::new(Default::default());
    let mut state = vec![0xff];
    state.extend_from_slice(&ct.save_state(1, 2));
    seeds.push(state);
    let _ = &mut ct;
    seeds
}

fn vxlan_rx() -> Vec<Vec<u8>> {
    vec![
        // One valid datagram with a plausible inner frame.
        vec![0x03, 0, 0, 0, 42, 0x12, 0x34, 4, 1, 2, 3, 4],
        // A valid header, raw inner bytes, then a raw datagram.
        vec![
            0x01, 0, 0, 0, 7, 0, 14, 0x0a, 0x58, 0x0a, 0xf4, 0, 4, 0x0a, 0x58, 0x0a, 0xf4, 1, 7,
            0x08, 0x06, 0x00, 0, 4, 8, 0, 0, 0,
        ],
        // A damaged header.
        vec![0x07, 0, 0, 0, 42, 0, 1, 3, 0x80],
        // The same three through the IPv6 port (bit 7 of the first byte).
        vec![0x83, 0, 0, 0, 42, 0x12, 0x34, 4, 1, 2, 3, 4],
        vec![
            0x81, 0, 0, 0, 7, 0, 14, 0x0a, 0x58, 0x0a, 0xf4, 0, 4, 0x0a, 0x58, 0x0a, 0xf4, 1, 7,
            0x08, 0x06, 0x00, 0, 4, 8, 0, 0, 0,
        ],
        vec![0x87, 0, 0, 0, 42, 0, 1, 3, 0x80],
    ]
}

fn vxlan_tx() -> Vec<Vec<u8>> {
    // mtu sel, tun_id bool, src u32, dst sel, inner kind, len sel, ...
    let v4 = |mtu: u8, df: bool, len_sel: u8, len: u8| {
        vec![
            mtu,
            0,
            0,
            0,
            0,
            0,
            1,
            u8::from(!df),
            len_sel,
            len,
            0,
            0,
            0,
            0,
            0x12,
            0x34,
            0,
        ]
    };
    vec![
        v4(0, true, 1, 150),                        // 1500, DF, ~1550 bytes: too big
        v4(0, false, 1, 150),                       // 1500, no DF: fragments
        v4(1, false, 2, 255),                       // 576, fragments
        v4(0, true, 0, 40),                         // fits
        vec![0, 0, 0, 0, 0, 0, 1, 2, 1, 100, 0, 0], // IPv6, too big
        vec![2, 0, 0, 0, 0, 0, 1, 3, 0, 60],        // ARP
        vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 40],        // no tun_dst
        vec![0, 0, 0, 0, 0, 0, 1, 0x20, 1, 150, 0, 0, 0, 0, 0, 0, 0, 1, 7], // VLAN, DF
        // Destination selector 0xfe: the IPv6 port, to tun_ipv6_dst.
        vec![0, 0, 0, 0, 0, 0, 0xfe, 0, 0, 40], // IPv4 DF, fits
        vec![0, 0, 0, 0, 0, 0, 0xfe, 0, 1, 150], // IPv4 DF, too big (- 70)
        vec![0, 0, 0, 0, 0, 0, 0xfe, 1, 1, 150], // no DF: too big too, never fragmented
        vec![0, 0, 0, 0, 0, 0, 0xfe, 2, 1, 100, 0, 0], // IPv6, too big
        vec![2, 0, 0, 0, 0, 0, 0xfe, 0, 3, 0x20, 0, 0], // 9000, 8 KiB TCP, fits
        vec![0, 0, 0, 0, 0, 0, 0xfd, 0, 0, 40], // IPv6 destination, IPv4 port
    ]
}

fn line(l: &str) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&(l.len() as u16).to_be_bytes());
    v.extend_from_slice(l.as_bytes());
    v
}

fn control() -> Vec<Vec<u8>> {
    let reqs = [
        Request::Show,
        Request::AddFlows {
            flows: "table=0,priority=10,ip,actions=drop\n".into(),
        },
        Request::DumpFlows {
            table: Some("ConntrackState".into()),
            names: true,
            stats: true,
        },
        Request::Bundle {
            mods: "add table=0,priority=1 actions=drop\ndelete table=70\n".into(),
        },
        Request::Trace(TraceRequest {
            spec: Some("in_port=3,tcp,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.3,nw_dst=10.244.0.4,tp_dst=80,tcp_flags=+syn".into()),
            ct_next: vec!["trk,new".into()],
            names: true,
            ..TraceRequest::default()
        }),
        Request::DelFlows {
            spec: Some("table=90".into()),
            strict: false,
        },
        Request::ModFlows {
            flows: "table=90,priority=200,reg1=0x4 actions=output:3".into(),
            strict: true,
        },
        Request::DumpConntrack { zone: None },
        Request::Stats,
        Request::Version,
    ];
    let mut seeds: Vec<Vec<u8>> = reqs.iter().map(|r| line(&r.to_line())).collect();
    seeds.push(line(r#"{"v":1,"op":"trace","packet_hex":"0a580af400040a580af40003080045000028000100004006000000000a","in_port":3}"#));
    seeds.push(line(r#"{"v":2,"op":"show"}"#));
    seeds.push(line("{\"v\":1,\"op\":\"show\"}\r\n{\"v\":1}\nnot json"));
    // Built requests: add-flows then dump.
    seeds.push(vec![1, 2, 3, 0, 1, 1, 1, 7, 1, 0, 1]);
    seeds
}

fn agent_api() -> Vec<Vec<u8>> {
    let tf = |src: &str, dst: &str, proto: Proto, dport: Option<u16>| {
        AgentRequest::Traceflow(TraceflowRequest {
            src: src.into(),
            dst: dst.into(),
            proto,
            sport: None,
            dport,
            inject: false,
            from_tunnel: None,
            ipv6: false,
        })
    };
    let reqs = [
        AgentRequest::Info,
        AgentRequest::Pod {
            namespace: "x".into(),
            name: "r".into(),
        },
        tf("x/a", "x/b", Proto::Tcp, Some(80)),
        tf("x/b", "x/a", Proto::Udp, Some(53)),
        tf("x/a", "x/r", Proto::Icmp, None),
        tf("x/a", "8.8.8.8", Proto::Tcp, Some(443)),
    ];
    let mut seeds: Vec<Vec<u8>> = reqs.iter().map(|r| line(&r.to_line())).collect();
    seeds.push(line(r#"{"v":1,"op":"traceflow","src":"x/r","dst":"x/b","proto":"tcp","dport":80,"from_tunnel":{"from_node":"n2","tun_src":"192.168.77.12","tun_dst":"192.168.77.11","src_mac":"0a:58:0a:f4:01:07","dst_mac":"aa:bb:cc:dd:ee:ff","src_ip":"10.244.1.7","dst_ip":"10.244.0.4","ttl":63}}"#));
    let mut trace = vec![0xff];
    // The switch's answer: a structured trace (a tunnel output, then a
    // pass whose drop names a step that is not there).
    trace.extend_from_slice(
        br#"{"text":"Flow: in_port=3,tcp","injected":false,"trace":{"passes":[{"flow":"in_port=3,tcp","steps":[{"table":0,"table_name":"Classifier","flow":{"cookie":562949953421315,"priority":190,"match":"in_port=3","actions":"load:0x3->NXM_NX_REG0[0..3],goto_table:IngressRule"},"actions":[{"action":"load:0x3->NXM_NX_REG0[0..3]"},{"action":"goto_table:IngressRule","lookup":1}]},{"table":70,"table_name":"IngressRule","parent":0,"flow":{"cookie":1125899906842631,"priority":200,"match":"tcp,reg1=0x4,nw_src=10.244.0.3,tp_dst=80","actions":"output:9"},"actions":[{"action":"output:9"}]}],"final_flow":"in_port=3,tcp","megaflow":"recirc_id=0,tcp","datapath_actions":"set(tunnel(tun_id=0x0,dst=192.168.77.12)),9","verdict":{"outputs":[{"port":9,"packet":"in_port=3,tcp","headers":{"dl_src":"0a:58:0a:f4:00:01","dl_dst":"aa:bb:cc:dd:ee:ff","dl_type":2048,"nw_src":"10.244.0.3","nw_dst":"10.244.1.7","nw_proto":6,"nw_ttl":63,"tp_src":49152,"tp_dst":80},"tunnel":{"tun_id":0,"dst":"192.168.77.12"}}]}},{"flow":"recirc_id=0x15,in_port=3,tcp","steps":[],"final_flow":"","megaflow":"","datapath_actions":"drop","verdict":{"drop":{"reason":"no-match","step":7,"detail":"no flow matched"}}}],"unprocessed":0}}"#,
    );
    seeds.push(trace);
    seeds
}

fn cni() -> Vec<Vec<u8>> {
    // env: 6 vars (sel byte each, dictionary index), stdin_is_terminal, stdin sel, config...
    let env = |cmd: u8| vec![3, cmd, 3, 0, 3, 0, 3, 0, 3, 0, 3, 0];
    let mut seeds = Vec::new();
    for cmd in 0..6u8 {
        let mut s = env(cmd);
        // not a terminal; built config (1.1.0, "oxvs", type oxvs, prevResult for ADD)
        s.extend_from_slice(&[0, 0, 0, 0, 0, u8::from(cmd == 0), 0, 0, 1, 0, 0, 0]);
        s.extend_from_slice(&[255, 255, 255, 5, 1, 0, 0, 0]); // answer: a result
        seeds.push(s);
    }
    // ADD with an agent error; DEL with netns gone.
    let mut s = env(0);
    s.extend_from_slice(&[0, 0, 0, 0, 0, 0, 255, 255, 255, 2, 0, 3, b'b', b'a', b'd']);
    seeds.push(s);
    let mut s = vec![3, 1, 3, 0, 3, 2, 3, 0, 0, 3, 0];
    s.extend_from_slice(&[0, 0, 0, 0, 0, 0, 255, 255, 255, 1]);
    seeds.push(s);
    // Raw stdin.
    let mut s = env(0);
    s.extend_from_slice(&[0, 255, 0, 2, b'{', b'}']);
    seeds.push(s);
    seeds
}

fn metrics_http() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = [
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        "HEAD /metrics HTTP/1.0\r\n\r\n",
        "GET /metrics?x=1 HTTP/1.1\n\n",
        "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/2.0\r\n\r\n",
        "get /metrics HTTP/1.1\r\n\r\n",
        "GET  /metrics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let mut long = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
    long.extend(std::iter::repeat_n(b'a', 9000));
    long.extend_from_slice(b"\r\n\r\n");
    seeds.push(long);
    let mut pure = vec![0xff];
    pure.extend_from_slice(
        b"# HELP x_total A counter.\n# TYPE x_total counter\nx_total{a=\"b\"} 1\n\n",
    );
    seeds.push(pure);
    seeds
}

fn ipblock() -> Vec<Vec<u8>> {
    vec![
        // 10.0.0.0/8 minus 10.1.0.0/16.
        vec![10, 0, 0, 0, 8, 0, 10, 1, 0, 0, 16],
        // 0.0.0.0/0 minus 0.0.0.0/1 and 255.255.255.255/32.
        vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 255, 255, 255, 255, 32],
        // 10.0.0.0/8 minus 50 000 /32s every 256 addresses.
        vec![
            10, 0, 0, 0, 8, 1, 10, 0, 0, 1, 24, 1, 0xc3, 0x50, 0, 80, 0, 90,
        ],
        // Ports 1..=65535, an exception outside the block.
        vec![192, 168, 0, 0, 16, 0, 10, 0, 0, 0, 8, 0, 0, 1, 0xff, 0xff],
    ]
}

fn main() {
    write("conntrack", &conntrack());
    write("vxlan_rx", &vxlan_rx());
    write("vxlan_tx", &vxlan_tx());
    write("control", &control());
    write("agent_api", &agent_api());
    write("cni", &cni());
    write("metrics_http", &metrics_http());
    write("ipblock", &ipblock());
}
