//! Fuzz target `vxlan_tx`: see `oxvs_fuzz_harness::vxlan` for what it
//! drives and checks (the same body replays the corpus in `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| oxvs_fuzz_harness::vxlan::run_tx(data));
