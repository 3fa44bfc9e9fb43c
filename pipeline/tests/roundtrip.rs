//! Round trips between the flow text parser and printer:
//! `parse(print(parse(text))) == parse(text)` on a hand-written corpus of
//! OVS-style flows, and `parse_flow(format_flow(f)) == f` for random valid flows.

use oxvs_pipeline::parse::{parse_flow, ParseContext};
use oxvs_pipeline::print::format_flow;

/// Hand-written flows in OVS syntax, as operators and the agent write them.
const CORPUS: &[&str] = &[
    "table=0,priority=100,ip,nw_dst=10.0.0.1,actions=output:2",
    "table=1,tcp,tp_dst=80,nw_src=10.0.0.0/24,actions=load:0x1->NXM_NX_REG0[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:10.0.0.2->tun_dst,resubmit(,10),goto_table:10",
    "table=1,tun_ipv6_src=fd00::1,tun_ipv6_dst=fd00:1::/32,tun_id=100,actions=set_field:fd00::2->tun_ipv6_dst,set_field:fd00::/ffff::->tun_ipv6_src,move:NXM_NX_TUN_IPV6_SRC[0..31]->NXM_NX_REG0[],load:0x1->NXM_NX_TUN_IPV6_DST[0..15],output:3",
    "table=2,idle_timeout=10,hard_timeout=20,importance=3,send_flow_rem,check_overlap,reset_counts,no_packet_counts,no_byte_counts,cookie=0x5,priority=5,ip,ct_state=+trk+est-rel,reg1=0x5/0xff,actions=ct(commit,zone=5,exec(set_field:0x1/0xff->ct_mark,set_field:0x5->ct_label,load:0x3->NXM_NX_CT_MARK[0..3]))",
    "table=3,ct_state=+trk,actions=conjunction(1,2/3)",
    "table=3,arp,nw_src=10.0.0.1,actions=output:NXM_NX_REG1[],output:reg1,output:NXM_NX_REG1[0..15],in_port,LOCAL,ALL,FLOOD,CONTROLLER,controller(reason=no_match,userdata=01.02.03,max_len=100,id=3)",
    "table=4,dl_vlan=5,dl_vlan_pcp=3,ip_dscp=3,ip,nw_ecn=1,actions=drop",
    "table=4,dl_vlan=0xffff,ip,actions=mod_dl_src:00:11:22:33:44:55,mod_nw_src:1.2.3.4,dec_ttl,push_vlan:0x8100,pop_vlan,strip_vlan,set_tunnel:5,set_tunnel64:0x1234567890,ct_clear,note:00.11.22,resubmit:3,resubmit(4,5),ct(zone=NXM_NX_REG0[0..15],table=7)",
    "table=5,tcp6,ipv6_src=2001:db8::/64,tcp_flags=+syn-ack,actions=drop",
    "table=5,udp,tp_dst=0x1000/0xf000,dl_src=00:11:22:00:00:00/ff:ff:ff:00:00:00,in_port=LOCAL,vlan_tci=0x1005/0x1fff,actions=drop",
    "table=5,tcp6,nw_frag=later,actions=drop",
    "table=6,ip,nw_frag=first,nw_tos=4,actions=drop",
    "table=6,ip,nw_frag=not_later,actions=drop",
    "table=6,ip,nw_frag=yes,nw_dst=10.0.0.0/255.255.0.255,actions=drop",
    "table=6,ipv6,ipv6_dst=2001:db8::1,ipv6_label=0x12,actions=drop",
    "table=7,arp,arp_op=1,arp_sha=00:11:22:33:44:55,arp_tpa=1.2.3.0/24,actions=drop",
    "table=7,icmp,icmp_type=8,icmp_code=0,nw_ttl=3,actions=drop",
    "table=7,icmp6,icmpv6_type=135,actions=drop",
    "table=7,sctp,tp_src=5,actions=drop",
    "table=7,udp6,udp_dst=53,actions=drop",
    "table=8,rarp,actions=drop",
    "table=8,dl_type=0x0800,nw_proto=6,actions=drop",
    "table=8,dl_type=0x0800,nw_proto=99,actions=drop",
    "table=8,eth,dl_type=0x1234,actions=drop",
    "table=8,metadata=0x5,tun_id=0x7/0xff,tun_src=1.1.1.1,tun_dst=2.2.2.0/24,pkt_mark=0x3,ct_mark=0x5/0xf,ct_zone=5,ct_label=0x1/0x1,conj_id=7,recirc_id=0x0,xreg1=0x5,actions=drop",
    "table=9,ct_state=0x22/0x26,actions=drop",
    "table=9,ct_state=trk|est,actions=drop",
    "priority=100 ip nw_dst=1.2.3.4 actions=drop",
    "priority=100, ip, nw_dst=1.2.3.4, actions=drop",
    "table=5,arp,actions=set_field:1->arp_op,load:0x2->NXM_OF_ARP_OP[],set_field:1.2.3.4->arp_spa,move:NXM_OF_ETH_SRC[]->NXM_NX_ARP_SHA[],move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],set_field:00:11:22:33:44:55->arp_sha",
    "table=6,ipv6,actions=set_field:2001:db8::1->ipv6_src,set_field:0x12->ipv6_label,load:0x1->NXM_NX_IPV6_SRC[0..63]",
    "table=4,dl_type=0x0800,actions=dec_ttl,set_field:1->nw_ttl,set_field:4->nw_tos,set_field:8->ip_dscp,move:NXM_NX_TUN_ID[0..31]->NXM_NX_REG0[],move:NXM_NX_CT_LABEL[0..31]->NXM_NX_REG0[],set_field:0x1->tun_id,load:0x1->NXM_NX_TUN_ID[0..7],set_field:0x5->xreg1,goto_table:5",
    "table=7,actions=note:00.11,conjunction(1,2/3)",
    "table=7,priority=1,actions=push_vlan:0x88a8",
    "table=7,priority=2,actions=output:in_port",
    "table=7,priority=5,actions=controller(reason=invalid_ttl)",
    "table=7,priority=6,actions=note:",
    "table=7,priority=11,ip,actions=resubmit(,8),output:NXM_NX_REG0[0..15],output:reg0[0..3]",
    "table=7,priority=12,ip,actions=ct(zone=5,table=8),ct(zone=reg0[0..15]),ct(commit,exec(set_field:1->ct_mark)),ct,ct(commit,force)",
    "tcp,tp_src=5,actions=set_field:5->tp_src,set_field:6->tcp_dst",
    "cookie=0x10,table=SpoofGuard,priority=200,in_port=3,dl_src=aa:bb:cc:dd:ee:ff,ip,nw_src=10.244.0.5,actions=goto_table:ConntrackZone",
    "table=ConntrackZone,ip,actions=ct(table=ConntrackState,zone=NXM_NX_REG0[0..15])",
    " cookie=0x5, duration=1.234s, table=2, n_packets=7, n_bytes=900, idle_timeout=10, send_flow_rem importance=3, idle_age=0, priority=5,ip actions=drop",
    "ip,dl_vlan=5,in_port=7,reg3=0/0xff,actions=set_field:0x1005->vlan_tci,controller:100,output:CONTROLLER,NORMAL,output:LOCAL,4",
    "icmp6,icmp_type=135,icmp_code=0,actions=set_field:136->icmp_type",
    "icmp6,icmp_type=136,nd_target=fec0::1234:f045:8fff:1111:fe00:0/96,nd_tll=00:0a:e4:25:6b:b1,actions=drop",
    "icmp6,icmp_type=135,nd_sll=00:0a:e4:00:00:00/ff:ff:ff:00:00:00,nd_reserved=5,nd_options_type=1,actions=drop",
    "table=0,priority=300,icmp6,icmp_type=135,icmp_code=0,nd_target=fd00:10:244:1::1,actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:02:00:00:00:00:01->eth_src,move:NXM_NX_IPV6_SRC[]->NXM_NX_IPV6_DST[],set_field:fd00:10:244:1::1->ipv6_src,set_field:136->icmpv6_type,set_field:0x60000000->nd_reserved,set_field:2->nd_options_type,set_field:0a:00:00:00:00:09->nd_sll,goto_table:1",
    "table=1,icmp6,icmp_type=136,actions=set_field:02:00:00:00:00:01->nd_tll,move:OXM_OF_IPV6_ND_TLL[]->NXM_OF_ETH_SRC[],load:0x1->NXM_NX_ND_TARGET[0..63],move:NXM_NX_ND_TARGET[64..127]->OXM_OF_PKT_REG1[],load:0x2->ERICOXM_OF_ICMPV6_ND_OPTIONS_TYPE[],move:ERICOXM_OF_ICMPV6_ND_RESERVED[]->NXM_NX_REG0[],IN_PORT",
];

#[test]
fn corpus_idempotent() {
    let ctx = ParseContext::default();
    for line in CORPUS {
        let f = parse_flow(line, &ctx).unwrap_or_else(|e| panic!("{line}: {e}"));
        for names in [None, Some(&ctx.tables)] {
            let text = format_flow(&f, names);
            let g = parse_flow(&text, &ctx).unwrap_or_else(|e| panic!("{line}\n -> {text}\n: {e}"));
            assert_eq!(f, g, "{line}\n -> {text}");
            if std::env::var_os("SHOW").is_some() && names.is_none() {
                println!("{text}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Random valid flows.
//
// A flow is built from a vector of random words (so proptest shrinks toward
// zeros, i.e. toward fewer fields and simpler actions). Every choice keeps
// the flow valid: fields only with their prerequisites, masks only where
// OVS allows them, actions only where the match allows them.

use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::{
    port, Action, ControllerAction, CtAction, CtZoneSrc, Flow, FlowFlags, Match, PacketInReason,
    SubField,
};
use proptest::prelude::*;

struct Rng<'a> {
    words: &'a [u64],
    i: usize,
}

impl Rng<'_> {
    fn u64(&mut self) -> u64 {
        let w = self.words.get(self.i).copied().unwrap_or(0);
        self.i += 1;
        w
    }
    fn below(&mut self, n: u64) -> u64 {
        self.u64() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        // Zero words mean "no": shrinking removes optional parts.
        let w = self.u64();
        w != 0 && w % 100 < percent
    }
    fn bits(&mut self, bits: u32) -> u128 {
        let v = (u128::from(self.u64()) << 64) | u128::from(self.u64());
        if bits >= 128 {
            v
        } else {
            v & ((1u128 << bits) - 1)
        }
    }
    /// A non-zero mask of `bits` bits: all ones, a prefix, or random.
    fn mask(&mut self, bits: u32) -> u128 {
        let full = if bits >= 128 {
            u128::MAX
        } else {
            (1u128 << bits) - 1
        };
        match self.below(3) {
            0 => full,
            1 => {
                let p = 1 + self.below(u64::from(bits)) as u32;
                full & !full.checked_shr(p).unwrap_or(0)
            }
            _ => match self.bits(bits) {
                0 => 1,
                m => m,
            },
        }
    }
}

fn masked(m: &mut Match, r: &mut Rng, f: Field) {
    let mask = r.mask(f.bits());
    let v = r.bits(f.bits());
    m.set(f, v & mask, mask);
}

fn exact(m: &mut Match, r: &mut Rng, f: Field) {
    let v = r.bits(f.bits());
    m.set_exact(f, v);
}

fn random_port(r: &mut Rng) -> u32 {
    const RESERVED: [u32; 6] = [
        port::IN_PORT,
        port::NORMAL,
        port::FLOOD,
        port::ALL,
        port::LOCAL,
        port::CONTROLLER,
    ];
    if r.chance(20) {
        RESERVED[r.below(6) as usize]
    } else {
        (r.u64() % u64::from(port::MAX)) as u32
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Proto {
    None,
    Ip4(Option<u8>),
    Ip6(Option<u8>),
    Arp(u16),
    Other(u16),
}

fn random_match(r: &mut Rng) -> (Match, Proto) {
    let mut m = Match::CATCHALL;
    let proto = match r.below(8) {
        0 | 1 => Proto::None,
        2 => Proto::Arp(if r.chance(50) { 0x0806 } else { 0x8035 }),
        3 => Proto::Other(0x1234 + r.below(100) as u16),
        n => {
            let p = match r.below(6) {
                0 => None,
                1 => Some(6),
                2 => Some(17),
                3 => Some(132),
                4 => Some(if n % 2 == 0 { 1 } else { 58 }),
                _ => Some(99),
            };
            if n % 2 == 0 {
                Proto::Ip4(p.map(|p| if p == 58 { 1 } else { p }))
            } else {
                Proto::Ip6(p.map(|p| if p == 1 { 58 } else { p }))
            }
        }
    };
    match proto {
        Proto::None => {}
        Proto::Arp(t) | Proto::Other(t) => m.set_exact(Field::DlType, u128::from(t)),
        Proto::Ip4(p) | Proto::Ip6(p) => {
            m.set_exact(
                Field::DlType,
                if matches!(proto, Proto::Ip4(_)) {
                    0x0800
                } else {
                    0x86dd
                },
            );
            if let Some(p) = p {
                m.set_exact(Field::NwProto, u128::from(p));
            }
        }
    }
    for f in [
        Field::PktMark,
        Field::CtMark,
        Field::CtLabel,
        Field::TunId,
        Field::TunSrc,
        Field::TunDst,
        Field::TunIpv6Src,
        Field::TunIpv6Dst,
        Field::Metadata,
        Field::DlSrc,
        Field::DlDst,
        Field::VlanTci,
    ] {
        if r.chance(15) {
            masked(&mut m, r, f);
        }
    }
    for reg in 0..16 {
        if r.chance(8) {
            masked(&mut m, r, Field::Reg(reg));
        }
    }
    for f in [Field::RecircId, Field::ConjId, Field::CtZone] {
        if r.chance(10) {
            exact(&mut m, r, f);
        }
    }
    if r.chance(20) {
        let known = 0xffu128;
        if r.chance(30) {
            m.set(
                Field::CtState,
                r.bits(8) & known,
                Field::CtState.full_mask(),
            );
        } else {
            let mask = match r.bits(8) {
                0 => 0x20,
                x => x,
            };
            m.set(Field::CtState, r.bits(8) & mask, mask);
        }
    }
    if r.chance(20) {
        m.set_exact(Field::InPort, u128::from(random_port(r)));
    }
    let ip = matches!(proto, Proto::Ip4(_) | Proto::Ip6(_));
    if ip {
        if matches!(proto, Proto::Ip4(_)) {
            for f in [Field::NwSrc, Field::NwDst] {
                if r.chance(40) {
                    masked(&mut m, r, f);
                }
            }
        } else {
            for f in [Field::Ipv6Src, Field::Ipv6Dst, Field::Ipv6Label] {
                if r.chance(40) {
                    masked(&mut m, r, f);
                }
            }
        }
        if r.chance(25) {
            let mask = [0xfc, 0x03, 0xff][r.below(3) as usize];
            m.set(Field::NwTos, r.bits(8) & mask, mask);
        }
        if r.chance(20) {
            exact(&mut m, r, Field::NwTtl);
        }
        if r.chance(20) {
            let (v, mask) = [(0, 1), (1, 1), (1, 3), (3, 3), (0, 2)][r.below(5) as usize];
            m.set(Field::NwFrag, v, mask);
        }
        let p = match proto {
            Proto::Ip4(p) | Proto::Ip6(p) => p,
            _ => None,
        };
        match p {
            Some(6) | Some(17) | Some(132) => {
                for f in [Field::TpSrc, Field::TpDst] {
                    if r.chance(40) {
                        masked(&mut m, r, f);
                    }
                }
                if p == Some(6) && r.chance(30) {
                    if r.chance(50) {
                        let mask = match r.bits(9) {
                            0 => 2,
                            x => x,
                        };
                        m.set(Field::TcpFlags, r.bits(9) & mask, mask);
                    } else {
                        masked(&mut m, r, Field::TcpFlags);
                    }
                }
            }
            Some(1) | Some(58) => {
                for f in [Field::TpSrc, Field::TpDst] {
                    if r.chance(40) {
                        m.set_exact(f, r.bits(8));
                    }
                }
            }
            _ => {}
        }
    }
    if let Proto::Arp(_) = proto {
        for f in [Field::NwSrc, Field::NwDst, Field::ArpSha, Field::ArpTha] {
            if r.chance(40) {
                masked(&mut m, r, f);
            }
        }
        if r.chance(30) {
            exact(&mut m, r, Field::NwProto);
        }
    }
    (m, proto)
}

fn random_subfield(r: &mut Rng, fields: &[Field], max_bits: u32) -> SubField {
    let f = fields[r.below(fields.len() as u64) as usize];
    let bits = f.bits().min(128);
    let n = 1 + r.below(u64::from(bits.min(max_bits))) as u32;
    let ofs = r.below(u64::from(bits - n + 1)) as u32;
    SubField {
        field: f,
        ofs: ofs as u8,
        n_bits: n as u8,
    }
}

const RW_FIELDS: &[Field] = &[
    Field::Reg(0),
    Field::Reg(7),
    Field::Reg(15),
    Field::Xreg(3),
    Field::Metadata,
    Field::TunId,
    Field::TunSrc,
    Field::TunDst,
    Field::TunIpv6Src,
    Field::TunIpv6Dst,
    Field::PktMark,
    Field::DlSrc,
    Field::DlDst,
    Field::VlanTci,
];

fn random_action(r: &mut Rng, proto: Proto) -> Action {
    let ip = matches!(proto, Proto::Ip4(_) | Proto::Ip6(_));
    loop {
        let a = match r.below(19) {
            0 => Action::Output(random_port(r)),
            1 => Action::OutputReg(random_subfield(
                r,
                &[Field::Reg(1), Field::Reg(9), Field::InPort],
                32,
            )),
            2 => Action::Controller(ControllerAction {
                reason: [
                    PacketInReason::Action,
                    PacketInReason::NoMatch,
                    PacketInReason::InvalidTtl,
                ][r.below(3) as usize],
                userdata: (0..r.below(5)).map(|_| r.u64() as u8).collect(),
                max_len: if r.chance(50) {
                    u16::MAX
                } else {
                    r.u64() as u16
                },
                controller_id: if r.chance(50) { 0 } else { r.u64() as u16 },
            }),
            3 => {
                let in_port = r
                    .chance(50)
                    .then(|| random_port(r))
                    .filter(|p| *p != port::IN_PORT);
                let table = if in_port.is_none() || r.chance(50) {
                    Some(r.below(255) as u8)
                } else {
                    None
                };
                Action::Resubmit { in_port, table }
            }
            4 => {
                let mut fields: Vec<Field> = RW_FIELDS.to_vec();
                fields.push(Field::InPort);
                if matches!(proto, Proto::Ip4(_)) {
                    fields.extend([Field::NwSrc, Field::NwDst, Field::NwTos, Field::NwTtl]);
                }
                if matches!(
                    proto,
                    Proto::Ip4(Some(6 | 17 | 132)) | Proto::Ip6(Some(6 | 17 | 132))
                ) {
                    fields.extend([Field::TpSrc, Field::TpDst]);
                }
                let f = fields[r.below(fields.len() as u64) as usize];
                let mask = match f {
                    Field::InPort => f.full_mask(),
                    Field::NwTos => [0xfc, 0x03][r.below(2) as usize],
                    _ => r.mask(f.bits()),
                };
                let value = if f == Field::InPort {
                    u128::from(random_port(r))
                } else {
                    r.bits(f.bits()) & mask
                };
                Action::SetField {
                    field: f,
                    value,
                    mask,
                }
            }
            5 => {
                let dst = random_subfield(r, RW_FIELDS, 128);
                let value = r.bits(u32::from(dst.n_bits));
                Action::Load { dst, value }
            }
            6 => {
                let src = random_subfield(
                    r,
                    &[
                        Field::Reg(2),
                        Field::TunId,
                        Field::DlSrc,
                        Field::CtState,
                        Field::InPort,
                        Field::CtLabel,
                    ],
                    128,
                );
                let mut dst = random_subfield(r, RW_FIELDS, u32::from(src.n_bits));
                if dst.n_bits != src.n_bits {
                    continue;
                }
                dst.n_bits = src.n_bits;
                Action::Move { src, dst }
            }
            7 => Action::ModDlSrc(r.bits(48) as u64),
            8 => Action::ModDlDst(r.bits(48) as u64),
            9 if matches!(proto, Proto::Ip4(_)) => {
                if r.chance(50) {
                    Action::ModNwSrc(r.u64() as u32)
                } else {
                    Action::ModNwDst(r.u64() as u32)
                }
            }
            10 if ip => Action::DecTtl,
            11 => Action::PushVlan(if r.chance(50) { 0x8100 } else { 0x88a8 }),
            12 => Action::PopVlan,
            13 => Action::SetTunnel(r.u64()),
            14 if ip => {
                let commit = r.chance(50);
                let exec = if commit {
                    (0..r.below(3))
                        .map(|_| {
                            let f = if r.chance(50) {
                                Field::CtMark
                            } else {
                                Field::CtLabel
                            };
                            let mask = r.mask(f.bits());
                            Action::SetField {
                                field: f,
                                value: r.bits(f.bits()) & mask,
                                mask,
                            }
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Action::Ct(CtAction {
                    commit,
                    force: commit && r.chance(30),
                    zone: if r.chance(50) {
                        CtZoneSrc::Imm(r.u64() as u16)
                    } else {
                        CtZoneSrc::Field(SubField {
                            field: Field::Reg(r.below(16) as u8),
                            ofs: r.below(17) as u8,
                            n_bits: 16,
                        })
                    },
                    table: r.chance(50).then(|| r.below(255) as u8),
                    exec,
                })
            }
            15 => Action::CtClear,
            16 => Action::Note((0..r.below(8)).map(|_| r.u64() as u8).collect()),
            17 => Action::Output(1 + r.below(100) as u32),
            _ => continue,
        };
        return a;
    }
}

fn random_flow(words: &[u64]) -> Flow {
    let mut r = Rng { words, i: 0 };
    let (matches, proto) = random_match(&mut r);
    let table = r.below(255) as u8;
    let mut actions = Vec::new();
    if r.chance(10) {
        for _ in 0..r.below(3) {
            actions.push(Action::Note(
                (0..r.below(4)).map(|_| r.u64() as u8).collect(),
            ));
        }
        let n = 2 + r.below(63) as u8;
        actions.push(Action::Conjunction {
            id: r.u64() as u32,
            clause: 1 + r.below(u64::from(n)) as u8,
            n_clauses: n,
        });
    } else {
        for _ in 0..r.below(6) {
            actions.push(random_action(&mut r, proto));
        }
        if table < 254 && r.chance(30) {
            actions.push(Action::GotoTable(
                table + 1 + r.below(u64::from(254 - table)) as u8,
            ));
        }
    }
    Flow {
        table,
        priority: r.u64() as u16,
        matches,
        actions,
        cookie: if r.chance(50) { r.u64() } else { 0 },
        idle_timeout: if r.chance(30) { r.u64() as u16 } else { 0 },
        hard_timeout: if r.chance(30) { r.u64() as u16 } else { 0 },
        importance: if r.chance(30) { r.u64() as u16 } else { 0 },
        flags: FlowFlags {
            send_flow_rem: r.chance(20),
            check_overlap: r.chance(20),
            reset_counts: r.chance(20),
            no_packet_counts: r.chance(20),
            no_byte_counts: r.chance(20),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn print_then_parse_is_identity(words in prop::collection::vec(any::<u64>(), 200)) {
        let flow = random_flow(&words);
        let ctx = ParseContext::default();
        for names in [None, Some(&ctx.tables)] {
            let text = format_flow(&flow, names);
            let back = parse_flow(&text, &ctx);
            prop_assert!(back.is_ok(), "{text}\n{:?}\n{flow:?}", back.err());
            prop_assert_eq!(back.ok(), Some(flow.clone()), "{}", text);
        }
    }
}

#[test]
#[ignore = "prints sample generated flows; run with --ignored --nocapture"]
fn show_samples() {
    for seed in 1..15u64 {
        let words: Vec<u64> = (0..200u64)
            .map(|i| {
                seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_mul(i + 1)
                    .rotate_left(17)
                    ^ i
            })
            .collect();
        println!("{}", format_flow(&random_flow(&words), None));
    }
}
