//! The per-thread datapath: batches through caches, slow path and actions. (Being written.)
