//! The conntrack state file: the connection table saved when switchd stops
//! and restored when the next switchd starts, so that established
//! connections keep their conntrack entries (`+est`, direction, mark,
//! label, TCP windows) across a restart or an upgrade.
//!
//! The bytes are [`oxvs_pipeline::conntrack`]'s versioned format
//! ([`Conntrack::save_state`], [`Conntrack::restore_state`]); this module
//! does the file side:
//!
//! - **save** ([`save`], on SIGTERM/SIGINT, after the datapath threads
//!   stopped): the image is built under the conntrack lock, then written to
//!   `.NAME.tmp.PID` in the same directory (mode 0600), fsynced, renamed over
//!   `NAME`, and the directory fsynced, so a crash leaves the old file or the
//!   new one, never half of one. An empty table writes nothing.
//! - **restore** ([`restore`], at start, before any port exists): a missing
//!   file is not an error (a first start, or the last stop did not save). A
//!   file larger than a table of `--ct-max` connections can produce is
//!   refused unread. The file is consumed: removed once loaded, renamed to
//!   `NAME.rejected` (replacing an older one) when refused, so a stale table
//!   is never loaded twice, e.g. after a crash that saved nothing. A refused
//!   file leaves the table empty; loose TCP pickup then covers established
//!   connections.
//!
//! Nothing here runs on the per-packet path.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use oxvs_pipeline::conntrack::{state_len_limit, Conntrack, CtRestored, CtStateError};

use crate::engine::{monotonic_ns, Switch};

/// The default state file: next to the control socket, named after it
/// (`/run/oxvs/switchd.conntrack.state` for the default socket), so that
/// switches whose sockets share a directory never load each other's table.
pub fn default_path(socket: &Path) -> PathBuf {
    let stem = socket
        .file_stem()
        .map_or_else(|| "switchd".into(), |s| s.to_string_lossy().into_owned());
    socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join(format!("{stem}.conntrack.state"))
}

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Why the state file could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    #[error("{path}: {op}: {err}")]
    Io {
        path: PathBuf,
        op: &'static str,
        err: std::io::Error,
    },
    #[error("{path}: {len} bytes, more than a table of {max_entries} connections can need ({limit} bytes)")]
    TooLarge {
        path: PathBuf,
        len: u64,
        limit: u64,
        max_entries: usize,
    },
    #[error("{path}: {err}")]
    Invalid { path: PathBuf, err: CtStateError },
}

fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> StateFileError {
    let path = path.to_path_buf();
    move |err| StateFileError::Io { path, op, err }
}

/// What [`save`] wrote.
#[derive(Clone, Copy, Debug)]
pub struct Saved {
    pub entries: usize,
    pub bytes: usize,
    pub elapsed: Duration,
}

/// What [`restore`] loaded.
#[derive(Clone, Copy, Debug)]
pub struct Restored {
    pub result: CtRestored,
    pub bytes: usize,
    pub elapsed: Duration,
}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateFileError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "conntrack.state".into());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp, "create"))?;
        f.write_all(bytes).map_err(io(&tmp, "write"))?;
        f.sync_all().map_err(io(&tmp, "fsync"))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io(path, "rename into place"))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir, "fsync directory"))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Saves `switch`'s connection table to `path` (call once the datapath
/// threads have stopped, so that the table no longer changes). An empty
/// table writes nothing (`entries` 0, `bytes` 0).
pub fn save(switch: &Switch, path: &Path) -> Result<Saved, StateFileError> {
    let t0 = Instant::now();
    let (bytes, entries) = switch.with_conntrack(|ct| {
        let now = monotonic_ns();
        let live = ct
            .entries()
            .iter()
            .filter(|e| e.expiration_ns > now)
            .count();
        if live == 0 {
            return (Vec::new(), 0);
        }
        (ct.save_state(now, wall_ns()), live)
    });
    if entries > 0 {
        write_atomic(path, &bytes)?;
    }
    Ok(Saved {
        entries,
        bytes: bytes.len(),
        elapsed: t0.elapsed(),
    })
}

/// Reads `path` (at most what a table of `max_entries` can need) and
/// consumes it: removed on success, renamed to `PATH.rejected` otherwise.
/// `Ok(None)`: there is no file.
fn take_file(path: &Path, max_entries: usize) -> Result<Option<Vec<u8>>, StateFileError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path, "open")(e)),
    };
    let limit = state_len_limit(max_entries);
    let len = f.metadata().map_err(io(path, "stat"))?.len();
    if len > limit {
        return Err(StateFileError::TooLarge {
            path: path.to_path_buf(),
            len,
            limit,
            max_entries,
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // One byte more than the limit, in case the file grew since the stat.
    Read::take(&mut f, limit + 1)
        .read_to_end(&mut bytes)
        .map_err(io(path, "read"))?;
    if bytes.len() as u64 > limit {
        return Err(StateFileError::TooLarge {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
            limit,
            max_entries,
        });
    }
    Ok(Some(bytes))
}

/// The path a refused state file is moved to.
pub fn rejected_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".rejected");
    PathBuf::from(s)
}

/// Restores the connection table of `switch` (which must be empty, i.e.
/// just started) from `path`, then removes the file (or, when it is
/// refused, renames it to `PATH.rejected`). `Ok(None)`: no file.
pub fn restore(switch: &Switch, path: &Path) -> Result<Option<Restored>, StateFileError> {
    let t0 = Instant::now();
    let r = switch.with_conntrack(|ct| restore_into(ct, path, monotonic_ns(), wall_ns()));
    let consumed = match &r {
        Ok(None) => return Ok(None),
        Ok(Some(_)) => fs::remove_file(path).map_err(io(path, "remove after loading")),
        Err(StateFileError::Io { op: "open", .. }) => Ok(()),
        Err(_) => {
            let to = rejected_path(path);
            let r = fs::rename(path, &to).map_err(io(path, "rename to .rejected"));
            if r.is_ok() {
                tracing::warn!(to = %to.display(), "refused conntrack state file kept for inspection");
            }
            r
        }
    };
    if let Err(e) = consumed {
        // Loading it twice would be worse than not loading it at all.
        tracing::error!("{e}; remove the file by hand before the next start");
    }
    r.map(|o| {
        o.map(|(result, bytes)| Restored {
            result,
            bytes,
            elapsed: t0.elapsed(),
        })
    })
}

/// [`restore`] on a bare tracker, with the clocks given (tests).
pub fn restore_into(
    ct: &mut Conntrack,
    path: &Path,
    now_ns: u64,
    wall_ns: u64,
) -> Result<Option<(CtRestored, usize)>, StateFileError> {
    let Some(bytes) = take_file(path, ct.config().max_entries)? else {
        return Ok(None);
    };
    ct.restore_state(&bytes, now_ns, wall_ns)
        .map(|r| Some((r, bytes.len())))
        .map_err(|err| StateFileError::Invalid {
            path: path.to_path_buf(),
            err,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::conntrack::CtConfig;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("oxvs-ctstate-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("mkdir");
        d
    }

    #[test]
    fn default_path_is_next_to_the_socket() {
        assert_eq!(
            default_path(Path::new("/run/oxvs/switchd.sock")),
            Path::new("/run/oxvs/switchd.conntrack.state")
        );
        assert_eq!(
            default_path(Path::new("/tmp/sw-1-2.sock")),
            Path::new("/tmp/sw-1-2.conntrack.state")
        );
        assert_eq!(
            default_path(Path::new("sock")),
            Path::new("./sock.conntrack.state")
        );
    }

    #[test]
    fn atomic_write_then_restore_consumes_the_file() {
        let d = tmpdir("roundtrip");
        let p = d.join("conntrack.state");
        let image = Conntrack::new(CtConfig::default()).save_state(0, 0);
        write_atomic(&p, &image).expect("write");
        write_atomic(&p, &image).expect("overwrite");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&p).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(&d)
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["conntrack.state"], "no temporary file left");

        let mut ct = Conntrack::new(CtConfig::default());
        let (r, n) = restore_into(&mut ct, &p, 0, 0)
            .expect("ok")
            .expect("a file");
        assert_eq!((r.restored, n), (0, image.len()));
        assert!(restore_into(&mut ct, Path::new("/nonexistent/x"), 0, 0)
            .expect("missing is fine")
            .is_none());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn oversized_and_corrupt_files_are_refused_with_the_reason() {
        let d = tmpdir("bad");
        let p = d.join("conntrack.state");
        let small = CtConfig {
            max_entries: 2,
            ..CtConfig::default()
        };
        fs::write(&p, vec![0u8; 1 << 20]).expect("write");
        let e = restore_into(&mut Conntrack::new(small.clone()), &p, 0, 0).expect_err("too large");
        assert!(
            e.to_string()
                .contains("more than a table of 2 connections can need"),
            "{e}"
        );
        fs::write(&p, b"OXVS-CT\ngarbage").expect("write");
        let e = restore_into(&mut Conntrack::new(small), &p, 0, 0).expect_err("truncated");
        assert!(e.to_string().contains("truncated"), "{e}");
        let _ = fs::remove_dir_all(&d);
    }
}
