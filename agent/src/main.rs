//! `oxvs-agent`: the node agent (pending).
fn main() {}
