//! The cluster file's checks, one behaviour each.
use super::*;
