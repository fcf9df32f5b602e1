//! [`Communicator`]: a group of ranks and the operations among them.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use futures_util::future::{try_join, try_join_all};
use tokio::time::Instant;
use uniplane_client::Session;

use crate::compress::RelayLink;
use crate::datatype::{to_bytes, Element, Op};
use crate::frame::Key;
use crate::operator::OperatorLink;
use crate::transport::{Limits, Peer, Stats, OVERHEAD};
use crate::tuning::{Algorithm, Collective, Tuning};
use crate::Error;

/// Tags with this bit belong to collectives; user tags never have it.
const COLLECTIVE: u64 = 1 << 63;
/// The context of the finalize handshake.
const FINAL: u64 = u64::MAX;

/// What the ranks of one process share: its session, its peers (by world
/// rank) and the settings.
pub(crate) struct Fabric {
    pub(crate) session: Arc<Session>,
    pub(crate) rank: usize,
    pub(crate) peers: Vec<Peer>,
    pub(crate) limits: Limits,
    pub(crate) eager_threshold: AtomicUsize,
    pub(crate) tuning: RwLock<Tuning>,
    pub(crate) stats: Arc<Stats>,
    /// The reduction operator endpoint allreduce and reduce go through,
    /// when one is set.
    pub(crate) operator: RwLock<Option<Arc<OperatorLink>>>,
    /// The compression pair data messages go through, when one is set.
    pub(crate) relay: RwLock<Option<Arc<RelayLink>>>,
}

impl Fabric {
    fn deadline(&self) -> Instant {
        Instant::now() + self.limits.timeout
    }

    async fn send(&self, to: usize, key: Key, data: &[u8]) -> Result<(), Error> {
        let peer = &self.peers[to];
        let deadline = self.deadline();
        let eager_max = (self.limits.window / 2 - OVERHEAD) as usize;
        if to != self.rank {
            let relay = self.relay.read().unwrap_or_else(|e| e.into_inner()).clone();
            if let (Some(relay), Some(uid)) = (relay, peer.uid()) {
                if data.len() <= u32::MAX as usize {
                    return relay
                        .send(peer, uid, key, data, self.limits.window, deadline)
                        .await;
                }
            }
        }
        let threshold = self.eager_threshold.load(Ordering::Relaxed).min(eager_max);
        if data.len() <= threshold || to == self.rank {
            peer.send_eager(key, data, deadline, &self.stats).await
        } else {
            peer.send_rendezvous(
                &self.session,
                key,
                data,
                deadline,
                &self.limits,
                &self.stats,
            )
            .await
        }
    }

    async fn recv(&self, from: usize, key: Key, limit: u64) -> Result<Bytes, Error> {
        self.peers[from]
            .recv(&self.session, key, limit, self.deadline(), &self.limits)
            .await
    }
}

/// A deterministic 64-bit mix (splitmix64), for context ids every rank
/// derives alike.
pub(crate) fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Inner {
    fabric: Arc<Fabric>,
    id: u64,
    /// World rank of each member, by rank in this communicator.
    members: Vec<usize>,
    rank: usize,
    next_collective: AtomicU64,
    next_child: AtomicU64,
}

/// A group of ranks: point-to-point messages and collectives among them.
///
/// Every operation returns a future (its request handle): the call takes
/// its place in the communicator's order when it is made, so several can
/// run at once (join them); every rank must make the same collective
/// calls in the same order, as in MPI. A peer that fails makes the calls
/// waiting on it fail with [`Error::PeerGone`]; one that stalls, with
/// [`Error::Timeout`] after the world's timeout — never a hang.
///
/// Clones share the communicator (and its call order).
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("id", &self.inner.id)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.members.len())
            .finish()
    }
}

fn chunk_range(count: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

impl Communicator {
    pub(crate) fn new(fabric: Arc<Fabric>, id: u64, members: Vec<usize>) -> Communicator {
        let rank = members
            .iter()
            .position(|&w| w == fabric.rank)
            .unwrap_or_default();
        Communicator {
            inner: Arc::new(Inner {
                fabric,
                id,
                members,
                rank,
                next_collective: AtomicU64::new(0),
                next_child: AtomicU64::new(0),
            }),
        }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The communicator's context id (what its messages' keys carry).
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.members.len()
    }

    /// The world rank of each member, by rank here.
    pub fn members(&self) -> &[usize] {
        &self.inner.members
    }

    /// The session this process's ranks send through.
    pub fn session(&self) -> &Session {
        &self.inner.fabric.session
    }

    /// Messages up to this many bytes go eagerly (buffered at the
    /// receiver); larger ones by rendezvous (one-sided writes into a
    /// window the receiver registers). Shared by every communicator of the
    /// process; takes effect for calls made after it.
    pub fn set_eager_threshold(&self, bytes: usize) {
        self.inner
            .fabric
            .eager_threshold
            .store(bytes, Ordering::Relaxed);
    }

    /// The eager threshold in bytes (capped at half the receive window).
    pub fn eager_threshold(&self) -> usize {
        let eager_max = (self.inner.fabric.limits.window / 2 - OVERHEAD) as usize;
        self.inner
            .fabric
            .eager_threshold
            .load(Ordering::Relaxed)
            .min(eager_max)
    }

    /// Replaces the algorithm table (every communicator of the process).
    /// All ranks must use the same table.
    pub fn set_tuning(&self, tuning: Tuning) {
        *self
            .inner
            .fabric
            .tuning
            .write()
            .unwrap_or_else(|e| e.into_inner()) = tuning;
    }

    /// The algorithm table in use.
    pub fn tuning(&self) -> Tuning {
        self.inner
            .fabric
            .tuning
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Transport counters of this process.
    pub fn stats(&self) -> &Stats {
        &self.inner.fabric.stats
    }

    /// Sends every later `allreduce` and `reduce` (of every communicator
    /// of the process) through the reduction operator endpoint named
    /// `name` (a resource of the daemon listening on
    /// [`crate::operator::OPERATOR_PORT`], see
    /// [`crate::operator::ReductionOperator`]); `None` returns to the
    /// ranks' own algorithms. Every rank must make the same choice before
    /// its next reduction.
    pub async fn use_reduction_operator(&self, name: Option<&str>) -> Result<(), Error> {
        let f = &self.inner.fabric;
        let link = match name {
            Some(name) => Some(Arc::new(
                OperatorLink::connect(&f.session, name, f.deadline()).await?,
            )),
            None => None,
        };
        *f.operator.write().unwrap_or_else(|e| e.into_inner()) = link;
        Ok(())
    }

    fn operator(&self) -> Option<Arc<OperatorLink>> {
        if self.size() == 1 {
            return None;
        }
        self.inner
            .fabric
            .operator
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reduces through the operator endpoint `link`.
    async fn reduce_via<T: Element>(
        &self,
        link: &OperatorLink,
        key: Key,
        acc: &mut [T],
        op: Op,
        root: Option<usize>,
    ) -> Result<(), Error> {
        let f = &self.inner.fabric;
        link.reduce(
            mix(key.comm, key.tag),
            (self.rank(), self.size()),
            root,
            acc,
            op,
            || f.deadline(),
        )
        .await
    }

    /// Sends every later data message of the process to another rank
    /// through the compression pair: the compressor `c` and the
    /// decompressor `d` (resources listening on
    /// [`crate::compress::COMPRESSION_PORT`], see
    /// [`crate::compress::CompressionOperator`]); `None` sends directly
    /// again. Collective: every rank calls it; it ends with a barrier, so
    /// every rank is known to the decompressor before any data goes.
    pub async fn use_compression(&self, pair: Option<(&str, &str)>) -> Result<(), Error> {
        let f = &self.inner.fabric;
        let link = match pair {
            Some(pair) => {
                let weak = Arc::downgrade(f);
                let peers = Arc::new(move |src: usize| {
                    weak.upgrade()
                        .and_then(|f| f.peers.get(src).and_then(Peer::linked_inbox))
                });
                Some(Arc::new(
                    RelayLink::connect(
                        &f.session,
                        pair,
                        f.rank,
                        peers,
                        f.limits.window,
                        f.deadline(),
                    )
                    .await?,
                ))
            }
            None => None,
        };
        // Direct: every rank's HELLO went out before anyone relays.
        let old = f.relay.write().unwrap_or_else(|e| e.into_inner()).take();
        self.barrier().await?;
        drop(old);
        *f.relay.write().unwrap_or_else(|e| e.into_inner()) = link;
        Ok(())
    }

    pub(crate) fn choose(&self, c: Collective, bytes: usize) -> Algorithm {
        self.inner
            .fabric
            .tuning
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .choose(c, self.size(), bytes)
    }

    pub(crate) fn next_key(&self) -> Key {
        let seq = self.inner.next_collective.fetch_add(1, Ordering::Relaxed);
        Key {
            comm: self.inner.id,
            tag: COLLECTIVE | seq,
        }
    }

    fn check_rank(&self, rank: usize, what: &str) -> Result<(), Error> {
        if rank < self.size() {
            Ok(())
        } else {
            Err(Error::Argument(format!(
                "{what} {rank} outside a communicator of {}",
                self.size()
            )))
        }
    }

    // ── typed point-to-point inside operations ────────────────────────

    async fn send_t<T: Element>(&self, to: usize, key: Key, data: &[T]) -> Result<(), Error> {
        let bytes = to_bytes(data);
        self.send_raw(to, key, &bytes).await
    }

    async fn send_raw(&self, to: usize, key: Key, bytes: &[u8]) -> Result<(), Error> {
        let world = self.inner.members[to];
        self.inner.fabric.send(world, key, bytes).await
    }

    async fn recv_raw<T: Element>(
        &self,
        from: usize,
        key: Key,
        count: usize,
    ) -> Result<Bytes, Error> {
        let world = self.inner.members[from];
        let want = count * T::SIZE;
        let b = self.inner.fabric.recv(world, key, want as u64).await?;
        if b.len() != want {
            return Err(Error::Protocol(format!(
                "rank {from} sent {} bytes where {want} were expected",
                b.len()
            )));
        }
        Ok(b)
    }

    async fn recv_into<T: Element>(
        &self,
        from: usize,
        key: Key,
        out: &mut [T],
    ) -> Result<(), Error> {
        let b = self.recv_raw::<T>(from, key, out.len()).await?;
        T::decode(&b, out);
        Ok(())
    }

    async fn recv_reduce<T: Element>(
        &self,
        from: usize,
        key: Key,
        acc: &mut [T],
        op: Op,
    ) -> Result<(), Error> {
        let b = self.recv_raw::<T>(from, key, acc.len()).await?;
        T::reduce_bytes(op, acc, &b);
        Ok(())
    }

    /// Sends `encoded` to `to` while receiving `count` elements from
    /// `from`.
    async fn exchange<T: Element>(
        &self,
        key: Key,
        to: usize,
        encoded: &[u8],
        from: usize,
        count: usize,
    ) -> Result<Bytes, Error> {
        let (_, b) = try_join(
            self.send_raw(to, key, encoded),
            self.recv_raw::<T>(from, key, count),
        )
        .await?;
        Ok(b)
    }

    // ── point-to-point ────────────────────────────────────────────────

    /// Sends `data` to rank `to` under `tag`.
    pub fn send<'a, T: Element>(
        &'a self,
        to: usize,
        tag: u32,
        data: &'a [T],
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        let key = Key {
            comm: self.inner.id,
            tag: u64::from(tag),
        };
        async move {
            self.check_rank(to, "destination")?;
            self.send_t(to, key, data).await
        }
    }

    /// Receives exactly `count` elements from rank `from` under `tag`
    /// (messages of one sender and tag arrive in the order sent).
    pub fn recv<T: Element>(
        &self,
        from: usize,
        tag: u32,
        count: usize,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + '_ {
        let key = Key {
            comm: self.inner.id,
            tag: u64::from(tag),
        };
        async move {
            self.check_rank(from, "source")?;
            let mut out = vec![T::default(); count];
            self.recv_into(from, key, &mut out).await?;
            Ok(out)
        }
    }

    /// Copies `src` into `dst` (same length), as ACCL+'s local copy.
    pub fn copy<T: Element>(&self, src: &[T], dst: &mut [T]) -> Result<(), Error> {
        if src.len() != dst.len() {
            return Err(Error::Argument(format!(
                "copy of {} elements into {}",
                src.len(),
                dst.len()
            )));
        }
        dst.copy_from_slice(src);
        Ok(())
    }

    // ── broadcast ─────────────────────────────────────────────────────

    /// Broadcasts `buf` from `root` (in place: the root's buffer is the
    /// input, every other rank's is overwritten).
    pub fn bcast<'a, T: Element>(
        &'a self,
        buf: &'a mut [T],
        root: usize,
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        let key = self.next_key();
        async move {
            self.check_rank(root, "root")?;
            let alg = self.choose(Collective::Bcast, buf.len() * T::SIZE);
            self.bcast_with(key, buf, root, alg).await
        }
    }

    pub(crate) async fn bcast_with<T: Element>(
        &self,
        key: Key,
        buf: &mut [T],
        root: usize,
        alg: Algorithm,
    ) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        if n == 1 {
            return Ok(());
        }
        if alg == Algorithm::Linear {
            if r == root {
                let bytes = to_bytes(buf);
                try_join_all(
                    (0..n)
                        .filter(|&i| i != root)
                        .map(|i| self.send_raw(i, key, &bytes)),
                )
                .await?;
            } else {
                self.recv_into(root, key, buf).await?;
            }
            return Ok(());
        }
        let vr = (r + n - root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                self.recv_into((vr - mask + root) % n, key, buf).await?;
                break;
            }
            mask <<= 1;
        }
        let bytes = to_bytes(buf);
        let mut children = Vec::new();
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                children.push((vr + mask + root) % n);
            }
            mask >>= 1;
        }
        try_join_all(children.into_iter().map(|c| self.send_raw(c, key, &bytes))).await?;
        Ok(())
    }

    // ── reduce ────────────────────────────────────────────────────────

    /// Reduces every rank's `data` with `op`; the root gets the result,
    /// the others `None`.
    pub fn reduce<'a, T: Element>(
        &'a self,
        data: &'a [T],
        op: Op,
        root: usize,
    ) -> impl Future<Output = Result<Option<Vec<T>>, Error>> + 'a {
        let key = self.next_key();
        async move {
            let mut acc = data.to_vec();
            if let Some(link) = self.operator() {
                self.check_rank(root, "root")?;
                self.reduce_via(&link, key, &mut acc, op, Some(root))
                    .await?;
                return Ok((self.rank() == root).then_some(acc));
            }
            let at_root = self.reduce_with(key, &mut acc, op, root, None).await?;
            Ok(at_root.then_some(acc))
        }
    }

    /// [`Communicator::reduce`] in place: the root's `buf` becomes the
    /// result; the others' `buf` is left in an unspecified state.
    pub fn reduce_in_place<'a, T: Element>(
        &'a self,
        buf: &'a mut [T],
        op: Op,
        root: usize,
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        let key = self.next_key();
        async move {
            if let Some(link) = self.operator() {
                self.check_rank(root, "root")?;
                return self.reduce_via(&link, key, buf, op, Some(root)).await;
            }
            self.reduce_with(key, buf, op, root, None).await?;
            Ok(())
        }
    }

    /// Returns whether this rank holds the result.
    async fn reduce_with<T: Element>(
        &self,
        key: Key,
        acc: &mut [T],
        op: Op,
        root: usize,
        alg: Option<Algorithm>,
    ) -> Result<bool, Error> {
        self.check_rank(root, "root")?;
        let (n, r) = (self.size(), self.rank());
        let alg = alg.unwrap_or_else(|| self.choose(Collective::Reduce, acc.len() * T::SIZE));
        if alg == Algorithm::Linear {
            if r != root {
                self.send_t(root, key, acc).await?;
                return Ok(false);
            }
            let all = try_join_all(
                (0..n)
                    .filter(|&i| i != root)
                    .map(|i| self.recv_raw::<T>(i, key, acc.len())),
            )
            .await?;
            for b in all {
                T::reduce_bytes(op, acc, &b);
            }
            return Ok(true);
        }
        let vr = (r + n - root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask == 0 {
                let src = vr | mask;
                if src < n {
                    self.recv_reduce((src + root) % n, key, acc, op).await?;
                }
            } else {
                self.send_t(((vr & !mask) + root) % n, key, acc).await?;
                return Ok(false);
            }
            mask <<= 1;
        }
        Ok(true)
    }

    // ── allreduce ─────────────────────────────────────────────────────

    /// Reduces every rank's `data` with `op`; every rank gets the result.
    pub fn allreduce<'a, T: Element>(
        &'a self,
        data: &'a [T],
        op: Op,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + 'a {
        let key = self.next_key();
        async move {
            let mut acc = data.to_vec();
            self.allreduce_with(key, &mut acc, op).await?;
            Ok(acc)
        }
    }

    /// [`Communicator::allreduce`] in place: `buf` is the input and
    /// becomes the result.
    pub fn allreduce_in_place<'a, T: Element>(
        &'a self,
        buf: &'a mut [T],
        op: Op,
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        let key = self.next_key();
        async move { self.allreduce_with(key, buf, op).await }
    }

    pub(crate) async fn allreduce_with<T: Element>(
        &self,
        key: Key,
        acc: &mut [T],
        op: Op,
    ) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        if n == 1 {
            return Ok(());
        }
        if let Some(link) = self.operator() {
            return self.reduce_via(&link, key, acc, op, None).await;
        }
        match self.choose(Collective::Allreduce, acc.len() * T::SIZE) {
            Algorithm::Linear | Algorithm::BinomialTree => {
                self.reduce_with(key, acc, op, 0, Some(Algorithm::BinomialTree))
                    .await?;
                self.bcast_with(key, acc, 0, Algorithm::BinomialTree).await
            }
            Algorithm::Ring => {
                let count = acc.len();
                let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                for step in 0..n - 1 {
                    let send = chunk_range(count, n, (r + n - step) % n);
                    let recv = chunk_range(count, n, (r + 2 * n - step - 1) % n);
                    let bytes = to_bytes(&acc[send]);
                    let b = self
                        .exchange::<T>(key, right, &bytes, left, recv.len())
                        .await?;
                    T::reduce_bytes(op, &mut acc[recv], &b);
                }
                for step in 0..n - 1 {
                    let send = chunk_range(count, n, (r + 1 + n - step) % n);
                    let recv = chunk_range(count, n, (r + n - step) % n);
                    let bytes = to_bytes(&acc[send]);
                    let b = self
                        .exchange::<T>(key, right, &bytes, left, recv.len())
                        .await?;
                    T::decode(&b, &mut acc[recv]);
                }
                Ok(())
            }
            Algorithm::RecursiveDoubling => {
                let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
                let rem = n - p;
                let newrank = if r < 2 * rem {
                    if r % 2 == 0 {
                        self.send_t(r + 1, key, acc).await?;
                        None
                    } else {
                        self.recv_reduce(r - 1, key, acc, op).await?;
                        Some(r / 2)
                    }
                } else {
                    Some(r - rem)
                };
                if let Some(nr) = newrank {
                    let mut mask = 1;
                    while mask < p {
                        let pn = nr ^ mask;
                        let partner = if pn < rem { pn * 2 + 1 } else { pn + rem };
                        let bytes = to_bytes(acc);
                        let b = self
                            .exchange::<T>(key, partner, &bytes, partner, acc.len())
                            .await?;
                        T::reduce_bytes(op, acc, &b);
                        mask <<= 1;
                    }
                }
                if r < 2 * rem {
                    if r % 2 == 1 {
                        self.send_t(r - 1, key, acc).await?;
                    } else {
                        self.recv_into(r + 1, key, acc).await?;
                    }
                }
                Ok(())
            }
        }
    }

    // ── gather, scatter, allgather ────────────────────────────────────

    /// Gathers every rank's `data` (equal lengths) at `root`, in rank
    /// order; the others get `None`.
    pub fn gather<'a, T: Element>(
        &'a self,
        data: &'a [T],
        root: usize,
    ) -> impl Future<Output = Result<Option<Vec<T>>, Error>> + 'a {
        let key = self.next_key();
        async move {
            self.check_rank(root, "root")?;
            let c = data.len();
            if self.rank() != root {
                self.send_t(root, key, data).await?;
                return Ok(None);
            }
            let mut out = vec![T::default(); c * self.size()];
            out[root * c..(root + 1) * c].copy_from_slice(data);
            let parts =
                try_join_all((0..self.size()).filter(|&i| i != root).map(|i| async move {
                    Ok::<_, Error>((i, self.recv_raw::<T>(i, key, c).await?))
                }))
                .await?;
            for (i, b) in parts {
                T::decode(&b, &mut out[i * c..(i + 1) * c]);
            }
            Ok(Some(out))
        }
    }

    /// Scatters the root's `data` (`size() * count` elements) in blocks of
    /// `count`: rank `i` gets block `i`. Other ranks pass an empty slice.
    pub fn scatter<'a, T: Element>(
        &'a self,
        data: &'a [T],
        count: usize,
        root: usize,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + 'a {
        let key = self.next_key();
        async move {
            self.check_rank(root, "root")?;
            self.scatter_with(key, data, count, root).await
        }
    }

    async fn scatter_with<T: Element>(
        &self,
        key: Key,
        data: &[T],
        count: usize,
        root: usize,
    ) -> Result<Vec<T>, Error> {
        let (n, r) = (self.size(), self.rank());
        if r != root {
            let mut out = vec![T::default(); count];
            self.recv_into(root, key, &mut out).await?;
            return Ok(out);
        }
        if data.len() != n * count {
            return Err(Error::Argument(format!(
                "scatter of {} elements in {n} blocks of {count}",
                data.len()
            )));
        }
        try_join_all(
            (0..n)
                .filter(|&i| i != root)
                .map(|i| self.send_t(i, key, &data[i * count..(i + 1) * count])),
        )
        .await?;
        Ok(data[r * count..(r + 1) * count].to_vec())
    }

    /// Gathers every rank's `data` (equal lengths) at every rank, in rank
    /// order.
    pub fn allgather<'a, T: Element>(
        &'a self,
        data: &'a [T],
    ) -> impl Future<Output = Result<Vec<T>, Error>> + 'a {
        let key = self.next_key();
        async move {
            let c = data.len();
            let mut buf = vec![T::default(); c * self.size()];
            buf[self.rank() * c..(self.rank() + 1) * c].copy_from_slice(data);
            self.allgather_with(key, &mut buf, c).await?;
            Ok(buf)
        }
    }

    /// [`Communicator::allgather`] in place: `buf` holds `size()` blocks;
    /// this rank's own block (at `rank() * len / size()`) is the input.
    pub fn allgather_in_place<'a, T: Element>(
        &'a self,
        buf: &'a mut [T],
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        let key = self.next_key();
        async move {
            if !buf.len().is_multiple_of(self.size()) {
                return Err(Error::Argument(format!(
                    "{} elements are not {} equal blocks",
                    buf.len(),
                    self.size()
                )));
            }
            let c = buf.len() / self.size();
            self.allgather_with(key, buf, c).await
        }
    }

    async fn allgather_with<T: Element>(
        &self,
        key: Key,
        buf: &mut [T],
        c: usize,
    ) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        if n == 1 {
            return Ok(());
        }
        let block = |i: usize| i * c..(i + 1) * c;
        let mut alg = self.choose(Collective::Allgather, c * T::SIZE);
        if alg == Algorithm::RecursiveDoubling && !n.is_power_of_two() {
            alg = Algorithm::Ring;
        }
        match alg {
            Algorithm::RecursiveDoubling => {
                let mut mask = 1;
                while mask < n {
                    let partner = r ^ mask;
                    let mine = (r & !(mask - 1)) * c..((r & !(mask - 1)) + mask) * c;
                    let theirs = (partner & !(mask - 1)) * c..((partner & !(mask - 1)) + mask) * c;
                    let bytes = to_bytes(&buf[mine]);
                    let b = self
                        .exchange::<T>(key, partner, &bytes, partner, theirs.len())
                        .await?;
                    T::decode(&b, &mut buf[theirs]);
                    mask <<= 1;
                }
                Ok(())
            }
            Algorithm::Linear | Algorithm::BinomialTree => {
                if r != 0 {
                    self.send_t(0, key, &buf[block(r)]).await?;
                } else {
                    for i in 1..n {
                        self.recv_into(i, key, &mut buf[block(i)]).await?;
                    }
                }
                self.bcast_with(key, buf, 0, Algorithm::BinomialTree).await
            }
            Algorithm::Ring => {
                let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                for step in 0..n - 1 {
                    let send = block((r + n - step) % n);
                    let recv = block((r + 2 * n - step - 1) % n);
                    let bytes = to_bytes(&buf[send]);
                    let b = self.exchange::<T>(key, right, &bytes, left, c).await?;
                    T::decode(&b, &mut buf[recv]);
                }
                Ok(())
            }
        }
    }

    // ── reduce-scatter ────────────────────────────────────────────────

    /// Reduces every rank's `data` (`size() * count` elements) with `op`
    /// and gives rank `i` block `i` of the result (`MPI_Reduce_scatter_block`).
    pub fn reduce_scatter<'a, T: Element>(
        &'a self,
        data: &'a [T],
        op: Op,
    ) -> impl Future<Output = Result<Vec<T>, Error>> + 'a {
        let key = self.next_key();
        async move {
            let n = self.size();
            if !data.len().is_multiple_of(n) {
                return Err(Error::Argument(format!(
                    "{} elements are not {n} equal blocks",
                    data.len()
                )));
            }
            let c = data.len() / n;
            let r = self.rank();
            let mut acc = data.to_vec();
            if n == 1 {
                return Ok(acc);
            }
            match self.choose(Collective::ReduceScatter, data.len() * T::SIZE) {
                Algorithm::Ring => {
                    let block = |i: usize| i * c..(i + 1) * c;
                    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                    for step in 0..n - 1 {
                        let send = block((r + 2 * n - step - 1) % n);
                        let recv = block((r + 2 * n - step - 2) % n);
                        let bytes = to_bytes(&acc[send]);
                        let b = self.exchange::<T>(key, right, &bytes, left, c).await?;
                        T::reduce_bytes(op, &mut acc[recv], &b);
                    }
                    Ok(acc[block(r)].to_vec())
                }
                _ => {
                    self.reduce_with(key, &mut acc, op, 0, Some(Algorithm::BinomialTree))
                        .await?;
                    self.scatter_with(key, &acc, c, 0).await
                }
            }
        }
    }

    // ── all-to-all ────────────────────────────────────────────────────

    /// Every rank sends block `j` of `data` (`size() * count` elements)
    /// to rank `j`; the result's block `i` came from rank `i`.
    pub fn alltoall<'a, T: Element>(
        &'a self,
        data: &'a [T],
    ) -> impl Future<Output = Result<Vec<T>, Error>> + 'a {
        let key = self.next_key();
        async move {
            let mut buf = data.to_vec();
            self.alltoall_with(key, &mut buf).await?;
            Ok(buf)
        }
    }

    /// [`Communicator::alltoall`] in place.
    pub fn alltoall_in_place<'a, T: Element>(
        &'a self,
        buf: &'a mut [T],
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        let key = self.next_key();
        async move { self.alltoall_with(key, buf).await }
    }

    async fn alltoall_with<T: Element>(&self, key: Key, buf: &mut [T]) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        if !buf.len().is_multiple_of(n) {
            return Err(Error::Argument(format!(
                "{} elements are not {n} equal blocks",
                buf.len()
            )));
        }
        let c = buf.len() / n;
        let outgoing: Vec<Vec<u8>> = (0..n).map(|j| to_bytes(&buf[j * c..(j + 1) * c])).collect();
        let others = || (0..n).filter(move |&j| j != r);
        let (_, got) =
            try_join(
                try_join_all(others().map(|j| self.send_raw(j, key, &outgoing[j]))),
                try_join_all(others().map(|j| async move {
                    Ok::<_, Error>((j, self.recv_raw::<T>(j, key, c).await?))
                })),
            )
            .await?;
        for (j, b) in got {
            T::decode(&b, &mut buf[j * c..(j + 1) * c]);
        }
        Ok(())
    }

    // ── barrier ───────────────────────────────────────────────────────

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> impl Future<Output = Result<(), Error>> + '_ {
        let key = self.next_key();
        async move {
            let (n, r) = (self.size(), self.rank());
            match self.choose(Collective::Barrier, 0) {
                Algorithm::RecursiveDoubling => {
                    let mut k = 1;
                    while k < n {
                        self.exchange::<u8>(key, (r + k) % n, &[], (r + n - k) % n, 0)
                            .await?;
                        k <<= 1;
                    }
                    Ok(())
                }
                _ => {
                    let mut none: [u8; 0] = [];
                    if r != 0 {
                        self.send_raw(0, key, &[]).await?;
                    } else {
                        for i in 1..n {
                            self.recv_raw::<u8>(i, key, 0).await?;
                        }
                    }
                    self.bcast_with(key, &mut none, 0, Algorithm::Linear).await
                }
            }
        }
    }

    // ── communicators ─────────────────────────────────────────────────

    /// A communicator of the same ranks with its own message space.
    /// Collective: every rank must call it.
    pub fn dup(&self) -> Communicator {
        let child = self.inner.next_child.fetch_add(1, Ordering::Relaxed);
        let id = mix(mix(self.inner.id, child), u64::MAX);
        Communicator::new(self.inner.fabric.clone(), id, self.inner.members.clone())
    }

    /// Splits the communicator: ranks passing the same `color` form a new
    /// one, ordered by `key` (then by rank here); `None` takes part in
    /// the call but joins no group. Collective: every rank must call it.
    pub fn split(
        &self,
        color: Option<u32>,
        key: i64,
    ) -> impl Future<Output = Result<Option<Communicator>, Error>> + '_ {
        let child = self.inner.next_child.fetch_add(1, Ordering::Relaxed);
        let coll = self.next_key();
        async move {
            let mine = [color.map_or(-1, i64::from), key];
            let mut all = vec![0i64; 2 * self.size()];
            all[2 * self.rank()..2 * self.rank() + 2].copy_from_slice(&mine);
            self.allgather_with(coll, &mut all, 2).await?;
            let Some(color) = color else {
                return Ok(None);
            };
            let mut group: Vec<(i64, usize)> = (0..self.size())
                .filter(|&i| all[2 * i] == i64::from(color))
                .map(|i| (all[2 * i + 1], i))
                .collect();
            group.sort();
            let members = group
                .into_iter()
                .map(|(_, i)| self.inner.members[i])
                .collect();
            let id = mix(mix(self.inner.id, child), u64::from(color));
            Ok(Some(Communicator::new(
                self.inner.fabric.clone(),
                id,
                members,
            )))
        }
    }

    /// Ends this process's part in the world cleanly: tells every peer it
    /// is done and waits until each has said the same or gone, so that
    /// closing the connections afterwards cannot cut off a message a peer
    /// still needs. Call it once, on any communicator, after the last
    /// operation of the process.
    pub async fn finalize(&self) -> Result<(), Error> {
        let f = &self.inner.fabric;
        let key = Key {
            comm: FINAL,
            tag: 0,
        };
        let others = || (0..f.peers.len()).filter(|&p| p != f.rank);
        let (sent, got) = futures_util::future::join(
            futures_util::future::join_all(others().map(|p| f.send(p, key, &[]))),
            futures_util::future::join_all(others().map(|p| f.recv(p, key, 0))),
        )
        .await;
        for r in sent.into_iter().chain(got.into_iter().map(|r| r.map(drop))) {
            match r {
                // A peer already gone has nothing left to ask of us.
                Ok(()) | Err(Error::PeerGone { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer_in_order() {
        for count in 0..20 {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let r = chunk_range(count, parts, i);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, count);
            }
        }
    }
}
