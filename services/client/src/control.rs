//! [`Client`]: the control connection to the daemon, and where the
//! daemon's sockets live.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use crate::protocol::{Answer, Attached, Request};
use crate::{ClientError, Session};

/// Control socket file name inside the runtime directory.
pub const CONTROL_SOCKET: &str = "control.sock";
/// Data socket file name inside the runtime directory.
pub const DATA_SOCKET: &str = "data.sock";

/// The runtime directory, where the daemon's sockets are: `configured`
/// when given, else `$UNIPLANE_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/uniplane`, else `/tmp/uniplane-$UID`. The daemon
/// resolves its own the same way.
pub fn runtime_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(dir) = configured {
        return dir.to_owned();
    }
    if let Some(dir) = std::env::var_os("UNIPLANE_RUNTIME_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(dir).join("uniplane");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/uniplane-{uid}"))
}

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

/// A connection to the daemon's control socket.
pub struct Client {
    pub(crate) control: Arc<ControlChannel>,
    runtime: PathBuf,
}

impl Client {
    /// Connects to the daemon of the default runtime directory (see
    /// [`runtime_dir`]).
    pub async fn connect_default() -> Result<Client, ClientError> {
        Client::connect(&runtime_dir(None)).await
    }

    /// Connects to the daemon whose sockets are in `runtime`.
    pub async fn connect(runtime: &Path) -> Result<Client, ClientError> {
        let path = runtime.join(CONTROL_SOCKET);
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

    /// Registers this process as a resource named `name` and opens its
    /// data path. The resource lives as long as the session.
    pub async fn attach(self, name: &str) -> Result<Session, ClientError> {
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
        let link = uniplane_shm::ShmLink::join(data, &uniplane_shm::ShmConfig::default())
            .await
            .map_err(|e| ClientError::Protocol(format!("data path: {e}")))?;
        Ok(Session::open(self, attached.uid, attached.daemon, link))
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
    fn a_configured_runtime_dir_wins() {
        let dir = Path::new("/somewhere/else");
        assert_eq!(runtime_dir(Some(dir)), dir);
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
