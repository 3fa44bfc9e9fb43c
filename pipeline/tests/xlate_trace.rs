//! `ofproto/trace`-style output over the real slow path.
//!
//! Action and match text come from `print` (another module); these tests
//! check the trace's own structure: table lines, indentation, details,
//! recirculation sections and the summary lines.

use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::{Action, CtAction, CtZoneSrc, Flow, Match, SubField};
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::names::TableNames;
use oxvs_pipeline::odp::{recirc_id_for_table, DpAction};
use oxvs_pipeline::trace::{trace, NodeKind, TraceOptions, TraceReport};
use oxvs_pipeline::xlate::{translate_with, LinearTables, XlateEnv, XlateError};

fn flow(table: u8, priority: u16, m: &[(Field, u128)], actions: Vec<Action>) -> Flow {
    let mut matches = Match::CATCHALL;
    for (f, v) in m {
        matches.set_exact(*f, *v);
    }
    Flow {
        table,
        priority,
        matches,
        actions,
        ..Flow::default()
    }
}

fn tcp_key(in_port: u32) -> FlowKey {
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, in_port as u128);
    k.set(Field::DlType, 0x0800);
    k.set(Field::NwSrc, 0x0a00_0001);
    k.set(Field::NwDst, 0x0a00_0002);
    k.set(Field::NwProto, 6);
    k.set(Field::NwTtl, 64);
    k.set(Field::TpDst, 80);
    k
}

fn env() -> XlateEnv {
    XlateEnv::with_ports(vec![1, 2, 3])
}

fn resubmit(table: u8) -> Action {
    Action::Resubmit {
        in_port: None,
        table: Some(table),
    }
}

/// Lines of the first pass between the bridge underline and "Final flow".
fn step_lines(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.starts_with("---"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn ct_pipeline() -> LinearTables {
    LinearTables::from_flows(vec![
        flow(
            0,
            100,
            &[(Field::InPort, 1)],
            vec![
                Action::Load {
                    dst: SubField {
                        field: Field::Reg(0),
                        ofs: 0,
                        n_bits: 32,
                    },
                    value: 5,
                },
                Action::ModDlSrc(0xaa),
                Action::GotoTable(10),
            ],
        ),
        flow(
            10,
            10,
            &[],
            vec![Action::Ct(CtAction {
                commit: false,
                force: false,
                zone: CtZoneSrc::Imm(5),
                table: Some(20),
                exec: vec![],
            })],
        ),
        flow(
            20,
            10,
            &[(Field::CtState, (ct_state::TRK | ct_state::NEW) as u128)],
            vec![Action::Output(2)],
        ),
        flow(
            20,
            5,
            &[(Field::CtState, (ct_state::TRK | ct_state::EST) as u128)],
            vec![Action::Output(3)],
        ),
    ])
}

#[test]
fn nested_resubmits_are_indented_like_ovs() {
    let tables = LinearTables::from_flows(vec![
        flow(
            0,
            100,
            &[(Field::InPort, 1)],
            vec![
                resubmit(5),
                Action::Note(vec![0xaa]),
                Action::Output(2),
                Action::GotoTable(10),
            ],
        ),
        flow(
            5,
            10,
            &[],
            vec![
                Action::Move {
                    src: SubField {
                        field: Field::NwSrc,
                        ofs: 0,
                        n_bits: 32,
                    },
                    dst: SubField {
                        field: Field::Reg(1),
                        ofs: 0,
                        n_bits: 32,
                    },
                },
                resubmit(6),
            ],
        ),
        flow(6, 10, &[], vec![Action::Output(3)]),
    ]);
    let report = trace(&tables, &tcp_key(1), &env(), &TraceOptions::default());
    let text = report.to_string();
    let lines = step_lines(&text);
    let indents: Vec<(usize, &str)> = lines
        .iter()
        .map(|l| {
            let t = l.trim_start();
            (l.len() - t.len(), t)
        })
        .collect();
    // Shape (OVS): table line at the list's level, its actions one step
    // in; a resubmitted table that is not last sits one step in with its
    // actions three steps in; a last table (tail resubmit, goto) does not
    // move right.
    let expect: Vec<(usize, &str)> = vec![
        (1, "0."),  // " 0. ..., priority 100"
        (4, "A"),   // resubmit(,5)
        (5, "5."),  // "     5. priority 10"
        (12, "A"),  // move
        (13, "->"), // " -> NXM_NX_REG1[] is now 0xa000001"
        (12, "A"),  // resubmit(,6)
        (9, "6."),  // "         6. priority 10"
        (12, "A"),  // output:3
        (4, "A"),   // note
        (4, "A"),   // output:2
        (4, "A"),   // goto_table:10
        (0, "10."), // "10. No match."
        (4, "A"),   // drop
    ];
    assert_eq!(indents.len(), expect.len(), "{text}");
    for ((got_i, got_t), (want_i, want_t)) in indents.iter().zip(&expect) {
        assert_eq!(got_i, want_i, "{got_t:?} in\n{text}");
        if *want_t != "A" {
            assert!(got_t.starts_with(want_t), "{got_t:?} in\n{text}");
        }
    }
    assert!(
        text.contains(" -> NXM_NX_REG1[] is now 0xa000001"),
        "{text}"
    );
    assert!(text.contains("priority 100\n"), "{text}");
    assert!(text.contains("10. No match.\n    drop\n"), "{text}");
    assert!(text.starts_with("Flow: "), "{text}");
    assert!(
        text.contains("\n\nbridge(\"oxvs\")\n--------------\n"),
        "{text}"
    );
    assert!(text.contains("\nFinal flow: "), "{text}");
    assert!(text.contains("\nMegaflow: "), "{text}");
    assert!(text.contains("\nDatapath actions: "), "{text}");
    // The trace ran the real translation.
    let t = translate_with(&tables, &tcp_key(1), &env());
    assert_eq!(report.passes.len(), 1);
    assert_eq!(report.passes[0].actions, t.actions);
    assert_eq!(report.passes[0].megaflow.mask, t.wildcards);
    assert_eq!(t.actions, vec![DpAction::Output(3), DpAction::Output(2)]);
    // reg1 was written: the final flow differs.
    assert_eq!(report.passes[0].final_flow.get(Field::Reg(1)), 0x0a00_0001);
}

#[test]
fn table_names_and_cookies_are_printed() {
    let mut f = flow(10, 7, &[], vec![]);
    f.cookie = 0x1234;
    let tables = LinearTables::from_flows(vec![flow(0, 1, &[], vec![Action::GotoTable(10)]), f]);
    let opts = TraceOptions {
        names: Some(TableNames::default()),
        bridge: "br-int".into(),
        ..TraceOptions::default()
    };
    let text = trace(&tables, &tcp_key(1), &env(), &opts).to_string();
    assert!(text.contains("\n 0. Classifier: priority 1\n"), "{text}");
    assert!(
        text.contains("10. SpoofGuard: priority 7, cookie 0x1234\n    drop\n"),
        "{text}"
    );
    assert!(
        text.contains("bridge(\"br-int\")\n----------------\n"),
        "{text}"
    );
    assert!(text.ends_with("Datapath actions: drop"), "{text}");
    assert!(text.contains("Final flow: unchanged"), "{text}");
}

#[test]
fn ct_recirculation_is_traced_with_default_state() {
    let tables = ct_pipeline();
    let report = trace(&tables, &tcp_key(1), &env(), &TraceOptions::default());
    assert_eq!(report.passes.len(), 2);
    let first = &report.passes[0];
    assert_eq!(
        first.actions.last(),
        Some(&DpAction::Recirc(recirc_id_for_table(20)))
    );
    let second = &report.passes[1];
    let info = second.recirc.expect("recirculated pass");
    assert_eq!(info.id, recirc_id_for_table(20));
    assert!(info.default_state);
    // The recirculated key: the working key at the ct, plus conntrack's verdict.
    assert_eq!(second.flow.get(Field::RecircId), 21);
    assert_eq!(second.flow.get(Field::CtZone), 5);
    assert_eq!(
        second.flow.get(Field::CtState),
        (ct_state::TRK | ct_state::NEW) as u128
    );
    assert_eq!(second.flow.get(Field::Reg(0)), 5);
    assert_eq!(second.flow.get(Field::DlSrc), 0xaa);
    assert_eq!(second.actions, vec![DpAction::Output(2)]);

    let text = report.to_string();
    let rule = "=".repeat(79);
    assert!(
        text.contains(&format!(
            "\n\n{rule}\nrecirc(0x15) - resume conntrack with default ct_state=trk|new \
             (use --ct-next to customize)\n{rule}\n\nFlow: "
        )),
        "{text}"
    );
    assert!(
        text.contains("\n    thaw\n        Resuming from table 20\n20. "),
        "{text}"
    );
    assert!(
        text.contains(
            " -> A clone of the packet is forked to recirculate. \
             The forked pipeline will be resumed at table 20.\n"
        ),
        "{text}"
    );
    assert_eq!(text.matches("Datapath actions: ").count(), 2, "{text}");
}

#[test]
fn ct_next_states_are_used_in_order() {
    let tables = ct_pipeline();
    let opts = TraceOptions {
        ct_next: vec![ct_state::TRK | ct_state::EST],
        ..TraceOptions::default()
    };
    let report = trace(&tables, &tcp_key(1), &env(), &opts);
    let second = &report.passes[1];
    assert!(!second.recirc.unwrap().default_state);
    assert_eq!(second.actions, vec![DpAction::Output(3)]);
    assert!(report
        .to_string()
        .contains("recirc(0x15) - resume conntrack with ct_state=est|trk\n"));
}

#[test]
fn recirculation_loops_are_cut() {
    // Table 20 sends every packet round again.
    let tables = LinearTables::from_flows(vec![flow(
        0,
        1,
        &[],
        vec![Action::Ct(CtAction {
            commit: false,
            force: false,
            zone: CtZoneSrc::Imm(1),
            table: Some(0),
            exec: vec![],
        })],
    )]);
    let report = trace(&tables, &tcp_key(1), &env(), &TraceOptions::default());
    assert_eq!(
        report.passes.len(),
        oxvs_pipeline::trace::MAX_RECIRCULATIONS + 1
    );
    assert!(report.unprocessed > 0);
    assert!(report
        .to_string()
        .contains("Trace reached the recirculation limit."));
}

#[test]
fn failures_and_warnings_are_reported() {
    let tables = LinearTables::from_flows(vec![flow(
        0,
        1,
        &[],
        vec![Action::Output(1), Action::DecTtl, resubmit(0)],
    )]);
    let mut k = tcp_key(1);
    k.set(Field::NwTtl, 1);
    let text = trace(&tables, &k, &env(), &TraceOptions::default()).to_string();
    assert!(
        text.contains(" >> skipping output to input port\n"),
        "{text}"
    );
    assert!(
        text.contains(" >> IPv4 decrement TTL exception\n"),
        "{text}"
    );
    // As OVS 3.1 prints it (with its own pid and cookie fields): the
    // invalid_ttl packet-in, then nothing.
    assert!(
        text.ends_with(
            "Datapath actions: userspace(pid=0,controller(reason=2,table=0,rule_cookie=0x0))"
        ),
        "{text}"
    );

    let tables = LinearTables::from_flows(vec![flow(0, 1, &[], vec![resubmit(0)])]);
    let report: TraceReport = trace(&tables, &k, &env(), &TraceOptions::default());
    assert_eq!(
        report.passes[0].error,
        Some(XlateError::RecursionTooDeep(64))
    );
    let text = report.to_string();
    assert!(text.contains(" >>>> Recursion too deep"), "{text}");
    assert!(
        text.ends_with(
            "Datapath actions: drop\nTranslation failed (Recursion too deep: \
             resubmit nesting over 64 levels), packet is dropped.\n"
        ),
        "{text}"
    );
}

#[test]
fn unknown_recirc_id_is_an_error_node() {
    let tables = LinearTables::new();
    let mut k = tcp_key(1);
    k.set(Field::RecircId, 0x999);
    let report = trace(&tables, &k, &env(), &TraceOptions::default());
    let root = &report.passes[0].nodes[0];
    assert_eq!(root.kind(), NodeKind::Bridge);
    assert_eq!(root.subs.len(), 1);
    assert_eq!(root.subs[0].kind(), NodeKind::Error);
}

#[test]
fn trace_packet_extracts_then_traces() {
    let tables = LinearTables::from_flows(vec![flow(
        0,
        1,
        &[(Field::InPort, 4)],
        vec![Action::Output(2)],
    )]);
    let report = oxvs_pipeline::trace::trace_packet(
        &tables,
        &[0u8; 14],
        4,
        &env(),
        &TraceOptions::default(),
    );
    assert_eq!(report.passes[0].flow.get(Field::InPort), 4);
    assert_eq!(report.passes[0].actions, vec![DpAction::Output(2)]);
}
