//! Commands and child processes, shared by the bench binaries (`e2e`,
//! `cni-bench`, `oxvs-bench` through [`crate::xbench::setup`]).
//!
//! [`run`] and [`must`] run a command to completion; [`Proc`] owns a
//! long-running child: it leads its own process group (so Ctrl-C reaches
//! only the bench, which then stops it, and a signal reaches the child's
//! own children too), and on drop it is stopped (SIGTERM first when
//! `gentle`, SIGKILL after [`GRACE`]) and reaped, also when the bench
//! unwinds from an error or a panic.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How long a gentle stop waits after SIGTERM before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// Runs a command (stdin closed) and returns its output.
pub fn run(args: &[&str]) -> Result<Output> {
    Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", args[0]))
}

/// Runs a command that must succeed; returns its stdout.
pub fn must(args: &[&str]) -> Result<String> {
    let out = run(args)?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`must`] inside network namespace `ns` (`ip netns exec`).
pub fn must_in(ns: &str, args: &[&str]) -> Result<String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    must(&v)
}

/// A child process leading its own process group, stopped and reaped on
/// drop (see the module doc).
pub struct Proc {
    child: Child,
    what: String,
    gentle: bool,
}

impl Proc {
    /// Starts `args`: stdout discarded, stderr kept for [`Proc::exited`].
    pub fn spawn(args: &[&str], what: &str, gentle: bool) -> Result<Proc> {
        Self::spawn_env(args, &[], what, gentle)
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_env(
        args: &[&str],
        env: &[(&str, &str)],
        what: &str,
        gentle: bool,
    ) -> Result<Proc> {
        Self::spawn_with(args, env, Stdio::null(), Stdio::piped(), what, gentle)
    }

    /// Starts `args` with stdout and stderr kept for [`Proc::finish`].
    pub fn spawn_piped(args: &[&str], what: &str, gentle: bool) -> Result<Proc> {
        Self::spawn_with(args, &[], Stdio::piped(), Stdio::piped(), what, gentle)
    }

    /// Starts a daemon (stopped gently) with stdout and stderr appended to
    /// `log`, which is created.
    pub fn spawn_logged(
        args: &[&str],
        env: &[(&str, &str)],
        what: &str,
        log: &Path,
    ) -> Result<Proc> {
        let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone().context("log file handle")?;
        Self::spawn_with(args, env, out.into(), err.into(), what, true)
    }

    fn spawn_with(
        args: &[&str],
        env: &[(&str, &str)],
        stdout: Stdio,
        stderr: Stdio,
        what: &str,
        gentle: bool,
    ) -> Result<Proc> {
        use std::os::unix::process::CommandExt;
        let child = Command::new(args[0])
            .args(&args[1..])
            .envs(env.iter().copied())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("cannot start {what} ({})", args.join(" ")))?;
        Ok(Proc {
            child,
            what: what.to_owned(),
            gentle,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether it has exited; its stderr (when kept) if so.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(_)) => {
                let mut err = String::new();
                if let Some(mut s) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = s.read_to_string(&mut err);
                }
                Some(err)
            }
            _ => None,
        }
    }

    /// Stops and reaps it; returns (stdout, stderr) where they were kept.
    pub fn finish(mut self) -> (String, String) {
        self.stop();
        let mut out = String::new();
        let mut err = String::new();
        use std::io::Read;
        if let Some(mut s) = self.child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        (out, err)
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), sig);
        }
    }

    /// SIGTERM and up to [`GRACE`] when gentle, then SIGKILL; reaps.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if self.gentle {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            let end = Instant::now() + GRACE;
            while Instant::now() < end {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!("{} did not stop on SIGTERM; killing it", self.what);
        }
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}
