//! The control protocol: requests, responses and their results.
//!
//! ## Wire format
//!
//! One JSON object per line, both ways. A request is
//! `{"v":1,"op":"<op>", ...args}`; its response is
//! `{"v":1,"ok":true,"result":...}` or `{"v":1,"ok":false,"error":"..."}`.
//! Arguments are the fields of the [`Request`] variant, in `snake_case`
//! (`"packet_hex"`, `"wait_ms"`); operation names are `kebab-case`
//! (`"add-flows"`). Flows travel as text in the `ovs-ofctl` syntax.
//!
//! ## Strictness
//!
//! [`parse_request`] refuses, with an error naming what was wrong, a line that
//! is not JSON, not an object, has no or another `v`, no `op`, an unknown
//! `op`, or arguments of the wrong type or unknown to the operation. A
//! misspelt argument is an error, never silently ignored.
//!
//! ## Results
//!
//! Each operation has one result type ([`ShowResult`], [`DumpFlowsResult`],
//! ...), serialised as the `result` value. Read results carry both what a
//! human reads (the `ovs-ofctl`-formatted lines) and structured entries
//! for scripts.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{PortInfo, PortSpec, VERSION};

/// Longest request or response line accepted (bytes, newline excluded).
/// Large enough for a flow file of a few hundred thousand flows.
pub const MAX_LINE: usize = 256 << 20;

/// A control request (the `op` and its arguments; `v` is added on the wire).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// The switch and its ports (`ovs-ofctl show`).
    Show,
    /// Adds a port; answers the [`PortInfo`].
    AddPort(PortSpec),
    /// Removes a port.
    DelPort { name: String },
    /// Adds flows (flow-file text: one per line, `#` comments) as one
    /// atomic bundle; answers a [`FlowModResult`].
    AddFlows { flows: String },
    /// Deletes the flows `spec` selects (`None`: every flow).
    DelFlows {
        #[serde(default)]
        spec: Option<String>,
        #[serde(default)]
        strict: bool,
    },
    /// Modifies the actions of the flows each line selects (one bundle).
    ModFlows {
        flows: String,
        #[serde(default)]
        strict: bool,
    },
    /// Makes the tables hold exactly these flows (one atomic version).
    ReplaceFlows { flows: String },
    /// Applies flow mods as one atomic bundle, in the `ovs-ofctl bundle`
    /// file format: one per line, `add|modify|modify_strict|delete|delete_strict FLOW`
    /// (a line without a command is an add; `flow` may precede the
    /// command), and group mods, `group add|modify|add_or_mod|delete
    /// GROUP` (as `ovs-ofctl bundle`). All or nothing.
    Bundle { mods: String },
    /// Adds groups (a group file: one `ovs-ofctl add-group` group per
    /// line, `#` comments) as one atomic bundle; an existing id fails the
    /// whole bundle. Answers a [`GroupModResult`].
    AddGroups { groups: String },
    /// Replaces groups (a group file) as one atomic bundle; a missing id
    /// fails it unless `may_create` (`ovs-ofctl mod-group --may-create`).
    ModGroups {
        groups: String,
        #[serde(default)]
        may_create: bool,
    },
    /// Deletes one group (`group_id=N`) or all (`None`, `group_id=all`),
    /// and every flow that names a deleted group.
    DelGroups {
        #[serde(default)]
        spec: Option<String>,
    },
    /// Makes the switch hold exactly these groups (a group file) and flows
    /// (a flow file), as one atomic version (`oxvsctl replace-flows
    /// --groups`): identical groups and flows are kept as they are. An
    /// error about the group file starts with `groups: `. Answers a
    /// [`ReplaceResult`].
    ReplaceGroups { groups: String, flows: String },
    /// Dumps the groups (one, or all by id).
    DumpGroups {
        #[serde(default)]
        group_id: Option<u32>,
    },
    /// Adds meters (a meter file: one `ovs-ofctl add-meter` meter per
    /// line, `#` comments) as one atomic bundle; an existing id fails the
    /// whole bundle (`OFPMMFC_METER_EXISTS`). Answers a [`MeterModResult`].
    AddMeters { meters: String },
    /// Replaces meters (a meter file) as one atomic bundle; a missing id
    /// fails it (`OFPMMFC_UNKNOWN_METER`). Buckets and counters start again.
    ModMeters { meters: String },
    /// Deletes one meter (`meter=N`) or all (`None`, `meter=all`), and
    /// every flow that names a deleted meter.
    DelMeters {
        #[serde(default)]
        spec: Option<String>,
    },
    /// The meters' configuration (one, or all by id). Answers a
    /// [`DumpMetersResult`].
    DumpMeters {
        #[serde(default)]
        meter_id: Option<u32>,
    },
    /// The meters' counters (one, or all by id). Answers a
    /// [`MeterStatsResult`].
    MeterStats {
        #[serde(default)]
        meter_id: Option<u32>,
    },
    /// Dumps flows; `table` is a number or a table name.
    DumpFlows {
        #[serde(default)]
        table: Option<String>,
        /// Table names instead of numbers in the lines.
        #[serde(default)]
        names: bool,
        /// Cookie, duration and counters in the lines (default true).
        #[serde(default = "yes")]
        stats: bool,
    },
    /// Ports with their counters.
    DumpPorts,
    /// Traces a packet through the flows (`ofproto/trace`).
    Trace(TraceRequest),
    /// Connections, all or of one zone.
    DumpConntrack {
        #[serde(default)]
        zone: Option<u16>,
    },
    /// Removes connections: all, or those every given condition selects
    /// (`oxvsctl flush-conntrack --zone Z --proto P --reply-src IP[:PORT]`).
    FlushConntrack {
        #[serde(default)]
        zone: Option<u16>,
        /// Only this IP protocol (number).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        proto: Option<u8>,
        /// Only connections whose reply comes from this address (a
        /// translated connection's endpoint).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_src: Option<std::net::IpAddr>,
        /// ... and this port.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_sport: Option<u16>,
    },
    /// Changes connection limits (`ovs-appctl dpctl/ct-set-limits` for
    /// ports): the default of every port without its own, and ports' own
    /// ones. 0 is "no limit"; a port entry without `limit` goes back to the
    /// default. All or nothing: an unknown port changes nothing. Answers a
    /// [`CtLimitsResult`] with the limits now in force.
    CtSetLimits {
        #[serde(default)]
        default: Option<u32>,
        #[serde(default)]
        ports: Vec<CtPortLimitSpec>,
    },
    /// Connection limits, counts and refusals per port
    /// (`ovs-appctl dpctl/ct-get-limits`): of the named ports, or of every
    /// port that has connections, its own limit or refusals.
    CtGetLimits {
        #[serde(default)]
        ports: Vec<String>,
    },
    /// Datapath counters summed over threads.
    Stats,
    /// Takes up to `max` queued packet-ins, waiting up to `wait_ms` for one.
    PacketIn {
        #[serde(default = "default_packet_in_max")]
        max: usize,
        #[serde(default)]
        wait_ms: u64,
    },
    /// The switch's build and protocol version.
    Version,
}

fn yes() -> bool {
    true
}

fn default_packet_in_max() -> usize {
    100
}

/// Most a `packet-in` request may wait (ms); longer waits are cut to this.
pub const MAX_PACKET_IN_WAIT_MS: u64 = 60_000;

/// Every operation name, in the order of [`Request`].
pub const OPS: &[&str] = &[
    "show",
    "add-port",
    "del-port",
    "add-flows",
    "del-flows",
    "mod-flows",
    "replace-flows",
    "bundle",
    "add-groups",
    "mod-groups",
    "del-groups",
    "replace-groups",
    "dump-groups",
    "add-meters",
    "mod-meters",
    "del-meters",
    "dump-meters",
    "meter-stats",
    "dump-flows",
    "dump-ports",
    "trace",
    "dump-conntrack",
    "flush-conntrack",
    "ct-set-limits",
    "ct-get-limits",
    "stats",
    "packet-in",
    "version",
];

/// What to trace: a packet spec, or raw bytes plus the port they came in on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// `in_port=1,tcp,nw_dst=10.0.0.2,tp_dst=80` (unnamed fields are zero).
    #[serde(default)]
    pub spec: Option<String>,
    /// An Ethernet frame in hex (instead of `spec`).
    #[serde(default)]
    pub packet_hex: Option<String>,
    /// The port `packet_hex` arrived on.
    #[serde(default)]
    pub in_port: Option<u32>,
    /// Conntrack state for each recirculation after `ct(table=..)`, in
    /// order (`trk,new`, `est|rpl`); then `trk,new`.
    #[serde(default)]
    pub ct_next: Vec<String>,
    /// Table names in the trace.
    #[serde(default)]
    pub names: bool,
    /// Also send the packet through the real datapath.
    #[serde(default)]
    pub inject: bool,
}

impl Request {
    /// The operation name as on the wire.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Show => "show",
            Request::AddPort(_) => "add-port",
            Request::DelPort { .. } => "del-port",
            Request::AddFlows { .. } => "add-flows",
            Request::DelFlows { .. } => "del-flows",
            Request::ModFlows { .. } => "mod-flows",
            Request::ReplaceFlows { .. } => "replace-flows",
            Request::Bundle { .. } => "bundle",
            Request::AddGroups { .. } => "add-groups",
            Request::ModGroups { .. } => "mod-groups",
            Request::DelGroups { .. } => "del-groups",
            Request::ReplaceGroups { .. } => "replace-groups",
            Request::DumpGroups { .. } => "dump-groups",
            Request::AddMeters { .. } => "add-meters",
            Request::ModMeters { .. } => "mod-meters",
            Request::DelMeters { .. } => "del-meters",
            Request::DumpMeters { .. } => "dump-meters",
            Request::MeterStats { .. } => "meter-stats",
            Request::DumpFlows { .. } => "dump-flows",
            Request::DumpPorts => "dump-ports",
            Request::Trace(_) => "trace",
            Request::DumpConntrack { .. } => "dump-conntrack",
            Request::FlushConntrack { .. } => "flush-conntrack",
            Request::CtSetLimits { .. } => "ct-set-limits",
            Request::CtGetLimits { .. } => "ct-get-limits",
            Request::Stats => "stats",
            Request::PacketIn { .. } => "packet-in",
            Request::Version => "version",
        }
    }

    /// The request as one wire line (with `"v"`, without the newline).
    pub fn to_line(&self) -> String {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("v".into(), Value::from(VERSION));
        }
        v.to_string()
    }
}

/// Why a request line was refused before it reached the switch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("request is not valid JSON: {0}")]
    BadJson(String),
    #[error("request must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("request has no \"v\" (protocol version; this switch speaks {VERSION})")]
    MissingVersion,
    #[error("unsupported protocol version {0} (this switch speaks {VERSION})")]
    BadVersion(String),
    #[error("request has no \"op\" (one of: {})", OPS.join(", "))]
    MissingOp,
    #[error("unknown op '{0}' (one of: {ops})", ops = OPS.join(", "))]
    UnknownOp(String),
    #[error("bad arguments for '{op}': {msg}")]
    BadArgs { op: String, msg: String },
    #[error("request line longer than {0} bytes")]
    TooLong(usize),
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses one request line (see the module doc for what is refused).
pub fn parse_request(line: &str) -> Result<Request, ProtocolError> {
    if line.len() > MAX_LINE {
        return Err(ProtocolError::TooLong(MAX_LINE));
    }
    let value: Value =
        serde_json::from_str(line).map_err(|e| ProtocolError::BadJson(e.to_string()))?;
    let Value::Object(mut obj) = value else {
        return Err(ProtocolError::NotAnObject(json_kind(&value)));
    };
    match obj.remove("v") {
        None => return Err(ProtocolError::MissingVersion),
        Some(v) if v.as_u64() == Some(u64::from(VERSION)) => {}
        Some(v) => return Err(ProtocolError::BadVersion(v.to_string())),
    }
    let op = match obj.get("op") {
        None => return Err(ProtocolError::MissingOp),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(ProtocolError::UnknownOp(other.to_string())),
    };
    if !OPS.contains(&op.as_str()) {
        return Err(ProtocolError::UnknownOp(op));
    }
    serde_json::from_value(Value::Object(obj)).map_err(|e| ProtocolError::BadArgs {
        op,
        msg: e.to_string(),
    })
}

/// A response line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub v: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The server turned the connection away because it serves as many as
    /// its cap allows ([`crate::listen`]): nothing was done, retry after a
    /// short wait ([`crate::listen::backoff`]). Sent on its own, before any
    /// request is read, and the connection is closed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

impl Response {
    /// A success carrying `result` (serialised; a result that cannot be is an error response).
    pub fn ok<T: Serialize>(result: &T) -> Response {
        match serde_json::to_value(result) {
            Ok(v) => Response {
                v: VERSION,
                ok: true,
                result: Some(v),
                error: None,
                busy: false,
            },
            Err(e) => Response::error(format!("cannot encode the result: {e}")),
        }
    }

    /// A refusal naming what was wrong.
    pub fn error(msg: impl Into<String>) -> Response {
        Response {
            v: VERSION,
            ok: false,
            result: None,
            error: Some(msg.into()),
            busy: false,
        }
    }

    /// "Busy, retry": the connection cap is reached (see [`Response::busy`]).
    pub fn busy(msg: impl Into<String>) -> Response {
        Response {
            busy: true,
            ..Response::error(msg)
        }
    }

    /// The response as one wire line (without the newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!(r#"{{"v":{VERSION},"ok":false,"error":"cannot encode the response: {e}"}}"#)
        })
    }

    /// The result on success, the error message otherwise.
    pub fn into_result(self) -> Result<Value, String> {
        if self.ok {
            Ok(self.result.unwrap_or(Value::Null))
        } else {
            Err(self
                .error
                .unwrap_or_else(|| "refused without a message".into()))
        }
    }
}

/// `show`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShowResult {
    /// The switch's build version.
    pub version: String,
    pub n_tables: u32,
    pub n_flows: usize,
    /// By ofport.
    pub ports: Vec<PortInfo>,
    /// The largest frame a pod port takes and sends whole (multi-buffer
    /// AF_XDP): pods and the gateway may have an MTU up to this less the
    /// 14-byte Ethernet header. 0 from a switch that does not say.
    #[serde(default)]
    pub max_frame_len: u32,
    /// Whether the switch's tunnel port segments TCP frames larger than
    /// the tunnel's inner MTU (userspace TSO): pods may then send TCP to
    /// other nodes in frames up to their MTU. False from a switch that
    /// does not say, or has no tunnel port.
    #[serde(default)]
    pub tunnel_tso: bool,
}

/// `add-flows`, `del-flows`, `mod-flows`, `replace-flows`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowModResult {
    pub added: usize,
    /// Adds that replaced an identical match and priority.
    pub replaced: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Flows in all tables afterwards.
    pub n_flows: usize,
}

/// `add-groups`, `mod-groups`, `del-groups`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupModResult {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Flows deleted because they named a deleted group.
    pub flows_deleted: usize,
    /// Groups afterwards.
    pub n_groups: usize,
}

/// `replace-groups`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceResult {
    pub flows: FlowModResult,
    pub groups: GroupModResult,
}

/// `dump-groups`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpGroupsResult {
    /// `ovs-ofctl -O OpenFlow15 dump-groups` lines (without the leading
    /// space), by group id.
    pub lines: Vec<String>,
    pub groups: Vec<GroupEntry>,
}

/// One group of a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupEntry {
    pub group_id: u32,
    /// `all`, `select`, `indirect` or `ff`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Bucket ids in order.
    pub buckets: Vec<u32>,
    /// Flows whose actions name the group.
    pub n_flows: usize,
}

/// `add-meters`, `mod-meters`, `del-meters`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterModResult {
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Flows deleted because they named a deleted meter.
    pub flows_deleted: usize,
    /// Meters afterwards.
    pub n_meters: usize,
}

/// `dump-meters`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpMetersResult {
    /// Per meter, by id, what `ovs-ofctl -O OpenFlow15 dump-meters` prints
    /// for it (`meter=1 pktps burst stats bands=` and a line per band).
    pub lines: Vec<String>,
    pub meters: Vec<MeterEntry>,
}

/// One meter of a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterEntry {
    pub meter_id: u32,
    /// `kbps` or `pktps`.
    pub unit: String,
    pub burst: bool,
    pub stats: bool,
    /// Drop bands: (rate, burst_size).
    pub bands: Vec<(u32, u32)>,
    /// Flows whose actions name the meter.
    pub n_flows: usize,
}

/// `meter-stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterStatsResult {
    /// Per meter, by id, what `ovs-ofctl -O OpenFlow15 meter-stats` prints.
    pub lines: Vec<String>,
    pub meters: Vec<MeterStatsEntry>,
}

/// One meter's counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeterStatsEntry {
    pub meter_id: u32,
    pub flow_count: u64,
    pub packet_in_count: u64,
    pub byte_in_count: u64,
    pub duration_ns: u64,
    /// Per band: packets and bytes it dropped.
    pub bands: Vec<(u64, u64)>,
}

/// One flow of a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEntry {
    pub table: u8,
    /// The table's name in the oxvs plan, if it has one.
    #[serde(default)]
    pub table_name: Option<String>,
    pub priority: u16,
    pub cookie: u64,
    pub duration_ns: u64,
    pub n_packets: u64,
    pub n_bytes: u64,
    /// Seconds since the last hit (`None`: never hit).
    #[serde(default)]
    pub idle_age_s: Option<u64>,
    /// The match in `ovs-ofctl` syntax (without priority).
    #[serde(rename = "match")]
    pub matches: String,
    /// The actions in `ovs-ofctl` syntax.
    pub actions: String,
}

/// `dump-flows`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpFlowsResult {
    /// `ovs-ofctl dump-flows` lines, in order: by table, descending priority.
    pub lines: Vec<String>,
    /// The same flows, structured.
    pub flows: Vec<FlowEntry>,
}

/// `dump-ports`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpPortsResult {
    pub ports: Vec<PortInfo>,
}

/// `trace`.
///
/// `text` and `trace` say the same: both come from one trace of the
/// pipeline, and `text` is its rendering (`oxvs_pipeline::trace`, the only
/// place the text is made). Programs read `trace`; people read `text`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceResult {
    /// The `ofproto/trace`-style explanation.
    pub text: String,
    /// Whether the packet was also sent through the datapath.
    pub injected: bool,
    /// The trace, structured. `None` from a switch older than the field
    /// (it sent `text` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceReport>,
}

/// A trace, structured: the packet as given, then each recirculation it
/// led to (`ct(table=..)`), one [`TracePass`] each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceReport {
    pub passes: Vec<TracePass>,
    /// Recirculations queued but not traced: the trace stopped at its limit.
    #[serde(default)]
    pub unprocessed: usize,
}

/// One translation: the packet, the table lookups, what it does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TracePass {
    /// The recirculation this pass resumes; `None` for the packet as given.
    #[serde(default)]
    pub recirc: Option<TraceRecirc>,
    /// The packet's flow as it enters (`Flow:`), `ovs-ofctl` syntax.
    pub flow: String,
    /// The table lookups in the order they happened. A lookup reached by a
    /// `resubmit` or `goto_table` names its parent step; its own actions
    /// are its own, not the parent's.
    #[serde(default)]
    pub steps: Vec<TraceLookup>,
    /// Notes outside any lookup (e.g. an unknown recirculation id).
    #[serde(default)]
    pub notes: Vec<TraceNote>,
    /// The flow after the last action (`Final flow:`; the same as `flow`
    /// when unchanged).
    pub final_flow: String,
    /// `Megaflow:`.
    pub megaflow: String,
    /// `Datapath actions:` (`drop` for none).
    pub datapath_actions: String,
    /// What the datapath actions do with the packet.
    pub verdict: TraceVerdict,
    /// Why translation failed (the packet is dropped).
    #[serde(default)]
    pub error: Option<String>,
}

/// Why a pass is traced: the recirculation after a `ct(table=T)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecirc {
    /// `recirc_id` (`T + 1`).
    pub id: u32,
    /// The table the packet resumes in.
    #[serde(default)]
    pub table: Option<u8>,
    /// The conntrack state assumed (`trk|new`).
    pub ct_state: String,
    /// Whether it is the default (no `ct_next` left).
    pub default_state: bool,
}

/// One table lookup of a pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceLookup {
    pub table: u8,
    /// When the trace names tables.
    #[serde(default)]
    pub table_name: Option<String>,
    /// The step (index in the pass's `steps`) whose `resubmit` or
    /// `goto_table` led here; `None` for the pass's first lookup.
    #[serde(default)]
    pub parent: Option<usize>,
    /// The flow that matched; `None`: none did (the table-miss drop).
    #[serde(default)]
    pub flow: Option<TraceFlow>,
    /// The actions the flow executed, in order (none after a miss).
    #[serde(default)]
    pub actions: Vec<TraceAction>,
    /// Notes that follow no action of the step.
    #[serde(default)]
    pub notes: Vec<TraceNote>,
}

/// The flow a lookup matched.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceFlow {
    pub cookie: u64,
    pub priority: u16,
    /// The match in `ovs-ofctl` syntax, without the priority (empty: it
    /// matches everything).
    #[serde(rename = "match")]
    pub matches: String,
    /// All its actions, as `dump-flows` prints them (`drop` for none).
    pub actions: String,
}

/// An action a flow executed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceAction {
    /// As the trace prints it (`resubmit(,SpoofGuard)`, `output:3`).
    pub action: String,
    /// What it did, or why it did nothing (`Nonexistent output port`).
    #[serde(default)]
    pub notes: Vec<TraceNote>,
    /// A `resubmit` or `goto_table`: the step it led to.
    #[serde(default)]
    pub lookup: Option<usize>,
}

/// A ` -> `, ` >> ` or ` >>>> ` line of the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceNote {
    pub kind: TraceNoteKind,
    pub text: String,
}

/// What a [`TraceNote`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceNoteKind {
    /// ` -> ` what the action did.
    Detail,
    /// ` >> ` why the action did nothing.
    Warning,
    /// ` >>>> <<<<` translation failed here.
    Error,
    /// A kind this build does not know (a newer switch).
    #[serde(other)]
    Other,
}

/// What a pass's datapath actions do with the packet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceVerdict {
    /// Copies sent to ports, in order.
    #[serde(default)]
    pub outputs: Vec<TraceOutput>,
    /// Copies sent to the controller (packet-ins).
    #[serde(default)]
    pub controller: Vec<TraceController>,
    /// `ct(table=..)` recirculation ids (each traced as a later pass).
    #[serde(default)]
    pub recirculations: Vec<u32>,
    /// Set when the pass sends the packet nowhere (no output, controller
    /// or recirculation), with why.
    #[serde(default)]
    pub drop: Option<TraceDrop>,
}

/// A copy of the packet sent to a port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceOutput {
    pub port: u32,
    /// The packet as it is sent (the pass's flow with the header writes
    /// before this output), `ovs-ofctl` syntax.
    pub packet: String,
    /// Its headers.
    pub headers: TraceHeaders,
    /// The tunnel metadata it is sent with (to a tunnel port).
    #[serde(default)]
    pub tunnel: Option<TraceTunnel>,
}

/// The headers of a packet as it is sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeaders {
    /// `aa:bb:cc:dd:ee:ff`.
    pub dl_src: String,
    pub dl_dst: String,
    pub dl_type: u16,
    /// The 802.1Q VLAN ID, when tagged.
    #[serde(default)]
    pub vlan: Option<u16>,
    /// IPv4 or IPv6 addresses (IP packets only).
    #[serde(default)]
    pub nw_src: Option<std::net::IpAddr>,
    #[serde(default)]
    pub nw_dst: Option<std::net::IpAddr>,
    /// IP protocol, TTL / hop limit (0 when not IP).
    #[serde(default)]
    pub nw_proto: u8,
    #[serde(default)]
    pub nw_ttl: u8,
    /// L4 ports, or ICMP type and code.
    #[serde(default)]
    pub tp_src: u16,
    #[serde(default)]
    pub tp_dst: u16,
}

/// Tunnel metadata of an output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceTunnel {
    pub tun_id: u64,
    /// Outer source (`None`: the port's local address).
    #[serde(default)]
    pub src: Option<std::net::IpAddr>,
    /// Outer destination (IPv4 or IPv6: the tunnel's underlay family).
    pub dst: std::net::IpAddr,
}

/// A copy of the packet sent to the controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceController {
    /// `action`, `no_match` or `invalid_ttl`.
    pub reason: String,
    /// The flow that sent it.
    pub table: u8,
    pub cookie: u64,
}

/// Why a pass sends the packet nowhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceDrop {
    pub reason: TraceDropReason,
    /// The step that decided (index in the pass's `steps`): the one whose
    /// output was refused, where translation failed, else the last one.
    #[serde(default)]
    pub step: Option<usize>,
    /// The port of a refused output, when known.
    #[serde(default)]
    pub port: Option<u32>,
    /// For people: `no flow matched in table 10 (SpoofGuard)`, `output to
    /// nonexistent port 7`, the translation error...
    pub detail: String,
}

/// The reason of a [`TraceDrop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceDropReason {
    /// The last table looked up had no matching flow (table-miss drop).
    NoMatch,
    /// The flows sent it nowhere (`drop`, or no output action).
    NoOutput,
    /// Its outputs went only to ports that do not exist (OVS:
    /// "Nonexistent output port").
    NonexistentPort,
    /// Its outputs were skipped for another reason (`skipping output to
    /// input port`).
    OutputSkipped,
    /// Translation failed.
    Error,
    /// A reason this build does not know (a newer switch).
    #[serde(other)]
    Other,
}

impl TraceReport {
    /// The first copy sent to a port, and the pass that sent it.
    pub fn first_output(&self) -> Option<(usize, &TraceOutput)> {
        self.passes
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.verdict.outputs.first().map(|o| (i, o)))
    }

    /// The drop of the last pass that dropped the packet, and that pass.
    pub fn last_drop(&self) -> Option<(usize, &TraceDrop)> {
        self.passes
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, p)| p.verdict.drop.as_ref().map(|d| (i, d)))
    }
}

/// One connection of `dump-conntrack`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackEntry {
    /// `ovs-appctl dpctl/dump-conntrack` line.
    pub line: String,
    /// IP protocol number.
    pub proto: u8,
    pub zone: u16,
    pub mark: u32,
    /// Label as hex (`0x..`).
    pub labels: String,
    /// `src=..,dst=..,sport=..,dport=..`.
    pub orig: String,
    pub reply: String,
    /// TCP state as OVS prints it.
    #[serde(default)]
    pub tcp_state: Option<String>,
    /// Milliseconds until it expires (0: expired, not yet removed).
    pub expires_in_ms: u64,
    /// The OpenFlow port it counts against (the port of the packet that
    /// committed it), if any.
    #[serde(default)]
    pub owner: Option<u32>,
}

/// `dump-conntrack`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpConntrackResult {
    pub entries: Vec<ConntrackEntry>,
}

/// `flush-conntrack`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushConntrackResult {
    pub flushed: usize,
}

/// One port's limit in a [`Request::CtSetLimits`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtPortLimitSpec {
    /// The port: its name or its OpenFlow number.
    pub port: String,
    /// Most connections it may own (0: no limit); `None`: the default.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// `ct-set-limits`, `ct-get-limits`: the limits in force.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtLimitsResult {
    /// The table's size (`--ct-max`).
    pub max_entries: usize,
    /// Connections in the table now.
    pub entries: usize,
    /// The limit of ports without their own (0: none).
    pub default_limit: u32,
    pub ports: Vec<CtPortLimitEntry>,
}

/// One port of a [`CtLimitsResult`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtPortLimitEntry {
    pub ofport: u32,
    /// The port's name (`None`: no port has this number now).
    #[serde(default)]
    pub name: Option<String>,
    /// The limit in force (0: none).
    pub limit: u32,
    /// Whether the port has its own limit (else the default applies).
    pub explicit: bool,
    /// Connections it owns.
    pub count: u32,
    /// Its new connections refused by the limit.
    pub refused: u64,
}

/// `stats`: datapath counters summed over threads. Lookup counters count
/// passes (a recirculated packet is looked up once per pass).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsResult {
    pub threads: usize,
    pub packets: u64,
    pub bytes: u64,
    /// Passes answered by the exact-match cache.
    pub emc_hits: u64,
    /// Passes answered by the megaflow cache.
    pub megaflow_hits: u64,
    /// Passes that went to the slow path.
    pub upcalls: u64,
    pub megaflow_inserts: u64,
    /// Slow-path translations that failed.
    pub xlate_errors: u64,
    pub cache_flushes: u64,
    pub recirculations: u64,
    pub drops: u64,
    pub recirc_limit_drops: u64,
    pub write_errors: u64,
    pub outputs: u64,
    pub packet_ins: u64,
    /// Time the datapath threads spent processing packets.
    pub busy_ns: u64,
    /// `busy_ns / packets` (`None` before the first packet).
    #[serde(default)]
    pub ns_per_packet: Option<f64>,
    pub n_flows: usize,
    pub conntrack_entries: usize,
    /// IP fragments held by the reassembler until their datagram completes
    /// (counter).
    #[serde(default)]
    pub frags_held: u64,
    /// IP fragments the reassembler refused (counter).
    #[serde(default)]
    pub frag_drops: u64,
    /// Datagrams reassembled for conntrack (counter).
    #[serde(default)]
    pub reassembled: u64,
    /// Incomplete datagrams held now.
    #[serde(default)]
    pub ipf_held_datagrams: u64,
    /// Bytes of fragments held now.
    #[serde(default)]
    pub ipf_held_bytes: u64,
    /// Packets dropped because conntrack refused their new connection
    /// (a port's limit, or a full table).
    #[serde(default)]
    pub ct_refused_drops: u64,
    /// Commits refused by a port's connection limit.
    #[serde(default)]
    pub ct_limit_refused: u64,
    /// Commits refused because the table was full and nothing could be
    /// dropped early.
    #[serde(default)]
    pub ct_table_full: u64,
    /// Unreplied connections dropped early to make room.
    #[serde(default)]
    pub ct_early_drops: u64,
    /// New connections not committed because the pipeline dropped their
    /// packet after the commit.
    #[serde(default)]
    pub ct_commits_discarded: u64,
    /// Frames (4 KiB, pinned) of the UMEMs the datapath threads' ports
    /// share (ports with their own UMEM not included).
    #[serde(default)]
    pub umem_frames: u64,
    /// Of those, the frames free now (on no ring, in no batch).
    #[serde(default)]
    pub umem_free_frames: u64,
    /// Learned flows (`learn` actions) the datapath handed on.
    #[serde(default)]
    pub learns: u64,
    /// Learned flows added to the tables (new match and priority).
    #[serde(default)]
    pub learned_added: u64,
    /// Learned flows that replaced an installed flow with other actions,
    /// cookie or timeouts.
    #[serde(default)]
    pub learned_replaced: u64,
    /// Learned flows identical to an installed one (its hard timeout
    /// started again).
    #[serde(default)]
    pub learned_refreshed: u64,
    /// Learned flows dropped because the learn queue was full.
    #[serde(default)]
    pub learn_dropped: u64,
    /// Learned flows the tables refused.
    #[serde(default)]
    pub learn_failed: u64,
    /// Flows removed by their idle or hard timeout (and with a
    /// `delete_learned` learner).
    #[serde(default)]
    pub flows_expired: u64,
    /// ICMP "fragmentation needed" / "packet too big" answers to packets
    /// too big for a tunnel.
    #[serde(default)]
    pub icmp_too_big: u64,
    /// ICMP port unreachable answers to packets a flow rejected.
    #[serde(default)]
    pub rejects: u64,
    /// Rejected packets not answered: over the rate limit.
    #[serde(default)]
    pub rejects_limited: u64,
    /// ICMP time exceeded answers to packets whose TTL (hop limit) a
    /// `dec_ttl` found at 0 or 1.
    #[serde(default)]
    pub time_exceeded: u64,
    /// Such packets not answered: over the rate limit.
    #[serde(default)]
    pub time_exceeded_limited: u64,
    /// Such packets not answered because they must not or cannot be (an
    /// ICMP error, a later fragment, a non-unicast address, a malformed
    /// header, no address to answer from).
    #[serde(default)]
    pub time_exceeded_unanswered: u64,
}

/// One packet sent to the controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketInEntry {
    pub in_port: u32,
    pub table: u8,
    pub cookie: u64,
    /// `no_match`, `action` or `invalid_ttl`.
    pub reason: String,
    /// Hex.
    pub userdata: String,
    /// The Ethernet frame, hex.
    pub frame: String,
}

/// `packet-in`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketInResult {
    pub packets: Vec<PacketInEntry>,
}

/// `version`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionResult {
    /// The switch's build version.
    pub version: String,
    /// The protocol version it speaks.
    pub protocol: u32,
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Parses hex bytes; whitespace, `:` and a leading `0x` are allowed.
pub fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    let t = text.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    let digits: Vec<u8> = t
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b':')
        .collect();
    if digits.is_empty() {
        return Err("empty hex string".into());
    }
    if digits.len() & 1 == 1 {
        return Err(format!("odd number of hex digits ({})", digits.len()));
    }
    let nib = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    digits
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| match pair {
            [h, l] => match (nib(*h), nib(*l)) {
                (Some(h), Some(l)) => Ok((h << 4) | l),
                _ => Err(format!(
                    "bad hex byte '{}' at byte {i}",
                    String::from_utf8_lossy(pair)
                )),
            },
            _ => Err("odd number of hex digits".into()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PortKind, XdpModeRequest};

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Show,
            Request::AddPort(PortSpec {
                name: "p1".into(),
                ofport: Some(3),
                kind: PortKind::Afxdp {
                    ifname: Some("veth1".into()),
                    xdp_mode: XdpModeRequest::Native,
                    n_rxq: None,
                },
            }),
            Request::AddPort(PortSpec {
                name: "tun0".into(),
                ofport: None,
                kind: PortKind::Vxlan {
                    local_ip: "192.168.1.1".parse().unwrap(),
                    dst_port: Some(4789),
                    underlay_mtu: None,
                },
            }),
            Request::AddPort(PortSpec {
                name: "tun6".into(),
                ofport: None,
                kind: PortKind::Vxlan {
                    local_ip: "fd00:192:168::1".parse().unwrap(),
                    dst_port: None,
                    underlay_mtu: Some(1500),
                },
            }),
            Request::DelPort { name: "p1".into() },
            Request::AddFlows {
                flows: "table=0 actions=drop\n".into(),
            },
            Request::DelFlows {
                spec: Some("table=0,ip".into()),
                strict: true,
            },
            Request::DelFlows {
                spec: None,
                strict: false,
            },
            Request::ModFlows {
                flows: "actions=drop".into(),
                strict: false,
            },
            Request::ReplaceFlows { flows: "".into() },
            Request::AddGroups {
                groups: "group_id=1,type=all,bucket=output:1".into(),
            },
            Request::ModGroups {
                groups: "group_id=1,type=all".into(),
                may_create: true,
            },
            Request::DelGroups {
                spec: Some("group_id=1".into()),
            },
            Request::DelGroups { spec: None },
            Request::ReplaceGroups {
                groups: "group_id=1,type=all".into(),
                flows: "actions=group:1".into(),
            },
            Request::DumpGroups { group_id: Some(1) },
            Request::AddMeters {
                meters: "meter=1,pktps,band=type=drop,rate=10".into(),
            },
            Request::ModMeters {
                meters: "meter=1,pktps,band=type=drop,rate=20".into(),
            },
            Request::DelMeters {
                spec: Some("meter=1".into()),
            },
            Request::DumpMeters { meter_id: Some(1) },
            Request::MeterStats { meter_id: None },
            Request::Bundle {
                mods: "delete_strict table=0,priority=5\nadd actions=drop".into(),
            },
            Request::DumpFlows {
                table: Some("SpoofGuard".into()),
                names: true,
                stats: false,
            },
            Request::DumpPorts,
            Request::Trace(TraceRequest {
                spec: Some("in_port=1,ip".into()),
                ct_next: vec!["trk,est".into()],
                inject: true,
                ..TraceRequest::default()
            }),
            Request::Trace(TraceRequest {
                packet_hex: Some("00ff".into()),
                in_port: Some(2),
                ..TraceRequest::default()
            }),
            Request::DumpConntrack { zone: Some(5) },
            Request::FlushConntrack {
                zone: None,
                proto: None,
                reply_src: None,
                reply_sport: None,
            },
            Request::FlushConntrack {
                zone: Some(65520),
                proto: Some(17),
                reply_src: Some("10.244.1.2".parse().unwrap()),
                reply_sport: Some(53),
            },
            Request::CtSetLimits {
                default: Some(100),
                ports: vec![
                    CtPortLimitSpec {
                        port: "pod-a".into(),
                        limit: Some(10),
                    },
                    CtPortLimitSpec {
                        port: "3".into(),
                        limit: None,
                    },
                ],
            },
            Request::CtGetLimits {
                ports: vec!["pod-a".into()],
            },
            Request::Stats,
            Request::PacketIn {
                max: 3,
                wait_ms: 100,
            },
            Request::Version,
        ]
    }

    #[test]
    fn every_request_round_trips_through_a_line() {
        let mut seen = std::collections::BTreeSet::new();
        for r in all_requests() {
            let line = r.to_line();
            assert!(!line.contains('\n'), "{line}");
            assert!(line.contains(r#""v":1"#), "{line}");
            assert!(line.contains(&format!(r#""op":"{}""#, r.op())), "{line}");
            assert_eq!(parse_request(&line), Ok(r.clone()), "{line}");
            seen.insert(r.op());
        }
        // Every op is covered, and OPS lists exactly them.
        assert_eq!(seen.len(), OPS.len());
        assert!(OPS.iter().all(|o| seen.contains(o)));
    }

    #[test]
    fn vxlan_local_ip_of_either_family_and_old_json() {
        // An IPv4 string, as every client sent it before IPv6 underlays,
        // still parses; an IPv6 one gives an IPv6 port.
        let old = r#"{"v":1,"op":"add-port","name":"tun0","kind":{"type":"vxlan","local_ip":"192.168.1.1"}}"#;
        let Ok(Request::AddPort(p)) = parse_request(old) else {
            panic!("{old}")
        };
        assert_eq!(
            p.kind,
            PortKind::Vxlan {
                local_ip: std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 168, 1, 1)),
                dst_port: None,
                underlay_mtu: None,
            }
        );
        // And serialises as before.
        assert!(Request::AddPort(p)
            .to_line()
            .contains(r#""local_ip":"192.168.1.1""#));
        let v6 =
            r#"{"v":1,"op":"add-port","name":"tun0","kind":{"type":"vxlan","local_ip":"fd00::1"}}"#;
        let Ok(Request::AddPort(p)) = parse_request(v6) else {
            panic!("{v6}")
        };
        assert!(matches!(p.kind, PortKind::Vxlan { local_ip, .. } if local_ip.is_ipv6()));
        let bad = r#"{"v":1,"op":"add-port","name":"tun0","kind":{"type":"vxlan","local_ip":"fd00::1::2"}}"#;
        assert!(parse_request(bad).is_err());
    }

    #[test]
    fn wire_form_is_as_documented() {
        let r = parse_request(r#"{"v":1,"op":"dump-flows","table":"10"}"#).unwrap();
        assert_eq!(
            r,
            Request::DumpFlows {
                table: Some("10".into()),
                names: false,
                stats: true
            }
        );
        let r = parse_request(r#"{"op":"packet-in","v":1}"#).unwrap();
        assert_eq!(
            r,
            Request::PacketIn {
                max: 100,
                wait_ms: 0
            }
        );
        let r =
            parse_request(r#"{"v":1,"op":"add-port","name":"p","kind":{"type":"afxdp"}}"#).unwrap();
        assert_eq!(
            r,
            Request::AddPort(PortSpec {
                name: "p".into(),
                ofport: None,
                kind: PortKind::Afxdp {
                    ifname: None,
                    xdp_mode: XdpModeRequest::Auto,
                    n_rxq: None,
                }
            })
        );
    }

    #[test]
    fn bad_requests_name_what_was_wrong() {
        let cases: &[(&str, &str)] = &[
            ("not json", "not valid JSON"),
            ("", "not valid JSON"),
            ("[1,2]", "JSON object, got an array"),
            (r#"{"op":"show"}"#, "no \"v\""),
            (r#"{"v":2,"op":"show"}"#, "unsupported protocol version 2"),
            (
                r#"{"v":"1","op":"show"}"#,
                "unsupported protocol version \"1\"",
            ),
            (r#"{"v":1}"#, "no \"op\""),
            (r#"{"v":1,"op":"frobnicate"}"#, "unknown op 'frobnicate'"),
            (r#"{"v":1,"op":7}"#, "unknown op '7'"),
            (r#"{"v":1,"op":"del-port"}"#, "bad arguments for 'del-port'"),
            (
                r#"{"v":1,"op":"dump-flows","tabel":"1"}"#,
                "unknown field `tabel`",
            ),
            (
                r#"{"v":1,"op":"dump-conntrack","zone":70000}"#,
                "bad arguments for 'dump-conntrack'",
            ),
            (
                r#"{"v":1,"op":"trace","spec":"x","bogus":1}"#,
                "unknown field `bogus`",
            ),
            (
                r#"{"v":1,"op":"ct-set-limits","default":-1}"#,
                "bad arguments for 'ct-set-limits'",
            ),
            (
                r#"{"v":1,"op":"ct-set-limits","ports":[{"port":"a","limt":3}]}"#,
                "unknown field `limt`",
            ),
            (
                r#"{"v":1,"op":"ct-get-limits","ports":"a"}"#,
                "bad arguments for 'ct-get-limits'",
            ),
        ];
        for (line, want) in cases {
            let e = parse_request(line).unwrap_err().to_string();
            assert!(e.contains(want), "{line}: {e}");
        }
    }

    #[test]
    fn responses_round_trip() {
        let ok = Response::ok(&FlushConntrackResult { flushed: 3 });
        let line = ok.to_line();
        assert_eq!(line, r#"{"v":1,"ok":true,"result":{"flushed":3}}"#);
        let back: Response = serde_json::from_str(&line).unwrap();
        assert_eq!(back, ok);
        let v = back.into_result().unwrap();
        let r: FlushConntrackResult = serde_json::from_value(v).unwrap();
        assert_eq!(r.flushed, 3);

        let err = Response::error("no port named 'x'");
        let line = err.to_line();
        assert_eq!(line, r#"{"v":1,"ok":false,"error":"no port named 'x'"}"#);
        let back: Response = serde_json::from_str(&line).unwrap();
        assert_eq!(back.into_result().unwrap_err(), "no port named 'x'");
    }

    /// A switch before the structured trace sends `text` and `injected`
    /// only; one after sends `trace` too, which an older reader ignores.
    /// Kinds and reasons a newer switch adds read as `other`.
    #[test]
    fn trace_results_read_both_ways() {
        let old: TraceResult =
            serde_json::from_str(r#"{"text":"Flow: ip\nDatapath actions: drop","injected":false}"#)
                .unwrap();
        assert_eq!(old.trace, None);
        assert_eq!(
            serde_json::to_value(&old).unwrap(),
            serde_json::json!({"text": "Flow: ip\nDatapath actions: drop", "injected": false})
        );
        let new = TraceResult {
            text: "t".into(),
            injected: true,
            trace: Some(TraceReport {
                passes: vec![TracePass {
                    flow: "ip".into(),
                    steps: vec![TraceLookup {
                        table: 0,
                        flow: Some(TraceFlow {
                            cookie: 0x2,
                            priority: 5,
                            matches: "ip".into(),
                            actions: "output:7".into(),
                        }),
                        actions: vec![TraceAction {
                            action: "output:7".into(),
                            notes: vec![TraceNote {
                                kind: TraceNoteKind::Warning,
                                text: "Nonexistent output port".into(),
                            }],
                            lookup: None,
                        }],
                        ..TraceLookup::default()
                    }],
                    datapath_actions: "drop".into(),
                    verdict: TraceVerdict {
                        drop: Some(TraceDrop {
                            reason: TraceDropReason::NonexistentPort,
                            step: Some(0),
                            port: Some(7),
                            detail: "output to nonexistent port 7".into(),
                        }),
                        ..TraceVerdict::default()
                    },
                    ..TracePass::default()
                }],
                unprocessed: 0,
            }),
        };
        let v = serde_json::to_value(&new).unwrap();
        assert_eq!(v["trace"]["passes"][0]["steps"][0]["flow"]["match"], "ip");
        assert_eq!(
            v["trace"]["passes"][0]["verdict"]["drop"]["reason"],
            "nonexistent-port"
        );
        assert_eq!(
            serde_json::from_value::<TraceResult>(v.clone()).unwrap(),
            new
        );
        // The reader of the old shape (text and injected) is not disturbed.
        #[derive(Deserialize)]
        struct OldReader {
            text: String,
            injected: bool,
        }
        let o: OldReader = serde_json::from_value(v.clone()).unwrap();
        assert_eq!((o.text.as_str(), o.injected), ("t", true));
        let mut v = v;
        v["trace"]["passes"][0]["verdict"]["drop"]["reason"] = "frobnicated".into();
        v["trace"]["passes"][0]["steps"][0]["actions"][0]["notes"][0]["kind"] = "hint".into();
        let r: TraceResult = serde_json::from_value(v).unwrap();
        let p = &r.trace.unwrap().passes[0];
        assert_eq!(
            p.verdict.drop.as_ref().unwrap().reason,
            TraceDropReason::Other
        );
        assert_eq!(p.steps[0].actions[0].notes[0].kind, TraceNoteKind::Other);
    }

    #[test]
    fn flow_entry_uses_match_key() {
        let e = FlowEntry {
            table: 0,
            table_name: Some("Classifier".into()),
            priority: 1,
            cookie: 0,
            duration_ns: 0,
            n_packets: 0,
            n_bytes: 0,
            idle_age_s: None,
            matches: "ip".into(),
            actions: "drop".into(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["match"], "ip");
        assert_eq!(serde_json::from_value::<FlowEntry>(v).unwrap(), e);
    }

    #[test]
    fn hex_both_ways() {
        assert_eq!(to_hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(from_hex("0x00AB10"), Ok(vec![0, 0xab, 0x10]));
        assert_eq!(from_hex("00 ab:10"), Ok(vec![0, 0xab, 0x10]));
        assert!(from_hex("abc").unwrap_err().contains("odd"));
        assert!(from_hex("zz").unwrap_err().contains("'zz'"));
        assert!(from_hex("").is_err());
        assert!(from_hex("é1").is_err());
    }
}
