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
    /// --ip-family dual`, has both).
    #[arg(long, value_enum, default_value_t = Family::Ipv4)]
    pub ip_family: Family,
}

/// The address family `probe` sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    Ipv4,
    Ipv6,
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
    let mut pods: Vec<_> = st
        .pods
        .iter()
        .filter_map(|p| {
            let ip = match args.ip_family {
                Family::Ipv4 => p.ip.as_deref(),
                Family::Ipv6 => p.ip6.as_deref(),
            };
            let ip: IpAddr = ip?.parse().ok()?;
            Some((p.key(), p.netns_path(), ip))
        })
        .collect();
    if pods.is_empty() && args.ip_family == Family::Ipv6 && !st.pods.is_empty() {
        anyhow::bail!(
            "no pod of lab {} has an IPv6 address (create the lab with `up --ip-family dual`)",
            ctx.name()
        );
    }
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
