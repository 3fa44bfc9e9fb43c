//! AF_XDP TX metadata: the bytes in front of a TX descriptor's data where
//! the kernel takes per-packet offload requests (`struct xsk_tx_metadata`),
//! used here for one: "finish this packet's TCP/UDP checksum"
//! (`XDP_TXMD_FLAGS_CHECKSUM`). In copy mode the kernel then builds the
//! skb `CHECKSUM_PARTIAL`, as a Linux bridge hands a pod's segment on,
//! and the receiving pod's stack trusts it: nobody sums the payload.
//!
//! The UMEM has to be registered with room for the metadata
//! (`tx_metadata_len` and the `XDP_UMEM_TX_METADATA_LEN` flag, kernel
//! 6.11+), and libxdp registers it from a config that has no such field.
//! So oxvs-switchd links with `--wrap=setsockopt` (`switch/build.rs`):
//! every `setsockopt` of the process comes to [`__wrap_setsockopt`], which
//! passes it to the kernel unchanged, except the UMEM registration made
//! inside [`with_tx_metadata`] on the same thread, to which it adds the
//! request. A kernel that refuses it (before 6.11, unknown flag) gets the
//! registration as libxdp made it, and the UMEM has no metadata:
//! [`with_tx_metadata`] says which. Binaries linked without the wrap
//! (the library's own tests) never get here and register as libxdp does.

use std::cell::Cell;
use std::ffi::{c_int, c_void};

/// Bytes reserved in front of every TX descriptor's data on a UMEM with
/// TX metadata: `sizeof(struct xsk_tx_metadata)`. The kernel then refuses
/// a TX descriptor whose data starts less than this into its chunk
/// (the switch's start 256 bytes in: `XDP_PACKET_HEADROOM`).
pub const TX_METADATA_LEN: usize = 24;
/// Descriptor option: the metadata in front of the data is to be read.
pub const XDP_TX_METADATA: u32 = 1 << 1;
/// `struct xsk_tx_metadata` flag: finish the checksum.
const XDP_TXMD_FLAGS_CHECKSUM: u64 = 1 << 1;
/// `struct xdp_umem_reg` flag: `tx_metadata_len` is meant (6.11+).
const XDP_UMEM_TX_METADATA_LEN: u32 = 1 << 2;
const SOL_XDP: c_int = 283;
const XDP_UMEM_REG: c_int = 4;

/// `struct xdp_umem_reg` as of Linux 6.8 (its last field was padding
/// before, so the size is the same as libxdp's).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
    tx_metadata_len: u32,
}

thread_local! {
    /// Set by [`with_tx_metadata`] around one UMEM registration.
    static WANTED: Cell<bool> = const { Cell::new(false) };
    /// Whether the kernel accepted the request since `WANTED` was set.
    static GRANTED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `register` (which registers one UMEM through libxdp, on this
/// thread) asking the kernel for TX metadata; returns its result and
/// whether the kernel reserved the metadata. False also when the binary
/// was not linked with the wrap.
pub fn with_tx_metadata<T>(register: impl FnOnce() -> T) -> (T, bool) {
    /// Ends the request however `register` returns (a panic included), so
    /// no later registration on this thread gets it unasked.
    struct Wanted;
    impl Drop for Wanted {
        fn drop(&mut self) {
            WANTED.set(false);
        }
    }
    WANTED.set(true);
    GRANTED.set(false);
    let wanted = Wanted;
    let r = register();
    drop(wanted);
    (r, GRANTED.replace(false))
}

/// The raw system call (not libc's `setsockopt`, which the wrap sends
/// here: the binary's own would loop).
///
/// # Safety
/// As `setsockopt(2)`: `val` points to `len` readable bytes.
unsafe fn raw_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    // SAFETY: forwarded as the caller made it (the kernel checks `fd`,
    // `level`, `name` and reads at most `len` bytes at `val`).
    let r = unsafe { libc::syscall(libc::SYS_setsockopt, fd, level, name, val, len) };
    c_int::try_from(r).unwrap_or(-1)
}

/// Every `setsockopt` of oxvs-switchd (`--wrap=setsockopt`): to the kernel
/// unchanged, except a UMEM registration inside [`with_tx_metadata`],
/// which asks for [`TX_METADATA_LEN`] bytes of TX metadata first (and is
/// made as it came if the kernel refuses that).
///
/// # Safety
/// As `setsockopt(2)`: `val` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn __wrap_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    let wanted = WANTED.try_with(Cell::get).unwrap_or(false);
    let v1 = std::mem::size_of::<u64>() * 2 + std::mem::size_of::<u32>() * 2;
    if wanted && level == SOL_XDP && name == XDP_UMEM_REG && !val.is_null() {
        let n = usize::try_from(len).unwrap_or(0);
        if n >= v1 {
            let mut reg = UmemReg::default();
            let size = std::mem::size_of::<UmemReg>();
            // SAFETY: `val` holds `n` readable bytes (the caller's promise);
            // at most `size` of them are copied into `reg`, which is
            // plain old data of `size` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    val.cast::<u8>(),
                    std::ptr::from_mut(&mut reg).cast::<u8>(),
                    n.min(size),
                );
            }
            reg.flags |= XDP_UMEM_TX_METADATA_LEN;
            reg.tx_metadata_len = TX_METADATA_LEN as u32;
            let size = libc::socklen_t::try_from(size).unwrap_or(len);
            // SAFETY: `reg` is `size` readable bytes, alive for the call.
            let r =
                unsafe { raw_setsockopt(fd, level, name, std::ptr::from_ref(&reg).cast(), size) };
            if r == 0 {
                let _ = GRANTED.try_with(|g| g.set(true));
                return 0;
            }
        }
    }
    // SAFETY: the caller's arguments, as made.
    unsafe { raw_setsockopt(fd, level, name, val, len) }
}

/// Writes, into the [`TX_METADATA_LEN`] bytes `meta` in front of a
/// packet's data, the request to finish its checksum: summed from
/// `start` (from the data's start) to the end, stored at `start +
/// offset`.
pub fn write_checksum_request(meta: &mut [u8; TX_METADATA_LEN], start: u16, offset: u16) {
    meta.fill(0);
    meta[..8].copy_from_slice(&XDP_TXMD_FLAGS_CHECKSUM.to_ne_bytes());
    meta[8..10].copy_from_slice(&start.to_ne_bytes());
    meta[10..12].copy_from_slice(&offset.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_the_kernels_layout() {
        let mut m = [0xaa; TX_METADATA_LEN];
        write_checksum_request(&mut m, 34, 16);
        let flags = u64::from_ne_bytes(m[..8].try_into().unwrap());
        assert_eq!(flags, XDP_TXMD_FLAGS_CHECKSUM);
        assert_eq!(u16::from_ne_bytes([m[8], m[9]]), 34);
        assert_eq!(u16::from_ne_bytes([m[10], m[11]]), 16);
        assert!(m[12..].iter().all(|&b| b == 0));
    }

    /// The wrap's own path, called directly (the library's tests are not
    /// linked with it): an AF_XDP socket's UMEM registered with metadata
    /// where the kernel has it, other options passed through unchanged.
    #[test]
    fn a_umem_registration_asks_for_metadata_and_other_options_pass() {
        // SAFETY: plain socket calls on fds this test owns; `area` is a
        // mapping of `size` bytes that outlives the registration (the
        // socket is closed before it is unmapped).
        unsafe {
            let fd = libc::socket(libc::AF_XDP, libc::SOCK_RAW, 0);
            if fd < 0 {
                eprintln!("SKIPPED: no AF_XDP socket (not root?)");
                return;
            }
            let size = 16 * 4096;
            let area = libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(area, libc::MAP_FAILED);
            let reg = UmemReg {
                addr: area as u64,
                len: size as u64,
                chunk_size: 4096,
                ..UmemReg::default()
            };
            let len = std::mem::size_of::<UmemReg>() as libc::socklen_t;
            let (r, granted) = with_tx_metadata(|| {
                __wrap_setsockopt(
                    fd,
                    SOL_XDP,
                    XDP_UMEM_REG,
                    std::ptr::from_ref(&reg).cast(),
                    len,
                )
            });
            assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
            let v: Vec<u32> = release
                .split(|c: char| !c.is_ascii_digit())
                .take(2)
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            if v >= vec![6, 11] {
                assert!(granted, "kernel {release} refused TX metadata");
            } else {
                assert!(!granted, "kernel {release} has no TX metadata flag");
            }
            // A second registration is refused (the socket has its UMEM),
            // also through the wrap; nothing is granted outside it.
            assert_ne!(
                __wrap_setsockopt(
                    fd,
                    SOL_XDP,
                    XDP_UMEM_REG,
                    std::ptr::from_ref(&reg).cast(),
                    len
                ),
                0
            );
            let (_, again) = with_tx_metadata(|| ());
            assert!(!again);
            // Anything else goes through as made.
            let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
            let one: c_int = 1;
            let r = __wrap_setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                std::ptr::from_ref(&one).cast(),
                4,
            );
            assert_eq!(r, 0);
            let mut got: c_int = 0;
            let mut gl: libc::socklen_t = 4;
            libc::getsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                std::ptr::from_mut(&mut got).cast(),
                &mut gl,
            );
            assert_eq!(got, 1);
            libc::close(s);
            libc::close(fd);
            libc::munmap(area, size);
        }
    }
}
