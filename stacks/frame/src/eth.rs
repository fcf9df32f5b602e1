//! The Ethernet II header, from `smoltcp::wire` (a checked view over bytes:
//! [`EthernetFrame::new_checked`] validates the length once, accessors
//! read in place), our MAC address type with its colon text form, and the
//! completion of checksums a local sender left to offload.

use std::fmt;
use std::str::FromStr;

use smoltcp::wire::{EthernetAddress, IpProtocol, Ipv4Packet};

pub use smoltcp::wire::{EthernetFrame, EthernetProtocol};

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = smoltcp::wire::ETHERNET_HEADER_LEN;
/// Smallest frame on the wire without the FCS; shorter frames are padded.
pub const MIN_FRAME_LEN: usize = 60;

/// An Ethernet address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Whether the group bit is set (broadcast or multicast).
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    /// A locally administered unicast address whose last four bytes are
    /// `tag` (for tests and examples).
    pub fn local(tag: u32) -> MacAddr {
        let t = tag.to_be_bytes();
        MacAddr([0x02, 0x75, t[0], t[1], t[2], t[3]])
    }
}

impl From<EthernetAddress> for MacAddr {
    fn from(a: EthernetAddress) -> Self {
        MacAddr(a.0)
    }
}

impl From<MacAddr> for EthernetAddress {
    fn from(m: MacAddr) -> Self {
        EthernetAddress(m.0)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Why text is not a MAC address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseMacError(pub String);

impl fmt::Display for ParseMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a MAC address such as 02:00:00:00:00:01",
            self.0
        )
    }
}

impl std::error::Error for ParseMacError {}

impl FromStr for MacAddr {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseMacError(s.to_owned());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for o in out.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 {
                return Err(bad());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        match parts.next() {
            None => Ok(MacAddr(out)),
            Some(_) => Err(bad()),
        }
    }
}

/// The source address of a checked frame, as a [`MacAddr`].
#[inline]
pub fn src<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> MacAddr {
    frame.src_addr().into()
}

/// The EtherType of a checked frame as its number.
#[inline]
pub fn ethertype<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> u16 {
    frame.ethertype().into()
}

/// Writes an Ethernet II header at the start of `buf` (at least
/// [`HEADER_LEN`] bytes long).
#[inline]
pub fn write_header(buf: &mut [u8], dst: MacAddr, src: MacAddr, ethertype: u16) {
    let mut f = EthernetFrame::new_unchecked(buf);
    f.set_dst_addr(dst.into());
    f.set_src_addr(src.into());
    f.set_ethertype(ethertype.into());
}

/// One's-complement sum of `data` added to `sum`, not folded.
fn sum16(mut sum: u64, data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u64) << 8;
    }
    sum
}

fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Internet checksum of `data` (RFC 1071).
pub fn internet_checksum(data: &[u8]) -> u16 {
    !fold(sum16(0, data))
}

/// Completes the TCP or UDP checksum of an IPv4 frame whose sender left it
/// to offload (the field holds the folded pseudo-header sum, as Linux does
/// for `CHECKSUM_PARTIAL`). Returns whether the frame was one it could
/// complete; other frames are left alone.
pub fn complete_l4_checksum(frame: &mut [u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(&*frame) else {
        return false;
    };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return false;
    }
    // Checks the header and total lengths against the frame.
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
        return false;
    };
    // smoltcp's length check leaves the version and a header shorter than
    // the fixed 20 bytes to its `Repr::parse`, which also wants a valid IP
    // checksum: check both here.
    if ip.version() != 4 || ip.header_len() < 20 {
        return false;
    }
    let csum_at = match ip.next_header() {
        IpProtocol::Tcp => 16,
        IpProtocol::Udp => 6,
        _ => return false,
    };
    let l4 = HEADER_LEN + usize::from(ip.header_len());
    let end = HEADER_LEN + usize::from(ip.total_len());
    if l4 + csum_at + 2 > end {
        return false;
    }
    let sum = !fold(sum16(0, &frame[l4..end]));
    let sum = if sum == 0 && csum_at == 6 {
        0xffff
    } else {
        sum
    };
    frame[l4 + csum_at..l4 + csum_at + 2].copy_from_slice(&sum.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_through_the_view() {
        let mut buf = [0u8; 20];
        write_header(&mut buf, MacAddr::BROADCAST, MacAddr::local(7), 0x88b5);
        let f = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(MacAddr::from(f.dst_addr()), MacAddr::BROADCAST);
        assert_eq!(src(&f), MacAddr::local(7));
        assert_eq!(ethertype(&f), 0x88b5);
        assert_eq!(f.payload().len(), 6);
        assert!(EthernetFrame::new_checked(&buf[..13]).is_err());
    }

    #[test]
    fn mac_text_forms_parse_and_print() {
        let m: MacAddr = "02:75:00:00:00:0a".parse().unwrap();
        assert_eq!(m, MacAddr::local(10));
        assert_eq!(m.to_string(), "02:75:00:00:00:0a");
        assert!("02:75".parse::<MacAddr>().is_err());
        assert!("02:75:00:00:00:0a:00".parse::<MacAddr>().is_err());
    }

    #[test]
    fn a_partial_udp_checksum_is_completed_to_the_full_one() {
        // IPv4/UDP 10.0.0.1:1000 -> 10.0.0.2:2000, payload "hi!".
        let mut f = vec![0u8; 14 + 20 + 8 + 3];
        write_header(&mut f, MacAddr::local(2), MacAddr::local(1), 0x0800);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&31u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let udp = &mut f[34..];
        udp[0..2].copy_from_slice(&1000u16.to_be_bytes());
        udp[2..4].copy_from_slice(&2000u16.to_be_bytes());
        udp[4..6].copy_from_slice(&11u16.to_be_bytes());
        udp[8..].copy_from_slice(b"hi!");
        // Pseudo header: src, dst, protocol, UDP length.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2, 0, 17]);
        pseudo.extend_from_slice(&11u16.to_be_bytes());
        let partial = fold(sum16(0, &pseudo));
        f[40..42].copy_from_slice(&partial.to_be_bytes());
        assert!(complete_l4_checksum(&mut f));
        // A correct checksum sums, with the pseudo header, to all ones.
        let total = fold(sum16(sum16(0, &pseudo), &f[34..]));
        assert_eq!(total, 0xffff);
    }

    #[test]
    fn a_frame_whose_ip_lengths_disagree_is_left_alone() {
        let mut f = vec![0u8; 14 + 20 + 8];
        write_header(&mut f, MacAddr::local(2), MacAddr::local(1), 0x0800);
        f[14] = 0x45;
        f[14 + 9] = 17;
        // Total length beyond the frame.
        f[16..18].copy_from_slice(&200u16.to_be_bytes());
        let before = f.clone();
        assert!(!complete_l4_checksum(&mut f));
        assert_eq!(f, before);
        // Header length below 20 bytes.
        f[14] = 0x44;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        assert!(!complete_l4_checksum(&mut f));
        // Not IPv4.
        f[14] = 0x65;
        assert!(!complete_l4_checksum(&mut f));
    }
}
