//! Flow key extraction from raw Ethernet frames. (Being written.)
use crate::field::Field;
use crate::key::FlowKey;

/// Extracts the key of a frame that arrived on `in_port` (metadata zero).
pub fn extract(frame: &[u8], in_port: u32) -> FlowKey {
    let mut key = FlowKey::ZERO;
    key.set(Field::InPort, in_port as u128);
    extract_packet(frame, &mut key);
    key
}

/// Writes the packet-header fields of `key` from `frame`, leaving metadata
/// (in_port, registers, tunnel, conntrack, recirc_id) as it is.
pub fn extract_packet(_frame: &[u8], _key: &mut FlowKey) {}
