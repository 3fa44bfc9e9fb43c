//! The classifier: tuple-space search over one table's flows. (Being written.)
