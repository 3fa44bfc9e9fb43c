//! Daemons the lab starts inside namespaces, and stopping them.
//!
//! A daemon is started as `ip netns exec NS BIN ARGS...` (`ip` enters the
//! namespace and `exec`s the binary, so the pid we get is the daemon's),
//! in its own process group (a Ctrl-C at the terminal that ran `oxvs-lab`
//! does not reach it), stdin from /dev/null and stdout+stderr appended to a
//! log file. The lab does not wait for it: when `oxvs-lab` exits, the
//! daemon is re-parented and keeps running.
//!
//! Pid reuse: before signalling a recorded pid, [`alive`] checks that
//! `/proc/PID/cmdline` still names the binary the lab started, so a
//! recycled pid is never killed. Zombies count as dead.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Starts `argv` in namespace `ns`, output appended to `log`. The
/// [`Child`] is for start-up checks only (`try_wait`); dropping it leaves
/// the process running.
pub fn spawn_in(ns: &str, argv: &[&str], log: &Path) -> anyhow::Result<Child> {
    let f = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open log {}", log.display()))?;
    let f2 = f
        .try_clone()
        .with_context(|| format!("cannot dup log {}", log.display()))?;
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(argv)
        .stdin(Stdio::null())
        .stdout(f)
        .stderr(f2)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start `{}` in {ns}", argv.join(" ")))
}

/// Whether a process this invocation started is still running.
pub fn child_running(child: &mut Child) -> bool {
    matches!(child.try_wait(), Ok(None))
}

/// Whether `pid` is a live (not zombie) process whose command line
/// contains `needle` (a binary path or name).
pub fn alive(pid: u32, needle: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    if !cmdline.contains(needle) {
        return false;
    }
    // Field 3 of /proc/PID/stat, after the parenthesised comm.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
        })
        .unwrap_or_default();
    state != "Z" && state != "X" && !state.is_empty()
}

/// SIGTERM, up to `grace` for it to go, then SIGKILL. `Ok(true)` when it
/// went on SIGTERM, `Ok(false)` when it needed SIGKILL or was already gone.
pub fn stop(pid: u32, needle: &str, grace: Duration) -> anyhow::Result<bool> {
    if !alive(pid, needle) {
        return Ok(false);
    }
    let p = Pid::from_raw(i32::try_from(pid).context("pid out of range")?);
    let _ = kill(p, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !alive(pid, needle) {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = kill(p, Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if !alive(pid, needle) {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    anyhow::bail!("process {pid} ({needle}) survived SIGKILL")
}

/// SIGKILLs every process still inside namespace `ns` (the lab's own
/// namespaces only: whatever runs there goes with the namespace).
pub fn kill_netns_processes(ns: &str) {
    for pid in crate::netns::pids(ns) {
        if let Ok(raw) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
        }
    }
}

/// The last `n` lines of a log file (for error messages).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

/// The argv of a live process (`/proc/PID/cmdline`).
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let v: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    (!v.is_empty()).then_some(v)
}

/// Waits until `pid` has fully exited: no `/proc/PID`, or a zombie whose
/// other threads are gone too.
///
/// [`alive`] turns false as soon as the dying process's command line
/// reads empty, which the kernel does (memory released) *before* it closes
/// the process's files; and the main thread of a multi-threaded process is
/// a zombie while the others still exit, holding the shared file table. The
/// new agent would find the old one's IPAM `flock` still held and exit.
/// Only when the last thread is gone are the files closed.
pub fn wait_exited(pid: u32, what: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
            });
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0);
        match state.as_deref() {
            None => return Ok(()),
            Some("Z") | Some("X") if threads <= 1 => return Ok(()),
            Some(_) if Instant::now() > deadline => {
                anyhow::bail!("the old {what} (pid {pid}) has not exited after {within:?}")
            }
            Some(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}
