//! uniplane's services: the host daemon `uniplaned` (DUA's CPU control
//! agent), its control protocol, the devices it hosts, and the client
//! library applications link.

#![deny(missing_docs)]

pub mod client;
pub mod config;
pub mod control;
pub mod daemon;
pub mod devices;

pub use config::Config;
pub use daemon::{Daemon, DaemonError};
