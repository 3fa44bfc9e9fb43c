//! Methods: one trial ([`run_trial`]), fixed-rate runs ([`fixed`]), the
//! RFC 2544-style throughput search ([`throughput`]).
//!
//! A trial opens the sink's AF_XDP socket (in its thread, inside its
//! namespace), then the generator's, sends for the duration, lets the
//! sink drain, and reports: sent (frames on the generator's TX ring),
//! received, lost = sent - received, reordered, duplicates, latency, and
//! the switch processes' CPU time over the trial (the sum of the run time
//! of all their threads, `/proc/PID/task/*/schedstat`, ns; `utime+stime`
//! of `/proc/PID/stat` when schedstat is missing), or, for datapaths in
//! softirq context ([`SOFTIRQ`] in the list), the softirq time of all CPUs.
//!
//! A fixed-rate trial also says where its losses were: the switch's
//! drop counters that moved during it (oxvs: `oxvsctl dump-ports`, by
//! port and reason), the sink socket's ring drops, and how busy the
//! whole machine was ([`MachineCpu`]: on a shared VM the generator, the
//! switch and the sink compete for the same CPUs, and a switch that gets
//! none drops at its RX ring whatever its own speed).
//!
//! Sockets are opened per trial, so every trial starts with empty rings
//! and no state left over from the previous rate.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use oxvs_api::XdpModeRequest;
use oxvs_switch::afxdp::XskPort;

use super::gen::{self, GenConfig, GenReport};
use super::hist::Histogram;
use super::setup::{stop_flag, Endpoint};
use super::sink::{self, Accounting, SinkStats};

/// UMEM frames per generator/sink socket.
pub const UMEM_FRAMES: u32 = 16384;

/// One trial's outcome.
#[derive(Clone, Debug)]
pub struct Trial {
    pub rate_pps: u64,
    pub gen: GenReport,
    pub received: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub foreign: u64,
    pub latency: Histogram,
    pub sink: SinkStats,
    /// Switch CPU time over the trial (None: no process, e.g. a bridge).
    pub cpu_ns: Option<u64>,
    /// Per-flow received counts, when asked for ([`TrialOpts::per_flow`]).
    pub per_flow_received: Option<Vec<u64>>,
    /// The switch's drop counters that moved over the trial (`port.reason`
    /// -> count; None: not read, e.g. not oxvs).
    pub switch_drops: Option<BTreeMap<String, u64>>,
    /// The whole machine's CPU over the trial.
    pub machine: Option<MachineCpu>,
}

/// All CPUs over an interval, from two reads of `/proc/stat`'s `cpu`
/// line: the fraction busy (not idle or waiting for I/O) and the
/// fraction the hypervisor took (steal).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MachineCpu {
    pub busy: f64,
    pub steal: f64,
}

/// The `cpu` line's ticks: (total, idle + iowait, steal).
fn cpu_ticks(stat: &str) -> Option<(u64, u64, u64)> {
    let f = cpu_fields(stat)?;
    // Guest time is in user already: the first 8 fields are the total.
    let total: u64 = f.iter().take(8).sum();
    Some((total, f.get(3)? + f.get(4)?, *f.get(7)?))
}

impl MachineCpu {
    /// Between two `/proc/stat` texts (None: unreadable, or no tick
    /// passed).
    pub fn between(before: &str, after: &str) -> Option<MachineCpu> {
        let (t0, i0, s0) = cpu_ticks(before)?;
        let (t1, i1, s1) = cpu_ticks(after)?;
        let total = t1.checked_sub(t0).filter(|t| *t > 0)? as f64;
        Some(MachineCpu {
            busy: 1.0 - i1.saturating_sub(i0) as f64 / total,
            steal: s1.saturating_sub(s0) as f64 / total,
        })
    }
}

impl Trial {
    pub fn lost(&self) -> u64 {
        self.gen.sent.saturating_sub(self.received)
    }

    pub fn loss_fraction(&self) -> f64 {
        if self.gen.sent == 0 {
            0.0
        } else {
            self.lost() as f64 / self.gen.sent as f64
        }
    }

    pub fn delivered_pps(&self) -> f64 {
        if self.gen.secs > 0.0 {
            self.received as f64 / self.gen.secs
        } else {
            0.0
        }
    }

    pub fn cpu_ns_per_pkt(&self) -> Option<f64> {
        self.cpu_ns.map(|c| c as f64 / self.received.max(1) as f64)
    }
}

/// Knobs of a trial besides the generator's configuration.
#[derive(Clone, Debug)]
pub struct TrialOpts {
    /// How long the sink keeps receiving after the generator stopped.
    pub drain: Duration,
    /// Keep per-flow received counts.
    pub per_flow: bool,
}

impl Default for TrialOpts {
    fn default() -> Self {
        TrialOpts {
            drain: Duration::from_millis(300),
            per_flow: false,
        }
    }
}

/// CPU time of all threads of `pid` in ns.
pub fn proc_cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0u64;
    let mut any = false;
    let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("process {pid} is gone"))?;
    for t in dir.flatten() {
        if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
            if let Some(n) = s
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
            {
                total += n;
                any = true;
            }
        }
    }
    if any {
        return Ok(total);
    }
    // utime + stime (fields 14 and 15), in clock ticks of 10 ms.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    Ok((f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) * 10_000_000)
}

/// In a trial's process list: not a process but the kernel's softirq
/// time summed over all CPUs ([`softirq_ns`]), for datapaths that run in
/// softirq context (the `xdp-redirect` kind).
pub const SOFTIRQ: u32 = 0;

/// Softirq time of all CPUs in ns: the `softirq` field of the `cpu` line
/// of `/proc/stat` (USER_HZ = 100 ticks per second, so 10 ms resolution;
/// with IRQ time accounting the kernel measures it exactly).
pub fn softirq_ns() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    softirq_ns_from(&stat)
}

/// [`softirq_ns`] of a `/proc/stat` text.
pub fn softirq_ns_from(stat: &str) -> Result<u64> {
    let f = cpu_fields(stat).ok_or_else(|| anyhow!("/proc/stat has no `cpu` line"))?;
    let ticks = f
        .get(6)
        .ok_or_else(|| anyhow!("/proc/stat `cpu` line has no softirq field: {f:?}"))?;
    Ok(ticks * 10_000_000)
}

/// The tick counts of `/proc/stat`'s `cpu` line (all CPUs): user nice
/// system idle iowait irq softirq steal guest guest_nice (an unreadable
/// one as 0).
fn cpu_fields(stat: &str) -> Option<Vec<u64>> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    Some(
        line.split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect(),
    )
}

fn cpu_of(pids: &[u32]) -> Result<Option<u64>> {
    if pids.is_empty() {
        return Ok(None);
    }
    let mut t = 0;
    for p in pids {
        t += if *p == SOFTIRQ {
            softirq_ns()?
        } else {
            proc_cpu_ns(*p)?
        };
    }
    Ok(Some(t))
}

fn enter(ep: &Endpoint) -> Result<()> {
    match &ep.netns {
        Some(ns) => super::enter_netns(ns),
        None => Ok(()),
    }
}

/// Interfaces (by namespace and name) where native XDP failed for good:
/// later trials go straight to `Auto` (generic) there.
static NO_NATIVE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Opens an AF_XDP socket on `ifname` queue `queue` (in the calling
/// thread's namespace `ns`, for the cache key), native XDP mode first.
///
/// The kernel releases the previous trial's socket and XDP program on the
/// same interface asynchronously (the release waits for the RTNL lock,
/// which namespace deletions elsewhere on the machine can hold for
/// seconds), so an open right after it can fail with EBUSY: that is
/// waited out, up to [`BUSY_WAIT`], without giving up native mode. Only
/// another error (the driver slot still taken, no native XDP) counts
/// against native: with `Auto` it would silently fall back to generic
/// mode, and on a veth whose peer redirects frames with XDP (the
/// `xdp-redirect` kind) generic mode receives nothing. So native is asked
/// for and retried for up to 3 s; only then `Auto` (remembered for the
/// interface, so an interface without native XDP pays the wait once).
fn open_xsk(ns: &str, ifname: &str, queue: u32, batch: usize) -> Result<XskPort> {
    let key = format!("{ns}/{ifname}");
    let no_native = NO_NATIVE.lock().map(|v| v.contains(&key)).unwrap_or(false);
    let start = std::time::Instant::now();
    let busy_end = start + BUSY_WAIT;
    let is_busy = |e: &oxvs_switch::afxdp::AfxdpError| format!("{e:#}").contains("busy");
    if !no_native {
        let mut end = start + Duration::from_secs(3);
        loop {
            match XskPort::open_queue(ifname, queue, XdpModeRequest::Native, UMEM_FRAMES, batch) {
                Ok(p) => return Ok(p),
                Err(e) => {
                    let now = std::time::Instant::now();
                    if is_busy(&e) && now < busy_end {
                        end = end.max(now + Duration::from_secs(3)).min(busy_end);
                    } else if now > end {
                        eprintln!(
                            "oxvs-bench: {ifname}: native XDP unavailable ({e}); using generic mode"
                        );
                        if let Ok(mut v) = NO_NATIVE.lock() {
                            v.push(key);
                        }
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
    let end = std::time::Instant::now().max(busy_end);
    loop {
        match XskPort::open_queue(ifname, queue, XdpModeRequest::Auto, UMEM_FRAMES, batch) {
            Ok(p) => return Ok(p),
            Err(e) => {
                if !is_busy(&e) || std::time::Instant::now() > end {
                    return Err(e.into());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// How long an open waits for a queue the kernel has not released yet.
const BUSY_WAIT: Duration = Duration::from_secs(20);

/// A socket on each of the endpoint's queues (in the calling thread's
/// namespace, which is the endpoint's).
fn open_all(ep: &Endpoint, batch: usize) -> Result<Vec<XskPort>> {
    (0..ep.queues.max(1))
        .map(|q| {
            open_xsk(ep.netns.as_deref().unwrap_or(""), &ep.ifname, q, batch)
                .with_context(|| format!("socket on {} queue {q}", ep.ifname))
        })
        .collect()
}

/// One trial: `cfg` from `gen_ep` to `sink_ep`, CPU of `pids` measured.
pub fn run_trial(
    gen_ep: &Endpoint,
    sink_ep: &Endpoint,
    cfg: &GenConfig,
    pids: &[u32],
    opts: &TrialOpts,
) -> Result<Trial> {
    // Validate before any thread starts.
    gen::FrameBuilder::new(cfg)?;
    let sig = stop_flag();
    let sink_stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let sink_thread = {
        let ep = sink_ep.clone();
        let stop = Arc::clone(&sink_stop);
        let flows = cfg.flows;
        let drain = opts.drain;
        let batch = sink::RX_BATCH;
        std::thread::Builder::new()
            .name("xbench-sink".into())
            .spawn(move || -> Result<(Accounting, SinkStats)> {
                let open = || -> Result<Vec<XskPort>> {
                    enter(&ep)?;
                    open_all(&ep, batch).context("sink")
                };
                let mut ports = match open() {
                    Ok(p) => {
                        let _ = ready_tx.send(Ok(()));
                        p
                    }
                    Err(e) => {
                        let msg = format!("{e:#}");
                        let _ = ready_tx.send(Err(e));
                        bail!("{msg}");
                    }
                };
                let mut acct = Accounting::new(flows);
                let st = sink::run(&mut ports, &mut acct, &stop, drain);
                Ok((acct, st))
            })
            .context("spawn sink thread")?
    };
    let join_sink = |stop: &AtomicBool| {
        stop.store(true, Ordering::Relaxed);
        sink_thread
            .join()
            .map_err(|_| anyhow!("sink thread panicked"))?
    };
    match ready_rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = join_sink(&sink_stop);
            return Err(e);
        }
        Err(_) => {
            let _ = join_sink(&sink_stop);
            bail!("sink socket did not open within 20 s");
        }
    }
    // Let the sink's XDP program settle before the first frame.
    std::thread::sleep(Duration::from_millis(100));
    let cpu0 = cpu_of(pids)?;
    let stat0 = std::fs::read_to_string("/proc/stat").ok();
    let gen_thread = {
        let ep = gen_ep.clone();
        let cfg = cfg.clone();
        let sig = Arc::clone(&sig);
        std::thread::Builder::new()
            .name("xbench-gen".into())
            .spawn(move || -> Result<GenReport> {
                enter(&ep)?;
                let mut ports = open_all(&ep, cfg.batch).context("generator")?;
                gen::run(&mut ports, &cfg, &sig)
            })
            .context("spawn generator thread")?
    };
    let g = gen_thread
        .join()
        .map_err(|_| anyhow!("generator thread panicked"));
    let (acct, st) = join_sink(&sink_stop)?;
    let g = g??;
    let cpu1 = cpu_of(pids)?;
    let stat1 = std::fs::read_to_string("/proc/stat").ok();
    if sig.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    let per_flow = opts.per_flow.then(|| {
        (0..acct.flows())
            .map(|i| acct.received_for_flow(i))
            .collect()
    });
    Ok(Trial {
        rate_pps: cfg.rate_pps,
        gen: g,
        received: acct.received,
        reordered: acct.reordered,
        duplicates: acct.duplicates,
        foreign: acct.foreign,
        latency: acct.latency,
        sink: st,
        cpu_ns: cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        per_flow_received: per_flow,
        switch_drops: None,
        machine: stat0
            .zip(stat1)
            .and_then(|(a, b)| MachineCpu::between(&a, &b)),
    })
}

/// A short check before measuring: 500 frames at 20 kpps must mostly
/// (>= 90%) arrive, else the setup or the pipeline does not deliver the
/// generator's frames, and measuring would only report 100% loss.
pub fn probe(gen_ep: &Endpoint, sink_ep: &Endpoint, cfg: &GenConfig, pids: &[u32]) -> Result<()> {
    let c = GenConfig {
        rate_pps: 20_000,
        count: Some(500),
        duration: Duration::from_secs(2),
        ..cfg.clone()
    };
    let t = run_trial(gen_ep, sink_ep, &c, pids, &TrialOpts::default())?;
    if t.gen.sent == 0 || t.received * 10 < t.gen.sent * 9 {
        bail!(
            "probe: {} of {} frames arrived at the sink ({} foreign): the switch does not \
             deliver the generator's frames",
            t.received,
            t.gen.sent,
            t.foreign
        );
    }
    Ok(())
}

/// Where a trial's losses were, for its log line: the switch's drop
/// counters that moved, the sink's ring drops, the machine's CPU.
pub fn loss_sites(t: &Trial) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(d) = &t.switch_drops {
        if d.is_empty() {
            parts.push("switch dropped none".into());
        } else {
            parts.extend(d.iter().map(|(k, n)| format!("switch {k} {n}")));
        }
    }
    parts.push(format!("sink ring {}", t.sink.ring_drops));
    if let Some(m) = t.machine {
        parts.push(format!(
            "machine {:.0}% busy, {:.0}% steal",
            m.busy * 100.0,
            m.steal * 100.0
        ));
    }
    parts.join(", ")
}

/// `trials` fixed-rate trials. `drops` reads the switch's cumulative
/// drop counters (None: it has none to read); read around each trial,
/// they give [`Trial::switch_drops`].
pub fn fixed(
    gen_ep: &Endpoint,
    sink_ep: &Endpoint,
    cfg: &GenConfig,
    pids: &[u32],
    trials: usize,
    drops: &dyn Fn() -> Option<BTreeMap<String, u64>>,
) -> Result<Vec<Trial>> {
    let mut out = Vec::new();
    for i in 0..trials {
        let before = drops();
        let mut t = run_trial(gen_ep, sink_ep, cfg, pids, &TrialOpts::default())?;
        t.switch_drops = before
            .zip(drops())
            .map(|(b, a)| super::setup::drop_delta(&b, &a));
        eprintln!(
            "oxvs-bench:   fixed #{i}: sent {:.0} pps, delivered {:.0} pps, loss {:.3}% ({}), p99 {} us, cpu {} ns/pkt",
            t.gen.pps(),
            t.delivered_pps(),
            t.loss_fraction() * 100.0,
            loss_sites(&t),
            t.latency.quantile(0.99).map_or("-".into(), |v| format!("{:.1}", v as f64 / 1e3)),
            t.cpu_ns_per_pkt().map_or("-".into(), |c| format!("{c:.0}"))
        );
        out.push(t);
    }
    Ok(out)
}

/// The outcome of one throughput search.
#[derive(Clone, Debug)]
pub struct Search {
    /// The highest rate (pps) with loss <= the target; 0 if none.
    pub rate_pps: f64,
    /// True when even the generator's maximum met the target (the
    /// figure is the generator's limit, not the switch's).
    pub generator_bound: bool,
    /// The trial at that rate.
    pub best: Option<Trial>,
    /// (offered rate, achieved rate, loss fraction) of every step.
    pub steps: Vec<(u64, f64, f64)>,
}

/// RFC 2544-style binary search: first a trial as fast as the generator
/// goes (its achieved rate bounds the search), then halving the interval
/// between the best passing and the lowest failing rate, `steps` times
/// or until it is within 2%. A trial passes when its loss is at most
/// `max_loss` (a fraction) and the generator achieved at least 90% of the
/// asked rate.
pub fn throughput(
    gen_ep: &Endpoint,
    sink_ep: &Endpoint,
    cfg: &GenConfig,
    pids: &[u32],
    max_loss: f64,
    steps: usize,
) -> Result<Search> {
    let mut s = Search {
        rate_pps: 0.0,
        generator_bound: false,
        best: None,
        steps: Vec::new(),
    };
    let opts = TrialOpts::default();
    let mut c = cfg.clone();
    c.rate_pps = 0;
    let t = run_trial(gen_ep, sink_ep, &c, pids, &opts)?;
    let top = t.gen.pps();
    s.steps.push((0, top, t.loss_fraction()));
    eprintln!(
        "oxvs-bench:   search max: sent {top:.0} pps, loss {:.3}%",
        t.loss_fraction() * 100.0
    );
    if t.loss_fraction() <= max_loss {
        s.rate_pps = top;
        s.generator_bound = true;
        s.best = Some(t);
        return Ok(s);
    }
    let (mut lo, mut hi) = (0.0f64, top);
    for _ in 0..steps {
        if hi - lo <= hi * 0.02 {
            break;
        }
        let mid = if lo == 0.0 { hi / 2.0 } else { (lo + hi) / 2.0 };
        c.rate_pps = mid.max(1.0) as u64;
        let t = run_trial(gen_ep, sink_ep, &c, pids, &opts)?;
        let pass = t.loss_fraction() <= max_loss && t.gen.pps() >= 0.90 * mid;
        eprintln!(
            "oxvs-bench:   search {:.0} pps: sent {:.0} pps, loss {:.3}% -> {}",
            mid,
            t.gen.pps(),
            t.loss_fraction() * 100.0,
            if pass { "pass" } else { "fail" }
        );
        s.steps.push((c.rate_pps, t.gen.pps(), t.loss_fraction()));
        if pass {
            lo = mid;
            s.rate_pps = t.gen.pps();
            s.best = Some(t);
        } else {
            hi = mid;
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softirq_field_of_proc_stat() {
        let stat = "cpu  10 0 20 300 4 5 67 0 0 0\ncpu0 5 0 10 150 2 2 30 0 0 0\n";
        assert_eq!(softirq_ns_from(stat).expect("parses"), 670_000_000);
        assert!(softirq_ns_from("cpu0 1 2 3\n").is_err());
        assert!(softirq_ns_from("cpu  1 2 3\n").is_err());
    }

    #[test]
    fn machine_cpu_between_two_reads() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let a = "cpu  100 0 50 800 50 0 0 0 0 0\n";
        let b = "cpu  160 0 90 860 60 0 10 20 5 0\n";
        // 200 ticks: idle + iowait 70, steal 20.
        let m = MachineCpu::between(a, b).expect("ticks passed");
        assert!((m.busy - 0.65).abs() < 1e-9, "{m:?}");
        assert!((m.steal - 0.10).abs() < 1e-9, "{m:?}");
        assert_eq!(MachineCpu::between(a, a), None, "no tick passed");
        assert_eq!(MachineCpu::between("cpu0 1 2\n", b), None);
    }

    #[test]
    fn drop_delta_keeps_what_grew() {
        let before: BTreeMap<String, u64> = [
            ("g.rx_ring_full".to_owned(), 5),
            ("s.tx_ring_full".to_owned(), 2),
        ]
        .into();
        let after: BTreeMap<String, u64> = [
            ("g.rx_ring_full".to_owned(), 9),
            ("s.tx_ring_full".to_owned(), 2),
            ("n.rx_fill_empty".to_owned(), 3),
        ]
        .into();
        let d = super::super::setup::drop_delta(&before, &after);
        assert_eq!(
            d,
            [
                ("g.rx_ring_full".to_owned(), 4),
                ("n.rx_fill_empty".to_owned(), 3)
            ]
            .into()
        );
    }
}
