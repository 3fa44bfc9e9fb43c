//! The switch's one XDP program: loaded once, attached to every port.
//!
//! An AF_XDP socket only receives what an XDP program on its interface
//! redirects into an `XSKMAP` entry holding that socket. libxdp's default
//! way loads a program and a map per interface, parsing its ELF objects and
//! running the verifier each time: tens of milliseconds per port, most of
//! a CNI ADD. Instead switchd loads one program at start, with two maps
//! every port shares:
//!
//! - `slots` (hash, `(ifindex, rx queue)` -> slot number): which XSKMAP
//!   entry serves a port's queue;
//! - `xsks` (XSKMAP, slot -> socket).
//!
//! The program (19 instructions, assembled below) looks the receiving
//! interface and queue up in `slots` and redirects to that slot of `xsks`;
//! a queue without a slot, or a slot without a socket (a port being set
//! up or torn down), passes the packet to the kernel stack (the
//! `bpf_redirect_map` default action), as libxdp's default program does.
//! So does every interface once switchd is gone (its links go with it).
//! A pod's host link is isolated from that stack by the agent
//! (`oxvs_agent::hostnet::isolate_host_link`: no ARP answered, nothing
//! routed on, no IPv6), so what reaches it there is dropped.
//! The kernel delivers a redirected frame only to a socket bound to the
//! interface and queue it arrived on, so a stale entry can never leak a
//! frame to another port.
//!
//! A port's attachment is a BPF link (`BPF_LINK_CREATE`, kernel 5.9+)
//! plus a slot per queue it serves ([`XdpAttachment`], sharing the link):
//! adding a port costs one link creation and two map updates per queue, no
//! program load. Dropping a queue's attachment deletes the slot's entries;
//! the last one closes the link, which detaches the program; a
//! switchd that dies loses its links with its file descriptors, so nothing
//! of it stays on an interface. An interface that already has an XDP
//! program attached the old way (netlink, e.g. by libxdp) refuses a link
//! (`EBUSY`): the caller falls back to libxdp for that port.
//!
//! Everything here is port setup and teardown, never per packet: the
//! control thread attaches, the owning datapath thread puts its socket in
//! the slot once its fill ring has frames (`insert_socket`, one map update
//! per queue), the port close thread detaches. `unsafe` is
//! limited to the `bpf(2)` system call and its attribute structs.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// Most port queues one program serves (the size of both maps).
pub const MAX_SLOTS: u32 = 16384;

// bpf(2) commands.
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;

const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_F_NO_PREALLOC: u32 = 1;
/// The program handles frames in several buffers (`xdp.frags`): a veth
/// then allows an MTU above a page, and AF_XDP sockets bound with
/// `XDP_USE_SG` get such frames in several descriptors.
const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;

/// XDP attach flags (`XDP_FLAGS_*`).
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

// The program's helpers and return codes.
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;

/// Why the program or an attachment could not be made.
#[derive(Debug, thiserror::Error)]
pub enum XdpProgError {
    #[error("cannot {step}: {source}")]
    Bpf {
        step: String,
        source: std::io::Error,
    },
    #[error("cannot load the XDP program: {reason}")]
    Verifier { reason: String },
    #[error("no free XDP slot: {MAX_SLOTS} port queues are attached already")]
    NoSlot,
    #[error("'{0}' has no interface index (is it gone?)")]
    NoIfindex(String),
}

impl XdpProgError {
    /// Whether the program cannot serve this interface but libxdp can:
    /// another program is attached to it already (by netlink: libxdp,
    /// `ip link set xdp`; `EBUSY`), or its slot key is taken by an
    /// interface of another network namespace with the same index
    /// (`EEXIST`).
    pub fn is_busy(&self) -> bool {
        matches!(self, XdpProgError::Bpf { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EBUSY) | Some(libc::EEXIST)))
    }

    /// Whether the driver cannot run the program in the mode asked for
    /// (native XDP on a device without it).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, XdpProgError::Bpf { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)))
    }
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0xf) | (src << 4),
        off,
        imm,
    }
}

// Opcodes (class | size/op | source).
const MOV64_REG: u8 = 0xbf; // ALU64 | MOV | X
const MOV64_IMM: u8 = 0xb7; // ALU64 | MOV | K
const ADD64_IMM: u8 = 0x07; // ALU64 | ADD | K
const LDX_W: u8 = 0x61; // LDX | MEM | W
const STX_W: u8 = 0x63; // STX | MEM | W
const LD_DW_IMM: u8 = 0x18; // LD | IMM | DW (two slots)
const JEQ_IMM: u8 = 0x15; // JMP | JEQ | K
const CALL: u8 = 0x85; // JMP | CALL
const EXIT: u8 = 0x95; // JMP | EXIT
/// `src` of a `LD_DW_IMM` whose immediate is a map file descriptor.
const PSEUDO_MAP_FD: u8 = 1;

// struct xdp_md offsets.
const XDP_MD_INGRESS_IFINDEX: i16 = 12;
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;

/// The program, with the two maps' descriptors in place:
///
/// ```text
///     r6 = ctx
///     key.ifindex = ctx->ingress_ifindex      (stack fp-8)
///     key.queue   = ctx->rx_queue_index       (stack fp-4)
///     r0 = map_lookup_elem(slots, &key)
///     if r0 == NULL: return XDP_PASS
///     return redirect_map(xsks, *r0, XDP_PASS)
/// ```
fn program(slots_fd: RawFd, xsks_fd: RawFd) -> [Insn; 19] {
    [
        insn(MOV64_REG, 6, 1, 0, 0),
        insn(LDX_W, 2, 6, XDP_MD_INGRESS_IFINDEX, 0),
        insn(STX_W, 10, 2, -8, 0),
        insn(LDX_W, 2, 6, XDP_MD_RX_QUEUE_INDEX, 0),
        insn(STX_W, 10, 2, -4, 0),
        insn(LD_DW_IMM, 1, PSEUDO_MAP_FD, 0, slots_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_REG, 2, 10, 0, 0),
        insn(ADD64_IMM, 2, 0, 0, -8),
        insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP_ELEM),
        // to the XDP_PASS exit, 6 instructions on
        insn(JEQ_IMM, 0, 0, 6, 0),
        insn(LDX_W, 2, 0, 0, 0),
        insn(LD_DW_IMM, 1, PSEUDO_MAP_FD, 0, xsks_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_IMM, 3, 0, 0, XDP_PASS),
        insn(CALL, 0, 0, 0, HELPER_REDIRECT_MAP),
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV64_IMM, 0, 0, 0, XDP_PASS),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// `bpf(cmd, attr)`: the returned value (a descriptor for the commands
/// that make one), or the error.
fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, exclusively borrowed `#[repr(C)]` value of
    // one of this module's attribute structs, laid out as the kernel's
    // `union bpf_attr` member for `cmd`, and its size is passed with it;
    // every pointer inside it (instructions, license, log, key, value)
    // points to memory the caller keeps alive across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Takes ownership of a descriptor `bpf(2)` just returned.
fn owned(fd: libc::c_long) -> std::io::Result<OwnedFd> {
    let fd = RawFd::try_from(fd).map_err(|_| std::io::Error::other("descriptor out of range"))?;
    // SAFETY: `fd` was returned by a successful bpf(2) call that creates a
    // descriptor, so it is open and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn name16(s: &str) -> [u8; 16] {
    let mut n = [0u8; 16];
    for (d, b) in n.iter_mut().zip(s.bytes().take(15)) {
        *d = b;
    }
    n
}

fn create_map(
    name: &str,
    map_type: u32,
    key_size: u32,
    flags: u32,
) -> Result<OwnedFd, XdpProgError> {
    let mut attr = MapCreateAttr {
        map_type,
        key_size,
        value_size: 4,
        max_entries: MAX_SLOTS,
        map_flags: flags,
        map_name: name16(name),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr)
        .and_then(owned)
        .map_err(|source| XdpProgError::Bpf {
            step: format!("create the XDP map '{name}'"),
            source,
        })
}

fn update(
    map: &OwnedFd,
    key: &[u8],
    value: &u32,
    flags: u64,
    what: &str,
) -> Result<(), XdpProgError> {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value: value as *const u32 as u64,
        flags,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
        .map(drop)
        .map_err(|source| XdpProgError::Bpf {
            step: format!("set {what}"),
            source,
        })
}

fn delete(map: &OwnedFd, key: &[u8]) {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        ..Default::default()
    };
    // Absent already (a socket closed empties its XSKMAP entry) is fine.
    let _ = bpf(BPF_MAP_DELETE_ELEM, &mut attr);
}

/// The `slots` key of an interface's queue: `struct { u32 ifindex; u32
/// queue; }` in host order, as the program stores it on its stack.
fn slot_key(ifindex: u32, queue: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&ifindex.to_ne_bytes());
    k[4..].copy_from_slice(&queue.to_ne_bytes());
    k
}

/// The loaded program and its maps.
pub struct XdpProgram {
    prog: OwnedFd,
    slots: OwnedFd,
    xsks: OwnedFd,
    free: Mutex<Vec<u32>>,
    /// Loaded frags-aware (see [`XdpProgram::frags`]).
    frags: bool,
}

impl std::fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpProgram")
            .field("prog_fd", &self.prog.as_raw_fd())
            .finish()
    }
}

impl XdpProgram {
    /// Creates the maps and loads the program (verified once, here).
    pub fn load() -> Result<XdpProgram, XdpProgError> {
        let slots = create_map("oxvs_slots", BPF_MAP_TYPE_HASH, 8, BPF_F_NO_PREALLOC)?;
        let xsks = create_map("oxvs_xsks", BPF_MAP_TYPE_XSKMAP, 4, 0)?;
        let insns = program(slots.as_raw_fd(), xsks.as_raw_fd());
        let license = CString::from(c"Apache-2.0");
        let mut log = vec![0u8; 16 * 1024];
        // Frags-aware where the kernel knows the flag (5.18+): the program
        // only looks up the receive queue, never the packet's bytes.
        let mut frags = true;
        let loaded = loop {
            let mut attr = ProgLoadAttr {
                prog_type: BPF_PROG_TYPE_XDP,
                insn_cnt: insns.len() as u32,
                insns: insns.as_ptr() as u64,
                license: license.as_ptr() as u64,
                log_level: 1,
                log_size: log.len() as u32,
                log_buf: log.as_mut_ptr() as u64,
                prog_name: name16("oxvs_xsk"),
                expected_attach_type: BPF_XDP,
                prog_flags: if frags { BPF_F_XDP_HAS_FRAGS } else { 0 },
                ..Default::default()
            };
            match bpf(BPF_PROG_LOAD, &mut attr).and_then(owned) {
                Err(e) if frags && e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::info!("the kernel refuses a frags-aware XDP program ({e}): pods keep an MTU of at most a page");
                    frags = false;
                }
                r => break r,
            }
        };
        let prog = match loaded {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                return Err(XdpProgError::Verifier {
                    reason: String::from_utf8_lossy(&log[..end]).trim().to_string(),
                });
            }
            Err(source) => {
                return Err(XdpProgError::Bpf {
                    step: "load the XDP program".into(),
                    source,
                })
            }
        };
        Ok(XdpProgram {
            prog,
            slots,
            xsks,
            free: Mutex::new((0..MAX_SLOTS).rev().collect()),
            frags,
        })
    }

    /// Whether the program is frags-aware (`xdp.frags`): interfaces it is
    /// attached to may have an MTU above a page.
    pub fn frags(&self) -> bool {
        self.frags
    }

    /// Attaches the program to `ifname` in native (`native`) or generic
    /// mode (one BPF link), with a slot for each of its `queues` (in that
    /// order); each queue's socket goes in with
    /// [`XdpAttachment::insert_socket`]. The program stays attached until
    /// the last of them is dropped.
    pub fn attach(
        self: &Arc<Self>,
        ifname: &str,
        queues: &[u32],
        native: bool,
    ) -> Result<Vec<XdpAttachment>, XdpProgError> {
        let ifindex = nix::net::if_::if_nametoindex(ifname)
            .map_err(|_| XdpProgError::NoIfindex(ifname.to_string()))?;
        let mut attr = LinkCreateAttr {
            prog_fd: self.prog.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: if native {
                XDP_FLAGS_DRV_MODE
            } else {
                XDP_FLAGS_SKB_MODE
            },
        };
        let link = bpf(BPF_LINK_CREATE, &mut attr)
            .and_then(owned)
            .map_err(|source| XdpProgError::Bpf {
                step: format!(
                    "attach the XDP program to '{ifname}' ({} mode)",
                    if native { "native" } else { "generic" }
                ),
                source,
            })?;
        let link = Arc::new(link);
        let mut out = Vec::with_capacity(queues.len());
        for &queue in queues {
            let slot = self
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop()
                .ok_or(XdpProgError::NoSlot)?;
            let key = slot_key(ifindex, queue);
            // NOEXIST: an interface of another network namespace with the
            // same index must not take over this one's slot (nor lose its
            // own: nothing of it is deleted on this error). The queues
            // attached so far are dropped with `out` (their slots freed,
            // the link closed with the last).
            if let Err(e) = update(
                &self.slots,
                &key,
                &slot,
                BPF_NOEXIST,
                &format!("the XDP slot of '{ifname}' queue {queue}"),
            ) {
                self.free
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(slot);
                return Err(e);
            }
            out.push(XdpAttachment {
                prog: Arc::clone(self),
                key,
                slot,
                _link: Arc::clone(&link),
            });
        }
        Ok(out)
    }
}

/// The program attached to one interface queue, with its slot. Dropping it
/// removes the slot; dropping the interface's last one detaches the program.
pub struct XdpAttachment {
    prog: Arc<XdpProgram>,
    key: [u8; 8],
    slot: u32,
    // Dropped last: the program stays attached until the slot is gone.
    _link: Arc<OwnedFd>,
}

impl XdpAttachment {
    /// Puts the AF_XDP socket `xsk_fd` (bound to this interface queue) in
    /// the slot: from now on the program redirects the queue's frames to it.
    pub fn insert_socket(&self, xsk_fd: RawFd) -> Result<(), XdpProgError> {
        let fd = u32::try_from(xsk_fd).map_err(|_| XdpProgError::Bpf {
            step: "put the socket in its XDP slot".into(),
            source: std::io::Error::from_raw_os_error(libc::EBADF),
        })?;
        update(
            &self.prog.xsks,
            &self.slot.to_ne_bytes(),
            &fd,
            BPF_ANY,
            "put the socket in its XDP slot",
        )
    }
}

impl Drop for XdpAttachment {
    fn drop(&mut self) {
        delete(&self.prog.slots, &self.key);
        delete(&self.prog.xsks, &self.slot.to_ne_bytes());
        self.prog
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.slot);
    }
}

impl std::fmt::Debug for XdpAttachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpAttachment")
            .field("slot", &self.slot)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        let p = program(7, 9);
        // r6 = r1
        assert_eq!(
            p[0],
            Insn {
                code: 0xbf,
                regs: 0x16,
                off: 0,
                imm: 0
            }
        );
        // the map loads carry the descriptors, src = pseudo map fd
        assert_eq!((p[5].code, p[5].regs, p[5].imm), (0x18, 0x11, 7));
        assert_eq!((p[12].code, p[12].regs, p[12].imm), (0x18, 0x11, 9));
        // the miss branch lands on `r0 = XDP_PASS; exit`
        let target = 10 + 1 + p[10].off as usize;
        assert_eq!(p[target], insn(MOV64_IMM, 0, 0, 0, XDP_PASS));
        assert_eq!(p[target + 1].code, EXIT);
    }

    #[test]
    fn slot_keys_are_ifindex_then_queue() {
        let k = slot_key(0x01020304, 5);
        assert_eq!(&k[..4], &0x01020304u32.to_ne_bytes());
        assert_eq!(&k[4..], &5u32.to_ne_bytes());
    }
}
