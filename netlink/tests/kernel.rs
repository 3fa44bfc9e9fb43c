//! oxvs-netlink against the real kernel (root).
//!
//! Isolation: each test runs on a thread that `unshare`s a fresh network
//! namespace first, so everything it makes lives there and disappears with
//! the thread; the machine's own namespace is never touched, and nothing
//! runs `ip`.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;

use ipnet::{Ipv4Net, Ipv6Net};
use nix::sched::{unshare, CloneFlags};
use oxvs_netlink::{
    ethtool, Change, Errno, Error, Ipv4Route, Ipv4Rule, Ipv6Route, LinkChange, LinkSpec, Netlink,
    NewLink,
};

/// Runs `f` on a new thread in a new, empty network namespace; `None` (after
/// a skip) when this process may not make one.
fn in_fresh_netns<T: Send>(f: impl FnOnce() -> T + Send) -> Option<T> {
    if !oxvs_testutil::is_root() {
        oxvs_testutil::skip_or_fail("not root: cannot make a network namespace");
        return None;
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
    .into()
}

fn veth<'a>(a: &str, b: &str) -> NewLink<'a> {
    NewLink::Veth {
        end: LinkSpec::named(a),
        peer: LinkSpec::named(b),
    }
}

#[test]
fn veth_pair_lifecycle() {
    in_fresh_netns(|| {
        let mut nl = Netlink::open().unwrap();
        assert_eq!(nl.link("va").unwrap(), None);
        let made = nl
            .add_link_and_get(&NewLink::Veth {
                end: LinkSpec {
                    mtu: Some(1400),
                    queues: Some(3),
                    ..LinkSpec::named("va")
                },
                peer: LinkSpec {
                    mac: Some([0x02, 0, 0, 0, 0, 0x0b]),
                    queues: Some(3),
                    ..LinkSpec::named("vb")
                },
            })
            .unwrap();
        assert_eq!(made.name, "va");
        assert_eq!(made.mtu, Some(1400));
        assert_eq!(made.kind.as_deref(), Some("veth"));
        assert!(!made.up && !made.xdp);
        assert!(made.mac.is_some());
        let vb = nl.existing_link("vb").unwrap();
        assert_eq!(vb.mac, Some([0x02, 0, 0, 0, 0, 0x0b]));
        assert_eq!(nl.link_by_index(made.index).unwrap().unwrap().name, "va");

        // A taken name: EEXIST, worded like strerror.
        let e = nl.add_link(&veth("va", "vc")).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EEXIST), "{e}");
        assert_eq!(e.to_string(), "File exists");
        assert!(matches!(
            nl.add_link(&veth("va", "no/pe")),
            Err(Error::BadName(_))
        ));

        nl.set_link(
            made.index,
            &LinkChange {
                up: Some(true),
                mtu: Some(1300),
                alias: Some("oxvs:test".into()),
            },
        )
        .unwrap();
        nl.set_link(vb.index, &LinkChange::up()).unwrap();
        let va = nl.existing_link("va").unwrap();
        assert!(va.up);
        assert_eq!(va.mtu, Some(1300));
        assert_eq!(va.alias.as_deref(), Some("oxvs:test"));
        let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
        assert!(names.contains(&"lo".to_string()) && names.contains(&"vb".to_string()));

        // Deleting one end deletes both; a second delete finds nothing.
        assert!(nl.delete_link("va").unwrap());
        assert_eq!(nl.link("vb").unwrap(), None);
        assert!(!nl.delete_link("va").unwrap());
        assert!(!nl.delete_link_index(made.index).unwrap());
        assert_eq!(
            nl.existing_link("va").unwrap_err().errno(),
            Some(Errno::ENODEV)
        );
    });
}

#[test]
fn addresses_routes_and_pipeline() {
    in_fresh_netns(|| {
        let mut nl = Netlink::open().unwrap();
        let gw = nl.add_link_and_get(&veth("gw0", "gw0-p")).unwrap();
        let peer = nl.existing_link("gw0-p").unwrap();
        let ip = Ipv4Addr::new(10, 244, 0, 1);
        let results = nl
            .pipeline(&[
                Change::SetLink {
                    index: 1,
                    change: LinkChange::up(),
                },
                Change::SetLink {
                    index: gw.index,
                    change: LinkChange::up(),
                },
                Change::SetLink {
                    index: peer.index,
                    change: LinkChange::up(),
                },
                Change::AddAddress {
                    index: gw.index,
                    ip: IpAddr::V4(ip),
                    prefix_len: 24,
                },
                // The same address again: its own EEXIST, the rest goes on.
                Change::AddAddress {
                    index: gw.index,
                    ip: IpAddr::V4(ip),
                    prefix_len: 24,
                },
                Change::AddRoute {
                    route: Ipv4Route {
                        dst: "0.0.0.0/0".parse().unwrap(),
                        gateway: Some(Ipv4Addr::new(10, 244, 0, 254)),
                        oif: Some(gw.index),
                        onlink: false,
                        mtu: None,
                        table: None,
                    },
                    replace: false,
                },
            ])
            .unwrap();
        assert_eq!(results.len(), 6);
        for (i, r) in results.iter().enumerate() {
            if i == 4 {
                assert_eq!(r.as_ref().unwrap_err().errno(), Some(Errno::EEXIST));
            } else {
                assert!(r.is_ok(), "change {i}: {r:?}");
            }
        }
        let addrs = nl.addresses(Some(gw.index)).unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.ip == IpAddr::V4(ip) && a.prefix_len == 24),
            "{addrs:?}"
        );
        // Up, the peer has an IPv6 link-local address, and no IPv4 one.
        assert!(!nl
            .addresses(Some(peer.index))
            .unwrap()
            .iter()
            .any(|a| a.ip.is_ipv4()));
        assert!(nl
            .addresses(None)
            .unwrap()
            .iter()
            .any(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let defaults = nl.ipv4_default_routes().unwrap();
        assert_eq!(defaults.len(), 1, "{defaults:?}");
        assert_eq!(defaults[0].gateway, Some(Ipv4Addr::new(10, 244, 0, 254)));
        assert_eq!(defaults[0].oif, Some(gw.index));

        // An onlink route via a next hop outside every subnet; replace is
        // idempotent; delete, then delete again finds none.
        let r = Ipv4Route {
            dst: "10.245.0.0/16".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(192, 0, 2, 7)),
            oif: Some(gw.index),
            onlink: true,
            mtu: Some(1400),
            table: None,
        };
        nl.add_route(&r, true).unwrap();
        nl.add_route(&r, true).unwrap();
        // The route MTU took (a child process shares this thread's netns).
        let shown = std::process::Command::new("ip")
            .args(["route", "show", "10.245.0.0/16"])
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.contains("mtu 1400"), "{shown}");
        assert_eq!(
            nl.add_route(&r, false).unwrap_err().errno(),
            Some(Errno::EEXIST)
        );
        let del = Ipv4Route {
            gateway: None,
            onlink: false,
            ..r.clone()
        };
        assert!(nl.delete_route(&del).unwrap());
        assert!(!nl.delete_route(&del).unwrap());

        // A route in another table and a rule sending TCP to it, as the
        // agent gives a pod whose TCP takes the interface's MTU.
        let t = Ipv4Route {
            dst: "0.0.0.0/0".parse().unwrap(),
            gateway: Some(Ipv4Addr::new(192, 0, 2, 7)),
            oif: Some(gw.index),
            onlink: true,
            mtu: None,
            table: Some(100),
        };
        nl.add_route(&t, false).unwrap();
        let rule = Ipv4Rule {
            priority: 100,
            ip_proto: 6,
            table: 100,
        };
        nl.add_rule(&rule).unwrap();
        assert_eq!(nl.add_rule(&rule).unwrap_err().errno(), Some(Errno::EEXIST));
        let show = |args: &[&str]| {
            let o = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        let rules = show(&["-4", "rule", "show"]);
        assert!(
            rules.contains("100:\tfrom all ipproto tcp lookup 100"),
            "{rules}"
        );
        let table = show(&["-4", "route", "show", "table", "100"]);
        assert!(table.contains("default via 192.0.2.7"), "{table}");
        // A large table number goes in the attribute.
        let big = Ipv4Route {
            table: Some(1000),
            ..t.clone()
        };
        nl.add_route(&big, false).unwrap();
        let table = show(&["-4", "route", "show", "table", "1000"]);
        assert!(table.contains("default via 192.0.2.7"), "{table}");
    });
}

#[test]
fn tx_checksum_offload() {
    in_fresh_netns(|| {
        let mut nl = Netlink::open().unwrap();
        nl.add_link(&veth("cs0", "cs1")).unwrap();
        assert!(
            ethtool::tx_checksum("cs0").unwrap(),
            "veth starts with it on"
        );
        ethtool::set_tx_checksum("cs0", false).unwrap();
        assert!(!ethtool::tx_checksum("cs0").unwrap());
        assert!(
            ethtool::tx_checksum("cs1").unwrap(),
            "the peer is unchanged"
        );
        ethtool::set_tx_checksum("cs0", true).unwrap();
        assert!(ethtool::tx_checksum("cs0").unwrap());
        let e = ethtool::set_tx_checksum("nosuch0", false).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ENODEV), "{e}");
        assert!(matches!(
            ethtool::tx_checksum("a/b"),
            Err(Error::BadName(_))
        ));
    });
}

#[test]
fn root_qdisc_replace_and_read() {
    in_fresh_netns(|| {
        let mut nl = Netlink::open().unwrap();
        let l = nl.add_link_and_get(&veth("qd0", "qd1")).unwrap();
        // A link that is down lists no qdisc (it has the hidden `noop`).
        assert_eq!(nl.root_qdisc(l.index).unwrap(), None);
        nl.set_link(l.index, &LinkChange::up()).unwrap();
        assert_eq!(
            nl.root_qdisc(l.index).unwrap().as_deref(),
            Some("noqueue"),
            "a veth queues nothing by default"
        );
        // FIFOs are built into every kernel with qdiscs at all.
        nl.replace_root_qdisc(l.index, "pfifo").unwrap();
        assert_eq!(nl.root_qdisc(l.index).unwrap().as_deref(), Some("pfifo"));
        // Replacing again, also through a pipeline, is not an error.
        let r = nl
            .pipeline(&[Change::ReplaceRootQdisc {
                index: l.index,
                kind: "pfifo_fast".into(),
            }])
            .unwrap();
        assert!(r[0].is_ok(), "{:?}", r[0]);
        assert_eq!(
            nl.root_qdisc(l.index).unwrap().as_deref(),
            Some("pfifo_fast")
        );
        let e = nl.replace_root_qdisc(l.index, "no_such_qdisc").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ENOENT), "{e}");
        let e = nl.replace_root_qdisc(l.index, "bad kind").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EINVAL), "{e}");
        let e = nl.replace_root_qdisc(999_999, "pfifo").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ENODEV), "{e}");
        assert_eq!(nl.root_qdisc(999_999).unwrap(), None);
        assert_eq!(
            nl.root_qdisc(l.index).unwrap().as_deref(),
            Some("pfifo_fast")
        );
    });
}

#[test]
fn dummy_with_queues() {
    in_fresh_netns(|| {
        let mut nl = Netlink::open().unwrap();
        let spec = LinkSpec {
            queues: Some(4),
            ..LinkSpec::named("anchor0")
        };
        match nl.add_link_and_get(&NewLink::Dummy(spec)) {
            Ok(l) => {
                assert_eq!(l.kind.as_deref(), Some("dummy"));
                assert!(nl.delete_link("anchor0").unwrap());
            }
            // No dummy module in this kernel: what the switch falls back on.
            Err(e) if e.errno() == Some(Errno::EOPNOTSUPP) => {
                eprintln!("no dummy links here: {e}")
            }
            Err(e) => panic!("{e}"),
        }
    });
}

#[test]
fn peer_made_in_another_namespace() {
    in_fresh_netns(|| {
        // The socket stays in namespace A; the thread moves on to B.
        let mut in_a = Netlink::open().unwrap();
        let a = File::open("/proc/thread-self/ns/net").unwrap();
        unshare(CloneFlags::CLONE_NEWNET).unwrap();
        let mut in_b = Netlink::open().unwrap();
        let host = in_b
            .add_link_and_get(&NewLink::Veth {
                end: LinkSpec {
                    up: true,
                    ..LinkSpec::named("host0")
                },
                peer: LinkSpec {
                    netns: Some(a.as_fd()),
                    mtu: Some(1450),
                    ..LinkSpec::named("eth0")
                },
            })
            .unwrap();
        assert!(host.up);
        assert_eq!(in_b.link("eth0").unwrap(), None);
        let eth0 = in_a.existing_link("eth0").unwrap();
        assert_eq!(eth0.mtu, Some(1450));
        // A name taken in the peer's namespace fails the whole message.
        let e = in_b
            .add_link(&NewLink::Veth {
                end: LinkSpec::named("host1"),
                peer: LinkSpec {
                    netns: Some(a.as_fd()),
                    ..LinkSpec::named("eth0")
                },
            })
            .unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EEXIST));
        assert_eq!(in_b.link("host1").unwrap(), None);
    });
}

/// The routes via a next hop, both families: what the agent reads back to
/// find the Service routes a previous run left.
#[test]
fn routes_via_a_next_hop_of_each_family() {
    in_fresh_netns(|| {
        let mut nl = Netlink::open().unwrap();
        let gw = nl.add_link_and_get(&veth("gw0", "gw0-p")).unwrap();
        let peer = nl.existing_link("gw0-p").unwrap();
        // Loopback up too: the kernel checks an onlink next hop's address
        // type, which needs it.
        for index in [1, gw.index, peer.index] {
            nl.pipeline(&[Change::SetLink {
                index,
                change: LinkChange::up(),
            }])
            .unwrap();
        }
        let vip4 = Ipv4Addr::new(169, 254, 169, 253);
        let vip6: Ipv6Addr = "fc01::a9fe:a9fd".parse().unwrap();
        // The next hop on the link first, as the agent routes it.
        let link_route = Ipv4Route {
            dst: Ipv4Net::from(vip4),
            gateway: None,
            oif: Some(gw.index),
            onlink: false,
            mtu: None,
            table: None,
        };
        nl.add_route(&link_route, true).unwrap();
        for dst in ["10.96.0.10/32", "10.96.0.11/32"] {
            let r = Ipv4Route {
                dst: dst.parse().unwrap(),
                gateway: Some(vip4),
                oif: Some(gw.index),
                onlink: true,
                mtu: None,
                table: None,
            };
            nl.add_route(&r, true).unwrap();
        }
        nl.add_ipv6_route(
            &Ipv6Route {
                dst: Ipv6Net::from(vip6),
                gateway: None,
                oif: Some(gw.index),
                onlink: false,
                mtu: None,
                table: None,
            },
            true,
        )
        .unwrap();
        let r6 = Ipv6Route {
            dst: "fd00:10:96::a/128".parse().unwrap(),
            gateway: Some(vip6),
            oif: Some(gw.index),
            onlink: true,
            mtu: None,
            table: None,
        };
        nl.add_ipv6_route(&r6, true).unwrap();
        let mut v4 = nl.ipv4_routes_via(vip4, gw.index).unwrap();
        v4.sort();
        assert_eq!(
            v4,
            ["10.96.0.10/32", "10.96.0.11/32"].map(|s| s.parse().unwrap())
        );
        assert_eq!(
            nl.ipv6_routes_via(vip6, gw.index).unwrap(),
            ["fd00:10:96::a/128".parse().unwrap()]
        );
        // Another next hop or link: none.
        assert!(nl
            .ipv6_routes_via("fc01::1".parse().unwrap(), gw.index)
            .unwrap()
            .is_empty());
        assert!(nl.ipv6_routes_via(vip6, 1).unwrap().is_empty());
    });
}
