//! Classifier tests. Conjunction cases marked "OVS" were checked against
//! Open vSwitch 3.1 `ofproto/trace` with the same flows.

use super::*;
use crate::flow::Flow;
use crate::tables::RuleStats;
use proptest::prelude::*;

fn rule(priority: u16, m: Match, actions: Vec<Action>) -> Arc<Rule> {
    Arc::new(Rule {
        flow: Flow {
            priority,
            matches: m,
            actions,
            ..Flow::default()
        },
        created_ns: 0,
        stats: RuleStats::default(),
    })
}

fn out(p: u32) -> Vec<Action> {
    vec![Action::Output(p)]
}

fn conj(id: u32, k: u8, n: u8) -> Action {
    Action::Conjunction {
        id,
        clause: k,
        n_clauses: n,
    }
}

fn m(fields: &[(Field, u128)]) -> Match {
    let mut m = Match::CATCHALL;
    for (f, v) in fields {
        m.set_exact(*f, *v);
    }
    m
}

fn ip() -> (Field, u128) {
    (Field::DlType, 0x0800)
}

fn key(fields: &[(Field, u128)]) -> FlowKey {
    let mut k = FlowKey::ZERO;
    for (f, v) in fields {
        k.set(*f, *v);
    }
    k
}

/// The output port of the winning rule (`None`: no match; 0: non-output).
fn hit(c: &Classifier, k: &FlowKey) -> Option<u32> {
    let mut wc = FlowKey::ZERO;
    c.lookup(k, &mut wc).map(|r| match r.flow.actions.first() {
        Some(Action::Output(p)) => *p,
        _ => 0,
    })
}

fn lookup_wc(c: &Classifier, k: &FlowKey) -> (Option<u32>, FlowKey) {
    let mut wc = FlowKey::ZERO;
    let r = c.lookup(k, &mut wc).map(|r| match r.flow.actions.first() {
        Some(Action::Output(p)) => *p,
        _ => 0,
    });
    (r, wc)
}

#[test]
fn empty_classifier_matches_nothing() {
    let c = Classifier::new();
    let (r, wc) = lookup_wc(&c, &key(&[(Field::InPort, 1)]));
    assert_eq!(r, None);
    assert!(wc.is_zero());
}

#[test]
fn highest_priority_wins_and_replace_keeps_one_rule() {
    let mut c = Classifier::new();
    c.insert(rule(10, m(&[(Field::InPort, 1)]), out(1)));
    c.insert(rule(20, m(&[(Field::InPort, 1), ip()]), out(2)));
    c.insert(rule(5, Match::CATCHALL, out(3)));
    assert_eq!(c.len(), 3);
    assert_eq!(c.n_subtables(), 3);
    assert_eq!(hit(&c, &key(&[(Field::InPort, 1), ip()])), Some(2));
    assert_eq!(hit(&c, &key(&[(Field::InPort, 1)])), Some(1));
    assert_eq!(hit(&c, &key(&[(Field::InPort, 2)])), Some(3));
    // Same match and priority: replaced.
    let old = c.insert(rule(10, m(&[(Field::InPort, 1)]), out(9)));
    assert!(old.is_some());
    assert_eq!(c.len(), 3);
    assert_eq!(hit(&c, &key(&[(Field::InPort, 1)])), Some(9));
    // Same match, other priority: a second rule in the same list.
    c.insert(rule(30, m(&[(Field::InPort, 1)]), out(4)));
    assert_eq!(c.len(), 4);
    assert_eq!(c.n_subtables(), 3);
    assert_eq!(hit(&c, &key(&[(Field::InPort, 1), ip()])), Some(4));
    let removed = c
        .remove(&m(&[(Field::InPort, 1)]), 30)
        .map(|r| r.flow.priority);
    assert_eq!(removed, Some(30));
    assert_eq!(hit(&c, &key(&[(Field::InPort, 1), ip()])), Some(2));
    assert!(c.remove(&m(&[(Field::InPort, 1)]), 30).is_none());
}

#[test]
fn masked_prefixes() {
    let mut c = Classifier::new();
    let mut m24 = m(&[ip()]);
    m24.set(Field::NwDst, 0x0a00_0100, 0xffff_ff00);
    let mut m16 = m(&[ip()]);
    m16.set(Field::NwDst, 0x0a00_0000, 0xffff_0000);
    c.insert(rule(24, m24, out(24)));
    c.insert(rule(16, m16, out(16)));
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwDst, 0x0a00_0105)])),
        Some(24)
    );
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwDst, 0x0a00_0205)])),
        Some(16)
    );
    assert_eq!(hit(&c, &key(&[ip(), (Field::NwDst, 0x0b00_0105)])), None);
    assert_eq!(hit(&c, &key(&[(Field::NwDst, 0x0a00_0105)])), None);
}

#[test]
fn subtable_pruning_and_wildcards() {
    let mut c = Classifier::new();
    // High priority: exact in_port + tp_dst (does not match the key below).
    c.insert(rule(
        100,
        m(&[(Field::InPort, 1), (Field::TpDst, 80)]),
        out(1),
    ));
    // Middle: in_port only (matches).
    c.insert(rule(50, m(&[(Field::InPort, 1)]), out(2)));
    // Low: nw_src (would match, but cannot win: never probed).
    c.insert(rule(10, m(&[(Field::NwSrc, 7)]), out(3)));
    let k = key(&[(Field::InPort, 1), (Field::TpDst, 443), (Field::NwSrc, 7)]);
    let (r, wc) = lookup_wc(&c, &k);
    assert_eq!(r, Some(2));
    // tp_dst was consulted by the non-matching higher-priority subtable.
    assert_eq!(wc.get(Field::TpDst), 0xffff);
    assert_eq!(wc.get(Field::InPort), 0xffff_ffff);
    // nw_src's subtable was pruned.
    assert_eq!(wc.get(Field::NwSrc), 0);
    // A miss consults everything.
    let (r, wc) = lookup_wc(&c, &key(&[(Field::InPort, 2)]));
    assert_eq!(r, None);
    assert_eq!(wc.get(Field::NwSrc), 0xffff_ffff);
    // wc is OR-ed into, never cleared.
    let mut wc = key(&[(Field::Reg(3), 5)]);
    c.lookup(&k, &mut wc);
    assert_eq!(wc.get(Field::Reg(3)), 5);
}

#[test]
fn equal_priority_oldest_wins_and_modify_keeps_age() {
    let mut c = Classifier::new();
    c.insert(rule(10, m(&[(Field::NwSrc, 1)]), out(1)));
    c.insert(rule(10, m(&[(Field::NwDst, 2)]), out(2)));
    let k = key(&[(Field::NwSrc, 1), (Field::NwDst, 2)]);
    let (r, wc) = lookup_wc(&c, &k);
    assert_eq!(r, Some(1));
    // Both subtables consulted to break the tie.
    assert_eq!(wc.get(Field::NwSrc), 0xffff_ffff);
    assert_eq!(wc.get(Field::NwDst), 0xffff_ffff);
    // Modify (replace) keeps the age.
    assert!(c
        .replace(rule(10, m(&[(Field::NwSrc, 1)]), out(5)))
        .is_some());
    assert_eq!(hit(&c, &k), Some(5));
    // Re-adding makes it the newest.
    c.insert(rule(10, m(&[(Field::NwSrc, 1)]), out(6)));
    assert_eq!(hit(&c, &k), Some(2));
    // Replace of something absent inserts nothing.
    assert!(c
        .replace(rule(11, m(&[(Field::NwSrc, 1)]), out(7)))
        .is_none());
    assert_eq!(c.len(), 2);
}

#[test]
fn empty_subtables_are_removed() {
    let mut c = Classifier::new();
    c.insert(rule(1, m(&[(Field::NwSrc, 1)]), out(1)));
    c.insert(rule(2, m(&[(Field::NwDst, 1)]), out(2)));
    c.insert(rule(3, m(&[(Field::TpDst, 1)]), out(3)));
    assert_eq!(c.n_subtables(), 3);
    assert!(c.remove(&m(&[(Field::NwSrc, 1)]), 1).is_some());
    assert_eq!(c.n_subtables(), 2);
    assert_eq!(hit(&c, &key(&[(Field::NwDst, 1)])), Some(2));
    assert_eq!(hit(&c, &key(&[(Field::TpDst, 1)])), Some(3));
    assert!(c.remove(&m(&[(Field::TpDst, 1)]), 3).is_some());
    assert!(c.remove(&m(&[(Field::NwDst, 1)]), 2).is_some());
    assert!(c.is_empty());
    assert_eq!(c.n_subtables(), 0);
    assert_eq!(hit(&c, &key(&[(Field::NwDst, 1)])), None);
}

/// The OVS manual's example: 2 clauses, src and dst sets.
fn two_clause() -> Classifier {
    let mut c = Classifier::new();
    c.insert(rule(100, m(&[(Field::ConjId, 1234)]), out(1234)));
    for src in [1, 4, 6, 7] {
        c.insert(rule(
            10,
            m(&[ip(), (Field::NwSrc, src)]),
            vec![conj(1234, 1, 2)],
        ));
    }
    for dst in [2, 5, 7, 8] {
        c.insert(rule(
            10,
            m(&[ip(), (Field::NwDst, dst)]),
            vec![conj(1234, 2, 2)],
        ));
    }
    c
}

#[test]
fn conjunction_two_clauses() {
    let c = two_clause();
    let (r, wc) = lookup_wc(&c, &key(&[ip(), (Field::NwSrc, 4), (Field::NwDst, 8)]));
    assert_eq!(r, Some(1234));
    assert_eq!(
        wc.get(Field::ConjId),
        0,
        "conj_id never reaches the megaflow"
    );
    assert_eq!(wc.get(Field::NwSrc), 0xffff_ffff);
    assert_eq!(wc.get(Field::NwDst), 0xffff_ffff);
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 4), (Field::NwDst, 3)])),
        None
    );
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 3), (Field::NwDst, 8)])),
        None
    );
    // Same address in both dimensions.
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 7), (Field::NwDst, 7)])),
        Some(1234)
    );
}

#[test]
fn conjunction_three_clauses() {
    let mut c = Classifier::new();
    c.insert(rule(1, m(&[(Field::ConjId, 3)]), out(3)));
    c.insert(rule(0, Match::CATCHALL, out(99)));
    c.insert(rule(20, m(&[(Field::NwSrc, 1)]), vec![conj(3, 1, 3)]));
    c.insert(rule(20, m(&[(Field::NwDst, 2)]), vec![conj(3, 2, 3)]));
    c.insert(rule(20, m(&[(Field::TpDst, 80)]), vec![conj(3, 3, 3)]));
    c.insert(rule(20, m(&[(Field::TpDst, 443)]), vec![conj(3, 3, 3)]));
    let full = key(&[(Field::NwSrc, 1), (Field::NwDst, 2), (Field::TpDst, 443)]);
    assert_eq!(hit(&c, &full), Some(3));
    let two_of_three = key(&[(Field::NwSrc, 1), (Field::NwDst, 2), (Field::TpDst, 22)]);
    assert_eq!(hit(&c, &two_of_three), Some(99));
}

#[test]
fn several_conjunctions_and_shared_clauses() {
    // ip_src in {a,b} and ip_dst in {d,e} -> id 1; ip_src in {b,c} and
    // ip_dst in {f,g} -> id 2; the ip_src=b flow belongs to both.
    let mut c = Classifier::new();
    c.insert(rule(50, m(&[(Field::ConjId, 1)]), out(1)));
    c.insert(rule(50, m(&[(Field::ConjId, 2)]), out(2)));
    c.insert(rule(10, m(&[(Field::NwSrc, 0xa)]), vec![conj(1, 1, 2)]));
    c.insert(rule(
        10,
        m(&[(Field::NwSrc, 0xb)]),
        vec![conj(1, 1, 2), conj(2, 1, 2)],
    ));
    c.insert(rule(10, m(&[(Field::NwSrc, 0xc)]), vec![conj(2, 1, 2)]));
    c.insert(rule(10, m(&[(Field::NwDst, 0xd)]), vec![conj(1, 2, 2)]));
    c.insert(rule(
        10,
        m(&[(Field::NwDst, 0xe)]),
        vec![conj(1, 2, 2), Action::Note(vec![1])],
    ));
    c.insert(rule(10, m(&[(Field::NwDst, 0xf)]), vec![conj(2, 2, 2)]));
    let k = |s, d| key(&[(Field::NwSrc, s), (Field::NwDst, d)]);
    assert_eq!(hit(&c, &k(0xa, 0xd)), Some(1));
    assert_eq!(hit(&c, &k(0xb, 0xe)), Some(1));
    assert_eq!(hit(&c, &k(0xb, 0xf)), Some(2));
    assert_eq!(hit(&c, &k(0xc, 0xf)), Some(2));
    assert_eq!(hit(&c, &k(0xc, 0xd)), None);
    assert_eq!(hit(&c, &k(0xa, 0xf)), None);
}

#[test]
fn several_ids_complete_smallest_id_with_a_flow_wins() {
    let mut c = Classifier::new();
    c.insert(rule(
        10,
        m(&[(Field::NwSrc, 1)]),
        vec![conj(7, 1, 2), conj(5, 1, 2)],
    ));
    c.insert(rule(
        10,
        m(&[(Field::NwDst, 2)]),
        vec![conj(7, 2, 2), conj(5, 2, 2)],
    ));
    c.insert(rule(1, m(&[(Field::ConjId, 7)]), out(7)));
    let k = key(&[(Field::NwSrc, 1), (Field::NwDst, 2)]);
    // Only id 7 has a conj_id flow: 5 is tried first and finds nothing.
    assert_eq!(hit(&c, &k), Some(7));
    c.insert(rule(1, m(&[(Field::ConjId, 5)]), out(5)));
    assert_eq!(hit(&c, &k), Some(5));
}

#[test]
fn incomplete_conjunction_falls_back_to_lower_priority() {
    let mut c = two_clause();
    c.insert(rule(5, m(&[ip()]), out(5)));
    // Only clause 1 matches: the ordinary lower-priority flow wins.
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 1), (Field::NwDst, 3)])),
        Some(5)
    );
    // A lower-priority ordinary flow with the same match as a clause flow
    // (same subtable, same masked value) is found under it (OVS).
    c.insert(rule(3, m(&[ip(), (Field::NwSrc, 1)]), out(3)));
    c.insert(rule(6, m(&[ip(), (Field::NwSrc, 1)]), out(6)));
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 1), (Field::NwDst, 3)])),
        Some(6)
    );
}

#[test]
fn higher_priority_ordinary_flow_beats_conjunction() {
    let mut c = two_clause();
    c.insert(rule(11, m(&[ip(), (Field::NwDst, 8)]), out(11)));
    let k = key(&[ip(), (Field::NwSrc, 4), (Field::NwDst, 8)]);
    assert_eq!(hit(&c, &k), Some(11));
    // At equal priority the ordinary flow wins too (OVS: soft <= hard_pri is dropped).
    let mut c = two_clause();
    c.insert(rule(10, m(&[ip(), (Field::TpDst, 0)]), out(10)));
    assert_eq!(hit(&c, &k), Some(10));
    // Lower priority: the conjunction wins.
    let mut c = two_clause();
    c.insert(rule(9, m(&[ip(), (Field::NwDst, 8)]), out(9)));
    assert_eq!(hit(&c, &k), Some(1234));
}

#[test]
fn conjunction_second_lookup_may_return_any_flow_like_ovs() {
    // OVS: priority 10 conjunction 7 completes but no conj_id=7 flow
    // exists; the conj_id=7 lookup returns the priority-0 catch-all, even
    // though conjunction 8 at priority 8 would also complete.
    let mut c = Classifier::new();
    c.insert(rule(0, Match::CATCHALL, out(100)));
    c.insert(rule(10, m(&[ip(), (Field::NwSrc, 1)]), vec![conj(7, 1, 2)]));
    c.insert(rule(10, m(&[ip(), (Field::NwDst, 2)]), vec![conj(7, 2, 2)]));
    c.insert(rule(8, m(&[ip(), (Field::NwSrc, 1)]), vec![conj(8, 1, 2)]));
    c.insert(rule(8, m(&[ip(), (Field::NwDst, 2)]), vec![conj(8, 2, 2)]));
    c.insert(rule(1, m(&[(Field::ConjId, 8)]), out(8)));
    let k = key(&[ip(), (Field::NwSrc, 1), (Field::NwDst, 2)]);
    assert_eq!(hit(&c, &k), Some(100));
    // Without the catch-all, the conj_id=7 lookup finds nothing and the
    // search continues with priority 8.
    c.remove(&Match::CATCHALL, 0);
    assert_eq!(hit(&c, &k), Some(8));
}

#[test]
fn conjunction_second_lookup_ignores_flows_hidden_under_clauses() {
    // OVS: the conj_id lookup skips clause flows and does not look under
    // them, so the priority-3 flow (same match as a clause) is not found
    // and the priority-2 flow is the answer.
    let mut c = Classifier::new();
    c.insert(rule(10, m(&[ip(), (Field::NwSrc, 1)]), vec![conj(7, 1, 2)]));
    c.insert(rule(10, m(&[ip(), (Field::NwDst, 2)]), vec![conj(7, 2, 2)]));
    c.insert(rule(3, m(&[ip(), (Field::NwSrc, 1)]), out(3)));
    c.insert(rule(2, m(&[ip()]), out(2)));
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 1), (Field::NwDst, 2)])),
        Some(2)
    );
    assert_eq!(
        hit(&c, &key(&[ip(), (Field::NwSrc, 1), (Field::NwDst, 3)])),
        Some(3)
    );
}

#[test]
fn one_flow_carrying_all_clauses_does_not_complete_alone() {
    // OVS: a conjunction needs at least n matching clause flows.
    let mut c = Classifier::new();
    c.insert(rule(
        10,
        m(&[ip(), (Field::NwDst, 3)]),
        vec![conj(7, 1, 2), conj(7, 2, 2)],
    ));
    c.insert(rule(5, m(&[(Field::ConjId, 7)]), out(7)));
    c.insert(rule(1, Match::CATCHALL, out(1)));
    let k = key(&[ip(), (Field::NwDst, 3), (Field::TpDst, 80)]);
    assert_eq!(hit(&c, &k), Some(1));
    // Any second clause flow matching at that priority lifts the limit.
    c.insert(rule(
        10,
        m(&[ip(), (Field::TpDst, 80)]),
        vec![conj(9, 1, 3)],
    ));
    assert_eq!(hit(&c, &k), Some(7));
}

#[test]
fn mixed_priority_clauses_never_complete() {
    let mut c = Classifier::new();
    c.insert(rule(10, m(&[(Field::NwSrc, 1)]), vec![conj(7, 1, 2)]));
    c.insert(rule(9, m(&[(Field::NwDst, 2)]), vec![conj(7, 2, 2)]));
    c.insert(rule(5, m(&[(Field::ConjId, 7)]), out(7)));
    assert_eq!(hit(&c, &key(&[(Field::NwSrc, 1), (Field::NwDst, 2)])), None);
}

#[test]
fn mixed_n_is_a_different_conjunction() {
    let mut c = Classifier::new();
    c.insert(rule(10, m(&[(Field::NwSrc, 1)]), vec![conj(7, 1, 2)]));
    c.insert(rule(10, m(&[(Field::NwDst, 2)]), vec![conj(7, 2, 3)]));
    c.insert(rule(5, m(&[(Field::ConjId, 7)]), out(7)));
    assert_eq!(hit(&c, &key(&[(Field::NwSrc, 1), (Field::NwDst, 2)])), None);
}

#[test]
fn conj_id_lookup_wildcards_exclude_conj_id_but_include_probed_bits() {
    let mut c = two_clause();
    c.insert(rule(
        101,
        m(&[(Field::ConjId, 1234), (Field::TpDst, 80)]),
        out(80),
    ));
    let k = key(&[
        ip(),
        (Field::NwSrc, 4),
        (Field::NwDst, 8),
        (Field::TpDst, 80),
    ]);
    let (r, wc) = lookup_wc(&c, &k);
    assert_eq!(r, Some(80));
    assert_eq!(wc.get(Field::ConjId), 0);
    assert_eq!(wc.get(Field::TpDst), 0xffff);
    // A packet carrying a nonzero conj_id is looked up like any other field.
    let mut k2 = k;
    k2.set(Field::ConjId, 1234);
    assert_eq!(hit(&c, &k2), Some(80));
}

// ---- property test: classifier == naive scan, and wc is sufficient ----

#[derive(Clone, Debug)]
struct GenFlow {
    priority: u16,
    m: Match,
}

fn gen_match() -> impl Strategy<Value = Match> {
    // A few mask shapes over a few fields with small value ranges, so masks
    // repeat (shared subtables) and keys often match.
    (
        prop::option::of(0u128..3),
        prop::option::of((
            0u128..4,
            prop::sample::select(vec![0xffff_ffffu128, 0xffff_fffe, 0xffff_ff00]),
        )),
        prop::option::of(0u128..3),
        prop::option::of((0u128..4, 1u128..4)),
    )
        .prop_map(|(in_port, nw, tp, reg)| {
            let mut m = Match::CATCHALL;
            if let Some(p) = in_port {
                m.set_exact(Field::InPort, p);
            }
            if let Some((v, mask)) = nw {
                m.set(Field::NwSrc, v, mask);
            }
            if let Some(t) = tp {
                m.set_exact(Field::TpDst, t);
            }
            if let Some((v, mask)) = reg {
                m.set(Field::Reg(0), v, mask);
            }
            m
        })
}

fn gen_key() -> impl Strategy<Value = FlowKey> {
    (0u128..3, 0u128..4, 0u128..3, 0u128..4).prop_map(|(p, n, t, r)| {
        key(&[
            (Field::InPort, p),
            (Field::NwSrc, n),
            (Field::TpDst, t),
            (Field::Reg(0), r),
        ])
    })
}

fn gen_flow() -> impl Strategy<Value = GenFlow> {
    (0u16..4, gen_match()).prop_map(|(priority, m)| GenFlow { priority, m })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lookup_equals_linear_scan(
        flows in prop::collection::vec(gen_flow(), 0..40),
        removals in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        keys in prop::collection::vec(gen_key(), 1..8),
        others in prop::collection::vec(gen_key(), 1..8),
    ) {
        let mut c = Classifier::new();
        // Naive model: (flow index, priority, match, insertion seq).
        let mut naive: Vec<(usize, u16, Match, usize)> = Vec::new();
        for (i, f) in flows.iter().enumerate() {
            naive.retain(|n| !(n.1 == f.priority && n.2 == f.m));
            naive.push((i, f.priority, f.m, i));
            c.insert(rule(f.priority, f.m, out(i as u32)));
        }
        for r in &removals {
            if naive.is_empty() {
                break;
            }
            let (_, p, mm, _) = naive.remove(r.index(naive.len()));
            prop_assert!(c.remove(&mm, p).is_some());
        }
        prop_assert_eq!(c.len(), naive.len());
        for k in &keys {
            let expect = naive
                .iter()
                .filter(|n| n.2.matches(k))
                .max_by_key(|n| (n.1, std::cmp::Reverse(n.3)))
                .map(|n| n.0 as u32);
            let (got, wc) = lookup_wc(&c, k);
            prop_assert_eq!(got, expect);
            // Every key agreeing with k on wc gets the same answer.
            for o in others.iter().chain(keys.iter()) {
                let mut k2 = FlowKey::ZERO;
                for w in 0..KEY_WORDS {
                    k2.w[w] = (k.w[w] & wc.w[w]) | (o.w[w] & !wc.w[w]);
                }
                prop_assert_eq!(hit(&c, &k2), got);
            }
        }
    }
}

// ---- timing and memory sanity (release: cargo test --release -- --ignored) ----

fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
#[ignore = "timing/memory report; run with --release -- --ignored --nocapture"]
fn bench_100k_flows_few_masks() {
    let before = rss_bytes().unwrap_or(0);
    let mut c = Classifier::new();
    let n = 100_000u32;
    let t0 = std::time::Instant::now();
    for i in 0..n {
        // 4 masks: /32 nw_dst; nw_dst+tp_dst; in_port+dl_src; reg0.
        let mut mm = m(&[ip()]);
        let actions = vec![
            Action::Load {
                dst: crate::flow::SubField::whole(Field::Reg(1)),
                value: u128::from(i),
            },
            Action::GotoTable(50),
        ];
        match i % 4 {
            0 => mm.set_exact(Field::NwDst, u128::from(i)),
            1 => {
                mm.set_exact(Field::NwDst, u128::from(i));
                mm.set_exact(Field::TpDst, 80);
            }
            2 => {
                mm.set_exact(Field::InPort, u128::from(i % 64));
                mm.set_exact(Field::DlSrc, u128::from(i));
            }
            _ => mm.set_exact(Field::Reg(0), u128::from(i)),
        }
        c.insert(rule(100 + (i % 4) as u16, mm, actions));
    }
    let build = t0.elapsed();
    let after = rss_bytes().unwrap_or(0);
    let keys: Vec<FlowKey> = (0..1024u32)
        .map(|i| {
            let j = i.wrapping_mul(97) % n;
            key(&[
                ip(),
                (Field::NwDst, u128::from(j)),
                (Field::TpDst, 80),
                (Field::Reg(0), u128::from(j)),
            ])
        })
        .collect();
    let iters = 2_000_000usize;
    let t0 = std::time::Instant::now();
    let mut found = 0usize;
    for i in 0..iters {
        let mut wc = FlowKey::ZERO;
        if c.lookup(&keys[i & 1023], &mut wc).is_some() {
            found += 1;
        }
    }
    let el = t0.elapsed();
    println!(
        "100k flows, {} subtables: build {:?}, lookup {:.1} ns/op ({} hits), RSS delta {} bytes/flow (Rule = {} bytes + actions)",
        c.n_subtables(),
        build,
        el.as_nanos() as f64 / iters as f64,
        found,
        (after.saturating_sub(before)) / u64::from(n),
        std::mem::size_of::<Rule>(),
    );
    assert!(found > 0);
}

/// Staged lookup: a subtable ruled out by its earlier stages unwildcards
/// only those stages' bits, so megaflows stay general.
#[test]
fn staged_lookup_keeps_later_fields_wildcarded() {
    let mut c = Classifier::new();
    // ARP spoof guard: in_port + arp + arp_sha.
    c.insert(rule(
        200,
        m(&[
            (Field::InPort, 3),
            (Field::DlType, 0x0806),
            (Field::ArpSha, 0xaa),
        ]),
        out(1),
    ));
    // Policy: in_port + ip + nw_src + tp_dst.
    c.insert(rule(
        150,
        m(&[
            (Field::InPort, 4),
            ip(),
            (Field::NwProto, 6),
            (Field::NwSrc, 0x0a00_0001),
            (Field::TpDst, 80),
        ]),
        out(2),
    ));
    c.insert(rule(0, Match::CATCHALL, out(9)));

    // An IPv4 packet from port 3: the ARP subtable fails at L2 (dl_type),
    // the policy subtable at the metadata stage (in_port).
    let k = key(&[
        (Field::InPort, 3),
        ip(),
        (Field::NwProto, 6),
        (Field::NwSrc, 0x0a00_0009),
        (Field::TpDst, 80),
    ]);
    let mut wc = FlowKey::ZERO;
    let r = c.lookup(&k, &mut wc).expect("catch-all");
    assert_eq!(r.flow.priority, 0);
    assert_eq!(wc.get(Field::InPort), 0xffff_ffff);
    assert_eq!(wc.get(Field::DlType), 0xffff);
    assert_eq!(wc.get(Field::ArpSha), 0, "arp_sha must stay wildcarded");
    assert_eq!(wc.get(Field::NwSrc), 0, "nw_src must stay wildcarded");
    assert_eq!(wc.get(Field::TpDst), 0, "tp_dst must stay wildcarded");

    // From port 4 with the wrong source: fails at L3, so tp_dst stays out.
    let k = key(&[
        (Field::InPort, 4),
        ip(),
        (Field::NwProto, 6),
        (Field::NwSrc, 0x0a00_0009),
        (Field::TpDst, 80),
    ]);
    let mut wc = FlowKey::ZERO;
    c.lookup(&k, &mut wc);
    assert_eq!(wc.get(Field::NwSrc), 0xffff_ffff);
    assert_eq!(wc.get(Field::TpDst), 0, "tp_dst must stay wildcarded");

    // The right source: the whole mask is consulted and the policy matches.
    let k = key(&[
        (Field::InPort, 4),
        ip(),
        (Field::NwProto, 6),
        (Field::NwSrc, 0x0a00_0001),
        (Field::TpDst, 80),
    ]);
    let mut wc = FlowKey::ZERO;
    assert_eq!(c.lookup(&k, &mut wc).map(|r| r.flow.priority), Some(150));
    assert_eq!(wc.get(Field::TpDst), 0xffff);

    // Removing the policy rule empties its stage indices: lookups still work.
    let mut pm = m(&[
        (Field::InPort, 4),
        ip(),
        (Field::NwProto, 6),
        (Field::NwSrc, 0x0a00_0001),
        (Field::TpDst, 80),
    ]);
    pm.value = pm.value.and(&pm.mask);
    assert!(c.remove(&pm, 150).is_some());
    let mut wc = FlowKey::ZERO;
    assert_eq!(c.lookup(&k, &mut wc).map(|r| r.flow.priority), Some(0));
    assert_eq!(wc.get(Field::NwSrc), 0);
}
