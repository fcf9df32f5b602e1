//! The library's error type.

use std::time::Duration;

use uniplane_dataplane::wire::DecodeError;
use uniplane_dataplane::{LinkError, Locator, StackError};

use crate::args::ArgError;
use crate::peer::PeerError;
use crate::plot::PlotError;

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// No stack of that name in this build.
    #[error("unknown stack `{name}`; this build has: {known}")]
    UnknownStack {
        /// The name asked for.
        name: String,
        /// The names known, comma-separated.
        known: String,
    },
    /// The stack has no default locator; the user must give one.
    #[error("stack `{0}` needs --listen and --connect locators (for example an interface name and a MAC)")]
    NeedsLocator(String),
    /// A bad argument.
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// Messages of the requested size do not fit the stack.
    #[error("a {size}-byte payload makes {encoded}-byte messages, more than stack `{stack}` carries ({mtu} bytes)")]
    TooLargeForStack {
        /// Payload size asked for.
        size: usize,
        /// Encoded message size.
        encoded: usize,
        /// The stack's name.
        stack: String,
        /// The stack's largest message.
        mtu: usize,
    },
    /// Opening or accepting a link failed.
    #[error("stack: {0}")]
    Stack(#[from] StackError),
    /// A link failed during the run.
    #[error("link: {0}")]
    Link(#[from] LinkError),
    /// A message could not be built.
    #[error("message: {0}")]
    Message(#[from] DecodeError),
    /// An OS thread or its runtime could not be started.
    #[error("starting the {what} thread: {source}")]
    Thread {
        /// Which side.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A side panicked.
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    /// The other side stopped before the run began.
    #[error("the {0} side stopped before the run began")]
    SideGone(&'static str),
    /// Nothing connected to the listener in time.
    #[error("nothing connected to {0} within {1:?}")]
    AcceptTimeout(Locator, Duration),
    /// The listener ended before a link arrived.
    #[error("the listener at {0} closed before a link arrived")]
    ListenerClosed(Locator),
    /// A bad combination of settings.
    #[error("bad configuration: {0}")]
    Config(String),
    /// A peer tool failed.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// Drawing a plot failed.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// The report could not be serialized.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),

    /// The paced sender's timer failed.
    #[error("the pacing timer: {0}")]
    Timer(std::io::Error),
}
