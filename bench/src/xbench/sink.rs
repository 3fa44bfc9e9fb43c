//! The sink: receives on an AF_XDP socket, finds each frame's trailer and
//! accounts for it ([`Accounting`]): received, duplicates, reordered,
//! frames without the magic, per-flow counts, and latency (send timestamp
//! to the receive batch's clock reading) into a [`Histogram`].
//!
//! ## Accounting (per flow)
//!
//! Each flow keeps the highest sequence seen and a 64-bit window of which
//! of the 64 sequences up to it arrived. A sequence above the highest
//! moves the window; one inside the window is a duplicate if its bit is
//! set, else a reordered arrival (it is lower than the highest seen); one
//! below the window is counted reordered (too old to tell a duplicate).
//! `received` counts distinct frames (duplicates excluded), so with the
//! generator's count, lost = sent - received.
//!
//! No allocation per packet: the flow table is allocated once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use oxvs_switch::afxdp::{poll_readable, XskPort};
use xsk_rs::FrameDesc;

use super::hist::Histogram;
use super::{find_trailer, now_ns, Trailer};

#[derive(Clone, Copy, Debug, Default)]
struct FlowState {
    /// Highest sequence seen + 1 (0: nothing yet).
    next: u64,
    /// Bit `d` set: sequence `next - 1 - d` arrived.
    window: u64,
    received: u64,
}

/// Per-flow and total counts (see the module doc).
#[derive(Clone, Debug)]
pub struct Accounting {
    flows: Vec<FlowState>,
    pub received: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Frames without our trailer (or with a flow index out of range).
    pub foreign: u64,
    pub bytes: u64,
    pub latency: Histogram,
}

impl Accounting {
    /// Accounting for flows `0..flows`.
    pub fn new(flows: u32) -> Accounting {
        Accounting {
            flows: vec![FlowState::default(); flows as usize],
            received: 0,
            duplicates: 0,
            reordered: 0,
            foreign: 0,
            bytes: 0,
            latency: Histogram::new(),
        }
    }

    /// Accounts one frame's trailer, received at `now_ns`.
    #[inline]
    pub fn record(&mut self, t: &Trailer, now_ns: u64) {
        let Some(st) = self.flows.get_mut(t.flow as usize) else {
            self.foreign += 1;
            return;
        };
        let seq = u64::from(t.seq);
        if st.next == 0 || seq >= st.next {
            let shift = if st.next == 0 { 64 } else { seq + 1 - st.next };
            st.window = if shift >= 64 { 0 } else { st.window << shift };
            st.window |= 1;
            st.next = seq + 1;
        } else {
            let d = st.next - 1 - seq;
            if d < 64 {
                let bit = 1u64 << d;
                if st.window & bit != 0 {
                    self.duplicates += 1;
                    return;
                }
                st.window |= bit;
            }
            self.reordered += 1;
        }
        st.received += 1;
        self.received += 1;
        self.latency.record(now_ns.saturating_sub(t.ts_ns));
    }

    /// Distinct frames received of flow `i`.
    pub fn received_for_flow(&self, i: u32) -> u64 {
        self.flows.get(i as usize).map_or(0, |f| f.received)
    }

    /// Number of flows accounted.
    pub fn flows(&self) -> u32 {
        self.flows.len() as u32
    }
}

/// What a sink run saw besides the accounting.
#[derive(Clone, Debug, Default)]
pub struct SinkStats {
    /// AF_XDP mode of the socket.
    pub mode: String,
    /// Frames the kernel dropped before our ring (ring full, no fill frames).
    pub ring_drops: u64,
}

/// Frames per receive batch.
pub const RX_BATCH: usize = 64;

/// Receives on `ports` (one socket per queue of the interface) into
/// `acct` until `stop` is set and then nothing arrived for `drain` (or
/// `2 * drain` passed since `stop`).
pub fn run(
    ports: &mut [XskPort],
    acct: &mut Accounting,
    stop: &AtomicBool,
    drain: Duration,
) -> SinkStats {
    let mems: Vec<_> = ports.iter().map(XskPort::mem).collect();
    let mut descs = vec![FrameDesc::default(); RX_BATCH];
    let mut fds: Vec<libc::pollfd> = ports
        .iter()
        .map(|p| libc::pollfd {
            fd: p.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut stop_seen: Option<u64> = None;
    let mut last_rx = now_ns();
    let drain_ns = drain.as_nanos() as u64;
    // Drops before this run are not ours.
    for port in ports.iter_mut() {
        let _ = port.take_counters(true);
    }
    loop {
        let mut got = 0;
        for (port, mem) in ports.iter_mut().zip(&mems) {
            let n = port.recv(&mut descs);
            if n == 0 {
                if port.fill_needs_wakeup() {
                    port.wake_fill();
                }
                continue;
            }
            got += n;
            let now = now_ns();
            for d in descs.iter_mut().take(n) {
                let Some(p) = mem.packet(d) else {
                    acct.foreign += 1;
                    continue;
                };
                let data = p.data();
                acct.bytes += data.len() as u64;
                match find_trailer(data) {
                    Some(t) => acct.record(&t, now),
                    None => acct.foreign += 1,
                }
            }
            port.recycle(&descs[..n]);
            if port.fill_needs_wakeup() {
                port.wake_fill();
            }
        }
        let now = now_ns();
        if got > 0 {
            last_rx = now;
            continue;
        }
        if stop.load(Ordering::Relaxed) {
            let s = *stop_seen.get_or_insert(now);
            if now.saturating_sub(last_rx.max(s)) >= drain_ns
                || now.saturating_sub(s) >= 2 * drain_ns
            {
                break;
            }
        }
        let _ = poll_readable(&mut fds, 10);
    }
    SinkStats {
        mode: ports
            .first()
            .map(|p| p.mode().name().to_owned())
            .unwrap_or_default(),
        ring_drops: ports
            .iter_mut()
            .map(|p| p.take_counters(true).rx_dropped)
            .sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(a: &mut Accounting, flow: u32, seqs: &[u32]) {
        for &seq in seqs {
            a.record(
                &Trailer {
                    flow,
                    seq,
                    ts_ns: 100,
                },
                1100,
            );
        }
    }

    #[test]
    fn in_order_no_loss() {
        let mut a = Accounting::new(2);
        feed(&mut a, 0, &[0, 1, 2, 3]);
        feed(&mut a, 1, &[0, 1]);
        assert_eq!((a.received, a.reordered, a.duplicates), (6, 0, 0));
        assert_eq!(a.received_for_flow(0), 4);
        assert_eq!(a.latency.quantile(0.5), Some(1000));
    }

    #[test]
    fn gaps_are_loss_not_reordering() {
        let mut a = Accounting::new(1);
        feed(&mut a, 0, &[0, 2, 5, 6]);
        assert_eq!((a.received, a.reordered, a.duplicates), (4, 0, 0));
    }

    #[test]
    fn reordering_and_duplicates() {
        let mut a = Accounting::new(1);
        // 3 and 1 arrive late; 2 twice; 4 twice.
        feed(&mut a, 0, &[0, 2, 4, 3, 1, 2, 4, 5]);
        assert_eq!(a.received, 6);
        assert_eq!(a.reordered, 2);
        assert_eq!(a.duplicates, 2);
    }

    #[test]
    fn old_and_far_jumps() {
        let mut a = Accounting::new(1);
        feed(&mut a, 0, &[0, 1000, 5, 1000, 1064, 937]);
        // 5: below the window -> reordered; 1000 again -> dup;
        // 1064 moves the window by 64 (1000 falls out); 937 old -> reordered.
        assert_eq!((a.received, a.reordered, a.duplicates), (5, 2, 1));
        feed(&mut a, 0, &[u32::MAX, 7]);
        assert_eq!(a.received, 7);
    }

    #[test]
    fn foreign_flow_index() {
        let mut a = Accounting::new(1);
        feed(&mut a, 3, &[0]);
        assert_eq!((a.received, a.foreign), (0, 1));
    }
}
