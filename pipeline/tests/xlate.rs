//! Slow-path translation on small hand-written pipelines.

use oxvs_pipeline::datapath::TunnelMeta;
use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::{
    port, Action, ControllerAction, CtAction, CtZoneSrc, Flow, Match, PacketInReason, SubField,
};
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::odp::{recirc_id_for_table, DpAction, TunnelFields};
use oxvs_pipeline::xlate::{
    translate_with, LinearTables, Translation, XlateEnv, XlateError, MAX_DEPTH, MAX_LOOKUPS,
};
use std::net::Ipv6Addr;

fn flow(table: u8, priority: u16, m: &[(Field, u128)], actions: Vec<Action>) -> Flow {
    let mut matches = Match::CATCHALL;
    for (f, v) in m {
        matches.set_exact(*f, *v);
    }
    Flow {
        table,
        priority,
        matches,
        actions,
        ..Flow::default()
    }
}

fn tcp_key(in_port: u32) -> FlowKey {
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, in_port as u128);
    k.set(Field::DlType, 0x0800);
    k.set(Field::DlSrc, 0x0000_0000_0a01);
    k.set(Field::DlDst, 0x0000_0000_0a02);
    k.set(Field::NwSrc, 0x0a00_0001);
    k.set(Field::NwDst, 0x0a00_0002);
    k.set(Field::NwProto, 6);
    k.set(Field::NwTtl, 64);
    k.set(Field::TpSrc, 12345);
    k.set(Field::TpDst, 80);
    k
}

fn arp_key(in_port: u32) -> FlowKey {
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, in_port as u128);
    k.set(Field::DlType, 0x0806);
    k.set(Field::NwProto, 1);
    k
}

fn env() -> XlateEnv {
    XlateEnv::with_ports(vec![1, 2, 3, port::LOCAL])
}

fn run(flows: Vec<Flow>, key: &FlowKey) -> Translation {
    translate_with(&LinearTables::from_flows(flows), key, &env())
}

fn sub(field: Field, ofs: u8, n_bits: u8) -> SubField {
    SubField { field, ofs, n_bits }
}

fn wc_has(t: &Translation, f: Field, mask: u128) -> bool {
    t.wildcards.get(f) & mask == mask
}

#[test]
fn miss_drops_and_unwildcards_the_basics() {
    let t = run(vec![], &tcp_key(1));
    assert!(t.actions.is_empty());
    assert!(t.rules.is_empty());
    assert!(t.error.is_none());
    for f in [Field::RecircId, Field::InPort, Field::DlType] {
        assert!(wc_has(&t, f, f.full_mask()), "{f:?}");
    }
    assert_eq!(t.wildcards.get(Field::NwFrag), 0x3);
    assert_eq!(t.wildcards.get(Field::NwDst), 0);
    // nw_frag only for IP.
    let t = run(vec![], &arp_key(1));
    assert_eq!(t.wildcards.get(Field::NwFrag), 0);
}

#[test]
fn outputs_skip_in_port_and_expand_reserved_ports() {
    let f = flow(
        0,
        10,
        &[],
        vec![
            Action::Output(2),
            Action::Output(1), // in_port: skipped
            Action::Output(port::IN_PORT),
            Action::Output(port::LOCAL),
            Action::Output(port::ALL),
            Action::Output(port::NORMAL), // unsupported: skipped
        ],
    );
    let t = run(vec![f], &tcp_key(1));
    use DpAction::Output as O;
    assert_eq!(
        t.actions,
        vec![O(2), O(1), O(port::LOCAL), O(2), O(3), O(port::LOCAL)]
    );
    assert_eq!(t.rules.len(), 1);
}

#[test]
fn flood_excludes_in_port() {
    let f = flow(0, 10, &[], vec![Action::Output(port::FLOOD)]);
    let t = run(vec![f], &tcp_key(3));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Output(1),
            DpAction::Output(2),
            DpAction::Output(port::LOCAL)
        ]
    );
}

#[test]
fn priority_and_miss_in_later_table() {
    let flows = vec![
        flow(0, 100, &[(Field::InPort, 1)], vec![Action::GotoTable(10)]),
        flow(0, 0, &[], vec![Action::Output(3)]),
        flow(
            10,
            10,
            &[(Field::NwDst, 0x0a00_0099)],
            vec![Action::Output(2)],
        ),
    ];
    // in_port=1: goto 10, which misses: drop.
    let t = run(flows.clone(), &tcp_key(1));
    assert!(t.actions.is_empty());
    assert_eq!(t.rules.len(), 1);
    assert!(wc_has(&t, Field::NwDst, 0xffff_ffff));
    // in_port=2: low-priority catch-all.
    let t = run(flows, &tcp_key(2));
    assert_eq!(t.actions, vec![DpAction::Output(3)]);
}

#[test]
fn goto_runs_after_the_rest_of_the_actions() {
    let flows = vec![
        flow(0, 1, &[], vec![Action::GotoTable(5), Action::Output(2)]),
        flow(5, 1, &[], vec![Action::Output(3)]),
    ];
    let t = run(flows, &tcp_key(1));
    assert_eq!(t.actions, vec![DpAction::Output(2), DpAction::Output(3)]);
    assert_eq!(t.rules.len(), 2);
    assert_eq!(t.rules[0].flow.table, 0);
    assert_eq!(t.rules[1].flow.table, 5);
}

#[test]
fn resubmit_nests_and_returns() {
    let flows = vec![
        flow(
            0,
            1,
            &[],
            vec![
                Action::Resubmit {
                    in_port: None,
                    table: Some(5),
                },
                Action::Output(3),
            ],
        ),
        flow(
            5,
            1,
            &[],
            vec![
                Action::Output(2),
                Action::Resubmit {
                    in_port: None,
                    table: Some(6),
                },
            ],
        ),
        flow(6, 1, &[], vec![Action::Output(port::LOCAL)]),
    ];
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Output(2),
            DpAction::Output(port::LOCAL),
            DpAction::Output(3)
        ]
    );
    let tables: Vec<u8> = t.rules.iter().map(|r| r.flow.table).collect();
    assert_eq!(tables, vec![0, 5, 6]);
}

#[test]
fn resubmit_with_in_port_override() {
    let flows = vec![
        flow(
            0,
            1,
            &[(Field::InPort, 1)],
            vec![
                Action::Resubmit {
                    in_port: Some(2),
                    table: Some(1),
                },
                Action::Output(2), // in_port is 1 again: sent
            ],
        ),
        flow(
            1,
            1,
            &[(Field::InPort, 2)],
            vec![
                Action::Output(2), // skipped: in_port is 2 here
                Action::Output(port::IN_PORT),
                Action::Output(3),
            ],
        ),
    ];
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Output(2),
            DpAction::Output(3),
            DpAction::Output(2)
        ]
    );
}

#[test]
fn resubmit_to_current_table_loops_into_depth_limit() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::Output(2),
            Action::Resubmit {
                in_port: None,
                table: None,
            },
        ],
    )];
    let t = run(flows, &tcp_key(1));
    assert_eq!(t.error, Some(XlateError::RecursionTooDeep(MAX_DEPTH)));
    assert!(t.actions.is_empty(), "an error drops everything");
    assert_eq!(t.rules.len(), MAX_DEPTH as usize + 1);
}

#[test]
fn wide_resubmit_tree_hits_lookup_limit() {
    // Each table resubmits twice to the next: 2^13 lookups at depth 13.
    let mut flows = Vec::new();
    for t in 0..13u8 {
        let r = Action::Resubmit {
            in_port: None,
            table: Some(t + 1),
        };
        flows.push(flow(t, 1, &[], vec![r.clone(), r]));
    }
    flows.push(flow(13, 1, &[], vec![Action::Output(2)]));
    let t = run(flows, &tcp_key(1));
    assert_eq!(t.error, Some(XlateError::TooManyResubmits(MAX_LOOKUPS)));
    assert!(t.actions.is_empty());
}

#[test]
fn load_feeds_output_reg() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::Load {
                dst: sub(Field::Reg(0), 4, 8),
                value: 3,
            },
            Action::OutputReg(sub(Field::Reg(0), 4, 8)),
        ],
    )];
    let t = run(flows, &tcp_key(1));
    assert_eq!(t.actions, vec![DpAction::Output(3)]);
    // Registers are metadata: no Set; the read bits are in the mask.
    assert!(wc_has(&t, Field::Reg(0), 0xff0));
}

#[test]
fn move_reads_its_source() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::Move {
                src: sub(Field::NwSrc, 0, 8),
                dst: sub(Field::Reg(1), 0, 8),
            },
            Action::OutputReg(sub(Field::Reg(1), 0, 8)),
        ],
    )];
    let tables = LinearTables::from_flows(flows);
    let mut k = tcp_key(7);
    k.set(Field::NwSrc, 0x0a00_0002);
    let t = translate_with(&tables, &k, &env());
    assert_eq!(t.actions, vec![DpAction::Output(2)]);
    assert_eq!(t.wildcards.get(Field::NwSrc), 0xff);
    k.set(Field::NwSrc, 0x0a00_0003);
    let t = translate_with(&tables, &k, &env());
    assert_eq!(t.actions, vec![DpAction::Output(3)]);
}

#[test]
fn set_field_emits_set_only_for_changed_fields_once() {
    let key = tcp_key(1);
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::SetField {
                field: Field::DlSrc,
                value: 0xaa,
                mask: Field::DlSrc.full_mask(),
            },
            // Same value as the packet has: no Set.
            Action::SetField {
                field: Field::NwDst,
                value: key.get(Field::NwDst),
                mask: Field::NwDst.full_mask(),
            },
            Action::SetField {
                field: Field::Reg(3),
                value: 9,
                mask: 0xffff_ffff,
            },
            Action::Output(2),
            Action::Output(3),
            Action::SetField {
                field: Field::TpDst,
                value: 8080,
                mask: 0xffff,
            },
            Action::Output(2),
        ],
    )];
    let t = run(flows, &key);
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::DlSrc,
                value: 0xaa
            },
            DpAction::Output(2),
            DpAction::Output(3),
            DpAction::Set {
                field: Field::TpDst,
                value: 8080
            },
            DpAction::Output(2),
        ]
    );
    // Written-and-compared header fields are exact; the register is not read.
    for f in [Field::DlSrc, Field::NwDst, Field::TpDst] {
        assert!(wc_has(&t, f, f.full_mask()), "{f:?}");
    }
    assert_eq!(t.wildcards.get(Field::Reg(3)), 0);
}

#[test]
fn sets_follow_field_order_and_skip_unobserved_writes() {
    // Writes after the last output are never committed.
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::ModNwDst(0x0a00_0063),
            Action::ModDlDst(0x22),
            Action::ModDlSrc(0x11),
            Action::ModNwSrc(0x0a00_0062),
            Action::Output(2),
            Action::ModDlSrc(0x33),
        ],
    )];
    let t = run(flows, &tcp_key(1));
    let set = |field, value| DpAction::Set { field, value };
    assert_eq!(
        t.actions,
        vec![
            set(Field::DlSrc, 0x11),
            set(Field::DlDst, 0x22),
            set(Field::NwSrc, 0x0a00_0062),
            set(Field::NwDst, 0x0a00_0063),
            DpAction::Output(2),
        ]
    );
}

#[test]
fn mod_nw_is_ipv4_only() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::ModNwDst(0x0a00_0063),
            Action::ModDlDst(0x22),
            Action::Output(2),
        ],
    )];
    let t = run(flows, &arp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::DlDst,
                value: 0x22
            },
            DpAction::Output(2)
        ]
    );
}

#[test]
fn dec_ttl_decrements_and_reads_ttl() {
    let flows = vec![flow(0, 1, &[], vec![Action::DecTtl, Action::Output(2)])];
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::NwTtl,
                value: 63
            },
            DpAction::Output(2)
        ]
    );
    assert!(wc_has(&t, Field::NwTtl, 0xff));
}

/// The `invalid_ttl` packet-in a TTL exception sends from `table`.
fn invalid_ttl(table: u8, cookie: u64) -> DpAction {
    DpAction::Userspace {
        reason: PacketInReason::InvalidTtl,
        userdata: vec![],
        table,
        cookie,
    }
}

#[test]
fn dec_ttl_at_one_sends_invalid_ttl_and_stops_the_action_list() {
    let flows = vec![
        flow(
            0,
            1,
            &[],
            vec![
                Action::Resubmit {
                    in_port: None,
                    table: Some(1),
                },
                Action::Output(3),
            ],
        ),
        Flow {
            cookie: 0x55,
            ..flow(
                1,
                1,
                &[],
                vec![Action::DecTtl, Action::Output(2), Action::GotoTable(2)],
            )
        },
        flow(2, 1, &[], vec![Action::Output(port::LOCAL)]),
    ];
    let mut k = tcp_key(1);
    k.set(Field::NwTtl, 1);
    let t = run(flows.clone(), &k);
    // As OVS: a packet-in with reason invalid_ttl (from the flow's table,
    // with its cookie), then table 1's remaining actions (and its goto)
    // are dropped; the resubmitting level resumes.
    assert_eq!(t.actions, vec![invalid_ttl(1, 0x55), DpAction::Output(3)]);
    assert!(wc_has(&t, Field::NwTtl, 0xff));
    assert!(t.error.is_none());
    // TTL 0 behaves the same; TTL 2 goes through.
    k.set(Field::NwTtl, 0);
    assert_eq!(
        run(flows.clone(), &k).actions,
        vec![invalid_ttl(1, 0x55), DpAction::Output(3)]
    );
    k.set(Field::NwTtl, 2);
    let t = run(flows, &k);
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::NwTtl,
                value: 1
            },
            DpAction::Output(2),
            DpAction::Output(port::LOCAL),
            DpAction::Output(3)
        ]
    );
    assert!(wc_has(&t, Field::NwTtl, 0xff));
}

#[test]
fn dec_ttl_exception_commits_the_writes_before_its_packet_in() {
    // L3Forwarding's MAC rewrite, then L3DecTTL: the packet-in carries the
    // packet as the actions made it (OVS: `set(eth(...)),userspace(...)`).
    let flows = vec![
        flow(
            0,
            1,
            &[],
            vec![Action::ModDlSrc(0x0a58_0af4_0001), Action::GotoTable(55)],
        ),
        flow(55, 1, &[], vec![Action::DecTtl, Action::Output(2)]),
    ];
    let mut k = tcp_key(1);
    k.set(Field::NwTtl, 1);
    let t = run(flows, &k);
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::DlSrc,
                value: 0x0a58_0af4_0001
            },
            invalid_ttl(55, 0),
        ]
    );
}

#[test]
fn dec_ttl_on_ipv6_uses_the_hop_limit() {
    let flows = vec![flow(0, 1, &[], vec![Action::DecTtl, Action::Output(2)])];
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, 1);
    k.set(Field::DlType, 0x86dd);
    k.set(Field::Ipv6Src, 0xfd00_0000_0000_0000_0000_0000_0000_0003);
    k.set(Field::Ipv6Dst, 0xfd00_0000_0000_0000_0000_0000_0000_0004);
    k.set(Field::NwProto, 58);
    for (hlim, expect) in [
        (1, vec![invalid_ttl(0, 0)]),
        (0, vec![invalid_ttl(0, 0)]),
        (
            2,
            vec![
                DpAction::Set {
                    field: Field::NwTtl,
                    value: 1,
                },
                DpAction::Output(2),
            ],
        ),
        (
            255,
            vec![
                DpAction::Set {
                    field: Field::NwTtl,
                    value: 254,
                },
                DpAction::Output(2),
            ],
        ),
    ] {
        k.set(Field::NwTtl, hlim);
        let t = run(flows.clone(), &k);
        assert_eq!(t.actions, expect, "hop limit {hlim}");
        assert!(wc_has(&t, Field::NwTtl, 0xff));
    }
}

#[test]
fn dec_ttl_ignores_non_ip() {
    let flows = vec![flow(0, 1, &[], vec![Action::DecTtl, Action::Output(2)])];
    let t = run(flows, &arp_key(1));
    assert_eq!(t.actions, vec![DpAction::Output(2)]);
    assert_eq!(t.wildcards.get(Field::NwTtl), 0);
}

#[test]
fn vlan_push_set_pop() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::PushVlan(0x8100),
            Action::SetField {
                field: Field::VlanTci,
                value: 0x1000 | 42,
                mask: 0x1fff,
            },
            Action::Output(2),
            Action::PopVlan,
            Action::Output(3),
        ],
    )];
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::PushVlan {
                tpid: 0x8100,
                tci: 0x1000
            },
            DpAction::Set {
                field: Field::VlanTci,
                value: 0x1000 | 42
            },
            DpAction::Output(2),
            DpAction::PopVlan,
            DpAction::Output(3),
        ]
    );
}

#[test]
fn pop_vlan_on_untagged_reads_only_the_tag_bit() {
    let flows = vec![flow(0, 1, &[], vec![Action::PopVlan, Action::Output(3)])];
    let t = run(flows.clone(), &tcp_key(1));
    assert_eq!(t.actions, vec![DpAction::Output(3)]);
    assert_eq!(t.wildcards.get(Field::VlanTci), 0x1000);
    let mut k = tcp_key(1);
    k.set(Field::VlanTci, 0x1000 | 7);
    let t = run(flows, &k);
    assert_eq!(t.actions, vec![DpAction::PopVlan, DpAction::Output(3)]);
}

#[test]
/// OVS 3.1: `push_vlan:0x88a8` onto a `dl_vlan=5,dl_vlan_pcp=2` packet gives
/// `push_vlan(tpid=0x88a8,vid=0,pcp=0)`: the new tag does not copy the old.
fn push_vlan_on_tagged_starts_from_vid_0_like_ovs() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![Action::PushVlan(0x88a8), Action::Output(3)],
    )];
    let mut k = tcp_key(1);
    k.set(Field::VlanTci, 0x1000 | 7);
    let t = run(flows, &k);
    assert_eq!(
        t.actions,
        vec![
            DpAction::PushVlan {
                tpid: 0x88a8,
                tci: 0x1000
            },
            DpAction::Output(3)
        ]
    );
    assert_eq!(t.wildcards.get(Field::VlanTci), 0);
}

#[test]
fn tunnel_metadata_is_set_before_output_once_per_change() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::SetField {
                field: Field::TunDst,
                value: 0xc0a8_0002,
                mask: 0xffff_ffff,
            },
            Action::SetTunnel(0x10),
            Action::Output(2),
            Action::Output(3),
            Action::SetTunnel(0x11),
            Action::Output(2),
            Action::SetTunnel(0x11), // no change
            Action::Output(3),
        ],
    )];
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::SetTunnel(TunnelFields {
                tun_id: 0x10,
                dst: 0xc0a8_0002,
                ..TunnelFields::default()
            }),
            DpAction::Output(2),
            DpAction::Output(3),
            DpAction::SetTunnel(TunnelFields {
                tun_id: 0x11,
                dst: 0xc0a8_0002,
                ..TunnelFields::default()
            }),
            DpAction::Output(2),
            DpAction::Output(3),
        ]
    );
    for f in Field::TUNNEL {
        assert!(wc_has(&t, f, f.full_mask()), "{f:?}");
    }
}

fn parse_tun_flows(text: &str) -> Result<Vec<Flow>, oxvs_pipeline::parse::FileError> {
    oxvs_pipeline::parse::parse_flow_file(text, &oxvs_pipeline::parse::ParseContext::default())
}

const TUN6_A: u128 = 0xfd00_0000_0000_0000_0000_0000_0000_0001;
const TUN6_B: u128 = 0xfd00_0000_0000_0000_0000_0000_0000_0002;

#[test]
fn tun_ipv6_dst_write_gives_ipv6_tunnel_metadata() {
    // `set_field:fd00::2->tun_ipv6_dst,set_tunnel:0x10,output:2`: the
    // output carries an IPv6 tunnel destination, and the datapath's
    // TunnelMeta for it is IPv6.
    let flows = parse_tun_flows(
        "in_port=1 actions=set_field:fd00::2->tun_ipv6_dst,set_tunnel:0x10,output:2",
    )
    .unwrap();
    let t = run(flows, &tcp_key(1));
    let set = TunnelFields {
        tun_id: 0x10,
        ipv6_dst: TUN6_B,
        ..TunnelFields::default()
    };
    assert_eq!(
        t.actions,
        vec![DpAction::SetTunnel(set), DpAction::Output(2)]
    );
    let mut out = tcp_key(1);
    set.write_to(&mut out);
    let meta = TunnelMeta::from_key(&out).unwrap();
    assert_eq!(
        meta,
        TunnelMeta::v6(0x10, Ipv6Addr::UNSPECIFIED, Ipv6Addr::from(TUN6_B))
    );
    assert!(meta.is_ipv6());
    for f in Field::TUNNEL {
        assert!(wc_has(&t, f, f.full_mask()), "{f:?}");
    }
}

#[test]
fn tun_dst_wins_over_tun_ipv6_dst_as_in_ovs() {
    // Both destinations set: OVS's flow_tnl_dst() takes the IPv4 one.
    let flows = parse_tun_flows(
        "in_port=1 actions=set_field:fd00::2->tun_ipv6_dst,set_field:192.168.0.2->tun_dst,output:2",
    )
    .unwrap();
    let t = run(flows, &tcp_key(1));
    let DpAction::SetTunnel(set) = t.actions[0] else {
        panic!("{:?}", t.actions)
    };
    assert_eq!((set.dst, set.ipv6_dst), (0xc0a8_0002, TUN6_B));
    let mut out = FlowKey::ZERO;
    set.write_to(&mut out);
    assert_eq!(
        TunnelMeta::from_key(&out),
        Some(TunnelMeta::v4(0, 0, 0xc0a8_0002))
    );
    // Clearing tun_dst again makes it the IPv6 tunnel.
    out.set(Field::TunDst, 0);
    assert!(TunnelMeta::from_key(&out).unwrap().is_ipv6());
}

#[test]
fn received_ipv6_tunnel_matches_tun_ipv6_src_only() {
    // A packet from an IPv6 tunnel has tun_ipv6_src/dst and no tun_src;
    // one from an IPv4 tunnel the other way round: a flow on one family's
    // source never matches the other's packets.
    let flows = parse_tun_flows(
        "table=0,priority=10,tun_ipv6_src=fd00::1 actions=output:3\n\
         table=0,priority=10,tun_src=192.168.0.1 actions=output:1\n\
         table=0,priority=5,tun_ipv6_src=fd00::/16 actions=output:2\n\
         table=0,priority=1 actions=drop",
    )
    .unwrap();
    let from6 = |src: u128| {
        let mut k = tcp_key(9);
        TunnelMeta::v6(100, Ipv6Addr::from(src), Ipv6Addr::from(TUN6_B)).write_to(&mut k);
        k
    };
    let mut from4 = tcp_key(9);
    TunnelMeta::v4(100, 0xc0a8_0001, 0xc0a8_0002).write_to(&mut from4);
    assert_eq!(from4.get(Field::TunIpv6Src), 0);
    assert_eq!(from6(TUN6_A).get(Field::TunSrc), 0);
    assert_eq!(
        run(flows.clone(), &from6(TUN6_A)).actions,
        vec![DpAction::Output(3)]
    );
    assert_eq!(
        run(flows.clone(), &from6(TUN6_B)).actions,
        vec![DpAction::Output(2)]
    );
    assert_eq!(
        run(flows.clone(), &from4).actions,
        vec![DpAction::Output(1)]
    );
    // An IPv4 source whose bits equal the IPv6 one's low bits does not
    // match the IPv6 flow (separate fields).
    let mut v4_lookalike = tcp_key(9);
    TunnelMeta::v4(100, 1, 0xc0a8_0002).write_to(&mut v4_lookalike);
    assert!(run(flows.clone(), &v4_lookalike).actions.is_empty());
    // The megaflow of the IPv6 match reads tun_ipv6_src.
    let t = run(flows, &from6(TUN6_A));
    assert!(wc_has(&t, Field::TunIpv6Src, u128::MAX));
}

#[test]
fn tunnel_write_equal_to_input_emits_nothing() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![Action::SetTunnel(5), Action::Output(2)],
    )];
    let mut k = tcp_key(1);
    k.set(Field::TunId, 5);
    let t = run(flows, &k);
    assert_eq!(t.actions, vec![DpAction::Output(2)]);
    assert!(wc_has(&t, Field::TunId, Field::TunId.full_mask()));
}

fn ct(commit: bool, zone: CtZoneSrc, table: Option<u8>, exec: Vec<Action>) -> Action {
    Action::Ct(CtAction {
        commit,
        force: false,
        zone,
        table,
        exec,
    })
}

#[test]
fn ct_without_table_just_runs_conntrack() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            ct(
                true,
                CtZoneSrc::Imm(7),
                None,
                vec![Action::SetField {
                    field: Field::CtMark,
                    value: 0x1,
                    mask: 0xffff_ffff,
                }],
            ),
            Action::Output(2),
        ],
    )];
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Ct {
                zone: 7,
                commit: true,
                force: false,
                mark: Some((1, 0xffff_ffff)),
                label: None,
                nat: None,
            },
            DpAction::Output(2)
        ]
    );
}

#[test]
fn ct_with_table_commits_loads_meta_and_recirculates() {
    let flows = vec![
        flow(
            0,
            1,
            &[],
            vec![
                Action::Load {
                    dst: sub(Field::Reg(0), 0, 16),
                    value: 0x2a,
                },
                Action::SetField {
                    field: Field::Metadata,
                    value: 0x77,
                    mask: u64::MAX as u128,
                },
                Action::ModDlSrc(0xaa),
                ct(
                    false,
                    CtZoneSrc::Field(sub(Field::Reg(0), 0, 16)),
                    Some(31),
                    vec![],
                ),
                // The original packet continues, untracked.
                Action::Resubmit {
                    in_port: None,
                    table: Some(1),
                },
            ],
        ),
        flow(1, 10, &[(Field::CtState, 0)], vec![Action::Output(2)]),
        flow(1, 1, &[], vec![Action::Output(3)]),
    ];
    let mut k = tcp_key(1);
    // Arrived tracked: ct() clears that for the continuing packet.
    k.set(Field::CtState, (ct_state::TRK | ct_state::EST) as u128);
    let t = run(flows, &k);
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::DlSrc,
                value: 0xaa
            },
            DpAction::Ct {
                zone: 0x2a,
                commit: false,
                force: false,
                mark: None,
                label: None,
                nat: None,
            },
            DpAction::LoadMeta {
                field: Field::Metadata,
                value: 0x77
            },
            DpAction::LoadMeta {
                field: Field::Reg(0),
                value: 0x2a
            },
            DpAction::Recirc(recirc_id_for_table(31)),
            DpAction::Output(2),
        ]
    );
    // LoadMeta carries whole fields: the bits not written come from the
    // input and are exact in the mask (the written ones need not be).
    // reg0: high half for LoadMeta, low half read by ct(zone=reg0[0..15]).
    assert_eq!(t.wildcards.get(Field::Reg(0)), 0xffff_ffff);
    assert_eq!(t.wildcards.get(Field::Metadata), 0);
}

#[test]
fn recirculated_key_resumes_in_its_table() {
    let flows = vec![
        flow(0, 1, &[], vec![Action::Output(2)]),
        flow(
            31,
            10,
            &[(Field::CtState, (ct_state::TRK | ct_state::NEW) as u128)],
            vec![Action::Output(3)],
        ),
    ];
    let mut k = tcp_key(1);
    k.set(Field::RecircId, recirc_id_for_table(31) as u128);
    k.set(Field::CtState, (ct_state::TRK | ct_state::NEW) as u128);
    let t = run(flows.clone(), &k);
    assert_eq!(t.actions, vec![DpAction::Output(3)]);
    assert!(wc_has(&t, Field::RecircId, 0xffff_ffff));
    // An id that names no table drops.
    k.set(Field::RecircId, 0x1000);
    let t = run(flows, &k);
    assert!(t.actions.is_empty());
    assert_eq!(t.error, Some(XlateError::UnknownRecircId(0x1000)));
}

#[test]
fn controller_action_and_port() {
    let flows = vec![flow(
        3,
        1,
        &[],
        vec![
            Action::ModDlDst(0x5),
            Action::Controller(ControllerAction {
                reason: PacketInReason::NoMatch,
                userdata: vec![1, 2],
                max_len: 65535,
                controller_id: 0,
            }),
            Action::Output(port::CONTROLLER),
        ],
    )];
    let mut f0 = flow(0, 1, &[], vec![Action::GotoTable(3)]);
    f0.cookie = 0x99;
    let mut flows = flows;
    flows[0].cookie = 0xabc;
    flows.push(f0);
    let t = run(flows, &tcp_key(1));
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::DlDst,
                value: 5
            },
            DpAction::Userspace {
                reason: PacketInReason::NoMatch,
                userdata: vec![1, 2],
                table: 3,
                cookie: 0xabc
            },
            DpAction::Userspace {
                reason: PacketInReason::Action,
                userdata: vec![],
                table: 3,
                cookie: 0xabc
            },
        ]
    );
}

#[test]
fn empty_actions_and_conjunction_flows_drop() {
    let flows = vec![
        flow(0, 1, &[], vec![Action::GotoTable(1), Action::Note(vec![1])]),
        flow(
            1,
            1,
            &[],
            vec![
                Action::Conjunction {
                    id: 1,
                    clause: 1,
                    n_clauses: 2,
                },
                Action::Output(2),
            ],
        ),
    ];
    let t = run(flows, &tcp_key(1));
    assert!(t.actions.is_empty());
    assert_eq!(t.rules.len(), 2);
    let t = run(vec![flow(0, 1, &[], vec![])], &tcp_key(1));
    assert!(t.actions.is_empty());
    assert_eq!(t.rules.len(), 1);
}

#[test]
fn ct_clear_clears_state_for_later_lookups() {
    let flows = vec![
        flow(0, 1, &[], vec![Action::CtClear, Action::GotoTable(1)]),
        flow(
            1,
            10,
            &[(Field::CtState, ct_state::TRK as u128)],
            vec![Action::Output(2)],
        ),
        flow(1, 1, &[], vec![Action::Output(3)]),
    ];
    let mut k = tcp_key(1);
    k.set(Field::CtState, ct_state::TRK as u128);
    let t = run(flows, &k);
    assert_eq!(t.actions, vec![DpAction::CtClear, DpAction::Output(3)]);
}

#[test]
fn translation_is_deterministic() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::ModDlSrc(1),
            Action::Output(port::ALL),
            Action::DecTtl,
            Action::Output(2),
        ],
    )];
    let tables = LinearTables::from_flows(flows);
    let a = translate_with(&tables, &tcp_key(1), &env());
    let b = translate_with(&tables, &tcp_key(1), &env());
    assert_eq!(a.actions, b.actions);
    assert_eq!(a.wildcards, b.wildcards);
}

#[test]
fn xreg_and_tunnel_writes_are_carried_per_field() {
    let flows = vec![flow(
        0,
        1,
        &[],
        vec![
            Action::SetField {
                field: Field::Xreg(1),
                value: 0x1111_2222_3333_4444,
                mask: u64::MAX as u128,
            },
            Action::SetField {
                field: Field::TunDst,
                value: 0x0a0a_0a0a,
                mask: 0xffff_ffff,
            },
            ct(false, CtZoneSrc::Imm(1), Some(2), vec![]),
        ],
    )];
    let t = run(flows, &tcp_key(1));
    let load = |field, value| DpAction::LoadMeta { field, value };
    assert_eq!(
        t.actions,
        vec![
            DpAction::Ct {
                zone: 1,
                commit: false,
                force: false,
                mark: None,
                label: None,
                nat: None,
            },
            load(Field::Reg(2), 0x1111_2222),
            load(Field::Reg(3), 0x3333_4444),
            load(Field::TunDst, 0x0a0a_0a0a),
            DpAction::Recirc(recirc_id_for_table(2)),
        ]
    );
}
