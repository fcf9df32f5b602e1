//! [`Client`]: the control connection to the daemon.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::protocol::{Answer, Attached, Request};
use crate::runtime::{check_runtime_dir, client_runtime_dir, RuntimeDirError, CONTROL_SOCKET};
use crate::{ClientError, Session};
use uniplane_dataplane::Uid;

/// The control socket, shared by a [`Client`] and the background task of
/// its session (which closes dropped connections through it).
pub(crate) struct ControlChannel {
    io: tokio::sync::Mutex<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>,
}

impl ControlChannel {
    /// Sends one request and returns its result; one request at a time.
    pub(crate) async fn request(&self, req: &Request) -> Result<serde_json::Value, ClientError> {
        let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let mut guard = self.io.lock().await;
        let (reader, writer) = &mut *guard;
        writer
            .write_all(&line)
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut answer = String::new();
        let n = reader
            .read_line(&mut answer)
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if n == 0 {
            return Err(ClientError::Protocol(
                "the daemon closed the control socket".into(),
            ));
        }
        let a: Answer =
            serde_json::from_str(&answer).map_err(|e| ClientError::Protocol(e.to_string()))?;
        match (a.ok, a.result, a.error) {
            (true, Some(r), _) => Ok(r),
            (true, None, _) => Ok(serde_json::Value::Null),
            (false, _, Some(e)) => Err(ClientError::Daemon {
                kind: e.kind,
                message: e.message,
            }),
            (false, _, None) => Err(ClientError::Protocol("error without a body".into())),
        }
    }
}

/// How a session's data path waits when the engine has nothing for it
/// (and, sending, when its ring to the engine is full).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Never park: the data path looks at its rings at every turn of the
    /// application's runtime and never raises its waiting flag, so the
    /// engine never rings its doorbell and a message costs no system call
    /// on this side. Lowest latency; the session's task keeps one core of
    /// the application's runtime busy for as long as it lives. Pair it
    /// with a busy-polling engine for round trips in microseconds.
    Busy,
    /// Spin for `spin` on the ring, then park on the doorbell until the
    /// engine rings it. `Duration::ZERO` parks at once: no CPU while idle,
    /// a wake-up (system calls on both sides) per idle-to-busy turn.
    Park {
        /// How long to spin before parking.
        spin: Duration,
    },
}

impl Default for Wait {
    /// Park at once: an idle application costs nothing.
    fn default() -> Self {
        Wait::Park {
            spin: Duration::ZERO,
        }
    }
}

/// Options of a session's data path, for [`Client::attach_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataPathOptions {
    /// How the data path waits for the engine.
    pub wait: Wait,
}

impl DataPathOptions {
    /// The shared-memory configuration of the client's end of the link.
    /// The ring size is the daemon's; only the waiting is ours.
    pub fn shm_config(&self) -> uniplane_shm::ShmConfig {
        let base = uniplane_shm::ShmConfig::default();
        match self.wait {
            Wait::Busy => uniplane_shm::ShmConfig {
                busy_poll: true,
                ..base
            },
            Wait::Park { spin } => uniplane_shm::ShmConfig { spin, ..base },
        }
    }
}

/// A connection to the daemon's control socket.
pub struct Client {
    pub(crate) control: Arc<ControlChannel>,
    runtime: PathBuf,
}

impl Client {
    /// Connects to the daemon of the default runtime directory (see
    /// [`client_runtime_dir`]).
    pub async fn connect_default() -> Result<Client, ClientError> {
        Client::connect(&client_runtime_dir()).await
    }

    /// Connects to the daemon whose sockets are in `runtime`, unless
    /// another user could have put them there (see
    /// [`check_runtime_dir`]).
    pub async fn connect(runtime: &Path) -> Result<Client, ClientError> {
        let path = runtime.join(CONTROL_SOCKET);
        match check_runtime_dir(runtime) {
            Ok(()) => {}
            Err(RuntimeDirError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(ClientError::Unreachable {
                    path: path.display().to_string(),
                    source,
                })
            }
            Err(e) => return Err(e.into()),
        }
        let stream =
            UnixStream::connect(&path)
                .await
                .map_err(|source| ClientError::Unreachable {
                    path: path.display().to_string(),
                    source,
                })?;
        let (r, w) = stream.into_split();
        Ok(Client {
            control: Arc::new(ControlChannel {
                io: tokio::sync::Mutex::new((BufReader::new(r), w)),
            }),
            runtime: runtime.to_owned(),
        })
    }

    /// Sends one control request and returns its result.
    pub async fn request(&self, req: &Request) -> Result<serde_json::Value, ClientError> {
        self.control.request(req).await
    }

    /// The UID `name` stands for: in the cluster's directory when the
    /// daemon has one, else among the daemon's own resources (processes
    /// by the name they attached with, devices as `DEVICE` or
    /// `DEVICE@SERVER-NAME`).
    pub async fn resolve(&self, name: &str) -> Result<Uid, ClientError> {
        let v = self
            .request(&Request::Resolve { name: name.into() })
            .await?;
        v.get("uid")
            .and_then(|u| u.as_str())
            .and_then(|u| u.parse().ok())
            .ok_or_else(|| ClientError::Protocol(format!("resolve answered {v}")))
    }

    /// Resolves every one of `names`, asking again for those not claimed
    /// yet (or while the directory is out of reach) until `deadline`:
    /// each name's UID, `None` for those still missing at the deadline.
    /// Any other error ends the wait.
    pub async fn resolve_all(
        &self,
        names: &[String],
        deadline: tokio::time::Instant,
    ) -> Result<Vec<Option<Uid>>, ClientError> {
        let mut found: Vec<Option<Uid>> = vec![None; names.len()];
        let mut pause = Duration::from_millis(1);
        loop {
            for (name, slot) in names.iter().zip(found.iter_mut()) {
                if slot.is_some() {
                    continue;
                }
                match self.resolve(name).await {
                    Ok(uid) => *slot = Some(uid),
                    Err(ClientError::Daemon { kind, .. })
                        if kind == "not-found" || kind == "unavailable" => {}
                    Err(e) => return Err(e),
                }
            }
            if found.iter().all(Option::is_some) || tokio::time::Instant::now() + pause > deadline {
                return Ok(found);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Registers this process as a resource named `name` and opens its
    /// data path, which parks while idle ([`DataPathOptions::default`]).
    /// The resource lives as long as the session.
    pub async fn attach(self, name: &str) -> Result<Session, ClientError> {
        self.attach_with(name, DataPathOptions::default()).await
    }

    /// [`Client::attach`] with a choice of how the session's data path
    /// waits for the engine (see [`Wait`]). Every connection of the
    /// session shares its data path, and so its wait mode.
    pub async fn attach_with(
        self,
        name: &str,
        options: DataPathOptions,
    ) -> Result<Session, ClientError> {
        let v = self.request(&Request::Attach { name: name.into() }).await?;
        let attached: Attached =
            serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut data = UnixStream::connect(&attached.data_socket)
            .await
            .map_err(|source| ClientError::Unreachable {
                path: attached.data_socket.clone(),
                source,
            })?;
        data.write_all(&attached.token.to_le_bytes())
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut ok = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), data.read_exact(&mut ok))
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let link = uniplane_shm::ShmLink::join(data, &options.shm_config())
            .await
            .map_err(|e| ClientError::Protocol(format!("data path: {e}")))?;
        let busy = options.wait == Wait::Busy;
        Ok(Session::open(
            self,
            attached.uid,
            attached.daemon,
            link,
            busy,
        ))
    }

    /// The runtime directory of the daemon.
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_modes_map_to_the_links_configuration() {
        let busy = DataPathOptions { wait: Wait::Busy }.shm_config();
        assert!(busy.busy_poll);
        let spin = Duration::from_micros(20);
        let park = DataPathOptions {
            wait: Wait::Park { spin },
        }
        .shm_config();
        assert_eq!((park.busy_poll, park.spin), (false, spin));
        assert_eq!(
            DataPathOptions::default().shm_config(),
            uniplane_shm::ShmConfig::default(),
            "the default parks at once, as before"
        );
    }

    #[tokio::test]
    async fn finding5_the_client_refuses_an_open_runtime_dir() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("uniplane-client-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = Client::connect(&dir).await.err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            matches!(
                err,
                Some(ClientError::RuntimeDir(RuntimeDirError::Writable { .. }))
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn an_absent_daemon_is_unreachable_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("uniplane-client-none-{}", std::process::id()));
        let err = Client::connect(&dir).await.err();
        assert!(
            matches!(err, Some(ClientError::Unreachable { ref path, .. }) if path.ends_with(CONTROL_SOCKET)),
            "{err:?}"
        );
    }
}
