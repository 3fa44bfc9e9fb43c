//! Output: the machine description, median/min/max summaries, the JSON
//! form of trials, and SVG plots (plotters, SVG backend only).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use serde_json::{json, Value};

use super::methods::Trial;
use super::setup::run;

/// CPU model, cores, kernel, and for each named interface its driver
/// (`ethtool -i`).
pub fn machine(ifaces: &[String]) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = crate::cni_bench::cpu_model(&cpuinfo);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .ok();
    let first_line = |args: &[&str]| {
        run(args).ok().and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
    };
    let nics: serde_json::Map<String, Value> = ifaces
        .iter()
        .map(|i| {
            let out = run(&["ethtool", "-i", i])
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let kv: serde_json::Map<String, Value> = out
                .lines()
                .filter_map(|l| l.split_once(": "))
                .filter(|(k, _)| ["driver", "version", "firmware-version", "bus-info"].contains(k))
                .map(|(k, v)| (k.to_owned(), Value::from(v.trim())))
                .collect();
            (i.clone(), Value::Object(kv))
        })
        .collect();
    json!({
        "cpu_model": model,
        "cores": cores,
        "kernel": kernel,
        "loadavg": std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.trim().to_owned()),
        "ovs": first_line(&["ovs-vswitchd", "--version"]),
        "nics": nics,
    })
}

/// (median, min, max) of `v`; None if empty.
pub fn median_min_max(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((med, v[0], v[n - 1]))
}

/// `{"median", "min", "max", "trials"}`.
pub fn summary(v: &[f64]) -> Value {
    match median_min_max(v) {
        Some((m, lo, hi)) => json!({"median": m, "min": lo, "max": hi, "trials": v}),
        None => Value::Null,
    }
}

/// `median [min-max]` scaled by `1/scale`.
pub fn fmt3(v: &[f64], scale: f64, prec: usize) -> String {
    match median_min_max(v) {
        Some((m, lo, hi)) => format!(
            "{:.p$} [{:.p$}-{:.p$}]",
            m / scale,
            lo / scale,
            hi / scale,
            p = prec
        ),
        None => "-".into(),
    }
}

/// Latency quantiles in ns.
pub const QUANTILES: [(&str, f64); 5] = [
    ("p50", 0.5),
    ("p90", 0.9),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("max", 1.0),
];

/// One trial as JSON.
pub fn trial_json(t: &Trial) -> Value {
    let lat: serde_json::Map<String, Value> = QUANTILES
        .iter()
        .map(|(k, q)| ((*k).to_owned(), json!(t.latency.quantile(*q))))
        .collect();
    json!({
        "target_pps": t.rate_pps,
        "secs": t.gen.secs,
        "sent": t.gen.sent,
        "received": t.received,
        "lost": t.lost(),
        "loss_fraction": t.loss_fraction(),
        "reordered": t.reordered,
        "duplicates": t.duplicates,
        "foreign": t.foreign,
        "sent_pps": t.gen.pps(),
        "delivered_pps": t.delivered_pps(),
        "gen_backpressure_batches": t.gen.backpressure,
        "sink_ring_drops": t.sink.ring_drops,
        "switch_drops": t.switch_drops,
        "machine_busy_fraction": t.machine.map(|m| m.busy),
        "machine_steal_fraction": t.machine.map(|m| m.steal),
        "switch_cpu_ns": t.cpu_ns,
        "switch_cpu_ns_per_pkt": t.cpu_ns_per_pkt(),
        "latency_ns": lat,
        "gen_xdp_mode": t.gen.mode,
        "sink_xdp_mode": t.sink.mode,
    })
}

/// A line plot: one series per (name, points), log-x when `log_x`.
pub fn line_plot(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    log_x: bool,
) -> Result<()> {
    let pts = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for (x, y) in pts {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y1 = y1.max(*y);
    }
    if x0 > x1 {
        return Err(anyhow!("nothing to plot for {title}"));
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    let err = |e: &dyn std::fmt::Debug| anyhow!("plot {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut b = ChartBuilder::on(&root);
    b.caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70);
    let colors = [&RED, &BLUE, &GREEN, &MAGENTA, &CYAN, &BLACK];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(|e| err(&e))?;
            for (i, (name, p)) in series.iter().enumerate() {
                let c = colors[i % colors.len()];
                chart
                    .draw_series(LineSeries::new(p.iter().copied(), c))
                    .map_err(|e| err(&e))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    if log_x {
        draw!(b
            .build_cartesian_2d((x0.max(1e-9)..x1).log_scale(), 0.0..y1)
            .map_err(|e| err(&e))?);
    } else {
        draw!(b.build_cartesian_2d(x0..x1, 0.0..y1).map_err(|e| err(&e))?);
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
