//! `oxvsctl ct-set-limits [default=N] [port=P,limit=N]...`: connection
//! limits, like `ovs-appctl dpctl/ct-set-limits` with ports in place of
//! zones (oxvs limits what each port, i.e. each pod, may own: see
//! `docs/pipeline.md`, "Conntrack limits"). `P` is a port name or number;
//! `N` a number of connections, `0` or `none` for no limit. Prints the
//! limits now in force, as `ct-get-limits` does.

use clap::Args;
use oxvs_api::{CtLimitsResult, CtPortLimitSpec, Request};

use super::online::Ctx;
use super::{emit, UsageError};

#[derive(Debug, Args)]
pub struct CtSetLimits {
    /// `default=N` and/or `port=P,limit=N` (N: connections, 0 or none: no limit).
    #[arg(value_name = "LIMIT", required = true)]
    limits: Vec<String>,
}

impl CtSetLimits {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let (default, ports) = parse_set(&self.limits)?;
        let v = ctx.call(&Request::CtSetLimits { default, ports })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: CtLimitsResult = serde_json::from_value(v)?;
        emit(&format(&r))
    }
}

/// A limit: a number of connections, `0` or `none` for no limit.
fn parse_limit(text: &str, arg: &str) -> Result<u32, UsageError> {
    if text == "none" {
        return Ok(0);
    }
    text.parse().map_err(|_| {
        UsageError(format!(
            "'{arg}': limit '{text}' is not a number of connections (0 to {}) or 'none'",
            u32::MAX
        ))
    })
}

/// `default=N` and `port=P,limit=N` arguments.
pub fn parse_set(args: &[String]) -> Result<(Option<u32>, Vec<CtPortLimitSpec>), UsageError> {
    let mut default = None;
    let mut ports = Vec::new();
    for arg in args {
        if let Some(v) = arg.strip_prefix("default=") {
            if default.is_some() {
                return Err(UsageError(format!("'{arg}': default given twice")));
            }
            default = Some(parse_limit(v, arg)?);
            continue;
        }
        let mut port = None;
        let mut limit = None;
        for part in arg.split(',') {
            match part.split_once('=') {
                Some(("port", p)) if !p.is_empty() && port.is_none() => port = Some(p),
                Some(("limit", l)) if limit.is_none() => limit = Some(parse_limit(l, arg)?),
                _ => {
                    return Err(UsageError(format!(
                        "'{arg}': expected default=N or port=P,limit=N (bad part '{part}')"
                    )))
                }
            }
        }
        match (port, limit) {
            (Some(p), Some(l)) => ports.push(CtPortLimitSpec {
                port: p.to_string(),
                limit: Some(l),
            }),
            _ => {
                return Err(UsageError(format!(
                    "'{arg}': a port limit needs both port=P and limit=N"
                )))
            }
        }
    }
    Ok((default, ports))
}

/// `port=P[,port=Q]...` arguments (ct-get-limits, ct-del-limits).
pub fn parse_ports(args: &[String]) -> Result<Vec<String>, UsageError> {
    let mut ports = Vec::new();
    for arg in args {
        for part in arg.split(',') {
            match part.strip_prefix("port=") {
                Some(p) if !p.is_empty() => ports.push(p.to_string()),
                _ => {
                    return Err(UsageError(format!(
                        "'{arg}': expected port=P[,port=Q]... (bad part '{part}')"
                    )))
                }
            }
        }
    }
    Ok(ports)
}

fn limit_text(n: u32) -> String {
    if n == 0 {
        "none".into()
    } else {
        n.to_string()
    }
}

/// The text form: the table, the default, one line per port.
pub fn format(r: &CtLimitsResult) -> String {
    let mut s = format!(
        "connections: {} of {}\ndefault limit={}\n",
        r.entries,
        r.max_entries,
        limit_text(r.default_limit)
    );
    for p in &r.ports {
        let name = p
            .name
            .as_deref()
            .map_or(String::new(), |n| format!("({n})"));
        s.push_str(&format!(
            "port={}{name},limit={}{},count={},refused={}\n",
            p.ofport,
            limit_text(p.limit),
            if p.explicit { "" } else { "(default)" },
            p.count,
            p.refused
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_api::CtPortLimitEntry;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn set_arguments() {
        let (d, p) = parse_set(&args(&[
            "default=100",
            "port=pod-a,limit=10",
            "limit=none,port=3",
        ]))
        .unwrap();
        assert_eq!(d, Some(100));
        assert_eq!(
            p,
            [
                CtPortLimitSpec {
                    port: "pod-a".into(),
                    limit: Some(10)
                },
                CtPortLimitSpec {
                    port: "3".into(),
                    limit: Some(0)
                }
            ]
        );
        for (bad, want) in [
            ("default=x", "limit 'x' is not a number"),
            ("default=-1", "limit '-1' is not a number"),
            ("port=a", "needs both port=P and limit=N"),
            ("limit=3", "needs both"),
            ("port=a,limit=1,zone=2", "bad part 'zone=2'"),
            ("port=,limit=1", "bad part 'port='"),
            ("zone=1,limit=1", "bad part 'zone=1'"),
            ("port=a,limit=99999999999", "not a number"),
        ] {
            let e = parse_set(&args(&[bad])).unwrap_err().0;
            assert!(e.contains(want), "{bad}: {e}");
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let e = parse_set(&args(&["default=1", "default=2"])).unwrap_err().0;
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn port_arguments() {
        assert_eq!(
            parse_ports(&args(&["port=a,port=2", "port=b"])).unwrap(),
            ["a", "2", "b"]
        );
        assert!(parse_ports(&args(&["zone=1"]))
            .unwrap_err()
            .0
            .contains("zone=1"));
        assert!(parse_ports(&args(&["port="])).is_err());
    }

    #[test]
    fn text_form() {
        let r = CtLimitsResult {
            max_entries: 1000,
            entries: 12,
            default_limit: 250,
            ports: vec![
                CtPortLimitEntry {
                    ofport: 3,
                    name: Some("pod-a".into()),
                    limit: 250,
                    explicit: false,
                    count: 10,
                    refused: 4,
                },
                CtPortLimitEntry {
                    ofport: 2,
                    name: None,
                    limit: 0,
                    explicit: true,
                    count: 2,
                    refused: 0,
                },
            ],
        };
        assert_eq!(
            format(&r),
            "connections: 12 of 1000\ndefault limit=250\n\
             port=3(pod-a),limit=250(default),count=10,refused=4\n\
             port=2,limit=none,count=2,refused=0\n"
        );
    }
}
