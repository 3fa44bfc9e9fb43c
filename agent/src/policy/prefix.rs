//! Address and port sets as the prefixes and value/mask pairs flows can
//! match: `ipBlock` (a CIDR minus its exceptions) as disjoint prefixes, and
//! a port range (`port..=endPort`) as `tp_dst` value/mask pairs.
//!
//! Pure functions; every result is sorted and its pieces disjoint, so equal
//! input gives equal flows.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// `cidr` minus every net of `except`, as sorted, disjoint prefixes that
/// cover exactly the remaining addresses (the fewest such prefixes: each
/// is a largest aligned block of the remainder). Exceptions outside `cidr`
/// are ignored; host bits of every net are cleared first.
///
/// Cost: O(e log e + p) for e exceptions and p output prefixes (sort the
/// exceptions as address ranges, walk the gaps between them, cut each gap
/// into aligned blocks), never e x p: a policy with tens of thousands of
/// `except` entries is milliseconds, not minutes. `p` is at most about
/// 2 x 32 per gap, so the output is bounded by the input times 64.
pub fn ipblock_prefixes(cidr: Ipv4Net, except: &[Ipv4Net]) -> Vec<Ipv4Net> {
    let range = |n: &Ipv4Net| {
        let n = n.trunc();
        (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
        )
    };
    remainder(range(&cidr), except.iter().map(range), 32)
        .into_iter()
        // Blocks of the IPv4 space: below 2^32, lengths 0..=32.
        .filter_map(|(lo, len)| Ipv4Net::new(Ipv4Addr::from(lo as u32), len).ok())
        .collect()
}

/// [`ipblock_prefixes`] for an IPv6 `ipBlock`.
pub fn ipblock_prefixes6(cidr: Ipv6Net, except: &[Ipv6Net]) -> Vec<Ipv6Net> {
    let range = |n: &Ipv6Net| {
        let n = n.trunc();
        (u128::from(n.network()), u128::from(n.broadcast()))
    };
    remainder(range(&cidr), except.iter().map(range), 128)
        .into_iter()
        .filter_map(|(lo, len)| Ipv6Net::new(Ipv6Addr::from(lo), len).ok())
        .collect()
}

/// The block `lo..=hi` minus the `holes` (address ranges, clipped to the
/// block: two prefixes overlap only if one contains the other, so
/// clipping is an intersection), as the largest aligned blocks
/// `(first address, prefix length)` of a `bits`-bit address space, in
/// order.
fn remainder(
    (lo, hi): (u128, u128),
    holes: impl Iterator<Item = (u128, u128)>,
    bits: u32,
) -> Vec<(u128, u8)> {
    let mut holes: Vec<(u128, u128)> = holes
        .filter(|&(s, e)| s <= hi && e >= lo)
        .map(|(s, e)| (s.max(lo), e.min(hi)))
        .collect();
    holes.sort_unstable();
    let mut out = Vec::new();
    // The first address not yet covered or cut; `None` once past `hi`
    // (`hi + 1` may not exist: `::/0` ends at 2^128 - 1).
    let mut next = Some(lo);
    for (s, e) in holes {
        let Some(n) = next else { break };
        if s > n {
            push_blocks(n, s - 1, bits, &mut out);
        }
        if e >= n {
            next = (e < hi).then(|| e + 1);
        }
    }
    if let Some(n) = next {
        push_blocks(n, hi, bits, &mut out);
    }
    out
}

/// The lowest `k` bits set (`k` up to 128).
fn low_bits(k: u32) -> u128 {
    if k >= 128 {
        u128::MAX
    } else {
        (1u128 << k) - 1
    }
}

/// `lo..=hi` (within a `bits`-bit space) as the largest aligned blocks, in
/// order.
fn push_blocks(mut lo: u128, hi: u128, bits: u32, out: &mut Vec<(u128, u8)>) {
    loop {
        // The largest aligned block starting at `lo` that ends within `hi`.
        let mut k = if lo == 0 {
            bits
        } else {
            lo.trailing_zeros().min(bits)
        };
        while lo | low_bits(k) > hi {
            k -= 1;
        }
        // `k <= bits <= 128`, so the length fits.
        out.push((lo, (bits - k) as u8));
        let last = lo | low_bits(k);
        if last >= hi {
            return;
        }
        lo = last + 1;
    }
}

/// Whether `ip` is in the IPv6 `cidr` and in none of `except`.
pub fn ipblock6_contains(cidr: Ipv6Net, except: &[Ipv6Net], ip: Ipv6Addr) -> bool {
    cidr.trunc().contains(&ip) && !except.iter().any(|e| e.trunc().contains(&ip))
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

    fn net6(s: &str) -> Ipv6Net {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_ipblocks_with_and_without_exceptions() {
        assert_eq!(
            ipblock_prefixes6(net6("fd00::7/64"), &[]),
            vec![net6("fd00::/64")]
        );
        assert_eq!(ipblock_prefixes6(net6("::/0"), &[]), vec![net6("::/0")]);
        // The whole space minus its last address: 128 blocks, and the
        // walk does not overflow at 2^128 - 1.
        let all_but_last = ipblock_prefixes6(
            net6("::/0"),
            &[net6("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")],
        );
        assert_eq!(all_but_last.len(), 128);
        assert_eq!(all_but_last[0], net6("::/1"));
        // Minus its first address.
        let all_but_first = ipblock_prefixes6(net6("::/0"), &[net6("::/128")]);
        assert_eq!(all_but_first.len(), 128);
        assert_eq!(all_but_first[127], net6("8000::/1"));
        let got = ipblock_prefixes6(
            net6("fd00::/64"),
            &[net6("fd00::/66"), net6("fd00::8000:0:0:0/65")],
        );
        assert_eq!(got, vec![net6("fd00::4000:0:0:0/66")]);
        // Every address of a small block is judged as the direct
        // definition judges it.
        let (cidr, except) = (
            net6("fd00::/120"),
            vec![net6("fd00::10/124"), net6("fd00::81/128")],
        );
        let got = ipblock_prefixes6(cidr, &except);
        for i in 0..=255u128 {
            let ip = Ipv6Addr::from(u128::from(cidr.network()) + i);
            assert_eq!(
                got.iter().any(|n| n.contains(&ip)),
                ipblock6_contains(cidr, &except, ip),
                "{ip}"
            );
        }
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

    /// The former recursive decomposition (quadratic: every step scanned
    /// every exception), kept as a reference for the linear one.
    fn reference(cidr: Ipv4Net, except: &[Ipv4Net]) -> Vec<Ipv4Net> {
        fn subtract(net: Ipv4Net, except: &[Ipv4Net], out: &mut Vec<Ipv4Net>) {
            if except.iter().any(|e| e.contains(&net)) {
                return;
            }
            if !except.iter().any(|e| net.contains(e)) {
                out.push(net);
                return;
            }
            for h in net.subnets(net.prefix_len() + 1).unwrap() {
                subtract(h, except, out);
            }
        }
        let except: Vec<Ipv4Net> = except.iter().map(|e| e.trunc()).collect();
        let mut out = Vec::new();
        subtract(cidr.trunc(), &except, &mut out);
        out.sort();
        out
    }

    #[test]
    fn ipblock_prefixes_equal_the_recursive_decomposition() {
        // A small deterministic generator (xorshift): blocks and
        // exceptions of every size, nested, overlapping, outside.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..400 {
            let len = 8 + (next() % 25) as u8;
            let base = Ipv4Addr::from(0x0a00_0000 | (next() as u32 & 0x00ff_ffff));
            let cidr = Ipv4Net::new(base, len).unwrap();
            let n = next() % 12;
            let except: Vec<Ipv4Net> = (0..n)
                .map(|_| {
                    let l = len.saturating_sub(2) + (next() % (35 - u64::from(len))) as u8;
                    let a = u32::from(cidr.network()) ^ (next() as u32 & 0x0003_ffff);
                    Ipv4Net::new(Ipv4Addr::from(a), l.min(32)).unwrap()
                })
                .collect();
            assert_eq!(
                ipblock_prefixes(cidr, &except),
                reference(cidr, &except),
                "{cidr} except {except:?}"
            );
        }
        // The whole space and its edges.
        let all = net("0.0.0.0/0");
        for except in [
            vec![],
            vec![net("0.0.0.0/32")],
            vec![net("255.255.255.255/32")],
            vec![net("0.0.0.0/1"), net("128.0.0.0/1")],
            vec![net("10.0.0.0/8"), net("10.1.0.0/16")],
        ] {
            assert_eq!(
                ipblock_prefixes(all, &except),
                reference(all, &except),
                "{except:?}"
            );
        }
    }

    #[test]
    fn twenty_thousand_exceptions_are_linear() {
        // 20 000 scattered /32s in a /8: the former algorithm scanned all
        // of them at each of ~400 000 steps (minutes in a debug build).
        let except: Vec<Ipv4Net> = (0..20_000u32)
            .map(|i| Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 | (i * 797)), 32).unwrap())
            .collect();
        let p = ipblock_prefixes(net("10.0.0.0/8"), &except);
        // Every address is in exactly one prefix or one exception.
        let total: u64 = p.iter().map(|n| 1u64 << (32 - n.prefix_len())).sum();
        assert_eq!(total, (1 << 24) - 20_000);
        assert!(p.windows(2).all(|w| w[0].broadcast() < w[1].network()));
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
