//! The uniplane client library: what an application links to use
//! uniplane.
//!
//! ```text
//!  application                         uniplaned
//!  ───────────                         ─────────
//!  Client ── control socket (JSON) ──► attach, listen, connect, close, status…
//!  Session ─ data path (messages) ───► its own engine port
//!     ├─ Connection (Link) ─┐
//!     ├─ Connection (Link) ─┼─ one writer, one dispatcher by (port, peer)
//!     ├─ write / read ──────┤  answers matched by (source UID, sequence)
//!     └─ Window ◄───────────┘  peers' WRTE/READ served against it
//! ```
//!
//! Control requests go over the daemon's Unix control socket
//! ([`protocol`]); data never does: after `attach`, the session opens its
//! data path (shared-memory rings into the session's port of the daemon's
//! engine) and every connection's messages, one-sided writes and reads,
//! and their answers travel on it. Whichever task of the session finds
//! the data path free moves it: a connection that sends writes into the
//! ring in its own poll, a connection of a busy-polling session waiting
//! for a message takes it from the ring in its own poll, and a background
//! task per session does the rest — peers' one-sided requests against the session's memory
//! [`Window`]s, notices, messages nobody is waiting for.
//!
//! How the data path waits for the engine is chosen per session with
//! [`Client::attach_with`] and [`DataPathOptions`]: [`Wait::Busy`] never
//! parks (no system call per message, a busy core),
//! [`Wait::Park`] spins a while and then parks on a doorbell (the
//! default parks at once).
//!
//! This crate depends on the vocabulary (`uniplane-dataplane`) and the
//! shared-memory stack only, never on the daemon.
//!
//! # Example
//!
//! ```no_run
//! # async fn example() -> Result<(), uniplane_client::ClientError> {
//! use bytes::Bytes;
//! use uniplane_client::Client;
//! use uniplane_dataplane::Uid;
//!
//! // The daemon of the default runtime directory.
//! let session = Client::connect_default().await?.attach("example").await?;
//!
//! // A connection to port 80 of device 1 (the daemon's echo device):
//! // two messages, the second ends the unit (PUSH).
//! let echo = Uid::new(session.uid().server(), 1).port(80);
//! let mut conn = session.connect(echo).await?;
//! conn.send_bytes(Bytes::from_static(b"hello, ")).await?;
//! conn.send_push(Bytes::from_static(b"world")).await?;
//! if let Some(unit) = conn.recv_until_push().await {
//!     assert_eq!(&unit?[..], b"hello, world");
//! }
//! drop(conn); // closes the connection at both ends
//!
//! // A window peers may WRITE to and READ from, at `uid@offset`.
//! let window = session.register_window(4096);
//! session.write(window.at(16), Bytes::from_static(b"mine")).await?;
//! assert_eq!(window.read(16, 4).as_deref(), Some(&b"mine"[..]));
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod connection;
mod control;
mod datapath;
mod error;
mod mapping;
pub mod protocol;
mod runtime;
mod session;
mod window;

pub use connection::{Connection, Listener};
pub use control::{Client, DataPathOptions, Wait};
pub use error::ClientError;
pub use mapping::{MappedMemory, SharedRegion};
pub use runtime::{
    check_runtime_dir, client_runtime_dir, prepare_runtime_dir, runtime_dir, RuntimeDirError,
    CONTROL_SOCKET, DATA_SOCKET, SYSTEM_RUNTIME_DIR,
};
pub use session::Session;
pub use uniplane_shm::grant::Access as SharedAccess;
pub use window::Window;

#[cfg(test)]
mod tests {
    /// The arrow points down: applications link this crate, so it must not
    /// pull in the daemon or the router.
    #[test]
    fn the_client_depends_on_neither_the_daemon_nor_the_overlay() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .unwrap_or_default();
        for forbidden in ["uniplane-services", "uniplane-overlay", "uniplane-stacks"] {
            assert!(!deps.contains(forbidden), "{forbidden} in {deps}");
        }
    }
}
