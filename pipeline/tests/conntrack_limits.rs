//! Conntrack hardening through the whole Antrea-like example pipeline
//! (`examples/antrea-like.flows`, ports in `common`): one pod must not be
//! able to starve the node's connection table.
//!
//! - per-port limits: a pod's commits beyond its limit are refused and the
//!   packets dropped, counted per port;
//! - early drop: a commit into a full table drops an unreplied connection
//!   instead of failing, never one that has seen a reply;
//! - staged commits: a packet the pipeline drops after ConntrackCommit
//!   leaves nothing in the table;
//! - the background sweep, persistence with owners, dumps and flushes in
//!   slices.

mod common;

use common::{seg, tcp, udp, udp_to_mac, Node, ACK, SYN};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig, CtParams, CtRefusal};
use oxvs_pipeline::key::FlowKey;

const CLIENT: u32 = 3;
const WEB: u32 = 4;
const DB: u32 = 5;

fn node(max_entries: usize, port_limit: u32) -> Node {
    Node::with(CtConfig {
        max_entries,
        port_limit,
        ..CtConfig::default()
    })
}

/// client-1 sends `flows` new UDP flows to db-1 (nothing isolates db-1
/// for ingress), 32 per batch, from source ports `first_sport` on;
/// returns how many were forwarded.
fn flood(n: &mut Node, flows: u16, first_sport: u16) -> usize {
    let mut forwarded = 0;
    let mut sport = first_sport;
    let mut left = flows;
    while left > 0 {
        let k = left.min(32);
        let frames: Vec<_> = (0..k)
            .map(|i| (udp(3, sport + i, 5, 9000), CLIENT))
            .collect();
        forwarded += n.send_batch(&frames).len();
        sport += k;
        left -= k;
    }
    forwarded
}

/// web-1 opens a TCP connection to db-1 from `sport` and sends data on
/// it; panics naming the step that failed.
fn web_connects(n: &mut Node, sport: u16) {
    let isn_a = 1_000u32;
    let isn_b = 9_000u32;
    assert_eq!(
        n.send(&tcp(4, sport, 5, 5432, SYN, isn_a, 0, 0), WEB),
        [DB],
        "web-1's SYN (port {sport}) did not get through"
    );
    assert_eq!(
        n.send(&tcp(5, 5432, 4, sport, SYN | ACK, isn_b, isn_a + 1, 0), DB),
        [WEB],
        "db-1's SYN-ACK (port {sport}) did not get back: the connection was not committed"
    );
    assert_eq!(
        n.send(&seg(4, sport, 5, 5432, isn_a + 1, isn_b + 1, 100), WEB),
        [DB],
        "web-1's data (port {sport})"
    );
}

#[test]
fn a_pod_over_its_limit_is_refused_and_others_still_connect() {
    let mut n = node(10_000, 100);
    let forwarded = flood(&mut n, 1_000, 20_000);
    // Its first 100 flows got through; the other 900 were refused at the
    // commit and dropped.
    assert_eq!(forwarded, 100);
    let c = n.ct.port_limit(CLIENT);
    assert_eq!((c.count, c.limit, c.refused), (100, 100, 900));
    let s = n.ct.stats();
    assert_eq!((s.entries, s.limit_refused_total), (100, 900));
    assert_eq!(n.dp.stats().ct_refused_drops, 900);
    // web-1 is not client-1: it connects as usual.
    for i in 0..20 {
        web_connects(&mut n, 40_000 + i);
    }
    assert_eq!(n.ct.port_limit(WEB).count, 20);
    // Replies of client-1's admitted flows are not new connections: they
    // are forwarded, and count against nobody.
    assert_eq!(n.send(&udp(5, 9000, 3, 20_000), DB), [CLIENT]);
    assert_eq!(n.ct.port_limit(DB).count, 0);
}

#[test]
fn limits_change_at_run_time() {
    let mut n = node(10_000, 100);
    assert_eq!(flood(&mut n, 150, 20_000), 100);
    // Raised for client-1 only: 50 more get in.
    n.ct.set_port_limit(CLIENT, Some(150));
    assert_eq!(flood(&mut n, 100, 30_000), 50);
    let c = n.ct.port_limit(CLIENT);
    assert_eq!((c.count, c.limit, c.explicit), (150, 150, true));
    // 0: no limit.
    n.ct.set_port_limit(CLIENT, Some(0));
    assert_eq!(flood(&mut n, 100, 40_000), 100);
    // Back to the default, lowered meanwhile: over it, so refused, but
    // nothing already in the table is removed.
    n.ct.set_default_port_limit(10);
    n.ct.set_port_limit(CLIENT, None);
    assert_eq!(flood(&mut n, 10, 50_000), 0);
    let c = n.ct.port_limit(CLIENT);
    assert_eq!((c.count, c.limit, c.explicit), (250, 10, false));
    // Other ports have the default too.
    assert_eq!(n.ct.port_limit(WEB).limit, 10);
}

#[test]
fn expired_connections_stop_counting() {
    let mut n = node(10_000, 100);
    assert_eq!(flood(&mut n, 100, 20_000), 100);
    assert_eq!(flood(&mut n, 1, 30_000), 0);
    // UDP's first timeout is 60 s: after it, client-1 may open new ones
    // (the refused commit sweeps some slots, the batches sweep the rest).
    n.now += 61 * 1_000_000_000;
    assert_eq!(flood(&mut n, 100, 30_000), 100);
    assert_eq!(n.ct.port_limit(CLIENT).count, 100);
}

#[test]
fn a_full_table_drops_unreplied_connections_early() {
    // No per-port limit: only early drop protects the table.
    let mut n = node(256, 0);
    // web-1's first connection, established before the flood.
    web_connects(&mut n, 40_000);
    assert_eq!(flood(&mut n, 1_000, 20_000), 1_000);
    // Full or nearly (the batches' sweep drops unreplied connections
    // above 95 %).
    assert!(n.ct.len() <= 256 && n.ct.len() > 200, "{}", n.ct.len());
    let s = n.ct.stats();
    assert!(s.early_drop_total >= 1_000 - 255, "{s:?}");
    assert_eq!(s.table_full_total, 0);
    // The flood did not evict web-1's established connection ...
    assert_eq!(
        n.send(&seg(4, 40_000, 5, 5432, 1_101, 9_001, 100), WEB),
        [DB]
    );
    assert_eq!(n.send(&seg(5, 5432, 4, 40_000, 9_001, 1_201, 0), DB), [WEB]);
    // ... and web-1 still opens new ones: each evicts an unreplied flow.
    for i in 1..20 {
        web_connects(&mut n, 40_000 + i);
    }
    assert_eq!(n.ct.port_limit(WEB).count, 20);
}

#[test]
fn a_table_full_of_assured_connections_refuses_and_drops() {
    let mut n = node(16, 0);
    for i in 0..16 {
        web_connects(&mut n, 40_000 + i);
    }
    assert_eq!(n.ct.len(), 16);
    // Nothing to drop early: the commit is refused and the packet dropped.
    assert_eq!(n.send(&tcp(4, 41_000, 5, 5432, SYN, 1, 0, 0), WEB), []);
    let s = n.ct.stats();
    assert_eq!((s.table_full_total, s.early_drop_total), (1, 0));
    assert_eq!(n.dp.stats().ct_refused_drops, 1);
}

#[test]
fn a_packet_dropped_after_the_commit_table_commits_nothing() {
    let mut n = node(10_000, 100);
    // client-1 -> db-1's address but a MAC no port has: ConntrackCommit
    // commits it, then Output drops it (no output port).
    let nobody = [0x02, 0, 0, 0, 0, 0x99];
    for i in 0..50 {
        assert_eq!(
            n.send(&udp_to_mac(3, 20_000 + i, 5, 53, nobody), CLIENT),
            []
        );
    }
    assert_eq!(n.ct.len(), 0, "a dropped packet left its connection behind");
    let s = n.ct.stats();
    assert_eq!((s.commits_discarded_total, s.committed_total), (50, 0));
    assert_eq!(n.ct.port_limit(CLIENT).count, 0);
    // The same flows sent properly are committed.
    for i in 0..50 {
        assert_eq!(n.send(&udp(3, 20_000 + i, 5, 53), CLIENT), [DB]);
    }
    assert_eq!(n.ct.len(), 50);
}

#[test]
fn in_one_batch_a_commit_is_visible_to_the_next_packet() {
    let mut n = node(10_000, 100);
    // Request and reply in the same batch: the reply finds the
    // connection the request committed (+est), so it is not new.
    let out = n.send_batch(&[
        (udp(3, 20_000, 5, 53), CLIENT),
        (udp(5, 53, 3, 20_000), DB),
        (udp(3, 20_000, 5, 53), CLIENT),
    ]);
    assert_eq!(out, [DB, CLIENT, DB]);
    assert_eq!(n.ct.len(), 1);
    assert_eq!(n.ct.port_limit(DB).count, 0);
    let e = n.ct.entries()[0];
    assert_eq!(e.owner, Some(CLIENT));
}

#[test]
fn the_sweep_reclaims_unreplied_connections_above_95_percent() {
    let mut n = node(100, 0);
    web_connects(&mut n, 40_000);
    // 96 unreplied flows committed straight into the tracker (the
    // datapath would have swept while they came).
    let p = commit();
    for sport in 20_000..20_096 {
        let (key, frame) = udp_key(sport);
        assert!(n.ct.execute_staged(&frame, &key, &p, n.now).is_ok());
        n.ct.commit_staged(n.now);
    }
    assert_eq!(n.ct.len(), 97);
    // Above 95 %: a sweep drops every unreplied connection it passes.
    let removed = n.ct.sweep(n.now, 1_000);
    assert_eq!(removed, 96);
    assert_eq!(n.ct.stats().early_drop_total, 96);
    // Below: only expired ones, and the established connection stays.
    assert_eq!(flood(&mut n, 50, 30_000), 50);
    assert_eq!(n.ct.sweep(n.now, 1_000), 0);
    assert_eq!(n.ct.len(), 51);
    assert_eq!(
        n.send(&seg(4, 40_000, 5, 5432, 1_101, 9_001, 100), WEB),
        [DB]
    );
}

fn commit() -> CtParams {
    CtParams {
        zone: 65520,
        commit: true,
        ..Default::default()
    }
}

#[test]
fn a_deleted_port_stops_owning_its_connections() {
    let mut n = node(10_000, 100);
    n.ct.set_port_limit(CLIENT, Some(300));
    assert_eq!(flood(&mut n, 200, 20_000), 200);
    let mut at = Some(0);
    let mut slices = 0;
    while let Some(start) = at {
        at = n.ct.disown_port_slice(CLIENT, start, 16);
        slices += 1;
    }
    assert!(slices > 1);
    // Forgotten: count, own limit; the connections stay (nobody's).
    let c = n.ct.port_limit(CLIENT);
    assert_eq!((c.count, c.limit, c.explicit), (0, 100, false));
    assert_eq!(n.ct.len(), 200);
    assert!(n.ct.entries().iter().all(|e| e.owner.is_none()));
    // A new pod on the same port number starts afresh.
    assert_eq!(flood(&mut n, 100, 30_000), 100);
}

#[test]
fn owners_and_limits_survive_a_save_and_restore() {
    let mut n = node(10_000, 100);
    assert_eq!(flood(&mut n, 80, 20_000), 80);
    web_connects(&mut n, 40_000);
    let image = n.ct.save_state(n.now, 0);
    // Restored into a switch whose limit is lower than what client-1
    // owns: nothing is refused or dropped by the restore ...
    let mut ct = Conntrack::new(CtConfig {
        max_entries: 10_000,
        port_limit: 50,
        ..CtConfig::default()
    });
    let r = ct.restore_state(&image, 7, 0).expect("restore");
    assert_eq!(r.restored, 81);
    assert_eq!(ct.port_limit(CLIENT).count, 80);
    assert_eq!(ct.port_limit(WEB).count, 1);
    // ... but client-1's new connections are refused until it is below.
    let (key, frame) = udp_key(20_500);
    let p = commit();
    assert_eq!(
        ct.execute_staged(&frame, &key, &p, 8),
        Err(CtRefusal::PortLimit)
    );
    assert_eq!(ct.port_limit(CLIENT).refused, 1);
}

#[test]
fn older_state_files_restore() {
    let mut n = node(10_000, 100);
    assert_eq!(flood(&mut n, 3, 20_000), 3);
    let v3 = n.ct.save_state(n.now, 0);
    // The same table as versions 1 (100-byte records, no owner) and 2
    // (104 bytes, no NAT) wrote it.
    for (version, len) in [(1u16, 100usize), (2, 104)] {
        let mut old = v3[..32].to_vec();
        old[8..10].copy_from_slice(&version.to_le_bytes());
        old[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        for rec in v3[32..v3.len() - 8].chunks(144) {
            old.extend_from_slice(&rec[..len]);
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in &old {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        old.extend_from_slice(&h.to_le_bytes());
        let mut ct = Conntrack::new(CtConfig::default());
        assert_eq!(ct.restore_state(&old, 0, 0).expect("old").restored, 3);
        if version == 1 {
            assert!(ct.entries().iter().all(|e| e.owner.is_none()));
            assert_eq!(ct.port_limit(CLIENT).count, 0);
        } else {
            assert_eq!(ct.port_limit(CLIENT).count, 3);
        }
    }
}

/// A client-1 -> db-1 UDP datagram's key and frame, as the datapath would
/// give them to conntrack.
fn udp_key(sport: u16) -> (FlowKey, Vec<u8>) {
    let frame = udp(3, sport, 5, 9000);
    let key = oxvs_pipeline::extract::extract(&frame, CLIENT);
    (key, frame)
}

#[test]
fn dumps_and_flushes_in_slices() {
    let mut n = node(10_000, 0);
    assert_eq!(flood(&mut n, 1_000, 20_000), 1_000);
    // A dump in slices of 64, the table changing between slices: each
    // connection that lives through the dump is reported exactly once.
    let mut out = Vec::new();
    let mut at = Some(0);
    let mut round = 0u16;
    while let Some(start) = at {
        at = n.ct.entries_slice(None, start, 64, &mut out);
        // Forwarding goes on between slices: new flows, removed ones.
        flood(&mut n, 2, 40_000 + round * 2);
        round += 1;
    }
    assert!(round >= 1_000 / 64);
    let mut ports: Vec<u16> = out
        .iter()
        .filter_map(|e| match e.orig.l4 {
            oxvs_pipeline::conntrack::CtL4::Ports { src, .. } if src < 40_000 => Some(src),
            _ => None,
        })
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, (20_000..21_000).collect::<Vec<_>>());
    // Zone filter.
    let mut none = Vec::new();
    let mut at = Some(0);
    while let Some(start) = at {
        at = n.ct.entries_slice(Some(7), start, 64, &mut none);
    }
    assert!(none.is_empty());
    // A flush in slices removes everything that existed when it started.
    let before = n.ct.len();
    let (mut removed, mut at) = (0, Some(0));
    while let Some(start) = at {
        let (k, next) = n.ct.flush_slice(None, start, 100);
        removed += k;
        at = next;
    }
    assert_eq!(removed, before);
    assert!(n.ct.is_empty());
    assert_eq!(n.ct.port_limit(CLIENT).count, 0);
}
