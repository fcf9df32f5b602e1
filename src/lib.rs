//! uniplane: Direct Universal Access (DUA, NSDI'19) as a Rust dataplane.
//!
//! Every resource — a process, an FPGA kernel, a GPU, host or device
//! memory — has a global [`Uid`] (server IPv4 + device number) and one
//! interface: connect/listen/accept/close, send/recv and one-sided
//! write/read, carried by pluggable [`Stack`]s.
//!
//! This facade re-exports what applications use; the crates behind it are
//! `uniplane-dataplane` (the vocabulary and traits), `uniplane-stacks`
//! (the transports) and `uniplane-client` (the client library of the host
//! daemon, as [`client`]).

#![deny(missing_docs)]

pub use uniplane_dataplane::{
    codec, fault, wire, BoxLink, BoxListener, Capabilities, Endpoint, Link, LinkError, LinkExt,
    Locator, MemoryAddress, Message, ParseUidError, Stack, StackError, Target, Uid,
};

pub use uniplane_client as client;

/// Packet captures of message streams (pcap files readable by
/// Wireshark and tcpdump).
pub use uniplane_stacks::pcap;

/// The transports.
pub mod stacks {
    pub use uniplane_stacks::{by_name, inproc, STACK_NAMES};
}

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
