//! The compression operator pair on the path of payloads: a compressor
//! and a decompressor, each a resource of its own (a session with its
//! own UID and name), that ranks' data messages go through once a
//! communicator is told their names.
//!
//! ```text
//!   rank S ── DATA seg ──► compressor ── lz4 seg ──► decompressor ── DATA seg ──► rank R
//!          (raw, ≤ 60 KiB)   (own UID)   (or raw when    (own UID)   (raw again)
//!                                         it does not shrink)
//!   credits, RTS/CTS/FIN: direct S ⇄ R as before
//! ```
//!
//! With the pair in use, every data message to another rank (eager or of
//! rendezvous size) goes as segments of at most [`RELAY_SEGMENT`] bytes
//! to the compressor, which compresses each with LZ4 (`lz4_flex`'s block
//! format) and forwards it to the decompressor, which restores it and
//! sends it to the destination rank, found by the UID its HELLO gave.
//! One path per sender keeps the order of its messages. The sender takes
//! the receiver's window credit as for an eager message (at most half the
//! window per message), so the receiver's buffering stays bounded.
//!
//! Relay frames (little-endian), a 48-byte header then data: `kind u8
//! (1 HELLO, 2 DATA) | flags u8 (1 LAST, 2 COMPRESSED) | 0 u16 | source
//! world rank u32 | destination UID u64 | key comm u64 | key tag u64 |
//! message length u64 | segment offset u32 | segment's raw length u32`.
//! Every endpoint checks what it receives; a bad frame is counted and
//! dropped (the receiving rank then times out, never hangs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::mpsc;

use crate::endpoint::Event;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uniplane_client::{Client, Connection, Session};
use uniplane_dataplane::Uid;

use crate::frame::Key;
use crate::operator::find;
use crate::transport::{Item, Peer, OVERHEAD};
use crate::Error;

/// The port compression endpoints listen on.
pub const COMPRESSION_PORT: u16 = 7172;
/// Raw bytes of one relayed segment: compressed or not, it fits one
/// uniplane message with its header.
pub const RELAY_SEGMENT: usize = 60 * 1024;
const HEADER: usize = 48;
const HELLO: u8 = 1;
const DATA: u8 = 2;
const LAST: u8 = 1;
const COMPRESSED: u8 = 2;
/// Frames a decompressor holds for a rank that has not said HELLO yet.
const UNKNOWN_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: u8,
    flags: u8,
    src: u32,
    dst: u64,
    key: Key,
    total: u64,
    offset: u32,
    raw_len: u32,
}

impl Header {
    fn encode(&self, data: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER + data.len());
        b.put_u8(self.kind);
        b.put_u8(self.flags);
        b.put_u16_le(0);
        b.put_u32_le(self.src);
        b.put_u64_le(self.dst);
        b.put_u64_le(self.key.comm);
        b.put_u64_le(self.key.tag);
        b.put_u64_le(self.total);
        b.put_u32_le(self.offset);
        b.put_u32_le(self.raw_len);
        b.put_slice(data);
        b.freeze()
    }

    fn parse(p: &[u8]) -> Result<(Header, &[u8]), String> {
        if p.len() < HEADER {
            return Err(format!("a relay frame of {} bytes", p.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&p[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let h = Header {
            kind: p[0],
            flags: p[1],
            src: u32_at(4),
            dst: u64_at(8),
            key: Key {
                comm: u64_at(16),
                tag: u64_at(24),
            },
            total: u64_at(32),
            offset: u32_at(40),
            raw_len: u32_at(44),
        };
        let data = &p[HEADER..];
        if h.kind != HELLO && h.kind != DATA {
            return Err(format!("relay frame kind {}", h.kind));
        }
        if h.raw_len as usize > RELAY_SEGMENT
            || (h.flags & COMPRESSED == 0 && data.len() != h.raw_len as usize)
            || u64::from(h.offset) + u64::from(h.raw_len) > h.total
        {
            return Err(format!(
                "a segment of {} raw bytes at {} of {} carrying {}",
                h.raw_len,
                h.offset,
                h.total,
                data.len()
            ));
        }
        Ok((h, data))
    }
}

/// Counters of a compression endpoint.
#[derive(Debug, Default)]
pub struct CompressionStats {
    /// Data segments handled.
    pub segments: AtomicU64,
    /// Segments sent on compressed (the others did not shrink).
    pub compressed: AtomicU64,
    /// Raw bytes of the segments handled.
    pub raw_bytes: AtomicU64,
    /// Bytes between the pair (compressed where that was smaller).
    pub wire_bytes: AtomicU64,
    /// Frames refused and dropped.
    pub malformed: AtomicU64,
}

/// What a compression endpoint does.
#[derive(Clone, Debug)]
pub enum Role {
    /// Compresses what ranks send and forwards it to the decompressor of
    /// this name.
    Compress {
        /// The decompressor's resource name.
        to: String,
    },
    /// Restores what the compressor sends and delivers it to the ranks.
    Decompress,
}

/// A compression or decompression endpoint running as a task of this
/// process: its own session of the daemon, named as given, listening on
/// [`COMPRESSION_PORT`]. Dropping it stops it.
pub struct CompressionOperator {
    uid: Uid,
    stats: Arc<CompressionStats>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for CompressionOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressionOperator")
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

impl Drop for CompressionOperator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CompressionOperator {
    /// Attaches a session named `name` through `client` and serves as
    /// `role`. A compressor waits up to `timeout` for its decompressor.
    pub async fn start(
        client: Client,
        name: &str,
        role: Role,
        timeout: std::time::Duration,
    ) -> Result<CompressionOperator, Error> {
        let session = client.attach(name).await?;
        let listener = session.listen(COMPRESSION_PORT).await?;
        let uid = session.uid();
        let stats = Arc::new(CompressionStats::default());
        let next = match &role {
            Role::Compress { to } => {
                let at = find(&session, to, COMPRESSION_PORT, Instant::now() + timeout).await?;
                Some(session.connect(at.port(COMPRESSION_PORT)).await?)
            }
            Role::Decompress => None,
        };
        let task = tokio::spawn(serve(session, listener, next, stats.clone()));
        Ok(CompressionOperator { uid, stats, task })
    }

    /// Its UID.
    pub fn uid(&self) -> Uid {
        self.uid
    }

    /// Its counters.
    pub fn stats(&self) -> &CompressionStats {
        &self.stats
    }
}

async fn serve(
    session: Session,
    mut listener: uniplane_client::Listener,
    mut next: Option<Connection>,
    stats: Arc<CompressionStats>,
) {
    let (events_tx, mut events) = mpsc::channel::<Event>(1024);
    // Connections by their index, and the rank each serves; a connection
    // that left is forgotten with its ranks.
    let mut conns: HashMap<usize, mpsc::Sender<Bytes>> = HashMap::new();
    let mut ranks: HashMap<u64, usize> = HashMap::new();
    let mut unknown: Vec<(u64, Bytes)> = Vec::new();
    let mut index = 0usize;
    loop {
        tokio::select! {
            c = listener.accept() => {
                let Some(conn) = c else { break };
                crate::endpoint::join(index, conn, &events_tx).await;
                index += 1;
            }
            Some(e) = events.recv() => match e {
                Event::Joined(i, tx) => {
                    conns.insert(i, tx);
                }
                // Nothing waits on one connection: a rank's relayed
                // segments are whole frames.
                Event::Left(i) => {
                    conns.remove(&i);
                    ranks.retain(|_, c| *c != i);
                }
                Event::Frame(i, payload) => {
                    let (h, data) = match Header::parse(&payload) {
                        Ok(x) => x,
                        Err(why) => {
                            stats.malformed.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!("compression endpoint dropped a frame: {why}");
                            continue;
                        }
                    };
                    if h.kind == HELLO {
                        ranks.insert(h.dst, i);
                        // Deliver what waited for this rank.
                        let (now, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut unknown).into_iter().partition(|(d, _)| *d == h.dst);
                        unknown = wait;
                        if let Some(tx) = conns.get(&i) {
                            for (_, f) in now {
                                let _ = tx.send(f).await;
                            }
                        }
                        continue;
                    }
                    stats.segments.fetch_add(1, Ordering::Relaxed);
                    stats.raw_bytes.fetch_add(u64::from(h.raw_len), Ordering::Relaxed);
                    if let Some(next) = next.as_mut() {
                        // Compressor: shrink and pass on.
                        let packed = if h.flags & COMPRESSED == 0 {
                            lz4_flex::block::compress(data)
                        } else {
                            Vec::new()
                        };
                        let out = if !packed.is_empty() && packed.len() < data.len() {
                            stats.compressed.fetch_add(1, Ordering::Relaxed);
                            Header { flags: h.flags | COMPRESSED, ..h }.encode(&packed)
                        } else {
                            payload.clone()
                        };
                        stats.wire_bytes.fetch_add((out.len() - HEADER) as u64, Ordering::Relaxed);
                        if let Err(e) = next.send_bytes(out).await {
                            tracing::warn!("compressor lost its decompressor: {e}");
                            break;
                        }
                    } else {
                        // Decompressor: restore and deliver.
                        stats.wire_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                        let out = if h.flags & COMPRESSED != 0 {
                            stats.compressed.fetch_add(1, Ordering::Relaxed);
                            match lz4_flex::block::decompress(data, h.raw_len as usize) {
                                Ok(raw) if raw.len() == h.raw_len as usize => {
                                    Header { flags: h.flags & !COMPRESSED, ..h }.encode(&raw)
                                }
                                other => {
                                    stats.malformed.fetch_add(1, Ordering::Relaxed);
                                    tracing::warn!("decompressor dropped a bad segment: {:?}", other.map(|r| r.len()));
                                    continue;
                                }
                            }
                        } else {
                            payload.clone()
                        };
                        match ranks.get(&h.dst).and_then(|c| conns.get(c)) {
                            Some(tx) => {
                                let _ = tx.send(out).await;
                            }
                            None if unknown.len() < UNKNOWN_MAX => unknown.push((h.dst, out)),
                            None => {
                                stats.malformed.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!("decompressor dropped a segment for unknown rank {}", h.dst);
                            }
                        }
                    }
                }
            }
        }
    }
    drop(session);
}

// ── the rank's side ──────────────────────────────────────────────────

/// A rank's links to the pair: segments out to the compressor, restored
/// messages in from the decompressor.
pub(crate) struct RelayLink {
    out: mpsc::Sender<Vec<Bytes>>,
    tasks: [JoinHandle<()>; 2],
    me: u32,
}

impl Drop for RelayLink {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl RelayLink {
    /// Connects to the compressor `c` and the decompressor `d` (says
    /// HELLO there), delivering what arrives into `peers`' inboxes.
    pub(crate) async fn connect(
        session: &Session,
        (c, d): (&str, &str),
        me: usize,
        peers: Arc<dyn Fn(usize) -> Option<Arc<crate::transport::Inbox>> + Send + Sync>,
        window: u64,
        deadline: Instant,
    ) -> Result<RelayLink, Error> {
        let c_uid = find(session, c, COMPRESSION_PORT, deadline).await?;
        let d_uid = find(session, d, COMPRESSION_PORT, deadline).await?;
        let mut to_c = session.connect(c_uid.port(COMPRESSION_PORT)).await?;
        let mut from_d = session.connect(d_uid.port(COMPRESSION_PORT)).await?;
        let hello = Header {
            kind: HELLO,
            flags: 0,
            src: me as u32,
            dst: session.uid().to_u64(),
            key: Key { comm: 0, tag: 0 },
            total: 0,
            offset: 0,
            raw_len: 0,
        };
        from_d
            .send_bytes(hello.encode(&[]))
            .await
            .map_err(|e| Error::Setup(format!("greeting the decompressor: {e}")))?;
        let (out, mut out_rx) = mpsc::channel::<Vec<Bytes>>(64);
        let sender = tokio::spawn(async move {
            while let Some(frames) = out_rx.recv().await {
                for f in frames {
                    if to_c.send_bytes(f).await.is_err() {
                        return;
                    }
                }
            }
        });
        let receiver = tokio::spawn(async move {
            let mut partial: HashMap<(u32, Key), BytesMut> = HashMap::new();
            while let Some(Ok(m)) = from_d.recv().await {
                let (h, data) = match Header::parse(m.payload()) {
                    Ok(x) if x.0.kind == DATA && x.0.flags & COMPRESSED == 0 => x,
                    other => {
                        tracing::warn!("dropped a bad frame from the decompressor: {other:?}");
                        continue;
                    }
                };
                let Some(inbox) = peers(h.src as usize) else {
                    tracing::warn!("a relayed message from unknown rank {}", h.src);
                    continue;
                };
                let buf = partial.entry((h.src, h.key)).or_default();
                if buf.len() as u64 != u64::from(h.offset) {
                    tracing::warn!(
                        "a relayed segment out of place: {} at {}",
                        h.offset,
                        buf.len()
                    );
                    partial.remove(&(h.src, h.key));
                    continue;
                }
                buf.extend_from_slice(data);
                if h.flags & LAST != 0 {
                    let Some(whole) = partial.remove(&(h.src, h.key)) else {
                        continue;
                    };
                    if whole.len() as u64 != h.total {
                        tracing::warn!("a relayed message ended short");
                        continue;
                    }
                    let cost = relay_cost(h.total, window);
                    inbox.push(h.key, Item::Eager(whole.freeze()), cost);
                }
            }
        });
        Ok(RelayLink {
            out,
            tasks: [sender, receiver],
            me: me as u32,
        })
    }

    /// Sends `data` under `key` to `peer` (UID `dst`) through the pair,
    /// after taking the receiver's window credit.
    pub(crate) async fn send(
        &self,
        peer: &Peer,
        dst: Uid,
        key: Key,
        data: &[u8],
        window: u64,
        deadline: Instant,
    ) -> Result<(), Error> {
        peer.take_credit(relay_cost(data.len() as u64, window), deadline)
            .await?;
        let mut frames = Vec::with_capacity(data.len() / RELAY_SEGMENT + 1);
        let mut offset = 0;
        loop {
            let end = (offset + RELAY_SEGMENT).min(data.len());
            let h = Header {
                kind: DATA,
                flags: if end == data.len() { LAST } else { 0 },
                src: self.me,
                dst: dst.to_u64(),
                key,
                total: data.len() as u64,
                offset: offset as u32,
                raw_len: (end - offset) as u32,
            };
            frames.push(h.encode(&data[offset..end]));
            offset = end;
            if offset == data.len() {
                break;
            }
        }
        tokio::time::timeout_at(deadline, self.out.send(frames))
            .await
            .map_err(|_| Error::Timeout {
                peer: peer.rank(),
                what: "room towards the compressor",
            })?
            .map_err(|_| Error::PeerGone {
                peer: peer.rank(),
                reason: "the compressor's connection closed".into(),
            })
    }
}

/// Window credit one relayed message of `len` bytes takes (and its
/// receiver returns): as an eager message, at most half the window.
fn relay_cost(len: u64, window: u64) -> u64 {
    (len + OVERHEAD).min(window / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_frames_round_trip_and_bad_ones_are_refused() {
        let h = Header {
            kind: DATA,
            flags: LAST,
            src: 2,
            dst: 77,
            key: Key { comm: 5, tag: 9 },
            total: 10,
            offset: 7,
            raw_len: 3,
        };
        let b = h.encode(&[1, 2, 3]);
        assert_eq!(Header::parse(&b).unwrap(), (h, &[1u8, 2, 3][..]));
        assert!(Header::parse(&b[..HEADER - 1]).is_err());
        assert!(Header::parse(&b[..HEADER + 2]).is_err());
        let past = Header { offset: 8, ..h }.encode(&[1, 2, 3]);
        assert!(Header::parse(&past).is_err());
    }

    #[test]
    fn a_full_segment_fits_one_message_even_when_it_does_not_shrink() {
        let noise: Vec<u8> = (0..RELAY_SEGMENT as u64)
            .map(|i| (crate::comm::mix(i, 3) >> 7) as u8)
            .collect();
        let packed = lz4_flex::block::compress(&noise);
        assert!(HEADER + packed.len().max(noise.len()) <= 65_535);
        assert_eq!(
            lz4_flex::block::decompress(&packed, noise.len()).unwrap(),
            noise
        );
    }
}
