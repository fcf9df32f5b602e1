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
use uniplane_dataplane::Uid;

use crate::naming::etcd::name_key;
use crate::naming::{check_name, NamingError};

use super::driver::client;
use super::observe;
use super::{io_err, DaemonError, Shared, CONTROL_SOCKET, DATA_SOCKET};
use crate::control::{
    conn_key, conn_spec, decode_request, read_line, write_line, Answer, Attached, Mapping,
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
    let mut names = Names::default();
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
                Ok(req) => handle(&shared, id, &mut names, req).await,
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
    if let Some(naming) = &shared.naming {
        for name in names.claimed {
            naming.release(name_key(&name)).await;
        }
    }
    shared
        .input(super::Input::Core(uniplane_control::Event::ClientClosed {
            session: id,
        }))
        .await;
}

/// What a session is known by: its resource, and the names it claimed in
/// the directory (released when it ends).
#[derive(Default)]
struct Names {
    uid: Option<Uid>,
    claimed: Vec<String>,
}

fn naming_err(e: NamingError) -> Answer {
    Answer::err(e.kind(), e.to_string())
}

/// The UID `name` stands for among this daemon's resources: processes by
/// the name they attached with, devices by `DEVICE` or
/// `DEVICE@SERVER-NAME`; a name two resources share is ambiguous.
async fn resolve_local(shared: &Shared, name: &str) -> Result<Uid, NamingError> {
    let own = format!("@{}", shared.config.name);
    let bare = name.strip_suffix(own.as_str()).unwrap_or(name).to_owned();
    let server = shared.server;
    let found = shared
        .inspect(move |d| {
            d.core
                .resources()
                .filter(|r| r.name == bare)
                .map(|r| Uid::new(server, r.uid.device()))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
    match found.as_slice() {
        [uid] => Ok(*uid),
        [] => Err(NamingError::NotFound(name.to_owned())),
        _ => Err(NamingError::Taken {
            name: name.to_owned(),
            holder: format!("{} local resources at once", found.len()),
        }),
    }
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

/// The answer to a share or a shared mapping: how to claim it.
fn shared_mapping(shared: &Shared, asked: Result<(Reply, Option<u64>), Answer>) -> Answer {
    match asked {
        Ok((
            Reply::Shared {
                owner,
                len,
                writable,
                ..
            },
            Some(token),
        )) => {
            let mapping = Mapping {
                device: owner,
                len,
                writable,
                data_socket: shared.runtime.join(DATA_SOCKET).display().to_string(),
                token,
            };
            Answer::ok(serde_json::to_value(mapping).unwrap_or_default())
        }
        Ok(_) => Answer::err("resources", "the shared memory could not be made"),
        Err(a) => a,
    }
}

async fn handle(shared: &Arc<Shared>, id: u64, names: &mut Names, req: CtlRequest) -> Answer {
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
        CtlRequest::Connections => observe::connections(shared)
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
                    names.uid = Some(uid);
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
        CtlRequest::Map { device } => match ask(shared, id, ClientRequest::Map { device }).await {
            Ok((Reply::Mapped { device, writable }, Some(token))) => {
                let len = shared
                    .inspect(move |d| {
                        d.core
                            .resources()
                            .find(|r| r.uid.device() == device)
                            .map(|r| r.name.clone())
                    })
                    .await
                    .flatten()
                    .and_then(|name| shared.host_region(&name).map(|r| r.len()));
                let Some(len) = len else {
                    return Answer::err("not-found", format!("device {device} is gone"));
                };
                let mapping = Mapping {
                    device,
                    len: len as u64,
                    writable,
                    data_socket: shared.runtime.join(DATA_SOCKET).display().to_string(),
                    token,
                };
                Answer::ok(serde_json::to_value(mapping).unwrap_or_default())
            }
            Ok(_) => Answer::err("resources", "the mapping could not be set up"),
            Err(a) => a,
        },
        CtlRequest::Share {
            id: region,
            len,
            peers_write,
        } => {
            let req = ClientRequest::Share {
                id: region,
                len,
                peers_write,
            };
            shared_mapping(shared, ask(shared, id, req).await)
        }
        CtlRequest::Unshare { id: region } => {
            match ask(shared, id, ClientRequest::Unshare { id: region }).await {
                Ok(_) => Answer::ok(json!({ "unshared": region })),
                Err(a) => a,
            }
        }
        CtlRequest::MapShared { owner, id: region } => {
            if owner.server() != shared.server {
                return Answer::err(
                    "bad-request",
                    format!(
                        "{owner} is on another server: only this server's memory can be mapped"
                    ),
                );
            }
            let req = ClientRequest::MapShared {
                owner: owner.device(),
                id: region,
            };
            shared_mapping(shared, ask(shared, id, req).await)
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
        CtlRequest::Register { name } => {
            let Some(uid) = names.uid else {
                return err(ControlError::NotAttached);
            };
            let Some(naming) = &shared.naming else {
                return naming_err(NamingError::Local);
            };
            if let Err(e) = check_name(&name) {
                return naming_err(e);
            }
            if names.claimed.len() >= MAX_NAMES_PER_SESSION {
                return err(ControlError::Limit("names per session"));
            }
            match naming.claim(name_key(&name), uid.to_string(), false).await {
                Ok(()) => {
                    names.claimed.push(name.clone());
                    Answer::ok(json!({ "name": name, "uid": uid.to_string() }))
                }
                Err(e) => naming_err(e),
            }
        }
        CtlRequest::Resolve { name } => {
            if let Err(e) = check_name(&name) {
                return naming_err(e);
            }
            let answer = |uid: Uid, source: &str| {
                Answer::ok(json!({ "name": name, "uid": uid.to_string(), "source": source }))
            };
            match &shared.naming {
                None => match resolve_local(shared, &name).await {
                    Ok(uid) => answer(uid, "local"),
                    Err(e) => naming_err(e),
                },
                Some(naming) => match naming.resolve(&name).await {
                    Ok(uid) => answer(uid, "directory"),
                    // What this daemon holds itself still resolves
                    // without the directory.
                    Err(e) => match resolve_local(shared, &name).await {
                        Ok(uid) => answer(uid, "local"),
                        Err(_) => naming_err(e),
                    },
                },
            }
        }
        CtlRequest::Directory => directory(shared).await,
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

/// Most names one session may claim.
const MAX_NAMES_PER_SESSION: usize = 64;

/// `uniplane cluster status`: the directory and this daemon's claims.
async fn directory(shared: &Shared) -> Answer {
    let Some(naming) = &shared.naming else {
        return Answer::ok(json!({
            "registry": "local",
            "server": shared.server.to_string(),
            "name": shared.config.name,
        }));
    };
    let own = naming.view().await.map(|v| {
        json!({
            "lease": v.lease.map(|(id, left)| json!({ "id": id, "left_ms": left.as_millis() as u64 })),
            "error": v.error,
            "keys": v.keys.iter().map(|(k, value, state)| json!({
                "key": k,
                "value": value,
                "state": format!("{state:?}").to_lowercase(),
            })).collect::<Vec<_>>(),
        })
    });
    match naming.list().await {
        Ok(listing) => Answer::ok(json!({
            "registry": "etcd",
            "server": shared.server.to_string(),
            "name": shared.config.name,
            "servers": listing.servers,
            "names": listing.names,
            "claims": own,
        })),
        Err(e) => Answer::ok(json!({
            "registry": "etcd",
            "server": shared.server.to_string(),
            "name": shared.config.name,
            "error": e.to_string(),
            "claims": own,
        })),
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
