//! [`Endpoint`]: a session of the group, its connections and operations.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::future::join_all;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use rustc_hash::FxHashMap;
use tokio::sync::{oneshot, watch, Mutex as AsyncMutex, Semaphore};
use tokio::task::AbortHandle;
use uniplane_client::{Connection, Listener, Session, SharedAccess, SharedRegion};
use uniplane_dataplane::{Endpoint as PortAddr, LinkError, Message, Uid};

use crate::segment::{SegmentMemory, Width};
use crate::target::{Inbound, Reply, TargetCounters, MAX_GET};
use crate::wire::{
    self, charge, Head, Kind, Shape, FLAG_ASYNC, FLAG_LANDED, HEADER_LEN, MAX_FRAME,
};
use crate::{
    Acl, AtomicOp, Group, Handler, HandlerId, PgasError, Progress, Refusal, Segment, SegmentId,
    SoftTarget, Target, TargetStats, FIRST_USER_HANDLER, HANDLER_COUNTER, HANDLER_NONE,
};

/// The port endpoints listen on unless [`Options::port`] says otherwise.
pub const DEFAULT_PORT: u16 = 0x5047;

/// Traffic class of requests (bulk data).
const DATA_CLASS: u8 = 0;
/// Traffic class of replies, credit and barrier messages.
const CONTROL_CLASS: u8 = 1;

/// How an endpoint works.
#[derive(Clone, Debug)]
pub struct Options {
    /// The port every member listens on (the same for the whole group).
    pub port: u16,
    /// Bytes of requests a sender may have unprocessed at each target.
    /// Keep `members × credit_bytes` under the 1 MiB data ring of a
    /// session. At least 4 frames (256 KiB).
    pub credit_bytes: u32,
    /// The largest medium payload a target gathers for its handler.
    pub max_medium: usize,
    /// Frames of one get in flight at once.
    pub get_window: usize,
    /// How long [`Endpoint::join`] may take.
    pub join_timeout: Duration,
    /// Put the segments registered before [`Endpoint::join`] (those whose
    /// ACL is [`Acl::ReadWrite`] or [`Acl::ReadOnly`]) in shared memory
    /// the daemon lends this server's other ranks, so that their
    /// contiguous long messages and gets copy the bytes themselves, as
    /// OpenSHMEM's symmetric heap lets processes: a long message is then
    /// one copy and a header-only frame for its handler and reply, a get
    /// one copy and no message. Other ranks, other shapes, and segments
    /// registered later use messages.
    pub share: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            port: DEFAULT_PORT,
            credit_bytes: 256 * 1024,
            max_medium: 4 << 20,
            get_window: 4,
            join_timeout: Duration::from_secs(10),
            share: true,
        }
    }
}

/// What a message asks of the target once it arrived (and, for a long
/// message, landed): run handler `handler` with argument `arg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The handler.
    pub handler: HandlerId,
    /// Its argument.
    pub arg: u64,
}

impl Call {
    /// No handler.
    pub const NONE: Call = Call {
        handler: HANDLER_NONE,
        arg: 0,
    };

    /// The built-in counter: adds `n` to the target's counter.
    pub fn counter(n: u64) -> Call {
        Call {
            handler: HANDLER_COUNTER,
            arg: n,
        }
    }

    /// User handler `handler` with `arg`.
    pub fn handler(handler: HandlerId, arg: u64) -> Call {
        Call { handler, arg }
    }
}

/// Whether a message gets a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The target replies; the reply counts in [`Endpoint::replies`].
    Reply,
    /// No reply unless the target refuses it ([`Endpoint::quiet`]
    /// reports that).
    Async,
}

/// A reply as the waiting caller gets it.
struct Answer {
    refusal: Option<Refusal>,
    value: u64,
    data: Bytes,
}

/// The data connection to a member, as this endpoint sends on it.
enum DataConn {
    /// To a software rank: requests only (its replies come on its
    /// control connection to this endpoint).
    Soft(Connection),
    /// To a hardware rank: requests go out here and its answers —
    /// replies and credit — come back on the same connection, read by
    /// this endpoint's task for that rank ([`read_answers`]).
    Hard {
        sink: SplitSink<Connection, Message>,
        local: PortAddr,
        remote: PortAddr,
        seq: u32,
    },
    /// Closed by [`Endpoint::close`].
    Closed,
}

impl DataConn {
    async fn send_bytes(&mut self, payload: Bytes) -> Result<(), LinkError> {
        match self {
            DataConn::Closed => Err(LinkError::Closed),
            DataConn::Soft(c) => c.send_bytes(payload).await,
            DataConn::Hard {
                sink,
                local,
                remote,
                seq,
            } => {
                let mut m = Message::send(*local, *remote, payload)?;
                m.set_seqnum(*seq);
                *seq = seq.wrapping_add(1);
                sink.send(m).await
            }
        }
    }
}

/// One member as this endpoint sends to it.
struct Peer {
    /// Requests, class 0; held for a whole message so frames of two
    /// messages never interleave.
    data: AsyncMutex<DataConn>,
    /// Replies, credit, barrier messages, class 1; held per frame. A
    /// hardware rank has none; `None` inside once closed.
    control: Option<AsyncMutex<Option<Connection>>>,
    /// Bytes this endpoint may still send to it.
    credit: Semaphore,
    /// Sent to since the last quiet.
    dirty: AtomicBool,
    /// Sent a request other than a direct long's header since its credit
    /// was last seen whole: a direct write could overtake it. Read and
    /// set under `data`.
    mixed: AtomicBool,
}

/// The group as joined.
struct Net {
    rank: usize,
    group: Group,
    peers: Vec<Peer>,
}

impl Net {
    /// The rank that counts barrier arrivals: the lowest software rank
    /// (there is one: this endpoint).
    fn coordinator(&self) -> usize {
        self.group.software_ranks().next().unwrap_or(self.rank)
    }
}

/// Errors of replies to requests nobody waits for, for quiet and
/// wait_replies; bounded, the rest counted.
#[derive(Default)]
struct Errors {
    first: Vec<PgasError>,
    more: u64,
}

const MAX_KEPT_ERRORS: usize = 64;

struct Inner {
    session: Session,
    options: Options,
    target: Arc<SoftTarget>,
    counters: Arc<TargetCounters>,
    progress: Arc<Progress>,
    net: OnceLock<Net>,
    joined: watch::Sender<bool>,
    next_token: AtomicU32,
    next_segment: AtomicU16,
    /// Callers waiting for replies, by token: the rank asked, the waiter.
    pending: Mutex<FxHashMap<u32, (usize, oneshot::Sender<Answer>)>>,
    errors: Mutex<Errors>,
    /// This endpoint's barrier count; the highest epoch released.
    barrier_epoch: AtomicU64,
    released: AtomicU64,
    /// Rank 0: arrivals per epoch.
    arrivals: Mutex<FxHashMap<u64, usize>>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Other ranks' segments mapped here, by (rank, segment); a miss is
    /// asked again after [`DIRECT_RETRY`].
    direct: AsyncMutex<FxHashMap<(usize, SegmentId), Direct>>,
    /// Long messages and gets that went directly (see [`DirectStats`]).
    direct_puts: AtomicU64,
    direct_gets: AtomicU64,
    direct_bytes: AtomicU64,
}

/// What this endpoint moved itself through other ranks' shared segments
/// ([`Options::share`]), rather than by message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectStats {
    /// Long messages written into a shared segment.
    pub puts: u64,
    /// Gets read out of one.
    pub gets: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// A peer's segment as this endpoint reaches it.
#[derive(Clone)]
enum Direct {
    Mapped(Arc<SharedRegion>),
    /// Not shared with this endpoint (or no longer), as of then.
    Missing(tokio::time::Instant),
}

/// How long a segment found not shared is left to messages before it is
/// asked for again.
const DIRECT_RETRY: Duration = Duration::from_millis(200);

/// Most peer segments one endpoint keeps mapped or remembers missing.
const MAX_DIRECT: usize = 4096;

/// A PGAS endpoint: a session listening for its group, its segments and
/// handlers, and the operations on other members. See the crate
/// documentation. Dropping it stops its tasks; drop its session's
/// connections by dropping the endpoint after a final
/// [`Endpoint::barrier`]. Clones share the endpoint; its tasks stop when
/// the last clone goes.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
    _tasks: Arc<TaskGuard>,
}

/// Stops the endpoint's tasks (which hold `Inner`, never this).
struct TaskGuard(Arc<Inner>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        for t in self
            .0
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Endpoint {
    /// Makes `session` an endpoint: it listens on `options.port` at once
    /// so members may connect before it joins.
    pub async fn bind(session: Session, options: Options) -> Result<Endpoint, PgasError> {
        if options.credit_bytes < 4 * MAX_FRAME as u32 {
            return Err(PgasError::Invalid(format!(
                "credit_bytes must be at least {}",
                4 * MAX_FRAME
            )));
        }
        let listener = session.listen(options.port).await?;
        let progress = Arc::new(Progress::default());
        let inner = Arc::new(Inner {
            session,
            target: Arc::new(SoftTarget::new(progress.clone())),
            counters: Arc::default(),
            progress,
            net: OnceLock::new(),
            joined: watch::Sender::new(false),
            next_token: AtomicU32::new(1),
            next_segment: AtomicU16::new(0),
            pending: Mutex::default(),
            errors: Mutex::default(),
            barrier_epoch: AtomicU64::new(0),
            released: AtomicU64::new(0),
            arrivals: Mutex::default(),
            tasks: Mutex::default(),
            direct: AsyncMutex::default(),
            direct_puts: AtomicU64::new(0),
            direct_gets: AtomicU64::new(0),
            direct_bytes: AtomicU64::new(0),
            options,
        });
        let accept = tokio::spawn(accept_loop(inner.clone(), listener));
        inner.track(accept.abort_handle());
        Ok(Endpoint {
            _tasks: Arc::new(TaskGuard(inner.clone())),
            inner,
        })
    }

    /// The endpoint's UID (its session's), for the group's member list.
    pub fn uid(&self) -> Uid {
        self.inner.session.uid()
    }

    /// The group of `size` endpoints named `{job}-0` … `{job}-{size-1}`
    /// in the cluster's directory (`[registry] kind = "etcd"`): claims
    /// `{job}-{rank}` for this endpoint (it listens already), then
    /// resolves the others' names until all are found or
    /// [`Options::join_timeout`] passes. Endpoints on any servers build
    /// the same group this way, with no launcher collecting UIDs.
    pub async fn group_by_name(
        &self,
        job: &str,
        rank: usize,
        size: usize,
    ) -> Result<Group, PgasError> {
        if rank >= size {
            return Err(PgasError::NoRank(rank));
        }
        let name = |r: usize| format!("{job}-{r}");
        self.inner.session.register(&name(rank)).await?;
        let deadline = tokio::time::Instant::now() + self.inner.options.join_timeout;
        let names: Vec<String> = (0..size).map(name).collect();
        let found = self
            .inner
            .session
            .client()
            .resolve_all(&names, deadline)
            .await?;
        if found.iter().any(Option::is_none) {
            return Err(PgasError::Timeout("finding the group's endpoints by name"));
        }
        Ok(Group::new(found.into_iter().flatten().collect()))
    }

    /// Connects to every member of `group` (this endpoint among them),
    /// waiting for members that are not listening yet up to
    /// [`Options::join_timeout`]. Software members join concurrently; a
    /// hardware member ([`Group::with_hardware`]) does not join: this
    /// endpoint dials it one data connection, on which its answers come
    /// back.
    pub async fn join(&self, group: Group) -> Result<(), PgasError> {
        let rank = group.rank_of(self.uid()).ok_or(PgasError::NotMember)?;
        if group.is_hardware(rank) {
            return Err(PgasError::Invalid(
                "a hardware rank is a kernel device, not an endpoint that joins".into(),
            ));
        }
        let deadline = tokio::time::Instant::now() + self.inner.options.join_timeout;
        if self.inner.options.share {
            self.inner.share_segments().await;
        }
        if group.len() > wire::MAX_MEMBERS && group.software_ranks().count() < group.len() {
            return Err(PgasError::Invalid(format!(
                "a group with hardware ranks has at most {} members",
                wire::MAX_MEMBERS
            )));
        }
        let dial = |member: Uid, class: u8, hardware: Option<usize>| {
            let inner = self.inner.clone();
            let group = &group;
            async move {
                inner
                    .dial(
                        member,
                        class,
                        rank,
                        deadline,
                        hardware.map(|to| (to, group)),
                    )
                    .await
            }
        };
        let mut peers = Vec::with_capacity(group.len());
        let mut answers = Vec::new();
        for r in 0..group.len() {
            let member = group.uid(r).ok_or(PgasError::NoRank(r))?;
            let (data, control) = if group.is_hardware(r) {
                let conn = dial(member, DATA_CLASS, Some(r)).await?;
                let (local, remote) = (conn.local(), conn.remote());
                let (sink, stream) = conn.split();
                answers.push((r, stream));
                let data = DataConn::Hard {
                    sink,
                    local,
                    remote,
                    seq: 0,
                };
                (data, None)
            } else {
                let data = dial(member, DATA_CLASS, None).await;
                let control = dial(member, CONTROL_CLASS, None).await;
                (DataConn::Soft(data?), Some(AsyncMutex::new(Some(control?))))
            };
            peers.push(Peer {
                data: AsyncMutex::new(data),
                control,
                credit: Semaphore::new(self.inner.options.credit_bytes as usize),
                dirty: AtomicBool::new(false),
                mixed: AtomicBool::new(false),
            });
        }
        self.inner
            .net
            .set(Net { rank, group, peers })
            .map_err(|_| PgasError::Invalid("already joined".into()))?;
        for (r, stream) in answers {
            let task = tokio::spawn(read_answers(self.inner.clone(), r, stream));
            self.inner.track(task.abort_handle());
        }
        self.inner.joined.send_replace(true);
        Ok(())
    }

    /// This endpoint's rank (once joined).
    pub fn rank(&self) -> Option<usize> {
        self.inner.net.get().map(|n| n.rank)
    }

    /// Members of the joined group (0 before joining).
    pub fn size(&self) -> usize {
        self.inner.net.get().map_or(0, |n| n.group.len())
    }

    /// The joined group (`None` before joining).
    pub fn group(&self) -> Option<&Group> {
        self.inner.net.get().map(|n| &n.group)
    }

    /// Registers a zeroed segment of `len` bytes that members reach as
    /// [`Acl`] allows. IDs count from 0 in registration order, so members
    /// registering alike get alike IDs.
    pub fn register_segment(&self, len: usize, acl: Acl) -> Segment {
        let id = self.inner.next_segment.fetch_add(1, Ordering::Relaxed);
        let memory = Arc::new(SegmentMemory::new(len, acl));
        self.inner
            .target
            .segments
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, memory.clone());
        Segment { id, memory }
    }

    /// Segment `id` of this endpoint.
    pub fn segment(&self, id: SegmentId) -> Option<Segment> {
        let memory = self
            .inner
            .target
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()?;
        Some(Segment { id, memory })
    }

    /// Bytes of requests this endpoint may still send to `dst` before it
    /// waits for `dst` to process earlier ones (flow control).
    pub fn credit(&self, dst: usize) -> Option<usize> {
        Some(
            self.inner
                .net
                .get()?
                .peers
                .get(dst)?
                .credit
                .available_permits(),
        )
    }

    /// Registers user handler `id` (at least [`FIRST_USER_HANDLER`]),
    /// replacing any before.
    pub fn register_handler(
        &self,
        id: HandlerId,
        handler: impl Fn(crate::AmCall<'_>) -> Bytes + Send + Sync + 'static,
    ) -> Result<(), PgasError> {
        if id < FIRST_USER_HANDLER {
            return Err(PgasError::Invalid(format!(
                "handler IDs below {FIRST_USER_HANDLER} are built in"
            )));
        }
        let handler: Handler = Arc::new(handler);
        self.inner
            .target
            .handlers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handler);
        Ok(())
    }

    /// A short active message: `call` at `dst`, no payload.
    pub async fn short(
        &self,
        dst: usize,
        call: Call,
        completion: Completion,
    ) -> Result<(), PgasError> {
        let head = request(Kind::Short, call, completion);
        self.inner.send(dst, head, &[], &[], false).await.map(drop)
    }

    /// A medium active message: `payload` (any size up to the target's
    /// [`Options::max_medium`]) to `call` at `dst`.
    pub async fn medium(
        &self,
        dst: usize,
        call: Call,
        payload: &[u8],
        completion: Completion,
    ) -> Result<(), PgasError> {
        let mut head = request(Kind::Medium, call, completion);
        head.len = len32(payload.len())?;
        self.inner
            .send(dst, head, &[], payload, false)
            .await
            .map(drop)
    }

    /// A long active message: `payload` written at `offset` of segment
    /// `segment` of `dst`, then `call` runs there.
    pub async fn long(
        &self,
        dst: usize,
        segment: SegmentId,
        offset: u64,
        payload: &[u8],
        call: Call,
        completion: Completion,
    ) -> Result<(), PgasError> {
        self.long_shaped(
            dst,
            segment,
            Shape::Contiguous { offset },
            payload,
            call,
            completion,
        )
        .await
    }

    /// A long active message whose payload lands in `shape` (contiguous,
    /// strided or vectored) of segment `segment` of `dst`.
    pub async fn long_shaped(
        &self,
        dst: usize,
        segment: SegmentId,
        shape: Shape,
        payload: &[u8],
        call: Call,
        completion: Completion,
    ) -> Result<(), PgasError> {
        let (head, desc) = long_head(segment, &shape, payload.len() as u64, call, completion)?;
        // Direct only with a handler every target has: one it may lack
        // must refuse the message before a byte lands.
        let builtin = call.handler == HANDLER_NONE || call.handler == HANDLER_COUNTER;
        if let (Shape::Contiguous { offset }, true) = (&shape, builtin) {
            let offset = *offset;
            if let Some(region) = self.inner.direct(dst, segment).await {
                if self
                    .inner
                    .send_landed(dst, &region, head, &desc, offset, payload)
                    .await?
                {
                    return Ok(());
                }
            }
        }
        self.inner
            .send(dst, head, &desc, payload, false)
            .await
            .map(drop)
    }

    /// A medium active message whose `len` bytes of payload come from
    /// `stream` as it yields them (Shoal's payload from a kernel's stream
    /// rather than its memory): frames leave as they fill, nothing is
    /// gathered here. The frames of one message go out together, so other
    /// requests to `dst` wait while the stream is read.
    ///
    /// A stream that ends before `len` bytes is an error, and the message
    /// is cut: the target drops it — no handler runs — when the next
    /// frame from this endpoint comes (any request, or the flush of a
    /// [`Endpoint::quiet`]), and refuses it `Malformed`. Bytes a stream
    /// yields beyond `len` are not sent, and are an error too (polled no
    /// further than the chunk that holds the `len`th byte).
    pub async fn medium_from_stream<S>(
        &self,
        dst: usize,
        call: Call,
        len: u64,
        stream: S,
        completion: Completion,
    ) -> Result<(), PgasError>
    where
        S: futures_util::Stream<Item = Bytes> + Send,
    {
        let mut head = request(Kind::Medium, call, completion);
        head.len = len32(usize::try_from(len).unwrap_or(usize::MAX))?;
        let stream = std::pin::pin!(stream);
        let source = Source::stream(stream, len);
        self.inner.send_from(dst, head, &[], source).await
    }

    /// A long active message whose `len` bytes come from `stream` and land
    /// in `shape` of segment `segment` of `dst`, then `call` runs there;
    /// as [`Endpoint::medium_from_stream`]. Of a cut message, the bytes
    /// that landed before the cut stay in the segment; its handler and
    /// counter do not run.
    #[allow(clippy::too_many_arguments)]
    pub async fn long_from_stream<S>(
        &self,
        dst: usize,
        segment: SegmentId,
        shape: Shape,
        len: u64,
        stream: S,
        call: Call,
        completion: Completion,
    ) -> Result<(), PgasError>
    where
        S: futures_util::Stream<Item = Bytes> + Send,
    {
        let (head, desc) = long_head(segment, &shape, len, call, completion)?;
        let stream = std::pin::pin!(stream);
        let source = Source::stream(stream, len);
        self.inner.send_from(dst, head, &desc, source).await
    }

    /// A get-medium: `payload` to `call` at `dst`; its handler's answer
    /// (at most [`MAX_GET`] bytes) comes back. `payload` must fit one
    /// frame too.
    pub async fn get_medium(
        &self,
        dst: usize,
        call: Call,
        payload: &[u8],
    ) -> Result<Bytes, PgasError> {
        if payload.len() > MAX_GET {
            return Err(PgasError::Invalid(
                "get-medium payload larger than a frame".into(),
            ));
        }
        let mut head = request(Kind::GetMedium, call, Completion::Reply);
        head.len = payload.len() as u32;
        let answer = self.inner.call(dst, head, &[], payload).await?;
        Ok(answer.data)
    }

    /// A get-long into `out`: `out.len()` bytes at `offset` of segment
    /// `segment` of `dst`, as OpenSHMEM's `getmem` fills the caller's
    /// buffer — from a rank of this server's shared segment, one copy
    /// and no allocation.
    pub async fn get_into(
        &self,
        dst: usize,
        segment: SegmentId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), PgasError> {
        if let Some(region) = self.inner.direct(dst, segment).await {
            if self.inner.get_direct(dst, &region, offset, out).await? {
                return Ok(());
            }
        }
        let data = self.get(dst, segment, offset, out.len()).await?;
        out.copy_from_slice(&data);
        Ok(())
    }

    /// A get-long: `len` bytes at `offset` of segment `segment` of `dst`,
    /// fetched in frames, [`Options::get_window`] of them in flight.
    pub async fn get(
        &self,
        dst: usize,
        segment: SegmentId,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, PgasError> {
        if let Some(region) = self.inner.direct(dst, segment).await {
            let mut out = BytesMut::zeroed(len);
            if self
                .inner
                .get_direct(dst, &region, offset, &mut out)
                .await?
            {
                return Ok(out.freeze());
            }
        }
        let chunks = len.div_ceil(MAX_GET);
        let parts = futures_util::stream::iter((0..chunks).map(|i| {
            let at = offset.saturating_add((i * MAX_GET) as u64);
            let n = MAX_GET.min(len - i * MAX_GET);
            let mut head = request(Kind::GetLong, Call::NONE, Completion::Reply);
            head.segment = segment;
            head.len = n as u32;
            let desc = at.to_be_bytes();
            let inner = self.inner.clone();
            async move { inner.call(dst, head, &desc, &[]).await }
        }))
        .buffered(self.inner.options.get_window.max(1))
        .collect::<Vec<_>>()
        .await;
        let mut out = BytesMut::with_capacity(len);
        for p in parts {
            out.extend_from_slice(&p?.data);
        }
        Ok(out.freeze())
    }

    /// An atomic on the `width` word at `offset` of segment `segment` of
    /// `dst`, run at the target; the word's value before it.
    pub async fn atomic(
        &self,
        dst: usize,
        segment: SegmentId,
        offset: u64,
        width: Width,
        op: AtomicOp,
    ) -> Result<u64, PgasError> {
        let mut head = request(Kind::Atomic, Call::NONE, Completion::Reply);
        head.segment = segment;
        head.op = op.code();
        head.count = width.bytes() as u32;
        let (operand, compare) = op.operands();
        head.arg = operand;
        let mut desc = [0u8; 24];
        desc[..8].copy_from_slice(&offset.to_be_bytes());
        desc[8..16].copy_from_slice(&compare.to_be_bytes());
        Ok(self.inner.call(dst, head, &desc, &[]).await?.value)
    }

    /// Replies received so far to messages not sent async.
    pub fn replies(&self) -> u64 {
        self.inner.progress.replies.load(Ordering::Acquire)
    }

    /// Waits until at least `n` replies came ([`Endpoint::replies`]);
    /// then reports the first refusal among them, if any.
    pub async fn wait_replies(&self, n: u64) -> Result<(), PgasError> {
        let p = &self.inner.progress;
        wait_for(p, || p.replies.load(Ordering::Acquire) >= n).await;
        self.inner.take_error()
    }

    /// Bytes long messages landed in this endpoint's segments so far.
    pub fn mem(&self) -> u64 {
        self.inner.progress.mem.load(Ordering::Acquire)
    }

    /// Waits until long messages landed at least `n` bytes in this
    /// endpoint's segments (counting from its start).
    pub async fn wait_mem(&self, n: u64) {
        let p = &self.inner.progress;
        wait_for(p, || p.mem.load(Ordering::Acquire) >= n).await;
    }

    /// The built-in counter ([`Call::counter`]) of this endpoint.
    pub fn counter(&self) -> u64 {
        self.inner.progress.counter.load(Ordering::Acquire)
    }

    /// Waits until the built-in counter reaches `n`.
    pub async fn wait_counter(&self, n: u64) {
        let p = &self.inner.progress;
        wait_for(p, || p.counter.load(Ordering::Acquire) >= n).await;
    }

    /// What rank `source` added to the built-in counter.
    pub fn counter_from(&self, source: usize) -> u64 {
        let p = &self.inner.progress;
        let from = p.counter_from.lock().unwrap_or_else(|e| e.into_inner());
        from.get(&source).copied().unwrap_or(0)
    }

    /// Waits until rank `source` added at least `n` to the built-in
    /// counter: a signal from one sender, whatever the others send.
    pub async fn wait_counter_from(&self, source: usize, n: u64) {
        wait_for(&self.inner.progress, || self.counter_from(source) >= n).await;
    }

    /// OpenSHMEM's fence: messages to one target sent before it are
    /// processed there before those sent after. Each target's requests
    /// travel on one ordered connection and are processed in order, so
    /// this holds already and fence returns at once.
    pub async fn fence(&self) {}

    /// OpenSHMEM's quiet: waits until every message sent before it
    /// (async ones included) was processed at its target, then reports
    /// the first refusal among them, if any.
    pub async fn quiet(&self) -> Result<(), PgasError> {
        let net = self.inner.net()?;
        let flushes = net
            .peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.dirty.swap(false, Ordering::AcqRel))
            .map(|(r, _)| {
                let head = request(Kind::Flush, Call::NONE, Completion::Reply);
                self.inner.call(r, head, &[], &[])
            });
        for r in join_all(flushes).await {
            r?;
        }
        self.inner.take_error()
    }

    /// Completes everything this endpoint sent ([`Endpoint::quiet`]) and
    /// closes its connections to the group, each once its far end has
    /// taken everything sent on it (the client library's close in band,
    /// bounded by its timeout). Call it before the process ends: a
    /// process that exits with messages still queued in its session
    /// loses them — the last barrier's release, sent by the lowest
    /// software rank just before it exits, among them, leaving the other
    /// ranks waiting for ever. The endpoint leaves the group: it sends
    /// nothing after and answers nothing (its replies went on the
    /// connections it closed), and the others' calls to it fail
    /// [`PgasError::Closed`]. The result is quiet's.
    pub async fn close(&self) -> Result<(), PgasError> {
        let quiet = self.quiet().await;
        let net = self.inner.net()?;
        let session = &self.inner.session;
        // Its shared segments are withdrawn first: no rank reaches them
        // directly once it has left.
        let shared: Vec<SegmentId> = self
            .inner
            .target
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, m)| m.is_shared())
            .map(|(id, _)| *id)
            .collect();
        for id in shared {
            if let Err(e) = session.unshare(id).await {
                tracing::warn!(segment = id, "shared segment not withdrawn: {e}");
            }
        }
        let closes = net.peers.iter().map(|peer| async move {
            // A hardware rank's connection has nothing in flight after
            // quiet (its replies came back on it): it is dropped.
            let data = match std::mem::replace(&mut *peer.data.lock().await, DataConn::Closed) {
                DataConn::Soft(c) => Some(c),
                _ => None,
            };
            let control = match &peer.control {
                Some(c) => c.lock().await.take(),
                None => None,
            };
            for conn in data.into_iter().chain(control) {
                let _ = session.close(conn).await;
            }
        });
        join_all(closes).await;
        quiet
    }

    /// A barrier across the group's software ranks: quiet — which
    /// completes every request outstanding, to hardware ranks too — then
    /// wait until every software member reached the same barrier.
    /// Hardware ranks never call it: they hold memory, they do not run
    /// a program.
    pub async fn barrier(&self) -> Result<(), PgasError> {
        self.quiet().await?;
        let net = self.inner.net()?;
        let epoch = self.inner.barrier_epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let coordinator = net.coordinator();
        if net.rank == coordinator {
            self.inner.arrive(epoch).await?;
        } else {
            let head = Head {
                arg: epoch,
                ..Head::new(Kind::BarrierEnter)
            };
            self.inner.control(coordinator, head).await?;
        }
        let p = &self.inner.progress;
        let released = &self.inner.released;
        wait_for(p, || released.load(Ordering::Acquire) >= epoch).await;
        Ok(())
    }

    /// What this endpoint moved through other ranks' shared segments.
    pub fn direct_stats(&self) -> DirectStats {
        let i = &self.inner;
        DirectStats {
            puts: i.direct_puts.load(Ordering::Relaxed),
            gets: i.direct_gets.load(Ordering::Relaxed),
            bytes: i.direct_bytes.load(Ordering::Relaxed),
        }
    }

    /// What this endpoint's target side counted.
    pub fn stats(&self) -> TargetStats {
        self.inner.counters.snapshot()
    }

    /// The session underneath.
    pub fn session(&self) -> &Session {
        &self.inner.session
    }
}

/// Waits until `ready` holds, woken by the endpoint's progress.
async fn wait_for(p: &Progress, ready: impl Fn() -> bool) {
    loop {
        let notified = p.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if ready() {
            return;
        }
        notified.await;
    }
}

fn request(kind: Kind, call: Call, completion: Completion) -> Head {
    Head {
        handler: call.handler,
        arg: call.arg,
        flags: if completion == Completion::Async {
            FLAG_ASYNC
        } else {
            0
        },
        ..Head::new(kind)
    }
}

/// The first frame's head and shape descriptor of a long message of
/// `len` bytes.
fn long_head(
    segment: SegmentId,
    shape: &Shape,
    len: u64,
    call: Call,
    completion: Completion,
) -> Result<(Head, BytesMut), PgasError> {
    let kind = match shape {
        Shape::Contiguous { .. } => Kind::Long,
        Shape::Strided { .. } => Kind::Strided,
        Shape::Vectored(_) => Kind::Vectored,
    };
    shape
        .validate(len)
        .map_err(|e| PgasError::Invalid(e.to_string()))?;
    let mut head = request(kind, call, completion);
    head.segment = segment;
    head.len = len32(usize::try_from(len).unwrap_or(usize::MAX))?;
    let mut desc = BytesMut::with_capacity(shape.descriptor_len());
    head.count = shape.put(&mut desc);
    if HEADER_LEN + desc.len() > MAX_FRAME {
        return Err(PgasError::Invalid("descriptor larger than a frame".into()));
    }
    Ok((head, desc))
}

/// Where a request's payload comes from: memory, or a stream read as
/// frames fill.
enum Source<'a> {
    Slice(&'a [u8]),
    Stream {
        stream: std::pin::Pin<&'a mut (dyn futures_util::Stream<Item = Bytes> + Send)>,
        /// Bytes still to send.
        left: u64,
        /// Declared in all.
        len: u64,
        /// What the last chunk had beyond the frame it filled.
        carry: Bytes,
    },
}

impl<'a> Source<'a> {
    fn stream(
        stream: std::pin::Pin<&'a mut (dyn futures_util::Stream<Item = Bytes> + Send)>,
        len: u64,
    ) -> Source<'a> {
        Source::Stream {
            stream,
            left: len,
            len,
            carry: Bytes::new(),
        }
    }

    /// Bytes still to send.
    fn left(&self) -> u64 {
        match self {
            Source::Slice(p) => p.len() as u64,
            Source::Stream { left, .. } => *left,
        }
    }

    /// Appends up to `room` more payload bytes to `frame`.
    async fn fill(&mut self, frame: &mut BytesMut, room: usize) -> Result<(), PgasError> {
        match self {
            Source::Slice(p) => {
                let take = p.len().min(room);
                frame.extend_from_slice(&p[..take]);
                *p = &p[take..];
                Ok(())
            }
            Source::Stream {
                stream,
                left,
                len,
                carry,
            } => {
                let mut room = room;
                while room > 0 && *left > 0 {
                    if carry.is_empty() {
                        match stream.next().await {
                            Some(chunk) => *carry = chunk,
                            None => {
                                return Err(PgasError::Invalid(format!(
                                "the payload stream ended after {} of the {len} bytes declared: \
                                     the message was cut",
                                *len - *left
                            )))
                            }
                        }
                    }
                    let take = (carry.len() as u64).min(*left).min(room as u64) as usize;
                    frame.extend_from_slice(&carry.split_to(take));
                    room -= take;
                    *left -= take as u64;
                }
                Ok(())
            }
        }
    }

    /// After the last byte: an error when the stream yielded more.
    fn check_end(&self) -> Result<(), PgasError> {
        match self {
            Source::Stream { carry, len, .. } if !carry.is_empty() => Err(PgasError::Invalid(
                format!("the payload stream yielded more than the {len} bytes declared: the first {len} were sent"),
            )),
            _ => Ok(()),
        }
    }
}

fn len32(n: usize) -> Result<u32, PgasError> {
    u32::try_from(n).map_err(|_| PgasError::Invalid("payload over 4 GiB".into()))
}

impl Inner {
    fn track(&self, task: AbortHandle) {
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    fn net(&self) -> Result<&Net, PgasError> {
        self.net.get().ok_or(PgasError::NotJoined)
    }

    fn take_error(&self) -> Result<(), PgasError> {
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        e.more = 0;
        let first = std::mem::take(&mut e.first).into_iter().next();
        first.map_or(Ok(()), Err)
    }

    /// Connects to `member` in `class` and names this endpoint, retrying
    /// while the member is not listening yet.
    /// Connects to `member` for `class` and says hello as `rank`. To a
    /// hardware rank (`to`, of `group`) the hello also names the group's
    /// members, which the kernel checks the connection's caller against.
    async fn dial(
        &self,
        member: Uid,
        class: u8,
        rank: usize,
        deadline: tokio::time::Instant,
        hardware: Option<(usize, &Group)>,
    ) -> Result<Connection, PgasError> {
        let ep = member.port(self.options.port);
        let mut conn = loop {
            match self.session.connect_class(ep, class).await {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(%member, "connect: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        // The connector says who it is and which class the connection
        // serves (`Hello`, once), the acceptor answers `Ready`, once, and
        // nothing else is sent before the `Ready`. Neither is lost: the
        // client library keeps data that comes before the accept notice,
        // and the connector's daemon admits the connection before the
        // acceptor's hears of it, across servers too.
        // `arg`: this endpoint's credit window, which a hardware target
        // needs to know when to give credit back.
        let mut hello = BytesMut::with_capacity(HEADER_LEN);
        Head {
            len: rank as u32,
            op: class,
            arg: u64::from(self.options.credit_bytes),
            ..Head::new(Kind::Hello)
        }
        .put(&mut hello);
        if let Some((_, group)) = hardware {
            let members = (0..group.len()).filter_map(|r| group.uid(r));
            wire::put_members(members.map(|u| (u.server(), u.device())), &mut hello);
        }
        conn.send_bytes(hello.freeze())
            .await
            .map_err(|_| PgasError::Closed(rank))?;
        match tokio::time::timeout_at(deadline, conn.recv()).await {
            Ok(Some(Ok(m))) if is_kind(m.payload(), Kind::Ready) => {
                let status = Head::parse(m.payload()).map_or(0, |(h, _)| h.status);
                match (Refusal::from_code(status), hardware) {
                    (None, _) => Ok(conn),
                    (Some(refusal), Some((to, _))) => Err(PgasError::Refused { rank: to, refusal }),
                    (Some(_), None) => Err(PgasError::Invalid(format!(
                        "{member} did not answer as a PGAS endpoint"
                    ))),
                }
            }
            Ok(Some(Ok(_))) => Err(PgasError::Invalid(format!(
                "{member} did not answer as a PGAS endpoint"
            ))),
            Ok(Some(Err(_)) | None) => Err(PgasError::Closed(rank)),
            Err(_) => Err(PgasError::Timeout("waiting for a member to accept")),
        }
    }

    /// Sends a request to `dst`: its first frame carries `head` and
    /// `desc`, the payload follows in as many frames as it needs. With
    /// `wait`, the reply is awaited and returned.
    async fn send(
        &self,
        dst: usize,
        mut head: Head,
        desc: &[u8],
        payload: &[u8],
        wait: bool,
    ) -> Result<Option<oneshot::Receiver<Answer>>, PgasError> {
        let net = self.net()?;
        let peer = net.peers.get(dst).ok_or(PgasError::NoRank(dst))?;
        head.token = self.next_token.fetch_add(1, Ordering::Relaxed).max(1);
        let rx = wait.then(|| {
            let (tx, rx) = oneshot::channel();
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(head.token, (dst, tx));
            rx
        });
        let result = self
            .send_frames(dst, peer, head, desc, Source::Slice(payload))
            .await;
        if result.is_err() && wait {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&head.token);
        }
        result.map(|()| rx)
    }

    /// Sends a request whose payload comes from `source`, not waiting for
    /// its reply.
    async fn send_from(
        &self,
        dst: usize,
        mut head: Head,
        desc: &[u8],
        source: Source<'_>,
    ) -> Result<(), PgasError> {
        let net = self.net()?;
        let peer = net.peers.get(dst).ok_or(PgasError::NoRank(dst))?;
        head.token = self.next_token.fetch_add(1, Ordering::Relaxed).max(1);
        self.send_frames(dst, peer, head, desc, source).await
    }

    async fn send_frames(
        &self,
        dst: usize,
        peer: &Peer,
        head: Head,
        desc: &[u8],
        payload: Source<'_>,
    ) -> Result<(), PgasError> {
        let mut conn = peer.data.lock().await;
        self.send_locked(dst, peer, &mut conn, head, desc, payload)
            .await
    }

    /// [`Inner::send_frames`] with the data connection held.
    async fn send_locked(
        &self,
        dst: usize,
        peer: &Peer,
        conn: &mut DataConn,
        head: Head,
        desc: &[u8],
        mut payload: Source<'_>,
    ) -> Result<(), PgasError> {
        // A quiet's own flush leaves nothing for the next quiet to wait
        // for, and neither does a direct long with no handler and no
        // reply: its bytes are in place already, and the target cannot
        // refuse it (the mapping is the segment, writable; the handler is
        // none) — the frame only counts them in the target's `wait_mem`.
        let landed_quietly = head.flags & FLAG_LANDED != 0
            && head.flags & FLAG_ASYNC != 0
            && head.handler == HANDLER_NONE;
        if head.kind() != Some(Kind::Flush) && !landed_quietly {
            peer.dirty.store(true, Ordering::Release);
        }
        if head.flags & FLAG_LANDED == 0 && head.kind() != Some(Kind::Flush) {
            peer.mixed.store(true, Ordering::Relaxed);
        }
        let mut first = true;
        loop {
            let wanted = (HEADER_LEN + desc.len()) as u64 + payload.left();
            let mut frame = BytesMut::with_capacity(MAX_FRAME.min(wanted as usize));
            if first {
                head.put(&mut frame);
                frame.extend_from_slice(desc);
            } else {
                Head {
                    token: head.token,
                    ..Head::new(Kind::Cont)
                }
                .put(&mut frame);
            }
            let room = MAX_FRAME - frame.len();
            let filled = payload.fill(&mut frame, room).await;
            if filled.is_err() && !first && frame.len() == HEADER_LEN {
                // Nothing more came: no empty frame.
                return filled;
            }
            // Flow control: wait for the target to have room.
            peer.credit
                .acquire_many(charge(frame.len()) as u32)
                .await
                .map_err(|_| PgasError::Closed(dst))?
                .forget();
            conn.send_bytes(frame.freeze())
                .await
                .map_err(|_| PgasError::Closed(dst))?;
            // A stream that ended short: what it gave has gone, and the
            // target drops the message at the next frame (doc above).
            filled?;
            first = false;
            if payload.left() == 0 {
                return payload.check_end();
            }
        }
    }

    /// Puts every segment registered so far whose ACL lets every rank in
    /// in shared memory (see [`Options::share`]); one the daemon does not
    /// share (its limits, its rules) stays private, as it was.
    async fn share_segments(&self) {
        let segments: Vec<(SegmentId, Arc<SegmentMemory>)> = self
            .target
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, m)| (*id, m.clone()))
            .collect();
        for (id, memory) in segments {
            let peers_write = match memory.acl {
                Acl::ReadWrite => true,
                Acl::ReadOnly => false,
                Acl::Ranks(_) => continue,
            };
            if memory.len() == 0 || memory.is_shared() {
                continue;
            }
            match self.session.share(id, memory.len(), peers_write).await {
                Ok(region) => {
                    memory.adopt(region);
                }
                Err(e) => tracing::debug!(segment = id, "segment not shared: {e}"),
            }
        }
    }

    /// Segment `segment` of rank `dst` mapped here, when `dst` is another
    /// software rank of this server that shares it.
    async fn direct(&self, dst: usize, segment: SegmentId) -> Option<Arc<SharedRegion>> {
        let net = self.net.get()?;
        if !self.options.share || dst == net.rank || net.group.is_hardware(dst) {
            return None;
        }
        let uid = net.group.uid(dst)?;
        if uid.server() != self.session.uid().server() {
            return None;
        }
        let mut cache = self.direct.lock().await;
        let now = tokio::time::Instant::now();
        match cache.get(&(dst, segment)) {
            Some(Direct::Mapped(r)) if !r.is_withdrawn() => return Some(r.clone()),
            Some(Direct::Missing(at)) if now < *at + DIRECT_RETRY => return None,
            _ => {}
        }
        let entry = match self.session.map_shared(uid, segment).await {
            Ok(r) => Direct::Mapped(Arc::new(r)),
            Err(_) => Direct::Missing(now),
        };
        if cache.len() >= MAX_DIRECT && !cache.contains_key(&(dst, segment)) {
            return None;
        }
        cache.insert((dst, segment), entry.clone());
        match entry {
            Direct::Mapped(r) => Some(r),
            Direct::Missing(_) => None,
        }
    }

    /// Whether `dst`'s earlier requests are all done or were direct longs
    /// (whose bytes are in place): a direct access now cannot overtake a
    /// write still travelling. Call with `dst`'s data connection held.
    fn settled(&self, peer: &Peer) -> bool {
        if peer.credit.available_permits() >= self.options.credit_bytes as usize {
            peer.mixed.store(false, Ordering::Relaxed);
        }
        !peer.mixed.load(Ordering::Relaxed)
    }

    /// A contiguous long message to a rank of this server written into its
    /// shared segment here, then its header alone for the handler, the
    /// counters and the reply; false (nothing sent) when it must go as
    /// frames: out of the mapping's bounds or read-only (the target then
    /// refuses and counts it), withdrawn, or behind a request in flight.
    async fn send_landed(
        &self,
        dst: usize,
        region: &SharedRegion,
        mut head: Head,
        desc: &[u8],
        offset: u64,
        payload: &[u8],
    ) -> Result<bool, PgasError> {
        let net = self.net()?;
        let peer = net.peers.get(dst).ok_or(PgasError::NoRank(dst))?;
        let Ok(start) = usize::try_from(offset) else {
            return Ok(false);
        };
        let mut conn = peer.data.lock().await;
        if matches!(*conn, DataConn::Closed) {
            return Err(PgasError::Closed(dst));
        }
        if !self.settled(peer) {
            return Ok(false);
        }
        match region.write(start, payload) {
            SharedAccess::Done => {}
            SharedAccess::OutOfRange => return Ok(false),
            SharedAccess::Revoked => {
                // May or may not have landed: the frames carry it again.
                return Ok(false);
            }
        }
        head.flags |= FLAG_LANDED;
        head.token = self.next_token.fetch_add(1, Ordering::Relaxed).max(1);
        self.send_locked(dst, peer, &mut conn, head, desc, Source::Slice(&[]))
            .await?;
        self.direct_puts.fetch_add(1, Ordering::Relaxed);
        self.direct_bytes
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// A get from a rank of this server's shared segment, copied into
    /// `out`; false when it must go as messages (as for
    /// [`Inner::send_landed`]).
    async fn get_direct(
        &self,
        dst: usize,
        region: &SharedRegion,
        offset: u64,
        out: &mut [u8],
    ) -> Result<bool, PgasError> {
        let len = out.len();
        let net = self.net()?;
        let peer = net.peers.get(dst).ok_or(PgasError::NoRank(dst))?;
        let Ok(start) = usize::try_from(offset) else {
            return Ok(false);
        };
        if start.checked_add(len).is_none_or(|end| end > region.len()) {
            return Ok(false);
        }
        let conn = peer.data.lock().await;
        if matches!(*conn, DataConn::Closed) {
            return Err(PgasError::Closed(dst));
        }
        if !self.settled(peer) {
            return Ok(false);
        }
        Ok(match region.read(start, out) {
            SharedAccess::Done => {
                self.direct_gets.fetch_add(1, Ordering::Relaxed);
                self.direct_bytes.fetch_add(len as u64, Ordering::Relaxed);
                true
            }
            SharedAccess::OutOfRange | SharedAccess::Revoked => false,
        })
    }

    /// Sends a request and waits for its reply; a refusal is an error.
    async fn call(
        &self,
        dst: usize,
        head: Head,
        desc: &[u8],
        payload: &[u8],
    ) -> Result<Answer, PgasError> {
        let rx = self
            .send(dst, head, desc, payload, true)
            .await?
            .ok_or(PgasError::Closed(dst))?;
        let answer = rx.await.map_err(|_| PgasError::Closed(dst))?;
        match answer.refusal {
            Some(refusal) => Err(PgasError::Refused { rank: dst, refusal }),
            None => Ok(answer),
        }
    }

    /// Sends one control frame to `dst`.
    async fn control(&self, dst: usize, head: Head) -> Result<(), PgasError> {
        let net = self.net()?;
        let peer = net.peers.get(dst).ok_or(PgasError::NoRank(dst))?;
        let mut frame = BytesMut::with_capacity(HEADER_LEN);
        head.put(&mut frame);
        self.control_frame(dst, peer, frame.freeze()).await
    }

    async fn control_frame(&self, dst: usize, peer: &Peer, frame: Bytes) -> Result<(), PgasError> {
        let Some(control) = peer.control.as_ref() else {
            return Err(PgasError::Invalid(format!(
                "rank {dst} is a hardware endpoint: it takes no control frames"
            )));
        };
        let mut control = control.lock().await;
        let Some(conn) = control.as_mut() else {
            return Err(PgasError::Closed(dst));
        };
        conn.send_bytes(frame)
            .await
            .map_err(|_| PgasError::Closed(dst))
    }

    /// Rank 0: a member reached barrier `epoch`; the last releases all.
    async fn arrive(&self, epoch: u64) -> Result<(), PgasError> {
        let net = self.net()?;
        let all = {
            let mut a = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
            let n = a.entry(epoch).or_insert(0);
            *n += 1;
            let all = *n == net.group.software_ranks().count();
            if all {
                a.remove(&epoch);
            }
            all
        };
        if all {
            let coordinator = net.coordinator();
            for r in net.group.software_ranks().filter(|&r| r != coordinator) {
                let head = Head {
                    arg: epoch,
                    ..Head::new(Kind::BarrierRelease)
                };
                self.control(r, head).await?;
            }
            self.release(epoch);
        }
        Ok(())
    }

    /// A rank's replies can come no more (a hardware rank's connection,
    /// or a software rank's control connection, ended): its waiting
    /// callers and senders fail ([`PgasError::Closed`]) instead of
    /// waiting forever.
    fn fail_rank(&self, rank: usize) {
        if let Some(peer) = self.net.get().and_then(|n| n.peers.get(rank)) {
            peer.credit.close();
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, (r, _)| *r != rank);
    }

    fn release(&self, epoch: u64) {
        self.released.fetch_max(epoch, Ordering::AcqRel);
        self.progress.notify.notify_waiters();
    }

    /// A reply, credit or barrier frame from `source`.
    async fn on_control(&self, source: usize, frame: &[u8]) {
        let Ok((head, rest)) = Head::parse(frame) else {
            tracing::debug!(source, "malformed control frame");
            self.counters.count_malformed();
            return;
        };
        let Ok(net) = self.net() else { return };
        if head.credit > 0 {
            if let Some(peer) = net.peers.get(source) {
                peer.credit.add_permits(head.credit as usize);
            }
        }
        match head.kind() {
            Some(Kind::Reply) => {
                let refusal = Refusal::from_code(head.status);
                let waiter = self
                    .pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&head.token);
                if head.flags & FLAG_ASYNC == 0 {
                    self.progress.replies.fetch_add(1, Ordering::AcqRel);
                }
                match waiter {
                    Some((_, w)) => {
                        let _ = w.send(Answer {
                            refusal,
                            value: head.arg,
                            data: Bytes::copy_from_slice(rest),
                        });
                    }
                    None => {
                        if let Some(refusal) = refusal {
                            let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
                            if e.first.len() < MAX_KEPT_ERRORS {
                                e.first.push(PgasError::Refused {
                                    rank: source,
                                    refusal,
                                });
                            } else {
                                e.more += 1;
                            }
                        }
                    }
                }
                self.progress.notify.notify_waiters();
            }
            Some(Kind::Credit) => {}
            Some(Kind::BarrierEnter) if net.rank == net.coordinator() => {
                if let Err(e) = self.arrive(head.arg).await {
                    tracing::debug!("barrier release: {e}");
                }
            }
            Some(Kind::BarrierRelease) => self.release(head.arg),
            _ => {
                tracing::debug!(source, kind = head.kind, "unexpected control frame");
                self.counters.count_malformed();
            }
        }
    }
}

/// Accepts members' connections: the member names its rank and the
/// connection's role (`Hello`), the acceptor answers `Ready` (see
/// [`Inner::dial`]).
async fn accept_loop(inner: Arc<Inner>, mut listener: Listener) {
    while let Some(conn) = listener.accept().await {
        let task = tokio::spawn(serve_connection(inner.clone(), conn));
        inner.track(task.abort_handle());
    }
}

fn is_kind(frame: &[u8], kind: Kind) -> bool {
    Head::parse(frame).is_ok_and(|(h, _)| h.kind() == Some(kind))
}

/// Answers a connector's `Hello`, once (see [`Inner::dial`]).
async fn send_ready(conn: &mut Connection) -> bool {
    let mut ready = BytesMut::with_capacity(HEADER_LEN);
    Head::new(Kind::Ready).put(&mut ready);
    conn.send_bytes(ready.freeze()).await.is_ok()
}

async fn serve_connection(inner: Arc<Inner>, mut conn: Connection) {
    let hello = tokio::time::timeout(inner.options.join_timeout, conn.recv()).await;
    let Ok(Some(Ok(hello))) = hello else {
        return;
    };
    let Ok((head, _)) = Head::parse(hello.payload()) else {
        inner.counters.count_malformed();
        return;
    };
    if head.kind() != Some(Kind::Hello) {
        inner.counters.count_malformed();
        return;
    }
    if !send_ready(&mut conn).await {
        return;
    }
    // Serve only once joined: replies need the connections to the group.
    let mut joined = inner.joined.subscribe();
    if joined.wait_for(|j| *j).await.is_err() {
        return;
    }
    let Ok(net) = inner.net() else { return };
    let source = head.len as usize;
    if net.group.uid(source) != Some(conn.remote().uid) {
        tracing::debug!(remote = %conn.remote().uid, source, "hello from a non-member");
        return;
    }
    match head.op {
        DATA_CLASS => serve_data(&inner, source, conn).await,
        CONTROL_CLASS => {
            while let Some(Ok(m)) = conn.recv().await {
                inner.on_control(source, m.payload()).await;
            }
            // No reply from `source` can come any more (it closed, or
            // went): what waits on it fails instead of waiting for ever.
            inner.fail_rank(source);
        }
        _ => inner.counters.count_malformed(),
    }
}

/// Runs `source`'s requests in order and sends back replies and credit.
async fn serve_data(inner: &Arc<Inner>, source: usize, mut conn: Connection) {
    let Ok(net) = inner.net() else { return };
    let Some(peer) = net.peers.get(source) else {
        return;
    };
    let mut inbound = Inbound::new(source, inner.options.max_medium, inner.counters.clone());
    let target: &(dyn Target + Sync) = &*inner.target;
    let mut replies: Vec<Reply> = Vec::with_capacity(4);
    let mut owed: usize = 0;
    let threshold = inner.options.credit_bytes as usize / 4;
    while let Some(Ok(m)) = conn.recv().await {
        let frame = m.payload();
        owed += charge(frame.len());
        inbound.on_frame(target, frame, &mut replies);
        for r in replies.drain(..) {
            let credit = std::mem::take(&mut owed) as u32;
            if inner
                .control_frame(source, peer, r.encode(credit))
                .await
                .is_err()
            {
                return;
            }
        }
        // Unreturned credit stays under a quarter of the window, so a
        // sender always has room for its largest frame.
        if owed >= threshold {
            let mut f = BytesMut::with_capacity(HEADER_LEN);
            Head {
                credit: std::mem::take(&mut owed) as u32,
                ..Head::new(Kind::Credit)
            }
            .put(&mut f);
            if inner.control_frame(source, peer, f.freeze()).await.is_err() {
                return;
            }
        }
    }
}

/// Takes hardware rank `rank`'s answers — replies and credit, as a
/// software target sends on its control connection — from the data
/// connection they came back on.
async fn read_answers(inner: Arc<Inner>, rank: usize, mut answers: SplitStream<Connection>) {
    while let Some(m) = answers.next().await {
        match m {
            Ok(m) => inner.on_control(rank, m.payload()).await,
            Err(e) => {
                // The device failed or refused a frame it could not take
                // (`BadRequest`): the requests waiting on it fail with
                // its connection.
                tracing::debug!(rank, "hardware endpoint: {e}");
                break;
            }
        }
    }
    inner.fail_rank(rank);
}
