//! The control socket: one session per connected client, one JSON line
//! per request and per answer. Listings are read from the driver; every
//! request that changes something is the core's to decide.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::BufReader;
use tokio::net::{UnixListener, UnixStream};
use uniplane_control::{ClientRequest, ControlError, Reply};

use super::driver::client;
use super::observe;
use super::{io_err, DaemonError, Shared, CONTROL_SOCKET, DATA_SOCKET};
use crate::control::{
    conn_key, conn_spec, decode_request, read_line, write_line, Answer, Attached,
    Request as CtlRequest, MAX_LINE,
};

pub(super) fn listen(shared: &Arc<Shared>) -> Result<(), DaemonError> {
    let listener = bind_unix(&shared.runtime.join(CONTROL_SOCKET))?;
    let shared = shared.clone();
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(session(shared.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!("control accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(())
}

async fn session(shared: Arc<Shared>, stream: UnixStream) {
    let id = shared.next_session.fetch_add(1, Ordering::Relaxed);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        let Ok(n) = read_line(&mut lines, &mut line).await else {
            break;
        };
        if n == 0 {
            break;
        }
        let answer = if line.len() > MAX_LINE {
            Answer::err(
                "bad-request",
                format!("request longer than {MAX_LINE} bytes"),
            )
        } else {
            match decode_request(&line) {
                Ok(req) => handle(&shared, id, req).await,
                Err(e) => Answer::err("bad-request", e.to_string()),
            }
        };
        if write_line(&mut write, &answer).await.is_err() {
            break;
        }
        if line.len() > MAX_LINE {
            // The rest of the oversized line is not worth reading.
            break;
        }
    }
    shared
        .input(super::Input::Core(uniplane_control::Event::ClientClosed {
            session: id,
        }))
        .await;
}

fn err(e: ControlError) -> Answer {
    Answer::err(e.kind(), e.to_string())
}

async fn ask(shared: &Shared, id: u64, req: ClientRequest) -> Result<(Reply, Option<u64>), Answer> {
    match client(shared, id, req).await {
        Ok(outcome) => match outcome.result {
            Ok(reply) => Ok((reply, outcome.token)),
            Err(e) => Err(err(e)),
        },
        Err(e) => Err(err(e)),
    }
}

async fn handle(shared: &Arc<Shared>, id: u64, req: CtlRequest) -> Answer {
    let gone = || Answer::err("engine", "the daemon is stopping");
    match req {
        CtlRequest::Status => shared
            .inspect(observe::status)
            .await
            .map_or_else(gone, Answer::ok),
        CtlRequest::Resources => shared
            .inspect(observe::resources)
            .await
            .map_or_else(gone, Answer::ok),
        CtlRequest::Routes => shared
            .inspect(observe::routes)
            .await
            .map_or_else(gone, Answer::ok),
        CtlRequest::Connections => shared
            .inspect(observe::connections)
            .await
            .map_or_else(gone, Answer::ok),
        CtlRequest::Tables { device } => observe::tables(shared, device).await,
        CtlRequest::Stats => Answer::ok(observe::stats(shared).await),
        CtlRequest::PlaneDump => observe::plane_dump(shared).await,
        CtlRequest::Class {
            id: None,
            weight: None,
            priority: None,
        } => shared
            .inspect(|d| observe::classes_json(&d.underlay))
            .await
            .map_or_else(gone, Answer::ok),
        CtlRequest::Class { id: None, .. } => {
            Answer::err("bad-request", "name the class to change (id)")
        }
        CtlRequest::Class {
            id: Some(id),
            weight,
            priority,
        } => {
            let (reply, rx) = tokio::sync::oneshot::channel();
            shared
                .input(super::Input::Underlay {
                    change: super::UnderlayChange::Class {
                        id,
                        weight,
                        priority,
                    },
                    reply,
                })
                .await;
            match rx.await {
                Ok(Ok(u)) => Answer::ok(observe::classes_json(&u)),
                Ok(Err(e)) => Answer::err("bad-request", e),
                Err(_) => gone(),
            }
        }
        CtlRequest::Metrics => Answer::ok(json!({ "text": observe::metrics_text(shared).await })),
        CtlRequest::Policy { device, set } => {
            let port = shared
                .inspect(move |d| d.core.resource(device).map(|r| r.port))
                .await
                .flatten();
            let Some(port) = port else {
                return Answer::err("not-found", format!("no device {device}"));
            };
            let Some(text) = set else {
                return Answer::ok(json!({ "device": device, "port": port }));
            };
            let policy = match observe::parse_policy(&text) {
                Ok(p) => p,
                Err(e) => return Answer::err("bad-request", e),
            };
            match ask(shared, id, ClientRequest::SetPolicy { device, policy }).await {
                Ok(_) => Answer::ok(json!({ "device": device, "policy": text })),
                Err(a) => a,
            }
        }
        CtlRequest::Attach { name } => {
            match ask(shared, id, ClientRequest::Attach { name }).await {
                Ok((Reply::Attached { uid, .. }, Some(token))) => {
                    let attached = Attached {
                        uid,
                        daemon: shared.uid(),
                        data_socket: shared.runtime.join(DATA_SOCKET).display().to_string(),
                        token,
                    };
                    Answer::ok(serde_json::to_value(attached).unwrap_or_default())
                }
                Ok(_) => Answer::err("resources", "no data path for the new port"),
                Err(a) => a,
            }
        }
        CtlRequest::Listen { port } => {
            match ask(shared, id, ClientRequest::Listen { port }).await {
                Ok(_) => Answer::ok(json!({ "port": port })),
                Err(a) => a,
            }
        }
        CtlRequest::Unlisten { port } => {
            match ask(shared, id, ClientRequest::Unlisten { port }).await {
                Ok(_) => Answer::ok(json!({ "port": port })),
                Err(a) => a,
            }
        }
        CtlRequest::Connect {
            src_port,
            dst,
            dst_port,
            class,
        } => {
            let req = ClientRequest::Connect {
                src_port,
                dst,
                dst_port,
                class,
            };
            match ask(shared, id, req).await {
                Ok((Reply::Connected(key), _)) => {
                    Answer::ok(serde_json::to_value(conn_spec(key)).unwrap_or_default())
                }
                Ok(_) => Answer::err("engine", "unexpected answer"),
                Err(a) => a,
            }
        }
        CtlRequest::Close { conn } => {
            match ask(
                shared,
                id,
                ClientRequest::Close {
                    conn: conn_key(conn),
                },
            )
            .await
            {
                Ok(_) => Answer::ok(json!({})),
                Err(a) => a,
            }
        }
    }
}

/// Binds a Unix socket, removing a stale socket file but never one a live
/// daemon serves.
pub(super) fn bind_unix(path: &Path) -> Result<UnixListener, DaemonError> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::Io {
                what: format!("{} is served by a running daemon", path.display()),
                source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(io_err(format!("binding {}", path.display())))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(io_err(format!("chmod {}", path.display())))?;
    Ok(l)
}
