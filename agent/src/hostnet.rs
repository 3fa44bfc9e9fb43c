//! The host side of pod egress: forwarding on, and masquerade for pod
//! traffic that leaves the node other than through the gateway; and, for
//! the Service proxy, the NodePorts the host DNATs into the switch.
//!
//! Pod traffic to another pod (local, or remote through the tunnel) never
//! leaves through a host interface other than the gateway, so it is never
//! translated: pod-to-pod is NAT-free, as Kubernetes requires. Traffic from
//! a pod to anything outside the cluster's pod networks is routed by the
//! host out of its uplink; that is masqueraded to the node's address (one
//! `iptables -t nat` rule, marked with an `oxvs` comment), like other
//! networks do by default.
//!
//! `iptables` is run as a command (there is no netlink API for it); every
//! call is idempotent (`-C` before `-A`). Blocking: call from
//! `spawn_blocking`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use ipnet::IpNet;

/// Where the host's `/proc/sys` is, set once at start (`--proc-sys`).
///
/// A process-wide setting rather than a field of the agent's
/// configuration: it is a fact about the container the agent runs in (an
/// unprivileged container's own `/proc/sys` is read-only, so the DaemonSet
/// mounts the host's `/proc/sys/net` elsewhere), the same for every caller,
/// and set before any of them runs.
static PROC_SYS: OnceLock<PathBuf> = OnceLock::new();

/// Sets where `/proc/sys` is (default `/proc/sys`). The first call wins.
pub fn set_proc_sys(dir: PathBuf) {
    let _ = PROC_SYS.set(dir);
}

/// `/proc/sys/<rel>` under the configured root.
fn sysctl_path(rel: &str) -> String {
    let root = PROC_SYS
        .get()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "/proc/sys".into());
    format!("{}/{rel}", root.trim_end_matches('/'))
}

/// Why a host setting could not be made.
#[derive(Debug, thiserror::Error)]
pub enum HostnetError {
    #[error("cannot enable forwarding ({path}): {err}")]
    Forwarding { path: String, err: std::io::Error },
    #[error("cannot turn off ICMP redirects ({path}): {err}")]
    Redirects { path: String, err: std::io::Error },
    #[error("cannot keep the host's stack from a pod's packets ({path}): {err}")]
    Isolate { path: String, err: std::io::Error },
    #[error("'{0}' is not an interface name")]
    BadLink(String),
    #[error("cannot run iptables: {0}")]
    Spawn(std::io::Error),
    #[error("`iptables {args}` failed: {stderr}")]
    Iptables { args: String, stderr: String },
}

/// Turns IPv4 forwarding on in the caller's network namespace.
pub fn enable_forwarding() -> Result<(), HostnetError> {
    ensure_sysctl_one("net/ipv4/ip_forward")
}

/// Turns IPv6 forwarding on in the caller's network namespace (for a node
/// with an IPv6 pod CIDR; Kubernetes asks nodes for it in dual-stack).
/// Linux then stops taking router advertisements on interfaces whose
/// `accept_ra` is 1: a host that configures its own IPv6 default route by
/// SLAAC must set `accept_ra=2` on its uplink, as every dual-stack
/// Kubernetes node must.
pub fn enable_ipv6_forwarding() -> Result<(), HostnetError> {
    ensure_sysctl_one("net/ipv6/conf/all/forwarding")
}

fn ensure_sysctl_one(rel: &str) -> Result<(), HostnetError> {
    let path = sysctl_path(rel);
    if std::fs::read_to_string(&path)
        .map(|s| s.trim() == "1")
        .unwrap_or(false)
    {
        return Ok(());
    }
    std::fs::write(&path, "1\n").map_err(|err| HostnetError::Forwarding { path, err })
}

/// The settings [`isolate_host_link`] makes on a pod's host link:
/// `(path under /proc/sys, value)`.
fn isolation(link: &str) -> [(String, &'static str); 3] {
    [
        // Nothing that arrives on it is routed on.
        (format!("net/ipv4/conf/{link}/forwarding"), "0"),
        // The host answers no ARP on it, for any of its addresses.
        (format!("net/ipv4/conf/{link}/arp_ignore"), "8"),
        // No IPv6 on it at all: no link-local address (so nothing the host
        // sends there reveals its MAC), nothing received is taken.
        (format!("net/ipv6/conf/{link}/disable_ipv6"), "1"),
    ]
}

/// Keeps the host's stack from taking a pod's packets on the pod's host
/// link, when the switch does not take them: while oxvs-switchd is down
/// (restarting, crashed: its XDP program goes with it) or a port is being
/// set up, the link is an ordinary interface of the host. Without this the
/// host answers the pod's ARP for the gateway with the link's MAC, and
/// then routes (and masquerades) what the pod sends, past the switch and
/// its NetworkPolicy. With it, the pod's frames are addressed to the
/// gateway's MAC, which is not the link's, and the host drops them; the
/// link's MAC is never shown to the pod; and a frame the pod addresses
/// to it anyway is not routed. What is left: a broadcast frame carrying a
/// unicast datagram to one of the host's own addresses is still delivered
/// to a UDP socket there, while the switch is down.
///
/// Three writes under `/proc/sys` (0.1 ms); a link without IPv6 (the
/// kernel's IPv6 off) skips that one. A later change of
/// `net.ipv4.ip_forward` (or `conf/all/forwarding`) sets every interface's
/// `forwarding` again, this one's too: the agent's reconcile (on start,
/// after a switch restart) applies these again.
///
/// (A tcx ingress program that drops everything XDP passes would close the
/// broadcast case too, but the kernel waits for an RCU grace period under
/// the RTNL lock to install one: about 10 ms per pod, during which every
/// other ADD and DEL of the node waits: docs/benchmarks.md.)
pub fn isolate_host_link(link: &str) -> Result<(), HostnetError> {
    if !pod_link_name(link) {
        return Err(HostnetError::BadLink(link.to_string()));
    }
    for (rel, value) in isolation(link) {
        let path = sysctl_path(&rel);
        match std::fs::write(&path, value) {
            Ok(()) => {}
            Err(_) if no_ipv6_for(&rel) => {}
            Err(err) => return Err(HostnetError::Isolate { path, err }),
        }
    }
    Ok(())
}

/// Whether `link` may name a pod's host link under `/proc/sys/net/*/conf`:
/// an interface name the kernel takes, and not one of the directories
/// that stand for every interface.
fn pod_link_name(link: &str) -> bool {
    oxvs_netlink::valid_ifname(link) && link != "all" && link != "default"
}

/// Whether the setting `rel` is an IPv6 one on a kernel without IPv6 (no
/// `net/ipv6` at all): then there is nothing to set.
fn no_ipv6_for(rel: &str) -> bool {
    rel.starts_with("net/ipv6/") && !std::path::Path::new(&sysctl_path("net/ipv6")).exists()
}

/// Whether `link` has the settings of [`isolate_host_link`] (a missing
/// IPv6 directory counts as isolated when the kernel has no IPv6).
pub fn host_link_isolated(link: &str) -> bool {
    pod_link_name(link)
        && isolation(link).iter().all(|(rel, value)| {
            match std::fs::read_to_string(sysctl_path(rel)) {
                Ok(s) => s.trim() == *value,
                Err(_) => no_ipv6_for(rel),
            }
        })
}

/// Stops the host from sending ICMP redirects, on the gateway and for all
/// interfaces (Linux sends them when either `conf/all` or `conf/<dev>` says
/// so).
///
/// With kube-proxy, a pod's packet to a ClusterIP whose endpoint is on the
/// same node enters the host through the gateway and leaves through it
/// again (after the DNAT), so the host would answer it with a redirect
/// "go to the endpoint directly", which the pod must not follow (its
/// connection is to the ClusterIP). The pod ignores it, but each one also
/// spends the host's ICMP rate budget for that pod, and kube-proxy's
/// REJECT for a Service without endpoints then reaches the pod only a
/// second later, as a retransmitted SYN's answer. Antrea turns them off
/// on its gateway too.
pub fn disable_redirects(gateway: &str) -> Result<(), HostnetError> {
    for dev in ["all", gateway] {
        let path = sysctl_path(&format!("net/ipv4/conf/{dev}/send_redirects"));
        if std::fs::read_to_string(&path).is_ok_and(|s| s.trim() == "0") {
            continue;
        }
        std::fs::write(&path, "0\n").map_err(|err| HostnetError::Redirects { path, err })?;
    }
    Ok(())
}

fn masquerade_rule(pod_cidr: IpNet, gateway: &str) -> Vec<String> {
    [
        "POSTROUTING",
        "-s",
        &pod_cidr.to_string(),
        "!",
        "-o",
        gateway,
        "-m",
        "comment",
        "--comment",
        "oxvs: pod egress",
        "-j",
        "MASQUERADE",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The iptables command of `cidr`'s family.
fn iptables_of(cidr: IpNet) -> &'static str {
    match cidr {
        IpNet::V4(_) => "iptables",
        IpNet::V6(_) => "ip6tables",
    }
}

fn iptables_cmd(cmd: &str, op: &str, rule: &[String]) -> Result<bool, HostnetError> {
    let out = Command::new(cmd)
        .args(["-w", "5", "-t", "nat", op])
        .args(rule)
        .output()
        .map_err(HostnetError::Spawn)?;
    if out.status.success() {
        return Ok(true);
    }
    // `-C` exits 1 when the rule is absent.
    if op == "-C" && out.status.code() == Some(1) {
        return Ok(false);
    }
    Err(HostnetError::Iptables {
        args: format!("{cmd} -t nat {op} {}", rule.join(" ")),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Masquerades traffic from `pod_cidr` that leaves through an interface
/// other than `gateway`. Idempotent.
/// IPv6 pod CIDRs (usually unique local addresses) are masqueraded by
/// `ip6tables` the same way.
pub fn ensure_masquerade(pod_cidr: impl Into<IpNet>, gateway: &str) -> Result<(), HostnetError> {
    let pod_cidr = pod_cidr.into();
    let (cmd, rule) = (iptables_of(pod_cidr), masquerade_rule(pod_cidr, gateway));
    if !iptables_cmd(cmd, "-C", &rule)? {
        iptables_cmd(cmd, "-A", &rule)?;
    }
    Ok(())
}

/// Removes the rule [`ensure_masquerade`] made, if present.
pub fn remove_masquerade(pod_cidr: impl Into<IpNet>, gateway: &str) -> Result<(), HostnetError> {
    let pod_cidr = pod_cidr.into();
    let (cmd, rule) = (iptables_of(pod_cidr), masquerade_rule(pod_cidr, gateway));
    while iptables_cmd(cmd, "-C", &rule)? {
        iptables_cmd(cmd, "-D", &rule)?;
    }
    Ok(())
}

/// The `nat` chain the Service proxy DNATs NodePorts in.
pub const NODE_PORTS_CHAIN: &str = "OXVS-NODEPORTS";

/// The jump into [`NODE_PORTS_CHAIN`] from `hook` (PREROUTING: traffic
/// arriving at the node; OUTPUT: the node's own): packets to any of the
/// node's addresses but loopback ones (`127.0.0.0/8`, or `::1` for
/// `ip6tables`).
fn node_ports_jump(hook: &str, v6: bool) -> Vec<String> {
    let loopback = if v6 { "::1/128" } else { "127.0.0.0/8" };
    [
        hook,
        "-m",
        "comment",
        "--comment",
        "oxvs: Service NodePorts",
        "-m",
        "addrtype",
        "--dst-type",
        "LOCAL",
        "!",
        "-d",
        loopback,
        "-j",
        NODE_PORTS_CHAIN,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One NodePort the host sends into the switch: protocol keyword (`tcp`,
/// `udp`), port, and the Service port it belongs to (a comment).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodePort {
    pub protocol: &'static str,
    pub port: u16,
    pub service: String,
}

/// The `iptables-restore --noflush` (`ip6tables-restore` for an IPv6
/// `vip`) input that makes [`NODE_PORTS_CHAIN`] exactly `ports`, each
/// DNATed to `vip` (its port kept).
fn node_ports_restore(ports: &[NodePort], vip: std::net::IpAddr) -> String {
    let mut s = format!("*nat\n:{NODE_PORTS_CHAIN} - [0:0]\n");
    for p in ports {
        // A comment is one word of iptables-restore's line syntax when quoted;
        // Service names cannot hold a quote.
        let comment: String = p
            .service
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || "-./:_".contains(*c))
            .collect();
        s.push_str(&format!(
            "-A {NODE_PORTS_CHAIN} -p {proto} -m {proto} --dport {port} -m comment --comment \"{comment}\" -j DNAT --to-destination {vip}\n",
            proto = p.protocol,
            port = p.port,
        ));
    }
    s.push_str("COMMIT\n");
    s
}

/// Makes the host DNAT each of `ports` on every node address of `vip`'s
/// family to `vip` (which it routes into the switch), replacing the
/// chain's previous rules in one `iptables-restore` (`ip6tables-restore`
/// for IPv6), and makes sure PREROUTING and OUTPUT jump to it.
/// Idempotent.
pub fn sync_node_ports(ports: &[NodePort], vip: std::net::IpAddr) -> Result<(), HostnetError> {
    use std::io::Write as _;
    let v6 = vip.is_ipv6();
    let (restore, cmd) = match v6 {
        false => ("iptables-restore", "iptables"),
        true => ("ip6tables-restore", "ip6tables"),
    };
    let input = node_ports_restore(ports, vip);
    let mut child = Command::new(restore)
        .args(["-w", "5", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(HostnetError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(HostnetError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(HostnetError::Spawn)?;
    if !out.status.success() {
        return Err(HostnetError::Iptables {
            args: format!("{restore} --noflush ({} NodePorts)", ports.len()),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    for hook in ["PREROUTING", "OUTPUT"] {
        let rule = node_ports_jump(hook, v6);
        if !iptables_cmd(cmd, "-C", &rule)? {
            iptables_cmd(cmd, "-I", &rule)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A host link name from a record on disk is checked before it becomes
    /// a path under `/proc/sys`: nothing is written for a bad one.
    #[test]
    fn isolation_refuses_what_is_not_an_interface_name() {
        for bad in [
            "",
            "../../kernel",
            "a/b",
            "all",
            "default",
            "sixteen-bytes-xx",
            "a b",
        ] {
            assert!(
                matches!(
                    super::isolate_host_link(bad),
                    Err(super::HostnetError::BadLink(ref n)) if n == bad
                ),
                "{bad:?}"
            );
            assert!(!super::host_link_isolated(bad), "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn the_rule_names_the_cidr_and_spares_the_gateway() {
        let r = masquerade_rule("10.244.1.0/24".parse().unwrap(), "oxvs-gw0").join(" ");
        assert_eq!(
            r,
            "POSTROUTING -s 10.244.1.0/24 ! -o oxvs-gw0 -m comment --comment oxvs: pod egress -j MASQUERADE"
        );
    }

    #[test]
    fn node_ports_replace_the_chain_and_keep_the_port() {
        let ports = [
            NodePort {
                protocol: "tcp",
                port: 30080,
                service: "web/front:http \"x\"".into(),
            },
            NodePort {
                protocol: "udp",
                port: 30053,
                service: "kube-system/dns:dns".into(),
            },
        ];
        let r = node_ports_restore(&ports, "169.254.169.253".parse().unwrap());
        assert_eq!(
            r,
            "*nat\n:OXVS-NODEPORTS - [0:0]\n\
             -A OXVS-NODEPORTS -p tcp -m tcp --dport 30080 -m comment --comment \"web/front:httpx\" -j DNAT --to-destination 169.254.169.253\n\
             -A OXVS-NODEPORTS -p udp -m udp --dport 30053 -m comment --comment \"kube-system/dns:dns\" -j DNAT --to-destination 169.254.169.253\n\
             COMMIT\n"
        );
        // None: the chain is emptied (still declared, so it exists).
        assert_eq!(
            node_ports_restore(&[], "169.254.169.253".parse().unwrap()),
            "*nat\n:OXVS-NODEPORTS - [0:0]\nCOMMIT\n"
        );
        // IPv6: the same rules to the IPv6 VIP, the jump sparing ::1.
        assert!(node_ports_restore(&ports, "fc01::a9fe:a9fd".parse().unwrap())
            .contains("--dport 30080 -m comment --comment \"web/front:httpx\" -j DNAT --to-destination fc01::a9fe:a9fd\n"));
        assert!(node_ports_jump("OUTPUT", true)
            .join(" ")
            .contains("! -d ::1/128 -j OXVS-NODEPORTS"));
        assert_eq!(
            node_ports_jump("PREROUTING", false).join(" "),
            "PREROUTING -m comment --comment oxvs: Service NodePorts -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j OXVS-NODEPORTS"
        );
    }
}
