//! A log-linear latency histogram (HdrHistogram-like, no dependency).
//!
//! Values (ns) below 64 have a bucket each; above, every power of two is
//! split into 32 sub-buckets, so a recorded value is known to within
//! 1/32 (~3%). Covers 0..2^48 ns; larger values land in the last bucket.
//! Recording is an index computation and an increment (no allocation);
//! the exact maximum is kept. Not thread-safe: one per sink thread,
//! merged afterwards ([`Histogram::merge`]).

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const MAX_EXP: usize = 48;
const BUCKETS: usize = 2 * SUB + (MAX_EXP - SUB_BITS as usize - 1) * SUB;

/// See the module doc.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    min: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

fn index(v: u64) -> usize {
    if v < (2 * SUB) as u64 {
        return v as usize;
    }
    // e >= SUB_BITS + 1: v in [2^e, 2^(e+1)).
    let e = 63 - v.leading_zeros() as usize;
    let sub = ((v >> (e - SUB_BITS as usize)) as usize) & (SUB - 1);
    let i = 2 * SUB + (e - SUB_BITS as usize - 1) * SUB + sub;
    i.min(BUCKETS - 1)
}

/// The highest value of bucket `i`.
fn bucket_high(i: usize) -> u64 {
    if i < 2 * SUB {
        return i as u64;
    }
    let k = i - 2 * SUB;
    let e = k / SUB + SUB_BITS as usize + 1;
    let sub = (k % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS as usize);
    (1u64 << e) + sub * width + width - 1
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max: 0,
            min: u64::MAX,
        }
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        let i = index(v);
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.total += 1;
        self.max = self.max.max(v);
        self.min = self.min.min(v);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn min(&self) -> Option<u64> {
        (self.total > 0).then_some(self.min)
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.max = self.max.max(o.max);
        self.min = self.min.min(o.min);
    }

    /// The value at quantile `q` (0..=1): the upper bound of the bucket
    /// holding it, capped at the exact maximum. None when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bucket_high(i).min(self.max));
            }
        }
        Some(self.max)
    }

    /// (value, cumulative fraction) for every non-empty bucket: the CDF.
    pub fn cdf(&self) -> Vec<(u64, f64)> {
        let mut out = Vec::new();
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            if *c > 0 {
                seen += c;
                out.push((
                    bucket_high(i).min(self.max),
                    seen as f64 / self.total as f64,
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut prev = 0;
        for v in [
            0u64,
            1,
            63,
            64,
            65,
            100,
            1000,
            12_345,
            1 << 20,
            1 << 40,
            1 << 47,
        ] {
            let i = index(v);
            assert!(i >= prev, "{v}");
            prev = i;
            let hi = bucket_high(i);
            assert!(hi >= v, "{v} -> {hi}");
            assert!(hi - v <= v / 16 + 1, "{v} -> {hi}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5).unwrap_or(0);
        assert!((490_000..=520_000).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99).unwrap_or(0);
        assert!((985_000..=1_000_000).contains(&p99), "{p99}");
        assert_eq!(h.quantile(1.0), Some(1_000_000));
        assert_eq!(h.max(), 1_000_000);
        let mut h2 = Histogram::new();
        h2.record(5);
        h.merge(&h2);
        assert_eq!(h.count(), 1001);
        assert_eq!(h.min(), Some(5));
        assert_eq!(h.cdf().last().map(|x| x.1), Some(1.0));
    }
}
