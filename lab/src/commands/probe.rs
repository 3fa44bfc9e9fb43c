//! `oxvs-lab probe`: the reachability matrix between every pair of pods
//! (including each pod to itself), by real connections from inside each
//! source pod's namespace ([`crate::probe`]), printed as a truth table
//! ([`crate::table`]) or, with `--json`, as a list of
//! `{from, to, protocol, port, reachable, detail}` (`reachable` is null when
//! the probe could not decide, e.g. SCTP on a kernel without it).
//!
//! `--expect FILE` compares with an expected table in the printed format
//! and exits 1, listing the differing pairs, when they differ.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;

use super::{Ctx, Global};
use crate::probe::{run_matrix, sctp_supported, Job, Outcome, Protocol};
use crate::state::IpFamily;
use crate::table::{Mark, TruthTable};

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    #[arg(long, value_enum, default_value_t = Protocol::Tcp)]
    pub protocol: Protocol,
    #[arg(long, default_value_t = 80)]
    pub port: u16,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Per-probe timeout.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Probes in flight at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub parallel: usize,
    /// Expected truth table (the printed format); exit 1 on a difference.
    #[arg(long, value_name = "FILE")]
    pub expect: Option<PathBuf>,
    /// Probe the pods' IPv4 or IPv6 addresses (a dual-stack lab, `up
    /// --ip-family dual`, has both). Default: ipv6 in an IPv6-only lab
    /// (`up --ip-family ipv6`), else ipv4.
    #[arg(long, value_enum)]
    pub ip_family: Option<Family>,
}

/// The address family `probe` sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    Ipv4,
    Ipv6,
}

/// The family to probe in a lab of `lab` family when asked for `asked`
/// (`--ip-family`, `None` when not given): the lab's own in an IPv6-only
/// lab, IPv4 otherwise; a family the lab's pods have no address of is an
/// error.
pub fn probe_family(lab: &str, family: IpFamily, asked: Option<Family>) -> anyhow::Result<Family> {
    match (family, asked) {
        (IpFamily::Ipv6, Some(Family::Ipv4)) => anyhow::bail!(
            "--ip-family ipv4: lab {lab} is IPv6-only (`up --ip-family ipv6`), its pods have no \
             IPv4 address; probe over ipv6 (the default in this lab)"
        ),
        (IpFamily::Ipv4, Some(Family::Ipv6)) => anyhow::bail!(
            "--ip-family ipv6: lab {lab} is IPv4-only, its pods have no IPv6 address (create the \
             lab with `up --ip-family dual` or `--ip-family ipv6`)"
        ),
        (IpFamily::Ipv6, None) => Ok(Family::Ipv6),
        (_, asked) => Ok(asked.unwrap_or(Family::Ipv4)),
    }
}

pub fn run_probe(global: &Global, args: &ProbeArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let expected = match &args.expect {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Some(TruthTable::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    let st = {
        let _lock = ctx.paths.lock(false)?;
        ctx.paths.load()?
    };
    let family = probe_family(ctx.name(), st.ip_family, args.ip_family)?;
    let mut pods: Vec<_> = st
        .pods
        .iter()
        .filter_map(|p| {
            let ip = match family {
                Family::Ipv4 => p.ip.as_deref(),
                Family::Ipv6 => p.ip6.as_deref(),
            };
            let ip: IpAddr = ip?.parse().ok()?;
            Some((p.key(), p.netns_path(), ip))
        })
        .collect();
    // A pod still without an address of the family (CNI ADD failed half
    // way) is left out, as before.
    pods.sort();
    let names: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    let jobs: Vec<Job> = pods
        .iter()
        .flat_map(|(from, path, _)| {
            pods.iter().map(move |(to, _, ip)| Job {
                from: from.clone(),
                to: to.clone(),
                netns_path: path.clone(),
                dst: *ip,
            })
        })
        .collect();
    let started = Instant::now();
    let outcomes = run_matrix(
        &jobs,
        args.protocol,
        args.port,
        Duration::from_millis(args.timeout_ms.max(1)),
        args.parallel,
    );
    let elapsed = started.elapsed();
    let mut table = TruthTable::new(names.clone(), names);
    for (j, o) in jobs.iter().zip(&outcomes) {
        let mark = match o.reachable() {
            Some(true) => Mark::Reachable,
            Some(false) => Mark::Blocked,
            None => Mark::Unknown,
        };
        table.set(&j.from, &j.to, mark);
    }
    if args.json {
        let v: Vec<_> = jobs
            .iter()
            .zip(&outcomes)
            .map(|(j, o)| {
                json!({
                    "from": j.from, "to": j.to,
                    "protocol": args.protocol.api_name(), "port": args.port,
                    "reachable": o.reachable(), "detail": o.detail(),
                })
            })
            .collect();
        crate::say!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        crate::say!(
            "{}/{}: {} pods, {} reachable, {} blocked, {} unknown ({:.1} s)",
            args.protocol.api_name(),
            args.port,
            table.froms.len(),
            table.count(Mark::Reachable),
            table.count(Mark::Blocked),
            table.count(Mark::Unknown),
            elapsed.as_secs_f64()
        );
        if args.protocol == Protocol::Sctp {
            if let Err(why) = sctp_supported() {
                crate::say!("SCTP unsupported: {why} (cells marked ?)");
            }
        }
        for (j, o) in jobs.iter().zip(&outcomes) {
            if let Outcome::Error(e) = o {
                crate::say!("probe {} -> {} failed: {e}", j.from, j.to);
            }
        }
        crate::say_raw!("{}", table.render());
    }
    if let Some(want) = expected {
        let diff = table.diff(&want);
        if !diff.is_empty() || want.froms != table.froms || want.tos != table.tos {
            eprintln!(
                "the matrix differs from {}:",
                args.expect
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
            if want.froms != table.froms || want.tos != table.tos {
                eprintln!("  pods: expected {:?}, have {:?}", want.froms, table.froms);
            }
            for (f, t, got, exp) in diff {
                eprintln!(
                    "  {f} -> {t}: got {} expected {}",
                    got.symbol(),
                    exp.symbol()
                );
            }
            return Ok(1);
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probed_family_follows_the_lab() {
        let f = |lab, asked| probe_family("l", lab, asked);
        assert_eq!(f(IpFamily::Ipv4, None).expect("v4"), Family::Ipv4);
        assert_eq!(f(IpFamily::Dual, None).expect("dual"), Family::Ipv4);
        assert_eq!(f(IpFamily::Ipv6, None).expect("v6"), Family::Ipv6);
        assert_eq!(
            f(IpFamily::Dual, Some(Family::Ipv6)).expect("dual v6"),
            Family::Ipv6
        );
        assert_eq!(
            f(IpFamily::Ipv6, Some(Family::Ipv6)).expect("v6 v6"),
            Family::Ipv6
        );
        let e = f(IpFamily::Ipv6, Some(Family::Ipv4))
            .expect_err("no IPv4 in an IPv6-only lab")
            .to_string();
        assert!(
            e.contains("IPv6-only") && e.contains("no IPv4 address"),
            "{e}"
        );
        let e = f(IpFamily::Ipv4, Some(Family::Ipv6))
            .expect_err("no IPv6 in an IPv4 lab")
            .to_string();
        assert!(e.contains("IPv4-only"), "{e}");
    }
}
