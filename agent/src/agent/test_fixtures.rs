//! Fixtures of the agent's unit tests: an attachment, an agent without a
//! switch, a GC request.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oxvs_api::cni::{CniCommand, CniRequest};
use serde_json::Value;

use super::{Agent, AgentConfig};
use crate::state::{AttachState, Attachment};

pub(super) fn att() -> Attachment {
    Attachment {
        container_id: "c1".into(),
        ifname: "eth0".into(),
        netns: "/proc/1/ns/net".into(),
        host_ifname: "a-1234567".into(),
        pod_namespace: "x".into(),
        pod_name: "a".into(),
        ipv4: Some(crate::state::PodIpv4 {
            ip: "10.244.0.5".parse().unwrap(),
            prefix_len: 24,
            gateway: "10.244.0.1".parse().unwrap(),
        }),
        mac: "0a:58:0a:f4:00:05".into(),
        mtu: 1450,
        ofport: Some(3),
        state: AttachState::Ready,
        ipv6: None,
        qdisc: None,
    }
}

/// An agent on a fresh state directory, with no switch.
pub(super) fn offline_agent(dir: &Path) -> Arc<Agent> {
    Arc::new(
        Agent::open(AgentConfig {
            node_name: "n1".into(),
            cni_socket: dir.join("cni.sock"),
            switchd_socket: dir.join("no-switchd.sock"),
            state_dir: dir.join("state"),
            pod_cidr: Some("10.244.0.0/24".parse().unwrap()),
            pod_cidr6: None,
            node_ip: None,
            gateway: "gw".into(),
            tunnel: "tun".into(),
            pod_mtu: 1450,
            pod_mtu_auto: false,
            local_mtu: super::LocalMtu::Auto,
            pod_tx_checksum_off: true,
            pod_qdisc: None,
            switch_timeout: Duration::from_secs(1),
            masquerade: false,
            proxy: false,
            max_policy_flows: crate::policy::DEFAULT_MAX_POLICY_FLOWS,
        })
        .unwrap(),
    )
}

pub(super) fn gc_request(valid: Value) -> CniRequest {
    CniRequest {
        v: oxvs_api::cni::CNI_PROTOCOL_VERSION,
        command: CniCommand::Gc,
        container_id: String::new(),
        netns: String::new(),
        ifname: String::new(),
        args: Default::default(),
        config: serde_json::json!({
            "cniVersion": "1.1.0", "name": "oxvs", "cni.dev/valid-attachments": valid
        }),
    }
}

pub(super) fn holds(agent: &Agent, cid: &str) -> bool {
    let ipam = agent.ipam.lock().unwrap();
    ipam.as_ref()
        .unwrap()
        .allocations()
        .iter()
        .any(|a| a.container_id == cid)
}
