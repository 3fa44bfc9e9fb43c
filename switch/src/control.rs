//! The control server: oxvs-switchd's Unix socket.
//!
//! ## What it does
//!
//! [`ControlServer::start`] listens on a Unix socket (mode 0600 from the
//! instant it exists, parent directory created: [`oxvs_api::listen`]) and
//! answers the newline-delimited JSON protocol of
//! [`oxvs_api::protocol`] against one [`Switch`]. Flow operations go straight
//! to the switch's [`Pipeline`](oxvs_pipeline::tables::Pipeline): text is
//! parsed with [`oxvs_pipeline::parse`] and applied as one atomic bundle
//! (`apply` / `replace_all`), so a file with one bad flow changes nothing and
//! the error names its line (and column and token, for syntax errors).
//! Dumps and traces read the current table version without locking.
//!
//! ## Invariants
//!
//! - Every request line gets exactly one response line, in order. A line
//!   that is not JSON, has the wrong version or an unknown op is answered
//!   with an error; the connection stays usable. Only a line longer than
//!   [`MAX_LINE`] ends the connection (after an error response), since the
//!   stream cannot be resynchronised.
//! - A panic while handling a request (a bug) is caught and answered as an
//!   internal error; the daemon keeps serving.
//! - Startup refuses a socket held by a live switchd (one that accepts a
//!   connection) and replaces a stale one (connection refused). A path that
//!   exists but is not a socket is never removed.
//! - On [`ControlServer::stop`] (or drop) the socket file is removed, but
//!   only if it is still the one this server bound (same inode).
//!
//! ## Time
//!
//! Flow creation times and ages are on [`monotonic_ns`] (`CLOCK_MONOTONIC`),
//! which must be the clock the datapath passes to `process_batch`, so that
//! `duration` and `idle_age` in dumps agree with the counters.
//!
//! ## Concurrency
//!
//! One accept thread; one thread per connection, at most
//! [`Limits::max_connections`] at once (default [`DEFAULT_MAX_CONNECTIONS`],
//! `--control-max-connections`): one more gets a `"busy": true` response
//! line and is closed, and clients ([`oxvs_api::Client`]) retry with a
//! backoff. A connection that sends nothing for [`Limits::idle_timeout`]
//! while a request is awaited (default [`DEFAULT_IDLE_TIMEOUT`],
//! `--control-idle-timeout`) is closed; so is one that does not read its
//! responses for that long. Handlers only take `&Switch`; flow writers are serialised
//! inside the pipeline. `stop` sets a flag, wakes the accept thread by
//! shutting the listening socket down (its `accept` fails at once; not by
//! connecting to the path, which may be gone or someone else's by then),
//! shuts down every open connection and joins the
//! accept thread. Lock order: the connection registry lock is never held
//! while calling into the switch.

mod compose;
pub mod conntrack;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxvs_api::listen::{self, Gate, Limits, ListenError, ListenStats};
use oxvs_api::protocol::{
    self, DumpFlowsResult, DumpGroupsResult, DumpMetersResult, DumpPortsResult, FlowEntry,
    FlowModResult, GroupEntry, GroupModResult, MeterEntry, MeterModResult, MeterStatsEntry,
    MeterStatsResult, PacketInEntry, PacketInResult, ReplaceResult, Request, Response, ShowResult,
    StatsResult, TraceRequest, TraceResult, VersionResult, MAX_LINE, MAX_PACKET_IN_WAIT_MS,
};
use oxvs_pipeline::field::ct_state;
use oxvs_pipeline::flow::{Flow, FlowMod, FlowModCommand, N_TABLES};
use oxvs_pipeline::group::{Group, GroupMod};
use oxvs_pipeline::meter::{self, MeterMod, MeterUnit};
use oxvs_pipeline::parse::{self, ParseContext, ParseError};
use oxvs_pipeline::print::{self, DumpOptions, FlowStats};
use oxvs_pipeline::tables::{ApplyReport, FlowModError, TableMod};
use oxvs_pipeline::trace::{self as ptrace, TraceOptions};
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_pipeline::Field;

use crate::engine::Switch;

/// Most connections served at once, unless configured otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// How long a connection may sit idle, unless configured otherwise.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The default [`Limits`] of the control socket.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_connections: DEFAULT_MAX_CONNECTIONS,
    idle_timeout: DEFAULT_IDLE_TIMEOUT,
};

/// How long the accept thread waits to hand a turned-away client its
/// "busy" line.
const BUSY_WRITE_TIMEOUT: Duration = Duration::from_millis(200);

/// Most packet-ins one `packet-in` request takes.
const MAX_PACKET_INS: usize = 10_000;

/// Nanoseconds on the datapath's monotonic clock ([`crate::engine::monotonic_ns`]).
pub fn monotonic_ns() -> u64 {
    // The datapath's clock: flow ages and rule last-used times must compare.
    crate::engine::monotonic_ns()
}

/// Why the control server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("another oxvs-switchd is serving {}", .0.display())]
    AlreadyServing(PathBuf),
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    #[error(transparent)]
    Listen(ListenError),
    #[error("cannot start the control thread for {}: {source}", .path.display())]
    Thread {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<ListenError> for ControlError {
    fn from(e: ListenError) -> ControlError {
        match e {
            ListenError::AlreadyServing(p) => ControlError::AlreadyServing(p),
            ListenError::NotASocket(p) => ControlError::NotASocket(p),
            e => ControlError::Listen(e),
        }
    }
}

/// Open connections, so `stop` can close them.
type Registry = Arc<Mutex<HashMap<u64, UnixStream>>>;

/// A running control server (see the module doc).
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    /// (device, inode) of the socket file this server bound.
    ident: (u64, u64),
    stop: Arc<AtomicBool>,
    conns: Registry,
    stats: Arc<ListenStats>,
    accept: Option<JoinHandle<()>>,
    /// The listening socket (a second handle): shut down to wake the
    /// accept thread.
    wake: Option<UnixListener>,
}

impl ControlServer {
    /// Binds `path` and serves `switch` on it from background threads,
    /// with the [`DEFAULT_LIMITS`].
    pub fn start(
        path: impl Into<PathBuf>,
        switch: Arc<Switch>,
    ) -> Result<ControlServer, ControlError> {
        ControlServer::start_with(path, switch, DEFAULT_LIMITS)
    }

    /// [`ControlServer::start`] with a connection cap and idle timeout.
    pub fn start_with(
        path: impl Into<PathBuf>,
        switch: Arc<Switch>,
        limits: Limits,
    ) -> Result<ControlServer, ControlError> {
        let path = path.into();
        let listener = listen::bind_private_unix(&path)?;
        let wake = listener.try_clone().ok();
        let meta = std::fs::metadata(&path).map_err(|source| {
            ControlError::Listen(ListenError::Socket {
                path: path.clone(),
                step: "stat",
                source,
            })
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Registry = Arc::default();
        let gate = Gate::new(limits);
        let stats = gate.stats();
        let accept = {
            let stop = stop.clone();
            let conns = conns.clone();
            let sock = path.clone();
            std::thread::Builder::new()
                .name("oxvs-control".into())
                .spawn(move || accept_loop(listener, switch, stop, conns, gate, &sock))
                .map_err(|source| ControlError::Thread {
                    path: path.clone(),
                    source,
                })?
        };
        tracing::info!(socket = %path.display(), "control socket listening");
        Ok(ControlServer {
            path,
            ident: (meta.dev(), meta.ino()),
            stop,
            conns,
            stats,
            accept: Some(accept),
            wake,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Connections served, turned away busy and closed idle (for `/metrics`).
    pub fn stats(&self) -> Arc<ListenStats> {
        self.stats.clone()
    }

    /// Stops accepting, closes open connections and removes the socket file
    /// (if it is still ours). Idempotent.
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept thread; it sees the flag and returns.
        match self.wake.take() {
            Some(l) => oxvs_api::listen::wake_accept(std::os::fd::AsRawFd::as_raw_fd(&l)),
            None => drop(UnixStream::connect(&self.path)),
        }
        let _ = accept.join();
        let open: Vec<UnixStream> = {
            let mut map = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            map.drain().map(|(_, s)| s).collect()
        };
        for s in open {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.ident => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove the control socket");
                }
            }
            _ => {}
        }
        tracing::info!(socket = %self.path.display(), "control socket closed");
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(
    listener: UnixListener,
    switch: Arc<Switch>,
    stop: Arc<AtomicBool>,
    conns: Registry,
    gate: Gate,
    path: &Path,
) {
    let idle = gate.limits().idle_timeout;
    let next_id = AtomicU64::new(0);
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(socket = %path.display(), error = %e, "accept failed");
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Some(permit) = gate.try_enter() else {
            let max = gate.limits().max_connections;
            tracing::debug!(max, "control socket busy: a connection turned away");
            let msg = format!(
                "busy: oxvs-switchd serves {max} control connections already (--control-max-connections); retry"
            );
            // Never block the accept thread on a client that does not read.
            let _ = stream.set_write_timeout(Some(BUSY_WRITE_TIMEOUT));
            let _ = writeln!(stream, "{}", Response::busy(msg).to_line());
            continue;
        };
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        // Idle: a read (waiting for a request) or a write (the peer not
        // reading its responses) that makes no progress for this long
        // fails, and the connection ends.
        let timeouts = stream
            .set_read_timeout(Some(idle))
            .and_then(|()| stream.set_write_timeout(Some(idle)));
        let registered = timeouts.is_ok()
            && match stream.try_clone() {
                Ok(clone) => {
                    conns
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id, clone);
                    true
                }
                Err(_) => false,
            };
        if !registered {
            let _ = writeln!(
                stream,
                "{}",
                Response::error("cannot set up the connection (see the switchd log)").to_line()
            );
            continue;
        }
        let switch = switch.clone();
        let conns2 = conns.clone();
        let stats = gate.stats();
        let spawned = std::thread::Builder::new()
            .name(format!("oxvs-control-{id}"))
            .spawn(move || {
                let _permit = permit;
                if let End::Idle = serve_connection(stream, &switch) {
                    stats.idle_closed();
                }
                conns2.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a connection thread");
            conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        }
    }
}

/// How a connection ended.
enum End {
    /// The peer closed, broke the connection or sent an oversized line.
    Done,
    /// Nothing moved for the idle timeout.
    Idle,
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Answers request lines until the peer closes (or sends an oversized
/// line, or sits idle past the socket's read/write timeouts).
fn serve_connection(stream: UnixStream, switch: &Switch) -> End {
    let Ok(mut writer) = stream.try_clone() else {
        return End::Done;
    };
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let limit = MAX_LINE as u64 + 1;
        match reader.by_ref().take(limit).read_until(b'\n', &mut buf) {
            Ok(0) => return End::Done,
            Ok(_) => {}
            Err(e) if is_timeout(&e) => {
                tracing::debug!("control connection idle: closed");
                return End::Idle;
            }
            Err(e) => {
                tracing::debug!(error = %e, "control connection read failed");
                return End::Done;
            }
        }
        let complete = buf.last() == Some(&b'\n');
        if !complete && buf.len() > MAX_LINE {
            let r = Response::error(protocol::ProtocolError::TooLong(MAX_LINE).to_string());
            let _ = writeln!(writer, "{}", r.to_line());
            return End::Done;
        }
        if complete {
            buf.pop();
        }
        let response = match std::str::from_utf8(&buf) {
            Ok(line) => handle_line(switch, line.trim_end_matches('\r')),
            Err(e) => Response::error(format!("request is not valid UTF-8: {e}")),
        };
        let mut out = response.to_line();
        out.push('\n');
        if let Err(e) = writer.write_all(out.as_bytes()) {
            return if is_timeout(&e) { End::Idle } else { End::Done };
        }
        if !complete {
            // The peer closed without a final newline: that was the last line.
            return End::Done;
        }
    }
}

/// Parses and answers one request line (never panics).
pub fn handle_line(switch: &Switch, line: &str) -> Response {
    match protocol::parse_request(line) {
        Ok(req) => handle(switch, req),
        Err(e) => {
            tracing::debug!(error = %e, "bad control request");
            Response::error(e.to_string())
        }
    }
}

/// Answers one request (never panics: a bug becomes an error response).
pub fn handle(switch: &Switch, req: Request) -> Response {
    let op = req.op();
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch(switch, req)));
    let response = match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(msg)) => {
            tracing::info!(op, error = %msg, "control request refused");
            Response::error(msg)
        }
        Err(_) => {
            tracing::error!(op, "control request handler panicked");
            Response::error(format!(
                "internal error while handling '{op}' (a bug; see the switchd log)"
            ))
        }
    };
    tracing::debug!(
        op,
        ok = response.ok,
        elapsed_us = started.elapsed().as_micros() as u64,
        "control request"
    );
    response
}

fn dispatch(switch: &Switch, req: Request) -> Result<Response, String> {
    Ok(match req {
        Request::Show => Response::ok(&show(switch)),
        Request::AddPort(spec) => {
            let name = spec.name.clone();
            let info = switch
                .add_port(spec)
                .map_err(|e| format!("cannot add port '{name}': {e}"))?;
            tracing::info!(port = %info.name, ofport = info.ofport, "port added");
            conntrack::port_added(switch, &info);
            Response::ok(&info)
        }
        Request::DelPort { name } => {
            let ofport = switch
                .ports()
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.ofport);
            switch
                .del_port(&name)
                .map_err(|e| format!("cannot delete port '{name}': {e}"))?;
            tracing::info!(port = %name, "port deleted");
            if let Some(ofport) = ofport {
                conntrack::port_deleted(switch, ofport);
            }
            Response::ok(&serde_json::json!({}))
        }
        Request::AddFlows { flows } => Response::ok(&add_flows(switch, &flows)?),
        Request::DelFlows { spec, strict } => {
            Response::ok(&del_flows(switch, spec.as_deref(), strict)?)
        }
        Request::ModFlows { flows, strict } => Response::ok(&mod_flows(switch, &flows, strict)?),
        Request::Bundle { mods } => Response::ok(&bundle(switch, &mods)?),
        Request::ReplaceFlows { flows } => Response::ok(&replace_flows(switch, &flows)?),
        Request::AddGroups { groups } => Response::ok(&add_groups(switch, &groups, None)?),
        Request::ModGroups { groups, may_create } => {
            Response::ok(&add_groups(switch, &groups, Some(may_create))?)
        }
        Request::DelGroups { spec } => Response::ok(&del_groups(switch, spec.as_deref())?),
        Request::ReplaceGroups { groups, flows } => {
            Response::ok(&replace_groups(switch, &groups, &flows)?)
        }
        Request::DumpGroups { group_id } => Response::ok(&dump_groups(switch, group_id)),
        Request::AddMeters { meters } => Response::ok(&add_meters(switch, &meters, false)?),
        Request::ModMeters { meters } => Response::ok(&add_meters(switch, &meters, true)?),
        Request::DelMeters { spec } => Response::ok(&del_meters(switch, spec.as_deref())?),
        Request::DumpMeters { meter_id } => Response::ok(&dump_meters(switch, meter_id)),
        Request::MeterStats { meter_id } => Response::ok(&meter_stats(switch, meter_id)),
        Request::DumpFlows {
            table,
            names,
            stats,
        } => Response::ok(&dump_flows(switch, table.as_deref(), names, stats)?),
        Request::DumpPorts => Response::ok(&DumpPortsResult {
            ports: switch.ports(),
        }),
        Request::Trace(t) => Response::ok(&trace(switch, &t)?),
        Request::DumpConntrack { zone } => Response::ok(&conntrack::dump(switch, zone)),
        Request::FlushConntrack {
            zone,
            proto,
            reply_src,
            reply_sport,
        } => {
            let filter = oxvs_pipeline::conntrack::CtFilter {
                zone,
                proto,
                reply_src,
                reply_sport,
            };
            Response::ok(&conntrack::flush(switch, &filter))
        }
        Request::CtSetLimits { default, ports } => {
            Response::ok(&conntrack::set_limits(switch, default, &ports)?)
        }
        Request::CtGetLimits { ports } => Response::ok(&conntrack::get_limits(switch, &ports)?),
        Request::Stats => Response::ok(&stats(switch)),
        Request::PacketIn { max, wait_ms } => Response::ok(&packet_in(switch, max, wait_ms)),
        Request::Version => Response::ok(&VersionResult {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: oxvs_api::VERSION,
        }),
    })
}

fn show(switch: &Switch) -> ShowResult {
    ShowResult {
        version: env!("CARGO_PKG_VERSION").into(),
        n_tables: N_TABLES as u32,
        n_flows: switch.pipeline().snapshot().flow_count(),
        ports: switch.ports(),
        max_frame_len: u32::try_from(switch.max_frame_len()).unwrap_or(u32::MAX),
        tunnel_tso: switch.tunnel_tso(),
    }
}

fn parse_context(switch: &Switch) -> ParseContext {
    ParseContext {
        tables: switch.pipeline().names().clone(),
    }
}

/// `msg (token 'x')`, the way flow files report errors.
fn parse_msg(e: &ParseError) -> String {
    format!("{} (token '{}')", e.msg, e.token)
}

/// Parses flow-file text, errors as `line L, column C: msg (token 'x')`.
fn parse_flows(switch: &Switch, text: &str) -> Result<Vec<Flow>, String> {
    parse::parse_flow_file(text, &parse_context(switch)).map_err(|e| {
        format!(
            "line {}, column {}: {}",
            e.line,
            e.column,
            parse_msg(&e.error)
        )
    })
}

/// A table error, located at the line of the bundle's failing flow.
fn table_error(text: &str, err: FlowModError) -> String {
    match err {
        FlowModError::InBundle { index, error } => match parse::logical_lines(text).get(index) {
            Some((line, _)) => format!("line {line}: {error}"),
            None => format!("flow #{} of the bundle: {error}", index + 1),
        },
        // A bundle of one: the only flow line.
        other => match parse::logical_lines(text).first() {
            Some((line, _)) => format!("line {line}: {other}"),
            None => other.to_string(),
        },
    }
}

fn mod_result(switch: &Switch, r: ApplyReport) -> FlowModResult {
    FlowModResult {
        added: r.added,
        replaced: r.replaced,
        modified: r.modified,
        deleted: r.deleted,
        n_flows: switch.pipeline().snapshot().flow_count(),
    }
}

fn add_flows(switch: &Switch, text: &str) -> Result<FlowModResult, String> {
    let flows = parse_flows(switch, text)?;
    let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
    if mods.is_empty() {
        return Ok(mod_result(switch, ApplyReport::default()));
    }
    let r = switch
        .pipeline()
        .apply(&mods, monotonic_ns())
        .map_err(|e| table_error(text, e))?;
    tracing::info!(added = r.added, replaced = r.replaced, "flows added");
    Ok(mod_result(switch, r))
}

fn del_flows(switch: &Switch, spec: Option<&str>, strict: bool) -> Result<FlowModResult, String> {
    let command = FlowModCommand::Delete { strict };
    let fm = match spec.map(str::trim).filter(|s| !s.is_empty()) {
        None => FlowMod {
            command,
            flow: Flow::default(),
            table: None,
            cookie_mask: 0,
            out_port: None,
        },
        Some(s) => parse::parse_flow_mod(s, command, &parse_context(switch))
            .map_err(|e| format!("bad flow spec '{s}': {}", parse_msg(&e)))?,
    };
    let r = switch
        .pipeline()
        .apply(std::slice::from_ref(&fm), monotonic_ns())
        .map_err(|e| e.to_string())?;
    tracing::info!(deleted = r.deleted, "flows deleted");
    Ok(mod_result(switch, r))
}

fn mod_flows(switch: &Switch, text: &str, strict: bool) -> Result<FlowModResult, String> {
    let ctx = parse_context(switch);
    let mut mods = Vec::new();
    for (line, flow) in parse::logical_lines(text) {
        let fm = parse::parse_flow_mod(&flow, FlowModCommand::Modify { strict }, &ctx)
            .map_err(|e| format!("line {line}, column {}: {}", e.pos + 1, parse_msg(&e)))?;
        mods.push(fm);
    }
    if mods.is_empty() {
        return Err("no flow to modify".into());
    }
    let r = switch
        .pipeline()
        .apply(&mods, monotonic_ns())
        .map_err(|e| table_error(text, e))?;
    tracing::info!(modified = r.modified, "flows modified");
    Ok(mod_result(switch, r))
}

/// `bundle`: flow mods in the `ovs-ofctl bundle` file format, one atomic
/// version.
fn bundle(switch: &Switch, text: &str) -> Result<FlowModResult, String> {
    let ctx = parse_context(switch);
    let mut mods = Vec::new();
    for (line, text) in parse::logical_lines(text) {
        let t = text.trim_start();
        // `group CMD GROUP` lines (as ovs-ofctl bundle files), `flow` optional.
        if let Some(g) = t.strip_prefix("group ") {
            let g = g.trim_start();
            let (cmd, rest) = g
                .split_once(|c: char| c.is_ascii_whitespace())
                .unwrap_or((g, ""));
            let skipped = text.len() - rest.len();
            let at = |e: ParseError| {
                format!(
                    "line {line}, column {}: {}",
                    e.pos + skipped + 1,
                    parse_msg(&e)
                )
            };
            let gm = match cmd {
                "delete" => GroupMod::Delete(parse::parse_group_id(rest).map_err(at)?),
                "add" | "modify" | "add_or_mod" => {
                    let group = parse::parse_group(rest, &ctx).map_err(at)?;
                    match cmd {
                        "add" => GroupMod::Add(group),
                        _ => GroupMod::Modify {
                            group,
                            may_create: cmd == "add_or_mod",
                        },
                    }
                }
                other => {
                    return Err(format!(
                        "line {line}: unknown group command '{other}' (add, modify, add_or_mod or delete)"
                    ))
                }
            };
            mods.push(TableMod::Group(gm));
            continue;
        }
        let t = t.strip_prefix("flow ").map_or(t, str::trim_start);
        let (command, rest) = match t.split_once(|c: char| c.is_ascii_whitespace()) {
            Some(("add", r)) => (FlowModCommand::Add, r),
            Some(("modify", r)) => (FlowModCommand::Modify { strict: false }, r),
            Some(("modify_strict", r)) => (FlowModCommand::Modify { strict: true }, r),
            Some(("delete", r)) => (FlowModCommand::Delete { strict: false }, r),
            Some(("delete_strict", r)) => (FlowModCommand::Delete { strict: true }, r),
            _ => (FlowModCommand::Add, t),
        };
        let skipped = text.len() - rest.len();
        let fm = parse::parse_flow_mod(rest, command, &ctx).map_err(|e| {
            format!(
                "line {line}, column {}: {}",
                e.pos + skipped + 1,
                parse_msg(&e)
            )
        })?;
        mods.push(TableMod::Flow(fm));
    }
    if mods.is_empty() {
        return Ok(mod_result(switch, ApplyReport::default()));
    }
    let r = switch
        .pipeline()
        .apply_bundle(&mods, monotonic_ns())
        .map_err(|e| table_error(text, e))?;
    tracing::debug!(
        added = r.added,
        modified = r.modified,
        deleted = r.deleted,
        groups_added = r.groups_added,
        "bundle applied"
    );
    Ok(mod_result(switch, r))
}

fn replace_flows(switch: &Switch, text: &str) -> Result<FlowModResult, String> {
    let flows = parse_flows(switch, text)?;
    let r = switch
        .pipeline()
        .replace_all(&flows, monotonic_ns())
        .map_err(|e| table_error(text, e))?;
    tracing::info!(
        added = r.added,
        replaced = r.replaced,
        deleted = r.deleted,
        "flows replaced"
    );
    Ok(mod_result(switch, r))
}

/// Parses group-file text, errors as `line L, column C: msg`.
fn parse_groups(switch: &Switch, text: &str) -> Result<Vec<Group>, String> {
    parse::parse_group_file(text, &parse_context(switch)).map_err(|e| {
        format!(
            "line {}, column {}: {}",
            e.line,
            e.column,
            parse_msg(&e.error)
        )
    })
}

fn group_result(switch: &Switch, r: ApplyReport) -> GroupModResult {
    GroupModResult {
        added: r.groups_added,
        modified: r.groups_modified,
        deleted: r.groups_deleted,
        flows_deleted: r.deleted,
        n_groups: switch.pipeline().snapshot().groups().count(),
    }
}

/// `add-groups` (`modify: None`) and `mod-groups` (`Some(may_create)`):
/// every group of the file in one atomic bundle.
fn add_groups(switch: &Switch, text: &str, modify: Option<bool>) -> Result<GroupModResult, String> {
    let mods: Vec<TableMod> = parse_groups(switch, text)?
        .into_iter()
        .map(|g| {
            TableMod::Group(match modify {
                None => GroupMod::Add(g),
                Some(may_create) => GroupMod::Modify {
                    group: g,
                    may_create,
                },
            })
        })
        .collect();
    if mods.is_empty() {
        return Ok(group_result(switch, ApplyReport::default()));
    }
    let r = switch
        .pipeline()
        .apply_bundle(&mods, monotonic_ns())
        .map_err(|e| table_error(text, e))?;
    tracing::info!(
        added = r.groups_added,
        modified = r.groups_modified,
        "groups changed"
    );
    Ok(group_result(switch, r))
}

/// `replace-groups`: exactly these groups and flows, one version.
fn replace_groups(switch: &Switch, groups: &str, flows: &str) -> Result<ReplaceResult, String> {
    let group_list = parse_groups(switch, groups).map_err(|e| format!("groups: {e}"))?;
    let flow_list = parse_flows(switch, flows)?;
    let r = switch
        .pipeline()
        .replace_all_with_groups(&flow_list, Some(&group_list), monotonic_ns())
        .map_err(|e| match e {
            FlowModError::BadGroup { .. } => format!("groups: {e}"),
            other => table_error(flows, other),
        })?;
    tracing::info!(
        flows_added = r.added,
        flows_deleted = r.deleted,
        groups_added = r.groups_added,
        groups_modified = r.groups_modified,
        groups_deleted = r.groups_deleted,
        "groups and flows replaced"
    );
    Ok(ReplaceResult {
        flows: mod_result(switch, r),
        groups: GroupModResult {
            added: r.groups_added,
            modified: r.groups_modified,
            deleted: r.groups_deleted,
            flows_deleted: 0,
            n_groups: switch.pipeline().snapshot().groups().count(),
        },
    })
}

fn del_groups(switch: &Switch, spec: Option<&str>) -> Result<GroupModResult, String> {
    let spec = spec.unwrap_or("");
    let which = parse::parse_group_id(spec)
        .map_err(|e| format!("bad group spec '{spec}': {}", parse_msg(&e)))?;
    let r = switch
        .pipeline()
        .apply_bundle(&[TableMod::Group(GroupMod::Delete(which))], monotonic_ns())
        .map_err(|e| e.to_string())?;
    tracing::info!(
        deleted = r.groups_deleted,
        flows_deleted = r.deleted,
        "groups deleted"
    );
    Ok(group_result(switch, r))
}

fn dump_groups(switch: &Switch, group_id: Option<u32>) -> DumpGroupsResult {
    let tables = switch.pipeline().snapshot();
    let mut out = DumpGroupsResult::default();
    let mut n_flows: HashMap<u32, usize> = HashMap::new();
    for rule in tables.flows() {
        let mut ids = Vec::new();
        Group::referenced(&rule.flow.actions, &mut ids);
        ids.dedup();
        for id in ids {
            *n_flows.entry(id).or_default() += 1;
        }
    }
    for g in tables
        .groups()
        .filter(|g| group_id.is_none_or(|id| g.id == id))
    {
        out.lines.push(g.to_string());
        out.groups.push(GroupEntry {
            group_id: g.id,
            kind: g.kind.name().to_string(),
            buckets: g.buckets.iter().map(|b| b.id).collect(),
            n_flows: n_flows.get(&g.id).copied().unwrap_or(0),
        });
    }
    out
}

fn meter_result(switch: &Switch, r: ApplyReport) -> MeterModResult {
    MeterModResult {
        added: r.meters_added,
        modified: r.meters_modified,
        deleted: r.meters_deleted,
        flows_deleted: r.deleted,
        n_meters: switch.pipeline().snapshot().meters().count(),
    }
}

/// `add-meters` and `mod-meters`: every meter of the file in one atomic
/// bundle.
fn add_meters(switch: &Switch, text: &str, modify: bool) -> Result<MeterModResult, String> {
    let list = parse::parse_meter_file(text).map_err(|e| {
        format!(
            "line {}, column {}: {}",
            e.line,
            e.column,
            parse_msg(&e.error)
        )
    })?;
    let mods: Vec<TableMod> = list
        .into_iter()
        .map(|m| {
            TableMod::Meter(if modify {
                MeterMod::Modify(m)
            } else {
                MeterMod::Add(m)
            })
        })
        .collect();
    if mods.is_empty() {
        return Ok(meter_result(switch, ApplyReport::default()));
    }
    let r = switch
        .pipeline()
        .apply_bundle(&mods, monotonic_ns())
        .map_err(|e| e.to_string())?;
    tracing::info!(
        added = r.meters_added,
        modified = r.meters_modified,
        "meters changed"
    );
    Ok(meter_result(switch, r))
}

fn del_meters(switch: &Switch, spec: Option<&str>) -> Result<MeterModResult, String> {
    let spec = spec.unwrap_or("");
    let which = parse::parse_meter_id(spec)
        .map_err(|e| format!("bad meter spec '{spec}': {}", parse_msg(&e)))?;
    let r = switch
        .pipeline()
        .apply_bundle(&[TableMod::Meter(MeterMod::Delete(which))], monotonic_ns())
        .map_err(|e| e.to_string())?;
    tracing::info!(
        deleted = r.meters_deleted,
        flows_deleted = r.deleted,
        "meters deleted"
    );
    Ok(meter_result(switch, r))
}

fn dump_meters(switch: &Switch, meter_id: Option<u32>) -> DumpMetersResult {
    let tables = switch.pipeline().snapshot();
    let mut out = DumpMetersResult::default();
    for m in tables
        .meters()
        .filter(|m| meter_id.is_none_or(|id| m.config.id == id))
    {
        let c = &m.config;
        out.lines.push(meter::format_config(c));
        out.meters.push(MeterEntry {
            meter_id: c.id,
            unit: match c.unit {
                MeterUnit::Kbps => "kbps",
                MeterUnit::Pktps => "pktps",
            }
            .to_string(),
            burst: c.burst,
            stats: c.stats,
            bands: c.bands.iter().map(|b| (b.rate, b.burst_size)).collect(),
            n_flows: tables.meter_flow_count(c.id) as usize,
        });
    }
    out
}

fn meter_stats(switch: &Switch, meter_id: Option<u32>) -> MeterStatsResult {
    let tables = switch.pipeline().snapshot();
    let now = monotonic_ns();
    let mut out = MeterStatsResult::default();
    for m in tables
        .meters()
        .filter(|m| meter_id.is_none_or(|id| m.config.id == id))
    {
        let st = m.stats(tables.meter_flow_count(m.config.id), now);
        out.lines.push(meter::format_stats(&st));
        out.meters.push(MeterStatsEntry {
            meter_id: st.id,
            flow_count: st.flow_count,
            packet_in_count: st.packets_in,
            byte_in_count: st.bytes_in,
            duration_ns: st.duration_ns,
            bands: st.bands.iter().map(|b| (b.packets, b.bytes)).collect(),
        });
    }
    out
}

fn parse_table(switch: &Switch, text: &str) -> Result<u8, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<u32>() {
        return u8::try_from(n)
            .ok()
            .filter(|n| usize::from(*n) < N_TABLES)
            .ok_or_else(|| format!("table number {n} out of range (0..={})", N_TABLES - 1));
    }
    switch
        .pipeline()
        .names()
        .id(t)
        .ok_or_else(|| format!("unknown table '{t}' (give a number or a table name)"))
}

fn dump_flows(
    switch: &Switch,
    table: Option<&str>,
    names: bool,
    stats: bool,
) -> Result<DumpFlowsResult, String> {
    let table = table.map(|t| parse_table(switch, t)).transpose()?;
    let pipeline = switch.pipeline();
    let all_names = pipeline.names();
    let opts = DumpOptions {
        stats,
        names: names.then(|| all_names.clone()),
    };
    let tables = pipeline.snapshot();
    let rules = match table {
        Some(t) => tables.flows_in(t),
        None => tables.flows().collect(),
    };
    let now = monotonic_ns();
    let mut out = DumpFlowsResult::default();
    for rule in rules {
        let last = rule.stats.last_used_ns.load(Ordering::Relaxed);
        let fs = FlowStats {
            duration_ns: now.saturating_sub(rule.created_ns),
            n_packets: rule.stats.n_packets.load(Ordering::Relaxed),
            n_bytes: rule.stats.n_bytes.load(Ordering::Relaxed),
            idle_age_s: (last != 0).then(|| now.saturating_sub(last) / 1_000_000_000),
        };
        let f = &rule.flow;
        out.lines.push(print::format_dump_line(f, &fs, &opts));
        out.flows.push(FlowEntry {
            table: f.table,
            table_name: all_names.name(f.table).map(str::to_owned),
            priority: f.priority,
            cookie: f.cookie,
            duration_ns: fs.duration_ns,
            n_packets: fs.n_packets,
            n_bytes: fs.n_bytes,
            idle_age_s: fs.idle_age_s,
            matches: print::format_match(&f.matches),
            actions: print::format_actions_for(&f.actions, &f.matches, opts.names.as_ref()),
        });
    }
    Ok(out)
}

/// A `--ct-next` state: flag names separated by `,`, `|` or `+`; `trk` implied.
fn parse_ct_state(text: &str) -> Result<u32, String> {
    let mut state = ct_state::TRK;
    let mut any = false;
    for word in text
        .split([',', '|', '+'])
        .map(str::trim)
        .filter(|w| !w.is_empty())
    {
        let bit = ct_state::NAMES
            .iter()
            .find(|(name, _)| *name == word)
            .map(|(_, bit)| *bit)
            .ok_or_else(|| {
                format!("unknown conntrack state flag '{word}' in ct_next '{text}' (expected: new, est, rel, rpl, inv, trk, snat, dnat)")
            })?;
        state |= bit;
        any = true;
    }
    if !any {
        return Err(format!("empty conntrack state '{text}' in ct_next"));
    }
    Ok(state)
}

fn trace(switch: &Switch, t: &TraceRequest) -> Result<TraceResult, String> {
    let ctx = parse_context(switch);
    let (key, frame) = match (&t.spec, &t.packet_hex) {
        (Some(spec), None) => {
            let key = parse::parse_packet_spec(spec, &ctx)
                .map_err(|e| format!("bad packet spec '{spec}': {}", parse_msg(&e)))?;
            (key, None)
        }
        (None, Some(hex)) => {
            let in_port = t
                .in_port
                .ok_or("packet_hex needs in_port (the port the packet arrived on)")?;
            let frame = oxvs_api::from_hex(hex).map_err(|e| format!("bad packet_hex: {e}"))?;
            (
                oxvs_pipeline::extract::extract(&frame, in_port),
                Some(frame),
            )
        }
        (Some(_), Some(_)) => return Err("give either spec or packet_hex, not both".into()),
        (None, None) => return Err("give a packet: spec, or packet_hex with in_port".into()),
    };
    let ct_next = t
        .ct_next
        .iter()
        .map(|s| parse_ct_state(s))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = TraceOptions {
        ct_next,
        names: t.names.then(|| switch.pipeline().names().clone()),
        ..TraceOptions::default()
    };
    // The switch's ports: an output to any other is "Nonexistent output
    // port" and sends nothing, as in the datapath and in OVS (also on a
    // switch with no port at all: the list is known to be empty).
    let env = XlateEnv::with_ports(switch.ports().iter().map(|p| p.ofport).collect());
    let tables = switch.pipeline().snapshot();
    let report = ptrace::trace(&*tables, &key, &env, &opts);
    if !t.inject {
        return Ok(TraceResult::from_report(&report, false));
    }
    let frame = match frame {
        Some(f) => f,
        None => compose::frame_from_key(&key).map_err(|e| format!("cannot inject: {e}"))?,
    };
    let in_port = key.get(Field::InPort) as u32;
    switch
        .inject(in_port, frame)
        .map_err(|e| format!("traced, but injecting the packet on port {in_port} failed: {e}"))?;
    tracing::info!(in_port, "packet injected");
    Ok(TraceResult::from_report(&report, true))
}

fn stats(switch: &Switch) -> StatsResult {
    let s = switch.stats();
    let (conntrack_entries, ct, ipf) =
        switch.with_conntrack(|ct| (ct.len(), ct.stats(), ct.ipf().stats()));
    let d = s.datapath;
    StatsResult {
        threads: s.threads,
        packets: d.packets,
        bytes: d.bytes,
        emc_hits: d.emc_hits,
        megaflow_hits: d.megaflow_hits,
        upcalls: d.upcalls,
        megaflow_inserts: d.megaflow_inserts,
        xlate_errors: d.xlate_errors,
        cache_flushes: d.cache_flushes,
        recirculations: d.recirculations,
        drops: d.drops,
        recirc_limit_drops: d.recirc_limit_drops,
        write_errors: d.write_errors,
        outputs: d.outputs,
        packet_ins: d.packet_ins,
        busy_ns: s.busy_ns,
        ns_per_packet: (d.packets > 0).then(|| s.busy_ns as f64 / d.packets as f64),
        n_flows: switch.pipeline().snapshot().flow_count(),
        conntrack_entries,
        frags_held: d.frags_held,
        frag_drops: d.frag_drops,
        reassembled: d.reassembled,
        ipf_held_datagrams: ipf.held_datagrams,
        ipf_held_bytes: ipf.held_bytes,
        ct_refused_drops: d.ct_refused_drops,
        ct_limit_refused: ct.limit_refused_total,
        ct_table_full: ct.table_full_total,
        ct_early_drops: ct.early_drop_total,
        ct_commits_discarded: ct.commits_discarded_total,
        umem_frames: s.umem_frames,
        umem_free_frames: s.umem_free_frames,
        learns: d.learns,
        learned_added: s.learn.learned,
        learned_replaced: s.learn.learn_replaced,
        learned_refreshed: s.learn.learn_refreshed,
        learn_dropped: s.learn.learn_dropped,
        learn_failed: s.learn.learn_failed,
        flows_expired: s.learn.flows_expired,
        icmp_too_big: s.icmp_too_big,
        rejects: s.rejects,
        rejects_limited: s.rejects_limited,
        time_exceeded: s.time_exceeded,
        time_exceeded_limited: s.time_exceeded_limited,
        time_exceeded_unanswered: s.time_exceeded_unanswered,
    }
}

fn packet_in(switch: &Switch, max: usize, wait_ms: u64) -> PacketInResult {
    let max = max.clamp(1, MAX_PACKET_INS);
    let deadline = Instant::now() + Duration::from_millis(wait_ms.min(MAX_PACKET_IN_WAIT_MS));
    let taken = loop {
        let got = switch.take_packet_ins(max);
        if !got.is_empty() || Instant::now() >= deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    PacketInResult {
        packets: taken
            .into_iter()
            .map(|p| PacketInEntry {
                in_port: p.in_port,
                table: p.table,
                cookie: p.cookie,
                reason: p.reason,
                userdata: oxvs_api::to_hex(&p.userdata),
                frame: oxvs_api::to_hex(&p.frame),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_lines_join_and_skip() {
        let text = "# c\n\ntable=0 actions=drop\ntable=1, \\\n actions=drop\n  # x\n";
        let l = parse::logical_lines(text);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].0, 3);
        assert_eq!(l[1].0, 4);
        assert!(l[1].1.contains("actions=drop"));
    }

    #[test]
    fn ct_states() {
        assert_eq!(
            parse_ct_state("est|rpl"),
            Ok(ct_state::TRK | ct_state::EST | ct_state::RPL)
        );
        assert_eq!(
            parse_ct_state("+trk+new"),
            Ok(ct_state::TRK | ct_state::NEW)
        );
        assert!(parse_ct_state("bogus").unwrap_err().contains("'bogus'"));
        assert!(parse_ct_state("").is_err());
    }

    #[test]
    fn clock_moves_forward() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
