//! One pod's attachment, made and undone.
//!
//! [`Agent::attach`] runs ADD's steps 2 to 6 (veth and pod interface,
//! switch port, flows, gratuitous ARP, record `ready`; the list is in
//! [`super::cni`]) once the address is allocated and the `pending` record
//! written. [`Agent::teardown`] undoes everything of an attachment that
//! exists, in the reverse order: for DEL, GC, a failed ADD, and
//! [`Agent::reconcile`]'s rollback of interrupted ADDs and clean-up of
//! pods whose sandbox vanished.

use std::path::PathBuf;

use oxvs_api::cni::{code, CniError};
use oxvs_api::{Request, TraceRequest};

use super::{blocking, err, Agent};
use crate::flows::{self, NodeNet};
use crate::podnet::{self, PodIfaceSpec};
use crate::state::{AttachState, Attachment};

impl Agent {
    /// The pod interface `a` describes, in the namespace `netns`.
    pub(super) fn iface_spec(&self, a: &Attachment, netns: &str) -> PodIfaceSpec {
        PodIfaceSpec {
            netns: PathBuf::from(netns),
            ifname: a.ifname.clone(),
            host_ifname: a.host_ifname.clone(),
            mac: flows::parse_mac(&a.mac).unwrap_or_default(),
            ipv4: a.ipv4,
            mtu: a.mtu,
            route_mtu: self.route_mtu(a.mtu),
            tcp_full_mtu: self.tcp_full_mtu(a.mtu),
            tx_checksum_off: self.cfg.pod_tx_checksum_off,
            ipv6: a.ipv6,
            // As ADD made it (its record), not as the agent would now.
            qdisc: a.qdisc.clone(),
        }
    }

    /// ADD's steps 2 to 6 for `a` (its address allocated, its `pending`
    /// record written): the pod interface, the switch port, the flows, a
    /// gratuitous ARP, the record `ready`. On failure the caller tears
    /// `a` down.
    pub(super) async fn attach(&self, node: &NodeNet, a: &mut Attachment) -> Result<(), CniError> {
        let spec = self.iface_spec(a, &a.netns);
        let t0 = std::time::Instant::now();
        let alias = podnet::owner_alias(&a.container_id, &a.ifname);
        blocking(move || {
            podnet::setup_pod_interface(&spec)?;
            // Whose link this is, for a DEL without a record (see `del`, cni.rs).
            podnet::set_link_alias(&spec.host_ifname, &alias)
        })
        .await?
        .map_err(|e| match e {
            podnet::PodnetError::NoNetns(p) => err(
                code::INVALID_ENV,
                format!("CNI_NETNS {} does not exist", p.display()),
            ),
            e => err(
                code::INTERFACE_FAILURE,
                format!("cannot set up the pod interface: {e}"),
            ),
        })?;
        let t_netlink = t0.elapsed();
        let ofport = self.add_port(&a.host_ifname, None).await?;
        let t_port = t0.elapsed();
        a.ofport = Some(ofport);
        a.state = AttachState::Ready;
        self.save_record(a.clone()).await?;
        // The pod's flows and every policy flow that concerns it, before
        // the pod can send anything: the desired state now includes it.
        self.sync().await?;
        let t_flows = t0.elapsed();
        // An IPv6-only pod has no ARP; its neighbours solicit it.
        if let Some(ip) = a.ip4() {
            let garp = flows::gratuitous_arp(flows::parse_mac(&a.mac).unwrap_or_default(), ip);
            let hex: String = garp.iter().map(|b| format!("{b:02x}")).collect();
            if let Err(e) = self
                .switch(Request::Trace(TraceRequest {
                    packet_hex: Some(hex),
                    in_port: Some(ofport),
                    inject: true,
                    ..TraceRequest::default()
                }))
                .await
            {
                tracing::debug!(pod = %a.pod_ref(), error = %e, "gratuitous ARP not sent");
            }
        }
        let _ = node;
        tracing::info!(
            pod = %a.pod_ref(),
            ip = %a.ip_text(),
            port = %a.host_ifname,
            ofport,
            netlink_ms = t_netlink.as_secs_f64() * 1e3,
            port_ms = (t_port - t_netlink).as_secs_f64() * 1e3,
            flows_ms = (t_flows - t_port).as_secs_f64() * 1e3,
            total_ms = t0.elapsed().as_secs_f64() * 1e3,
            "pod attached"
        );
        Ok(())
    }

    /// Removes everything of `a` that exists, in order: its flows (the
    /// pod is dropped from the desired state and the switch converged),
    /// its veth, its port, its address, its record. Idempotent; on failure
    /// the record stays, so a retry (or the next start) finishes the job.
    ///
    /// The veth goes before the switch port ([`delete_then_detach`]).
    pub(super) async fn teardown(&self, a: &Attachment) -> Result<(), CniError> {
        if let Ok(mut r) = self.records.lock() {
            r.remove(&a.key());
        }
        let r = self.teardown_steps(a).await;
        if r.is_err() {
            if let Ok(mut recs) = self.records.lock() {
                recs.insert(a.key(), a.clone());
            }
        } else {
            self.forget_admitted(&a.pod_namespace, &a.pod_name);
        }
        r
    }

    /// Deletes the host end of a pod's veth, then the switch port on it.
    /// In this order a DEL is 10-20 ms shorter: deleting the interface
    /// unbinds the port's AF_XDP socket under the kernel's RTNL lock,
    /// where its RCU wait is an expedited one, so closing the socket then
    /// waits for nothing; closed first, the socket waits for a normal
    /// grace period (docs/benchmarks.md, "DEL: the veth before the switch
    /// port"). The pod's flows are already gone, so nothing is sent to the
    /// port meanwhile, and the switch keeps the frames it lent the socket
    /// until the port goes.
    pub(super) async fn delete_then_detach(&self, host: &str) -> Result<(), CniError> {
        let h = host.to_string();
        blocking(move || podnet::delete_host_link(&h))
            .await?
            .map_err(|e| {
                err(
                    code::INTERFACE_FAILURE,
                    format!("cannot delete {host}: {e}"),
                )
            })?;
        self.del_port(host).await
    }

    async fn teardown_steps(&self, a: &Attachment) -> Result<(), CniError> {
        if a.ofport.is_some() && self.node().is_some() {
            self.sync().await?;
        }
        self.delete_then_detach(&a.host_ifname).await?;
        let (cid, ifn) = a.key();
        self.release_addresses(&cid, &ifn).await?;
        let store = self.store.clone();
        blocking(move || store.remove(&cid, &ifn))
            .await?
            .map_err(|e| err(code::IO_FAILURE, e.to_string()))
    }
}
