//! `deploy/oxvs.yaml` against its invariants, without a cluster.
//!
//! Every document parses as its typed Kubernetes object with no unknown
//! field; the RBAC grants exactly the read verbs the agent needs; the
//! DaemonSet runs on every node on the host network, no container
//! privileged, each with only its capabilities ([`CAPABILITIES`]), no
//! privilege escalation, a read-only root filesystem, the ServiceAccount
//! token in the agent only; it mounts every host path its commands use
//! and no other; commands name workspace binaries and
//! only flags those binaries accept (checked against the built binaries'
//! `--help` in `target/<profile>/`, skipped with a message if absent); the
//! init container's script is run for real with its host paths mapped into
//! a temporary directory; the agent's readiness probe is run against the
//! built `oxvs-cni` and must be a well-formed STATUS call.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use oxvs_deploy_validate::{
    built_binaries_dir, env_refs, flag_values, flags_of, help_flags, parse_documents, Document,
    Object,
};
use serde_json::Value;

/// The workspace's binaries a manifest may run.
const BINARIES: [&str; 4] = ["oxvs-switchd", "oxvs-agent", "oxvs-cni", "oxvsctl"];
/// Where the image puts them (deploy/Dockerfile).
const IMAGE_BIN_DIR: &str = "/usr/local/bin";

/// The capabilities of each container, exactly (deploy/README.md,
/// "Privileges", says why each one, and what fails without it).
const CAPABILITIES: [(&str, &[&str]); 3] = [
    ("install-cni", &[]),
    (
        "oxvs-switchd",
        &["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "IPC_LOCK"],
    ),
    ("oxvs-agent", &["NET_ADMIN", "SYS_ADMIN"]),
];

/// Where in-cluster clients find the ServiceAccount token.
const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn manifest_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../oxvs.yaml")
}

fn documents() -> Vec<Document> {
    let path = manifest_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn daemonset() -> DaemonSet {
    documents()
        .into_iter()
        .find_map(|d| match d.object {
            Object::DaemonSet(ds) => Some(*ds),
            _ => None,
        })
        .expect("a DaemonSet")
}

fn pod_spec(ds: &DaemonSet) -> PodSpec {
    ds.spec
        .template
        .spec
        .clone()
        .expect("DaemonSet spec.template.spec")
}

fn config_map() -> ConfigMap {
    documents()
        .into_iter()
        .find_map(|d| match d.object {
            Object::ConfigMap(c) => Some(*c),
            _ => None,
        })
        .expect("a ConfigMap")
}

fn all_containers(spec: &PodSpec) -> Vec<Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .cloned()
        .collect()
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// command + args, as the kubelet runs them.
fn argv(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

/// Every command line the pod runs: containers' and exec probes'.
fn command_lines(spec: &PodSpec) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for c in all_containers(spec) {
        out.push((format!("container {}", c.name), argv(&c)));
        for (what, probe) in [
            ("readinessProbe", &c.readiness_probe),
            ("livenessProbe", &c.liveness_probe),
            ("startupProbe", &c.startup_probe),
        ] {
            if let Some(cmd) = probe
                .as_ref()
                .and_then(|p| p.exec.as_ref())
                .and_then(|e| e.command.clone())
            {
                out.push((format!("container {} {what}", c.name), cmd));
            }
        }
    }
    out
}

/// The workspace binaries a shell script runs (by name or as
/// /usr/local/bin/NAME).
fn binaries_in_script(script: &str) -> BTreeSet<String> {
    script
        .split(|ch: char| ch.is_whitespace() || ch == '|' || ch == ';' || ch == '\'')
        .filter_map(|w| {
            let w = w
                .strip_prefix(IMAGE_BIN_DIR)
                .map_or(w, |r| r.trim_start_matches('/'));
            w.starts_with("oxvs").then(|| w.to_string())
        })
        .collect()
}

fn is_shell(argv: &[String]) -> Option<&str> {
    match argv {
        [sh, c, script] if (sh == "/bin/sh" || sh == "sh") && c == "-c" => Some(script),
        _ => None,
    }
}

#[test]
fn every_document_is_a_typed_object_without_unknown_fields() {
    let docs = documents();
    let kinds: Vec<(&str, &str)> = docs
        .iter()
        .map(|d| (d.kind.as_str(), d.name.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("ServiceAccount", "oxvs-agent"),
            ("ClusterRole", "oxvs-agent"),
            ("ClusterRoleBinding", "oxvs-agent"),
            ("ConfigMap", "oxvs-config"),
            ("DaemonSet", "oxvs"),
        ]
    );
    for d in &docs {
        let ns = d
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str);
        let cluster_scoped = matches!(d.kind.as_str(), "ClusterRole" | "ClusterRoleBinding");
        if cluster_scoped {
            assert_eq!(ns, None, "{} {} is cluster-scoped", d.kind, d.name);
        } else {
            assert_eq!(ns, Some("kube-system"), "{} {}", d.kind, d.name);
        }
        assert_eq!(
            d.value
                .pointer("/metadata/labels/app.kubernetes.io~1name")
                .and_then(Value::as_str),
            Some("oxvs"),
            "{} {} is labelled app.kubernetes.io/name=oxvs",
            d.kind,
            d.name
        );
    }
}

#[test]
fn cluster_role_grants_exactly_the_read_verbs_the_agent_needs() {
    let role: ClusterRole = documents()
        .into_iter()
        .find_map(|d| match d.object {
            Object::ClusterRole(r) => Some(*r),
            _ => None,
        })
        .expect("a ClusterRole");
    assert!(role.aggregation_rule.is_none());
    let mut granted = BTreeSet::new();
    for rule in role.rules.iter().flatten() {
        assert!(rule.resource_names.is_none(), "{rule:?}");
        assert!(rule.non_resource_urls.is_none(), "{rule:?}");
        for g in rule.api_groups.iter().flatten() {
            for r in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    assert_ne!(v, "*", "wildcard verb in {rule:?}");
                    granted.insert((g.clone(), r.clone(), v.clone()));
                }
            }
        }
    }
    let mut expected = BTreeSet::new();
    for (g, r) in [
        ("", "pods"),
        ("", "namespaces"),
        ("", "nodes"),
        // The Service proxy's (`--proxy`).
        ("", "services"),
        ("", "endpoints"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "networkpolicies"),
    ] {
        for v in ["get", "list", "watch"] {
            expected.insert((g.to_string(), r.to_string(), v.to_string()));
        }
    }
    assert_eq!(granted, expected);
}

#[test]
fn the_binding_gives_the_role_to_the_daemonsets_service_account() {
    let docs = documents();
    let binding: ClusterRoleBinding = docs
        .iter()
        .find_map(|d| match &d.object {
            Object::ClusterRoleBinding(b) => Some((**b).clone()),
            _ => None,
        })
        .expect("a ClusterRoleBinding");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        binding.role_ref.api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );
    assert_eq!(binding.role_ref.name, "oxvs-agent");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].name, "oxvs-agent");
    assert_eq!(subjects[0].namespace.as_deref(), Some("kube-system"));
    let spec = pod_spec(&daemonset());
    assert_eq!(spec.service_account_name.as_deref(), Some("oxvs-agent"));
}

/// Only the agent calls the API server: the pod does not mount the token
/// into every container; the agent mounts it (a projected token, the CA
/// and the namespace, as the kubelet would) where in-cluster clients look.
#[test]
fn only_the_agent_gets_the_serviceaccount_token() {
    let spec = pod_spec(&daemonset());
    assert_eq!(spec.automount_service_account_token, Some(false));
    let vol = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.projected.as_ref().is_some_and(|p| {
                p.sources
                    .iter()
                    .flatten()
                    .any(|s| s.service_account_token.is_some())
            })
        })
        .expect("a projected ServiceAccount token volume");
    let paths: BTreeSet<String> = vol
        .projected
        .iter()
        .flat_map(|p| p.sources.iter().flatten())
        .flat_map(|s| {
            let mut v = Vec::new();
            if let Some(t) = &s.service_account_token {
                v.push(t.path.clone());
            }
            for i in s.config_map.iter().flat_map(|c| c.items.iter().flatten()) {
                v.push(i.path.clone());
            }
            for i in s.downward_api.iter().flat_map(|d| d.items.iter().flatten()) {
                v.push(i.path.clone());
            }
            v
        })
        .collect();
    assert_eq!(
        paths,
        ["ca.crt", "namespace", "token"].map(String::from).into(),
        "what an in-cluster client reads"
    );
    for c in all_containers(&spec) {
        let mount = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == vol.name);
        match c.name.as_str() {
            "oxvs-agent" => {
                let m = mount.expect("the agent mounts the token");
                assert_eq!(m.mount_path, TOKEN_DIR);
                assert_eq!(m.read_only, Some(true));
            }
            other => assert!(mount.is_none(), "{other} mounts the token"),
        }
    }
}

/// No container is privileged or can gain privileges; each has exactly its
/// capabilities (all others dropped) and a read-only root filesystem; the
/// runtime's default seccomp filter applies.
#[test]
fn each_container_has_only_the_capabilities_it_needs() {
    let spec = pod_spec(&daemonset());
    let seccomp = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.as_str());
    assert_eq!(seccomp, Some("RuntimeDefault"));
    let containers = all_containers(&spec);
    assert_eq!(containers.len(), CAPABILITIES.len());
    for c in containers {
        let want = CAPABILITIES
            .iter()
            .find(|(n, _)| *n == c.name)
            .map(|(_, caps)| *caps)
            .unwrap_or_else(|| panic!("no capability list for container {}", c.name));
        let sc = c
            .security_context
            .as_ref()
            .unwrap_or_else(|| panic!("{} has no securityContext", c.name));
        assert_ne!(sc.privileged, Some(true), "{} is privileged", c.name);
        assert_eq!(
            sc.allow_privilege_escalation,
            Some(false),
            "{}: allowPrivilegeEscalation",
            c.name
        );
        assert_eq!(
            sc.read_only_root_filesystem,
            Some(true),
            "{}: readOnlyRootFilesystem",
            c.name
        );
        assert_ne!(sc.proc_mount.as_deref(), Some("Unmasked"), "{}", c.name);
        let caps = sc.capabilities.as_ref();
        let drop: Vec<&str> = caps
            .and_then(|k| k.drop.as_ref())
            .map(|d| d.iter().map(String::as_str).collect())
            .unwrap_or_default();
        assert_eq!(drop, ["ALL"], "{} drops every capability first", c.name);
        let mut add: Vec<&str> = caps
            .and_then(|k| k.add.as_ref())
            .map(|a| a.iter().map(String::as_str).collect())
            .unwrap_or_default();
        add.sort_unstable();
        let mut want = want.to_vec();
        want.sort_unstable();
        assert_eq!(add, want, "{}'s capabilities", c.name);
    }
}

#[test]
fn the_conflist_is_oxvs_then_portmap() {
    let cm = config_map();
    let data = cm.data.unwrap_or_default();
    let text = data.get("10-oxvs.conflist").expect("key 10-oxvs.conflist");
    let conf: Value = serde_json::from_str(text).expect("the conflist is JSON");
    assert_eq!(conf["cniVersion"], "1.0.0");
    assert_eq!(conf["name"], "oxvs");
    let plugins = conf["plugins"].as_array().expect("plugins");
    assert_eq!(plugins.len(), 2);
    assert_eq!(plugins[0], serde_json::json!({"type": "oxvs"}));
    assert_eq!(
        plugins[1],
        serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}})
    );
}

#[test]
fn the_agent_settings_are_valid_flag_values() {
    let data = config_map().data.unwrap_or_default();
    let gw = data.get("gateway").expect("gateway");
    // switchd: at most 13 characters (NAME-p must fit in IFNAMSIZ).
    assert!(
        !gw.is_empty()
            && gw.len() <= 13
            && gw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
        "gateway {gw:?}"
    );
    let tun = data.get("tunnel").expect("tunnel");
    assert!(!tun.is_empty() && tun.len() <= 15, "tunnel {tun:?}");
    let resync: u64 = data
        .get("resync-interval")
        .and_then(|s| s.parse().ok())
        .expect("resync-interval is a number of seconds");
    assert!(resync >= 1);
    assert!(!data.get("log-level").expect("log-level").is_empty());
}

#[test]
fn the_daemonset_runs_on_every_node_on_the_host_network() {
    let ds = daemonset();
    let dspec = &ds.spec;
    let selector = dspec.selector.match_labels.clone().unwrap_or_default();
    let labels = dspec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert!(!selector.is_empty());
    for (k, v) in &selector {
        assert_eq!(labels.get(k), Some(v), "template labels match the selector");
    }
    let strategy = dspec.update_strategy.as_ref().expect("updateStrategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));

    let spec = pod_spec(&ds);
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(spec.termination_grace_period_seconds.is_some_and(|s| s > 0));
    // A toleration with operator Exists and neither key nor effect
    // tolerates every taint (control-plane NoSchedule, NoExecute, ...).
    let tolerates_all = spec.tolerations.iter().flatten().any(|t| {
        t.operator.as_deref() == Some("Exists")
            && t.key.is_none()
            && t.effect.is_none()
            && t.toleration_seconds.is_none()
    });
    assert!(tolerates_all, "{:?}", spec.tolerations);
    assert!(spec.node_selector.is_none() && spec.affinity.is_none());

    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["oxvs-switchd", "oxvs-agent"]);
    let init: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["install-cni"]);
    for c in all_containers(&spec) {
        assert!(c.image.as_deref().is_some_and(|i| !i.is_empty()));
    }
    for c in &spec.containers {
        let requests = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone())
            .unwrap_or_default();
        assert!(
            requests.contains_key("cpu") && requests.contains_key("memory"),
            "{} has cpu and memory requests",
            c.name
        );
        assert!(
            c.readiness_probe
                .as_ref()
                .and_then(|p| p.exec.as_ref())
                .is_some(),
            "{} has an exec readiness probe",
            c.name
        );
    }
}

/// volume name -> host path (hostPath volumes only).
fn host_paths(spec: &PodSpec) -> BTreeMap<String, String> {
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (v.name.clone(), h.path.clone()))
        })
        .collect()
}

/// mount path -> volume name, for one container.
fn mounts(c: &Container) -> BTreeMap<String, String> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.clone(), m.name.clone()))
        .collect()
}

#[test]
fn every_mount_has_a_volume_and_every_volume_is_mounted() {
    let spec = pod_spec(&daemonset());
    let volumes: BTreeSet<String> = spec
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    let mut used = BTreeSet::new();
    for c in all_containers(&spec) {
        for m in c.volume_mounts.iter().flatten() {
            assert!(
                volumes.contains(&m.name),
                "container {} mounts {} from volume {:?}, which does not exist",
                c.name,
                m.mount_path,
                m.name
            );
            used.insert(m.name.clone());
        }
    }
    assert_eq!(used, volumes, "volumes nobody mounts");
    // Exactly these host paths (deploy/README.md, "Privileges", says who
    // needs each): not the host's /proc (nothing reads it), not
    // /run/xtables.lock (iptables-nft takes no lock).
    let hosts: BTreeSet<String> = host_paths(&spec).into_values().collect();
    let want: BTreeSet<String> = [
        "/run/oxvs",
        "/var/lib/oxvs",
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/run/netns",
        "/proc/sys/net",
        "/sys/fs/bpf",
    ]
    .map(String::from)
    .into();
    assert_eq!(hosts, want, "the host paths");
    // Each where it is needed: the switch has /run/oxvs and bpffs only.
    let switchd = container(&spec, "oxvs-switchd");
    let sw_hosts: BTreeSet<String> = mounts(switchd)
        .into_values()
        .filter_map(|v| host_paths(&spec).get(&v).cloned())
        .collect();
    assert_eq!(
        sw_hosts,
        ["/run/oxvs", "/sys/fs/bpf"].map(String::from).into(),
        "switchd's host paths"
    );
    // The agent writes sysctls through the mounted /proc/sys/net.
    let agent = container(&spec, "oxvs-agent");
    let a = argv(agent);
    let at = a
        .iter()
        .position(|x| x == "--proc-sys")
        .expect("--proc-sys");
    let dir = a.get(at + 1).expect("--proc-sys DIR");
    assert_eq!(
        host_path_of(&spec, agent, &format!("{dir}/net")).as_deref(),
        Some("/proc/sys/net"),
        "--proc-sys {dir}: DIR/net is the host's /proc/sys/net"
    );
}

/// Resolves a path seen inside container `c` to the host path it is on,
/// if it is on a hostPath mount.
fn host_path_of(spec: &PodSpec, c: &Container, path: &str) -> Option<String> {
    let hosts = host_paths(spec);
    mounts(c)
        .into_iter()
        .filter(|(mp, _)| path == mp || path.starts_with(&format!("{mp}/")))
        .max_by_key(|(mp, _)| mp.len())
        .and_then(|(mp, vol)| hosts.get(&vol).map(|h| format!("{h}{}", &path[mp.len()..])))
}

#[test]
fn sockets_and_state_are_on_host_paths_shared_by_both_daemons() {
    let spec = pod_spec(&daemonset());
    let switchd = container(&spec, "oxvs-switchd");
    let agent = container(&spec, "oxvs-agent");
    let (sw, ag) = (argv(switchd), argv(agent));
    let switch_sock = flag_values(&sw, "--socket").expect("switchd --socket");
    assert_eq!(
        flag_values(&ag, "--switchd-socket").as_deref(),
        Some(switch_sock.as_str())
    );
    let on_host_sw = host_path_of(&spec, switchd, &switch_sock);
    assert!(
        on_host_sw.is_some(),
        "{switch_sock} is on a hostPath in switchd"
    );
    assert_eq!(on_host_sw, host_path_of(&spec, agent, &switch_sock));
    assert_eq!(
        flag_values(&sw, "--gateway"),
        flag_values(&ag, "--gateway"),
        "switchd and the agent agree on the gateway"
    );
    // The plugin runs on the host (kubelet -> runtime -> /opt/cni/bin/oxvs)
    // and finds the agent at its default socket.
    let cni_sock = flag_values(&ag, "--cni-socket").expect("agent --cni-socket");
    assert_eq!(
        host_path_of(&spec, agent, &cni_sock).as_deref(),
        Some("/run/oxvs/cni.sock")
    );
    let api_sock = flag_values(&ag, "--api-socket").expect("agent --api-socket");
    assert_eq!(
        host_path_of(&spec, agent, &api_sock).as_deref(),
        Some("/run/oxvs/agent.sock"),
        "oxvsctl traceflow's default agent socket, on the host"
    );
    let state = flag_values(&ag, "--state-dir").expect("agent --state-dir");
    assert_eq!(
        host_path_of(&spec, agent, &state).as_deref(),
        Some("/var/lib/oxvs")
    );
    // Pod netns appear after the agent started: they must propagate in.
    let netns = agent
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/var/run/netns")
        .expect("agent mounts /var/run/netns");
    assert_eq!(netns.mount_propagation.as_deref(), Some("HostToContainer"));
    // The probes use the same sockets.
    let probe = |c: &Container| -> Vec<String> {
        c.readiness_probe
            .as_ref()
            .and_then(|p| p.exec.as_ref())
            .and_then(|e| e.command.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        flag_values(&probe(switchd), "--socket").as_deref(),
        Some(switch_sock.as_str())
    );
    let agent_probe = probe(agent).join(" ");
    assert!(
        agent_probe.contains(&format!("\"agentSocket\":\"{cni_sock}\"")),
        "{agent_probe}"
    );
    assert!(agent_probe.contains("CNI_COMMAND=STATUS"), "{agent_probe}");
}

#[test]
fn commands_run_workspace_binaries_with_defined_variables() {
    let spec = pod_spec(&daemonset());
    for c in all_containers(&spec) {
        let defined: BTreeSet<String> = c.env.iter().flatten().map(|e| e.name.clone()).collect();
        for e in c.env.iter().flatten() {
            let from = e.value_from.as_ref();
            if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                assert_eq!(r.name, "oxvs-config");
                let data = config_map().data.unwrap_or_default();
                assert!(
                    data.contains_key(&r.key),
                    "ConfigMap key {} of {}",
                    r.key,
                    e.name
                );
            }
            if let Some(f) = from.and_then(|f| f.field_ref.as_ref()) {
                assert_eq!(f.field_path, "spec.nodeName", "{}", e.name);
            }
        }
        for arg in argv(&c) {
            for r in env_refs(&arg) {
                assert!(
                    defined.contains(&r),
                    "container {}: $({r}) is not in its env (Kubernetes would pass it literally)",
                    c.name
                );
            }
        }
    }
    let agent = argv(container(&spec, "oxvs-agent"));
    assert_eq!(
        flag_values(&agent, "--node-name").as_deref(),
        Some("$(NODE_NAME)")
    );
    for (what, line) in command_lines(&spec) {
        let bins: BTreeSet<String> = match is_shell(&line) {
            Some(script) => binaries_in_script(script),
            None => line.first().cloned().into_iter().collect(),
        };
        assert!(!bins.is_empty(), "{what} runs no oxvs binary: {line:?}");
        for b in bins {
            assert!(
                BINARIES.contains(&b.as_str()),
                "{what} runs {b:?}, not a workspace binary ({BINARIES:?})"
            );
        }
    }
}

/// The built binaries' directory, or None (with a message) when one is missing.
fn built() -> Option<PathBuf> {
    let dir = built_binaries_dir()?;
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if missing.is_empty() {
        Some(dir)
    } else {
        oxvs_testutil::skip_or_fail(format!(
            "{missing:?} not built in {} (cargo build --workspace with this profile)",
            dir.display()
        ));
        None
    }
}

fn help(bin: &Path, sub: &[&str]) -> String {
    let out = Command::new(bin)
        .args(sub)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} {sub:?} --help: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_flag_is_one_the_binary_accepts() {
    let Some(dir) = built() else { return };
    let spec = pod_spec(&daemonset());
    let mut checked = 0;
    for (what, line) in command_lines(&spec) {
        if is_shell(&line).is_some() {
            continue; // scripts: run by the tests below
        }
        let bin = line[0].as_str();
        let args = &line[1..];
        let mut text = help(&dir.join(bin), &[]);
        // oxvsctl: global flags, then a subcommand with its own flags.
        if bin == "oxvsctl" {
            let name = subcommand(args).expect("an oxvsctl subcommand");
            assert!(
                text.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{name} "))),
                "{what}: oxvsctl has no subcommand {name}"
            );
            text.push_str(&help(&dir.join(bin), &[name]));
        }
        let known = help_flags(&text);
        for f in flags_of(args) {
            assert!(
                known.contains(&f),
                "{what}: {bin} has no flag {f} (its --help lists {known:?})"
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} flags checked");
}

/// The first argument that is neither a flag nor a flag's value
/// (`--socket PATH show` -> `show`).
fn subcommand(args: &[String]) -> Option<&str> {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if !a.starts_with("--") {
            return Some(a);
        }
        i += if a.contains('=') { 1 } else { 2 };
    }
    None
}

/// Copies `s`, mapping every container path in `map` (longest first) to
/// a directory of the test.
fn remap(s: &str, map: &[(String, PathBuf)]) -> String {
    let mut out = s.to_string();
    let mut map = map.to_vec();
    map.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    for (from, to) in map {
        out = out.replace(&from, &to.display().to_string());
    }
    out
}

#[test]
fn the_init_container_installs_plugin_and_conflist_atomically() {
    let spec = pod_spec(&daemonset());
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "install-cni")
        .expect("init container install-cni");
    let line = argv(init);
    let script = is_shell(&line).expect("install-cni runs /bin/sh -c SCRIPT");
    assert!(
        script.contains("set -eu"),
        "the script stops at the first error"
    );
    let hosts = host_paths(&spec);
    let tmp = tempfile::tempdir().expect("tempdir");
    let cm = config_map().data.unwrap_or_default();
    // Each mount of the init container becomes a directory of the test.
    let mut map = Vec::new();
    for m in init.volume_mounts.iter().flatten() {
        let dir = tmp.path().join(&m.name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        if !hosts.contains_key(&m.name) {
            // The ConfigMap volume: one file per key.
            for (k, v) in &cm {
                std::fs::write(dir.join(k), v).expect("write config file");
            }
        }
        map.push((m.mount_path.clone(), dir));
    }
    // The image's binary: the built plugin, or a stand-in.
    let image_bin = tmp.path().join("image-bin");
    std::fs::create_dir_all(&image_bin).expect("mkdir");
    let plugin_bytes = built_binaries_dir()
        .map(|d| d.join("oxvs-cni"))
        .and_then(|p| std::fs::read(p).ok())
        .unwrap_or_else(|| b"#!/bin/sh\nexit 0\n".to_vec());
    std::fs::write(image_bin.join("oxvs-cni"), &plugin_bytes).expect("write plugin");
    map.push((IMAGE_BIN_DIR.to_string(), image_bin));
    let local = remap(script, &map);
    for l in local
        .lines()
        .filter(|l| !l.trim_start().starts_with("echo "))
    {
        assert!(
            !l.contains(" /host/") && !l.contains(" /etc/") && !l.contains(" /usr/"),
            "the script uses a path outside its mounts: {l}"
        );
    }
    for round in 0..2 {
        // Twice: an init container re-runs on every pod restart.
        let out = Command::new("/bin/sh")
            .args(["-c", &local])
            .output()
            .expect("run /bin/sh");
        assert!(
            out.status.success(),
            "round {round}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir_of = |host: &str| {
        let vol = hosts
            .iter()
            .find(|(_, h)| h.as_str() == host)
            .map(|(v, _)| v.clone())
            .unwrap_or_else(|| panic!("no hostPath {host}"));
        tmp.path().join(vol)
    };
    let bin_dir = dir_of("/opt/cni/bin");
    let installed = std::fs::read(bin_dir.join("oxvs")).expect("/opt/cni/bin/oxvs installed");
    assert_eq!(installed, plugin_bytes);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(bin_dir.join("oxvs"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let conf_dir = dir_of("/etc/cni/net.d");
    let conf = std::fs::read_to_string(conf_dir.join("10-oxvs.conflist")).expect("conflist");
    let conf: Value = serde_json::from_str(&conf).expect("installed conflist is JSON");
    assert_eq!(conf["plugins"][0]["type"], "oxvs");
    // Nothing but the final names is left behind.
    for (dir, name) in [(&bin_dir, "oxvs"), (&conf_dir, "10-oxvs.conflist")] {
        let names: Vec<String> = std::fs::read_dir(dir)
            .expect("readdir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [name], "{}", dir.display());
    }
    // Atomic: every write goes to a temporary name renamed into place in
    // the same directory.
    for target in [
        "/host/opt/cni/bin/oxvs",
        "/host/etc/cni/net.d/10-oxvs.conflist",
    ] {
        let mv = script
            .lines()
            .find(|l| l.trim_start().starts_with("mv ") && l.trim_end().ends_with(target))
            .unwrap_or_else(|| panic!("no `mv TEMP {target}`"));
        let parent = target.rsplit_once('/').map(|(p, _)| p).unwrap_or_default();
        assert!(
            mv.contains(&format!("{parent}/.")),
            "{mv}: temp in the same directory"
        );
        assert!(
            !script.lines().any(|l| l.trim_start().starts_with("cp ")
                && l.contains(&format!("{target} "))
                || l.trim_start().starts_with("cp ") && l.trim_end().ends_with(target)),
            "{target} is written directly"
        );
    }
}

#[test]
fn the_agent_readiness_probe_is_a_well_formed_status_call() {
    let Some(dir) = built() else { return };
    let spec = pod_spec(&daemonset());
    let agent = container(&spec, "oxvs-agent");
    let cmd = agent
        .readiness_probe
        .as_ref()
        .and_then(|p| p.exec.as_ref())
        .and_then(|e| e.command.clone())
        .expect("exec probe");
    let script = is_shell(&cmd).expect("the probe is /bin/sh -c SCRIPT");
    let tmp = tempfile::tempdir().expect("tempdir");
    let sock = tmp.path().join("cni.sock");
    let local = script.replace("/run/oxvs/cni.sock", &sock.display().to_string());
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // No agent: not ready, and the plugin says why with a STATUS code
    // (50: not available), which proves the call itself (env, config,
    // version) was accepted: a malformed one gets 1, 4, 6 or 7.
    let out = Command::new("/bin/sh")
        .args(["-c", &local])
        .env_clear()
        .env("PATH", &path)
        .output()
        .expect("run the probe");
    assert!(!out.status.success(), "the probe passes with no agent");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "probe output is not a CNI error ({e}): {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(err["code"], 50, "{err}");
    let msg = err["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&sock.display().to_string()), "{err}");
}
