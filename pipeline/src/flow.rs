//! The OpenFlow-style flow model: matches, actions, flows and flow mods.
//!
//! These are plain values: [`crate::parse`] builds them from `ovs-ofctl`
//! text, [`crate::print`] writes them back, [`crate::tables`] stores them and
//! [`crate::xlate`] executes them. A [`Match`] is canonical (value bits
//! outside the mask are zero), so two matches that mean the same thing are
//! equal, and printing never depends on how the flow was written.

use std::net::IpAddr;

use crate::field::Field;
use crate::key::FlowKey;
pub use crate::learn::{LearnAction, LearnSpec, LearnSrc, LearnSubField, OvsField};

/// OpenFlow reserved port numbers (32-bit, OpenFlow 1.1+ numbering).
pub mod port {
    /// Highest number a real port can have.
    pub const MAX: u32 = 0xffff_ff00;
    /// Send the packet out the port it came in on.
    pub const IN_PORT: u32 = 0xffff_fff8;
    /// Submit to the first table (packet-out only).
    pub const TABLE: u32 = 0xffff_fff9;
    /// Traditional L2 switching (not supported by oxvs).
    pub const NORMAL: u32 = 0xffff_fffa;
    /// All ports except the input port, except those with flooding disabled.
    pub const FLOOD: u32 = 0xffff_fffb;
    /// All ports except the input port.
    pub const ALL: u32 = 0xffff_fffc;
    /// Send to the controller (the packet-in queue).
    pub const CONTROLLER: u32 = 0xffff_fffd;
    /// The local port (the bridge's own interface).
    pub const LOCAL: u32 = 0xffff_fffe;
    /// Not a port (`out_port` wildcard in flow mods).
    pub const NONE: u32 = 0xffff_ffff;
}

/// The default flow priority (OpenFlow `OFP_DEFAULT_PRIORITY`).
pub const DEFAULT_PRIORITY: u16 = 32768;

/// Number of flow tables (0..=254; 255 means "all tables" in OpenFlow).
pub const N_TABLES: usize = 255;

/// A (value, mask) match over the flow key. Invariant: `value & mask == value`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Match {
    /// The bits to compare (zero outside `mask`).
    pub value: FlowKey,
    /// Which bits are compared.
    pub mask: FlowKey,
}

impl Match {
    /// The match that matches every packet.
    pub const CATCHALL: Match = Match {
        value: FlowKey::ZERO,
        mask: FlowKey::ZERO,
    };

    /// Adds `field & mask == value & mask` to the match (replacing any
    /// earlier constraint on the same bits).
    pub fn set(&mut self, field: Field, value: u128, mask: u128) {
        let old_mask = self.mask.get(field);
        let old_value = self.value.get(field);
        let new_mask = (old_mask & !mask) | mask;
        let new_value = (old_value & !mask) | (value & mask);
        self.mask.set(field, new_mask);
        self.value.set(field, new_value & new_mask);
    }

    /// Adds an exact-match constraint on a field.
    pub fn set_exact(&mut self, field: Field, value: u128) {
        self.set(field, value, field.full_mask());
    }

    /// The (value, mask) pair for one field.
    pub fn get(&self, field: Field) -> (u128, u128) {
        (self.value.get(field), self.mask.get(field))
    }

    /// Whether the match constrains any bit of `field`.
    pub fn has(&self, field: Field) -> bool {
        self.mask.get(field) != 0
    }

    /// Whether a packet key matches.
    #[inline]
    pub fn matches(&self, key: &FlowKey) -> bool {
        key.matches(&self.value, &self.mask)
    }
}

/// Bits `ofs..ofs+n_bits` of a field, as in `NXM_NX_REG1[0..15]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SubField {
    pub field: Field,
    /// First bit (0 = least significant).
    pub ofs: u8,
    /// Number of bits (>= 1, `ofs + n_bits <= field.bits()`).
    pub n_bits: u8,
}

impl SubField {
    /// The whole field.
    pub fn whole(field: Field) -> SubField {
        SubField {
            field,
            ofs: 0,
            n_bits: field.bits() as u8,
        }
    }

    /// The mask of the sub-field's bits, in field units.
    pub fn mask(&self) -> u128 {
        let ones = if self.n_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << self.n_bits) - 1
        };
        ones << self.ofs
    }

    /// Reads the sub-field (right-aligned).
    pub fn get(&self, key: &FlowKey) -> u128 {
        (key.get(self.field) & self.mask()) >> self.ofs
    }

    /// Writes the sub-field from a right-aligned value.
    pub fn set(&self, key: &mut FlowKey, value: u128) {
        key.set_masked(self.field, value << self.ofs, self.mask());
    }
}

/// Why a packet was sent to the controller.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum PacketInReason {
    /// No matching flow (table-miss).
    NoMatch,
    /// An explicit `controller` action.
    #[default]
    Action,
    /// `dec_ttl` found a TTL of 0 or 1.
    InvalidTtl,
}

/// The userdata of a `controller` action whose packet the switch answers
/// itself with an ICMP "port unreachable" instead of queueing it as a
/// packet-in (a Service without endpoints, as kube-proxy rejects it):
/// `controller(userdata=72.65.6a.65.63.74)`, "reject" in ASCII.
pub const REJECT_USERDATA: &[u8] = b"reject";

/// `controller(reason=...,userdata=...,max_len=...,id=...)`.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct ControllerAction {
    pub reason: PacketInReason,
    pub userdata: Vec<u8>,
    /// Bytes of the packet to send (65535 = whole packet).
    pub max_len: u16,
    /// Controller connection id.
    pub controller_id: u16,
}

/// Where a `ct` action takes its zone from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CtZoneSrc {
    Imm(u16),
    Field(SubField),
}

/// Which side of a connection `nat` translates.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NatKind {
    /// Source NAT (`nat(src=...)`): the initiator's address and port.
    Src,
    /// Destination NAT (`nat(dst=...)`): the responder's address and port.
    Dst,
}

/// The addresses (one family) and ports a `nat` may choose from.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct NatRange {
    /// First address (inclusive).
    pub addr_min: IpAddr,
    /// Last address (inclusive; equal to `addr_min` for one address).
    pub addr_max: IpAddr,
    /// First and last port (inclusive); `None` keeps the packet's port
    /// (SNAT may still change it to keep the connection unique).
    pub ports: Option<(u16, u16)>,
}

/// `nat`, `nat(src=RANGE,...)`, `nat(dst=RANGE,...)` inside `ct`: on a
/// connection's first packet, with `commit`, chooses the translation and
/// stores it with the connection; on every later packet of a connection
/// that has one (either direction), applies it (the reverse on replies).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct NatAction {
    /// `None`: bare `nat`, which only applies a connection's existing
    /// translation.
    pub kind: Option<NatKind>,
    /// Where to translate to; `None` with a kind keeps the addresses.
    pub range: Option<NatRange>,
    /// `persistent`: the same client gets the same address.
    pub persistent: bool,
    /// `hash`: the port is chosen by a hash of the connection.
    pub hash: bool,
    /// `random`: the port is chosen at random.
    pub random: bool,
}

/// `ct(commit,force,zone=...,table=...,exec(...))`.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct CtAction {
    pub commit: bool,
    pub force: bool,
    pub zone: CtZoneSrc,
    /// Table to recirculate to after conntrack; `None` = no recirculation.
    pub table: Option<u8>,
    /// Nested actions, in order: `SetField` (a parsed `load` is one too) or
    /// `Move` (the packet's bits, read when the `ct` runs) to `ct_mark` /
    /// `ct_label`, and
    /// at most one [`Action::Nat`] (written `nat(...)` in the `ct`
    /// arguments or inside `exec(...)`; printed outside `exec` when it is
    /// first, as OVS does).
    pub exec: Vec<Action>,
}

/// One OpenFlow action (or instruction: `goto_table`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Action {
    /// `output:PORT` (also `in_port`, `LOCAL`, `ALL`... via [`port`] numbers).
    Output(u32),
    /// `output:NXM_NX_REG1[]`: port number read from a sub-field.
    OutputReg(SubField),
    /// `controller(...)`.
    Controller(ControllerAction),
    /// `goto_table:T` (must be last).
    GotoTable(u8),
    /// `resubmit(PORT,TABLE)`; `None` = the current in_port / table.
    Resubmit {
        in_port: Option<u32>,
        table: Option<u8>,
    },
    /// `set_field:VALUE[/MASK]->FIELD` (value and mask in field units).
    SetField {
        field: Field,
        value: u128,
        mask: u128,
    },
    /// `load:VALUE->DST[a..b]`.
    Load { dst: SubField, value: u128 },
    /// `move:SRC[a..b]->DST[c..d]`.
    Move { src: SubField, dst: SubField },
    /// `mod_dl_src:MAC` (48-bit value).
    ModDlSrc(u64),
    /// `mod_dl_dst:MAC`.
    ModDlDst(u64),
    /// `mod_nw_src:IP`.
    ModNwSrc(u32),
    /// `mod_nw_dst:IP`.
    ModNwDst(u32),
    /// `dec_ttl`: at TTL (hop limit) <= 1, a packet-in with reason
    /// `invalid_ttl` to controller 0 and the end of the action list (OVS);
    /// else one less.
    DecTtl,
    /// `push_vlan:ETHERTYPE`.
    PushVlan(u16),
    /// `pop_vlan` / `strip_vlan`.
    PopVlan,
    /// `set_tunnel:ID` / `set_tunnel64:ID`.
    SetTunnel(u64),
    /// `ct(...)`.
    Ct(CtAction),
    /// `ct_clear`.
    CtClear,
    /// `nat(...)`: only inside a `ct` action's nested actions.
    Nat(NatAction),
    /// `group:ID`: the group's buckets (see [`crate::group`]).
    Group(u32),
    /// `meter:ID`: the packet is metered; over the meter's rate it is
    /// dropped here (see [`crate::meter`]).
    Meter(u32),
    /// `conjunction(ID,K/N)`: `clause` is K (1-based), `n_clauses` is N.
    Conjunction { id: u32, clause: u8, n_clauses: u8 },
    /// `note:XX.XX...` (bytes).
    Note(Vec<u8>),
    /// `learn(...)`: adds a flow made from the packet (see [`crate::learn`];
    /// boxed: it is large and rare).
    Learn(Box<LearnAction>),
}

/// Flow flags from `ovs-ofctl` (`send_flow_rem`, `check_overlap`, ...).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct FlowFlags {
    pub send_flow_rem: bool,
    pub check_overlap: bool,
    pub reset_counts: bool,
    pub no_packet_counts: bool,
    pub no_byte_counts: bool,
}

/// A flow as written in flow text.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Flow {
    pub table: u8,
    pub priority: u16,
    pub matches: Match,
    /// Empty = drop.
    pub actions: Vec<Action>,
    pub cookie: u64,
    /// Seconds; 0 = none.
    pub idle_timeout: u16,
    /// Seconds; 0 = none.
    pub hard_timeout: u16,
    pub importance: u16,
    pub flags: FlowFlags,
}

impl Default for Flow {
    fn default() -> Self {
        Flow {
            table: 0,
            priority: DEFAULT_PRIORITY,
            matches: Match::CATCHALL,
            actions: Vec::new(),
            cookie: 0,
            idle_timeout: 0,
            hard_timeout: 0,
            importance: 0,
            flags: FlowFlags::default(),
        }
    }
}

/// What a flow mod does.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum FlowModCommand {
    /// Add, replacing a flow with the identical match and priority in the same table.
    Add,
    /// Change the actions of matching flows (`strict`: same match and priority).
    Modify { strict: bool },
    /// Delete matching flows (`strict`: same match and priority).
    Delete { strict: bool },
}

/// One change to the flow tables (`add-flow`, `mod-flows`, `del-flows`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct FlowMod {
    pub command: FlowModCommand,
    /// Match, priority, actions, cookie and timeouts. For modify/delete,
    /// `flow.matches` selects flows (non-strict: every flow whose match is at
    /// least as specific; strict: identical match and priority).
    pub flow: Flow,
    /// For modify/delete: `None` = every table (`table=` not given).
    pub table: Option<u8>,
    /// For modify/delete: only flows whose `cookie & cookie_mask == flow.cookie & cookie_mask`.
    pub cookie_mask: u64,
    /// For delete: only flows that output to this port (`out_port=`).
    pub out_port: Option<u32>,
}

impl FlowMod {
    /// `add-flow` of `flow` into its own table.
    pub fn add(flow: Flow) -> FlowMod {
        FlowMod {
            command: FlowModCommand::Add,
            table: None,
            flow,
            cookie_mask: 0,
            out_port: None,
        }
    }
}

impl CtAction {
    /// The `nat` among the nested actions, if any.
    pub fn nat(&self) -> Option<&NatAction> {
        self.exec.iter().find_map(|a| match a {
            Action::Nat(n) => Some(n),
            _ => None,
        })
    }
}
