//! The naming service's driver: [`Claims`] carried out against an etcd
//! cluster with the `etcd-client` crate.
//!
//! Layout under the configured prefix `P`:
//!
//! | key | value | lease |
//! |---|---|---|
//! | `P/servers/<server ID>` | `{"name", "peer_listen", "started"}` (JSON) | the daemon's |
//! | `P/names/<name>` | the UID, `A.B.C.D:DEVICE` | its daemon's |
//!
//! One task runs the [`Claims`] state machine; each etcd request it asks
//! for runs in a task of its own, bounded by the configured timeout, and
//! reports back — so a slow or partitioned cluster delays names, never the
//! daemon's driver or its data path.

use std::collections::HashMap;
use std::time::Duration;

use std::net::Ipv4Addr;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::{mpsc, oneshot};
use uniplane_dataplane::Uid;

use super::roster::{RosterEvent, ServerRecord};
use super::{
    ClaimOutcome, Claims, ClaimsConfig, LeaseId, NamingAction, NamingError, NamingEvent,
    NamingView, Waiter,
};
use crate::config::EtcdConfig;

/// Why the naming service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file the configuration names could not be read.
    #[error("registry: reading {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The client could not be set up (a bad certificate, say).
    #[error("registry: {0}")]
    Client(String),
}

/// What the rest of the daemon asks of the naming task.
enum Cmd {
    Want {
        key: String,
        value: String,
        keep: bool,
        reply: Option<oneshot::Sender<Result<(), NamingError>>>,
    },
    Drop {
        key: String,
    },
    View(oneshot::Sender<NamingView>),
}

/// A server as the directory lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ServerEntry {
    /// Its server ID.
    pub server: String,
    /// What it registered (JSON text).
    pub record: serde_json::Value,
    /// Its lease and the seconds the lease has left.
    pub lease: i64,
    /// Seconds left on the lease (−1 when it could not be asked).
    pub ttl_s: i64,
}

/// A name as the directory lists it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NameEntry {
    /// The name.
    pub name: String,
    /// The UID it stands for.
    pub uid: String,
    /// Its owner's lease.
    pub lease: i64,
}

/// The whole directory, for `uniplane cluster status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Listing {
    /// Registered servers.
    pub servers: Vec<ServerEntry>,
    /// Claimed names.
    pub names: Vec<NameEntry>,
}

/// A handle on the naming service of one daemon.
#[derive(Clone)]
pub struct Etcd {
    tx: mpsc::Sender<Cmd>,
    client: Client,
    prefix: String,
    timeout: Duration,
}

impl Etcd {
    /// Sets up the client and starts the naming task on the current
    /// runtime. Nothing waits for the cluster: an unreachable one shows
    /// as failed claims, retried.
    pub async fn start(config: &EtcdConfig) -> Result<Etcd, StartError> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| StartError::File {
                path: path.display().to_string(),
                source,
            })
        };
        let mut options = ConnectOptions::new()
            .with_timeout(config.timeout)
            .with_connect_timeout(config.timeout)
            .with_keep_alive(config.timeout, config.timeout);
        if let Some((user, file)) = &config.credentials {
            let password = String::from_utf8(read(file)?)
                .map_err(|_| StartError::Client(format!("{}: not UTF-8", file.display())))?;
            options = options.with_user(user.clone(), password.trim_end().to_owned());
        }
        if let Some(ca) = &config.ca {
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(ca)?));
            if let Some((cert, key)) = &config.identity {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(domain) = &config.domain {
                tls = tls.domain_name(domain.clone());
            }
            options = options.with_tls(tls);
        }
        // With credentials the client asks for a token when it connects;
        // without, it connects lazily and fails per request.
        let client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(|e| StartError::Client(e.to_string()))?;
        let (tx, rx) = mpsc::channel(1024);
        let claims = Claims::new(ClaimsConfig {
            ttl: config.lease_ttl,
            ..ClaimsConfig::default()
        });
        let task = Task {
            claims,
            client: client.clone(),
            prefix: config.prefix.clone(),
            timeout: config.timeout,
            started: tokio::time::Instant::now(),
            waiters: HashMap::new(),
            next_waiter: 1,
        };
        tokio::spawn(task.run(rx));
        Ok(Etcd {
            tx,
            client,
            prefix: config.prefix.clone(),
            timeout: config.timeout,
        })
    }

    /// Claims `key` (relative to the prefix) with `value`; the first
    /// outcome. `keep`: retried after a failure until held.
    pub async fn claim(&self, key: String, value: String, keep: bool) -> Result<(), NamingError> {
        let (reply, rx) = oneshot::channel();
        let cmd = Cmd::Want {
            key,
            value,
            keep,
            reply: Some(reply),
        };
        if self.tx.send(cmd).await.is_err() {
            return Err(NamingError::Unavailable("the naming task ended".into()));
        }
        rx.await
            .unwrap_or_else(|_| Err(NamingError::Unavailable("the naming task ended".into())))
    }

    /// Holds `key` with `value` from now on, retrying until it is held;
    /// nobody waits.
    pub async fn keep(&self, key: String, value: String) {
        let _ = self
            .tx
            .send(Cmd::Want {
                key,
                value,
                keep: true,
                reply: None,
            })
            .await;
    }

    /// Stops holding `key` (deleted if it is still ours).
    pub async fn release(&self, key: String) {
        let _ = self.tx.send(Cmd::Drop { key }).await;
    }

    /// How this daemon's claims stand.
    pub async fn view(&self) -> Option<NamingView> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Cmd::View(tx)).await.ok()?;
        rx.await.ok()
    }

    /// The UID `name` stands for in the directory.
    pub async fn resolve(&self, name: &str) -> Result<Uid, NamingError> {
        super::check_name(name)?;
        let key = format!("{}/{}", self.prefix, name_key(name));
        let mut client = self.client.clone();
        let got = tokio::time::timeout(self.timeout, client.get(key, None))
            .await
            .map_err(|_| NamingError::Unavailable("no answer in time".into()))?
            .map_err(|e| NamingError::Unavailable(e.to_string()))?;
        let kv = got
            .kvs()
            .first()
            .ok_or_else(|| NamingError::NotFound(name.to_owned()))?;
        let text = kv.value_str().unwrap_or_default();
        text.parse().map_err(|_| {
            NamingError::Unavailable(format!(
                "the directory holds `{text}` for `{name}`, not a UID"
            ))
        })
    }

    /// Every server and name in the directory.
    pub async fn list(&self) -> Result<Listing, NamingError> {
        let unavailable = |e: etcd_client::Error| NamingError::Unavailable(e.to_string());
        let late = |_| NamingError::Unavailable("no answer in time".into());
        let mut client = self.client.clone();
        let get = |client: &mut Client, what: &str| {
            let key = format!("{}/{what}/", self.prefix);
            let mut c = client.clone();
            async move {
                tokio::time::timeout(
                    self.timeout,
                    c.get(key, Some(GetOptions::new().with_prefix())),
                )
                .await
            }
        };
        let servers = get(&mut client, "servers")
            .await
            .map_err(late)?
            .map_err(unavailable)?;
        let names = get(&mut client, "names")
            .await
            .map_err(late)?
            .map_err(unavailable)?;
        let strip = |key: &[u8], what: &str| {
            let key = String::from_utf8_lossy(key).into_owned();
            key.strip_prefix(&format!("{}/{what}/", self.prefix))
                .map(str::to_owned)
                .unwrap_or(key)
        };
        let mut listing = Listing {
            servers: Vec::new(),
            names: Vec::new(),
        };
        for kv in servers.kvs() {
            let ttl = match tokio::time::timeout(
                self.timeout,
                client.lease_time_to_live(kv.lease(), None),
            )
            .await
            {
                Ok(Ok(r)) => r.ttl(),
                _ => -1,
            };
            listing.servers.push(ServerEntry {
                server: strip(kv.key(), "servers"),
                record: serde_json::from_slice(kv.value()).unwrap_or(serde_json::Value::Null),
                lease: kv.lease(),
                ttl_s: ttl,
            });
        }
        for kv in names.kvs() {
            listing.names.push(NameEntry {
                name: strip(kv.key(), "names"),
                uid: kv.value_str().unwrap_or_default().to_owned(),
                lease: kv.lease(),
            });
        }
        Ok(listing)
    }
}

impl Etcd {
    /// Watches the servers' records: a full listing first and after every
    /// break of the watch (with a back-off), then each change. Records
    /// that do not parse are left out and logged. Ends when the receiver
    /// is dropped.
    pub fn watch_servers(&self) -> mpsc::Receiver<RosterEvent> {
        let (tx, rx) = mpsc::channel(256);
        let this = self.clone();
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(200);
            loop {
                match this.list_and_watch(&tx).await {
                    Ok(()) => return,
                    Err(e) => tracing::debug!("naming: watching the servers: {e}"),
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        });
        rx
    }

    /// One listing and the watch after it, until it breaks (`Err`) or
    /// nobody listens (`Ok`).
    async fn list_and_watch(&self, tx: &mpsc::Sender<RosterEvent>) -> Result<(), String> {
        let prefix = format!("{}/servers/", self.prefix);
        let mut client = self.client.clone();
        let listed = bounded(
            self.timeout,
            client.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let revision = listed.header().map_or(0, |h| h.revision());
        let parse = |key: &[u8], value: &[u8]| -> Option<(Ipv4Addr, ServerRecord)> {
            let key = String::from_utf8_lossy(key);
            let server: Ipv4Addr = key.strip_prefix(&prefix)?.parse().ok()?;
            match ServerRecord::parse(value) {
                Ok(r) => Some((server, r)),
                Err(e) => {
                    tracing::warn!(%server, "naming: a malformed server record is ignored: {e}");
                    None
                }
            }
        };
        let list = listed
            .kvs()
            .iter()
            .filter_map(|kv| parse(kv.key(), kv.value()))
            .collect();
        if tx.send(RosterEvent::Listed(list)).await.is_err() {
            return Ok(());
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1)
            .with_progress_notify();
        let mut stream = bounded(self.timeout, client.watch(prefix.clone(), Some(options))).await?;
        loop {
            let Some(r) = stream.message().await.map_err(|e| e.to_string())? else {
                return Err("the watch ended".into());
            };
            if r.canceled() {
                return Err(format!("the watch was cancelled: {}", r.cancel_reason()));
            }
            for e in r.events() {
                let Some(kv) = e.kv() else { continue };
                let event = match e.event_type() {
                    EventType::Put => match parse(kv.key(), kv.value()) {
                        Some((s, record)) => RosterEvent::Put(s, record),
                        None => continue,
                    },
                    EventType::Delete => {
                        let key = String::from_utf8_lossy(kv.key());
                        match key.strip_prefix(&prefix).and_then(|s| s.parse().ok()) {
                            Some(s) => RosterEvent::Delete(s),
                            None => continue,
                        }
                    }
                };
                if tx.send(event).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// The key of a name, relative to the prefix.
pub fn name_key(name: &str) -> String {
    format!("names/{name}")
}

/// The key of a server's record, relative to the prefix.
pub fn server_key(server: std::net::Ipv4Addr) -> String {
    format!("servers/{server}")
}

struct Task {
    claims: Claims,
    client: Client,
    prefix: String,
    timeout: Duration,
    started: tokio::time::Instant,
    waiters: HashMap<Waiter, oneshot::Sender<Result<(), NamingError>>>,
    next_waiter: Waiter,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let (done_tx, mut done) = mpsc::channel::<NamingEvent>(256);
        loop {
            let wake = self
                .claims
                .poll_timeout()
                .map(|t| self.started + t)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                cmd = rx.recv() => {
                    let Some(cmd) = cmd else { break };
                    self.command(cmd);
                }
                Some(event) = done.recv() => {
                    let now = self.now();
                    self.claims.handle(event, now);
                }
                _ = tokio::time::sleep_until(wake) => {
                    let now = self.now();
                    self.claims.handle_timeout(now);
                }
            }
            while let Some(action) = self.claims.poll_action() {
                self.act(action, &done_tx);
            }
        }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn command(&mut self, cmd: Cmd) {
        let now = self.now();
        match cmd {
            Cmd::Want {
                key,
                value,
                keep,
                reply,
            } => {
                let waiter = reply.map(|r| {
                    let id = self.next_waiter;
                    self.next_waiter += 1;
                    self.waiters.insert(id, r);
                    id
                });
                self.claims.handle(
                    NamingEvent::Want {
                        key,
                        value,
                        waiter,
                        keep,
                    },
                    now,
                );
            }
            Cmd::Drop { key } => self.claims.handle(NamingEvent::Drop { key }, now),
            Cmd::View(reply) => {
                let _ = reply.send(self.claims.view());
            }
        }
    }

    /// Carries out one action in a task of its own; its outcome comes
    /// back on `done`.
    fn act(&mut self, action: NamingAction, done: &mpsc::Sender<NamingEvent>) {
        let mut client = self.client.clone();
        let timeout = self.timeout;
        let full = |key: &str| format!("{}/{key}", self.prefix);
        let done = done.clone();
        match action {
            NamingAction::Answer { waiter, result } => {
                if let Some(reply) = self.waiters.remove(&waiter) {
                    let _ = reply.send(result);
                }
            }
            NamingAction::GrantLease { ttl } => {
                tokio::spawn(async move {
                    let secs = ttl.as_secs().max(1) as i64;
                    let event = match bounded(timeout, client.lease_grant(secs, None)).await {
                        Ok(r) => NamingEvent::LeaseGranted {
                            lease: r.id(),
                            ttl: Duration::from_secs(r.ttl().max(1) as u64),
                        },
                        Err(error) => NamingEvent::LeaseFailed { error },
                    };
                    let _ = done.send(event).await;
                });
            }
            NamingAction::KeepAlive { lease } => {
                tokio::spawn(async move {
                    let event = match bounded(timeout, keep_alive(&mut client, lease)).await {
                        Ok(ttl) if ttl > 0 => NamingEvent::KeptAlive {
                            lease,
                            ttl: Duration::from_secs(ttl as u64),
                        },
                        Ok(_) => NamingEvent::KeepAliveFailed {
                            lease,
                            gone: true,
                            error: "the lease expired".into(),
                        },
                        Err(error) => NamingEvent::KeepAliveFailed {
                            lease,
                            gone: error.contains("requested lease not found"),
                            error,
                        },
                    };
                    let _ = done.send(event).await;
                });
            }
            NamingAction::Claim {
                key,
                value,
                lease,
                previous,
            } => {
                let path = full(&key);
                tokio::spawn(async move {
                    let claim = claim(&mut client, &path, &value, lease, previous);
                    let outcome = match bounded(timeout, claim).await {
                        Ok(outcome) => outcome,
                        Err(error) => ClaimOutcome::Failed(error),
                    };
                    let _ = done
                        .send(NamingEvent::Claimed {
                            key,
                            lease,
                            outcome,
                        })
                        .await;
                });
            }
            NamingAction::Release { key, lease } => {
                let path = full(&key);
                tokio::spawn(async move {
                    // Deleted only while it is still ours; a failure leaves it
                    // to the lease.
                    let txn = Txn::new()
                        .when([Compare::lease(path.clone(), CompareOp::Equal, lease)])
                        .and_then([TxnOp::delete(path, None)]);
                    if let Err(e) = bounded(timeout, client.txn(txn)).await {
                        tracing::debug!("naming: release: {e}");
                    }
                });
            }
        }
    }
}

/// `f` with a deadline; errors as text.
async fn bounded<T, E: std::fmt::Display>(
    timeout: Duration,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// One renewal of `lease`: the TTL it has now (0: gone).
async fn keep_alive(client: &mut Client, lease: LeaseId) -> Result<i64, etcd_client::Error> {
    let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
    keeper.keep_alive().await?;
    match stream.message().await? {
        Some(r) => Ok(r.ttl()),
        None => Ok(0),
    }
}

/// Creates `path` = `value` under `lease` if it does not exist; held too
/// when it already holds exactly that under that lease (a claim repeated
/// after its answer was lost), and taken back when it is still attached
/// to `previous`, this daemon's own lost lease.
async fn claim(
    client: &mut Client,
    path: &str,
    value: &str,
    lease: LeaseId,
    previous: Option<LeaseId>,
) -> Result<ClaimOutcome, etcd_client::Error> {
    let put = || TxnOp::put(path, value, Some(PutOptions::new().with_lease(lease)));
    let txn = Txn::new()
        .when([Compare::create_revision(path, CompareOp::Equal, 0)])
        .and_then([put()])
        .or_else([TxnOp::get(path, None)]);
    let r = client.txn(txn).await?;
    if r.succeeded() {
        return Ok(ClaimOutcome::Held);
    }
    let Some((held, held_lease)) = first_kv(&r) else {
        // Deleted between the compare and the get: try again later.
        return Ok(ClaimOutcome::Failed(
            "the key changed during the claim".into(),
        ));
    };
    if held_lease == lease && held == value {
        return Ok(ClaimOutcome::Held);
    }
    if previous.is_some_and(|p| p == held_lease) {
        let txn = Txn::new()
            .when([Compare::lease(path, CompareOp::Equal, held_lease)])
            .and_then([put()])
            .or_else([TxnOp::get(path, None)]);
        let r = client.txn(txn).await?;
        if r.succeeded() {
            return Ok(ClaimOutcome::Held);
        }
        return Ok(match first_kv(&r) {
            Some((held, _)) => ClaimOutcome::Taken(held),
            None => ClaimOutcome::Failed("the key changed during the claim".into()),
        });
    }
    Ok(ClaimOutcome::Taken(held))
}

/// The value and lease of the key a transaction's failure branch read.
fn first_kv(r: &etcd_client::TxnResponse) -> Option<(String, LeaseId)> {
    r.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .map(|kv| (kv.value_str().unwrap_or_default().to_owned(), kv.lease())),
        _ => None,
    })
}
