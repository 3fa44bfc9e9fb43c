//! The field registry: every field a flow can match or an action can write.
//!
//! A [`Field`] is one slot of the [`FlowKey`](crate::key::FlowKey): a run of
//! bits inside one 64-bit word (or two words for the 128-bit fields). This is
//! the only place where the key's layout is written down; everything else
//! (extraction, matching, masks, set-field, printing) goes through
//! [`Field::slot`].
//!
//! Names follow `ovs-fields(7)`. One field can have several names: the
//! OpenFlow 1.0 style name (`dl_src`), the OXM style name (`eth_src`), the
//! NXM name used in `move`/`load` (`NXM_OF_ETH_SRC`) and, for some, a
//! protocol-specific alias that covers the same key bits (`tcp_dst`,
//! `icmp_type`, `arp_spa`). Aliases that cover only *part* of a field
//! (`dl_vlan`, `ip_dscp`) are [`FieldName`] entries with a bit offset.
//!
//! ## Views
//!
//! Open vSwitch has fields that oxvs keeps inside another key field: the
//! 12-bit `vlan_vid` and `vlan_pcp` (in `vlan_tci`), `ip_dscp` and `nw_ecn`
//! (in `nw_tos`), UDP and SCTP ports (in `tp_src`/`tp_dst`), ARP addresses
//! and opcode, ICMP type and code, the 32-bit `OXM_OF_IN_PORT`. In
//! sub-fields (`move:OXM_OF_VLAN_VID[]->...`) OVS keeps their identity: its
//! width, its prerequisite and the name it prints (the NXM name if there
//! is one, else the OXM name). A *view* (`Field::VlanVid`, `Field::UdpSrc`...,
//! [`Field::is_view`]) is that identity: a [`Slot`] over the same key bits,
//! with its own names. Views are never in [`Field::ALL`]: matches, masks
//! and datapath writes see only the key fields, so a write through a view
//! is a write of the key field's bits. [`lookup_subfield_name`] resolves
//! sub-field names to views; [`lookup_name`] (matches, `set_field`) never does.
//!
//! ## Layout
//!
//! ```text
//! word   bits 63 ............................................. 0
//!  0     in_port (32)                 | recirc_id (32)
//!  1     metadata
//!  2-9   xreg0..xreg7 (reg0..reg15: reg(2i) high, reg(2i+1) low)
//! 10     tun_id
//! 11     tun_src (32)                 | tun_dst (32)
//! 12     pkt_mark (32)                | ct_mark (32)
//! 13     ct_state (32)                | conj_id (32)
//! 14     nd_reserved (32)             | nd_options_type (8) | - (4) | ipv6_label (20)
//! 15     vlan_tci (16) | dl_src (48)
//! 16     dl_type (16)  | dl_dst (48)
//! 17     nw_src (32)                  | nw_dst (32)       } shared: or the high half
//!                                                            of nd_target
//! 18     nd_target, low half
//! 19-20  ipv6_src
//! 21-22  ipv6_dst
//! 23     tp_src (16) | tp_dst (16) | nw_proto | nw_tos | nw_ttl | nw_frag (8 each)
//! 24     ct_zone (16)   | arp_sha (48)  } shared: or nd_sll
//! 25     tcp_flags (16) | arp_tha (48)  } shared: or nd_tll
//! 26-27  ct_label
//! 28-29  tun_ipv6_src
//! 30-31  tun_ipv6_dst
//! ```
//!
//! The 16-bit fields fill the top of the words of the 48-bit Ethernet
//! addresses: that and the shared storage below kept the key at 28 words
//! with the Neighbour Discovery fields, as many as before them. (Giving
//! the ND fields words of their own made it 32: every packet hashes,
//! compares, masks and copies every word, and the 4 more words cost the
//! datapath up to 10% per packet batch.) `dl_type`, in every megaflow
//! mask, shares its word with `dl_dst`, which most pipelines match too. A
//! field moves only here: everything else reads the layout through
//! [`Field::slot`].
//!
//! The IPv6 tunnel addresses (`tun_ipv6_src`, `tun_ipv6_dst`, 256 bits)
//! made it 32. They coexist with every packet field (an IPv6 underlay
//! carries IPv4 and IPv6 pods, ND and ARP) and with all the metadata; the
//! only field a tunnel's IPv6 address never coexists with is the IPv4
//! tunnel address (`tun_src`/`tun_dst`, one word), and sharing that word
//! would still need three more, while [`FlowKey::hash64`](crate::key::FlowKey::hash64)
//! hashes in lanes of four words: 29 to 32 words cost the same. So the
//! IPv4 and IPv6 tunnel addresses are separate fields, as in Open vSwitch's
//! `struct flow_tnl` (`ip_src`/`ip_dst` and `ipv6_src`/`ipv6_dst`), with
//! its rule for a key that has both: the IPv4 destination wins
//! (`flow_tnl_dst()`; [`crate::datapath::TunnelMeta::from_key`]). The
//! cost of the 4 words is measured in `docs/benchmarks.md`.
//!
//! ## Shared storage
//!
//! Some fields share key bits, as in Open vSwitch's `struct flow` (where
//! `arp_sha` is also `nd_sll` and `arp_tha` also `nd_tll`). Two fields may
//! share bits only if no packet ever has both:
//!
//! - `nd_sll` is `arp_sha`, `nd_tll` is `arp_tha` (words 24 and 25, bits
//!   0..48);
//! - the high half of the 128-bit `nd_target` (word 17) is `nw_src` and
//!   `nw_dst` (`arp_spa`/`arp_tpa`); its low half (word 18) is its own.
//!
//! `nw_src`/`nw_dst`/`arp_*` exist only in IPv4 and ARP packets, the ND
//! fields only in IPv6 ones (ICMPv6 types 135/136), so `dl_type` tells
//! which one a key holds ([`Field::owned_by`]):
//!
//! - extraction writes a shared word only for the packet kind that owns it
//!   (ARP/IPv4 their fields, ND messages theirs; otherwise it stays zero);
//! - matching or writing one of these fields needs its prerequisites
//!   (`ip`/`arp`, or `icmp6,icmp_type=135|136`), which pin `dl_type`: a
//!   flow that tests the bits of one never matches a packet of the other,
//!   and a megaflow always has `dl_type` in its mask;
//! - where no prerequisite is checked (group buckets, `fields(...)` of
//!   select groups), translation reads a field the packet does not own as
//!   0 and ignores writes to it, as Open vSwitch does with a field whose
//!   prerequisites the packet lacks; commits and printing (traces, dumped
//!   megaflows, the `Debug` of [`FlowKey`](crate::key::FlowKey)) only use
//!   the fields the packet owns.
//!
//! `nd_options_type` and `nd_reserved` (OVS keeps them in `tcp_flags` and
//! `igmp_group_ip4`) have bits of their own.

use std::fmt::Write as _;

/// Number of 64-bit words in a [`FlowKey`](crate::key::FlowKey). Every
/// packet hashes, compares, masks and copies all of them: a word more is a
/// measurable per-packet cost (see "Layout" in the module doc).
pub const KEY_WORDS: usize = 32;

// Words named because several slots (and the views) use them; see "Layout".
/// `ipv6_label`, `nd_options_type`, `nd_reserved`.
const W_IPV6_SMALL: u8 = 14;
/// `vlan_tci` and `dl_src`.
const W_DL_SRC: u8 = 15;
/// `dl_type` and `dl_dst`.
const W_DL_DST: u8 = 16;
/// `nw_src`/`nw_dst`, or the high half of `nd_target` (the low half is the
/// next word).
const W_NW: u8 = 17;
/// Ports, ICMP type and code, `nw_proto`, `nw_tos`, `nw_ttl`, `nw_frag`.
const W_L4: u8 = 23;
/// `ct_zone`, and `arp_sha` or `nd_sll`.
const W_SHA: u8 = 24;
/// `tcp_flags`, and `arp_tha` or `nd_tll`.
const W_THA: u8 = 25;
/// `tun_ipv6_src` (this word and the next), then `tun_ipv6_dst`.
const W_TUN6: u8 = 28;

/// Where a field lives in the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Index of the word holding the field (for 128-bit fields: the high half;
    /// the low half is `word + 1`).
    pub word: u8,
    /// Bit position of the field's least significant bit inside its word.
    pub shift: u8,
    /// Width in bits (1..=128).
    pub bits: u8,
}

/// How a field's value is written in flow text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueFormat {
    /// Plain decimal (`in_port=1`, `tp_dst=80`, `nw_ttl=64`); masked values
    /// are printed in hex (`tp_dst=0x1000/0xf000`).
    Decimal,
    /// Hexadecimal with `0x` (`reg0=0x5`, `tun_id=0x10`).
    Hex,
    /// Ethernet address `aa:bb:cc:dd:ee:ff`.
    Mac,
    /// Dotted quad, masks as CIDR prefix where contiguous.
    Ipv4,
    /// IPv6 text form, masks as prefix where contiguous.
    Ipv6,
    /// `ct_state` flags: `+trk+est-rel`.
    CtState,
    /// `tcp_flags` flags: `+syn-ack`.
    TcpFlags,
    /// `nw_frag`: `no`, `yes`, `first`, `later`, `not_later`.
    Frag,
}

/// A field of the flow key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// Ingress OpenFlow port.
    InPort,
    /// Recirculation id (internal: 0 for packets that come from a port).
    RecircId,
    /// 64-bit metadata register (`metadata`).
    Metadata,
    /// 32-bit registers `reg0`..`reg15`.
    Reg(u8),
    /// 64-bit register pairs `xreg0`..`xreg7` (`xregN` = `reg(2N)` high, `reg(2N+1)` low).
    Xreg(u8),
    /// Tunnel id (VXLAN VNI on the wire).
    TunId,
    /// Outer IPv4 source of a tunnelled packet.
    TunSrc,
    /// Outer IPv4 destination of a tunnelled packet.
    TunDst,
    /// Outer IPv6 source of a tunnelled packet (`tun_ipv6_src`).
    TunIpv6Src,
    /// Outer IPv6 destination of a tunnelled packet (`tun_ipv6_dst`).
    TunIpv6Dst,
    /// Packet mark (`pkt_mark`).
    PktMark,
    /// Connection tracking mark.
    CtMark,
    /// Connection tracking state bits (see [`ct_state`]).
    CtState,
    /// Conjunction id set by a completed conjunctive match.
    ConjId,
    /// Connection tracking zone.
    CtZone,
    /// 802.1Q tag control information; bit 12 (`0x1000`) means "a tag is present".
    VlanTci,
    /// Ethertype (after any VLAN tag).
    DlType,
    /// TCP flags (12 bits).
    TcpFlags,
    /// Ethernet source.
    DlSrc,
    /// Ethernet destination.
    DlDst,
    /// IPv4 source, or ARP sender protocol address.
    NwSrc,
    /// IPv4 destination, or ARP target protocol address.
    NwDst,
    /// IPv6 source.
    Ipv6Src,
    /// IPv6 destination.
    Ipv6Dst,
    /// L4 source port, or ICMP type.
    TpSrc,
    /// L4 destination port, or ICMP code.
    TpDst,
    /// IP protocol, or the low 8 bits of the ARP opcode.
    NwProto,
    /// IPv4 TOS / IPv6 traffic class (DSCP in the upper 6 bits, ECN in the lower 2).
    NwTos,
    /// IPv4 TTL / IPv6 hop limit.
    NwTtl,
    /// Fragment bits (see [`frag`]).
    NwFrag,
    /// ARP sender hardware address.
    ArpSha,
    /// ARP target hardware address.
    ArpTha,
    /// Connection tracking label (128 bits).
    CtLabel,
    /// IPv6 flow label (20 bits).
    Ipv6Label,
    /// Neighbour Discovery target address (solicitations and advertisements).
    NdTarget,
    /// ND source link-layer address option of a solicitation.
    NdSll,
    /// ND target link-layer address option of an advertisement.
    NdTll,
    /// The 32-bit word after the ICMPv6 checksum of an ND message (the
    /// advertisement's R/S/O flags), OVS's `nd_reserved`.
    NdReserved,
    /// The type of the first link-layer address option of an ND message
    /// (1 = source, 2 = target; 0 = none), OVS's `nd_options_type`.
    NdOptionsType,
    // Views: Open vSwitch fields that are (part of) one of the key fields
    // above under another identity (see "Views" in the module doc). Never
    // in [`Field::ALL`]: matches and datapath writes use the key fields.
    /// `OXM_OF_VLAN_VID`: `vlan_tci` bits 0..11 (12 bits, as OVS's `vlan_vid`).
    VlanVid,
    /// `OXM_OF_VLAN_PCP`: `vlan_tci` bits 13..15.
    VlanPcp,
    /// `OXM_OF_IP_DSCP`: `nw_tos` bits 2..7.
    IpDscp,
    /// `NXM_NX_IP_ECN` / `OXM_OF_IP_ECN`: `nw_tos` bits 0..1.
    IpEcn,
    /// `OXM_OF_IN_PORT`: `in_port` (OpenFlow 1.1+ 32-bit port numbers).
    InPortOxm,
    /// `NXM_OF_UDP_SRC` / `OXM_OF_UDP_SRC`: `tp_src` of UDP.
    UdpSrc,
    /// `NXM_OF_UDP_DST` / `OXM_OF_UDP_DST`: `tp_dst` of UDP.
    UdpDst,
    /// `OXM_OF_SCTP_SRC`: `tp_src` of SCTP.
    SctpSrc,
    /// `OXM_OF_SCTP_DST`: `tp_dst` of SCTP.
    SctpDst,
    /// `NXM_OF_ARP_SPA` / `OXM_OF_ARP_SPA`: `nw_src` of ARP.
    ArpSpa,
    /// `NXM_OF_ARP_TPA` / `OXM_OF_ARP_TPA`: `nw_dst` of ARP.
    ArpTpa,
    /// `NXM_OF_ARP_OP` / `OXM_OF_ARP_OP`: `nw_proto` of ARP (oxvs keeps the
    /// opcode's low 8 bits; OVS's field is 16 bits).
    ArpOp,
    /// `NXM_OF_ICMP_TYPE` / `OXM_OF_ICMPV4_TYPE`: `tp_src` bits 0..7 of ICMP.
    IcmpType,
    /// `NXM_OF_ICMP_CODE` / `OXM_OF_ICMPV4_CODE`: `tp_dst` bits 0..7 of ICMP.
    IcmpCode,
    /// `NXM_NX_ICMPV6_TYPE` / `OXM_OF_ICMPV6_TYPE`.
    Icmpv6Type,
    /// `NXM_NX_ICMPV6_CODE` / `OXM_OF_ICMPV6_CODE`.
    Icmpv6Code,
}

/// Bits of `ct_state`, as in OVS.
pub mod ct_state {
    /// Beginning of a new connection.
    pub const NEW: u32 = 0x01;
    /// Part of an established connection.
    pub const EST: u32 = 0x02;
    /// Related to an existing connection (e.g. an ICMP error).
    pub const REL: u32 = 0x04;
    /// In the reply direction.
    pub const RPL: u32 = 0x08;
    /// Invalid: could not be tracked or does not fit the connection state.
    pub const INV: u32 = 0x10;
    /// Has been through the connection tracker.
    pub const TRK: u32 = 0x20;
    /// Source NAT applied (never set yet: no NAT).
    pub const SNAT: u32 = 0x40;
    /// Destination NAT applied (never set yet: no NAT).
    pub const DNAT: u32 = 0x80;
    /// Flag names in OVS print order.
    pub const NAMES: [(&str, u32); 8] = [
        ("new", NEW),
        ("est", EST),
        ("rel", REL),
        ("rpl", RPL),
        ("inv", INV),
        ("trk", TRK),
        ("snat", SNAT),
        ("dnat", DNAT),
    ];
}

/// Bits of `nw_frag`, as in OVS.
pub mod frag {
    /// The packet is a fragment.
    pub const ANY: u8 = 0x01;
    /// The packet is a fragment with a nonzero offset.
    pub const LATER: u8 = 0x02;
}

/// TCP flag bits and names (OVS order for `tcp_flags=+syn-ack`).
pub mod tcp_flags {
    pub const FIN: u16 = 0x001;
    pub const SYN: u16 = 0x002;
    pub const RST: u16 = 0x004;
    pub const PSH: u16 = 0x008;
    pub const ACK: u16 = 0x010;
    pub const URG: u16 = 0x020;
    pub const ECE: u16 = 0x040;
    pub const CWR: u16 = 0x080;
    pub const NS: u16 = 0x100;
    /// Flag names in OVS print order.
    pub const NAMES: [(&str, u16); 9] = [
        ("fin", FIN),
        ("syn", SYN),
        ("rst", RST),
        ("psh", PSH),
        ("ack", ACK),
        ("urg", URG),
        ("ece", ECE),
        ("cwr", CWR),
        ("ns", NS),
    ];
}

/// Which kind of packet a field needs before it can be matched (OVS "prerequisites").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prereq {
    None,
    /// `dl_type` is IPv4 or IPv6.
    Ip,
    Ipv4,
    Ipv6,
    Arp,
    /// `dl_type` is IPv4/IPv6 and `nw_proto` is TCP.
    Tcp,
    Udp,
    Sctp,
    /// ICMP (IPv4) or ICMPv6.
    Icmp,
    Icmpv6,
    /// `dl_type` is IPv4 or IPv6 and `nw_proto` is TCP, UDP or SCTP.
    L4Ports,
    /// ICMPv6 Neighbour Discovery (OVS `MFP_ND`): ICMPv6 with `icmp_type`
    /// 135 or 136 and `icmp_code` 0 (or not matched).
    Nd,
    /// An ND solicitation (OVS `MFP_ND_SOLICIT`): [`Prereq::Nd`] with type 135.
    NdSolicit,
    /// An ND advertisement (OVS `MFP_ND_ADVERT`): [`Prereq::Nd`] with type 136.
    NdAdvert,
    /// A VLAN tag is present.
    Vlan,
}

impl Field {
    /// All fields, in the order [`crate::print`] prints matches.
    pub const ALL: &'static [Field] = &[
        Field::RecircId,
        Field::ConjId,
        Field::PktMark,
        Field::CtState,
        Field::CtZone,
        Field::CtMark,
        Field::CtLabel,
        Field::TunId,
        Field::TunSrc,
        Field::TunDst,
        Field::TunIpv6Src,
        Field::TunIpv6Dst,
        Field::Metadata,
        Field::Reg(0),
        Field::Reg(1),
        Field::Reg(2),
        Field::Reg(3),
        Field::Reg(4),
        Field::Reg(5),
        Field::Reg(6),
        Field::Reg(7),
        Field::Reg(8),
        Field::Reg(9),
        Field::Reg(10),
        Field::Reg(11),
        Field::Reg(12),
        Field::Reg(13),
        Field::Reg(14),
        Field::Reg(15),
        Field::InPort,
        Field::VlanTci,
        Field::DlSrc,
        Field::DlDst,
        Field::DlType,
        Field::NwSrc,
        Field::NwDst,
        Field::Ipv6Src,
        Field::Ipv6Dst,
        Field::Ipv6Label,
        Field::NwProto,
        Field::NwTos,
        Field::NwTtl,
        Field::NwFrag,
        Field::ArpSha,
        Field::ArpTha,
        // OVS commits `nd_ext` before `nd` and both before `icmpv6`; the
        // datapath writes the fields in this order.
        Field::NdReserved,
        Field::NdOptionsType,
        Field::NdTarget,
        Field::NdSll,
        Field::NdTll,
        Field::TpSrc,
        Field::TpDst,
        Field::TcpFlags,
    ];

    /// Where the field lives in the key. Inlined: every key read and
    /// write of the datapath goes through it, and with the views its match
    /// grew past what the compiler inlines by itself (a call per access
    /// cost the datapath ~18% per packet).
    #[inline(always)]
    pub const fn slot(self) -> Slot {
        const fn s(word: u8, shift: u8, bits: u8) -> Slot {
            Slot { word, shift, bits }
        }
        match self {
            Field::InPort => s(0, 32, 32),
            Field::RecircId => s(0, 0, 32),
            Field::Metadata => s(1, 0, 64),
            // reg(2i) is the high half of word 2+i, reg(2i+1) the low half,
            // so that xreg(i) is exactly word 2+i.
            Field::Reg(n) => s(2 + n / 2, if n % 2 == 0 { 32 } else { 0 }, 32),
            Field::Xreg(n) => s(2 + n, 0, 64),
            Field::TunId => s(10, 0, 64),
            Field::TunSrc => s(11, 32, 32),
            Field::TunDst => s(11, 0, 32),
            Field::PktMark => s(12, 32, 32),
            Field::CtMark => s(12, 0, 32),
            Field::CtState => s(13, 32, 32),
            Field::ConjId => s(13, 0, 32),
            Field::NdReserved => s(W_IPV6_SMALL, 32, 32),
            Field::NdOptionsType => s(W_IPV6_SMALL, 24, 8),
            Field::Ipv6Label => s(W_IPV6_SMALL, 0, 20),
            Field::VlanTci => s(W_DL_SRC, 48, 16),
            Field::DlSrc => s(W_DL_SRC, 0, 48),
            Field::DlType => s(W_DL_DST, 48, 16),
            Field::DlDst => s(W_DL_DST, 0, 48),
            // Shared: IPv4/ARP addresses, or the high half of nd_target.
            Field::NwSrc => s(W_NW, 32, 32),
            Field::NwDst => s(W_NW, 0, 32),
            Field::NdTarget => s(W_NW, 0, 128),
            Field::Ipv6Src => s(W_NW + 2, 0, 128),
            Field::Ipv6Dst => s(W_NW + 4, 0, 128),
            Field::TpSrc => s(W_L4, 48, 16),
            Field::TpDst => s(W_L4, 32, 16),
            Field::NwProto => s(W_L4, 24, 8),
            Field::NwTos => s(W_L4, 16, 8),
            Field::NwTtl => s(W_L4, 8, 8),
            Field::NwFrag => s(W_L4, 0, 8),
            // Shared: ARP hardware addresses, or the ND link-layer options.
            Field::CtZone => s(W_SHA, 48, 16),
            Field::ArpSha | Field::NdSll => s(W_SHA, 0, 48),
            Field::TcpFlags => s(W_THA, 48, 16),
            Field::ArpTha | Field::NdTll => s(W_THA, 0, 48),
            Field::CtLabel => s(W_THA + 1, 0, 128),
            Field::TunIpv6Src => s(W_TUN6, 0, 128),
            Field::TunIpv6Dst => s(W_TUN6 + 2, 0, 128),
            // Views.
            Field::VlanVid => s(W_DL_SRC, 48, 12),
            Field::VlanPcp => s(W_DL_SRC, 61, 3),
            Field::IpDscp => s(W_L4, 18, 6),
            Field::IpEcn => s(W_L4, 16, 2),
            Field::InPortOxm => s(0, 32, 32),
            Field::UdpSrc | Field::SctpSrc => s(W_L4, 48, 16),
            Field::UdpDst | Field::SctpDst => s(W_L4, 32, 16),
            Field::ArpSpa => s(W_NW, 32, 32),
            Field::ArpTpa => s(W_NW, 0, 32),
            Field::ArpOp => s(W_L4, 24, 8),
            Field::IcmpType | Field::Icmpv6Type => s(W_L4, 48, 8),
            Field::IcmpCode | Field::Icmpv6Code => s(W_L4, 32, 8),
        }
    }

    /// Width of the field in bits.
    pub const fn bits(self) -> u32 {
        self.slot().bits as u32
    }

    /// All-ones value of the field's width.
    pub const fn full_mask(self) -> u128 {
        let b = self.bits();
        if b >= 128 {
            u128::MAX
        } else {
            (1u128 << b) - 1
        }
    }

    /// The canonical (printed) name, as `ovs-ofctl dump-flows` prints it.
    pub fn name(self) -> &'static str {
        const REGS: [&str; 16] = [
            "reg0", "reg1", "reg2", "reg3", "reg4", "reg5", "reg6", "reg7", "reg8", "reg9",
            "reg10", "reg11", "reg12", "reg13", "reg14", "reg15",
        ];
        const XREGS: [&str; 8] = [
            "xreg0", "xreg1", "xreg2", "xreg3", "xreg4", "xreg5", "xreg6", "xreg7",
        ];
        match self {
            Field::InPort => "in_port",
            Field::RecircId => "recirc_id",
            Field::Metadata => "metadata",
            Field::Reg(n) => REGS[(n as usize) & 15],
            Field::Xreg(n) => XREGS[(n as usize) & 7],
            Field::TunId => "tun_id",
            Field::TunSrc => "tun_src",
            Field::TunDst => "tun_dst",
            Field::TunIpv6Src => "tun_ipv6_src",
            Field::TunIpv6Dst => "tun_ipv6_dst",
            Field::PktMark => "pkt_mark",
            Field::CtMark => "ct_mark",
            Field::CtState => "ct_state",
            Field::ConjId => "conj_id",
            Field::CtZone => "ct_zone",
            Field::VlanTci => "vlan_tci",
            Field::DlType => "dl_type",
            Field::TcpFlags => "tcp_flags",
            Field::DlSrc => "dl_src",
            Field::DlDst => "dl_dst",
            Field::NwSrc => "nw_src",
            Field::NwDst => "nw_dst",
            Field::Ipv6Src => "ipv6_src",
            Field::Ipv6Dst => "ipv6_dst",
            Field::TpSrc => "tp_src",
            Field::TpDst => "tp_dst",
            Field::NwProto => "nw_proto",
            Field::NwTos => "nw_tos",
            Field::NwTtl => "nw_ttl",
            Field::NwFrag => "nw_frag",
            Field::ArpSha => "arp_sha",
            Field::ArpTha => "arp_tha",
            Field::CtLabel => "ct_label",
            Field::Ipv6Label => "ipv6_label",
            Field::NdTarget => "nd_target",
            Field::NdSll => "nd_sll",
            Field::NdTll => "nd_tll",
            Field::NdReserved => "nd_reserved",
            Field::NdOptionsType => "nd_options_type",
            Field::VlanVid => "vlan_vid",
            Field::VlanPcp => "vlan_pcp",
            Field::IpDscp => "ip_dscp",
            Field::IpEcn => "nw_ecn",
            Field::InPortOxm => "in_port_oxm",
            Field::UdpSrc => "udp_src",
            Field::UdpDst => "udp_dst",
            Field::SctpSrc => "sctp_src",
            Field::SctpDst => "sctp_dst",
            Field::ArpSpa => "arp_spa",
            Field::ArpTpa => "arp_tpa",
            Field::ArpOp => "arp_op",
            Field::IcmpType => "icmp_type",
            Field::IcmpCode => "icmp_code",
            Field::Icmpv6Type => "icmpv6_type",
            Field::Icmpv6Code => "icmpv6_code",
        }
    }

    /// The NXM/OXM name used inside `move`/`load`/`output:...[]` (`NXM_NX_REG1`).
    pub fn nxm_name(self) -> &'static str {
        const REGS: [&str; 16] = [
            "NXM_NX_REG0",
            "NXM_NX_REG1",
            "NXM_NX_REG2",
            "NXM_NX_REG3",
            "NXM_NX_REG4",
            "NXM_NX_REG5",
            "NXM_NX_REG6",
            "NXM_NX_REG7",
            "NXM_NX_REG8",
            "NXM_NX_REG9",
            "NXM_NX_REG10",
            "NXM_NX_REG11",
            "NXM_NX_REG12",
            "NXM_NX_REG13",
            "NXM_NX_REG14",
            "NXM_NX_REG15",
        ];
        const XREGS: [&str; 8] = [
            "OXM_OF_PKT_REG0",
            "OXM_OF_PKT_REG1",
            "OXM_OF_PKT_REG2",
            "OXM_OF_PKT_REG3",
            "OXM_OF_PKT_REG4",
            "OXM_OF_PKT_REG5",
            "OXM_OF_PKT_REG6",
            "OXM_OF_PKT_REG7",
        ];
        match self {
            Field::InPort => "NXM_OF_IN_PORT",
            Field::RecircId => "NXM_NX_RECIRC_ID",
            Field::Metadata => "OXM_OF_METADATA",
            Field::Reg(n) => REGS[(n as usize) & 15],
            Field::Xreg(n) => XREGS[(n as usize) & 7],
            Field::TunId => "NXM_NX_TUN_ID",
            Field::TunSrc => "NXM_NX_TUN_IPV4_SRC",
            Field::TunDst => "NXM_NX_TUN_IPV4_DST",
            Field::TunIpv6Src => "NXM_NX_TUN_IPV6_SRC",
            Field::TunIpv6Dst => "NXM_NX_TUN_IPV6_DST",
            Field::PktMark => "NXM_NX_PKT_MARK",
            Field::CtMark => "NXM_NX_CT_MARK",
            Field::CtState => "NXM_NX_CT_STATE",
            Field::ConjId => "NXM_NX_CONJ_ID",
            Field::CtZone => "NXM_NX_CT_ZONE",
            Field::VlanTci => "NXM_OF_VLAN_TCI",
            Field::DlType => "NXM_OF_ETH_TYPE",
            Field::TcpFlags => "NXM_NX_TCP_FLAGS",
            Field::DlSrc => "NXM_OF_ETH_SRC",
            Field::DlDst => "NXM_OF_ETH_DST",
            Field::NwSrc => "NXM_OF_IP_SRC",
            Field::NwDst => "NXM_OF_IP_DST",
            Field::Ipv6Src => "NXM_NX_IPV6_SRC",
            Field::Ipv6Dst => "NXM_NX_IPV6_DST",
            Field::TpSrc => "NXM_OF_TCP_SRC",
            Field::TpDst => "NXM_OF_TCP_DST",
            Field::NwProto => "NXM_OF_IP_PROTO",
            Field::NwTos => "NXM_OF_IP_TOS",
            Field::NwTtl => "NXM_NX_IP_TTL",
            Field::NwFrag => "NXM_NX_IP_FRAG",
            Field::ArpSha => "NXM_NX_ARP_SHA",
            Field::ArpTha => "NXM_NX_ARP_THA",
            Field::CtLabel => "NXM_NX_CT_LABEL",
            Field::Ipv6Label => "NXM_NX_IPV6_LABEL",
            Field::NdTarget => "NXM_NX_ND_TARGET",
            Field::NdSll => "NXM_NX_ND_SLL",
            Field::NdTll => "NXM_NX_ND_TLL",
            Field::NdReserved => "ERICOXM_OF_ICMPV6_ND_RESERVED",
            Field::NdOptionsType => "ERICOXM_OF_ICMPV6_ND_OPTIONS_TYPE",
            Field::VlanVid => "OXM_OF_VLAN_VID",
            Field::VlanPcp => "OXM_OF_VLAN_PCP",
            Field::IpDscp => "OXM_OF_IP_DSCP",
            Field::IpEcn => "NXM_NX_IP_ECN",
            Field::InPortOxm => "OXM_OF_IN_PORT",
            Field::UdpSrc => "NXM_OF_UDP_SRC",
            Field::UdpDst => "NXM_OF_UDP_DST",
            Field::SctpSrc => "OXM_OF_SCTP_SRC",
            Field::SctpDst => "OXM_OF_SCTP_DST",
            Field::ArpSpa => "NXM_OF_ARP_SPA",
            Field::ArpTpa => "NXM_OF_ARP_TPA",
            Field::ArpOp => "NXM_OF_ARP_OP",
            Field::IcmpType => "NXM_OF_ICMP_TYPE",
            Field::IcmpCode => "NXM_OF_ICMP_CODE",
            Field::Icmpv6Type => "NXM_NX_ICMPV6_TYPE",
            Field::Icmpv6Code => "NXM_NX_ICMPV6_CODE",
        }
    }

    /// How values of this field are written.
    pub fn format(self) -> ValueFormat {
        match self {
            Field::InPort
            | Field::CtZone
            | Field::ConjId
            | Field::TpSrc
            | Field::TpDst
            | Field::NwProto
            | Field::NwTos
            | Field::NwTtl
            | Field::VlanVid
            | Field::VlanPcp
            | Field::IpDscp
            | Field::IpEcn
            | Field::InPortOxm
            | Field::UdpSrc
            | Field::UdpDst
            | Field::SctpSrc
            | Field::SctpDst
            | Field::ArpOp
            | Field::IcmpType
            | Field::IcmpCode
            | Field::Icmpv6Type
            | Field::Icmpv6Code
            | Field::NdReserved
            | Field::NdOptionsType => ValueFormat::Decimal,
            Field::ArpSpa | Field::ArpTpa => ValueFormat::Ipv4,
            Field::DlSrc
            | Field::DlDst
            | Field::ArpSha
            | Field::ArpTha
            | Field::NdSll
            | Field::NdTll => ValueFormat::Mac,
            Field::NwSrc | Field::NwDst | Field::TunSrc | Field::TunDst => ValueFormat::Ipv4,
            Field::Ipv6Src
            | Field::Ipv6Dst
            | Field::NdTarget
            | Field::TunIpv6Src
            | Field::TunIpv6Dst => ValueFormat::Ipv6,
            Field::CtState => ValueFormat::CtState,
            Field::TcpFlags => ValueFormat::TcpFlags,
            Field::NwFrag => ValueFormat::Frag,
            _ => ValueFormat::Hex,
        }
    }

    /// Whether a flow may write this field (`set_field`, `load`, `move` destination).
    pub fn writable(self) -> bool {
        !matches!(
            self,
            Field::RecircId | Field::ConjId | Field::CtState | Field::CtZone | Field::NwFrag
        ) && !matches!(self, Field::CtMark | Field::CtLabel)
    }

    /// The tunnel metadata fields: what a tunnel port decapsulated, or
    /// what an output to one encapsulates with.
    pub const TUNNEL: [Field; 5] = [
        Field::TunId,
        Field::TunSrc,
        Field::TunDst,
        Field::TunIpv6Src,
        Field::TunIpv6Dst,
    ];

    /// Whether the field is tunnel metadata ([`Field::TUNNEL`]).
    #[inline]
    pub const fn is_tunnel(self) -> bool {
        matches!(
            self,
            Field::TunId | Field::TunSrc | Field::TunDst | Field::TunIpv6Src | Field::TunIpv6Dst
        )
    }

    /// Whether the field is part of the packet's headers (as opposed to
    /// metadata such as registers). Writing a header field produces a
    /// datapath `set(...)` action; writing metadata does not.
    pub fn is_header(self) -> bool {
        matches!(
            self,
            Field::VlanTci
                | Field::DlSrc
                | Field::DlDst
                | Field::NwSrc
                | Field::NwDst
                | Field::Ipv6Src
                | Field::Ipv6Dst
                | Field::Ipv6Label
                | Field::TpSrc
                | Field::TpDst
                | Field::NwTos
                | Field::NwTtl
                | Field::ArpSha
                | Field::ArpTha
                | Field::NwProto
                | Field::NdTarget
                | Field::NdSll
                | Field::NdTll
                | Field::NdReserved
                | Field::NdOptionsType
        ) || (self.is_view() && self != Field::InPortOxm)
    }

    /// Whether this is a view: an OVS field identity over (part of) another
    /// key field, used only in sub-fields (`move`, `load`, `output`...).
    pub fn is_view(self) -> bool {
        matches!(
            self,
            Field::VlanVid
                | Field::VlanPcp
                | Field::IpDscp
                | Field::IpEcn
                | Field::InPortOxm
                | Field::UdpSrc
                | Field::UdpDst
                | Field::SctpSrc
                | Field::SctpDst
                | Field::ArpSpa
                | Field::ArpTpa
                | Field::ArpOp
                | Field::IcmpType
                | Field::IcmpCode
                | Field::Icmpv6Type
                | Field::Icmpv6Code
        )
    }

    /// The packet kind this field needs before it can be matched or written.
    /// `NwProto` covers `arp_op` too and so needs only IP-or-ARP; see [`Prereq`].
    pub fn prereq(self) -> Prereq {
        match self {
            Field::Ipv6Src | Field::Ipv6Dst | Field::Ipv6Label => Prereq::Ipv6,
            Field::ArpSha | Field::ArpTha => Prereq::Arp,
            Field::NwTos | Field::NwTtl | Field::NwFrag => Prereq::Ip,
            Field::TpSrc | Field::TpDst => Prereq::L4Ports,
            Field::TcpFlags => Prereq::Tcp,
            Field::VlanPcp => Prereq::Vlan,
            Field::IpDscp | Field::IpEcn => Prereq::Ip,
            Field::UdpSrc | Field::UdpDst => Prereq::Udp,
            Field::SctpSrc | Field::SctpDst => Prereq::Sctp,
            Field::ArpSpa | Field::ArpTpa | Field::ArpOp => Prereq::Arp,
            Field::IcmpType | Field::IcmpCode => Prereq::Icmp,
            Field::Icmpv6Type | Field::Icmpv6Code => Prereq::Icmpv6,
            Field::NdTarget | Field::NdReserved | Field::NdOptionsType => Prereq::Nd,
            Field::NdSll => Prereq::NdSolicit,
            Field::NdTll => Prereq::NdAdvert,
            _ => Prereq::None,
        }
    }
}

impl Field {
    /// Whether the field shares key bits with a field of another packet
    /// kind (module doc, "Shared storage").
    pub const fn shares_storage(self) -> bool {
        matches!(
            self,
            Field::NwSrc
                | Field::NwDst
                | Field::ArpSpa
                | Field::ArpTpa
                | Field::ArpSha
                | Field::ArpTha
                | Field::NdTarget
                | Field::NdSll
                | Field::NdTll
        )
    }

    /// Whether a key whose Ethertype is `dl_type` owns the field's bits.
    /// Of two fields that share bits (module doc, "Shared storage"), every
    /// key owns exactly one: IPv6 keys the ND fields, all others the
    /// IPv4/ARP ones. Every other field is always owned.
    #[inline]
    pub const fn owned_by(self, dl_type: u16) -> bool {
        const IPV6: u16 = 0x86dd;
        match self {
            Field::NdTarget | Field::NdSll | Field::NdTll => dl_type == IPV6,
            Field::NwSrc
            | Field::NwDst
            | Field::ArpSpa
            | Field::ArpTpa
            | Field::ArpSha
            | Field::ArpTha => dl_type != IPV6,
            _ => true,
        }
    }
}

/// A name that flow text may use for (part of) a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldName {
    /// The name as written.
    pub name: &'static str,
    /// The field it refers to.
    pub field: Field,
    /// Offset of the named bits inside the field (e.g. `ip_dscp` = `nw_tos` bits 2..8).
    pub ofs: u8,
    /// Number of named bits.
    pub bits: u8,
    /// Packet kind required to use this name.
    pub prereq: Prereq,
    /// How values written with this name are formatted (e.g. `icmp_type` is decimal).
    pub format: ValueFormat,
}

const fn whole(name: &'static str, field: Field, prereq: Prereq, format: ValueFormat) -> FieldName {
    FieldName {
        name,
        field,
        ofs: 0,
        bits: field.slot().bits,
        prereq,
        format,
    }
}

const fn part(
    name: &'static str,
    field: Field,
    ofs: u8,
    bits: u8,
    prereq: Prereq,
    format: ValueFormat,
) -> FieldName {
    FieldName {
        name,
        field,
        ofs,
        bits,
        prereq,
        format,
    }
}

use Prereq as P;
use ValueFormat as V;

/// Every name accepted in flow text (matches and `set_field`/`load`/`move`),
/// except the registers, which [`lookup_name`] handles by pattern.
pub const NAMES: &[FieldName] = &[
    whole("in_port", Field::InPort, P::None, V::Decimal),
    whole("in_port_oxm", Field::InPort, P::None, V::Decimal),
    whole("recirc_id", Field::RecircId, P::None, V::Hex),
    whole("metadata", Field::Metadata, P::None, V::Hex),
    whole("tun_id", Field::TunId, P::None, V::Hex),
    whole("tunnel_id", Field::TunId, P::None, V::Hex),
    whole("tun_src", Field::TunSrc, P::None, V::Ipv4),
    whole("tun_dst", Field::TunDst, P::None, V::Ipv4),
    whole("tun_ipv6_src", Field::TunIpv6Src, P::None, V::Ipv6),
    whole("tun_ipv6_dst", Field::TunIpv6Dst, P::None, V::Ipv6),
    whole("pkt_mark", Field::PktMark, P::None, V::Hex),
    whole("ct_mark", Field::CtMark, P::None, V::Hex),
    whole("ct_state", Field::CtState, P::None, V::CtState),
    whole("conj_id", Field::ConjId, P::None, V::Decimal),
    whole("ct_zone", Field::CtZone, P::None, V::Decimal),
    whole("ct_label", Field::CtLabel, P::None, V::Hex),
    whole("vlan_tci", Field::VlanTci, P::None, V::Hex),
    part("dl_vlan", Field::VlanTci, 0, 12, P::None, V::Decimal),
    part("vlan_vid", Field::VlanTci, 0, 13, P::None, V::Decimal),
    part("dl_vlan_pcp", Field::VlanTci, 13, 3, P::None, V::Decimal),
    part("vlan_pcp", Field::VlanTci, 13, 3, P::None, V::Decimal),
    whole("dl_type", Field::DlType, P::None, V::Hex),
    whole("eth_type", Field::DlType, P::None, V::Hex),
    whole("dl_src", Field::DlSrc, P::None, V::Mac),
    whole("eth_src", Field::DlSrc, P::None, V::Mac),
    whole("dl_dst", Field::DlDst, P::None, V::Mac),
    whole("eth_dst", Field::DlDst, P::None, V::Mac),
    whole("nw_src", Field::NwSrc, P::Ipv4, V::Ipv4),
    whole("ip_src", Field::NwSrc, P::Ipv4, V::Ipv4),
    whole("nw_dst", Field::NwDst, P::Ipv4, V::Ipv4),
    whole("ip_dst", Field::NwDst, P::Ipv4, V::Ipv4),
    whole("arp_spa", Field::NwSrc, P::Arp, V::Ipv4),
    whole("arp_tpa", Field::NwDst, P::Arp, V::Ipv4),
    part("arp_op", Field::NwProto, 0, 8, P::Arp, V::Decimal),
    whole("arp_sha", Field::ArpSha, P::Arp, V::Mac),
    whole("arp_tha", Field::ArpTha, P::Arp, V::Mac),
    whole("ipv6_src", Field::Ipv6Src, P::Ipv6, V::Ipv6),
    whole("ipv6_dst", Field::Ipv6Dst, P::Ipv6, V::Ipv6),
    whole("ipv6_label", Field::Ipv6Label, P::Ipv6, V::Hex),
    whole("nw_proto", Field::NwProto, P::Ip, V::Decimal),
    whole("ip_proto", Field::NwProto, P::Ip, V::Decimal),
    whole("nw_tos", Field::NwTos, P::Ip, V::Decimal),
    part("ip_dscp", Field::NwTos, 2, 6, P::Ip, V::Decimal),
    part("nw_ecn", Field::NwTos, 0, 2, P::Ip, V::Decimal),
    part("ip_ecn", Field::NwTos, 0, 2, P::Ip, V::Decimal),
    whole("nw_ttl", Field::NwTtl, P::Ip, V::Decimal),
    whole("nw_frag", Field::NwFrag, P::Ip, V::Frag),
    whole("ip_frag", Field::NwFrag, P::Ip, V::Frag),
    whole("tp_src", Field::TpSrc, P::L4Ports, V::Decimal),
    whole("tp_dst", Field::TpDst, P::L4Ports, V::Decimal),
    whole("tcp_src", Field::TpSrc, P::Tcp, V::Decimal),
    whole("tcp_dst", Field::TpDst, P::Tcp, V::Decimal),
    whole("udp_src", Field::TpSrc, P::Udp, V::Decimal),
    whole("udp_dst", Field::TpDst, P::Udp, V::Decimal),
    whole("sctp_src", Field::TpSrc, P::Sctp, V::Decimal),
    whole("sctp_dst", Field::TpDst, P::Sctp, V::Decimal),
    whole("tcp_flags", Field::TcpFlags, P::Tcp, V::TcpFlags),
    part("icmp_type", Field::TpSrc, 0, 8, P::Icmp, V::Decimal),
    part("icmp_code", Field::TpDst, 0, 8, P::Icmp, V::Decimal),
    part("icmpv4_type", Field::TpSrc, 0, 8, P::Icmp, V::Decimal),
    part("icmpv4_code", Field::TpDst, 0, 8, P::Icmp, V::Decimal),
    part("icmpv6_type", Field::TpSrc, 0, 8, P::Icmpv6, V::Decimal),
    part("icmpv6_code", Field::TpDst, 0, 8, P::Icmpv6, V::Decimal),
    whole("nd_target", Field::NdTarget, P::Nd, V::Ipv6),
    whole("nd_sll", Field::NdSll, P::NdSolicit, V::Mac),
    whole("nd_tll", Field::NdTll, P::NdAdvert, V::Mac),
    whole("nd_reserved", Field::NdReserved, P::Nd, V::Decimal),
    whole("nd_options_type", Field::NdOptionsType, P::Nd, V::Decimal),
];

/// Looks up a field name as written in flow text (`reg3`, `xreg1`,
/// `eth_src`, `NXM_NX_REG1`, `NXM_OF_ETH_SRC`, ...). Case matters for the
/// lower-case names and not for the NXM/OXM names, as in OVS.
pub fn lookup_name(name: &str) -> Option<FieldName> {
    if let Some(n) = name.strip_prefix("reg") {
        return reg_index(n, 16).map(|i| whole_dyn(Field::Reg(i)));
    }
    if let Some(n) = name.strip_prefix("xreg") {
        return reg_index(n, 8).map(|i| whole_dyn(Field::Xreg(i)));
    }
    if let Some(f) = NAMES.iter().find(|f| f.name == name) {
        return Some(*f);
    }
    let upper = name.to_ascii_uppercase();
    if let Some(n) = upper.strip_prefix("NXM_NX_REG") {
        return reg_index(n, 16).map(|i| whole_dyn(Field::Reg(i)));
    }
    if let Some(n) = upper.strip_prefix("OXM_OF_PKT_REG") {
        return reg_index(n, 8).map(|i| whole_dyn(Field::Xreg(i)));
    }
    let alias = match upper.as_str() {
        "NXM_OF_IN_PORT" | "OXM_OF_IN_PORT" => Field::InPort,
        "OXM_OF_METADATA" => Field::Metadata,
        "NXM_NX_TUN_ID" | "OXM_OF_TUNNEL_ID" => Field::TunId,
        "NXM_NX_TUN_IPV4_SRC" => Field::TunSrc,
        "NXM_NX_TUN_IPV4_DST" => Field::TunDst,
        "NXM_NX_TUN_IPV6_SRC" => Field::TunIpv6Src,
        "NXM_NX_TUN_IPV6_DST" => Field::TunIpv6Dst,
        "NXM_NX_PKT_MARK" => Field::PktMark,
        "NXM_NX_CT_MARK" => Field::CtMark,
        "NXM_NX_CT_STATE" => Field::CtState,
        "NXM_NX_CT_ZONE" => Field::CtZone,
        "NXM_NX_CT_LABEL" => Field::CtLabel,
        "NXM_OF_VLAN_TCI" => Field::VlanTci,
        "NXM_OF_ETH_TYPE" | "OXM_OF_ETH_TYPE" => Field::DlType,
        "NXM_NX_TCP_FLAGS" | "OXM_OF_TCP_FLAGS" => Field::TcpFlags,
        "NXM_OF_ETH_SRC" | "OXM_OF_ETH_SRC" => Field::DlSrc,
        "NXM_OF_ETH_DST" | "OXM_OF_ETH_DST" => Field::DlDst,
        "NXM_OF_IP_SRC" | "OXM_OF_IPV4_SRC" | "NXM_OF_ARP_SPA" | "OXM_OF_ARP_SPA" => Field::NwSrc,
        "NXM_OF_IP_DST" | "OXM_OF_IPV4_DST" | "NXM_OF_ARP_TPA" | "OXM_OF_ARP_TPA" => Field::NwDst,
        "NXM_NX_IPV6_SRC" | "OXM_OF_IPV6_SRC" => Field::Ipv6Src,
        "NXM_NX_IPV6_DST" | "OXM_OF_IPV6_DST" => Field::Ipv6Dst,
        "NXM_NX_IPV6_LABEL" | "OXM_OF_IPV6_FLABEL" => Field::Ipv6Label,
        "NXM_OF_TCP_SRC" | "NXM_OF_UDP_SRC" | "OXM_OF_TCP_SRC" | "OXM_OF_UDP_SRC"
        | "OXM_OF_SCTP_SRC" => Field::TpSrc,
        "NXM_OF_TCP_DST" | "NXM_OF_UDP_DST" | "OXM_OF_TCP_DST" | "OXM_OF_UDP_DST"
        | "OXM_OF_SCTP_DST" => Field::TpDst,
        "NXM_OF_IP_PROTO" | "OXM_OF_IP_PROTO" | "NXM_OF_ARP_OP" | "OXM_OF_ARP_OP" => Field::NwProto,
        "NXM_OF_IP_TOS" => Field::NwTos,
        "NXM_NX_IP_TTL" => Field::NwTtl,
        "NXM_NX_IP_FRAG" => Field::NwFrag,
        "NXM_NX_ARP_SHA" | "OXM_OF_ARP_SHA" => Field::ArpSha,
        "NXM_NX_ARP_THA" | "OXM_OF_ARP_THA" => Field::ArpTha,
        "NXM_NX_CONJ_ID" => Field::ConjId,
        "NXM_NX_RECIRC_ID" => Field::RecircId,
        "NXM_NX_ND_TARGET" | "OXM_OF_IPV6_ND_TARGET" => Field::NdTarget,
        "NXM_NX_ND_SLL" | "OXM_OF_IPV6_ND_SLL" => Field::NdSll,
        "NXM_NX_ND_TLL" | "OXM_OF_IPV6_ND_TLL" => Field::NdTll,
        "ERICOXM_OF_ICMPV6_ND_RESERVED" => Field::NdReserved,
        "ERICOXM_OF_ICMPV6_ND_OPTIONS_TYPE" => Field::NdOptionsType,
        _ => return None,
    };
    Some(whole_dyn(alias))
}

/// The names a sub-field (`move`, `load`, `output:F[]`, `ct(zone=F[])`)
/// may use for a field whose Open vSwitch identity differs from the key
/// field's, with the prerequisite OVS gives that identity: OVS prints a
/// sub-field by its NXM name if it has one and by its OXM name otherwise
/// (`OXM_OF_UDP_SRC[]` prints as `NXM_OF_UDP_SRC[]`, `OXM_OF_VLAN_VID[]` as
/// itself), which [`Field::nxm_name`] of the field given here does.
/// NXM/OXM names are matched case-insensitively, the others exactly.
#[rustfmt::skip]
const SUBFIELD_NAMES: &[(&[&str], Field, Prereq)] = &[
    (&["OXM_OF_VLAN_VID", "vlan_vid"], Field::VlanVid, P::None),
    (&["OXM_OF_VLAN_PCP", "vlan_pcp"], Field::VlanPcp, P::Vlan),
    (&["OXM_OF_IP_DSCP", "ip_dscp"], Field::IpDscp, P::Ip),
    (&["NXM_NX_IP_ECN", "OXM_OF_IP_ECN", "nw_ecn", "ip_ecn"], Field::IpEcn, P::Ip),
    (&["OXM_OF_IN_PORT", "in_port_oxm"], Field::InPortOxm, P::None),
    (&["NXM_OF_TCP_SRC", "OXM_OF_TCP_SRC", "tcp_src"], Field::TpSrc, P::Tcp),
    (&["NXM_OF_TCP_DST", "OXM_OF_TCP_DST", "tcp_dst"], Field::TpDst, P::Tcp),
    (&["NXM_OF_UDP_SRC", "OXM_OF_UDP_SRC", "udp_src"], Field::UdpSrc, P::Udp),
    (&["NXM_OF_UDP_DST", "OXM_OF_UDP_DST", "udp_dst"], Field::UdpDst, P::Udp),
    (&["OXM_OF_SCTP_SRC", "sctp_src"], Field::SctpSrc, P::Sctp),
    (&["OXM_OF_SCTP_DST", "sctp_dst"], Field::SctpDst, P::Sctp),
    (&["NXM_OF_ARP_SPA", "OXM_OF_ARP_SPA", "arp_spa"], Field::ArpSpa, P::Arp),
    (&["NXM_OF_ARP_TPA", "OXM_OF_ARP_TPA", "arp_tpa"], Field::ArpTpa, P::Arp),
    (&["NXM_OF_ARP_OP", "OXM_OF_ARP_OP", "arp_op"], Field::ArpOp, P::Arp),
    (&["NXM_OF_ICMP_TYPE", "OXM_OF_ICMPV4_TYPE", "icmp_type", "icmpv4_type"], Field::IcmpType, P::Icmp),
    (&["NXM_OF_ICMP_CODE", "OXM_OF_ICMPV4_CODE", "icmp_code", "icmpv4_code"], Field::IcmpCode, P::Icmp),
    (&["NXM_NX_ICMPV6_TYPE", "OXM_OF_ICMPV6_TYPE", "icmpv6_type"], Field::Icmpv6Type, P::Icmpv6),
    (&["NXM_NX_ICMPV6_CODE", "OXM_OF_ICMPV6_CODE", "icmpv6_code"], Field::Icmpv6Code, P::Icmpv6),
];

/// Looks up a field name as a sub-field writes it (`NXM_NX_REG1`,
/// `OXM_OF_VLAN_VID`, `NXM_OF_UDP_SRC`, `reg1`, `eth_src`...): the OVS
/// identities of `SUBFIELD_NAMES` first (so widths, prerequisites and
/// the printed name are OVS's), then every name [`lookup_name`] knows.
pub fn lookup_subfield_name(name: &str) -> Option<FieldName> {
    let nxm = is_nxm_name(name);
    let hit = SUBFIELD_NAMES.iter().find(|(names, _, _)| {
        names.iter().any(|n| {
            if nxm {
                n.eq_ignore_ascii_case(name)
            } else {
                *n == name
            }
        })
    });
    if let Some(&(_, field, prereq)) = hit {
        return Some(FieldName {
            prereq,
            ..whole_dyn(field)
        });
    }
    lookup_name(name)
}

/// Whether a name is an NXM/OXM name (`NXM_NX_REG0`, `OXM_OF_VLAN_VID`),
/// which OVS takes only in sub-fields, never as a `set_field` destination.
pub fn is_nxm_name(name: &str) -> bool {
    name.get(..4)
        .is_some_and(|p| p.eq_ignore_ascii_case("nxm_") || p.eq_ignore_ascii_case("oxm_"))
        || name
            .get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("ericoxm_"))
}

fn whole_dyn(field: Field) -> FieldName {
    FieldName {
        name: field.name(),
        field,
        ofs: 0,
        bits: field.slot().bits,
        prereq: field.prereq(),
        format: field.format(),
    }
}

fn reg_index(digits: &str, limit: u8) -> Option<u8> {
    if digits.is_empty() || digits.len() > 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() == 2 && digits.starts_with('0') {
        return None;
    }
    let n: u8 = digits.parse().ok()?;
    (n < limit).then_some(n)
}

/// Formats a field value (no mask) the way flow text writes it.
pub fn format_value(format: ValueFormat, value: u128) -> String {
    let mut s = String::new();
    write_value(&mut s, format, value);
    s
}

/// Appends a field value (no mask) to `out` the way flow text writes it.
pub fn write_value(out: &mut String, format: ValueFormat, value: u128) {
    match format {
        ValueFormat::Decimal => {
            let _ = write!(out, "{value}");
        }
        ValueFormat::Hex => {
            let _ = write!(out, "{value:#x}");
        }
        ValueFormat::Mac => {
            let b = (value as u64).to_be_bytes();
            let _ = write!(
                out,
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                b[2], b[3], b[4], b[5], b[6], b[7]
            );
        }
        ValueFormat::Ipv4 => {
            let _ = write!(out, "{}", std::net::Ipv4Addr::from(value as u32));
        }
        ValueFormat::Ipv6 => {
            let _ = write!(out, "{}", std::net::Ipv6Addr::from(value));
        }
        ValueFormat::CtState => write_flags(
            out,
            &ct_state::NAMES.map(|(n, b)| (n, b as u128)),
            value,
            u128::MAX,
        ),
        ValueFormat::TcpFlags => write_flags(
            out,
            &tcp_flags::NAMES.map(|(n, b)| (n, b as u128)),
            value,
            u128::MAX,
        ),
        ValueFormat::Frag => {
            let _ = write!(out, "{}", frag_name(value as u8, 0xff).unwrap_or("?"));
        }
    }
}

/// Writes flags as `+a+b-c`: set bits with `+`, bits in `mask` that are
/// clear with `-`. Unnamed bits are printed as a hex remainder.
pub fn write_flags(out: &mut String, names: &[(&str, u128)], value: u128, mask: u128) {
    let mut known = 0u128;
    for (name, bit) in names {
        known |= bit;
        if mask & bit == 0 {
            continue;
        }
        out.push(if value & bit != 0 { '+' } else { '-' });
        out.push_str(name);
    }
    let rest = value & !known;
    if rest != 0 {
        let _ = write!(out, "+{rest:#x}");
    }
}

/// The `nw_frag` keyword for a value/mask pair, if it is one OVS names.
pub fn frag_name(value: u8, mask: u8) -> Option<&'static str> {
    let any = frag::ANY;
    let later = frag::LATER;
    match (value & (any | later), mask & (any | later)) {
        (0, m) if m == any || m == any | later => Some("no"),
        (v, m) if v == any && m == any => Some("yes"),
        (v, m) if v == any && m == any | later => Some("first"),
        (v, m) if v == any | later && m == any | later => Some("later"),
        (0, m) if m == later => Some("not_later"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key bits of a field, word by word.
    fn bits_of(f: Field) -> [u64; KEY_WORDS] {
        let mut k = crate::key::FlowKey::ZERO;
        k.mask_field(f);
        k.w
    }

    /// Fields that share key bits on purpose (module doc, "Shared
    /// storage"): the IPv4/ARP field first, the ND field second.
    const SHARED: [(Field, Field); 4] = [
        (Field::NwSrc, Field::NdTarget),
        (Field::NwDst, Field::NdTarget),
        (Field::ArpSha, Field::NdSll),
        (Field::ArpTha, Field::NdTll),
    ];

    #[test]
    fn slots_do_not_overlap_except_shared_storage() {
        for (i, a) in Field::ALL.iter().enumerate() {
            let s = a.slot();
            assert!(s.bits > 64 || s.shift as u32 + s.bits as u32 <= 64, "{a:?}");
            let words = if s.bits > 64 { 2 } else { 1 };
            assert!(s.word as usize + words <= KEY_WORDS, "{a:?}");
            for b in &Field::ALL[i + 1..] {
                let overlap = bits_of(*a).iter().zip(bits_of(*b)).any(|(x, y)| x & y != 0);
                let shared = SHARED.contains(&(*a, *b)) || SHARED.contains(&(*b, *a));
                assert_eq!(overlap, shared, "{a:?} and {b:?}");
            }
        }
    }

    #[test]
    fn shared_storage_has_exactly_one_owner() {
        // Every key owns exactly one field of each shared pair, whatever
        // its Ethertype, and the owners are the packet kinds the fields'
        // prerequisites name.
        for dl_type in [0x0800u16, 0x0806, 0x8035, 0x86dd, 0x88cc, 0x05ff, 0] {
            for (v4, nd) in SHARED {
                assert_ne!(v4.owned_by(dl_type), nd.owned_by(dl_type), "{dl_type:#x}");
            }
        }
        for (v4, nd) in SHARED {
            assert!(v4.shares_storage() && nd.shares_storage());
            assert!(v4.owned_by(0x0800) && v4.owned_by(0x0806));
            assert!(nd.owned_by(0x86dd));
            assert!(matches!(
                nd.prereq(),
                Prereq::Nd | Prereq::NdSolicit | Prereq::NdAdvert
            ));
        }
        for f in Field::ALL {
            let shared = SHARED.iter().any(|(a, b)| a == f || b == f);
            assert_eq!(f.shares_storage(), shared, "{f:?}");
        }
        // The views over shared bits follow their key field.
        for (view, of) in [(Field::ArpSpa, Field::NwSrc), (Field::ArpTpa, Field::NwDst)] {
            assert_eq!(view.slot(), of.slot());
            assert!(view.shares_storage());
            for dl_type in [0x0800u16, 0x0806, 0x86dd] {
                assert_eq!(view.owned_by(dl_type), of.owned_by(dl_type));
            }
        }
    }

    #[test]
    fn views_are_inside_their_key_field() {
        for (view, of) in [
            (Field::VlanVid, Field::VlanTci),
            (Field::VlanPcp, Field::VlanTci),
            (Field::IpDscp, Field::NwTos),
            (Field::IpEcn, Field::NwTos),
            (Field::InPortOxm, Field::InPort),
            (Field::UdpSrc, Field::TpSrc),
            (Field::UdpDst, Field::TpDst),
            (Field::SctpSrc, Field::TpSrc),
            (Field::SctpDst, Field::TpDst),
            (Field::ArpSpa, Field::NwSrc),
            (Field::ArpTpa, Field::NwDst),
            (Field::ArpOp, Field::NwProto),
            (Field::IcmpType, Field::TpSrc),
            (Field::IcmpCode, Field::TpDst),
            (Field::Icmpv6Type, Field::TpSrc),
            (Field::Icmpv6Code, Field::TpDst),
        ] {
            assert!(view.is_view(), "{view:?}");
            let (v, o) = (bits_of(view), bits_of(of));
            assert!(v.iter().any(|w| *w != 0), "{view:?}");
            assert!(
                v.iter().zip(o).all(|(x, y)| x & !y == 0),
                "{view:?} in {of:?}"
            );
        }
    }

    #[test]
    fn xreg_covers_two_regs() {
        assert_eq!(Field::Xreg(0).slot().word, Field::Reg(0).slot().word);
        assert_eq!(Field::Reg(0).slot().shift, 32);
        assert_eq!(Field::Reg(1).slot().shift, 0);
    }

    #[test]
    fn names_resolve() {
        assert_eq!(lookup_name("reg15").unwrap().field, Field::Reg(15));
        assert!(lookup_name("reg16").is_none());
        assert!(lookup_name("reg01").is_none());
        assert_eq!(lookup_name("NXM_NX_REG1").unwrap().field, Field::Reg(1));
        assert_eq!(lookup_name("eth_src").unwrap().field, Field::DlSrc);
        assert_eq!(lookup_name("ip_dscp").unwrap().ofs, 2);
        assert!(lookup_name("bogus").is_none());
    }

    #[test]
    fn value_formats() {
        assert_eq!(
            format_value(ValueFormat::Mac, 0x0a0b0c0d0e0f),
            "0a:0b:0c:0d:0e:0f"
        );
        assert_eq!(format_value(ValueFormat::Ipv4, 0x0a000001), "10.0.0.1");
        let mut s = String::new();
        write_flags(
            &mut s,
            &ct_state::NAMES.map(|(n, b)| (n, b as u128)),
            0x22,
            0x26,
        );
        assert_eq!(s, "+est-rel+trk");
    }
}
