//! Fuzz target: flow key extraction on arbitrary bytes.
//!
//! Invariants checked beyond "no panic": `extract_packet` keeps every
//! metadata bit of the key it is given and writes the same packet fields as
//! `extract` does from a zero key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxvs_pipeline::extract::{extract, extract_packet, PACKET_FIELDS};
use oxvs_pipeline::{Field, FlowKey};

fuzz_target!(|frame: &[u8]| {
    let fresh = extract(frame, 7);
    assert_eq!(fresh.get(Field::InPort), 7);

    // A key full of metadata and stale packet fields.
    let mut key = FlowKey {
        w: [0xa5a5_a5a5_a5a5_a5a5; oxvs_pipeline::field::KEY_WORDS],
    };
    let before = key;
    extract_packet(frame, &mut key);
    let mut packet_mask = FlowKey::ZERO;
    for f in PACKET_FIELDS {
        packet_mask.mask_field(f);
    }
    for i in 0..key.w.len() {
        let m = packet_mask.w[i];
        assert_eq!(key.w[i] & !m, before.w[i] & !m, "metadata word {i} changed");
        assert_eq!(
            key.w[i] & m,
            fresh.w[i] & m,
            "packet word {i} differs from extract()"
        );
    }
});
