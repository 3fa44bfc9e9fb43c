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
pub fn ipblock_prefixes(cidr: Ipv4Net, except: &[Ipv4Net]) -> Vec<Ipv4Net> {
    let except: Vec<Ipv4Net> = except.iter().map(|e| e.trunc()).collect();
    let mut out = Vec::new();
    subtract(cidr.trunc(), &except, &mut out);
    out.sort();
    out
}

fn subtract(net: Ipv4Net, except: &[Ipv4Net], out: &mut Vec<Ipv4Net>) {
    if except.iter().any(|e| e.contains(&net)) {
        return;
    }
    if !except.iter().any(|e| net.contains(e)) {
        // No exception overlaps `net` (two prefixes overlap only if one
        // contains the other).
        out.push(net);
        return;
    }
    // Some exception is strictly inside `net`, so `net` is not a /32.
    match net.subnets(net.prefix_len().saturating_add(1)) {
        Ok(halves) => {
            for h in halves {
                subtract(h, except, out);
            }
        }
        Err(_) => out.push(net),
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
