//! Peer channels: JSON lines over TCP between daemons. We dial each
//! configured peer (and dial again when the channel breaks) to send our
//! requests and heartbeats; peers dial us to send theirs.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use uniplane_control::{Event, PeerMsg};

use super::{io_err, DaemonError, Input, Shared};
use crate::control::{conn_key, read_line, write_line, Answer, PeerRequest, MAX_LINE};

pub(super) async fn listen(shared: &Arc<Shared>) -> Result<(), DaemonError> {
    let addr = shared.config.peer_listen;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(io_err(format!("peer listener on {addr}")))?;
    let shared = shared.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            tokio::spawn(session(shared.clone(), stream));
        }
    });
    Ok(())
}

/// A channel a peer opened to us: its hello, heartbeats and requests.
async fn session(shared: Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    let mut from: Option<Ipv4Addr> = None;
    let seen = |server| {
        Input::Core(Event::PeerMessage {
            server,
            msg: PeerMsg::Heartbeat,
            request: 0,
        })
    };
    loop {
        let Ok(n) = read_line(&mut lines, &mut line).await else {
            break;
        };
        if n == 0 || line.len() > MAX_LINE {
            break;
        }
        let answer = match (serde_json::from_slice::<PeerRequest>(&line), from) {
            (Err(e), _) => Some(Answer::err("bad-request", e.to_string())),
            (Ok(PeerRequest::Hello { server, name }), _) => {
                tracing::info!(%server, name, "peer channel up");
                from = Some(server);
                shared.input(seen(server)).await;
                Some(Answer::ok(json!({ "server": shared.server })))
            }
            (Ok(_), None) => Some(Answer::err("bad-request", "hello first")),
            (Ok(PeerRequest::Heartbeat), Some(server)) => {
                shared.input(seen(server)).await;
                None
            }
            (Ok(PeerRequest::Connect { conn, class }), Some(server)) => {
                let (reply, rx) = oneshot::channel();
                shared
                    .input(Input::PeerConnect {
                        server,
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
            (Ok(PeerRequest::Close { conn }), Some(server)) => {
                shared
                    .input(Input::Core(Event::PeerMessage {
                        server,
                        msg: PeerMsg::Close {
                            conn: conn_key(conn),
                        },
                        request: 0,
                    }))
                    .await;
                None
            }
        };
        if let Some(a) = answer {
            if write_line(&mut write, &a).await.is_err() {
                break;
            }
        }
    }
}

/// Our channel to one peer, dialled again for as long as the daemon runs.
pub(super) async fn dial_loop(shared: Arc<Shared>, server: Ipv4Addr) {
    let pause = shared.config.heartbeat.max(Duration::from_millis(50));
    loop {
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

/// One life of our channel to `server`: hello, then what the core sends
/// (heartbeats included) out, and the peer's verdicts in.
async fn channel(shared: &Shared, server: Ipv4Addr) -> Result<(), String> {
    let address = shared
        .config
        .peers
        .iter()
        .find(|p| p.server == server)
        .ok_or("unknown peer")?
        .address;
    let stream = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(address))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let hello = PeerRequest::Hello {
        server: shared.server,
        name: shared.config.name.clone(),
    };
    write_line(&mut write, &hello)
        .await
        .map_err(|e| e.to_string())?;
    let reply = tokio::time::timeout(Duration::from_secs(2), lines.next_line())
        .await
        .map_err(|_| "no answer to hello".to_string())?
        .map_err(|e| e.to_string())?
        .ok_or("closed during hello")?;
    let a: Answer = serde_json::from_str(&reply).map_err(|e| e.to_string())?;
    if !a.ok {
        return Err(format!("peer refused hello: {:?}", a.error));
    }
    let (tx, mut rx) = mpsc::channel::<PeerRequest>(256);
    shared.input(Input::PeerUp { server, tx }).await;
    // The peer answers connects in order: verdicts match the oldest ask.
    let mut asked = VecDeque::new();
    loop {
        tokio::select! {
            req = rx.recv() => {
                // The core closed the channel (peer declared failed).
                let Some(req) = req else { return Ok(()) };
                if let PeerRequest::Connect { conn, .. } = &req {
                    asked.push_back(*conn);
                }
                write_line(&mut write, &req).await.map_err(|e| e.to_string())?;
            }
            line = lines.next_line() => {
                let line = line.map_err(|e| e.to_string())?.ok_or("peer closed the channel")?;
                let Some(conn) = asked.pop_front() else { continue };
                let verdict = match serde_json::from_str::<Answer>(&line) {
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
