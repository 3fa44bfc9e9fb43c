//! The connection table ([`Conntrack`]): lookup and commit per packet,
//! staged commits, per-port limits and early drop, expiry, and the sliced
//! walks (dump, flush, disown).

use std::collections::HashMap;

use super::nat::{nat_flags, rewrite_to};
use super::packet::{parse, Pkt, PktKind};
use super::state::{
    icmp_update, other_update, tcp_flags_invalid, tcp_new, tcp_update, Conn, ConnKey, IcmpState,
    L4State, OtherState, Tm, Update, NO_OWNER,
};
use super::{CtConfig, CtEntry, CtFilter, CtParams, CtStats, CtVerdict, TcpState};
use crate::field::{ct_state, tcp_flags as tf, Field};
use crate::ipf::Ipf;
use crate::key::FlowKey;

/// Why a commit was refused (the packet is `+inv`; the datapath drops it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtRefusal {
    /// The ingress port owns its limit of connections.
    PortLimit,
    /// The table is full and nothing near the new connection's hash could
    /// be dropped early.
    TableFull,
    /// `nat` found no free address and port for the new connection.
    NatExhausted,
}

/// The connection the packet being processed already belongs to in a
/// zone (an earlier `ct` of the same packet found or created it), as OVS
/// keeps it in the packet's metadata: a later `ct` in that zone uses it
/// without a lookup or a second state update (module doc, "NAT").
#[derive(Clone, Copy, Debug)]
pub(super) struct Current {
    pub(super) zone: u16,
    pub(super) at: CurrentAt,
    pub(super) reply: bool,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum CurrentAt {
    Slot(u32),
    Staged(usize),
}

/// What a lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// The connection in `slot`, in the reply direction or not.
    Conn { slot: u32, reply: bool },
    /// Nothing.
    None,
    /// A NATed connection's tuple in neither of its directions (the
    /// un-translated reverse of one, or the translated forward of one seen
    /// without its earlier `ct`): cannot be tracked.
    Clash,
}

/// One port's connection limit, count and refusals
/// ([`Conntrack::port_limits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtPortLimit {
    /// OpenFlow port.
    pub port: u32,
    /// The limit in force (0: none).
    pub limit: u32,
    /// Whether `limit` was set for this port (else it is the default).
    pub explicit: bool,
    /// Connections it owns now (expired ones not yet removed included).
    pub count: u32,
    /// Commits from it refused by its limit (only grows while the port
    /// exists).
    pub refused: u64,
}

/// Per-port bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PortCt {
    pub(super) count: u32,
    pub(super) limit: Option<u32>,
    pub(super) refused: u64,
}

/// A new connection waiting for its packet's fate ("Staged commits").
#[derive(Clone, Copy, Debug)]
pub(super) struct Staged {
    pub(super) pkt: Pkt,
    pub(super) owner: u32,
    pub(super) mark: u32,
    pub(super) label: u128,
    /// The slot admission chose to drop early, if the table was full.
    pub(super) victim: Option<u32>,
    /// The reply-direction key if `nat` translated it.
    pub(super) rev: Option<ConnKey>,
}

/// Most commits one packet can stage; more are applied at once.
pub(super) const MAX_STAGED: usize = 4;

/// Slots a commit into a full table examines for an expired or unreplied
/// connection to drop (Linux scans the new entry's hash bucket).
pub(super) const EARLY_DROP_SCAN: usize = 64;

/// Slots swept for expired connections when a port hits its limit, so
/// that a port whose old connections expired is not refused until the
/// background sweep gets there (bounded work per refused packet).
pub(super) const LIMIT_RECLAIM_SCAN: usize = 64;

/// A connection tracker (one per switch; callers serialise access).
#[derive(Debug)]
pub struct Conntrack {
    pub(super) config: CtConfig,
    /// Connection storage; `None` slots are on `free`.
    pub(super) slots: Vec<Option<Conn>>,
    pub(super) free: Vec<u32>,
    /// Canonical key -> slot index.
    pub(super) map: HashMap<ConnKey, u32>,
    /// Next slot [`Conntrack::expire_some`] / [`Conntrack::sweep`] looks at.
    pub(super) cursor: usize,
    pub(super) stats: CtStats,
    /// Connections owned, limits and refusals, by port.
    pub(super) ports: HashMap<u32, PortCt>,
    /// New connections of the packet being processed, not yet in the table
    /// (`staged[..n_staged]`).
    pub(super) staged: [Option<Staged>; MAX_STAGED],
    pub(super) n_staged: usize,
    /// Reassembles IP fragments for the tracker (the datapath offers
    /// fragments here before `ct`; see [`crate::ipf`]).
    pub(super) ipf: Ipf,
    /// The reply-direction keys of NATed connections, by slot.
    pub(super) nat_revs: HashMap<u32, ConnKey>,
    /// The state of `nat(...,random)`'s choices.
    pub(super) nat_seed: u64,
    /// The current packet's connection ([`Current`]).
    pub(super) cur: Option<Current>,
}

impl Default for Conntrack {
    fn default() -> Self {
        Conntrack::new(CtConfig::default())
    }
}

impl Conntrack {
    pub fn new(config: CtConfig) -> Self {
        Conntrack {
            ipf: Ipf::new(config.ipf),
            config,
            slots: Vec::new(),
            free: Vec::new(),
            map: HashMap::new(),
            cursor: 0,
            stats: CtStats::default(),
            ports: HashMap::new(),
            staged: [None; MAX_STAGED],
            n_staged: 0,
            nat_revs: HashMap::new(),
            nat_seed: 0x6f78_7673,
            cur: None,
        }
    }

    /// A new packet starts: it belongs to no connection yet (the datapath
    /// calls this per packet; [`Conntrack::execute`] on every call).
    #[inline]
    pub fn begin_packet(&mut self) {
        self.cur = None;
    }

    /// The fragment reassembler that serves this tracker.
    pub fn ipf(&self) -> &Ipf {
        &self.ipf
    }

    /// The fragment reassembler, to offer it fragments.
    pub fn ipf_mut(&mut self) -> &mut Ipf {
        &mut self.ipf
    }

    /// The configuration.
    pub fn config(&self) -> &CtConfig {
        &self.config
    }

    /// Tracks one packet: `frame` is the whole Ethernet frame as it is now,
    /// `key` its flow key (extracted from that frame). A new connection is
    /// stored at once (see [`Conntrack::execute_staged`] for the
    /// datapath's way). Never panics, never allocates except to store a
    /// newly committed connection.
    pub fn execute(&mut self, frame: &[u8], key: &FlowKey, p: &CtParams, now_ns: u64) -> CtVerdict {
        self.cur = None;
        let v = match self.execute_staged(frame, key, p, now_ns) {
            Ok(v) => v,
            Err(_) => CtVerdict {
                state: ct_state::TRK | ct_state::INV,
                zone: p.zone,
                ..CtVerdict::default()
            },
        };
        self.commit_staged(now_ns);
        v
    }

    /// Tracks one packet like [`Conntrack::execute`], but a connection it
    /// commits is only staged: it enters the table at
    /// [`Conntrack::commit_staged`], called when the packet has left the
    /// pipeline, or never, at [`Conntrack::discard_staged`], when the
    /// pipeline dropped it (module doc, "Staged commits"). The verdict is
    /// the same either way. `Err` if the commit was refused (per-port
    /// limit, a full table with nothing to drop early, no free NAT
    /// tuple): the packet is `+trk+inv` and the datapath drops it, as
    /// Linux and the OVS kernel datapath drop a packet whose connection
    /// cannot be created. Commits of existing connections (mark, label)
    /// apply at once. A packet that already went through `ct` in this zone
    /// (since [`Conntrack::begin_packet`]) reuses the connection found
    /// then, and a packet whose `key` says it was tracked in this zone
    /// keeps its `ct_state` (module doc, "NAT").
    pub fn execute_staged(
        &mut self,
        frame: &[u8],
        key: &FlowKey,
        p: &CtParams,
        now_ns: u64,
    ) -> Result<CtVerdict, CtRefusal> {
        use ct_state::{EST, INV, NEW, REL, RPL, TRK};
        self.stats.packets_total += 1;
        if let Some(cur) = self.cur {
            let tracked_here = key.get(Field::CtState) as u32 & TRK != 0
                && key.get(Field::CtZone) as u16 == p.zone;
            if cur.zone == p.zone && tracked_here && !p.force {
                if let Some(v) = self.execute_known(cur, key, p) {
                    return Ok(v);
                }
            }
        }
        self.cur = None;
        let mut verdict = CtVerdict {
            state: TRK,
            zone: p.zone,
            ..CtVerdict::default()
        };
        let pkt = match parse(frame, key, p.zone) {
            Ok(pkt) => pkt,
            Err(_) => {
                verdict.state |= INV;
                self.stats.invalid_total += 1;
                return Ok(verdict);
            }
        };
        let commit = p.commit || p.force;
        let related = matches!(pkt.kind, PktKind::Related);

        let mut found = match self.lookup(&pkt.key, now_ns) {
            Found::Conn { slot, reply } => Some((slot, reply)),
            Found::None => None,
            Found::Clash => {
                verdict.state |= INV;
                self.stats.invalid_total += 1;
                return Ok(verdict);
            }
        };
        if let (true, Some((idx, true))) = (p.force, found) {
            self.remove(idx);
            self.stats.deleted_total += 1;
            found = None;
        }

        let mut state = 0;
        let mut conn_idx = None;
        let mut create = false;
        match found {
            Some((idx, reply)) if related => {
                conn_idx = Some((idx, reply));
                state = REL | if reply { RPL } else { 0 };
            }
            Some((idx, reply)) => {
                conn_idx = Some((idx, reply));
                match self.update(idx, &pkt, reply, now_ns) {
                    Update::Valid => state = EST | if reply { RPL } else { 0 },
                    Update::ValidNew => state = NEW,
                    Update::Invalid => state = INV,
                    Update::New => {
                        self.remove(idx);
                        self.stats.deleted_total += 1;
                        conn_idx = None;
                        create = true;
                    }
                }
            }
            None if related => state = INV,
            None => create = true,
        }

        if create {
            if !self.valid_new(&pkt) {
                state = INV;
            } else {
                state = NEW;
                if commit {
                    let owner = key.get(Field::InPort) as u32;
                    let admitted = self.admit(&pkt.key, owner, now_ns).and_then(|victim| {
                        let rev = match &p.nat {
                            Some(n) => self.nat_choose(&pkt.key, n, now_ns)?,
                            None => None,
                        };
                        Ok((victim, rev))
                    });
                    let (victim, rev) = match admitted {
                        Ok(x) => x,
                        Err(r) => {
                            self.stats.invalid_total += 1;
                            return Err(r);
                        }
                    };
                    let staged = Staged {
                        pkt,
                        owner,
                        mark: p.mark.map_or(0, |(v, m)| v & m),
                        label: p.label.map_or(0, |(v, m)| v & m),
                        victim,
                        rev,
                    };
                    verdict.mark = staged.mark;
                    verdict.label = staged.label;
                    if let Some(rev) = rev {
                        let fwd = rev.reverse();
                        state |= nat_flags(&pkt.key, &fwd);
                        verdict.rewrite = Some(rewrite_to(&fwd));
                    }
                    if self.n_staged < MAX_STAGED {
                        self.staged[self.n_staged] = Some(staged);
                        self.cur = Some(Current {
                            zone: p.zone,
                            at: CurrentAt::Staged(self.n_staged),
                            reply: false,
                        });
                        self.n_staged += 1;
                    } else {
                        self.apply(staged, now_ns);
                        if let Some(&slot) = self.map.get(&pkt.key.canonical()) {
                            self.cur = Some(Current {
                                zone: p.zone,
                                at: CurrentAt::Slot(slot),
                                reply: false,
                            });
                        }
                    }
                }
            }
        }

        if let Some((idx, reply)) = conn_idx {
            if let Some(conn) = self.slots.get_mut(idx as usize).and_then(Option::as_mut) {
                // The side table only for translated connections: the
                // common case pays no lookup.
                let rev = match (conn.nat, &p.nat) {
                    (true, Some(_)) => self.nat_revs.get(&idx).copied(),
                    _ => None,
                };
                if commit && state & INV == 0 {
                    if let Some((v, m)) = p.mark {
                        conn.mark = (conn.mark & !m) | (v & m);
                    }
                    if let Some((v, m)) = p.label {
                        conn.label = (conn.label & !m) | (v & m);
                    }
                }
                verdict.mark = conn.mark;
                verdict.label = conn.label;
                // Related packets (ICMP errors) are not translated: their
                // embedded header would need it too.
                if let (Some(rev), Some(_), false) = (rev, &p.nat, related) {
                    let to = if reply {
                        conn.orig.reverse()
                    } else {
                        rev.reverse()
                    };
                    state |= nat_flags(&pkt.key, &to);
                    verdict.rewrite = Some(rewrite_to(&to));
                }
                if state & INV == 0 {
                    self.cur = Some(Current {
                        zone: p.zone,
                        at: CurrentAt::Slot(idx),
                        reply,
                    });
                }
            }
        }
        if state & INV != 0 {
            self.stats.invalid_total += 1;
        }
        verdict.state |= state;
        Ok(verdict)
    }

    /// A `ct` in a zone the packet already went through ([`Current`]): no
    /// lookup, no state update (the packet keeps its `ct_state`); a commit
    /// sets mark and label, a `nat` translates if no earlier `ct` in the
    /// zone did. `None` if the connection is gone.
    fn execute_known(&mut self, cur: Current, key: &FlowKey, p: &CtParams) -> Option<CtVerdict> {
        let mut state = key.get(Field::CtState) as u32;
        let commit = p.commit || p.force;
        let (orig, rev, mark, label) = match cur.at {
            CurrentAt::Slot(idx) => {
                let conn = self.slots.get_mut(idx as usize)?.as_mut()?;
                let rev = match (conn.nat, &p.nat) {
                    (true, Some(_)) => self.nat_revs.get(&idx).copied(),
                    _ => None,
                };
                if commit && state & ct_state::INV == 0 {
                    if let Some((v, m)) = p.mark {
                        conn.mark = (conn.mark & !m) | (v & m);
                    }
                    if let Some((v, m)) = p.label {
                        conn.label = (conn.label & !m) | (v & m);
                    }
                }
                (conn.orig, rev, conn.mark, conn.label)
            }
            CurrentAt::Staged(i) => {
                let s = self.staged.get_mut(i)?.as_mut()?;
                if commit && state & ct_state::INV == 0 {
                    if let Some((v, m)) = p.mark {
                        s.mark = (s.mark & !m) | (v & m);
                    }
                    if let Some((v, m)) = p.label {
                        s.label = (s.label & !m) | (v & m);
                    }
                }
                (s.pkt.key, s.rev, s.mark, s.label)
            }
        };
        let mut verdict = CtVerdict {
            state: 0,
            zone: p.zone,
            mark,
            label,
            rewrite: None,
        };
        let natted = state & (ct_state::SNAT | ct_state::DNAT) != 0;
        if let (Some(rev), Some(_), false) = (rev, &p.nat, natted) {
            let (from, to) = if cur.reply {
                (rev, orig.reverse())
            } else {
                (orig, rev.reverse())
            };
            state |= nat_flags(&from, &to);
            verdict.rewrite = Some(rewrite_to(&to));
        }
        verdict.state = state;
        Some(verdict)
    }

    /// Whether commits wait for [`Conntrack::commit_staged`] or
    /// [`Conntrack::discard_staged`].
    #[inline]
    pub fn has_staged(&self) -> bool {
        self.n_staged != 0
    }

    /// The packet that staged commits left the pipeline (was output or
    /// sent to the controller): its new connections enter the table.
    pub fn commit_staged(&mut self, now_ns: u64) {
        self.cur = None;
        for i in 0..std::mem::take(&mut self.n_staged) {
            if let Some(s) = self.staged[i].take() {
                self.apply(s, now_ns);
            }
        }
    }

    /// The packet that staged commits was dropped: its new connections are
    /// forgotten (counted in [`CtStats::commits_discarded_total`]).
    pub fn discard_staged(&mut self) {
        self.cur = None;
        for i in 0..std::mem::take(&mut self.n_staged) {
            if self.staged[i].take().is_some() {
                self.stats.commits_discarded_total += 1;
            }
        }
    }

    /// Admission of a new connection owned by `owner`: `Ok(victim)` with
    /// the slot to drop early if the table is full. Bounded work.
    pub(super) fn admit(
        &mut self,
        key: &ConnKey,
        owner: u32,
        now_ns: u64,
    ) -> Result<Option<u32>, CtRefusal> {
        let limit = self.limit_of(owner);
        if limit != 0 {
            let staged_here = self.staged[..self.n_staged]
                .iter()
                .flatten()
                .filter(|s| s.owner == owner)
                .count() as u32;
            let count = |ct: &Self| ct.ports.get(&owner).map_or(0, |p| p.count) + staged_here;
            if count(self) >= limit {
                // Maybe some of its connections expired: sweep a little
                // before refusing.
                self.sweep(now_ns, LIMIT_RECLAIM_SCAN);
                if count(self) >= limit {
                    self.ports.entry(owner).or_default().refused += 1;
                    self.stats.limit_refused_total += 1;
                    return Err(CtRefusal::PortLimit);
                }
            }
        }
        if self.count() + self.n_staged < self.config.max_entries {
            return Ok(None);
        }
        match self.early_drop_candidate(key, now_ns) {
            Some(victim) => Ok(Some(victim)),
            None => {
                self.stats.table_full_total += 1;
                Err(CtRefusal::TableFull)
            }
        }
    }

    /// The limit in force for `port` (0: none).
    pub(super) fn limit_of(&self, port: u32) -> u32 {
        match self.ports.get(&port).and_then(|p| p.limit) {
            Some(l) => l,
            None => self.config.port_limit,
        }
    }

    /// A slot to drop for a new connection with `key` in a full table:
    /// among [`EARLY_DROP_SCAN`] slots from a place the key's hash picks,
    /// the first expired connection, else the first unreplied one (not
    /// assured), else none; never a slot another staged commit chose.
    /// Reads only.
    pub(super) fn early_drop_candidate(&self, key: &ConnKey, now_ns: u64) -> Option<u32> {
        use std::hash::BuildHasher;
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        let start = (self.map.hasher().hash_one(key.canonical()) % n as u64) as usize;
        let mut unreplied = None;
        for i in 0..EARLY_DROP_SCAN.min(n) {
            let idx = (start + i) % n;
            let Some(Some(c)) = self.slots.get(idx) else {
                continue;
            };
            if self.staged[..self.n_staged]
                .iter()
                .flatten()
                .any(|s| s.victim == Some(idx as u32))
            {
                continue;
            }
            if now_ns >= c.expiration_ns {
                return Some(idx as u32);
            }
            if unreplied.is_none() && !c.assured() {
                unreplied = Some(idx as u32);
            }
        }
        unreplied
    }

    /// Stores a staged connection (admission already passed): drops its
    /// victim first if the table is (still) full.
    pub(super) fn apply(&mut self, s: Staged, now_ns: u64) {
        let canon = s.pkt.key.canonical();
        if let Some(&idx) = self.map.get(&canon) {
            // The same packet committed it twice: the second commit only
            // adds its mark and label, as on an existing connection.
            if let Some(Some(c)) = self.slots.get_mut(idx as usize) {
                c.mark |= s.mark;
                c.label |= s.label;
            }
            return;
        }
        if self.count() >= self.config.max_entries {
            let victim = s
                .victim
                .filter(|&v| {
                    matches!(self.slots.get(v as usize), Some(Some(c))
                        if now_ns >= c.expiration_ns || !c.assured())
                })
                .or_else(|| self.early_drop_candidate(&s.pkt.key, now_ns));
            match victim {
                Some(v) => self.drop_early(v, now_ns),
                None => {
                    self.stats.table_full_total += 1;
                    return;
                }
            }
        }
        if s.rev.is_some_and(|r| self.map.contains_key(&r.canonical())) {
            // Its translated tuple was taken since it was chosen.
            self.stats.nat_exhausted_total += 1;
            return;
        }
        if let Some(idx) = self.insert(&s.pkt, s.rev, s.owner, now_ns) {
            if let Some(Some(c)) = self.slots.get_mut(idx as usize) {
                c.mark = s.mark;
                c.label = s.label;
            }
        }
    }

    /// Removes `idx` to make room: counted as expired if it was, else as an
    /// early drop.
    pub(super) fn drop_early(&mut self, idx: u32, now_ns: u64) {
        let expired = match self.slots.get(idx as usize) {
            Some(Some(c)) => now_ns >= c.expiration_ns,
            _ => return,
        };
        self.remove(idx);
        if expired {
            self.stats.expired_total += 1;
        } else {
            self.stats.early_drop_total += 1;
        }
    }

    /// Finds the live connection `key` belongs to, and in which direction.
    /// An expired connection met here is removed.
    pub(super) fn lookup(&mut self, key: &ConnKey, now_ns: u64) -> Found {
        let Some(&idx) = self.map.get(&key.canonical()) else {
            return Found::None;
        };
        let Some(Some(conn)) = self.slots.get(idx as usize) else {
            return Found::None;
        };
        let reply = if conn.orig == *key {
            false
        } else if !conn.nat || self.nat_revs.get(&idx) == Some(key) {
            true
        } else if conn.closed() || now_ns >= conn.expiration_ns {
            // A translated connection that is over holds a tuple the
            // endpoints reuse: the new connection takes it.
            self.remove(idx);
            self.stats.deleted_total += 1;
            return Found::None;
        } else {
            return Found::Clash;
        };
        if now_ns >= conn.expiration_ns {
            self.remove(idx);
            self.stats.expired_total += 1;
            return Found::None;
        }
        Found::Conn { slot: idx, reply }
    }

    /// The reply-direction key of the connection in `idx`.
    pub(super) fn reply_key(&self, idx: u32, conn: &Conn) -> ConnKey {
        match conn.nat {
            true => self
                .nat_revs
                .get(&idx)
                .copied()
                .unwrap_or(conn.orig.reverse()),
            false => conn.orig.reverse(),
        }
    }

    pub(super) fn valid_new(&self, pkt: &Pkt) -> bool {
        match pkt.kind {
            PktKind::Tcp(seg) => {
                let f = seg.flags;
                // Never a SYN-ACK: a connection starts at its beginning
                // (a SYN) or, when loose, anywhere but half-way through
                // the handshake.
                let syn_ack = f & (tf::SYN | tf::ACK) == tf::SYN | tf::ACK;
                !tcp_flags_invalid(f) && !syn_ack && (self.config.tcp_loose || f & tf::SYN != 0)
            }
            PktKind::IcmpQuery { may_start } => may_start,
            PktKind::Related => false,
            PktKind::Other => true,
        }
    }

    pub(super) fn update(&mut self, idx: u32, pkt: &Pkt, reply: bool, now_ns: u64) -> Update {
        let timeouts = self.config.timeouts;
        let seq_check = self.config.tcp_seq_check;
        let Some(conn) = self.slots.get_mut(idx as usize).and_then(Option::as_mut) else {
            return Update::Invalid;
        };
        let (res, tm) = match (&mut conn.l4, pkt.kind) {
            (L4State::Tcp(peers), PktKind::Tcp(seg)) => {
                // `+inv` never changes a connection: `tcp_update` sets up a
                // side at its first segment before the window check, so
                // undo that when the segment then fails it (found by the
                // `conntrack` fuzz target).
                let before = *peers;
                let r = tcp_update(peers, &seg, reply, seq_check);
                if matches!(r.0, Update::Invalid) {
                    *peers = before;
                }
                r
            }
            (L4State::Icmp(st), _) => {
                let (r, tm) = icmp_update(st, reply);
                (r, Some(tm))
            }
            (L4State::Other(st), _) => {
                let (r, tm) = other_update(st, reply);
                (r, Some(tm))
            }
            // A TCP connection key with a non-TCP packet cannot happen (the
            // protocol is part of the key).
            (L4State::Tcp(_), _) => (Update::Invalid, None),
        };
        if let Some(tm) = tm {
            conn.expiration_ns = timeouts.deadline(tm, now_ns);
        }
        res
    }

    /// Stores a new connection with `pkt` as its original direction, owned
    /// by `owner`, or `None` if the table is full (the caller made room).
    pub(super) fn insert(
        &mut self,
        pkt: &Pkt,
        rev: Option<ConnKey>,
        owner: u32,
        now_ns: u64,
    ) -> Option<u32> {
        if self.count() >= self.config.max_entries {
            return None;
        }
        let (l4, tm) = match pkt.kind {
            PktKind::Tcp(seg) => (L4State::Tcp(tcp_new(&seg)), Tm::TcpFirstPacket),
            PktKind::IcmpQuery { .. } => (L4State::Icmp(IcmpState::First), Tm::IcmpFirst),
            PktKind::Other | PktKind::Related => {
                (L4State::Other(OtherState::First), Tm::OtherFirst)
            }
        };
        let conn = Conn {
            orig: pkt.key,
            mark: 0,
            expiration_ns: self.config.timeouts.deadline(tm, now_ns),
            label: 0,
            l4,
            owner,
            nat: rev.is_some(),
        };
        let idx = self.store(conn)?;
        self.map.insert(pkt.key.canonical(), idx);
        if let Some(rev) = rev {
            self.map.insert(rev.canonical(), idx);
            self.nat_revs.insert(idx, rev);
        }
        self.charge(owner);
        self.stats.committed_total += 1;
        Some(idx)
    }

    /// Puts `conn` in a free slot (growing the slab within the bound).
    pub(super) fn store(&mut self, conn: Conn) -> Option<u32> {
        Some(match self.free.pop() {
            Some(i) => {
                *self.slots.get_mut(i as usize)? = Some(conn);
                i
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    // Grow geometrically but never past the bound.
                    let want = (self.slots.len() * 2)
                        .max(16)
                        .min(self.config.max_entries.max(1));
                    self.slots
                        .reserve_exact(want.saturating_sub(self.slots.len()));
                    // Room for every slot on the free list, so that removing
                    // (also from the per-packet path) never allocates.
                    let free_room = self.slots.capacity().saturating_sub(self.free.len());
                    self.free.reserve_exact(free_room);
                }
                self.slots.push(Some(conn));
                (self.slots.len() - 1) as u32
            }
        })
    }

    /// One more connection owned by `owner`.
    pub(super) fn charge(&mut self, owner: u32) {
        if owner != NO_OWNER {
            let p = self.ports.entry(owner).or_default();
            p.count = p.count.saturating_add(1);
        }
    }

    pub(super) fn remove(&mut self, idx: u32) {
        if let Some(conn) = self.slots.get_mut(idx as usize).and_then(Option::take) {
            self.map.remove(&conn.orig.canonical());
            if conn.nat {
                if let Some(rev) = self.nat_revs.remove(&idx) {
                    self.map.remove(&rev.canonical());
                }
            }
            self.free.push(idx);
            if let Some(p) = self.ports.get_mut(&conn.owner) {
                p.count = p.count.saturating_sub(1);
            }
        }
    }

    /// Number of stored connections (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.count()
    }

    /// Whether no connection is stored.
    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// Connections stored (a NATed one has two map entries, one slot).
    #[inline]
    pub(super) fn count(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Counters.
    pub fn stats(&self) -> CtStats {
        CtStats {
            entries: self.count(),
            ..self.stats
        }
    }

    // -- Per-port limits ----------------------------------------------------

    /// The limit of ports without one of their own (0: none).
    pub fn default_port_limit(&self) -> u32 {
        self.config.port_limit
    }

    /// Sets the limit of ports without one of their own (0: none). Ports
    /// already over it keep their connections; their new ones are refused
    /// until they are below it.
    pub fn set_default_port_limit(&mut self, limit: u32) {
        self.config.port_limit = limit;
    }

    /// Sets `port`'s own limit (`Some(0)`: none), or `None` to go back to
    /// the default.
    pub fn set_port_limit(&mut self, port: u32, limit: Option<u32>) {
        match limit {
            Some(l) => self.ports.entry(port).or_default().limit = Some(l),
            None => {
                if let Some(p) = self.ports.get_mut(&port) {
                    p.limit = None;
                }
            }
        }
    }

    /// `port`'s limit, count and refusals.
    pub fn port_limit(&self, port: u32) -> CtPortLimit {
        let p = self.ports.get(&port).copied().unwrap_or_default();
        CtPortLimit {
            port,
            limit: p.limit.unwrap_or(self.config.port_limit),
            explicit: p.limit.is_some(),
            count: p.count,
            refused: p.refused,
        }
    }

    /// Every port that owns connections, has its own limit or had commits
    /// refused, by port number.
    pub fn port_limits(&self) -> Vec<CtPortLimit> {
        let mut v: Vec<CtPortLimit> = self.ports.keys().map(|&p| self.port_limit(p)).collect();
        v.sort_by_key(|p| p.port);
        v
    }

    /// `port` was deleted: up to `max_slots` slots from `start`, its
    /// connections stop counting against it (they stay until they expire);
    /// returns where to go on, `None` when done, and then its limit and
    /// refusal counter are forgotten too, so that a new port with the same
    /// number starts afresh. Call repeatedly (each call under the lock)
    /// from 0; see [`Conntrack::flush_slice`] for the semantics of a scan
    /// in slices.
    pub fn disown_port_slice(
        &mut self,
        port: u32,
        start: usize,
        max_slots: usize,
    ) -> Option<usize> {
        let end = start.saturating_add(max_slots).min(self.slots.len());
        for slot in self.slots.iter_mut().take(end).skip(start).flatten() {
            if slot.owner == port {
                slot.owner = NO_OWNER;
                if let Some(p) = self.ports.get_mut(&port) {
                    p.count = p.count.saturating_sub(1);
                }
            }
        }
        if end < self.slots.len() {
            return Some(end);
        }
        if self.ports.get(&port).is_some_and(|p| p.count == 0) {
            self.ports.remove(&port);
        }
        None
    }

    // -- Expiry and reclaim -------------------------------------------------

    /// Removes every connection that has expired at `now_ns`; returns how many.
    /// Work is proportional to the number of slots ever used.
    pub fn expire(&mut self, now_ns: u64) -> usize {
        self.cursor = 0;
        self.expire_some(now_ns, self.slots.len())
    }

    /// Examines at most `max_slots` slots, continuing where the previous call
    /// stopped (wrapping around), and removes the expired connections found;
    /// returns how many. Calling it regularly with a small budget spreads the
    /// cleanup over time.
    pub fn expire_some(&mut self, now_ns: u64, max_slots: usize) -> usize {
        self.scan(now_ns, max_slots, false)
    }

    /// The background sweep ([`crate::datapath`] runs it with every batch):
    /// [`Conntrack::expire_some`], and while the table is more than 95 %
    /// full also drops the connections that are not assured or are closing
    /// (Linux's `gc_worker` early drop), so that a commit rarely meets a
    /// full table. Returns how many it removed.
    pub fn sweep(&mut self, now_ns: u64, max_slots: usize) -> usize {
        let crowded = self.count().saturating_mul(20) > self.config.max_entries.saturating_mul(19);
        self.scan(now_ns, max_slots, crowded)
    }

    pub(super) fn scan(&mut self, now_ns: u64, max_slots: usize, reclaim: bool) -> usize {
        let n = self.slots.len();
        if n == 0 {
            return 0;
        }
        let mut removed = 0;
        for _ in 0..max_slots.min(n) {
            if self.cursor >= n {
                self.cursor = 0;
            }
            let idx = self.cursor;
            self.cursor += 1;
            if let Some(Some(conn)) = self.slots.get(idx) {
                if now_ns >= conn.expiration_ns {
                    self.remove(idx as u32);
                    self.stats.expired_total += 1;
                    removed += 1;
                } else if reclaim && conn.reclaimable() {
                    self.remove(idx as u32);
                    self.stats.early_drop_total += 1;
                    removed += 1;
                }
            }
        }
        removed
    }

    // -- Dumps and flushes --------------------------------------------------

    /// Removes all connections, or those of one zone; returns how many.
    /// Work is proportional to the table: a caller that must not hold its
    /// lock that long uses [`Conntrack::flush_slice`].
    pub fn flush(&mut self, zone: Option<u16>) -> usize {
        let mut removed = 0;
        let mut at = Some(0);
        while let Some(start) = at {
            let (n, next) = self.flush_slice(zone, start, usize::MAX);
            removed += n;
            at = next;
        }
        removed
    }

    /// Removes the connections (all, or those of one zone) in up to
    /// `max_slots` slots from `start`; returns how many, and where to go on
    /// (`None`: done). Flushing in slices, the lock released in between:
    /// every connection that exists for the whole flush is removed;
    /// connections committed meanwhile may survive (if their slot was
    /// already passed), so a flush ends with the table empty only if
    /// nothing was committed while it ran.
    pub fn flush_slice(
        &mut self,
        zone: Option<u16>,
        start: usize,
        max_slots: usize,
    ) -> (usize, Option<usize>) {
        let filter = CtFilter {
            zone,
            ..CtFilter::default()
        };
        self.flush_slice_filtered(&filter, start, max_slots)
    }

    /// [`Conntrack::flush_slice`] of the connections `filter` selects.
    pub fn flush_slice_filtered(
        &mut self,
        filter: &CtFilter,
        start: usize,
        max_slots: usize,
    ) -> (usize, Option<usize>) {
        let end = start.saturating_add(max_slots).min(self.slots.len());
        let mut removed = 0;
        for idx in start..end {
            let hit = match self.slots.get(idx) {
                Some(Some(conn)) => {
                    let reply = self.reply_key(idx as u32, conn);
                    filter.selects(conn.orig.zone, conn.orig.proto, &reply.tuple())
                }
                _ => false,
            };
            if hit {
                self.remove(idx as u32);
                removed += 1;
            }
        }
        self.stats.deleted_total += removed as u64;
        (removed, (end < self.slots.len()).then_some(end))
    }

    /// A snapshot of every stored connection, in storage order (expired ones
    /// not yet removed included: compare `expiration_ns` with the time).
    /// Work and memory are proportional to the table: a caller that must
    /// not hold its lock that long uses [`Conntrack::entries_slice`].
    pub fn entries(&self) -> Vec<CtEntry> {
        let mut out = Vec::with_capacity(self.len());
        self.entries_slice(None, 0, usize::MAX, &mut out);
        out
    }

    /// Appends to `out` the connections (all, or those of one zone) in up
    /// to `max_slots` slots from `start`; returns where to go on (`None`:
    /// done). A dump in slices, the lock released in between, reports every
    /// connection that exists for the whole dump exactly once, each as it
    /// was when its slice was read; connections committed or removed
    /// meanwhile may or may not appear (a slot's connection never moves,
    /// so nothing is reported twice unless it was removed and committed
    /// again). This is what Linux's `conntrack -L` (a netlink dump bucket
    /// by bucket) promises too.
    pub fn entries_slice(
        &self,
        zone: Option<u16>,
        start: usize,
        max_slots: usize,
        out: &mut Vec<CtEntry>,
    ) -> Option<usize> {
        let end = start.saturating_add(max_slots).min(self.slots.len());
        let slots = self.slots.get(start..end).unwrap_or_default();
        out.extend(
            slots
                .iter()
                .enumerate()
                .filter_map(|(i, c)| Some(((start + i) as u32, c.as_ref()?)))
                .filter(|(_, c)| zone.is_none() || zone == Some(c.orig.zone))
                .map(|(idx, c)| {
                    let tcp_states = match c.l4 {
                        L4State::Tcp([o, r]) => Some((o.state, r.state)),
                        _ => None,
                    };
                    CtEntry {
                        proto: c.orig.proto,
                        orig: c.orig.tuple(),
                        reply: self.reply_key(idx, c).tuple(),
                        zone: c.orig.zone,
                        mark: c.mark,
                        label: c.label,
                        tcp_state: tcp_states.map(|(o, r)| TcpState::coalesce(o, r)),
                        tcp_states,
                        expiration_ns: c.expiration_ns,
                        owner: (c.owner != NO_OWNER).then_some(c.owner),
                    }
                }),
        );
        (end < self.slots.len()).then_some(end)
    }

    /// Memory one connection costs at most: its slot, its map entry (key,
    /// index, control byte), its free-list entry. Hash-map load factor slack
    /// comes on top (at most 2x for the map part).
    pub fn bytes_per_entry() -> usize {
        std::mem::size_of::<Option<Conn>>()
            + std::mem::size_of::<(ConnKey, u32)>()
            + 1
            + std::mem::size_of::<u32>()
    }
}
