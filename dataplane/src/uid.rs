//! Global resource names: the [`Uid`] and the endpoint forms built on it.
//!
//! A UID names one resource anywhere in the data center: the IPv4 address of
//! the server it lives in (32 bits) and a device number on that server
//! (16 bits). Its text form is `10.0.0.7:3`. An [`Endpoint`] adds a port
//! (`10.0.0.7:3/80`) and a [`MemoryAddress`] a byte address in the
//! resource's memory (`10.0.0.7:5@0x1000`).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// Why a piece of text is not a UID, an endpoint or a memory address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseUidError {
    /// The text has no `:` separating server and device.
    #[error("`{0}` has no device number: expected SERVER:DEVICE such as 10.0.0.7:3")]
    MissingDevice(String),
    /// The server part is not a dotted IPv4 address.
    #[error("`{0}` is not an IPv4 server address such as 10.0.0.7")]
    BadServer(String),
    /// The device part is not a number from 0 to 65535.
    #[error("`{0}` is not a device number from 0 to 65535")]
    BadDevice(String),
    /// The text has no `/` before the port.
    #[error("`{0}` has no port: expected SERVER:DEVICE/PORT such as 10.0.0.7:3/80")]
    MissingPort(String),
    /// The port part is not a number from 0 to 65535.
    #[error("`{0}` is not a port number from 0 to 65535")]
    BadPort(String),
    /// The text has no `@` before the address.
    #[error("`{0}` has no memory address: expected SERVER:DEVICE@ADDR such as 10.0.0.7:5@0x1000")]
    MissingAddress(String),
    /// The address part is not a 64-bit number (decimal or `0x` hexadecimal).
    #[error("`{0}` is not a 64-bit address (decimal, or hexadecimal with 0x)")]
    BadAddress(String),
    /// The text is neither an endpoint nor a memory address.
    #[error("`{0}` is neither SERVER:DEVICE/PORT nor SERVER:DEVICE@ADDR")]
    NotATarget(String),
}

/// A global resource name: a server's IPv4 address and a device on it.
///
/// Ordered and hashed as its 48-bit wire value, so tables keyed by UID sort
/// the way the hardware forwarding table matches.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Uid(u64);

impl Uid {
    /// Number of bits in a UID on the wire.
    pub const BITS: u32 = 48;
    /// Mask of the 48 meaningful bits of [`Uid::to_u64`].
    pub const MASK: u64 = (1 << Self::BITS) - 1;

    /// The UID of `device` on `server`.
    pub const fn new(server: Ipv4Addr, device: u16) -> Self {
        let ip = u32::from_be_bytes(server.octets()) as u64;
        Uid((ip << 16) | device as u64)
    }

    /// The UID whose 48-bit wire value is the low 48 bits of `value`; the
    /// high 16 bits must be zero.
    pub const fn from_u64(value: u64) -> Option<Self> {
        if value & !Self::MASK == 0 {
            Some(Uid(value))
        } else {
            None
        }
    }

    /// The UID of the low 48 bits of `value`, ignoring the rest.
    #[inline]
    pub(crate) const fn from_u64_masked(value: u64) -> Self {
        Uid(value & Self::MASK)
    }

    /// The 48-bit wire value (server in the high 32 bits, device in the low 16).
    pub const fn to_u64(self) -> u64 {
        self.0
    }

    /// The UID in its six wire bytes, big-endian.
    pub const fn from_bytes(b: [u8; 6]) -> Self {
        Uid(((b[0] as u64) << 40)
            | ((b[1] as u64) << 32)
            | ((b[2] as u64) << 24)
            | ((b[3] as u64) << 16)
            | ((b[4] as u64) << 8)
            | b[5] as u64)
    }

    /// The six wire bytes, big-endian.
    pub const fn to_bytes(self) -> [u8; 6] {
        let b = self.0.to_be_bytes();
        [b[2], b[3], b[4], b[5], b[6], b[7]]
    }

    /// The server this resource lives on.
    pub const fn server(self) -> Ipv4Addr {
        let ip = (self.0 >> 16) as u32;
        Ipv4Addr::new(
            (ip >> 24) as u8,
            (ip >> 16) as u8,
            (ip >> 8) as u8,
            ip as u8,
        )
    }

    /// The device number on its server.
    pub const fn device(self) -> u16 {
        self.0 as u16
    }

    /// The endpoint at `port` of this resource.
    pub const fn port(self, port: u16) -> Endpoint {
        Endpoint { uid: self, port }
    }

    /// The byte `addr` in this resource's memory.
    pub const fn at(self, addr: u64) -> MemoryAddress {
        MemoryAddress { uid: self, addr }
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.server(), self.device())
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uid({self})")
    }
}

impl FromStr for Uid {
    type Err = ParseUidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (server, device) = s
            .rsplit_once(':')
            .ok_or_else(|| ParseUidError::MissingDevice(s.to_owned()))?;
        let server: Ipv4Addr = server
            .parse()
            .map_err(|_| ParseUidError::BadServer(server.to_owned()))?;
        let device =
            parse_u16(device).ok_or_else(|| ParseUidError::BadDevice(device.to_owned()))?;
        Ok(Uid::new(server, device))
    }
}

/// A decimal number of at most 65535 with no sign, spaces or leading `+`.
fn parse_u16(s: &str) -> Option<u16> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A port of a resource: the address of one side of a SEND/RECV connection.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Endpoint {
    /// The resource.
    pub uid: Uid,
    /// The port on that resource.
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.uid, self.port)
    }
}

impl FromStr for Endpoint {
    type Err = ParseUidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (uid, port) = s
            .rsplit_once('/')
            .ok_or_else(|| ParseUidError::MissingPort(s.to_owned()))?;
        let port = parse_u16(port).ok_or_else(|| ParseUidError::BadPort(port.to_owned()))?;
        Ok(Endpoint {
            uid: uid.parse()?,
            port,
        })
    }
}

/// A byte in a resource's memory: the target of a one-sided WRITE or READ.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MemoryAddress {
    /// The resource whose memory is addressed.
    pub uid: Uid,
    /// The byte address inside it.
    pub addr: u64,
}

impl fmt::Display for MemoryAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{:#x}", self.uid, self.addr)
    }
}

impl FromStr for MemoryAddress {
    type Err = ParseUidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (uid, addr) = s
            .rsplit_once('@')
            .ok_or_else(|| ParseUidError::MissingAddress(s.to_owned()))?;
        let bad = || ParseUidError::BadAddress(addr.to_owned());
        let addr = match addr.strip_prefix("0x").or_else(|| addr.strip_prefix("0X")) {
            Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                u64::from_str_radix(hex, 16).map_err(|_| bad())?
            }
            None if !addr.is_empty() && addr.bytes().all(|b| b.is_ascii_digit()) => {
                addr.parse().map_err(|_| bad())?
            }
            _ => return Err(bad()),
        };
        Ok(MemoryAddress {
            uid: uid.parse()?,
            addr,
        })
    }
}

/// Either form of address an application names: a port or a memory byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Target {
    /// `SERVER:DEVICE/PORT`: two-sided SEND/RECV.
    Port(Endpoint),
    /// `SERVER:DEVICE@ADDR`: one-sided WRITE/READ.
    Memory(MemoryAddress),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Port(e) => e.fmt(f),
            Target::Memory(m) => m.fmt(f),
        }
    }
}

impl FromStr for Target {
    type Err = ParseUidError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match (s.contains('/'), s.contains('@')) {
            (true, false) => s.parse().map(Target::Port),
            (false, true) => s.parse().map(Target::Memory),
            _ => Err(ParseUidError::NotATarget(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_text_round_trips() {
        let uid: Uid = "10.0.0.7:3".parse().unwrap();
        assert_eq!(uid.server(), Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(uid.device(), 3);
        assert_eq!(uid.to_string(), "10.0.0.7:3");
        assert_eq!(uid.to_u64(), 0x0a00_0007_0003);
    }

    #[test]
    fn uid_bytes_are_big_endian_server_then_device() {
        let uid = Uid::new(Ipv4Addr::new(192, 168, 1, 2), 0x1234);
        assert_eq!(uid.to_bytes(), [192, 168, 1, 2, 0x12, 0x34]);
        assert_eq!(Uid::from_bytes(uid.to_bytes()), uid);
    }

    #[test]
    fn uid_from_u64_rejects_bits_above_48() {
        assert!(Uid::from_u64(1 << 48).is_none());
        assert_eq!(Uid::from_u64(Uid::MASK).unwrap().device(), 0xffff);
    }

    #[test]
    fn invalid_uid_text_says_what_is_wrong() {
        assert_eq!(
            "10.0.0.7".parse::<Uid>(),
            Err(ParseUidError::MissingDevice("10.0.0.7".into()))
        );
        assert_eq!(
            "10.0.0:7".parse::<Uid>(),
            Err(ParseUidError::BadServer("10.0.0".into()))
        );
        assert_eq!(
            "10.0.0.7:65536".parse::<Uid>(),
            Err(ParseUidError::BadDevice("65536".into()))
        );
        assert_eq!(
            "10.0.0.7:+3".parse::<Uid>(),
            Err(ParseUidError::BadDevice("+3".into()))
        );
        let msg = "10.0.0.7".parse::<Uid>().unwrap_err().to_string();
        assert!(msg.contains("SERVER:DEVICE"), "{msg}");
    }

    #[test]
    fn endpoint_text_round_trips() {
        let e: Endpoint = "10.0.0.7:3/80".parse().unwrap();
        assert_eq!(e.uid.to_string(), "10.0.0.7:3");
        assert_eq!(e.port, 80);
        assert_eq!(e.to_string(), "10.0.0.7:3/80");
        assert_eq!(
            "10.0.0.7:3/x".parse::<Endpoint>(),
            Err(ParseUidError::BadPort("x".into()))
        );
        assert_eq!(
            "10.0.0.7:3".parse::<Endpoint>(),
            Err(ParseUidError::MissingPort("10.0.0.7:3".into()))
        );
    }

    #[test]
    fn memory_address_accepts_hex_and_decimal() {
        let m: MemoryAddress = "10.0.0.7:5@0x1000".parse().unwrap();
        assert_eq!(m.addr, 0x1000);
        assert_eq!(m.to_string(), "10.0.0.7:5@0x1000");
        let d: MemoryAddress = "10.0.0.7:5@4096".parse().unwrap();
        assert_eq!(d, m);
        assert_eq!(
            "10.0.0.7:5@0x".parse::<MemoryAddress>(),
            Err(ParseUidError::BadAddress("0x".into()))
        );
        assert_eq!(
            "10.0.0.7:5@0x1_0000_0000_0000_0000".parse::<MemoryAddress>(),
            Err(ParseUidError::BadAddress("0x1_0000_0000_0000_0000".into()))
        );
        assert_eq!(
            "10.0.0.7:5@0x10000000000000000".parse::<MemoryAddress>(),
            Err(ParseUidError::BadAddress("0x10000000000000000".into()))
        );
    }

    #[test]
    fn target_picks_the_form_from_the_separator() {
        assert!(matches!("1.2.3.4:1/2".parse(), Ok(Target::Port(_))));
        assert!(matches!("1.2.3.4:1@2".parse(), Ok(Target::Memory(_))));
        assert_eq!(
            "1.2.3.4:1".parse::<Target>(),
            Err(ParseUidError::NotATarget("1.2.3.4:1".into()))
        );
    }
}
