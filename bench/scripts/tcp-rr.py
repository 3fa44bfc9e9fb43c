#!/usr/bin/env python3
"""TCP request/response probes for scripts/bench-services.sh (stdlib only).

  tcp-rr.py server --port P [--pidfile F]
      echo server: every byte read is written back; one thread per connection.
  tcp-rr.py rr --host H --port P [--count 2000] [--warmup 200]
      one connection (TCP_NODELAY), COUNT round trips of 1 byte;
      JSON: p50/p90/p99/mean/min/max in microseconds.
  tcp-rr.py crr --host H --port P [--count 500]
      COUNT new connections, one after the other: connect, 1-byte round trip,
      close. JSON: connections/s, connect() and whole-transaction latency.
  tcp-rr.py report --dir D [--json OUT] [--meta M]
      reads the per-trial result files the bench script wrote and prints the
      markdown table (median [min-max] over trials); --json writes all trials.

The latency includes Python's own cost per round trip (a few microseconds on
each side); the bench measures the same thing in the client pod's loopback as
a floor.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time


def pct(sorted_vals, p):
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def summary_us(ns_list):
    v = sorted(x / 1000.0 for x in ns_list)
    return {
        "n": len(v),
        "p50": round(pct(v, 50), 1),
        "p90": round(pct(v, 90), 1),
        "p99": round(pct(v, 99), 1),
        "mean": round(statistics.fmean(v), 1),
        "min": round(v[0], 1),
        "max": round(v[-1], 1),
    }


# --------------------------------------------------------------------------
# server


def cmd_server(a):
    # One thread, epoll: no thread start per connection, no GIL hand-offs,
    # so a new connection costs the server one accept() and a register.
    import selectors
    sel = selectors.DefaultSelector()
    if a.dual:
        # One socket for both families (IPv4 clients as mapped addresses).
        ls = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        ls.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    else:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("::" if a.dual else "0.0.0.0", a.port))
    ls.listen(1024)
    ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ, None)
    if a.pidfile:
        with open(a.pidfile, "w") as f:
            f.write(f"{os.getpid()}\n")
    while True:
        for key, _ in sel.select():
            if key.data is None:
                try:
                    c, _ = ls.accept()
                except OSError:
                    continue
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ, True)
                continue
            c = key.fileobj
            try:
                b = c.recv(4096)
                if b:
                    c.sendall(b)  # 1 byte: never blocks
                    continue
            except OSError:
                pass
            sel.unregister(c)
            c.close()


# --------------------------------------------------------------------------
# clients


def recv1(s):
    b = s.recv(1)
    if not b:
        raise ConnectionError("server closed the connection")
    return b


def cmd_rr(a):
    s = socket.create_connection((a.host, a.port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x"
    now = time.perf_counter_ns
    for _ in range(a.warmup):
        s.sendall(msg)
        recv1(s)
    lat = []
    t0 = now()
    for _ in range(a.count):
        t = now()
        s.sendall(msg)
        recv1(s)
        lat.append(now() - t)
    wall = now() - t0
    s.close()
    out = {"kind": "rr", "host": a.host, "port": a.port, "round_trips": a.count,
           "per_s": round(a.count / (wall / 1e9), 1), "lat_us": summary_us(lat)}
    print(json.dumps(out))


def cmd_crr(a):
    now = time.perf_counter_ns
    conn, txn = [], []
    errors = 0
    t0 = now()
    for _ in range(a.count):
        t = now()
        try:
            s = socket.socket(socket.AF_INET6 if ":" in a.host else socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(5)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.connect((a.host, a.port))
            tc = now()
            s.sendall(b"x")
            recv1(s)
            s.close()
        except OSError:
            errors += 1
            continue
        te = now()
        conn.append(tc - t)
        txn.append(te - t)
    wall = now() - t0
    out = {"kind": "crr", "host": a.host, "port": a.port, "connections": len(txn),
           "errors": errors, "per_s": round(len(txn) / (wall / 1e9), 1),
           "connect_us": summary_us(conn) if conn else None,
           "txn_us": summary_us(txn) if txn else None}
    print(json.dumps(out))
    if errors:
        sys.exit(1)


# --------------------------------------------------------------------------
# report


def med_range(vals, fmt):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{fmt(statistics.median(vals))} [{fmt(min(vals))}–{fmt(max(vals))}]"


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def iperf_fields(j):
    if not j or "end" not in j or "error" in j:
        return None
    end = j["end"]
    sent, recv = end.get("sum_sent", {}), end.get("sum_received", {})
    cpu = end.get("cpu_utilization_percent", {})
    return {
        "sender_bits_per_second": sent.get("bits_per_second"),
        "receiver_bits_per_second": recv.get("bits_per_second"),
        "retransmits": sent.get("retransmits"),
        "bytes": recv.get("bytes"),
        "seconds": recv.get("seconds"),
        "cpu_client_pct": cpu.get("host_total"),
        "cpu_server_pct": cpu.get("remote_total"),
        "max_snd_cwnd": max((s["sender"].get("max_snd_cwnd", 0)
                             for s in end.get("streams", []) if "sender" in s), default=None),
        "mean_rtt_us": max((s["sender"].get("mean_rtt", 0)
                            for s in end.get("streams", []) if "sender" in s), default=None),
    }


def cmd_report(a):
    meta = load_json(a.meta) if a.meta else {}
    paths = meta.get("paths", [])
    trials = meta.get("trials", 0)
    rows, all_trials = [], []
    for p in paths:
        pid = p["id"]
        per = []
        for t in range(1, trials + 1):
            base = os.path.join(a.dir, f"{pid}.t{t}")
            ip = iperf_fields(load_json(base + ".iperf.json"))
            rr = load_json(base + ".rr.json")
            crr = load_json(base + ".crr.json")
            sw = load_json(base + ".switchd.json")
            rec = {"path": pid, "trial": t, "iperf": ip, "rr": rr, "crr": crr,
                   "counters": sw}
            per.append(rec)
            all_trials.append(rec)
        g = lambda f: [f(r) for r in per]
        gbps = g(lambda r: r["iperf"]["receiver_bits_per_second"] / 1e9 if r["iperf"] else None)
        rtx = g(lambda r: r["iperf"]["retransmits"] if r["iperf"] else None)
        drops = g(lambda r: r["counters"].get("switch_port_drops") if r["counters"] else None)
        sw = g(lambda r: r["counters"]["switchd_us_per_mib"] if r["counters"] else None)
        busy = g(lambda r: r["counters"]["machine_busy_us_per_mib"] if r["counters"] else None)
        rr50 = g(lambda r: r["rr"]["lat_us"]["p50"] if r["rr"] else None)
        rr99 = g(lambda r: r["rr"]["lat_us"]["p99"] if r["rr"] else None)
        cps = g(lambda r: r["crr"]["per_s"] if r["crr"] else None)
        c50 = g(lambda r: r["crr"]["connect_us"]["p50"] if r["crr"] and r["crr"]["connect_us"] else None)
        c99 = g(lambda r: r["crr"]["connect_us"]["p99"] if r["crr"] and r["crr"]["connect_us"] else None)
        rows.append((p["label"], gbps, rtx, sw, busy, rr50, rr99, cps, c50, c99, drops))

    f2 = lambda v: f"{v:.2f}"
    f0 = lambda v: f"{v:.0f}"
    hdr = ("| path | TCP Gbit/s | retransmits | switch drops | switchd CPU µs/MiB | all CPU µs/MiB "
           "| RR p50 µs | RR p99 µs | new conns/s | connect p50 µs | connect p99 µs |")
    lines = [hdr, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, gbps, rtx, sw, busy, rr50, rr99, cps, c50, c99, drops in rows:
        lines.append(
            f"| {label} | {med_range(gbps, f2)} | {med_range(rtx, f0)} | {med_range(drops, f0)} | "
            f"{med_range(sw, f0)} | {med_range(busy, f0)} | "
            f"{med_range(rr50, f0)} | {med_range(rr99, f0)} | {med_range(cps, f0)} | "
            f"{med_range(c50, f0)} | {med_range(c99, f0)} |")
    table = "\n".join(lines)
    print(table)

    # ClusterIP against pod IP, same locality, medians.
    by = {r[0]: r for r in rows}
    notes = []
    for pod_l, svc_l in meta.get("pairs", []):
        if pod_l in by and svc_l in by:
            def m(i, lab):
                v = [x for x in by[lab][i] if x is not None]
                return statistics.median(v) if v else None
            tp, ts = m(1, pod_l), m(1, svc_l)
            wp, ws = m(3, pod_l), m(3, svc_l)
            lp, ls = m(5, pod_l), m(5, svc_l)
            cp, cs = m(7, pod_l), m(7, svc_l)
            kp, ks = m(8, pod_l), m(8, svc_l)
            parts = []
            if tp and ts:
                parts.append(f"throughput x{ts / tp:.2f}")
            if wp and ws:
                parts.append(f"switchd CPU/MiB x{ws / wp:.2f}")
            if lp and ls:
                parts.append(f"RR p50 {ls - lp:+.0f} µs")
            if cp and cs:
                parts.append(f"new conns/s x{cs / cp:.2f}")
            if kp and ks:
                parts.append(f"connect p50 {ks - kp:+.0f} µs")
            notes.append(f"- {svc_l} vs {pod_l}: " + ", ".join(parts))
    if notes:
        print()
        print("\n".join(notes))

    if a.json:
        doc = dict(meta)
        doc["table_markdown"] = table
        doc["results"] = all_trials
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"\nwrote {a.json}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--pidfile")
    s.add_argument("--dual", action="store_true", help="serve IPv6 and IPv4 on one socket")
    for name in ("rr", "crr"):
        c = sub.add_parser(name)
        c.add_argument("--host", required=True)
        c.add_argument("--port", type=int, required=True)
        c.add_argument("--count", type=int, default=2000 if name == "rr" else 500)
        if name == "rr":
            c.add_argument("--warmup", type=int, default=200)
    r = sub.add_parser("report")
    r.add_argument("--dir", required=True)
    r.add_argument("--meta")
    r.add_argument("--json")
    a = ap.parse_args()
    {"server": cmd_server, "rr": cmd_rr, "crr": cmd_crr, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
