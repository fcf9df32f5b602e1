//! Streaming operators as endpoints (ACCL+'s plugins): a reduction
//! operator is a resource of its own — a session with its own UID and
//! name, attached to the daemon — that ranks send their operands through.
//!
//! ```text
//!   rank 0 ─ OPERAND seg i ─┐                       ┌─► RESULT seg i ─ rank 0
//!   rank 1 ─ OPERAND seg i ─┼─► reduction operator ─┼─► RESULT seg i ─ rank 1
//!   rank 2 ─ OPERAND seg i ─┘  (combines segment i  └─► RESULT seg i ─ rank 2
//!                               as operands arrive)
//! ```
//!
//! A call through the operator cuts each rank's buffer into segments of
//! [`SEGMENT_BYTES`](crate::stream::SEGMENT_BYTES); every rank sends
//! segment `i` as an OPERAND frame on its connection to the operator,
//! which folds each operand into the segment's accumulator as it arrives
//! and, once all `n` ranks' operands are in, sends a RESULT to each: with
//! the data for an allreduce (every rank) or a reduce (the root only),
//! empty otherwise (the acknowledgement that paces the sender). A rank
//! keeps at most [`IN_FLIGHT`](crate::stream::IN_FLIGHT) segments
//! unacknowledged, so segment `i+1` travels while segment `i` is reduced
//! and the operator holds at most that many accumulators per call.
//!
//! Frames (little-endian), a 32-byte header then data:
//! `kind u8 (1 OPERAND, 2 RESULT, 3 ERROR) | datatype u8 | op u8 | flags u8
//! | n u16 | rank u16 | root u16 (0xffff: all) | 0 u16 | segment u32 |
//! context u64 | data length u32 | 0 u32`. The operator checks every
//! frame (datatype, operation, sizes, ranks, that the operands of one
//! segment agree and that no rank sends one twice); a bad one is counted
//! and answered with an ERROR naming why, which fails that rank's call.

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

use crate::datatype::{Datatype, Element, Op};
use crate::frame::Key;
use crate::transport::{pop, Inbox, Item};
use crate::Error;

/// The port a reduction operator listens on.
pub const OPERATOR_PORT: u16 = 7171;
const HEADER: usize = 32;
const OPERAND: u8 = 1;
const RESULT: u8 = 2;
const ERROR: u8 = 3;
const ALL: u16 = u16::MAX;
/// Accumulators an operator holds at once (over every call and rank).
const MAX_PENDING: usize = 4096;
/// Bytes those accumulators may hold together (operands and the per-rank
/// record a segment keeps: 16 bytes a rank): a frame can claim 65,535
/// ranks, so the count alone does not bound the memory.
const MAX_PENDING_BYTES: usize = 256 << 20;

/// A parsed operator frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: u8,
    datatype: u8,
    op: u8,
    n: u16,
    rank: u16,
    root: u16,
    segment: u32,
    context: u64,
    len: u32,
}

impl Header {
    fn encode(&self, data: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER + data.len());
        b.put_u8(self.kind);
        b.put_u8(self.datatype);
        b.put_u8(self.op);
        b.put_u8(0);
        b.put_u16_le(self.n);
        b.put_u16_le(self.rank);
        b.put_u16_le(self.root);
        b.put_u16_le(0);
        b.put_u32_le(self.segment);
        b.put_u64_le(self.context);
        b.put_u32_le(data.len() as u32);
        b.put_u32_le(0);
        b.put_slice(data);
        b.freeze()
    }

    fn parse(p: &[u8]) -> Result<(Header, &[u8]), String> {
        if p.len() < HEADER {
            return Err(format!("a frame of {} bytes", p.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes([p[i], p[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&p[16..24]);
        let h = Header {
            kind: p[0],
            datatype: p[1],
            op: p[2],
            n: u16_at(4),
            rank: u16_at(6),
            root: u16_at(8),
            segment: u32_at(12),
            context: u64::from_le_bytes(c),
            len: u32_at(24),
        };
        let data = &p[HEADER..];
        if data.len() != h.len as usize {
            return Err(format!(
                "a frame saying {} bytes of data carries {}",
                h.len,
                data.len()
            ));
        }
        Ok((h, data))
    }
}

fn op_index(op: Op) -> u8 {
    Op::ALL.iter().position(|&o| o == op).unwrap_or_default() as u8
}

fn datatype_index(d: Datatype) -> u8 {
    Datatype::ALL
        .iter()
        .position(|&t| t == d)
        .unwrap_or_default() as u8
}

/// Counters of an operator endpoint: they show what went through it.
#[derive(Debug, Default)]
pub struct OperatorStats {
    /// Operand segments received and folded in.
    pub operands: AtomicU64,
    /// Operand bytes received.
    pub operand_bytes: AtomicU64,
    /// Segments completed (all ranks' operands combined).
    pub segments: AtomicU64,
    /// Frames refused (each answered with an ERROR).
    pub malformed: AtomicU64,
    /// Ranks connected so far.
    pub connections: AtomicU64,
    /// Segments waiting for operands now (those of a connection that
    /// ends are dropped).
    pub pending: AtomicU64,
}

/// A reduction operator endpoint running as a task of this process: its
/// own session (resource) of the daemon, named as given, listening on
/// [`OPERATOR_PORT`]. Dropping it stops the operator.
pub struct ReductionOperator {
    uid: Uid,
    stats: Arc<OperatorStats>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ReductionOperator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReductionOperator")
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

impl Drop for ReductionOperator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReductionOperator {
    /// Attaches a session named `name` through `client` and serves ranks
    /// that connect to it.
    pub async fn start(client: Client, name: &str) -> Result<ReductionOperator, Error> {
        let session = client.attach(name).await?;
        let listener = session.listen(OPERATOR_PORT).await?;
        let uid = session.uid();
        let stats = Arc::new(OperatorStats::default());
        let task = tokio::spawn(serve(session, listener, stats.clone()));
        Ok(ReductionOperator { uid, stats, task })
    }

    /// Its UID.
    pub fn uid(&self) -> Uid {
        self.uid
    }

    /// Its counters.
    pub fn stats(&self) -> &OperatorStats {
        &self.stats
    }
}

/// One segment being combined.
struct Pending {
    first: Header,
    acc: Vec<u8>,
    /// Which ranks sent their operand, and on which connection.
    from: Vec<Option<usize>>,
    got: usize,
}

impl Pending {
    /// What it holds, as [`MAX_PENDING_BYTES`] counts it.
    fn bytes(&self) -> usize {
        self.acc.len() + self.from.len() * std::mem::size_of::<Option<usize>>()
    }
}

/// The segments being combined, and the bytes they hold.
#[derive(Default)]
struct Accumulators {
    map: HashMap<(u64, u32), Pending>,
    bytes: usize,
}

async fn serve(
    session: Session,
    mut listener: uniplane_client::Listener,
    stats: Arc<OperatorStats>,
) {
    let (events_tx, mut events) = mpsc::channel::<Event>(1024);
    // Connections by their index; a connection that left is forgotten.
    let mut conns: HashMap<usize, mpsc::Sender<Bytes>> = HashMap::new();
    let mut pending = Accumulators::default();
    let mut scratch = Vec::new();
    let mut next = 0usize;
    loop {
        tokio::select! {
            c = listener.accept() => {
                let Some(conn) = c else { break };
                crate::endpoint::join(next, conn, &events_tx).await;
                stats.connections.fetch_add(1, Ordering::Relaxed);
                next += 1;
            }
            Some(e) = events.recv() => match e {
                Event::Joined(i, tx) => {
                    conns.insert(i, tx);
                }
                Event::Left(i) => {
                    conns.remove(&i);
                    pending.map.retain(|_, p| !p.from.contains(&Some(i)));
                    pending.bytes = pending.map.values().map(Pending::bytes).sum();
                    stats.pending.store(pending.map.len() as u64, Ordering::Relaxed);
                }
                Event::Frame(i, payload) => {
                    let folded = fold(i, &payload, &mut pending, &conns, &stats, &mut scratch).await;
                    stats.pending.store(pending.map.len() as u64, Ordering::Relaxed);
                    if let Err(why) = folded {
                        stats.malformed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!("reduction operator refused a frame: {why}");
                        let h = Header::parse(&payload).map(|(h, _)| h).unwrap_or(Header {
                            kind: 0, datatype: 0, op: 0, n: 0, rank: 0, root: 0, segment: 0, context: 0, len: 0,
                        });
                        let err = Header { kind: ERROR, ..h }.encode(why.as_bytes());
                        if let Some(tx) = conns.get(&i) {
                            let _ = tx.send(err).await;
                        }
                    }
                }
            }
        }
    }
    drop(session);
}

/// Folds one operand into its segment; sends the results when complete.
async fn fold(
    conn: usize,
    payload: &[u8],
    pending: &mut Accumulators,
    conns: &HashMap<usize, mpsc::Sender<Bytes>>,
    stats: &OperatorStats,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    let (h, data) = Header::parse(payload)?;
    if h.kind != OPERAND {
        return Err(format!("frame kind {}", h.kind));
    }
    let dt = *Datatype::ALL
        .get(h.datatype as usize)
        .ok_or_else(|| format!("datatype {}", h.datatype))?;
    let op = *Op::ALL
        .get(h.op as usize)
        .ok_or_else(|| format!("operation {}", h.op))?;
    if h.n == 0 || h.rank >= h.n || (h.root != ALL && h.root >= h.n) {
        return Err(format!("rank {} root {} of {}", h.rank, h.root, h.n));
    }
    if data.len() % dt.size() != 0 {
        return Err(format!("{} bytes of {}", data.len(), dt.name()));
    }
    stats.operands.fetch_add(1, Ordering::Relaxed);
    stats
        .operand_bytes
        .fetch_add(data.len() as u64, Ordering::Relaxed);
    let key = (h.context, h.segment);
    let full = pending.map.len() >= MAX_PENDING;
    let held = pending.bytes;
    let p = match pending.map.entry(key) {
        std::collections::hash_map::Entry::Vacant(v) => {
            if full {
                return Err(format!("more than {MAX_PENDING} segments pending"));
            }
            let bytes = data.len() + h.n as usize * std::mem::size_of::<Option<usize>>();
            if held + bytes > MAX_PENDING_BYTES {
                return Err(format!(
                    "a segment of {bytes} bytes over the {MAX_PENDING_BYTES} bytes pending segments may hold"
                ));
            }
            let mut from = vec![None; h.n as usize];
            from[h.rank as usize] = Some(conn);
            pending.bytes += bytes;
            v.insert(Pending {
                first: h,
                acc: data.to_vec(),
                from,
                got: 1,
            })
        }
        std::collections::hash_map::Entry::Occupied(o) => {
            let p = o.into_mut();
            let f = p.first;
            if (f.datatype, f.op, f.n, f.root, f.len) != (h.datatype, h.op, h.n, h.root, h.len) {
                return Err(format!(
                    "segment {} of rank {} disagrees with rank {}'s",
                    h.segment, h.rank, f.rank
                ));
            }
            if p.from[h.rank as usize].is_some() {
                return Err(format!("rank {} sent segment {} twice", h.rank, h.segment));
            }
            p.from[h.rank as usize] = Some(conn);
            p.got += 1;
            combine(dt, op, &mut p.acc, data, scratch);
            p
        }
    };
    if p.got < p.from.len() {
        return Ok(());
    }
    let Some(p) = pending.map.remove(&key) else {
        return Ok(());
    };
    pending.bytes -= p.bytes();
    stats.segments.fetch_add(1, Ordering::Relaxed);
    let result = |with: bool| {
        Header {
            kind: RESULT,
            len: 0,
            ..p.first
        }
        .encode(if with { &p.acc } else { &[] })
    };
    let (with, without) = (result(true), result(false));
    for (rank, c) in p.from.iter().enumerate() {
        let wants = p.first.root == ALL || p.first.root as usize == rank;
        if let Some(tx) = c.and_then(|c| conns.get(&c)) {
            let _ = tx
                .send(if wants { with.clone() } else { without.clone() })
                .await;
        }
    }
    Ok(())
}

/// `acc op= other`, both little-endian elements of `dt`.
fn combine(dt: Datatype, op: Op, acc: &mut [u8], other: &[u8], scratch: &mut Vec<u8>) {
    fn typed<T: Element>(op: Op, acc: &mut [u8], other: &[u8], scratch: &mut Vec<u8>) {
        const BLOCK: usize = 256;
        let mut tmp = [T::default(); BLOCK];
        for (a, o) in acc
            .chunks_mut(BLOCK * T::SIZE)
            .zip(other.chunks(BLOCK * T::SIZE))
        {
            let k = a.len() / T::SIZE;
            T::decode(a, &mut tmp[..k]);
            T::reduce_bytes(op, &mut tmp[..k], o);
            scratch.clear();
            T::encode(&tmp[..k], scratch);
            a.copy_from_slice(scratch);
        }
    }
    match dt {
        Datatype::I8 => typed::<i8>(op, acc, other, scratch),
        Datatype::I16 => typed::<i16>(op, acc, other, scratch),
        Datatype::I32 => typed::<i32>(op, acc, other, scratch),
        Datatype::I64 => typed::<i64>(op, acc, other, scratch),
        Datatype::U8 => typed::<u8>(op, acc, other, scratch),
        Datatype::U16 => typed::<u16>(op, acc, other, scratch),
        Datatype::U32 => typed::<u32>(op, acc, other, scratch),
        Datatype::U64 => typed::<u64>(op, acc, other, scratch),
        Datatype::F32 => typed::<f32>(op, acc, other, scratch),
        Datatype::F64 => typed::<f64>(op, acc, other, scratch),
    }
}

// ── the rank's side ──────────────────────────────────────────────────

/// A rank's connection to a reduction operator.
pub(crate) struct OperatorLink {
    out: mpsc::Sender<Bytes>,
    inbox: Arc<Inbox>,
    pump: JoinHandle<()>,
}

impl Drop for OperatorLink {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

impl OperatorLink {
    /// Finds the resource `name` (listening on [`OPERATOR_PORT`]) among
    /// the daemon's resources and connects to it.
    pub(crate) async fn connect(
        session: &Session,
        name: &str,
        deadline: Instant,
    ) -> Result<OperatorLink, Error> {
        let uid = find(session, name, OPERATOR_PORT, deadline).await?;
        let conn = tokio::time::timeout_at(deadline, session.connect(uid.port(OPERATOR_PORT)))
            .await
            .map_err(|_| Error::Setup(format!("connecting to operator {name} timed out")))??;
        let (out, out_rx) = mpsc::channel(64);
        let inbox: Arc<Inbox> = Arc::default();
        let pump = tokio::spawn(link_pump(conn, out_rx, inbox.clone()));
        Ok(OperatorLink { out, inbox, pump })
    }

    /// Reduces `acc` of rank `rank` with the other `n - 1` ranks'
    /// (`(rank, n)`) through the operator; `root`: only that rank gets
    /// the result (`None`: every rank).
    pub(crate) async fn reduce<T: Element>(
        &self,
        context: u64,
        (rank, n): (usize, usize),
        root: Option<usize>,
        acc: &mut [T],
        op: Op,
        deadline_of: impl Fn() -> Instant,
    ) -> Result<(), Error> {
        if n > usize::from(u16::MAX) {
            return Err(Error::Argument(format!(
                "{n} ranks is too many for an operator"
            )));
        }
        let seg = (crate::stream::SEGMENT_BYTES / T::SIZE).max(1);
        let total = acc.len();
        let segments = total.div_ceil(seg);
        let header = |i: usize, len: usize| Header {
            kind: OPERAND,
            datatype: datatype_index(T::DATATYPE),
            op: op_index(op),
            n: n as u16,
            rank: rank as u16,
            root: root.map_or(ALL, |r| r as u16),
            segment: i as u32,
            context,
            len: len as u32,
        };
        let mut encoded = Vec::with_capacity(seg * T::SIZE);
        let mut sent = 0;
        for i in 0..segments {
            while sent < segments && sent < i + crate::stream::IN_FLIGHT {
                let part = &acc[sent * seg..((sent + 1) * seg).min(total)];
                encoded.clear();
                T::encode(part, &mut encoded);
                let f = header(sent, encoded.len()).encode(&encoded);
                tokio::time::timeout_at(deadline_of(), self.out.send(f))
                    .await
                    .map_err(|_| Error::Timeout {
                        peer: rank,
                        what: "room towards the operator",
                    })?
                    .map_err(|_| Error::PeerGone {
                        peer: rank,
                        reason: "the operator's connection closed".into(),
                    })?;
                sent += 1;
            }
            let key = Key {
                comm: context,
                tag: i as u64,
            };
            let (item, _) = self
                .inbox
                .wait(rank, deadline_of(), |s| pop(&mut s.data, key))
                .await
                .map_err(|e| match e {
                    Error::Timeout { .. } => Error::Timeout {
                        peer: rank,
                        what: "the operator's result",
                    },
                    e => e,
                })?;
            let Item::Eager(b) = item else {
                return Err(Error::Protocol("the operator sent no result".into()));
            };
            let (h, data) = Header::parse(&b).map_err(Error::Protocol)?;
            if h.kind == ERROR {
                return Err(Error::Protocol(format!(
                    "the operator refused segment {i}: {}",
                    String::from_utf8_lossy(data)
                )));
            }
            let out = &mut acc[i * seg..((i + 1) * seg).min(total)];
            let wants = root.is_none_or(|r| r == rank);
            if wants {
                if data.len() != out.len() * T::SIZE {
                    return Err(Error::Protocol(format!(
                        "the operator's segment {i} has {} bytes where {} were expected",
                        data.len(),
                        out.len() * T::SIZE
                    )));
                }
                T::decode(data, out);
            }
        }
        Ok(())
    }
}

async fn link_pump(mut conn: Connection, mut out: mpsc::Receiver<Bytes>, inbox: Arc<Inbox>) {
    let reason = loop {
        tokio::select! {
            m = conn.recv() => match m {
                None => break "the operator's connection closed".to_string(),
                Some(Err(e)) => break e.to_string(),
                Some(Ok(m)) => {
                    let p = m.payload().clone();
                    match Header::parse(&p) {
                        Ok((h, _)) if h.kind == RESULT || h.kind == ERROR => {
                            let key = Key { comm: h.context, tag: u64::from(h.segment) };
                            inbox.push(key, Item::Eager(p), 0);
                        }
                        other => tracing::warn!("dropped a bad frame from the operator: {other:?}"),
                    }
                }
            },
            b = out.recv() => match b {
                None => break "the communicator was dropped".to_string(),
                Some(b) => {
                    if let Err(e) = conn.send_bytes(b).await {
                        break e.to_string();
                    }
                }
            },
        }
    };
    inbox.close(reason);
}

/// The UID of the resource `name` listening on `port`.
pub(crate) async fn find(
    session: &Session,
    name: &str,
    port: u16,
    deadline: Instant,
) -> Result<Uid, Error> {
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        let list = session
            .client()
            .request(&uniplane_client::protocol::Request::Resources)
            .await?;
        for r in list.as_array().into_iter().flatten() {
            if r.get("name").and_then(|n| n.as_str()) != Some(name) {
                continue;
            }
            let listening = r
                .get("listening")
                .and_then(|l| l.as_array())
                .is_some_and(|l| l.iter().any(|p| p.as_u64() == Some(u64::from(port))));
            if let (true, Some(uid)) = (
                listening,
                r.get("uid")
                    .and_then(|u| u.as_str())
                    .and_then(|u| u.parse().ok()),
            ) {
                return Ok(uid);
            }
        }
        if Instant::now() + pause > deadline {
            return Err(Error::Setup(format!(
                "no resource named {name} listens on port {port}"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Operand frames claiming 65,535 ranks each hold 1 MiB of rank
    /// records: they are refused once the accumulators' bytes would pass
    /// their bound, and a segment that completes gives its bytes back.
    #[tokio::test]
    async fn pending_segments_are_bounded_by_the_bytes_they_hold() {
        let stats = OperatorStats::default();
        let conns = HashMap::new();
        let mut pending = Accumulators::default();
        let mut scratch = Vec::new();
        let frame = |n: u16, rank: u16, segment: u32| {
            Header {
                kind: OPERAND,
                datatype: 3,
                op: 0,
                n,
                rank,
                root: ALL,
                segment,
                context: 1,
                len: 0,
            }
            .encode(&[0u8; 64])
        };
        let mut refused = None;
        for segment in 0..1000 {
            let r = fold(
                0,
                &frame(u16::MAX, 0, segment),
                &mut pending,
                &conns,
                &stats,
                &mut scratch,
            )
            .await;
            assert!(pending.bytes <= MAX_PENDING_BYTES);
            if let Err(why) = r {
                refused = Some((segment, why));
                break;
            }
        }
        let (at, why) = refused.expect("the bound was never reached");
        assert!(why.contains("pending segments may hold"), "{why}");
        let per = 64 + usize::from(u16::MAX) * std::mem::size_of::<Option<usize>>();
        assert_eq!(at as usize, MAX_PENDING_BYTES / per);
        // A segment of two ranks still fits in what is left, and gives
        // its bytes back when it completes.
        let before = (pending.map.len(), pending.bytes);
        let two = |rank| frame(2, rank, 5000);
        fold(0, &two(0), &mut pending, &conns, &stats, &mut scratch)
            .await
            .unwrap();
        assert!(pending.bytes > before.1);
        fold(1, &two(1), &mut pending, &conns, &stats, &mut scratch)
            .await
            .unwrap();
        assert_eq!((pending.map.len(), pending.bytes), before);
        assert_eq!(stats.segments.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let h = Header {
            kind: OPERAND,
            datatype: 3,
            op: 1,
            n: 4,
            rank: 2,
            root: ALL,
            segment: 9,
            context: 0x1234_5678_9abc,
            len: 3,
        };
        let b = h.encode(&[1, 2, 3]);
        assert_eq!(Header::parse(&b).unwrap(), (h, &[1u8, 2, 3][..]));
        assert!(Header::parse(&b[..HEADER - 1]).is_err());
        assert!(Header::parse(&b[..HEADER + 2]).is_err());
    }

    #[test]
    fn combining_bytes_equals_combining_values() {
        let a = [5i32, -7, i32::MAX];
        let b = [3i32, 9, 1];
        let mut acc = crate::datatype::to_bytes(&a);
        let mut scratch = Vec::new();
        combine(
            Datatype::I32,
            Op::Sum,
            &mut acc,
            &crate::datatype::to_bytes(&b),
            &mut scratch,
        );
        let mut got = [0i32; 3];
        i32::decode(&acc, &mut got);
        assert_eq!(got, [8, 2, i32::MIN]);
    }
}
