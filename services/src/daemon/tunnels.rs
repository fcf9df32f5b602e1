//! Stack tunnels between servers: the listeners that accept a peer's
//! tunnels, the opening of ours, and the daemon's own port, from which
//! notices to processes leave.

use std::net::Ipv4Addr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use tokio::sync::mpsc;
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::{Header, MsgFlags, Params, PortParams, ReqType, Request, Status};
use uniplane_dataplane::{BoxLink, LinkExt, Locator, Message, Uid};

use super::{tunnel_mtu, DaemonError, Input, Shared, DAEMON_DEVICE};

/// Starts a tunnel listener for every configured stack that has an
/// address to listen on.
pub(super) async fn listen_stacks(shared: &std::sync::Arc<Shared>) -> Result<(), DaemonError> {
    for sc in shared.config.stacks.clone() {
        let (Some(addr), Some(stack)) = (
            sc.listen,
            shared.stacks.iter().find(|s| s.name() == sc.name).cloned(),
        ) else {
            continue;
        };
        let listener = stack
            .listen(&Locator::Socket(addr))
            .await
            .map_err(|source| DaemonError::Stack {
                stack: sc.name.clone(),
                source,
            })?;
        let mtu = tunnel_mtu(stack.as_ref());
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut listener = listener;
            while let Some(accepted) = futures_util::StreamExt::next(&mut listener).await {
                match accepted {
                    Ok(link) => {
                        tokio::spawn(inbound(shared.clone(), link, mtu));
                    }
                    Err(e) => tracing::warn!("tunnel accept: {e}"),
                }
            }
        });
        tracing::info!(stack = %sc.name, %addr, "tunnel listener up");
    }
    Ok(())
}

/// A tunnel a peer opened to us: its first message says who it is; the
/// core decides whether it is welcome.
async fn inbound(shared: std::sync::Arc<Shared>, mut link: BoxLink, mtu: usize) {
    let mut first = Vec::with_capacity(1);
    let hello = tokio::time::timeout(Duration::from_secs(2), link.recv_batch(&mut first, 1)).await;
    let Ok(Ok(1)) = hello else {
        return;
    };
    let m = &first[0];
    let from = m.header().src.server();
    if m.kind() != ReqType::Connect || m.header().dst != shared.uid() {
        tracing::warn!(%from, "tunnel from a confused peer refused");
        return;
    }
    let class = m.header().request.ports().map_or(0, |(c, _)| c as u8);
    shared
        .input(Input::InboundLink {
            from,
            class,
            mtu,
            link,
        })
        .await;
}

/// Opens our tunnel of traffic class `class` to `server`: a link of the
/// peer's stack to its tunnel listener, and a hello naming us and the
/// class.
pub(super) async fn open(shared: &Shared, server: Ipv4Addr, class: u8) -> Result<BoxLink, String> {
    let peer = shared
        .config
        .peers
        .iter()
        .find(|p| p.server == server)
        .ok_or("unknown peer")?;
    let stack = shared
        .stacks
        .iter()
        .find(|s| s.name() == peer.stack)
        .cloned()
        .ok_or(format!("stack {} not running", peer.stack))?;
    let connect = stack.connect(&Locator::Socket(peer.tunnel));
    let mut link = tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let hello = tunnel_hello(shared.uid(), Uid::new(server, DAEMON_DEVICE), class)
        .ok_or("hello message")?;
    link.send(hello).await.map_err(|e| e.to_string())?;
    Ok(link)
}

/// Serves the daemon's own port: sends the notices handed to it, and
/// reads (and drops) what processes answer.
pub(super) async fn notices(mut link: RingLink, mut rx: mpsc::Receiver<Message>) {
    let mut buf = Vec::with_capacity(64);
    loop {
        tokio::select! {
            m = rx.recv() => {
                let Some(m) = m else { return };
                let _ = link.send(m).await;
            }
            got = link.recv_batch(&mut buf, 64) => {
                buf.clear();
                if !matches!(got, Ok(n) if n > 0) {
                    return;
                }
            }
        }
    }
}

/// The first message on a tunnel: a CONNECT from the opening daemon to
/// the accepting one, whose source port carries the traffic class.
fn tunnel_hello(from: Uid, to: Uid, class: u8) -> Option<Message> {
    let request = Request::new(
        ReqType::Connect,
        Params::Port(PortParams {
            flag: 0,
            src_port: u16::from(class),
            dst_port: 0,
        }),
    )
    .ok()?;
    Message::new(Header::new(from, to, request), Bytes::new()).ok()
}

/// A notice from the daemon to a process: `kind` at the process's
/// `local_port`, payload = local port (2 bytes), remote UID (6), remote
/// port (2).
pub(super) fn notice(
    daemon: Uid,
    to: Uid,
    kind: ReqType,
    local_port: u16,
    remote: (Uid, u16),
    status: Status,
) -> Option<Message> {
    let request = Request::new(
        kind,
        Params::Port(PortParams {
            flag: status.to_u8(),
            src_port: 0,
            dst_port: local_port,
        }),
    )
    .ok()?;
    let mut header = Header::new(daemon, to, request);
    if status != Status::Ok && kind.is_answer() {
        header.flags = header.flags.with(MsgFlags::ERROR);
    }
    let mut payload = Vec::with_capacity(10);
    payload.extend_from_slice(&local_port.to_be_bytes());
    payload.extend_from_slice(&remote.0.to_bytes());
    payload.extend_from_slice(&remote.1.to_be_bytes());
    let payload = if kind.carries_payload() {
        Bytes::from(payload)
    } else {
        Bytes::new()
    };
    Message::new(header, payload).ok()
}
