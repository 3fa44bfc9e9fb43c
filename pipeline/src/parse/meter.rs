//! The `ovs-ofctl add-meter` syntax: `meter=ID,(kbps|pktps)[,burst][,stats],
//! band=type=drop,rate=R[,burst_size=B][,type=drop,rate=R...]` (`bands=`
//! too), with OVS's checks and, where `ovs-ofctl` has one, its message.

use super::error::{PResult, ParseError, Src};
use super::lexer::Lexer;
use super::value::uint_bits;
use crate::meter::{MeterBand, MeterConfig, MeterUnit, METER_MAX};

/// Parses one meter (`add-meter`, `mod-meter`).
pub fn parse_meter(text: &str) -> Result<MeterConfig, ParseError> {
    let src = Src { text };
    let mut lex = Lexer::new(src, text);
    let mut id = None;
    let mut unit: Option<(MeterUnit, &str)> = None;
    let (mut burst, mut stats) = (false, false);
    let mut bands: Vec<(MeterBand, &str)> = Vec::new();
    let mut in_bands = false;
    while let Some(item) = lex.next_item()? {
        let (key, value) = match (item.key, item.value) {
            ("band" | "bands", Some(v)) if !in_bands => {
                in_bands = true;
                match v.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (v, None),
                }
            }
            (k, v) => (k, v),
        };
        if in_bands {
            match (key, value) {
                ("type", Some("drop")) => bands.push((
                    MeterBand {
                        rate: 0,
                        burst_size: 0,
                    },
                    item.whole,
                )),
                ("type", Some("dscp_remark")) => {
                    return Err(src.err(
                        item.whole,
                        "dscp_remark bands are not supported (oxvs, as OVS's userspace \
                         datapath, has drop bands only: OFPMMFC_BAD_BAND)",
                    ))
                }
                ("type", _) => return Err(src.err(item.whole, "unknown band type")),
                ("rate" | "burst_size" | "prec_level", Some(v)) => {
                    let Some((band, _)) = bands.last_mut() else {
                        return Err(src.err(item.whole, "a band starts with type=drop"));
                    };
                    let n = uint_bits(&src, v, 32, key)? as u32;
                    match key {
                        "rate" => band.rate = n,
                        "burst_size" => band.burst_size = n,
                        _ => {
                            return Err(src.err(
                                item.whole,
                                "prec_level is for dscp_remark bands, which oxvs does not have",
                            ))
                        }
                    }
                }
                _ => return Err(src.err(item.whole, "unknown band keyword")),
            }
            continue;
        }
        match (key, value) {
            ("meter", Some(v)) => {
                let n = match v {
                    "all" | "slowpath" | "controller" => {
                        return Err(src.err(
                            v,
                            "special meters (all, slowpath, controller) are not supported",
                        ))
                    }
                    _ => uint_bits(&src, v, 32, "meter")? as u32,
                };
                if n == 0 || n > METER_MAX {
                    return Err(src.err(v, format!("invalid value for meter (1..={METER_MAX:#x})")));
                }
                id = Some(n);
            }
            ("kbps" | "pktps", None) => {
                if let Some((_, first)) = unit {
                    return Err(src.err(
                        item.whole,
                        format!("meter must specify either 'kbps' or 'pktps', not both ({first} already)"),
                    ));
                }
                let u = if key == "kbps" {
                    MeterUnit::Kbps
                } else {
                    MeterUnit::Pktps
                };
                unit = Some((u, item.whole));
            }
            ("burst", None) => burst = true,
            ("stats", None) => stats = true,
            _ => return Err(src.err(item.whole, "unknown meter keyword")),
        }
    }
    let end = src.end_of(text);
    let id = id.ok_or_else(|| src.err(end, "must specify meter"))?;
    let (unit, _) =
        unit.ok_or_else(|| src.err(end, "meter must specify either 'kbps' or 'pktps'"))?;
    if bands.is_empty() {
        return Err(src.err(end, "must specify bands"));
    }
    for (b, tok) in &bands {
        if b.rate == 0 {
            return Err(src.err(tok, "band must have 'rate'"));
        }
        if burst && b.burst_size == 0 {
            return Err(src.err(tok, "band must have 'burst_size' when 'burst' flag is set"));
        }
        if !burst && b.burst_size != 0 {
            return Err(src.err(
                tok,
                "band may have 'burst_size' only when 'burst' flag is set",
            ));
        }
    }
    Ok(MeterConfig {
        id,
        unit,
        burst,
        stats,
        bands: bands.into_iter().map(|(b, _)| b).collect(),
    })
}

/// Parses the argument of `del-meters` / `dump-meters` / `meter-stats`:
/// nothing or `meter=all` (every meter: `None`) or `meter=N`.
pub fn parse_meter_id(text: &str) -> Result<Option<u32>, ParseError> {
    let src = Src { text };
    let mut lex = Lexer::new(src, text);
    let mut id = None;
    while let Some(item) = lex.next_item()? {
        match (item.key, item.value) {
            ("meter", Some("all")) => id = None,
            ("meter", Some(v)) => {
                let n = uint_bits(&src, v, 32, "meter")? as u32;
                if n == 0 || n > METER_MAX {
                    return Err(src.err(v, "invalid value for meter"));
                }
                id = Some(n);
            }
            _ => return Err(src.err(item.whole, "unknown keyword (takes meter=N or meter=all)")),
        }
    }
    Ok(id)
}

pub(super) fn meter_action(src: &Src, v: &str) -> PResult<u32> {
    let n = uint_bits(src, v, 32, "meter")? as u32;
    if n == 0 || n > METER_MAX {
        return Err(src.err(v, format!("invalid meter id (1..={METER_MAX:#x})")));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meter::format_config;

    #[test]
    fn meters_parse_and_print_as_ovs() {
        // (add-meter text, ovs-ofctl -O OpenFlow15 dump-meters, OVS 3.1)
        for (text, ovs) in [
            (
                "meter=3,pktps,burst,stats,band=type=drop,rate=10,burst_size=10",
                "meter=3 pktps burst stats bands=\ntype=drop rate=10 burst_size=10",
            ),
            (
                "meter=2,kbps,stats,band=type=drop,rate=1000",
                "meter=2 kbps stats bands=\ntype=drop rate=1000",
            ),
            (
                "meter=5,pktps,bands=type=drop,rate=10,type=drop,rate=20",
                "meter=5 pktps bands=\ntype=drop rate=10\ntype=drop rate=20",
            ),
        ] {
            let m = parse_meter(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(format_config(&m), ovs, "{text}");
        }
    }

    #[test]
    fn bad_meters_are_refused_as_ovs_refuses_them() {
        for (text, msg) in [
            (
                "meter=1,pktps,band=type=drop,rate=100,burst_size=10",
                "only when 'burst' flag is set",
            ),
            (
                "meter=5,pktps,burst,band=type=drop,rate=10",
                "must have 'burst_size'",
            ),
            ("meter=5,pktps", "must specify bands"),
            ("meter=5,band=type=drop,rate=10", "either 'kbps' or 'pktps'"),
            ("meter=5,kbps,pktps,band=type=drop,rate=10", "not both"),
            (
                "meter=0,pktps,band=type=drop,rate=10",
                "invalid value for meter",
            ),
            ("meter=5,pktps,band=type=drop", "must have 'rate'"),
            ("meter=5,pktps,band=type=drop,rate=0", "must have 'rate'"),
            ("meter=all,pktps,band=type=drop,rate=1", "special meters"),
            (
                "meter=4,kbps,band=type=dscp_remark,rate=100,prec_level=1",
                "dscp_remark",
            ),
            ("pktps,band=type=drop,rate=1", "must specify meter"),
        ] {
            let e = parse_meter(text).expect_err(text);
            assert!(e.msg.contains(msg), "{text}: {e}");
        }
        assert_eq!(parse_meter_id("meter=7"), Ok(Some(7)));
        assert_eq!(parse_meter_id(""), Ok(None));
        assert_eq!(parse_meter_id("meter=all"), Ok(None));
        assert!(parse_meter_id("meter=0").is_err());
    }
}
