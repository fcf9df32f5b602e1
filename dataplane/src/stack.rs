//! The [`Stack`] trait: a transport that opens [`Link`](crate::Link)s.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::str::FromStr;

use futures_core::Stream;

use crate::link::BoxLink;

/// What a stack guarantees and carries; the overlay chooses paths by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Every message accepted is delivered (or the link fails).
    pub reliable: bool,
    /// Messages arrive in the order sent.
    pub ordered: bool,
    /// Largest encoded message (header and payload) one link carries, in bytes.
    pub mtu: usize,
    /// Whether the stack carries one-sided WRTE and READ.
    pub one_sided: bool,
    /// Most links open at once.
    pub max_connections: usize,
}

/// Where a stack connects or listens: a name, a socket address, a MAC.
///
/// Text forms: `mem:NAME` or a bare name, an `IP:PORT` socket address, and
/// `mac:aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Locator {
    /// A name in a process-local or host-local namespace (mem, shm).
    Name(String),
    /// An IP socket address (udp, tcp, ltl).
    Socket(SocketAddr),
    /// An Ethernet address (ether).
    Mac([u8; 6]),
}

impl fmt::Display for Locator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Locator::Name(n) => write!(f, "mem:{n}"),
            Locator::Socket(s) => s.fmt(f),
            Locator::Mac(m) => write!(
                f,
                "mac:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            ),
        }
    }
}

/// Why text is not a [`Locator`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseLocatorError {
    /// An empty name.
    #[error("empty locator")]
    Empty,
    /// `mac:` followed by something that is not six hex octets.
    #[error("`{0}` is not a MAC address such as mac:02:00:00:00:00:01")]
    BadMac(String),
}

impl FromStr for Locator {
    type Err = ParseLocatorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(mac) = s.strip_prefix("mac:") {
            let bad = || ParseLocatorError::BadMac(s.to_owned());
            let mut out = [0u8; 6];
            let mut parts = mac.split(':');
            for octet in out.iter_mut() {
                let p = parts.next().ok_or_else(bad)?;
                if p.len() != 2 {
                    return Err(bad());
                }
                *octet = u8::from_str_radix(p, 16).map_err(|_| bad())?;
            }
            return match parts.next() {
                None => Ok(Locator::Mac(out)),
                Some(_) => Err(bad()),
            };
        }
        if let Ok(sa) = s.parse::<SocketAddr>() {
            return Ok(Locator::Socket(sa));
        }
        let name = s.strip_prefix("mem:").unwrap_or(s);
        if name.is_empty() {
            return Err(ParseLocatorError::Empty);
        }
        Ok(Locator::Name(name.to_owned()))
    }
}

/// Why a stack could not open a link.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StackError {
    /// This stack cannot use that kind of locator.
    #[error("stack `{stack}` cannot use locator {locator}")]
    UnsupportedLocator {
        /// The stack's name.
        stack: &'static str,
        /// The locator given.
        locator: Locator,
    },
    /// Nothing listens at the locator.
    #[error("connection refused: nothing listens at {0}")]
    Refused(Locator),
    /// Something already listens at the locator.
    #[error("address in use: {0}")]
    AddrInUse(Locator),
    /// The stack's connection limit is reached.
    #[error("connection limit of {0} reached")]
    TooManyConnections(usize),
    /// The listener or the stack was shut down.
    #[error("stack shut down")]
    Shutdown,
    /// An operating-system error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A future a stack returns.
pub type StackFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StackError>> + Send + 'a>>;

/// Links arriving at a listener.
pub type BoxListener = Pin<Box<dyn Stream<Item = Result<BoxLink, StackError>> + Send>>;

/// A transport: opens links to peers and accepts links from them.
///
/// Object safe, so the overlay holds stacks chosen by configuration at run
/// time as `Arc<dyn Stack>`. Opening links allocates; moving messages on
/// them does not.
pub trait Stack: Send + Sync {
    /// The name the configuration uses (`mem`, `udp`, `tcp`, …).
    fn name(&self) -> &'static str;

    /// What links of this stack guarantee.
    fn capabilities(&self) -> Capabilities;

    /// Opens a link to the listener at `peer`.
    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink>;

    /// Listens at `local`; the stream yields a link per accepted connection.
    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locator_forms_parse_and_print() {
        assert_eq!("mem:a".parse(), Ok(Locator::Name("a".into())));
        assert_eq!("a".parse(), Ok(Locator::Name("a".into())));
        let s: Locator = "127.0.0.1:9".parse().unwrap();
        assert_eq!(s.to_string(), "127.0.0.1:9");
        let m: Locator = "mac:02:00:00:00:00:0a".parse().unwrap();
        assert_eq!(m, Locator::Mac([2, 0, 0, 0, 0, 10]));
        assert_eq!(m.to_string(), "mac:02:00:00:00:00:0a");
        assert!(matches!(
            "mac:02:00".parse::<Locator>(),
            Err(ParseLocatorError::BadMac(_))
        ));
        assert_eq!("mem:".parse::<Locator>(), Err(ParseLocatorError::Empty));
    }
}
