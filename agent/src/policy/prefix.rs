//! Address and port sets as the prefixes and value/mask pairs flows can
//! match: `ipBlock` (a CIDR minus its exceptions) as disjoint prefixes, and
//! a port range (`port..=endPort`) as `tp_dst` value/mask pairs.
//!
//! Pure functions; every result is sorted and its pieces disjoint, so equal
//! input gives equal flows.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// `cidr` minus every net of `except`, as sorted, disjoint prefixes that
/// cover exactly the remaining addresses. Exceptions outside `cidr` are
/// ignored; host bits of every net are cleared first.
///
/// Time O(n log n) and at most 62 (n + 1) prefixes for n exceptions (an
/// `ipBlock` may list as many as fit in a Kubernetes object, ~100 000):
/// the exceptions, as address ranges clipped to the block and sorted,
/// leave at most n + 1 gaps, and each gap is cut into its largest aligned
/// blocks (at most 62 for a range of 32-bit addresses). The result is the
/// unique smallest set of prefixes covering the remaining addresses.
pub fn ipblock_prefixes(cidr: Ipv4Net, except: &[Ipv4Net]) -> Vec<Ipv4Net> {
    let block = cidr.trunc();
    let (lo, hi) = (u32::from(block.network()), u32::from(block.broadcast()));
    let mut holes: Vec<(u32, u32)> = except
        .iter()
        .map(|e| {
            let e = e.trunc();
            (u32::from(e.network()), u32::from(e.broadcast()))
        })
        .filter(|&(s, e)| s <= hi && e >= lo)
        .map(|(s, e)| (s.max(lo), e.min(hi)))
        .collect();
    holes.sort_unstable();
    let mut out = Vec::new();
    // The first address neither emitted nor excepted yet (u64: may pass 2^32 - 1).
    let mut next = u64::from(lo);
    for (s, e) in holes {
        if u64::from(s) > next {
            range_prefixes(next, u64::from(s) - 1, &mut out);
        }
        next = next.max(u64::from(e) + 1);
    }
    if next <= u64::from(hi) {
        range_prefixes(next, u64::from(hi), &mut out);
    }
    out
}

/// Appends the largest aligned blocks that exactly cover `lo..=hi`
/// (`hi < 2^32`), in address order.
fn range_prefixes(mut lo: u64, hi: u64, out: &mut Vec<Ipv4Net>) {
    while lo <= hi {
        // The largest aligned block starting at `lo` that ends within `hi`.
        let mut size: u64 = if lo == 0 {
            1 << 32
        } else {
            1 << lo.trailing_zeros()
        };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        // `size` is a power of two in 1..=2^32, so the length is 0..=32;
        // `lo` is below 2^32 since it is at most `hi`.
        let len = 32 - size.trailing_zeros() as u8;
        if let Ok(net) = Ipv4Net::new(Ipv4Addr::from(lo as u32), len) {
            out.push(net);
        }
        lo += size;
    }
}

/// Whether `ip` is in `cidr` and in none of `except` (the API's meaning,
/// evaluated directly; the reference for [`ipblock_prefixes`]).
pub fn ipblock_contains(cidr: Ipv4Net, except: &[Ipv4Net], ip: Ipv4Addr) -> bool {
    cidr.trunc().contains(&ip) && !except.iter().any(|e| e.trunc().contains(&ip))
}

/// The range `lo..=hi` as sorted, disjoint `(value, mask)` pairs of a 16-bit
/// field (`tp_dst=value/mask`). Empty if `lo > hi`; the full range is the one
/// pair `(0, 0)`.
pub fn port_masks(lo: u16, hi: u16) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    let (mut lo, hi) = (u32::from(lo), u32::from(hi));
    while lo <= hi {
        // The largest aligned block starting at `lo` that ends within `hi`.
        let mut size: u32 = if lo == 0 {
            1 << 16
        } else {
            1 << lo.trailing_zeros()
        };
        while lo + size - 1 > hi {
            size >>= 1;
        }
        let mask = (!(size - 1)) & 0xffff;
        // `lo` and `mask` are below 2^16 by construction.
        out.push((lo as u16, mask as u16));
        lo += size;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn ipblock_without_except_is_itself() {
        assert_eq!(
            ipblock_prefixes(net("10.0.0.7/24"), &[]),
            vec![net("10.0.0.0/24")]
        );
    }

    #[test]
    fn ipblock_except_decomposes_into_disjoint_prefixes() {
        let p = ipblock_prefixes(net("10.0.0.0/24"), &[net("10.0.0.128/26")]);
        assert_eq!(p, vec![net("10.0.0.0/25"), net("10.0.0.192/26")]);
        let p = ipblock_prefixes(net("10.0.0.0/30"), &[net("10.0.0.1/32")]);
        assert_eq!(p, vec![net("10.0.0.0/32"), net("10.0.0.2/31")]);
        assert!(ipblock_prefixes(net("10.0.0.0/24"), &[net("10.0.0.0/16")]).is_empty());
        // An exception outside the block changes nothing.
        assert_eq!(
            ipblock_prefixes(net("10.0.0.0/24"), &[net("10.1.0.0/24")]),
            vec![net("10.0.0.0/24")]
        );
    }

    /// Regression (found by the `ipblock` fuzz target): the old recursive
    /// split scanned every exception at every node, O(n^2) for n
    /// exceptions: 4 000 took 90 s, the ~100 000 an object can hold would
    /// stall the agent for hours.
    #[test]
    fn ipblock_with_many_exceptions_is_fast_and_small() {
        let cidr = net("10.0.0.0/8");
        let except: Vec<Ipv4Net> = (0..100_000u32)
            .map(|k| Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + k * 37), 32).unwrap())
            .collect();
        let t = std::time::Instant::now();
        let p = ipblock_prefixes(cidr, &except);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert!(p.len() <= 62 * (except.len() + 1));
        assert!(p.windows(2).all(|w| w[0].broadcast() < w[1].network()));
        for e in except.iter().step_by(4999) {
            let a = u32::from(e.network());
            for ip in [a - 1, a, a + 1] {
                let ip = Ipv4Addr::from(ip);
                let covered = p.iter().any(|n| n.contains(&ip));
                assert_eq!(covered, ipblock_contains(cidr, &except, ip), "{ip}");
            }
        }
    }

    #[test]
    fn ipblock_at_the_ends_of_the_address_space() {
        let all = net("0.0.0.0/0");
        assert_eq!(ipblock_prefixes(all, &[]), vec![all]);
        assert!(ipblock_prefixes(all, &[all]).is_empty());
        let p = ipblock_prefixes(all, &[net("255.255.255.255/32"), net("0.0.0.0/32")]);
        assert_eq!(p.len(), 62);
        assert_eq!(p.first(), Some(&net("0.0.0.1/32")));
        assert_eq!(p.last(), Some(&net("255.255.255.254/32")));
        assert_eq!(
            ipblock_prefixes(net("255.255.255.254/31"), &[net("255.255.255.254/32")]),
            vec![net("255.255.255.255/32")]
        );
    }

    #[test]
    fn ipblock_prefixes_agree_with_the_definition() {
        let cidr = net("10.0.0.0/27");
        let except = [
            net("10.0.0.3/32"),
            net("10.0.0.8/30"),
            net("10.0.0.20/31"),
            net("10.0.0.9/32"),
        ];
        let p = ipblock_prefixes(cidr, &except);
        for a in 0..=255u8 {
            let ip = Ipv4Addr::new(10, 0, 0, a);
            let hits = p.iter().filter(|n| n.contains(&ip)).count();
            assert!(hits <= 1, "{ip} in {hits} prefixes");
            assert_eq!(hits == 1, ipblock_contains(cidr, &except, ip), "{ip}");
        }
    }

    #[test]
    fn port_ranges_as_masks() {
        assert_eq!(port_masks(80, 80), vec![(80, 0xffff)]);
        assert_eq!(port_masks(8080, 8095), vec![(8080, 0xfff0)]);
        assert_eq!(
            port_masks(1000, 1003),
            vec![(1000, 0xfffc)],
            "1000 is a multiple of 4"
        );
        assert_eq!(port_masks(0, 65535), vec![(0, 0)]);
        assert_eq!(port_masks(32768, 65535), vec![(32768, 0x8000)]);
        assert!(port_masks(10, 9).is_empty());
        assert_eq!(port_masks(65535, 65535), vec![(65535, 0xffff)]);
        for (lo, hi) in [(1u16, 65535u16), (3, 1000), (22, 23), (1, 2), (5000, 5100)] {
            let m = port_masks(lo, hi);
            for p in 0..=65535u16 {
                let hits = m.iter().filter(|(v, k)| p & k == *v).count();
                assert_eq!(
                    hits,
                    usize::from(p >= lo && p <= hi),
                    "{lo}..={hi} port {p}"
                );
            }
            assert!(m.len() <= 30, "{lo}..={hi}: {} pairs", m.len());
        }
    }
}
