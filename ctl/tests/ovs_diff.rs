//! Differential tests: oxvs's trace against Open vSwitch's.
//!
//! Each case under `tests/ovs_cases/` is a flow file plus packet specs (see
//! the README there). For each case the test creates a uniquely named OVS
//! bridge (`datapath_type=netdev`, internal ports with OpenFlow numbers
//! 1..5), loads the flow file with `ovs-ofctl -O OpenFlow15 add-flows`, and
//! for every packet compares
//!
//! - `ovs-appctl ofproto/trace BRIDGE 'SPEC' [--ct-next STATE]...` with
//! - `oxvsctl trace --flows FILE 'SPEC' [--ct-next STATE]...` (the real binary)
//!
//! on their `Datapath actions:` lines (one per pass through the tables),
//! after [`normalise`]: OVS prints datapath port numbers where oxvs prints
//! OpenFlow ports, picks its own recirculation ids, and merges header writes
//! differently; masked writes are compared by value under the mask
//! ([`same_actions`]). Each packet line also records the expected (normalised)
//! answer, which OVS must give too: that keeps the cases honest and catches
//! a broken harness.
//!
//! OVS is started if it is installed but not running; if it is not
//! installed the tests print why they are skipped and pass (CI installs it:
//! `scripts/setup.sh`). The bridge is deleted when the case ends, also when
//! it fails (a drop guard).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

// ---------------------------------------------------------------------------
// Normalisation (pure functions, tested below without OVS).
// ---------------------------------------------------------------------------

/// The `Datapath actions:` payloads of a trace, in order.
fn datapath_actions(trace: &str) -> Vec<String> {
    trace
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("Datapath actions:"))
        .map(|a| a.trim().to_string())
        .collect()
}

/// Splits `s` at the commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() || !out.is_empty() {
        out.push(&s[start..]);
    }
    out.into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

/// `set(PROTO(a=1,b=2))` -> `("PROTO", ["a=1", "b=2"])`.
fn parse_set(action: &str) -> Option<(&str, Vec<&str>)> {
    let inner = action.strip_prefix("set(")?.strip_suffix(')')?;
    let open = inner.find('(')?;
    let proto = &inner[..open];
    let fields = inner[open + 1..].strip_suffix(')')?;
    Some((proto, split_top(fields)))
}

/// Drops a mask that covers the whole value (`/255.255.255.255`,
/// `/ff:ff:ff:ff:ff:ff`, `/0xffff`): OVS prints masked sets where oxvs may
/// not, and a full mask means the same as none.
fn strip_full_mask(item: &str) -> String {
    if let Some((value, mask)) = item.rsplit_once('/') {
        let all_ones = mask
            .trim_start_matches("0x")
            .chars()
            .all(|c| matches!(c, 'f' | 'F' | ':' | '.'))
            || mask.split('.').all(|o| o == "255") && mask.contains('.');
        if all_ones && !mask.is_empty() {
            return value.to_string();
        }
    }
    item.to_string()
}

/// Canonicalises one pass's datapath actions:
///
/// - a bare number (an output) is a datapath port: mapped to its OpenFlow
///   port with `ports` (numbers missing from the map are kept);
/// - `recirc(ID)` becomes `recirc(#N)`, N numbering distinct ids in order of
///   appearance across the whole trace (`recircs` carries the numbering);
/// - a run of consecutive `set(...)` actions is merged per header, its
///   fields sorted and full masks dropped, the headers sorted: writes to
///   different fields between two outputs commute, so only the set matters;
/// - `userspace(...controller(reason=R,...))` becomes
///   `userspace(controller(reason=R))`, whatever its `dont_send`:
///   `ofproto/trace` sets `dont_send=1` on every packet-in it shows
///   because a trace has no side effects (`xlate_controller_action`:
///   `!allow_side_effects && !xcache`), while the datapath flow of a real
///   packet carries the same action with `dont_send=0` (the packet-in is
///   made; whether a controller receives it is the connection's
///   asynchronous configuration);
/// - `set(tunnel(...))` is dropped when `drop_tunnel` is given: OVS emits
///   tunnel metadata only on output to a tunnel port, and the test bridge's
///   ports are all internal.
fn normalise_actions(
    actions: &str,
    ports: &HashMap<u32, u32>,
    recircs: &mut Vec<String>,
    drop_tunnel: bool,
) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut sets: Vec<(String, Vec<String>)> = Vec::new();
    let flush = |sets: &mut Vec<(String, Vec<String>)>, out: &mut Vec<String>| {
        sets.sort();
        for (proto, mut fields) in sets.drain(..) {
            fields.sort();
            fields.dedup();
            out.push(format!("set({proto}({}))", fields.join(",")));
        }
    };
    for a in split_top(actions) {
        if let Some((proto, fields)) = parse_set(a) {
            if drop_tunnel && proto == "tunnel" {
                continue;
            }
            let fields: Vec<String> = fields.into_iter().map(strip_full_mask).collect();
            match sets.iter_mut().find(|(p, _)| p == proto) {
                Some((_, existing)) => {
                    // A later write to the same field wins.
                    for f in fields {
                        let name = f.split('=').next().unwrap_or("").to_string();
                        existing.retain(|e| e.split('=').next() != Some(name.as_str()));
                        existing.push(f);
                    }
                }
                None => sets.push((proto.to_string(), fields)),
            }
            continue;
        }
        flush(&mut sets, &mut out);
        if !a.is_empty() && a.bytes().all(|b| b.is_ascii_digit()) {
            let port: Option<u32> = a.parse().ok();
            let mapped = port.and_then(|p| ports.get(&p).copied());
            out.push(mapped.map_or_else(|| a.to_string(), |p| p.to_string()));
        } else if let Some(reason) = controller_reason(a) {
            out.push(format!("userspace(controller(reason={reason}))"));
        } else if let Some(id) = a.strip_prefix("recirc(").and_then(|r| r.strip_suffix(')')) {
            let n = match recircs.iter().position(|r| r == id) {
                Some(i) => i + 1,
                None => {
                    recircs.push(id.to_string());
                    recircs.len()
                }
            };
            out.push(format!("recirc(#{n})"));
        } else {
            out.push(a.to_string());
        }
    }
    flush(&mut sets, &mut out);
    if out.is_empty() {
        "drop".into()
    } else {
        out.join(",")
    }
}

/// The packet-in reason of a `userspace(...controller(reason=R,...)...)`
/// action: the rest (netlink pid, recirculation id for continuations,
/// cookie) depends on the switch's state, not on the flows.
fn controller_reason(action: &str) -> Option<&str> {
    let rest = action.strip_prefix("userspace(")?;
    let after = &rest[rest.find("controller(reason=")? + "controller(reason=".len()..];
    let end = after.find([',', ')']).unwrap_or(after.len());
    Some(&after[..end])
}

/// A whole trace's datapath actions, normalised, passes joined by ` ; `.
fn normalise(trace: &str, ports: &HashMap<u32, u32>) -> String {
    let mut recircs = Vec::new();
    datapath_actions(trace)
        .iter()
        .map(|a| normalise_actions(a, ports, &mut recircs, true))
        .collect::<Vec<_>>()
        .join(" ; ")
}

/// Splits a normalised trace into tokens: runs of text and the single
/// characters `,();` and space between them.
fn tokens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if matches!(c, ',' | '(' | ')' | ';' | ' ') {
            if start < i {
                out.push(&s[start..i]);
            }
            out.push(&s[i..i + 1]);
            start = i + 1;
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// A field value as written in datapath actions: `0x..` hex, decimal,
/// dotted-quad IPv4 or colon-separated MAC.
fn parse_value(v: &str) -> Option<u128> {
    if let Some(h) = v.strip_prefix("0x") {
        return u128::from_str_radix(h, 16).ok();
    }
    if v.contains('.') {
        let octets: Vec<&str> = v.split('.').collect();
        if octets.len() != 4 {
            return None;
        }
        return octets.iter().try_fold(0u128, |acc, o| {
            Some(acc << 8 | u128::from(o.parse::<u8>().ok()?))
        });
    }
    if v.contains(':') {
        let bytes: Vec<&str> = v.split(':').collect();
        if bytes.len() != 6 {
            return None;
        }
        return bytes.iter().try_fold(0u128, |acc, b| {
            Some(acc << 8 | u128::from(u8::from_str_radix(b, 16).ok()?))
        });
    }
    v.parse().ok()
}

/// Whether oxvs's normalised trace says the same as OVS's, allowing for
/// masked sets: OVS prints `set(ipv4(tos=0xb8/0xfc))` (the bits the flow
/// wrote, and which), oxvs the whole field after the write
/// (`set(ipv4(tos=0xb8))`); they agree when oxvs's value under OVS's mask is
/// OVS's value.
fn same_actions(ovs: &str, oxvs: &str) -> bool {
    if ovs == oxvs {
        return true;
    }
    let (a, b) = (tokens(ovs), tokens(oxvs));
    a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| {
            if x == y {
                return true;
            }
            let (Some((xk, xv)), Some((yk, yv))) = (x.split_once('='), y.split_once('=')) else {
                return false;
            };
            let Some((value, mask)) = xv.split_once('/') else {
                return false;
            };
            match (parse_value(value), parse_value(mask), parse_value(yv)) {
                (Some(v), Some(m), Some(w)) => xk == yk && w & m == v & m,
                _ => false,
            }
        })
}

/// The datapath port -> OpenFlow port map of `bridge`, from `ovs-appctl
/// dpif/show` (lines `    NAME OFPORT/DPPORT: (TYPE)` under `  BRIDGE:`).
fn parse_dpif_show(text: &str, bridge: &str) -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if indent == 2 && t.ends_with(':') {
            inside = t.trim_end_matches(':') == bridge;
            continue;
        }
        if indent == 0 {
            inside = false;
            continue;
        }
        if !inside {
            continue;
        }
        let Some(numbers) = t.split_whitespace().nth(1) else {
            continue;
        };
        let numbers = numbers.trim_end_matches(':');
        if let Some((of, dp)) = numbers.split_once('/') {
            if let (Ok(of), Ok(dp)) = (of.parse::<u32>(), dp.parse::<u32>()) {
                map.insert(dp, of);
            }
        }
    }
    map
}

/// One line of a `.packets` file.
#[derive(Debug, PartialEq)]
struct PacketCase {
    line: usize,
    spec: String,
    ct_next: Vec<String>,
    expected: String,
}

/// Parses a `.packets` file: `SPEC [--ct-next STATE]... => EXPECTED`.
fn parse_packets(text: &str) -> Result<Vec<PacketCase>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (lhs, expected) = line
            .split_once("=>")
            .ok_or_else(|| format!("line {}: no '=> EXPECTED' in '{line}'", i + 1))?;
        let mut words = lhs.split_whitespace();
        let spec = words
            .next()
            .ok_or_else(|| format!("line {}: no packet spec", i + 1))?
            .to_string();
        let mut ct_next = Vec::new();
        while let Some(w) = words.next() {
            match (w, words.next()) {
                ("--ct-next", Some(state)) => ct_next.push(state.to_string()),
                _ => return Err(format!("line {}: unexpected '{w}'", i + 1)),
            }
        }
        out.push(PacketCase {
            line: i + 1,
            spec,
            ct_next,
            expected: expected.trim().to_string(),
        });
    }
    Ok(out)
}

#[test]
fn normaliser_maps_ports_and_recirc_ids() {
    let ports = HashMap::from([(11, 3), (12, 4)]);
    let trace = "Flow: x\nDatapath actions: ct(zone=65520),recirc(0x7)\n\
                 ...\nDatapath actions: ct(commit,zone=65520),12\n";
    assert_eq!(
        normalise(trace, &ports),
        "ct(zone=65520),recirc(#1) ; ct(commit,zone=65520),4"
    );
    // Unmapped numbers stay; numbers inside parentheses are not ports.
    assert_eq!(
        normalise("Datapath actions: 99,11,ct(zone=11)", &ports),
        "99,3,ct(zone=11)"
    );
    // Distinct ids number in order of appearance, repeats reuse theirs.
    let mut r = Vec::new();
    assert_eq!(
        normalise_actions(
            "recirc(0x20),recirc(0x5),recirc(0x20)",
            &ports,
            &mut r,
            true
        ),
        "recirc(#1),recirc(#2),recirc(#1)"
    );
    assert_eq!(normalise("nothing here", &ports), "");
    assert_eq!(
        normalise(
            "Datapath actions: userspace(pid=0,controller(reason=1,dont_send=0,recirc_id=43,max_len=65535))",
            &ports
        ),
        "userspace(controller(reason=1))"
    );
    assert_eq!(
        normalise(
            "Datapath actions: userspace(pid=0,controller(reason=2,dont_send=1,recirc_id=43,max_len=65535))",
            &ports
        ),
        "userspace(controller(reason=2))"
    );
    // oxvs prints the packet-in's table and cookie instead.
    assert_eq!(
        normalise(
            "Datapath actions: set(eth(src=02:00:00:00:00:01)),userspace(pid=0,controller(reason=2,table=55,rule_cookie=0x1))",
            &ports
        ),
        "set(eth(src=02:00:00:00:00:01)),userspace(controller(reason=2))"
    );
    assert_eq!(normalise("Datapath actions: drop", &ports), "drop");
}

#[test]
fn normaliser_canonicalises_sets() {
    let none = HashMap::new();
    let mut r = Vec::new();
    // Split or merged, any order, with or without full masks: the same.
    let a = normalise_actions(
        "set(ipv4(ttl=63)),set(eth(src=0a:00:00:00:00:01)),set(eth(dst=0a:00:00:00:00:02/ff:ff:ff:ff:ff:ff)),2",
        &none,
        &mut r,
        true,
    );
    let b = normalise_actions(
        "set(eth(dst=0a:00:00:00:00:02,src=0a:00:00:00:00:01)),set(ipv4(ttl=63)),2",
        &none,
        &mut r,
        true,
    );
    assert_eq!(a, b);
    assert_eq!(
        a,
        "set(eth(dst=0a:00:00:00:00:02,src=0a:00:00:00:00:01)),set(ipv4(ttl=63)),2"
    );
    // Partial masks are kept; sets are not moved across an output.
    assert_eq!(
        normalise_actions(
            "set(ipv4(src=10.0.0.0/255.0.0.0)),1,set(ipv4(ttl=62)),2",
            &none,
            &mut r,
            true
        ),
        "set(ipv4(src=10.0.0.0/255.0.0.0)),1,set(ipv4(ttl=62)),2"
    );
    // The later of two writes to one field wins.
    assert_eq!(
        normalise_actions("set(ipv4(ttl=63)),set(ipv4(ttl=62)),1", &none, &mut r, true),
        "set(ipv4(ttl=62)),1"
    );
    // Tunnel metadata is dropped only when asked.
    let t = "set(tunnel(dst=192.168.77.12,ttl=64,flags(df|key))),2";
    assert_eq!(normalise_actions(t, &none, &mut r, true), "2");
    assert_eq!(
        normalise_actions(t, &none, &mut r, false),
        "set(tunnel(dst=192.168.77.12,flags(df|key),ttl=64)),2"
    );
    assert_eq!(strip_full_mask("tp_dst=80/0xffff"), "tp_dst=80");
    assert_eq!(strip_full_mask("tp_dst=80/0xff00"), "tp_dst=80/0xff00");
    assert_eq!(
        strip_full_mask("src=1.2.3.4/255.255.255.255"),
        "src=1.2.3.4"
    );
}

#[test]
fn masked_sets_compare_by_value_under_the_mask() {
    let ovs = "set(ipv4(tos=0xb8/0xfc)),set(tcp(dst=8080)),5";
    assert!(same_actions(
        ovs,
        "set(ipv4(tos=0xb8)),set(tcp(dst=8080)),5"
    ));
    assert!(same_actions(
        ovs,
        "set(ipv4(tos=0xb9)),set(tcp(dst=8080)),5"
    ));
    assert!(!same_actions(
        ovs,
        "set(ipv4(tos=0xbc)),set(tcp(dst=8080)),5"
    ));
    assert!(!same_actions(
        ovs,
        "set(ipv4(tos=0xb8)),set(tcp(dst=8081)),5"
    ));
    assert!(!same_actions(ovs, "set(ipv4(tos=0xb8)),5"));
    assert!(same_actions(
        "set(ipv4(src=10.0.0.0/255.0.0.0)),1",
        "set(ipv4(src=10.1.2.3)),1"
    ));
    assert!(same_actions(
        "set(eth(dst=02:00:00:00:00:00/ff:ff:00:00:00:00)),1",
        "set(eth(dst=02:00:5e:00:00:01)),1"
    ));
    // The key must match too, and an unmasked difference is a difference.
    assert!(!same_actions(
        "set(ipv4(tos=0xb8/0xfc)),1",
        "set(ipv4(ttl=0xb8)),1"
    ));
    assert!(!same_actions("1", "2"));
    assert_eq!(parse_value("10.0.0.1"), Some(0x0a00_0001));
    assert_eq!(parse_value("0a:00:00:00:00:01"), Some(0x0a00_0000_0001));
    assert_eq!(parse_value("1.2.3"), None);
}

#[test]
fn dpif_show_is_parsed_per_bridge() {
    let text =
        "netdev@ovs-netdev: hit:0 missed:0\n  br0:\n    br0 65534/1: (tap)\n    p1 1/3: (tap)\n  \
                oxd1:\n    oxd1 65534/2: (tap)\n    oxd1p1 1/7: (tap)\n    oxd1p2 2/8: (tap)\n";
    let m = parse_dpif_show(text, "oxd1");
    assert_eq!(m, HashMap::from([(2, 65534), (7, 1), (8, 2)]));
    assert!(parse_dpif_show(text, "nope").is_empty());
}

#[test]
fn packets_files_parse() {
    let text = "# c\n\ntcp,in_port=1 --ct-next trk,new --ct-next trk,est => a ; b\nip => drop\n";
    let p = parse_packets(text).expect("parses");
    assert_eq!(
        p,
        vec![
            PacketCase {
                line: 3,
                spec: "tcp,in_port=1".into(),
                ct_next: vec!["trk,new".into(), "trk,est".into()],
                expected: "a ; b".into(),
            },
            PacketCase {
                line: 4,
                spec: "ip".into(),
                ct_next: vec![],
                expected: "drop".into(),
            },
        ]
    );
    assert!(parse_packets("ip").is_err());
    assert!(parse_packets("ip --bogus x => drop").is_err());
}

#[test]
fn every_case_has_flows_and_packets() {
    let cases = case_names();
    assert!(cases.len() >= 10, "cases: {cases:?}");
    for name in &cases {
        assert!(flows_path(name).is_file(), "{name}: no flow file");
        let text = std::fs::read_to_string(cases_dir().join(format!("{name}.packets")))
            .expect("packets file");
        let packets = parse_packets(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!packets.is_empty(), "{name}: no packets");
    }
}

// ---------------------------------------------------------------------------
// Running OVS.
// ---------------------------------------------------------------------------

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ovs_cases")
}

/// The case names (`.packets` files), sorted.
fn case_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cases_dir())
        .expect("tests/ovs_cases exists")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".packets").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// The flow file of a case; `antrea-like` is the shipped example.
fn flows_path(case: &str) -> PathBuf {
    if case == "antrea-like" {
        return Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/antrea-like.flows");
    }
    cases_dir().join(format!("{case}.flows"))
}

/// The group file of a case (`NAME.groups`), if it has one: loaded with
/// `ovs-ofctl -O OpenFlow15 add-groups` before the flows, and given to
/// `oxvsctl trace --groups`.
fn groups_path(case: &str) -> Option<PathBuf> {
    Some(cases_dir().join(format!("{case}.groups"))).filter(|p| p.is_file())
}

fn run(cmd: &str, args: &[&str]) -> Result<Output, String> {
    Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))
}

fn run_ok(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = run(cmd, args)?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether OVS can be used: `Err(reason)` to skip. Starts it once if it is
/// installed but not running (an error then is a failure, not a skip).
fn ovs_ready() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            if run("ovs-vsctl", &["--version"]).is_err() {
                return Err("Open vSwitch is not installed (no ovs-vsctl); \
                            scripts/setup.sh installs openvswitch-switch"
                    .into());
            }
            if run_ok("ovs-vsctl", &["--timeout=5", "show"]).is_ok() {
                return Ok(());
            }
            let ctl = "/usr/share/openvswitch/scripts/ovs-ctl";
            let started = run_ok(ctl, &["start", "--system-id=random"]);
            match run_ok("ovs-vsctl", &["--timeout=5", "show"]) {
                Ok(_) => Ok(()),
                Err(e) => panic!("OVS is installed but does not start: {started:?}; {e}"),
            }
        })
        .clone()
}

/// A netdev bridge with internal ports 1..=n, deleted on drop.
struct Bridge {
    name: String,
}

impl Bridge {
    fn create(n_ports: u32) -> Result<Bridge, String> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        // Linux interface names are at most 15 bytes: "oxd" + 5 + "c" + 2 + "p" + 1.
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("oxd{:05}c{:02}", std::process::id() % 100_000, seq % 100);
        let bridge = Bridge { name };
        let b = bridge.name.as_str();
        let mut args: Vec<String> = vec![
            "--may-exist".into(),
            "add-br".into(),
            b.into(),
            "--".into(),
            "set".into(),
            "bridge".into(),
            b.into(),
            "datapath_type=netdev".into(),
            "fail_mode=secure".into(),
        ];
        for p in 1..=n_ports {
            let port = format!("{b}p{p}");
            args.extend([
                "--".into(),
                "add-port".into(),
                b.into(),
                port.clone(),
                "--".into(),
                "set".into(),
                "interface".into(),
                port,
                "type=internal".into(),
                format!("ofport_request={p}"),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_ok("ovs-vsctl", &args)?;
        Ok(bridge)
    }

    /// Datapath port -> OpenFlow port.
    fn port_map(&self) -> Result<HashMap<u32, u32>, String> {
        let text = run_ok("ovs-appctl", &["dpif/show"])?;
        Ok(parse_dpif_show(&text, &self.name))
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = run("ovs-vsctl", &["--if-exists", "del-br", &self.name]);
    }
}

/// One packet's outcome.
struct Outcome {
    line: usize,
    spec: String,
    expected: String,
    ovs: String,
    oxvs: String,
}

/// Runs one case; returns the failures as text (empty = pass).
fn run_case(case: &str) -> Vec<String> {
    if let Err(reason) = ovs_ready() {
        oxvs_testutil::skip_or_fail(format!("ovs_diff::{case}: {reason}"));
        return Vec::new();
    }
    let flows = flows_path(case);
    let flows_s = flows.to_str().expect("utf-8 path");
    let packets_text =
        std::fs::read_to_string(cases_dir().join(format!("{case}.packets"))).expect("packets file");
    let packets = parse_packets(&packets_text).expect("packets parse");
    let groups = groups_path(case).map(|p| p.to_str().expect("utf-8 path").to_string());

    // OVS side: only one bridge setup at a time (ovsdb transactions are
    // cheap, but concurrent port creation makes dpif numbering racy to read).
    static SETUP: Mutex<()> = Mutex::new(());
    let (bridge, ports) = {
        let _g = SETUP.lock().unwrap_or_else(|e| e.into_inner());
        let bridge = Bridge::create(5).expect("create OVS bridge");
        if let Some(g) = &groups {
            run_ok(
                "ovs-ofctl",
                &["-O", "OpenFlow15", "add-groups", &bridge.name, g],
            )
            .expect("OVS loads the group file");
        }
        run_ok(
            "ovs-ofctl",
            &["-O", "OpenFlow15", "add-flows", &bridge.name, flows_s],
        )
        .expect("OVS loads the flow file");
        let ports = bridge.port_map().expect("dpif/show");
        (bridge, ports)
    };

    let mut outcomes = Vec::new();
    for p in &packets {
        let mut ovs_args = vec!["ofproto/trace", bridge.name.as_str(), p.spec.as_str()];
        let mut ox_args = vec!["trace", "--flows", flows_s];
        if let Some(g) = &groups {
            ox_args.extend(["--groups", g.as_str()]);
        }
        for s in &p.ct_next {
            ovs_args.extend(["--ct-next", s.as_str()]);
            ox_args.extend(["--ct-next", s.as_str()]);
        }
        ox_args.push(p.spec.as_str());
        let ovs = match run_ok("ovs-appctl", &ovs_args) {
            Ok(t) => normalise(&t, &ports),
            Err(e) => format!("<error: {e}>"),
        };
        let oxvs = match run_ok(env!("CARGO_BIN_EXE_oxvsctl"), &ox_args) {
            Ok(t) => normalise(&t, &HashMap::new()),
            Err(e) => format!("<error: {e}>"),
        };
        outcomes.push(Outcome {
            line: p.line,
            spec: p.spec.clone(),
            expected: p.expected.clone(),
            ovs,
            oxvs,
        });
    }
    drop(bridge);

    let mut failures = Vec::new();
    for o in &outcomes {
        let mut why = Vec::new();
        if o.ovs != o.expected {
            why.push(format!(
                "OVS gives '{}', the case expects '{}'",
                o.ovs, o.expected
            ));
        }
        if !same_actions(&o.ovs, &o.oxvs) {
            why.push(format!("oxvs gives '{}', OVS gives '{}'", o.oxvs, o.ovs));
        }
        let verdict = if why.is_empty() { "PASS" } else { "FAIL" };
        eprintln!("{verdict} {case}.packets:{} {}", o.line, o.spec);
        if !why.is_empty() {
            failures.push(format!(
                "{case}.packets:{} {}\n    {}",
                o.line,
                o.spec,
                why.join("\n    ")
            ));
        }
    }
    failures
}

fn check_case(case: &str) {
    let failures = run_case(case);
    assert!(
        failures.is_empty(),
        "{} of the traces of case '{case}' differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

macro_rules! cases {
    ($($fn_name:ident => $case:literal,)*) => {
        $(
            #[test]
            fn $fn_name() {
                check_case($case);
            }
        )*

        #[test]
        fn every_case_file_has_a_test() {
            let listed = [$($case),*];
            for name in case_names() {
                assert!(listed.contains(&name.as_str()), "case '{name}' has no test function");
            }
        }
    };
}

cases! {
    ovs_masks => "masks",
    ovs_priorities => "priorities",
    ovs_registers => "registers",
    ovs_gotos => "gotos",
    ovs_conjunctions => "conjunctions",
    ovs_conntrack => "conntrack",
    ovs_rewrite => "rewrite",
    ovs_vlan => "vlan",
    ovs_drops => "drops",
    ovs_antrea_like => "antrea-like",
    ovs_groups => "groups",
    ovs_learn => "learn",
    ovs_oxm => "oxm",
    ovs_nd => "nd",
    ovs_ttl => "ttl",
    ovs_tun6 => "tun6",
}

/// `oxvsctl dump-groups --groups FILE` prints what
/// `ovs-ofctl -O OpenFlow15 dump-groups` prints for the same file (OVS
/// dumps in hash order: the lines are compared sorted).
#[test]
fn dump_groups_matches_ovs() {
    if let Err(reason) = ovs_ready() {
        oxvs_testutil::skip_or_fail(format!("ovs_diff::dump_groups: {reason}"));
        return;
    }
    let file = cases_dir().join("dump.groups");
    let file_s = file.to_str().expect("utf-8 path");
    let ovs = {
        let bridge = Bridge::create(0).expect("create OVS bridge");
        run_ok(
            "ovs-ofctl",
            &["-O", "OpenFlow15", "add-groups", &bridge.name, file_s],
        )
        .expect("OVS loads the group file");
        run_ok(
            "ovs-ofctl",
            &["-O", "OpenFlow15", "dump-groups", &bridge.name],
        )
        .expect("OVS dumps the groups")
    };
    let oxvs = run_ok(
        env!("CARGO_BIN_EXE_oxvsctl"),
        &["dump-groups", "--groups", file_s],
    )
    .expect("oxvsctl dumps the groups");
    // OVS's first line is the reply header.
    let mut ovs: Vec<&str> = ovs.lines().skip(1).collect();
    let mut oxvs: Vec<&str> = oxvs.lines().collect();
    ovs.sort_unstable();
    oxvs.sort_unstable();
    assert!(ovs.len() >= 10, "{ovs:?}");
    assert_eq!(oxvs, ovs);
}
