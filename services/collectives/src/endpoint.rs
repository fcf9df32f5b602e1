//! What the operator endpoints ([`crate::operator`], [`crate::compress`])
//! share: each is a resource of its own that accepts ranks' connections
//! and serves them from one task, fed by one small task per connection
//! that moves its frames in and the endpoint's answers out.

use bytes::Bytes;
use tokio::sync::mpsc;
use uniplane_client::Connection;

/// What a connection's task tells the endpoint.
pub(crate) enum Event {
    /// Connection `index` was accepted; answers to it go on the sender.
    Joined(usize, mpsc::Sender<Bytes>),
    /// A frame arrived on connection `index`.
    Frame(usize, Bytes),
    /// Connection `index` ended.
    Left(usize),
}

/// Answers queued per connection before its task pushes back.
const QUEUED: usize = 64;

/// Starts serving the accepted connection `index`: [`Event::Joined`]
/// first, then its frames, then [`Event::Left`] on `events`.
pub(crate) async fn join(index: usize, conn: Connection, events: &mpsc::Sender<Event>) {
    let (tx, rx) = mpsc::channel(QUEUED);
    let _ = events.send(Event::Joined(index, tx)).await;
    tokio::spawn(connection(index, conn, rx, events.clone()));
}

/// Moves one connection: frames in to the endpoint, answers out.
async fn connection(
    me: usize,
    mut conn: Connection,
    mut out: mpsc::Receiver<Bytes>,
    events: mpsc::Sender<Event>,
) {
    loop {
        tokio::select! {
            m = conn.recv() => match m {
                Some(Ok(m)) => {
                    if events.send(Event::Frame(me, m.payload().clone())).await.is_err() {
                        break;
                    }
                }
                _ => break,
            },
            b = out.recv() => match b {
                Some(b) => {
                    if conn.send_bytes(b).await.is_err() {
                        break;
                    }
                }
                None => break,
            },
        }
    }
    let _ = events.send(Event::Left(me)).await;
}
