//! Wildcard soundness of the slow path, by property test.
//!
//! For random small pipelines and random keys: every key that agrees with
//! the translated key on the translation's wildcard bits must translate to
//! the same datapath actions (and hit the same rules). This is what makes a
//! megaflow built from a translation safe to install.

use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::flow::{port, Action, CtAction, CtZoneSrc, Flow, Match, SubField};
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::odp::recirc_id_for_table;
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::{translate, translate_with, FlowLookup, LinearTables, XlateEnv};
use proptest::prelude::*;
use std::sync::Arc;

/// Number of tables the generated pipelines use (0..N_TABLES).
const N_TABLES: u8 = 5;

/// Each generated field with a small pool of values, so that matches hit.
fn pool(f: Field) -> &'static [u128] {
    match f {
        Field::InPort => &[1, 2, 3],
        Field::RecircId => &[0, 0, 0, 2, 4],
        Field::Reg(_) => &[0, 1, 2, 0x13],
        Field::Metadata => &[0, 5],
        Field::TunId => &[0, 1, 2],
        Field::TunDst => &[0, 0x0a00_0001],
        Field::CtState => &[0, 0x21, 0x22],
        Field::VlanTci => &[0, 0x1005, 0x1006],
        Field::DlType => &[0x0800, 0x0806, 0x86dd],
        Field::DlSrc => &[1, 2],
        Field::DlDst => &[1, 2, 3],
        Field::NwSrc => &[0x0a00_0001, 0x0a00_0102],
        Field::NwDst => &[0x0a00_0001, 0x0a00_0002, 0x0a00_0103],
        Field::NwProto => &[6, 17],
        Field::NwTtl => &[0, 1, 2, 64],
        Field::TpDst => &[22, 80, 81],
        _ => &[0],
    }
}

const MATCH_FIELDS: &[Field] = &[
    Field::InPort,
    Field::Reg(0),
    Field::Reg(1),
    Field::Metadata,
    Field::TunId,
    Field::CtState,
    Field::VlanTci,
    Field::DlType,
    Field::DlSrc,
    Field::NwDst,
    Field::NwTtl,
    Field::TpDst,
];

const KEY_FIELDS: &[Field] = &[
    Field::InPort,
    Field::RecircId,
    Field::Reg(0),
    Field::Reg(1),
    Field::Metadata,
    Field::TunId,
    Field::TunDst,
    Field::CtState,
    Field::VlanTci,
    Field::DlType,
    Field::DlSrc,
    Field::DlDst,
    Field::NwSrc,
    Field::NwDst,
    Field::NwProto,
    Field::NwTtl,
    Field::TpDst,
];

fn field_value(f: Field) -> impl Strategy<Value = u128> {
    let p = pool(f);
    (0..p.len()).prop_map(move |i| p[i])
}

/// One match constraint: exact, or a partial mask (low bits or one bit).
fn constraint() -> impl Strategy<Value = (Field, u128, u128)> {
    (0..MATCH_FIELDS.len(), 0u8..3, any::<u8>()).prop_flat_map(|(i, kind, bit)| {
        let f = MATCH_FIELDS[i];
        let mask = match kind {
            0 => f.full_mask(),
            1 => 0xff & f.full_mask(),
            _ => (1u128 << (bit as u32 % f.bits())) & f.full_mask(),
        };
        field_value(f).prop_map(move |v| (f, v, mask))
    })
}

fn sub(field: Field, ofs: u8, n_bits: u8) -> SubField {
    SubField { field, ofs, n_bits }
}

fn src_subfield() -> impl Strategy<Value = SubField> {
    prop_oneof![
        Just(sub(Field::NwDst, 0, 2)),
        Just(sub(Field::TpDst, 0, 8)),
        Just(sub(Field::InPort, 0, 4)),
        Just(sub(Field::Reg(0), 0, 32)),
        Just(sub(Field::VlanTci, 0, 4)),
        Just(sub(Field::TunId, 0, 2)),
    ]
}

fn dst_subfield() -> impl Strategy<Value = SubField> {
    prop_oneof![
        Just(sub(Field::Reg(0), 0, 4)),
        Just(sub(Field::Reg(1), 0, 32)),
        Just(sub(Field::Reg(1), 4, 2)),
        Just(sub(Field::Metadata, 0, 8)),
        Just(sub(Field::TunId, 0, 8)),
        Just(sub(Field::NwDst, 0, 8)),
        Just(sub(Field::DlSrc, 0, 16)),
    ]
}

fn set_field() -> impl Strategy<Value = Action> {
    (
        prop_oneof![
            Just(Field::DlSrc),
            Just(Field::NwDst),
            Just(Field::NwTtl),
            Just(Field::TpDst),
            Just(Field::VlanTci),
            Just(Field::Reg(0)),
            Just(Field::TunDst),
            Just(Field::PktMark),
        ],
        any::<bool>(),
    )
        .prop_flat_map(|(f, partial)| {
            let mask = if partial { 0x3 } else { f.full_mask() };
            field_value(f).prop_map(move |v| Action::SetField {
                field: f,
                value: v & mask,
                mask,
            })
        })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        prop_oneof![
            Just(1u32),
            Just(2),
            Just(3),
            Just(port::IN_PORT),
            Just(port::ALL),
            Just(port::CONTROLLER),
            Just(port::LOCAL),
        ]
        .prop_map(Action::Output),
        src_subfield().prop_map(Action::OutputReg),
        (
            proptest::option::of(1u32..4),
            proptest::option::of(0..N_TABLES)
        )
            .prop_map(|(in_port, table)| Action::Resubmit { in_port, table }),
        set_field(),
        (dst_subfield(), 0u128..4).prop_map(|(dst, value)| Action::Load { dst, value }),
        (src_subfield(), dst_subfield()).prop_map(|(src, dst)| {
            let n = src.n_bits.min(dst.n_bits);
            Action::Move {
                src: SubField { n_bits: n, ..src },
                dst: SubField { n_bits: n, ..dst },
            }
        }),
        (1u64..3).prop_map(Action::ModDlSrc),
        prop_oneof![Just(0x0a00_0001u32), Just(0x0a00_0002)].prop_map(Action::ModNwDst),
        Just(Action::DecTtl),
        Just(Action::PushVlan(0x8100)),
        Just(Action::PopVlan),
        (0u64..3).prop_map(Action::SetTunnel),
        (
            any::<bool>(),
            prop_oneof![
                (0u16..3).prop_map(CtZoneSrc::Imm),
                Just(CtZoneSrc::Field(sub(Field::Reg(0), 0, 16)))
            ],
            proptest::option::of(0..N_TABLES),
            proptest::option::of(0u128..3),
        )
            .prop_map(|(commit, zone, table, mark)| Action::Ct(CtAction {
                commit,
                force: false,
                zone,
                table,
                exec: mark
                    .map(|m| Action::SetField {
                        field: Field::CtMark,
                        value: m,
                        mask: 0xffff_ffff,
                    })
                    .into_iter()
                    .collect(),
            })),
        Just(Action::CtClear),
    ]
}

fn flow() -> impl Strategy<Value = Flow> {
    (
        0..N_TABLES,
        0u16..4,
        proptest::collection::vec(constraint(), 0..3),
        proptest::collection::vec(action(), 0..5),
        any::<bool>(),
        1u8..N_TABLES,
    )
        .prop_map(|(table, priority, cs, mut actions, goto, step)| {
            let mut matches = Match::CATCHALL;
            for (f, v, m) in cs {
                matches.set(f, v, m);
            }
            let next = table.saturating_add(step);
            if goto && next < N_TABLES {
                actions.push(Action::GotoTable(next));
            }
            Flow {
                table,
                priority,
                matches,
                actions,
                ..Flow::default()
            }
        })
}

fn key() -> impl Strategy<Value = FlowKey> {
    let fields: Vec<_> = KEY_FIELDS.iter().map(|f| field_value(*f)).collect();
    fields.prop_map(|vals| {
        let mut k = FlowKey::ZERO;
        for (f, v) in KEY_FIELDS.iter().zip(vals) {
            k.set(*f, v);
        }
        k
    })
}

/// splitmix64: a deterministic stream of variations from one seed.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A key agreeing with `key` on the `wc` bits, other bits varied (often
/// to pool values, so that variations reach other flows, sometimes random).
fn vary(key: &FlowKey, wc: &FlowKey, seed: &mut u64) -> FlowKey {
    let mut k2 = *key;
    for &f in Field::ALL {
        let r = next(seed);
        let p = pool(f);
        let other = match r % 4 {
            0 => key.get(f),
            1 => ((next(seed) as u128) << 64) | next(seed) as u128,
            _ => p[(r >> 8) as usize % p.len()],
        };
        let m = wc.get(f);
        k2.set(f, (key.get(f) & m) | (other & !m));
    }
    k2
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn megaflow_wildcards_are_sound(
        flows in proptest::collection::vec(flow(), 0..14),
        keys in proptest::collection::vec(key(), 1..4),
        seed in any::<u64>(),
    ) {
        check_sound(&LinearTables::from_flows(flows), &keys, seed)?;
    }
}

/// Checks the wildcard contract of `translate` over `tables` for `keys`.
fn check_sound<L: FlowLookup + ?Sized>(
    tables: &L,
    keys: &[FlowKey],
    seed: u64,
) -> Result<(), TestCaseError> {
    let env = XlateEnv::with_ports(vec![1, 2, 3, 4]);
    let mut seed = seed;
    for key in keys {
        let t = translate_with(tables, key, &env);
        for _ in 0..8 {
            let k2 = vary(key, &t.wildcards, &mut seed);
            prop_assert_eq!(k2.and(&t.wildcards), key.and(&t.wildcards));
            let t2 = translate_with(tables, &k2, &env);
            prop_assert_eq!(&t2.actions, &t.actions, "key {:?}\nkey2 {:?}", key, k2);
            prop_assert_eq!(t2.error, t.error);
            let r1: Vec<_> = t.rules.iter().map(Arc::as_ptr).collect();
            let r2: Vec<_> = t2.rules.iter().map(Arc::as_ptr).collect();
            prop_assert_eq!(r1, r2);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The same property over the real classifier (tuple-space search with
    /// its own wildcard reporting) behind `TableSet`.
    #[test]
    fn megaflow_wildcards_are_sound_over_the_classifier(
        flows in proptest::collection::vec(flow(), 0..14),
        keys in proptest::collection::vec(key(), 1..4),
        seed in any::<u64>(),
    ) {
        let mods: Vec<FlowMod> = flows
            .into_iter()
            .map(FlowMod::add)
            .collect();
        let p = Pipeline::new();
        prop_assume!(p.apply(&mods, 0).is_ok());
        let snapshot = p.snapshot();
        check_sound(&*snapshot, &keys, seed)?;
        // And through the production entry point.
        let env = XlateEnv::with_ports(vec![1, 2, 3, 4]);
        for key in &keys {
            prop_assert_eq!(
                translate(&snapshot, key, &env).actions,
                translate_with(&*snapshot, key, &env).actions
            );
        }
    }
}

/// The generator must produce interesting translations, or the property
/// above proves nothing: check that a fixed sample reaches every kind of
/// datapath action.
#[test]
fn generator_reaches_interesting_translations() {
    use oxvs_pipeline::odp::DpAction;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};

    let mut runner = TestRunner::new(Config::default());
    let strat = (proptest::collection::vec(flow(), 4..14), key());
    let env = XlateEnv::with_ports(vec![1, 2, 3, 4]);
    let mut seen = [false; 7];
    for _ in 0..2000 {
        let (flows, k) = strat.new_tree(&mut runner).unwrap().current();
        let t = translate_with(&LinearTables::from_flows(flows), &k, &env);
        for a in &t.actions {
            let i = match a {
                DpAction::Output(_) => 0,
                DpAction::Set { .. } => 1,
                DpAction::SetTunnel { .. } => 2,
                DpAction::Recirc(_) => 3,
                DpAction::LoadMeta { .. } => 4,
                DpAction::PushVlan { .. } | DpAction::PopVlan => 5,
                DpAction::Userspace { .. } => 6,
                _ => continue,
            };
            seen[i] = true;
        }
    }
    assert_eq!(seen, [true; 7]);
    // Recirculated keys really start elsewhere.
    assert_eq!(recirc_id_for_table(1), 2);
    let _ = ct_state::TRK;
}
