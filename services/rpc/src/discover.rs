//! Discovery from the daemon's registry: the local resources whose name
//! matches, as tower [`Change`]s of connected [`Client`]s, so
//! `tower::balance::p2c::Balance` spreads calls over them (their
//! [`tower::load::Load`] is their calls in flight).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use tower::discover::Change;
use tower::Service;
use uniplane_client::protocol::Request;
use uniplane_client::Session;
use uniplane_dataplane::Uid;

use crate::{Client, ClientOptions, Connector, Status};

struct State {
    session: Arc<Session>,
    connector: Connector,
    matches: Box<dyn Fn(&str) -> bool + Send>,
    every: Duration,
    known: HashSet<Uid>,
    ready: VecDeque<Change<Uid, Client>>,
    first: bool,
}

/// Watches the registry of `session`'s daemon every `every`: a resource
/// whose name `matches` appears as `Change::Insert` (a [`Client`] to its
/// `port`), one that left as `Change::Remove`. A resource that refuses
/// the connection is tried again at the next look.
pub fn registry(
    session: Arc<Session>,
    matches: impl Fn(&str) -> bool + Send + 'static,
    port: u16,
    options: ClientOptions,
    every: Duration,
) -> impl Stream<Item = Result<Change<Uid, Client>, Status>> + Send {
    let state = State {
        connector: Connector::new(session.clone(), port, options),
        session,
        matches: Box::new(matches),
        every,
        known: HashSet::new(),
        ready: VecDeque::new(),
        first: true,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(change) = s.ready.pop_front() {
                return Some((Ok(change), s));
            }
            if !s.first {
                tokio::time::sleep(s.every).await;
            }
            s.first = false;
            let listed = match s.session.client().request(&Request::Resources).await {
                Ok(v) => v,
                Err(e) => {
                    let status = Status::unavailable(format!("the daemon's registry: {e}"));
                    return Some((Err(status), s));
                }
            };
            let now: HashSet<Uid> = listed
                .as_array()
                .into_iter()
                .flatten()
                .filter(|r| r["name"].as_str().is_some_and(|n| (s.matches)(n)))
                .filter_map(|r| r["uid"].as_str()?.parse().ok())
                .collect();
            let gone: Vec<Uid> = s.known.difference(&now).copied().collect();
            for uid in gone {
                s.known.remove(&uid);
                s.ready.push_back(Change::Remove(uid));
            }
            let new: Vec<Uid> = now.difference(&s.known).copied().collect();
            for uid in new {
                if let Ok(client) = Service::<Uid>::call(&mut s.connector, uid).await {
                    s.known.insert(uid);
                    s.ready.push_back(Change::Insert(uid, client));
                }
            }
        }
    })
}
