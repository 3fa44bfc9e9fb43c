//! Round trips between the flow text parser and printer:
//! `parse(print(parse(text))) == parse(text)` on a hand-written corpus of
//! OVS-style flows, and `parse_flow(format_flow(f)) == f` for random valid flows.

use oxvs_pipeline::parse::{parse_flow, ParseContext};
use oxvs_pipeline::print::format_flow;

/// Hand-written flows in OVS syntax, as operators and the agent write them.
const CORPUS: &[&str] = &[
    "table=0,priority=100,ip,nw_dst=10.0.0.1,actions=output:2",
    "table=1,tcp,tp_dst=80,nw_src=10.0.0.0/24,actions=load:0x1->NXM_NX_REG0[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:10.0.0.2->tun_dst,resubmit(,10),goto_table:10",
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
