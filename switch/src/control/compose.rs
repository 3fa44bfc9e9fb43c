//! Building a real frame from a packet spec's flow key, for `trace --inject`
//! (what OVS's `flow_compose` does for `ofproto/trace ... -generate`).
//!
//! Covers what a spec usually describes: Ethernet (with an optional 802.1Q
//! tag), ARP, IPv4 and IPv6 carrying TCP, UDP, ICMP/ICMPv6 (header only,
//! no payload) or nothing. Checksums are correct; a TTL/hop limit of 0 in
//! the key (a spec that does not name it) becomes 64, so the packet can
//! actually travel. Anything else is an error asking for the packet in hex.
//! Pure function of the key; never panics.

use oxvs_pipeline::checksum::ones_sum;
use oxvs_pipeline::extract::VLAN_PRESENT;
use oxvs_pipeline::wire::{ethertype, icmp, ip_proto, tcp, udp};
use oxvs_pipeline::{Field, FlowKey};

/// Shortest Ethernet frame without FCS.
const ETH_MIN: usize = 60;

fn get(k: &FlowKey, f: Field) -> u128 {
    k.get(f)
}

fn be_bytes<const N: usize>(v: u128) -> [u8; N] {
    let all = v.to_be_bytes();
    let mut out = [0u8; N];
    out.copy_from_slice(all.get(16 - N..).unwrap_or(&[0u8; N][..]));
    out
}

/// The frame `key` describes (see the module doc).
pub fn frame_from_key(key: &FlowKey) -> Result<Vec<u8>, String> {
    let dl_type = get(key, Field::DlType) as u16;
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&be_bytes::<6>(get(key, Field::DlDst)));
    f.extend_from_slice(&be_bytes::<6>(get(key, Field::DlSrc)));
    let tci = get(key, Field::VlanTci) as u16;
    if tci & VLAN_PRESENT != 0 {
        f.extend_from_slice(&ethertype::VLAN.to_be_bytes());
        f.extend_from_slice(&(tci & !VLAN_PRESENT).to_be_bytes());
    }
    f.extend_from_slice(&dl_type.to_be_bytes());
    match dl_type {
        ethertype::ARP => {
            f.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
            f.extend_from_slice(&(get(key, Field::NwProto) as u16).to_be_bytes());
            f.extend_from_slice(&be_bytes::<6>(get(key, Field::ArpSha)));
            f.extend_from_slice(&be_bytes::<4>(get(key, Field::NwSrc)));
            f.extend_from_slice(&be_bytes::<6>(get(key, Field::ArpTha)));
            f.extend_from_slice(&be_bytes::<4>(get(key, Field::NwDst)));
        }
        ethertype::IPV4 => {
            let proto = get(key, Field::NwProto) as u8;
            let src = be_bytes::<4>(get(key, Field::NwSrc));
            let dst = be_bytes::<4>(get(key, Field::NwDst));
            let mut l4 = l4_header(key, proto)?;
            let mut pseudo = Vec::with_capacity(12);
            pseudo.extend_from_slice(&src);
            pseudo.extend_from_slice(&dst);
            pseudo.extend_from_slice(&[0, proto]);
            pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            fill_l4_checksum(&mut l4, proto, &pseudo);
            let ttl = match get(key, Field::NwTtl) as u8 {
                0 => 64,
                t => t,
            };
            let total = (20 + l4.len()) as u16;
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[1] = get(key, Field::NwTos) as u8;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[8] = ttl;
            ip[9] = proto;
            ip[12..16].copy_from_slice(&src);
            ip[16..20].copy_from_slice(&dst);
            let sum = checksum(&[&ip]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&ip);
            f.extend_from_slice(&l4);
        }
        ethertype::IPV6 => {
            let proto = get(key, Field::NwProto) as u8;
            let src = be_bytes::<16>(get(key, Field::Ipv6Src));
            let dst = be_bytes::<16>(get(key, Field::Ipv6Dst));
            let mut l4 = l4_header(key, proto)?;
            let mut pseudo = Vec::with_capacity(40);
            pseudo.extend_from_slice(&src);
            pseudo.extend_from_slice(&dst);
            pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, proto]);
            fill_l4_checksum(&mut l4, proto, &pseudo);
            let hlim = match get(key, Field::NwTtl) as u8 {
                0 => 64,
                t => t,
            };
            let tc = get(key, Field::NwTos) as u32;
            let label = get(key, Field::Ipv6Label) as u32 & 0xf_ffff;
            let first = (6u32 << 28) | (tc << 20) | label;
            f.extend_from_slice(&first.to_be_bytes());
            f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
            f.push(proto);
            f.push(hlim);
            f.extend_from_slice(&src);
            f.extend_from_slice(&dst);
            f.extend_from_slice(&l4);
        }
        other => {
            return Err(format!(
                "cannot build a packet of dl_type {other:#06x} from a spec (arp, ip and ipv6 can be); give the packet in hex"
            ))
        }
    }
    if f.len() < ETH_MIN {
        f.resize(ETH_MIN, 0);
    }
    Ok(f)
}

/// The L4 header for `proto` with a zero checksum.
fn l4_header(key: &FlowKey, proto: u8) -> Result<Vec<u8>, String> {
    let sport = get(key, Field::TpSrc) as u16;
    let dport = get(key, Field::TpDst) as u16;
    Ok(match proto {
        ip_proto::TCP => {
            let mut h = vec![0u8; 20];
            h[0..2].copy_from_slice(&sport.to_be_bytes());
            h[2..4].copy_from_slice(&dport.to_be_bytes());
            let flags = get(key, Field::TcpFlags) as u16 & 0x0fff;
            h[12..14].copy_from_slice(&((5u16 << 12) | flags).to_be_bytes());
            h[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
            h
        }
        ip_proto::UDP => {
            let mut h = vec![0u8; 8];
            h[0..2].copy_from_slice(&sport.to_be_bytes());
            h[2..4].copy_from_slice(&dport.to_be_bytes());
            h[4..6].copy_from_slice(&8u16.to_be_bytes());
            h
        }
        // Type and code live in tp_src / tp_dst; id and sequence are 0.
        ip_proto::ICMP | ip_proto::ICMPV6 => vec![sport as u8, dport as u8, 0, 0, 0, 0, 0, 0],
        _ => Vec::new(),
    })
}

/// Writes the L4 checksum (`pseudo`: the pseudo-header; ICMPv4 has none).
fn fill_l4_checksum(l4: &mut [u8], proto: u8, pseudo: &[u8]) {
    let at = match proto {
        ip_proto::TCP => tcp::field::CHECKSUM.start,
        ip_proto::UDP => udp::field::CHECKSUM.start,
        ip_proto::ICMP | ip_proto::ICMPV6 => icmp::field::CHECKSUM.start,
        _ => return,
    };
    let sum = if proto == ip_proto::ICMP {
        checksum(&[l4])
    } else {
        checksum(&[pseudo, l4])
    };
    // UDP sends an all-zero checksum as 0xffff.
    let sum = if proto == ip_proto::UDP && sum == 0 {
        0xffff
    } else {
        sum
    };
    if let Some(slot) = l4.get_mut(at..at + 2) {
        slot.copy_from_slice(&sum.to_be_bytes());
    }
}

/// Internet checksum over the concatenation of `parts` (each of even
/// length except possibly the last).
fn checksum(parts: &[&[u8]]) -> u16 {
    let sum = parts.iter().fold(0, |sum, part| ones_sum(part, sum));
    !oxvs_pipeline::checksum::fold(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::parse::{parse_packet_spec, ParseContext};

    fn key(spec: &str) -> FlowKey {
        parse_packet_spec(spec, &ParseContext::default()).unwrap()
    }

    /// The frame extracts back to the key for every field the spec named.
    fn round_trip(spec: &str, fields: &[Field]) {
        let k = key(spec);
        let frame = frame_from_key(&k).unwrap();
        let in_port = k.get(Field::InPort) as u32;
        let back = oxvs_pipeline::extract::extract(&frame, in_port);
        for f in fields {
            assert_eq!(back.get(*f), k.get(*f), "{spec}: {}", f.name());
        }
    }

    #[test]
    fn specs_become_frames_that_extract_back() {
        use Field::*;
        round_trip(
            "in_port=1,tcp,dl_src=0a:00:00:00:00:01,dl_dst=0a:00:00:00:00:02,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_src=1234,tp_dst=80,tcp_flags=+syn",
            &[InPort, DlSrc, DlDst, DlType, NwSrc, NwDst, NwProto, TpSrc, TpDst, TcpFlags],
        );
        round_trip(
            "in_port=2,udp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_src=53,tp_dst=5353,nw_tos=16",
            &[NwSrc, NwDst, NwProto, TpSrc, TpDst, NwTos],
        );
        round_trip(
            "in_port=2,icmp,nw_src=10.0.0.1,nw_dst=10.0.0.2,icmp_type=8,icmp_code=0",
            &[NwProto, TpSrc, TpDst],
        );
        round_trip(
            "in_port=3,arp,arp_op=1,arp_spa=10.0.0.1,arp_tpa=10.0.0.2,arp_sha=0a:00:00:00:00:01",
            &[DlType, NwProto, NwSrc, NwDst, ArpSha],
        );
        round_trip(
            "in_port=3,tcp6,ipv6_src=fd00::1,ipv6_dst=fd00::2,tp_src=1,tp_dst=2",
            &[DlType, Ipv6Src, Ipv6Dst, NwProto, TpSrc, TpDst],
        );
        round_trip("in_port=1,dl_vlan=7,ip,nw_src=1.2.3.4", &[VlanTci, NwSrc]);
    }

    #[test]
    fn checksums_verify() {
        let frame = frame_from_key(&key("udp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_dst=7")).unwrap();
        // IPv4 header sums to 0xffff including its checksum.
        assert_eq!(checksum(&[&frame[14..34]]), 0);
        assert!(frame.len() >= ETH_MIN);
    }

    #[test]
    fn other_ethertypes_are_refused() {
        let e = frame_from_key(&key("dl_type=0x88cc")).unwrap_err();
        assert!(e.contains("0x88cc"), "{e}");
    }
}
