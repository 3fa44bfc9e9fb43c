//! Shared by the kube-proxy tests: waiting until every node's kube-proxy
//! has programmed the Services, and what to show of the nodes at a
//! failure.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::Command;
use std::time::{Duration, Instant};

use oxvs_lab::commands::kube::programmed_family;
use oxvs_lab::service::Family;

use super::Lab;

/// Waits (20 s at most) until the kube-proxies of nodes 1..=`nodes`
/// programmed `want`: per proxier family, Service port, number of
/// endpoints (`Some(0)`: rejected, no endpoints; `None`: no rule at all).
pub fn wait_rules(lab: &Lab, nodes: u32, want: &[(Family, &str, Option<usize>)], what: &str) {
    let t = Instant::now();
    let deadline = t + Duration::from_secs(20);
    loop {
        let mut missing = Vec::new();
        for i in 1..=nodes {
            let ns = format!("{}-node-{i}", lab.name);
            let got4 = programmed_family(&ns, Family::Ipv4);
            let got6 = programmed_family(&ns, Family::Ipv6);
            for (family, svc, n) in want {
                let got = if *family == Family::Ipv4 {
                    &got4
                } else {
                    &got6
                };
                if got.get(*svc).copied() != *n {
                    missing.push(format!(
                        "{ns}: {svc} ({}) has {:?}, want {n:?}",
                        family.api_name(),
                        got.get(*svc)
                    ));
                }
            }
        }
        if missing.is_empty() {
            eprintln!(
                "{what}: kube-proxy rules in place after {} ms",
                t.elapsed().as_millis()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: kube-proxy did not program the Services within 20 s:\n{}",
            missing.join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `argv` in node `i`'s namespace: its stdout (empty when it fails).
pub fn in_node(lab: &Lab, i: u32, argv: &[&str]) -> String {
    let ns = format!("{}-node-{i}", lab.name);
    Command::new("ip")
        .args(["netns", "exec", &ns])
        .args(argv)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The IPv6 side of both nodes of a 2-node lab, for [`super::paths::Report`]:
/// `conntrack -L -f ipv6`, `ip6tables-save -t nat`, `ip -6 route`.
pub fn evidence6(lab: &Lab) -> String {
    let mut s = String::new();
    for i in 1..=2 {
        for argv in [
            &["conntrack", "-L", "-f", "ipv6"][..],
            &["ip6tables-save", "-t", "nat"],
            &["ip", "-6", "route"],
        ] {
            s += &format!(
                "--- node-{i}: {} ---\n{}",
                argv.join(" "),
                in_node(lab, i, argv)
            );
        }
    }
    s
}
