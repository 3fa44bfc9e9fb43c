//! Tables tests.
use super::*;
