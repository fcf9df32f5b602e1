//! The data socket: a process presents the token its attach answer gave,
//! and gets its port's rings as shared memory.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};
use uniplane_client::protocol::MapHello;

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
            let token = u64::from_le_bytes(token);
            let taken = shared
                .pending_data
                .lock()
                .ok()
                .and_then(|mut p| p.remove(&token));
            let Some((device, link)) = taken else {
                lend(&shared, token, stream).await;
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

/// Hands a granted mapping to the process that presents its token: the
/// memory's descriptor (read-only unless writable) and its grant word's,
/// after a [`MapHello`]. The loan is made while the token is taken, under
/// the same lock the driver's take-backs clear tokens under, so a grant
/// the core has taken back is never lent.
async fn lend(shared: &Shared, token: u64, stream: UnixStream) {
    let loan = {
        let Ok(mut pending) = shared.pending_maps.lock() else {
            return;
        };
        let Some(p) = pending.remove(&token) else {
            tracing::warn!("data connection with an unknown token");
            return;
        };
        p.region.lend(p.writable)
    };
    let loan = match loan {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("mapping not lent: {e}");
            return;
        }
    };
    let hello = MapHello {
        len: loan.len as u64,
    }
    .encode();
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            uniplane_shm::sys::send_with_fds(
                std::os::fd::AsFd::as_fd(&stream),
                &hello,
                &[
                    std::os::fd::AsFd::as_fd(&loan.region),
                    std::os::fd::AsFd::as_fd(&loan.grant),
                ],
            )
        })
        .await;
    if let Err(e) = sent {
        tracing::warn!("mapping not handed over: {e}");
    }
}
