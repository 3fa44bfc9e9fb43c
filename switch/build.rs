//! oxvs-switchd links with `--wrap=setsockopt`: libxdp registers a UMEM
//! from a config that cannot ask for TX metadata, and the switch's
//! `__wrap_setsockopt` (`src/afxdp/txmd.rs`) adds that request to the one
//! call that registers it. Every other `setsockopt` goes to the kernel as
//! it was made. Only the binaries: the library's tests register their
//! UMEMs without TX metadata.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--wrap=setsockopt");
    println!("cargo:rerun-if-changed=build.rs");
}
