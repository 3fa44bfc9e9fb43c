//! The CLI commands, one module each; [`Ctx`] is what they share (lab
//! name, paths, the binaries to run).

pub mod agent;
pub mod apply;
pub mod delete;
pub mod down;
pub mod exec;
pub mod kube;
pub mod node;
pub mod probe;
pub mod proxy;
pub mod runtime;
pub mod serve;
pub mod status;
pub mod switch;
pub mod up;

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::state::{check_lab_name, LabPaths, LabState, DEFAULT_LAB};

/// The gateway interface switchd makes in every node.
pub const GATEWAY: &str = "oxvs-gw0";

/// Options every command takes.
#[derive(Clone, Debug, clap::Args)]
pub struct Global {
    /// The lab to act on (also $OXVS_LAB; default "lab").
    #[arg(long, global = true, env = "OXVS_LAB", value_name = "LAB")]
    pub name: Option<String>,
    /// Directory holding labs.
    #[arg(long, global = true, value_name = "DIR", default_value = crate::state::STATE_ROOT)]
    pub state_root: PathBuf,
    /// Where oxvs-switchd, oxvs-agent and oxvs-cni are (default: next to oxvs-lab).
    #[arg(long, global = true, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
}

/// The binaries the lab runs.
#[derive(Clone, Debug)]
pub struct Bins {
    pub switchd: PathBuf,
    pub agent: PathBuf,
    pub cni: PathBuf,
    /// This binary (the pod server).
    pub lab: PathBuf,
}

impl Bins {
    /// Finds the binaries in `dir`, or next to this executable.
    pub fn find(dir: Option<&Path>) -> anyhow::Result<Bins> {
        let me = std::env::current_exe().context("cannot find oxvs-lab's own path")?;
        let dir = match dir {
            Some(d) => d.to_path_buf(),
            None => me
                .parent()
                .context("oxvs-lab's path has no directory")?
                .to_path_buf(),
        };
        let get = |name: &str| -> anyhow::Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                anyhow::bail!(
                    "{} not found: build the workspace (`cargo build`) or pass --bin-dir",
                    p.display()
                )
            }
        };
        Ok(Bins {
            switchd: get("oxvs-switchd")?,
            agent: get("oxvs-agent")?,
            cni: get("oxvs-cni")?,
            lab: me,
        })
    }

    /// From what `up` recorded (so later commands run the same binaries).
    pub fn from_state(st: &LabState) -> Option<Bins> {
        let get = |k: &str| st.bins.get(k).map(PathBuf::from);
        Some(Bins {
            switchd: get("switchd")?,
            agent: get("agent")?,
            cni: get("cni")?,
            lab: get("lab")?,
        })
    }

    pub fn record(&self, st: &mut LabState) {
        for (k, p) in [
            ("switchd", &self.switchd),
            ("agent", &self.agent),
            ("cni", &self.cni),
            ("lab", &self.lab),
        ] {
            st.bins.insert(k.to_string(), p.display().to_string());
        }
    }
}

/// A command's view of its lab.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub paths: LabPaths,
    pub global: Global,
}

impl Ctx {
    /// The lab named by `--name`, or `fallback`, or `lab`.
    pub fn new(global: &Global, fallback: Option<&str>) -> anyhow::Result<Ctx> {
        let name = global
            .name
            .as_deref()
            .or(fallback)
            .unwrap_or(DEFAULT_LAB)
            .to_string();
        check_lab_name(&name)?;
        Ok(Ctx {
            paths: LabPaths::new(&global.state_root, &name),
            global: global.clone(),
        })
    }

    pub fn name(&self) -> &str {
        &self.paths.name
    }

    /// The binaries: those `up` recorded, unless `--bin-dir` says otherwise.
    pub fn bins(&self, st: &LabState) -> anyhow::Result<Bins> {
        if self.global.bin_dir.is_none() {
            if let Some(b) = Bins::from_state(st) {
                return Ok(b);
            }
        }
        Bins::find(self.global.bin_dir.as_deref())
    }
}

/// Resolves `ns/pod` or `pod` (namespace `default`) to `(ns, pod)`.
pub fn split_pod_ref(r: &str) -> anyhow::Result<(String, String)> {
    match r.split_once('/') {
        Some((ns, pod)) if !ns.is_empty() && !pod.is_empty() && !pod.contains('/') => {
            Ok((ns.to_string(), pod.to_string()))
        }
        None if !r.is_empty() => Ok(("default".to_string(), r.to_string())),
        _ => anyhow::bail!("invalid pod {r:?}: use NAMESPACE/POD or POD"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_refs() {
        assert_eq!(
            split_pod_ref("x/a").expect("ok"),
            ("x".to_string(), "a".to_string())
        );
        assert_eq!(
            split_pod_ref("a").expect("ok"),
            ("default".to_string(), "a".to_string())
        );
        for bad in ["", "/a", "x/", "x/a/b"] {
            assert!(split_pod_ref(bad).is_err(), "{bad:?}");
        }
    }
}
