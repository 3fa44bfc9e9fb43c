//! Open vSwitch userspace on the `virtual-vxlan` topology: two private
//! OVS instances, one per lab node.
//!
//! ```text
//!  netns gen (eth0) -- pod port
//!   [node A: ovs-vswitchd A + ovsdb-server A
//!      br-int (netdev): pod afxdp port 1, vxlan port 10 (remote_ip=flow, key=flow)
//!      br-phy (netdev): afxdp port on ul0; 192.0.2.1/24 on br-phy's internal port]
//!        -- underlay veth ul0 <-> ul0 --
//!   [node B: the same with 192.0.2.2/24]  -- pod port -- netns sink (eth0)
//! ```
//!
//! The topology is the one oxvs runs on ([`super::vxlan_nodes`]: same
//! namespaces, veths and underlay addresses) and `br-int` gets the same
//! flow files ([`super::VXLAN_NODE_A_FLOWS`], `..._B_FLOWS`) with the same
//! OpenFlow port numbers (`ofport_request`). The difference is where the
//! tunnel goes out: oxvs sends through the node's kernel UDP socket on
//! `ul0`, OVS's userspace tunnel (`tnl_push`/`tnl_pop`) needs the
//! underlay address on an OVS bridge, so `ul0` is an `afxdp` port of
//! `br-phy` and the node's address sits on `br-phy`'s internal (tap)
//! interface, where `ovs-vswitchd`'s route table picks it up. The peer's
//! `br-phy` MAC is set as a static tunnel neighbour (`tnl/neigh/set`), so
//! no ARP is needed before the first frame.
//!
//! Each instance is private: its own database (`ovsdb-tool create`),
//! `ovsdb-server` and `ovs-vswitchd`, both run in the foreground under
//! `ip netns exec NODE` with their pidfiles, control sockets, database
//! socket and logs in a directory of the lab (`OVS_RUNDIR`, `OVS_DBDIR`,
//! `OVS_LOGDIR` point there too, so the bridges' `mgmt` sockets land
//! there); the system's OVS instance (root namespace, `/var/run/openvswitch`)
//! is never talked to. With PMD ports and at least two CPUs, node A's PMD
//! thread is pinned to core 0 and node B's to core 1 (`pmd-cpu-mask`;
//! left to OVS both would take the same core and time-share it).
//!
//! Before measuring, `ofproto/trace` on each node checks the three steps
//! (pod -> `tnl_push` to the peer, underlay VXLAN -> `tnl_pop`, tunnel
//! VNI 100 -> the pod's port); a failure names the node and the step.
//!
//! Cleanup: the processes are [`Proc`]s (SIGTERM, then SIGKILL), stopped
//! before the lab (namespaces with every link, the private directories)
//! is removed; on errors the locals unwind in that order too.
//! Concurrency: none (called from the main thread).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use super::{
    afxdp_mode_in_log, exec_pid, must, run, sleep, trace_text_delivers, vxlan_nodes, Proc, Running,
    Virtual, VxlanNodes, SIMPLE_FLOWS, VXLAN_NODE_A_FLOWS, VXLAN_NODE_B_FLOWS, VXLAN_UNDERLAY,
};
use crate::xbench::pipeline::Plan;

/// The OVS database schema (`$OVS_PKGDATADIR/vswitch.ovsschema`).
fn schema() -> PathBuf {
    let dir =
        std::env::var("OVS_PKGDATADIR").unwrap_or_else(|_| "/usr/share/openvswitch".to_owned());
    Path::new(&dir).join("vswitch.ovsschema")
}

/// Why the OVS side of `virtual-vxlan` cannot run here, or None.
pub fn ovs_vxlan_unavailable() -> Option<String> {
    for tool in [
        "ovs-vswitchd",
        "ovsdb-server",
        "ovsdb-tool",
        "ovs-vsctl",
        "ovs-ofctl",
        "ovs-appctl",
    ] {
        if run(&[tool, "--version"]).map_or(true, |o| !o.status.success()) {
            return Some(format!("Open vSwitch is not installed (no working {tool})"));
        }
    }
    let s = schema();
    if !s.exists() {
        return Some(format!("the OVS schema {} does not exist", s.display()));
    }
    None
}

/// One private OVS instance in a node namespace.
struct Node {
    /// `A` or `B`, for messages.
    name: &'static str,
    ns: String,
    dir: PathBuf,
    ip: &'static str,
    peer_ip: &'static str,
    /// The pod port's host end.
    pod: String,
}

impl Node {
    fn path(&self, f: &str) -> String {
        self.dir.join(f).to_string_lossy().into_owned()
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let d = self.dir.to_string_lossy().into_owned();
        vec![
            ("OVS_RUNDIR", d.clone()),
            ("OVS_DBDIR", d.clone()),
            ("OVS_LOGDIR", d),
        ]
    }

    fn vsctl(&self, args: &[&str]) -> Result<String> {
        let db = format!("--db=unix:{}", self.path("db.sock"));
        let mut v = vec!["ovs-vsctl", &db, "--timeout=10"];
        v.extend_from_slice(args);
        must(&v).with_context(|| format!("OVS node {}", self.name))
    }

    fn appctl(&self, args: &[&str]) -> Result<String> {
        let t = self.path("ovs-vswitchd.ctl");
        let mut v = vec!["ovs-appctl", "-t", &t];
        v.extend_from_slice(args);
        must(&v).with_context(|| format!("OVS node {}", self.name))
    }

    /// Spawns `args` under `ip netns exec` with the private environment.
    fn spawn(&self, args: &[&str], what: &str) -> Result<Proc> {
        let mut v = vec!["ip", "netns", "exec", &self.ns];
        v.extend_from_slice(args);
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Proc::spawn_env(&v, &env, &format!("{what} (node {})", self.name), true)
    }

    /// Waits until `ready` succeeds, failing if `p` exits first.
    fn wait(&self, p: &mut Proc, what: &str, ready: &dyn Fn() -> bool) -> Result<()> {
        let end = Instant::now() + Duration::from_secs(15);
        while !ready() {
            if let Some(err) = p.exited() {
                bail!(
                    "OVS node {}: {what} exited: {} (log in {})",
                    self.name,
                    err.trim(),
                    self.dir.display()
                );
            }
            if Instant::now() > end {
                bail!("OVS node {}: {what} did not become ready", self.name);
            }
            sleep(Duration::from_millis(100))?;
        }
        Ok(())
    }

    /// An interface's `ofport` once OVS opened it; fails with its error.
    fn ofport(&self, ifname: &str) -> Result<u32> {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let err = self.vsctl(&["get", "interface", ifname, "error"])?;
            let ofp = self.vsctl(&["get", "interface", ifname, "ofport"])?;
            let ofp = ofp.trim();
            if err.trim() != "[]" || (ofp != "[]" && ofp != "-1") || Instant::now() > end {
                if err.trim() != "[]" || ofp == "-1" || ofp == "[]" {
                    bail!(
                        "OVS node {}: cannot open {ifname}: ofport {ofp}, error {}",
                        self.name,
                        err.trim()
                    );
                }
                return ofp
                    .parse()
                    .with_context(|| format!("ofport of {ifname} on node {}", self.name));
            }
            sleep(Duration::from_millis(100))?;
        }
    }
}

/// The MAC address of `ifname` in namespace `ns`.
fn mac_in(ns: &str, ifname: &str) -> Result<String> {
    let j = must(&["ip", "-n", ns, "-j", "link", "show", "dev", ifname])?;
    let v: Value = serde_json::from_str(&j).context("ip -j link output")?;
    v[0]["address"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("{ifname} in {ns} has no MAC address: {j}"))
}

/// The datapath port number of `ifname` from `dpif/show`
/// (`    NAME OFPORT/ODPPORT: (TYPE...)`).
fn odp_port(dpif_show: &str, ifname: &str) -> Option<u32> {
    dpif_show.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(ifname)?.strip_prefix(' ')?;
        let (ports, _) = rest.split_once(':')?;
        ports.split_once('/')?.1.trim().parse().ok()
    })
}

/// The `Datapath actions:` line of an `ofproto/trace` answer.
fn dp_actions(trace: &str) -> &str {
    trace
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Datapath actions:"))
        .unwrap_or("")
        .trim()
}

/// Checks the node's three steps with `ofproto/trace` (see the module
/// doc).
fn trace_node(n: &Node, hex: &str, peer_mac: &str, own_mac: &str, ul0: u32) -> Result<()> {
    // 1. The pod's frame is encapsulated towards the peer.
    let t = n.appctl(&["ofproto/trace", "br-int", "in_port=1", hex])?;
    let a = dp_actions(&t);
    if !(a.contains("tnl_push(")
        && a.contains(&format!("dst={}", n.peer_ip))
        && a.contains("vni=0x64"))
    {
        bail!(
            "OVS node {}: ofproto/trace: the pod's frames (port 1) are not tunnelled to {} \
             with VNI 100 (no route or neighbour via br-phy?):\n{t}",
            n.name,
            n.peer_ip
        );
    }
    // 2. VXLAN from the peer on the underlay is decapsulated.
    let f = format!(
        "udp,in_port={ul0},dl_src={peer_mac},dl_dst={own_mac},nw_src={},nw_dst={},nw_ttl=64,\
         udp_src=49152,udp_dst=4789",
        n.peer_ip, n.ip
    );
    let t = n.appctl(&["ofproto/trace", "br-phy", &f])?;
    if !dp_actions(&t).contains("tnl_pop(") {
        bail!(
            "OVS node {}: ofproto/trace: VXLAN from {} on ul0 is not decapsulated \
             (no tnl_pop; is {} on br-phy?):\n{t}",
            n.name,
            n.peer_ip,
            n.ip
        );
    }
    // 3. The tunnel's VNI 100 goes to the pod.
    let dpif = n.appctl(&["dpif/show"])?;
    let odp = odp_port(&dpif, &n.pod).ok_or_else(|| {
        anyhow!(
            "OVS node {}: {} is not in dpif/show:\n{dpif}",
            n.name,
            n.pod
        )
    })?;
    let f = format!(
        "in_port=10,tun_id=100,tun_src={},tun_dst={}",
        n.peer_ip, n.ip
    );
    let t = n.appctl(&["ofproto/trace", "br-int", &f, hex])?;
    if !trace_text_delivers(&t, odp) {
        bail!(
            "OVS node {}: ofproto/trace: frames from the tunnel (VNI 100) are not output \
             to the pod port {} (datapath port {odp}):\n{t}",
            n.name,
            n.pod
        );
    }
    Ok(())
}

/// Starts the two-node VXLAN setup with Open vSwitch userspace, its pod
/// and underlay ports of `port_type` (`afxdp`: PMD threads, or
/// `afxdp-nonpmd`). The CPU measured is both `ovs-vswitchd`s'.
pub fn start_ovs_vxlan_pair(port_type: &str) -> Result<Running> {
    if let Some(why) = ovs_vxlan_unavailable() {
        bail!("{why}");
    }
    let pmd = match port_type {
        "afxdp" => true,
        "afxdp-nonpmd" => false,
        _ => bail!("unknown OVS port type {port_type} (afxdp, afxdp-nonpmd)"),
    };
    let VxlanNodes {
        mut lab,
        nodes: [na, nb],
        hosts: [ha, hb],
        gen,
        sink,
    } = vxlan_nodes("ov", false)?;
    // Dropped before `lab` on errors (declared after it): vswitchd first.
    let mut dbs: Vec<Proc> = Vec::new();
    let mut switches: Vec<Proc> = Vec::new();
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let schema = schema().to_string_lossy().into_owned();
    let mut nodes = Vec::new();
    for (name, ns, ip, peer_ip, pod) in [
        ("A", &na, VXLAN_UNDERLAY[0], VXLAN_UNDERLAY[1], &ha),
        ("B", &nb, VXLAN_UNDERLAY[1], VXLAN_UNDERLAY[0], &hb),
    ] {
        let dir = lab.dir(&format!("ovs-{}", name.to_lowercase()))?;
        nodes.push(Node {
            name,
            ns: ns.clone(),
            dir,
            ip,
            peer_ip,
            pod: pod.clone(),
        });
    }
    let mut modes = std::collections::BTreeMap::new();
    for (i, (n, flows)) in nodes
        .iter()
        .zip([VXLAN_NODE_A_FLOWS, VXLAN_NODE_B_FLOWS])
        .enumerate()
    {
        let db = n.path("conf.db");
        must(&["ovsdb-tool", "create", &db, &schema])
            .with_context(|| format!("OVS node {}: creating its database", n.name))?;
        let mut p = n.spawn(
            &[
                "ovsdb-server",
                &db,
                &format!("--remote=punix:{}", n.path("db.sock")),
                &format!("--pidfile={}", n.path("ovsdb-server.pid")),
                &format!("--unixctl={}", n.path("ovsdb-server.ctl")),
                &format!("--log-file={}", n.path("ovsdb-server.log")),
                "-vconsole:off",
                "--no-chdir",
            ],
            "ovsdb-server",
        )?;
        n.wait(&mut p, "ovsdb-server", &|| {
            n.vsctl(&["--no-wait", "init"]).is_ok()
        })?;
        dbs.push(p);
        if pmd && ncpu >= 2 {
            n.vsctl(&[
                "--no-wait",
                "set",
                "Open_vSwitch",
                ".",
                &format!("other_config:pmd-cpu-mask=0x{:x}", 1u64 << i),
            ])?;
        }
        let mut p = n.spawn(
            &[
                "ovs-vswitchd",
                &format!("unix:{}", n.path("db.sock")),
                &format!("--pidfile={}", n.path("ovs-vswitchd.pid")),
                &format!("--unixctl={}", n.path("ovs-vswitchd.ctl")),
                &format!("--log-file={}", n.path("ovs-vswitchd.log")),
                "-vconsole:off",
                "--no-chdir",
            ],
            "ovs-vswitchd",
        )?;
        n.wait(&mut p, "ovs-vswitchd", &|| n.appctl(&["version"]).is_ok())?;
        switches.push(p);
        let ty = format!("type={port_type}");
        n.vsctl(&[
            "add-br",
            "br-phy",
            "--",
            "set",
            "bridge",
            "br-phy",
            "datapath_type=netdev",
        ])?;
        n.vsctl(&[
            "add-port",
            "br-phy",
            "ul0",
            "--",
            "set",
            "interface",
            "ul0",
            &ty,
            "options:xdp-mode=best-effort",
        ])?;
        n.ofport("ul0")?;
        must(&[
            "ip",
            "-n",
            &n.ns,
            "addr",
            "add",
            &format!("{}/24", n.ip),
            "dev",
            "br-phy",
        ])
        .with_context(|| format!("OVS node {}: underlay address on br-phy", n.name))?;
        must(&["ip", "-n", &n.ns, "link", "set", "br-phy", "up"])?;
        n.vsctl(&[
            "add-br",
            "br-int",
            "--",
            "set",
            "bridge",
            "br-int",
            "datapath_type=netdev",
            "fail_mode=secure",
            "protocols=OpenFlow10,OpenFlow13,OpenFlow15",
        ])?;
        n.vsctl(&[
            "add-port",
            "br-int",
            &n.pod,
            "--",
            "set",
            "interface",
            &n.pod,
            &ty,
            "options:xdp-mode=best-effort",
            "ofport_request=1",
        ])?;
        n.vsctl(&[
            "add-port",
            "br-int",
            "tun0",
            "--",
            "set",
            "interface",
            "tun0",
            "type=vxlan",
            "ofport_request=10",
            "options:remote_ip=flow",
            "options:key=flow",
            &format!("options:local_ip={}", n.ip),
        ])?;
        for (ifname, want) in [(n.pod.as_str(), 1), ("tun0", 10)] {
            let got = n.ofport(ifname)?;
            if got != want {
                bail!(
                    "OVS node {}: {ifname} got OpenFlow port {got}, the flows need {want}",
                    n.name
                );
            }
        }
        let f = lab.file(&format!("ovx-{}.flows", n.name.to_lowercase()), flows)?;
        let mgmt = format!("unix:{}", n.path("br-int.mgmt"));
        must(&["ovs-ofctl", "-O", "OpenFlow15", "add-flows", &mgmt, &f])
            .with_context(|| format!("OVS node {}: loading the flows", n.name))?;
    }
    // Static tunnel neighbours: each node's peer is the other's br-phy.
    let macs = [mac_in(&na, "br-phy")?, mac_in(&nb, "br-phy")?];
    let hex: String = Plan::simple(SIMPLE_FLOWS)
        .sample_frame()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for (i, n) in nodes.iter().enumerate() {
        let (own, peer) = (&macs[i], &macs[1 - i]);
        n.appctl(&["tnl/neigh/set", "br-phy", n.peer_ip, peer])?;
        let ul0 = n.ofport("ul0")?;
        trace_node(n, &hex, peer, own, ul0)?;
        let log = std::fs::read_to_string(n.dir.join("ovs-vswitchd.log")).unwrap_or_default();
        let tag = n.name.to_lowercase();
        for ifname in ["ul0", n.pod.as_str()] {
            modes.insert(
                format!("node-{tag}:{ifname}"),
                format!("{port_type} {}", afxdp_mode_in_log(&log, ifname)),
            );
        }
        modes.insert(
            format!("node-{tag}:tun0"),
            "vxlan (userspace tnl_push/tnl_pop via br-phy)".to_owned(),
        );
    }
    let pids = switches.iter().map(|p| exec_pid(p.pid())).collect();
    let pin = if pmd && ncpu >= 2 {
        "; PMD threads pinned: node A core 0, node B core 1"
    } else {
        ""
    };
    let note = format!(
        "pod on node A -> VXLAN (VNI 100) over a veth underlay -> pod on node B; private \
         ovs-vswitchd (netdev datapath) per node: br-int (pod {port_type} port 1, vxlan port 10, \
         the oxvs flows) and br-phy ({port_type} on ul0, the underlay IP on br-phy's internal \
         port, static tunnel neighbour){pin}"
    );
    // Stop order on drop: the switches, then the databases.
    switches.append(&mut dbs);
    Ok(Running {
        name: if pmd {
            "ovs-afxdp-pmd-vxlan-2node".into()
        } else {
            "ovs-afxdp-nonpmd-vxlan-2node".into()
        },
        pids,
        port_modes: modes,
        flows: 4,
        note,
        _procs: switches,
        topo: Virtual {
            lab,
            queues: 1,
            gen,
            sink,
            port1: ha,
            port2: hb,
        },
        oxvs_ctl: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dpif_show_and_actions() {
        let d = "netdev@ovs-netdev: hit:0 missed:0\n  br-int:\n    br-int 65534/3: (tap)\n    \
                 xb12ov3g 1/2: (afxdp)\n    tun0 10/5: (vxlan: key=flow)\n";
        assert_eq!(odp_port(d, "xb12ov3g"), Some(2));
        assert_eq!(odp_port(d, "tun0"), Some(5));
        assert_eq!(odp_port(d, "xb12ov3"), None);
        assert_eq!(
            dp_actions("Flow: x\nDatapath actions: tnl_pop(5)\n"),
            "tnl_pop(5)"
        );
        assert_eq!(dp_actions("nothing"), "");
    }
}
