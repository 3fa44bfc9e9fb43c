//! IP fragments through the datapath: `ct` reassembles, NetworkPolicy-style
//! flows decide on the whole datagram's ports, and the original fragments
//! leave with the actions' header rewrites (module doc of
//! `oxvs_pipeline::datapath`, "Fragments").

mod common;

use std::sync::Arc;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

use common::csum16;

/// A policy-like pipeline: everything through `ct`; new UDP only to port
/// 53 (committed), established in both directions; TTL decremented and
/// MACs rewritten on the way out of port 2 (routed), replies from port 2
/// out of port 1.
const FLOWS: &str = "
table=0, priority=10, ip, actions=ct(table=1,zone=7)
table=0, priority=0, actions=drop
table=1, priority=30, ct_state=+inv+trk, actions=drop
table=1, priority=20, ct_state=+new+trk, udp, in_port=1, tp_dst=53, actions=ct(commit,zone=7),goto_table:2
table=1, priority=20, ct_state=+est+trk, ip, actions=goto_table:2
table=1, priority=0, actions=drop
table=2, priority=10, ip, in_port=1, actions=set_field:02:00:00:00:00:aa->eth_src,set_field:02:00:00:00:00:bb->eth_dst,dec_ttl,output:2
table=2, priority=10, in_port=2, actions=output:1
";

fn datapath() -> (Datapath, Conntrack) {
    let flows = parse_flow_file(FLOWS, &ParseContext::default()).unwrap();
    let p = Arc::new(Pipeline::new());
    p.replace_all(&flows, 0).unwrap();
    (
        Datapath::new(p, XlateEnv::default(), DatapathConfig::default()),
        Conntrack::new(CtConfig::default()),
    )
}

/// A UDP datagram from 10.0.0.1:5353 to 10.0.0.2:`dport` (UDP checksum 0:
/// none) as IPv4 fragments of at most `chunk` payload bytes, and the
/// datagram's IP payload.
fn udp_fragments(dport: u16, len: usize, chunk: usize, id: u16) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut l4 = Vec::with_capacity(8 + len);
    l4.extend_from_slice(&5353u16.to_be_bytes());
    l4.extend_from_slice(&dport.to_be_bytes());
    l4.extend_from_slice(&((8 + len) as u16).to_be_bytes());
    l4.extend_from_slice(&[0, 0]);
    l4.extend((0..len).map(|i| (i * 7 + 3) as u8));
    let mut frames = Vec::new();
    let mut off = 0;
    while off < l4.len() {
        let end = (off + chunk).min(l4.len());
        let more = end < l4.len();
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        let total = (20 + end - off) as u16;
        let frag = ((off / 8) as u16) | if more { 0x2000 } else { 0 };
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&id.to_be_bytes());
        ip.extend_from_slice(&frag.to_be_bytes());
        ip.extend_from_slice(&[64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let c = csum16(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&l4[off..end]);
        frames.push(f);
        off = end;
    }
    (frames, l4)
}

fn send(dp: &mut Datapath, ct: &mut Conntrack, frames: &[Vec<u8>], port: u32) -> RecordingSink {
    let mut sink = RecordingSink::default();
    let mut pkts: Vec<_> = frames
        .iter()
        .map(|f| DpPacket::from_frame(f, port))
        .collect();
    dp.process_batch(&mut pkts, ct, 1_000, &mut sink);
    sink
}

#[test]
fn fragments_are_reassembled_for_ct_and_forwarded_as_they_came() {
    let (mut dp, mut ct) = datapath();
    let (mut frames, l4) = udp_fragments(53, 3000, 1480, 0x1234);
    assert_eq!(frames.len(), 3);
    // Out of order: the last fragment first, the first one last.
    frames.reverse();
    let sink = send(&mut dp, &mut ct, &frames, 1);
    assert_eq!(sink.outputs.len(), 3, "every fragment leaves once");
    let mut payload = Vec::new();
    for (port, out, _) in &sink.outputs {
        assert_eq!(*port, 2);
        assert_eq!(&out[..12], &[2, 0, 0, 0, 0, 0xbb, 2, 0, 0, 0, 0, 0xaa]);
        let ip = &out[14..34];
        assert_eq!(ip[8], 63, "dec_ttl applied to each fragment");
        assert_eq!(csum16(ip), 0, "IPv4 header checksum valid");
        assert_eq!(&ip[4..6], &0x1234u16.to_be_bytes(), "identification kept");
        assert_eq!(
            out.len(),
            14 + usize::from(u16::from_be_bytes([ip[2], ip[3]]))
        );
        payload.extend_from_slice(&out[34..]);
    }
    // Offset order, nothing lost or changed.
    assert_eq!(payload, l4);
    let st = dp.stats();
    assert_eq!((st.frags_held, st.reassembled), (2, 1));
    assert_eq!(ct.ipf().held_bytes(), 0);
    assert_eq!(
        ct.stats().committed_total,
        1,
        "one connection for the datagram"
    );

    // A fragmented reply is established (+est), whatever its ports in the
    // later fragments (none): it goes back out of port 1, untouched.
    let (reply, _) = udp_fragments(53, 2000, 1000, 0x99);
    let reply: Vec<Vec<u8>> = reply
        .into_iter()
        .map(|mut f| {
            // Swap addresses and ports: 10.0.0.2:53 -> 10.0.0.1:5353.
            let (a, b) = (f[26..30].to_vec(), f[30..34].to_vec());
            f[26..30].copy_from_slice(&b);
            f[30..34].copy_from_slice(&a);
            if u16::from_be_bytes([f[20], f[21]]) & 0x1fff == 0 {
                f[34..36].copy_from_slice(&53u16.to_be_bytes());
                f[36..38].copy_from_slice(&5353u16.to_be_bytes());
            }
            f
        })
        .collect();
    let sink = send(&mut dp, &mut ct, &reply, 2);
    assert_eq!(sink.outputs.len(), reply.len());
    for ((port, out, _), orig) in sink.outputs.iter().zip(&reply) {
        assert_eq!(*port, 1);
        assert_eq!(out, orig, "a fragment without rewrites leaves as it came");
    }
}

#[test]
fn policy_sees_the_ports_of_later_fragments() {
    let (mut dp, mut ct) = datapath();
    // To port 54: not allowed as new. Every fragment dropped, also the
    // later ones whose own headers carry no port.
    let (frames, _) = udp_fragments(54, 3000, 1480, 7);
    let sink = send(&mut dp, &mut ct, &frames, 1);
    assert!(sink.outputs.is_empty(), "{:?}", sink.outputs.len());
    assert_eq!(ct.stats().committed_total, 0);
    assert_eq!(ct.ipf().held_bytes(), 0);
}

#[test]
fn incomplete_and_overlapping_datagrams_go_nowhere() {
    let (mut dp, mut ct) = datapath();
    let (frames, _) = udp_fragments(53, 3000, 1480, 8);
    // Without its last fragment: held, nothing out.
    let sink = send(&mut dp, &mut ct, &frames[..2], 1);
    assert!(sink.outputs.is_empty());
    assert_eq!(dp.stats().frags_held, 2);
    assert!(ct.ipf().held_bytes() > 0);
    // An overlapping fragment: the whole datagram is dropped.
    let mut overlap = frames[1].clone();
    let fo = u16::from_be_bytes([overlap[20], overlap[21]]);
    overlap[20..22].copy_from_slice(&(fo - 8).to_be_bytes());
    overlap[24..26].fill(0);
    let c = csum16(&overlap[14..34]);
    overlap[24..26].copy_from_slice(&c.to_be_bytes());
    let sink = send(&mut dp, &mut ct, &[overlap, frames[2].clone()], 1);
    assert!(sink.outputs.is_empty(), "{:?}", sink.outputs.len());
    assert!(dp.stats().frag_drops >= 1);
}
