//! Packet buffers with headroom, and header rewriting.
//!
//! A [`Packet<B>`] is a window `buf[head..head + len]` over some storage `B`:
//! an owned `Vec<u8>` ([`PacketBuf`], for tests and the slow path) or a
//! borrowed `&mut [u8]` ([`PacketRef`], e.g. an AF_XDP UMEM frame). Bytes in
//! front of the window are *headroom*: pushing a header (an 802.1Q tag, later
//! VXLAN encapsulation) moves `head` back instead of copying the payload, and
//! pulling one moves it forward. The window never leaves the buffer.
//!
//! ## Header rewrites
//!
//! The datapath's `set(...)` actions land here. [`Layout::parse`] finds the
//! L2/L3/L4 offsets of the current bytes (Ethernet, up to two VLAN tags,
//! IPv4 with options, IPv6 with extension headers, ARP, TCP/UDP/SCTP/ICMP)
//! with the wire layer's views and walks ([`crate::wire`]: the same VLAN
//! tag and IPv6 extension header rules as the flow key extractor), and each
//! `set_*` method writes one field, at the wire layer's named offsets, and
//! fixes every checksum that covers it:
//!
//! - IPv4 header checksum: incremental update (RFC 1624, eqn. 3).
//! - TCP/UDP (and ICMPv6) checksums over the IPv4/IPv6 pseudo-header when an
//!   address changes, and over the port words when a port changes. A UDP
//!   checksum of 0 means "none" and stays 0; a computed 0 becomes 0xffff.
//! - SCTP's CRC32c is recomputed over the whole SCTP packet (it is not
//!   incremental).
//!
//! ## No-panic contract
//!
//! Frames are untrusted. Every access is bounds-checked (the module denies
//! `clippy::indexing_slicing`); a write whose bytes are not all inside the
//! frame (a truncated frame, or a frame of a different protocol) changes
//! nothing and returns a [`WriteError`], which the datapath counts. L4
//! headers of non-first fragments are never touched. If a header is
//! present but its checksum field is cut off, the field is written and the
//! unreachable checksum is left alone.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

pub use crate::checksum::{checksum, checksum_update, ones_sum};
use crate::field::Field;
use crate::wire::arp::{self, ArpPacket};
use crate::wire::ethernet::{self, vlan, EthernetFrame};
use crate::wire::ipv4::{self, Ipv4Packet};
use crate::wire::ipv6::{self, ExtEnd, Ipv6Packet};
use crate::wire::udp::sctp;
use crate::wire::{ethertype, icmp, ip_proto, nd, tcp, udp};

/// Headroom [`PacketBuf::from_frame`] reserves: room for VXLAN-over-IPv4
/// encapsulation (50 bytes) plus two VLAN tags, rounded up.
pub const DEFAULT_HEADROOM: usize = 128;

/// The `vlan_tci` "a tag is present" bit of the flow key (OVS `VLAN_CFI`),
/// which is not written to the wire.
const VLAN_CFI: u16 = crate::extract::VLAN_PRESENT;

/// Why a header write (or push/pull) was skipped. Small and `Copy`: the
/// datapath counts these, it never allocates for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The bytes to write lie (partly) beyond the end of the frame.
    #[error("frame of {len} bytes too short: write needs bytes up to {need}")]
    Truncated { need: usize, len: usize },
    /// The frame does not carry the header the write is for (e.g. setting
    /// `tp_dst` on an ARP frame, or an L4 port of a non-first fragment).
    #[error("frame has no {0} header to write")]
    NoHeader(&'static str),
    /// Not enough headroom (push) or bytes (pull) to move the front by this much.
    #[error("cannot move the frame start by {0} bytes")]
    NoRoom(usize),
    /// The field is not a packet header this module can write.
    #[error("field {0:?} cannot be written into a packet")]
    Unsupported(Field),
}

/// A packet: the window `buf[head..head + len]` over storage `B`.
/// Invariant: `head + len <= buf.len()`.
#[derive(Clone, Debug)]
pub struct Packet<B> {
    buf: B,
    head: usize,
    len: usize,
}

/// An owned packet (tests, slow paths, recirculation copies).
pub type PacketBuf = Packet<Vec<u8>>;

/// A packet over borrowed memory (zero-copy over a ring frame).
pub type PacketRef<'a> = Packet<&'a mut [u8]>;

impl PacketBuf {
    /// Copies `frame` into a new buffer with [`DEFAULT_HEADROOM`] in front.
    pub fn from_frame(frame: &[u8]) -> PacketBuf {
        PacketBuf::with_headroom(frame, DEFAULT_HEADROOM)
    }

    /// Copies `frame` into a new buffer with `headroom` bytes in front.
    pub fn with_headroom(frame: &[u8], headroom: usize) -> PacketBuf {
        let mut buf = Vec::with_capacity(headroom + frame.len());
        buf.resize(headroom, 0);
        buf.extend_from_slice(frame);
        Packet {
            buf,
            head: headroom,
            len: frame.len(),
        }
    }

    /// Replaces the contents with `frame` (with [`DEFAULT_HEADROOM`]),
    /// reusing the allocation when it is big enough.
    pub fn set_frame(&mut self, frame: &[u8]) {
        self.buf.clear();
        self.buf.resize(DEFAULT_HEADROOM, 0);
        self.buf.extend_from_slice(frame);
        self.head = DEFAULT_HEADROOM;
        self.len = frame.len();
    }
}

/// An empty packet with no storage: allocates nothing (so `mem::take` of a
/// scratch buffer on the per-packet path is free). [`PacketBuf::set_frame`]
/// gives it headroom.
impl Default for PacketBuf {
    fn default() -> Self {
        Packet {
            buf: Vec::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<'a> PacketRef<'a> {
    /// A packet over `buf[head..head + len]`; `None` if that is outside `buf`.
    pub fn new(buf: &'a mut [u8], head: usize, len: usize) -> Option<PacketRef<'a>> {
        (head.checked_add(len)? <= buf.len()).then_some(Packet { buf, head, len })
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Packet<B> {
    /// A packet over `buf[head..head + len]`; `None` if that is outside `buf`.
    pub fn from_parts(buf: B, head: usize, len: usize) -> Option<Packet<B>> {
        (head.checked_add(len)? <= buf.as_ref().len()).then_some(Packet { buf, head, len })
    }

    /// The frame bytes.
    #[inline]
    pub fn data(&self) -> &[u8] {
        self.buf
            .as_ref()
            .get(self.head..self.head + self.len)
            .unwrap_or(&[])
    }

    /// The frame bytes, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (h, l) = (self.head, self.len);
        self.buf.as_mut().get_mut(h..h + l).unwrap_or(&mut [])
    }

    /// Frame length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes available in front of the frame.
    #[inline]
    pub fn headroom(&self) -> usize {
        self.head
    }

    /// Offset of the frame in the underlying buffer.
    #[inline]
    pub fn head(&self) -> usize {
        self.head
    }

    /// Gives back the storage.
    pub fn into_inner(self) -> B {
        self.buf
    }

    /// Grows the frame by `n` bytes at the front (into the headroom) and
    /// returns the new front bytes (their content is whatever was there).
    pub fn push_front(&mut self, n: usize) -> Result<&mut [u8], WriteError> {
        if n > self.head {
            return Err(WriteError::NoRoom(n));
        }
        self.head -= n;
        self.len += n;
        let h = self.head;
        Ok(self.buf.as_mut().get_mut(h..h + n).unwrap_or(&mut []))
    }

    /// Removes `n` bytes from the front of the frame.
    pub fn pull_front(&mut self, n: usize) -> Result<(), WriteError> {
        if n > self.len {
            return Err(WriteError::NoRoom(n));
        }
        self.head += n;
        self.len -= n;
        Ok(())
    }

    /// Shortens the frame to `len` bytes (no effect if it is shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Where the headers of the current bytes are.
    pub fn layout(&self) -> Layout {
        Layout::parse(self.data())
    }

    // ---- Ethernet and VLAN -------------------------------------------------

    /// Sets the Ethernet source address.
    pub fn set_eth_src(&mut self, mac: [u8; 6]) -> Result<(), WriteError> {
        self.write_at(ethernet::field::SRC.start, &mac)
    }

    /// Sets the Ethernet destination address.
    pub fn set_eth_dst(&mut self, mac: [u8; 6]) -> Result<(), WriteError> {
        self.write_at(ethernet::field::DST.start, &mac)
    }

    /// Pushes an outermost VLAN tag (`tpid` is 0x8100 or 0x88a8) using 4
    /// bytes of headroom. `tci` is written as given (without the key's
    /// "tag present" bit 0x1000, which is not a wire bit).
    pub fn push_vlan(&mut self, tpid: u16, tci: u16) -> Result<(), WriteError> {
        // The MAC addresses move 4 bytes to the front; the tag goes where
        // the type field was.
        let macs = ethernet::field::ETHERTYPE.start;
        if self.len < macs {
            return Err(WriteError::Truncated {
                need: macs,
                len: self.len,
            });
        }
        self.push_front(vlan::HEADER_LEN)?;
        // In range: the frame now has at least `macs + 4` bytes.
        self.data_mut()
            .copy_within(vlan::HEADER_LEN..vlan::HEADER_LEN + macs, 0);
        let [t0, t1] = tpid.to_be_bytes();
        let [c0, c1] = (tci & !VLAN_CFI).to_be_bytes();
        self.write_at(macs, &[t0, t1, c0, c1])
    }

    /// Removes the outermost VLAN tag.
    pub fn pop_vlan(&mut self) -> Result<(), WriteError> {
        let need = ethernet::HEADER_LEN + vlan::HEADER_LEN;
        let d = self.data();
        if d.len() < need {
            return Err(WriteError::Truncated { need, len: d.len() });
        }
        let tpid = EthernetFrame::new_checked(d).map_or(0, |e| e.ethertype());
        if !ethernet::is_vlan_tpid(tpid) {
            return Err(WriteError::NoHeader("802.1Q"));
        }
        // In range: the frame has at least 18 bytes.
        self.data_mut()
            .copy_within(0..ethernet::field::ETHERTYPE.start, vlan::HEADER_LEN);
        self.pull_front(vlan::HEADER_LEN)
    }

    /// Rewrites the TCI of the outermost VLAN tag in place (bit 0x1000 ignored).
    pub fn set_vlan_tci(&mut self, tci: u16) -> Result<(), WriteError> {
        if self.layout().vlan_tags == 0 {
            return Err(WriteError::NoHeader("802.1Q"));
        }
        self.write_at(
            ethernet::HEADER_LEN + vlan::field::TCI.start,
            &(tci & !VLAN_CFI).to_be_bytes(),
        )
    }

    // ---- ARP ---------------------------------------------------------------

    fn arp_offset(&self) -> Result<usize, WriteError> {
        let l = self.layout();
        match l.l3 {
            Some(off) if l.eth_type == ethertype::ARP => Ok(off),
            _ => Err(WriteError::NoHeader("ARP")),
        }
    }

    /// Sets the ARP opcode.
    pub fn set_arp_op(&mut self, op: u16) -> Result<(), WriteError> {
        let off = self.arp_offset()?;
        self.write_at(off + arp::field::OPER.start, &op.to_be_bytes())
    }

    /// Sets the ARP sender hardware address.
    pub fn set_arp_sha(&mut self, mac: [u8; 6]) -> Result<(), WriteError> {
        let off = self.arp_offset()?;
        self.write_at(off + arp::field::SHA.start, &mac)
    }

    /// Sets the ARP sender protocol address.
    pub fn set_arp_spa(&mut self, ip: u32) -> Result<(), WriteError> {
        let off = self.arp_offset()?;
        self.write_at(off + arp::field::SPA.start, &ip.to_be_bytes())
    }

    /// Sets the ARP target hardware address.
    pub fn set_arp_tha(&mut self, mac: [u8; 6]) -> Result<(), WriteError> {
        let off = self.arp_offset()?;
        self.write_at(off + arp::field::THA.start, &mac)
    }

    /// Sets the ARP target protocol address.
    pub fn set_arp_tpa(&mut self, ip: u32) -> Result<(), WriteError> {
        let off = self.arp_offset()?;
        self.write_at(off + arp::field::TPA.start, &ip.to_be_bytes())
    }

    // ---- IPv4 --------------------------------------------------------------

    fn ipv4_layout(&self) -> Result<(Layout, usize), WriteError> {
        let l = self.layout();
        match l.l3 {
            Some(off) if l.eth_type == ethertype::IPV4 => Ok((l, off)),
            _ => Err(WriteError::NoHeader("IPv4")),
        }
    }

    /// Sets the IPv4 source address (header and L4 pseudo-header checksums).
    pub fn set_ipv4_src(&mut self, ip: u32) -> Result<(), WriteError> {
        let (l, off) = self.ipv4_layout()?;
        self.write_csum(
            off + ipv4::field::SRC.start,
            &ip.to_be_bytes(),
            Some(off + ipv4::field::CHECKSUM.start),
            l.pseudo_csum(),
        )
    }

    /// Sets the IPv4 destination address (header and L4 pseudo-header checksums).
    pub fn set_ipv4_dst(&mut self, ip: u32) -> Result<(), WriteError> {
        let (l, off) = self.ipv4_layout()?;
        self.write_csum(
            off + ipv4::field::DST.start,
            &ip.to_be_bytes(),
            Some(off + ipv4::field::CHECKSUM.start),
            l.pseudo_csum(),
        )
    }

    /// Sets the IPv4 TOS byte (DSCP and ECN).
    pub fn set_ipv4_tos(&mut self, tos: u8) -> Result<(), WriteError> {
        let (_, off) = self.ipv4_layout()?;
        // The checksum covers 16-bit words: TOS shares one with VER_IHL.
        let at = off + ipv4::field::VER_IHL;
        let Some(&[vihl, _]) = self.data().get(at..at + 2) else {
            return Err(WriteError::Truncated {
                need: at + 2,
                len: self.len,
            });
        };
        self.write_csum(
            at,
            &[vihl, tos],
            Some(off + ipv4::field::CHECKSUM.start),
            None,
        )
    }

    /// Sets the IPv4 TTL.
    pub fn set_ipv4_ttl(&mut self, ttl: u8) -> Result<(), WriteError> {
        let (_, off) = self.ipv4_layout()?;
        // TTL shares a 16-bit word with the protocol.
        let at = off + ipv4::field::TTL;
        let Some(&[_, proto]) = self.data().get(at..at + 2) else {
            return Err(WriteError::Truncated {
                need: at + 2,
                len: self.len,
            });
        };
        self.write_csum(
            at,
            &[ttl, proto],
            Some(off + ipv4::field::CHECKSUM.start),
            None,
        )
    }

    // ---- IPv6 --------------------------------------------------------------

    fn ipv6_layout(&self) -> Result<(Layout, usize), WriteError> {
        let l = self.layout();
        match l.l3 {
            Some(off) if l.eth_type == ethertype::IPV6 => Ok((l, off)),
            _ => Err(WriteError::NoHeader("IPv6")),
        }
    }

    /// Sets the IPv6 source address (L4 pseudo-header checksum).
    pub fn set_ipv6_src(&mut self, ip: u128) -> Result<(), WriteError> {
        let (l, off) = self.ipv6_layout()?;
        self.write_csum(
            off + ipv6::field::SRC.start,
            &ip.to_be_bytes(),
            None,
            l.pseudo_csum(),
        )
    }

    /// Sets the IPv6 destination address (L4 pseudo-header checksum).
    pub fn set_ipv6_dst(&mut self, ip: u128) -> Result<(), WriteError> {
        let (l, off) = self.ipv6_layout()?;
        self.write_csum(
            off + ipv6::field::DST.start,
            &ip.to_be_bytes(),
            None,
            l.pseudo_csum(),
        )
    }

    /// Rewrites the bits `mask` of the first IPv6 header word
    /// (version, traffic class, flow label) with those of `bits`.
    fn set_ipv6_word(&mut self, mask: u32, bits: u32) -> Result<(), WriteError> {
        let (_, off) = self.ipv6_layout()?;
        let at = off + ipv6::field::VER_TC_FLOW.start;
        let w = be32(self.data(), at).ok_or(WriteError::Truncated {
            need: at + 4,
            len: self.len,
        })?;
        self.write_at(at, &((w & !mask) | (bits & mask)).to_be_bytes())
    }

    /// Sets the IPv6 traffic class.
    pub fn set_ipv6_tclass(&mut self, tclass: u8) -> Result<(), WriteError> {
        self.set_ipv6_word(0x0ff0_0000, u32::from(tclass) << 20)
    }

    /// Sets the IPv6 flow label (low 20 bits of `label`).
    pub fn set_ipv6_label(&mut self, label: u32) -> Result<(), WriteError> {
        self.set_ipv6_word(ipv6::FLOW_LABEL_MASK, label)
    }

    /// Sets the IPv6 hop limit.
    pub fn set_ipv6_hlimit(&mut self, hlimit: u8) -> Result<(), WriteError> {
        let (_, off) = self.ipv6_layout()?;
        self.write_at(off + ipv6::field::HOP_LIMIT, &[hlimit])
    }

    // ---- L4 ----------------------------------------------------------------

    /// Sets the TCP/UDP/SCTP source port, or the ICMP/ICMPv6 type (low 8 bits).
    pub fn set_tp_src(&mut self, v: u16) -> Result<(), WriteError> {
        self.set_tp(false, v)
    }

    /// Sets the TCP/UDP/SCTP destination port, or the ICMP/ICMPv6 code (low 8 bits).
    pub fn set_tp_dst(&mut self, v: u16) -> Result<(), WriteError> {
        self.set_tp(true, v)
    }

    fn set_tp(&mut self, dst: bool, v: u16) -> Result<(), WriteError> {
        let l = self.layout();
        let Some(l4) = l.l4 else {
            return Err(WriteError::NoHeader("L4"));
        };
        // TCP, UDP and SCTP all start with the two ports.
        let port = l4
            + if dst {
                tcp::field::DST_PORT.start
            } else {
                tcp::field::SRC_PORT.start
            };
        match l.nw_proto {
            ip_proto::TCP | ip_proto::UDP => {
                let csum = l.l4_csum();
                self.write_csum(port, &v.to_be_bytes(), None, csum)
            }
            ip_proto::SCTP => {
                self.write_at(port, &v.to_be_bytes())?;
                let end = l.l3_end.min(self.len);
                let crc_at = l4 + sctp::field::CHECKSUM.start;
                // The CRC covers the whole SCTP packet: recomputed when
                // the packet (at least its common header) is in the frame.
                if end >= l4 + sctp::HEADER_LEN {
                    let d = self.data_mut();
                    if let Some(c) = d.get_mut(crc_at..crc_at + 4) {
                        c.fill(0);
                    }
                    let crc = d.get(l4..end).map_or(0, crc32c);
                    if let Some(c) = d.get_mut(crc_at..crc_at + 4) {
                        c.copy_from_slice(&crc.to_le_bytes());
                    }
                }
                Ok(())
            }
            // ICMP only in IPv4 and ICMPv6 only in IPv6, as the flow key
            // reads them: the other pairing has no type and code to set.
            ip_proto::ICMP | ip_proto::ICMPV6 if l.icmp_in_its_ip_version() => {
                let at = l4
                    + if dst {
                        icmp::field::CODE
                    } else {
                        icmp::field::TYPE
                    };
                let [_, v8] = v.to_be_bytes();
                self.write_csum(
                    at,
                    &[v8],
                    None,
                    Some((l4 + icmp::field::CHECKSUM.start, false)),
                )
            }
            _ => Err(WriteError::NoHeader("TCP/UDP/SCTP/ICMP")),
        }
    }

    // ---- ICMPv6 Neighbour Discovery ----------------------------------------

    /// The ND message's offset and end (`l3_end`): an ICMPv6 message with
    /// at least the 24 bytes up to the end of the target (OVS
    /// `packet_set_nd`/`packet_set_nd_ext` do nothing on shorter ones; like
    /// them, the message type is not checked: the flow's match did that).
    fn nd_layout(&self) -> Result<(usize, usize), WriteError> {
        let l = self.layout();
        match l.l4 {
            Some(at) if l.nw_proto == ip_proto::ICMPV6 && at + nd::MSG_LEN <= l.l3_end => {
                Ok((at, l.l3_end))
            }
            _ => Err(WriteError::NoHeader("ICMPv6 ND")),
        }
    }

    /// Sets the ND target address (incremental ICMPv6 checksum update).
    pub fn set_nd_target(&mut self, target: u128) -> Result<(), WriteError> {
        let (at, _) = self.nd_layout()?;
        self.write_csum(
            at + nd::field::TARGET.start,
            &target.to_be_bytes(),
            None,
            Some((at + icmp::field::CHECKSUM.start, false)),
        )
    }

    /// Sets the address of the message's first Ethernet link-layer option
    /// if that option has type `opt_type` (SLL for `nd_sll`, TLL for
    /// `nd_tll`). As OVS's `packet_set_nd`: no option is ever added, and
    /// an option of the other type is left alone.
    pub fn set_nd_lla(&mut self, opt_type: u8, mac: [u8; 6]) -> Result<(), WriteError> {
        let (at, end) = self.nd_layout()?;
        let opts = at + nd::MSG_LEN;
        let found = self.data().get(opts..end).and_then(nd::first_lla_option);
        match found {
            Some((off, ty)) if ty == opt_type => self.write_csum(
                opts + off + nd::field::OPT_MAC.start,
                &mac,
                None,
                Some((at + icmp::field::CHECKSUM.start, false)),
            ),
            _ => Err(WriteError::NoHeader("ND link-layer option")),
        }
    }

    /// Sets the ND flags word (`nd_reserved`), then recomputes the ICMPv6
    /// checksum in full, as OVS's `packet_set_nd_ext` does.
    pub fn set_nd_reserved(&mut self, reserved: u32) -> Result<(), WriteError> {
        let (at, end) = self.nd_layout()?;
        self.write_at(at + nd::field::RESERVED.start, &reserved.to_be_bytes())?;
        self.recompute_icmpv6_csum(at, end);
        Ok(())
    }

    /// Sets the type byte of the message's first option, whatever it is
    /// (`nd_options_type`; turning a source link-layer option into a target
    /// one is how a solicitation becomes an advertisement), then recomputes
    /// the ICMPv6 checksum, as OVS's `packet_set_nd_ext`. A message without
    /// options is left alone (OVS would write past its end).
    pub fn set_nd_options_type(&mut self, opt_type: u8) -> Result<(), WriteError> {
        let (at, end) = self.nd_layout()?;
        let opt = at + nd::MSG_LEN + nd::field::OPT_TYPE;
        if opt >= end {
            return Err(WriteError::Truncated {
                need: opt + 1,
                len: end,
            });
        }
        self.write_at(opt, &[opt_type])?;
        self.recompute_icmpv6_csum(at, end);
        Ok(())
    }

    /// Recomputes the ICMPv6 checksum of the message `at..end` over the
    /// IPv6 pseudo-header (addresses, upper-layer length, next header 58).
    fn recompute_icmpv6_csum(&mut self, at: usize, end: usize) {
        let Some(l3) = self.layout().l3 else {
            return;
        };
        let csum_at = at + icmp::field::CHECKSUM.start;
        let d = self.data_mut();
        let (Some(addrs), Some(len)) = (
            d.get(l3 + ipv6::field::SRC.start..l3 + ipv6::field::DST.end),
            u32::try_from(end.saturating_sub(at)).ok(),
        ) else {
            return;
        };
        let pseudo = ones_sum(addrs, u64::from(len) + u64::from(ip_proto::ICMPV6));
        if let Some(c) = d.get_mut(csum_at..csum_at + 2) {
            c.fill(0);
        }
        let Some(msg) = d.get(at..end) else {
            return;
        };
        let csum = checksum(msg, pseudo);
        if let Some(c) = d.get_mut(csum_at..csum_at + 2) {
            c.copy_from_slice(&csum.to_be_bytes());
        }
    }

    // ---- by field ----------------------------------------------------------

    /// Writes a header field of the flow key into the packet: the executor of
    /// datapath `set(...)` actions. `NwSrc`/`NwDst`/`NwProto` mean the ARP
    /// SPA/TPA/opcode on ARP frames. `VlanTci` with the 0x1000 "present" bit
    /// rewrites the outer tag or pushes one; without it, pops the outer tag.
    ///
    /// `value` holds the field in its low bits (the key's representation):
    /// the `as` casts below keep exactly the field's width.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "a key field holds no more bits than its width"
    )]
    pub fn set_field(&mut self, field: Field, value: u128) -> Result<(), WriteError> {
        let mac = |v: u128| {
            let [_, _, m0, m1, m2, m3, m4, m5] = (v as u64).to_be_bytes();
            [m0, m1, m2, m3, m4, m5]
        };
        let l = self.layout();
        let arp = l.eth_type == ethertype::ARP;
        let v6 = l.eth_type == ethertype::IPV6;
        match field {
            Field::DlSrc => self.set_eth_src(mac(value)),
            Field::DlDst => self.set_eth_dst(mac(value)),
            Field::VlanTci => {
                let tci = value as u16;
                match (tci & VLAN_CFI != 0, l.vlan_tags > 0) {
                    (true, true) => self.set_vlan_tci(tci),
                    (true, false) => self.push_vlan(ethertype::VLAN, tci),
                    (false, true) => self.pop_vlan(),
                    (false, false) => Ok(()),
                }
            }
            Field::NwSrc if arp => self.set_arp_spa(value as u32),
            Field::NwDst if arp => self.set_arp_tpa(value as u32),
            Field::NwProto if arp => self.set_arp_op(value as u16 & 0xff),
            Field::NwSrc => self.set_ipv4_src(value as u32),
            Field::NwDst => self.set_ipv4_dst(value as u32),
            Field::NwTos if v6 => self.set_ipv6_tclass(value as u8),
            Field::NwTos => self.set_ipv4_tos(value as u8),
            Field::NwTtl if v6 => self.set_ipv6_hlimit(value as u8),
            Field::NwTtl => self.set_ipv4_ttl(value as u8),
            Field::Ipv6Src => self.set_ipv6_src(value),
            Field::Ipv6Dst => self.set_ipv6_dst(value),
            Field::Ipv6Label => self.set_ipv6_label(value as u32),
            Field::TpSrc => self.set_tp_src(value as u16),
            Field::TpDst => self.set_tp_dst(value as u16),
            Field::ArpSha => self.set_arp_sha(mac(value)),
            Field::ArpTha => self.set_arp_tha(mac(value)),
            Field::NdTarget => self.set_nd_target(value),
            Field::NdSll => self.set_nd_lla(nd::OPT_SLL, mac(value)),
            Field::NdTll => self.set_nd_lla(nd::OPT_TLL, mac(value)),
            Field::NdReserved => self.set_nd_reserved(value as u32),
            Field::NdOptionsType => self.set_nd_options_type(value as u8),
            other => Err(WriteError::Unsupported(other)),
        }
    }

    // ---- helpers -----------------------------------------------------------

    fn write_at(&mut self, off: usize, bytes: &[u8]) -> Result<(), WriteError> {
        let len = self.len;
        let need = off + bytes.len();
        match self.data_mut().get_mut(off..need) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(WriteError::Truncated { need, len }),
        }
    }

    /// Writes `new` (at most 16 bytes, even length unless `off` is used for a
    /// single ICMP byte, see below) at `off`, then updates the 16-bit
    /// checksums at `csum1` (plain) and `csum2` (`(offset, is_udp)`) for the
    /// change. A one-byte write is widened to its aligned 16-bit word, which
    /// requires `off` to have the same parity relative to the checksummed
    /// area as in the header definitions used here.
    fn write_csum(
        &mut self,
        off: usize,
        new: &[u8],
        csum1: Option<usize>,
        csum2: Option<(usize, bool)>,
    ) -> Result<(), WriteError> {
        let len = self.len;
        let n = new.len();
        // Widen to a word-aligned (relative to the header start) span.
        let (start, end) = if n % 2 == 1 {
            let s = off & !1;
            (s, s + 2)
        } else {
            (off, off + n)
        };
        let mut old_buf = [0u8; 16];
        let old = self
            .data()
            .get(start..end)
            .and_then(|span| {
                let o = old_buf.get_mut(..span.len())?;
                o.copy_from_slice(span);
                Some(&*o)
            })
            .ok_or(WriteError::Truncated { need: end, len })?;
        self.write_at(off, new)?;
        let mut new_buf = [0u8; 16];
        let w = old.len();
        let newb = new_buf.get_mut(..w).unwrap_or(&mut []);
        newb.copy_from_slice(self.data().get(start..end).unwrap_or(old));
        for (c, udp) in [csum1.map(|c| (c, false)), csum2].into_iter().flatten() {
            let d = self.data_mut();
            let Some(cur) = be16(d, c) else { continue };
            if udp && cur == 0 {
                continue;
            }
            let mut nc = checksum_update(cur, old, newb);
            if udp && nc == 0 {
                nc = 0xffff;
            }
            if let Some(dst) = d.get_mut(c..c + 2) {
                dst.copy_from_slice(&nc.to_be_bytes());
            }
        }
        Ok(())
    }
}

/// Where the headers of a frame are. Offsets are from the frame start; an
/// offset is `Some` only if the fixed part of that header is inside the frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Number of VLAN tags (0..=2; a third tag is treated as the ethertype,
    /// and so is a tag cut short, as in the flow key).
    pub vlan_tags: u8,
    /// The ethertype after the VLAN tags (0 if the frame is shorter than 14 bytes).
    pub eth_type: u16,
    /// Offset of the L3 header (IPv4 with all options, IPv6 fixed header,
    /// or a 28-byte Ethernet/IPv4 ARP body).
    pub l3: Option<usize>,
    /// End of the L3 datagram: the IP total length, clipped to the frame
    /// (excludes Ethernet padding).
    pub l3_end: usize,
    /// IP protocol of the L4 header (after IPv6 extension headers; for an
    /// IPv6 later fragment, its Fragment header's next header; 0 when the
    /// IPv6 extension header chain is truncated or too long).
    pub nw_proto: u8,
    /// Offset of the L4 header; `None` for later fragments, non-IP, and
    /// IPv6 packets whose extension header chain
    /// ([`crate::wire::ipv6::walk_ext`]) is truncated or too long.
    pub l4: Option<usize>,
}

impl Layout {
    /// ICMP in IPv4 or ICMPv6 in IPv6: the pairings whose type and code
    /// the flow key reads (ICMPv6 in IPv4, or ICMP in IPv6, is an L4
    /// protocol the switch does not parse, as in OVS).
    pub fn icmp_in_its_ip_version(&self) -> bool {
        matches!(
            (self.eth_type, self.nw_proto),
            (ethertype::IPV4, ip_proto::ICMP) | (ethertype::IPV6, ip_proto::ICMPV6)
        )
    }

    /// Parses the header offsets of `d`. Never panics.
    pub fn parse(d: &[u8]) -> Layout {
        let mut l = Layout::default();
        let Some(l2) = ethernet::l2_of(d) else {
            return l;
        };
        // At most MAX_VLAN_TAGS (2).
        l.vlan_tags = u8::try_from(l2.tags).unwrap_or(u8::MAX);
        l.eth_type = l2.ethertype;
        let l3 = l2.l3_offset;
        let ip = l2.payload;
        match l2.ethertype {
            ethertype::ARP if ArpPacket::new_checked(ip).is_ok_and(|a| a.is_ethernet_ipv4()) => {
                l.l3 = Some(l3);
                l.l3_end = l3 + arp::HEADER_LEN;
            }
            ethertype::IPV4 => {
                let Ok(p) = Ipv4Packet::new_checked(ip) else {
                    return l;
                };
                let ihl = p.header_len();
                if p.version() != 4 || p.header().is_none() {
                    return l;
                }
                l.l3 = Some(l3);
                let total = usize::from(p.total_len());
                l.l3_end = (l3 + total.max(ihl)).min(d.len());
                l.nw_proto = p.protocol();
                if p.flags_frag() & ipv4::FRAG_OFFSET_MASK == 0 {
                    l.l4 = Some(l3 + ihl);
                }
            }
            ethertype::IPV6 => {
                let Ok(p) = Ipv6Packet::new_checked(ip) else {
                    return l;
                };
                if p.version() != 6 {
                    return l;
                }
                l.l3 = Some(l3);
                l.l3_end = (l3 + ipv6::HEADER_LEN + usize::from(p.payload_len())).min(d.len());
                // The payload as far as the frame holds it.
                let payload = p.payload().unwrap_or(p.rest());
                match ipv6::walk_ext(p.next_header(), payload).end {
                    ExtEnd::Upper {
                        next_header,
                        offset,
                    } => {
                        l.nw_proto = next_header;
                        l.l4 = Some(l3 + ipv6::HEADER_LEN + offset);
                    }
                    ExtEnd::LaterFragment { next_header, .. } => l.nw_proto = next_header,
                    ExtEnd::Truncated { .. } | ExtEnd::TooLong { .. } => {}
                }
            }
            _ => {}
        }
        l
    }

    /// The L4 checksum that covers the IP pseudo-header: `(offset, is_udp)`.
    fn pseudo_csum(&self) -> Option<(usize, bool)> {
        match self.nw_proto {
            ip_proto::ICMPV6 => self.l4.map(|o| (o + icmp::field::CHECKSUM.start, false)),
            ip_proto::ICMP => None,
            _ => self.l4_csum(),
        }
    }

    /// The TCP/UDP checksum location: `(offset, is_udp)`.
    fn l4_csum(&self) -> Option<(usize, bool)> {
        let l4 = self.l4?;
        match self.nw_proto {
            ip_proto::TCP => Some((l4 + tcp::field::CHECKSUM.start, false)),
            ip_proto::UDP => Some((l4 + udp::field::CHECKSUM.start, true)),
            _ => None,
        }
    }
}

fn be16(d: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes(*d.get(off..)?.first_chunk::<2>()?))
}

fn be32(d: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(*d.get(off..)?.first_chunk::<4>()?))
}

#[allow(
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    reason = "const evaluation: an index out of range is a compile error; i < 256"
)]
const CRC32C_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC32c (Castagnoli), as used by SCTP (stored little-endian on the wire).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        let [low, ..] = c.to_le_bytes();
        // A byte indexes the 256-entry table: the fallback is dead code.
        let t = CRC32C_TABLE.get(usize::from(low ^ b)).copied().unwrap_or(0);
        c = t ^ (c >> 8);
    }
    !c
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::wire::{ethertype, ip_proto};

    const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

    #[test]
    fn default_allocates_nothing_and_set_frame_restores_headroom() {
        // The datapath `mem::take`s scratch buffers per recirculated copy.
        let mut p = PacketBuf::default();
        assert!(p.is_empty());
        assert_eq!(p.headroom(), 0);
        p.set_frame(&[1, 2, 3]);
        assert_eq!(p.data(), &[1, 2, 3]);
        assert_eq!(p.headroom(), DEFAULT_HEADROOM);
        assert_eq!(PacketBuf::default().into_inner().capacity(), 0);
    }

    fn eth(ethertype: u16) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&MAC_B);
        f.extend_from_slice(&MAC_A);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    /// An IPv4 frame with `options` bytes of IP options and a valid header
    /// checksum; `l4` is appended as payload and its checksum computed.
    fn ipv4(proto: u8, options: usize, l4: &[u8]) -> Vec<u8> {
        let mut f = eth(ethertype::IPV4);
        let ihl = 20 + options;
        let total = (ihl + l4.len()) as u16;
        let mut ip = vec![0x40 | (ihl / 4) as u8, 0x10];
        ip.extend_from_slice(&total.to_be_bytes());
        ip.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 64, proto, 0, 0]);
        ip.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        ip.extend(std::iter::repeat_n(1u8, options)); // NOP options
        let c = checksum(&ip, 0);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(l4);
        fix_l4(&mut f);
        f
    }

    fn ipv6(proto: u8, ext: &[u8], l4: &[u8]) -> Vec<u8> {
        let mut f = eth(ethertype::IPV6);
        let plen = (ext.len() + l4.len()) as u16;
        f.extend_from_slice(&[0x60, 0x00, 0x00, 0x00]);
        f.extend_from_slice(&plen.to_be_bytes());
        f.push(if ext.is_empty() { proto } else { 0 });
        f.push(64);
        f.extend_from_slice(&0x2001_0db8_0000_0000_0000_0000_0000_0001u128.to_be_bytes());
        f.extend_from_slice(&0x2001_0db8_0000_0000_0000_0000_0000_0002u128.to_be_bytes());
        f.extend_from_slice(ext);
        f.extend_from_slice(l4);
        fix_l4(&mut f);
        f
    }

    fn tcp() -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&1234u16.to_be_bytes());
        t[2..4].copy_from_slice(&80u16.to_be_bytes());
        t[12] = 0x50;
        t.extend_from_slice(b"hello, world");
        t
    }

    fn udp() -> Vec<u8> {
        let mut u = vec![0u8; 8];
        u[0..2].copy_from_slice(&5353u16.to_be_bytes());
        u[2..4].copy_from_slice(&53u16.to_be_bytes());
        u.extend_from_slice(b"query!x"); // odd length
        let n = u.len() as u16;
        u[4..6].copy_from_slice(&n.to_be_bytes());
        u
    }

    /// The checksum a correct L4 header must carry, computed from scratch
    /// (checksum field taken as zero). `None` when the frame has no checksum
    /// to check.
    fn l4_expected(f: &[u8]) -> Option<(usize, u16)> {
        let l = Layout::parse(f);
        let l3 = l.l3?;
        let l4 = l.l4?;
        let seg = &f[l4..l.l3_end];
        let (coff, pseudo) = match l.nw_proto {
            ip_proto::TCP => (16, true),
            ip_proto::UDP => (6, true),
            ip_proto::ICMPV6 => (2, true),
            ip_proto::ICMP => (2, false),
            ip_proto::SCTP => {
                let mut s = seg.to_vec();
                s[8..12].fill(0);
                return Some((l4 + 8, 0)).map(|(o, _)| (o, crc32c(&s) as u16));
            }
            _ => return None,
        };
        let mut s = seg.to_vec();
        s[coff..coff + 2].fill(0);
        let mut init = 0;
        if pseudo {
            if l.eth_type == ethertype::IPV4 {
                init = ones_sum(&f[l3 + 12..l3 + 20], 0);
            } else {
                init = ones_sum(&f[l3 + 8..l3 + 40], 0);
            }
            init += l.nw_proto as u64 + seg.len() as u64;
        }
        let mut c = checksum(&s, init);
        if l.nw_proto == ip_proto::UDP && c == 0 {
            c = 0xffff;
        }
        Some((l4 + coff, c))
    }

    fn fix_l4(f: &mut [u8]) {
        let l = Layout::parse(f);
        if l.nw_proto == ip_proto::SCTP {
            let l4 = l.l4.unwrap();
            let mut s = f[l4..l.l3_end].to_vec();
            s[8..12].fill(0);
            let c = crc32c(&s);
            f[l4 + 8..l4 + 12].copy_from_slice(&c.to_le_bytes());
        } else if let Some((o, c)) = l4_expected(f) {
            f[o..o + 2].copy_from_slice(&c.to_be_bytes());
        }
    }

    /// Asserts every checksum in `f` equals a from-scratch recomputation.
    fn assert_checksums(f: &[u8]) {
        let l = Layout::parse(f);
        if l.eth_type == ethertype::IPV4 {
            let l3 = l.l3.unwrap();
            let ihl = (f[l3] & 0xf) as usize * 4;
            let mut h = f[l3..l3 + ihl].to_vec();
            h[10..12].fill(0);
            assert_eq!(
                be16(f, l3 + 10).unwrap(),
                checksum(&h, 0),
                "IPv4 header checksum"
            );
        }
        if l.nw_proto == ip_proto::SCTP {
            let l4 = l.l4.unwrap();
            let mut s = f[l4..l.l3_end].to_vec();
            s[8..12].fill(0);
            assert_eq!(
                &f[l4 + 8..l4 + 12],
                &crc32c(&s).to_le_bytes(),
                "SCTP CRC32c"
            );
        } else if let Some((o, c)) = l4_expected(f) {
            assert_eq!(be16(f, o).unwrap(), c, "L4 checksum");
        }
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn incremental_matches_full() {
        let mut data =
            *b"\x45\x00\x00\x54\x12\x34\x40\x00\x40\x06\x00\x00\x0a\x00\x00\x01\x0a\x00\x00\x02";
        let c = checksum(&data, 0);
        data[10..12].copy_from_slice(&c.to_be_bytes());
        let new = [192, 168, 7, 9];
        let nc = checksum_update(c, &data[16..20], &new);
        data[16..20].copy_from_slice(&new);
        data[10..12].fill(0);
        assert_eq!(nc, checksum(&data, 0));
    }

    #[test]
    fn layout_finds_headers() {
        let f = ipv4(ip_proto::TCP, 8, &tcp());
        let l = Layout::parse(&f);
        assert_eq!(
            (l.eth_type, l.l3, l.l4, l.nw_proto),
            (0x0800, Some(14), Some(42), 6)
        );
        // Two VLAN tags.
        let mut q = PacketBuf::from_frame(&f);
        q.push_vlan(ethertype::VLAN, 5).unwrap();
        q.push_vlan(ethertype::QINQ, 7).unwrap();
        let l = q.layout();
        assert_eq!((l.vlan_tags, l.l3, l.l4), (2, Some(22), Some(50)));
        // IPv6 with a hop-by-hop header then a destination-options header.
        let mut ext = vec![60, 0, 0, 0, 0, 0, 0, 0];
        ext.extend_from_slice(&[ip_proto::UDP, 1]);
        ext.extend_from_slice(&[0; 14]);
        let f6 = ipv6(ip_proto::UDP, &ext, &udp());
        let l = Layout::parse(&f6);
        assert_eq!(
            (l.l3, l.l4, l.nw_proto),
            (Some(14), Some(54 + 24), ip_proto::UDP)
        );
        // Truncated frames never panic and report what is there.
        for n in 0..f6.len() {
            let _ = Layout::parse(&f6[..n]);
        }
        // Extension headers must lie inside the payload length (the flow
        // key's rule): bytes after it are padding, not headers.
        let mut short = f6.clone();
        short[18..20].copy_from_slice(&20u16.to_be_bytes());
        let l = Layout::parse(&short);
        assert_eq!((l.l3, l.l4, l.nw_proto), (Some(14), None, 0));
        // A tag cut short is not a tag (as in the flow key).
        let cut = [&f[..12], &[0x81, 0x00, 0x00][..]].concat();
        let l = Layout::parse(&cut);
        assert_eq!((l.vlan_tags, l.eth_type, l.l3), (0, ethertype::VLAN, None));
    }

    #[test]
    fn eth_and_vlan() {
        let f = ipv4(ip_proto::TCP, 0, &tcp());
        let mut p = PacketBuf::from_frame(&f);
        p.set_eth_src(MAC_B).unwrap();
        p.set_eth_dst(MAC_A).unwrap();
        assert_eq!(&p.data()[0..6], &MAC_A);
        assert_eq!(&p.data()[6..12], &MAC_B);
        let before = p.headroom();
        p.push_vlan(ethertype::VLAN, 0x1000 | 0x2005).unwrap();
        assert_eq!(p.headroom(), before - 4);
        assert_eq!(&p.data()[12..16], &[0x81, 0x00, 0x20, 0x05]);
        assert_eq!(&p.data()[16..], &f[12..]);
        p.set_vlan_tci(0x1007).unwrap();
        assert_eq!(&p.data()[14..16], &[0x00, 0x07]);
        p.pop_vlan().unwrap();
        assert_eq!(&p.data()[12..], &f[12..]);
        assert_eq!(p.pop_vlan(), Err(WriteError::NoHeader("802.1Q")));
        // set_field(VlanTci) pushes, rewrites and pops.
        p.set_field(Field::VlanTci, 0x1003).unwrap();
        assert_eq!(p.layout().vlan_tags, 1);
        p.set_field(Field::VlanTci, 0).unwrap();
        assert_eq!(
            p.data(),
            &{
                let mut g = f.clone();
                g[0..6].copy_from_slice(&MAC_A);
                g[6..12].copy_from_slice(&MAC_B);
                g
            }[..]
        );
        // No headroom: push fails and changes nothing.
        let mut tight = PacketBuf::with_headroom(&f, 2);
        assert_eq!(
            tight.push_vlan(ethertype::VLAN, 1),
            Err(WriteError::NoRoom(4))
        );
        assert_eq!(tight.data(), &f[..]);
    }

    #[test]
    fn arp_fields() {
        let mut f = eth(ethertype::ARP);
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&MAC_A);
        f.extend_from_slice(&[10, 0, 0, 1]);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&[10, 0, 0, 2]);
        let mut p = PacketBuf::from_frame(&f);
        p.set_field(Field::NwProto, 2).unwrap();
        p.set_field(Field::NwSrc, 0x0a00_0002).unwrap();
        p.set_field(Field::NwDst, 0x0a00_0001).unwrap();
        p.set_field(Field::ArpSha, 0x0200_0000_000b).unwrap();
        p.set_field(Field::ArpTha, 0x0200_0000_000a).unwrap();
        let d = p.data();
        assert_eq!(&d[20..22], &[0, 2]);
        assert_eq!(&d[22..28], &MAC_B);
        assert_eq!(&d[28..32], &[10, 0, 0, 2]);
        assert_eq!(&d[32..38], &MAC_A);
        assert_eq!(&d[38..42], &[10, 0, 0, 1]);
        // ARP fields on an IPv4 frame: refused.
        let mut q = PacketBuf::from_frame(&ipv4(ip_proto::UDP, 0, &udp()));
        assert_eq!(q.set_arp_op(2), Err(WriteError::NoHeader("ARP")));
    }

    #[test]
    fn ipv4_rewrites_keep_checksums() {
        for (proto, l4) in [
            (ip_proto::TCP, tcp()),
            (ip_proto::UDP, udp()),
            (ip_proto::ICMP, vec![8, 0, 0, 0, 0, 1, 0, 1, 0xde, 0xad]),
            (ip_proto::SCTP, {
                let mut s = vec![0u8; 12];
                s[0..2].copy_from_slice(&7u16.to_be_bytes());
                s[2..4].copy_from_slice(&9u16.to_be_bytes());
                s.extend_from_slice(&[0, 0, 0, 16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
                s
            }),
        ] {
            for options in [0, 4, 12] {
                let f = ipv4(proto, options, &l4);
                assert_checksums(&f);
                let mut p = PacketBuf::from_frame(&f);
                let writes: [(Field, u128); 6] = [
                    (Field::NwSrc, 0xc0a8_0101),
                    (Field::NwDst, 0xac10_fe01),
                    (Field::NwTos, 0xb8),
                    (Field::NwTtl, 63),
                    (Field::TpSrc, 40000),
                    (Field::TpDst, 8080),
                ];
                for (field, v) in writes {
                    p.set_field(field, v).unwrap();
                    assert_checksums(p.data());
                }
                let l = p.layout();
                let (l3, l4o) = (l.l3.unwrap(), l.l4.unwrap());
                let d = p.data();
                assert_eq!(&d[l3 + 12..l3 + 20], &[192, 168, 1, 1, 172, 16, 254, 1]);
                assert_eq!((d[l3 + 1], d[l3 + 8]), (0xb8, 63));
                if proto == ip_proto::ICMP {
                    assert_eq!((d[l4o], d[l4o + 1]), (0x40, 0x90));
                } else {
                    assert_eq!(be16(d, l4o), Some(40000));
                    assert_eq!(be16(d, l4o + 2), Some(8080));
                }
            }
        }
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        let mut f = ipv4(ip_proto::UDP, 0, &udp());
        f[14 + 20 + 6..14 + 20 + 8].fill(0);
        let mut p = PacketBuf::from_frame(&f);
        p.set_ipv4_dst(0x0102_0304).unwrap();
        p.set_tp_dst(99).unwrap();
        assert_eq!(be16(p.data(), 40), Some(0));
        let mut h = p.data()[14..34].to_vec();
        h[10..12].fill(0);
        assert_eq!(be16(p.data(), 24), Some(checksum(&h, 0)));
    }

    #[test]
    fn ipv6_rewrites_keep_checksums() {
        let icmp6 = vec![128, 0, 0, 0, 0, 1, 0, 1, 1, 2, 3];
        for (proto, l4) in [
            (ip_proto::TCP, tcp()),
            (ip_proto::UDP, udp()),
            (ip_proto::ICMPV6, icmp6),
        ] {
            for ext in [vec![], {
                let mut e = vec![proto, 0];
                e.extend_from_slice(&[0; 6]);
                e
            }] {
                let f = ipv6(proto, &ext, &l4);
                assert_checksums(&f);
                let mut p = PacketBuf::from_frame(&f);
                let writes: [(Field, u128); 7] = [
                    (Field::Ipv6Src, 0xfd00_0000_0000_0000_0000_0000_0000_00aa),
                    (Field::Ipv6Dst, 0xfd00_0000_0000_0000_0000_0000_0000_00bb),
                    (Field::NwTos, 0x28),
                    (Field::NwTtl, 7),
                    (Field::Ipv6Label, 0xabcde),
                    (Field::TpSrc, 1),
                    (Field::TpDst, 2),
                ];
                for (field, v) in writes {
                    p.set_field(field, v).unwrap();
                    assert_checksums(p.data());
                }
                let d = p.data();
                assert_eq!(be32(d, 14), Some(0x6280_0000 | 0xabcde));
                assert_eq!(d[21], 7);
                assert_eq!(d[22 + 15], 0xaa);
                assert_eq!(d[38 + 15], 0xbb);
            }
        }
    }

    #[test]
    fn icmp_type_is_written_only_in_its_own_ip_version() {
        let echo = [8, 0, 0, 0, 0, 1, 0, 1];
        // ICMP in IPv4 and ICMPv6 in IPv6: the type and code are written.
        for f in [
            ipv4(ip_proto::ICMP, 0, &echo),
            ipv6(ip_proto::ICMPV6, &[], &echo),
        ] {
            let mut p = PacketBuf::from_frame(&f);
            p.set_tp_src(0).unwrap();
            p.set_tp_dst(3).unwrap();
            let at = f.len() - echo.len();
            assert_eq!(&p.data()[at..at + 2], &[0, 3]);
        }
        // The other pairings are protocols the flow key does not parse
        // (as OVS): nothing is written.
        for f in [
            ipv4(ip_proto::ICMPV6, 0, &echo),
            ipv6(ip_proto::ICMP, &[], &echo),
        ] {
            let mut p = PacketBuf::from_frame(&f);
            assert_eq!(
                p.set_tp_src(0),
                Err(WriteError::NoHeader("TCP/UDP/SCTP/ICMP"))
            );
            assert_eq!(p.data(), &f[..]);
        }
    }

    #[test]
    fn later_fragment_has_no_l4() {
        let mut f = ipv4(ip_proto::UDP, 0, &udp());
        f[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 128 bytes
        let c = {
            let mut h = f[14..34].to_vec();
            h[10..12].fill(0);
            checksum(&h, 0)
        };
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let mut p = PacketBuf::from_frame(&f);
        assert_eq!(p.set_tp_dst(1), Err(WriteError::NoHeader("L4")));
        assert_eq!(p.data(), &f[..]);
        p.set_ipv4_src(1).unwrap();
        assert_checksums(p.data());
    }

    #[test]
    fn truncated_writes_are_skipped_not_panics() {
        let f = ipv4(ip_proto::TCP, 0, &tcp());
        let fields: [(Field, u128); 15] = [
            (Field::DlSrc, 1),
            (Field::DlDst, 1),
            (Field::VlanTci, 0x1001),
            (Field::NwSrc, 1),
            (Field::NwDst, 1),
            (Field::NwTos, 1),
            (Field::NwTtl, 1),
            (Field::TpSrc, 1),
            (Field::TpDst, 1),
            (Field::Ipv6Src, 1),
            (Field::Ipv6Label, 1),
            (Field::ArpSha, 1),
            (Field::NwProto, 1),
            (Field::InPort, 1),
            (Field::Ipv6Dst, 1),
        ];
        let mut errors = 0;
        for n in 0..f.len() {
            for (field, v) in fields {
                let mut p = PacketBuf::from_frame(&f[..n]);
                if p.set_field(field, v).is_err() {
                    errors += 1;
                    if field != Field::VlanTci {
                        assert_eq!(
                            p.data(),
                            &f[..n],
                            "{field:?} at {n}: failed write changed bytes"
                        );
                    }
                }
            }
        }
        assert!(errors > 0);
        // tp_dst on a frame cut inside the TCP header: skipped, counted.
        let mut p = PacketBuf::from_frame(&f[..14 + 20 + 3]);
        assert_eq!(
            p.set_tp_dst(1),
            Err(WriteError::Truncated { need: 38, len: 37 })
        );
        // Port written but checksum cut off: written, no panic.
        let mut p = PacketBuf::from_frame(&f[..14 + 20 + 10]);
        p.set_tp_dst(1).unwrap();
    }

    #[test]
    fn packet_ref_over_borrowed_memory() {
        let f = ipv4(ip_proto::UDP, 0, &udp());
        let mut umem = vec![0u8; 256];
        umem[64..64 + f.len()].copy_from_slice(&f);
        assert!(PacketRef::new(&mut umem, 250, 10).is_none());
        let mut p = PacketRef::new(&mut umem, 64, f.len()).unwrap();
        p.push_vlan(ethertype::VLAN, 9).unwrap();
        assert_eq!(p.head(), 60);
        p.set_field(Field::NwTtl, 1).unwrap();
        assert_checksums(p.data());
        assert_eq!(p.pull_front(1000), Err(WriteError::NoRoom(1000)));
    }
}
