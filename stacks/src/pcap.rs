//! Capture of the messages a link carries into pcap files that tshark and
//! Wireshark open.
//!
//! Each message is written as an Ethernet II frame with the `ether`
//! stack's EtherType ([`ETHERTYPE`], IEEE 802 local experimental 1) whose
//! payload is the encoded message, so a capture of a wrapped link looks
//! like a capture of the raw-Ethernet stack. The frame's MAC addresses are
//! the source and destination UIDs with the first octet's two low bits set
//! to "locally administered, unicast". Timestamps have nanosecond
//! resolution.
//!
//! The Ethernet header is written by the frame layer (`smoltcp::wire`),
//! the file format by the `pcap-file` crate; this module only decides what
//! goes into them. It lives here rather than in `uniplane-dataplane` so
//! the vocabulary crate every other one builds on stays free of both.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use byteorder::LittleEndian;
use bytes::BytesMut;
use futures_core::Stream;
use futures_sink::Sink;
use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::{DataLink, PcapError, TsResolution};
use uniplane_dataplane::wire::EXTENDED_HEADER_LEN;
use uniplane_dataplane::{Link, LinkError, Message, Uid};
use uniplane_frame::eth::{self, MacAddr};

pub use crate::ether::ETHERTYPE;

/// Length of the Ethernet header in front of each message.
pub const ETHERNET_HEADER_LEN: usize = eth::HEADER_LEN;
/// Largest frame a capture holds: Ethernet header, two-beat header and the
/// largest payload.
pub const SNAPLEN: u32 = (ETHERNET_HEADER_LEN + EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD) as u32;

/// The MAC address a capture gives `uid`: its six bytes, locally
/// administered and unicast.
pub fn uid_mac(uid: Uid) -> [u8; 6] {
    let mut mac = uid.to_bytes();
    mac[0] = (mac[0] & 0xfc) | 0x02;
    mac
}

/// Writes messages into a pcap stream: Ethernet frames, nanosecond
/// timestamps, little-endian.
pub struct PcapWriter<W: Write> {
    out: W,
    scratch: BytesMut,
    records: u64,
}

/// The I/O error a `pcap-file` error stands for.
fn io_error(e: PcapError) -> io::Error {
    match e {
        PcapError::IoError(e) => e,
        other => io::Error::other(other),
    }
}

impl PcapWriter<BufWriter<File>> {
    /// Creates (or truncates) the file at `path` and writes the pcap header.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        PcapWriter::new(BufWriter::new(File::create(path)?))
    }
}

impl<W: Write> PcapWriter<W> {
    /// Writes the pcap file header to `out`.
    pub fn new(mut out: W) -> io::Result<Self> {
        // `pcap_file::pcap::PcapWriter` would own `out` with no way to
        // flush it; its header and packet encoders are used directly.
        PcapHeader {
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            endianness: pcap_file::Endianness::Little,
            ..PcapHeader::default()
        }
        .write_to(&mut out)
        .map_err(io_error)?;
        Ok(PcapWriter {
            out,
            scratch: BytesMut::with_capacity(SNAPLEN as usize),
            records: 0,
        })
    }

    /// Appends `message` as a frame captured at `time`.
    pub fn write_message(&mut self, time: SystemTime, message: &Message) -> io::Result<()> {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.scratch.clear();
        self.scratch.resize(ETHERNET_HEADER_LEN, 0);
        eth::write_header(
            &mut self.scratch,
            MacAddr(uid_mac(message.header().dst)),
            MacAddr(uid_mac(message.header().src)),
            ETHERTYPE,
        );
        message.encode(&mut self.scratch);
        let len = self.scratch.len() as u32;
        PcapPacket::new(since, len, &self.scratch)
            .write_to::<_, LittleEndian>(&mut self.out, TsResolution::NanoSecond, SNAPLEN)
            .map_err(io_error)?;
        self.records += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Pushes buffered records to the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// A [`Link`] that writes every message `L` sends and receives to a pcap
/// stream. Records are pushed to the writer on `poll_flush` and `poll_close`
/// (a `BufWriter` also flushes when dropped).
pub struct Capture<L, W: Write> {
    inner: L,
    writer: PcapWriter<W>,
}

impl<L: Link, W: Write> Capture<L, W> {
    /// Captures what `inner` carries into `writer`.
    pub fn new(inner: L, writer: PcapWriter<W>) -> Self {
        Capture { inner, writer }
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.writer.records()
    }

    /// The wrapped link and the writer.
    pub fn into_parts(self) -> (L, PcapWriter<W>) {
        (self.inner, self.writer)
    }
}

impl<L: Link, W: Write + Send + Unpin> Stream for Capture<L, W> {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let item = std::task::ready!(Pin::new(&mut this.inner).poll_next(cx));
        if let Some(Ok(m)) = &item {
            this.writer.write_message(SystemTime::now(), m)?;
        }
        Poll::Ready(item)
    }
}

impl<L: Link, W: Write + Send + Unpin> Sink<Message> for Capture<L, W> {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        Pin::new(&mut self.get_mut().inner).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        let this = self.get_mut();
        this.writer.write_message(SystemTime::now(), &item)?;
        Pin::new(&mut this.inner).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        this.writer.flush()?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        this.writer.flush()?;
        Pin::new(&mut this.inner).poll_close(cx)
    }
}

impl<L: Link, W: Write + Send + Unpin> Link for Capture<L, W> {}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;
    use uniplane_dataplane::channel;

    fn le32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[tokio::test]
    async fn capture_writes_a_pcap_record_per_message_in_both_directions() {
        let (a, mut b) = channel::pair(8);
        let mut cap = Capture::new(a, PcapWriter::new(Vec::new()).unwrap());
        let src = Uid::new(Ipv4Addr::new(10, 0, 0, 7), 3);
        let dst = Uid::new(Ipv4Addr::new(10, 0, 0, 9), 1);
        let m = Message::send(src.port(80), dst.port(443), Bytes::from_static(b"hello")).unwrap();
        cap.send(m.clone()).await.unwrap();
        b.send(m.clone()).await.unwrap();
        assert_eq!(cap.next().await.unwrap().unwrap(), m);
        assert_eq!(cap.records(), 2);
        let (_, writer) = cap.into_parts();
        let file = writer.into_inner();

        // The file header as the pcap format defines it: the magic of
        // nanosecond files, version 2.4, our snap length, link type 1
        // (Ethernet).
        assert_eq!(le32(&file, 0), 0xa1b2_3c4d);
        assert_eq!(&file[4..8], &[2, 0, 4, 0]);
        assert_eq!(le32(&file, 16), SNAPLEN);
        assert_eq!(le32(&file, 20), 1);
        let mut at = 24;
        for _ in 0..2 {
            let len = le32(&file, at + 8) as usize;
            assert_eq!(len, ETHERNET_HEADER_LEN + 32 + 5);
            let frame = &file[at + 16..at + 16 + len];
            assert_eq!(&frame[0..6], &uid_mac(dst));
            assert_eq!(&frame[6..12], &uid_mac(src));
            assert_eq!(&frame[12..14], &[0x88, 0xb5]);
            let body = Bytes::copy_from_slice(&frame[14..]);
            assert_eq!(Message::decode(&body).unwrap().0, m);
            at += 16 + len;
        }
        assert_eq!(at, file.len());
    }

    #[test]
    fn captured_macs_are_local_unicast() {
        let uid = Uid::new(Ipv4Addr::new(225, 1, 2, 3), 4);
        let mac = uid_mac(uid);
        assert_eq!(mac[0] & 0x03, 0x02);
        assert_eq!(&mac[1..], &uid.to_bytes()[1..]);
    }
}
