//! `ofproto/trace`-style tracing. (Being written.)
