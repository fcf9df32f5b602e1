//! Programming a plane that runs on another thread: batches of
//! [`PlaneOp`]s go in through a bounded queue, their results come back
//! through a future. Nothing blocks the caller's thread.
//!
//! ```text
//!  daemon task ── submit(ops) ──► PlaneRemote ──► queue (bounded) ──► PlaneInbox::serve
//!       ▲                                                                   │ (plane thread,
//!       └──────────── PlaneFuture resolves ◄── completion + waker ◄─────────┘  once per pass)
//! ```
//!
//! The software engine's thread and the RTL co-simulation's thread both
//! serve an inbox once per pass, so a controller holds one
//! `Arc<dyn PlaneHandle>` whichever plane runs. A batch is applied in
//! order in one pass; each operation has its own result, and a failed one
//! does not stop the rest (the controller decides what to undo).
//!
//! A full queue pushes back: the future waits until the plane took
//! earlier batches. A plane that stopped fails every waiting and later
//! batch with [`PlaneError::EngineGone`].

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use atomic_waker::AtomicWaker;

use crate::plane::{ForwardingPlane, PlaneError, PlaneOp, PlaneReply};

/// The results of one batch, one per operation in order; the outer error
/// says the plane is gone.
pub type BatchResult = Result<Vec<Result<PlaneReply, PlaneError>>, PlaneError>;

/// The future a [`PlaneHandle::submit`] returns.
pub type PlaneFuture = Pin<Box<dyn Future<Output = BatchResult> + Send>>;

/// The asynchronous, batched control handle a daemon holds: the software
/// engine or the RTL behind the same calls.
pub trait PlaneHandle: Send + Sync + 'static {
    /// `engine` or `rtl`.
    fn kind(&self) -> &'static str;
    /// Applies `ops` in order, in one pass of the plane.
    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture;
}

/// Where one batch's results land.
struct Completion {
    result: Mutex<Option<BatchResult>>,
    waker: AtomicWaker,
}

impl Completion {
    fn finish(&self, r: BatchResult) {
        *lock(&self.result) = Some(r);
        self.waker.wake();
    }
}

struct Job {
    ops: Vec<PlaneOp>,
    done: Arc<Completion>,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Submitters waiting for room.
    waiting: Vec<Waker>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Batches in the queue, read without the lock by the plane's pass.
    queued: AtomicUsize,
    capacity: usize,
    /// The plane thread, when it waits for work.
    plane: AtomicWaker,
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here panics while holding a lock; a poisoned one is usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A channel to a plane on another thread: the remote half submits, the
/// inbox half is served by the plane's thread. `capacity` batches may
/// wait at once.
pub fn channel(kind: &'static str, capacity: usize) -> (PlaneRemote, PlaneInbox) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            jobs: VecDeque::with_capacity(capacity),
            waiting: Vec::new(),
        }),
        queued: AtomicUsize::new(0),
        capacity: capacity.max(1),
        plane: AtomicWaker::new(),
        closed: AtomicBool::new(false),
    });
    (
        PlaneRemote {
            shared: shared.clone(),
            kind,
        },
        PlaneInbox { shared },
    )
}

/// The submitting half of [`channel`]. Cloning is cheap; every clone
/// reaches the same plane.
#[derive(Clone)]
pub struct PlaneRemote {
    shared: Arc<Shared>,
    kind: &'static str,
}

impl PlaneRemote {
    /// Applies `ops` and waits for the results on this thread (parking
    /// it): for tests, benchmarks and tools, never on an async runtime.
    pub fn submit_blocking(&self, ops: Vec<PlaneOp>) -> BatchResult {
        block_on(self.submit(ops))
    }

    /// Applies one operation, blocking; see [`PlaneRemote::submit_blocking`].
    pub fn apply_blocking(&self, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
        self.submit_blocking(vec![op])?
            .pop()
            .unwrap_or(Err(PlaneError::EngineGone))
    }
}

impl PlaneHandle for PlaneRemote {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture {
        Box::pin(Submit {
            shared: self.shared.clone(),
            ops: Some(ops),
            done: Arc::new(Completion {
                result: Mutex::new(None),
                waker: AtomicWaker::new(),
            }),
        })
    }
}

struct Submit {
    shared: Arc<Shared>,
    /// The batch until it is queued.
    ops: Option<Vec<PlaneOp>>,
    done: Arc<Completion>,
}

impl Future for Submit {
    type Output = BatchResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<BatchResult> {
        let this = self.get_mut();
        // Registered before the job is visible: the plane cannot finish it
        // unseen.
        this.done.waker.register(cx.waker());
        if this.ops.is_some() {
            if this.shared.closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(PlaneError::EngineGone));
            }
            let mut q = lock(&this.shared.queue);
            if q.jobs.len() >= this.shared.capacity {
                q.waiting.push(cx.waker().clone());
                return Poll::Pending;
            }
            let ops = this.ops.take().unwrap_or_default();
            q.jobs.push_back(Job {
                ops,
                done: this.done.clone(),
            });
            this.shared.queued.store(q.jobs.len(), Ordering::Release);
            drop(q);
            this.shared.plane.wake();
            // A plane that closed after our check never sees the job.
            if this.shared.closed.load(Ordering::Acquire) {
                fail_all(&this.shared);
            }
        }
        match lock(&this.done.result).take() {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

fn fail_all(shared: &Shared) {
    let (jobs, waiting) = {
        let mut q = lock(&shared.queue);
        (std::mem::take(&mut q.jobs), std::mem::take(&mut q.waiting))
    };
    for j in jobs {
        j.done.finish(Err(PlaneError::EngineGone));
    }
    for w in waiting {
        w.wake();
    }
}

/// The serving half of [`channel`], owned by the plane's thread.
pub struct PlaneInbox {
    shared: Arc<Shared>,
}

impl PlaneInbox {
    /// Applies every waiting batch to `plane`; returns the operations
    /// carried out.
    pub fn serve<P: ForwardingPlane + ?Sized>(&mut self, plane: &mut P) -> usize {
        let mut n = 0;
        // The plane's every pass comes here: no lock while nothing waits.
        while self.shared.queued.load(Ordering::Acquire) > 0 {
            let (job, waiting) = {
                let mut q = lock(&self.shared.queue);
                let Some(job) = q.jobs.pop_front() else { break };
                self.shared.queued.store(q.jobs.len(), Ordering::Release);
                (job, std::mem::take(&mut q.waiting))
            };
            for w in waiting {
                w.wake();
            }
            n += job.ops.len();
            let results = job.ops.into_iter().map(|op| plane.apply(op)).collect();
            job.done.finish(Ok(results));
        }
        n
    }

    /// Whether batches wait, registering `cx`'s waker to hear of the
    /// next one.
    pub fn poll_pending(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.shared.plane.register(cx.waker());
        if self.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// Whether batches wait.
    pub fn is_empty(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire) == 0
    }
}

impl Drop for PlaneInbox {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        fail_all(&self.shared);
    }
}

/// Runs a future to completion on this thread, parking between polls.
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{AclRule, ConnKey};
    use crate::table::Route;
    use crate::{Engine, EngineConfig, PortSpec};
    use uniplane_dataplane::Uid;

    fn uid(d: u16) -> Uid {
        Uid::new("10.0.0.1".parse().unwrap(), d)
    }

    #[test]
    fn a_batch_is_applied_in_order_with_one_result_each() {
        let (remote, mut inbox) = channel("engine", 4);
        let mut engine = Engine::new(EngineConfig::default());
        let mut fut = remote.submit(vec![
            PlaneOp::Attach(PortSpec::app("a")),
            PlaneOp::AddRoute(0, Route::exact(uid(1), 0)),
            PlaneOp::AddRoute(9, Route::exact(uid(1), 0)),
            PlaneOp::Dump(0),
        ]);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        assert_eq!(inbox.serve(&mut engine), 4);
        let Poll::Ready(Ok(results)) = fut.as_mut().poll(&mut cx) else {
            panic!("batch not finished");
        };
        assert!(matches!(results[0], Ok(PlaneReply::Attached(0, _))));
        assert!(matches!(results[1], Ok(PlaneReply::Done)));
        assert_eq!(results[2].as_ref().err(), Some(&PlaneError::NoSuchPort(9)));
        let Ok(PlaneReply::Dump(d)) = &results[3] else {
            panic!("no dump");
        };
        assert_eq!(d.routes, vec![Route::exact(uid(1), 0)]);
    }

    #[test]
    fn a_full_queue_makes_the_submitter_wait_and_loses_nothing() {
        let (remote, mut inbox) = channel("engine", 1);
        let mut engine = Engine::new(EngineConfig::default());
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut first = remote.submit(vec![PlaneOp::Attach(PortSpec::app("a"))]);
        let mut second = remote.submit(vec![PlaneOp::AddRule(0, AclRule::ALLOW_ALL)]);
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(inbox.serve(&mut engine), 1, "only the first was queued");
        assert!(first.as_mut().poll(&mut cx).is_ready());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert_eq!(inbox.serve(&mut engine), 1);
        let Poll::Ready(Ok(r)) = second.as_mut().poll(&mut cx) else {
            panic!("second batch lost");
        };
        assert!(matches!(r[0], Ok(PlaneReply::Done)));
        assert_eq!(engine.dump(0).unwrap().rules, vec![AclRule::ALLOW_ALL]);
    }

    #[test]
    fn a_stopped_plane_fails_waiting_and_later_batches() {
        let (remote, inbox) = channel("engine", 4);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let conn = ConnKey {
            src: uid(1),
            src_port: 1,
            dst: uid(2),
            dst_port: 2,
        };
        let mut waiting = remote.submit(vec![PlaneOp::Allow(0, conn)]);
        assert!(waiting.as_mut().poll(&mut cx).is_pending());
        drop(inbox);
        assert!(matches!(
            waiting.as_mut().poll(&mut cx),
            Poll::Ready(Err(PlaneError::EngineGone))
        ));
        assert!(matches!(
            remote.submit_blocking(vec![PlaneOp::Counters(0)]),
            Err(PlaneError::EngineGone)
        ));
    }
}
