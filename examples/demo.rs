//! Two endpoints exchange messages over the `mem` stack: a client sends
//! SENDs and one-sided WRTEs, an echo server answers each with its
//! completion, and both print what happened.
//!
//! Run: `cargo run --release --example demo`

use std::net::Ipv4Addr;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane::wire::{Header, MemoryParams, MsgFlags, Params, PortParams, ReqType, Request};
use uniplane::{Locator, Message, Stack, Uid};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stack = uniplane::stacks::inproc::InProcessStack::new();
    let server_uid = Uid::new(Ipv4Addr::LOCALHOST, 1);
    let client_uid = Uid::new(Ipv4Addr::LOCALHOST, 2);
    let name: Locator = "mem:echo".parse()?;

    let mut listener = stack.listen(&name).await?;
    println!(
        "server {server_uid} listening at {name} (stack {}, {:?})",
        stack.name(),
        stack.capabilities()
    );

    let server = tokio::spawn(async move {
        let mut link = listener.next().await.expect("listener open")?;
        while let Some(m) = link.next().await {
            let m = m?;
            let h = m.header();
            println!(
                "server <- {} from {} ({} bytes, seq {})",
                h.request.kind(),
                h.src,
                m.payload().len(),
                h.seqnum
            );
            let answer = match *h.request.params() {
                Params::Port(p) => Request::new(
                    ReqType::SendCmpl,
                    Params::Port(PortParams {
                        flag: 0,
                        src_port: p.dst_port,
                        dst_port: p.src_port,
                    }),
                )?,
                Params::Memory(p) => Request::new(
                    ReqType::WriteCmpl,
                    Params::Memory(MemoryParams {
                        flag: 0,
                        length: p.length,
                        addr: p.addr,
                    }),
                )?,
                _ => continue,
            };
            let mut reply = Header::new(h.dst, h.src, answer);
            reply.seqnum = h.seqnum;
            link.send(Message::new(reply, Bytes::new())?).await?;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });

    let mut link = stack.connect(&name).await?;
    println!("client {client_uid} connected to {name}");
    for seq in 0..3u32 {
        let mut m = Message::send(
            client_uid.port(5000),
            server_uid.port(7),
            Bytes::from(format!("hello #{seq}")),
        )?;
        m.set_seqnum(seq);
        link.send(m).await?;
        println!("client -> SEND seq {seq}");
    }
    let mut w = Message::write(
        client_uid,
        server_uid.at(0x1000),
        Bytes::from_static(&[0xab; 64]),
    )?;
    w.set_seqnum(3);
    link.send(w).await?;
    println!("client -> WRTE 64 bytes at {}", server_uid.at(0x1000));

    for _ in 0..4 {
        let m = link.next().await.ok_or("server closed early")??;
        let h = m.header();
        assert!(!h.flags.contains(MsgFlags::ERROR));
        println!(
            "client <- {} seq {} status {:?}",
            h.request.kind(),
            h.seqnum,
            h.status()
        );
    }
    drop(link);
    server.await?.map_err(|e| e.to_string())?;
    println!("done: 4 requests, 4 completions");
    Ok(())
}
