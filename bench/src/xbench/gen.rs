//! The traffic generator: IPv4 UDP or TCP-SYN frames of a given size over
//! N flows, optionally VXLAN-encapsulated, at a target rate, in batches
//! through one AF_XDP socket per queue of the interface.
//!
//! ## Flows
//!
//! Flow `i` (0-based) has source port `1024 + i % 64000`, destination
//! port `dst_port + i / 64000` (`dst_port` 5000 by default), source address `src_ip + i % src_ips` and
//! destination address `dst_ip + i % dst_ips` (the last octets counted
//! up), so up to 1M flows are distinct 5-tuples. With N sockets, flow `i`
//! leaves on socket `i % N` (a lane); the batches go to the lanes in turn
//! and each lane sends its flows round-robin. [`GenReport::sent_for_flow`]
//! is what flow `i` got, counted; its sequence numbers are `0..` that
//! many (per-flow mode).
//!
//! ## Invariants
//!
//! - A frame counts as sent when it was put on the TX ring. Frames the
//!   socket could not take (no free UMEM frame, ring full) are a suffix of
//!   the batch (see `XskPort::send`/`flush`); their flow cursor and
//!   sequence numbers are rolled back, so they go out again, with the same
//!   numbers, in the next batch: sequences have no gaps at the source.
//! - The per-packet path does not allocate: one frame buffer is patched in
//!   place (addresses, ports, checksums, trailer) and copied into the UMEM.
//!
//! ## Rate control ([`Pacer`])
//!
//! A token bucket refilled from the monotonic clock, holding at most
//! [`CREDIT_NS`] of credit (10 ms: at 274 kpps about 2700 frames), so a
//! late wake-up (a sleep that overshoots, the thread descheduled on a
//! loaded machine) is made up by the following batches instead of being
//! lost, while a long stall still cannot turn into an unbounded burst. The
//! loop waits for a *chunk* of tokens — what the rate accumulates in
//! [`CHUNK_NS`] (100 us), at most a batch, at least one frame — so high rates
//! send full batches (one TX kick per batch) and low rates are not delayed.
//! Waits longer than [`SLEEP_ABOVE_NS`] (200 us) sleep; shorter ones yield
//! the CPU and poll again (`thread::sleep` overshoots by 50 us or more,
//! which at 200 kpps is ten frames). Rate 0 = as fast as the socket takes
//! them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Result};
use oxvs_switch::afxdp::XskPort;

use super::{now_ns, Trailer, TRAILER_LEN, VXLAN_PORT};

/// L4 protocol of the generated frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Udp,
    /// TCP with only SYN set (checksum valid).
    TcpSyn,
}

/// Sequence numbering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqMode {
    PerFlow,
    Global,
}

/// Outer headers of VXLAN-encapsulated frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vxlan {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub vni: u32,
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Frame size on the wire including the 4-byte FCS (64..=1518).
    pub frame_size: usize,
    /// Distinct flows (1..=1M).
    pub flows: u32,
    pub proto: Proto,
    pub vxlan: Option<Vxlan>,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    /// Distinct source / destination addresses (>= 1).
    pub src_ips: u32,
    pub dst_ips: u32,
    /// Destination port of flows `0..64000` (then counted up per 64000).
    pub dst_port: u16,
    /// Target rate in packets per second; 0 = as fast as possible.
    pub rate_pps: u64,
    pub batch: usize,
    pub seq: SeqMode,
    pub duration: Duration,
    /// Stop after this many frames (None: only the duration).
    pub count: Option<u64>,
    /// Injected reordering, to check the sink (0: none): of every `N`
    /// sequence numbers, the first two are swapped (`1, 0, 2, 3, ..,
    /// N+1, N, ..`), so each block of `N` adds exactly one reordered
    /// arrival at an in-order sink.
    pub reorder_every: u32,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            frame_size: 64,
            flows: 1,
            proto: Proto::Udp,
            vxlan: None,
            src_mac: [0x02, 0x0b, 0x5e, 0, 0, 1],
            dst_mac: [0x02, 0x0b, 0x5e, 0, 0, 2],
            src_ip: [10, 200, 0, 1],
            dst_ip: [10, 200, 0, 3],
            src_ips: 1,
            dst_ips: 1,
            dst_port: 5000,
            rate_pps: 0,
            batch: 32,
            seq: SeqMode::PerFlow,
            duration: Duration::from_secs(1),
            count: None,
            reorder_every: 0,
        }
    }
}

/// Most flows.
pub const MAX_FLOWS: u32 = 1 << 20;
/// Largest frame (1500-byte MTU + Ethernet header + FCS).
pub const MAX_FRAME: usize = 1518;
const ETH: usize = 14;
const IP: usize = 20;
const UDP: usize = 8;
const TCP: usize = 20;
const VXLAN_OVERHEAD: usize = ETH + IP + UDP + 8;

/// The smallest frame size (with FCS) `cfg`'s headers and trailer fit in.
pub fn min_frame_size(proto: Proto, vxlan: bool) -> usize {
    let l4 = match proto {
        Proto::Udp => UDP,
        Proto::TcpSyn => TCP,
    };
    let outer = if vxlan { VXLAN_OVERHEAD } else { 0 };
    (outer + ETH + IP + l4 + TRAILER_LEN + 4).max(64)
}

/// Flow `i`'s (source port, destination port, source ip, destination ip).
pub fn flow_tuple(cfg: &GenConfig, i: u32) -> (u16, u16, [u8; 4], [u8; 4]) {
    let sport = 1024 + (i % 64_000) as u16;
    let dport = cfg.dst_port.wrapping_add((i / 64_000) as u16);
    let add = |ip: [u8; 4], n: u32| (u32::from_be_bytes(ip).wrapping_add(n)).to_be_bytes();
    (
        sport,
        dport,
        add(cfg.src_ip, i % cfg.src_ips.max(1)),
        add(cfg.dst_ip, i % cfg.dst_ips.max(1)),
    )
}

fn csum_add(mut sum: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A frame template patched per packet (see the module doc).
#[derive(Clone, Debug)]
pub struct FrameBuilder {
    cfg: GenConfig,
    buf: Vec<u8>,
    /// Offset of the (inner) Ethernet header.
    inner: usize,
}

impl FrameBuilder {
    /// Checks `cfg` and builds the template.
    pub fn new(cfg: &GenConfig) -> Result<FrameBuilder> {
        let min = min_frame_size(cfg.proto, cfg.vxlan.is_some());
        if cfg.frame_size < min || cfg.frame_size > MAX_FRAME {
            bail!(
                "frame size {} is outside {min}..={MAX_FRAME} for {:?}{}",
                cfg.frame_size,
                cfg.proto,
                if cfg.vxlan.is_some() { " in VXLAN" } else { "" }
            );
        }
        if cfg.flows == 0 || cfg.flows > MAX_FLOWS {
            bail!("flow count {} is outside 1..={MAX_FLOWS}", cfg.flows);
        }
        if cfg.batch == 0 || cfg.batch > 512 {
            bail!("batch {} is outside 1..=512", cfg.batch);
        }
        let len = cfg.frame_size - 4;
        let mut buf = vec![0u8; len];
        let inner = if let Some(v) = &cfg.vxlan {
            buf[0..6].copy_from_slice(&v.dst_mac);
            buf[6..12].copy_from_slice(&v.src_mac);
            buf[12..14].copy_from_slice(&[0x08, 0x00]);
            write_ipv4(&mut buf[ETH..], len - ETH, 17, v.src_ip, v.dst_ip);
            let u = ETH + IP;
            buf[u..u + 2].copy_from_slice(&49152u16.to_be_bytes());
            buf[u + 2..u + 4].copy_from_slice(&VXLAN_PORT.to_be_bytes());
            buf[u + 4..u + 6].copy_from_slice(&((len - u) as u16).to_be_bytes());
            // VXLAN: flags (I), VNI.
            buf[u + 8] = 0x08;
            buf[u + 12..u + 15].copy_from_slice(&v.vni.to_be_bytes()[1..4]);
            VXLAN_OVERHEAD
        } else {
            0
        };
        buf[inner..inner + 6].copy_from_slice(&cfg.dst_mac);
        buf[inner + 6..inner + 12].copy_from_slice(&cfg.src_mac);
        buf[inner + 12..inner + 14].copy_from_slice(&[0x08, 0x00]);
        let proto = match cfg.proto {
            Proto::Udp => 17,
            Proto::TcpSyn => 6,
        };
        write_ipv4(
            &mut buf[inner + ETH..],
            len - inner - ETH,
            proto,
            cfg.src_ip,
            cfg.dst_ip,
        );
        let l4 = inner + ETH + IP;
        match cfg.proto {
            Proto::Udp => {
                buf[l4 + 4..l4 + 6].copy_from_slice(&((len - l4) as u16).to_be_bytes());
            }
            Proto::TcpSyn => {
                buf[l4 + 12] = 5 << 4;
                buf[l4 + 13] = 0x02; // SYN
                buf[l4 + 14..l4 + 16].copy_from_slice(&65535u16.to_be_bytes());
            }
        }
        Ok(FrameBuilder {
            cfg: cfg.clone(),
            buf,
            inner,
        })
    }

    /// The frame for flow `flow` with `seq` and `ts_ns`, patched in place.
    #[inline]
    pub fn frame(&mut self, flow: u32, seq: u32, ts_ns: u64) -> &[u8] {
        let (sport, dport, sip, dip) = flow_tuple(&self.cfg, flow);
        let ip = self.inner + ETH;
        let l4 = ip + IP;
        let b = &mut self.buf;
        b[ip + 12..ip + 16].copy_from_slice(&sip);
        b[ip + 16..ip + 20].copy_from_slice(&dip);
        b[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
        let c = csum_fold(csum_add(0, &b[ip..ip + IP]));
        b[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        b[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
        b[l4 + 2..l4 + 4].copy_from_slice(&dport.to_be_bytes());
        let hl = match self.cfg.proto {
            Proto::Udp => UDP,
            Proto::TcpSyn => TCP,
        };
        Trailer { flow, seq, ts_ns }.write(&mut b[l4 + hl..]);
        if self.cfg.proto == Proto::TcpSyn {
            // TCP sequence number = our sequence (a SYN-flood-like stream).
            b[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
            b[l4 + 16..l4 + 18].copy_from_slice(&[0, 0]);
            let seg = b.len() - l4;
            let mut s = csum_add(0, &b[ip + 12..ip + 20]);
            s += 6 + seg as u32;
            s = csum_add(s, &b[l4..]);
            let c = csum_fold(s);
            b[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        }
        if self.inner > 0 {
            // Outer UDP source port: flow entropy, as tunnel endpoints do.
            let u = ETH + IP;
            let e = 49152 | (flow as u16 & 0x3fff);
            b[u..u + 2].copy_from_slice(&e.to_be_bytes());
        }
        &self.buf
    }
}

fn write_ipv4(b: &mut [u8], total: usize, proto: u8, src: [u8; 4], dst: [u8; 4]) {
    b[0] = 0x45;
    b[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    b[6] = 0x40; // DF
    b[8] = 64;
    b[9] = proto;
    b[12..16].copy_from_slice(&src);
    b[16..20].copy_from_slice(&dst);
    b[10..12].copy_from_slice(&[0, 0]);
    let c = csum_fold(csum_add(0, &b[..20]));
    b[10..12].copy_from_slice(&c.to_be_bytes());
}

/// What a generator run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenReport {
    /// Frames put on the TX ring.
    pub sent: u64,
    pub flows: u32,
    /// Seconds from the first to the last batch.
    pub secs: f64,
    /// Batches the socket could not take whole (back-pressure).
    pub backpressure: u64,
    /// AF_XDP mode of the socket (`native/copy`, ...).
    pub mode: String,
    /// Frames each flow got, counted (modulo 2^32) by a run; empty: the
    /// flows shared `sent` round-robin from flow 0.
    pub per_flow_sent: Vec<u32>,
}

impl GenReport {
    /// Frames flow `i` got: as counted, else its round-robin share.
    pub fn sent_for_flow(&self, i: u32) -> u64 {
        if let Some(&n) = self.per_flow_sent.get(i as usize) {
            return u64::from(n);
        }
        let n = u64::from(self.flows.max(1));
        self.sent / n + u64::from(u64::from(i) < self.sent % n)
    }

    pub fn pps(&self) -> f64 {
        if self.secs > 0.0 {
            self.sent as f64 / self.secs
        } else {
            0.0
        }
    }
}

/// Most credit the pacer's bucket holds, in ns of the target rate.
pub const CREDIT_NS: u64 = 10_000_000;
/// The pacer waits for the tokens this many ns of the rate bring (a chunk).
pub const CHUNK_NS: u64 = 100_000;
/// Waits longer than this sleep; shorter ones yield and poll.
pub const SLEEP_ABOVE_NS: u64 = 200_000;

/// Token-bucket pacing on a caller-supplied clock (see the module doc),
/// so tests can drive it with a virtual one.
#[derive(Clone, Debug)]
pub struct Pacer {
    rate: f64,
    tokens: f64,
    cap: f64,
    chunk: f64,
    last: u64,
}

impl Pacer {
    /// A pacer for `rate_pps` (> 0) sending at most `batch` frames at a
    /// time, starting at `now` (ns) with one chunk of credit.
    pub fn new(rate_pps: u64, batch: usize, now: u64) -> Pacer {
        let rate = rate_pps.max(1) as f64;
        let batch = batch.max(1) as f64;
        let chunk = (rate * CHUNK_NS as f64 / 1e9).clamp(1.0, batch);
        let cap = (rate * CREDIT_NS as f64 / 1e9).max(batch);
        Pacer {
            rate,
            tokens: chunk,
            cap,
            chunk,
            last: now,
        }
    }

    /// Most tokens the bucket holds.
    pub fn cap(&self) -> f64 {
        self.cap
    }

    /// At `now`: `Ok(n)`, send up to `n` (1..=`max`) frames now, or
    /// `Err(ns)`, wait that long first. `max` is what the caller would
    /// send (a batch, or what is left of the count).
    pub fn poll(&mut self, now: u64, max: usize) -> Result<usize, u64> {
        let dt = now.saturating_sub(self.last);
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt as f64 * self.rate / 1e9).min(self.cap);
        let max = max.max(1);
        let want = self.chunk.min(max as f64);
        if self.tokens >= want {
            return Ok((self.tokens as usize).clamp(1, max));
        }
        Err((((want - self.tokens) * 1e9 / self.rate).ceil() as u64).max(1))
    }

    /// `n` frames went out.
    pub fn spent(&mut self, n: usize) {
        self.tokens -= n as f64;
    }
}

/// Waits `ns` as the pacer wants: sleeps when longer than
/// [`SLEEP_ABOVE_NS`] (the bucket absorbs the overshoot), else yields.
fn pace_wait(ns: u64) {
    if ns > SLEEP_ABOVE_NS {
        std::thread::sleep(Duration::from_nanos(ns.min(10_000_000)));
    } else {
        std::thread::yield_now();
    }
}

/// The sequence number sent in place of `seq` under
/// [`GenConfig::reorder_every`] (a permutation: the first two of every
/// block of `every` are swapped).
#[inline]
pub fn reorder(seq: u32, every: u32) -> u32 {
    if every < 2 {
        return seq;
    }
    match seq % every {
        0 => seq.wrapping_add(1),
        1 => seq.wrapping_sub(1),
        _ => seq,
    }
}

/// Sends on `ports` as configured until the duration/count is reached or
/// `stop` is set. With several sockets (one per queue of the interface),
/// flow `i` always leaves on `ports[i % ports.len()]` (as RSS keeps a
/// flow on one queue) and the batches go to the sockets in turn.
pub fn run(ports: &mut [XskPort], cfg: &GenConfig, stop: &AtomicBool) -> Result<GenReport> {
    let mut fb = FrameBuilder::new(cfg)?;
    let flows = cfg.flows;
    let lanes = ports.len() as u32;
    if lanes == 0 || flows < lanes {
        bail!("{flows} flows cannot use {lanes} queues (at least one flow per queue)");
    }
    // Per flow: frames sent (modulo 2^32), which in per-flow mode is also
    // the next sequence number. One allocation per run.
    let mut seqs = vec![0u32; flows as usize];
    let mut global: u32 = 0;
    // Each lane's next flow: lane k sends flows k, k + lanes, ...
    let mut cursors: Vec<u32> = (0..lanes).collect();
    let mut lane = 0usize;
    let mut sent: u64 = 0;
    let mut backpressure = 0;
    let limit = cfg.count.unwrap_or(u64::MAX);
    let start = now_ns();
    let end = start.saturating_add(cfg.duration.as_nanos() as u64);
    let mut pacer = (cfg.rate_pps > 0).then(|| Pacer::new(cfg.rate_pps, cfg.batch, start));
    let mut now = start;
    for port in ports.iter_mut() {
        let _ = port.take_counters(false);
    }
    // The next flow of a lane after `f`.
    let next = |f: u32, lane: u32| {
        let n = f + lanes;
        if n >= flows {
            lane
        } else {
            n
        }
    };
    while now < end && sent < limit && !stop.load(Ordering::Relaxed) {
        let mut n = cfg
            .batch
            .min((limit - sent).min(usize::MAX as u64) as usize);
        if let Some(p) = pacer.as_mut() {
            match p.poll(now, n) {
                Ok(k) => n = k,
                Err(wait) => {
                    pace_wait(wait.min(end.saturating_sub(now)).max(1));
                    now = now_ns();
                    continue;
                }
            }
        }
        let port = &mut ports[lane];
        let first = cursors[lane];
        let mut cursor = first;
        for _ in 0..n {
            let s = &mut seqs[cursor as usize];
            let flow_seq = *s;
            *s = flow_seq.wrapping_add(1);
            let seq = match cfg.seq {
                SeqMode::PerFlow => flow_seq,
                SeqMode::Global => {
                    let v = global;
                    global = global.wrapping_add(1);
                    v
                }
            };
            let seq = reorder(seq, cfg.reorder_every);
            port.send(fb.frame(cursor, seq, now_ns()));
            cursor = next(cursor, lane as u32);
        }
        port.flush();
        let c = port.take_counters(false);
        let ok = (c.tx_packets as usize).min(n);
        if ok < n {
            backpressure += 1;
            // Roll back the frames the socket did not take (a suffix):
            // the lane resumes at the first of them.
            let mut f = first;
            for _ in 0..ok {
                f = next(f, lane as u32);
            }
            cursor = f;
            for _ in ok..n {
                if let Some(s) = seqs.get_mut(f as usize) {
                    *s = s.wrapping_sub(1);
                }
                f = next(f, lane as u32);
            }
            global = global.wrapping_sub((n - ok) as u32);
            if ok == 0 {
                // Let the kernel drain the ring.
                std::thread::yield_now();
            }
        }
        cursors[lane] = cursor;
        lane = (lane + 1) % ports.len();
        sent += ok as u64;
        if let Some(p) = pacer.as_mut() {
            p.spent(ok);
        }
        now = now_ns();
    }
    let secs = (now_ns() - start) as f64 / 1e9;
    // Let the kernel transmit what is on the rings (copy mode sends on kicks).
    for _ in 0..20 {
        for port in ports.iter_mut() {
            port.flush();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(GenReport {
        sent,
        flows,
        secs,
        backpressure,
        mode: ports[0].mode().name().to_owned(),
        per_flow_sent: seqs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xbench::find_trailer;

    fn parse_ok(f: &[u8]) {
        let ip = etherparse::SlicedPacket::from_ethernet(f).expect("parses");
        assert!(ip.net.is_some());
    }

    #[test]
    fn frames_have_the_size_tuple_and_trailer() {
        for (proto, vx) in [
            (Proto::Udp, false),
            (Proto::TcpSyn, false),
            (Proto::Udp, true),
            (Proto::TcpSyn, true),
        ] {
            let min = min_frame_size(proto, vx);
            for size in [min, 128, 1518] {
                let cfg = GenConfig {
                    frame_size: size,
                    flows: 100_000,
                    proto,
                    src_ips: 7,
                    vxlan: vx.then_some(Vxlan {
                        src_mac: [2, 0, 0, 0, 0, 1],
                        dst_mac: [2, 0, 0, 0, 0, 2],
                        src_ip: [192, 0, 2, 1],
                        dst_ip: [192, 0, 2, 2],
                        vni: 42,
                    }),
                    ..GenConfig::default()
                };
                let mut fb = FrameBuilder::new(&cfg).expect("valid");
                let f = fb.frame(70_001, 9, 123).to_vec();
                assert_eq!(f.len(), size - 4);
                parse_ok(&f);
                let t = find_trailer(&f).expect("trailer");
                assert_eq!((t.flow, t.seq, t.ts_ns), (70_001, 9, 123));
                let inner = if vx { &f[VXLAN_OVERHEAD..] } else { &f[..] };
                let p = etherparse::SlicedPacket::from_ethernet(inner).expect("inner");
                match p.transport {
                    Some(etherparse::TransportSlice::Udp(u)) => {
                        assert_eq!(u.source_port(), 1024 + 6001);
                        assert_eq!(u.destination_port(), 5001);
                    }
                    Some(etherparse::TransportSlice::Tcp(t)) => {
                        assert!(t.syn());
                        let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else {
                            panic!("ipv4")
                        };
                        let h = ip.header().to_header();
                        let c = t.calc_checksum_ipv4(h.source, h.destination).expect("csum");
                        assert_eq!(c, t.checksum());
                    }
                    _ => panic!("no L4"),
                }
                let Some(etherparse::NetSlice::Ipv4(ip)) = p.net else {
                    panic!("ipv4")
                };
                let h = ip.header().to_header();
                assert_eq!(h.header_checksum, h.calc_header_checksum());
                assert_eq!(h.source, [10, 200, 0, 1 + (70_001 % 7) as u8]);
            }
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        let c = |f: fn(&mut GenConfig)| {
            let mut g = GenConfig::default();
            f(&mut g);
            FrameBuilder::new(&g).is_err()
        };
        assert!(c(|g| g.frame_size = 63));
        assert!(c(|g| g.frame_size = 1519));
        assert!(c(|g| {
            g.proto = Proto::TcpSyn;
            g.frame_size = 64
        }));
        assert!(c(|g| g.flows = 0));
        assert!(c(|g| g.flows = MAX_FLOWS + 1));
        assert!(!c(|_| {}));
    }

    /// Drives a pacer on a virtual clock: each batch costs `cost_ns`,
    /// each wait overshoots by `overshoot(i)` ns; returns the frames sent
    /// in `secs` and the largest single grant.
    fn simulate(
        rate: u64,
        batch: usize,
        secs: f64,
        cost_ns: u64,
        overshoot: impl Fn(u64) -> u64,
    ) -> (u64, usize) {
        let end = (secs * 1e9) as u64;
        let mut now = 0u64;
        let mut p = Pacer::new(rate, batch, now);
        let (mut sent, mut biggest, mut i) = (0u64, 0usize, 0u64);
        while now < end {
            i += 1;
            match p.poll(now, batch) {
                Ok(n) => {
                    assert!((1..=batch).contains(&n));
                    biggest = biggest.max(n);
                    p.spent(n);
                    sent += n as u64;
                    now += cost_ns;
                }
                Err(w) => {
                    assert!(w > 0);
                    now += w + overshoot(i);
                }
            }
        }
        (sent, biggest)
    }

    #[test]
    fn pacer_holds_the_rate_despite_late_wakeups() {
        for rate in [10_000u64, 100_000, 274_000, 1_000_000] {
            // Exact clock.
            let (sent, _) = simulate(rate, 32, 1.0, 2_000, |_| 0);
            let err = (sent as f64 - rate as f64).abs() / rate as f64;
            assert!(err < 0.01, "rate {rate}: sent {sent}");
            // Every wait 150 us late, and every 50th wait a 3 ms stall (a
            // loaded machine): the credit makes it up.
            let (sent, biggest) = simulate(rate, 32, 1.0, 2_000, |i| {
                if i % 50 == 0 {
                    3_000_000
                } else {
                    150_000
                }
            });
            let err = (sent as f64 - rate as f64).abs() / rate as f64;
            assert!(err < 0.02, "rate {rate} with late wake-ups: sent {sent}");
            assert!(biggest <= 32);
        }
    }

    #[test]
    fn pacer_credit_is_bounded_and_chunks_scale_with_rate() {
        // A 1 s stall earns at most CREDIT_NS worth of frames.
        let mut p = Pacer::new(200_000, 32, 0);
        assert!((p.cap() - 2000.0).abs() < 1e-6);
        let mut burst = 0;
        let now = 1_000_000_000;
        while let Ok(n) = p.poll(now, 32) {
            p.spent(n);
            burst += n;
        }
        // All of it but what is left below one chunk (20 frames).
        assert!((1980..=2001).contains(&burst), "burst {burst}");
        // 10 kpps: one frame per 100 us, never a batch's worth of waiting.
        let mut p = Pacer::new(10_000, 32, 0);
        assert_eq!(p.poll(0, 32), Ok(1));
        p.spent(1);
        assert_eq!(p.poll(0, 32), Err(100_000));
        assert_eq!(p.poll(100_000, 32), Ok(1));
        // 1 Mpps: waits for a full batch (one kick per 32 frames).
        let mut p = Pacer::new(1_000_000, 32, 0);
        p.spent(32);
        assert_eq!(p.poll(0, 32), Err(32_000));
        assert_eq!(p.poll(32_000, 32), Ok(32));
        // The count's remainder is granted without waiting for a chunk.
        let mut p = Pacer::new(1_000_000, 32, 0);
        assert_eq!(p.poll(0, 5), Ok(5));
    }

    #[test]
    fn round_robin_share() {
        let r = GenReport {
            sent: 10,
            flows: 4,
            ..Default::default()
        };
        let v: Vec<u64> = (0..4).map(|i| r.sent_for_flow(i)).collect();
        assert_eq!(v, [3, 3, 2, 2]);
        // Counted (several queues: each lane has its own share).
        let r = GenReport {
            per_flow_sent: vec![4, 1, 3, 2],
            ..r
        };
        let v: Vec<u64> = (0..4).map(|i| r.sent_for_flow(i)).collect();
        assert_eq!(v, [4, 1, 3, 2]);
    }

    #[test]
    fn reorder_swaps_the_first_two_of_each_block() {
        let sent: Vec<u32> = (0..12).map(|v| reorder(v, 5)).collect();
        assert_eq!(sent, [1, 0, 2, 3, 4, 6, 5, 7, 8, 9, 11, 10]);
        assert_eq!(
            (0..7).map(|v| reorder(v, 0)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5, 6]
        );
        assert_eq!(
            (0..4).map(|v| reorder(v, 1)).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }
}
