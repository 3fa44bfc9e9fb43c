//! The agent's calls to oxvs-switchd: one blocking client call each, on
//! the blocking pool, within `--switch-timeout-ms`. The switch's errors
//! become CNI errors ([`Agent::switch_err`]: an unreachable switch is "try
//! again later", a refusal a switch failure). Adding and removing a pod's
//! port tolerate what is already so (a taken port number, a port gone).

use oxvs_api::cni::{code, CniError};
use oxvs_api::{Client, DumpPortsResult, PortKind, PortSpec, Request, ShowResult, XdpModeRequest};
use serde_json::Value;

use super::{err, Agent};

impl Agent {
    pub(super) async fn switch(&self, req: Request) -> Result<Value, oxvs_api::ClientError> {
        let path = self.cfg.switchd_socket.clone();
        let timeout = self.cfg.switch_timeout;
        match tokio::task::spawn_blocking(move || {
            let mut c = Client::connect(&path)?;
            c.set_timeout(timeout);
            c.call(&req)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => Err(oxvs_api::ClientError::Refused(format!(
                "internal task failed: {e}"
            ))),
        }
    }

    pub(super) async fn switch_ports(
        &self,
    ) -> Result<Vec<oxvs_api::PortInfo>, oxvs_api::ClientError> {
        let v = self.switch(Request::DumpPorts).await?;
        let r: DumpPortsResult = serde_json::from_value(v)
            .map_err(|e| oxvs_api::ClientError::Refused(format!("bad dump-ports answer: {e}")))?;
        Ok(r.ports)
    }

    /// The largest frame the switch's pod ports take whole (its `show`);
    /// 0 when it does not say (an older switch) or cannot be asked.
    pub(super) async fn switch_max_frame_len(&self) -> u32 {
        match self.switch_show().await {
            Ok(s) => s.max_frame_len,
            Err(e) => {
                tracing::warn!("cannot ask the switch which frames it takes whole: {e}");
                0
            }
        }
    }

    /// Whether the switch's tunnel port segments large TCP frames (its
    /// `show`); false when it does not say or cannot be asked.
    pub(super) async fn switch_tunnel_tso(&self) -> bool {
        match self.switch_show().await {
            Ok(s) => s.tunnel_tso,
            Err(e) => {
                tracing::warn!("cannot ask the switch whether its tunnel segments TCP: {e}");
                false
            }
        }
    }

    async fn switch_show(&self) -> Result<ShowResult, oxvs_api::ClientError> {
        self.switch(Request::Show).await.and_then(|v| {
            serde_json::from_value::<ShowResult>(v)
                .map_err(|e| oxvs_api::ClientError::Refused(format!("bad show answer: {e}")))
        })
    }

    pub(super) fn switch_err(what: &str, e: oxvs_api::ClientError) -> CniError {
        if e.is_unreachable() {
            err(code::TRY_AGAIN_LATER, format!("{what}: {e}"))
        } else {
            err(
                code::SWITCH_FAILURE,
                format!("{what}: the switch refused: {e}"),
            )
        }
    }

    pub(super) async fn add_port(&self, name: &str, ofport: Option<u32>) -> Result<u32, CniError> {
        let spec = PortSpec {
            name: name.to_string(),
            ofport,
            kind: PortKind::Afxdp {
                ifname: None,
                xdp_mode: XdpModeRequest::Auto,
                // A pod's veth has one queue.
                n_rxq: None,
            },
        };
        let v = match self.switch(Request::AddPort(spec.clone())).await {
            Ok(v) => v,
            // The wanted number may be taken: take any.
            Err(oxvs_api::ClientError::Refused(_)) if ofport.is_some() => self
                .switch(Request::AddPort(PortSpec {
                    ofport: None,
                    ..spec
                }))
                .await
                .map_err(|e| Self::switch_err(&format!("cannot attach {name} to the switch"), e))?,
            Err(e) => {
                return Err(Self::switch_err(
                    &format!("cannot attach {name} to the switch"),
                    e,
                ))
            }
        };
        let info: oxvs_api::PortInfo = serde_json::from_value(v)
            .map_err(|e| err(code::SWITCH_FAILURE, format!("bad add-port answer: {e}")))?;
        Ok(info.ofport)
    }

    pub(super) async fn del_port(&self, name: &str) -> Result<(), CniError> {
        match self
            .switch(Request::DelPort {
                name: name.to_string(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e @ oxvs_api::ClientError::Refused(_)) => {
                let ports = self
                    .switch_ports()
                    .await
                    .map_err(|e| Self::switch_err("cannot list the switch's ports", e))?;
                if ports.iter().any(|p| p.name == name) {
                    Err(Self::switch_err(&format!("cannot remove port {name}"), e))
                } else {
                    Ok(())
                }
            }
            Err(e) => Err(Self::switch_err(&format!("cannot remove port {name}"), e)),
        }
    }
}
