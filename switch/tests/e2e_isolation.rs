//! End to end, isolation: a pod gets exactly the traffic the flows allow.
//!
//! Flows (`examples/switch-isolation.flows`) allow only ARP and TCP
//! pod1 -> pod2:80 (with its replies). A listener in pod2 on TCP 80, TCP 81
//! and UDP 81 reports every connection and datagram it gets: only the
//! port-80 exchange may show up; UDP, TCP to 81, ICMP, and TCP from pod2 to
//! pod1:80 (wrong direction) must not arrive.

mod common;

use std::time::{Duration, Instant};

use common::*;

const IP1: &str = "10.10.0.1";
const IP2: &str = "10.10.0.2";

/// Listens on the TCP and UDP ports given (`tcp:80 tcp:81 udp:81`) for
/// SECS seconds; prints "tcp:PORT:DATA" / "udp:PORT:DATA" for what arrives
/// and answers TCP with "ok:" + data.
const LISTENER: &str = r#"
import select, socket, sys, time
secs = float(sys.argv[1]); socks = {}
for spec in sys.argv[2:]:
    proto, port = spec.split(":"); port = int(port)
    if proto == "tcp":
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port)); s.listen(8)
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    socks[s] = (proto, port)
print("listening", flush=True)
end = time.time() + secs
while time.time() < end:
    r, _, _ = select.select(list(socks), [], [], 0.1)
    for s in r:
        proto, port = socks[s]
        if proto == "tcp":
            c, _ = s.accept(); c.settimeout(2)
            try: data = c.recv(100)
            except OSError: data = b"<nothing>"
            print(f"tcp:{port}:{data.decode()}", flush=True)
            try: c.sendall(b"ok:" + data)
            except OSError: pass
            c.close()
        else:
            data, _ = s.recvfrom(100)
            print(f"udp:{port}:{data.decode()}", flush=True)
"#;

/// `tcp ADDR PORT MSG TIMEOUT` or `udp ADDR PORT MSG COUNT`: prints the
/// answer (TCP) or "sent"; exits 1 on connect/read failure.
const CLIENT: &str = r#"
import socket, sys, time
proto, addr, port, msg, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode(), float(sys.argv[5])
if proto == "tcp":
    try:
        c = socket.create_connection((addr, port), timeout=n); c.settimeout(n)
        c.sendall(msg); print(c.recv(100).decode(), flush=True)
    except OSError as e:
        print("failed:", e, flush=True); sys.exit(1)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(int(n)):
        s.sendto(msg, (addr, port)); time.sleep(0.05)
    print("sent", flush=True)
"#;

fn start_listener(pod: &Netns, secs: &str, specs: &[&str]) -> Bg {
    let mut cmd = vec!["python3", "-c", LISTENER, secs];
    cmd.extend_from_slice(specs);
    let mut l = pod.spawn(&cmd);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !l.stdout_text().contains("listening") {
        assert!(
            Instant::now() < deadline && l.running(),
            "listener did not start: {}",
            l.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    l
}

fn client(pod: &Netns, args: &[&str]) -> (bool, String) {
    let mut cmd = vec!["python3", "-c", CLIENT];
    cmd.extend_from_slice(args);
    let out = pod.exec(&cmd);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn e2e_isolation() {
    skip_unless_capable!();
    let node = Netns::new("node");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let sw = Switchd::start(&node);
    add_pod(
        &sw,
        &node,
        &pod1,
        "p1",
        1,
        "10.10.0.1/24",
        "02:00:0a:0a:00:01",
        1500,
    );
    add_pod(
        &sw,
        &node,
        &pod2,
        "p2",
        2,
        "10.10.0.2/24",
        "02:00:0a:0a:00:02",
        1500,
    );
    sw.add_flows(&example("switch-isolation.flows"));

    let mut l2 = start_listener(&pod2, "12", &["tcp:80", "tcp:81", "udp:81", "udp:80"]);
    let mut l1 = start_listener(&pod1, "12", &["tcp:80"]);

    // Allowed: pod1 -> pod2:80 (first packets also resolve ARP).
    let (ok, out) = client(&pod1, &["tcp", IP2, "80", "allowed", "5"]);
    assert!(
        ok && out.contains("ok:allowed"),
        "TCP pod1 -> pod2:80 (allowed) failed: {out}"
    );

    // Not allowed: TCP to 81, UDP to 81 and 80, ICMP, TCP pod2 -> pod1:80.
    let (ok, out) = client(&pod1, &["tcp", IP2, "81", "tcp81", "2"]);
    assert!(!ok, "TCP pod1 -> pod2:81 connected: {out}");
    assert!(
        out.contains("timed out"),
        "TCP pod1 -> pod2:81 should time out (SYN dropped), got: {out}"
    );
    let (ok, out) = client(&pod1, &["udp", IP2, "81", "udp81", "5"]);
    assert!(ok, "UDP client: {out}");
    let (ok, out) = client(&pod1, &["udp", IP2, "80", "udp80", "5"]);
    assert!(ok, "UDP client: {out}");
    let p = ping(&pod1, IP2, 2, "0.2", &[]);
    assert_eq!(p.received, 0, "ICMP pod1 -> pod2 passed:\n{}", p.output);
    let (ok, out) = client(&pod2, &["tcp", IP1, "80", "reverse", "2"]);
    assert!(
        !ok,
        "TCP pod2 -> pod1:80 (wrong direction) connected: {out}"
    );

    // Still allowed afterwards.
    let (ok, out) = client(&pod1, &["tcp", IP2, "80", "again", "5"]);
    assert!(
        ok && out.contains("ok:again"),
        "TCP pod1 -> pod2:80 failed later: {out}"
    );

    let (_, got2, err2) = l2.wait(Duration::from_secs(15));
    let (_, got1, err1) = l1.wait(Duration::from_secs(15));
    let events2: Vec<&str> = got2.lines().filter(|l| *l != "listening").collect();
    assert_eq!(
        events2,
        vec!["tcp:80:allowed", "tcp:80:again"],
        "pod2 received other traffic than the flows allow (stderr {err2})"
    );
    let events1: Vec<&str> = got1.lines().filter(|l| *l != "listening").collect();
    assert!(
        events1.is_empty(),
        "pod1 received traffic the flows do not allow: {events1:?} (stderr {err1})"
    );
}
