//! AF_XDP ports: one socket and one UMEM (with its frame pool) per port.
//!
//! This is the only module of the workspace allowed `unsafe`: it talks to
//! the AF_XDP rings and the UMEM through `xsk-rs`, whose ring and frame
//! accessors are `unsafe` because their soundness depends on who owns each
//! frame. The ownership discipline that makes them sound lives here:
//!
//! ## Frame ownership (the invariant every `SAFETY:` comment relies on)
//!
//! Every UMEM frame (chunk) is, at any time, in exactly one of these states:
//!
//! - **free**: its descriptor is in the port's free list ([`FramePool`]);
//! - **user**: its descriptor is held by the datapath thread (an RX batch
//!   being processed, a frame being written for TX);
//! - **kernel**: it was produced on the fill ring or the TX ring and has not
//!   come back through the RX or completion ring.
//!
//! Only frames in the *user* state are read or written, and only through an
//! exclusive borrow of their descriptor, so no two slices of one frame exist
//! and the kernel never writes a frame we read.
//!
//! A frame's memory is the whole chunk (`FRAME_SIZE` bytes): packet data
//! starts `XDP_PACKET_HEADROOM` (256) bytes in, so the datapath can push
//! headers (VLAN tags) in place in front of a received packet.
//!
//! ## Why a UMEM per port, not one per thread
//!
//! Forwarding copies each packet once (from the RX frame, processed in
//! place, into a free TX frame of the output port), so a shared UMEM would
//! save no copy, only memory. And it cannot be torn down port by port:
//! libxdp makes a UMEM's *first* socket the UMEM's own fd and does not close
//! it when that socket is deleted, so the kernel socket stays bound to its
//! interface until the whole UMEM goes -- deleting the first port would
//! leave its queue taken (re-adding it fails with EINVAL). Parking that
//! first socket on `lo` works once per network namespace only (a queue
//! takes one UMEM: EBUSY for the next thread or switch). A UMEM per port is
//! released exactly with its port, and each port gets zero-copy when its
//! driver has it (sockets sharing a UMEM inherit the first one's mode).
//!
//! ## Modes
//!
//! [`XskPort::open`] attaches the XDP program in native (driver) mode first
//! and falls back to generic (skb) mode with a warning, unless a mode is
//! forced; for each it tries zero-copy, then copy. `XDP_USE_NEED_WAKEUP` is
//! set: TX is kicked with one `sendto` per port per batch, only when the
//! ring says so.
//!
//! ## Concurrency
//!
//! A port and its UMEM belong to one datapath thread, which uses them
//! alone. The slow ends of their life happen elsewhere, so the datapath
//! thread never stops forwarding for them: [`XskPort::prepare`] (UMEM
//! mapping, XDP program load, bind) runs on the caller's thread and hands a
//! `Send` [`PreparedXsk`] over; [`XskPort::into_closing`] hands the socket
//! and UMEM back for a short-lived thread to drop (close, detach, unmap).
//! Nothing here locks.

#![allow(unsafe_code)]

use std::io::Write;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;

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

/// Maps a UMEM: the frames ([`UmemMem`], shared by a batch's packets
/// through an `Rc`) and their free list ([`FramePool`]).
fn map_umem(frames: u32) -> Result<(xsk_rs::Umem, UmemMem, FramePool), AfxdpError> {
    let err = |reason: String| AfxdpError::Umem { frames, reason };
    let count = NonZeroU32::new(frames).ok_or_else(|| err("zero frames".into()))?;
    let config = UmemConfig::builder()
        .frame_size(FrameSize::new(FRAME_SIZE).map_err(|e| err(e.to_string()))?)
        .fill_queue_size(QueueSize::new(RING_SIZE).map_err(|e| err(e.to_string()))?)
        .comp_queue_size(QueueSize::new(RING_SIZE).map_err(|e| err(e.to_string()))?)
        .build()
        .map_err(|e| err(e.to_string()))?;
    let (umem, mut all) = xsk_rs::Umem::new(config, count, false).map_err(|e| err(chain(&e)))?;
    let first = all
        .first_mut()
        .ok_or_else(|| err("no frames returned".into()))?;
    // SAFETY: `first` is a descriptor of this UMEM that nobody else holds
    // (the UMEM was just created; no socket uses it). We only take the
    // address of its chunk start, which is the mapping's start.
    let base = unsafe {
        let (mut headroom, _) = umem.frame_mut(first);
        headroom.contents_mut().as_mut_ptr()
    };
    let frame_size = FRAME_SIZE as usize;
    let mem = UmemMem {
        _umem: umem.clone(),
        base,
        len: all.len() * frame_size,
        frame_size,
    };
    all.reverse();
    Ok((umem, mem, FramePool { free: all }))
}

/// A UMEM mapped ahead of time, so that adding a port does not wait for
/// the mapping and registration (about 10 ms for 4096 frames): at most one
/// per process, made again in the background after each use. It costs
/// the memory of one port's UMEM while no port is being added.
struct SpareUmem {
    frames: u32,
    umem: xsk_rs::Umem,
    mem: UmemMem,
    pool: FramePool,
}

static SPARE_UMEM: std::sync::Mutex<Option<SpareUmem>> = std::sync::Mutex::new(None);
static SPARE_REFILLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A fresh (never bound) UMEM of `frames` frames: the spare if it fits,
/// else a new mapping; a new spare is made in the background either way.
fn take_umem(frames: u32) -> Result<(xsk_rs::Umem, UmemMem, FramePool), AfxdpError> {
    let spare = SPARE_UMEM.lock().ok().and_then(|mut s| s.take());
    let r = match spare {
        Some(s) if s.frames == frames => Ok((s.umem, s.mem, s.pool)),
        _ => map_umem(frames),
    };
    if !SPARE_REFILLING.swap(true, std::sync::atomic::Ordering::AcqRel) {
        let spawned = std::thread::Builder::new()
            .name("oxvs-umem-spare".into())
            .spawn(move || {
                if let Ok((umem, mem, pool)) = map_umem(frames) {
                    if let Ok(mut s) = SPARE_UMEM.lock() {
                        *s = Some(SpareUmem {
                            frames,
                            umem,
                            mem,
                            pool,
                        });
                    }
                }
                SPARE_REFILLING.store(false, std::sync::atomic::Ordering::Release);
            });
        if spawned.is_err() {
            SPARE_REFILLING.store(false, std::sync::atomic::Ordering::Release);
        }
    }
    r
}

fn chain(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

/// The mapped frames of a port's UMEM.
pub struct UmemMem {
    /// Keeps the mapping alive.
    _umem: xsk_rs::Umem,
    /// Start of the mapping (frame 0's chunk).
    base: *mut u8,
    /// Length of the mapping.
    len: usize,
    frame_size: usize,
}

// SAFETY: `base` points into the mapping `_umem` owns (xsk-rs's `Umem` is
// `Send`). A `UmemMem` is moved between threads only whole, before it is
// shared (`PreparedXsk`, made on a control thread, handed to a datapath
// thread) or after it stopped being shared (`ClosingXsk`, the last `Rc`
// taken back, handed to a reaper thread): no two threads ever access the
// frames through it at once.
unsafe impl Send for UmemMem {}

impl std::fmt::Debug for UmemMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UmemMem").field("len", &self.len).finish()
    }
}

impl UmemMem {
    /// The packet in frame `desc` (a *user* frame received on the RX ring),
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
        // above), which lives as long as `self`, borrowed for 'a. The frame is
        // in the *user* state (module invariant) and `desc` is borrowed
        // exclusively for 'a, so no other slice of this chunk exists and the
        // kernel does not access it until the descriptor is produced on a
        // ring again, which needs that borrow to have ended.
        let chunk =
            unsafe { std::slice::from_raw_parts_mut(self.base.add(start), self.frame_size) };
        PacketRef::new(chunk, addr - start, len)
    }

    /// Copies `bytes` into the *user* frame `desc` as its packet data (at
    /// the frame's data offset). False if it does not fit.
    #[inline]
    fn write(&self, desc: &mut FrameDesc, bytes: &[u8]) -> bool {
        let start = desc.addr() & !(self.frame_size - 1);
        if start + self.frame_size > self.len {
            return false;
        }
        // SAFETY: `desc` is a frame of this UMEM (bounds checked above) in
        // the *user* state, borrowed exclusively: nothing else reads or
        // writes its chunk while the returned `DataMut` lives.
        let mut data = unsafe { self._umem.data_mut(desc) };
        let mut cursor = data.cursor();
        if cursor.buf_len() < bytes.len() {
            return false;
        }
        cursor.set_pos(0);
        cursor.write_all(bytes).is_ok()
    }
}

/// The free frames of a port's UMEM.
#[derive(Debug)]
pub struct FramePool {
    free: Vec<FrameDesc>,
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

/// A socket and its UMEM made by [`XskPort::prepare`], not yet a port
/// (no frame is on a ring yet): `Send`, so it can be made off the datapath
/// thread.
pub struct PreparedXsk {
    ifname: String,
    mode: SocketMode,
    // Drop order: the rings (each holding the socket) before the UMEM.
    tx: TxQueue,
    rx: RxQueue,
    fq: FillQueue,
    cq: CompQueue,
    mem: UmemMem,
    pool: FramePool,
    frames: u32,
}

impl PreparedXsk {
    /// The mode the socket got.
    pub fn mode(&self) -> SocketMode {
        self.mode
    }
}

impl std::fmt::Debug for PreparedXsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedXsk")
            .field("ifname", &self.ifname)
            .field("mode", &self.mode)
            .finish()
    }
}

/// What is left of a port to drop: its socket and UMEM (see
/// [`XskPort::into_closing`]). Field order is drop order.
pub struct ClosingXsk {
    _tx: TxQueue,
    _rx: RxQueue,
    _fq: FillQueue,
    _cq: CompQueue,
    _mem: UmemMem,
}

/// One AF_XDP socket bound to queue 0 of an interface, with its own UMEM.
pub struct XskPort {
    ifname: String,
    mode: SocketMode,
    // Field order is drop order: the rings (each holding the socket) go
    // before the UMEM handles.
    tx: TxQueue,
    rx: RxQueue,
    fq: FillQueue,
    cq: CompQueue,
    mem: Rc<UmemMem>,
    pool: FramePool,
    /// Frames currently on the fill ring.
    filled: usize,
    /// Frames queued for TX, not yet submitted.
    pending_tx: Vec<FrameDesc>,
    /// Frames submitted on TX, not yet completed.
    in_flight: usize,
    /// Scratch for ring transfers.
    scratch: Vec<FrameDesc>,
    /// Frames kept in the pool for TX when filling the fill ring.
    reserve: usize,
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
    /// Opens an AF_XDP socket on `ifname` queue 0 with a UMEM of `frames`
    /// frames, and fills its fill ring: [`XskPort::prepare`] then
    /// [`XskPort::from_prepared`] on the calling thread.
    pub fn open(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
        batch: usize,
    ) -> Result<XskPort, AfxdpError> {
        Ok(XskPort::from_prepared(
            XskPort::prepare(ifname, request, frames)?,
            batch,
        ))
    }

    /// Makes the socket and its UMEM (the slow part: mapping and
    /// registering the UMEM, loading and attaching the XDP program), on any
    /// thread, so the datapath thread that will own the port does not stop
    /// forwarding meanwhile.
    ///
    /// A queue whose previous socket was just closed stays busy until the
    /// kernel's deferred release runs: "device or resource busy" is retried
    /// for up to a second.
    pub fn prepare(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
    ) -> Result<PreparedXsk, AfxdpError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            match XskPort::prepare_once(ifname, request, frames) {
                Err(AfxdpError::Socket { ref reason, .. })
                    if reason.contains("busy") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => return r,
            }
        }
    }

    fn prepare_once(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
    ) -> Result<PreparedXsk, AfxdpError> {
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
        // Virtual devices (veth, ...) have no `device` in sysfs and never do
        // zero-copy: trying costs an XDP program load and a UMEM for nothing.
        let physical = std::path::Path::new("/sys/class/net")
            .join(ifname)
            .join("device")
            .exists();
        let copy_modes: &[bool] = if physical { &[true, false] } else { &[false] };
        for &native in natives {
            for &zero_copy in copy_modes {
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
                // A fresh UMEM per attempt: a failed bind may leave libxdp
                // state on the old one. The first attempt takes the spare.
                let t0 = std::time::Instant::now();
                let (umem, mem, pool) = if tried.len() == 1 {
                    take_umem(frames)?
                } else {
                    map_umem(frames)?
                };
                let t_umem = t0.elapsed();
                // SAFETY: the UMEM is fresh, so (ifname, 0) is not bound to
                // it and the INHIBIT_PROG_LOAD requirement does not apply.
                let r = unsafe { Socket::new(config, &umem, &iface, 0) };
                tracing::debug!(
                    ifname,
                    mode = mode.name(),
                    umem_ms = t_umem.as_secs_f64() * 1e3,
                    socket_ms = (t0.elapsed() - t_umem).as_secs_f64() * 1e3,
                    ok = r.is_ok(),
                    "AF_XDP socket attempt"
                );
                match r {
                    Ok((tx, rx, Some((fq, cq)))) => {
                        if !native && request == XdpModeRequest::Auto {
                            tracing::warn!(
                                ifname,
                                "native XDP mode is not available; using generic (skb) mode ({last_err})"
                            );
                        }
                        return Ok(PreparedXsk {
                            ifname: ifname.to_string(),
                            mode,
                            tx,
                            rx,
                            fq,
                            cq,
                            mem,
                            pool,
                            frames,
                        });
                    }
                    Ok((_, _, None)) => {
                        last_err = "libxdp returned no fill/completion rings".into();
                    }
                    Err(e) => {
                        last_err = chain(&e);
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

    /// The port made of a [`PreparedXsk`], with its fill ring filled (on
    /// the thread that owns the port from now on).
    pub fn from_prepared(p: PreparedXsk, batch: usize) -> XskPort {
        let frames = p.frames as usize;
        let mut port = XskPort {
            ifname: p.ifname,
            mode: p.mode,
            tx: p.tx,
            rx: p.rx,
            fq: p.fq,
            cq: p.cq,
            mem: Rc::new(p.mem),
            pool: p.pool,
            filled: 0,
            pending_tx: Vec::with_capacity(batch.max(1) * 4),
            in_flight: 0,
            scratch: Vec::with_capacity(RING_SIZE as usize),
            // Frames kept back for TX; at most half the UMEM, so the
            // fill ring always gets frames (a small UMEM with a large
            // batch would otherwise never receive).
            reserve: (frames / 4).max(batch * 2).min(frames / 2),
            counters: PortCounters::default(),
            kernel_drops_seen: 0,
        };
        port.refill();
        port
    }

    /// The socket and UMEM, to be dropped on another thread (closing a
    /// socket detaches the XDP program and unmaps the UMEM: slow). `None`
    /// (and dropped here) if a packet still holds the UMEM.
    pub fn into_closing(self) -> Option<ClosingXsk> {
        let XskPort {
            tx,
            rx,
            fq,
            cq,
            mem,
            ..
        } = self;
        match Rc::try_unwrap(mem) {
            Ok(mem) => Some(ClosingXsk {
                _tx: tx,
                _rx: rx,
                _fq: fq,
                _cq: cq,
                _mem: mem,
            }),
            Err(_) => None,
        }
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

    /// The port's frames (received packets are read through this).
    pub fn mem(&self) -> Rc<UmemMem> {
        Rc::clone(&self.mem)
    }

    /// Tops the fill ring up to [`FILL_TARGET`] from the pool, keeping a
    /// reserve in the pool for TX.
    pub fn refill(&mut self) {
        let want = FILL_TARGET.saturating_sub(self.filled);
        let avail = self.pool.free.len().saturating_sub(self.reserve);
        let n = want.min(avail);
        if n == 0 {
            return;
        }
        let at = self.pool.free.len() - n;
        self.scratch.clear();
        self.scratch.extend(self.pool.free.drain(at..));
        // SAFETY: the frames come from the free pool (*user* state, no
        // slice of them exists) and belong to this fill ring's UMEM.
        let done = unsafe { self.fq.produce(&self.scratch) };
        self.pool.free.extend_from_slice(&self.scratch[done..]);
        self.scratch.clear();
        self.filled += done;
    }

    /// Receives up to `out.len()` frames; they become *user* frames, to be
    /// handed back with [`XskPort::recycle`]. Returns how many.
    #[inline]
    pub fn recv(&mut self, out: &mut [FrameDesc]) -> usize {
        // SAFETY: the descriptors in `out` are overwritten with frames the
        // kernel hands back on this socket's RX ring (this port's UMEM);
        // they become *user* frames.
        let n = unsafe { self.rx.consume(out) };
        for d in out.iter().take(n) {
            self.counters.rx_packets += 1;
            self.counters.rx_bytes += d.lengths().data() as u64;
        }
        self.filled = self.filled.saturating_sub(n);
        n
    }

    /// Gives received frames back to the fill ring (what it cannot take
    /// goes to the pool).
    #[inline]
    pub fn recycle(&mut self, frames: &[FrameDesc]) {
        // SAFETY: `frames` are *user* frames of this UMEM (from `recv`)
        // whose packet slices have all been dropped (the batch is done).
        let done = unsafe { self.fq.produce(frames) };
        self.pool.free.extend_from_slice(&frames[done..]);
        self.filled += done;
    }

    /// Queues `bytes` for transmission (copied into a free frame). Drops
    /// and counts when no frame is free or the packet does not fit.
    #[inline]
    pub fn send(&mut self, bytes: &[u8]) {
        if self.pending_tx.len() >= RING_SIZE as usize {
            self.counters.tx_dropped += 1;
            return;
        }
        let Some(mut d) = self.pool.free.pop() else {
            self.counters.tx_dropped += 1;
            return;
        };
        if !self.mem.write(&mut d, bytes) {
            self.pool.free.push(d);
            self.counters.tx_errors += 1;
            return;
        }
        self.pending_tx.push(d);
    }

    /// Submits queued frames to the TX ring and kicks the kernel if it asks
    /// for it; drains the completion ring back to the pool; tops up the
    /// fill ring.
    pub fn flush(&mut self) {
        if !self.pending_tx.is_empty() {
            // SAFETY: `pending_tx` holds *user* frames of this UMEM, written
            // and no longer borrowed.
            let done = unsafe { self.tx.produce(&self.pending_tx) };
            for d in &self.pending_tx[..done] {
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += d.lengths().data() as u64;
            }
            self.counters.tx_dropped += (self.pending_tx.len() - done) as u64;
            self.pool.free.extend_from_slice(&self.pending_tx[done..]);
            self.pending_tx.clear();
            self.in_flight += done;
        }
        self.complete();
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
            self.complete();
            if self.in_flight == before {
                break;
            }
        }
        self.refill();
    }

    /// Drains the completion ring back to the pool.
    fn complete(&mut self) {
        if self.in_flight == 0 {
            return;
        }
        self.scratch.clear();
        self.scratch
            .resize(self.in_flight.min(RING_SIZE as usize), FrameDesc::default());
        // SAFETY: the completion ring hands back frames this socket
        // transmitted from its UMEM; they become *user* (then free) frames.
        let n = unsafe { self.cq.consume(&mut self.scratch) };
        self.pool.free.extend_from_slice(&self.scratch[..n]);
        self.scratch.clear();
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

    /// Counters since the last call. With `kernel`, the kernel-side RX
    /// drops are read too (a `getsockopt`: callers do it only every few
    /// tens of milliseconds, never per batch).
    pub fn take_counters(&mut self, kernel: bool) -> PortCounters {
        if !kernel {
            return std::mem::take(&mut self.counters);
        }
        if let Ok(s) = self.rx.fd().xdp_statistics() {
            let drops = s.rx_dropped() + s.rx_ring_full() + s.rx_fill_ring_empty_descs();
            self.counters.rx_dropped += drops.saturating_sub(self.kernel_drops_seen);
            self.kernel_drops_seen = drops;
        }
        std::mem::take(&mut self.counters)
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
