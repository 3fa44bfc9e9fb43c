//! `oxvs-lab apply -f FILE|DIR...`: Namespaces, NetworkPolicies and Pods,
//! in that order (policies before pods, so a new pod is never briefly
//! open). Each object is reported as `created`, `configured` or
//! `unchanged`, like kubectl; a failing object does not stop the others,
//! and the exit status is 1 when any failed.
//!
//! A Namespace or NetworkPolicy is written to the manifest directory as
//! given (plus uid/namespace defaults); the agents validate it and log what
//! they reject. A Pod or Policy in a namespace with no Namespace object is
//! refused, as the API server would.
//!
//! Services and Endpoints (a lab started with `up --kube-proxy`) come
//! last and go to the API server ([`super::kube`]); then the lab, as the
//! endpoints controller, rewrites the Endpoints of every Service whose
//! pods changed.

use std::path::PathBuf;

use super::runtime::{create_pod, update_pod};
use super::{Ctx, Global};
use crate::manifest::{self, Kind, Object};
use crate::state::random_uid;

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// Files or directories (*.yaml, *.yml, *.json) to apply.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "FILE|DIR",
        required = true
    )]
    pub files: Vec<PathBuf>,
}

pub fn run_apply(global: &Global, args: &ApplyArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    let mut objs: Vec<Object> = Vec::new();
    for f in &args.files {
        objs.extend(manifest::read_path(f)?);
    }
    objs.sort_by_key(|o| o.kind);
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist: run `oxvs-lab up` first", ctx.name());
    }
    let _lock = ctx.paths.lock(true)?;
    let mut st = ctx.paths.load()?;
    let bins = ctx.bins(&st)?;
    let dir = ctx.paths.manifests();
    let mut failed = 0;
    let mut applied_services: Vec<String> = Vec::new();
    for obj in &objs {
        let res = (|| -> anyhow::Result<&'static str> {
            if obj.kind.namespaced() {
                let ns_file = manifest::object_file_name("Namespace", "", &obj.namespace);
                if !dir.join(&ns_file).exists() {
                    anyhow::bail!(
                        "{}: namespace {:?} not found (apply the Namespace first)",
                        obj.display_name(),
                        obj.namespace
                    );
                }
            }
            match obj.kind {
                Kind::Namespace | Kind::NetworkPolicy => {
                    let file = obj.file_name();
                    let existed = dir.join(&file).exists();
                    let uid = st
                        .uids
                        .entry(file.clone())
                        .or_insert_with(random_uid)
                        .clone();
                    let stored = manifest::stored_object(obj, &uid);
                    if existed && manifest::read(&dir, &file).ok().as_ref() == Some(&stored) {
                        return Ok("unchanged");
                    }
                    manifest::write(&dir, &file, &stored)?;
                    ctx.paths.save(&st)?;
                    Ok(if existed { "configured" } else { "created" })
                }
                Kind::Pod => {
                    if st.pod(&obj.namespace, &obj.name).is_some() {
                        let changed = update_pod(&ctx, &bins, &mut st, obj)?;
                        Ok(if changed { "configured" } else { "unchanged" })
                    } else {
                        create_pod(&ctx, &bins, &mut st, obj)?;
                        Ok("created")
                    }
                }
                Kind::Service => super::kube::apply_service(&ctx, &mut st, obj),
                Kind::Endpoints => super::kube::apply_endpoints(&ctx, &mut st, obj),
            }
        })();
        match res {
            Ok(what) => {
                if obj.kind == Kind::Service {
                    applied_services.push(format!("{}/{}", obj.namespace, obj.name));
                }
                let extra = match obj.kind {
                    Kind::Pod => st
                        .pod(&obj.namespace, &obj.name)
                        .map(|p| format!(" on {} ip {}", p.node, p.ips_display()))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                crate::say!("{} {what}{extra}", obj.display_name());
            }
            Err(e) => {
                failed += 1;
                eprintln!("error: {e:#}");
            }
        }
    }
    // The endpoints controller's pass, then (a lab with kube-proxy) the
    // wait until every kube-proxy has the Services as written.
    let mut touched: Vec<String> = applied_services;
    match super::kube::sync_endpoints_keys(&ctx, &mut st) {
        Ok(changed) => {
            for (key, n) in changed {
                crate::say!("{}", super::kube::endpoints_line(&key, n));
                touched.push(key);
            }
        }
        Err(e) => {
            failed += 1;
            eprintln!("error: {e:#}");
        }
    }
    touched.sort();
    touched.dedup();
    super::kube::report_programmed(&st, &touched);
    Ok(if failed > 0 { 1 } else { 0 })
}
