//! Black-box tests of the `oxvsctl` binary: exit codes, messages, output.

mod common;

use std::path::PathBuf;

use common::{oxvsctl, stderr, stdout};

fn example() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/antrea-like.flows")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(oxvsctl(&[], None).status.code(), Some(2));
    assert_eq!(oxvsctl(&["no-such-command"], None).status.code(), Some(2));
    // trace needs a spec or --packet; --packet needs --in-port.
    let o = oxvsctl(&["trace", "--flows", "-"], Some(""));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = oxvsctl(&["trace", "--flows", "-", "--packet", "00"], Some(""));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = oxvsctl(&["dump-flows", "--flows", "-", "--table", "Nope"], Some(""));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("'Nope'"), "{}", stderr(&o));
    // flush-conntrack's filters are checked before the switch is asked.
    for (args, what) in [
        (
            &["flush-conntrack", "--proto", "tcpx"][..],
            "not a protocol",
        ),
        (&["flush-conntrack", "--proto", "300"][..], "not a protocol"),
        (
            &["flush-conntrack", "--reply-src", "10.0.0.1:x"][..],
            "not IP or IP:PORT",
        ),
        (
            &["flush-conntrack", "--reply-src", "10.0.0.1:70000"][..],
            "not IP or IP:PORT",
        ),
    ] {
        let o = oxvsctl(args, None);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(what), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn help_exits_0() {
    let o = oxvsctl(&["--help"], None);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("check-flows"));
}

#[test]
fn unreadable_file_exits_1_naming_it() {
    let o = oxvsctl(&["check-flows", "/nonexistent/x.flows"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("/nonexistent/x.flows"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn check_flows_reports_file_line_column_token() {
    let text =
        "# a comment\ntable=0, priority=10, actions=drop\ntable=0, nw_dts=10.0.0.1, actions=drop\n";
    let o = oxvsctl(&["check-flows", "-"], Some(text));
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.starts_with("<stdin>:3:"), "{err}");
    assert!(err.contains("(token 'nw_dts"), "{err}");
}

#[test]
fn check_flows_accepts_the_example() {
    let o = oxvsctl(&["check-flows", &example()], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    // 16 tables in the plan, all used by the example.
    assert!(out.trim_end().ends_with("flows in 16 tables OK"), "{out}");
}

#[test]
fn check_flows_from_stdin() {
    let o = oxvsctl(
        &["check-flows", "-"],
        Some("table=0, in_port=1, actions=output:2\ntable=0, in_port=2, actions=output:1\n"),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "2 flows in 1 table OK");
}

#[test]
fn dump_flows_with_names_and_table_filter() {
    let o = oxvsctl(
        &[
            "dump-flows",
            "--flows",
            &example(),
            "--names",
            "--no-stats",
            "--table",
            "L3Forwarding",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert!(
        lines.iter().all(|l| l.contains("table=L3Forwarding")),
        "{out}"
    );
    assert!(!out.contains("n_packets"), "{out}");
    // Highest priority first.
    assert!(lines[0].contains("priority=200"), "{out}");
}

#[test]
fn trace_ends_in_datapath_actions() {
    let o = oxvsctl(
        &[
            "trace",
            "--flows",
            &example(),
            "--ct-next",
            "trk,new",
            "tcp,in_port=3,dl_src=0a:58:0a:f4:00:03,dl_dst=0a:58:0a:f4:00:04,nw_src=10.244.0.3,nw_dst=10.244.0.4,nw_ttl=64,tp_src=40000,tp_dst=80",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let last = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(last.starts_with("Datapath actions: "), "{out}");
    assert!(last.ends_with(",4"), "{out}");
}

#[test]
fn trace_rejects_a_bad_spec_with_exit_1() {
    let o = oxvsctl(
        &["trace", "--flows", "-", "in_port=1,bogus_field=3"],
        Some("table=0, actions=drop\n"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bogus_field"), "{}", stderr(&o));
}

#[test]
fn trace_rejects_bad_ct_next_and_hex_with_exit_2_or_1() {
    let o = oxvsctl(
        &["trace", "--flows", "-", "--ct-next", "trk,wat", "in_port=1"],
        Some(""),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("wat"), "{}", stderr(&o));
    let o = oxvsctl(
        &["trace", "--flows", "-", "--packet", "0g", "--in-port", "1"],
        Some("table=0, actions=drop\n"),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("'0g'"), "{}", stderr(&o));
}

#[test]
fn check_flows_reports_table_errors_with_their_line() {
    // The tables, not the parser, see the overlap (check_overlap).
    let text = "table=0, priority=5, ip, actions=output:1\n\n# comment\n\
                table=0, priority=5, ip, nw_src=10.0.0.0/8, check_overlap, actions=output:2\n";
    let o = oxvsctl(&["check-flows", "-"], Some(text));
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.starts_with("<stdin>:4: "), "{err}");
    assert!(err.contains("check_overlap"), "{err}");
}

#[test]
fn group_files_offline() {
    let dir = common::TempDir(
        std::env::temp_dir().join(format!("oxvsctl-groups-{}", std::process::id())),
    );
    std::fs::create_dir_all(&dir.0).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let groups = write(
        "a.groups",
        "# mirror\ngroup_id=1,type=all,bucket=output:2,bucket=output:3\n",
    );
    let flows = write("a.flows", "in_port=1 actions=group:1\n");
    // Without the groups the flow names a missing group: its line says so.
    let o = oxvsctl(&["check-flows", &flows], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with(&format!("{flows}:1: ")),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("group 1"), "{}", stderr(&o));
    let o = oxvsctl(&["check-flows", &flows, "--groups", &groups], None);
    assert_eq!(stdout(&o), "1 flow in 1 table OK\n", "{}", stderr(&o));
    let o = oxvsctl(
        &[
            "trace",
            "--flows",
            &flows,
            "--groups",
            &groups,
            "in_port=1,ip",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).trim_end().ends_with("Datapath actions: 2,3"),
        "{}",
        stdout(&o)
    );
    let o = oxvsctl(&["dump-groups", "--groups", &groups], None);
    assert_eq!(
        stdout(&o),
        " group_id=1,type=all,bucket=bucket_id:0,actions=output:2,bucket=bucket_id:1,actions=output:3\n"
    );
    // A bad group file: FILE:LINE:COLUMN and the token.
    let bad = write(
        "bad.groups",
        "group_id=1,type=all\ngroup_id=2,type=all,bucket=goto_table:3\n",
    );
    let o = oxvsctl(&["dump-groups", "--groups", &bad], None);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o).trim(),
        format!("{bad}:2:28: goto_table is not allowed in a group bucket (token 'goto_table:3')")
    );
    // --groups is offline only for trace (it needs --flows).
    let o = oxvsctl(&["trace", "--groups", &groups, "in_port=1"], None);
    assert_eq!(o.status.code(), Some(2));
}
