//! The glue between [`super`] and `oxvs-netlink`: a "run this with a
//! netlink socket" helper, the thread that enters a network namespace, and
//! the mapping of netlink errors to [`PodnetError`]s naming the step.
//!
//! Invariants:
//! - A netlink socket belongs to the network namespace of the thread that
//!   created it, so [`with_netlink`] always opens its own socket on the
//!   calling thread, and [`in_netns`] runs its closure on a fresh OS thread
//!   that `setns`es first and exits afterwards (it is never reused).
//! - Everything blocks on plain system calls (no runtime): call from
//!   `spawn_blocking` in async code, as for any blocking call.

use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::sched::{setns, CloneFlags};
use oxvs_netlink::Netlink;

use super::PodnetError;

/// Runs `f` with a netlink socket opened on the calling thread (hence in
/// its network namespace).
pub(super) fn with_netlink<T>(
    f: impl FnOnce(&mut Netlink) -> Result<T, PodnetError>,
) -> Result<T, PodnetError> {
    let mut nl = Netlink::open().map_err(|e| nl_err("open a netlink socket", &e))?;
    f(&mut nl)
}

/// Runs `f` on a new OS thread that first enters the network namespace
/// `ns` (an open nsfs file, `ns_path` only names it in errors). The thread
/// exits when `f` returns, so no thread outlives its namespace switch.
pub(super) fn in_netns<T, F>(ns: BorrowedFd<'_>, ns_path: &Path, f: F) -> Result<T, PodnetError>
where
    T: Send,
    F: FnOnce() -> Result<T, PodnetError> + Send,
{
    std::thread::scope(|s| {
        let joined = std::thread::Builder::new()
            .name("oxvs-netns".into())
            .spawn_scoped(s, move || {
                setns(ns, CloneFlags::CLONE_NEWNET).map_err(|e| PodnetError::Netlink {
                    step: format!("enter network namespace {}", ns_path.display()),
                    reason: e.desc().to_string(),
                })?;
                f()
            })
            .map_err(|e| PodnetError::Other(format!("cannot spawn a netns thread: {e}")))?
            .join();
        joined.unwrap_or_else(|_| {
            Err(PodnetError::Other(format!(
                "the thread working in {} panicked",
                ns_path.display()
            )))
        })
    })
}

/// A [`PodnetError::Netlink`] for `step`, the reason rendered with the
/// errno name when there is one (`EEXIST: File exists`).
pub(super) fn nl_err(step: impl Into<String>, e: &oxvs_netlink::Error) -> PodnetError {
    let reason = match e {
        oxvs_netlink::Error::Kernel(n) => format!("{n}: {}", n.desc()),
        other => other.to_string(),
    };
    PodnetError::Netlink {
        step: step.into(),
        reason,
    }
}

/// `nl_err` as a closure for `map_err`.
pub(super) fn step(s: impl Into<String>) -> impl FnOnce(oxvs_netlink::Error) -> PodnetError {
    let s = s.into();
    move |e| nl_err(s, &e)
}
