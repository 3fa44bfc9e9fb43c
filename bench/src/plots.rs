//! # Plots of the committed benchmark results (SVG)
//!
//! Reads the JSON documents that `cni-bench`, `policy-bench` and `e2e`
//! write and draws them as SVG files (plotters, SVG backend only):
//!
//! - `cni-bench` (`"bench": "cni-latency"`): ADD and DEL latency p50/p90/p99,
//!   oxvs vs the reference `bridge` + `host-local` plugins, one chart per
//!   mode (sequential, concurrent), plus where oxvs's time goes (the probe
//!   steps) when the document has them;
//! - `policy-bench matrix`: realisation time vs number of policies, one
//!   line per pod count (slowest node, and all nodes on one CPU), log-log;
//! - `policy-bench lab`: time from `oxvs-lab apply -f` to the flows on every
//!   switch (and removal) vs number of policies;
//! - `policy-bench datapath`: pps with 0 and N policies per traffic/cache tier;
//! - `e2e`: delivered pps at maximum load, switch CPU ns/packet at fixed
//!   load, and TCP Gbit/s, per switch (median, whiskers min-max).
//!
//! Every chart has the machine (CPU model, cores, kernel) and the date the
//! document records (`date`, top level or in `machine`; "date not recorded"
//! when absent) under its title.
//!
//! Invariants: nothing here panics on bad input. A missing or mistyped
//! field is an error naming the field's path (`results[3].p50_ms`); the
//! caller adds the file name. A JSON `null` where a measurement may be
//! absent (a skipped switch, a node that timed out) just leaves that bar or
//! point out. Output file names are `<stem>-<what>.svg` in the given
//! directory, which is created if needed.
//!
//! Concurrency: none; plain functions writing files.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

// ---------------------------------------------------------------- metadata

/// What a chart says about where and when its numbers were taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// "CPU model, N cores, kernel K" (the parts the document has).
    pub machine: Option<String>,
    /// The document's `date` field as written.
    pub date: Option<String>,
}

impl Meta {
    /// The line under every chart title.
    pub fn subtitle(&self) -> String {
        format!(
            "{} | {}",
            self.machine.as_deref().unwrap_or("machine not recorded"),
            self.date.as_deref().unwrap_or("date not recorded")
        )
    }
}

/// The machine and date of a results document (top-level `machine` object
/// with `cpu_model`, `cores`, `kernel`; `date` at the top level or in
/// `machine`). Absent parts are left out, never an error.
pub fn meta(doc: &Value) -> Meta {
    let m = doc.get("machine");
    let s = |k: &str| m.and_then(|m| m.get(k)).and_then(Value::as_str);
    let mut parts = Vec::new();
    if let Some(cpu) = s("cpu_model") {
        parts.push(cpu.to_owned());
    }
    if let Some(c) = m.and_then(|m| m.get("cores")).and_then(Value::as_u64) {
        parts.push(format!("{c} cores"));
    }
    if let Some(k) = s("kernel") {
        parts.push(format!("kernel {k}"));
    }
    let date = doc
        .get("date")
        .and_then(Value::as_str)
        .or_else(|| s("date"))
        .map(str::to_owned);
    Meta {
        machine: (!parts.is_empty()).then(|| parts.join(", ")),
        date,
    }
}

/// `YYYY-MM-DD HH:MM UTC` of `t` (what the benchmarks record as `date`).
pub fn utc_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (h, mi) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{mi:02} UTC")
}

/// [`utc_date`] of now.
pub fn now_date() -> String {
    utc_date(SystemTime::now())
}

// ---------------------------------------------------------------- field access

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn field<'a>(v: &'a Value, path: &str, key: &str) -> Result<&'a Value> {
    if !v.is_object() {
        bail!(
            "`{}` is not an object (found {})",
            if path.is_empty() { "(document)" } else { path },
            kind(v)
        );
    }
    v.get(key)
        .ok_or_else(|| anyhow!("field `{}` is missing", join(path, key)))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn num(v: &Value, path: &str, key: &str) -> Result<f64> {
    opt_num(v, path, key)?.ok_or_else(|| anyhow!("field `{}` is null", join(path, key)))
}

/// A number, or `None` for `null`; missing or another type is an error.
fn opt_num(v: &Value, path: &str, key: &str) -> Result<Option<f64>> {
    match field(v, path, key)? {
        Value::Null => Ok(None),
        x => x
            .as_f64()
            .filter(|f| f.is_finite())
            .map(Some)
            .ok_or_else(|| {
                anyhow!(
                    "field `{}` is not a number (found {})",
                    join(path, key),
                    kind(x)
                )
            }),
    }
}

fn text<'a>(v: &'a Value, path: &str, key: &str) -> Result<&'a str> {
    let x = field(v, path, key)?;
    x.as_str().ok_or_else(|| {
        anyhow!(
            "field `{}` is not a string (found {})",
            join(path, key),
            kind(x)
        )
    })
}

fn array<'a>(v: &'a Value, path: &str, key: &str) -> Result<&'a [Value]> {
    let x = field(v, path, key)?;
    x.as_array().map(Vec::as_slice).ok_or_else(|| {
        anyhow!(
            "field `{}` is not an array (found {})",
            join(path, key),
            kind(x)
        )
    })
}

/// A `{"median", "min", "max"}` summary as a bar; `None` for `null`.
fn summary_bar(v: &Value, path: &str, key: &str) -> Result<Option<Bar>> {
    let s = field(v, path, key)?;
    if s.is_null() {
        return Ok(None);
    }
    let p = join(path, key);
    let value = num(s, &p, "median")?;
    let lo = opt_num(s, &p, "min")?;
    let hi = opt_num(s, &p, "max")?;
    Ok(Some(Bar {
        value,
        range: lo.zip(hi),
    }))
}

// ---------------------------------------------------------------- charts

/// One bar: a value and, optionally, a (min, max) whisker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bar {
    pub value: f64,
    pub range: Option<(f64, f64)>,
}

impl Bar {
    /// A bar without whisker.
    pub fn of(value: f64) -> Bar {
        Bar { value, range: None }
    }
}

/// A horizontal grouped bar chart: one band per category (top to bottom),
/// in each band one bar per series.
#[derive(Clone, Debug, Default)]
pub struct BarChart {
    pub title: String,
    pub subtitle: String,
    pub value_label: String,
    pub categories: Vec<String>,
    /// (series name, one entry per category; `None`: no bar).
    pub series: Vec<(String, Vec<Option<Bar>>)>,
}

/// Points of a line, (x, y).
pub type Points = Vec<(f64, f64)>;

/// A line chart, optionally with logarithmic axes.
#[derive(Clone, Debug, Default)]
pub struct LineChart {
    pub title: String,
    pub subtitle: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<(String, Points)>,
    pub log_x: bool,
    pub log_y: bool,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

const WIDTH: u32 = 900;

/// A white SVG canvas at `path` with the title and, under it, the
/// subtitle (the machine and date): the whole canvas and the area left
/// for the chart.
fn titled_area<'a>(
    path: &'a Path,
    size: (u32, u32),
    title: &str,
    subtitle: &str,
) -> Result<(Canvas<'a>, Canvas<'a>)> {
    let err = plot_err(path);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let area = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| err(&e))?;
    let area = area
        .titled(
            subtitle,
            ("sans-serif", 13).into_font().color(&BLACK.mix(0.7)),
        )
        .map_err(|e| err(&e))?;
    Ok((root, area))
}

/// A drawing area of an SVG file.
type Canvas<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn plot_err(path: &Path) -> impl Fn(&dyn std::fmt::Debug) -> anyhow::Error + '_ {
    move |e| anyhow!("cannot draw {}: {e:?}", path.display())
}

/// A short form of `v` for labels (3 significant digits, thousands grouped).
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        let s = format!("{:.0}", a);
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if v < 0.0 {
            format!("-{out}")
        } else {
            out
        }
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// An axis tick: whole numbers without decimals (grouped), others as [`short`]
/// with trailing zeros trimmed.
pub fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return if v.abs() >= 100.0 {
            short(v)
        } else {
            format!("{v:.0}")
        };
    }
    let s = short(v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Draws `c` into `path` (SVG). Errors: no bar at all, a series whose
/// length differs from the categories, or a drawing error.
pub fn bar_chart(path: &Path, c: &BarChart) -> Result<()> {
    let n = c.categories.len();
    for (name, v) in &c.series {
        if v.len() != n {
            bail!(
                "{}: series {name:?} has {} values for {n} categories",
                c.title,
                v.len()
            );
        }
    }
    let bars = || c.series.iter().flat_map(|s| s.1.iter().flatten());
    if bars().next().is_none() {
        bail!("nothing to plot for {:?}", c.title);
    }
    let mut hi = 0.0f64;
    let mut lo = 0.0f64;
    for b in bars() {
        let (l, h) = b.range.unwrap_or((b.value, b.value));
        hi = hi.max(b.value).max(h);
        lo = lo.min(b.value).min(l);
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    // Room on the right for the value labels.
    let span = hi - lo;
    let (x0, x1) = (
        if lo < 0.0 { lo - span * 0.05 } else { 0.0 },
        hi + span * 0.18,
    );
    let ns = c.series.len().max(1);
    let band_px = (ns as u32 * 18 + 16).max(34);
    let legend_px = ns as u32 * 20 + 16;
    let plot_px = band_px * n as u32 + legend_px;
    let height = (plot_px + 140).max(300);
    let label_chars = c.categories.iter().map(|s| s.chars().count()).max();
    let label_w = (label_chars.unwrap_or(4) as u32 * 13 / 2 + 20).clamp(60, 330);
    // The legend sits in `extra` empty bands at the top.
    let extra = f64::from(legend_px) / f64::from(band_px);
    let y_top = n as f64 + extra;

    let err = plot_err(path);
    let (root, area) = titled_area(path, (WIDTH, height), &c.title, &c.subtitle)?;
    let mut chart = ChartBuilder::on(&area)
        .margin(10)
        .margin_right(25)
        .x_label_area_size(40)
        .y_label_area_size(label_w)
        .build_cartesian_2d(x0..x1, 0.0..y_top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(c.value_label.as_str())
        .x_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(|e| err(&e))?;
    // Band of category i (top to bottom): [n-1-i, n-i].
    let pad = 0.12;
    let slot = (1.0 - 2.0 * pad) / ns as f64;
    for (j, (name, vals)) in c.series.iter().enumerate() {
        let color = PALETTE[j % PALETTE.len()];
        let rects: Vec<_> = vals
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let b = (*b)?;
                let top = (n - i) as f64 - pad - slot * j as f64;
                Some(Rectangle::new(
                    [(0.0, top - slot * 0.9), (b.value, top)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(|e| err(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
        for (i, b) in vals.iter().enumerate() {
            let Some(b) = *b else { continue };
            let top = (n - i) as f64 - pad - slot * j as f64;
            let mid = top - slot * 0.45;
            let mut end = b.value;
            if let Some((l, h)) = b.range {
                let q = slot * 0.25;
                let w = BLACK.stroke_width(1);
                for seg in [
                    vec![(l, mid), (h, mid)],
                    vec![(l, mid - q), (l, mid + q)],
                    vec![(h, mid - q), (h, mid + q)],
                ] {
                    chart
                        .draw_series(std::iter::once(PathElement::new(seg, w)))
                        .map_err(|e| err(&e))?;
                }
                end = end.max(h);
            }
            let style = ("sans-serif", 11)
                .into_text_style(&area)
                .pos(Pos::new(HPos::Left, VPos::Center));
            let (px, py) = chart.backend_coord(&(end, mid));
            root.draw(&Text::new(short(b.value), (px + 4, py), style))
                .map_err(|e| err(&e))?;
        }
    }
    // Category names left of the plotting area, centred on their band.
    let style = ("sans-serif", 13)
        .into_text_style(&area)
        .pos(Pos::new(HPos::Right, VPos::Center));
    for (i, cat) in c.categories.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(x0, (n - i) as f64 - 0.5));
        root.draw(&Text::new(cat.as_str(), (px - 8, py), style.clone()))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Draws `c` into `path` (SVG). Errors: no point at all, a non-positive
/// value on a log axis, or a drawing error.
pub fn line_chart(path: &Path, c: &LineChart) -> Result<()> {
    let pts = || c.series.iter().flat_map(|s| s.1.iter());
    if pts().next().is_none() {
        bail!("nothing to plot for {:?}", c.title);
    }
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts() {
        if (c.log_x && x <= 0.0) || (c.log_y && y <= 0.0) {
            bail!("{}: point ({x}, {y}) cannot go on a log axis", c.title);
        }
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let (x0, x1) = if c.log_x {
        (x0 / 1.5, x1 * 1.5)
    } else {
        let s = (x1 - x0).max(1e-9);
        (x0 - s * 0.05, x1 + s * 0.05)
    };
    let (y0, y1) = if c.log_y {
        (y0 / 2.0, y1 * 3.0)
    } else {
        (y0.min(0.0), if y1 > 0.0 { y1 * 1.3 } else { 1.0 })
    };
    let err = plot_err(path);
    let (root, area) = titled_area(path, (WIDTH, 560), &c.title, &c.subtitle)?;
    let mut b = ChartBuilder::on(&area);
    b.margin(10)
        .margin_right(25)
        .x_label_area_size(40)
        .y_label_area_size(70);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart.map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_desc(c.x_label.as_str())
                .y_desc(c.y_label.as_str())
                .x_label_formatter(&|v| tick(*v))
                .y_label_formatter(&|v| tick(*v))
                .draw()
                .map_err(|e| err(&e))?;
            for (i, (name, p)) in c.series.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                let mut p = p.clone();
                p.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(p.iter().copied(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(p.iter().map(|&q| Circle::new(q, 3, color.filled())))
                    .map_err(|e| err(&e))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    match (c.log_x, c.log_y) {
        (true, true) => draw!(b.build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())),
        (true, false) => draw!(b.build_cartesian_2d((x0..x1).log_scale(), y0..y1)),
        (false, true) => draw!(b.build_cartesian_2d(x0..x1, (y0..y1).log_scale())),
        (false, false) => draw!(b.build_cartesian_2d(x0..x1, y0..y1)),
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

// ---------------------------------------------------------------- documents

/// What kind of results document a JSON value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cni-bench` (`"bench": "cni-latency"`).
    Cni,
    /// `policy-bench matrix|datapath|lab` (a `matrix`, `datapath` or `lab` array).
    Policy,
    /// `e2e` (`fixed_rate_pps` and `results` with `switch` entries).
    E2e,
}

/// Recognises a results document by its fields.
pub fn kind_of(doc: &Value) -> Result<Kind> {
    if !doc.is_object() {
        bail!("the document is not a JSON object (found {})", kind(doc));
    }
    if doc.get("bench").and_then(Value::as_str) == Some("cni-latency") {
        return Ok(Kind::Cni);
    }
    if ["matrix", "datapath", "lab"]
        .iter()
        .any(|k| doc.get(*k).is_some())
    {
        return Ok(Kind::Policy);
    }
    if doc.get("fixed_rate_pps").is_some()
        || doc
            .get("results")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .is_some_and(|r| r.get("switch").is_some())
    {
        return Ok(Kind::E2e);
    }
    bail!(
        "not a known results document: none of `bench`: \"cni-latency\", `matrix`, \
         `datapath`, `lab`, `fixed_rate_pps` is there"
    )
}

/// Plots `doc` (any [`Kind`]) into `dir` as `<stem>-*.svg`; the files written.
pub fn plot_doc(doc: &Value, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    match kind_of(doc)? {
        Kind::Cni => cni_plots(doc, dir, stem),
        Kind::Policy => policy_plots(doc, dir, stem),
        Kind::E2e => e2e_plots(doc, dir, stem),
    }
}

/// Reads the JSON file `file` and plots it into `dir` (stem: the file's);
/// errors name the file.
pub fn plot_file(file: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", file.display()))?;
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow!("{} has no usable file name", file.display()))?;
    plot_doc(&doc, dir, stem).with_context(|| format!("{}", file.display()))
}

fn out(dir: &Path, stem: &str, what: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.join(format!("{stem}-{what}.svg")))
}

/// The reference plugin's legend label.
fn plugin_label(p: &str) -> String {
    match p {
        "bridge" => "bridge + host-local".into(),
        p => p.into(),
    }
}

/// `cni-bench`: `<stem>-sequential.svg`, `<stem>-concurrent.svg` (one per
/// mode present) and, with a `probe` array, `<stem>-probe.svg`.
pub fn cni_plots(doc: &Value, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    let meta = meta(doc);
    let results = array(doc, "", "results")?;
    // (plugin, verb, mode, concurrency, [p50, p90, p99])
    let mut rows = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let p = format!("results[{i}]");
        rows.push((
            text(r, &p, "plugin")?.to_owned(),
            text(r, &p, "verb")?.to_owned(),
            text(r, &p, "mode")?.to_owned(),
            r.get("concurrency").and_then(Value::as_u64),
            [
                num(r, &p, "p50_ms")?,
                num(r, &p, "p90_ms")?,
                num(r, &p, "p99_ms")?,
            ],
        ));
    }
    if rows.is_empty() {
        bail!("field `results` is empty");
    }
    let pods = doc.get("pods").and_then(Value::as_u64);
    let mut modes: Vec<&str> = Vec::new();
    let mut plugins: Vec<&str> = Vec::new();
    for r in &rows {
        if !modes.contains(&r.2.as_str()) {
            modes.push(&r.2);
        }
        if !plugins.contains(&r.0.as_str()) {
            plugins.push(&r.0);
        }
    }
    let mut written = Vec::new();
    for mode in modes {
        let mut categories = Vec::new();
        let mut keys = Vec::new();
        for verb in ["ADD", "DEL"] {
            for (qi, q) in ["p50", "p90", "p99"].iter().enumerate() {
                categories.push(format!("{verb} {q}"));
                keys.push((verb, qi));
            }
        }
        let series = plugins
            .iter()
            .map(|pl| {
                let vals = keys
                    .iter()
                    .map(|(verb, qi)| {
                        rows.iter()
                            .find(|r| r.0 == *pl && r.1 == *verb && r.2 == mode)
                            .map(|r| Bar::of(r.4[*qi]))
                    })
                    .collect();
                (plugin_label(pl), vals)
            })
            .collect();
        let conc = rows
            .iter()
            .find(|r| r.2 == mode)
            .and_then(|r| r.3)
            .map_or(String::new(), |c| format!(", {c} at a time"));
        let n = pods.map_or(String::new(), |n| format!(", {n} pods"));
        let path = out(dir, stem, mode)?;
        bar_chart(
            &path,
            &BarChart {
                title: format!("CNI ADD/DEL latency, {mode}{conc}{n} (spawn to exit)"),
                subtitle: meta.subtitle(),
                value_label: "ms".into(),
                categories,
                series,
            },
        )?;
        written.push(path);
    }
    if let Some(probe) = doc.get("probe") {
        let probe = probe
            .as_array()
            .ok_or_else(|| anyhow!("field `probe` is not an array (found {})", kind(probe)))?;
        let mut categories = Vec::new();
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for (i, s) in probe.iter().enumerate() {
            let p = format!("probe[{i}]");
            categories.push(format!("{} {}", text(s, &p, "verb")?, text(s, &p, "step")?));
            p50.push(Some(Bar::of(num(s, &p, "p50_ms")?)));
            p99.push(Some(Bar::of(num(s, &p, "p99_ms")?)));
        }
        if !categories.is_empty() {
            let path = out(dir, stem, "probe")?;
            bar_chart(
                &path,
                &BarChart {
                    title: "Where oxvs-cni's time goes (in-process probe of each step)".into(),
                    subtitle: meta.subtitle(),
                    value_label: "ms".into(),
                    categories,
                    series: vec![("p50".into(), p50), ("p99".into(), p99)],
                },
            )?;
            written.push(path);
        }
    }
    Ok(written)
}

/// `policy-bench`: `<stem>-realisation.svg` (matrix or lab) or
/// `<stem>-pps.svg` (datapath), for whichever arrays the document has.
pub fn policy_plots(doc: &Value, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    let meta = meta(doc);
    let mut written = Vec::new();
    if doc.get("matrix").is_some() {
        let matrix = array(doc, "", "matrix")?;
        let mut by_pods: Vec<(u64, Points, Points)> = Vec::new();
        let mut nodes = None;
        for (i, m) in matrix.iter().enumerate() {
            let p = format!("matrix[{i}]");
            let pods = num(m, &p, "pods")? as u64;
            let pol = num(m, &p, "policies")?;
            let max = num(m, &p, "realise_max_ms")?;
            let sum = num(m, &p, "realise_sum_ms")?;
            nodes = nodes.or_else(|| m.get("nodes").and_then(Value::as_array).map(Vec::len));
            match by_pods.iter_mut().find(|e| e.0 == pods) {
                Some(e) => {
                    e.1.push((pol, max));
                    e.2.push((pol, sum));
                }
                None => by_pods.push((pods, vec![(pol, max)], vec![(pol, sum)])),
            }
        }
        if by_pods.is_empty() {
            bail!("field `matrix` is empty");
        }
        let mut series = Vec::new();
        for (pods, max, _) in &by_pods {
            series.push((format!("{pods} pods: slowest node"), max.clone()));
        }
        for (pods, _, sum) in &by_pods {
            series.push((format!("{pods} pods: all nodes on 1 CPU"), sum.clone()));
        }
        let nodes = nodes.map_or(String::new(), |n| format!(", {n} nodes"));
        let path = out(dir, stem, "realisation")?;
        line_chart(
            &path,
            &LineChart {
                title: format!("NetworkPolicy realisation time, in process{nodes}"),
                subtitle: meta.subtitle(),
                x_label: "NetworkPolicies".into(),
                y_label: "ms (translate + diff + parse + install)".into(),
                series,
                log_x: true,
                log_y: true,
            },
        )?;
        written.push(path);
    }
    if doc.get("lab").is_some() {
        let lab = array(doc, "", "lab")?;
        let (mut realised, mut apply, mut removed) = (Vec::new(), Vec::new(), Vec::new());
        let mut pods = None;
        for (i, l) in lab.iter().enumerate() {
            let p = format!("lab[{i}]");
            let pol = num(l, &p, "policies")?;
            pods = pods.or(l.get("pods").and_then(Value::as_u64));
            apply.push((pol, num(l, &p, "apply_cmd_s")?));
            if let Some(r) = opt_num(l, &p, "removed_s")? {
                removed.push((pol, r));
            }
            // The slowest node; a node that timed out (null) leaves the point out.
            let mut slowest = Some(0.0f64);
            for (j, nd) in array(l, &p, "nodes")?.iter().enumerate() {
                let t = opt_num(nd, &format!("{p}.nodes[{j}]"), "realised_s")?;
                slowest = slowest.zip(t).map(|(a, b)| a.max(b));
            }
            if let Some(s) = slowest {
                realised.push((pol, s));
            }
        }
        let pods = pods.map_or(String::new(), |n| format!(", {n} pods"));
        let path = out(dir, stem, "realisation")?;
        line_chart(
            &path,
            &LineChart {
                title: format!("NetworkPolicy realisation on oxvs-lab{pods}"),
                subtitle: meta.subtitle(),
                x_label: "NetworkPolicies".into(),
                y_label: "seconds".into(),
                series: vec![
                    ("apply -f to flows on every switch".into(), realised),
                    ("oxvs-lab apply -f command".into(), apply),
                    ("delete -f to flows removed".into(), removed),
                ],
                log_x: true,
                log_y: true,
            },
        )?;
        written.push(path);
    }
    if doc.get("datapath").is_some() {
        let dp = array(doc, "", "datapath")?;
        let mut tiers: Vec<String> = Vec::new();
        let mut pols: Vec<u64> = Vec::new();
        let mut rows = Vec::new();
        for (i, d) in dp.iter().enumerate() {
            let p = format!("datapath[{i}]");
            let tier = text(d, &p, "tier")?.to_owned();
            let pol = num(d, &p, "policies")? as u64;
            let pps = num(d, &p, "pps")?;
            let trials: Vec<f64> = match d.get("trials_pps").and_then(Value::as_array) {
                Some(t) => t.iter().filter_map(Value::as_f64).collect(),
                None => Vec::new(),
            };
            let range = trials
                .iter()
                .copied()
                .fold(None, |acc: Option<(f64, f64)>, x| {
                    Some(acc.map_or((x, x), |(l, h)| (l.min(x), h.max(x))))
                });
            if !tiers.contains(&tier) {
                tiers.push(tier.clone());
            }
            if !pols.contains(&pol) {
                pols.push(pol);
            }
            let m = |v: f64| v / 1e6;
            rows.push((
                tier,
                pol,
                Bar {
                    value: m(pps),
                    range: range.map(|(l, h)| (m(l), m(h))),
                },
            ));
        }
        let series = pols
            .iter()
            .map(|pol| {
                let vals = tiers
                    .iter()
                    .map(|t| rows.iter().find(|r| &r.0 == t && r.1 == *pol).map(|r| r.2))
                    .collect();
                (format!("{pol} policies"), vals)
            })
            .collect();
        let path = out(dir, stem, "pps")?;
        bar_chart(
            &path,
            &BarChart {
                title: "Datapath::process_batch with and without NetworkPolicies".into(),
                subtitle: meta.subtitle(),
                value_label: "Mpps (median, whiskers: min-max of trials)".into(),
                categories: tiers,
                series,
            },
        )?;
        written.push(path);
    }
    Ok(written)
}

/// `e2e`: `<stem>-pps.svg` (max load), `<stem>-cpu.svg` (fixed load),
/// `<stem>-tcp.svg`.
pub fn e2e_plots(doc: &Value, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
    let meta = meta(doc);
    let results = array(doc, "", "results")?;
    if results.is_empty() {
        bail!("field `results` is empty");
    }
    struct Row {
        name: String,
        skipped: bool,
        offered: Option<Bar>,
        delivered: Option<Bar>,
        cpu: Option<Bar>,
        softirq: Option<Bar>,
        tcp: Option<Bar>,
        /// One bar per TCP setting (`tcp[]`: pod offload x streams).
        tcp_runs: Vec<(String, Option<Bar>)>,
    }
    /// Which bar of a row a series shows.
    type Pick = fn(&Row) -> Option<Bar>;
    let kilo = |b: Option<Bar>| {
        b.map(|b| Bar {
            value: b.value / 1e3,
            range: b.range.map(|(l, h)| (l / 1e3, h / 1e3)),
        })
    };
    let mut rows = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let p = format!("results[{i}]");
        let name = text(r, &p, "switch")?.to_owned();
        let skipped = !r.get("skipped").is_none_or(Value::is_null);
        if skipped {
            rows.push(Row {
                name: format!("{name} (skipped)"),
                skipped,
                offered: None,
                delivered: None,
                cpu: None,
                softirq: None,
                tcp: None,
                tcp_runs: Vec::new(),
            });
            continue;
        }
        let mut tcp_runs = Vec::new();
        if let Some(Value::Array(runs)) = r.get("tcp") {
            for (j, t) in runs.iter().enumerate() {
                let tp = format!("{p}.tcp[{j}]");
                let offload = t
                    .get("pod_tx_offload")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                let streams = t.get("streams").and_then(Value::as_u64).unwrap_or(1);
                let label = format!(
                    "offload {offload}, {streams} stream{}",
                    if streams == 1 { "" } else { "s" }
                );
                tcp_runs.push((label, summary_bar(t, &tp, "gbps")?));
            }
        }
        let sub = |key: &str, inner: &str| -> Result<Option<Bar>> {
            let v = field(r, &p, key)?;
            if v.is_null() {
                return Ok(None);
            }
            summary_bar(v, &join(&p, key), inner)
        };
        rows.push(Row {
            name,
            skipped,
            offered: kilo(sub("max_load", "offered_pps")?),
            delivered: kilo(sub("max_load", "delivered_pps")?),
            cpu: sub("fixed_load", "switch_cpu_ns_per_pkt")?,
            softirq: sub("fixed_load", "softirq_ns_per_pkt_machine")?,
            tcp: summary_bar(r, &p, "tcp_gbps")?,
            tcp_runs,
        });
    }
    // Categories: switches with data for this chart, and the skipped ones.
    let chart = |what: &str,
                 title: String,
                 value_label: &str,
                 series: Vec<(&str, Pick)>|
     -> Result<PathBuf> {
        let keep: Vec<&Row> = rows
            .iter()
            .filter(|r| r.skipped || series.iter().any(|(_, f)| f(r).is_some()))
            .collect();
        let path = out(dir, stem, what)?;
        bar_chart(
            &path,
            &BarChart {
                title,
                subtitle: meta.subtitle(),
                value_label: value_label.into(),
                categories: keep.iter().map(|r| r.name.clone()).collect(),
                series: series
                    .iter()
                    .map(|(n, f)| ((*n).to_owned(), keep.iter().map(|r| f(r)).collect()))
                    .collect(),
            },
        )?;
        Ok(path)
    };
    let trials = doc.get("trials").and_then(Value::as_u64);
    let dur = doc.get("duration_s").and_then(Value::as_u64);
    let how = match (trials, dur) {
        (Some(t), Some(d)) => format!(", median of {t} x {d} s"),
        _ => String::new(),
    };
    let rate = doc
        .get("fixed_rate_pps")
        .and_then(Value::as_u64)
        .map_or(String::new(), |r| {
            format!(" ({} pps requested)", short(r as f64))
        });
    let mut written = Vec::new();
    let mut run = |r: Result<PathBuf>| -> Result<()> {
        written.push(r?);
        Ok(())
    };
    // A `--tcp-only` run has no UDP load to draw.
    if doc.get("tcp_only").and_then(Value::as_bool) != Some(true) {
        run(chart(
            "pps",
            format!("64-byte UDP at maximum load{how}"),
            "kpps (whiskers: min-max)",
            vec![
                ("delivered", |r: &Row| r.delivered),
                ("offered", |r: &Row| r.offered),
            ],
        ))?;
        run(chart(
            "cpu",
            format!("CPU per packet at fixed load{rate}"),
            "ns per delivered packet (whiskers: min-max)",
            vec![
                ("switch process CPU", |r: &Row| r.cpu),
                ("machine softirq (incl. generator, sink)", |r: &Row| {
                    r.softirq
                }),
            ],
        ))?;
    }
    // One series per TCP setting when the run has them (else the headline).
    let mut labels: Vec<String> = Vec::new();
    for r in &rows {
        for (l, _) in &r.tcp_runs {
            if !labels.contains(l) {
                labels.push(l.clone());
            }
        }
    }
    if labels.is_empty() {
        run(chart(
            "tcp",
            format!("TCP throughput, iperf3{how}"),
            "Gbit/s (whiskers: min-max)",
            vec![("TCP Gbit/s", |r: &Row| r.tcp)],
        ))?;
    } else {
        let path = out(dir, stem, "tcp")?;
        bar_chart(
            &path,
            &BarChart {
                title: format!("TCP throughput, iperf3, pods' TX checksum offload on/off{how}"),
                subtitle: meta.subtitle(),
                value_label: "Gbit/s (whiskers: min-max; no bar: failed)".into(),
                categories: rows.iter().map(|r| r.name.clone()).collect(),
                series: labels
                    .iter()
                    .map(|l| {
                        let bars = rows
                            .iter()
                            .map(|r| {
                                r.tcp_runs
                                    .iter()
                                    .find(|(rl, _)| rl == l)
                                    .and_then(|(_, b)| *b)
                            })
                            .collect();
                        (l.clone(), bars)
                    })
                    .collect(),
            },
        )?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new() -> Scratch {
            static N: AtomicUsize = AtomicUsize::new(0);
            let d = std::env::temp_dir().join(format!(
                "oxvs-plots-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&d).expect("scratch dir");
            Scratch(d)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn machine() -> Value {
        json!({"cpu_model": "Test CPU 9000", "cores": 2, "kernel": "6.1.0-test"})
    }

    fn lat(plugin: &str, verb: &str, mode: &str, p50: f64) -> Value {
        json!({"plugin": plugin, "verb": verb, "mode": mode, "concurrency": 1,
               "p50_ms": p50, "p90_ms": p50 * 1.5, "p99_ms": p50 * 2.0, "n": 10})
    }

    fn cni_doc() -> Value {
        json!({
            "bench": "cni-latency", "pods": 10, "machine": machine(), "date": "2030-01-02 03:04 UTC",
            "results": [
                lat("oxvs", "ADD", "sequential", 20.0), lat("oxvs", "DEL", "sequential", 40.0),
                lat("bridge", "ADD", "sequential", 8.0), lat("bridge", "DEL", "sequential", 20.0),
                lat("oxvs", "ADD", "concurrent", 120.0), lat("bridge", "ADD", "concurrent", 45.0),
            ],
            "probe": [{"verb": "ADD", "step": "IPAM allocate", "p50_ms": 0.5, "p99_ms": 2.0}],
        })
    }

    fn read(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn cni_plots_have_both_plugins_machine_and_date() {
        let s = Scratch::new();
        let files = plot_doc(&cni_doc(), &s.0, "cni").expect("plots");
        let names: Vec<_> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["cni-sequential.svg", "cni-concurrent.svg", "cni-probe.svg"]
        );
        let svg = read(&files[0]);
        assert!(svg.starts_with("<svg"), "{svg:.100}");
        for want in [
            "oxvs",
            "bridge + host-local",
            "ADD p50",
            "DEL p99",
            "Test CPU 9000, 2 cores, kernel 6.1.0-test",
            "2030-01-02 03:04 UTC",
            "sequential",
        ] {
            assert!(svg.contains(want), "{want:?} not in sequential plot");
        }
        // The bar value labels are there (oxvs ADD p50 = 20.0).
        assert!(
            svg.contains(">\n20.0\n<") || svg.contains(">20.0<"),
            "no value label"
        );
        assert!(read(&files[2]).contains("IPAM allocate"));
    }

    #[test]
    fn cni_missing_field_names_it() {
        let s = Scratch::new();
        let mut d = cni_doc();
        d["results"][2]
            .as_object_mut()
            .expect("object")
            .remove("p90_ms");
        let e = format!("{:#}", plot_doc(&d, &s.0, "cni").expect_err("must fail"));
        assert!(e.contains("results[2].p90_ms"), "{e}");
        d["results"][2]["p90_ms"] = json!("fast");
        let e = format!("{:#}", plot_doc(&d, &s.0, "cni").expect_err("must fail"));
        assert!(
            e.contains("results[2].p90_ms") && e.contains("not a number"),
            "{e}"
        );
        d["results"] = json!([]);
        let e = format!("{:#}", plot_doc(&d, &s.0, "cni").expect_err("must fail"));
        assert!(e.contains("`results` is empty"), "{e}");
    }

    #[test]
    fn unknown_and_malformed_documents_are_errors() {
        let s = Scratch::new();
        for (doc, want) in [
            (json!([1, 2]), "not a JSON object"),
            (json!({"foo": 1}), "not a known results document"),
            (
                json!({"bench": "cni-latency", "results": 3}),
                "`results` is not an array",
            ),
            (json!({"matrix": [{"pods": 1}]}), "matrix[0].policies"),
            (
                json!({"lab": [{"policies": 10, "apply_cmd_s": 1.0, "removed_s": 1.0}]}),
                "lab[0].nodes",
            ),
            (json!({"datapath": {}}), "`datapath` is not an array"),
            (
                json!({"fixed_rate_pps": 1, "results": [{"switch": "x"}]}),
                "results[0].max_load",
            ),
            (
                json!({"fixed_rate_pps": 1, "results": [{"switch": "x", "max_load": null,
                "fixed_load": null, "tcp_gbps": {"min": 1}}]}),
                "results[0].tcp_gbps.median",
            ),
        ] {
            let e = format!("{:#}", plot_doc(&doc, &s.0, "x").expect_err("must fail"));
            assert!(e.contains(want), "{doc}: {e:?} lacks {want:?}");
        }
        // A file that is not JSON: the error names the file.
        let f = s.0.join("broken.json");
        std::fs::write(&f, "{\"bench\": ").expect("write");
        let e = format!("{:#}", plot_file(&f, &s.0).expect_err("must fail"));
        assert!(
            e.contains("broken.json") && e.contains("not valid JSON"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            plot_file(&s.0.join("absent.json"), &s.0).expect_err("must fail")
        );
        assert!(e.contains("absent.json"), "{e}");
    }

    #[test]
    fn policy_matrix_lab_and_datapath() {
        let s = Scratch::new();
        let m = |pods: u64, pol: u64, ms: f64| {
            json!({"pods": pods, "policies": pol, "realise_max_ms": ms, "realise_sum_ms": ms * 5.0,
                   "nodes": [{}, {}]})
        };
        let doc = json!({"machine": machine(), "matrix": [m(100, 10, 0.5), m(100, 100, 5.0), m(1000, 10, 7.0)]});
        let f = policy_plots(&doc, &s.0, "policy-matrix").expect("matrix");
        assert_eq!(f.len(), 1);
        let svg = read(&f[0]);
        for want in [
            "100 pods: slowest node",
            "1000 pods: all nodes on 1 CPU",
            "2 nodes",
            "date not recorded",
        ] {
            assert!(svg.contains(want), "{want:?} not in matrix plot");
        }
        let lab = json!({"machine": machine(), "lab": [
            {"policies": 10, "pods": 40, "apply_cmd_s": 0.1, "removed_s": 0.2,
             "nodes": [{"realised_s": 0.2}, {"realised_s": 0.3}]},
            {"policies": 100, "pods": 40, "apply_cmd_s": 1.0, "removed_s": null,
             "nodes": [{"realised_s": null}, {"realised_s": 1.5}]},
        ]});
        let f = policy_plots(&lab, &s.0, "policy-lab").expect("lab");
        let svg = read(&f[0]);
        assert!(svg.contains("apply -f to flows on every switch") && svg.contains("40 pods"));
        let dp = json!({"datapath": [
            {"tier": "mixed/emc", "policies": 0, "pps": 4e5, "trials_pps": [3e5, 4e5, 5e5]},
            {"tier": "mixed/emc", "policies": 1000, "pps": 4.5e5},
        ]});
        let f = policy_plots(&dp, &s.0, "policy-datapath").expect("datapath");
        let svg = read(&f[0]);
        for want in [
            "0 policies",
            "1000 policies",
            "mixed/emc",
            "machine not recorded",
        ] {
            assert!(svg.contains(want), "{want:?} not in datapath plot");
        }
    }

    #[test]
    fn e2e_plots_each_switch_and_mark_skipped() {
        let s = Scratch::new();
        let sm = |m: f64| json!({"median": m, "min": m * 0.9, "max": m * 1.1, "trials": [m]});
        let sw = |name: &str, cpu: Value| {
            json!({"switch": name, "skipped": null,
                   "max_load": {"offered_pps": sm(9e5), "delivered_pps": sm(8e5)},
                   "fixed_load": {"switch_cpu_ns_per_pkt": cpu, "softirq_ns_per_pkt_machine": sm(2000.0)},
                   "tcp_gbps": sm(3.0)})
        };
        let doc = json!({
        "machine": machine(), "trials": 3, "duration_s": 5, "fixed_rate_pps": 50000,
        "results": [
            sw("oxvs-switchd", sm(6700.0)),
            sw("Linux bridge", Value::Null),
            {"switch": "OVS afxdp (PMD)", "skipped": "ovs-vsctl not found"},
            {"switch": "oxvs VXLAN (2 nodes)", "skipped": null, "max_load": null,
             "fixed_load": null, "tcp_gbps": sm(1.5)},
        ]});
        let f = e2e_plots(&doc, &s.0, "e2e").expect("e2e");
        assert_eq!(f.len(), 3);
        let pps = read(&f[0]);
        for want in [
            "oxvs-switchd",
            "Linux bridge",
            "OVS afxdp (PMD) (skipped)",
            "delivered",
            "offered",
        ] {
            assert!(pps.contains(want), "{want:?} not in pps plot");
        }
        // VXLAN has no max-load numbers: not a category of the pps chart.
        assert!(!pps.contains("VXLAN"));
        let cpu = read(&f[1]);
        assert!(cpu.contains("switch process CPU") && cpu.contains("6,700"));
        assert!(cpu.contains("50,000 pps requested"));
        let tcp = read(&f[2]);
        assert!(tcp.contains("oxvs VXLAN (2 nodes)") && tcp.contains("TCP Gbit/s"));
    }

    #[test]
    fn dates_and_labels() {
        assert_eq!(utc_date(UNIX_EPOCH), "1970-01-01 00:00 UTC");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 3_600 + 120);
        assert_eq!(utc_date(t), "2000-02-29 01:02 UTC");
        assert_eq!(short(1_234_567.0), "1,234,567");
        assert_eq!(short(12.34), "12.3");
        assert_eq!(short(0.1234), "0.123");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(10.0), "10");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(1000.0), "1,000");
        assert_eq!(tick(0.1), "0.1");
        assert_eq!(
            meta(&json!({})).subtitle(),
            "machine not recorded | date not recorded"
        );
    }

    #[test]
    fn charts_reject_empty_and_bad_log_input() {
        let s = Scratch::new();
        let e = bar_chart(&s.0.join("a.svg"), &BarChart::default()).expect_err("empty");
        assert!(e.to_string().contains("nothing to plot"));
        let c = LineChart {
            title: "t".into(),
            series: vec![("a".into(), vec![(0.0, 1.0)])],
            log_x: true,
            ..Default::default()
        };
        let e = line_chart(&s.0.join("b.svg"), &c).expect_err("log of 0");
        assert!(e.to_string().contains("log axis"));
        let c = BarChart {
            categories: vec!["x".into()],
            series: vec![("s".into(), vec![])],
            ..Default::default()
        };
        assert!(bar_chart(&s.0.join("c.svg"), &c).is_err());
    }
}
