//! The in-process stack (named `mem` in configurations): links between
//! tasks of one process, found by name.
//!
//! A listener registers a name; `connect` to that name creates a
//! [`uniplane_dataplane::channel::pair`] and hands one end to the listener. The
//! queues are bounded, so a slow receiver pushes back on its sender.
//! Reliable, ordered, and able to carry one-sided operations.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures_core::Stream;
use uniplane_dataplane::channel::{pair, ChannelLink};
use uniplane_dataplane::wire::EXTENDED_HEADER_LEN;
use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, Locator, Message, Stack, StackError, StackFuture,
};

/// Messages each direction of an in-process link holds by default.
pub const DEFAULT_QUEUE_DEPTH: usize = 1024;
/// Connections a listener may have waiting to be accepted.
const ACCEPT_BACKLOG: usize = 128;

type Backlog = Arc<(ChannelQueue, atomic_waker::AtomicWaker)>;
type ChannelQueue = Mutex<std::collections::VecDeque<ChannelLink>>;

/// In-process stack; clones share one namespace of listeners.
#[derive(Clone)]
pub struct InProcessStack {
    listeners: Arc<Mutex<HashMap<String, Backlog>>>,
    depth: usize,
}

impl Default for InProcessStack {
    fn default() -> Self {
        Self::new()
    }
}

impl InProcessStack {
    /// A stack with an empty namespace and the default queue depth.
    pub fn new() -> Self {
        Self::with_depth(DEFAULT_QUEUE_DEPTH)
    }

    /// A stack whose links hold `depth` messages per direction.
    pub fn with_depth(depth: usize) -> Self {
        InProcessStack {
            listeners: Arc::new(Mutex::new(HashMap::new())),
            depth: depth.max(1),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, Backlog>> {
        // A panic while holding this lock leaves the map consistent (every
        // operation is one insert or remove), so poisoning is ignored.
        self.listeners.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn name<'a>(&self, locator: &'a Locator) -> Result<&'a str, StackError> {
        match locator {
            Locator::Name(n) => Ok(n),
            other => Err(StackError::UnsupportedLocator {
                stack: "mem",
                locator: other.clone(),
            }),
        }
    }

    /// Opens a link to the listener named by `peer` now (no await needed).
    pub fn connect_now(&self, peer: &Locator) -> Result<ChannelLink, StackError> {
        let name = self.name(peer)?;
        let backlog = self
            .table()
            .get(name)
            .cloned()
            .ok_or_else(|| StackError::Refused(peer.clone()))?;
        let (ours, theirs) = pair(self.depth);
        {
            let mut queue = backlog.0.lock().unwrap_or_else(|e| e.into_inner());
            if queue.len() >= ACCEPT_BACKLOG {
                return Err(StackError::TooManyConnections(ACCEPT_BACKLOG));
            }
            queue.push_back(theirs);
        }
        backlog.1.wake();
        Ok(ours)
    }

    /// Registers a listener at `local` now.
    pub fn listen_now(&self, local: &Locator) -> Result<InProcessListener, StackError> {
        let name = self.name(local)?.to_owned();
        let mut table = self.table();
        if table.contains_key(&name) {
            return Err(StackError::AddrInUse(local.clone()));
        }
        let backlog: Backlog = Arc::default();
        table.insert(name.clone(), backlog.clone());
        Ok(InProcessListener {
            stack: self.clone(),
            name,
            backlog,
        })
    }
}

impl Stack for InProcessStack {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: true,
            ordered: true,
            mtu: EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD,
            one_sided: true,
            max_connections: usize::MAX,
        }
    }

    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink> {
        let result = self.connect_now(peer).map(|l| Box::new(l) as BoxLink);
        Box::pin(async move { result })
    }

    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener> {
        let result = self.listen_now(local);
        Box::pin(async move {
            let listener = result?;
            Ok(Box::pin(futures_util::StreamExt::map(listener, |r| {
                r.map(|l| Box::new(l) as BoxLink)
            })) as BoxListener)
        })
    }
}

/// Links connecting to a name; dropping it frees the name.
pub struct InProcessListener {
    stack: InProcessStack,
    name: String,
    backlog: Backlog,
}

impl Stream for InProcessListener {
    type Item = Result<ChannelLink, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let pop = |b: &Backlog| b.0.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        if let Some(link) = pop(&self.backlog) {
            return Poll::Ready(Some(Ok(link)));
        }
        self.backlog.1.register(cx.waker());
        match pop(&self.backlog) {
            Some(link) => Poll::Ready(Some(Ok(link))),
            None => Poll::Pending,
        }
    }
}

impl Drop for InProcessListener {
    fn drop(&mut self) {
        self.stack.table().remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;
    use uniplane_dataplane::Uid;

    fn name(n: &str) -> Locator {
        Locator::Name(n.into())
    }

    #[tokio::test]
    async fn connect_reaches_the_listener_by_name() {
        let stack = InProcessStack::new();
        let mut listener = stack.listen(&name("echo")).await.unwrap();
        let mut client = stack.connect(&name("echo")).await.unwrap();
        let mut server = listener.next().await.unwrap().unwrap();
        let uid = Uid::new(Ipv4Addr::LOCALHOST, 1);
        let m = Message::send(uid.port(1), uid.port(2), Bytes::from_static(b"ping")).unwrap();
        client.send(m.clone()).await.unwrap();
        assert_eq!(server.next().await.unwrap().unwrap(), m);
    }

    #[tokio::test]
    async fn connecting_to_an_unknown_name_is_refused() {
        let stack = InProcessStack::new();
        let err = stack.connect(&name("nobody")).await.err().unwrap();
        assert!(matches!(err, StackError::Refused(_)));
    }

    #[tokio::test]
    async fn a_name_has_one_listener_until_it_is_dropped() {
        let stack = InProcessStack::new();
        let first = stack.listen(&name("x")).await.unwrap();
        assert!(matches!(
            stack.listen(&name("x")).await.err().unwrap(),
            StackError::AddrInUse(_)
        ));
        drop(first);
        assert!(stack.listen(&name("x")).await.is_ok());
    }

    #[tokio::test]
    async fn socket_locators_are_not_for_mem() {
        let stack = InProcessStack::new();
        let err = stack
            .connect(&"127.0.0.1:1".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(matches!(err, StackError::UnsupportedLocator { .. }));
    }

    #[test]
    fn by_name_knows_mem() {
        assert_eq!(crate::by_name("mem").unwrap().name(), "mem");
        assert!(crate::by_name("carrier-pigeon").is_none());
    }
}
