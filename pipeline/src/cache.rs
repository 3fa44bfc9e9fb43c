//! Exact-match and megaflow caches. (Being written.)
