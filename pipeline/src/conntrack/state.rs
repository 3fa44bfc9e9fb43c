//! Per-connection state: the connection key (both directions, canonical
//! form), what is kept per connection and per TCP peer, and the
//! per-protocol state machines (TCP window tracking as in OVS's
//! `conntrack-tcp.c`, ICMP, and the generic one for UDP, SCTP and the
//! rest) that move it on each packet.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::packet::TcpSeg;
use super::{CtL4, CtTimeouts, CtTuple, TcpState, NS_PER_SEC};
use crate::field::tcp_flags as tf;
use crate::wire::ip_proto;

/// One direction of a connection. Addresses are 16 bytes (IPv4 as
/// IPv4-mapped IPv6); `stype`/`dtype` are the ICMP types of this direction
/// and of the reverse one (zero for other protocols). Byte arrays keep the
/// alignment at 2, so the key is 42 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ConnKey {
    pub(super) src: [u8; 16],
    pub(super) dst: [u8; 16],
    pub(super) sport: u16,
    pub(super) dport: u16,
    pub(super) zone: u16,
    pub(super) v6: bool,
    pub(super) proto: u8,
    pub(super) stype: u8,
    pub(super) dtype: u8,
}

impl ConnKey {
    pub(super) fn reverse(&self) -> ConnKey {
        ConnKey {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            stype: self.dtype,
            dtype: self.stype,
            ..*self
        }
    }

    /// The same key for both directions: the smaller of the key and its
    /// reverse, comparing the (address, port, type) endpoints.
    pub(super) fn canonical(&self) -> ConnKey {
        if (self.src, self.sport, self.stype) <= (self.dst, self.dport, self.dtype) {
            *self
        } else {
            self.reverse()
        }
    }

    pub(super) fn tuple(&self) -> CtTuple {
        let addr = |a: [u8; 16]| -> IpAddr {
            if self.v6 {
                IpAddr::V6(Ipv6Addr::from(a))
            } else {
                IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
            }
        };
        let l4 = if self.proto == ip_proto::ICMP || self.proto == ip_proto::ICMPV6 {
            CtL4::Icmp {
                id: self.sport,
                icmp_type: self.stype,
                code: 0,
            }
        } else {
            CtL4::Ports {
                src: self.sport,
                dst: self.dport,
            }
        };
        CtTuple {
            src: addr(self.src),
            dst: addr(self.dst),
            l4,
        }
    }
}

pub(super) const WS_FLAG: u8 = 0x80;
pub(super) const WS_UNKNOWN: u8 = 0x40;
pub(super) const WS_MASK: u8 = 0x0f;
pub(super) const TCP_MAX_WSCALE: u8 = 14;
/// How far an ack may lag or lead: a maximal unscaled window plus slack.
pub(super) const MAX_ACK_WINDOW: i64 = 0xffff + 1500;

/// One side of a TCP connection (see the module doc).
#[derive(Clone, Copy, Debug)]
pub(super) struct TcpPeer {
    /// Highest sequence number sent (end of its data).
    pub(super) seqlo: u32,
    /// Highest sequence number it may send (other side's ack + window).
    pub(super) seqhi: u32,
    /// Largest window advertised, in units of `1 << wscale`.
    pub(super) max_win: u32,
    /// Window scale: `WS_FLAG | shift` if negotiated, `WS_UNKNOWN` if the
    /// connection was picked up mid-stream.
    pub(super) wscale: u8,
    pub(super) state: TcpState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OtherState {
    First,
    Multiple,
    Bidir,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IcmpState {
    First,
    Reply,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum L4State {
    /// Index 0: original direction, 1: reply direction.
    Tcp([TcpPeer; 2]),
    Other(OtherState),
    Icmp(IcmpState),
}

/// A stored connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Conn {
    /// Original-direction key (the reply key is its reverse).
    pub(super) orig: ConnKey,
    pub(super) mark: u32,
    pub(super) expiration_ns: u64,
    pub(super) label: u128,
    pub(super) l4: L4State,
    /// The OpenFlow port whose packet committed it ([`NO_OWNER`]: none),
    /// charged against that port's limit while it lives.
    pub(super) owner: u32,
    /// Whether `nat` translated it: its reply-direction key is then in
    /// the tracker's `nat_revs`, not `orig.reverse()`.
    pub(super) nat: bool,
}

impl Conn {
    /// Whether the connection is "assured" (Linux's `IPS_ASSURED`): it has
    /// seen traffic both ways (TCP: both sides reached ESTABLISHED). Only
    /// connections that are not may be dropped early.
    pub(super) fn assured(&self) -> bool {
        match self.l4 {
            L4State::Other(s) => s == OtherState::Bidir,
            L4State::Icmp(s) => s == IcmpState::Reply,
            L4State::Tcp([o, r]) => {
                o.state >= TcpState::Established && r.state >= TcpState::Established
            }
        }
    }

    /// Whether its tuples may be taken by a new connection, as the TCP
    /// stacks at both ends already reuse the ports: a TCP connection
    /// closed on both sides (`FIN_WAIT_2` or later; the rule by which a
    /// new SYN replaces it), as Linux's NAT lets a new connection evict a
    /// `TIME_WAIT` one whose reply tuple it needs.
    pub(super) fn closed(&self) -> bool {
        match self.l4 {
            L4State::Tcp([o, r]) => o.state >= TcpState::FinWait2 && r.state >= TcpState::FinWait2,
            _ => false,
        }
    }

    /// Whether it may go when the table is nearly full: not assured, or a
    /// TCP connection that is closing (Linux's `gc_worker_can_early_drop`).
    pub(super) fn reclaimable(&self) -> bool {
        match self.l4 {
            L4State::Tcp([o, r]) => !self.assured() || o.state.max(r.state) > TcpState::Established,
            _ => !self.assured(),
        }
    }
}

/// The stored owner of a connection charged to no port ([`CtEntry::owner`]
/// is `None`): restored from a version-1 state file, or its port was
/// deleted.
pub const NO_OWNER: u32 = u32::MAX;

/// Which timeout applies (OVS `CT_TM_*`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Tm {
    TcpFirstPacket,
    TcpOpening,
    TcpEstablished,
    TcpClosing,
    TcpFinWait,
    TcpClosed,
    OtherFirst,
    OtherMultiple,
    OtherBidir,
    IcmpFirst,
    IcmpReply,
}

impl CtTimeouts {
    pub(super) fn secs(&self, tm: Tm) -> u32 {
        match tm {
            Tm::TcpFirstPacket => self.tcp_syn_sent,
            Tm::TcpOpening => self.tcp_syn_recv,
            Tm::TcpEstablished => self.tcp_established,
            Tm::TcpClosing => self.tcp_fin_wait,
            Tm::TcpFinWait => self.tcp_time_wait,
            Tm::TcpClosed => self.tcp_close,
            Tm::OtherFirst => self.udp_first,
            Tm::OtherMultiple => self.udp_single,
            Tm::OtherBidir => self.udp_multiple,
            Tm::IcmpFirst => self.icmp_first,
            Tm::IcmpReply => self.icmp_reply,
        }
    }

    pub(super) fn deadline(&self, tm: Tm, now_ns: u64) -> u64 {
        now_ns.saturating_add(u64::from(self.secs(tm)) * NS_PER_SEC)
    }
}

/// Result of updating a connection with a packet (OVS `ct_update_res`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Update {
    /// Fits the connection, which has seen both directions: `+est`.
    Valid,
    /// Fits, but the connection has not seen a reply yet: `+new`.
    ValidNew,
    /// Does not fit: `+inv`.
    Invalid,
    /// Starts a new connection on a closed tuple: delete and start over.
    New,
}

pub(super) fn seq_diff(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

pub(super) fn seq_geq(a: u32, b: u32) -> bool {
    seq_diff(a, b) >= 0
}

pub(super) fn seq_gt(a: u32, b: u32) -> bool {
    seq_diff(a, b) > 0
}

/// Flag combinations no TCP stack sends.
pub(super) fn tcp_flags_invalid(flags: u16) -> bool {
    let has = |f: u16| flags & f != 0;
    if has(tf::SYN) {
        if has(tf::RST) || has(tf::FIN) {
            return true;
        }
    } else if !has(tf::ACK) && !has(tf::RST) {
        return true;
    }
    !has(tf::ACK) && (has(tf::FIN) || has(tf::PSH) || has(tf::URG))
}

pub(super) fn tcp_new(seg: &TcpSeg) -> [TcpPeer; 2] {
    let mut src = TcpPeer {
        seqlo: seg.seq,
        seqhi: 0,
        max_win: 0,
        wscale: 0,
        state: TcpState::SynSent,
    };
    let mut dst = TcpPeer {
        seqlo: 0,
        seqhi: 1,
        max_win: 1,
        wscale: 0,
        state: TcpState::Closed,
    };
    src.seqhi = seg.seq.wrapping_add(seg.payload).wrapping_add(1);
    if seg.flags & tf::SYN != 0 {
        src.seqhi = src.seqhi.wrapping_add(1);
        src.wscale = seg.wscale;
    } else {
        src.wscale = WS_UNKNOWN;
        dst.wscale = WS_UNKNOWN;
        // Picked up mid-stream: the other side is unknown until it is
        // seen. Its position is what this segment acks, and both
        // directions get a maximal window meanwhile, so that this side
        // may go on sending (and retransmitting) while the other is
        // silent, e.g. while a policy drops its packets.
        if seg.flags & tf::ACK != 0 {
            dst.seqlo = seg.ack;
        }
        dst.max_win = u32::from(u16::MAX);
        src.seqhi = src
            .seqhi
            .wrapping_add(u32::from(u16::MAX) << TCP_MAX_WSCALE);
    }
    src.max_win = u32::from(seg.win).max(1);
    let sws = src.wscale & WS_MASK;
    if sws != 0 {
        src.max_win = src.max_win.div_ceil(1 << sws);
    }
    if seg.flags & tf::FIN != 0 {
        src.seqhi = src.seqhi.wrapping_add(1);
    }
    [src, dst]
}

/// Runs a segment through the connection's TCP state; returns the result and
/// the timeout to apply (if the expiration moves).
pub(super) fn tcp_update(
    peers: &mut [TcpPeer; 2],
    seg: &TcpSeg,
    reply: bool,
    seq_check: bool,
) -> (Update, Option<Tm>) {
    use TcpState as S;
    let flags = seg.flags;
    let has = |f: u16| flags & f != 0;
    if tcp_flags_invalid(flags) {
        return (Update::Invalid, None);
    }
    let [p0, p1] = peers;
    let (src, dst) = if reply { (p1, p0) } else { (p0, p1) };

    if flags & (tf::SYN | tf::ACK) == tf::SYN {
        if src.state >= S::FinWait2 && dst.state >= S::FinWait2 {
            src.state = S::Closed;
            dst.state = S::Closed;
            return (Update::New, None);
        }
        if src.state <= S::SynSent {
            src.state = S::SynSent;
            return (Update::ValidNew, Some(Tm::TcpFirstPacket));
        }
    }

    let syn = has(tf::SYN);
    let (mut sws, mut dws) = (0u32, 0u32);
    // How far an ack may run ahead of the data seen from the other side.
    let mut ack_lead = MAX_ACK_WINDOW;
    if !syn {
        if src.wscale & WS_FLAG != 0 && dst.wscale & WS_FLAG != 0 {
            sws = u32::from(src.wscale & WS_MASK);
            dws = u32::from(dst.wscale & WS_MASK);
        } else if src.wscale & WS_UNKNOWN != 0 && dst.wscale & WS_UNKNOWN != 0 {
            sws = u32::from(TCP_MAX_WSCALE);
            dws = u32::from(TCP_MAX_WSCALE);
            // Picked up mid-stream: the other side may have sent up to a
            // (maximally scaled) window of data before the pickup, which
            // this side acks but the tracker never saw.
            ack_lead = MAX_ACK_WINDOW << dws;
        }
    }

    let mut win = u32::from(seg.win);
    let orig_seq = seg.seq;
    let mut seq = seg.seq;
    let mut ack = seg.ack;
    let mut end = seq.wrapping_add(seg.payload);
    let mut check_ackskew = true;
    if syn {
        end = end.wrapping_add(1);
    }
    if has(tf::FIN) {
        end = end.wrapping_add(1);
    }
    if src.state < S::SynSent {
        // First packet from this side (normally the SYN-ACK).
        if syn && dst.wscale & WS_FLAG != 0 {
            src.wscale = seg.wscale;
            if src.wscale & WS_FLAG != 0 {
                sws = u32::from(src.wscale & WS_MASK);
                win = win.div_ceil(1 << sws);
                dws = u32::from(dst.wscale & WS_MASK);
            } else {
                // The other side offered scaling but this side did not: no
                // scaling at all, so the other side's window is unscaled.
                dst.max_win <<= dst.wscale & WS_MASK;
                dst.wscale = 0;
            }
        }
        src.seqlo = seq;
        src.state = S::SynSent;
        let reach = end.wrapping_add((dst.max_win << dws).max(1));
        if src.seqhi == 1 || seq_geq(reach, src.seqhi) {
            src.seqhi = reach;
            check_ackskew = false;
        }
        if win > src.max_win {
            src.max_win = win;
        }
    }

    if !has(tf::ACK) || (ack == 0 && has(tf::RST)) {
        // No ack to check (or a stack that sends RST|ACK with ack 0).
        ack = dst.seqlo;
    }
    if seq == end {
        // No data: only the ack matters.
        seq = src.seqlo;
        end = seq;
    }
    let ackskew = if check_ackskew {
        i64::from(seq_diff(dst.seqlo, ack))
    } else {
        0
    };
    let rst_ok = !has(tf::RST)
        || orig_seq == src.seqlo
        || orig_seq == src.seqlo.wrapping_add(1)
        || orig_seq.wrapping_add(1) == src.seqlo;
    let in_window = seq_geq(src.seqhi, end)
        && seq_geq(seq, src.seqlo.wrapping_sub(dst.max_win << dws))
        && ackskew >= -ack_lead
        && ackskew <= MAX_ACK_WINDOW << sws
        && rst_ok;

    let slide = |src: &mut TcpPeer, dst: &mut TcpPeer| {
        if src.max_win < win {
            src.max_win = win;
        }
        if seq_gt(end, src.seqlo) {
            src.seqlo = end;
        }
        let w = win << sws;
        if seq_geq(ack.wrapping_add(w), dst.seqhi) {
            dst.seqhi = ack.wrapping_add(w.max(1));
        }
    };

    if in_window || !seq_check {
        slide(src, dst);
        if has(tf::FIN) && src.state < S::Closing {
            src.state = S::Closing;
        }
        if has(tf::ACK) {
            if dst.state == S::SynSent {
                dst.state = S::Established;
            } else if dst.state == S::Closing {
                dst.state = S::FinWait2;
            }
        }
        if has(tf::RST) {
            src.state = S::TimeWait;
            dst.state = S::TimeWait;
        }
        let tm = if src.state >= S::FinWait2 && dst.state >= S::FinWait2 {
            Tm::TcpClosed
        } else if src.state >= S::Closing && dst.state >= S::Closing {
            Tm::TcpFinWait
        } else if src.state < S::Established || dst.state < S::Established {
            Tm::TcpOpening
        } else if src.state >= S::Closing || dst.state >= S::Closing {
            Tm::TcpClosing
        } else {
            Tm::TcpEstablished
        };
        return (Update::Valid, Some(tm));
    }
    // Looser acceptance while the other side has not answered yet (SYNs
    // shotgunned before the peer replies) or after the close (stray FINs and
    // ACKs): within a maximal window of what this side sent. The expiration
    // does not move, so a flood of these cannot keep a connection alive.
    if (dst.state < S::SynSent || dst.state >= S::FinWait2 || src.state >= S::FinWait2)
        && seq_geq(src.seqhi.wrapping_add(MAX_ACK_WINDOW as u32), end)
        && seq_geq(seq, src.seqlo.wrapping_sub(MAX_ACK_WINDOW as u32))
    {
        slide(src, dst);
        if has(tf::FIN) && src.state < S::Closing {
            src.state = S::Closing;
        }
        if has(tf::RST) {
            src.state = S::TimeWait;
            dst.state = S::TimeWait;
        }
        return (Update::Valid, None);
    }
    (Update::Invalid, None)
}

pub(super) fn other_update(st: &mut OtherState, reply: bool) -> (Update, Tm) {
    if reply {
        *st = OtherState::Bidir;
    } else if *st == OtherState::First {
        *st = OtherState::Multiple;
    }
    match st {
        OtherState::Bidir => (Update::Valid, Tm::OtherBidir),
        OtherState::Multiple => (Update::ValidNew, Tm::OtherMultiple),
        OtherState::First => (Update::ValidNew, Tm::OtherFirst),
    }
}

pub(super) fn icmp_update(st: &mut IcmpState, reply: bool) -> (Update, Tm) {
    if reply {
        *st = IcmpState::Reply;
    }
    match st {
        IcmpState::Reply => (Update::Valid, Tm::IcmpReply),
        IcmpState::First => (Update::ValidNew, Tm::IcmpFirst),
    }
}
