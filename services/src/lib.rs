//! uniplane's services: the host daemon `uniplaned` (DUA's CPU control
//! agent), the devices it hosts, and the CLI. The client library and the
//! control protocol live in `uniplane-client`, which applications link
//! instead of this crate; [`client`] and [`control`] re-export them.

#![deny(missing_docs)]

pub mod auth;
pub mod client;
pub mod cluster;
pub mod config;
pub mod control;
pub mod daemon;
pub mod devices;
pub mod manual;
pub mod naming;
pub mod plane;
pub mod seal;
pub mod top;
pub mod transfer;

pub use config::Config;
pub use daemon::{Daemon, DaemonError, ReloadError};
pub use plane::{open_plane, PlaneKind};
