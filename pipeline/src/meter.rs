//! OpenFlow meters: rate limits a flow applies with `meter:N`.
//!
//! A meter (`ovs-ofctl add-meter BR 'meter=1,pktps,burst,stats,
//! band=type=drop,rate=10,burst_size=10'`) measures the packets that run
//! its `meter:N` action, in packets per second (`pktps`) or kilobits per
//! second (`kbps`, the frame's length), and drops those over the rate of
//! one of its bands. Antrea puts one on its controller-bound flows to cap
//! packet-ins; oxvs has the meter table, the action and the drop band,
//! as OVS's userspace datapath does (`dscp_remark` bands are refused).
//!
//! ## The bucket
//!
//! Each band is a token bucket of `rate` units per second holding at most
//! `burst_size` units (`burst` flag; without it the bucket holds one
//! second's worth, `rate`). It starts full. It is kept as one atomic, the
//! bucket's *theoretical arrival time* (`tat`, the generic cell rate
//! algorithm of ATM, equivalent to a token bucket): a packet costing `c`
//! units pushes `tat` to `max(tat, now) + c / rate`; it conforms if that
//! is at most `burst / rate` ahead of `now`, and only then is `tat`
//! stored (one compare-and-swap; a lost race retries). So a flood of
//! `burst`-sized bursts at rate `r` passes `burst + r * t` packets in `t`
//! seconds and drops the rest.
//!
//! ## Concurrency and cost
//!
//! A [`Meter`] lives in the table version ([`crate::tables::TableSet`])
//! and the translation puts an `Arc` of it in the datapath actions
//! ([`crate::odp::DpAction::Meter`]), so the datapath reaches it with no
//! lookup. Every datapath thread shares the meter's atomics: no lock, no
//! syscall, no allocation per packet; the cost is one compare-and-swap on
//! a cache line the threads share (one line per band, padded), and relaxed
//! adds for the counters. Per-thread buckets (each a share of the rate)
//! would avoid the shared line but are wrong for a flow whose packets
//! arrive on one thread: it would get only its share; the shared bucket is
//! exact. A meter change makes a new `Meter` (counters and bucket start
//! again, as a replaced meter in OVS's userspace datapath) and bumps the
//! table generation, which empties every cache holding the old one.
//!
//! Differences from OVS: `meter=all`, `slowpath` and `controller` ids are
//! refused; a flow's `meter:N` must name an existing meter
//! (`OFPMMFC_INVALID_METER`, as OVS); deleting a meter deletes the flows
//! that name it (as OVS). Group buckets may not use `meter`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::flow::Action;

/// The largest meter id (OpenFlow's `OFPM13_MAX`).
pub const METER_MAX: u32 = 0xffff_0000;

/// What a meter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MeterUnit {
    /// Kilobits per second (of the frame's bytes).
    Kbps,
    /// Packets per second.
    Pktps,
}

/// One band: packets over `rate` are dropped (OpenFlow's `OFPMBT_DROP`,
/// the only type oxvs has).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeterBand {
    /// Units per second (kbps or packets).
    pub rate: u32,
    /// Bucket size, in the meter's unit (kilobits or packets); 0 unless
    /// the meter has `burst`.
    pub burst_size: u32,
}

/// A meter as `add-meter` writes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MeterConfig {
    /// 1..=[`METER_MAX`].
    pub id: u32,
    pub unit: MeterUnit,
    /// The bands give `burst_size`.
    pub burst: bool,
    /// `stats`: counters are kept (oxvs keeps them always; the flag is
    /// printed back).
    pub stats: bool,
    /// At least one.
    pub bands: Vec<MeterBand>,
}

/// One change of the meter table (`add-meter`, `mod-meter`, `del-meters`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MeterMod {
    /// Refused if the id exists (`OFPMMFC_METER_EXISTS`).
    Add(MeterConfig),
    /// Replaces the meter (counters start again); refused if there is
    /// none (`OFPMMFC_UNKNOWN_METER`).
    Modify(MeterConfig),
    /// One meter (`Some`; nothing if it does not exist) or all; the flows
    /// that name a deleted meter are deleted with it.
    Delete(Option<u32>),
}

/// Why a meter cannot be installed (a meter built in code, not parsed).
pub fn invalid(c: &MeterConfig) -> Option<String> {
    if c.id == 0 || c.id > METER_MAX {
        return Some(format!("meter id {} is not in 1..={METER_MAX:#x}", c.id));
    }
    if c.bands.is_empty() {
        return Some("a meter needs at least one band".into());
    }
    for b in &c.bands {
        if b.rate == 0 {
            return Some("a band's rate must be at least 1".into());
        }
        if c.burst && b.burst_size == 0 {
            return Some("band must have 'burst_size' when 'burst' flag is set".into());
        }
        if !c.burst && b.burst_size != 0 {
            return Some("band may have 'burst_size' only when 'burst' flag is set".into());
        }
    }
    None
}

/// One band's bucket and counters, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct BandState {
    /// Theoretical arrival time, ns on the datapath's clock.
    tat: AtomicU64,
    packets: AtomicU64,
    bytes: AtomicU64,
}

/// An installed meter: its configuration, buckets and counters.
#[derive(Debug)]
pub struct Meter {
    pub config: MeterConfig,
    /// When it was installed (the caller's clock, ns).
    pub created_ns: u64,
    bands: Box<[BandState]>,
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
}

/// A band's counters (`meter-stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BandStats {
    pub packets: u64,
    pub bytes: u64,
}

/// A meter's counters (`meter-stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeterStats {
    pub id: u32,
    /// Flows whose actions name the meter.
    pub flow_count: u64,
    pub packets_in: u64,
    pub bytes_in: u64,
    pub duration_ns: u64,
    /// Packets each band dropped.
    pub bands: Vec<BandStats>,
}

impl Meter {
    pub fn new(config: MeterConfig, now_ns: u64) -> Meter {
        let bands = config.bands.iter().map(|_| BandState::default()).collect();
        Meter {
            config,
            created_ns: now_ns,
            bands,
            packets_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
        }
    }

    /// Units per second and bucket size of a band, in the units a packet
    /// costs (packets, or bits for kbps).
    fn band_units(&self, b: &MeterBand) -> (u64, u64) {
        let (rate, burst) = match self.config.unit {
            MeterUnit::Pktps => (u64::from(b.rate), u64::from(b.burst_size)),
            MeterUnit::Kbps => (u64::from(b.rate) * 1000, u64::from(b.burst_size) * 1000),
        };
        let burst = if self.config.burst { burst } else { rate };
        (rate.max(1), burst.max(1))
    }

    /// Meters one packet of `len` bytes at `now_ns`: whether it passes.
    /// A dropped packet is counted in the band that dropped it (of the
    /// bands it exceeds, the one with the highest rate, as OpenFlow says).
    /// Lock-free, no allocation.
    pub fn admit(&self, now_ns: u64, len: usize) -> bool {
        let len = len as u64;
        self.packets_in.fetch_add(1, Ordering::Relaxed);
        self.bytes_in.fetch_add(len, Ordering::Relaxed);
        let cost = match self.config.unit {
            MeterUnit::Pktps => 1,
            MeterUnit::Kbps => len * 8,
        };
        let mut dropped_by: Option<usize> = None;
        for (i, (band, st)) in self.config.bands.iter().zip(self.bands.iter()).enumerate() {
            let (rate, burst) = self.band_units(band);
            // ns per unit, kept exact with u128 intermediates.
            let inc = (u128::from(cost) * 1_000_000_000 / u128::from(rate)) as u64;
            let tau = (u128::from(burst) * 1_000_000_000 / u128::from(rate)) as u64;
            let mut tat = st.tat.load(Ordering::Relaxed);
            let conforms = loop {
                let next = tat.max(now_ns).saturating_add(inc);
                if next - now_ns > tau {
                    break false;
                }
                match st
                    .tat
                    .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => break true,
                    Err(t) => tat = t,
                }
            };
            if !conforms && dropped_by.is_none_or(|d| self.config.bands[d].rate < band.rate) {
                dropped_by = Some(i);
            }
        }
        match dropped_by {
            Some(i) => {
                if let Some(st) = self.bands.get(i) {
                    st.packets.fetch_add(1, Ordering::Relaxed);
                    st.bytes.fetch_add(len, Ordering::Relaxed);
                }
                false
            }
            None => true,
        }
    }

    /// The counters, with the number of flows that name the meter.
    pub fn stats(&self, flow_count: u64, now_ns: u64) -> MeterStats {
        MeterStats {
            id: self.config.id,
            flow_count,
            packets_in: self.packets_in.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            duration_ns: now_ns.saturating_sub(self.created_ns),
            bands: self
                .bands
                .iter()
                .map(|b| BandStats {
                    packets: b.packets.load(Ordering::Relaxed),
                    bytes: b.bytes.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

impl PartialEq for Meter {
    fn eq(&self, other: &Self) -> bool {
        self.config == other.config && self.created_ns == other.created_ns
    }
}

impl Eq for Meter {}

impl std::hash::Hash for Meter {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.config.hash(state);
        self.created_ns.hash(state);
    }
}

/// The meter ids `actions` name.
pub fn referenced(actions: &[Action], out: &mut Vec<u32>) {
    for a in actions {
        if let Action::Meter(id) = a {
            out.push(*id);
        }
    }
}

/// A meter as `ovs-ofctl -O OpenFlow15 dump-meters` prints it (two lines:
/// `meter=1 pktps burst stats bands=` and one `type=drop rate=10
/// burst_size=10` per band).
pub fn format_config(c: &MeterConfig) -> String {
    let mut s = format!(
        "meter={} {}",
        c.id,
        match c.unit {
            MeterUnit::Kbps => "kbps",
            MeterUnit::Pktps => "pktps",
        }
    );
    if c.burst {
        s.push_str(" burst");
    }
    if c.stats {
        s.push_str(" stats");
    }
    s.push_str(" bands=");
    for b in &c.bands {
        let _ = write!(s, "\ntype=drop rate={}", b.rate);
        if c.burst {
            let _ = write!(s, " burst_size={}", b.burst_size);
        }
    }
    s
}

/// A meter's counters as `ovs-ofctl -O OpenFlow15 meter-stats` prints
/// them (`meter:1 flow_count:1 packet_in_count:5 byte_in_count:300
/// duration:1.500s bands:` and `0: packet_count:2 byte_count:120`).
pub fn format_stats(st: &MeterStats) -> String {
    let mut s = format!(
        "meter:{} flow_count:{} packet_in_count:{} byte_in_count:{} duration:{}.{:03}s bands:",
        st.id,
        st.flow_count,
        st.packets_in,
        st.bytes_in,
        st.duration_ns / 1_000_000_000,
        st.duration_ns % 1_000_000_000 / 1_000_000
    );
    for (i, b) in st.bands.iter().enumerate() {
        let _ = write!(
            s,
            "\n{i}: packet_count:{} byte_count:{}",
            b.packets, b.bytes
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(unit: MeterUnit, burst: Option<u32>, rate: u32) -> Meter {
        Meter::new(
            MeterConfig {
                id: 1,
                unit,
                burst: burst.is_some(),
                stats: true,
                bands: vec![MeterBand {
                    rate,
                    burst_size: burst.unwrap_or(0),
                }],
            },
            0,
        )
    }

    /// A flood of `per_ms` packets every millisecond for `ms` ms: how many
    /// passed.
    fn flood(m: &Meter, start_ns: u64, ms: u64, per_ms: u64, len: usize) -> u64 {
        let mut passed = 0;
        for t in 0..ms {
            for _ in 0..per_ms {
                if m.admit(start_ns + t * 1_000_000, len) {
                    passed += 1;
                }
            }
        }
        passed
    }

    #[test]
    fn pktps_passes_burst_plus_rate_times_t() {
        let m = meter(MeterUnit::Pktps, Some(10), 10);
        let start = 5_000_000_000;
        // 2 s of 10 packets per ms: 10 (the burst) + 10/s * 2 s, give or
        // take the packet on the edge.
        let passed = flood(&m, start, 2000, 10, 60);
        assert!((29..=31).contains(&passed), "{passed}");
        let st = m.stats(3, start + 2_000_000_000);
        assert_eq!(st.packets_in, 20_000);
        assert_eq!(st.bands[0].packets, 20_000 - passed);
        assert_eq!(st.bands[0].bytes, (20_000 - passed) * 60);
        assert_eq!(st.flow_count, 3);
    }

    #[test]
    fn without_burst_the_bucket_holds_one_second() {
        let m = meter(MeterUnit::Pktps, None, 100);
        let passed = flood(&m, 1_000_000_000, 1, 500, 60);
        assert_eq!(passed, 100);
    }

    #[test]
    fn kbps_counts_bits() {
        // 80 kbps = 10,000 bytes/s; burst 8 kbit = 1,000 bytes.
        let m = meter(MeterUnit::Kbps, Some(8), 80);
        let start = 1_000_000_000;
        let passed = flood(&m, start, 1000, 10, 100);
        // 1,000 bytes of burst + 10,000 bytes in 1 s, 100 bytes each.
        assert!((109..=111).contains(&passed), "{passed}");
    }

    #[test]
    fn the_highest_rate_band_exceeded_counts_the_drop() {
        let m = Meter::new(
            MeterConfig {
                id: 2,
                unit: MeterUnit::Pktps,
                burst: false,
                stats: false,
                bands: vec![
                    MeterBand {
                        rate: 10,
                        burst_size: 0,
                    },
                    MeterBand {
                        rate: 5,
                        burst_size: 0,
                    },
                ],
            },
            0,
        );
        let passed = flood(&m, 1_000_000_000, 1, 20, 60);
        assert_eq!(passed, 5);
        let st = m.stats(0, 0);
        // Packets 6..10 exceed only the 5 pps band; 11..20 both: the 10 pps one counts them.
        assert_eq!((st.bands[0].packets, st.bands[1].packets), (10, 5));
    }

    #[test]
    fn prints_as_ovs_ofctl() {
        let c = MeterConfig {
            id: 3,
            unit: MeterUnit::Pktps,
            burst: true,
            stats: true,
            bands: vec![MeterBand {
                rate: 10,
                burst_size: 10,
            }],
        };
        assert_eq!(
            format_config(&c),
            "meter=3 pktps burst stats bands=\ntype=drop rate=10 burst_size=10"
        );
        let c = MeterConfig {
            id: 2,
            unit: MeterUnit::Kbps,
            burst: false,
            stats: true,
            bands: vec![MeterBand {
                rate: 1000,
                burst_size: 0,
            }],
        };
        assert_eq!(
            format_config(&c),
            "meter=2 kbps stats bands=\ntype=drop rate=1000"
        );
        let st = MeterStats {
            id: 2,
            flow_count: 0,
            packets_in: 0,
            bytes_in: 0,
            duration_ns: 74_000_000,
            bands: vec![BandStats::default()],
        };
        assert_eq!(
            format_stats(&st),
            "meter:2 flow_count:0 packet_in_count:0 byte_in_count:0 duration:0.074s bands:\n0: packet_count:0 byte_count:0"
        );
    }
}
