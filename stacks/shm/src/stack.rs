//! [`ShmStack`]: shared-memory links behind the [`Stack`] trait.

use std::pin::Pin;

use uniplane_dataplane::wire::EXTENDED_HEADER_LEN;
use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, Locator, Message, Stack, StackError, StackFuture,
};

use crate::link::{ShmConfig, ShmError, ShmLink, ShmListener};

/// The `shm` stack: links between processes of one server. A locator is
/// the path of a Unix socket (`Locator::Name`), where a listener hands out
/// shared-memory regions.
#[derive(Clone, Debug, Default)]
pub struct ShmStack {
    cfg: ShmConfig,
}

impl ShmStack {
    /// A stack with the default ring size.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stack whose links use `cfg`.
    pub fn with_config(cfg: ShmConfig) -> Self {
        ShmStack { cfg }
    }

    fn path(locator: &Locator) -> Result<&str, StackError> {
        match locator {
            Locator::Name(n) => Ok(n),
            other => Err(StackError::UnsupportedLocator {
                stack: "shm",
                locator: other.clone(),
            }),
        }
    }
}

fn stack_error(e: ShmError, locator: &Locator) -> StackError {
    match e {
        ShmError::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ) =>
        {
            StackError::Refused(locator.clone())
        }
        ShmError::Io(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            StackError::AddrInUse(locator.clone())
        }
        ShmError::Io(e) => StackError::Io(e),
        other => StackError::Io(std::io::Error::other(other)),
    }
}

impl Stack for ShmStack {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: true,
            ordered: true,
            mtu: EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD,
            one_sided: true,
            max_connections: usize::MAX,
        }
    }

    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink> {
        let peer = peer.clone();
        Box::pin(async move {
            let path = Self::path(&peer)?;
            let link = ShmLink::connect_with(path, &self.cfg)
                .await
                .map_err(|e| stack_error(e, &peer))?;
            Ok(Box::new(link) as BoxLink)
        })
    }

    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener> {
        let local = local.clone();
        Box::pin(async move {
            let path = Self::path(&local)?;
            let listener = ShmListener::bind_with(path, self.cfg.clone())
                .map_err(|e| stack_error(e, &local))?;
            let stream = futures_util::StreamExt::map(listener, |r| {
                r.map(|l| Box::new(l) as BoxLink)
                    .map_err(|e| StackError::Io(std::io::Error::other(e)))
            });
            Ok(Box::pin(stream) as Pin<Box<_>> as BoxListener)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use uniplane_dataplane::Uid;

    #[tokio::test]
    async fn the_stack_connects_by_socket_path() {
        let path = std::env::temp_dir().join(format!("uniplane-shm-stack-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let loc = Locator::Name(path.to_string_lossy().into_owned());
        let stack = ShmStack::new();
        let mut listener = stack.listen(&loc).await.unwrap();
        // The connector waits for the listener's handshake: accept alongside.
        let (client, server) = tokio::join!(stack.connect(&loc), listener.next());
        let (mut client, mut server) = (client.unwrap(), server.unwrap().unwrap());
        let u = Uid::new(std::net::Ipv4Addr::LOCALHOST, 3);
        let m = Message::send(u.port(1), u.port(2), Bytes::from_static(b"hi")).unwrap();
        client.send(m.clone()).await.unwrap();
        assert_eq!(server.next().await.unwrap().unwrap(), m);
    }

    #[tokio::test]
    async fn connecting_where_nobody_listens_is_refused() {
        let loc = Locator::Name("/nonexistent/uniplane.sock".into());
        let err = ShmStack::new().connect(&loc).await.err().unwrap();
        assert!(matches!(err, StackError::Refused(_)), "{err}");
    }

    #[tokio::test]
    async fn socket_locators_are_not_for_shm() {
        let err = ShmStack::new()
            .connect(&"127.0.0.1:1".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(matches!(err, StackError::UnsupportedLocator { .. }));
    }
}
