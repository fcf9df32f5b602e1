//! Which servers are peers, from the directory's server records: a
//! sans-IO state machine on virtual time.
//!
//! A record that appears makes its server a peer; one that goes makes it
//! leave — but only after `grace` without coming back, because a record
//! also goes when its daemon merely lost its lease (a partition between
//! it and etcd) and claims it again moments later, and heartbeats, not
//! the directory, are the fast path for failures. A record whose peer
//! address or tunnel endpoints changed is a new daemon at another place:
//! the old peer leaves and the new one joins. A full listing (after the
//! watch broke) replaces what was known: what it lacks leaves, with the
//! same grace.

use std::collections::{BTreeMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Most tunnel endpoints one record may list.
const MAX_TUNNELS: usize = 16;

/// A server's record in the directory, as this daemon reads it (the
/// daemon's name, where its peer channel and its stacks' tunnel
/// listeners are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRecord {
    /// Its daemon's name.
    pub name: String,
    /// Where its daemon's peer channel listens.
    pub peer_listen: SocketAddr,
    /// Each IP stack's tunnel listener.
    pub tunnels: BTreeMap<String, SocketAddr>,
}

impl ServerRecord {
    /// The record's JSON, as this daemon writes it.
    pub fn to_json(&self, pid: u32) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "peer_listen": self.peer_listen.to_string(),
            "tunnels": self.tunnels.iter().map(|(k, v)| (k.clone(), v.to_string())).collect::<BTreeMap<_, _>>(),
            "pid": pid,
        })
    }

    /// Reads a record another daemon wrote; anything malformed is refused
    /// with the reason (the directory is outside this process).
    pub fn parse(bytes: &[u8]) -> Result<ServerRecord, String> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let name = v["name"]
            .as_str()
            .filter(|n| n.len() <= 128)
            .ok_or("no name")?
            .to_owned();
        let peer_listen = v["peer_listen"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .ok_or("no peer_listen address")?;
        let mut tunnels = BTreeMap::new();
        if let Some(map) = v["tunnels"].as_object() {
            if map.len() > MAX_TUNNELS {
                return Err(format!("more than {MAX_TUNNELS} tunnels"));
            }
            for (stack, addr) in map {
                let addr: SocketAddr = addr
                    .as_str()
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| format!("tunnel `{stack}`: not an address"))?;
                tunnels.insert(stack.chars().take(32).collect(), addr);
            }
        }
        Ok(ServerRecord {
            name,
            peer_listen,
            tunnels,
        })
    }

    fn same_place(&self, other: &ServerRecord) -> bool {
        self.peer_listen == other.peer_listen && self.tunnels == other.tunnels
    }
}

/// What the directory said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RosterEvent {
    /// Every record there is now (the watch started or restarted).
    Listed(Vec<(Ipv4Addr, ServerRecord)>),
    /// A record was written.
    Put(Ipv4Addr, ServerRecord),
    /// A record went.
    Delete(Ipv4Addr),
}

/// What changes in the peer set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RosterAction {
    /// The server is a peer now.
    Join(Ipv4Addr, ServerRecord),
    /// The server is no peer any more.
    Leave(Ipv4Addr),
}

#[derive(Debug)]
struct Known {
    record: ServerRecord,
    /// When it leaves unless its record comes back.
    leaving_at: Option<Duration>,
}

/// The peer set the directory describes (see the module documentation).
#[derive(Debug)]
pub struct Roster {
    me: Ipv4Addr,
    grace: Duration,
    max: usize,
    now: Duration,
    known: BTreeMap<Ipv4Addr, Known>,
    actions: VecDeque<RosterAction>,
}

impl Roster {
    /// The roster of server `me` (never its own peer), keeping at most
    /// `max` servers.
    pub fn new(me: Ipv4Addr, grace: Duration, max: usize) -> Roster {
        Roster {
            me,
            grace,
            max,
            now: Duration::ZERO,
            known: BTreeMap::new(),
            actions: VecDeque::new(),
        }
    }

    /// Takes what the directory said at `now`.
    pub fn handle(&mut self, event: RosterEvent, now: Duration) {
        self.now = self.now.max(now);
        match event {
            RosterEvent::Put(server, record) => self.put(server, record),
            RosterEvent::Delete(server) => self.delete(server),
            RosterEvent::Listed(list) => {
                let listed: Vec<Ipv4Addr> = list.iter().map(|(s, _)| *s).collect();
                let gone: Vec<Ipv4Addr> = self
                    .known
                    .keys()
                    .filter(|s| !listed.contains(s))
                    .copied()
                    .collect();
                for s in gone {
                    self.delete(s);
                }
                for (s, r) in list {
                    self.put(s, r);
                }
            }
        }
    }

    /// Lets servers whose grace ran out leave.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.now = self.now.max(now);
        let due: Vec<Ipv4Addr> = self
            .known
            .iter()
            .filter(|(_, k)| k.leaving_at.is_some_and(|t| t <= self.now))
            .map(|(s, _)| *s)
            .collect();
        for s in due {
            self.known.remove(&s);
            self.actions.push_back(RosterAction::Leave(s));
        }
    }

    /// When [`Roster::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.known.values().filter_map(|k| k.leaving_at).min()
    }

    /// The next change.
    pub fn poll_action(&mut self) -> Option<RosterAction> {
        self.actions.pop_front()
    }

    fn put(&mut self, server: Ipv4Addr, record: ServerRecord) {
        if server == self.me {
            return;
        }
        let full = self.known.len() >= self.max;
        match self.known.get_mut(&server) {
            Some(k) if k.record.same_place(&record) => {
                k.leaving_at = None;
                k.record = record;
                return;
            }
            // Somewhere else now: the old peer goes, the new one comes.
            Some(_) => self.actions.push_back(RosterAction::Leave(server)),
            None if full => {
                tracing::warn!(%server, max = self.max, "directory: server not taken as a peer: too many");
                return;
            }
            None => {}
        }
        self.actions
            .push_back(RosterAction::Join(server, record.clone()));
        self.known.insert(
            server,
            Known {
                record,
                leaving_at: None,
            },
        );
    }

    fn delete(&mut self, server: Ipv4Addr) {
        if let Some(k) = self.known.get_mut(&server) {
            if k.leaving_at.is_none() {
                k.leaving_at = Some(self.now + self.grace);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn record(port: u16) -> ServerRecord {
        ServerRecord {
            name: "b".into(),
            peer_listen: SocketAddr::from(([127, 0, 0, 1], port)),
            tunnels: [(
                "tcp".to_owned(),
                SocketAddr::from(([127, 0, 0, 1], port + 1)),
            )]
            .into_iter()
            .collect(),
        }
    }

    fn drain(r: &mut Roster) -> Vec<RosterAction> {
        std::iter::from_fn(|| r.poll_action()).collect()
    }

    const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn a_record_that_goes_and_comes_back_within_the_grace_changes_nothing() {
        let mut r = Roster::new(ME, 3 * S, 100);
        r.handle(RosterEvent::Put(ME, record(1)), Duration::ZERO);
        r.handle(RosterEvent::Put(B, record(7000)), Duration::ZERO);
        assert_eq!(drain(&mut r), vec![RosterAction::Join(B, record(7000))]);
        r.handle(RosterEvent::Delete(B), S);
        assert_eq!(r.poll_timeout(), Some(4 * S));
        r.handle(RosterEvent::Put(B, record(7000)), 2 * S);
        r.handle_timeout(5 * S);
        assert_eq!(drain(&mut r), vec![]);
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn a_record_gone_for_the_grace_leaves() {
        let mut r = Roster::new(ME, 3 * S, 100);
        r.handle(RosterEvent::Put(B, record(7000)), Duration::ZERO);
        drain(&mut r);
        r.handle(RosterEvent::Delete(B), S);
        r.handle_timeout(4 * S - Duration::from_millis(1));
        assert_eq!(drain(&mut r), vec![]);
        r.handle_timeout(4 * S);
        assert_eq!(drain(&mut r), vec![RosterAction::Leave(B)]);
    }

    #[test]
    fn a_daemon_at_another_place_replaces_the_old_one() {
        let mut r = Roster::new(ME, 3 * S, 100);
        r.handle(RosterEvent::Put(B, record(7000)), Duration::ZERO);
        drain(&mut r);
        r.handle(RosterEvent::Put(B, record(8000)), S);
        assert_eq!(
            drain(&mut r),
            vec![RosterAction::Leave(B), RosterAction::Join(B, record(8000))]
        );
    }

    #[test]
    fn a_listing_replaces_what_was_known_with_the_same_grace() {
        let mut r = Roster::new(ME, 3 * S, 100);
        let c = Ipv4Addr::new(10, 0, 0, 3);
        r.handle(RosterEvent::Put(B, record(7000)), Duration::ZERO);
        drain(&mut r);
        r.handle(RosterEvent::Listed(vec![(c, record(9000))]), S);
        assert_eq!(drain(&mut r), vec![RosterAction::Join(c, record(9000))]);
        r.handle_timeout(4 * S);
        assert_eq!(drain(&mut r), vec![RosterAction::Leave(B)]);
    }

    #[test]
    fn the_roster_is_bounded() {
        let mut r = Roster::new(ME, S, 2);
        for i in 2..10 {
            r.handle(
                RosterEvent::Put(Ipv4Addr::new(10, 0, 0, i), record(7000)),
                Duration::ZERO,
            );
        }
        assert_eq!(drain(&mut r).len(), 2);
    }

    #[test]
    fn records_from_the_directory_are_validated() {
        let good = record(7000).to_json(1).to_string();
        assert_eq!(ServerRecord::parse(good.as_bytes()).unwrap(), record(7000));
        for bad in [
            "nope",
            "{}",
            r#"{"name":"b","peer_listen":"x"}"#,
            r#"{"name":"b","peer_listen":"127.0.0.1:1","tunnels":{"tcp":7}}"#,
        ] {
            assert!(ServerRecord::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
