//! Datapath actions: what the slow path compiles a packet's trip through the
//! flow tables into, and what the caches store and the datapath executes.
//!
//! A translation ([`crate::xlate`]) ends in a short list of [`DpAction`]s,
//! the same idea as OVS's ODP actions. Header writes are accumulated during
//! translation and emitted right before the action that needs them (an
//! output, a `ct`, a recirculation), so a list reads like OVS's
//! `Datapath actions:` line: `set(eth(src=..,dst=..)),set(ipv4(ttl=63)),3`.
//!
//! Recirculation: `ct(table=T)` compiles to `Ct{..}` then `Recirc(id)`. The
//! recirculated copy of the packet starts over with `recirc_id = id` in its
//! key (and the connection tracker's verdict in `ct_state`/`ct_mark`/...), and
//! the slow path resumes at table `id - 1` (see [`recirc_id_for_table`]).
//! Registers and other metadata the first pass wrote are carried to the next
//! pass by `LoadMeta` actions placed just before `Recirc` (they change only
//! the key, never the packet, and are not printed in the OVS format).

use crate::field::Field;
use crate::flow::PacketInReason;

/// The recirculation id used for `ct(table=T)`: `T + 1` (0 means "from a port").
pub const fn recirc_id_for_table(table: u8) -> u32 {
    table as u32 + 1
}

/// The table a recirculated packet resumes in, for a nonzero recirculation id.
pub const fn table_for_recirc_id(id: u32) -> Option<u8> {
    if id == 0 || id > 255 {
        None
    } else {
        Some((id - 1) as u8)
    }
}

/// One datapath action.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum DpAction {
    /// Transmit a copy of the packet (as modified so far) on an OpenFlow port.
    Output(u32),
    /// Write a header field of the packet (and the key). Only fields with
    /// [`Field::is_header`] appear here.
    Set { field: Field, value: u128 },
    /// Push an 802.1Q tag.
    PushVlan { tpid: u16, tci: u16 },
    /// Remove the outermost 802.1Q tag.
    PopVlan,
    /// Tunnel metadata for the next output to a tunnel port.
    SetTunnel { tun_id: u64, src: u32, dst: u32 },
    /// Run the packet through the connection tracker.
    Ct {
        zone: u16,
        commit: bool,
        force: bool,
        /// `(value, mask)` to store as ct_mark on commit.
        mark: Option<(u32, u32)>,
        /// `(value, mask)` to store as ct_label on commit.
        label: Option<(u128, u128)>,
    },
    /// Clear the packet's conntrack state (`ct_clear`).
    CtClear,
    /// Write a metadata field of the key (registers, metadata, pkt_mark,
    /// tunnel fields) so that it survives a recirculation. Not printed.
    LoadMeta { field: Field, value: u128 },
    /// Re-inject a copy of the packet into the pipeline with this recirc_id.
    Recirc(u32),
    /// Send the packet to the controller's packet-in queue.
    Userspace {
        reason: PacketInReason,
        userdata: Vec<u8>,
        /// Table and cookie of the flow that sent it (for the packet-in).
        table: u8,
        cookie: u64,
    },
}

/// Formats a datapath action list the way OVS prints `Datapath actions:`
/// (`drop` when empty). (Being written.)
pub fn format_dp_actions(actions: &[DpAction]) -> String {
    if actions.is_empty() {
        return "drop".into();
    }
    format!("{actions:?}")
}
