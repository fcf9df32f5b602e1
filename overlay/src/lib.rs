//! The uniplane overlay (DUA §7.1): the software router every message of
//! a server passes through.
//!
//! - [`table`]: forwarding tables (destination UID → output port).
//! - [`acl`]: access control (installed connections, connectionless rules).
//! - [`segment`]: segmentation to a path's MTU and reassembly.

#![deny(missing_docs)]

pub mod acl;
pub mod segment;
pub mod table;

/// Index of a port of the engine.
pub type PortId = u16;
