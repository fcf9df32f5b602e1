//! uniplane's transports, each behind the [`Stack`](uniplane_dataplane::Stack)
//! and [`Link`](uniplane_dataplane::Link) traits.
//!
//! - [`mem`]: in-process links over bounded lock-free queues.
//!
//! Stacks are found by name through [`by_name`], which is how configuration
//! files pick them.

#![deny(missing_docs)]

pub mod mem;

use std::sync::Arc;

use uniplane_dataplane::Stack;

/// Names of the stacks this build provides.
pub const STACK_NAMES: &[&str] = &["mem"];

/// A new instance of the stack called `name`, or `None` for an unknown name.
pub fn by_name(name: &str) -> Option<Arc<dyn Stack>> {
    match name {
        "mem" => Some(Arc::new(mem::MemStack::new())),
        _ => None,
    }
}
