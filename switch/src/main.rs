//! oxvs-switchd. (Being written.)
fn main() {}
