//! `oxvs-cni`: the CNI plugin (pending).
fn main() {}
