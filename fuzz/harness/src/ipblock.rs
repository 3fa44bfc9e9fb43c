//! `ipblock`: a NetworkPolicy `ipBlock` (a CIDR minus its `except`s) as
//! the disjoint prefixes flows match ([`ipblock_prefixes`]), and a port
//! range as value/mask pairs ([`port_masks`]); small inputs also go
//! through the whole policy translator ([`policy::policy_flows`]) as a peer.
//!
//! Exceptions come one by one or in runs (a start, a prefix length, a
//! stride and a count of up to 65536), so a few bytes make the large
//! `except` lists a Kubernetes object may carry (the API server allows
//! ~1.5 MB: 100 000 of them). Time and memory must stay bounded:
//! the number of prefixes is at most 62 per gap between exceptions
//! (62 (n + 1) for n exceptions), and the computation must finish within
//! [`TIME_LIMIT`] for any input (libFuzzer's `-timeout` is the backstop).
//!
//! Checked: the prefixes are sorted, disjoint, inside the block, and cover
//! exactly the addresses [`ipblock_contains`] accepts, probed at every
//! edge of every prefix and exception (a sample when there are many);
//! every port pair is aligned and the pairs cover exactly `lo..=hi`.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use oxvs_agent::model::{ClusterState, LabelSelector, NetworkPolicy, Peer, Pod, Rule};
use oxvs_agent::policy::{
    self,
    prefix::{ipblock_contains, ipblock_prefixes, port_masks},
    LocalPod,
};

use crate::input::Input;

/// Most exceptions an input makes.
pub const MAX_EXCEPT: usize = 200_000;
/// Longest a computation may take (with a wide margin for a loaded machine
/// and unoptimised test builds: the expected time is milliseconds).
pub const TIME_LIMIT: Duration = Duration::from_secs(3);

fn net(addr: u32, len: u8) -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::from(addr), len.min(32)).expect("prefix length <= 32")
}

fn lo(n: &Ipv4Net) -> u32 {
    u32::from(n.network())
}

fn hi(n: &Ipv4Net) -> u32 {
    u32::from(n.broadcast())
}

pub fn run(data: &[u8]) {
    let mut i = Input::new(data);
    let cidr = net(i.u32(), i.u8() % 33);
    let mut except = Vec::new();
    while !i.is_empty() && except.len() < MAX_EXCEPT {
        let op = i.u8();
        if op & 1 == 0 {
            except.push(net(i.u32(), i.u8() % 33));
        } else {
            let (start, len) = (i.u32(), 8 + i.u8() % 25);
            let step = u64::from(i.u8().max(1)) << (32 - u32::from(len));
            let count = usize::from(i.u16()).min(MAX_EXCEPT - except.len());
            for k in 0..count as u64 {
                except.push(net((u64::from(start) + k * step) as u32, len));
            }
        }
    }
    let ports = (i.u16(), i.u16());

    let t = Instant::now();
    let out = ipblock_prefixes(cidr, &except);
    let took = t.elapsed();
    assert!(
        took < TIME_LIMIT,
        "{} exceptions took {took:?}",
        except.len()
    );
    assert!(
        out.len() <= 62 * (except.len() + 1),
        "{} prefixes for {} exceptions",
        out.len(),
        except.len()
    );
    check_prefixes(cidr, &except, &out);
    check_ports(ports.0, ports.1);
    if except.len() <= 64 {
        through_translator(cidr, &except, &out);
    }
}

fn covered(out: &[Ipv4Net], ip: u32) -> bool {
    // The prefixes are sorted by address and disjoint.
    let k = out.partition_point(|n| lo(n) <= ip);
    k > 0 && hi(&out[k - 1]) >= ip
}

fn check_prefixes(cidr: Ipv4Net, except: &[Ipv4Net], out: &[Ipv4Net]) {
    let block = cidr.trunc();
    for w in out.windows(2) {
        assert!(
            hi(&w[0]) < lo(&w[1]),
            "not sorted and disjoint: {} {}",
            w[0],
            w[1]
        );
    }
    for n in out {
        assert_eq!(*n, n.trunc(), "host bits set in {n}");
        assert!(block.contains(n), "{n} outside {block}");
    }
    let mut probes: Vec<u32> = vec![lo(&block), hi(&block)];
    let edges = |n: &Ipv4Net| [lo(n).wrapping_sub(1), lo(n), hi(n), hi(n).wrapping_add(1)];
    let sample = |len: usize| (len / 64).max(1);
    for n in out.iter().step_by(sample(out.len())) {
        probes.extend(edges(n));
    }
    for n in except.iter().step_by(sample(except.len())) {
        probes.extend(edges(&n.trunc()));
    }
    for ip in probes {
        assert_eq!(
            covered(out, ip),
            ipblock_contains(cidr, except, Ipv4Addr::from(ip)),
            "{} in {cidr} minus {} exceptions",
            Ipv4Addr::from(ip),
            except.len()
        );
    }
}

fn check_ports(a: u16, b: u16) {
    let pairs = port_masks(a, b);
    if a > b {
        assert!(pairs.is_empty());
        return;
    }
    assert!(pairs.len() <= 32, "{} pairs for {a}..={b}", pairs.len());
    let mut next = u32::from(a);
    for (v, m) in pairs {
        assert_eq!(v & !m, 0, "value {v:#x} has bits outside mask {m:#x}");
        let size = u32::from(!m) + 1;
        assert!(size.is_power_of_two());
        assert_eq!(u32::from(v), next, "pairs not contiguous");
        next += size;
    }
    assert_eq!(next, u32::from(b) + 1, "pairs do not end at {b}");
}

/// The block as the peer of an ingress rule selecting a local pod: the
/// translator's flows stay proportional to the prefixes.
fn through_translator(cidr: Ipv4Net, except: &[Ipv4Net], out: &[Ipv4Net]) {
    let mut state = ClusterState::default();
    let pod = Pod {
        namespace: "x".into(),
        name: "p".into(),
        uid: "uid-p".into(),
        labels: Default::default(),
        node_name: "n1".into(),
        ip: Some(Ipv4Addr::new(10, 244, 0, 3)),
        host_network: false,
        ports: vec![],
        ip6: None,
    };
    state.pods.insert(pod.key(), pod);
    let np = NetworkPolicy {
        namespace: "x".into(),
        name: "block".into(),
        uid: "uid-block".into(),
        pod_selector: LabelSelector::default(),
        ingress_isolation: true,
        egress_isolation: false,
        ingress: vec![Rule {
            peers: vec![Peer::IpBlock {
                cidr,
                except: except.to_vec(),
            }],
            ports: vec![],
        }],
        egress: vec![],
    };
    state.policies.insert(np.key(), np);
    let local = [LocalPod {
        namespace: "x".into(),
        name: "p".into(),
        ip: Some(Ipv4Addr::new(10, 244, 0, 3)),
        ofport: 3,
        ip6: None,
    }];
    let pf = policy::policy_flows(&state, &local);
    assert!(
        pf.flows.len() <= 16 + 2 * out.len(),
        "{} flows for {} prefixes",
        pf.flows.len(),
        out.len()
    );
}
