//! Fuzz target: IP fragment reassembly on arbitrary frames. The input is a
//! sequence of records `[flags, len, zone, frame bytes (len)]`; each frame
//! goes to `Ipf::add` with its extracted key (or, when `flags & 1`, a key
//! forced to say "fragment") at a time that only grows (`flags >> 1` ms per
//! record, so datagrams also time out). Small limits make every limit
//! reachable. Checked after every call: held bytes and datagrams within the
//! limits, and every offered fragment counted exactly once (held,
//! reassembled or dropped). At the end, expiry must free everything.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::{frag, Field};
use oxvs_pipeline::ipf::{Ipf, IpfConfig, IpfOutcome};

const MS: u64 = 1_000_000;

fuzz_target!(|data: &[u8]| {
    let config = IpfConfig {
        max_bytes: 16 * 1024,
        max_datagrams: 8,
        max_frags_per_datagram: 16,
        min_frag_payload: 8,
        timeout_ns: 100 * MS,
        ..IpfConfig::default()
    };
    let mut ipf = Ipf::new(config);
    let mut now = 0u64;
    let mut rest = data;
    while let [flags, len, zone, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (frame, after) = tail.split_at(n);
        rest = after;
        now += u64::from(flags >> 1) * MS;

        let mut key = extract(frame, 1);
        if flags & 1 != 0 {
            key.set(Field::NwFrag, u128::from(frag::ANY));
        }
        if let IpfOutcome::Completed(done) = ipf.add(frame, &key, u16::from(*zone % 4), now) {
            assert!(done.fragment_count() >= 2);
            ipf.recycle(done);
        }

        assert!(ipf.held_bytes() <= config.max_bytes);
        assert!(ipf.held_datagrams() <= config.max_datagrams);
        let s = ipf.stats();
        assert_eq!(
            s.fragments_total,
            s.held_fragments + s.fragments_reassembled_total + s.dropped_total()
        );
    }
    ipf.expire(u64::MAX);
    assert_eq!(ipf.held_bytes(), 0);
    assert_eq!(ipf.held_datagrams(), 0);
});
