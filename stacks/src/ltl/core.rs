//! The sans-IO LTL endpoint: every connection of one datagram port, driven
//! by datagrams in, datagrams out and time, with no I/O and no clock of its
//! own (as `quinn-proto` is).
//!
//! ```text
//!  handle_datagram(from, bytes, now) ─┐               ┌─► poll_transmit(now, buf) -> dst
//!  handle_timeout(now) ───────────────┤  LtlEndpoint  ├─► poll_timeout() -> when
//!  connect / send / recv / close ─────┘               └─► poll_event() -> what changed
//! ```
//!
//! Reliability is selective repeat: the receiver keeps out-of-order frames
//! inside its window and acknowledges cumulatively; on a gap it sends a
//! NACK with a bitmap of what it holds beyond the gap (repeated once per
//! round trip while the gap stays open and nothing arrives). The sender
//! resends a frame once frames sent after it are known to have arrived
//! (loss judged by transmission order, as RACK judges it by time), so a
//! gap is repaired on the first NACK that shows it, and a lost
//! retransmission on the first answer to anything sent after it. When
//! nothing comes back for two round trips, a tail-loss probe resends the
//! newest frame not known to have arrived, whose answer names what is
//! missing; the retransmission timer (RFC 6298: SRTT, RTTVAR, Karn's rule,
//! exponential backoff) is left for a peer that stopped answering.
//!
//! Flow control is credit in frames: the window covers frames held out of
//! order and frames received but not yet read by the application, so a
//! reader that stalls stops the sender and nothing is dropped. The sender
//! keeps at most `max_in_flight` frames in flight that no NACK reported,
//! well under the window: while a gap is repaired, frames reported beyond
//! it leave the flight and the sender goes on into the rest of the window
//! instead of stalling for the round trip the repair takes.
//!
//! A listener keeps nothing for a handshake until it completes: it answers
//! a SYN with a SYN_ACK whose connection id and initial sequence number
//! are a cookie, a MAC under a key of its own that changes every 64 s
//! (see [`super::cookie`]), and creates the connection only when a
//! frame echoing a valid cookie arrives. A flood of SYNs from forged
//! addresses costs it two hashes and one answer each, no memory. Complete
//! handshakes that the application has not accepted yet wait in a
//! backlog of at most [`LtlConfig::accept_backlog`] (1024 by default);
//! beyond it handshakes are dropped and counted, and the opener tries
//! again. The accepted side has no handshake RTT sample (it sent nothing
//! it remembers): its first sample comes with its first acknowledged
//! frame, and until then its timers use `initial_rto`.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::{Message, SplitMix64};

use super::cookie::Cookies;
use super::wire::{
    payload_checksum, Frame, Kind, PayloadSum, Repr, HEADER_LEN, MAX_SACK_BYTES, SACK_LEN,
};

/// How an LTL endpoint behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LtlConfig {
    /// Most connections at once (both directions).
    pub max_connections: usize,
    /// Most connections peers opened that the application has not accepted
    /// yet (1024 by default). Further handshakes are refused: a SYN goes
    /// unanswered and a cookie's echo is dropped, both counted in
    /// [`LtlStats::backlog_full`], so the opener tries again later.
    pub accept_backlog: usize,
    /// Largest datagram, header included.
    pub max_frame: usize,
    /// Frames a receiver buffers per connection (out of order, or in order
    /// and not yet read): the credit it grants, and so the most frames a
    /// sender has unacknowledged. NACKs report up to 2048 frames past a
    /// gap.
    pub window: u32,
    /// Frames a sender keeps in flight that are not known to have arrived
    /// (frames a NACK reported do not count). Smaller than `window`, it
    /// leaves the sender room to go on while a gap is repaired, and keeps
    /// the queue it builds short.
    pub max_in_flight: u32,
    /// Bytes of messages a connection queues before `send` refuses more.
    pub send_buffer: usize,
    /// Retransmission timeout before the first RTT sample.
    pub initial_rto: Duration,
    /// Smallest retransmission timeout.
    pub min_rto: Duration,
    /// Largest retransmission timeout (the backoff stops here).
    pub max_rto: Duration,
    /// Quiet time after which a keepalive is sent.
    pub keepalive_interval: Duration,
    /// Timeouts in a row (retransmissions or unanswered keepalives) after
    /// which the peer is declared failed.
    pub max_timeouts: u32,
    /// How long a closed connection lingers to answer a repeated FIN.
    pub linger: Duration,
    /// Frames sent after a missing one that must arrive before it counts
    /// as lost and goes again (1 suits fabrics that keep order; more
    /// tolerates paths that reorder, at the price of slower repair).
    pub reorder_threshold: u32,
}

impl Default for LtlConfig {
    fn default() -> Self {
        LtlConfig {
            max_connections: 4096,
            accept_backlog: 1024,
            max_frame: 1472,
            window: 1024,
            max_in_flight: 256,
            send_buffer: 512 << 10,
            initial_rto: Duration::from_millis(50),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_millis(500),
            keepalive_interval: Duration::from_millis(200),
            max_timeouts: 8,
            linger: Duration::from_millis(100),
            reorder_threshold: 3,
        }
    }
}

impl LtlConfig {
    /// Largest encoded overlay message a frame carries.
    pub fn max_message(&self) -> usize {
        self.max_frame.saturating_sub(HEADER_LEN)
    }
}

/// A connection's id at this endpoint.
pub type ConnId = u32;

/// Why a connection ended badly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The peer stopped answering.
    #[error("no answer after {0} timeouts")]
    TimedOut(u32),
    /// The peer reset the connection, or refused it.
    #[error("connection reset by the peer")]
    Reset,
}

/// Why `send` did not take a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The send buffer is full: wait for [`Event::Writable`].
    #[error("send buffer full")]
    Full,
    /// The message is larger than a frame carries.
    #[error("message of {0} bytes exceeds the frame's limit")]
    TooLarge(usize),
    /// The connection was closed by this side.
    #[error("connection closed")]
    Closed,
    /// The connection failed.
    #[error(transparent)]
    Failed(#[from] ConnError),
    /// No such connection.
    #[error("unknown connection")]
    Unknown,
}

/// What `recv` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recv {
    /// A message.
    Message(Message),
    /// Nothing now: wait for [`Event::Readable`].
    Empty,
    /// The peer closed and everything it sent was read.
    End,
    /// The connection failed.
    Failed(ConnError),
}

/// Something an application may want to wake up for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A connection this endpoint opened is established.
    Connected(ConnId),
    /// A peer opened a connection; take it with [`LtlEndpoint::accept`].
    Incoming,
    /// Messages (or the end) can be read.
    Readable(ConnId),
    /// The send buffer has room again.
    Writable(ConnId),
    /// The connection failed; every user gets the error.
    Failed(ConnId, ConnError),
    /// The connection is gone from the table.
    Removed(ConnId),
}

/// What an endpoint counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LtlStats {
    /// Frames received that passed every check.
    pub rx_frames: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames that failed a check (bad checksum, length, kind): dropped.
    pub bad_frames: u64,
    /// Frames for no connection here (bad cookies included).
    pub unknown_conn: u64,
    /// DATA frames received twice.
    pub duplicates: u64,
    /// DATA frames beyond the credit granted.
    pub out_of_window: u64,
    /// Frames sent again after a timeout.
    pub timeout_retransmits: u64,
    /// Frames sent again because a NACK or ACK showed frames sent after
    /// them arrived (a gap).
    pub fast_retransmits: u64,
    /// Frames sent again as tail-loss probes: no progress for two round
    /// trips while frames were unacknowledged.
    pub probe_retransmits: u64,
    /// Timer expiries with data outstanding (each doubles the timeout).
    pub timeouts: u64,
    /// ACK frames sent (keepalive answers included).
    pub acks_sent: u64,
    /// NACK frames sent.
    pub nacks_sent: u64,
    /// NACKs sent again because a gap stayed open with nothing arriving.
    pub nack_repeats: u64,
    /// Microseconds connections spent with data queued but no credit or
    /// window to send it.
    pub blocked_micros: u64,
    /// Connections refused at the limit or while not listening.
    pub refused: u64,
    /// Connections whose peer failed.
    pub peer_failures: u64,
    /// SYNs answered with a cookie, keeping nothing.
    pub syn_cookies: u64,
    /// Frames for no connection here whose cookie did not check out
    /// (forged, or older than two cookie epochs): dropped, answered with a
    /// reset, nothing created.
    pub bad_cookies: u64,
    /// Handshakes refused because [`LtlConfig::accept_backlog`] connections
    /// were waiting to be accepted.
    pub backlog_full: u64,
    /// SYN_ACKs and resets not sent because [`MAX_REPLIES`] were already
    /// waiting to go.
    pub replies_dropped: u64,
}

/// Most SYN_ACKs and resets waiting to be sent, which the endpoint sends
/// for no connection of its own: beyond it they are dropped and counted.
pub const MAX_REPLIES: usize = 1024;

/// Shortest tail-loss probe timeout.
const PROBE_FLOOR: Duration = Duration::from_micros(100);
/// Tail-loss probes between two acknowledgements that make progress.
const MAX_PROBES: u32 = 2;
/// Shortest interval between NACKs repeated for an open gap.
const NACK_REPEAT_FLOOR: Duration = Duration::from_micros(100);

/// `a < b` in sequence-number arithmetic.
#[inline]
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    SynSent,
    Established,
    /// Both FINs exchanged and acknowledged; lingering until the deadline.
    Closed(Instant),
    Failed,
}

/// A DATA or FIN frame sent and not yet acknowledged.
struct Sent {
    kind: Kind,
    payload: Bytes,
    sum: PayloadSum,
    /// When it was last transmitted.
    sent_at: Instant,
    /// Its last transmission's place among the connection's transmissions.
    order: u64,
    retransmitted: bool,
    /// Reported received beyond a gap by a NACK.
    sacked: bool,
    /// Waiting in the retransmission queue.
    queued: bool,
}

/// Something received in order or held out of order.
enum Item {
    Data(Bytes),
    Fin,
}

struct Conn<A> {
    peer: A,
    peer_id: u32,
    state: State,
    // Sending.
    snd_una: u32,
    snd_nxt: u32,
    snd_limit: u32,
    inflight: VecDeque<Sent>,
    /// Frames of `inflight` a NACK reported.
    sacked: u32,
    rexmit: VecDeque<u32>,
    unsent: BytesMut,
    unsent_lens: VecDeque<u32>,
    closing: bool,
    fin_sent: bool,
    was_full: bool,
    // Receiving.
    rcv_nxt: u32,
    ooo: VecDeque<Option<Item>>,
    ready: VecDeque<Bytes>,
    reading: VecDeque<Message>,
    peer_fin: bool,
    advertised: u32,
    ack_due: bool,
    nack_due: bool,
    syn_due: bool,
    synack_due: bool,
    keepalive_pending: bool,
    // Timers.
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    rto_at: Option<Instant>,
    /// Smallest RTT sample seen.
    min_rtt: Option<Duration>,
    /// DATA and FIN transmissions so far, new or again.
    tx_order: u64,
    /// The latest transmission (by `tx_order`) known to have arrived.
    delivered_order: u64,
    /// Tail-loss probe timer, and probes sent since the last progress.
    probe_at: Option<Instant>,
    probes: u32,
    /// When the first SYN went, for a handshake RTT sample; cleared when
    /// it is sent again (Karn). A listener's first SYN_ACK goes from no
    /// connection, so its side has no such sample.
    handshake_at: Option<Instant>,
    handshake_repeated: bool,
    /// Receiver: when to repeat a NACK if a gap is still open.
    nack_at: Option<Instant>,
    keepalive_at: Instant,
    /// Since when data waits for credit or window.
    blocked_since: Option<Instant>,
    timeouts: u32,
    error: Option<ConnError>,
    scheduled: bool,
}

/// Every LTL connection over one datagram port, without I/O.
pub struct LtlEndpoint<A> {
    config: LtlConfig,
    rng: SplitMix64,
    conns: HashMap<ConnId, Conn<A>>,
    by_peer: HashMap<(A, u32), ConnId>,
    listening: bool,
    /// Makes and checks the cookies of handshakes in progress.
    cookies: Cookies,
    /// Complete handshakes not accepted yet.
    incoming: VecDeque<ConnId>,
    /// Connections that may have something to transmit.
    dirty: VecDeque<ConnId>,
    /// Frames of no connection to send (SYN_ACKs, resets), and where.
    replies: VecDeque<(A, Repr)>,
    events: VecDeque<Event>,
    stats: LtlStats,
    /// Connection ids, reused by the timer walk.
    scratch: Vec<ConnId>,
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> LtlEndpoint<A> {
    /// An endpoint with no connections; `seed` picks the ids and initial
    /// sequence numbers of the connections it opens. The keys of its SYN
    /// cookies come from the operating system's random source.
    pub fn new(config: LtlConfig, seed: u64) -> Self {
        LtlEndpoint {
            config,
            rng: SplitMix64::new(seed),
            conns: HashMap::new(),
            by_peer: HashMap::new(),
            listening: false,
            cookies: Cookies::new(),
            incoming: VecDeque::new(),
            dirty: VecDeque::new(),
            replies: VecDeque::new(),
            events: VecDeque::new(),
            stats: LtlStats::default(),
            scratch: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LtlConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> LtlStats {
        self.stats
    }

    /// Connections in the table (lingering ones included). A listener
    /// has none for handshakes in progress.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Connections peers opened that wait for [`LtlEndpoint::accept`].
    pub fn accept_queue_len(&self) -> usize {
        self.incoming.len()
    }

    /// Whether peers may open connections here.
    pub fn set_listening(&mut self, on: bool) {
        self.listening = on;
    }

    /// Stops accepting, and refuses connections opened but not accepted.
    pub fn listening_off(&mut self) {
        self.listening = false;
        while let Some(id) = self.incoming.pop_front() {
            self.abort(id);
        }
    }

    /// A connection a peer opened, if any is waiting.
    pub fn accept(&mut self) -> Option<ConnId> {
        self.incoming.pop_front()
    }

    /// The peer of a connection.
    pub fn peer(&self, id: ConnId) -> Option<A> {
        self.conns.get(&id).map(|c| c.peer)
    }

    /// The smoothed round-trip time and the retransmission timeout of a
    /// connection (no RTT before the first sample).
    pub fn timing(&self, id: ConnId) -> Option<(Option<Duration>, Duration)> {
        self.conns.get(&id).map(|c| (c.srtt, c.rto))
    }

    /// Whether the connection is established (data flows).
    pub fn is_established(&self, id: ConnId) -> bool {
        self.conns
            .get(&id)
            .is_some_and(|c| c.state == State::Established)
    }

    /// The next thing that changed.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn fresh_id(&mut self) -> ConnId {
        loop {
            let id = self.rng.next_u64() as u32;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn new_conn(&self, peer: A, peer_id: u32, state: State, isn: u32, now: Instant) -> Conn<A> {
        let c = &self.config;
        Conn {
            peer,
            peer_id,
            state,
            snd_una: isn,
            snd_nxt: isn,
            snd_limit: isn,
            // Grown as the flight grows (a few doublings per connection),
            // not a window's worth (64 KiB at the default) up front.
            inflight: VecDeque::new(),
            sacked: 0,
            rexmit: VecDeque::new(),
            unsent: BytesMut::new(),
            unsent_lens: VecDeque::new(),
            closing: false,
            fin_sent: false,
            was_full: false,
            rcv_nxt: 0,
            ooo: VecDeque::new(),
            ready: VecDeque::new(),
            reading: VecDeque::new(),
            peer_fin: false,
            advertised: 0,
            ack_due: false,
            nack_due: false,
            syn_due: false,
            synack_due: false,
            keepalive_pending: false,
            srtt: None,
            rttvar: Duration::ZERO,
            rto: c.initial_rto,
            rto_at: None,
            min_rtt: None,
            tx_order: 0,
            delivered_order: 0,
            probe_at: None,
            probes: 0,
            handshake_at: None,
            handshake_repeated: false,
            nack_at: None,
            keepalive_at: now + c.keepalive_interval,
            blocked_since: None,
            timeouts: 0,
            error: None,
            scheduled: false,
        }
    }

    fn mark_dirty(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.scheduled {
                c.scheduled = true;
                self.dirty.push_back(id);
            }
        }
    }

    /// Opens a connection to `peer`; [`Event::Connected`] follows once the
    /// peer accepts, [`Event::Failed`] if it never answers.
    pub fn connect(&mut self, peer: A, now: Instant) -> Result<ConnId, SendError> {
        if self.conns.len() >= self.config.max_connections {
            return Err(SendError::Failed(ConnError::Reset));
        }
        let id = self.fresh_id();
        let isn = self.rng.next_u64() as u32;
        let mut c = self.new_conn(peer, 0, State::SynSent, isn, now);
        c.syn_due = true;
        self.conns.insert(id, c);
        self.mark_dirty(id);
        Ok(id)
    }

    /// Queues `message` on the connection.
    pub fn send(&mut self, id: ConnId, message: &Message) -> Result<(), SendError> {
        let max = self.config.max_message();
        let limit = self.config.send_buffer;
        let c = self.conns.get_mut(&id).ok_or(SendError::Unknown)?;
        if let Some(e) = &c.error {
            return Err(SendError::Failed(e.clone()));
        }
        if c.closing {
            return Err(SendError::Closed);
        }
        let size = message.encoded_len();
        if size > max {
            return Err(SendError::TooLarge(size));
        }
        if c.unsent.len() >= limit {
            c.was_full = true;
            return Err(SendError::Full);
        }
        message.encode(&mut c.unsent);
        c.unsent_lens.push_back(size as u32);
        self.mark_dirty(id);
        Ok(())
    }

    /// Whether `send` would take a message now.
    pub fn can_send(&self, id: ConnId) -> bool {
        self.conns.get(&id).is_some_and(|c| {
            c.error.is_none() && !c.closing && c.unsent.len() < self.config.send_buffer
        })
    }

    /// Bytes queued and frames unacknowledged on a connection.
    pub fn backlog(&self, id: ConnId) -> (usize, usize) {
        self.conns
            .get(&id)
            .map_or((0, 0), |c| (c.unsent.len(), c.inflight.len()))
    }

    /// Takes the next received message.
    pub fn recv(&mut self, id: ConnId) -> Recv {
        let Some(c) = self.conns.get_mut(&id) else {
            return Recv::End;
        };
        if c.reading.is_empty() {
            if let Some(frame) = c.ready.pop_front() {
                // Frames were checked by their checksum; a frame whose
                // messages do not decode came from a broken peer and is
                // skipped whole.
                if crate::udp::decode_datagram(&frame, &mut c.reading).is_err() {
                    self.stats.bad_frames += 1;
                }
            }
        }
        if let Some(m) = c.reading.pop_front() {
            if c.reading.is_empty() {
                self.after_read(id);
            }
            return Recv::Message(m);
        }
        if let Some(e) = &c.error {
            return Recv::Failed(e.clone());
        }
        if c.peer_fin && c.ready.is_empty() {
            return Recv::End;
        }
        if !c.ready.is_empty() {
            // Only undecodable frames were there; try the next.
            return self.recv(id);
        }
        Recv::Empty
    }

    /// A frame's worth of buffer was freed: grant more credit when enough.
    fn after_read(&mut self, id: ConnId) {
        let window = self.config.window;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let limit = c.rcv_nxt.wrapping_add(credit(c, window));
        let gained = limit.wrapping_sub(c.advertised);
        if c.state == State::Established
            && (gained >= (window / 4).max(1) || c.advertised == c.rcv_nxt)
            && limit != c.advertised
        {
            c.ack_due = true;
            self.mark_dirty(id);
        }
    }

    /// Closes the sending direction after everything queued is delivered;
    /// the connection leaves the table once both sides closed.
    pub fn close(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.closing {
                c.closing = true;
                self.mark_dirty(id);
            }
        }
    }

    /// Drops a connection at once, telling the peer with a reset.
    pub fn abort(&mut self, id: ConnId) {
        if let Some(c) = self.conns.remove(&id) {
            self.by_peer.remove(&(c.peer, c.peer_id));
            if c.state == State::Established && c.error.is_none() {
                // Not subject to MAX_REPLIES: one per connection at most.
                self.replies.push_back((c.peer, reset(c.peer_id, id)));
            }
            self.events.push_back(Event::Removed(id));
        }
    }

    /// Feeds one received datagram.
    pub fn handle_datagram(&mut self, from: A, data: &[u8], now: Instant) {
        self.handle(from, data, None, now);
    }

    /// Feeds one received datagram the caller holds as [`Bytes`]: a DATA
    /// frame's payload is kept as a slice of it, not copied.
    pub fn handle_datagram_bytes(&mut self, from: A, data: &Bytes, now: Instant) {
        self.handle(from, data, Some(data), now);
    }

    fn handle(&mut self, from: A, data: &[u8], owned: Option<&Bytes>, now: Instant) {
        let frame = match Frame::new_checked(data) {
            Ok(f) => f,
            Err(_) => {
                self.stats.bad_frames += 1;
                return;
            }
        };
        self.stats.rx_frames += 1;
        let kind = frame.kind();
        if kind == Kind::Syn {
            self.handle_syn(from, &frame, now);
            return;
        }
        let id = frame.dst_conn();
        if self.conns.get(&id).is_some_and(|c| {
            c.peer == from && c.state == State::SynSent && !matches!(kind, Kind::SynAck | Kind::Rst)
        }) {
            // The peer's side is up and its SYN_ACK was lost: our next SYN
            // brings it again.
            return;
        }
        let known = self.conns.get(&id).is_some_and(|c| {
            c.peer == from
                && (c.peer_id == frame.src_conn()
                    || (c.state == State::SynSent && kind == Kind::SynAck))
        });
        if !known && !self.complete_handshake(from, &frame, now) {
            return;
        }
        let window = self.config.window;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.timeouts = 0;
        c.keepalive_at = now + self.config.keepalive_interval;
        if kind != Kind::SynAck && c.state == State::Established {
            // The first answer to our SYN_ACK times the path.
            if let Some(at) = c.handshake_at.take() {
                rtt_sample(c, now.saturating_duration_since(at), &self.config);
            }
        }
        match kind {
            Kind::Rst => {
                self.fail(id, ConnError::Reset);
                return;
            }
            Kind::SynAck => {
                if c.state == State::SynSent {
                    if let Some(at) = c.handshake_at.take() {
                        rtt_sample(c, now.saturating_duration_since(at), &self.config);
                    }
                    c.state = State::Established;
                    c.peer_id = frame.src_conn();
                    c.rcv_nxt = frame.seq();
                    c.advertised = c.rcv_nxt;
                    c.snd_limit = frame.window();
                    c.rto_at = None;
                    c.ack_due = true;
                    self.by_peer.insert((from, frame.src_conn()), id);
                    self.events.push_back(Event::Connected(id));
                    self.events.push_back(Event::Writable(id));
                } else {
                    // Our ACK of it was lost; say it again.
                    c.ack_due = true;
                }
            }
            _ if c.state == State::SynSent => return,
            Kind::Data | Kind::Fin => {
                let item = if kind == Kind::Data {
                    let payload = frame.payload();
                    Item::Data(match owned {
                        Some(b) => b.slice(HEADER_LEN..HEADER_LEN + payload.len()),
                        None => Bytes::copy_from_slice(payload),
                    })
                } else {
                    Item::Fin
                };
                self.receive(id, frame.seq(), item, window);
                if let Some(c) = self.conns.get_mut(&id) {
                    handle_ack(
                        c,
                        frame.ack(),
                        frame.window(),
                        None,
                        now,
                        &self.config,
                        &mut self.stats,
                    );
                }
            }
            Kind::Ack => handle_ack(
                c,
                frame.ack(),
                frame.window(),
                None,
                now,
                &self.config,
                &mut self.stats,
            ),
            Kind::Nack => handle_ack(
                c,
                frame.ack(),
                frame.window(),
                Some(frame.payload()),
                now,
                &self.config,
                &mut self.stats,
            ),
            Kind::Keepalive => c.ack_due = true,
            Kind::Syn => {}
        }
        self.settle(id, now);
        self.mark_dirty(id);
    }

    /// Answers a SYN with a cookie, keeping nothing; a repeated SYN of a
    /// connection that exists has its SYN_ACK sent again from it.
    fn handle_syn(&mut self, from: A, frame: &Frame<&[u8]>, now: Instant) {
        if let Some(&id) = self.by_peer.get(&(from, frame.src_conn())) {
            // A repeated SYN: our SYN_ACK was lost, or delayed.
            if let Some(c) = self.conns.get_mut(&id) {
                c.synack_due = true;
            }
            self.mark_dirty(id);
            return;
        }
        if !self.listening || self.conns.len() >= self.config.max_connections {
            self.stats.refused += 1;
            self.queue_reset(from, frame.src_conn(), 0);
            return;
        }
        if self.incoming.len() >= self.config.accept_backlog {
            // Unanswered: the opener sends its SYN again after a timeout.
            self.stats.backlog_full += 1;
            return;
        }
        let peer_isn = frame.seq();
        let cookie = self.cookies.make(&from, frame.src_conn(), peer_isn, now);
        // What the connection's SYN_ACK would say: all credit, nothing read.
        let synack = Repr {
            kind: Kind::SynAck,
            src_conn: cookie.id,
            dst_conn: frame.src_conn(),
            seq: cookie.isn,
            ack: peer_isn,
            window: peer_isn.wrapping_add(self.config.window),
        };
        if self.queue_reply(from, synack) {
            self.stats.syn_cookies += 1;
        }
    }

    /// A frame for no connection here: it creates one if it echoes a valid
    /// cookie and there is room; otherwise it is counted, and answered with
    /// a reset unless refusing it is only for now. Returns whether the
    /// connection (the frame's `dst_conn`) now exists.
    fn complete_handshake(&mut self, from: A, frame: &Frame<&[u8]>, now: Instant) -> bool {
        let kind = frame.kind();
        let (id, peer_id) = (frame.dst_conn(), frame.src_conn());
        // Until it hears from the connection, an opener sends these. An id
        // that is another peer's connection's is no cookie to try (and a
        // valid cookie colliding with one, a chance of one in 2^31 per
        // connection in the table, is refused like a stale one).
        let may_echo = matches!(kind, Kind::Ack | Kind::Data | Kind::Fin | Kind::Keepalive);
        if !self.listening || !may_echo || self.conns.contains_key(&id) {
            self.stats.unknown_conn += 1;
            if kind != Kind::Rst {
                self.queue_reset(from, peer_id, id);
            }
            return false;
        }
        let Some(echo) = self.cookies.check(&from, peer_id, id, frame.ack(), now) else {
            self.stats.unknown_conn += 1;
            self.stats.bad_cookies += 1;
            self.queue_reset(from, peer_id, id);
            return false;
        };
        if self.by_peer.contains_key(&(from, peer_id)) {
            // The peer's connection exists under another cookie (its SYN
            // was answered twice); this one is stale.
            self.stats.unknown_conn += 1;
            self.queue_reset(from, peer_id, id);
            return false;
        }
        if self.incoming.len() >= self.config.accept_backlog {
            // Dropped without a word: the opener repeats itself (data,
            // keepalives), and gets in once the application accepts.
            self.stats.backlog_full += 1;
            return false;
        }
        if self.conns.len() >= self.config.max_connections {
            self.stats.refused += 1;
            self.queue_reset(from, peer_id, id);
            return false;
        }
        let mut c = self.new_conn(from, peer_id, State::Established, echo.isn, now);
        c.rcv_nxt = echo.peer_isn;
        // As the SYN_ACK said: all credit.
        c.advertised = echo.peer_isn.wrapping_add(self.config.window);
        // Every frame of the opener's carries its credit as an absolute
        // limit; the SYN's is not needed.
        let credit = frame.window().wrapping_sub(echo.isn);
        if !before(frame.window(), echo.isn) {
            c.snd_limit = echo.isn.wrapping_add(credit.min(self.config.window));
        }
        // The SYN_ACK went without a record: no handshake RTT sample, and
        // none from a SYN_ACK sent again (Karn).
        c.handshake_repeated = true;
        self.conns.insert(id, c);
        self.by_peer.insert((from, peer_id), id);
        self.incoming.push_back(id);
        self.events.push_back(Event::Incoming);
        true
    }

    fn queue_reset(&mut self, to: A, their: u32, ours: u32) {
        self.queue_reply(to, reset(their, ours));
    }

    /// Queues a frame of no connection; false (and counted) when
    /// [`MAX_REPLIES`] are waiting already.
    fn queue_reply(&mut self, to: A, repr: Repr) -> bool {
        if self.replies.len() >= MAX_REPLIES {
            self.stats.replies_dropped += 1;
            return false;
        }
        self.replies.push_back((to, repr));
        true
    }

    /// Takes a DATA or FIN frame into the receive window.
    fn receive(&mut self, id: ConnId, seq: u32, item: Item, window: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if before(seq, c.rcv_nxt) {
            self.stats.duplicates += 1;
            c.ack_due = true;
            return;
        }
        let offset = seq.wrapping_sub(c.rcv_nxt);
        if offset >= credit(c, window) {
            self.stats.out_of_window += 1;
            c.ack_due = true;
            return;
        }
        let offset = offset as usize;
        if c.ooo.len() <= offset {
            c.ooo.resize_with(offset + 1, || None);
        }
        if c.ooo[offset].is_some() {
            self.stats.duplicates += 1;
            c.nack_due = true;
            return;
        }
        c.ooo[offset] = Some(item);
        let mut advanced = false;
        while let Some(Some(_)) = c.ooo.front() {
            match c.ooo.pop_front().flatten() {
                Some(Item::Data(d)) => c.ready.push_back(d),
                Some(Item::Fin) => c.peer_fin = true,
                None => {}
            }
            c.rcv_nxt = c.rcv_nxt.wrapping_add(1);
            advanced = true;
        }
        c.ack_due = true;
        if c.ooo.is_empty() {
            c.nack_at = None;
        } else {
            c.nack_due = true;
        }
        if advanced {
            self.events.push_back(Event::Readable(id));
        }
    }

    /// Checks the send side after acknowledgements: room, closing.
    fn settle(&mut self, id: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.was_full && c.unsent.len() < self.config.send_buffer {
            c.was_full = false;
            self.events.push_back(Event::Writable(id));
        }
        let done = c.closing && c.fin_sent && c.inflight.is_empty() && c.peer_fin;
        if done && c.state == State::Established {
            c.state = State::Closed(now + self.config.linger);
        }
    }

    fn fail(&mut self, id: ConnId, e: ConnError) {
        if let Some(c) = self.conns.get_mut(&id) {
            if c.error.is_none() {
                if let ConnError::TimedOut(_) = e {
                    self.stats.peer_failures += 1;
                }
                c.error = Some(e.clone());
                c.state = State::Failed;
                c.rto_at = None;
                self.events.push_back(Event::Failed(id, e));
                self.events.push_back(Event::Readable(id));
                self.events.push_back(Event::Writable(id));
            }
        }
    }

    /// Removes a failed connection once its user let go of it.
    pub fn release(&mut self, id: ConnId) {
        let gone = self
            .conns
            .get(&id)
            .is_some_and(|c| matches!(c.state, State::Failed | State::Closed(_)));
        if gone {
            if let Some(c) = self.conns.remove(&id) {
                self.by_peer.remove(&(c.peer, c.peer_id));
                self.events.push_back(Event::Removed(id));
            }
        }
    }

    /// The next datagram to send: appended to `out`, destination returned.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut BytesMut) -> Option<A> {
        if let Some((to, repr)) = self.replies.pop_front() {
            repr.emit_empty(out);
            self.stats.tx_frames += 1;
            return Some(to);
        }
        while let Some(id) = self.dirty.pop_front() {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            match transmit_one(c, id, now, &self.config, &mut self.stats, out) {
                Some(to) => {
                    if c.was_full && c.unsent.len() < self.config.send_buffer {
                        c.was_full = false;
                        self.events.push_back(Event::Writable(id));
                    }
                    // More may follow: keep the connection in the rotation.
                    self.dirty.push_back(id);
                    self.stats.tx_frames += 1;
                    return Some(to);
                }
                None => c.scheduled = false,
            }
        }
        None
    }

    /// When [`LtlEndpoint::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .filter_map(|c| match c.state {
                State::Closed(at) => Some(at),
                State::Failed => None,
                _ => [c.rto_at, c.probe_at, c.nack_at]
                    .into_iter()
                    .flatten()
                    .fold(c.keepalive_at, Instant::min)
                    .into(),
            })
            .min()
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        ids.extend(self.conns.keys().copied());
        for &id in &ids {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            match c.state {
                State::Failed => continue,
                State::Closed(at) => {
                    if at <= now {
                        let peer = (c.peer, c.peer_id);
                        self.conns.remove(&id);
                        self.by_peer.remove(&peer);
                        self.events.push_back(Event::Removed(id));
                    }
                    continue;
                }
                _ => {}
            }
            let mut timed_out = false;
            let mut probed = false;
            if c.rto_at.is_some_and(|t| t <= now) {
                timed_out = true;
                self.stats.timeouts += 1;
                c.rto = (c.rto * 2).min(self.config.max_rto);
                c.rto_at = Some(now + c.rto);
                c.probe_at = None;
                if c.state == State::SynSent {
                    c.syn_due = true;
                    c.handshake_at = None;
                    c.handshake_repeated = true;
                } else {
                    // The oldest frame goes again; the answer to it says
                    // what else is missing (a NACK for holes below frames
                    // that arrived, partial acknowledgements for a lost
                    // tail). Sending the whole window again would repeat
                    // everything whenever only an ACK was lost.
                    if queue_first_unacked(c) {
                        self.stats.timeout_retransmits += 1;
                    }
                }
            } else if c.probe_at.is_some_and(|t| t <= now) {
                // Two round trips without progress: resend the newest frame
                // not known to have arrived. Its answer (an ACK, or a NACK
                // naming the gaps) repairs a lost tail, a lost NACK or a
                // lost retransmission in one round trip, where the
                // retransmission timer would wait for its floor. A probe
                // is no timeout: it neither backs off nor counts towards
                // declaring the peer failed.
                c.probe_at = None;
                c.probes += 1;
                if queue_newest_unacked(c) {
                    self.stats.probe_retransmits += 1;
                    probed = true;
                }
            } else if c.keepalive_at <= now {
                c.keepalive_at = now + self.config.keepalive_interval;
                if c.state == State::Established {
                    // Quiet for a keepalive interval: ask, and count it.
                    timed_out = true;
                    c.keepalive_pending = true;
                }
            }
            if timed_out {
                c.timeouts += 1;
                if c.timeouts > self.config.max_timeouts {
                    let n = c.timeouts;
                    self.fail(id, ConnError::TimedOut(n));
                    continue;
                }
            }
            if timed_out || probed {
                self.mark_dirty(id);
            }
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.nack_at.is_some_and(|t| t <= now) {
                // A gap is open and nothing arrived for a round trip: the
                // NACK (or the retransmission it asked for) may be lost.
                c.nack_at = None;
                if !c.ooo.is_empty() && c.state == State::Established {
                    c.nack_due = true;
                    self.stats.nack_repeats += 1;
                    self.mark_dirty(id);
                }
            }
        }
        self.scratch = ids;
    }
}

/// A reset from our connection `ours` (0: none) to the peer's `their`.
fn reset(their: u32, ours: u32) -> Repr {
    Repr {
        kind: Kind::Rst,
        src_conn: ours,
        dst_conn: their,
        seq: 0,
        ack: 0,
        window: 0,
    }
}

/// Frames the receiver can still take: the window less frames waiting to
/// be read.
fn credit<A>(c: &Conn<A>, window: u32) -> u32 {
    let held = c.ready.len() as u32 + u32::from(!c.reading.is_empty());
    window.saturating_sub(held)
}

fn rtt_sample<A>(c: &mut Conn<A>, sample: Duration, cfg: &LtlConfig) {
    c.min_rtt = Some(c.min_rtt.map_or(sample, |m| m.min(sample)));
    match c.srtt {
        None => {
            c.srtt = Some(sample);
            c.rttvar = sample / 2;
        }
        Some(srtt) => {
            let delta = srtt.abs_diff(sample);
            c.rttvar = (c.rttvar * 3 + delta) / 4;
            c.srtt = Some((srtt * 7 + sample) / 8);
        }
    }
    let srtt = c.srtt.unwrap_or(sample);
    // A fresh sample also ends any backoff (RFC 6298, 5.7).
    c.rto = (srtt + (c.rttvar * 4).max(Duration::from_micros(100))).clamp(cfg.min_rto, cfg.max_rto);
}

/// Arms the tail-loss probe two smoothed RTTs from now, when frames are
/// unacknowledged and that comes before the retransmission timeout.
fn arm_probe<A>(c: &mut Conn<A>, now: Instant) {
    c.probe_at = None;
    if c.inflight.is_empty() || c.probes >= MAX_PROBES {
        return;
    }
    let Some(srtt) = c.srtt else {
        return;
    };
    let at = now + (srtt * 2).max(PROBE_FLOOR);
    if c.rto_at.is_none_or(|rto| at < rto) {
        c.probe_at = Some(at);
    }
}

/// How long a receiver waits before it repeats a NACK for a gap nothing
/// has filled: one smoothed RTT.
fn nack_interval<A>(c: &Conn<A>, cfg: &LtlConfig) -> Duration {
    c.srtt.unwrap_or(cfg.initial_rto).max(NACK_REPEAT_FLOOR)
}

/// Applies an acknowledgement, a credit and (for a NACK) a bitmap, then
/// queues for retransmission every frame that a later transmission
/// overtook.
///
/// Loss is judged by transmission order, as RACK (RFC 8985) judges it by
/// time: a frame is lost once `reorder_threshold` transmissions made after
/// it have arrived. A retransmitted frame is therefore sent again only
/// after something sent after its retransmission arrived, never on a
/// timer that a stale RTT estimate could hold back.
fn handle_ack<A>(
    c: &mut Conn<A>,
    ack: u32,
    window: u32,
    sack: Option<&[u8]>,
    now: Instant,
    cfg: &LtlConfig,
    stats: &mut LtlStats,
) {
    if before(c.snd_limit, window) {
        c.snd_limit = window;
    }
    let mut progress = false;
    let mut sample: Option<Duration> = None;
    let mut delivered = c.delivered_order;
    // A retransmitted frame that arrives sooner than any round trip could
    // is its first transmission arriving: its order says nothing.
    let min_rtt = c.min_rtt.unwrap_or(Duration::ZERO);
    let mut note = |s: &Sent, sample: &mut Option<Duration>| {
        let rtt = now.saturating_duration_since(s.sent_at);
        if !s.retransmitted {
            *sample = Some(sample.map_or(rtt, |m| m.min(rtt)));
        }
        if !s.retransmitted || rtt >= min_rtt {
            delivered = delivered.max(s.order);
        }
    };
    if before(c.snd_una, ack) && !before(c.snd_nxt, ack) {
        // Karn's rule: frames sent twice do not time the path, and frames
        // reported by a NACK were timed when they were reported.
        while before(c.snd_una, ack) {
            let Some(s) = c.inflight.pop_front() else {
                break;
            };
            c.snd_una = c.snd_una.wrapping_add(1);
            if s.sacked {
                c.sacked -= 1;
            } else {
                note(&s, &mut sample);
            }
        }
        progress = true;
    }
    if let Some(bitmap) = sack {
        if c.snd_una == ack {
            // Bit i: frame ack + 1 + i arrived.
            let bits = bitmap.len() * 8;
            for (i, s) in c.inflight.iter_mut().enumerate().skip(1).take(bits) {
                let bit = i - 1;
                if !s.sacked && bitmap[bit / 8] & (0x80 >> (bit % 8)) != 0 {
                    s.sacked = true;
                    c.sacked += 1;
                    progress = true;
                    note(s, &mut sample);
                }
            }
        }
    }
    c.delivered_order = delivered;
    if let Some(rtt) = sample {
        rtt_sample(c, rtt, cfg);
    }
    if progress {
        c.rto_at = if c.inflight.is_empty() {
            None
        } else {
            Some(now + c.rto)
        };
        c.probes = 0;
        arm_probe(c, now);
    }
    let threshold = u64::from(cfg.reorder_threshold.max(1));
    let mut seq = c.snd_una;
    for s in c.inflight.iter_mut() {
        if s.order + threshold > c.delivered_order {
            if !s.retransmitted {
                // Frames beyond were first sent later still.
                break;
            }
        } else if !s.sacked && !s.queued {
            s.queued = true;
            c.rexmit.push_back(seq);
            stats.fast_retransmits += 1;
        }
        seq = seq.wrapping_add(1);
    }
}

/// Queues the newest frame not known to have arrived for retransmission;
/// false when there is none or it is already queued.
fn queue_newest_unacked<A>(c: &mut Conn<A>) -> bool {
    let Some(back) = c.inflight.iter().rposition(|s| !s.sacked) else {
        return false;
    };
    let s = &mut c.inflight[back];
    if s.queued {
        return false;
    }
    s.queued = true;
    c.rexmit.push_back(c.snd_una.wrapping_add(back as u32));
    true
}

/// Queues the oldest unacknowledged frame for retransmission; false when
/// it is already queued or known to have arrived.
fn queue_first_unacked<A>(c: &mut Conn<A>) -> bool {
    let seq = c.snd_una;
    match c.inflight.front_mut() {
        Some(s) if !s.sacked && !s.queued => {
            s.queued = true;
            c.rexmit.push_back(seq);
            true
        }
        _ => false,
    }
}

/// The one next frame of a connection, if it has one.
fn transmit_one<A: Copy>(
    c: &mut Conn<A>,
    id: ConnId,
    now: Instant,
    cfg: &LtlConfig,
    stats: &mut LtlStats,
    out: &mut BytesMut,
) -> Option<A> {
    if matches!(c.state, State::Failed) {
        return None;
    }
    let window = cfg.window;
    let mut repr = Repr {
        kind: Kind::Ack,
        src_conn: id,
        dst_conn: c.peer_id,
        seq: c.snd_nxt,
        ack: c.rcv_nxt,
        window: c.rcv_nxt.wrapping_add(credit(c, window)),
    };
    if c.syn_due {
        c.syn_due = false;
        if c.rto_at.is_none() {
            c.rto_at = Some(now + c.rto);
        }
        if c.handshake_at.is_none() && !c.handshake_repeated {
            c.handshake_at = Some(now);
        }
        repr.kind = Kind::Syn;
        repr.dst_conn = 0;
        repr.ack = 0;
        repr.window = window;
        repr.emit_empty(out);
        return Some(c.peer);
    }
    if c.state == State::SynSent {
        return None;
    }
    if c.synack_due {
        c.synack_due = false;
        // Karn: a SYN_ACK sent again makes the answer ambiguous.
        c.handshake_repeated = c.handshake_at.is_some() || c.handshake_repeated;
        c.handshake_at = if c.handshake_repeated {
            None
        } else {
            Some(now)
        };
        repr.kind = Kind::SynAck;
        repr.seq = c.snd_una;
        repr.emit_empty(out);
        c.advertised = repr.window;
        c.ack_due = false;
        return Some(c.peer);
    }
    if c.nack_due {
        c.nack_due = false;
        c.ack_due = false;
        c.keepalive_pending = false;
        // As many blocks as reach the highest frame held.
        let bits = c.ooo.len().saturating_sub(1).min(MAX_SACK_BYTES * 8);
        let len = bits.div_ceil(SACK_LEN * 8).max(1) * SACK_LEN;
        let mut bitmap = [0u8; MAX_SACK_BYTES];
        for (i, slot) in c.ooo.iter().enumerate().skip(1).take(bits) {
            if slot.is_some() {
                let bit = i - 1;
                bitmap[bit / 8] |= 0x80 >> (bit % 8);
            }
        }
        let bitmap = &bitmap[..len];
        repr.kind = Kind::Nack;
        c.advertised = repr.window;
        c.nack_at = Some(now + nack_interval(c, cfg));
        stats.nacks_sent += 1;
        repr.emit(bitmap, payload_checksum(bitmap), out);
        return Some(c.peer);
    }
    // Retransmissions first, oldest first.
    while let Some(seq) = c.rexmit.pop_front() {
        let idx = seq.wrapping_sub(c.snd_una) as usize;
        if before(seq, c.snd_una) || idx >= c.inflight.len() {
            continue;
        }
        let s = &mut c.inflight[idx];
        s.queued = false;
        if s.sacked {
            continue;
        }
        s.retransmitted = true;
        s.sent_at = now;
        c.tx_order += 1;
        s.order = c.tx_order;
        repr.kind = s.kind;
        repr.seq = seq;
        repr.emit(&s.payload, s.sum, out);
        c.advertised = repr.window;
        c.ack_due = false;
        c.keepalive_pending = false;
        if c.rto_at.is_none() {
            c.rto_at = Some(now + c.rto);
        }
        arm_probe(c, now);
        return Some(c.peer);
    }
    // New data, within the peer's credit and our own window.
    let pipe = c.inflight.len() as u32 - c.sacked;
    let can_send = before(c.snd_nxt, c.snd_limit)
        && (c.inflight.len() as u32) < window
        && pipe < cfg.max_in_flight.max(1);
    let has_data = !c.unsent_lens.is_empty() || (c.closing && !c.fin_sent);
    if has_data && !can_send && c.blocked_since.is_none() {
        c.blocked_since = Some(now);
    }
    if can_send && has_data {
        if let Some(since) = c.blocked_since.take() {
            stats.blocked_micros += now.saturating_duration_since(since).as_micros() as u64;
        }
        let (kind, payload) = if let Some(&first) = c.unsent_lens.front() {
            let max = cfg.max_message();
            let mut take = first as usize;
            c.unsent_lens.pop_front();
            while let Some(&next) = c.unsent_lens.front() {
                if take + next as usize > max {
                    break;
                }
                take += next as usize;
                c.unsent_lens.pop_front();
            }
            (Kind::Data, c.unsent.split_to(take).freeze())
        } else {
            c.fin_sent = true;
            (Kind::Fin, Bytes::new())
        };
        let sum = payload_checksum(&payload);
        repr.kind = kind;
        repr.seq = c.snd_nxt;
        repr.emit(&payload, sum, out);
        c.tx_order += 1;
        c.inflight.push_back(Sent {
            kind,
            payload,
            sum,
            sent_at: now,
            order: c.tx_order,
            retransmitted: false,
            sacked: false,
            queued: false,
        });
        c.snd_nxt = c.snd_nxt.wrapping_add(1);
        c.advertised = repr.window;
        c.ack_due = false;
        c.keepalive_pending = false;
        if c.rto_at.is_none() {
            c.rto_at = Some(now + c.rto);
        }
        arm_probe(c, now);
        return Some(c.peer);
    }
    if c.keepalive_pending {
        c.keepalive_pending = false;
        c.ack_due = false;
        repr.kind = Kind::Keepalive;
        c.advertised = repr.window;
        repr.emit_empty(out);
        return Some(c.peer);
    }
    if c.ack_due {
        c.ack_due = false;
        c.advertised = repr.window;
        stats.acks_sent += 1;
        repr.emit_empty(out);
        return Some(c.peer);
    }
    None
}
