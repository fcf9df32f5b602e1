//! Peer channels: JSON lines over TCP between daemons. We dial each
//! configured peer (and dial again when the channel breaks) to send our
//! requests and heartbeats; peers dial us to send theirs.
//!
//! Every channel opens with the cluster-secret handshake of
//! [`crate::auth`]: `hello` (the dialler's server ID and nonce), an answer
//! with the listener's nonce and proof, `prove` (the dialler's proof), and
//! a sealed answer. Nothing the dialler says is believed before its proof
//! checks; every later line in either direction is sealed, and a line
//! whose seal fails ends the channel. Handshakes are bounded in number and
//! in time, so connections that never prove anything hold nothing.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use uniplane_control::{Event, PeerMsg};

use super::{io_err, DaemonError, Input, Shared};
use crate::auth::{hex, nonce, tags_equal, unhex, Handshake, LineSeal, NONCE_LEN};
use crate::control::{conn_key, read_line, write_line, Answer, PeerRequest, MAX_LINE};

/// Handshakes in progress at once; more connections are closed at once.
const MAX_HANDSHAKES: usize = 32;
/// Time a dialler has to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

type Lines = BufReader<OwnedReadHalf>;

pub(super) async fn listen(shared: &Arc<Shared>) -> Result<(), DaemonError> {
    let addr = shared.config.peer_listen;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(io_err(format!("peer listener on {addr}")))?;
    let shared = shared.clone();
    let gate = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let Ok((stream, from)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Ok(permit) = gate.clone().try_acquire_owned() else {
                shared
                    .security
                    .refuse_peer(&from.to_string(), "too many handshakes at once");
                continue;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let authed = tokio::time::timeout(HANDSHAKE_TIMEOUT, accept(&shared, stream)).await;
                drop(permit);
                match authed {
                    Ok(Ok((server, seal, lines, write))) => {
                        session(shared, server, seal, lines, write).await
                    }
                    Ok(Err(why)) => shared.security.refuse_peer(&from.to_string(), &why),
                    Err(_) => shared
                        .security
                        .refuse_peer(&from.to_string(), "handshake timed out"),
                }
            });
        }
    });
    Ok(())
}

/// The listener's half of the handshake: who the dialler says it is, and
/// its proof that it holds the cluster secret.
async fn accept(
    shared: &Shared,
    stream: TcpStream,
) -> Result<(Ipv4Addr, LineSeal, Lines, OwnedWriteHalf), String> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    let refuse = |kind: &'static str, why: String| (Answer::err(kind, why.clone()), why);
    let outcome = async {
        let (server, dialler_nonce) = match next_request(&mut lines, &mut line).await? {
            PeerRequest::Hello { server, nonce, .. } => (server, nonce),
            _ => return Err(refuse("bad-request", "hello first".into())),
        };
        if shared.peer(server).is_none() {
            return Err(refuse(
                "refused",
                format!("{server} is not a peer of this server"),
            ));
        }
        let Some(secret) = shared.secret.as_ref() else {
            return Err(refuse(
                "refused",
                "this server has no cluster secret".into(),
            ));
        };
        let dialler_nonce = parse_nonce(&dialler_nonce)
            .ok_or_else(|| refuse("bad-request", "nonce: expected 32 hex digits".into()))?;
        let listener_nonce = nonce();
        let hs = Handshake::new(
            secret,
            "peer",
            &server.octets(),
            &shared.server.octets(),
            dialler_nonce,
            listener_nonce,
        );
        let challenge = Answer::ok(json!({
            "server": shared.server,
            "nonce": hex(&listener_nonce),
            "proof": hex(&hs.listener_proof()),
        }));
        write_line(&mut write, &challenge)
            .await
            .map_err(|e| refuse("refused", e.to_string()))?;
        let proof = match next_request(&mut lines, &mut line).await? {
            PeerRequest::Prove { proof } => proof,
            _ => return Err(refuse("bad-request", "prove second".into())),
        };
        let good = unhex(&proof).is_some_and(|p| tags_equal(&p, &hs.dialler_proof()));
        if !good {
            return Err(refuse(
                "unauthenticated",
                format!("{server} did not prove the cluster secret"),
            ));
        }
        Ok((server, LineSeal::new(hs.session_key(), false)))
    }
    .await;
    match outcome {
        Ok((server, mut seal)) => {
            write_sealed(&mut write, &mut seal, &Answer::ok(json!({})))
                .await
                .map_err(|e| e.to_string())?;
            Ok((server, seal, lines, write))
        }
        Err((answer, why)) => {
            let _ = write_line(&mut write, &answer).await;
            Err(why)
        }
    }
}

/// The next unsealed handshake request.
async fn next_request(
    lines: &mut Lines,
    line: &mut Vec<u8>,
) -> Result<PeerRequest, (Answer, String)> {
    let closed = |why: &str| (Answer::err("bad-request", why), why.to_owned());
    let n = read_line(lines, line)
        .await
        .map_err(|e| closed(&e.to_string()))?;
    if n == 0 {
        return Err(closed("closed during the handshake"));
    }
    if line.len() > MAX_LINE {
        return Err(closed("handshake line too long"));
    }
    serde_json::from_slice(line).map_err(|e| closed(&e.to_string()))
}

fn parse_nonce(text: &str) -> Option<[u8; NONCE_LEN]> {
    unhex(text)?.try_into().ok()
}

/// Writes `value` as one sealed line.
async fn write_sealed<T: Serialize>(
    write: &mut OwnedWriteHalf,
    seal: &mut LineSeal,
    value: &T,
) -> std::io::Result<()> {
    let body = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let mut line = seal.seal(&body);
    line.push(b'\n');
    write.write_all(&line).await
}

/// Why no sealed line came.
enum ReadError {
    /// The channel ended or failed.
    Ended(String),
    /// A line was refused: too long, or its seal failed.
    Refused(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Ended(why) | ReadError::Refused(why) => f.write_str(why),
        }
    }
}

/// Reads one sealed line into `buf` and opens it. Cancel-safe: a line
/// read in part stays in `buf` for the next call.
async fn read_sealed<'a>(
    lines: &mut Lines,
    buf: &'a mut Vec<u8>,
    seal: &mut LineSeal,
) -> Result<&'a [u8], ReadError> {
    loop {
        if buf.ends_with(b"\n") {
            break;
        }
        let room = (MAX_LINE + 1).saturating_sub(buf.len()) as u64;
        let n = lines
            .take(room)
            .read_until(b'\n', buf)
            .await
            .map_err(|e| ReadError::Ended(e.to_string()))?;
        if buf.ends_with(b"\n") {
            break;
        }
        if buf.len() > MAX_LINE {
            return Err(ReadError::Refused("line too long".into()));
        }
        if n == 0 {
            return Err(ReadError::Ended("the peer closed the channel".into()));
        }
    }
    let body_end = buf.len() - 1;
    seal.open(&buf[..body_end])
        .map_err(|e| ReadError::Refused(format!("sealed line: {e}")))
}

/// A channel a peer opened to us, after its proof: heartbeats and
/// requests.
async fn session(
    shared: Arc<Shared>,
    from: Ipv4Addr,
    mut seal: LineSeal,
    mut lines: Lines,
    mut write: OwnedWriteHalf,
) {
    tracing::info!(server = %from, "peer channel up");
    let seen = |server| {
        Input::Core(Event::PeerMessage {
            server,
            msg: PeerMsg::Heartbeat,
            request: 0,
        })
    };
    shared.input(seen(from)).await;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let req = match read_sealed(&mut lines, &mut buf, &mut seal).await {
            Ok(body) => serde_json::from_slice::<PeerRequest>(body),
            Err(ReadError::Ended(why)) => {
                tracing::debug!(server = %from, "peer channel ended: {why}");
                break;
            }
            Err(ReadError::Refused(why)) => {
                shared.security.refuse_peer(&from.to_string(), &why);
                break;
            }
        };
        let answer = match req {
            Err(e) => Some(Answer::err("bad-request", e.to_string())),
            Ok(PeerRequest::Hello { .. } | PeerRequest::Prove { .. }) => {
                Some(Answer::err("bad-request", "the handshake is over"))
            }
            Ok(PeerRequest::Heartbeat) => {
                shared.input(seen(from)).await;
                None
            }
            Ok(PeerRequest::Connect { conn, class }) => {
                let (reply, rx) = oneshot::channel();
                shared
                    .input(Input::PeerConnect {
                        server: from,
                        conn: conn_key(conn),
                        class,
                        reply,
                    })
                    .await;
                Some(match rx.await {
                    Ok(Ok(())) => Answer::ok(serde_json::to_value(conn).unwrap_or_default()),
                    Ok(Err(e)) => Answer::err(e.kind(), e.to_string()),
                    Err(_) => Answer::err("refused", "the daemon is stopping"),
                })
            }
            Ok(PeerRequest::Close { conn, status }) => {
                shared
                    .input(Input::Core(Event::PeerMessage {
                        server: from,
                        msg: PeerMsg::Close {
                            conn: conn_key(conn),
                            status: status.map_or(
                                uniplane_dataplane::wire::Status::Closed,
                                uniplane_dataplane::wire::Status::from_u8,
                            ),
                        },
                        request: 0,
                    }))
                    .await;
                None
            }
        };
        if let Some(a) = answer {
            if write_sealed(&mut write, &mut seal, &a).await.is_err() {
                break;
            }
        }
    }
}

/// Our channel to one peer, dialled again for as long as the daemon runs.
pub(super) async fn dial_loop(shared: Arc<Shared>, server: Ipv4Addr) {
    let pause = shared.config.heartbeat.max(Duration::from_millis(50));
    // Until the server is no peer any more (the directory's peers leave).
    while shared.peer(server).is_some() {
        match channel(&shared, server).await {
            Ok(()) => {}
            Err(e) => tracing::debug!(%server, "peer channel: {e}"),
        }
        shared
            .input(Input::Core(Event::PeerChannelDown { server }))
            .await;
        tokio::time::sleep(pause).await;
    }
}

/// The dialler's half of the handshake; the sealing of the channel.
async fn prove(
    shared: &Shared,
    server: Ipv4Addr,
    lines: &mut Lines,
    write: &mut OwnedWriteHalf,
) -> Result<LineSeal, String> {
    let secret = shared.secret.as_ref().ok_or("no cluster secret")?;
    let dialler_nonce = nonce();
    let hello = PeerRequest::Hello {
        server: shared.server,
        name: shared.config.name.clone(),
        nonce: hex(&dialler_nonce),
    };
    write_line(write, &hello).await.map_err(|e| e.to_string())?;
    let mut line = Vec::new();
    let n = read_line(lines, &mut line)
        .await
        .map_err(|e| e.to_string())?;
    if n == 0 || line.len() > MAX_LINE {
        return Err("no answer to hello".into());
    }
    let a: Answer = serde_json::from_slice(&line).map_err(|e| e.to_string())?;
    if !a.ok {
        return Err(format!("peer refused hello: {:?}", a.error));
    }
    let result = a.result.unwrap_or_default();
    let field = |name: &str| result.get(name).and_then(|v| v.as_str()).unwrap_or("");
    if field("server") != server.to_string() {
        return Err(format!("the peer says it is {}", field("server")));
    }
    let listener_nonce = parse_nonce(field("nonce")).ok_or("the peer's nonce is malformed")?;
    let hs = Handshake::new(
        secret,
        "peer",
        &shared.server.octets(),
        &server.octets(),
        dialler_nonce,
        listener_nonce,
    );
    let proved = unhex(field("proof")).is_some_and(|p| tags_equal(&p, &hs.listener_proof()));
    if !proved {
        shared
            .security
            .refuse_peer(&server.to_string(), "did not prove the cluster secret");
        return Err("the peer did not prove the cluster secret".into());
    }
    let prove = PeerRequest::Prove {
        proof: hex(&hs.dialler_proof()),
    };
    write_line(write, &prove).await.map_err(|e| e.to_string())?;
    let mut seal = LineSeal::new(hs.session_key(), true);
    let mut buf = Vec::new();
    let body = read_sealed(lines, &mut buf, &mut seal)
        .await
        .map_err(|e| e.to_string())?;
    let a: Answer = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if !a.ok {
        return Err(format!("peer refused our proof: {:?}", a.error));
    }
    Ok(seal)
}

/// One life of our channel to `server`: the handshake, then what the core
/// sends (heartbeats included) out, and the peer's verdicts in.
async fn channel(shared: &Shared, server: Ipv4Addr) -> Result<(), String> {
    let address = shared.peer(server).ok_or("unknown peer")?.address;
    let stream = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(address))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut seal = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        prove(shared, server, &mut lines, &mut write),
    )
    .await
    .map_err(|_| "handshake timed out".to_string())??;
    let (tx, mut rx) = mpsc::channel::<PeerRequest>(256);
    shared.input(Input::PeerUp { server, tx }).await;
    // The peer answers connects in order: verdicts match the oldest ask.
    let mut asked = VecDeque::new();
    let mut buf = Vec::new();
    loop {
        tokio::select! {
            req = rx.recv() => {
                // The core closed the channel (peer declared failed).
                let Some(req) = req else { return Ok(()) };
                if let PeerRequest::Connect { conn, .. } = &req {
                    asked.push_back(*conn);
                }
                write_sealed(&mut write, &mut seal, &req).await.map_err(|e| e.to_string())?;
            }
            body = read_sealed(&mut lines, &mut buf, &mut seal) => {
                let body = match body {
                    Ok(body) => body,
                    Err(ReadError::Refused(why)) => {
                        shared.security.refuse_peer(&server.to_string(), &why);
                        return Err(why);
                    }
                    Err(ReadError::Ended(why)) => return Err(why),
                };
                let answer = serde_json::from_slice::<Answer>(body);
                buf.clear();
                let Some(conn) = asked.pop_front() else { continue };
                let verdict = match answer {
                    Ok(a) if a.ok => Ok(()),
                    Ok(a) => Err(a.error.map(|e| e.message).unwrap_or_default()),
                    Err(e) => Err(e.to_string()),
                };
                shared
                    .input(Input::Core(Event::PeerVerdict {
                        server,
                        conn: conn_key(conn),
                        verdict,
                    }))
                    .await;
            }
        }
    }
}
