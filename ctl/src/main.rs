//! oxvsctl: the oxvs operator CLI. (Being written.)
fn main() {}
