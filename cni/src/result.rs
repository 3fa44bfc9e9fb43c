//! ADD results: parsing any supported version, converting to the version
//! the runtime asked for, and merging with a `prevResult`.
//!
//! One model ([`AddResult`]) holds the union of what 0.3.0 to 1.1.0 can say.
//! Parsing is shape-tolerant: `ips[].version` (0.3.x/0.4.0) is accepted and
//! ignored, since the IP family follows from the address; unknown keys are
//! ignored, as the reference library does. Addresses, gateways and route
//! destinations are validated (a result with a bad one is a decode error).
//!
//! Output per version ([`AddResult::to_json`]):
//! - 0.3.0, 0.3.1, 0.4.0: `interfaces[]` {name, mac, sandbox}; `ips[]`
//!   {version "4"/"6", address, gateway, interface}; `routes[]` {dst, gw};
//!   `dns`.
//! - 1.0.0: the same without `ips[].version`.
//! - 1.1.0: adds interface `mtu`, `socketPath`, `pciID` and route `mtu`,
//!   `advmss`, `priority`, `table`, `scope`.
//!
//! Fields a version does not define are dropped; empty lists, empty strings,
//! zero MTUs/priorities and an empty `dns` are omitted (as the reference's
//! `omitempty`). `cniVersion` is always set to the requested version.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::version::CniVersion;

/// A CNI ADD result, any version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddResult {
    #[serde(default, deserialize_with = "null_default")]
    pub interfaces: Vec<Interface>,
    #[serde(default, deserialize_with = "null_default")]
    pub ips: Vec<IpConfig>,
    #[serde(default, deserialize_with = "null_default")]
    pub routes: Vec<Route>,
    #[serde(default, deserialize_with = "null_default")]
    pub dns: Dns,
}

/// `interfaces[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub mac: String,
    #[serde(default)]
    pub mtu: Option<u64>,
    #[serde(default, deserialize_with = "null_default")]
    pub sandbox: String,
    #[serde(default, rename = "socketPath", deserialize_with = "null_default")]
    pub socket_path: String,
    #[serde(default, rename = "pciID", deserialize_with = "null_default")]
    pub pci_id: String,
}

/// `ips[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct IpConfig {
    pub address: String,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub interface: Option<usize>,
}

/// `routes[]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(default)]
    pub gw: Option<String>,
    #[serde(default)]
    pub mtu: Option<u64>,
    #[serde(default)]
    pub advmss: Option<u64>,
    #[serde(default)]
    pub priority: Option<u64>,
    #[serde(default)]
    pub table: Option<u64>,
    #[serde(default)]
    pub scope: Option<u64>,
}

/// `dns`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Dns {
    #[serde(default, deserialize_with = "null_default")]
    pub nameservers: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub domain: String,
    #[serde(default, deserialize_with = "null_default")]
    pub search: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Parses `a.b.c.d/len` or `v6/len`; the address part is kept as given.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

/// `"4"` or `"6"` for 0.3.x/0.4.0 `ips[].version`. An IPv4-mapped IPv6
/// address counts as IPv4, as in the reference (`To4() != nil`).
fn ip_family(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "4",
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => "4",
        IpAddr::V6(_) => "6",
    }
}

impl AddResult {
    /// Parses a result of any supported version; `what` names it in errors
    /// ("prevResult", "the agent's result").
    pub fn parse(v: &Value, what: &str) -> Result<AddResult, String> {
        let Some(obj) = v.as_object() else {
            return Err(format!("{what} is not a JSON object"));
        };
        if obj.contains_key("ip4") || obj.contains_key("ip6") {
            return Err(format!(
                "{what} is in the 0.1.0/0.2.0 shape (ip4/ip6), which is not supported"
            ));
        }
        if let Some(ver) = obj.get("cniVersion") {
            match ver.as_str() {
                Some(s) if s.is_empty() || CniVersion::parse(s).is_some() => {}
                _ => {
                    return Err(format!(
                        "{what} has unsupported cniVersion {ver}; supported: {}",
                        CniVersion::supported_strings().join(", ")
                    ))
                }
            }
        }
        let r: AddResult =
            serde_json::from_value(v.clone()).map_err(|e| format!("cannot decode {what}: {e}"))?;
        r.validate(what)?;
        Ok(r)
    }

    fn validate(&self, what: &str) -> Result<(), String> {
        for (i, ip) in self.ips.iter().enumerate() {
            if parse_cidr(&ip.address).is_none() {
                return Err(format!(
                    "{what} ips[{i}].address {:?} is not an IP address in CIDR notation",
                    ip.address
                ));
            }
            if let Some(gw) = &ip.gateway {
                if gw.parse::<IpAddr>().is_err() {
                    return Err(format!(
                        "{what} ips[{i}].gateway {gw:?} is not an IP address"
                    ));
                }
            }
        }
        for (i, r) in self.routes.iter().enumerate() {
            if parse_cidr(&r.dst).is_none() {
                return Err(format!("{what} routes[{i}].dst {:?} is not a CIDR", r.dst));
            }
            if let Some(gw) = &r.gw {
                if gw.parse::<IpAddr>().is_err() {
                    return Err(format!("{what} routes[{i}].gw {gw:?} is not an IP address"));
                }
            }
        }
        Ok(())
    }

    /// oxvs's result chained after `prev` (oxvs is not first in the list):
    /// `prev`'s interfaces, then ours; `prev`'s IPs, then ours with their
    /// `interface` index shifted past `prev`'s interfaces; `prev`'s routes,
    /// then ours; `prev`'s DNS, each empty field filled from ours.
    pub fn chained_after(self, prev: AddResult) -> AddResult {
        let shift = prev.interfaces.len();
        let mut out = prev;
        out.interfaces.extend(self.interfaces);
        out.ips.extend(self.ips.into_iter().map(|mut ip| {
            ip.interface = ip.interface.map(|i| i + shift);
            ip
        }));
        out.routes.extend(self.routes);
        let dns = &mut out.dns;
        if dns.nameservers.is_empty() {
            dns.nameservers = self.dns.nameservers;
        }
        if dns.domain.is_empty() {
            dns.domain = self.dns.domain;
        }
        if dns.search.is_empty() {
            dns.search = self.dns.search;
        }
        if dns.options.is_empty() {
            dns.options = self.dns.options;
        }
        out
    }

    /// The result as JSON of `version` (see the module doc).
    pub fn to_json(&self, version: CniVersion) -> Value {
        let v11 = version >= CniVersion::V1_1_0;
        let mut out = Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        let put_str = |m: &mut Map<String, Value>, k: &str, s: &str| {
            if !s.is_empty() {
                m.insert(k.into(), json!(s));
            }
        };
        let put_num = |m: &mut Map<String, Value>, k: &str, n: Option<u64>, keep_zero: bool| {
            if let Some(n) = n {
                if n != 0 || keep_zero {
                    m.insert(k.into(), json!(n));
                }
            }
        };
        if !self.interfaces.is_empty() {
            let list = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut m = Map::new();
                    m.insert("name".into(), json!(i.name));
                    put_str(&mut m, "mac", &i.mac);
                    if v11 {
                        put_num(&mut m, "mtu", i.mtu, false);
                    }
                    put_str(&mut m, "sandbox", &i.sandbox);
                    if v11 {
                        put_str(&mut m, "socketPath", &i.socket_path);
                        put_str(&mut m, "pciID", &i.pci_id);
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(list));
        }
        if !self.ips.is_empty() {
            let list = self
                .ips
                .iter()
                .map(|ip| {
                    let mut m = Map::new();
                    if version.has_ip_version_field() {
                        // Validated at parse time; "4" only if it is not parseable,
                        // which cannot happen for a parsed result.
                        let fam = parse_cidr(&ip.address).map_or("4", |(a, _)| ip_family(a));
                        m.insert("version".into(), json!(fam));
                    }
                    if let Some(i) = ip.interface {
                        m.insert("interface".into(), json!(i));
                    }
                    m.insert("address".into(), json!(ip.address));
                    if let Some(gw) = &ip.gateway {
                        m.insert("gateway".into(), json!(gw));
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("ips".into(), Value::Array(list));
        }
        if !self.routes.is_empty() {
            let list = self
                .routes
                .iter()
                .map(|r| {
                    let mut m = Map::new();
                    m.insert("dst".into(), json!(r.dst));
                    if let Some(gw) = &r.gw {
                        m.insert("gw".into(), json!(gw));
                    }
                    if v11 {
                        put_num(&mut m, "mtu", r.mtu, false);
                        put_num(&mut m, "advmss", r.advmss, false);
                        put_num(&mut m, "priority", r.priority, false);
                        put_num(&mut m, "table", r.table, true);
                        put_num(&mut m, "scope", r.scope, true);
                    }
                    Value::Object(m)
                })
                .collect();
            out.insert("routes".into(), Value::Array(list));
        }
        if !self.dns.is_empty() {
            let mut m = Map::new();
            if !self.dns.nameservers.is_empty() {
                m.insert("nameservers".into(), json!(self.dns.nameservers));
            }
            put_str(&mut m, "domain", &self.dns.domain);
            if !self.dns.search.is_empty() {
                m.insert("search".into(), json!(self.dns.search));
            }
            if !self.dns.options.is_empty() {
                m.insert("options".into(), json!(self.dns.options));
            }
            out.insert("dns".into(), Value::Object(m));
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::SUPPORTED;

    fn agent_result() -> Value {
        json!({
            "interfaces": [
                {"name": "oxvs1a2b3c4d", "mac": "aa:bb:cc:00:00:01", "mtu": 1450},
                {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "mtu": 1450, "sandbox": "/run/netns/p", "socketPath": "/x", "pciID": "0000:00:01.0"}
            ],
            "ips": [
                {"address": "10.244.0.5/24", "gateway": "10.244.0.1", "interface": 1},
                {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 1}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.244.0.1", "mtu": 1400, "advmss": 1360, "priority": 5, "table": 0, "scope": 0},
                {"dst": "::/0"}
            ],
            "dns": {"nameservers": ["10.96.0.10"]}
        })
    }

    #[test]
    fn shapes_per_version() {
        let r = AddResult::parse(&agent_result(), "result").unwrap();
        for v in SUPPORTED {
            let out = r.to_json(v);
            assert_eq!(out["cniVersion"], v.as_str());
            let ip0 = &out["ips"][0];
            assert_eq!(ip0["interface"], 1);
            assert_eq!(ip0["address"], "10.244.0.5/24");
            if v.has_ip_version_field() {
                assert_eq!(ip0["version"], "4");
                assert_eq!(out["ips"][1]["version"], "6");
            } else {
                assert!(ip0.get("version").is_none(), "{v}: {out}");
            }
            let eth0 = &out["interfaces"][1];
            let rt = &out["routes"][0];
            if v == CniVersion::V1_1_0 {
                assert_eq!(eth0["mtu"], 1450);
                assert_eq!(eth0["socketPath"], "/x");
                assert_eq!(eth0["pciID"], "0000:00:01.0");
                assert_eq!(rt["mtu"], 1400);
                assert_eq!(rt["advmss"], 1360);
                assert_eq!(rt["priority"], 5);
                assert_eq!(rt["table"], 0);
                assert_eq!(rt["scope"], 0);
            } else {
                for k in ["mtu", "socketPath", "pciID"] {
                    assert!(eth0.get(k).is_none(), "{v} {k}");
                }
                assert_eq!(rt.as_object().unwrap().len(), 2, "{v}: {rt}");
            }
            assert_eq!(eth0["sandbox"], "/run/netns/p");
            assert!(out["interfaces"][0].get("sandbox").is_none());
            assert_eq!(out["dns"]["nameservers"][0], "10.96.0.10");
        }
    }

    #[test]
    fn parse_round_trips_through_every_version() {
        let r = AddResult::parse(&agent_result(), "result").unwrap();
        // 1.1.0 output parses back to the same model.
        let back = AddResult::parse(&r.to_json(CniVersion::V1_1_0), "x").unwrap();
        assert_eq!(back, r);
        // 0.4.0 output (with ips[].version) parses back too.
        let old = AddResult::parse(&r.to_json(CniVersion::V0_4_0), "x").unwrap();
        assert_eq!(old.ips, r.ips);
    }

    #[test]
    fn bad_results_are_errors() {
        for (bad, word) in [
            (json!([]), "not a JSON object"),
            (json!({"ip4": {"ip": "10.0.0.1/24"}}), "ip4/ip6"),
            (json!({"cniVersion": "0.2.0"}), "0.2.0"),
            (json!({"ips": [{"address": "10.0.0.1"}]}), "CIDR"),
            (json!({"ips": [{"address": "10.0.0.1/33"}]}), "CIDR"),
            (
                json!({"ips": [{"address": "10.0.0.1/24", "gateway": "x"}]}),
                "gateway",
            ),
            (json!({"routes": [{"dst": "default"}]}), "routes[0]"),
            (json!({"interfaces": [{"mac": "x"}]}), "name"),
            (
                json!({"ips": [{"address": "10.0.0.1/24", "interface": -1}]}),
                "decode",
            ),
        ] {
            let e = AddResult::parse(&bad, "prevResult").unwrap_err();
            assert!(e.contains(word), "{bad}: {e}");
            assert!(e.contains("prevResult"), "{e}");
        }
    }

    #[test]
    fn chaining_appends_and_reindexes() {
        let prev = AddResult::parse(
            &json!({
                "cniVersion": "0.4.0",
                "interfaces": [{"name": "lo"}, {"name": "net1", "sandbox": "/run/netns/p"}],
                "ips": [{"version": "4", "address": "192.168.1.2/24", "interface": 1}],
                "routes": [{"dst": "192.168.0.0/16"}],
                "dns": {"domain": "example"}
            }),
            "prevResult",
        )
        .unwrap();
        let ours = AddResult::parse(&agent_result(), "agent").unwrap();
        let out = ours.chained_after(prev).to_json(CniVersion::V1_0_0);
        let names: Vec<_> = out["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["lo", "net1", "oxvs1a2b3c4d", "eth0"]);
        assert_eq!(out["ips"][0]["interface"], 1);
        assert_eq!(out["ips"][1]["interface"], 3);
        assert_eq!(out["ips"][2]["interface"], 3);
        assert_eq!(out["routes"].as_array().unwrap().len(), 3);
        assert_eq!(out["dns"]["domain"], "example");
        assert_eq!(out["dns"]["nameservers"][0], "10.96.0.10");
    }

    #[test]
    fn empty_parts_are_omitted() {
        let out = AddResult::default().to_json(CniVersion::V1_1_0);
        assert_eq!(out, json!({"cniVersion": "1.1.0"}));
        let r = AddResult::parse(&json!({"interfaces": null, "dns": {}}), "x").unwrap();
        assert_eq!(r, AddResult::default());
    }
}
