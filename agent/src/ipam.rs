//! Node IPAM: addresses for pods from the node's pod CIDR.
//!
//! # Address plan
//!
//! For a pod CIDR such as `10.244.0.0/24` (IPv4 only):
//!
//! - the network address (`10.244.0.0`) and the broadcast address
//!   (`10.244.0.255`) are never allocated;
//! - the gateway is the first host address (`10.244.0.1`), owned by the node,
//!   never allocated;
//! - pods get the rest (`10.244.0.2` ..= `10.244.0.254`). A `/30` therefore
//!   has exactly one pod address; `/31` and `/32` are refused with
//!   [`IpamError::CidrTooSmall`].
//!
//! Allocations are keyed by (container id, ifname). Addresses are handed out
//! round-robin from the address after the last one handed out (like the
//! reference `host-local` plugin), so a released address is not reused until
//! the range wraps around. Allocating for a key that already holds an address
//! returns that address (idempotent); releasing a key that holds none is not
//! an error (idempotent).
//!
//! # On-disk format
//!
//! The store for a CIDR is the directory `dir/<network>-<prefix>/` (for
//! example `/var/lib/oxvs/ipam/10.244.0.0-24/`), so stores of different
//! CIDRs never mix. In it:
//!
//! - one file per allocated address, named by the address (`10.244.0.7`),
//!   holding the key as one JSON object followed by a newline:
//!   `{"container_id":"<id>","ifname":"eth0"}` (JSON so that any id or name
//!   round-trips, whatever characters it holds);
//! - `last_reserved_ip`: the address handed out last, as text (a hint for
//!   round-robin only: if it is missing or unreadable, allocation starts
//!   again from the first pod address, which is still safe);
//! - `lock`: an empty file held with an exclusive `flock` while an [`Ipam`]
//!   is open, so two agents (or two `Ipam`s in one process) can never share a
//!   store;
//! - transiently `.<name>.tmp`: a write in progress.
//!
//! Every write is atomic: the content goes to `.<name>.tmp` in the same
//! directory, which is fsynced, renamed over `<name>`, and then the directory
//! is fsynced. A removal is `unlink` then fsync of the directory. A crash at
//! any point therefore leaves either the old record or the new one, plus at
//! worst a stray temporary file, which [`Ipam::open`] reports and deletes.
//!
//! # Invariants
//!
//! - Memory follows disk: every operation does its disk write first and
//!   changes memory only once the write succeeded, so a failed write leaves
//!   the in-memory view as it was (and a failed allocation leaves no record
//!   behind, best effort). A record on disk that memory does not know about
//!   can only come from a failed allocation, and is simply overwritten when
//!   that address is next handed out.
//! - An address is never held by two keys, and is never handed out while a
//!   record for it exists in the store, even an unreadable one: a record
//!   whose content cannot be read or parsed keeps its address taken (with a
//!   `tracing` warning) until [`Ipam::release_ip`] removes it. Such records
//!   are listed by [`Ipam::unreadable`], not by [`Ipam::allocations`], so
//!   garbage collection through [`Ipam::retain`] never frees them blindly.
//! - Files in the store that are not records (names that are not an address
//!   of this CIDR's pod range, and not one of the files above) are ignored
//!   with a warning.
//!
//! # Cost
//!
//! Allocation scans at most the whole pod range from the round-robin cursor:
//! O(size of the CIDR) in the worst case (a nearly full `/16` is 65 534
//! `BTreeMap` look-ups, well under a millisecond); the time of one allocation
//! is dominated by its two fsyncs (record and directory) plus those of
//! `last_reserved_ip`.
//!
//! # Concurrency
//!
//! Not thread-safe by itself (every mutating method takes `&mut self`): the
//! agent holds its one `Ipam` in a `Mutex`. There is never a reason for a
//! second `Ipam` on the same store, and the `flock` makes a second
//! [`Ipam::open`] of the same store fail until the first is dropped.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// One allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub ip: Ipv4Addr,
    pub container_id: String,
    pub ifname: String,
}

/// Why an IPAM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error("pod CIDR {cidr} has no free address ({allocated} allocated)")]
    Exhausted { cidr: Ipv4Net, allocated: usize },
    #[error(
        "pod CIDR {0} is too small (needs at least a gateway and one pod address: /30 or larger)"
    )]
    CidrTooSmall(Ipv4Net),
    #[error("IPAM store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("IPAM store {path}: corrupt record: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// Name of the round-robin cursor file.
const LAST_RESERVED: &str = "last_reserved_ip";
/// Name of the lock file.
const LOCK: &str = "lock";

/// The key of a record, as stored on disk.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Key {
    container_id: String,
    ifname: String,
}

/// What the store holds for one address.
#[derive(Clone, Debug)]
enum Record {
    /// A readable record.
    Held(Key),
    /// A record that could not be read or parsed; the address stays taken.
    Unreadable(String),
}

/// The node's address allocator.
#[derive(Debug)]
pub struct Ipam {
    /// The store directory of this CIDR (`dir/<network>-<prefix>`).
    dir: PathBuf,
    /// The store directory, open for fsync.
    dir_handle: File,
    /// Exclusive lock on `dir/lock`, released on drop.
    _lock: Flock<File>,
    cidr: Ipv4Net,
    /// First and last pod address (as integers), inclusive.
    first: u32,
    last: u32,
    /// Every record in the store, by address.
    records: BTreeMap<Ipv4Addr, Record>,
    /// Readable records by key. Normally one address per key; more only if
    /// the store was edited by hand (kept so that `release` frees them all).
    by_key: HashMap<Key, Vec<Ipv4Addr>>,
    /// The address handed out last, if known.
    last_reserved: Option<Ipv4Addr>,
}

impl Ipam {
    /// Opens (creating if needed) the store for `cidr` under `dir` and loads
    /// its allocations.
    ///
    /// `cidr` is normalised to its network (`10.244.0.7/24` is
    /// `10.244.0.0/24`). Stray temporary files are deleted with a warning;
    /// unreadable records keep their address taken (see the module doc).
    /// Fails if the store is open elsewhere (it is locked), or if it cannot
    /// be created or listed.
    pub fn open(dir: &Path, cidr: Ipv4Net) -> Result<Ipam, IpamError> {
        let cidr = cidr.trunc();
        if cidr.prefix_len() > 30 {
            return Err(IpamError::CidrTooSmall(cidr));
        }
        let first = u32::from(cidr.network()) + 2;
        let last = u32::from(cidr.broadcast()) - 1;

        let store = dir.join(format!("{}-{}", cidr.network(), cidr.prefix_len()));
        if store.exists() && !store.is_dir() {
            return Err(IpamError::Corrupt {
                path: store,
                reason: "exists but is not a directory".to_string(),
            });
        }
        fs::create_dir_all(&store).map_err(|e| io_err(&store, e))?;
        let dir_handle = File::open(&store).map_err(|e| io_err(&store, e))?;

        let lock_path = store.join(LOCK);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io_err(&lock_path, e))?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(
            |(_, errno)| {
                let source = if errno == nix::errno::Errno::EWOULDBLOCK {
                    io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "store is locked: in use by another oxvs-agent or another Ipam in this process",
                    )
                } else {
                    io::Error::from(errno)
                };
                io_err(&lock_path, source)
            },
        )?;

        let mut ipam = Ipam {
            dir: store,
            dir_handle,
            _lock: lock,
            cidr,
            first,
            last,
            records: BTreeMap::new(),
            by_key: HashMap::new(),
            last_reserved: None,
        };
        ipam.load()?;
        Ok(ipam)
    }

    /// Reads every file of the store into memory.
    fn load(&mut self) -> Result<(), IpamError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        let mut last_reserved_text = None;
        for entry in entries {
            let entry = entry.map_err(|e| io_err(&self.dir, e))?;
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                tracing::warn!(path = %path.display(), "IPAM store: ignoring a file whose name is not UTF-8");
                continue;
            };
            if name == LOCK {
                continue;
            }
            if name.starts_with('.') && name.ends_with(".tmp") {
                tracing::warn!(
                    path = %path.display(),
                    "IPAM store: removing a stray temporary file (a write was interrupted)"
                );
                if let Err(e) = fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "IPAM store: cannot remove a stray temporary file");
                }
                continue;
            }
            if name == LAST_RESERVED {
                last_reserved_text = Some(fs::read_to_string(&path).map_err(|e| (path, e)));
                continue;
            }
            let Ok(ip) = name.parse::<Ipv4Addr>() else {
                tracing::warn!(path = %path.display(), "IPAM store: ignoring an unknown file");
                continue;
            };
            if !self.in_range(ip) {
                tracing::warn!(
                    path = %path.display(), cidr = %self.cidr,
                    "IPAM store: ignoring a record for an address outside the pod range of the CIDR"
                );
                continue;
            }
            let record = match fs::read(&path) {
                Ok(bytes) => match parse_record(&bytes) {
                    Ok(key) => Record::Held(key),
                    Err(reason) => Record::Unreadable(reason),
                },
                Err(e) => Record::Unreadable(format!("cannot read: {e}")),
            };
            match record {
                Record::Held(key) => {
                    let ips = self.by_key.entry(key.clone()).or_default();
                    if let Some(other) = ips.first() {
                        tracing::warn!(
                            container_id = %key.container_id, ifname = %key.ifname,
                            %ip, %other,
                            "IPAM store: one key holds several addresses; all stay taken until it is released"
                        );
                    }
                    ips.push(ip);
                    self.records.insert(ip, Record::Held(key));
                }
                Record::Unreadable(reason) => {
                    tracing::warn!(
                        path = %path.display(), %reason,
                        "IPAM store: unreadable record; its address stays taken until release_ip"
                    );
                    self.records.insert(ip, Record::Unreadable(reason));
                }
            }
        }
        for ips in self.by_key.values_mut() {
            ips.sort();
        }
        self.last_reserved = match last_reserved_text {
            None => None,
            Some(Err((path, e))) => {
                tracing::warn!(path = %path.display(), error = %e, "IPAM store: cannot read the round-robin cursor; starting from the first address");
                None
            }
            Some(Ok(text)) => match text.trim().parse::<Ipv4Addr>() {
                Ok(ip) if self.in_range(ip) => Some(ip),
                _ => {
                    tracing::warn!(
                        path = %self.dir.join(LAST_RESERVED).display(), content = %text.trim(),
                        "IPAM store: invalid round-robin cursor; starting from the first address"
                    );
                    None
                }
            },
        };
        Ok(())
    }

    /// The pod CIDR.
    pub fn cidr(&self) -> Ipv4Net {
        self.cidr
    }

    /// The gateway address (the CIDR's first host address).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.cidr.network()) + 1)
    }

    /// The store directory of this CIDR.
    pub fn store_dir(&self) -> &Path {
        &self.dir
    }

    /// Number of pod addresses still free (the pod range minus every record,
    /// readable or not).
    pub fn free_count(&self) -> usize {
        self.range_len() - self.records.len()
    }

    /// Allocates an address for (container_id, ifname); if that key already
    /// holds one, returns it (idempotent).
    pub fn allocate(&mut self, container_id: &str, ifname: &str) -> Result<Ipv4Addr, IpamError> {
        if let Some(ip) = self.get(container_id, ifname) {
            return Ok(ip);
        }
        let ip = self.next_free().ok_or(IpamError::Exhausted {
            cidr: self.cidr,
            allocated: self.records.len(),
        })?;
        let key = Key {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        };
        let mut content = serde_json::to_vec(&key).map_err(|e| IpamError::Io {
            path: self.dir.join(ip.to_string()),
            source: io::Error::other(e),
        })?;
        content.push(b'\n');
        self.write_atomic(&ip.to_string(), &content)?;
        self.records.insert(ip, Record::Held(key.clone()));
        self.by_key.insert(key, vec![ip]);
        self.last_reserved = Some(ip);
        // The cursor is a hint: failing to persist it costs at most an
        // earlier reuse of a released address after a restart, never a
        // double allocation, so it does not fail the allocation.
        if let Err(e) = self.write_atomic(LAST_RESERVED, format!("{ip}\n").as_bytes()) {
            tracing::warn!(error = %e, "IPAM store: cannot persist the round-robin cursor");
        }
        Ok(ip)
    }

    /// Releases the address of (container_id, ifname); `Ok(None)` if it had none.
    pub fn release(
        &mut self,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<Ipv4Addr>, IpamError> {
        let key = Key {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        };
        let Some(ips) = self.by_key.get(&key).cloned() else {
            return Ok(None);
        };
        for ip in &ips {
            self.remove_record(*ip)?;
        }
        Ok(ips.first().copied())
    }

    /// Releases whatever record holds `ip`: its allocation, or an unreadable
    /// record (then `Ok(None)` is returned, as when nothing held `ip`).
    pub fn release_ip(&mut self, ip: Ipv4Addr) -> Result<Option<Allocation>, IpamError> {
        let Some(record) = self.records.get(&ip).cloned() else {
            return Ok(None);
        };
        self.remove_record(ip)?;
        Ok(match record {
            Record::Held(key) => Some(Allocation {
                ip,
                container_id: key.container_id,
                ifname: key.ifname,
            }),
            Record::Unreadable(_) => None,
        })
    }

    /// Removes every allocation for which `keep` returns false and returns
    /// the removed ones (used by CNI GC and start-up reconciliation).
    /// Unreadable records are not offered to `keep` and stay.
    ///
    /// Every removal is attempted; if some fail, the first error is returned
    /// (each is logged) and the allocations whose removal succeeded are gone
    /// (memory and disk agree, as always).
    pub fn retain<F>(&mut self, mut keep: F) -> Result<Vec<Allocation>, IpamError>
    where
        F: FnMut(&Allocation) -> bool,
    {
        let doomed: Vec<Allocation> = self.allocations().into_iter().filter(|a| !keep(a)).collect();
        let mut removed = Vec::with_capacity(doomed.len());
        let mut first_error = None;
        for alloc in doomed {
            match self.remove_record(alloc.ip) {
                Ok(()) => removed.push(alloc),
                Err(e) => {
                    tracing::warn!(ip = %alloc.ip, error = %e, "IPAM: cannot remove an allocation");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// The address of (container_id, ifname), if any.
    pub fn get(&self, container_id: &str, ifname: &str) -> Option<Ipv4Addr> {
        // A borrowed look-up would need a custom Borrow impl; the key is
        // small and `get` is not hot.
        let key = Key {
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        };
        self.by_key.get(&key).and_then(|ips| ips.first().copied())
    }

    /// Every allocation, by address.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.records
            .iter()
            .filter_map(|(ip, record)| match record {
                Record::Held(key) => Some(Allocation {
                    ip: *ip,
                    container_id: key.container_id.clone(),
                    ifname: key.ifname.clone(),
                }),
                Record::Unreadable(_) => None,
            })
            .collect()
    }

    /// Addresses held by unreadable records, with the reason each could not
    /// be read. They stay taken until [`Ipam::release_ip`].
    pub fn unreadable(&self) -> Vec<(Ipv4Addr, String)> {
        self.records
            .iter()
            .filter_map(|(ip, record)| match record {
                Record::Unreadable(reason) => Some((*ip, reason.clone())),
                Record::Held(_) => None,
            })
            .collect()
    }

    /// Number of pod addresses in the CIDR.
    fn range_len(&self) -> usize {
        // At most 2^32 - 2 (a /0), which fits usize on every 64-bit target;
        // saturate elsewhere.
        usize::try_from(self.last - self.first + 1).unwrap_or(usize::MAX)
    }

    /// Whether `ip` is a pod address of this CIDR.
    fn in_range(&self, ip: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(ip))
    }

    /// The first free address at or after the one following the cursor,
    /// wrapping around the pod range once.
    fn next_free(&self) -> Option<Ipv4Addr> {
        let len = self.last - self.first + 1;
        let start = match self.last_reserved {
            Some(ip) if self.in_range(ip) => (u32::from(ip) - self.first + 1) % len,
            _ => 0,
        };
        (0..len)
            .map(|i| Ipv4Addr::from(self.first + (start + i) % len))
            .find(|ip| !self.records.contains_key(ip))
    }

    /// Removes the record of `ip` from disk, then from memory.
    fn remove_record(&mut self, ip: Ipv4Addr) -> Result<(), IpamError> {
        let path = self.dir.join(ip.to_string());
        match fs::remove_file(&path) {
            Ok(()) => {}
            // Already gone (e.g. a previous attempt unlinked it but failed
            // to sync the directory): finish the job.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path, e)),
        }
        self.dir_handle
            .sync_all()
            .map_err(|e| io_err(&self.dir, e))?;
        if let Some(Record::Held(key)) = self.records.remove(&ip) {
            if let Some(ips) = self.by_key.get_mut(&key) {
                ips.retain(|held| *held != ip);
                if ips.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Writes `name` in the store atomically (temporary file, fsync, rename,
    /// fsync of the directory). On failure, removes what it wrote (best
    /// effort), so a failed write leaves neither the temporary file nor, if
    /// the rename happened, the new file.
    fn write_atomic(&self, name: &str, content: &[u8]) -> Result<(), IpamError> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let path = self.dir.join(name);
        let written = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(content)?;
            file.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&tmp, e));
        }
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&path, e));
        }
        if let Err(e) = self.dir_handle.sync_all() {
            let _ = fs::remove_file(&path);
            return Err(io_err(&self.dir, e));
        }
        Ok(())
    }
}

/// Parses the content of a record file.
fn parse_record(bytes: &[u8]) -> Result<Key, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))
}

fn io_err(path: &Path, source: io::Error) -> IpamError {
    IpamError::Io {
        path: path.to_path_buf(),
        source,
    }
}
