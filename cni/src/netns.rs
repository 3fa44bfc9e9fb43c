//! Checks of `CNI_NETNS` before a call is forwarded.
//!
//! For ADD and CHECK the namespace must exist: an absolute path to a
//! network namespace file (a bind mount under `/run/netns`, or
//! `/proc/PID/ns/net`). A path that does not exist, is relative, or is not a
//! namespace file is invalid (code 4, naming `CNI_NETNS` and the path).
//! For every verb, a `CNI_NETNS` that is the plugin's own network namespace
//! is refused with code 8 (as the reference `skel` does): acting on "eth0"
//! there would touch the host. DEL accepts an empty or vanished namespace.
//!
//! A namespace file is recognised by its device: all namespace inodes live
//! on the one internal `nsfs` filesystem, the same device as
//! `/proc/self/ns/net`. If `/proc/self/ns/net` cannot be read (no /proc),
//! only existence is checked.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use oxvs_api::cni::{code, CniError};

/// Code 8 of the reference library (`ErrInvalidNetNS`): `CNI_NETNS` is the
/// plugin's own namespace.
pub const INVALID_NETNS: u32 = 8;

/// What to require of the namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// ADD, CHECK: must exist.
    Exists,
    /// DEL: may be empty or gone; if present it must not be ours.
    MayBeGone,
}

/// Checks `path` against `own` (normally `/proc/self/ns/net`).
pub fn check_with(path: &str, need: Need, own: &Path) -> Result<(), CniError> {
    let invalid = |why: String| {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_NETNS {path:?}: {why}"),
        ))
    };
    if path.is_empty() {
        return match need {
            Need::Exists => invalid("empty".into()),
            Need::MayBeGone => Ok(()),
        };
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        // DEL: a gone (or unreadable) namespace is the agent's to handle.
        Err(_) if need == Need::MayBeGone => return Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return invalid("the network namespace does not exist".into())
        }
        Err(e) => return invalid(format!("cannot stat it: {e}")),
    };
    if need == Need::Exists && !Path::new(path).is_absolute() {
        return invalid("not an absolute path".into());
    }
    let Ok(own) = std::fs::metadata(own) else {
        return Ok(());
    };
    if meta.dev() == own.dev() && meta.ino() == own.ino() {
        return Err(CniError::new(
            INVALID_NETNS,
            format!("CNI_NETNS {path:?} is the plugin's own network namespace"),
        )
        .with_details("plugin's netns and netns from CNI_NETNS should not be the same"));
    }
    if need == Need::Exists && meta.dev() != own.dev() {
        return invalid("not a network namespace file".into());
    }
    Ok(())
}

/// Checks `path` against the plugin's own namespace.
pub fn check(path: &str, need: Need) -> Result<(), CniError> {
    check_with(path, need, Path::new("/proc/self/ns/net"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_relative_and_plain_files() {
        let e = check("/nonexistent/oxvs-netns", Need::Exists).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("CNI_NETNS") && e.msg.contains("/nonexistent/oxvs-netns"));
        check("/nonexistent/oxvs-netns", Need::MayBeGone).unwrap();
        check("", Need::MayBeGone).unwrap();
        assert!(check("", Need::Exists).is_err());
        let e = check("/etc/hostname", Need::Exists).unwrap_err();
        assert!(e.msg.contains("not a network namespace"), "{}", e.msg);
        let e = check("Cargo.toml", Need::Exists).unwrap_err();
        assert!(e.msg.contains("absolute"), "{}", e.msg);
    }

    #[test]
    fn own_namespace_is_refused_for_every_verb() {
        for need in [Need::Exists, Need::MayBeGone] {
            let e = check("/proc/self/ns/net", need).unwrap_err();
            assert_eq!(e.code, INVALID_NETNS);
        }
    }

    #[test]
    fn another_namespace_file_is_accepted() {
        // The UTS namespace file lives on nsfs and is not our netns.
        check("/proc/self/ns/uts", Need::Exists).unwrap();
    }
}
