//! The switch's `/metrics` endpoint under its connection cap and idle
//! timeout: 503 + Retry-After when full, idle clients closed, and the
//! listeners' counters exported.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxvs_api::listen::{Limits, ListenStats};
use oxvs_api::metrics as prom;
use oxvs_pipeline::tables::Pipeline;
use oxvs_switch::engine::{Switch, SwitchConfig};
use oxvs_switch::metrics::MetricsServer;

fn get(addr: std::net::SocketAddr) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn full_endpoint_answers_503_and_idle_clients_are_closed() {
    let switch =
        Arc::new(Switch::start(SwitchConfig::default(), Arc::new(Pipeline::new())).unwrap());
    let control = Arc::new(ListenStats::default());
    let limits = Limits::new("test", 1, Duration::from_millis(400)).unwrap();
    let srv = MetricsServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        switch.clone(),
        limits,
        vec![("control", control.clone())],
    )
    .unwrap();
    let addr = srv.local_addr();
    assert!(get(addr).starts_with("HTTP/1.1 200"));
    // (its place is freed just after the client sees the end of the answer)
    std::thread::sleep(Duration::from_millis(50));

    // An idle client holds the only place...
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // ...so a scrape meanwhile is told to come back.
    let busy = get(addr);
    assert!(
        busy.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{busy}"
    );
    assert!(busy.contains("\r\nRetry-After: 1\r\n"), "{busy}");
    // The idle one is closed (408) after the timeout, not before.
    let t0 = Instant::now();
    let mut out = String::new();
    idle.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    std::thread::sleep(Duration::from_millis(50));
    let ok = get(addr);
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let body = ok
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let p = prom::parse(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    let v = |name: &str, socket: &str| p.value(name, &[("socket", socket)]);
    assert_eq!(v("oxvs_listener_busy_total", "metrics"), Some(1.0));
    assert_eq!(v("oxvs_listener_idle_closed_total", "metrics"), Some(1.0));
    assert_eq!(
        v("oxvs_listener_connections", "metrics"),
        Some(1.0),
        "this scrape"
    );
    assert_eq!(v("oxvs_listener_busy_total", "control"), Some(0.0));
    drop(srv);
    switch.shutdown();
}
