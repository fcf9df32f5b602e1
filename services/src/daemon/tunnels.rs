//! Stack tunnels between servers: the listeners that accept a peer's
//! tunnels, the opening of ours, and the daemon's own port, from which
//! notices to processes leave.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use tokio::sync::mpsc;
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::{Header, MsgFlags, Params, PortParams, ReqType, Request, Status};
use uniplane_dataplane::{BoxLink, LinkExt, Locator, Message, Uid};

use super::seal::SealedLink;
use super::{tunnel_mtu, DaemonError, Input, Shared, DAEMON_DEVICE};
use crate::auth::{nonce, tags_equal, Handshake, Key, NONCE_LEN};
use crate::seal::{End, Sealer};

/// Starts a tunnel listener for every configured stack that has an
/// address to listen on.
pub(super) async fn listen_stacks(shared: &std::sync::Arc<Shared>) -> Result<(), DaemonError> {
    for sc in shared.config.stacks.clone() {
        // A stack on Ethernet listens on its interface; one over IP on
        // its address, when it has one.
        let at = match (&sc.options.interface, sc.listen) {
            // A DPDK port has a name of its own (its vdev's).
            (Some(_), _) if sc.name == "dpdk" => {
                Locator::Name(uniplane_stacks::dpdk_port(&sc.options).0)
            }
            (Some(iface), _) if sc.on_ethernet() => Locator::Name(iface.clone()),
            (_, Some(addr)) => Locator::Socket(addr),
            _ => continue,
        };
        let Some(stack) = shared.stacks.iter().find(|s| s.name() == sc.name).cloned() else {
            continue;
        };
        let listener = stack
            .listen(&at)
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
                    Err(e) => shared.security.refuse_tunnel("?", &format!("accept: {e}")),
                }
            }
        });
        tracing::info!(stack = %sc.name, %at, "tunnel listener up");
    }
    Ok(())
}

/// Handshakes on tunnels in progress at once.
const MAX_HANDSHAKES: usize = 32;
/// Time the other end has to complete a tunnel handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

static HANDSHAKES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_HANDSHAKES);

/// A tunnel a peer opened to us: its first message says who it claims to
/// be; it must then prove that it holds the cluster secret before the
/// core hears of it. Its frames are sealed from then on.
async fn inbound(shared: Arc<Shared>, link: BoxLink, mtu: usize) {
    let Ok(_permit) = HANDSHAKES.try_acquire() else {
        shared
            .security
            .refuse_tunnel("?", "too many tunnel handshakes at once");
        return;
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept(&shared, link)).await {
        Ok(Ok((from, class, link))) => {
            shared
                .input(Input::InboundLink {
                    from,
                    class,
                    mtu,
                    link,
                })
                .await
        }
        Ok(Err((who, why))) => shared.security.refuse_tunnel(&who, &why),
        Err(_) => shared
            .security
            .refuse_tunnel("?", "tunnel handshake timed out"),
    }
}

/// The accepting end of a tunnel handshake.
async fn accept(
    shared: &Arc<Shared>,
    mut link: BoxLink,
) -> Result<(Ipv4Addr, u8, BoxLink), (String, String)> {
    let hello = next(&mut link).await.map_err(|e| ("?".to_owned(), e))?;
    let from = hello.header().src.server();
    let who = from.to_string();
    let refuse = |why: &str| (who.clone(), why.to_owned());
    if hello.kind() != ReqType::Connect || hello.header().dst != shared.uid() {
        return Err(refuse(
            "the first frame is not a tunnel hello to this daemon",
        ));
    }
    let Some(peer) = shared.peer(from) else {
        return Err(refuse("not a peer of this server"));
    };
    let secret = shared
        .secret
        .as_ref()
        .ok_or_else(|| refuse("this server has no cluster secret"))?;
    let opener_nonce: [u8; NONCE_LEN] = hello
        .payload()
        .as_ref()
        .try_into()
        .map_err(|_| refuse("the hello carries no nonce"))?;
    let class = hello
        .header()
        .request
        .ports()
        .and_then(|(c, _)| u8::try_from(c).ok())
        .ok_or_else(|| refuse("the hello names no traffic class"))?;
    if !peer.ingress.classes.contains(&class) {
        return Err(refuse(&format!(
            "traffic class {class} is not allowed from this peer"
        )));
    }
    let opener = Uid::new(from, DAEMON_DEVICE);
    let our_nonce = nonce();
    let hs = handshake(secret, opener, class, shared.uid(), opener_nonce, our_nonce);
    let mut challenge = our_nonce.to_vec();
    challenge.extend_from_slice(&hs.listener_proof());
    let challenge = frame(ReqType::Accept, shared.uid(), opener, class, challenge)
        .ok_or_else(|| refuse("challenge"))?;
    link.send(challenge)
        .await
        .map_err(|e| refuse(&e.to_string()))?;
    let proof = next(&mut link).await.map_err(|e| refuse(&e))?;
    let good = proof.kind() == ReqType::Accept
        && proof.header().src == opener
        && tags_equal(proof.payload(), &hs.dialler_proof());
    if !good {
        return Err(refuse("did not prove the cluster secret"));
    }
    let sealer = Sealer::new(hs.session_key(), End::Acceptor, shared.uid(), opener)
        .carrying(beyond(shared, from));
    Ok((
        from,
        class,
        Box::new(SealedLink::new(link, sealer, shared.clone())),
    ))
}

/// The servers reached through `peer` (whose messages it carries on).
fn beyond(shared: &Shared, peer: Ipv4Addr) -> Vec<Ipv4Addr> {
    shared
        .config
        .remotes
        .iter()
        .filter(|r| r.via == peer)
        .map(|r| r.server)
        .collect()
}

/// The handshake of the tunnel of `class` from `opener` to `acceptor`.
fn handshake(
    secret: &Key,
    opener: Uid,
    class: u8,
    acceptor: Uid,
    opener_nonce: [u8; NONCE_LEN],
    acceptor_nonce: [u8; NONCE_LEN],
) -> Handshake {
    let mut dialler = opener.to_bytes().to_vec();
    dialler.push(class);
    Handshake::new(
        secret,
        "tunnel",
        &dialler,
        &acceptor.to_bytes(),
        opener_nonce,
        acceptor_nonce,
    )
}

/// The next message on a link in handshake.
async fn next(link: &mut BoxLink) -> Result<Message, String> {
    let mut got = Vec::with_capacity(1);
    match link.recv_batch(&mut got, 1).await {
        Ok(1) => Ok(got.remove(0)),
        Ok(_) => Err("closed during the handshake".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Opens our tunnel of traffic class `class` to `server`: a link of the
/// peer's stack to its tunnel listener, the handshake, and the seal.
pub(super) async fn open(
    shared: &Arc<Shared>,
    server: Ipv4Addr,
    class: u8,
) -> Result<BoxLink, String> {
    let peer = shared.peer(server).ok_or("unknown peer")?;
    let secret = shared.secret.as_ref().ok_or("no cluster secret")?;
    let (stack_name, tunnel, mac) = peer.tunnel_of(class);
    let stack = shared
        .stacks
        .iter()
        .find(|s| s.name() == stack_name)
        .cloned()
        .ok_or(format!("stack {stack_name} not running"))?;
    let acceptor = Uid::new(server, DAEMON_DEVICE);
    let handshake_ = async {
        let to = match mac {
            Some(mac) => Locator::Mac(mac),
            None => Locator::Socket(tunnel),
        };
        let mut link = stack.connect(&to).await.map_err(|e| e.to_string())?;
        let our_nonce = nonce();
        let hello = frame(
            ReqType::Connect,
            shared.uid(),
            acceptor,
            class,
            our_nonce.to_vec(),
        )
        .ok_or("hello message")?;
        link.send(hello).await.map_err(|e| e.to_string())?;
        let challenge = next(&mut link).await?;
        let body = challenge.payload();
        if challenge.kind() != ReqType::Accept
            || challenge.header().src != acceptor
            || body.len() != NONCE_LEN * 2
        {
            return Err("the peer's answer is not a tunnel challenge".to_string());
        }
        let their_nonce: [u8; NONCE_LEN] = body[..NONCE_LEN].try_into().unwrap_or_default();
        let hs = handshake(
            secret,
            shared.uid(),
            class,
            acceptor,
            our_nonce,
            their_nonce,
        );
        if !tags_equal(&body[NONCE_LEN..], &hs.listener_proof()) {
            shared
                .security
                .refuse_tunnel(&server.to_string(), "did not prove the cluster secret");
            return Err("the peer did not prove the cluster secret".to_string());
        }
        let proof = frame(
            ReqType::Accept,
            shared.uid(),
            acceptor,
            class,
            hs.dialler_proof().to_vec(),
        )
        .ok_or("proof message")?;
        link.send(proof).await.map_err(|e| e.to_string())?;
        Ok::<_, String>((link, hs.session_key()))
    };
    let (link, key) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake_)
        .await
        .map_err(|_| "tunnel handshake timed out".to_string())??;
    let sealer =
        Sealer::new(key, End::Opener, shared.uid(), acceptor).carrying(beyond(shared, server));
    Ok(Box::new(SealedLink::new(link, sealer, shared.clone())))
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

/// A handshake frame of `kind` between two daemons; the source port
/// carries the tunnel's traffic class.
fn frame(kind: ReqType, from: Uid, to: Uid, class: u8, payload: Vec<u8>) -> Option<Message> {
    let request = Request::new(
        kind,
        Params::Port(PortParams {
            flag: 0,
            src_port: u16::from(class),
            dst_port: 0,
        }),
    )
    .ok()?;
    Message::new(Header::new(from, to, request), Bytes::from(payload)).ok()
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
