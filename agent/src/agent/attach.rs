//! One pod's attachment, made and undone.
//!
//! [`Agent::attach`] runs ADD's steps 2 to 6 (veth; switch port, pod
//! interface and the host end's isolation from the host's stack at once;
//! record `ready`; flows; gratuitous ARP; the list is in
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

/// Why [`Agent::attach`] failed, and whether it made the pod's veth (and
/// so may have left a port, flows): if not, a host link of that name is
/// not the attachment's and [`Agent::teardown_unmade`] leaves it alone.
#[derive(Debug)]
pub(super) struct AttachError {
    pub error: CniError,
    pub made_veth: bool,
}

impl From<CniError> for AttachError {
    /// A failure once the veth exists.
    fn from(error: CniError) -> Self {
        AttachError {
            error,
            made_veth: true,
        }
    }
}

/// A failure making or configuring the pod's interface, as a CNI error.
fn pod_iface_err(e: podnet::PodnetError) -> CniError {
    match e {
        podnet::PodnetError::NoNetns(p) => err(
            code::INVALID_ENV,
            format!("CNI_NETNS {} does not exist", p.display()),
        ),
        e => err(
            code::INTERFACE_FAILURE,
            format!("cannot set up the pod interface: {e}"),
        ),
    }
}

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
    /// record written): the veth, the switch port and the pod end, the
    /// record `ready`, the flows, a gratuitous ARP. On failure the caller
    /// undoes `a`: all of it ([`Agent::teardown`]), or, when the veth was
    /// not made ([`AttachError::made_veth`]), its address and record only.
    pub(super) async fn attach(
        &self,
        node: &NodeNet,
        a: &mut Attachment,
    ) -> Result<(), AttachError> {
        let spec = self.iface_spec(a, &a.netns);
        let t0 = std::time::Instant::now();
        let alias = podnet::owner_alias(&a.container_id, &a.ifname);
        let host_spec = spec.clone();
        let ns = blocking(move || {
            let ns = podnet::open_pod_netns(&host_spec).map_err(|e| (e, false))?;
            // Refused with `Exists`, nothing was made: a host link of that
            // name is someone else's. After any other error the pair may
            // exist, and is undone by name as before.
            let host = podnet::create_pod_veth(&host_spec, &ns).map_err(|e| {
                let made = !matches!(e, podnet::PodnetError::Exists(..));
                (e, made)
            })?;
            // Whose link this is, for a DEL without a record (see `del`, cni.rs).
            podnet::set_link_alias_index(host.host_ifindex, &host_spec.host_ifname, &alias)
                .map_err(|e| (e, true))?;
            Ok(ns)
        })
        .await?
        .map_err(|(e, made_veth)| AttachError {
            error: pod_iface_err(e),
            made_veth,
        })?;
        let t_veth = t0.elapsed();
        // The switch binds the port on the host end while the pod end is
        // configured in the pod's namespace: the two are independent, and
        // the bind is most of an ADD (docs/benchmarks.md, "The pod end
        // configured during the bind"). Both finish before either's error
        // is returned, so the caller's teardown finds nothing in flight.
        let pod_end = blocking(move || {
            let t = std::time::Instant::now();
            podnet::configure_pod_veth(&spec, &ns).map(|()| t.elapsed())
        });
        // Meanwhile too: the host's stack must never take what the switch
        // does not (hostnet::isolate_host_link).
        let host = a.host_ifname.clone();
        let isolate = blocking(move || crate::hostnet::isolate_host_link(&host));
        let (pod_end, port, isolated) =
            tokio::join!(pod_end, self.add_port(&a.host_ifname, None), isolate);
        let failed = match (pod_end?, isolated?) {
            (Err(e), _) => Err(pod_iface_err(e)),
            (Ok(_), Err(e)) => Err(err(code::INTERFACE_FAILURE, e.to_string())),
            (Ok(t), Ok(())) => Ok(t.as_secs_f64() * 1e3),
        };
        let pod_end_ms = match failed {
            Ok(ms) => ms,
            Err(e) => {
                if let Err(p) = port {
                    tracing::warn!(pod = %a.pod_ref(), error = %p, "the switch port failed too");
                }
                return Err(e.into());
            }
        };
        let ofport = port?;
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
            self.announce(
                a.pod_ref(),
                flows::parse_mac(&a.mac).unwrap_or_default(),
                ip,
                ofport,
            );
        }
        let _ = node;
        tracing::info!(
            pod = %a.pod_ref(),
            ip = %a.ip_text(),
            port = %a.host_ifname,
            ofport,
            netlink_ms = t_veth.as_secs_f64() * 1e3,
            port_ms = (t_port - t_veth).as_secs_f64() * 1e3,
            pod_end_ms,
            flows_ms = (t_flows - t_port).as_secs_f64() * 1e3,
            total_ms = t0.elapsed().as_secs_f64() * 1e3,
            "pod attached"
        );
        Ok(())
    }

    /// Sends the pod's gratuitous ARP out of the switch (injected on its
    /// port), without holding up the ADD: like Antrea's, it is best effort,
    /// and the runtime starts the pod's containers only after ADD answers.
    fn announce(&self, pod: String, mac: [u8; 6], ip: std::net::Ipv4Addr, ofport: u32) {
        let garp = flows::gratuitous_arp(mac, ip);
        let req = Request::Trace(TraceRequest {
            packet_hex: Some(garp.iter().map(|b| format!("{b:02x}")).collect()),
            in_port: Some(ofport),
            inject: true,
            ..TraceRequest::default()
        });
        let path = self.cfg.switchd_socket.clone();
        let timeout = self.cfg.switch_timeout;
        tokio::task::spawn_blocking(move || {
            let r = oxvs_api::Client::connect(&path).and_then(|mut c| {
                c.set_timeout(timeout);
                c.call(&req)
            });
            if let Err(e) = r {
                tracing::debug!(pod = %pod, error = %e, "gratuitous ARP not sent");
            }
        });
    }

    /// Removes everything of `a` that exists, in order: its flows (the
    /// pod is dropped from the desired state and the switch converged),
    /// its veth, its port, its address, its record. Idempotent; on failure
    /// the record stays, so a retry (or the next start) finishes the job.
    ///
    /// The veth goes before the switch port ([`delete_then_detach`]).
    pub(super) async fn teardown(&self, a: &Attachment) -> Result<(), CniError> {
        self.undo(a, true).await
    }

    /// [`Agent::teardown`] of an ADD that failed before it made the pod's
    /// veth: its address and record only. A host link with its name (a
    /// clash of the 28-bit names, or a link someone else made) and that
    /// link's switch port are not the attachment's and stay.
    pub(super) async fn teardown_unmade(&self, a: &Attachment) -> Result<(), CniError> {
        self.undo(a, false).await
    }

    async fn undo(&self, a: &Attachment, links: bool) -> Result<(), CniError> {
        if let Ok(mut r) = self.records.lock() {
            r.remove(&a.key());
        }
        let r = self.teardown_steps(a, links).await;
        if r.is_err() {
            if let Ok(mut recs) = self.records.lock() {
                recs.insert(a.key(), a.clone());
            }
        } else {
            self.forget_admitted(&a.pod_namespace, &a.pod_name);
        }
        r
    }

    /// Whether a link named as `a`'s host end exists with an alias that
    /// names another attachment ([`podnet::owner_alias`]): the pod's own
    /// link went (deleted by someone else, or never made before a crash)
    /// and another took the name (a 28-bit hash). `Some(true)` when a
    /// switch port is bound to that link (its XDP program is attached):
    /// the port of that name is the other link's. `Some(false)`: the port
    /// of that name, if any, is `a`'s, bound to its gone link. A link
    /// without an alias is taken for `a`'s (made, then interrupted before
    /// its alias): `None`, as for `a`'s own link or none.
    async fn host_link_of_another(&self, a: &Attachment) -> Result<Option<bool>, CniError> {
        let h = a.host_ifname.clone();
        let owner = blocking(move || podnet::link_owner(&h))
            .await?
            .map_err(|e| {
                err(
                    code::INTERFACE_FAILURE,
                    format!("cannot read the alias of {}: {e}", a.host_ifname),
                )
            })?;
        let mine = podnet::owner_alias(&a.container_id, &a.ifname);
        Ok(match owner {
            Some((Some(other), xdp)) if other != mine => Some(xdp),
            _ => None,
        })
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

    async fn teardown_steps(&self, a: &Attachment, links: bool) -> Result<(), CniError> {
        if links {
            if a.ofport.is_some() && self.node().is_some() {
                self.sync().await?;
            }
            match self.host_link_of_another(a).await? {
                None => self.delete_then_detach(&a.host_ifname).await?,
                Some(true) => {
                    tracing::warn!(pod = %a.pod_ref(), link = %a.host_ifname, "the host link of this name has another owner's alias and a switch port (the pod's own link went, and another took its name): left alone, with its port");
                }
                Some(false) => {
                    tracing::warn!(pod = %a.pod_ref(), link = %a.host_ifname, "the host link of this name has another owner's alias (the pod's own link went, and another took its name): left alone; the pod's port, bound to its gone link, removed");
                    self.del_port(&a.host_ifname).await?;
                }
            }
        }
        let (cid, ifn) = a.key();
        self.release_addresses(&cid, &ifn).await?;
        let store = self.store.clone();
        blocking(move || store.remove(&cid, &ifn))
            .await?
            .map_err(|e| err(code::IO_FAILURE, e.to_string()))
    }
}
