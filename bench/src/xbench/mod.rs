//! # `xbench`: the library behind `oxvs-bench`, a datapath benchmark
//!
//! A traffic generator ([`gen`]) and a sink ([`sink`]) on AF_XDP sockets
//! (through `oxvs_switch::afxdp::XskPort`, so this crate has no `unsafe`),
//! the setups they run in ([`setup`]: namespaces and veths around a switch
//! under test, or user-named ports behind a safety check), the methods
//! ([`methods`]: fixed rate, RFC 2544-style throughput search, scaling) and
//! the output ([`report`]: table, JSON with the machine description, SVG
//! plots).
//!
//! ## The payload ([`Trailer`])
//!
//! Every generated frame carries, right after its L4 header (the inner one
//! for VXLAN), 18 bytes: a 16-bit magic, the flow index (u32), the
//! sequence number (u32, per flow or global) and the send time (u64,
//! CLOCK_MONOTONIC ns, the same clock on the sink's side of the same host),
//! all little-endian. 18 bytes is what a 64-byte UDP frame (60 bytes + FCS)
//! has room for.
//!
//! Concurrency: the generator and the sink each run in their own thread
//! (each entered into its network namespace); they share nothing but a
//! stop flag.

pub mod gen;
pub mod hist;
pub mod methods;
pub mod pipeline;
pub mod report;
pub mod setup;
pub mod sink;

/// Magic at the start of the trailer.
pub const MAGIC: u16 = 0x0b5e;
/// Bytes of the trailer.
pub const TRAILER_LEN: usize = 18;
/// The VXLAN UDP port.
pub const VXLAN_PORT: u16 = 4789;

/// What the generator writes into every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub flow: u32,
    pub seq: u32,
    pub ts_ns: u64,
}

impl Trailer {
    /// Writes the trailer into `out` (at least [`TRAILER_LEN`] bytes).
    #[inline]
    pub fn write(&self, out: &mut [u8]) {
        if out.len() < TRAILER_LEN {
            return;
        }
        out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        out[2..6].copy_from_slice(&self.flow.to_le_bytes());
        out[6..10].copy_from_slice(&self.seq.to_le_bytes());
        out[10..18].copy_from_slice(&self.ts_ns.to_le_bytes());
    }

    /// Reads a trailer at the start of `b`; None without the magic.
    #[inline]
    pub fn read(b: &[u8]) -> Option<Trailer> {
        let b = b.get(..TRAILER_LEN)?;
        if u16::from_le_bytes([b[0], b[1]]) != MAGIC {
            return None;
        }
        Some(Trailer {
            flow: u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
            seq: u32::from_le_bytes([b[6], b[7], b[8], b[9]]),
            ts_ns: u64::from_le_bytes([b[10], b[11], b[12], b[13], b[14], b[15], b[16], b[17]]),
        })
    }
}

/// Finds the trailer in an Ethernet frame: IPv4, UDP or TCP, optionally
/// inside one VXLAN encapsulation (outer UDP port 4789). None for anything
/// else (ARP, IPv6, truncated, no magic).
#[inline]
pub fn find_trailer(frame: &[u8]) -> Option<Trailer> {
    let (proto, l4) = ipv4_l4(frame)?;
    let udp_dport = |l4: &[u8]| l4.get(2..4).map(|p| u16::from_be_bytes([p[0], p[1]]));
    if proto == 17 && udp_dport(l4) == Some(VXLAN_PORT) {
        // UDP (8) + VXLAN (8), then the inner frame.
        let inner = l4.get(16..)?;
        if let Some((p2, l4b)) = ipv4_l4(inner) {
            return l4_payload(p2, l4b).and_then(Trailer::read);
        }
        return None;
    }
    l4_payload(proto, l4).and_then(Trailer::read)
}

fn ipv4_l4(frame: &[u8]) -> Option<(u8, &[u8])> {
    let eth = frame.get(..14)?;
    if eth[12] != 0x08 || eth[13] != 0x00 {
        return None;
    }
    let ip = frame.get(14..)?;
    let v_ihl = *ip.first()?;
    if v_ihl >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(v_ihl & 0x0f) * 4;
    if ihl < 20 {
        return None;
    }
    Some((*ip.get(9)?, ip.get(ihl..)?))
}

fn l4_payload(proto: u8, l4: &[u8]) -> Option<&[u8]> {
    match proto {
        17 => l4.get(8..),
        6 => {
            let off = usize::from(*l4.get(12)? >> 4) * 4;
            if off < 20 {
                return None;
            }
            l4.get(off..)
        }
        _ => None,
    }
}

/// CLOCK_MONOTONIC in ns (the vDSO: no syscall).
#[inline]
pub fn now_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux (0 if it ever did).
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        (t.tv_sec() as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(t.tv_nsec() as u64)
    })
}

/// Moves the calling thread into network namespace `name`
/// (`/var/run/netns/NAME`, as `ip netns add` makes it).
pub fn enter_netns(name: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let path = format!("/var/run/netns/{name}");
    let f = std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("cannot enter network namespace {name}"))
}
