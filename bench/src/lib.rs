//! oxvs benchmarks (see benches/).
