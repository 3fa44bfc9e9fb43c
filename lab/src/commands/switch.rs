//! `oxvs-lab switch restart NODE [--grace S] [--timeout S]`: stops a node's
//! oxvs-switchd and starts it again with exactly the command line it had,
//! as replacing the oxvs DaemonSet pod does; the agent and the pods are left
//! alone, and the agent re-adds the pod ports (it notices at its next
//! resync, every `--resync-interval` seconds, default 5).
//!
//! The command line is read from `/proc/PID/cmdline` (rebuilt as `up` builds
//! it when switchd is already dead). switchd is stopped with SIGTERM (it
//! then saves its connection table to `switchd.conntrack.state` next to its
//! socket, which the new one restores), SIGKILL after `--grace` seconds.
//! The new process appends to the same `switchd.log` and its pid replaces
//! the old one in the state. The command returns once the new switchd has
//! every port the old one had (the agent re-added them) and pods forward
//! again.
//!
//! **Reattach time**, measured for real: before the restart the command
//! picks a pod on the node and a TCP port of another pod (on the same node
//! if there is one) and checks that a connection gets through; from the
//! SIGTERM on it keeps opening connections from the first pod to the
//! second (100 ms timeout each: the measurement's resolution). The
//! reattach time is from the SIGTERM to the end of the first successful
//! connection opened after the new switchd started: how long the node's
//! pods had no forwarding. Holds the lab's exclusive lock throughout.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use super::runtime::wait_for_socket;
use super::{Ctx, Global, GATEWAY};
use crate::probe::{self, Job, Outcome, Protocol};
use crate::procs;
use crate::state::{LabState, NodeState};

/// What switchd's command line contains (for [`procs::alive`]).
const SWITCHD_NEEDLE: &str = "oxvs-switchd";
/// Timeout of one reattach probe (a handshake between two lab pods takes
/// well under a millisecond; a dropped SYN costs the whole timeout, so this
/// is the measurement's resolution).
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);

#[derive(Debug, clap::Args)]
pub struct SwitchArgs {
    #[command(subcommand)]
    pub command: SwitchCmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum SwitchCmd {
    /// Stop a node's oxvs-switchd and start it again with the same command
    /// line; waits until the agent re-added every port and prints the
    /// reattach time.
    Restart(SwitchRestartArgs),
}

#[derive(Debug, clap::Args)]
pub struct SwitchRestartArgs {
    /// The node (`node-N`).
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, value_name = "S", default_value_t = 5)]
    pub grace: u64,
    /// Seconds to wait for the ports to be back and pods to forward again.
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub timeout: u64,
}

pub fn run_switch(global: &Global, args: &SwitchArgs) -> anyhow::Result<u8> {
    match &args.command {
        SwitchCmd::Restart(a) => run_restart(global, a),
    }
}

/// One request on switchd's control socket (`{"v":1,"op":OP}`); the result.
pub fn switch_call(sock: &Path, op: &str) -> anyhow::Result<Value> {
    let mut s = UnixStream::connect(sock)
        .with_context(|| format!("cannot connect to {}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    writeln!(s, r#"{{"v":1,"op":"{op}"}}"#)?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line)
        .with_context(|| format!("bad answer from {}: {line:?}", sock.display()))?;
    if v.get("ok") != Some(&Value::Bool(true)) {
        anyhow::bail!("{op} refused: {}", v.get("error").unwrap_or(&Value::Null));
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}

/// The names of the switch's ports.
fn port_names(sock: &Path) -> anyhow::Result<Vec<String>> {
    let r = switch_call(sock, "dump-ports")?;
    Ok(r.get("ports")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// A probe from a pod on the node to a TCP port of another pod.
struct ProbePair {
    job: Job,
    port: u16,
}

fn pick_probe(st: &LabState, node: &NodeState) -> Option<ProbePair> {
    let tcp_port = |p: &crate::state::PodState| {
        p.ports
            .iter()
            .find(|x| x.protocol.eq_ignore_ascii_case("tcp"))
            .map(|x| x.port)
    };
    // Its IPv4 address, or its IPv6 one in an IPv6-only lab.
    let ip = |p: &crate::state::PodState| p.ips().first()?.parse::<IpAddr>().ok();
    let src = st
        .pods
        .iter()
        .find(|p| p.node == node.name && ip(p).is_some())?;
    let mut dsts: Vec<_> = st
        .pods
        .iter()
        .filter(|p| p.key() != src.key() && ip(p).is_some() && tcp_port(p).is_some())
        .collect();
    // Same node first: that traffic depends on this switch alone.
    dsts.sort_by_key(|p| p.node != node.name);
    let dst = dsts.first()?;
    Some(ProbePair {
        job: Job {
            from: src.key(),
            to: dst.key(),
            netns_path: src.netns_path(),
            dst: ip(dst)?,
        },
        port: tcp_port(dst)?,
    })
}

/// One probe attempt: (started, ended, reachable).
type Attempt = (Instant, Instant, bool);

fn probe_once(p: &ProbePair) -> bool {
    probe::run_matrix(
        std::slice::from_ref(&p.job),
        Protocol::Tcp,
        p.port,
        PROBE_TIMEOUT,
        1,
    )
    .first()
        == Some(&Outcome::Reachable)
}

/// The last line of `log` (from byte `from` on) that contains `needle`.
fn log_line(log: &Path, from: u64, needle: &str) -> Option<String> {
    let text = std::fs::read(log).ok()?;
    let tail = text.get(from as usize..)?;
    String::from_utf8_lossy(tail)
        .lines()
        .rev()
        .find(|l| l.contains(needle))
        .map(str::to_string)
}

fn run_restart(global: &Global, args: &SwitchRestartArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let _lock = ctx.paths.lock(true)?;
    let mut st = ctx.paths.load()?;
    let bins = ctx.bins(&st)?;
    let k = st.node_index(&args.node)?;
    let node = st.nodes[k].clone();
    let dir = ctx.paths.node_dir(node.index);
    let sock = dir.join("switchd.sock");
    let log = dir.join("switchd.log");
    let timeout = Duration::from_secs(args.timeout.max(1));

    let old = node
        .switchd_pid
        .filter(|p| procs::alive(*p, SWITCHD_NEEDLE));
    let argv = match old.and_then(procs::cmdline) {
        Some(v) => v,
        None => [
            bins.switchd.display().to_string(),
            "--socket".into(),
            sock.display().to_string(),
            "--gateway".into(),
            GATEWAY.into(),
            "--log-level".into(),
            "info".into(),
        ]
        .to_vec(),
    };
    // What must be back: every port the old switch had.
    let want_ports = if old.is_some() {
        port_names(&sock).unwrap_or_default()
    } else {
        Vec::new()
    };
    let pair = pick_probe(&st, &node);
    let measure = match &pair {
        None => {
            crate::say!("{}: no pod pair to probe (a pod on the node and another pod with a TCP port); reattach time not measured", node.name);
            None
        }
        Some(p) if !probe_once(p) => {
            crate::say!(
                "{}: {} -> {}:{} does not get through before the restart; reattach time not measured",
                node.name,
                p.job.from,
                p.job.to,
                p.port
            );
            None
        }
        Some(p) => Some(p),
    };

    // The prober: from the SIGTERM on, one connection after another.
    let stop = Arc::new(AtomicBool::new(false));
    let attempts: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let stopped_at = Instant::now();
    let prober = measure.map(|p| {
        let pair = ProbePair {
            job: p.job.clone(),
            port: p.port,
        };
        let (stop, attempts) = (Arc::clone(&stop), Arc::clone(&attempts));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let ok = probe_once(&pair);
                if let Ok(mut a) = attempts.lock() {
                    a.push((t0, Instant::now(), ok));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    });
    let result = restart(
        &ctx,
        &mut st,
        k,
        old,
        &argv,
        &want_ports,
        args.grace,
        timeout,
        stopped_at,
        &attempts,
        measure.is_some(),
    );
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = prober {
        let _ = h.join();
    }
    let r = result?;
    let restored = log_line(&log, r.log_from, "conntrack state")
        .map(|l| {
            let l = l.trim();
            // The message part of the tracing line, without its fields.
            let m = l.split_once(": ").map_or(l, |(_, m)| m);
            m.split_once(" path=").map_or(m, |(m, _)| m).to_string()
        })
        .unwrap_or_else(|| "no conntrack line in switchd.log".into());
    crate::say!(
        "{} switchd restarted: pid {} -> {} ({}; stopped in {} ms, up again after {} ms, {} ports re-added after {} ms)",
        node.name,
        old.map_or_else(|| "none".to_string(), |p| p.to_string()),
        r.new_pid,
        match (old, r.killed) {
            (None, _) => "it was not running",
            (Some(_), true) => "SIGKILL after the grace period: no conntrack state saved",
            (Some(_), false) => "SIGTERM",
        },
        r.exited_ms,
        r.socket_ms,
        want_ports.len(),
        r.ports_ms
    );
    crate::say!("{}: {restored}", node.name);
    if let (Some(ms), Some(p)) = (r.reattach_ms, &measure) {
        crate::say!(
            "{}: reattach time {ms} ms (no forwarding {} -> {}:{} from the SIGTERM until the first connection through the new switchd)",
            node.name,
            p.job.from,
            p.job.to,
            p.port
        );
    }
    Ok(0)
}

struct Outcomes {
    new_pid: u32,
    killed: bool,
    exited_ms: u128,
    socket_ms: u128,
    ports_ms: u128,
    reattach_ms: Option<u128>,
    /// switchd.log's length before the new process started.
    log_from: u64,
}

#[allow(clippy::too_many_arguments)]
fn restart(
    ctx: &Ctx,
    st: &mut LabState,
    k: usize,
    old: Option<u32>,
    argv: &[String],
    want_ports: &[String],
    grace: u64,
    timeout: Duration,
    t0: Instant,
    attempts: &Mutex<Vec<Attempt>>,
    measuring: bool,
) -> anyhow::Result<Outcomes> {
    let node = st.nodes[k].clone();
    let dir = ctx.paths.node_dir(node.index);
    let sock = dir.join("switchd.sock");
    let log = dir.join("switchd.log");
    let mut killed = false;
    if let Some(pid) = old {
        killed = !procs::stop(pid, SWITCHD_NEEDLE, Duration::from_secs(grace))?;
        procs::wait_exited(pid, "oxvs-switchd", Duration::from_secs(5))?;
    }
    let exited_ms = t0.elapsed().as_millis();
    if killed || old.is_none() {
        // A switchd that did not tear down left its socket and gateway.
        let _ = std::fs::remove_file(&sock);
        let _ = crate::netns::run(&["ip", "-n", &node.netns, "link", "del", GATEWAY]);
    }
    let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut child = procs::spawn_in(&node.netns, &argv_ref, &log)?;
    st.nodes[k].switchd_pid = Some(child.id());
    ctx.paths.save(st)?;
    if !wait_for_socket(&sock, &mut child, Duration::from_secs(10)) {
        anyhow::bail!(
            "the new oxvs-switchd on {} did not come up (no {}):\n{}",
            node.name,
            sock.display(),
            procs::log_tail(&log, 30)
        );
    }
    let socket_ms = t0.elapsed().as_millis();
    let deadline = Instant::now() + timeout;
    loop {
        let have = port_names(&sock).unwrap_or_default();
        let missing: Vec<&String> = want_ports.iter().filter(|p| !have.contains(p)).collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline || !procs::child_running(&mut child) {
            anyhow::bail!(
                "{}: after {} s the new switchd still lacks port(s) {:?} (the agent re-adds them at its next resync)\n--- agent.log (tail) ---\n{}\n--- switchd.log (tail) ---\n{}",
                node.name,
                timeout.as_secs(),
                missing,
                procs::log_tail(&dir.join("agent.log"), 20),
                procs::log_tail(&log, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ports_ms = t0.elapsed().as_millis();
    let mut reattach_ms = None;
    if measuring {
        loop {
            let first = attempts.lock().ok().and_then(|a| {
                a.iter()
                    .find(|(s, _, ok)| *ok && *s >= started)
                    .map(|(_, e, _)| e.duration_since(t0).as_millis())
            });
            if first.is_some() {
                reattach_ms = first;
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{}: pods do not forward {} s after the ports were re-added",
                    node.name,
                    timeout.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(Outcomes {
        new_pid: child.id(),
        killed,
        exited_ms,
        socket_ms,
        ports_ms,
        reattach_ms,
        log_from,
    })
}
