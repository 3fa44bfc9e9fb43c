//! `oxvs-lab delete -f FILE|DIR...`: the reverse of `apply`, in reverse
//! kind order (Pods, then NetworkPolicies, then Namespaces). Deleting a
//! Namespace deletes its Pods and NetworkPolicies first, as Kubernetes
//! does. A Pod is torn down completely (server stopped, CNI DEL, namespace
//! deleted, manifest removed). Objects that do not exist are reported and
//! make the exit status 1; the others are still deleted.
//!
//! Services (with their Endpoints) and Endpoints are deleted from the API
//! server; a deleted Namespace takes its Services too (the API server's
//! Namespace object itself stays: without the namespace controller it
//! could never finish terminating). Endpoints of Services whose pods went
//! are rewritten at the end.

use std::path::PathBuf;

use super::runtime::destroy_pod;
use super::{Ctx, Global};
use crate::manifest::{self, Kind, Object};

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// Files or directories (*.yaml, *.yml, *.json) whose objects to delete.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR",
        required = true
    )]
    pub files: Vec<PathBuf>,
}

pub fn run_delete(global: &Global, args: &DeleteArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    let mut objs: Vec<Object> = Vec::new();
    for f in &args.files {
        objs.extend(manifest::read_path(f)?);
    }
    objs.sort_by_key(|o| std::cmp::Reverse(o.kind));
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let _lock = ctx.paths.lock(true)?;
    let mut st = ctx.paths.load()?;
    let bins = ctx.bins(&st)?;
    let dir = ctx.paths.manifests();
    let mut failed = 0;
    for obj in &objs {
        let mut errs = Vec::new();
        let found = match obj.kind {
            Kind::Pod => {
                let found = st.pod(&obj.namespace, &obj.name).is_some();
                errs = destroy_pod(&ctx, &bins, &mut st, &obj.namespace, &obj.name);
                found
            }
            Kind::NetworkPolicy => {
                let file = obj.file_name();
                let found = dir.join(&file).exists();
                if let Err(e) = manifest::remove(&dir, &file) {
                    errs.push(format!("{e:#}"));
                }
                st.uids.remove(&file);
                found
            }
            Kind::Service => {
                match super::kube::delete_service(&ctx, &mut st, &obj.namespace, &obj.name) {
                    Ok(found) => found,
                    Err(e) => {
                        errs.push(format!("{e:#}"));
                        true
                    }
                }
            }
            Kind::Endpoints => {
                match super::kube::delete_endpoints(&ctx, &st, &obj.namespace, &obj.name) {
                    Ok(found) => found,
                    Err(e) => {
                        errs.push(format!("{e:#}"));
                        true
                    }
                }
            }
            Kind::Namespace => {
                let file = obj.file_name();
                let found = dir.join(&file).exists();
                errs.extend(super::kube::delete_namespace_services(
                    &ctx, &mut st, &obj.name,
                ));
                let pods: Vec<(String, String)> = st
                    .pods
                    .iter()
                    .filter(|p| p.namespace == obj.name)
                    .map(|p| (p.namespace.clone(), p.name.clone()))
                    .collect();
                for (ns, name) in pods {
                    errs.extend(destroy_pod(&ctx, &bins, &mut st, &ns, &name));
                    crate::say!("Pod {ns}/{name} deleted (with its namespace)");
                }
                let prefix = format!("networkpolicy_{}_", obj.name);
                if let Ok(rd) = std::fs::read_dir(&dir) {
                    for e in rd.flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if n.starts_with(&prefix) {
                            if let Err(e) = manifest::remove(&dir, &n) {
                                errs.push(format!("{e:#}"));
                            }
                            st.uids.remove(&n);
                        }
                    }
                }
                if let Err(e) = manifest::remove(&dir, &file) {
                    errs.push(format!("{e:#}"));
                }
                st.uids.remove(&file);
                found
            }
        };
        if let Err(e) = ctx.paths.save(&st) {
            errs.push(format!("{e:#}"));
        }
        if !found {
            failed += 1;
            eprintln!("error: {} not found", obj.display_name());
        } else if errs.is_empty() {
            crate::say!("{} deleted", obj.display_name());
        } else {
            failed += 1;
            eprintln!("error: {} deleted with errors:", obj.display_name());
            for e in errs {
                eprintln!("  {e}");
            }
        }
    }
    match super::kube::sync_endpoints_keys(&ctx, &mut st) {
        Ok(changed) => {
            for (key, n) in &changed {
                crate::say!("{}", super::kube::endpoints_line(key, *n));
            }
            let keys: Vec<String> = changed.into_iter().map(|(k, _)| k).collect();
            super::kube::report_programmed(&st, &keys);
        }
        Err(e) => {
            failed += 1;
            eprintln!("error: {e:#}");
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
