//! AF_XDP ports: one UMEM per datapath thread, its frame pool, and the
//! sockets (one per port) that share it.
//!
//! This is the only module of the workspace allowed `unsafe`: it talks to
//! the AF_XDP rings and the UMEM through `xsk-rs`, whose ring and frame
//! accessors are `unsafe` because their soundness depends on who owns each
//! frame. The ownership discipline that makes them sound lives here:
//!
//! ## Frame ownership (the invariant every `SAFETY:` comment relies on)
//!
//! Every UMEM frame (chunk) is, at any time, in exactly one of these states,
//! recorded in [`Umem::owner`]:
//!
//! - **free**: its descriptor is in the pool's free list ([`Umem::free`]);
//! - **user**: its descriptor is held by the datapath thread (an RX batch
//!   being processed, a frame being written for TX);
//! - **kernel (port k)**: it was produced on port `k`'s fill ring or TX ring
//!   and has not come back through that port's RX or completion ring.
//!
//! Only frames in the *user* state are read or written, and only through an
//! exclusive borrow of their descriptor, so no two slices of one frame exist
//! and the kernel never writes a frame we read. When a port is deleted
//! ([`Umem::reclaim`]), its socket (and so its rings) is gone, so every frame
//! still marked *kernel (port k)* is returned to the pool.
//!
//! A frame's memory is the whole chunk (`frame_size` bytes, a power of two):
//! packet data starts `XDP_PACKET_HEADROOM` (256) bytes in, so the datapath
//! can push headers (VLAN tags) in place in front of a received packet.
//!
//! ## Modes
//!
//! [`XskPort::open`] attaches the XDP program in native (driver) mode first
//! and falls back to generic (skb) mode with a warning, unless a mode is
//! forced; for each it tries zero-copy and then copy. `XDP_USE_NEED_WAKEUP`
//! is always set: TX is kicked with one `sendto` per port per batch, only
//! when the ring says so.
//!
//! ## Concurrency
//!
//! A [`Umem`] and its ports belong to one datapath thread (they are created
//! and dropped there). Nothing here locks; xsk-rs serialises socket
//! creation/deletion on the UMEM internally.

#![allow(unsafe_code)]

use std::io::Write;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};

use oxvs_api::XdpModeRequest;
use oxvs_pipeline::packet::PacketRef;
use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue};

/// Bytes per UMEM frame (one page: fits a 1500-byte MTU plus headroom).
pub const FRAME_SIZE: u32 = 4096;
/// Ring sizes (fill, completion, RX, TX) of every socket.
pub const RING_SIZE: u32 = 1024;
/// Frames kept on each port's fill ring (at most).
pub const FILL_TARGET: usize = 512;

/// Why an AF_XDP operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AfxdpError {
    #[error("cannot create a UMEM of {frames} frames of {FRAME_SIZE} bytes: {reason}")]
    Umem { frames: u32, reason: String },
    #[error("'{0}' is not a valid interface name")]
    BadName(String),
    #[error("cannot open an AF_XDP socket on '{ifname}' (tried {tried}): {reason}")]
    Socket {
        ifname: String,
        tried: String,
        reason: String,
    },
}

/// Frame state in [`Umem::owner`]: free or held by the thread.
const OWNER_USER: u32 = 0;

/// One thread's UMEM: the mapped frames ([`UmemMem`], read through shared
/// borrows while a batch is processed) and the pool of free ones
/// ([`FramePool`], mutated by RX/TX bookkeeping). Two parts so a batch's
/// packets can borrow the memory while the sink takes frames from the pool.
#[derive(Debug)]
pub struct Umem {
    pub mem: UmemMem,
    pub pool: FramePool,
}

/// The mapped frames of a [`Umem`].
pub struct UmemMem {
    mem: xsk_rs::Umem,
    /// Start of the mapping (frame 0's chunk).
    base: *mut u8,
    /// Length of the mapping.
    len: usize,
    frame_size: usize,
}

impl std::fmt::Debug for UmemMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmemMem").field("len", &self.len).finish()
    }
}

/// The frame pool of a [`Umem`] and who owns each frame.
#[derive(Debug)]
pub struct FramePool {
    frame_size: usize,
    /// The descriptor of every frame as created, by frame index.
    all: Vec<FrameDesc>,
    /// Free frames.
    free: Vec<FrameDesc>,
    /// Per frame index: [`OWNER_USER`] or the key of the port whose rings hold it.
    owner: Vec<u32>,
}

impl Umem {
    /// Maps `frames` frames of [`FRAME_SIZE`] bytes.
    pub fn new(frames: u32) -> Result<Umem, AfxdpError> {
        let err = |reason: String| AfxdpError::Umem { frames, reason };
        let count = NonZeroU32::new(frames).ok_or_else(|| err("zero frames".into()))?;
        let config = UmemConfig::builder()
            .frame_size(FrameSize::new(FRAME_SIZE).map_err(|e| err(e.to_string()))?)
            .fill_queue_size(QueueSize::new(RING_SIZE).map_err(|e| err(e.to_string()))?)
            .comp_queue_size(QueueSize::new(RING_SIZE).map_err(|e| err(e.to_string()))?)
            .build()
            .map_err(|e| err(e.to_string()))?;
        let (mem, mut all) = xsk_rs::Umem::new(config, count, false).map_err(|e| {
            err(format!(
                "{e}{}",
                std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default()
            ))
        })?;
        let first = all
            .first_mut()
            .ok_or_else(|| err("no frames returned".into()))?;
        // SAFETY: `first` is a descriptor of this UMEM that nobody else
        // holds (the UMEM was just created; no socket uses it). We only take
        // the address of its chunk start, which is the mapping's start.
        let base = unsafe {
            let (mut headroom, _) = mem.frame_mut(first);
            headroom.contents_mut().as_mut_ptr()
        };
        let frame_size = FRAME_SIZE as usize;
        let n = all.len();
        let free = all.iter().rev().copied().collect();
        Ok(Umem {
            mem: UmemMem {
                mem,
                base,
                len: n * frame_size,
                frame_size,
            },
            pool: FramePool {
                frame_size,
                all,
                free,
                owner: vec![OWNER_USER; n],
            },
        })
    }
}

impl FramePool {

    /// Frames in the free pool.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Total frames.
    pub fn frames(&self) -> usize {
        self.all.len()
    }

    /// Takes a free frame (it is then in the *user* state).
    #[inline]
    pub fn alloc(&mut self) -> Option<FrameDesc> {
        self.free.pop()
    }

    /// Returns a *user* frame to the pool.
    #[inline]
    pub fn release(&mut self, d: FrameDesc) {
        self.free.push(d);
    }

    #[inline]
    fn index(&self, addr: usize) -> usize {
        addr / self.frame_size
    }

    #[inline]
    fn mark(&mut self, addr: usize, owner: u32) {
        let i = self.index(addr);
        if let Some(o) = self.owner.get_mut(i) {
            *o = owner;
        }
    }

    /// Returns to the pool every frame held by the rings of port `key`
    /// (called once its socket has been deleted). Returns how many.
    pub fn reclaim(&mut self, key: u32) -> usize {
        let mut n = 0;
        for (i, o) in self.owner.iter_mut().enumerate() {
            if *o == key {
                *o = OWNER_USER;
                if let Some(d) = self.all.get(i) {
                    self.free.push(*d);
                    n += 1;
                }
            }
        }
        n
    }

}

impl UmemMem {
    /// The packet in frame `desc` (a *user* frame received on an RX ring),
    /// as a window over the whole chunk so headers can be pushed in front.
    /// `None` if the descriptor does not describe a packet inside this UMEM.
    #[inline]
    pub fn packet<'a>(&'a self, desc: &'a mut FrameDesc) -> Option<PacketRef<'a>> {
        let addr = desc.addr();
        let len = desc.lengths().data();
        let start = addr & !(self.frame_size - 1);
        if start + self.frame_size > self.len {
            return None;
        }
        // SAFETY: `start..start + frame_size` lies inside the mapping (checked
        // above), which lives as long as `self.mem`, borrowed for 'a. The
        // frame is in the *user* state (module invariant) and `desc` is
        // borrowed exclusively for 'a, so no other slice of this chunk exists
        // and the kernel does not access it until the descriptor is produced
        // on a ring again, which needs that borrow to have ended.
        let chunk = unsafe { std::slice::from_raw_parts_mut(self.base.add(start), self.frame_size) };
        PacketRef::new(chunk, addr - start, len)
    }

    /// Copies `bytes` into the *user* frame `desc` (as its packet data).
    /// False if it does not fit.
    #[inline]
    pub fn write(&self, desc: &mut FrameDesc, bytes: &[u8]) -> bool {
        let start = desc.addr() & !(self.frame_size - 1);
        if start + self.frame_size > self.len {
            return false;
        }
        // SAFETY: `desc` is a frame of this UMEM (bounds checked above) in
        // the *user* state, borrowed exclusively: nothing else reads or
        // writes its chunk while the returned `DataMut` lives.
        let mut data = unsafe { self.mem.data_mut(desc) };
        let mut cursor = data.cursor();
        if cursor.buf_len() < bytes.len() {
            return false;
        }
        cursor.set_pos(0);
        cursor.write_all(bytes).is_ok()
    }
}

/// XDP attach mode and copy mode a socket ended up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketMode {
    pub native: bool,
    pub zero_copy: bool,
}

impl SocketMode {
    /// `native/copy`, `generic/zerocopy`, ...
    pub fn name(self) -> &'static str {
        match (self.native, self.zero_copy) {
            (true, true) => "native/zerocopy",
            (true, false) => "native/copy",
            (false, true) => "generic/zerocopy",
            (false, false) => "generic/copy",
        }
    }
}

/// Counters a port accumulates between two [`XskPort::take_counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_errors: u64,
}

/// One AF_XDP socket bound to queue 0 of an interface, sharing its
/// thread's [`Umem`].
pub struct XskPort {
    /// Owner key of this port's frames in the UMEM (unique per thread, != 0).
    key: u32,
    ifname: String,
    mode: SocketMode,
    tx: TxQueue,
    rx: RxQueue,
    fq: FillQueue,
    cq: CompQueue,
    /// Frames currently on the fill ring.
    filled: usize,
    /// Frames queued for TX, not yet submitted.
    pending_tx: Vec<FrameDesc>,
    /// Frames submitted on TX, not yet completed.
    in_flight: usize,
    /// Scratch for ring transfers.
    scratch: Vec<FrameDesc>,
    counters: PortCounters,
    /// Kernel drop counters already reported.
    kernel_drops_seen: u64,
}

impl std::fmt::Debug for XskPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskPort")
            .field("ifname", &self.ifname)
            .field("mode", &self.mode)
            .finish()
    }
}

impl XskPort {
    /// Opens an AF_XDP socket on `ifname` queue 0 sharing `umem`, and fills
    /// its fill ring. `key` (non-zero, unique in this UMEM) tags its frames.
    pub fn open(
        umem: &mut Umem,
        key: u32,
        ifname: &str,
        request: XdpModeRequest,
        batch: usize,
    ) -> Result<XskPort, AfxdpError> {
        let iface: Interface = ifname
            .parse()
            .map_err(|_| AfxdpError::BadName(ifname.to_string()))?;
        let natives: &[bool] = match request {
            XdpModeRequest::Auto => &[true, false],
            XdpModeRequest::Native => &[true],
            XdpModeRequest::Generic => &[false],
        };
        let mut tried = Vec::new();
        let mut last_err = String::new();
        for &native in natives {
            for zero_copy in [true, false] {
                let mode = SocketMode { native, zero_copy };
                tried.push(mode.name());
                let bind = BindFlags::XDP_USE_NEED_WAKEUP
                    | if zero_copy {
                        BindFlags::XDP_ZEROCOPY
                    } else {
                        BindFlags::XDP_COPY
                    };
                let xdp = if native {
                    XdpFlags::XDP_FLAGS_DRV_MODE
                } else {
                    XdpFlags::XDP_FLAGS_SKB_MODE
                };
                let qsize = QueueSize::new(RING_SIZE).map_err(|e| AfxdpError::Socket {
                    ifname: ifname.into(),
                    tried: mode.name().into(),
                    reason: e.to_string(),
                })?;
                let config = SocketConfig::builder()
                    .rx_queue_size(qsize)
                    .tx_queue_size(qsize)
                    .libxdp_flags(LibxdpFlags::empty())
                    .xdp_flags(xdp)
                    .bind_flags(bind)
                    .build();
                // SAFETY: the UMEM is not yet bound to (ifname, queue 0) by
                // another of our sockets (port names and interfaces are
                // unique per switch), so libxdp loads its program here and
                // the INHIBIT_PROG_LOAD requirement does not apply.
                let r = unsafe { Socket::new(config, &umem.mem.mem, &iface, 0) };
                match r {
                    Ok((tx, rx, Some((fq, cq)))) => {
                        if !native && request == XdpModeRequest::Auto {
                            tracing::warn!(
                                ifname,
                                "native XDP mode is not available; using generic (skb) mode ({last_err})"
                            );
                        }
                        let mut port = XskPort {
                            key,
                            ifname: ifname.to_string(),
                            mode,
                            tx,
                            rx,
                            fq,
                            cq,
                            filled: 0,
                            pending_tx: Vec::with_capacity(batch.max(1) * 4),
                            in_flight: 0,
                            scratch: Vec::with_capacity(RING_SIZE as usize),
                            counters: PortCounters::default(),
                            kernel_drops_seen: 0,
                        };
                        port.refill(&mut umem.pool, batch * 4);
                        return Ok(port);
                    }
                    Ok((_, _, None)) => {
                        last_err = "the interface queue is already bound to this UMEM".into();
                    }
                    Err(e) => {
                        last_err = format!(
                            "{e}{}",
                            std::error::Error::source(&e)
                                .map(|s| format!(": {s}"))
                                .unwrap_or_default()
                        );
                        tracing::debug!(ifname, mode = mode.name(), error = %last_err, "AF_XDP bind attempt failed");
                    }
                }
            }
        }
        Err(AfxdpError::Socket {
            ifname: ifname.into(),
            tried: tried.join(", "),
            reason: last_err,
        })
    }

    /// The socket's file descriptor (for `poll(2)`).
    pub fn fd(&self) -> RawFd {
        self.rx.fd().as_raw_fd()
    }

    /// How the socket is attached.
    pub fn mode(&self) -> SocketMode {
        self.mode
    }

    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The owner key of this port's frames.
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Tops the fill ring up to [`FILL_TARGET`] from the pool, keeping
    /// `reserve` frames in the pool for TX.
    pub fn refill(&mut self, pool: &mut FramePool, reserve: usize) {
        let want = FILL_TARGET.saturating_sub(self.filled);
        let avail = pool.free.len().saturating_sub(reserve);
        let n = want.min(avail);
        if n == 0 {
            return;
        }
        self.scratch.clear();
        for _ in 0..n {
            if let Some(d) = pool.free.pop() {
                self.scratch.push(d);
            }
        }
        // SAFETY: the frames come from the free pool (*user* state, no
        // slice of them exists) and belong to the UMEM this fill ring is on.
        let done = unsafe { self.fq.produce(&self.scratch) };
        for i in 0..self.scratch.len() {
            let d = self.scratch[i];
            if i < done {
                pool.mark(d.addr(), self.key);
            } else {
                pool.free.push(d);
            }
        }
        self.scratch.clear();
        self.filled += done;
    }

    /// Receives up to `out.len()` frames; they become *user* frames.
    /// Returns how many.
    #[inline]
    pub fn recv(&mut self, pool: &mut FramePool, out: &mut [FrameDesc]) -> usize {
        // SAFETY: the descriptors in `out` are overwritten with frames the
        // kernel hands back on this socket's RX ring; this ring belongs to
        // `umem`.
        let n = unsafe { self.rx.consume(out) };
        for d in out.iter().take(n) {
            pool.mark(d.addr(), OWNER_USER);
            self.counters.rx_packets += 1;
            self.counters.rx_bytes += d.lengths().data() as u64;
        }
        self.filled = self.filled.saturating_sub(n);
        n
    }

    /// Gives received frames back to this port's fill ring (frames the fill
    /// ring cannot take go to the pool).
    #[inline]
    pub fn recycle(&mut self, pool: &mut FramePool, frames: &[FrameDesc]) {
        // SAFETY: `frames` are *user* frames of this UMEM whose packet
        // slices have all been dropped (the batch is done).
        let done = unsafe { self.fq.produce(frames) };
        for d in &frames[..done] {
            pool.mark(d.addr(), self.key);
        }
        for d in &frames[done..] {
            pool.free.push(*d);
        }
        self.filled += done;
    }

    /// Queues `bytes` for transmission (copied into a free frame). Drops
    /// and counts when no frame is free or the packet does not fit.
    #[inline]
    pub fn send(&mut self, mem: &UmemMem, pool: &mut FramePool, bytes: &[u8]) {
        if self.pending_tx.len() >= RING_SIZE as usize {
            self.counters.tx_dropped += 1;
            return;
        }
        let Some(mut d) = pool.alloc() else {
            self.counters.tx_dropped += 1;
            return;
        };
        if !mem.write(&mut d, bytes) {
            pool.release(d);
            self.counters.tx_errors += 1;
            return;
        }
        self.pending_tx.push(d);
    }

    /// Submits queued frames to the TX ring and kicks the kernel once if it
    /// asks for it; then drains the completion ring back to the pool.
    pub fn flush(&mut self, pool: &mut FramePool) {
        if !self.pending_tx.is_empty() {
            // SAFETY: `pending_tx` holds *user* frames of this UMEM, written
            // and no longer borrowed.
            let done = unsafe { self.tx.produce(&self.pending_tx) };
            for d in &self.pending_tx[..done] {
                pool.mark(d.addr(), self.key);
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += d.lengths().data() as u64;
            }
            for d in &self.pending_tx[done..] {
                pool.free.push(*d);
                self.counters.tx_dropped += 1;
            }
            self.pending_tx.clear();
            self.in_flight += done;
        }
        self.complete(pool);
        // In copy mode the kernel transmits at most 32 frames per kick
        // (and completes them at once): kick until the ring is drained or
        // it stops asking, bounded.
        let mut kicks = 0;
        while self.in_flight > 0 && self.tx.needs_wakeup() && kicks <= RING_SIZE / 32 {
            if self.tx.wakeup().is_err() {
                self.counters.tx_errors += 1;
                break;
            }
            kicks += 1;
            let before = self.in_flight;
            self.complete(pool);
            if self.in_flight == before {
                break;
            }
        }
    }

    /// Drains the completion ring back to the pool.
    pub fn complete(&mut self, pool: &mut FramePool) {
        if self.in_flight == 0 {
            return;
        }
        self.scratch.clear();
        self.scratch
            .resize(self.in_flight.min(RING_SIZE as usize), FrameDesc::default());
        // SAFETY: the completion ring hands back frames this socket
        // transmitted from `umem`; they become *user* frames.
        let n = unsafe { self.cq.consume(&mut self.scratch) };
        for d in &self.scratch[..n] {
            pool.mark(d.addr(), OWNER_USER);
            pool.free.push(*d);
        }
        self.in_flight -= n.min(self.in_flight);
    }

    /// Whether the fill ring asks for a wakeup (busy-poll mode kicks it).
    pub fn fill_needs_wakeup(&self) -> bool {
        self.fq.needs_wakeup()
    }

    /// Kicks the driver to refill (busy-poll mode).
    pub fn wake_fill(&mut self) {
        let fd = self.rx.fd_mut();
        // A zero-timeout poll is the documented way to kick RX.
        let _ = self.fq.wakeup(fd, 0);
    }

    /// Counters since the last call (kernel-side RX drops included).
    pub fn take_counters(&mut self) -> PortCounters {
        if let Ok(s) = self.rx.fd().xdp_statistics() {
            let drops = s.rx_dropped() + s.rx_ring_full() + s.rx_fill_ring_empty_descs();
            self.counters.rx_dropped += drops.saturating_sub(self.kernel_drops_seen);
            self.kernel_drops_seen = drops;
        }
        std::mem::take(&mut self.counters)
    }

    /// Frames this port's rings may hold (for accounting in tests).
    pub fn outstanding(&self) -> usize {
        self.filled + self.in_flight
    }
}

/// Waits until one of `fds` is readable or `timeout_ms` passes
/// (`poll(2)`); returns how many are ready (0 on timeout or signal).
pub fn poll_readable(fds: &mut [libc::pollfd], timeout_ms: i32) -> std::io::Result<usize> {
    for p in fds.iter_mut() {
        p.events = libc::POLLIN;
        p.revents = 0;
    }
    // SAFETY: `fds` is a valid, exclusively borrowed array of `pollfd` of
    // the length passed; poll(2) only writes their `revents`.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}
