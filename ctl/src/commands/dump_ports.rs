//! `oxvsctl dump-ports`: port counters, like `ovs-ofctl dump-ports`:
//! `  port  1: rx pkts=N, bytes=N, drop=N, errs=N` then a `tx` line, then,
//! for a port that dropped anything, a line with the drops by reason; a
//! port serving several receive queues adds a line per queue (its thread
//! and its receive counters).

use clap::Args;
use oxvs_api::{DumpPortsResult, PortInfo, Request};

use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DumpPorts {}

impl DumpPorts {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::DumpPorts)?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: DumpPortsResult = serde_json::from_value(v)?;
        emit(&format(&r.ports))
    }
}

/// The text form.
pub fn format(ports: &[PortInfo]) -> String {
    let mut s = format!("OFPST_PORT reply: {} ports\n", ports.len());
    for p in ports {
        let st = &p.stats;
        s.push_str(&format!(
            "  port {:>2}: rx pkts={}, bytes={}, drop={}, errs={}\n           tx pkts={}, bytes={}, drop={}, errs={}\n",
            p.ofport,
            st.rx_packets,
            st.rx_bytes,
            st.rx_dropped,
            st.rx_errors,
            st.tx_packets,
            st.tx_bytes,
            st.tx_dropped,
            st.tx_errors
        ));
        // `oxvs-switchd --tx-move` only; the lines above keep ovs-ofctl's
        // layout.
        if st.tx_moved > 0 {
            s.push_str(&format!(
                "           tx moved without a copy={}\n",
                st.tx_moved
            ));
        }
        if st.tx_checksum_requests > 0 {
            s.push_str(&format!(
                "           tx checksums finished by the kernel={}\n",
                st.tx_checksum_requests
            ));
        }
        let reasons = [
            st.rx_ring_full,
            st.rx_fill_empty,
            st.rx_other,
            st.tx_no_frame,
            st.tx_ring_full,
        ];
        if reasons.iter().any(|&n| n > 0) {
            s.push_str(&format!(
                "           drops: rx ring full={}, fill ring empty={}, other={}; tx no frame={}, ring full={}\n",
                st.rx_ring_full, st.rx_fill_empty, st.rx_other, st.tx_no_frame, st.tx_ring_full
            ));
        }
        // Where frames were lost to an empty fill ring: how large the
        // switch keeps that ring now (below the 4096-entry ring, the UMEM
        // is the limit: `--umem-frames`), and which UMEM that is where a
        // thread has several.
        if st.rx_fill_empty > 0 && st.rx_fill_target > 0 {
            s.push_str(&format!(
                "           fill ring: {} frames now, topped up to {}{}\n",
                st.rx_fill_frames,
                st.rx_fill_target,
                umem_note(p.umem)
            ));
        }
        for q in &p.queues {
            s.push_str(&format!(
                "           queue {} (thread {}{}): rx pkts={}, bytes={}, drop={}; tx pkts={}\n",
                q.queue,
                q.thread,
                q.umem.map(|u| format!(", UMEM {u}")).unwrap_or_default(),
                q.stats.rx_packets,
                q.stats.rx_bytes,
                q.stats.rx_dropped,
                q.stats.tx_packets
            ));
        }
    }
    s
}

/// `, on UMEM N of its thread` where the port's thread has several.
fn umem_note(umem: Option<u32>) -> String {
    umem.map(|u| format!(", on UMEM {u} of its thread"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_api::PortStats;

    #[test]
    fn ovs_ofctl_layout() {
        let p = PortInfo {
            name: "p1".into(),
            ofport: 1,
            kind: "afxdp".into(),
            mode: "native/copy".into(),
            state: "up".into(),
            local: None,
            stats: PortStats {
                rx_packets: 5,
                tx_bytes: 7,
                ..PortStats::default()
            },
            queues: Vec::new(),
            umem: None,
        };
        assert_eq!(
            format(std::slice::from_ref(&p)),
            "OFPST_PORT reply: 1 ports\n  port  1: rx pkts=5, bytes=0, drop=0, errs=0\n           tx pkts=0, bytes=7, drop=0, errs=0\n"
        );
        // Moved packets (`--tx-move`) on a line of their own.
        let mut moved = p.clone();
        moved.stats.tx_moved = 3;
        assert!(format(&[moved]).ends_with("errs=0\n           tx moved without a copy=3\n"));
        // Checksums the kernel finished, likewise.
        let mut finished = p.clone();
        finished.stats.tx_checksum_requests = 4;
        assert!(format(&[finished])
            .ends_with("errs=0\n           tx checksums finished by the kernel=4\n"));
        // The fill ring's size only where frames were lost to it empty.
        let mut filled = p;
        filled.stats.rx_fill_frames = 390;
        filled.stats.rx_fill_target = 396;
        assert!(!format(std::slice::from_ref(&filled)).contains("fill ring:"));
        filled.stats.rx_fill_empty = 12;
        filled.stats.rx_dropped = 12;
        assert!(format(std::slice::from_ref(&filled)).ends_with(
            "drops: rx ring full=0, fill ring empty=12, other=0; tx no frame=0, ring full=0\n           fill ring: 390 frames now, topped up to 396\n"
        ));
        // Which UMEM, where the thread has several.
        filled.umem = Some(1);
        assert!(format(&[filled])
            .ends_with("fill ring: 390 frames now, topped up to 396, on UMEM 1 of its thread\n"));
    }

    #[test]
    fn a_line_per_queue() {
        let q = |queue, rx_packets| oxvs_api::QueueInfo {
            queue,
            thread: queue as usize % 2,
            stats: PortStats {
                rx_packets,
                ..PortStats::default()
            },
            umem: (queue == 1).then_some(0),
        };
        let p = PortInfo {
            name: "eth0".into(),
            ofport: 3,
            kind: "afxdp".into(),
            mode: "native/copy".into(),
            state: "up".into(),
            local: None,
            stats: PortStats {
                rx_packets: 9,
                ..PortStats::default()
            },
            queues: vec![q(0, 4), q(1, 5)],
            umem: None,
        };
        let out = format(&[p]);
        assert!(
            out.contains("           queue 0 (thread 0): rx pkts=4, bytes=0, drop=0; tx pkts=0\n"),
            "{out}"
        );
        assert!(
            out.ends_with(
                "           queue 1 (thread 1, UMEM 0): rx pkts=5, bytes=0, drop=0; tx pkts=0\n"
            ),
            "{out}"
        );
    }
}
