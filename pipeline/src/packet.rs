//! Packet buffers with headroom, and header rewriting. (Being written.)
