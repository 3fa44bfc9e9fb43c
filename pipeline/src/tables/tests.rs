//! Tables tests: flow mods, bundles, replace_all, expiry.

use super::*;
use crate::field::Field;
use crate::flow::{ControllerAction, FlowFlags};
use crate::group::GroupMod;

const S: u64 = 1_000_000_000;

fn flow(table: u8, priority: u16, fields: &[(Field, u128)], actions: Vec<Action>) -> Flow {
    let mut m = Match::CATCHALL;
    for (f, v) in fields {
        m.set_exact(*f, *v);
    }
    Flow {
        table,
        priority,
        matches: m,
        actions,
        ..Flow::default()
    }
}

fn add(f: Flow) -> FlowMod {
    FlowMod::add(f)
}

fn cmd(command: FlowModCommand, table: Option<u8>, f: Flow) -> FlowMod {
    FlowMod {
        command,
        table,
        flow: f,
        cookie_mask: 0,
        out_port: None,
    }
}

fn key(fields: &[(Field, u128)]) -> FlowKey {
    let mut k = FlowKey::ZERO;
    for (f, v) in fields {
        k.set(*f, *v);
    }
    k
}

fn actions_of(ts: &TableSet, table: u8, k: &FlowKey) -> Option<Vec<Action>> {
    let mut wc = FlowKey::ZERO;
    ts.lookup(table, k, &mut wc).map(|r| r.flow.actions.clone())
}

fn port1() -> (Field, u128) {
    (Field::InPort, 1)
}

#[test]
fn add_lookup_and_generation() {
    let p = Pipeline::new();
    assert_eq!(p.snapshot().generation(), 0);
    let r = p
        .apply(&[add(flow(0, 10, &[port1()], vec![Action::Output(2)]))], 5)
        .expect("add");
    assert_eq!(
        r,
        ApplyReport {
            added: 1,
            ..Default::default()
        }
    );
    let ts = p.snapshot();
    assert_eq!(ts.generation(), 1);
    assert_eq!(ts.flow_count(), 1);
    assert_eq!(
        actions_of(&ts, 0, &key(&[port1()])),
        Some(vec![Action::Output(2)])
    );
    assert_eq!(actions_of(&ts, 1, &key(&[port1()])), None);
    assert_eq!(actions_of(&ts, 0, &key(&[(Field::InPort, 2)])), None);
    // FlowMod::table overrides flow.table for add.
    let mut fm = add(flow(0, 10, &[port1()], vec![]));
    fm.table = Some(7);
    p.apply(&[fm], 6).expect("add");
    let ts = p.snapshot();
    assert_eq!(ts.flows_in(7).len(), 1);
    assert_eq!(ts.flows_in(7)[0].flow.table, 7);
    assert_eq!(ts.generation(), 2);
}

#[test]
fn add_replaces_identical_keeping_counters_unless_reset() {
    let p = Pipeline::new();
    let mut f = flow(0, 10, &[port1()], vec![Action::Output(2)]);
    f.cookie = 1;
    f.idle_timeout = 100;
    p.apply(&[add(f.clone())], 1).expect("add");
    let old = p.snapshot().flows_in(0)[0].clone();
    old.credit(3, 300, 2);
    let mut f2 = f.clone();
    f2.cookie = 2;
    f2.idle_timeout = 0;
    f2.actions = vec![Action::Output(3)];
    let r = p.apply(&[add(f2)], 10).expect("replace");
    assert_eq!(r.replaced, 1);
    let ts = p.snapshot();
    assert_eq!(ts.flow_count(), 1);
    let new = ts.flows_in(0)[0];
    assert_eq!(new.flow.cookie, 2);
    assert_eq!(new.flow.idle_timeout, 0);
    assert_eq!(new.created_ns, 10);
    assert_eq!(new.stats.n_packets.load(Ordering::Relaxed), 3);
    assert_eq!(new.stats.n_bytes.load(Ordering::Relaxed), 300);
    let mut f3 = f.clone();
    f3.flags.reset_counts = true;
    p.apply(&[add(f3)], 11).expect("replace");
    assert_eq!(
        p.snapshot().flows_in(0)[0]
            .stats
            .n_packets
            .load(Ordering::Relaxed),
        0
    );
}

#[test]
fn check_overlap() {
    let p = Pipeline::new();
    p.apply(&[add(flow(0, 10, &[port1()], vec![]))], 0)
        .expect("add");
    let mut f = flow(0, 10, &[(Field::TpDst, 80)], vec![]);
    f.flags.check_overlap = true;
    let err = p.apply(&[add(f.clone())], 0).unwrap_err();
    assert_eq!(
        err,
        FlowModError::Overlap {
            table: 0,
            priority: 10
        }
    );
    assert!(err.to_string().contains("check_overlap"));
    // Different priority, or disjoint match: fine.
    f.priority = 11;
    p.apply(&[add(f)], 0).expect("other priority");
    let mut g = flow(0, 10, &[(Field::InPort, 2)], vec![]);
    g.flags.check_overlap = true;
    p.apply(&[add(g)], 0).expect("disjoint");
    assert_eq!(p.snapshot().flow_count(), 3);
}

#[test]
fn modify_strict_and_non_strict() {
    let p = Pipeline::new();
    let mut specific = flow(
        0,
        20,
        &[port1(), (Field::TpDst, 80)],
        vec![Action::Output(1)],
    );
    specific.cookie = 0x15;
    specific.idle_timeout = 60;
    p.apply(
        &[
            add(specific.clone()),
            add(flow(0, 10, &[port1()], vec![Action::Output(1)])),
            add(flow(0, 5, &[(Field::InPort, 2)], vec![Action::Output(1)])),
            add(flow(
                3,
                5,
                &[port1(), (Field::NwSrc, 9)],
                vec![Action::Output(1)],
            )),
        ],
        0,
    )
    .expect("add");
    p.snapshot().flows_in(0)[0].credit(1, 64, 1);
    // Non-strict in_port=1 in all tables: 3 flows (priority ignored).
    let r = p
        .apply(
            &[cmd(
                FlowModCommand::Modify { strict: false },
                None,
                flow(0, 0, &[port1()], vec![Action::Output(9)]),
            )],
            0,
        )
        .expect("modify");
    assert_eq!(r.modified, 3);
    let ts = p.snapshot();
    let top = ts.flows_in(0)[0];
    assert_eq!(top.flow.actions, vec![Action::Output(9)]);
    assert_eq!(top.flow.cookie, 0x15, "modify keeps the cookie");
    assert_eq!(top.flow.idle_timeout, 60, "modify keeps timeouts");
    assert_eq!(
        top.stats.n_packets.load(Ordering::Relaxed),
        1,
        "counters kept"
    );
    assert_eq!(ts.flows_in(0)[2].flow.actions, vec![Action::Output(1)]);
    assert_eq!(ts.flows_in(3)[0].flow.actions, vec![Action::Output(9)]);
    // Strict: needs identical match and priority.
    let strict = FlowModCommand::Modify { strict: true };
    let r = p
        .apply(
            &[cmd(
                strict,
                Some(0),
                flow(0, 11, &[port1()], vec![Action::Output(7)]),
            )],
            0,
        )
        .expect("no-op");
    assert_eq!(r.modified, 0);
    let r = p
        .apply(
            &[cmd(
                strict,
                Some(0),
                flow(0, 10, &[port1()], vec![Action::Output(7)]),
            )],
            0,
        )
        .expect("modify strict");
    assert_eq!(r.modified, 1);
    assert_eq!(
        p.snapshot().flows_in(0)[1].flow.actions,
        vec![Action::Output(7)]
    );
    // Cookie mask: only flows whose cookie & 0xf0 == 0x10.
    let mut fm = cmd(
        FlowModCommand::Modify { strict: false },
        Some(0),
        flow(0, 0, &[], vec![Action::Output(5)]),
    );
    fm.flow.cookie = 0x10;
    fm.cookie_mask = 0xf0;
    fm.flow.flags.reset_counts = true;
    let r = p.apply(&[fm], 0).expect("cookie modify");
    assert_eq!(r.modified, 1);
    let ts = p.snapshot();
    assert_eq!(ts.flows_in(0)[0].flow.actions, vec![Action::Output(5)]);
    assert_eq!(
        ts.flows_in(0)[0].stats.n_packets.load(Ordering::Relaxed),
        0,
        "reset_counts"
    );
    assert_eq!(ts.flows_in(0)[1].flow.actions, vec![Action::Output(7)]);
    // Modify of nothing is a no-op but still a successful version.
    let g = ts.generation();
    let r = p
        .apply(
            &[cmd(
                FlowModCommand::Modify { strict: false },
                None,
                flow(0, 0, &[(Field::InPort, 77)], vec![]),
            )],
            0,
        )
        .expect("nothing");
    assert_eq!(r, ApplyReport::default());
    assert_eq!(p.snapshot().generation(), g + 1);
}

#[test]
fn delete_strict_non_strict_cookie_out_port() {
    let p = Pipeline::new();
    let ctrl = Action::Controller(ControllerAction::default());
    let mut c1 = flow(
        0,
        30,
        &[port1(), (Field::TpDst, 80)],
        vec![Action::Output(4)],
    );
    c1.cookie = 0xa1;
    let mut c2 = flow(0, 20, &[port1()], vec![Action::Output(5)]);
    c2.cookie = 0xb1;
    p.apply(
        &[
            add(c1),
            add(c2),
            add(flow(0, 10, &[port1(), (Field::NwSrc, 3)], vec![ctrl])),
            add(flow(0, 10, &[(Field::InPort, 2)], vec![Action::Output(4)])),
            add(flow(4, 10, &[port1()], vec![Action::Output(4)])),
        ],
        0,
    )
    .expect("add");
    // out_port=4 with in_port=1 non-strict in table 0: only c1.
    let mut fm = cmd(
        FlowModCommand::Delete { strict: false },
        Some(0),
        flow(0, 0, &[port1()], vec![]),
    );
    fm.out_port = Some(4);
    assert_eq!(p.apply(&[fm], 0).expect("del").deleted, 1);
    // out_port=CONTROLLER matches the controller action.
    let mut fm = cmd(
        FlowModCommand::Delete { strict: false },
        None,
        flow(0, 0, &[], vec![]),
    );
    fm.out_port = Some(port::CONTROLLER);
    assert_eq!(p.apply(&[fm], 0).expect("del").deleted, 1);
    // Cookie mismatch: nothing.
    let mut fm = cmd(
        FlowModCommand::Delete { strict: false },
        None,
        flow(0, 0, &[], vec![]),
    );
    fm.flow.cookie = 0xc0;
    fm.cookie_mask = 0xf0;
    assert_eq!(p.apply(&[fm], 0).expect("del").deleted, 0);
    // Strict with wrong priority: nothing; right priority: c2.
    let strict = FlowModCommand::Delete { strict: true };
    assert_eq!(
        p.apply(&[cmd(strict, Some(0), flow(0, 21, &[port1()], vec![]))], 0)
            .expect("del")
            .deleted,
        0
    );
    assert_eq!(
        p.apply(&[cmd(strict, Some(0), flow(0, 20, &[port1()], vec![]))], 0)
            .expect("del")
            .deleted,
        1
    );
    // Non-strict catch-all over all tables deletes the rest.
    let ts = p.snapshot();
    assert_eq!(ts.flow_count(), 2);
    let r = p
        .apply(
            &[cmd(
                FlowModCommand::Delete { strict: false },
                None,
                flow(0, 0, &[], vec![]),
            )],
            0,
        )
        .expect("del");
    assert_eq!(r.deleted, 2);
    assert_eq!(p.snapshot().flow_count(), 0);
    // The old snapshot still sees its version.
    assert_eq!(ts.flow_count(), 2);
}

#[test]
fn bundle_is_atomic() {
    let p = Pipeline::new();
    p.apply(&[add(flow(0, 10, &[port1()], vec![]))], 0)
        .expect("add");
    let before = p.snapshot();
    let bad = add(flow(
        0,
        10,
        &[],
        vec![Action::Conjunction {
            id: 1,
            clause: 3,
            n_clauses: 2,
        }],
    ));
    let err = p
        .apply(
            &[
                add(flow(0, 20, &[(Field::InPort, 2)], vec![])),
                cmd(
                    FlowModCommand::Delete { strict: false },
                    None,
                    flow(0, 0, &[], vec![]),
                ),
                bad,
            ],
            0,
        )
        .unwrap_err();
    match &err {
        FlowModError::InBundle { index, error } => {
            assert_eq!(*index, 2);
            assert!(matches!(
                **error,
                FlowModError::BadConjunction { clause: 3, .. }
            ));
        }
        e => panic!("unexpected {e:?}"),
    }
    assert!(err.to_string().contains("#2"), "{err}");
    let after = p.snapshot();
    assert_eq!(after.generation(), before.generation());
    assert!(Arc::ptr_eq(&before, &after));
    assert_eq!(after.flow_count(), 1);
}

#[test]
fn validation_errors() {
    let p = Pipeline::new();
    let one = |f: Flow| p.apply(&[add(f)], 0).unwrap_err();
    assert_eq!(one(flow(255, 1, &[], vec![])), FlowModError::BadTable(255));
    assert!(matches!(
        one(flow(
            0,
            1,
            &[],
            vec![Action::Conjunction {
                id: 1,
                clause: 1,
                n_clauses: 1
            }]
        )),
        FlowModError::BadConjunction { .. }
    ));
    assert!(matches!(
        one(flow(
            0,
            1,
            &[],
            vec![Action::Conjunction {
                id: 1,
                clause: 1,
                n_clauses: 65
            }]
        )),
        FlowModError::BadConjunction { .. }
    ));
    assert!(matches!(
        one(flow(
            0,
            1,
            &[],
            vec![Action::Conjunction {
                id: 1,
                clause: 0,
                n_clauses: 2
            }]
        )),
        FlowModError::BadConjunction { .. }
    ));
    assert!(matches!(
        one(flow(
            0,
            1,
            &[],
            vec![
                Action::Conjunction {
                    id: 1,
                    clause: 1,
                    n_clauses: 2
                },
                Action::Output(1)
            ]
        )),
        FlowModError::ConjunctionWithOtherActions(_)
    ));
    assert_eq!(
        one(flow(5, 1, &[], vec![Action::GotoTable(5)])),
        FlowModError::BadGotoTable {
            table: 5,
            target: 5
        }
    );
    assert_eq!(
        one(flow(
            5,
            1,
            &[],
            vec![Action::GotoTable(6), Action::Output(1)]
        )),
        FlowModError::GotoNotLast(6)
    );
    let mut fm = cmd(
        FlowModCommand::Delete { strict: false },
        Some(255),
        flow(0, 0, &[], vec![]),
    );
    fm.table = Some(255);
    assert_eq!(p.apply(&[fm], 0).unwrap_err(), FlowModError::BadTable(255));
    // Accepted like OVS: conj_id match with a conjunction action; note with conjunction.
    p.apply(
        &[add(flow(
            0,
            1,
            &[(Field::ConjId, 5)],
            vec![
                Action::Conjunction {
                    id: 7,
                    clause: 1,
                    n_clauses: 2,
                },
                Action::Note(vec![0]),
            ],
        ))],
        0,
    )
    .expect("accepted");
    assert_eq!(p.snapshot().generation(), 1);
}

#[test]
fn non_canonical_match_is_stored_canonical() {
    let p = Pipeline::new();
    let mut f = flow(0, 1, &[], vec![Action::Output(1)]);
    f.matches.mask.set(Field::NwSrc, 0xffff_ff00);
    f.matches.value.set(Field::NwSrc, 0x0a00_0001); // stray low bits
    p.apply(&[add(f)], 0).expect("add");
    let ts = p.snapshot();
    assert_eq!(
        ts.flows_in(0)[0].flow.matches.value.get(Field::NwSrc),
        0x0a00_0000
    );
    assert!(actions_of(&ts, 0, &key(&[(Field::NwSrc, 0x0a00_00ff)])).is_some());
}

#[test]
fn replace_all_diffs_and_keeps_counters() {
    let p = Pipeline::new();
    let keep = flow(0, 10, &[port1()], vec![Action::Output(1)]);
    let change = flow(0, 20, &[(Field::InPort, 2)], vec![Action::Output(2)]);
    let gone = flow(1, 5, &[], vec![Action::Output(3)]);
    p.replace_all(&[keep.clone(), change.clone(), gone.clone()], 0)
        .expect("initial");
    let ts = p.snapshot();
    assert_eq!(ts.flow_count(), 3);
    let kept_rule = ts.flows_in(0)[1].clone();
    kept_rule.credit(2, 100, 1);
    ts.flows_in(0)[0].credit(5, 500, 1);
    let t2 = ts.table(2).map(|c| c as *const Classifier);

    let mut changed = change.clone();
    changed.actions = vec![Action::Output(22)];
    let new = flow(1, 6, &[port1()], vec![]);
    let r = p
        .replace_all(&[keep.clone(), changed, new], 9)
        .expect("replace");
    assert_eq!(
        r,
        ApplyReport {
            added: 1,
            replaced: 1,
            modified: 0,
            deleted: 1,
            ..ApplyReport::default()
        }
    );
    let ts = p.snapshot();
    assert_eq!(ts.flow_count(), 3);
    // Unchanged: the very same rule, counters intact.
    assert!(Arc::ptr_eq(ts.flows_in(0)[1], &kept_rule));
    assert_eq!(ts.flows_in(0)[1].stats.n_packets.load(Ordering::Relaxed), 2);
    // Changed: new actions, counters carried over (OVS add semantics).
    assert_eq!(ts.flows_in(0)[0].flow.actions, vec![Action::Output(22)]);
    assert_eq!(ts.flows_in(0)[0].stats.n_packets.load(Ordering::Relaxed), 5);
    assert_eq!(ts.flows_in(0)[0].created_ns, 9);
    assert_eq!(ts.flows_in(1).len(), 1);
    assert_eq!(ts.flows_in(1)[0].flow.priority, 6);
    // Untouched tables are shared between versions.
    assert_eq!(ts.table(2).map(|c| c as *const Classifier), t2);
    // Invalid input changes nothing.
    let g = ts.generation();
    let err = p
        .replace_all(&[keep, flow(255, 1, &[], vec![])], 10)
        .unwrap_err();
    assert!(matches!(err, FlowModError::InBundle { index: 1, .. }));
    assert_eq!(p.snapshot().generation(), g);
    assert_eq!(p.snapshot().flow_count(), 3);
}

#[test]
fn expiry() {
    let p = Pipeline::new();
    let mut idle = flow(0, 1, &[port1()], vec![]);
    idle.idle_timeout = 10;
    let mut hard = flow(0, 2, &[(Field::InPort, 2)], vec![]);
    hard.hard_timeout = 20;
    let forever = flow(0, 3, &[(Field::InPort, 3)], vec![]);
    p.apply(
        &[add(idle.clone()), add(hard.clone()), add(forever)],
        100 * S,
    )
    .expect("add");
    let g = p.snapshot().generation();
    assert!(p.expire(105 * S).is_empty());
    assert_eq!(
        p.snapshot().generation(),
        g,
        "nothing expired: no new version"
    );
    // A hit at 108 s keeps the idle flow alive until 118 s.
    p.snapshot().flows_in(0)[2].credit(1, 60, 108 * S);
    assert!(p.expire(115 * S).is_empty());
    let gone = p.expire(120 * S);
    assert_eq!(gone.len(), 2);
    assert!(gone.contains(&idle) && gone.contains(&hard));
    let ts = p.snapshot();
    assert_eq!(ts.flow_count(), 1);
    assert_eq!(ts.generation(), g + 1);
}

#[test]
fn flows_order_and_conjunction_through_tables() {
    let p = Pipeline::new();
    let conj = |k| Action::Conjunction {
        id: 9,
        clause: k,
        n_clauses: 2,
    };
    p.apply(
        &[
            add(flow(
                40,
                200,
                &[(Field::ConjId, 9)],
                vec![Action::GotoTable(41)],
            )),
            add(flow(40, 100, &[(Field::NwSrc, 1)], vec![conj(1)])),
            add(flow(40, 100, &[(Field::NwDst, 2)], vec![conj(2)])),
            add(flow(40, 0, &[], vec![Action::Output(0)])),
            add(flow(10, 5, &[], vec![])),
        ],
        0,
    )
    .expect("add");
    let ts = p.snapshot();
    let order: Vec<(u8, u16)> = ts
        .flows()
        .map(|r| (r.flow.table, r.flow.priority))
        .collect();
    assert_eq!(
        order,
        vec![(10, 5), (40, 200), (40, 100), (40, 100), (40, 0)]
    );
    let k = key(&[(Field::NwSrc, 1), (Field::NwDst, 2)]);
    assert_eq!(actions_of(&ts, 40, &k), Some(vec![Action::GotoTable(41)]));
    let k = key(&[(Field::NwSrc, 1), (Field::NwDst, 3)]);
    assert_eq!(actions_of(&ts, 40, &k), Some(vec![Action::Output(0)]));
    assert!(ts.find_strict(40, &Match::CATCHALL, 0).is_some());
    assert_eq!(actions_of(&ts, 255, &k), None);
    let _ = FlowFlags::default();
}

#[test]
fn bad_sub_fields_are_refused_not_panicked_on() {
    use crate::flow::{CtAction, CtZoneSrc, SubField};
    let p = Pipeline::new();
    let sf = |field, ofs, n_bits| SubField { field, ofs, n_bits };
    let bad: Vec<Action> = vec![
        Action::Load {
            dst: sf(Field::Reg(0), 200, 8),
            value: 1,
        },
        Action::Load {
            dst: sf(Field::Reg(0), 30, 8),
            value: 1,
        },
        Action::Load {
            dst: sf(Field::Reg(0), 0, 0),
            value: 0,
        },
        Action::Load {
            dst: sf(Field::Reg(0), 0, 8),
            value: 0x100,
        },
        Action::Move {
            src: sf(Field::Reg(0), 0, 16),
            dst: sf(Field::Reg(1), 0, 8),
        },
        Action::Move {
            src: sf(Field::Reg(0), 130, 8),
            dst: sf(Field::Reg(1), 0, 8),
        },
        Action::OutputReg(sf(Field::Reg(0), 250, 8)),
        Action::Ct(CtAction {
            commit: true,
            force: false,
            zone: CtZoneSrc::Field(sf(Field::Reg(0), 0, 33)),
            table: None,
            exec: vec![],
        }),
        Action::Ct(CtAction {
            commit: true,
            force: false,
            zone: CtZoneSrc::Imm(0),
            table: None,
            exec: vec![Action::Load {
                dst: sf(Field::CtMark, 129, 1),
                value: 1,
            }],
        }),
    ];
    for a in bad {
        let f = flow(0, 1, &[(Field::DlType, 0x0800)], vec![a.clone()]);
        match p.apply(&[add(f)], 0) {
            Err(FlowModError::BadSubField { .. }) => {}
            other => panic!("{a:?}: {other:?}"),
        }
    }
    assert_eq!(p.snapshot().flow_count(), 0);
    // In range: accepted.
    let ok = flow(
        0,
        1,
        &[],
        vec![
            Action::Load {
                dst: sf(Field::Reg(0), 24, 8),
                value: 0xff,
            },
            Action::Move {
                src: sf(Field::Reg(0), 0, 16),
                dst: sf(Field::Reg(1), 16, 16),
            },
        ],
    );
    p.apply(&[add(ok)], 0).expect("valid sub-fields");
}

#[test]
fn conjunction_misuse_through_parsed_flows() {
    use crate::parse::{parse_flow_mod, ParseContext};
    let ctx = ParseContext::default();
    let p = Pipeline::new();
    let fm = |t: &str| parse_flow_mod(t, FlowModCommand::Add, &ctx).expect(t);
    // Clauses at different priorities never complete (documented, as OVS):
    // the packet falls through to the next flow that matches on its own.
    p.apply(
        &[
            fm("table=3,priority=10,ip,nw_src=10.0.0.1,actions=conjunction(7,1/2)"),
            fm("table=3,priority=9,ip,nw_dst=10.0.0.2,actions=conjunction(7,2/2)"),
            fm("table=3,priority=5,conj_id=7,actions=output:7"),
            fm("table=3,priority=1,actions=output:1"),
        ],
        0,
    )
    .expect("mixed priorities are accepted");
    let k = key(&[
        (Field::DlType, 0x0800),
        (Field::NwSrc, 0x0a00_0001),
        (Field::NwDst, 0x0a00_0002),
    ]);
    let ts = p.snapshot();
    assert_eq!(actions_of(&ts, 3, &k), Some(vec![Action::Output(1)]));
    // Same priority: it completes.
    p.apply(
        &[fm(
            "table=3,priority=10,ip,nw_dst=10.0.0.2,actions=conjunction(7,2/2)",
        )],
        0,
    )
    .expect("add");
    assert_eq!(
        actions_of(&p.snapshot(), 3, &k),
        Some(vec![Action::Output(7)])
    );
    // k > n, k = 0 and n < 2 built in code are refused by the tables too.
    for (clause, n_clauses) in [(3, 2), (0, 2), (1, 1), (0, 0), (2, 255)] {
        let f = flow(
            0,
            1,
            &[],
            vec![Action::Conjunction {
                id: 1,
                clause,
                n_clauses,
            }],
        );
        let err = p.apply(&[add(f)], 0).unwrap_err();
        assert!(
            matches!(err, FlowModError::BadConjunction { .. }),
            "{clause}/{n_clauses}: {err}"
        );
        assert!(err.to_string().contains(&format!("{clause}/{n_clauses}")));
    }
}

// ---------------------------------------------------------------------------
// Groups

fn group(id: u32, ports: &[u32]) -> Group {
    let mut g = Group::new(id, GroupType::All);
    for (i, p) in ports.iter().enumerate() {
        g.buckets.push(crate::group::Bucket {
            id: i as u32,
            weight: 0,
            watch_port: None,
            watch_group: None,
            actions: vec![Action::Output(*p)],
        });
    }
    g
}

fn gadd(g: Group) -> TableMod {
    TableMod::Group(GroupMod::Add(g))
}

fn to_group(table: u8, priority: u16, id: u32) -> Flow {
    flow(table, priority, &[port1()], vec![Action::Group(id)])
}

#[test]
fn group_mods_follow_openflow() {
    let p = Pipeline::new();
    let r = p.apply_bundle(&[gadd(group(1, &[2]))], 0).unwrap();
    assert_eq!(r.groups_added, 1);
    assert_eq!(p.snapshot().generation(), 1);
    // Add of an existing id: refused, nothing changes.
    let e = p.apply_bundle(&[gadd(group(1, &[3]))], 0).unwrap_err();
    assert_eq!(e, FlowModError::GroupExists(1));
    assert_eq!(p.snapshot().generation(), 1);
    assert_eq!(
        p.snapshot().group(1).unwrap().buckets[0].actions,
        vec![Action::Output(2)]
    );
    // Modify replaces; a missing id is refused unless may_create.
    let modify = |g, may_create| {
        TableMod::Group(GroupMod::Modify {
            group: g,
            may_create,
        })
    };
    let r = p.apply_bundle(&[modify(group(1, &[3]), false)], 0).unwrap();
    assert_eq!(r.groups_modified, 1);
    assert_eq!(
        p.snapshot().group(1).unwrap().buckets[0].actions,
        vec![Action::Output(3)]
    );
    assert_eq!(
        p.apply_bundle(&[modify(group(2, &[3]), false)], 0)
            .unwrap_err(),
        FlowModError::UnknownGroup(2)
    );
    let r = p.apply_bundle(&[modify(group(2, &[3]), true)], 0).unwrap();
    assert_eq!(r.groups_added, 1);
    assert_eq!(p.snapshot().groups().count(), 2);
    assert_eq!(p.snapshot().generation(), 3);
    // Delete of a missing group is no error; delete all empties the table.
    p.apply_bundle(&[TableMod::Group(GroupMod::Delete(Some(9)))], 0)
        .unwrap();
    let r = p
        .apply_bundle(&[TableMod::Group(GroupMod::Delete(None))], 0)
        .unwrap();
    assert_eq!(r.groups_deleted, 2);
    assert_eq!(p.snapshot().groups().count(), 0);
}

#[test]
fn flows_naming_a_missing_group_are_refused() {
    let p = Pipeline::new();
    let e = p.apply(&[add(to_group(0, 5, 7))], 0).unwrap_err();
    assert_eq!(e, FlowModError::BadOutGroup(7));
    assert!(e.to_string().contains("group 7"), "{e}");
    assert_eq!(p.snapshot().flow_count(), 0);
    assert_eq!(p.snapshot().generation(), 0);
    // Inside ct too.
    let ct = Action::Ct(CtAction {
        commit: true,
        force: false,
        zone: CtZoneSrc::Imm(0),
        table: None,
        exec: vec![Action::Group(8)],
    });
    let e = p
        .apply(&[add(flow(0, 5, &[port1()], vec![ct]))], 0)
        .unwrap_err();
    assert_eq!(e, FlowModError::BadOutGroup(8));
    // In a bundle: the group may come after the flow; the index names the flow.
    p.apply_bundle(
        &[TableMod::Flow(add(to_group(0, 5, 7))), gadd(group(7, &[2]))],
        0,
    )
    .unwrap();
    assert_eq!(p.snapshot().flow_count(), 1);
    let e = p
        .apply_bundle(
            &[gadd(group(8, &[2])), TableMod::Flow(add(to_group(0, 6, 9)))],
            0,
        )
        .unwrap_err();
    assert_eq!(
        e,
        FlowModError::InBundle {
            index: 1,
            error: Box::new(FlowModError::BadOutGroup(9))
        }
    );
    // All or nothing: group 8 was not added.
    assert!(p.snapshot().group(8).is_none());
    // Modify naming a missing group: refused too.
    let m = cmd(
        FlowModCommand::Modify { strict: false },
        None,
        to_group(0, 0, 9),
    );
    assert_eq!(p.apply(&[m], 0).unwrap_err(), FlowModError::BadOutGroup(9));
}

#[test]
fn deleting_a_group_deletes_the_flows_naming_it() {
    let p = Pipeline::new();
    p.apply_bundle(
        &[
            gadd(group(1, &[2])),
            gadd(group(2, &[3])),
            TableMod::Flow(add(to_group(0, 5, 1))),
            TableMod::Flow(add(to_group(3, 5, 2))),
            TableMod::Flow(add(flow(4, 5, &[port1()], vec![Action::Output(1)]))),
        ],
        0,
    )
    .unwrap();
    let gen = p.snapshot().generation();
    let r = p
        .apply_bundle(&[TableMod::Group(GroupMod::Delete(Some(1)))], 0)
        .unwrap();
    assert_eq!((r.groups_deleted, r.deleted), (1, 1));
    let ts = p.snapshot();
    assert_eq!(ts.generation(), gen + 1);
    assert_eq!(ts.flow_count(), 2);
    assert!(ts.flows_in(0).is_empty());
    // Delete then re-add in one bundle: the flows are gone, the group back.
    let r = p
        .apply_bundle(
            &[
                TableMod::Group(GroupMod::Delete(Some(2))),
                gadd(group(2, &[4])),
            ],
            0,
        )
        .unwrap();
    assert_eq!((r.groups_deleted, r.groups_added, r.deleted), (1, 1, 1));
    assert_eq!(p.snapshot().flow_count(), 1);
    // Modifying a group keeps its flows.
    p.apply_bundle(&[TableMod::Flow(add(to_group(3, 5, 2)))], 0)
        .unwrap();
    p.apply_bundle(
        &[TableMod::Group(GroupMod::Modify {
            group: group(2, &[5]),
            may_create: false,
        })],
        0,
    )
    .unwrap();
    assert_eq!(p.snapshot().flow_count(), 2);
}

#[test]
fn bad_groups_built_in_code_are_refused() {
    let p = Pipeline::new();
    let mut g = group(1, &[2, 3]);
    g.kind = GroupType::Indirect;
    assert!(matches!(
        p.apply_bundle(&[gadd(g)], 0),
        Err(FlowModError::BadGroup { id: 1, .. })
    ));
    let mut g = group(1, &[2, 3]);
    g.buckets[1].id = 0;
    assert!(matches!(
        p.apply_bundle(&[gadd(g)], 0),
        Err(FlowModError::BadGroup { .. })
    ));
    let mut g = group(1, &[2]);
    g.buckets[0].actions.push(Action::GotoTable(3));
    assert!(matches!(
        p.apply_bundle(&[gadd(g)], 0),
        Err(FlowModError::BadGroup { .. })
    ));
    assert!(matches!(
        p.apply_bundle(&[gadd(group(GROUP_MAX + 1, &[]))], 0),
        Err(FlowModError::BadGroup { .. })
    ));
    assert_eq!(p.snapshot().generation(), 0);
}

#[test]
fn replace_all_with_groups_is_one_version() {
    let p = Pipeline::new();
    p.apply_bundle(&[gadd(group(1, &[2])), gadd(group(2, &[3]))], 0)
        .unwrap();
    let kept = Arc::clone(p.snapshot().groups().next().unwrap());
    // Without groups: the group table stays; a flow naming a missing group fails.
    let e = p
        .replace_all(&[to_group(0, 1, 1), to_group(0, 2, 5)], 0)
        .unwrap_err();
    assert_eq!(
        e,
        FlowModError::InBundle {
            index: 1,
            error: Box::new(FlowModError::BadOutGroup(5))
        }
    );
    let r = p
        .replace_all_with_groups(
            &[to_group(0, 1, 1), to_group(0, 2, 5)],
            Some(&[group(1, &[2]), group(5, &[9])]),
            0,
        )
        .unwrap();
    assert_eq!(
        (r.groups_added, r.groups_modified, r.groups_deleted),
        (1, 0, 1)
    );
    let ts = p.snapshot();
    assert_eq!(ts.groups().map(|g| g.id).collect::<Vec<_>>(), vec![1, 5]);
    // The unchanged group is the same object.
    assert!(Arc::ptr_eq(ts.groups().next().unwrap(), &kept));
    assert_eq!(ts.flow_count(), 2);
}
