//! `deploy/oxvs.yaml` applied to a real kube-apiserver with RBAC on, and
//! what the agent's ServiceAccount may do checked with
//! `kubectl auth can-i --as=system:serviceaccount:kube-system:oxvs-agent`.
//!
//! The apiserver (and etcd) are started with `shared/tools/k8s-local.sh up`
//! in a run directory and on ports of this test's own, and torn down with
//! `down --purge` also on failure. k8s-local.sh starts its apiserver with
//! `--authorization-mode AlwaysAllow` (every `can-i` would say yes), so the
//! test points `OXVS_K8S_CACHE` at a private directory whose
//! `bin/kube-apiserver` is a wrapper that runs the cached binary with `RBAC`
//! instead; nothing shared is modified. Before the objects are applied the
//! ServiceAccount must be refused (proof that RBAC is in force).
//!
//! Skips (prints SKIPPED, passes) unless: root, `k8s-local.sh` found
//! (`$OXVS_SHARED_TOOLS`, `<workspace>/../shared/tools`,
//! `/work/shared/tools`), a cached build (`$OXVS_K8S_CACHE`, default
//! `/var/cache/oxvs-k8s`, with `bin/kube-apiserver` and `bin/kubelet`),
//! `etcd` and `kubectl` installed. It never starts a build. With
//! `OXVS_TESTS_NO_SKIP=1` (set by `scripts/test.sh`, whose setup builds the
//! cache) a missing prerequisite fails the test instead.

mod common;
use common::{free_port, k8s_host, skip, text, K8sHost};

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use oxvs_deploy_validate::{parse_documents, Object};

const AGENT: &str = "system:serviceaccount:kube-system:oxvs-agent";

/// Why the test cannot run here, if it cannot.
fn prerequisites() -> Result<K8sHost, String> {
    k8s_host(
        &["kube-apiserver", "kubelet"],
        "k8s-local.sh build, ~10 min",
    )
}

/// A private etcd + kube-apiserver (RBAC); `down --purge` on drop.
struct ApiServer {
    tools: PathBuf,
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
    kubectl: PathBuf,
}

impl ApiServer {
    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    fn up(p: K8sHost) -> ApiServer {
        let dir = tempfile::Builder::new()
            .prefix(&format!("oxvs-deploy-rbac-{}-", std::process::id()))
            .tempdir()
            .expect("tempdir");
        // The private cache: the real kubelet (k8s-local.sh checks it is
        // there) and an apiserver wrapper that swaps AlwaysAllow for RBAC.
        let bin = dir.path().join("cache/bin");
        std::fs::create_dir_all(&bin).expect("mkdir cache/bin");
        std::os::unix::fs::symlink(p.cache.join("bin/kubelet"), bin.join("kubelet"))
            .expect("symlink kubelet");
        let real = p.cache.join("bin/kube-apiserver");
        let wrapper = format!(
            "#!/bin/bash\n# kube-apiserver with RBAC instead of AlwaysAllow (oxvs-deploy-validate)\n\
             args=()\nfor a in \"$@\"; do [[ $a == AlwaysAllow ]] && a=RBAC; args+=(\"$a\"); done\n\
             exec '{}' \"${{args[@]}}\"\n",
            real.display()
        );
        let w = bin.join("kube-apiserver");
        std::fs::write(&w, wrapper).expect("write wrapper");
        std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let env = vec![
            (
                "OXVS_K8S_CACHE",
                dir.path().join("cache").display().to_string(),
            ),
            ("OXVS_K8S_ETCD_PORT", free_port().to_string()),
            ("OXVS_K8S_ETCD_PEER_PORT", free_port().to_string()),
            ("OXVS_K8S_API_PORT", free_port().to_string()),
            ("OXVS_K8S_CONTROLLERS", "0".to_string()),
            ("OXVS_KUBECTL", p.kubectl.display().to_string()),
        ];
        let s = ApiServer {
            tools: p.tools,
            dir,
            env,
            kubectl: p.kubectl,
        };
        let out = s.script(&["up"]).output().expect("run k8s-local.sh up");
        assert!(
            out.status.success(),
            "k8s-local.sh up failed:\n{}",
            text(&out)
        );
        s
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.tools.join("k8s-local.sh"));
        cmd.args(args).arg("--run-dir").arg(self.run_dir());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(self.run_dir().join("admin.kubeconfig"))
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// `kubectl auth can-i` (all namespaces) as the agent's ServiceAccount.
    fn agent_can(&self, verb: &str, resource: &str) -> bool {
        let out = self.kubectl(&[
            "auth",
            "can-i",
            &format!("--as={AGENT}"),
            "--all-namespaces",
            verb,
            resource,
        ]);
        match String::from_utf8_lossy(&out.stdout).trim() {
            "yes" => true,
            "no" => false,
            _ => panic!("kubectl auth can-i {verb} {resource}: {}", text(&out)),
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.run_dir().join("logs/kube-apiserver.log");
            if let Ok(log) = std::fs::read_to_string(log) {
                eprintln!("--- kube-apiserver.log (tail) ---");
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        match self.script(&["down", "--purge"]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("k8s-local.sh down failed: {}", text(&o)),
            Err(e) => eprintln!("k8s-local.sh down: {e}"),
        }
    }
}

#[test]
fn the_agent_may_read_the_cluster_and_nothing_more() {
    let p = match prerequisites() {
        Ok(p) => p,
        Err(why) => return skip(&why),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../oxvs.yaml");
    let yaml = std::fs::read_to_string(&manifest).expect("read deploy/oxvs.yaml");
    // The RBAC documents alone, as the test applies them first.
    let docs = parse_documents(&yaml).unwrap_or_else(|e| panic!("{e}"));
    let rbac: Vec<String> = docs
        .iter()
        .filter(|d| {
            matches!(
                d.object,
                Object::ServiceAccount(_) | Object::ClusterRole(_) | Object::ClusterRoleBinding(_)
            )
        })
        .map(|d| serde_json::to_string(&d.value).expect("JSON"))
        .collect();
    assert_eq!(rbac.len(), 3);

    let api = ApiServer::up(p);
    assert!(
        !api.agent_can("list", "pods"),
        "the ServiceAccount may list pods before any RBAC object exists: is RBAC on?"
    );
    let rbac_file = api.dir.path().join("rbac.json");
    let list = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{}]}}",
        rbac.join(",")
    );
    std::fs::write(&rbac_file, list).expect("write rbac.json");
    let out = api.kubectl(&["apply", "-f", &rbac_file.display().to_string()]);
    assert!(out.status.success(), "apply RBAC: {}", text(&out));

    for resource in [
        "pods",
        "namespaces",
        "nodes",
        // The Service proxy's (`--proxy`).
        "services",
        "endpoints",
        "endpointslices.discovery.k8s.io",
        "networkpolicies.networking.k8s.io",
    ] {
        for verb in ["get", "list", "watch"] {
            assert!(
                api.agent_can(verb, resource),
                "{verb} {resource} is allowed"
            );
        }
    }
    for (verb, resource) in [
        ("create", "pods"),
        ("delete", "pods"),
        ("patch", "pods"),
        ("patch", "nodes"),
        ("update", "nodes"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("get", "secrets"),
        ("create", "services"),
        ("update", "endpoints"),
        ("create", "endpointslices.discovery.k8s.io"),
        ("get", "configmaps"),
    ] {
        assert!(
            !api.agent_can(verb, resource),
            "{verb} {resource} is refused"
        );
    }

    // The whole manifest, as an operator applies it: the API server's own
    // validation and defaulting of the ConfigMap and DaemonSet (no
    // controllers run here, so no pod is created).
    let out = api.kubectl(&["apply", "-f", &manifest.display().to_string()]);
    assert!(
        out.status.success(),
        "apply deploy/oxvs.yaml: {}",
        text(&out)
    );
    let out = api.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "daemonset/oxvs",
        "-o",
        "jsonpath={.spec.template.spec.priorityClassName}",
    ]);
    assert!(out.status.success(), "get daemonset: {}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "system-node-critical",
        "the DaemonSet is stored as written"
    );
}
