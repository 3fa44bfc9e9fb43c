//! Fragment reassembly tests: known datagrams are built byte by byte,
//! fragmented here (any cut, any order), fed to `Ipf` with keys from the real
//! extractor, and the reassembled frame must be the original datagram
//! exactly. Property tests add random cuts, orders, overlaps, garbage and
//! mutations, checking the bounds and the counters' conservation law.

mod common;

use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::{frag, Field};
use oxvs_pipeline::ipf::{Completed, Ipf, IpfConfig, IpfDrop, IpfOutcome};
use oxvs_pipeline::FlowKey;
use proptest::prelude::*;

use common::csum16;

const SEC: u64 = 1_000_000_000;

/// A config that accepts 8-byte fragments, so small datagrams fragment a lot.
fn permissive() -> IpfConfig {
    IpfConfig {
        min_frag_payload: 8,
        max_frags_per_datagram: 8192,
        ..IpfConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Datagrams and a fragmenter

fn l2(vlan: bool, ethertype: u16) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a];
    if vlan {
        f.extend_from_slice(&[0x81, 0x00, 0x20, 0x05]);
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A whole datagram and what the fragmenter needs to know about it.
#[derive(Clone, Debug)]
struct Orig {
    frame: Vec<u8>,
    /// Start of the IP header.
    l3: usize,
    /// Start of the fragmentable part (after IPv4 header / IPv6
    /// unfragmentable headers).
    body: usize,
    ipv6: bool,
    /// IPv6: the Next Header byte that names the first fragmentable header.
    nh_at: usize,
    id: u32,
}

impl Orig {
    fn body_len(&self) -> usize {
        self.frame.len() - self.body
    }

    /// The fragment carrying body bytes `start..end` (`start` a multiple of 8).
    fn fragment(&self, start: usize, end: usize) -> Vec<u8> {
        let more = end < self.body_len();
        let chunk = &self.frame[self.body + start..self.body + end];
        if self.ipv6 {
            let mut f = self.frame[..self.body].to_vec();
            let next = f[self.nh_at];
            f[self.nh_at] = 44;
            let plen = (self.body - self.l3 - 40 + 8 + chunk.len()) as u16;
            f[self.l3 + 4..self.l3 + 6].copy_from_slice(&plen.to_be_bytes());
            f.extend_from_slice(&[next, 0]);
            f.extend_from_slice(&((start as u16 & 0xfff8) | u16::from(more)).to_be_bytes());
            f.extend_from_slice(&self.id.to_be_bytes());
            f.extend_from_slice(chunk);
            f
        } else {
            // Later fragments carry no options (as for non-copied options),
            // so the reassembled header can only come from the first.
            let mut f = self.frame[..self.l3].to_vec();
            let mut h = if start == 0 {
                self.frame[self.l3..self.body].to_vec()
            } else {
                let mut h = self.frame[self.l3..self.l3 + 20].to_vec();
                h[0] = 0x45;
                h
            };
            let total = (h.len() + chunk.len()) as u16;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            let reserved = u16::from(h[6] & 0x80) << 8;
            let fw = reserved | (start / 8) as u16 | if more { 0x2000 } else { 0 };
            h[6..8].copy_from_slice(&fw.to_be_bytes());
            h[10..12].copy_from_slice(&[0, 0]);
            let c = csum16(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&h);
            f.extend_from_slice(chunk);
            f
        }
    }

    /// Fragments of the given sizes (in 8-byte units, used cyclically; the
    /// last fragment takes the rest). The first fragment is at least 16 bytes
    /// so that it holds the whole header chain (RFC 7112).
    fn cut(&self, units: &[usize]) -> Vec<Vec<u8>> {
        let len = self.body_len();
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while start < len {
            let size = units[i % units.len()].max(if i == 0 { 2 } else { 1 }) * 8;
            let end = (start + size).min(len);
            out.push(self.fragment(start, end));
            start = end;
            i += 1;
        }
        out
    }
}

fn udp(payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0x30, 0x39, 0x00, 0x35];
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// IPv4/UDP; `options`: a 4-byte Router Alert plus 4 bytes of NOP/EOL.
fn orig_v4(vlan: bool, options: bool, id: u16, payload: &[u8]) -> Orig {
    let mut f = l2(vlan, 0x0800);
    let l3 = f.len();
    let opts: &[u8] = if options {
        &[0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00]
    } else {
        &[]
    };
    let l4 = udp(payload);
    let ihl = 20 + opts.len();
    let mut h = vec![0x40 | (ihl / 4) as u8, 0x10];
    h.extend_from_slice(&((ihl + l4.len()) as u16).to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&[0, 0, 61, 17, 0, 0, 10, 1, 0, 5, 10, 2, 0, 7]);
    h.extend_from_slice(opts);
    let c = csum16(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(&l4);
    Orig {
        frame: f,
        l3,
        body: l3 + ihl,
        ipv6: false,
        nh_at: 0,
        id: u32::from(id),
    }
}

/// IPv6/UDP; `hbh`: an 8-byte hop-by-hop header (unfragmentable); `dstopts`:
/// an 8-byte destination options header before UDP (fragmentable).
fn orig_v6(vlan: bool, hbh: bool, dstopts: bool, id: u32, payload: &[u8]) -> Orig {
    let mut f = l2(vlan, 0x86dd);
    let l3 = f.len();
    let mut body = Vec::new();
    if dstopts {
        body.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
    }
    body.extend_from_slice(&udp(payload));
    let first_frag_nh = if dstopts { 60 } else { 17 };
    let unfrag: Vec<u8> = if hbh {
        vec![first_frag_nh, 0, 1, 4, 0, 0, 0, 0]
    } else {
        Vec::new()
    };
    let plen = (unfrag.len() + body.len()) as u16;
    f.extend_from_slice(&[0x60, 0x0a, 0xbc, 0xde]);
    f.extend_from_slice(&plen.to_be_bytes());
    f.push(if hbh { 0 } else { first_frag_nh });
    f.push(63);
    f.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11]);
    f.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x22]);
    let nh_at = if hbh { f.len() } else { l3 + 6 };
    f.extend_from_slice(&unfrag);
    let body_at = f.len();
    f.extend_from_slice(&body);
    Orig {
        frame: f,
        l3,
        body: body_at,
        ipv6: true,
        nh_at,
        id,
    }
}

fn payload(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------------------
// Feeding

fn key_of(frame: &[u8]) -> FlowKey {
    extract(frame, 1)
}

/// Feeds `frames` in order; all but the last must be held, the last must
/// complete the datagram.
fn feed_all(ipf: &mut Ipf, frames: &[Vec<u8>], zone: u16, now: u64) -> Completed {
    let (last, rest) = frames.split_last().expect("at least one fragment");
    for (i, f) in rest.iter().enumerate() {
        match ipf.add(f, &key_of(f), zone, now) {
            IpfOutcome::Held => {}
            other => panic!("fragment {i} of {}: {other:?}", frames.len()),
        }
    }
    match ipf.add(last, &key_of(last), zone, now) {
        IpfOutcome::Completed(c) => c,
        other => panic!("last fragment: {other:?}"),
    }
}

fn assert_conserved(ipf: &Ipf) {
    let s = ipf.stats();
    assert_eq!(
        s.fragments_total,
        s.held_fragments + s.fragments_reassembled_total + s.dropped_total(),
        "{s:?}"
    );
    assert_eq!(s.held_bytes as usize, ipf.held_bytes());
    assert_eq!(s.held_datagrams as usize, ipf.held_datagrams());
}

/// Reassembles `frames` (already in feeding order) and checks the result
/// against `orig`: the frame, both fragment orders, memory released.
fn check_reassembly(ipf: &mut Ipf, orig: &Orig, frames: &[Vec<u8>]) {
    let c = feed_all(ipf, frames, 3, 0);
    assert_eq!(c.frame(), &orig.frame[..], "reassembled frame");
    assert_eq!(c.zone(), 3);
    assert_eq!(c.is_ipv6(), orig.ipv6);
    assert_eq!(c.fragment_count(), frames.len());
    let received: Vec<&[u8]> = c.fragments().collect();
    let fed: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    assert_eq!(received, fed, "received order");
    let mut by_offset = fed.clone();
    by_offset.sort_by_key(|f| frag_offset(f));
    assert_eq!(c.fragments_by_offset().collect::<Vec<_>>(), by_offset);
    assert_eq!(
        c.fragment_bytes(),
        frames.iter().map(Vec::len).sum::<usize>()
    );
    // The reassembled frame is a whole datagram to the extractor.
    let k = key_of(c.frame());
    assert_eq!(k.get(Field::NwFrag), 0);
    assert_eq!(k.get(Field::TpSrc), 12345);
    assert_eq!(k.get(Field::TpDst), 53);
    ipf.recycle(c);
    assert_eq!(ipf.held_bytes(), 0);
    assert_eq!(ipf.held_datagrams(), 0);
    assert_conserved(ipf);
}

/// Fragment offset of a fragment frame built by `Orig::fragment`.
fn frag_offset(f: &[u8]) -> usize {
    let l3 = if f[12] == 0x81 { 18 } else { 14 };
    if f[l3] >> 4 == 4 {
        usize::from(u16::from_be_bytes([f[l3 + 6], f[l3 + 7]]) & 0x1fff) * 8
    } else {
        // Walk to the fragment header (at most a hop-by-hop header first).
        let mut nh = f[l3 + 6];
        let mut at = l3 + 40;
        while nh != 44 {
            nh = f[at];
            at += (usize::from(f[at + 1]) + 1) * 8;
        }
        usize::from(u16::from_be_bytes([f[at + 2], f[at + 3]]) & 0xfff8)
    }
}

fn orders(frames: &[Vec<u8>]) -> Vec<Vec<Vec<u8>>> {
    let in_order = frames.to_vec();
    let mut reverse = frames.to_vec();
    reverse.reverse();
    // Out of order: odd ones first, then even ones, last fragment in the middle.
    let mut mixed: Vec<Vec<u8>> = frames.iter().skip(1).step_by(2).cloned().collect();
    mixed.extend(frames.iter().step_by(2).cloned());
    vec![in_order, reverse, mixed]
}

// ---------------------------------------------------------------------------
// Examples

#[test]
fn ipv4_in_order_reverse_and_mixed() {
    for vlan in [false, true] {
        for options in [false, true] {
            let orig = orig_v4(vlan, options, 0x1234, &payload(3000, 7));
            let frames = orig.cut(&[185]); // 1480-byte fragments (MTU 1500)
            assert_eq!(frames.len(), 3);
            for order in orders(&frames) {
                let mut ipf = Ipf::new(IpfConfig::default());
                check_reassembly(&mut ipf, &orig, &order);
            }
        }
    }
}

#[test]
fn ipv6_in_order_reverse_and_mixed() {
    for vlan in [false, true] {
        for (hbh, dstopts) in [(false, false), (true, false), (true, true)] {
            let orig = orig_v6(vlan, hbh, dstopts, 0xdead_beef, &payload(5000, 9));
            // 1232 bytes: the largest fragment of a 1280-byte path.
            let frames = orig.cut(&[154]);
            assert!(frames.len() >= 4);
            for order in orders(&frames) {
                let mut ipf = Ipf::new(IpfConfig::default());
                check_reassembly(&mut ipf, &orig, &order);
            }
        }
    }
}

#[test]
fn largest_datagrams_reassemble_with_default_limits() {
    // 65535-byte IPv4 datagram on a 1500-byte MTU: 45 fragments.
    let orig = orig_v4(false, false, 1, &payload(65535 - 28, 1));
    let frames = orig.cut(&[185]);
    assert_eq!(frames.len(), 45);
    let mut ipf = Ipf::new(IpfConfig::default());
    check_reassembly(&mut ipf, &orig, &frames);
    // IPv6 payload length 65535 on a 1280-byte path: 54 fragments.
    let orig = orig_v6(false, false, false, 2, &payload(65535 - 8, 2));
    let frames = orig.cut(&[154]);
    assert_eq!(frames.len(), 54);
    check_reassembly(&mut ipf, &orig, &frames);
    // One byte more does not fit.
    let orig = orig_v6(false, false, false, 3, &payload(65535 - 7, 3));
    let frames = orig.cut(&[154]);
    let mut last = IpfOutcome::Held;
    for f in &frames {
        last = ipf.add(f, &key_of(f), 0, 0);
    }
    assert!(
        matches!(last, IpfOutcome::Dropped(IpfDrop::TooLong)),
        "{last:?}"
    );
    assert_eq!(ipf.held_bytes(), 0);
}

#[test]
fn interleaved_datagrams_and_zones() {
    let a = orig_v4(false, false, 77, &payload(2000, 1));
    let b = orig_v4(true, true, 78, &payload(1500, 2));
    let c = orig_v6(false, true, false, 77, &payload(2500, 3));
    let (fa, fb, fc) = (a.cut(&[100]), b.cut(&[60, 70]), c.cut(&[80]));
    let mut ipf = Ipf::new(IpfConfig::default());
    let mut done = Vec::new();
    let longest = fa.len().max(fb.len()).max(fc.len());
    for i in (0..longest).rev() {
        for (frames, zone) in [(&fa, 1u16), (&fb, 1), (&fc, 1), (&fa, 2)] {
            if let Some(f) = frames.get(i) {
                match ipf.add(f, &key_of(f), zone, 0) {
                    IpfOutcome::Held => {}
                    IpfOutcome::Completed(c) => done.push((zone, c.frame().to_vec())),
                    IpfOutcome::Dropped(r) => panic!("dropped: {r}"),
                }
            }
        }
    }
    done.sort();
    let mut want = vec![
        (1, a.frame.clone()),
        (1, b.frame.clone()),
        (1, c.frame.clone()),
        (2, a.frame.clone()),
    ];
    want.sort();
    assert_eq!(done, want);
    assert_eq!(ipf.held_bytes(), 0);
    assert_conserved(&ipf);
}

#[test]
fn timeouts_free_memory() {
    // One source holds 100 datagrams: above the per-source default.
    let mut ipf = Ipf::new(IpfConfig {
        max_datagrams_per_source: 100,
        ..IpfConfig::default()
    });
    for id in 0..100u16 {
        let orig = orig_v4(false, false, id, &payload(3000, id as u8));
        let frames = orig.cut(&[185]);
        let f = &frames[1];
        assert!(matches!(
            ipf.add(f, &key_of(f), 0, u64::from(id) * SEC / 10),
            IpfOutcome::Held
        ));
    }
    assert_eq!(ipf.held_datagrams(), 100);
    assert!(ipf.held_bytes() > 100 * 1480);
    // 30 s after the first: ids 0..=0 at exactly 30 s, then one per 100 ms.
    assert_eq!(ipf.expire(30 * SEC), 1);
    assert_eq!(ipf.expire(35 * SEC), 50);
    assert_eq!(ipf.expire(100 * SEC), 49);
    assert_eq!(ipf.held_bytes(), 0);
    assert_eq!(ipf.held_datagrams(), 0);
    let s = ipf.stats();
    assert_eq!(s.expired_datagrams_total, 100);
    assert_eq!(s.dropped(IpfDrop::Timeout), 100);
    assert_conserved(&ipf);

    // A datagram whose fragments straddle its timeout never completes; its
    // late fragment starts a new one.
    let orig = orig_v6(false, false, false, 5, &payload(3000, 5));
    let frames = orig.cut(&[154]);
    assert!(matches!(
        ipf.add(&frames[0], &key_of(&frames[0]), 0, 0),
        IpfOutcome::Held
    ));
    assert!(matches!(
        ipf.add(&frames[1], &key_of(&frames[1]), 0, 10 * SEC),
        IpfOutcome::Held
    ));
    assert!(matches!(
        ipf.add(&frames[2], &key_of(&frames[2]), 0, 30 * SEC),
        IpfOutcome::Held
    ));
    assert_eq!(ipf.held_fragments(), 1);
    assert_eq!(ipf.stats().dropped(IpfDrop::Timeout), 102);
}

#[test]
fn limits_hold_under_a_flood() {
    let config = IpfConfig {
        max_bytes: 64 * 1024,
        max_datagrams: 16,
        ..IpfConfig::default()
    };
    let mut ipf = Ipf::new(config);
    let mut full = 0;
    for id in 0..1000u16 {
        let orig = orig_v4(false, false, id, &payload(3000, 0));
        let f = &orig.cut(&[185])[0];
        if let IpfOutcome::Dropped(r) = ipf.add(f, &key_of(f), 0, u64::from(id)) {
            assert!(matches!(r, IpfDrop::TableFull | IpfDrop::MemoryFull), "{r}");
            full += 1;
        }
        assert!(ipf.held_bytes() <= config.max_bytes);
        assert!(ipf.held_datagrams() <= config.max_datagrams);
    }
    assert_eq!(full, 1000 - 16);
    assert_conserved(&ipf);
    // A legitimate datagram gets in once the flood has timed out.
    let orig = orig_v4(false, false, 5000, &payload(3000, 1));
    let frames = orig.cut(&[185]);
    for (i, f) in frames.iter().enumerate() {
        let out = ipf.add(f, &key_of(f), 0, 31 * SEC);
        assert_eq!(
            matches!(out, IpfOutcome::Completed(_)),
            i == frames.len() - 1
        );
    }
}

// ---------------------------------------------------------------------------
// Properties

#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Held,
    Completed,
    Drop(IpfDrop),
}

fn any_orig() -> impl Strategy<Value = Orig> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u32>(),
        9usize..3000,
        any::<u8>(),
    )
        .prop_map(|(v6, vlan, ext, ext2, id, n, seed)| {
            let data = payload(n, seed);
            if v6 {
                orig_v6(vlan, ext, ext2, id, &data)
            } else {
                orig_v4(vlan, ext, id as u16, &data)
            }
        })
}

/// A datagram cut into at least two fragments, in a random order.
fn any_fragmented() -> impl Strategy<Value = (Orig, Vec<Vec<u8>>)> {
    (any_orig(), prop::collection::vec(1usize..200, 1..6)).prop_flat_map(|(orig, units)| {
        let mut frames = orig.cut(&units);
        if frames.len() < 2 {
            // Force two fragments: the first 16 bytes, then the rest.
            frames = vec![orig.fragment(0, 16), orig.fragment(16, orig.body_len())];
        }
        (Just(orig), Just(frames).prop_shuffle())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_cuts_and_orders_reassemble_exactly((orig, frames) in any_fragmented()) {
        let mut ipf = Ipf::new(permissive());
        check_reassembly(&mut ipf, &orig, &frames);
        // Reused buffers give the same answer.
        check_reassembly(&mut ipf, &orig, &frames);
    }

    /// Overlapping and duplicated pieces of one datagram, checked step by
    /// step against a reference model of the rules (exact duplicates are
    /// dropped alone, any other overlap forgets the datagram); anything
    /// reassembled is the original, and memory comes back.
    #[test]
    fn overlaps_follow_the_model(
        orig in any_orig(),
        pieces in prop::collection::vec((0usize..400, 1usize..60, any::<bool>()), 1..40),
    ) {
        let mut ipf = Ipf::new(permissive());
        let len = orig.body_len();
        // The first fragment must hold the destination options header too.
        let first_min = if orig.ipv6 && orig.frame[orig.nh_at] == 60 { 16 } else { 8 };
        let mut model: Vec<(usize, usize)> = Vec::new();
        for (start_unit, units, to_end) in pieces {
            let start = (start_unit * 8).min((len - 1) / 8 * 8);
            let end = if to_end { len } else { (start + units * 8).min(len) };
            let want = if start == 0 && end == len {
                Expect::Drop(IpfDrop::NotAFragment)
            } else if start == 0 && end < first_min {
                Expect::Drop(IpfDrop::TinyFirstFragment)
            } else if model.contains(&(start, end)) {
                Expect::Drop(IpfDrop::Duplicate)
            } else if model.iter().any(|&(s, e)| s < end && start < e) {
                model.clear();
                Expect::Drop(IpfDrop::Overlap)
            } else {
                model.push((start, end));
                let covered: usize = model.iter().map(|(s, e)| e - s).sum();
                if covered == len && model.iter().any(|&(_, e)| e == len) {
                    model.clear();
                    Expect::Completed
                } else {
                    Expect::Held
                }
            };
            let f = orig.fragment(start, end);
            let mut key = key_of(&f);
            key.set(Field::NwFrag, u128::from(frag::ANY));
            let got = match ipf.add(&f, &key, 0, 0) {
                IpfOutcome::Completed(c) => {
                    prop_assert_eq!(c.frame(), &orig.frame[..]);
                    ipf.recycle(c);
                    Expect::Completed
                }
                IpfOutcome::Held => Expect::Held,
                IpfOutcome::Dropped(r) => Expect::Drop(r),
            };
            prop_assert_eq!(got, want, "piece {}..{} of {}", start, end, len);
            prop_assert_eq!(ipf.held_fragments(), model.len());
            assert_conserved(&ipf);
        }
        ipf.flush();
        prop_assert_eq!(ipf.held_bytes(), 0);
        assert_conserved(&ipf);
    }

    /// Garbage, truncations and byte flips of real fragments, keys forced to
    /// "fragment" half the time: no panic, limits hold, counters add up,
    /// and expiry empties everything.
    #[test]
    fn garbage_and_mutations_respect_limits(
        origs in prop::collection::vec(any_fragmented(), 1..4),
        ops in prop::collection::vec(
            (any::<usize>(), any::<usize>(), any::<u8>(), 0u8..5, any::<bool>(), 0u16..3),
            1..120,
        ),
        garbage in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..10),
        max_bytes in 0usize..20_000,
        max_datagrams in 0usize..6,
        max_frags in 1usize..10,
    ) {
        let config = IpfConfig {
            max_bytes,
            max_datagrams,
            max_frags_per_datagram: max_frags,
            min_frag_payload: 8,
            timeout_ns: 50,
            ..IpfConfig::default()
        };
        let mut ipf = Ipf::new(config);
        let pool: Vec<&Vec<u8>> = origs.iter().flat_map(|(_, fs)| fs.iter()).collect();
        for (now, (pick, at, byte, how, force, zone)) in ops.into_iter().enumerate() {
            let mut f = if how == 4 && !garbage.is_empty() {
                garbage[pick % garbage.len()].clone()
            } else {
                pool[pick % pool.len()].clone()
            };
            match how {
                1 if !f.is_empty() => { let i = at % f.len(); f[i] ^= byte | 1; }
                2 => f.truncate(at % (f.len() + 1)),
                3 => f.extend_from_slice(&[byte; 9]),
                _ => {}
            }
            let mut key = key_of(&f);
            if force {
                key.set(Field::NwFrag, u128::from(frag::ANY | (byte & frag::LATER)));
            }
            if let IpfOutcome::Completed(c) = ipf.add(&f, &key, zone, now as u64) {
                ipf.recycle(c);
            }
            prop_assert!(ipf.held_bytes() <= max_bytes);
            prop_assert!(ipf.held_datagrams() <= max_datagrams);
            assert_conserved(&ipf);
        }
        ipf.expire(u64::MAX);
        prop_assert_eq!(ipf.held_bytes(), 0);
        prop_assert_eq!(ipf.held_datagrams(), 0);
        assert_conserved(&ipf);
    }
}
