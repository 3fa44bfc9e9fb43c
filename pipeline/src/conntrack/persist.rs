//! The connection table as bytes: saved when a switch stops, restored when
//! the next one starts, so established connections keep their state (and
//! their `+est`, mark and label) across a restart.
//!
//! Pure like the rest of the crate: the caller gives both clocks (its
//! monotonic `now_ns`, which differs between processes, and the wall
//! clock, which does not) and does the file I/O.
//!
//! # Format, version 3
//!
//! All integers little-endian. A 32-byte header, `count` fixed-size
//! records, an 8-byte trailer:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 8 | magic `OXVS-CT\n` |
//! | 8 | 2 | format version (3) |
//! | 10 | 2 | flags (0) |
//! | 12 | 4 | record length (144) |
//! | 16 | 8 | `count`, the number of records |
//! | 24 | 8 | wall-clock time of the save (ns since the Unix epoch) |
//! | 32 | 144 x count | records |
//! | end - 8 | 8 | FNV-1a 64 of every byte before it |
//!
//! A record is one connection, in its original direction:
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 16 | source address (IPv4 as IPv4-mapped IPv6) |
//! | 16 | 16 | destination address |
//! | 32 | 2+2 | source, destination port (ICMP: the echo id, twice) |
//! | 36 | 2 | zone |
//! | 38 | 1 | 1 for IPv6, 0 for IPv4 |
//! | 39 | 1 | IP protocol |
//! | 40 | 1+1 | ICMP type of this direction and of the reply (else 0) |
//! | 42 | 4 | ct_mark |
//! | 46 | 16 | ct_label |
//! | 62 | 8 | remaining lifetime at the save, in ns |
//! | 70 | 1 | L4 state kind: 0 other (UDP, SCTP, ...), 1 ICMP query, 2 TCP |
//! | 71 | 1 | other: 0 first, 1 multiple, 2 both directions; ICMP: 0 request seen, 1 reply seen; TCP: 0 |
//! | 72 | 14 | TCP original side: seqlo, seqhi, max_win (u32 each), wscale, state (u8 each) |
//! | 86 | 14 | TCP reply side, the same (both sides all zero for other kinds) |
//! | 100 | 4 | the OpenFlow port the connection counts against (`0xffffffff`: none) |
//! | 104 | 1 | 1 if `nat` translated the connection, else 0 |
//! | 105 | 16+16 | NAT: the reply direction's source and destination address |
//! | 137 | 2+2 | NAT: the reply direction's source and destination port |
//! | 141 | 3 | zero (all of 105..144 is zero without NAT) |
//!
//! Version 2 (written before NAT) is the same with 104-byte records, and
//! version 1 (before per-port limits) with 100-byte records, without the
//! owner; both are still read (no NAT; version 1's connections count
//! against no port).
//!
//! # Restore
//!
//! [`Conntrack::restore_state`] checks everything before it trusts
//! anything: the magic, the version, the header, the exact length, the
//! checksum, and every record (address family, ports and ICMP types as
//! [`Conntrack::execute`] would have made them, state kind matching the
//! protocol, TCP states and window-scale values that exist, no two records
//! for the same connection). Any fault rejects the whole file with an error
//! naming it, and the table is left empty. Allocation is bounded by the
//! table's `max_entries` (a file with more records is refused before
//! anything is allocated; [`state_len_limit`] gives the file size a reader
//! should refuse beyond). Lifetimes: each connection's remaining lifetime
//! minus the wall-clock time that passed since the save (a clock that went
//! backwards counts as no time), capped at the longest configured timeout;
//! connections whose lifetime ran out are skipped and counted.
//!
//! Limits: a restored connection counts against its port again, but
//! restoring never refuses a connection for a port's limit (nor drops one
//! early): the table is as it was saved. A port left over its limit (the
//! limit was lowered across the restart) keeps its connections and has new
//! ones refused until enough of them end.

use super::packet::{icmp4_reverse_query, icmp6_reverse_query};
use super::state::{
    Conn, ConnKey, IcmpState, L4State, OtherState, TcpPeer, NO_OWNER, TCP_MAX_WSCALE, WS_FLAG,
    WS_MASK, WS_UNKNOWN,
};
use super::table::Conntrack;
use super::{TcpState, NS_PER_SEC};
use crate::wire::ip_proto;

/// The format version [`Conntrack::save_state`] writes and
/// [`Conntrack::restore_state`] reads.
pub const STATE_VERSION: u16 = 3;

const MAGIC: [u8; 8] = *b"OXVS-CT\n";
const HEADER_LEN: usize = 32;
const RECORD_LEN: usize = 144;
/// Version 2 records: no NAT.
const RECORD_LEN_V2: usize = 104;
/// Version 1 records: no owner.
const RECORD_LEN_V1: usize = 100;
/// Where the TCP peers end (what follows is zero for other kinds).
const L4_END: usize = 100;
const TRAILER_LEN: usize = 8;

/// Why a saved table was refused. Every variant names what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CtStateError {
    #[error("truncated: {len} bytes, a {what} needs {need}")]
    Truncated {
        len: usize,
        need: usize,
        what: &'static str,
    },
    #[error("not a conntrack state file (magic {found:02x?}, want {MAGIC:02x?})")]
    BadMagic { found: [u8; 8] },
    #[error("format version {found}, this switch reads versions 1 to {STATE_VERSION}")]
    UnsupportedVersion { found: u16 },
    #[error("bad header: {0}")]
    BadHeader(String),
    #[error("{count} connections, more than this table holds (max_entries {max})")]
    TooMany { count: u64, max: usize },
    #[error("{extra} bytes after the last record")]
    TrailingBytes { extra: usize },
    #[error(
        "checksum mismatch (stored {stored:#018x}, computed {computed:#018x}): the file is corrupt"
    )]
    Checksum { stored: u64, computed: u64 },
    #[error("record {index}: {what}")]
    BadRecord { index: usize, what: String },
    #[error("the table is not empty ({0} connections): restore only into a new tracker")]
    NotEmpty(usize),
}

/// What [`Conntrack::restore_state`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtRestored {
    /// Connections now in the table.
    pub restored: usize,
    /// Connections in the file whose lifetime ran out while the switch was
    /// down (skipped).
    pub expired: usize,
    /// Wall-clock time between the save and the restore.
    pub downtime_ns: u64,
}

/// The largest state file a table of `max_entries` connections can produce
/// (readers should refuse larger files before reading them).
pub fn state_len_limit(max_entries: usize) -> u64 {
    (HEADER_LEN + TRAILER_LEN) as u64 + (max_entries as u64).saturating_mul(RECORD_LEN as u64)
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn tcp_state_from(v: u8) -> Option<TcpState> {
    use TcpState as S;
    Some(match v {
        0 => S::Closed,
        1 => S::Listen,
        2 => S::SynSent,
        3 => S::SynRecv,
        4 => S::Established,
        5 => S::CloseWait,
        6 => S::FinWait1,
        7 => S::Closing,
        8 => S::LastAck,
        9 => S::FinWait2,
        10 => S::TimeWait,
        _ => return None,
    })
}

fn wscale_ok(ws: u8) -> bool {
    ws == 0 || ws == WS_UNKNOWN || (ws & !WS_MASK == WS_FLAG && ws & WS_MASK <= TCP_MAX_WSCALE)
}

/// A fixed-size record being read; every getter is bounds-checked against
/// the slice (which is exactly [`RECORD_LEN`] bytes).
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn arr<const N: usize>(&self, off: usize) -> [u8; N] {
        let mut a = [0u8; N];
        if let Some(s) = self.0.get(off..off + N) {
            a.copy_from_slice(s);
        }
        a
    }
    fn u8(&self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }
    fn u16(&self, off: usize) -> u16 {
        u16::from_le_bytes(self.arr(off))
    }
    fn u32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.arr(off))
    }
    fn u64(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.arr(off))
    }
    fn u128(&self, off: usize) -> u128 {
        u128::from_le_bytes(self.arr(off))
    }
}

fn encode_peer(out: &mut Vec<u8>, p: &TcpPeer) {
    out.extend_from_slice(&p.seqlo.to_le_bytes());
    out.extend_from_slice(&p.seqhi.to_le_bytes());
    out.extend_from_slice(&p.max_win.to_le_bytes());
    out.push(p.wscale);
    out.push(p.state as u8);
}

fn encode_record(out: &mut Vec<u8>, c: &Conn, rev: Option<&ConnKey>, remaining_ns: u64) {
    let k = &c.orig;
    out.extend_from_slice(&k.src);
    out.extend_from_slice(&k.dst);
    out.extend_from_slice(&k.sport.to_le_bytes());
    out.extend_from_slice(&k.dport.to_le_bytes());
    out.extend_from_slice(&k.zone.to_le_bytes());
    out.push(u8::from(k.v6));
    out.push(k.proto);
    out.push(k.stype);
    out.push(k.dtype);
    out.extend_from_slice(&c.mark.to_le_bytes());
    out.extend_from_slice(&c.label.to_le_bytes());
    out.extend_from_slice(&remaining_ns.to_le_bytes());
    match c.l4 {
        L4State::Other(s) => {
            out.push(0);
            out.push(match s {
                OtherState::First => 0,
                OtherState::Multiple => 1,
                OtherState::Bidir => 2,
            });
            out.extend_from_slice(&[0; 28]);
        }
        L4State::Icmp(s) => {
            out.push(1);
            out.push(match s {
                IcmpState::First => 0,
                IcmpState::Reply => 1,
            });
            out.extend_from_slice(&[0; 28]);
        }
        L4State::Tcp([o, r]) => {
            out.push(2);
            out.push(0);
            encode_peer(out, &o);
            encode_peer(out, &r);
        }
    }
    out.extend_from_slice(&c.owner.to_le_bytes());
    match rev {
        Some(r) => {
            out.push(1);
            out.extend_from_slice(&r.src);
            out.extend_from_slice(&r.dst);
            out.extend_from_slice(&r.sport.to_le_bytes());
            out.extend_from_slice(&r.dport.to_le_bytes());
            out.extend_from_slice(&[0; 3]);
        }
        None => out.extend_from_slice(&[0; RECORD_LEN - RECORD_LEN_V2]),
    }
}

fn decode_peer(r: &Rd<'_>, off: usize, side: &str) -> Result<TcpPeer, String> {
    let wscale = r.u8(off + 12);
    if !wscale_ok(wscale) {
        return Err(format!(
            "TCP {side} side: window scale byte {wscale:#04x} is not valid"
        ));
    }
    let state = r.u8(off + 13);
    let state = tcp_state_from(state)
        .ok_or_else(|| format!("TCP {side} side: state {state} does not exist (0..=10)"))?;
    Ok(TcpPeer {
        seqlo: r.u32(off),
        seqhi: r.u32(off + 4),
        max_win: r.u32(off + 8),
        wscale,
        state,
    })
}

/// One record -> (connection, its NAT reply key, remaining lifetime), or
/// what is wrong with it.
fn decode_record(b: &[u8]) -> Result<(Conn, Option<ConnKey>, u64), String> {
    // Version 1 records end at L4_END: no owner.
    let owner = match b.get(L4_END..L4_END + 4) {
        Some(o) => u32::from_le_bytes([o[0], o[1], o[2], o[3]]),
        None => NO_OWNER,
    };
    let r = Rd(b);
    let v6 = match r.u8(38) {
        0 => false,
        1 => true,
        v => return Err(format!("address family byte {v} (want 0 or 1)")),
    };
    let key = ConnKey {
        src: r.arr(0),
        dst: r.arr(16),
        sport: r.u16(32),
        dport: r.u16(34),
        zone: r.u16(36),
        v6,
        proto: r.u8(39),
        stype: r.u8(40),
        dtype: r.u8(41),
    };
    if !v6 {
        for (name, a) in [("source", key.src), ("destination", key.dst)] {
            if a[..12] != [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                return Err(format!("IPv4 {name} address is not IPv4-mapped"));
            }
        }
    }
    let icmp_query = (key.proto == ip_proto::ICMP && !v6) || (key.proto == ip_proto::ICMPV6 && v6);
    let with_ports = matches!(key.proto, ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP);
    if icmp_query {
        let rev = if v6 {
            icmp6_reverse_query(key.stype)
        } else {
            icmp4_reverse_query(key.stype)
        };
        if rev != Some(key.dtype) {
            return Err(format!(
                "ICMP types {}/{} are not a query and its reply",
                key.stype, key.dtype
            ));
        }
        if key.sport != key.dport {
            return Err(format!(
                "ICMP query ids differ ({} and {})",
                key.sport, key.dport
            ));
        }
    } else {
        if key.stype != 0 || key.dtype != 0 {
            return Err(format!("ICMP types set for protocol {}", key.proto));
        }
        if with_ports && (key.sport == 0 || key.dport == 0) {
            return Err(format!("port 0 for protocol {}", key.proto));
        }
        if !with_ports && (key.sport != 0 || key.dport != 0) {
            return Err(format!("ports set for protocol {}", key.proto));
        }
    }
    let kind = r.u8(70);
    let sub = r.u8(71);
    let want_kind = if key.proto == ip_proto::TCP {
        2
    } else if icmp_query {
        1
    } else {
        0
    };
    if kind != want_kind {
        return Err(format!(
            "state kind {kind} for protocol {} (want {want_kind})",
            key.proto
        ));
    }
    let l4 = match kind {
        2 => {
            if sub != 0 {
                return Err(format!("TCP sub-state byte {sub} (want 0)"));
            }
            L4State::Tcp([
                decode_peer(&r, 72, "original")?,
                decode_peer(&r, 86, "reply")?,
            ])
        }
        k => {
            if b.get(72..L4_END).is_none_or(|t| t.iter().any(|x| *x != 0)) {
                return Err("TCP window bytes set for a non-TCP connection".into());
            }
            if k == 1 {
                L4State::Icmp(match sub {
                    0 => IcmpState::First,
                    1 => IcmpState::Reply,
                    s => return Err(format!("ICMP state {s} (want 0 or 1)")),
                })
            } else {
                L4State::Other(match sub {
                    0 => OtherState::First,
                    1 => OtherState::Multiple,
                    2 => OtherState::Bidir,
                    s => return Err(format!("state {s} (want 0, 1 or 2)")),
                })
            }
        }
    };
    let rev = match b.get(RECORD_LEN_V2..RECORD_LEN) {
        None | Some([0, ..]) => {
            if b.get(RECORD_LEN_V2..)
                .is_some_and(|t| t.iter().any(|x| *x != 0))
            {
                return Err("NAT bytes set for a connection without NAT".into());
            }
            None
        }
        Some([1, rest @ ..]) => {
            let t = Rd(rest);
            let rev = ConnKey {
                src: t.arr(0),
                dst: t.arr(16),
                sport: t.u16(32),
                dport: t.u16(34),
                ..key.reverse()
            };
            if rest.get(36..).is_none_or(|z| z.iter().any(|x| *x != 0)) {
                return Err("NAT padding bytes are not zero".into());
            }
            if !v6 {
                for (name, a) in [("source", rev.src), ("destination", rev.dst)] {
                    if a[..12] != [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
                        return Err(format!("NAT reply {name} address is not IPv4-mapped"));
                    }
                }
            }
            if rev == key.reverse() {
                return Err("NAT reply tuple is the plain reverse (no translation)".into());
            }
            Some(rev)
        }
        Some([v, ..]) => return Err(format!("NAT byte {v} (want 0 or 1)")),
        Some([]) => None,
    };
    let conn = Conn {
        orig: key,
        mark: r.u32(42),
        expiration_ns: 0,
        label: r.u128(46),
        l4,
        owner,
        nat: rev.is_some(),
    };
    Ok((conn, rev, r.u64(62)))
}

impl Conntrack {
    /// The table as bytes (format above): every connection still alive at
    /// `now_ns` (this tracker's clock), with its remaining lifetime, and
    /// `wall_ns` (ns since the Unix epoch) as the time of the save.
    /// Allocates the whole image; meant for a stopping switch.
    pub fn save_state(&self, now_ns: u64, wall_ns: u64) -> Vec<u8> {
        let live = || {
            self.slots
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some((i as u32, c.as_ref()?)))
                .filter(move |(_, c)| c.expiration_ns > now_ns)
        };
        let count = live().count();
        let mut out = Vec::with_capacity(HEADER_LEN + count * RECORD_LEN + TRAILER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&STATE_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(RECORD_LEN as u32).to_le_bytes());
        out.extend_from_slice(&(count as u64).to_le_bytes());
        out.extend_from_slice(&wall_ns.to_le_bytes());
        for (idx, c) in live() {
            let rev = c.nat.then(|| self.nat_revs.get(&idx)).flatten();
            encode_record(&mut out, c, rev, c.expiration_ns - now_ns);
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Loads a table saved by [`Conntrack::save_state`] into this (empty)
    /// tracker: `now_ns` is this tracker's clock, `wall_ns` the wall clock
    /// (ns since the Unix epoch). All or nothing: on any error the table
    /// stays empty. Never panics; allocates at most what `max_entries`
    /// connections need.
    pub fn restore_state(
        &mut self,
        bytes: &[u8],
        now_ns: u64,
        wall_ns: u64,
    ) -> Result<CtRestored, CtStateError> {
        if !self.is_empty() {
            return Err(CtStateError::NotEmpty(self.len()));
        }
        let r = self.restore_inner(bytes, now_ns, wall_ns);
        if r.is_err() {
            self.slots.clear();
            self.free.clear();
            self.map.clear();
            self.nat_revs.clear();
            self.cursor = 0;
            for p in self.ports.values_mut() {
                p.count = 0;
            }
        }
        r
    }

    fn restore_inner(
        &mut self,
        bytes: &[u8],
        now_ns: u64,
        wall_ns: u64,
    ) -> Result<CtRestored, CtStateError> {
        let header = bytes.get(..HEADER_LEN).ok_or(CtStateError::Truncated {
            len: bytes.len(),
            need: HEADER_LEN,
            what: "header",
        })?;
        let h = Rd(header);
        let magic: [u8; 8] = h.arr(0);
        if magic != MAGIC {
            return Err(CtStateError::BadMagic { found: magic });
        }
        let version = h.u16(8);
        let record_len = match version {
            1 => RECORD_LEN_V1,
            2 => RECORD_LEN_V2,
            STATE_VERSION => RECORD_LEN,
            _ => return Err(CtStateError::UnsupportedVersion { found: version }),
        };
        let flags = h.u16(10);
        if flags != 0 {
            return Err(CtStateError::BadHeader(format!(
                "flags {flags:#06x} (version {version} has none)"
            )));
        }
        let rec_len = h.u32(12);
        if rec_len as usize != record_len {
            return Err(CtStateError::BadHeader(format!(
                "record length {rec_len} (version {version} records are {record_len} bytes)"
            )));
        }
        let count = h.u64(16);
        let max = self.config.max_entries;
        if count > max as u64 {
            return Err(CtStateError::TooMany { count, max });
        }
        // count <= max_entries, so this cannot overflow for any table that
        // fits in memory; checked anyway.
        let count = count as usize;
        let need = count
            .checked_mul(record_len)
            .and_then(|n| n.checked_add(HEADER_LEN + TRAILER_LEN))
            .ok_or(CtStateError::TooMany {
                count: count as u64,
                max,
            })?;
        if bytes.len() < need {
            return Err(CtStateError::Truncated {
                len: bytes.len(),
                need,
                what: "file of that many records",
            });
        }
        if bytes.len() > need {
            return Err(CtStateError::TrailingBytes {
                extra: bytes.len() - need,
            });
        }
        let body = &bytes[..need - TRAILER_LEN];
        let stored = Rd(&bytes[need - TRAILER_LEN..]).u64(0);
        let computed = fnv1a(body);
        if stored != computed {
            return Err(CtStateError::Checksum { stored, computed });
        }
        let saved_wall = h.u64(24);
        let downtime_ns = wall_ns.saturating_sub(saved_wall);
        let cap_ns = u64::from(self.config.timeouts.longest()).saturating_mul(NS_PER_SEC);

        self.slots.reserve_exact(count);
        // Removing a connection pushes its slot on the free list, which
        // must never allocate on the per-packet path (see `insert`).
        self.free.reserve_exact(self.slots.capacity());
        self.map.reserve(count);
        let mut report = CtRestored {
            downtime_ns,
            ..CtRestored::default()
        };
        for (index, rec) in body[HEADER_LEN..].chunks_exact(record_len).enumerate() {
            let (mut conn, rev, remaining) =
                decode_record(rec).map_err(|what| CtStateError::BadRecord { index, what })?;
            let canon = conn.orig.canonical();
            let rev_canon = rev.map(|r| r.canonical());
            if self.map.contains_key(&canon)
                || rev_canon.is_some_and(|rc| rc == canon || self.map.contains_key(&rc))
            {
                return Err(CtStateError::BadRecord {
                    index,
                    what: format!(
                        "a second record for connection {} (zone {})",
                        conn.orig.tuple(),
                        conn.orig.zone
                    ),
                });
            }
            let left = remaining.min(cap_ns).saturating_sub(downtime_ns);
            if left == 0 {
                report.expired += 1;
                continue;
            }
            conn.expiration_ns = now_ns.saturating_add(left);
            let idx = self.slots.len() as u32;
            self.slots.push(Some(conn));
            self.map.insert(canon, idx);
            if let (Some(rev), Some(rc)) = (rev, rev_canon) {
                self.map.insert(rc, idx);
                self.nat_revs.insert(idx, rev);
            }
            // Counted against its port, never refused (module doc).
            self.charge(conn.owner);
            report.restored += 1;
        }
        Ok(report)
    }
}

impl super::CtTimeouts {
    /// The longest of the timeouts, in seconds.
    fn longest(&self) -> u32 {
        [
            self.tcp_syn_sent,
            self.tcp_syn_recv,
            self.tcp_established,
            self.tcp_fin_wait,
            self.tcp_time_wait,
            self.tcp_close,
            self.udp_first,
            self.udp_single,
            self.udp_multiple,
            self.icmp_first,
            self.icmp_reply,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::packet::v4_mapped;
    use super::super::CtConfig;
    use super::*;

    fn key(proto: u8, sport: u16, dport: u16) -> ConnKey {
        ConnKey {
            src: v4_mapped(0x0a00_0001),
            dst: v4_mapped(0x0a00_0002),
            sport,
            dport,
            zone: 7,
            v6: false,
            proto,
            stype: 0,
            dtype: 0,
        }
    }

    fn tcp_conn() -> Conn {
        let peer = |state| TcpPeer {
            seqlo: 1000,
            seqhi: 70_000,
            max_win: 512,
            wscale: WS_FLAG | 7,
            state,
        };
        Conn {
            orig: key(ip_proto::TCP, 1234, 80),
            mark: 0x11,
            expiration_ns: 0,
            label: 0x22 << 100,
            l4: L4State::Tcp([peer(TcpState::Established), peer(TcpState::Established)]),
            owner: 3,
            nat: false,
        }
    }

    /// A file holding `conns`, each with 10 s to live, saved at wall time 0.
    fn file(conns: &[Conn]) -> Vec<u8> {
        let mut ct = Conntrack::new(CtConfig::default());
        for c in conns {
            let idx = ct.slots.len() as u32;
            let mut c = *c;
            c.expiration_ns = 10 * NS_PER_SEC;
            ct.slots.push(Some(c));
            ct.map.insert(c.orig.canonical(), idx);
        }
        ct.save_state(0, 0)
    }

    /// Rewrites the checksum after a test changed `f`.
    fn reseal(f: &mut [u8]) {
        let n = f.len() - TRAILER_LEN;
        let sum = fnv1a(&f[..n]);
        f[n..].copy_from_slice(&sum.to_le_bytes());
    }

    fn restore(f: &[u8]) -> Result<CtRestored, CtStateError> {
        Conntrack::new(CtConfig::default()).restore_state(f, 0, 0)
    }

    fn record_err(f: &[u8]) -> String {
        match restore(f) {
            Err(e @ CtStateError::BadRecord { .. }) => e.to_string(),
            other => panic!("want a record error, got {other:?}"),
        }
    }

    #[test]
    fn layout() {
        let f = file(&[tcp_conn()]);
        assert_eq!(f.len(), HEADER_LEN + RECORD_LEN + TRAILER_LEN);
        assert_eq!(&f[..8], b"OXVS-CT\n");
        assert_eq!(state_len_limit(1), f.len() as u64);
        let mut ct = Conntrack::new(CtConfig::default());
        let r = ct.restore_state(&f, 5, 0).expect("restore");
        assert_eq!(r.restored, 1);
        let e = ct.entries()[0];
        assert_eq!((e.zone, e.mark, e.label), (7, 0x11, 0x22 << 100));
        assert_eq!(e.expiration_ns, 5 + 10 * NS_PER_SEC);
        // Re-saving gives the same records.
        assert_eq!(ct.save_state(5, 0), f);
    }

    #[test]
    fn bad_records_are_named() {
        let base = file(&[tcp_conn()]);
        let rec = HEADER_LEN;
        let cases: &[(usize, u8, &str)] = &[
            (38, 2, "address family byte 2"),
            (10, 1, "not IPv4-mapped"),
            (70, 0, "state kind 0 for protocol 6"),
            (71, 3, "TCP sub-state byte 3"),
            (72 + 12, 0x8f, "window scale byte 0x8f"),
            (72 + 12, 0x41, "window scale byte 0x41"),
            (86 + 13, 11, "TCP reply side: state 11 does not exist"),
            (40, 8, "ICMP types set for protocol 6"),
        ];
        for (off, val, want) in cases {
            let mut f = base.clone();
            f[rec + off] = *val;
            reseal(&mut f);
            let e = record_err(&f);
            assert!(e.contains(want), "{off}: {e} (want {want})");
            assert!(e.starts_with("record 0: "), "{e}");
        }
        // Zero port.
        let mut f = base.clone();
        f[rec + 32..rec + 34].copy_from_slice(&[0, 0]);
        reseal(&mut f);
        assert!(record_err(&f).contains("port 0 for protocol 6"));
    }

    #[test]
    fn non_tcp_records_are_checked() {
        let udp = Conn {
            orig: key(ip_proto::UDP, 53, 5353),
            mark: 0,
            expiration_ns: 0,
            label: 0,
            l4: L4State::Other(OtherState::Bidir),
            owner: NO_OWNER,
            nat: false,
        };
        let mut ping = udp;
        ping.orig = ConnKey {
            stype: 8,
            dtype: 0,
            ..key(ip_proto::ICMP, 9, 9)
        };
        ping.l4 = L4State::Icmp(IcmpState::Reply);
        let mut gre = udp;
        gre.orig = key(47, 0, 0);
        let f = file(&[udp, ping, gre]);
        assert_eq!(restore(&f).expect("ok").restored, 3);

        let rec = |i: usize| HEADER_LEN + i * RECORD_LEN;
        let bad = |i: usize, off: usize, val: u8, want: &str| {
            let mut g = f.clone();
            g[rec(i) + off] = val;
            reseal(&mut g);
            let e = record_err(&g);
            assert!(e.contains(want), "{e} (want {want})");
            assert!(e.starts_with(&format!("record {i}: ")), "{e}");
        };
        bad(0, 71, 3, "state 3 (want 0, 1 or 2)");
        bad(0, 80, 1, "TCP window bytes set");
        bad(0, 70, 2, "state kind 2 for protocol 17");
        bad(1, 41, 14, "are not a query and its reply");
        bad(1, 33, 1, "ICMP query ids differ");
        bad(1, 71, 2, "ICMP state 2");
        bad(2, 32, 1, "ports set for protocol 47");
    }

    #[test]
    fn duplicates_are_refused_and_leave_the_table_empty() {
        let mut rev = tcp_conn();
        rev.orig = rev.orig.reverse();
        let f = file(&[tcp_conn()]);
        // Two records, the second the same connection seen the other way.
        let mut two = file(&[tcp_conn(), rev]);
        // `file` dedups nothing itself; check the records really are there.
        assert_eq!(two.len(), f.len() + RECORD_LEN);
        reseal(&mut two);
        let mut ct = Conntrack::new(CtConfig::default());
        let e = ct.restore_state(&two, 0, 0).expect_err("duplicate");
        assert!(e.to_string().contains("record 1: a second record"), "{e}");
        assert!(ct.is_empty());
        assert!(ct.entries().is_empty());
        // The tracker is still usable: the good file loads.
        ct.restore_state(&f, 0, 0).expect("then the good file");
        assert_eq!(ct.len(), 1);
    }

    #[test]
    fn lifetimes_shrink_by_the_downtime_and_are_capped() {
        let f = file(&[tcp_conn()]); // 10 s left, saved at wall 0
        let mut ct = Conntrack::new(CtConfig::default());
        let r = ct.restore_state(&f, 100, 4 * NS_PER_SEC).expect("ok");
        assert_eq!(
            (r.restored, r.expired, r.downtime_ns),
            (1, 0, 4 * NS_PER_SEC)
        );
        assert_eq!(ct.entries()[0].expiration_ns, 100 + 6 * NS_PER_SEC);
        let mut ct = Conntrack::new(CtConfig::default());
        let r = ct.restore_state(&f, 100, 10 * NS_PER_SEC).expect("ok");
        assert_eq!((r.restored, r.expired), (0, 1));
        // A huge remaining lifetime is capped at the longest timeout.
        let mut g = f.clone();
        g[HEADER_LEN + 62..HEADER_LEN + 70].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut g);
        let mut ct = Conntrack::new(CtConfig::default());
        ct.restore_state(&g, 0, 0).expect("ok");
        assert_eq!(ct.entries()[0].expiration_ns, 24 * 3600 * NS_PER_SEC);
        // A wall clock that went backwards counts as no downtime.
        let mut h = f.clone();
        h[24..32].copy_from_slice(&(50 * NS_PER_SEC).to_le_bytes());
        reseal(&mut h);
        let mut ct = Conntrack::new(CtConfig::default());
        let r = ct.restore_state(&h, 0, NS_PER_SEC).expect("ok");
        assert_eq!((r.restored, r.downtime_ns), (1, 0));
    }

    #[test]
    fn restore_needs_an_empty_table() {
        let f = file(&[tcp_conn()]);
        let mut ct = Conntrack::new(CtConfig::default());
        ct.restore_state(&f, 0, 0).expect("ok");
        assert_eq!(ct.restore_state(&f, 0, 0), Err(CtStateError::NotEmpty(1)));
        assert_eq!(ct.len(), 1, "a refused restore leaves a full table alone");
    }
}
