//! Learned flows and flow expiry: from the datapath threads to the tables.
//!
//! A `learn` action ([`oxvs_pipeline::learn`]) is translated once per
//! megaflow into the flow it learns; every packet that hits the megaflow
//! hands that flow to its thread's sink (at most every
//! [`Learned::RESEND_NS`] per megaflow). The datapath never changes the
//! tables itself: changing them builds a new table version, which is the
//! control side's work, so
//!
//! 1. the sink appends the learned flow to its thread's scratch list (no
//!    lock, no syscall, no allocation once the list has grown to a batch);
//! 2. after the batch, the thread moves the list into the switch's
//!    [`LearnQueue`]: one lock per batch that learned anything; a full queue
//!    drops the flow and counts it (`learn_dropped`), so memory stays
//!    bounded whatever the traffic; the keeper is woken only when the queue
//!    was empty;
//! 3. the **flow keeper** thread (`oxvs-flows`, [`FlowKeeper`]) takes the
//!    queue and applies it with [`Pipeline::learn`]: a new flow is added (one
//!    table version for everything taken at once, so the datapath's caches
//!    are flushed once), an identical one refreshed (its hard timeout starts
//!    again; no new version); and, at least every [`EXPIRE_INTERVAL`], it
//!    runs [`Pipeline::expire`], which removes every flow (learned or not)
//!    whose idle or hard timeout has passed, and with a `delete_learned`
//!    learner the flows it learned.
//!
//! The keeper's work is a pure function of the queue, the tables and the
//! time it is given ([`FlowKeeper::tick`]), so tests drive it with their
//! own clock; the thread gives it [`crate::engine::monotonic_ns`], the
//! clock the datapath credits flows with.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use oxvs_pipeline::learn::Learned;
use oxvs_pipeline::tables::Pipeline;

/// How often the keeper looks for expired flows (OVS: once a second).
pub const EXPIRE_INTERVAL: Duration = Duration::from_secs(1);

/// Default capacity of the learn queue.
pub const DEFAULT_LEARN_QUEUE: usize = 4096;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counters of learning and expiry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LearnStats {
    /// Learned flows added (new match and priority in their table).
    pub learned: u64,
    /// Learned flows that replaced a flow of the same match and priority
    /// with other actions, cookie or timeouts.
    pub learn_replaced: u64,
    /// Learned flows identical to an installed one: its hard timeout
    /// started again.
    pub learn_refreshed: u64,
    /// Learned flows dropped because the queue was full.
    pub learn_dropped: u64,
    /// Learned flows the tables refused.
    pub learn_failed: u64,
    /// Flows removed by their idle or hard timeout (and the flows a
    /// `delete_learned` learner took with it).
    pub flows_expired: u64,
}

/// The bounded queue of learned flows between the datapath threads and
/// the keeper.
#[derive(Debug)]
pub struct LearnQueue {
    queue: Mutex<Vec<Arc<Learned>>>,
    max: usize,
    ready: Condvar,
    stop: AtomicBool,
    learned: AtomicU64,
    replaced: AtomicU64,
    refreshed: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    expired: AtomicU64,
}

impl LearnQueue {
    /// A queue of at most `max` flows (at least 1).
    pub fn new(max: usize) -> LearnQueue {
        LearnQueue {
            queue: Mutex::new(Vec::new()),
            max: max.max(1),
            ready: Condvar::new(),
            stop: AtomicBool::new(false),
            learned: AtomicU64::new(0),
            replaced: AtomicU64::new(0),
            refreshed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Moves a batch's learned flows into the queue (one lock), dropping
    /// and counting what does not fit; `batch` is left empty (its capacity
    /// kept). Wakes the keeper if the queue was empty.
    pub fn push_batch(&self, batch: &mut Vec<Arc<Learned>>) {
        if batch.is_empty() {
            return;
        }
        let mut q = lock(&self.queue);
        let was_empty = q.is_empty();
        let room = self.max.saturating_sub(q.len());
        let take = room.min(batch.len());
        let lost = batch.len() - take;
        q.extend(batch.drain(..take));
        batch.clear();
        drop(q);
        if lost > 0 {
            self.dropped.fetch_add(lost as u64, Ordering::Relaxed);
        }
        if was_empty && take > 0 {
            self.ready.notify_one();
        }
    }

    /// Flows waiting to be applied.
    pub fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters.
    pub fn stats(&self) -> LearnStats {
        let r = Ordering::Relaxed;
        LearnStats {
            learned: self.learned.load(r),
            learn_replaced: self.replaced.load(r),
            learn_refreshed: self.refreshed.load(r),
            learn_dropped: self.dropped.load(r),
            learn_failed: self.failed.load(r),
            flows_expired: self.expired.load(r),
        }
    }

    /// Waits until flows are queued, the queue is stopped, or `timeout`.
    fn wait(&self, timeout: Duration) {
        let q = lock(&self.queue);
        if !q.is_empty() || self.stop.load(Ordering::Acquire) {
            return;
        }
        let _ = self
            .ready
            .wait_timeout_while(q, timeout, |q| {
                q.is_empty() && !self.stop.load(Ordering::Acquire)
            })
            .map_err(|e| e.into_inner());
    }

    /// Makes the keeper's thread return.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _q = lock(&self.queue);
        self.ready.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// The control side of learning and expiry (module doc).
#[derive(Debug)]
pub struct FlowKeeper {
    queue: Arc<LearnQueue>,
    pipeline: Arc<Pipeline>,
    /// Reused between rounds.
    taken: Vec<Arc<Learned>>,
    last_expire_ns: Option<u64>,
}

impl FlowKeeper {
    pub fn new(queue: Arc<LearnQueue>, pipeline: Arc<Pipeline>) -> FlowKeeper {
        FlowKeeper {
            queue,
            pipeline,
            taken: Vec::new(),
            last_expire_ns: None,
        }
    }

    /// One round at `now_ns`: applies every queued learned flow, and looks
    /// for expired flows if [`EXPIRE_INTERVAL`] has passed since it last
    /// did (or never did).
    pub fn tick(&mut self, now_ns: u64) {
        std::mem::swap(&mut *lock(&self.queue.queue), &mut self.taken);
        if !self.taken.is_empty() {
            let r = self
                .pipeline
                .learn(self.taken.iter().map(|l| &l.flow), now_ns);
            let q = &self.queue;
            let o = Ordering::Relaxed;
            q.learned.fetch_add(r.added as u64, o);
            q.replaced.fetch_add(r.replaced as u64, o);
            q.refreshed.fetch_add(r.refreshed as u64, o);
            q.failed.fetch_add(r.failed as u64, o);
            q.expired.fetch_add(r.deleted as u64, o);
            if r.failed > 0 {
                tracing::warn!(failed = r.failed, "learned flows refused by the tables");
            }
            self.taken.clear();
        }
        let interval = EXPIRE_INTERVAL.as_nanos() as u64;
        if self
            .last_expire_ns
            .is_none_or(|t| now_ns.saturating_sub(t) >= interval)
        {
            self.last_expire_ns = Some(now_ns);
            let gone = self.pipeline.expire(now_ns);
            if !gone.is_empty() {
                tracing::debug!(flows = gone.len(), "flows expired");
                self.queue
                    .expired
                    .fetch_add(gone.len() as u64, Ordering::Relaxed);
            }
        }
    }

    /// The keeper thread's loop: rounds until the queue is stopped, woken
    /// by queued flows, at least every [`EXPIRE_INTERVAL`].
    pub fn run(mut self, clock: impl Fn() -> u64) {
        while !self.queue.stopped() {
            self.queue.wait(EXPIRE_INTERVAL);
            if self.queue.stopped() {
                break;
            }
            self.tick(clock());
        }
    }
}

#[cfg(test)]
mod tests;
