//! Userspace connection tracking. (Being written.)
