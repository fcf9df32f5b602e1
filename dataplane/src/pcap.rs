//! Capture of the messages a link carries into pcap files that tshark and
//! Wireshark open.
//!
//! Each message is written as an Ethernet II frame with EtherType 0x88B5
//! (IEEE local experimental, the default of the `ether` stack) whose
//! payload is the encoded message, so a capture of a wrapped link looks
//! like a capture of the raw-Ethernet stack. The frame's MAC addresses are
//! the source and destination UIDs with the first octet's two low bits set
//! to "locally administered, unicast". Timestamps have nanosecond
//! resolution.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use futures_core::Stream;
use futures_sink::Sink;

use crate::link::{Link, LinkError};
use crate::wire::EXTENDED_HEADER_LEN;
use crate::{Message, Uid};

/// EtherType of captured frames (IEEE 802 local experimental 1).
pub const ETHERTYPE: u16 = 0x88b5;
/// pcap magic number of nanosecond-resolution files.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// pcap link type of Ethernet.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Length of the Ethernet header in front of each message.
pub const ETHERNET_HEADER_LEN: usize = 14;
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

/// Writes messages into a pcap stream.
pub struct PcapWriter<W: Write> {
    out: W,
    scratch: BytesMut,
    records: u64,
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
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&MAGIC_NANOS.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes());
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        header[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&header)?;
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
        self.scratch
            .extend_from_slice(&uid_mac(message.header().dst));
        self.scratch
            .extend_from_slice(&uid_mac(message.header().src));
        self.scratch.extend_from_slice(&ETHERTYPE.to_be_bytes());
        message.encode(&mut self.scratch);
        let len = self.scratch.len() as u32;
        let mut record = [0u8; 16];
        record[0..4].copy_from_slice(&(since.as_secs() as u32).to_le_bytes());
        record[4..8].copy_from_slice(&since.subsec_nanos().to_le_bytes());
        record[8..12].copy_from_slice(&len.to_le_bytes());
        record[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&record)?;
        self.out.write_all(&self.scratch)?;
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
    use crate::channel;
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;

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

        assert_eq!(le32(&file, 0), MAGIC_NANOS);
        assert_eq!(le32(&file, 20), LINKTYPE_ETHERNET);
        let mut at = 24;
        for _ in 0..2 {
            let len = le32(&file, at + 8) as usize;
            assert_eq!(len, ETHERNET_HEADER_LEN + 32 + 5);
            let frame = &file[at + 16..at + 16 + len];
            assert_eq!(&frame[0..6], &uid_mac(dst));
            assert_eq!(&frame[6..12], &uid_mac(src));
            assert_eq!(&frame[12..14], &ETHERTYPE.to_be_bytes());
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
