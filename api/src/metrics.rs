//! Prometheus text exposition (format version 0.0.4), shared by
//! `oxvs-switchd` and `oxvs-agent`: a writer, a strict reader (the
//! validator the tests use), and the two pure halves of the tiny HTTP/1.1
//! exchange both daemons serve `/metrics` with.
//!
//! ## The format, as written here
//!
//! A *family* is a `# HELP name text` line, a `# TYPE name type` line, then
//! its samples, all together (a family is never split or repeated):
//!
//! ```text
//! # HELP oxvs_port_rx_packets_total Packets received on a switch port.
//! # TYPE oxvs_port_rx_packets_total counter
//! oxvs_port_rx_packets_total{port="p1"} 42
//! ```
//!
//! Names follow the Prometheus conventions: the `oxvs_` prefix, `_total`
//! on counters (in the 0.0.4 format the TYPE line names the full sample
//! name), base units in the name (`_seconds`, `_bytes`). A histogram
//! `name` has `name_bucket{le="..."}` samples with cumulative counts ending
//! with `le="+Inf"`, then `name_sum` and `name_count`.
//!
//! ## Invariants
//!
//! - [`Exposition`] escapes label values (`\\`, `"`, newline) and HELP text
//!   (`\\`, newline), so any label value (a pod name, a policy name) is
//!   safe; metric and label *names* are the caller's constants and are
//!   checked in debug builds only.
//! - [`parse`] never panics on any input; it returns the first violation
//!   with its line number.
//! - [`parse_request_head`] never panics on any bytes; nothing here does
//!   I/O.
//!
//! Concurrency: plain values; no shared state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

/// The `Content-Type` of a 0.0.4 text exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Longest HTTP request head (request line + headers) a daemon reads.
pub const MAX_REQUEST_HEAD: usize = 8192;

/// The type of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    /// The word on the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// Whether `s` is a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn valid_metric_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_' || c == b':')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':')
}

/// Whether `s` is a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not `__*`).
pub fn valid_label_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !s.starts_with("__")
}

/// Formats a sample value: integers without a fraction, `+Inf`, `-Inf`, `NaN`.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        // `{}` never uses exponents and prints 3.0 as "3".
        format!("{v}")
    }
}

fn escape_label_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// An exposition being written. Start a family with [`Exposition::family`]
/// and write its samples through the returned [`Family`]; the borrow ends
/// the family, so families cannot interleave.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    families: HashSet<String>,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts family `name` (HELP and TYPE lines). Writing a family twice
    /// is a bug of the caller; the second one's samples are dropped (and a
    /// debug build panics), so the output stays valid.
    pub fn family(&mut self, name: &str, kind: MetricType, help: &str) -> Family<'_> {
        debug_assert!(valid_metric_name(name), "bad metric name {name}");
        debug_assert!(
            kind != MetricType::Counter || name.ends_with("_total"),
            "counter {name} does not end in _total"
        );
        let fresh = self.families.insert(name.to_owned());
        debug_assert!(fresh, "metric family {name} written twice");
        if fresh {
            let _ = write!(self.out, "# HELP {name} ");
            escape_help(&mut self.out, help);
            let _ = writeln!(self.out, "\n# TYPE {name} {}", kind.as_str());
        }
        Family {
            exp: self,
            name: name.to_owned(),
            skip: !fresh,
        }
    }

    /// A counter family.
    pub fn counter(&mut self, name: &str, help: &str) -> Family<'_> {
        self.family(name, MetricType::Counter, help)
    }

    /// A gauge family.
    pub fn gauge(&mut self, name: &str, help: &str) -> Family<'_> {
        self.family(name, MetricType::Gauge, help)
    }

    /// A histogram family.
    pub fn histogram(&mut self, name: &str, help: &str) -> Family<'_> {
        self.family(name, MetricType::Histogram, help)
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }

    fn line(
        &mut self,
        name: &str,
        suffix: &str,
        labels: &[(&str, &str)],
        le: Option<&str>,
        v: f64,
    ) {
        let o = &mut self.out;
        o.push_str(name);
        o.push_str(suffix);
        if !labels.is_empty() || le.is_some() {
            o.push('{');
            let mut first = true;
            let le_pair = le.map(|l| ("le", l));
            for (k, val) in labels.iter().copied().chain(le_pair) {
                debug_assert!(valid_label_name(k), "bad label name {k}");
                if !first {
                    o.push(',');
                }
                first = false;
                o.push_str(k);
                o.push_str("=\"");
                escape_label_value(o, val);
                o.push('"');
            }
            o.push('}');
        }
        o.push(' ');
        o.push_str(&format_value(v));
        o.push('\n');
    }
}

/// One family being written (see [`Exposition::family`]).
#[derive(Debug)]
pub struct Family<'a> {
    exp: &'a mut Exposition,
    name: String,
    skip: bool,
}

impl Family<'_> {
    /// A counter or gauge sample.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        if !self.skip {
            let name = std::mem::take(&mut self.name);
            self.exp.line(&name, "", labels, None, value);
            self.name = name;
        }
        self
    }

    /// An integer sample (counters are integers almost everywhere here).
    pub fn int(&mut self, labels: &[(&str, &str)], value: u64) -> &mut Self {
        // f64 is exact up to 2^53, far beyond any counter here.
        self.sample(labels, value as f64)
    }

    /// One histogram series: `bounds` are the finite upper bounds
    /// (increasing), `counts[i]` the observations in bucket `i`
    /// (*not* cumulative; `counts.len() == bounds.len() + 1`, the last one
    /// above every bound). Writes cumulative buckets, `+Inf`, `_sum` and
    /// `_count`. Missing counts count as zero.
    pub fn histogram(
        &mut self,
        labels: &[(&str, &str)],
        bounds: &[f64],
        counts: &[u64],
        sum: f64,
    ) -> &mut Self {
        if self.skip {
            return self;
        }
        let name = std::mem::take(&mut self.name);
        let mut cumulative = 0u64;
        for (i, b) in bounds.iter().enumerate() {
            cumulative += counts.get(i).copied().unwrap_or(0);
            let le = format_value(*b);
            self.exp
                .line(&name, "_bucket", labels, Some(&le), cumulative as f64);
        }
        cumulative += counts.iter().skip(bounds.len()).sum::<u64>();
        self.exp
            .line(&name, "_bucket", labels, Some("+Inf"), cumulative as f64);
        self.exp.line(&name, "_sum", labels, None, sum);
        self.exp
            .line(&name, "_count", labels, None, cumulative as f64);
        self.name = name;
        self
    }
}

// ---------------------------------------------------------------------------
// Reading (the validator).

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    /// In the order written.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `k`.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }

    /// Whether every `(k, v)` of `want` is a label of this sample.
    pub fn has(&self, want: &[(&str, &str)]) -> bool {
        want.iter().all(|(k, v)| self.label(k) == Some(v))
    }
}

/// What a text exposition says, checked.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    pub samples: Vec<Sample>,
    /// Family name -> type.
    pub types: BTreeMap<String, MetricType>,
}

impl Parsed {
    /// Samples named `name` carrying every label of `labels`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name && s.has(labels))
    }

    /// The sum of the values of [`Parsed::find`] (0 if none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).map(|s| s.value).sum()
    }

    /// The value of the one sample named `name` with exactly these labels.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels.len() == labels.len() && s.has(labels))
            .map(|s| s.value)
    }
}

/// Why a text is not a valid exposition (as this project writes them).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}: {text:?}")]
pub struct ExpositionError {
    pub line: usize,
    pub msg: String,
    pub text: String,
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse::<f64>().ok().filter(|v| v.is_finite()),
    }
}

/// Parses `name{k="v",...} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or("no value after the metric name")?;
    let name = &line[..name_end];
    if !valid_metric_name(name) {
        return Err(format!("bad metric name '{name}'"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start_matches(' ');
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find('=').ok_or("label without '='")?;
            let k = rest[..eq].trim();
            if !valid_label_name(k) {
                return Err(format!("bad label name '{k}'"));
            }
            if labels.iter().any(|(n, _): &(String, String)| n == k) {
                return Err(format!("label '{k}' given twice"));
            }
            rest = rest[eq + 1..]
                .strip_prefix('"')
                .ok_or_else(|| format!("value of label '{k}' is not quoted"))?;
            let mut v = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err(format!("unterminated value of label '{k}'")),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => v.push('\\'),
                        Some((_, '"')) => v.push('"'),
                        Some((_, 'n')) => v.push('\n'),
                        _ => return Err(format!("bad escape in the value of label '{k}'")),
                    },
                    Some((_, c)) => v.push(c),
                }
            };
            labels.push((k.to_owned(), v));
            rest = &rest[end + 1..];
            rest = rest.trim_start_matches(' ');
            if let Some(r) = rest.strip_prefix(',') {
                rest = r;
            } else if !rest.starts_with('}') {
                return Err("expected ',' or '}' after a label".into());
            }
        }
    }
    if !rest.starts_with(' ') {
        return Err("no space before the value".into());
    }
    let mut words = rest.split_ascii_whitespace();
    let value = words.next().ok_or("no value")?;
    let value = parse_value(value).ok_or_else(|| format!("bad value '{value}'"))?;
    if let Some(ts) = words.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp '{ts}'"))?;
    }
    if words.next().is_some() {
        return Err("trailing text after the value".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The family a sample belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, MetricType>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.get(base) == Some(&MetricType::Histogram) {
                return Some(base);
            }
        }
    }
    None
}

/// Reads and checks an exposition: every line is a `# HELP`, a `# TYPE`,
/// another comment, blank, or a sample `name{labels} value`; names and
/// label names are valid; every family has one TYPE (counter, gauge or
/// histogram) and at most one HELP, both before its samples, and its
/// samples are contiguous; counters end in `_total`; no sample (name and
/// label set) repeats; histogram series have increasing `le` bounds with
/// cumulative counts ending at `+Inf`, and `_count` equal to the `+Inf`
/// bucket, and a `_sum`.
pub fn parse(text: &str) -> Result<Parsed, ExpositionError> {
    let mut p = Parsed::default();
    let mut helps = HashSet::new();
    let mut finished: HashSet<String> = HashSet::new();
    let mut current: Option<String> = None;
    let mut seen: HashSet<(String, Vec<(String, String)>)> = HashSet::new();
    let fail = |line: usize, msg: String, text: &str| ExpositionError {
        line,
        msg,
        text: text.to_owned(),
    };
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            let c = c.trim_start();
            let mut w = c.splitn(3, ' ');
            match w.next() {
                Some("HELP") => {
                    let name = w.next().unwrap_or_default();
                    if !valid_metric_name(name) {
                        return Err(fail(n, format!("bad metric name '{name}' in HELP"), line));
                    }
                    if !helps.insert(name.to_owned()) {
                        return Err(fail(n, format!("second HELP for '{name}'"), line));
                    }
                    if !enter(name, &mut current, &mut finished) {
                        return Err(fail(n, format!("family '{name}' is split"), line));
                    }
                }
                Some("TYPE") => {
                    let name = w.next().unwrap_or_default();
                    if !valid_metric_name(name) {
                        return Err(fail(n, format!("bad metric name '{name}' in TYPE"), line));
                    }
                    let kind = match w.next().map(str::trim) {
                        Some("counter") => MetricType::Counter,
                        Some("gauge") => MetricType::Gauge,
                        Some("histogram") => MetricType::Histogram,
                        other => {
                            return Err(fail(n, format!("unsupported type {other:?}"), line));
                        }
                    };
                    if kind == MetricType::Counter && !name.ends_with("_total") {
                        return Err(fail(
                            n,
                            format!("counter '{name}' does not end in _total"),
                            line,
                        ));
                    }
                    if p.types.contains_key(name) {
                        return Err(fail(n, format!("second TYPE for '{name}'"), line));
                    }
                    if !enter(name, &mut current, &mut finished) {
                        return Err(fail(n, format!("family '{name}' is split"), line));
                    }
                    p.types.insert(name.to_owned(), kind);
                }
                _ => {} // another comment
            }
            continue;
        }
        let s = parse_sample(line).map_err(|m| fail(n, m, line))?;
        let Some(fam) = family_of(&s.name, &p.types).map(str::to_owned) else {
            return Err(fail(
                n,
                format!("sample '{}' before (or without) its TYPE", s.name),
                line,
            ));
        };
        if !enter(&fam, &mut current, &mut finished) {
            return Err(fail(n, format!("family '{fam}' is split"), line));
        }
        let mut key_labels = s.labels.clone();
        key_labels.sort();
        if !seen.insert((s.name.clone(), key_labels)) {
            return Err(fail(n, "duplicate sample".into(), line));
        }
        if p.types.get(&fam) == Some(&MetricType::Histogram) && fam == s.name {
            return Err(fail(
                n,
                "histogram sample without _bucket/_sum/_count".into(),
                line,
            ));
        }
        p.samples.push(s);
    }
    check_histograms(&p)?;
    Ok(p)
}

/// Moves to family `fam`; false if `fam` was already finished (split).
fn enter(fam: &str, current: &mut Option<String>, finished: &mut HashSet<String>) -> bool {
    if current.as_deref() != Some(fam) {
        if let Some(c) = current.take() {
            finished.insert(c);
        }
        if finished.contains(fam) {
            return false;
        }
        *current = Some(fam.to_owned());
    }
    true
}

fn check_histograms(p: &Parsed) -> Result<(), ExpositionError> {
    let fail = |msg: String| ExpositionError {
        line: 0,
        msg,
        text: String::new(),
    };
    // (family, labels without le) -> buckets (le, count), sum?, count?
    type Series = (Vec<(f64, f64)>, Option<f64>, Option<f64>);
    let mut series: HashMap<(String, Vec<(String, String)>), Series> = HashMap::new();
    for s in &p.samples {
        let Some(fam) = family_of(&s.name, &p.types) else {
            continue;
        };
        if p.types.get(fam) != Some(&MetricType::Histogram) {
            continue;
        }
        let mut rest: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        rest.sort();
        let e = series.entry((fam.to_owned(), rest)).or_default();
        match &s.name[fam.len()..] {
            "_bucket" => {
                let le = s
                    .label("le")
                    .ok_or_else(|| fail(format!("{} sample without le", s.name)))?;
                let le = parse_value(le)
                    .filter(|v| !v.is_nan())
                    .ok_or_else(|| fail(format!("{}: bad le '{le}'", s.name)))?;
                e.0.push((le, s.value));
            }
            "_sum" => e.1 = Some(s.value),
            _ => e.2 = Some(s.value),
        }
    }
    for ((fam, labels), (buckets, sum, count)) in series {
        let what = format!("histogram {fam}{labels:?}");
        let Some(&(last_le, last)) = buckets.last() else {
            return Err(fail(format!("{what} has no buckets")));
        };
        if last_le != f64::INFINITY {
            return Err(fail(format!("{what} does not end with le=\"+Inf\"")));
        }
        for w in buckets.windows(2) {
            if w[1].0 <= w[0].0 {
                return Err(fail(format!("{what}: le {} after {}", w[1].0, w[0].0)));
            }
            if w[1].1 < w[0].1 {
                return Err(fail(format!(
                    "{what}: bucket le={} holds {} < {} of le={} (not cumulative)",
                    w[1].0, w[1].1, w[0].1, w[0].0
                )));
            }
        }
        if sum.is_none() {
            return Err(fail(format!("{what} has no _sum")));
        }
        if count != Some(last) {
            return Err(fail(format!(
                "{what}: _count {count:?} differs from the +Inf bucket {last}"
            )));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// HTTP, the pure halves.

/// What an HTTP request asked, as far as a metrics endpoint cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    /// The path, without a query string.
    pub path: String,
}

/// Finds the end of the request head (`\r\n\r\n`, or `\n\n` from sloppy
/// clients) in `buf`: `Some(len)` once it is complete.
pub fn request_head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Parses a request head's first line (`GET /metrics HTTP/1.1`).
pub fn parse_request_head(head: &[u8]) -> Result<HttpRequest, String> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end])
        .map_err(|_| "request line is not UTF-8".to_owned())?
        .trim_end_matches('\r');
    let mut w = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (w.next(), w.next(), w.next(), w.next())
    else {
        return Err(format!("bad request line '{line}'"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unsupported protocol '{version}'"));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("bad method '{method}'"));
    }
    let path = target.split('?').next().unwrap_or_default();
    Ok(HttpRequest {
        method: method.to_owned(),
        path: path.to_owned(),
    })
}

/// An HTTP/1.1 response (the connection closes after it). With `head_only`
/// (a HEAD request) the headers say the body's length but it is not sent.
pub fn http_response(status: u16, content_type: &str, body: &[u8], head_only: bool) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    if status == 503 {
        out.push_str("Retry-After: 1\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

/// The response to a request head for an endpoint that serves `render()`
/// at `/metrics` only. `render` is called only for a GET/HEAD of `/metrics`.
pub fn respond(head: &[u8], render: impl FnOnce() -> String) -> Vec<u8> {
    const TEXT: &str = "text/plain; charset=utf-8";
    match parse_request_head(head) {
        Err(e) => http_response(400, TEXT, format!("{e}\n").as_bytes(), false),
        Ok(r) if r.method != "GET" && r.method != "HEAD" => http_response(
            405,
            TEXT,
            format!("method {} not allowed (GET or HEAD)\n", r.method).as_bytes(),
            false,
        ),
        Ok(r) if r.path != "/metrics" => http_response(
            404,
            TEXT,
            format!("no page {}; metrics are at /metrics\n", r.path).as_bytes(),
            r.method == "HEAD",
        ),
        Ok(r) => http_response(200, CONTENT_TYPE, render().as_bytes(), r.method == "HEAD"),
    }
}

/// The answer of a `/metrics` endpoint at its connection cap: 503 with
/// `Retry-After: 1` ("busy, retry"; [`crate::listen`]).
pub fn busy_response() -> Vec<u8> {
    http_response(
        503,
        "text/plain; charset=utf-8",
        b"busy: too many connections to the metrics endpoint; retry\n",
        false,
    )
}

/// Exports the counters of a daemon's listeners, labelled `socket`:
/// `oxvs_listener_connections` (gauge), `oxvs_listener_accepted_total`,
/// `oxvs_listener_busy_total`, `oxvs_listener_idle_closed_total`.
pub fn encode_listeners(e: &mut Exposition, listeners: &[(&str, &crate::listen::ListenStats)]) {
    use std::sync::atomic::Ordering::Relaxed;
    type Pick = fn(&crate::listen::ListenStats) -> u64;
    let families: [(&str, &str, bool, Pick); 4] = [
        (
            "oxvs_listener_connections",
            "Connections being served, by socket.",
            false,
            |s| s.active.load(Relaxed),
        ),
        (
            "oxvs_listener_accepted_total",
            "Connections admitted, by socket.",
            true,
            |s| s.accepted_total.load(Relaxed),
        ),
        (
            "oxvs_listener_busy_total",
            "Connections turned away busy (the socket's connection cap was reached), by socket.",
            true,
            |s| s.busy_total.load(Relaxed),
        ),
        (
            "oxvs_listener_idle_closed_total",
            "Connections closed after sitting idle past the socket's idle timeout, by socket.",
            true,
            |s| s.idle_closed_total.load(Relaxed),
        ),
    ];
    for (name, help, counter, pick) in families {
        let mut f = if counter {
            e.counter(name, help)
        } else {
            e.gauge(name, help)
        };
        for (socket, stats) in listeners {
            f.int(&[("socket", socket)], pick(stats));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_text() -> String {
        let mut e = Exposition::new();
        e.counter("oxvs_x_total", "Things.\nTwo lines \\ here.")
            .int(&[("port", "p\"1\\\n")], 3)
            .int(&[("port", "p2")], 0);
        e.gauge("oxvs_g", "A gauge.").sample(&[], 1.5);
        e.histogram("oxvs_h_seconds", "Latency.")
            .histogram(&[("verb", "ADD")], &[0.001, 0.01, 1.0], &[1, 0, 2, 1], 2.5)
            .histogram(&[("verb", "DEL")], &[0.001, 0.01, 1.0], &[], 0.0);
        e.finish()
    }

    #[test]
    fn written_text_parses_back() {
        let text = sample_text();
        let p = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(p.value("oxvs_x_total", &[("port", "p\"1\\\n")]), Some(3.0));
        assert_eq!(p.value("oxvs_g", &[]), Some(1.5));
        assert_eq!(
            p.value("oxvs_h_seconds_bucket", &[("verb", "ADD"), ("le", "0.01")]),
            Some(1.0)
        );
        assert_eq!(
            p.value("oxvs_h_seconds_bucket", &[("verb", "ADD"), ("le", "1")]),
            Some(3.0)
        );
        assert_eq!(
            p.value("oxvs_h_seconds_bucket", &[("verb", "ADD"), ("le", "+Inf")]),
            Some(4.0)
        );
        assert_eq!(
            p.value("oxvs_h_seconds_count", &[("verb", "ADD")]),
            Some(4.0)
        );
        assert_eq!(
            p.value("oxvs_h_seconds_count", &[("verb", "DEL")]),
            Some(0.0)
        );
        assert_eq!(p.types.get("oxvs_h_seconds"), Some(&MetricType::Histogram));
        assert!(text.contains("# HELP oxvs_x_total Things.\\nTwo lines \\\\ here.\n"));
    }

    #[test]
    fn values_format() {
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(0.0025), "0.0025");
        assert_eq!(format_value(1e-9), "0.000000001");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(
            format_value(18446744073709551615u64 as f64),
            "18446744073709552000"
        );
    }

    #[test]
    fn validator_rejects_what_it_must() {
        let bad = [
            ("x_total 1\n", "before"),
            ("# TYPE x counter\nx 1\n", "_total"),
            ("# TYPE 1x gauge\n", "bad metric name"),
            ("# TYPE x gauge\nx{a=\"1\"} one\n", "bad value"),
            ("# TYPE x gauge\nx{a=1} 1\n", "not quoted"),
            ("# TYPE x gauge\nx{__a=\"1\"} 1\n", "bad label name"),
            ("# TYPE x gauge\nx{a=\"1\",a=\"2\"} 1\n", "twice"),
            ("# TYPE x gauge\nx 1\nx 2\n", "duplicate"),
            ("# TYPE x gauge\n# TYPE x gauge\n", "second TYPE"),
            ("# TYPE x gauge\n# TYPE y gauge\ny 1\nx 1\n", "split"),
            ("# TYPE x gauge\nx{a=\"1} 1\n", "unterminated"),
            ("# TYPE x summary\n", "unsupported"),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n",
                "not cumulative",
            ),
            (
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 0\nh_count 2\n",
                "+Inf",
            ),
            (
                "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0\nh_count 3\n",
                "differs",
            ),
            ("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n", "_sum"),
            ("# TYPE h histogram\nh 2\n", "without _bucket"),
        ];
        for (text, why) in bad {
            match parse(text) {
                Ok(_) => panic!("accepted {text:?} (should fail: {why})"),
                Err(e) => assert!(e.to_string().contains(why), "{text:?}: {e} (want {why})"),
            }
        }
        // Comments, blank lines and timestamps are fine.
        let ok = "# a comment\n\n# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"b\"} 1 1700000000000\n";
        assert_eq!(parse(ok).map(|p| p.samples.len()), Ok(1));
    }

    #[test]
    fn validator_never_panics_on_junk() {
        for text in [
            "{",
            "}",
            "x{",
            "x{a",
            "x{a=",
            "x{a=\"",
            "x{a=\"\\",
            "#",
            "# TYPE",
            "# HELP",
            "\u{feff}x 1",
            "x\u{0}y 1",
            "x{a=\"é\"} 1",
        ] {
            let _ = parse(text);
        }
    }

    #[test]
    fn http_exchange() {
        let head = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(request_head_end(head), Some(head.len()));
        assert_eq!(request_head_end(b"GET / HTTP/1.1\r\nHost"), None);
        let r = String::from_utf8(respond(head, || "x 1\n".into())).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains(CONTENT_TYPE) && r.ends_with("\r\n\r\nx 1\n"),
            "{r}"
        );
        let r = String::from_utf8(respond(b"HEAD /metrics HTTP/1.0\r\n\r\n", || {
            "x 1\n".into()
        }))
        .unwrap_or_default();
        assert!(
            r.contains("Content-Length: 4\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = respond(b"GET /other HTTP/1.1\r\n\r\n", || unreachable!());
        assert!(r.starts_with(b"HTTP/1.1 404"));
        let r = respond(b"POST /metrics HTTP/1.1\r\n\r\n", || unreachable!());
        assert!(r.starts_with(b"HTTP/1.1 405"));
        for junk in [
            &b"\xff\xfe"[..],
            b"GET\r\n\r\n",
            b"GET / SPDY/3\r\n\r\n",
            b"",
        ] {
            let r = respond(junk, || unreachable!());
            assert!(r.starts_with(b"HTTP/1.1 400"), "{junk:?}");
        }
    }
}
