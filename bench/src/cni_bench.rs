//! # The pure parts of the CNI latency benchmark (`cni-bench`)
//!
//! The binary (`src/bin/cni-bench.rs`) spawns CNI plugins and times them;
//! this module holds what can be tested without root: latency summaries
//! (nearest-rank percentiles), the human table, the machine description and
//! the parser of the agent's per-request log lines.
//!
//! No state, no I/O apart from reading `/proc` in [`Machine::probe`].

use std::time::Duration;

use serde_json::{json, Value};

/// Percentiles and extremes of a set of latencies, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

/// Nearest-rank percentile `p` (0 < p <= 100) of sorted `v`; 0 if empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// Summary of latencies given in milliseconds (any order).
    pub fn of_ms(samples: &[f64]) -> Summary {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Summary {
            n,
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
            mean: if n == 0 {
                0.0
            } else {
                v.iter().sum::<f64>() / n as f64
            },
        }
    }

    /// Summary of durations.
    pub fn of(samples: &[Duration]) -> Summary {
        let ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        Summary::of_ms(&ms)
    }

    /// The summary as JSON fields (`n`, `p50_ms`, ...), rounded to µs.
    pub fn json(&self) -> Value {
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "n": self.n,
            "p50_ms": r(self.p50),
            "p90_ms": r(self.p90),
            "p99_ms": r(self.p99),
            "min_ms": r(self.min),
            "max_ms": r(self.max),
            "mean_ms": r(self.mean),
        })
    }
}

/// A fixed-width text table: `header` then `rows`, columns right-aligned
/// except the first `left` ones.
pub fn table(header: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let cols = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate().take(cols) {
            if i > 0 {
                s.push_str("  ");
            }
            if i < left {
                s.push_str(&format!("{c:<width$}", width = w[i]));
            } else {
                s.push_str(&format!("{c:>width$}", width = w[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    out.push('\n');
    out.push_str(&"-".repeat(w.iter().sum::<usize>() + 2 * cols.saturating_sub(1)));
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// The five latency columns of a summary, in ms with 2 decimals.
pub fn summary_cells(s: &Summary) -> Vec<String> {
    [s.p50, s.p90, s.p99, s.max]
        .iter()
        .map(|x| format!("{x:.2}"))
        .collect()
}

/// What the numbers were measured on.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cores: usize,
    pub kernel: String,
    /// `/proc/loadavg` (first three fields).
    pub loadavg: String,
}

impl Machine {
    /// Reads the description from `/proc` (fields it cannot read: "unknown").
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cpu_model: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            loadavg: loadavg(),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "cpu_model": self.cpu_model,
            "cores": self.cores,
            "kernel": self.kernel,
            "loadavg_at_start": self.loadavg,
        })
    }
}

/// The first three fields of `/proc/loadavg`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The `model name` of the first CPU in `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// One "CNI request served" line of the agent's debug log.
#[derive(Clone, Debug, PartialEq)]
pub struct Served {
    pub verb: String,
    pub container: String,
    pub ms: f64,
}

/// The value of `key=` in a tracing `fmt` line (quoted or bare).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let at = line.find(&pat)? + pat.len();
    let rest = &line[at..];
    if let Some(q) = rest.strip_prefix('"') {
        q.split('"').next()
    } else {
        rest.split_whitespace().next()
    }
}

/// Every successful request the agent logged (`CNI request served verb=..
/// container=.. ms=..`), in log order; other lines are ignored.
pub fn parse_agent_log(log: &str) -> Vec<Served> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("CNI request served"))
        .filter_map(|l| {
            Some(Served {
                verb: field(&l, "verb")?.to_string(),
                container: field(&l, "container")?.to_string(),
                ms: field(&l, "ms")?.parse().ok()?,
            })
        })
        .collect()
}

/// One "pod attached" line of the agent's log: the ADD's steps.
#[derive(Clone, Debug, PartialEq)]
pub struct Attached {
    /// The host end of the pod's veth (the switch port's name).
    pub port: String,
    /// The veth over netlink (before 2026-12-05: the pod end's addresses
    /// and routes too).
    pub netlink_ms: f64,
    /// Switch add-port (AF_XDP socket, XDP attach, UMEM), the pod end's
    /// addresses and routes configured meanwhile.
    pub port_ms: f64,
    /// Record save and the flow sync (desired state -> bundle).
    pub flows_ms: f64,
    /// From the netlink step to the end of the attach (the gratuitous ARP
    /// is sent in the background since 2026-12-05).
    pub total_ms: f64,
}

/// Every "pod attached" line with step timings, in log order.
pub fn parse_attached(log: &str) -> Vec<Attached> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("pod attached"))
        .filter_map(|l| {
            Some(Attached {
                port: field(&l, "port")?.to_string(),
                netlink_ms: field(&l, "netlink_ms")?.parse().ok()?,
                port_ms: field(&l, "port_ms")?.parse().ok()?,
                flows_ms: field(&l, "flows_ms")?.parse().ok()?,
                total_ms: field(&l, "total_ms")?.parse().ok()?,
            })
        })
        .collect()
}

/// One "AF_XDP socket attempt" line of switchd's debug log
/// (`oxvs_switch::afxdp=debug`): the UMEM mapping and the socket creation
/// (XDP program load + attach, rings) of one port.
#[derive(Clone, Debug, PartialEq)]
pub struct SocketAttempt {
    pub ifname: String,
    pub mode: String,
    pub umem_ms: f64,
    pub socket_ms: f64,
    pub ok: bool,
}

/// Every AF_XDP socket attempt switchd logged, in log order.
pub fn parse_switch_log(log: &str) -> Vec<SocketAttempt> {
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("AF_XDP socket attempt"))
        .filter_map(|l| {
            Some(SocketAttempt {
                ifname: field(&l, "ifname")?.to_string(),
                mode: field(&l, "mode")?.to_string(),
                umem_ms: field(&l, "umem_ms")?.parse().ok()?,
                socket_ms: field(&l, "socket_ms")?.parse().ok()?,
                ok: field(&l, "ok")? == "true",
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of_ms(&v);
        assert_eq!(
            (s.n, s.p50, s.p90, s.p99, s.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(s.min, 1.0);
        let s = Summary::of_ms(&[3.0, 1.0, 2.0]);
        assert_eq!((s.p50, s.p90, s.p99), (2.0, 3.0, 3.0));
        assert_eq!(Summary::of_ms(&[]).n, 0);
        let s = Summary::of(&[Duration::from_millis(5)]);
        assert_eq!((s.p50, s.p99), (5.0, 5.0));
    }

    #[test]
    fn parses_agent_lines_with_and_without_colour() {
        let log = "2025-01-01T00:00:00.1Z DEBUG oxvs_agent::server: CNI request served verb=\"ADD\" container=cnib-1-oxvs-seq-0 ms=12.5\n\
                   \u{1b}[2m2025\u{1b}[0m \u{1b}[34mDEBUG\u{1b}[0m \u{1b}[2moxvs_agent::server\u{1b}[0m\u{1b}[2m:\u{1b}[0m CNI request served \u{1b}[3mverb\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"DEL\" \u{1b}[3mcontainer\u{1b}[0m\u{1b}[2m=\u{1b}[0mc2 \u{1b}[3mms\u{1b}[0m\u{1b}[2m=\u{1b}[0m3.25\n\
                   INFO pod attached\n";
        let v = parse_agent_log(log);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].verb, "ADD");
        assert_eq!(v[0].container, "cnib-1-oxvs-seq-0");
        assert_eq!(v[0].ms, 12.5);
        assert_eq!(
            (v[1].verb.as_str(), v[1].container.as_str(), v[1].ms),
            ("DEL", "c2", 3.25)
        );
    }

    #[test]
    fn parses_attached_steps() {
        let log = "2026-11-29T15:00:00Z  INFO oxvs_agent::server: pod attached pod=bench/pod-1 ip=10.240.0.5 port=b-0123456789 ofport=3 netlink_ms=4.5 port_ms=10.25 flows_ms=3 total_ms=18.5\n\
                   INFO oxvs_agent::server: pod attached pod=x ip=1.2.3.4 port=y\n";
        let v = parse_attached(log);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].port, "b-0123456789");
        assert_eq!(
            (v[0].netlink_ms, v[0].port_ms, v[0].flows_ms, v[0].total_ms),
            (4.5, 10.25, 3.0, 18.5)
        );
    }

    #[test]
    fn parses_switch_socket_attempts() {
        let log = "2026-11-29T14:27:05Z DEBUG oxvs_switch::afxdp: AF_XDP socket attempt ifname=\"a-1234\" mode=\"native/copy\" umem_ms=0.25 socket_ms=9.5 ok=true\n\
                   2026-11-29T14:27:05Z  INFO oxvs_switch: port added\n\
                   DEBUG oxvs_switch::afxdp: AF_XDP socket attempt ifname=b mode=generic/copy umem_ms=1 socket_ms=2 ok=false\n";
        let v = parse_switch_log(log);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(
            v[0],
            SocketAttempt {
                ifname: "a-1234".into(),
                mode: "native/copy".into(),
                umem_ms: 0.25,
                socket_ms: 9.5,
                ok: true
            }
        );
        assert!(!v[1].ok);
    }

    #[test]
    fn table_aligns() {
        let t = table(
            &["plugin", "p50"],
            &[
                vec!["oxvs".into(), "1.00".into()],
                vec!["bridge".into(), "12.50".into()],
            ],
            1,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "plugin    p50");
        assert_eq!(lines[2], "oxvs     1.00");
        assert_eq!(lines[3], "bridge  12.50");
    }

    #[test]
    fn cpu_model_from_cpuinfo() {
        let s = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t: x\n";
        assert_eq!(cpu_model(s).as_deref(), Some("Intel(R) Xeon(R)"));
        assert_eq!(cpu_model("nothing"), None);
    }
}
