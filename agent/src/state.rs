//! The agent's record of attached pods, persisted on disk.
//!
//! One JSON file per attachment, `<state_dir>/pods/<container id>@<ifname>.json`,
//! written atomically (temporary file, rename). A record is written
//! *before* anything is created for the pod, in state
//! [`AttachState::Pending`], and turned `Ready` once the pod is fully
//! attached; so after a crash of the agent at any point it finds a record
//! for everything it may have made, and rolls pending ones back.
//!
//! Why no fsync: a record describes a pod's network namespace, veth and
//! switch port, none of which survives the host going down. An agent crash
//! loses nothing written (the page cache stays); a power failure may lose
//! or truncate recent records, but then every pod they describe is gone
//! too, and the agent starts by releasing what no live interface backs. A
//! record found truncated is moved aside (`.corrupt`) with a warning. The
//! fsyncs would cost a few milliseconds per ADD on the CNI critical path
//! for no guarantee a pod can use.
//!
//! The container id is `[A-Za-z0-9_.-]` (the CNI spec) and the interface
//! name has no `/` or NUL (checked before a record is made), so the file
//! name is a valid, unambiguous path component. Not thread-safe by itself
//! beyond what the file system gives: the agent writes a given record under
//! that (container, ifname)'s lock.

use std::fs;
use std::io::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where an attachment is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachState {
    /// ADD in progress (or interrupted): roll back on start.
    Pending,
    /// Attached: interface, switch port and flows exist.
    Ready,
}

/// One pod interface attached to the switch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// The host end of the veth pair, also the switch port's name.
    pub host_ifname: String,
    #[serde(default)]
    pub pod_namespace: String,
    #[serde(default)]
    pub pod_name: String,
    /// The pod's IPv4 address: none on an IPv6-only node (its fields,
    /// `ip`, `prefix_len` and `gateway`, are at the record's top level, as
    /// before IPv6-only nodes).
    #[serde(flatten)]
    pub ipv4: Option<PodIpv4>,
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    pub mtu: u32,
    /// The switch port number, once the port exists.
    #[serde(default)]
    pub ofport: Option<u32>,
    pub state: AttachState,
    /// The pod's IPv6 address, on a dual-stack or IPv6-only node (absent
    /// in records made before dual-stack, and on IPv4 nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PodIpv6>,
    /// The root qdisc ADD gave the pod's interface (`--pod-qdisc` then;
    /// `None`: none, also in records made before pods had one), what CNI
    /// CHECK compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qdisc: Option<String>,
}

/// A pod's IPv4 address, its prefix and its gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIpv4 {
    pub ip: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Ipv4Addr,
}

/// A pod's IPv6 address, its prefix and its gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIpv6 {
    pub ip: Ipv6Addr,
    pub prefix_len: u8,
    pub gateway: Ipv6Addr,
}

impl Attachment {
    /// Its IPv4 address, if it has one.
    pub fn ip4(&self) -> Option<Ipv4Addr> {
        self.ipv4.map(|v4| v4.ip)
    }

    /// Its IPv6 address, if it has one.
    pub fn ip6(&self) -> Option<Ipv6Addr> {
        self.ipv6.map(|v6| v6.ip)
    }

    /// Its addresses, IPv4 first (the pod's `status.podIPs` order on a
    /// dual-stack node).
    pub fn ips(&self) -> Vec<std::net::IpAddr> {
        self.ip4()
            .map(std::net::IpAddr::V4)
            .into_iter()
            .chain(self.ip6().map(std::net::IpAddr::V6))
            .collect()
    }

    /// Its first address (see [`Attachment::ips`]), for logs: `-` if none.
    pub fn ip_text(&self) -> String {
        self.ips()
            .first()
            .map_or_else(|| "-".to_string(), |ip| ip.to_string())
    }

    /// The (container id, ifname) key.
    pub fn key(&self) -> (String, String) {
        (self.container_id.clone(), self.ifname.clone())
    }

    /// `namespace/name` of the pod, or the container id if unknown.
    pub fn pod_ref(&self) -> String {
        if self.pod_name.is_empty() {
            format!("container {}", self.container_id)
        } else {
            format!("{}/{}", self.pod_namespace, self.pod_name)
        }
    }
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state store {path}: corrupt record: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// The on-disk attachment records (a handle: cheap to clone).
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `data` to `path` atomically: a temporary file in the same
/// directory, renamed over `path` (readers see the old or the new content,
/// never a mix); with `sync`, also fsync of the file and the directory.
pub fn write_atomic(path: &Path, data: &[u8], sync: bool) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(data)?;
        if sync {
            f.sync_all()?;
        }
        fs::rename(&tmp, path)?;
        if sync {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

impl Store {
    /// Opens (creating) `<state_dir>/pods` and reads every record. A record
    /// that does not parse (only a power failure can truncate one, see the
    /// module doc) is moved aside as `NAME.corrupt` with a warning;
    /// leftover temporary files are removed.
    pub fn open(state_dir: &Path) -> Result<(Store, Vec<Attachment>), StoreError> {
        let dir = state_dir.join("pods");
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let text = fs::read(&path).map_err(io_err(&path))?;
            match serde_json::from_slice::<Attachment>(&text) {
                Ok(rec) => records.push(rec),
                Err(e) => {
                    let aside = dir.join(format!("{name}.corrupt"));
                    tracing::warn!(record = %path.display(), error = %e, moved_to = %aside.display(), "unreadable attachment record set aside");
                    fs::rename(&path, &aside).map_err(io_err(&path))?;
                }
            }
        }
        records.sort_by_key(|a| a.key());
        Ok((Store { dir }, records))
    }

    fn path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(format!("{container_id}@{ifname}.json"))
    }

    /// Writes (replaces) the record of `a`.
    pub fn save(&self, a: &Attachment) -> Result<(), StoreError> {
        let path = self.path(&a.container_id, &a.ifname);
        let data = serde_json::to_vec_pretty(a).map_err(|e| StoreError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_atomic(&path, &data, false).map_err(io_err(&path))
    }

    /// Removes the record of (container_id, ifname), if any.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<(), StoreError> {
        let path = self.path(container_id, ifname);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(cid: &str) -> Attachment {
        Attachment {
            container_id: cid.into(),
            ifname: "eth0".into(),
            netns: "/proc/1/ns/net".into(),
            host_ifname: "pod-1234567".into(),
            pod_namespace: "x".into(),
            pod_name: "a".into(),
            ipv4: Some(crate::state::PodIpv4 {
                ip: "10.244.0.5".parse().unwrap(),
                prefix_len: 24,
                gateway: "10.244.0.1".parse().unwrap(),
            }),
            mac: "0a:58:0a:f4:00:05".into(),
            mtu: 1450,
            ofport: None,
            state: AttachState::Pending,
            ipv6: None,
            qdisc: None,
        }
    }

    /// An IPv6-only pod's record has no IPv4 fields; a record of an
    /// IPv4 pod keeps them at the top level (as before IPv6-only nodes),
    /// so records of either age load.
    #[test]
    fn ipv4_fields_are_optional_and_in_place() {
        let mut a = rec("c1");
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["ip"], "10.244.0.5");
        assert_eq!(v["prefix_len"], 24);
        assert_eq!(serde_json::from_value::<Attachment>(v).unwrap(), a);
        a.ipv4 = None;
        a.ipv6 = Some(PodIpv6 {
            ip: "fd00:10:244::5".parse().unwrap(),
            prefix_len: 64,
            gateway: "fd00:10:244::1".parse().unwrap(),
        });
        let v = serde_json::to_value(&a).unwrap();
        assert!(v.get("ip").is_none() && v.get("gateway").is_none(), "{v}");
        let back: Attachment = serde_json::from_value(v).unwrap();
        assert_eq!(back, a);
        assert_eq!(back.ip_text(), "fd00:10:244::5");
        assert_eq!(flows_mac(&back), "0a:58:00:00:00:05");
    }

    /// The pod's qdisc is kept when there is one; a record without it
    /// (made before pods had one) loads as none, so CHECK does not ask
    /// an older pod for one.
    #[test]
    fn qdisc_is_kept_and_optional() {
        let mut a = rec("c1");
        let v = serde_json::to_value(&a).unwrap();
        assert!(v.get("qdisc").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<Attachment>(v).unwrap().qdisc, None);
        a.qdisc = Some("pfifo_fast".into());
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["qdisc"], "pfifo_fast");
        assert_eq!(serde_json::from_value::<Attachment>(v).unwrap(), a);
    }

    fn flows_mac(a: &Attachment) -> String {
        crate::flows::mac_str(&crate::flows::pod_mac_of(a.ip4(), a.ip6()))
    }

    #[test]
    fn save_reopen_remove() {
        let dir = tempfile::tempdir().unwrap();
        let (s, recs) = Store::open(dir.path()).unwrap();
        assert!(recs.is_empty());
        let mut a = rec("c1");
        s.save(&a).unwrap();
        a.state = AttachState::Ready;
        a.ofport = Some(3);
        s.save(&a).unwrap();
        s.save(&rec("c2")).unwrap();
        std::fs::write(dir.path().join("pods/.c9@eth0.json.tmp77"), b"{").unwrap();
        let (s, recs) = Store::open(dir.path()).unwrap();
        assert_eq!(recs, vec![a.clone(), rec("c2")]);
        s.remove("c1", "eth0").unwrap();
        s.remove("c1", "eth0").unwrap();
        let (_, recs) = Store::open(dir.path()).unwrap();
        assert_eq!(recs, vec![rec("c2")]);
        assert!(!dir.path().join("pods/.c9@eth0.json.tmp77").exists());
    }

    #[test]
    fn a_truncated_record_is_set_aside_and_the_rest_load() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = Store::open(dir.path()).unwrap();
        s.save(&rec("c2")).unwrap();
        std::fs::write(dir.path().join("pods/c1@eth0.json"), b"{\"container_id\":").unwrap();
        let (_, recs) = Store::open(dir.path()).unwrap();
        assert_eq!(recs, vec![rec("c2")]);
        assert!(dir.path().join("pods/c1@eth0.json.corrupt").exists());
        assert!(!dir.path().join("pods/c1@eth0.json").exists());
    }
}
