//! The conntrack requests of the control socket: `dump-conntrack`,
//! `flush-conntrack`, `ct-set-limits`, `ct-get-limits`, and what adding
//! and deleting a port means for the limits.
//!
//! ## The lock, in slices
//!
//! The datapath threads take the conntrack lock once per batch. A dump or
//! a flush of a full table (262,144 connections by default) under one lock
//! would stop forwarding on every thread for as long as it takes (tens of
//! milliseconds, more for a dump's formatting). So both walk the table in
//! slices of [`CT_SLICE`] slots, one lock per slice, and yield between
//! slices so that a waiting datapath thread gets the lock; formatting
//! happens after the lock is released. What a walk in slices reports and
//! removes when the table changes meanwhile:
//! [`Conntrack::entries_slice`] and [`Conntrack::flush_slice`] (every
//! connection that lives through the walk is reported, or removed, exactly
//! once; connections created or removed meanwhile may or may not be).
//!
//! ## Limits and ports
//!
//! Limits are per OpenFlow port ([`oxvs_pipeline::conntrack`], "Per-port
//! limits"). Requests name ports by name or number; a port that does not
//! exist is an error and nothing changes. A VXLAN port gets no limit when
//! it is added (its traffic was limited at its pods' own node), like the
//! gateway (set by `main.rs`); a deleted port's connections stop counting
//! against its number, so a new port that reuses it starts afresh.

use oxvs_api::protocol::{
    ConntrackEntry, CtLimitsResult, CtPortLimitEntry, CtPortLimitSpec, DumpConntrackResult,
    FlushConntrackResult,
};
use oxvs_api::PortInfo;
use oxvs_pipeline::conntrack::{Conntrack, CtEntry, CtFilter};

use super::monotonic_ns;
use crate::engine::Switch;

/// Slots a dump, flush or disown examines per lock hold: about a
/// millisecond of work, so a datapath thread waits at most that long.
pub const CT_SLICE: usize = 4096;

/// Runs `step(tracker, start)` under the lock given by `lock`, slice after
/// slice from slot 0, until it returns `None`; the lock is released and
/// the thread yields between slices. Returns how many slices it took.
pub fn in_slices<L>(lock: L, mut step: impl FnMut(&mut Conntrack, usize) -> Option<usize>) -> usize
where
    L: Fn(&mut dyn FnMut(&mut Conntrack)),
{
    let mut at = Some(0);
    let mut slices = 0;
    while let Some(start) = at {
        let mut next = None;
        lock(&mut |ct| next = step(ct, start));
        slices += 1;
        at = next;
        if at.is_some() {
            // Let a datapath thread waiting for the lock have it now.
            std::thread::yield_now();
        }
    }
    slices
}

/// The switch's tracker, locked for one call.
fn switch_lock(switch: &Switch) -> impl Fn(&mut dyn FnMut(&mut Conntrack)) + '_ {
    move |f| switch.with_conntrack(|ct| f(ct))
}

/// The connections (of one zone), read in slices.
pub fn dump_entries<L>(lock: L, zone: Option<u16>) -> Vec<CtEntry>
where
    L: Fn(&mut dyn FnMut(&mut Conntrack)),
{
    let mut out = Vec::new();
    in_slices(lock, |ct, start| {
        ct.entries_slice(zone, start, CT_SLICE, &mut out)
    });
    out
}

/// `dump-conntrack`.
pub fn dump(switch: &Switch, zone: Option<u16>) -> DumpConntrackResult {
    let entries = dump_entries(switch_lock(switch), zone);
    let now = monotonic_ns();
    DumpConntrackResult {
        entries: entries
            .into_iter()
            .map(|e| ConntrackEntry {
                line: e.to_string(),
                proto: e.proto,
                zone: e.zone,
                mark: e.mark,
                labels: format!("{:#x}", e.label),
                orig: e.orig.to_string(),
                reply: e.reply.to_string(),
                tcp_state: e.tcp_state.map(|s| s.name().to_owned()),
                expires_in_ms: e.expiration_ns.saturating_sub(now) / 1_000_000,
                owner: e.owner,
            })
            .collect(),
    }
}

/// Removes the connections (of one zone) in slices; how many.
pub fn flush_entries<L>(lock: L, filter: &CtFilter) -> usize
where
    L: Fn(&mut dyn FnMut(&mut Conntrack)),
{
    let mut flushed = 0;
    in_slices(lock, |ct, start| {
        let (n, next) = ct.flush_slice_filtered(filter, start, CT_SLICE);
        flushed += n;
        next
    });
    flushed
}

/// `flush-conntrack`.
pub fn flush(switch: &Switch, filter: &CtFilter) -> FlushConntrackResult {
    let flushed = flush_entries(switch_lock(switch), filter);
    tracing::info!(?filter, flushed, "conntrack flushed");
    FlushConntrackResult { flushed }
}

/// The port `text` names: a name, or an OpenFlow number, of a port that
/// exists now.
fn resolve(ports: &[PortInfo], text: &str) -> Result<u32, String> {
    let found = match text.parse::<u32>() {
        Ok(n) => ports.iter().find(|p| p.ofport == n),
        Err(_) => ports.iter().find(|p| p.name == text),
    };
    match found {
        Some(p) => Ok(p.ofport),
        None => {
            let names: Vec<String> = ports
                .iter()
                .map(|p| format!("{} ({})", p.name, p.ofport))
                .collect();
            Err(format!(
                "no port '{text}' (ports: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        }
    }
}

/// The limits in force, of `only` (port numbers) or of every port the
/// tracker knows.
fn limits(switch: &Switch, ports: &[PortInfo], only: Option<&[u32]>) -> CtLimitsResult {
    let (max_entries, entries, default_limit, list) = switch.with_conntrack(|ct| {
        let list = match only {
            Some(ofports) => ofports.iter().map(|&p| ct.port_limit(p)).collect(),
            None => ct.port_limits(),
        };
        (
            ct.config().max_entries,
            ct.len(),
            ct.default_port_limit(),
            list,
        )
    });
    CtLimitsResult {
        max_entries,
        entries,
        default_limit,
        ports: list
            .into_iter()
            .map(|l| CtPortLimitEntry {
                ofport: l.port,
                name: ports
                    .iter()
                    .find(|p| p.ofport == l.port)
                    .map(|p| p.name.clone()),
                limit: l.limit,
                explicit: l.explicit,
                count: l.count,
                refused: l.refused,
            })
            .collect(),
    }
}

/// `ct-set-limits`: all or nothing.
pub fn set_limits(
    switch: &Switch,
    default: Option<u32>,
    specs: &[CtPortLimitSpec],
) -> Result<CtLimitsResult, String> {
    if default.is_none() && specs.is_empty() {
        return Err("nothing to set: give a default limit, port limits, or both".into());
    }
    let ports = switch.ports();
    let mut resolved = Vec::with_capacity(specs.len());
    for s in specs {
        let ofport = resolve(&ports, &s.port).map_err(|e| format!("cannot set a limit: {e}"))?;
        if resolved.iter().any(|&(p, _)| p == ofport) {
            return Err(format!(
                "port '{}' (ofport {ofport}) is named twice",
                s.port
            ));
        }
        resolved.push((ofport, s.limit));
    }
    switch.with_conntrack(|ct| {
        if let Some(d) = default {
            ct.set_default_port_limit(d);
        }
        for &(p, l) in &resolved {
            ct.set_port_limit(p, l);
        }
    });
    tracing::info!(?default, ports = ?resolved, "conntrack limits set");
    let only: Vec<u32> = resolved.iter().map(|&(p, _)| p).collect();
    Ok(limits(
        switch,
        &ports,
        (!only.is_empty()).then_some(only.as_slice()),
    ))
}

/// `ct-get-limits`.
pub fn get_limits(switch: &Switch, names: &[String]) -> Result<CtLimitsResult, String> {
    let ports = switch.ports();
    if names.is_empty() {
        return Ok(limits(switch, &ports, None));
    }
    let only = names
        .iter()
        .map(|n| resolve(&ports, n))
        .collect::<Result<Vec<u32>, String>>()?;
    Ok(limits(switch, &ports, Some(&only)))
}

/// A port was added: a VXLAN port gets no limit (module doc).
pub fn port_added(switch: &Switch, info: &PortInfo) {
    if info.kind == "vxlan" {
        switch.with_conntrack(|ct| ct.set_port_limit(info.ofport, Some(0)));
    }
}

/// A port was deleted: its connections stop counting against its number.
pub fn port_deleted(switch: &Switch, ofport: u32) {
    in_slices(switch_lock(switch), |ct, start| {
        ct.disown_port_slice(ofport, start, CT_SLICE)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use oxvs_pipeline::conntrack::{CtConfig, CtParams};
    use oxvs_pipeline::extract::extract;

    /// A UDP datagram 10.0.0.1:sport -> 10.0.0.2:53 (or its reply) and its key.
    fn udp(sport: u16, reply: bool) -> (Vec<u8>, oxvs_pipeline::FlowKey) {
        let (src, dst, sp, dp) = if reply {
            ([10, 0, 0, 2], [10, 0, 0, 1], 53, sport)
        } else {
            ([10, 0, 0, 1], [10, 0, 0, 2], sport, 53)
        };
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&u16::to_be_bytes(sp));
        f.extend_from_slice(&u16::to_be_bytes(dp));
        f.extend_from_slice(&[0, 8, 0, 0]);
        let key = extract(&f, 1);
        (f, key)
    }

    /// A full table of `n` replied UDP connections, from many sources.
    fn full_table(n: usize) -> Conntrack {
        let mut ct = Conntrack::new(CtConfig {
            max_entries: n,
            port_limit: 0,
            ..CtConfig::default()
        });
        let p = CtParams {
            commit: true,
            ..CtParams::default()
        };
        for i in 0..n {
            // Vary the source address too: 65535 ports are not enough.
            let (mut f, _) = udp(1 + (i % 60_000) as u16, false);
            f[14 + 12 + 2] = (i / 60_000) as u8;
            let key = extract(&f, 1);
            ct.execute(&f, &key, &p, 0);
        }
        assert_eq!(ct.len(), n);
        ct
    }

    /// While a dump and a flush of a full table run, a "datapath" thread
    /// keeps taking the lock and tracking packets: it must make progress
    /// during the walk, not only before and after.
    #[test]
    fn forwarding_goes_on_during_a_dump_and_a_flush_of_a_full_table() {
        let n = 262_144;
        let ct = Arc::new(Mutex::new(full_table(n)));
        let forwarded = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let fwd = {
            let (ct, forwarded, stop) = (ct.clone(), forwarded.clone(), stop.clone());
            std::thread::spawn(move || {
                let (frame, key) = udp(7, false);
                let p = CtParams::default();
                while !stop.load(Ordering::Relaxed) {
                    let mut g = ct.lock().unwrap();
                    g.execute(&frame, &key, &p, 1);
                    drop(g);
                    forwarded.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // Before each slice, give the forwarder a chance (up to 10 s) to
        // track a packet: it can only if the walk let go of the lock since
        // the previous slice. (Waiting, not racing: the mutex is not fair,
        // and on a loaded machine a bare yield may not hand it over.)
        let last = std::cell::Cell::new(forwarded.load(Ordering::Relaxed));
        let lock = |f: &mut dyn FnMut(&mut Conntrack)| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while forwarded.load(Ordering::Relaxed) == last.get()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            last.set(forwarded.load(Ordering::Relaxed));
            f(&mut ct.lock().unwrap())
        };
        // The forwarder's count at each slice: it must grow while the walk
        // is under way.
        let mut seen = Vec::new();
        let mut out = Vec::new();
        let slices = in_slices(lock, |c, start| {
            seen.push(forwarded.load(Ordering::Relaxed));
            c.entries_slice(None, start, CT_SLICE, &mut out)
        });
        assert_eq!(slices, n / CT_SLICE);
        // Every connection, each once (the table did not change).
        assert_eq!(out.len(), n);
        let first = seen[0];
        let last = *seen.last().unwrap();
        assert!(
            last > first,
            "no packet was tracked during the dump ({slices} slices)"
        );
        let before = forwarded.load(Ordering::Relaxed);
        let mut seen = Vec::new();
        let mut flushed = 0;
        in_slices(lock, |c, start| {
            seen.push(forwarded.load(Ordering::Relaxed));
            let (k, next) = c.flush_slice(None, start, CT_SLICE);
            flushed += k;
            next
        });
        assert_eq!(flushed, n);
        assert!(
            seen.last().unwrap() > &before,
            "no packet was tracked during the flush"
        );
        stop.store(true, Ordering::Relaxed);
        fwd.join().unwrap();
    }

    #[test]
    fn dump_and_flush_helpers_walk_the_whole_table() {
        let ct = Mutex::new(full_table(10_000));
        let lock = |f: &mut dyn FnMut(&mut Conntrack)| f(&mut ct.lock().unwrap());
        assert_eq!(dump_entries(lock, None).len(), 10_000);
        assert!(dump_entries(lock, Some(9)).is_empty());
        let zone = |z| CtFilter {
            zone: z,
            ..CtFilter::default()
        };
        assert_eq!(flush_entries(lock, &zone(Some(9))), 0);
        assert_eq!(flush_entries(lock, &zone(None)), 10_000);
        assert!(ct.lock().unwrap().is_empty());
    }

    #[test]
    fn ports_are_named_or_numbered_and_must_exist() {
        let ports = vec![PortInfo {
            name: "pod-a".into(),
            ofport: 3,
            kind: "afxdp".into(),
            mode: "generic/copy".into(),
            state: "up".into(),
            local: None,
            stats: Default::default(),
            queues: Vec::new(),
            umem: None,
        }];
        assert_eq!(resolve(&ports, "pod-a"), Ok(3));
        assert_eq!(resolve(&ports, "3"), Ok(3));
        assert_eq!(
            resolve(&ports, "4"),
            Err("no port '4' (ports: pod-a (3))".to_string())
        );
        assert_eq!(
            resolve(&[], "x"),
            Err("no port 'x' (ports: none)".to_string())
        );
    }
}
