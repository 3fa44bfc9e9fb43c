//! AF_XDP ports: one socket per port, a few UMEMs (each with its free
//! frames) per datapath thread.
//!
//! This is the switch's only module allowed `unsafe` (the agent's
//! `podnet::ethtool` is the workspace's other one): it talks to
//! the AF_XDP rings and the UMEM through `xsk-rs`, whose ring and frame
//! accessors are `unsafe` because their soundness depends on who owns each
//! frame. The ownership discipline that makes them sound lives here:
//!
//! ## Frame ownership (the invariant every `SAFETY:` comment relies on)
//!
//! Every UMEM frame (chunk) is, at any time, in exactly one of these states:
//!
//! - **free**: its descriptor is in the UMEM's free list ([`Frames`]);
//! - **user**: its descriptor is held by the datapath thread (an RX batch
//!   being processed, a frame being written for TX);
//! - **kernel**: it was produced on the fill ring or the TX ring and has not
//!   come back through the RX or completion ring.
//!
//! Only frames in the *user* state are read or written, and only through an
//! exclusive borrow of their descriptor, so no two slices of one frame exist
//! and the kernel never writes a frame we read.
//!
//! One exception, with `--tx-move` ([`XskPort::send_moved`]): a received
//! packet's frame goes to a TX ring while its packet slice is still alive
//! in the batch (the batch's packets are dropped together at its end). The
//! datapath never reads or writes that slice again (it was the packet's
//! last output, `DatapathSink::output_last`), so when a flush in the middle
//! of the batch hands the frame to the kernel, or its completion makes it
//! free and a later send of the batch writes it, nothing reads it through
//! the old slice: the slice is dead, only not yet dropped.
//!
//! A frame's memory is the whole chunk (`FRAME_SIZE` bytes): packet data
//! starts `XDP_PACKET_HEADROOM` (256) bytes in, so the datapath can push
//! headers (VLAN tags) in place in front of a received packet.
//!
//! ## A few UMEMs per datapath thread
//!
//! The ports one datapath thread serves share its UMEMs ([`ThreadUmem`],
//! one by default, each port on one): their memory is pinned, so a UMEM
//! per port (16 MiB each) would make a node's memory grow with its pods.
//! Each port keeps its own fill and completion rings (sockets on
//! different devices need their own); the free frames are one list per
//! UMEM ([`Frames`]).
//!
//! Why a thread may want several: the kernel gives every socket bound to
//! a UMEM on another device a buffer pool of its own, with an entry of
//! about 128 bytes per frame of the UMEM, allocated and zeroed at bind
//! (`xp_create_and_assign_umem`). At the default 16384 frames that is a
//! 2 MiB block per port (a buddy allocator's order 9, the block a virtual
//! machine's free page reporting hands back to the hypervisor, so each
//! pod's bind takes 5 ms of host page faults on such a VM), at 8192 a
//! 1 MiB one. Two UMEMs of 8192 give a thread as many frames at half the
//! kernel memory per port and a bind of 0.2-0.3 ms; but a busy port then
//! borrows only from its own UMEM's spare frames, and on a node of 30
//! pods three times as many segments were lost to empty fill rings
//! (`docs/benchmarks.md`, "Several UMEMs per thread"), so the default is
//! one. Each UMEM, like its ports, is one thread's alone.
//!
//! Within a UMEM, a fill ring
//! holds frames nobody can take back until packets arrive, so an idle
//! port must not hoard them: the first ports start with
//! [`FILL_DEEP_START`] frames while three quarters of the UMEM stay free
//! (two with the default UMEM), the next ones with [`FILL_START`] while
//! half the UMEM stays free, later ones with [`FILL_MIN`] frames (taken
//! even from the TX reserve, so a new port can always receive;
//! [`start_fill`]), and only a busy port grows its ring, while the UMEM has
//! frames to spare, up to its share of the UMEM ([`Frames::port_share`],
//! at most [`FILL_TARGET`]); an idle one decays back to that share. A
//! port under a burst (it lost frames to its empty ring, or a burst half
//! drained it) whose share is small may borrow beyond it, up to
//! [`BORROW_UP_TO`], half the spare frames at a time and never the last
//! few ([`Frames::room_to_grow`]): with many pods the shares are small
//! while most of the UMEM sits free. Borrowed frames come back only as
//! packets arrive, so a borrower gone quiet keeps them.
//!
//! The UMEM's *first* socket is special to libxdp: it is the UMEM's own
//! fd, kept open until the UMEM goes, and every later socket names it to
//! the kernel to share the UMEM -- which needs it bound. Were it a pod's
//! port, deleting that pod would keep its queue taken or, once the device
//! is gone, make every later bind fail. So the first socket is an
//! *anchor* bound to one queue (one per UMEM) of a quiet device the
//! switch creates for this and nothing else (no XDP program, no traffic),
//! and every port is an ordinary sharer that comes and goes.
//!
//! A closed port's fill ring, RX ring and unfinished TX still hold frames
//! the kernel owned: each frame records which port's rings it was given
//! to (a slot per port, one store per frame), so once the socket is
//! closed [`UmemMem::reclaim`] returns exactly those frames.
//!
//! A port on a physical device gets its own UMEM (sockets sharing a UMEM
//! get its first socket's mode, and the anchor has copy mode, so a NIC
//! would lose zero-copy), as does any port when the shared UMEM cannot be
//! bound to (the anchor device was deleted, ...). Forwarding copies each
//! packet once either way (from the RX frame, processed in place, into a
//! free TX frame of the output port).
//!
//! ## Multi-buffer
//!
//! The anchor (and an own UMEM's socket) binds with `XDP_USE_SG` where the
//! kernel has it (6.6+), and every socket sharing the UMEM inherits it: a
//! packet larger than a frame arrives as several descriptors, all but the
//! last flagged [`XDP_PKT_CONTD`]. [`XskPort::recv`] takes a packet's
//! descriptors whole, [`XskPort::packets`] splits a batch into packets
//! (the engine gathers a multi-descriptor one into a buffer of its own: a
//! second copy, for those only), and [`XskPort::send`] writes a frame
//! larger than a UMEM frame as a chain, all or none.
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
//! thread never stops forwarding for them: [`XskPort::prepare`] (XDP
//! program load, bind; UMEM mapping for an own UMEM) runs on the caller's
//! thread and hands a `Send` [`PreparedXsk`] over; [`XskPort::into_closing`]
//! hands the socket (and an own UMEM) back for a short-lived thread to
//! drop (close, detach, unmap), after which the datapath thread reclaims
//! the socket's frames. Creating and deleting sockets on a shared UMEM
//! from those threads is serialised by xsk-rs's lock on libxdp's UMEM
//! bookkeeping, which the datapath thread never takes: it touches only
//! rings and frames. Nothing on the packet path locks.

#![allow(unsafe_code)]

pub mod txmd;

use std::cell::RefCell;
use std::io::Write;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;

use oxvs_api::XdpModeRequest;
use oxvs_pipeline::checksum;
use oxvs_pipeline::packet::PacketRef;
use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue};

use crate::xdpprog::{XdpAttachment, XdpProgram};

/// Bytes per UMEM frame (one page: fits a 1500-byte MTU plus headroom).
pub const FRAME_SIZE: u32 = 4096;
/// Size of every socket's RX and fill rings: deep enough to absorb what a
/// pod's TCP sends in one burst while the datapath thread is busy
/// elsewhere (a GSO super-frame is ~44 segments, and several streams
/// burst at once). With 1024 (and 512 frames on the fill ring) one iperf3
/// stream through one thread lost ~12,000 segments in 5 s to an empty
/// fill ring; with 4096, none (`docs/benchmarks.md`, "TCP with the pods'
/// offloads on").
pub const RX_RING_SIZE: u32 = 4096;
/// Size of every socket's TX and completion rings (the completion ring
/// must hold every frame in flight on the TX ring). The datapath drains
/// the TX ring on every flush (copy mode) so it never fills at 1024.
pub const TX_RING_SIZE: u32 = 1024;
/// Frames kept on a busy port's fill ring (at most): all of it.
pub const FILL_TARGET: usize = RX_RING_SIZE as usize;
/// Frames a thread's first ports on a shared UMEM start with (while half
/// the UMEM stays free): enough for a burst before the first adaptation.
pub const FILL_START: usize = 512;
/// Frames a thread's very first ports on a shared UMEM start with (while
/// three quarters of the UMEM stay free, [`start_fill`]): a pod's first
/// TCP burst at MTU 65535 with four streams lost 12-200 segments to a
/// start of [`FILL_START`] and none to this (`docs/benchmarks.md`, "A
/// fresh pod's first burst").
pub const FILL_DEEP_START: usize = FILL_TARGET / 2;
/// Frames a port under a burst may borrow up to when its share of the
/// UMEM is smaller ([`Frames::room_to_grow`]): half a ring (7.5 MiB of
/// 64 KiB segments). A ring this large carried one TCP stream between
/// pods at MTU 65535 without loss (`docs/benchmarks.md`, "Many pods on a
/// node").
pub const BORROW_UP_TO: usize = FILL_TARGET / 2;
/// `setsockopt` level of AF_XDP sockets.
const SOL_XDP: libc::c_int = 283;
/// The socket option raising how many frames one copy-mode TX kick sends
/// (`include/uapi/linux/if_xdp.h`, Linux 6.17+; 32 before and by default).
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;
/// The descriptor option saying the packet goes on in the next descriptor
/// (multi-buffer AF_XDP, `XDP_USE_SG`).
pub const XDP_PKT_CONTD: u32 = 1;
/// The largest frame the switch receives or sends: an IP packet of 65535
/// bytes behind an Ethernet header with two VLAN tags (a pod MTU of up to
/// 65535 on a veth whose XDP program is frags-aware).
pub const MAX_FRAME_LEN: usize = 65_535 + 14 + 8;
/// Most descriptors one packet may span: a [`MAX_FRAME_LEN`] frame in
/// received chunks (a frame minus the kernel's 256 bytes of headroom),
/// which is also the kernel's limit on TX (`MAX_SKB_FRAGS` + 1).
pub const MAX_CHAIN: usize = 18;
/// Frames a port on a shared UMEM is topped up to even from the TX
/// reserve, and starts with once half the UMEM is on rings: what one NAPI
/// poll of a veth delivers (64 packets). A busy port's target doubles up
/// to its share of the UMEM ([`Frames::port_share`], at least this, at
/// most [`FILL_TARGET`]) while the UMEM has frames to spare, and decays
/// back to that share when it is idle.
pub const FILL_MIN: usize = 64;

/// Descriptors one receive must return for the fill ring's adaptation to
/// see a burst under way ([`XskPort::recv`]; with the default batch of 64,
/// a receive of 32 counts as a full one, as when the batch was 32).
pub const BURST_DESCS: usize = 32;

/// The fill ring a port on a shared UMEM of `total` frames starts with,
/// `free` of them free when it attaches: [`FILL_DEEP_START`] while that
/// leaves three quarters of the UMEM free, [`FILL_START`] while it leaves
/// half, else [`FILL_MIN`]. A quiet port keeps what it starts with (frames
/// on a fill ring come back only as packets arrive), so the deep starts
/// together take at most a quarter of the UMEM and all starts but the
/// minimum at most half, as before there were deep ones: half the UMEM
/// stays free for later ports (a quarter of it the TX reserve, the other
/// quarter to grow and borrow from). With the default 16384 frames: two
/// ports start deep, eight with 512, later ones with 64; with 8192, one
/// deep and four with 512 (per UMEM: two UMEMs of 8192 start as many per
/// thread as one of 16384); below 8192 none deep.
fn start_fill(total: usize, free: usize) -> usize {
    if free >= total * 3 / 4 + FILL_DEEP_START {
        FILL_DEEP_START.min(total / 4)
    } else if free >= total / 2 + FILL_START {
        FILL_START.min(total / 2)
    } else {
        FILL_MIN
    }
}

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

/// A fresh UMEM of `frames` frames for a socket that does not bind to
/// `shared`; `None` when it does.
fn own_umem_unless(
    shared: Option<&xsk_rs::Umem>,
    frames: u32,
) -> Result<Option<UmemMem>, AfxdpError> {
    match shared {
        Some(_) => Ok(None),
        None => map_umem(frames, false).map(Some),
    }
}

/// The ring sizes and flags every socket is made with.
fn socket_config(
    ifname: &str,
    mode: SocketMode,
    libxdp: LibxdpFlags,
    xdp: XdpFlags,
    bind: BindFlags,
) -> Result<SocketConfig, AfxdpError> {
    let qsize = |n: u32| {
        QueueSize::new(n).map_err(|e| AfxdpError::Socket {
            ifname: ifname.into(),
            tried: mode.name().into(),
            reason: e.to_string(),
        })
    };
    Ok(SocketConfig::builder()
        .rx_queue_size(qsize(RX_RING_SIZE)?)
        .tx_queue_size(qsize(TX_RING_SIZE)?)
        .libxdp_flags(libxdp)
        .xdp_flags(xdp)
        .bind_flags(bind)
        .build())
}

/// Bytes the kernel allocates, at bind, for every socket on a UMEM
/// registered on another device: its buffer pool's heads, about 128 per
/// UMEM frame (measured: `Slab` +121 MiB for 60 ports at 16384 frames,
/// +61 MiB at 8192; `docs/benchmarks.md`, "Several UMEMs per thread").
pub const POOL_BYTES_PER_FRAME: u64 = 128;

/// The buddy order (a block of 2^order pages) of the pool a socket on a
/// UMEM of `frames` frames takes at bind ([`POOL_BYTES_PER_FRAME`] each):
/// 9, a 2 MiB block, from 8193 frames.
pub fn pool_order(frames: u32) -> u32 {
    let pages = (u64::from(frames) * POOL_BYTES_PER_FRAME).div_ceil(4096);
    pages.max(1).next_power_of_two().trailing_zeros()
}

/// Where this (virtual) machine hands free memory back to its hypervisor
/// (a virtio balloon with free page reporting, `VIRTIO_BALLOON_F_REPORTING`):
/// the smallest order of the free blocks it reports. A block of that order
/// or more is faulted in from the host again when next used, so a bind
/// whose pool takes one ([`pool_order`]) pays for it: 5 ms per 2 MiB on the
/// VMs measured.
pub fn free_page_reporting_order() -> Option<u32> {
    let devices = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon").ok()?;
    let reporting = devices.flatten().any(|d| {
        let features = std::fs::read_to_string(d.path().join("features")).unwrap_or_default();
        reports_free_pages(&features)
    });
    if !reporting {
        return None;
    }
    std::fs::read_to_string("/sys/module/page_reporting/parameters/page_reporting_order")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether a virtio device's `features` (one `0`/`1` character per
/// feature bit, bit 0 first) has `VIRTIO_BALLOON_F_REPORTING` (bit 5).
fn reports_free_pages(features: &str) -> bool {
    features.trim().as_bytes().get(5) == Some(&b'1')
}

/// Bind flags of a copy-mode socket with `need_wakeup`, multi-buffer
/// (`XDP_USE_SG`) when `sg`.
fn copy_bind_flags(sg: bool) -> BindFlags {
    let flags = BindFlags::XDP_USE_NEED_WAKEUP | BindFlags::XDP_COPY;
    if sg {
        flags | BindFlags::XDP_USE_SG
    } else {
        flags
    }
}

/// Maps a UMEM of `frames` frames, all free; registered with TX metadata
/// ([`txmd`]) when `tx_metadata` and the kernel has it.
fn map_umem(frames: u32, tx_metadata: bool) -> Result<UmemMem, AfxdpError> {
    let err = |reason: String| AfxdpError::Umem { frames, reason };
    let count = NonZeroU32::new(frames).ok_or_else(|| err("zero frames".into()))?;
    let config = UmemConfig::builder()
        .frame_size(FrameSize::new(FRAME_SIZE).map_err(|e| err(e.to_string()))?)
        .fill_queue_size(QueueSize::new(RX_RING_SIZE).map_err(|e| err(e.to_string()))?)
        .comp_queue_size(QueueSize::new(TX_RING_SIZE).map_err(|e| err(e.to_string()))?)
        .build()
        .map_err(|e| err(e.to_string()))?;
    let create = || xsk_rs::Umem::new(config, count, false);
    let (made, txmd) = match tx_metadata {
        true => txmd::with_tx_metadata(create),
        false => (create(), false),
    };
    let (umem, mut all) = made.map_err(|e| err(chain(&e)))?;
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
    // Frame i's descriptor at index i, so a frame can be taken back by
    // index (see `Frames::reclaim`).
    all.sort_by_key(|d| d.addr());
    if all
        .iter()
        .enumerate()
        .any(|(i, d)| d.addr() / frame_size != i)
    {
        return Err(err("the UMEM's frames are not one per chunk".into()));
    }
    let len = all.len() * frame_size;
    Ok(UmemMem {
        _umem: umem,
        base,
        len,
        frame_size,
        frames: RefCell::new(Frames::new(all)),
        sg: false,
        txmd,
    })
}

fn chain(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

/// A UMEM: its mapped frames and their bookkeeping ([`Frames`]). One
/// port's own, or shared by the ports of one datapath thread
/// ([`ThreadUmem`]); batches of received packets hold it through an `Rc`.
pub struct UmemMem {
    /// Keeps the mapping alive (and is what sockets are created from).
    _umem: xsk_rs::Umem,
    /// Start of the mapping (frame 0's chunk).
    base: *mut u8,
    /// Length of the mapping.
    len: usize,
    frame_size: usize,
    /// Only the thread that owns the UMEM borrows it, never across a
    /// call that could borrow it again.
    frames: RefCell<Frames>,
    /// Whether its first socket was bound with `XDP_USE_SG`, which every
    /// socket sharing it inherits (the kernel takes no flags from those).
    sg: bool,
    /// Whether it was registered with TX metadata ([`txmd`]): its sockets
    /// can ask the kernel to finish a packet's checksum
    /// ([`XskPort::send_unfinished`]).
    txmd: bool,
}

// SAFETY: `base` points into the mapping `_umem` owns (xsk-rs's `Umem` is
// `Send`), and `Frames` is plain data. A `UmemMem` is moved between
// threads only whole, before it is shared (`PreparedXsk`, made on a
// control thread, handed to a datapath thread) or after it stopped being
// shared (`ClosingXsk`, the last `Rc` taken back, handed to a reaper
// thread): no two threads ever access the frames through it at once.
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
    /// the frame's data offset): all of them, or as many as fit.
    #[inline]
    fn write(&self, desc: &mut FrameDesc, bytes: &[u8]) -> Written {
        let start = desc.addr() & !(self.frame_size - 1);
        if start + self.frame_size > self.len {
            return Written::Part(0);
        }
        // SAFETY: `desc` is a frame of this UMEM (bounds checked above) in
        // the *user* state, borrowed exclusively: nothing else reads or
        // writes its chunk while the returned `DataMut` lives.
        let mut data = unsafe { self._umem.data_mut(desc) };
        let mut cursor = data.cursor();
        let n = cursor.buf_len().min(bytes.len());
        cursor.set_pos(0);
        match bytes.get(..n).map(|b| cursor.write_all(b)) {
            Some(Ok(())) if n == bytes.len() => Written::All,
            Some(Ok(())) => Written::Part(n),
            _ => Written::Part(0),
        }
    }

    /// Copies `bytes` over the data of the *user* frame `desc` (as
    /// received: same start, same length), e.g. a gathered packet's
    /// rewritten head back into its first descriptor. False (nothing
    /// written) if the lengths differ or `desc` is not a frame of this
    /// UMEM.
    #[inline]
    fn write_back(&self, desc: &FrameDesc, bytes: &[u8]) -> bool {
        let addr = desc.addr();
        let start = addr & !(self.frame_size - 1);
        if bytes.len() != desc.lengths().data()
            || addr + bytes.len() > start + self.frame_size
            || start + self.frame_size > self.len
        {
            return false;
        }
        // SAFETY: `addr..addr + bytes.len()` lies inside one chunk of the
        // mapping (checked above). The frame is in the *user* state (the
        // caller received it and has not given it back) and no slice of
        // it exists: its packet was gathered into another buffer, whose
        // bytes are what is written here, so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(addr), bytes.len()) };
        true
    }

    /// Overwrites `bytes` at offset `at` of the data of the *user* frame
    /// `desc` (a packet written for TX, not yet handed to the kernel);
    /// false (nothing written) unless they lie inside its data.
    #[inline]
    fn patch(&self, desc: &FrameDesc, at: usize, bytes: &[u8]) -> bool {
        let addr = desc.addr();
        let start = addr & !(self.frame_size - 1);
        if at + bytes.len() > desc.lengths().data()
            || addr + at + bytes.len() > start + self.frame_size
            || start + self.frame_size > self.len
        {
            return false;
        }
        // SAFETY: `addr + at..addr + at + bytes.len()` lies inside the
        // frame's data, inside one chunk of the mapping (checked above).
        // The frame is in the *user* state, queued by this thread and not
        // yet produced on a ring, and no slice of it exists (it was
        // written through a borrow that has ended).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(addr + at), bytes.len())
        };
        true
    }

    /// Takes back the frames a closed port's kernel rings held (its fill
    /// ring, RX ring and unfinished TX), once its socket is closed and the
    /// kernel no longer touches them; frees the port's slot. Returns how
    /// many frames came back.
    pub fn reclaim(&self, slot: u16) -> usize {
        self.frames.borrow_mut().reclaim(slot)
    }

    /// Whether sockets on this UMEM take and send packets in several
    /// descriptors (`XDP_USE_SG`).
    pub fn multi_buffer(&self) -> bool {
        self.sg
    }

    /// Whether the UMEM was registered with TX metadata: its sockets ask
    /// the kernel to finish checksums ([`XskPort::send_unfinished`]).
    pub fn tx_metadata(&self) -> bool {
        self.txmd
    }

    /// Writes the request to finish a checksum into the metadata in front
    /// of the data of the *user* frame `desc`; false (nothing written)
    /// when the UMEM has no TX metadata or the data starts too close to
    /// its chunk's start for it.
    #[inline]
    fn write_checksum_request(&self, desc: &FrameDesc, start: u16, offset: u16) -> bool {
        let addr = desc.addr();
        let chunk = addr & !(self.frame_size - 1);
        if !self.txmd || addr < chunk + txmd::TX_METADATA_LEN || chunk + self.frame_size > self.len
        {
            return false;
        }
        let at = addr - txmd::TX_METADATA_LEN;
        // SAFETY: `at..addr` lies inside one chunk of the mapping (checked
        // above): the bytes in front of the data of a frame in the *user*
        // state, queued for TX by this thread and not yet produced on a
        // ring; no slice of its chunk exists (it was written through a
        // borrow that has ended).
        let meta = unsafe { &mut *self.base.add(at).cast::<[u8; txmd::TX_METADATA_LEN]>() };
        txmd::write_checksum_request(meta, start, offset);
        true
    }

    /// Frames in the UMEM, free frames, ports attached.
    pub fn usage(&self) -> UmemUsage {
        let f = self.frames.borrow();
        UmemUsage {
            frames: f.pristine.len(),
            free: f.free.len(),
            ports: f.ports,
        }
    }
}

/// What [`UmemMem::write`] copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    All,
    /// Only this many bytes fit.
    Part(usize),
}

/// How a UMEM is used (see [`UmemMem::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UmemUsage {
    pub frames: usize,
    pub free: usize,
    pub ports: usize,
}

/// The frames of a UMEM: which are free, and which port's kernel rings
/// hold the others, so that the frames of a port that closes come back
/// to the ports still sharing the UMEM.
#[derive(Debug)]
struct Frames {
    free: Vec<FrameDesc>,
    /// Per frame (by index: address / frame size), the slot of the port
    /// whose fill or TX ring it was produced on; 0 once it came back
    /// (received, completed) or while it is free.
    owner: Vec<u16>,
    /// Frame i's descriptor as the UMEM handed it out.
    pristine: Vec<FrameDesc>,
    /// Slots taken (index 0 is never one): by a port, or by a closed
    /// port whose frames are not reclaimed yet.
    slots: Vec<bool>,
    /// Ports attached.
    ports: usize,
    /// Frames fill rings above [`FILL_MIN`] leave free for TX.
    reserve: usize,
    /// Frames even a fill ring below [`FILL_MIN`] leaves free for TX.
    tx_floor: usize,
}

impl Frames {
    fn new(pristine: Vec<FrameDesc>) -> Frames {
        let n = pristine.len();
        let mut free = pristine.clone();
        free.reverse();
        let mut f = Frames {
            free,
            owner: vec![0; n],
            pristine,
            slots: vec![true],
            ports: 0,
            reserve: 0,
            tx_floor: 0,
        };
        f.size_reserve(0);
        f
    }

    /// A slot for a new port (None if 65535 are taken); sizes the
    /// reserve for `batch`.
    fn attach(&mut self, batch: usize) -> Option<u16> {
        let slot = match self.slots.iter().position(|used| !used) {
            Some(i) => i,
            None if self.slots.len() <= u16::MAX as usize => {
                self.slots.push(false);
                self.slots.len() - 1
            }
            None => return None,
        };
        let slot_id = u16::try_from(slot).ok()?;
        self.slots[slot] = true;
        self.ports += 1;
        self.size_reserve(batch);
        Some(slot_id)
    }

    /// A port left (its slot stays taken until [`Frames::reclaim`]).
    fn detach(&mut self) {
        self.ports = self.ports.saturating_sub(1);
    }

    /// A port's share of the UMEM (at least [`FILL_MIN`], at most a full
    /// ring): the frames the TX reserve leaves to fill rings, divided
    /// equally among the ports. A busy port's fill ring grows to it and
    /// no further, and an idle one decays back to it, no lower.
    ///
    /// Frames on a fill ring stay the kernel's until packets arrive on
    /// that port: a port that grew beyond its share while others were
    /// idle would keep the surplus when it went idle, and another port
    /// woken by a burst would find nothing to grow with (measured: a pod's
    /// first TCP burst after three other pods had been busy lost ~4,000
    /// of its 64 KiB segments). An idle port keeps its share because a pod
    /// idle for seconds that then opens a connection sends its first
    /// burst (megabytes with a large pod MTU; `tcp_limit_output_bytes` is
    /// 4 MiB) onto that ring before the next adaptation could grow it.
    fn port_share(&self) -> usize {
        let rings = self.pristine.len().saturating_sub(self.reserve);
        (rings / self.ports.max(1)).clamp(FILL_MIN, FILL_TARGET)
    }

    /// How many frames a port whose fill target is `target` may add to
    /// it now: up to its share ([`Frames::port_share`]) from any spare
    /// frame (the free ones above the TX reserve), and, when `need`
    /// (frames were lost to its empty ring, or a burst half drained it),
    /// beyond its share when that is less than [`BORROW_UP_TO`], up to
    /// it: half the spare frames left, and never the last
    /// [`Frames::headroom`] of them.
    ///
    /// Borrowed frames sit on the ring until packets arrive there, like
    /// any, so they are lent only against a burst, only where the share
    /// is too small for one, and only what leaves the next port room to
    /// grow: on a node with many pods the equal share is a few hundred
    /// frames (two dozen 64 KiB segments), while most of the UMEM sits
    /// free because most pods are quiet. Where the shares are large a
    /// borrower would take frames the next busy port's share needs.
    fn room_to_grow(&self, target: usize, need: bool) -> usize {
        let spare = self.free.len().saturating_sub(self.reserve);
        let share = self.port_share();
        let fair = share.saturating_sub(target).min(spare);
        let left = spare - fair;
        // Half of what is left, so that the next port under a burst can
        // borrow too (half as much), never the headroom, and only up to
        // what one TCP stream's bursts need.
        let borrow = if need && share < BORROW_UP_TO {
            (left / 2)
                .min(left.saturating_sub(self.headroom()))
                .min(BORROW_UP_TO.saturating_sub(target + fair))
        } else {
            0
        };
        (fair + borrow).min(FILL_TARGET.saturating_sub(target))
    }

    /// How many free frames a port whose fill ring holds `filled` frames
    /// and should hold `target` takes now ([`XskPort::refill`]): what is
    /// above the TX reserve (and, to bring the ring up to [`FILL_MIN`],
    /// from the reserve down to its floor), and the part
    /// of its target beyond its share (borrowed, [`Frames::room_to_grow`])
    /// only from spare frames above the [`Frames::headroom`]. Targets of
    /// several ports may grow in one round against the same spare frames
    /// (growing takes no frame; this does), and without this rule two
    /// borrowers under a burst at once took the headroom too, so that a
    /// third port, or the gateway, could not even grow to its share.
    fn refill_count(&self, filled: usize, target: usize) -> usize {
        let want = target.saturating_sub(filled);
        let above_reserve = self.free.len().saturating_sub(self.reserve);
        // Into the reserve, down to its floor, only for what brings the
        // ring up to FILL_MIN.
        let dip = FILL_MIN
            .saturating_sub(filled)
            .min(self.free.len().saturating_sub(self.tx_floor));
        let avail = above_reserve.max(dip);
        let fair = self.port_share().saturating_sub(filled).min(want);
        if want == fair {
            return want.min(avail);
        }
        let fair = fair.min(avail);
        let spare = above_reserve.saturating_sub(fair);
        fair + (want - fair).min(spare.saturating_sub(self.headroom()))
    }

    /// Spare frames a port growing beyond its share must leave: what two
    /// ports need to grow to their shares (or from [`FILL_START`], so
    /// that a port woken by a burst finds a start's worth even when the
    /// shares are small).
    fn headroom(&self) -> usize {
        2 * self.port_share().max(FILL_START)
    }

    fn size_reserve(&mut self, batch: usize) {
        let total = self.pristine.len();
        self.reserve = self.reserve.max((total / 4).max(batch * 2).min(total / 2));
        self.tx_floor = self.tx_floor.max((batch * 2).min(total / 8));
    }

    fn reclaim(&mut self, slot: u16) -> usize {
        if slot == 0 {
            return 0;
        }
        let mut n = 0;
        for (o, d) in self.owner.iter_mut().zip(&self.pristine) {
            if *o == slot {
                *o = 0;
                self.free.push(*d);
                n += 1;
            }
        }
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = false;
        }
        n
    }

    /// Records that `descs` went to `slot`'s kernel rings.
    #[inline]
    fn given(&mut self, descs: &[FrameDesc], slot: u16) {
        for d in descs {
            // A constant power of two: a shift, not a division.
            if let Some(o) = self.owner.get_mut(d.addr() / FRAME_SIZE as usize) {
                *o = slot;
            }
        }
    }

    /// Records that `descs` came back from the kernel.
    #[inline]
    fn returned(&mut self, descs: &[FrameDesc]) {
        self.given(descs, 0);
    }
}

/// The UMEM one datapath thread shares between its ports on virtual
/// devices (see the module documentation): bound first to one queue of an
/// anchor device that carries no traffic, so that every port can come and
/// go.
pub struct ThreadUmem {
    // Drop order: the anchor's rings (its socket) before the UMEM.
    _anchor: (TxQueue, RxQueue, FillQueue, CompQueue),
    mem: Rc<UmemMem>,
}

impl std::fmt::Debug for ThreadUmem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadUmem")
            .field("usage", &self.mem.usage())
            .finish()
    }
}

impl ThreadUmem {
    /// Maps a UMEM of `frames` frames and binds its first socket to queue
    /// `queue` of `anchor` (a device with no traffic, such as a dummy),
    /// copy mode, no XDP program. Registered with TX metadata when
    /// `tx_metadata` and the kernel has it ([`UmemMem::tx_metadata`]).
    pub fn new(
        anchor: &str,
        queue: u32,
        frames: u32,
        tx_metadata: bool,
    ) -> Result<ThreadUmem, AfxdpError> {
        let iface: Interface = anchor
            .parse()
            .map_err(|_| AfxdpError::BadName(anchor.to_string()))?;
        let sock_err = |reason: String| AfxdpError::Socket {
            ifname: anchor.into(),
            tried: "anchor (generic/copy, no program)".into(),
            reason,
        };
        let qsize = |n: u32| QueueSize::new(n).map_err(|e| sock_err(e.to_string()));
        // Multi-buffer first (kernel 6.6+), so every port on this UMEM can
        // take frames larger than a page; without it where the kernel
        // refuses the flag.
        let mut last_err = String::new();
        for sg in [true, false] {
            let mut mem = map_umem(frames, tx_metadata)?;
            mem.sg = sg;
            let config = SocketConfig::builder()
                .rx_queue_size(qsize(RX_RING_SIZE)?)
                .tx_queue_size(qsize(TX_RING_SIZE)?)
                .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
                .xdp_flags(XdpFlags::XDP_FLAGS_SKB_MODE)
                .bind_flags(copy_bind_flags(sg))
                .build();
            // SAFETY: the UMEM is fresh, so (anchor, queue) is not bound to
            // it; the program load is inhibited anyway.
            match unsafe { Socket::new(config, &mem._umem, &iface, queue) } {
                Ok((tx, rx, Some((fq, cq)))) => {
                    if !sg {
                        tracing::info!(anchor, error = %last_err, "no multi-buffer AF_XDP (XDP_USE_SG): frames larger than a page are dropped");
                    }
                    return Ok(ThreadUmem {
                        _anchor: (tx, rx, fq, cq),
                        mem: Rc::new(mem),
                    });
                }
                Ok((_, _, None)) => {
                    return Err(sock_err("libxdp returned no fill/completion rings".into()))
                }
                Err(e) => last_err = chain(&e),
            }
        }
        Err(sock_err(last_err))
    }

    /// What sockets are created from ([`XskPort::prepare`], on any thread).
    pub fn handle(&self) -> xsk_rs::Umem {
        self.mem._umem.clone()
    }

    /// The frames (what [`XskPort::from_prepared`] attaches ports to).
    pub fn mem(&self) -> &Rc<UmemMem> {
        &self.mem
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
/// Every frame the port loses is counted once in `rx_dropped` or
/// `tx_dropped`, and once under its reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_errors: u64,
    /// Received by the kernel but the RX ring was full (the switch did not
    /// drain it in time).
    pub rx_ring_full: u64,
    /// Received by the kernel but the fill ring was empty (no frame to
    /// copy into), or, on a multi-buffer socket, held fewer frames than
    /// the packet needs (a 64 KiB segment takes 17).
    pub rx_fill_empty: u64,
    /// Dropped by the kernel for another reason (too big for a frame).
    pub rx_other: u64,
    /// To send, but no free frame in the UMEM.
    pub tx_no_frame: u64,
    /// To send, but the TX ring (or the queue in front of it) was full.
    pub tx_ring_full: u64,
    /// Packets queued asking the kernel to finish their checksum
    /// ([`XskPort::send_unfinished`]; counted when queued, as `tx_moved`).
    pub tx_checksum_requests: u64,
    /// Queued without a copy: a packet received on a port sharing this
    /// port's UMEM, in its own frames ([`XskPort::send_moved`]; counted
    /// when queued, so one the ring refuses is in `tx_dropped` too).
    pub tx_moved: u64,
}

/// A socket made by [`XskPort::prepare`], with its own UMEM or on a
/// thread's shared one, not yet a port (no frame is on a ring yet):
/// `Send`, so it can be made off the datapath thread.
pub struct PreparedXsk {
    ifname: String,
    queue: u32,
    mode: SocketMode,
    // Drop order: the rings (each holding the socket) before the UMEM.
    tx: TxQueue,
    rx: RxQueue,
    fq: FillQueue,
    cq: CompQueue,
    /// The port's own UMEM; `None` when the socket is on the shared UMEM
    /// it was prepared with.
    own: Option<UmemMem>,
    /// The switch's XDP program on the interface, when it serves the port
    /// (else libxdp's own program does). The socket is not in its slot
    /// yet: [`XskPort::from_prepared`] puts it there.
    xdp: Option<XdpAttachment>,
    /// Bound with `XDP_USE_SG` (on its own UMEM; a socket on a shared
    /// UMEM has what the UMEM has).
    sg: bool,
}

/// One receive queue to prepare a socket for
/// ([`XskPort::prepare_queues`]), and the shared UMEM (a
/// [`ThreadUmem::handle`]) of the thread that will serve it.
#[derive(Clone, Copy)]
pub struct QueueTarget<'a> {
    pub queue: u32,
    pub shared: Option<&'a xsk_rs::Umem>,
}

impl PreparedXsk {
    /// The receive queue the socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The mode the socket got.
    pub fn mode(&self) -> SocketMode {
        self.mode
    }

    /// Whether the socket uses the shared UMEM it was prepared with.
    pub fn is_shared(&self) -> bool {
        self.own.is_none()
    }
}

impl std::fmt::Debug for PreparedXsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedXsk")
            .field("ifname", &self.ifname)
            .field("queue", &self.queue)
            .field("mode", &self.mode)
            .field("shared", &self.is_shared())
            .finish()
    }
}

/// What is left of a port to drop: its socket, and its UMEM if it had its
/// own (see [`XskPort::into_closing`]). Field order is drop order.
pub struct ClosingXsk {
    _tx: TxQueue,
    _rx: RxQueue,
    _fq: FillQueue,
    _cq: CompQueue,
    _own: Option<UmemMem>,
    _xdp: Option<XdpAttachment>,
    reclaim: Option<u16>,
}

impl ClosingXsk {
    /// The slot whose frames the shared UMEM takes back
    /// ([`UmemMem::reclaim`]) once this is dropped; `None` for a port
    /// that had its own UMEM.
    pub fn reclaim_slot(&self) -> Option<u16> {
        self.reclaim
    }
}

/// One AF_XDP socket bound to one receive queue of an interface, on its
/// own UMEM or on its datapath thread's shared one (a port on an interface
/// with several queues is one `XskPort` per queue).
pub struct XskPort {
    ifname: String,
    queue: u32,
    mode: SocketMode,
    // Field order is drop order: the rings (each holding the socket) go
    // before the UMEM handles.
    tx: TxQueue,
    rx: RxQueue,
    fq: FillQueue,
    cq: CompQueue,
    mem: Rc<UmemMem>,
    xdp: Option<XdpAttachment>,
    /// This port's tag on the frames its kernel rings hold.
    slot: u16,
    /// Whether `mem` is shared with other ports.
    shared: bool,
    /// Frames currently on the fill ring.
    filled: usize,
    /// Frames the fill ring is topped up to (adapted to the port's load on
    /// a shared UMEM, see [`FILL_MIN`]).
    fill_target: usize,
    /// Full RX batches (at least [`BURST_DESCS`] descriptors) since the
    /// fill target was last adapted.
    full_batches: u32,
    /// Packets received since the fill target was last adapted.
    rx_since_adapt: u64,
    /// Adaptations in a row without a full batch.
    idle_rounds: u32,
    /// When the port last warned that it lost frames with its fill ring
    /// as large as it may be ([`XskPort::warn_at_limit`]).
    warned_at_limit: Option<std::time::Instant>,
    /// Frames queued for TX, not yet submitted.
    pending_tx: Vec<FrameDesc>,
    /// Frames submitted on TX, not yet completed.
    in_flight: usize,
    /// Scratch for ring transfers.
    scratch: Vec<FrameDesc>,
    counters: PortCounters,
    /// The socket's kernel counters already reported.
    kernel_seen: KernelDrops,
    /// Whether the socket takes and sends packets in several descriptors
    /// (bound with `XDP_USE_SG`, or on a UMEM whose first socket was).
    sg: bool,
    /// Dropping the rest of a packet whose start a batch ended in.
    rx_skipping: bool,
}

/// [`XskPort::packets`] on the descriptors' "continued" flags: the index
/// ranges of whole packets of at most [`MAX_CHAIN`] descriptors go to
/// `out` (cleared first); returns how many packets were dropped. A packet
/// still going on at the end sets `skipping`, which drops the descriptors
/// up to the end of the next packet (its rest) in the next batch.
fn split_packets(
    contd: impl Iterator<Item = bool>,
    skipping: &mut bool,
    out: &mut Vec<std::ops::Range<usize>>,
) -> u64 {
    out.clear();
    let mut dropped = 0;
    let mut start = 0;
    let mut len = 0;
    for (i, c) in contd.enumerate() {
        len = i + 1;
        if c {
            continue;
        }
        // `i` ends a packet that began at `start` (or the rest of one
        // dropped, and counted, when the last batch ended in it).
        let rest_of_dropped = *skipping;
        if i + 1 - start > MAX_CHAIN && !rest_of_dropped {
            dropped += 1;
        } else if !rest_of_dropped {
            out.push(start..i + 1);
        }
        *skipping = false;
        start = i + 1;
    }
    if start < len {
        // A packet goes on past this batch: drop it, and its rest.
        if !*skipping {
            dropped += 1;
        }
        *skipping = true;
    }
    dropped
}

/// The kernel's drop counters of a socket (`XDP_STATISTICS`).
#[derive(Clone, Copy, Debug, Default)]
struct KernelDrops {
    /// Every drop but a full RX ring, fill-ring-empty drops included.
    dropped: u64,
    ring_full: u64,
    fill_empty: u64,
}

impl std::fmt::Debug for XskPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskPort")
            .field("ifname", &self.ifname)
            .field("mode", &self.mode)
            .field("shared", &self.shared)
            .finish()
    }
}

impl XskPort {
    /// Opens an AF_XDP socket on `ifname` queue 0 with its own UMEM of
    /// `frames` frames, and fills its fill ring: [`XskPort::prepare`] then
    /// [`XskPort::from_prepared`] on the calling thread.
    pub fn open(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
        batch: usize,
    ) -> Result<XskPort, AfxdpError> {
        XskPort::open_queue(ifname, 0, request, frames, batch)
    }

    /// [`XskPort::open`] on receive queue `queue`.
    pub fn open_queue(
        ifname: &str,
        queue: u32,
        request: XdpModeRequest,
        frames: u32,
        batch: usize,
    ) -> Result<XskPort, AfxdpError> {
        let target = QueueTarget {
            queue,
            shared: None,
        };
        let p = XskPort::prepare_queues(ifname, request, frames, &[target], None)?
            .pop()
            .ok_or_else(|| AfxdpError::Socket {
                ifname: ifname.into(),
                tried: String::new(),
                reason: "no socket was made".into(),
            })?;
        XskPort::from_prepared(p, batch, None)
    }

    /// Makes the socket (the slow part: loading and attaching the XDP
    /// program, binding; and mapping and registering a UMEM when it gets
    /// its own), on any thread, so the datapath thread that will own the
    /// port does not stop forwarding meanwhile.
    ///
    /// With `shared` (a [`ThreadUmem::handle`]), a socket on a virtual
    /// device (veth, ...: no `device` in sysfs, never zero-copy) goes on
    /// that UMEM; a physical device gets its own UMEM of `frames` frames
    /// so it can have zero-copy (sockets sharing a UMEM get the mode of
    /// its first one, copy), as does any device if binding to the shared
    /// UMEM fails (with a warning).
    ///
    /// A queue whose previous socket was just closed stays busy until the
    /// kernel's deferred release runs (longer on a loaded machine): "device
    /// or resource busy" is retried for up to three seconds.
    pub fn prepare(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
        shared: Option<&xsk_rs::Umem>,
        prog: Option<&Arc<XdpProgram>>,
    ) -> Result<PreparedXsk, AfxdpError> {
        let mut v = XskPort::prepare_queues(
            ifname,
            request,
            frames,
            &[QueueTarget { queue: 0, shared }],
            prog,
        )?;
        v.pop().ok_or_else(|| AfxdpError::Socket {
            ifname: ifname.into(),
            tried: String::new(),
            reason: "no socket was made".into(),
        })
    }

    /// [`XskPort::prepare`] for several receive queues of one interface: a
    /// socket per target (in that order), each bound to its queue and on
    /// its target's UMEM (shared ones may differ: the queues of one port
    /// can be served by different datapath threads). All or none: the
    /// interface's XDP program is attached once, in one mode every queue
    /// gets.
    pub fn prepare_queues(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
        targets: &[QueueTarget<'_>],
        prog: Option<&Arc<XdpProgram>>,
    ) -> Result<Vec<PreparedXsk>, AfxdpError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        // Virtual devices (veth, ...) have no `device` in sysfs and never do
        // zero-copy: trying costs an XDP program load for nothing.
        let physical = crate::netdev::is_physical(ifname);
        let mut targets: Vec<QueueTarget<'_>> = targets
            .iter()
            .map(|t| QueueTarget {
                queue: t.queue,
                shared: t.shared.filter(|_| !physical),
            })
            .collect();
        loop {
            match XskPort::prepare_once(ifname, request, frames, physical, &targets, prog) {
                Err(AfxdpError::Socket { ref reason, .. })
                    if reason.contains("busy") && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) if targets.iter().any(|t| t.shared.is_some()) => {
                    tracing::warn!(
                        ifname,
                        error = %e,
                        "cannot bind to the thread's shared UMEM; the port gets its own"
                    );
                    for t in &mut targets {
                        t.shared = None;
                    }
                }
                r => return r,
            }
        }
    }

    fn prepare_once(
        ifname: &str,
        request: XdpModeRequest,
        frames: u32,
        physical: bool,
        targets: &[QueueTarget<'_>],
        prog: Option<&Arc<XdpProgram>>,
    ) -> Result<Vec<PreparedXsk>, AfxdpError> {
        let iface: Interface = ifname
            .parse()
            .map_err(|_| AfxdpError::BadName(ifname.to_string()))?;
        let natives: &[bool] = match request {
            XdpModeRequest::Auto => &[true, false],
            XdpModeRequest::Native => &[true],
            XdpModeRequest::Generic => &[false],
        };
        if let Some(prog) = prog.filter(|_| !physical) {
            if let Some(p) =
                XskPort::prepare_with_program(ifname, &iface, request, frames, targets, prog)?
            {
                return Ok(p);
            }
        }
        let mut tried = Vec::new();
        let mut last_err = String::new();
        let copy_modes: &[bool] = if physical { &[true, false] } else { &[false] };
        for &native in natives {
            'attempts: for &zero_copy in copy_modes {
                let mode = SocketMode { native, zero_copy };
                tried.push(mode.name());
                // Ignored by the kernel for a socket on a shared UMEM
                // (libxdp does not pass them): it inherits the first
                // socket's copy mode and need-wakeup.
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
                let config = socket_config(ifname, mode, LibxdpFlags::empty(), xdp, bind)?;
                let mut made = Vec::with_capacity(targets.len());
                for t in targets {
                    let t0 = std::time::Instant::now();
                    // A fresh own UMEM per attempt: a failed bind may leave
                    // libxdp state on the old one.
                    let own = own_umem_unless(t.shared, frames)?;
                    let Some(umem) = own.as_ref().map(|m| &m._umem).or(t.shared) else {
                        return Err(AfxdpError::Umem {
                            frames,
                            reason: "no UMEM to bind to".into(),
                        });
                    };
                    let t_umem = t0.elapsed();
                    // SAFETY: (ifname, queue) is not bound to this UMEM: an
                    // own UMEM is fresh, the targets name distinct queues,
                    // and on a shared one the engine refuses an interface
                    // that is already a port (the anchor is a device no
                    // port uses), so the INHIBIT_PROG_LOAD requirement
                    // does not apply.
                    let r = unsafe { Socket::new(config, umem, &iface, t.queue) };
                    tracing::debug!(
                        ifname,
                        queue = t.queue,
                        mode = mode.name(),
                        shared = t.shared.is_some(),
                        umem_ms = t_umem.as_secs_f64() * 1e3,
                        socket_ms = (t0.elapsed() - t_umem).as_secs_f64() * 1e3,
                        ok = r.is_ok(),
                        "AF_XDP socket attempt"
                    );
                    match r {
                        Ok((tx, rx, Some((fq, cq)))) => made.push(PreparedXsk {
                            ifname: ifname.to_string(),
                            queue: t.queue,
                            mode,
                            tx,
                            rx,
                            fq,
                            cq,
                            own,
                            xdp: None,
                            sg: false,
                        }),
                        Ok((_, _, None)) => {
                            last_err = "libxdp returned no fill/completion rings".into();
                            continue 'attempts;
                        }
                        Err(e) => {
                            last_err = format!("queue {}: {}", t.queue, chain(&e));
                            tracing::debug!(ifname, mode = mode.name(), error = %last_err, "AF_XDP bind attempt failed");
                            // The sockets made so far close with `made`.
                            continue 'attempts;
                        }
                    }
                }
                if !native && request == XdpModeRequest::Auto {
                    tracing::warn!(
                        ifname,
                        "native XDP mode is not available; using generic (skb) mode ({last_err})"
                    );
                }
                return Ok(made);
            }
        }
        Err(AfxdpError::Socket {
            ifname: ifname.into(),
            tried: tried.join(", "),
            reason: last_err,
        })
    }

    /// [`XskPort::prepare_once`] with the switch's own XDP program
    /// ([`crate::xdpprog`]): attach it once (native, else generic as
    /// `request` allows), bind a socket per queue without libxdp loading
    /// anything, and put each socket in its queue's slot. `None` when the
    /// interface has another XDP program attached already (the caller
    /// falls back to libxdp, which takes that one over).
    fn prepare_with_program(
        ifname: &str,
        iface: &Interface,
        request: XdpModeRequest,
        frames: u32,
        targets: &[QueueTarget<'_>],
        prog: &Arc<XdpProgram>,
    ) -> Result<Option<Vec<PreparedXsk>>, AfxdpError> {
        let natives: &[bool] = match request {
            XdpModeRequest::Auto => &[true, false],
            XdpModeRequest::Native => &[true],
            XdpModeRequest::Generic => &[false],
        };
        let queues: Vec<u32> = targets.iter().map(|t| t.queue).collect();
        let mut tried = Vec::new();
        let mut last_err = String::new();
        for &native in natives {
            let mode = SocketMode {
                native,
                zero_copy: false,
            };
            tried.push(mode.name());
            let t0 = std::time::Instant::now();
            let attachments = match prog.attach(ifname, &queues, native) {
                Ok(a) => a,
                Err(e) if e.is_busy() => {
                    tracing::debug!(ifname, error = %e, "interface has an XDP program already; libxdp takes it over");
                    return Ok(None);
                }
                Err(e) => {
                    last_err = e.to_string();
                    continue;
                }
            };
            let socket_err = |reason: String| AfxdpError::Socket {
                ifname: ifname.into(),
                tried: mode.name().into(),
                reason,
            };
            let mut made = Vec::with_capacity(targets.len());
            let mut t_umem = std::time::Duration::ZERO;
            for (t, xdp) in targets.iter().zip(attachments) {
                // On an own UMEM, multi-buffer first (kernel 6.6+), then
                // without; a socket on the shared UMEM takes no bind flags.
                let t_umem0 = std::time::Instant::now();
                let mut bound = None;
                let sgs: &[bool] = if t.shared.is_some() {
                    &[false]
                } else {
                    &[true, false]
                };
                for &sg in sgs {
                    // The XDP flags only matter to a program libxdp loads: none.
                    let config = socket_config(
                        ifname,
                        mode,
                        LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD,
                        XdpFlags::empty(),
                        copy_bind_flags(sg),
                    )?;
                    let own = own_umem_unless(t.shared, frames)?;
                    let Some(umem) = own.as_ref().map(|m| &m._umem).or(t.shared) else {
                        return Err(AfxdpError::Umem {
                            frames,
                            reason: "no UMEM to bind to".into(),
                        });
                    };
                    t_umem += t_umem0.elapsed();
                    // SAFETY: INHIBIT_PROG_LOAD is set, so libxdp neither loads
                    // nor detaches a program for this socket, whichever sockets
                    // share the UMEM.
                    let r = unsafe { Socket::new(config, umem, iface, t.queue) };
                    match r {
                        Ok((tx, rx, Some((fq, cq)))) => {
                            bound = Some((tx, rx, fq, cq, own, sg));
                            break;
                        }
                        Ok((_, _, None)) => {
                            return Err(socket_err(
                                "libxdp returned no fill/completion rings".into(),
                            ))
                        }
                        Err(e) => last_err = format!("queue {}: {}", t.queue, chain(&e)),
                    }
                }
                let Some((tx, rx, fq, cq, own, sg)) = bound else {
                    // The attachments and sockets made so far go with
                    // `made` (the program is detached with the last); a
                    // busy queue is retried by the caller.
                    return Err(socket_err(std::mem::take(&mut last_err)));
                };
                // The socket goes in its XDP slot in `from_prepared`, once
                // its fill ring holds frames: put in now, a frame arriving
                // before the owning thread fills the ring is dropped
                // (fill ring empty) instead of passed to the host.
                made.push(PreparedXsk {
                    ifname: ifname.to_string(),
                    queue: t.queue,
                    mode,
                    tx,
                    rx,
                    fq,
                    cq,
                    own,
                    xdp: Some(xdp),
                    sg,
                });
            }
            // The same line as libxdp's path (cni-bench reads it):
            // socket_ms is the attach, bind and slot here.
            tracing::debug!(
                ifname,
                queues = made.len(),
                mode = mode.name(),
                shared = targets.iter().any(|t| t.shared.is_some()),
                program = "switch",
                umem_ms = t_umem.as_secs_f64() * 1e3,
                socket_ms = (t0.elapsed() - t_umem).as_secs_f64() * 1e3,
                ok = true,
                "AF_XDP socket attempt"
            );
            if !native && request == XdpModeRequest::Auto {
                tracing::warn!(
                    ifname,
                    "native XDP mode is not available; using generic (skb) mode ({last_err})"
                );
            }
            return Ok(Some(made));
        }
        Err(AfxdpError::Socket {
            ifname: ifname.into(),
            tried: tried.join(", "),
            reason: last_err,
        })
    }

    /// The port made of a [`PreparedXsk`], with its fill ring filled (on
    /// the thread that owns the port from now on). A socket prepared on a
    /// shared UMEM needs that UMEM's frames as `shared`.
    pub fn from_prepared(
        p: PreparedXsk,
        batch: usize,
        shared: Option<&Rc<UmemMem>>,
    ) -> Result<XskPort, AfxdpError> {
        let PreparedXsk {
            ifname,
            queue,
            mode,
            tx,
            rx,
            fq,
            cq,
            own,
            xdp,
            sg,
        } = p;
        let (mem, is_shared) = match (own, shared) {
            (Some(mut m), _) => {
                m.sg = sg;
                (Rc::new(m), false)
            }
            (None, Some(m)) => (Rc::clone(m), true),
            (None, None) => {
                return Err(AfxdpError::Socket {
                    ifname,
                    tried: mode.name().into(),
                    reason: "the socket is on a shared UMEM this thread does not have".into(),
                })
            }
        };
        let sg = mem.sg;
        let slot = mem.frames.borrow_mut().attach(batch);
        let (frames_total, frames_free) = {
            let f = mem.frames.borrow();
            (f.pristine.len(), f.free.len())
        };
        let Some(slot) = slot else {
            return Err(AfxdpError::Socket {
                ifname,
                tried: mode.name().into(),
                reason: "65535 ports already share this UMEM".into(),
            });
        };
        let mut port = XskPort {
            ifname,
            queue,
            mode,
            tx,
            rx,
            fq,
            cq,
            mem,
            xdp,
            slot,
            shared: is_shared,
            filled: 0,
            // A port with its own UMEM fills its ring (up to half the
            // UMEM); one on a shared UMEM starts as `start_fill` says, and
            // a busy one grows to its share of the UMEM
            // (`Frames::port_share`).
            fill_target: if !is_shared {
                FILL_TARGET.min(frames_total / 2)
            } else {
                start_fill(frames_total, frames_free)
            },
            full_batches: 0,
            rx_since_adapt: 0,
            idle_rounds: 0,
            warned_at_limit: None,
            pending_tx: Vec::with_capacity(batch.max(1) * 4),
            in_flight: 0,
            scratch: Vec::with_capacity(RX_RING_SIZE as usize),
            counters: PortCounters::default(),
            kernel_seen: KernelDrops::default(),
            sg,
            rx_skipping: false,
        };
        if !port.mode.zero_copy {
            port.raise_tx_budget();
        }
        port.refill();
        // Only now does the switch's program redirect to the socket: the
        // fill ring has frames for what arrives.
        let inserted = match &port.xdp {
            Some(xdp) => xdp.insert_socket(port.rx.fd().as_raw_fd()),
            None => Ok(()),
        };
        if let Err(e) = inserted {
            let error = AfxdpError::Socket {
                ifname: port.ifname.clone(),
                tried: port.mode.name().into(),
                reason: e.to_string(),
            };
            // The frames just put on the fill ring go back to the UMEM.
            let mem = Rc::clone(&port.mem);
            let closing = port.into_closing();
            let slot = closing.reclaim_slot();
            drop(closing);
            if let Some(slot) = slot {
                mem.reclaim(slot);
            }
            return Err(error);
        }
        Ok(port)
    }

    /// The socket, and the port's own UMEM, to be dropped on another
    /// thread (closing a socket detaches the XDP program, unmapping a UMEM
    /// is slow too). On a shared UMEM the frames the socket's rings hold
    /// come back with [`UmemMem::reclaim`] once the socket is closed
    /// ([`ClosingXsk::reclaim_slot`]).
    pub fn into_closing(self) -> ClosingXsk {
        let XskPort {
            tx,
            rx,
            fq,
            cq,
            mem,
            xdp,
            slot,
            shared,
            pending_tx,
            ..
        } = self;
        {
            let mut f = mem.frames.borrow_mut();
            f.free.extend_from_slice(&pending_tx);
            f.detach();
        }
        // An own UMEM is still held by a batch only if the caller closes
        // the port mid-batch, which the engine does not: then it is
        // unmapped wherever its last holder drops it.
        let own = if shared {
            None
        } else {
            Rc::try_unwrap(mem).ok()
        };
        ClosingXsk {
            _tx: tx,
            _rx: rx,
            _fq: fq,
            _cq: cq,
            _own: own,
            _xdp: xdp,
            reclaim: shared.then_some(slot),
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

    /// The receive queue the socket is bound to.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// The port's frames (received packets are read through this).
    pub fn mem(&self) -> Rc<UmemMem> {
        Rc::clone(&self.mem)
    }

    /// Tops the fill ring up to its target from the free frames, keeping
    /// a reserve there for TX (only a floor of it while the ring is below
    /// [`FILL_MIN`], so that a new port can always receive).
    pub fn refill(&mut self) {
        let mut f = self.mem.frames.borrow_mut();
        let n = f.refill_count(self.filled, self.fill_target);
        if n == 0 {
            return;
        }
        let at = f.free.len() - n;
        self.scratch.clear();
        self.scratch.extend(f.free.drain(at..));
        // SAFETY: the frames come from the free list (*user* state, no
        // slice of them exists) and belong to this fill ring's UMEM.
        let done = unsafe { self.fq.produce(&self.scratch) };
        f.given(&self.scratch[..done], self.slot);
        f.free.extend_from_slice(&self.scratch[done..]);
        self.scratch.clear();
        self.filled += done;
    }

    /// Receives up to `out.len()` frames; they become *user* frames, to be
    /// handed back with [`XskPort::recycle`]. Returns how many.
    ///
    /// A packet spanning several descriptors (multi-buffer) is taken whole
    /// when `out` has room: up to `out.len() - MAX_CHAIN` descriptors are
    /// taken first, then the rest of a packet they end in the middle of
    /// (the kernel publishes a packet's descriptors together).
    /// [`XskPort::packets`] splits the result into packets.
    #[inline]
    pub fn recv(&mut self, out: &mut [FrameDesc]) -> usize {
        let first = out.len().saturating_sub(MAX_CHAIN).max(1).min(out.len());
        // SAFETY: the descriptors in `out` are overwritten with frames the
        // kernel hands back on this socket's RX ring (this port's UMEM);
        // they become *user* frames.
        let mut n = unsafe { self.rx.consume(&mut out[..first]) };
        if n == 0 {
            return 0;
        }
        while out
            .get(n - 1)
            .is_some_and(|d| d.options() & XDP_PKT_CONTD != 0)
        {
            let Some(next) = out.get_mut(n) else { break };
            // SAFETY: as above.
            if unsafe { self.rx.consume_one(next) } == 0 {
                break;
            }
            n += 1;
        }
        let got = &out[..n];
        self.rx_since_adapt += n as u64;
        // Packets, not descriptors: a packet's last descriptor has no
        // XDP_PKT_CONTD.
        self.counters.rx_packets += got
            .iter()
            .filter(|d| d.options() & XDP_PKT_CONTD == 0)
            .count() as u64;
        self.counters.rx_bytes += got.iter().map(|d| d.lengths().data() as u64).sum::<u64>();
        self.mem.frames.borrow_mut().returned(got);
        let filled_before = self.filled;
        self.filled = self.filled.saturating_sub(n);
        // A full batch: as many as asked for first (the rest of a packet
        // taken after them does not count), or a burst's worth when the
        // batch is larger than that.
        if n >= first.min(BURST_DESCS) {
            self.full_batches += 1;
            // A burst on a port whose target decayed while it was idle:
            // keep the frames its ring still holds (recycling only up to
            // the decayed target would drain the ring under the burst).
            if self.shared && filled_before > self.fill_target {
                self.fill_target = filled_before.min(FILL_TARGET);
            }
            // A full batch with the fill ring half drained: a burst is
            // under way, and the periodic adaptation would come too late.
            if self.shared && self.filled < self.fill_target / 2 {
                self.grow_fill(false, true);
            }
        }
        n
    }

    /// Splits `descs` (what [`XskPort::recv`] returned) into packets: the
    /// index ranges of their descriptors, in `out` (cleared first). A
    /// packet whose descriptors did not all arrive in this batch, or that
    /// spans more than [`MAX_CHAIN`] descriptors, is dropped (counted in
    /// `rx_other`), and so is the rest of it in the next batch.
    pub fn packets(&mut self, descs: &[FrameDesc], out: &mut Vec<std::ops::Range<usize>>) {
        let contd = descs.iter().map(|d| d.options() & XDP_PKT_CONTD != 0);
        let dropped = split_packets(contd, &mut self.rx_skipping, out);
        self.counters.rx_dropped += dropped;
        self.counters.rx_other += dropped;
    }

    /// Gives received frames back to the fill ring (what it cannot take,
    /// or does not need, goes to the free frames).
    #[inline]
    pub fn recycle(&mut self, frames: &[FrameDesc]) {
        let mut f = self.mem.frames.borrow_mut();
        let room = self
            .fill_target
            .saturating_sub(self.filled)
            .min(frames.len());
        // SAFETY: `frames` are *user* frames of this UMEM (from `recv`)
        // whose packet slices have all been dropped (the batch is done).
        let done = unsafe { self.fq.produce(&frames[..room]) };
        f.given(&frames[..done], self.slot);
        f.free.extend_from_slice(&frames[done..]);
        self.filled += done;
    }

    /// Queues `bytes` for transmission (copied into a free frame). Drops
    /// and counts when no frame is free or the packet does not fit.
    ///
    /// A frame larger than a UMEM frame goes out in several descriptors
    /// (multi-buffer, on a socket bound with `XDP_USE_SG`), all or none.
    #[inline]
    pub fn send(&mut self, bytes: &[u8]) {
        self.queue_tx(bytes);
    }

    /// As [`XskPort::send`], for a frame whose TCP/UDP checksum may be
    /// unfinished (a pod's, left partial by its kernel's TX checksum
    /// offload): on a UMEM with TX metadata the kernel is asked to finish
    /// it (the pseudo-header sum in the field and
    /// `XDP_TXMD_FLAGS_CHECKSUM`; the receiving stack then trusts it
    /// as it trusts a bridged pod's segment, and nothing sums the
    /// payload), else the complete checksum is written into the copy
    /// ([`checksum::l4_fix`]). Frames without one go as they are.
    #[inline]
    pub fn send_unfinished(&mut self, bytes: &[u8]) {
        if self.mem.txmd {
            // The kernel sums to the frame's end: only where the L4 data
            // ends there (no padding behind it).
            if let Some(p) = checksum::partial_l4(bytes).filter(|p| p.end == bytes.len()) {
                let (Ok(start), Ok(offset)) =
                    (u16::try_from(p.start), u16::try_from(p.field - p.start))
                else {
                    self.counters.tx_dropped += 1;
                    self.counters.tx_errors += 1;
                    return;
                };
                let Some(mark) = self.queue_tx(bytes) else {
                    return;
                };
                let ok = self.pending_tx.get(mark).is_some_and(|d| {
                    self.mem.patch(d, p.field, &p.pseudo.to_be_bytes())
                        && self.mem.write_checksum_request(d, start, offset)
                });
                match (ok, self.pending_tx.get_mut(mark)) {
                    (true, Some(d)) => {
                        d.set_options(d.options() | txmd::XDP_TX_METADATA);
                        self.counters.tx_checksum_requests += 1;
                    }
                    // No room for the request: the sum, computed here.
                    _ => self.fix_queued(mark, bytes),
                }
                return;
            }
        }
        if let Some(mark) = self.queue_tx(bytes) {
            self.fix_queued(mark, bytes);
        }
    }

    /// Writes the complete checksum of `bytes` ([`checksum::l4_fix`]; none
    /// for a frame without one) into the packet queued from
    /// `pending_tx[mark]`, which holds a copy of them; takes the packet
    /// back if it cannot.
    fn fix_queued(&mut self, mark: usize, bytes: &[u8]) {
        let Some(fix) = checksum::l4_fix(bytes) else {
            return;
        };
        let ok = self
            .pending_tx
            .get(mark)
            .is_some_and(|d| self.mem.patch(d, fix.at, fix.bytes()));
        if !ok {
            self.unqueue(mark);
        }
    }

    /// Takes back the packet queued from `pending_tx[mark]` on (its frames
    /// go back to the free frames): it could not be finished. Counted as
    /// an error.
    fn unqueue(&mut self, mark: usize) {
        let mut f = self.mem.frames.borrow_mut();
        f.free
            .extend(self.pending_tx.drain(mark.min(self.pending_tx.len())..));
        self.counters.tx_dropped += 1;
        self.counters.tx_errors += 1;
    }

    /// [`XskPort::send`]: the index in `pending_tx` of the packet's first
    /// descriptor when it was queued.
    #[inline]
    fn queue_tx(&mut self, bytes: &[u8]) -> Option<usize> {
        // A batch may output more than a ring's worth to one port (a
        // tunnel's coalesced trains): hand what is queued to the kernel
        // first (one per ring's worth), drop only if it takes nothing.
        let descs = bytes.len() / (FRAME_SIZE as usize / 2) + 1;
        if self.pending_tx.len() + descs > TX_RING_SIZE as usize {
            self.flush();
        }
        if self.pending_tx.len() >= TX_RING_SIZE as usize {
            self.counters.tx_dropped += 1;
            self.counters.tx_ring_full += 1;
            return None;
        }
        let mark = self.pending_tx.len();
        let mut f = self.mem.frames.borrow_mut();
        let Some(mut d) = f.free.pop() else {
            self.counters.tx_dropped += 1;
            self.counters.tx_no_frame += 1;
            return None;
        };
        match self.mem.write(&mut d, bytes) {
            Written::All => {
                d.set_options(0);
                self.pending_tx.push(d);
                Some(mark)
            }
            Written::Part(n) if bytes.len() <= MAX_FRAME_LEN && self.sg => {
                d.set_options(XDP_PKT_CONTD);
                self.pending_tx.push(d);
                let mut rest = bytes.get(n..).unwrap_or_default();
                while !rest.is_empty() {
                    let room = self.pending_tx.len() < TX_RING_SIZE as usize
                        && self.pending_tx.len() - mark < MAX_CHAIN;
                    // No frame taken when there is no room for it.
                    let Some(mut d) = room.then(|| f.free.pop()).flatten() else {
                        // Take the chain back: all or nothing.
                        f.free.extend(self.pending_tx.drain(mark..));
                        self.counters.tx_dropped += 1;
                        if room {
                            self.counters.tx_no_frame += 1;
                        } else {
                            self.counters.tx_ring_full += 1;
                        }
                        return None;
                    };
                    let n = match self.mem.write(&mut d, rest) {
                        Written::All => rest.len(),
                        Written::Part(n) if n > 0 => n,
                        _ => {
                            f.free.push(d);
                            f.free.extend(self.pending_tx.drain(mark..));
                            self.counters.tx_dropped += 1;
                            self.counters.tx_errors += 1;
                            return None;
                        }
                    };
                    rest = rest.get(n..).unwrap_or_default();
                    d.set_options(if rest.is_empty() { 0 } else { XDP_PKT_CONTD });
                    self.pending_tx.push(d);
                }
                Some(mark)
            }
            Written::Part(_) => {
                f.free.push(d);
                self.counters.tx_dropped += 1;
                self.counters.tx_errors += 1;
                None
            }
        }
    }

    /// Whether this port's frames live in `mem` (ports sharing a UMEM can
    /// take each other's received frames for TX: [`XskPort::send_moved`]).
    #[inline]
    pub fn uses(&self, mem: &Rc<UmemMem>) -> bool {
        Rc::ptr_eq(&self.mem, mem)
    }

    /// Queues a received packet for transmission without copying it: its
    /// own descriptors `descs` (a packet's, as [`XskPort::recv`] returned
    /// them, from this port's UMEM), after writing `head` over the first
    /// one's data when given (a gathered packet's rewritten headers).
    /// True if queued: the frames then belong to this port's TX and the
    /// caller must not give them back to a fill ring. False (nothing
    /// queued) when the ring has no room for them, a chain needs
    /// multi-buffer this socket lacks, or `head` does not fit.
    ///
    /// The caller vouches that the frames' contents are the packet to send
    /// and that nothing reads or writes them after this call.
    #[inline]
    pub fn send_moved(&mut self, descs: &[FrameDesc], head: Option<&[u8]>) -> bool {
        let Some(last) = descs.len().checked_sub(1) else {
            return false;
        };
        if last > 0 && !self.sg || descs.len() > MAX_CHAIN {
            return false;
        }
        if self.pending_tx.len() + descs.len() > TX_RING_SIZE as usize {
            self.flush();
        }
        if self.pending_tx.len() + descs.len() > TX_RING_SIZE as usize {
            return false;
        }
        if let Some(head) = head {
            if !self.mem.write_back(&descs[0], head) {
                return false;
            }
        }
        for (i, d) in descs.iter().enumerate() {
            let mut d = *d;
            d.set_options(if i < last { XDP_PKT_CONTD } else { 0 });
            self.pending_tx.push(d);
        }
        self.counters.tx_moved += 1;
        true
    }

    /// Submits queued frames to the TX ring and kicks the kernel if it asks
    /// for it; drains the completion ring back to the free frames; tops up
    /// the fill ring.
    pub fn flush(&mut self) {
        if !self.pending_tx.is_empty() {
            // SAFETY: `pending_tx` holds *user* frames of this UMEM, written
            // and no longer borrowed.
            let done = unsafe { self.tx.produce(&self.pending_tx) };
            for d in &self.pending_tx[..done] {
                self.counters.tx_packets += u64::from(d.options() & XDP_PKT_CONTD == 0);
                self.counters.tx_bytes += d.lengths().data() as u64;
            }
            // The ring takes all or nothing.
            let refused = self.pending_tx[done..]
                .iter()
                .filter(|d| d.options() & XDP_PKT_CONTD == 0)
                .count() as u64;
            self.counters.tx_dropped += refused;
            self.counters.tx_ring_full += refused;
            let mut f = self.mem.frames.borrow_mut();
            f.given(&self.pending_tx[..done], self.slot);
            f.free.extend_from_slice(&self.pending_tx[done..]);
            drop(f);
            self.pending_tx.clear();
            self.in_flight += done;
        }
        self.complete();
        // In copy mode the kernel transmits at most its budget per kick
        // (the whole ring where `raise_tx_budget` was granted, else 32) and
        // completes them at once: kick until the ring is drained or it
        // stops asking, bounded.
        let mut kicks = 0;
        while self.in_flight > 0 && self.tx.needs_wakeup() && kicks <= TX_RING_SIZE / 32 {
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

    /// Lets one kick of a copy-mode socket send the whole TX ring: the
    /// kernel sends at most 32 frames per `sendto` unless told more
    /// (`XDP_MAX_TX_SKB_BUDGET`, Linux 6.17+), and [`XskPort::flush`] would
    /// kick again for each 32. A kernel without the option keeps 32.
    fn raise_tx_budget(&self) {
        let budget: u32 = TX_RING_SIZE;
        let fd = self.rx.fd().as_raw_fd();
        // SAFETY: `budget` is a live u32 and its size is what is passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                SOL_XDP,
                XDP_MAX_TX_SKB_BUDGET,
                std::ptr::from_ref(&budget).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!(port = %self.ifname, queue = self.queue, error = %std::io::Error::last_os_error(), "the kernel keeps 32 frames per TX kick");
        }
    }

    /// Drains the completion ring back to the free frames.
    fn complete(&mut self) {
        if self.in_flight == 0 {
            return;
        }
        self.scratch.clear();
        self.scratch.resize(
            self.in_flight.min(TX_RING_SIZE as usize),
            FrameDesc::default(),
        );
        // SAFETY: the completion ring hands back frames this socket
        // transmitted from its UMEM; they become *user* (then free) frames.
        let n = unsafe { self.cq.consume(&mut self.scratch) };
        let mut f = self.mem.frames.borrow_mut();
        f.returned(&self.scratch[..n]);
        f.free.extend_from_slice(&self.scratch[..n]);
        drop(f);
        self.scratch.clear();
        self.in_flight -= n.min(self.in_flight);
    }

    /// Raises the fill target from the UMEM's spare frames
    /// ([`Frames::room_to_grow`]): doubled, or at once as far as it may
    /// go when `starved` (packets were lost to an empty fill ring: TCP
    /// bursts do not wait for doublings). Only a port in `need` (starved,
    /// or a burst half drained its ring) grows beyond its share.
    fn grow_fill(&mut self, starved: bool, need: bool) {
        let f = self.mem.frames.borrow();
        let want = if starved {
            FILL_TARGET
        } else {
            (self.fill_target * 2).min(FILL_TARGET)
        };
        let room = f.room_to_grow(self.fill_target, need || starved);
        let grown = want.min(self.fill_target + room);
        if grown > self.fill_target {
            tracing::debug!(port = %self.ifname, from = self.fill_target, to = grown, starved, share = f.port_share(), "fill ring grows");
            self.fill_target = grown;
        }
    }

    /// Adapts the fill target of a port on a shared UMEM to its load (called
    /// every few tens of milliseconds): a port is busy when it received a
    /// full RX batch (at least [`BURST_DESCS`] descriptors), lost packets
    /// to an empty fill ring, or received an eighth of what its fill ring
    /// holds since the last call. A busy
    /// port's target doubles while the UMEM has frames to spare, up to its
    /// share; a starved one's goes at once as far as
    /// [`Frames::room_to_grow`] lets it (beyond a small share, by
    /// borrowing). After twenty calls in a row without being
    /// busy it is lowered by a quarter (not below the port's share of the
    /// UMEM, [`Frames::port_share`]), and the fill ring gives frames back
    /// as packets arrive.
    fn adapt_fill(&mut self, starved: bool) {
        // Busy: an eighth of the ring's worth since the last call, so a
        // port keeps a ring of about 400 ms of its traffic (50 ms per
        // call), within the UMEM's spare frames: enough headroom for a
        // burst on top of a steady stream.
        let busy = self.full_batches > 0
            || starved
            || self.rx_since_adapt >= (self.fill_target / 8) as u64;
        self.full_batches = 0;
        self.rx_since_adapt = 0;
        if busy {
            self.idle_rounds = 0;
            self.grow_fill(starved, false);
            if starved {
                self.warn_at_limit();
            }
        } else {
            self.idle_rounds = self.idle_rounds.saturating_add(1);
            if self.idle_rounds >= 20 {
                self.idle_rounds = 0;
                let floor = self.mem.frames.borrow().port_share().min(self.fill_target);
                self.fill_target = (self.fill_target - self.fill_target / 4).max(floor);
                tracing::debug!(port = %self.ifname, to = self.fill_target, "fill ring shrinks (idle)");
            }
        }
    }

    /// Packets were lost to an empty fill ring: if the ring may not grow
    /// any further below a full one (its share of the UMEM, or what it may
    /// borrow, or the UMEM has no frame to spare), say so, at most once a
    /// minute per port: the remedy is the operator's (`--umem-frames`).
    fn warn_at_limit(&mut self) {
        if self.fill_target >= FILL_TARGET {
            return;
        }
        let f = self.mem.frames.borrow();
        if f.room_to_grow(self.fill_target, true) > 0 {
            return;
        }
        let now = std::time::Instant::now();
        if self
            .warned_at_limit
            .is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(60))
        {
            return;
        }
        self.warned_at_limit = Some(now);
        tracing::warn!(
            port = %self.ifname,
            queue = self.queue,
            fill_ring = self.fill_target,
            share = f.port_share(),
            ports = f.ports,
            free = f.free.len(),
            "packets lost to an empty fill ring already as large as this port may have it \
             (its share of the UMEM, or what it may borrow beyond): raise --umem-frames \
             (or --threads) for nodes with this many busy pods"
        );
    }

    /// Frames on the fill ring now (0 right after opening: the UMEM had
    /// none to spare, the port cannot receive until frames come back).
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// What the fill ring is topped up to now ([`XskPort::refill`]).
    pub fn fill_target(&self) -> usize {
        self.fill_target
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
            // The kernel counts a fill-ring-empty drop in `rx_dropped` too
            // (and a full RX ring only in `rx_ring_full`).
            let now = KernelDrops {
                dropped: s.rx_dropped(),
                ring_full: s.rx_ring_full(),
                fill_empty: s.rx_fill_ring_empty_descs(),
            };
            let seen = self.kernel_seen;
            let dropped = now.dropped.saturating_sub(seen.dropped);
            let ring_full = now.ring_full.saturating_sub(seen.ring_full);
            // On a multi-buffer socket the kernel's other `rx_dropped`
            // cause is the fill ring holding fewer frames than a packet
            // needs (`xsk_buff_can_alloc` fails; the kernel counts no empty
            // descriptor then): a fill ring too short all the same, and
            // the port's target must grow for it. (Too big for a frame,
            // the other cause, needs a socket without multi-buffer.)
            let fill_empty = if self.sg {
                dropped
            } else {
                now.fill_empty.saturating_sub(seen.fill_empty).min(dropped)
            };
            let c = &mut self.counters;
            c.rx_dropped += dropped + ring_full;
            c.rx_ring_full += ring_full;
            c.rx_fill_empty += fill_empty;
            c.rx_other += dropped - fill_empty;
            self.kernel_seen = now;
            if self.shared {
                self.adapt_fill(fill_empty > 0);
            }
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

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // one packet's range is what is meant
mod tests {
    use super::*;

    #[test]
    fn a_pool_of_more_than_8192_frames_is_a_2_mib_block() {
        assert_eq!(pool_order(4096), 7);
        assert_eq!(pool_order(8192), 8);
        assert_eq!(pool_order(8193), 9);
        assert_eq!(pool_order(16384), 9);
        assert_eq!(pool_order(65536), 11);
        assert_eq!(pool_order(1), 0);
    }

    #[test]
    fn free_page_reporting_is_feature_bit_5() {
        // This VM's balloon: stats, deflate on OOM, reporting.
        assert!(reports_free_pages(
            "0110010100000000000000000000000010000000\n"
        ));
        assert!(!reports_free_pages("0110000100000000"));
        assert!(!reports_free_pages("01100"));
        assert!(!reports_free_pages(""));
    }

    fn split(contd: &[bool], skipping: &mut bool) -> (Vec<std::ops::Range<usize>>, u64) {
        let mut out = vec![0..0];
        let dropped = split_packets(contd.iter().copied(), skipping, &mut out);
        (out, dropped)
    }

    #[test]
    fn a_ports_share_of_the_umem_is_what_the_tx_reserve_leaves_divided() {
        let mut f = Frames::new(vec![FrameDesc::default(); 16384]);
        f.attach(32).expect("slot");
        // One port: a full ring at most.
        assert_eq!(f.port_share(), FILL_TARGET);
        for _ in 0..3 {
            f.attach(32).expect("slot");
        }
        // A quarter of the UMEM is the TX reserve; four ports share the rest.
        assert_eq!(f.port_share(), (16384 - 4096) / 4);
        for _ in 0..996 {
            f.attach(32).expect("slot");
        }
        // Many ports: each keeps what one NAPI poll delivers.
        assert_eq!(f.port_share(), FILL_MIN);
        f.detach();
        assert_eq!(f.port_share(), FILL_MIN);
    }

    #[test]
    fn fresh_ports_start_deep_then_at_512_then_at_64_and_leave_half_the_umem() {
        let starts = |total: usize| {
            let mut free = total;
            let mut v = Vec::new();
            for _ in 0..40 {
                let s = start_fill(total, free);
                free -= s.min(free);
                v.push(s);
            }
            (v, free)
        };
        let (v, free) = starts(16384);
        assert_eq!(&v[..2], &[FILL_DEEP_START; 2]);
        assert_eq!(&v[2..10], &[FILL_START; 8]);
        assert!(v[10..].iter().all(|&s| s == FILL_MIN), "{v:?}");
        assert_eq!(free, 16384 / 2 - 30 * FILL_MIN);
        // Small UMEMs: no deep start where it would take over a quarter.
        for total in [64usize, 512, 2048, 4096, 8192, 1 << 16] {
            let (v, _) = starts(total);
            let before_min: usize = v.iter().take_while(|&&s| s != FILL_MIN).sum();
            assert!(before_min <= total / 2, "{total}: {v:?}");
            let deep: usize = v.iter().filter(|&&s| s == FILL_DEEP_START).sum();
            assert!(deep <= total / 4, "{total}: {v:?}");
        }
        assert_eq!(start_fill(2048, 2048), FILL_START);
    }

    /// Takes `n` frames off the free list, as fill rings would.
    fn take(f: &mut Frames, n: usize) {
        let at = f.free.len() - n;
        f.free.truncate(at);
    }

    /// Two ports under a burst in the same round both see the same spare
    /// frames when their targets grow; what they take leaves the headroom,
    /// so a third port can still grow to its share.
    #[test]
    fn borrowers_of_one_round_leave_the_headroom() {
        let mut f = Frames::new(vec![FrameDesc::default(); 16384]);
        for _ in 0..31 {
            f.attach(32).expect("slot");
        }
        take(&mut f, 16384 - 7296);
        let share = f.port_share();
        let (a, b) = (f.room_to_grow(share, true), f.room_to_grow(share, true));
        assert_eq!((a, b), (1600, 1600));
        for grown in [a, b] {
            let n = f.refill_count(share, share + grown);
            take(&mut f, n);
        }
        let spare = f.free.len() - f.reserve;
        assert_eq!(spare, f.headroom(), "the borrowers took the headroom");
        assert_eq!(f.room_to_grow(64, true), share - 64);
        assert_eq!(f.refill_count(64, share), share - 64);
        // Up to its share a port takes what is there, down to the reserve.
        assert_eq!(f.refill_count(0, share), share);
        // With nothing above the reserve, a ring below FILL_MIN is topped
        // up to FILL_MIN from the reserve (down to its floor), no more.
        take(&mut f, spare);
        assert_eq!(f.refill_count(FILL_MIN, share), 0);
        assert_eq!(f.refill_count(0, share), FILL_MIN);
        assert_eq!(f.refill_count(10, 3000), FILL_MIN - 10);
        let n = f.free.len() - f.tx_floor - 5;
        take(&mut f, n);
        assert_eq!(f.refill_count(0, share), 5);
    }

    #[test]
    fn a_port_under_a_burst_borrows_beyond_its_share_leaving_headroom() {
        let mut f = Frames::new(vec![FrameDesc::default(); 16384]);
        for _ in 0..31 {
            f.attach(32).expect("slot");
        }
        // A node with 30 pods and the gateway: small shares.
        let share = (16384 - 4096) / 31;
        assert_eq!(f.port_share(), share);
        // Their rings hold 9088 frames; 7296 are free, 3200 above the
        // TX reserve.
        take(&mut f, 16384 - 7296);
        // Without a burst a port grows to its share and no further.
        assert_eq!(f.room_to_grow(64, false), share - 64);
        assert_eq!(f.room_to_grow(share, false), 0);
        // Under one it borrows half the spare frames (up to half a ring).
        assert_eq!(f.room_to_grow(share, true), 1600);
        assert_eq!(
            f.room_to_grow(64, true),
            share - 64 + (3200 - share + 64) / 2
        );
        assert_eq!(f.room_to_grow(1500, true), BORROW_UP_TO - 1500);
        assert_eq!(f.room_to_grow(BORROW_UP_TO, true), 0);
        // The next one half of what is left, but never the last two
        // starts' worth.
        take(&mut f, 1600);
        let headroom = 2 * FILL_START;
        assert_eq!(f.headroom(), headroom);
        assert_eq!(f.room_to_grow(share, true), 1600 - headroom);
        // Once the headroom is all that is spare, no port borrows, but
        // each may still grow to its share from it.
        take(&mut f, 1600 - headroom);
        assert_eq!(f.room_to_grow(share, true), 0);
        assert_eq!(f.room_to_grow(64, true), share - 64);
        // Never beyond a full ring.
        let mut f = Frames::new(vec![FrameDesc::default(); 65536]);
        f.attach(32).expect("slot");
        f.attach(32).expect("slot");
        assert_eq!(f.room_to_grow(FILL_TARGET - 10, true), 10);
        assert_eq!(f.room_to_grow(FILL_TARGET, true), 0);
    }

    #[test]
    fn ports_whose_share_fits_a_burst_do_not_borrow() {
        // Six ports with a share of 2048 each, at 1024 when one bursts:
        // it grows to its share, and leaves the rest to the others'.
        let mut f = Frames::new(vec![FrameDesc::default(); 16384]);
        for _ in 0..6 {
            f.attach(32).expect("slot");
        }
        assert_eq!(f.port_share(), BORROW_UP_TO);
        take(&mut f, 6 * 1024);
        assert_eq!(f.room_to_grow(1024, true), 1024);
        assert_eq!(f.room_to_grow(2048, true), 0);
    }

    #[test]
    fn whole_packets_are_split_by_the_continued_flag() {
        let mut skipping = false;
        // One-descriptor packets, a 3-descriptor one, one more.
        let (out, dropped) = split(&[false, true, true, false, false], &mut skipping);
        assert_eq!(out, vec![0..1, 1..4, 4..5]);
        assert_eq!((dropped, skipping), (0, false));
        let (out, dropped) = split(&[], &mut skipping);
        assert!(out.is_empty());
        assert_eq!((dropped, skipping), (0, false));
    }

    #[test]
    fn a_packet_cut_by_the_batch_end_is_dropped_with_its_rest() {
        let mut skipping = false;
        let (out, dropped) = split(&[false, true, true], &mut skipping);
        assert_eq!((out, dropped, skipping), (vec![0..1], 1, true));
        // Its rest (still continued) drops nothing new and keeps skipping.
        let (out, dropped) = split(&[true, true], &mut skipping);
        assert_eq!((out, dropped, skipping), (vec![], 0, true));
        // Its last descriptor ends the skip; the next packet is whole.
        let (out, dropped) = split(&[false, false], &mut skipping);
        assert_eq!((out, dropped, skipping), (vec![1..2], 0, false));
    }

    #[test]
    fn a_chain_longer_than_max_chain_is_dropped() {
        let mut skipping = false;
        let mut at_max = vec![true; MAX_CHAIN - 1];
        at_max.push(false);
        let (out, dropped) = split(&at_max, &mut skipping);
        assert_eq!((out, dropped), (vec![0..MAX_CHAIN], 0));
        let mut over = vec![true; MAX_CHAIN];
        over.push(false);
        over.push(false);
        let (out, dropped) = split(&over, &mut skipping);
        assert_eq!((out, dropped), (vec![MAX_CHAIN + 1..MAX_CHAIN + 2], 1));
    }

    #[test]
    fn copy_bind_flags_add_sg_only_when_asked() {
        assert!(copy_bind_flags(true).contains(BindFlags::XDP_USE_SG));
        assert!(!copy_bind_flags(false).contains(BindFlags::XDP_USE_SG));
        assert!(
            copy_bind_flags(false).contains(BindFlags::XDP_COPY | BindFlags::XDP_USE_NEED_WAKEUP)
        );
    }
}
