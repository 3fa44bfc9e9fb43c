//! The lab as a container runtime: creating and destroying pods, and the
//! node daemons' CNI socket paths. Shared by `apply`, `delete` and `down`.
//!
//! Pod creation order (each step recorded in the state before the next, so
//! an interrupted `apply` is cleaned up by `delete` or `down`):
//! 1. the Pod manifest, with `spec.nodeName` and no IP (as the scheduler
//!    leaves it);
//! 2. the pod's network namespace (`lo` up);
//! 3. `oxvs-cni` ADD in the node's namespace, as containerd does; on failure
//!    everything so far is undone and the error carries the plugin's answer;
//! 4. `status.podIP` written back into the manifest (as the kubelet does);
//! 5. the pod server for the declared ports, waited for until it says `ready`.
//!
//! Destruction runs every step and returns every failure: server stopped,
//! CNI DEL, processes in the namespace killed, namespace deleted, manifest
//! removed, state forgotten.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{Bins, Ctx};
use crate::cni::{self, Call};
use crate::manifest::{self, Object};
use crate::netns;
use crate::procs;
use crate::state::{pod_netns_name, random_hex, random_uid, LabState, NodeState, PodState};

/// What a pod server's command line contains (for [`procs::alive`]).
pub const SERVER_NEEDLE: &str = "oxvs-lab serve";

/// A node's CNI socket.
pub fn cni_socket(ctx: &Ctx, node: &NodeState) -> String {
    ctx.paths
        .node_dir(node.index)
        .join("cni.sock")
        .display()
        .to_string()
}

/// Runs the plugin for `pod` on its node.
pub fn cni_for_pod(
    ctx: &Ctx,
    bins: &Bins,
    node: &NodeState,
    pod: &PodState,
    command: &str,
) -> anyhow::Result<cni::CniOut> {
    let netns_path = if netns::exists(&pod.netns) {
        pod.netns_path()
    } else {
        // As containerd does for DEL once the sandbox is gone.
        String::new()
    };
    cni::call(&Call {
        plugin: &bins.cni.display().to_string(),
        node_netns: &node.netns,
        command,
        container_id: &pod.container_id,
        netns_path: &netns_path,
        pod: Some((&pod.namespace, &pod.name, &pod.uid)),
        config: cni::config("1.0.0", &cni_socket(ctx, node)),
    })
}

/// Asks node's agent for STATUS through the plugin.
pub fn cni_status(ctx: &Ctx, bins: &Bins, node: &NodeState) -> anyhow::Result<cni::CniOut> {
    cni::call(&Call {
        plugin: &bins.cni.display().to_string(),
        node_netns: &node.netns,
        command: "STATUS",
        container_id: "",
        netns_path: "",
        pod: None,
        config: cni::config("1.1.0", &cni_socket(ctx, node)),
    })
}

/// The pod server's command line.
fn server_argv(bins: &Bins, pod: &PodState) -> Vec<String> {
    let mut v = vec![
        bins.lab.display().to_string(),
        "serve".to_string(),
        "--id".to_string(),
        pod.key(),
    ];
    for p in &pod.ports {
        let flag = match p.protocol.as_str() {
            "UDP" => "--udp",
            "SCTP" => "--sctp",
            _ => "--tcp",
        };
        v.push(flag.to_string());
        v.push(p.port.to_string());
    }
    if pod.ip6.is_some() {
        v.push("--dual".to_string());
    }
    v
}

/// Starts the pod's server (if it declares ports) and waits for `ready`.
pub fn start_server(ctx: &Ctx, bins: &Bins, pod: &PodState) -> anyhow::Result<Option<u32>> {
    if pod.ports.is_empty() {
        return Ok(None);
    }
    let log = ctx.paths.pod_log(&pod.namespace, &pod.name);
    std::fs::create_dir_all(ctx.paths.pods_dir())
        .with_context(|| format!("cannot create {}", ctx.paths.pods_dir().display()))?;
    let _ = std::fs::remove_file(&log);
    let argv = server_argv(bins, pod);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut child = procs::spawn_in(&pod.netns, &argv, &log)?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().any(|l| l.starts_with("ready")) {
            return Ok(Some(pid));
        }
        if !procs::child_running(&mut child) {
            anyhow::bail!(
                "the server of pod {} exited at start:\n{}",
                pod.key(),
                text.trim()
            );
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the server of pod {} is not ready after 5 s:\n{}",
                pod.key(),
                text.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops the pod's server, if running.
pub fn stop_server(pod: &PodState) -> anyhow::Result<()> {
    if let Some(pid) = pod.server_pid {
        procs::stop(pid, SERVER_NEEDLE, Duration::from_secs(2))?;
    }
    Ok(())
}

/// Picks the node of a new pod: `spec.nodeName`, else round-robin.
pub fn schedule(st: &mut LabState, obj: &Object) -> anyhow::Result<NodeState> {
    let wanted = obj
        .body
        .pointer("/spec/nodeName")
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty());
    match wanted {
        Some(n) => st.node(n).cloned().with_context(|| {
            let have: Vec<&str> = st.nodes.iter().map(|n| n.name.as_str()).collect();
            format!(
                "{}: spec.nodeName {n:?} is not a node of this lab ({})",
                obj.display_name(),
                have.join(", ")
            )
        }),
        None => {
            if st.nodes.is_empty() {
                anyhow::bail!("the lab has no nodes");
            }
            let n = st.nodes[st.next_node % st.nodes.len()].clone();
            st.next_node = st.next_node.wrapping_add(1);
            Ok(n)
        }
    }
}

/// Creates a new pod (see the module doc for the steps).
pub fn create_pod(ctx: &Ctx, bins: &Bins, st: &mut LabState, obj: &Object) -> anyhow::Result<()> {
    let ports = manifest::pod_ports(&obj.body)
        .with_context(|| format!("{} ({})", obj.display_name(), obj.source))?;
    let node = schedule(st, obj)?;
    let uid = st
        .uids
        .entry(obj.file_name())
        .or_insert_with(random_uid)
        .clone();
    let pod = PodState {
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        uid: uid.clone(),
        node: node.name.clone(),
        netns: pod_netns_name(ctx.name(), &obj.namespace, &obj.name, &st.netns),
        container_id: random_hex(32),
        ip: None,
        ip6: None,
        ports,
        server_pid: None,
    };
    let dir = ctx.paths.manifests();
    manifest::write(
        &dir,
        &obj.file_name(),
        &manifest::pod_object(obj, &uid, &node.name, None),
    )?;
    st.note_netns(&pod.netns);
    st.pods.push(pod.clone());
    ctx.paths.save(st)?;

    let made = netns::add(&pod.netns).and_then(|()| {
        let out = cni_for_pod(ctx, bins, &node, &pod, "ADD")?;
        if !out.ok {
            anyhow::bail!("CNI ADD failed: {}", out.describe());
        }
        check_addresses(&node, out.ip(), out.ip6(), &out.stdout)
    });
    let (ip, ip6) = match made {
        Ok(ips) => ips,
        Err(e) => {
            let undo = destroy_pod(ctx, bins, st, &obj.namespace, &obj.name);
            let mut msg = format!("{} on {}: {e:#}", obj.display_name(), node.name);
            for u in undo {
                msg.push_str(&format!("\n  while undoing: {u}"));
            }
            anyhow::bail!(msg);
        }
    };
    manifest::write(
        &dir,
        &obj.file_name(),
        &manifest::pod_object(
            obj,
            &uid,
            &node.name,
            Some((&pod_ips(&ip, &ip6), node.primary_ip())),
        ),
    )?;
    if let Some(p) = st.pod_mut(&obj.namespace, &obj.name) {
        p.ip.clone_from(&ip);
        p.ip6.clone_from(&ip6);
    }
    ctx.paths.save(st)?;
    let mut with_ip = pod;
    with_ip.ip = ip;
    with_ip.ip6 = ip6;
    let pid = start_server(ctx, bins, &with_ip);
    // Record a started server even if it then failed to get ready.
    if let Ok(Some(pid)) = pid {
        if let Some(p) = st.pod_mut(&obj.namespace, &obj.name) {
            p.server_pid = Some(pid);
        }
        ctx.paths.save(st)?;
    }
    pid.map(|_| ())
}

/// A pod's addresses as `status.podIPs` lists them: IPv4 first.
fn pod_ips<'a>(ip: &'a Option<String>, ip6: &'a Option<String>) -> Vec<&'a str> {
    ip.as_deref().into_iter().chain(ip6.as_deref()).collect()
}

/// The addresses a CNI ADD on `node` gave (`ip`, `ip6`: the first of each
/// family in its result, `stdout`), checked against the node's pod CIDRs:
/// one of each family the node has, none of a family it has not (an
/// IPv6-only node's pods have no IPv4 address).
pub fn check_addresses(
    node: &NodeState,
    ip: Option<String>,
    ip6: Option<String>,
    stdout: &str,
) -> anyhow::Result<(Option<String>, Option<String>)> {
    let stdout = stdout.trim();
    match (&node.pod_cidr, &ip) {
        (Some(_), None) => anyhow::bail!("CNI ADD gave no IPv4 address: {stdout}"),
        (None, Some(ip)) => anyhow::bail!(
            "CNI ADD gave IPv4 address {ip} on IPv6-only node {}: {stdout}",
            node.name
        ),
        _ => {}
    }
    match (&node.pod_cidr6, &ip6) {
        (Some(_), None) => anyhow::bail!(
            "CNI ADD gave no IPv6 address on {} node {}: {stdout}",
            if node.pod_cidr.is_some() {
                "dual-stack"
            } else {
                "IPv6-only"
            },
            node.name
        ),
        (None, Some(ip6)) => anyhow::bail!(
            "CNI ADD gave IPv6 address {ip6} on IPv4-only node {}: {stdout}",
            node.name
        ),
        _ => {}
    }
    Ok((ip, ip6))
}

/// Updates an existing pod from `obj`: labels and other metadata go to the
/// manifest (IP and node kept); changed ports restart the server.
/// Returns whether anything changed.
pub fn update_pod(ctx: &Ctx, bins: &Bins, st: &mut LabState, obj: &Object) -> anyhow::Result<bool> {
    let Some(old) = st.pod(&obj.namespace, &obj.name).cloned() else {
        anyhow::bail!("{} is not in the lab", obj.display_name());
    };
    if let Some(n) = obj
        .body
        .pointer("/spec/nodeName")
        .and_then(serde_json::Value::as_str)
    {
        if !n.is_empty() && n != old.node {
            anyhow::bail!(
                "{}: spec.nodeName is immutable (running on {}, asked for {n}); delete it first",
                obj.display_name(),
                old.node
            );
        }
    }
    let ports = manifest::pod_ports(&obj.body)
        .with_context(|| format!("{} ({})", obj.display_name(), obj.source))?;
    let host_ip = st
        .node(&old.node)
        .map(|n| n.primary_ip().to_string())
        .unwrap_or_default();
    // A pod with an address is running (CNI ADD returned).
    let list = Some(old.ips()).filter(|l| !l.is_empty());
    let ips = list.as_deref().map(|l| (l, host_ip.as_str()));
    let new = manifest::pod_object(obj, &old.uid, &old.node, ips);
    let dir = ctx.paths.manifests();
    let before = manifest::read(&dir, &obj.file_name()).ok();
    let mut changed = before.as_ref() != Some(&new);
    if changed {
        manifest::write(&dir, &obj.file_name(), &new)?;
    }
    if ports != old.ports {
        changed = true;
        stop_server(&old)?;
        let mut p = old.clone();
        p.ports = ports;
        p.server_pid = None;
        if let Some(s) = st.pod_mut(&obj.namespace, &obj.name) {
            *s = p.clone();
        }
        ctx.paths.save(st)?;
        let pid = start_server(ctx, bins, &p)?;
        if let Some(s) = st.pod_mut(&obj.namespace, &obj.name) {
            s.server_pid = pid;
        }
        ctx.paths.save(st)?;
    }
    Ok(changed)
}

/// Destroys pod `namespace/name`, running every step; the failures.
pub fn destroy_pod(
    ctx: &Ctx,
    bins: &Bins,
    st: &mut LabState,
    namespace: &str,
    name: &str,
) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(pod) = st.pod(namespace, name).cloned() else {
        return errs;
    };
    if let Err(e) = stop_server(&pod) {
        errs.push(format!("pod {}: stopping the server: {e:#}", pod.key()));
    }
    match st.node(&pod.node).cloned() {
        Some(node) => match cni_for_pod(ctx, bins, &node, &pod, "DEL") {
            Ok(out) if out.ok => {}
            Ok(out) => errs.push(format!("pod {}: CNI DEL: {}", pod.key(), out.describe())),
            Err(e) => errs.push(format!("pod {}: CNI DEL: {e:#}", pod.key())),
        },
        None => errs.push(format!(
            "pod {}: node {} unknown, no CNI DEL",
            pod.key(),
            pod.node
        )),
    }
    procs::kill_netns_processes(&pod.netns);
    if let Err(e) = netns::del(&pod.netns) {
        errs.push(format!("pod {}: {e:#}", pod.key()));
    }
    let file = manifest::object_file_name("Pod", namespace, name);
    if let Err(e) = manifest::remove(&ctx.paths.manifests(), &file) {
        errs.push(format!("pod {}: {e:#}", pod.key()));
    }
    let _ = std::fs::remove_file(ctx.paths.pod_log(namespace, name));
    if !netns::exists(&pod.netns) {
        st.forget_netns(&pod.netns);
    }
    st.pods
        .retain(|p| !(p.namespace == namespace && p.name == name));
    st.uids.remove(&file);
    if let Err(e) = ctx.paths.save(st) {
        errs.push(format!("pod {}: {e:#}", pod.key()));
    }
    errs
}

/// Waits until `path` exists or `child` exits.
pub fn wait_for_socket(path: &Path, child: &mut std::process::Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        if !procs::child_running(child) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    path.exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::IpFamily;

    #[test]
    fn cni_addresses_follow_the_nodes_families() {
        let v4 = Some("10.244.1.2".to_string());
        let v6 = Some("fd00:10:244:1::2".to_string());
        let node = |f| NodeState::new(1, "t-node-1".into(), f);
        let ok = |f, ip: &Option<String>, ip6: &Option<String>| {
            check_addresses(&node(f), ip.clone(), ip6.clone(), "{}")
        };
        assert_eq!(
            ok(IpFamily::Ipv4, &v4, &None).expect("v4"),
            (v4.clone(), None)
        );
        assert_eq!(
            ok(IpFamily::Dual, &v4, &v6).expect("dual"),
            (v4.clone(), v6.clone())
        );
        assert_eq!(
            ok(IpFamily::Ipv6, &None, &v6).expect("v6"),
            (None, v6.clone())
        );
        let err = |f, ip: &Option<String>, ip6: &Option<String>| {
            ok(f, ip, ip6).expect_err("refused").to_string()
        };
        assert!(err(IpFamily::Ipv4, &None, &None).contains("no IPv4 address"));
        assert!(err(IpFamily::Dual, &v4, &None).contains("dual-stack node"));
        let e = err(IpFamily::Ipv6, &None, &None);
        assert!(e.contains("no IPv6 address on IPv6-only node"), "{e}");
        let e = err(IpFamily::Ipv6, &v4, &v6);
        assert!(
            e.contains("IPv4 address 10.244.1.2 on IPv6-only node"),
            "{e}"
        );
        assert!(err(IpFamily::Ipv4, &v4, &v6).contains("IPv4-only node"));
    }

    #[test]
    fn pod_ips_are_listed_ipv4_first() {
        let v4 = Some("10.244.1.2".to_string());
        let v6 = Some("fd00:10:244:1::2".to_string());
        assert_eq!(pod_ips(&v4, &v6), vec!["10.244.1.2", "fd00:10:244:1::2"]);
        assert_eq!(pod_ips(&None, &v6), vec!["fd00:10:244:1::2"]);
        assert!(pod_ips(&None, &None).is_empty());
    }
}
