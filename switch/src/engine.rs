//! The switch engine: ports, datapath threads, shared state. (API contract; being written.)

use std::sync::Arc;

use oxvs_api::{PortInfo, PortSpec};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::DatapathStats;
use oxvs_pipeline::tables::Pipeline;

/// How datapath threads wait for packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// `poll(2)` on the ports' sockets: sleeps when idle (the default, for small machines).
    #[default]
    Interrupt,
    /// Spin on the rings (dedicated cores).
    Busy,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// Number of datapath threads (ports are spread across them).
    pub threads: usize,
    pub poll_mode: PollMode,
    /// UMEM frames per datapath thread.
    pub umem_frames: u32,
    /// Frames per RX/TX batch (32-64).
    pub batch: usize,
    pub conntrack: CtConfig,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            threads: 1,
            poll_mode: PollMode::Interrupt,
            umem_frames: 4096,
            batch: 32,
            conntrack: CtConfig::default(),
        }
    }
}

/// Why an engine operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("no port named '{0}'")]
    NoSuchPort(String),
    #[error("{0}")]
    Other(String),
}

/// A packet sent to the controller by a flow.
#[derive(Clone, Debug)]
pub struct PacketIn {
    pub in_port: u32,
    pub table: u8,
    pub cookie: u64,
    pub reason: String,
    pub userdata: Vec<u8>,
    pub frame: Vec<u8>,
}

/// Datapath statistics summed over threads.
#[derive(Clone, Debug, Default)]
pub struct SwitchStats {
    pub datapath: DatapathStats,
    pub threads: usize,
    /// Time spent processing packets (ns), for ns-per-packet.
    pub busy_ns: u64,
}

/// The running switch (shared by the control server; all methods take `&self`).
pub struct Switch {
    pipeline: Arc<Pipeline>,
}

impl Switch {
    /// Starts the datapath threads with no ports.
    pub fn start(_config: SwitchConfig, pipeline: Arc<Pipeline>) -> Result<Switch, SwitchError> {
        Ok(Switch { pipeline })
    }
    pub fn pipeline(&self) -> &Arc<Pipeline> {
        &self.pipeline
    }
    /// Adds a port at run time without disturbing the others.
    pub fn add_port(&self, _spec: PortSpec) -> Result<PortInfo, SwitchError> {
        Err(SwitchError::Other("not written yet".into()))
    }
    /// Removes a port (its XDP program is detached).
    pub fn del_port(&self, name: &str) -> Result<(), SwitchError> {
        Err(SwitchError::NoSuchPort(name.into()))
    }
    /// Every port with its counters, by ofport.
    pub fn ports(&self) -> Vec<PortInfo> {
        Vec::new()
    }
    /// Runs `f` with the connection tracker locked (dump, flush).
    pub fn with_conntrack<R>(&self, f: impl FnOnce(&mut Conntrack) -> R) -> R {
        let mut ct = Conntrack::new(CtConfig::default());
        f(&mut ct)
    }
    pub fn stats(&self) -> SwitchStats {
        SwitchStats::default()
    }
    /// Takes up to `max` queued packet-ins.
    pub fn take_packet_ins(&self, _max: usize) -> Vec<PacketIn> {
        Vec::new()
    }
    /// Injects a frame as if it arrived on `in_port`: it goes through the
    /// pipeline and out for real.
    pub fn inject(&self, _in_port: u32, _frame: Vec<u8>) -> Result<(), SwitchError> {
        Err(SwitchError::Other("not written yet".into()))
    }
    /// Stops the threads, detaches XDP programs, removes ports.
    pub fn shutdown(&self) {}
}
