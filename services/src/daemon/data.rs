//! The data socket: a process presents the token its attach answer gave,
//! and gets its port's rings as shared memory.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::driver::PortLink;
use super::sessions::bind_unix;
use super::{DaemonError, Shared, DATA_SOCKET};

pub(super) fn listen(shared: &Arc<Shared>) -> Result<(), DaemonError> {
    let listener = bind_unix(&shared.runtime.join(DATA_SOCKET))?;
    tokio::spawn(accept(shared.clone(), listener));
    Ok(())
}

async fn accept(shared: Arc<Shared>, listener: UnixListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut token = [0u8; 8];
            let read =
                tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut token)).await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            let taken = shared
                .pending_data
                .lock()
                .ok()
                .and_then(|mut p| p.remove(&u64::from_le_bytes(token)));
            let Some((device, link)) = taken else {
                tracing::warn!("data connection with an unknown token");
                return;
            };
            if stream.write_all(&[1]).await.is_err() {
                return;
            }
            let cfg = uniplane_shm::ShmConfig::default();
            match link {
                // The short path: the engine reads and writes the process's
                // shared-memory rings itself; this task only hears the
                // doorbells and the end of the process.
                PortLink::Handoff(handoff) => {
                    let (port, bell) = match uniplane_shm::ShmPort::serve(stream, &cfg) {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(device, "data path setup: {e}");
                            return;
                        }
                    };
                    handoff.install(Box::new(port));
                    let end = bell.await;
                    tracing::debug!(device, ?end, "data path ended");
                }
                // A plane that takes only rings: relay between the two.
                PortLink::Ring(ring) => {
                    let shm = match uniplane_shm::ShmLink::serve(stream, &cfg) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(device, "data path setup: {e}");
                            return;
                        }
                    };
                    if let Err(e) = uniplane_dataplane::bridge(shm, ring).await {
                        tracing::debug!(device, "data path ended: {e}");
                    }
                }
                PortLink::Inline => tracing::warn!(device, "a data connection for a device"),
            }
        });
    }
}
