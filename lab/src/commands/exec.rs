//! `oxvs-lab exec POD -- CMD...`: runs a command in a pod's network
//! namespace (like `kubectl exec`, minus the container filesystem), with
//! the terminal's stdin/stdout/stderr; exits with the command's status.

use std::process::Command;

use anyhow::Context as _;

use super::{split_pod_ref, Ctx, Global};

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// NAMESPACE/POD, or POD in namespace default.
    pub pod: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub fn run_exec(global: &Global, args: &ExecArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    let (ns, name) = split_pod_ref(&args.pod)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let st = {
        let _lock = ctx.paths.lock(false)?;
        ctx.paths.load()?
    };
    let pod = st
        .pod(&ns, &name)
        .with_context(|| format!("pod {ns}/{name} not found in lab {}", ctx.name()))?;
    let status = Command::new("ip")
        .args(["netns", "exec", &pod.netns])
        .args(&args.command)
        .status()
        .with_context(|| format!("cannot run `{}` in pod {ns}/{name}", args.command.join(" ")))?;
    // 128+signal when killed by one, as shells report it.
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt as _;
        128 + status.signal().unwrap_or(0)
    });
    Ok(u8::try_from(code).unwrap_or(1))
}
