//! A tonic gRPC service reached by UID: the generated Echo server and
//! client (`proto/echo.proto`, compiled at build time), unchanged, over
//! uniplane's byte-stream adapter.
//!
//! ```text
//! # both ends in this process, on a daemon embedded here:
//! cargo run -p uniplane-rpc --example greeter
//! # or on running daemons (each server its own uniplaned, e.g. in two
//! # network namespaces), by UID:
//! cargo run -p uniplane-rpc --example greeter -- serve          # prints its UID
//! cargo run -p uniplane-rpc --example greeter -- call 10.0.0.2:3
//! ```

use std::sync::Arc;

use bytes::Bytes;
use tonic::transport::{Endpoint, Server};
use uniplane_client::{Client, Session};
use uniplane_dataplane::Uid;
use uniplane_rpc::echo::echo_client::EchoClient;
use uniplane_rpc::echo::echo_server::EchoServer;
use uniplane_rpc::echo::{Payload, Repeat};
use uniplane_rpc::tonic::{incoming, EchoService, UidConnector};

const PORT: u16 = 50051;

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn serve(session: &Session) -> Result<(), Error> {
    let listener = session.listen(PORT).await?;
    Server::builder()
        .add_service(EchoServer::new(EchoService))
        .serve_with_incoming(incoming(listener))
        .await?;
    Ok(())
}

async fn call(session: Arc<Session>, server: Uid) -> Result<(), Error> {
    // The URI only names the channel; the connector dials the UID.
    let channel = Endpoint::from_static("http://uniplane")
        .connect_with_connector(UidConnector::new(session, server.port(PORT)))
        .await?;
    let mut echo = EchoClient::new(channel);
    let answer = echo
        .unary(Payload {
            data: Bytes::from_static(b"hello over uniplane"),
        })
        .await?;
    println!("unary: {:?}", answer.into_inner().data);
    let mut stream = echo
        .server_stream(Repeat {
            data: Bytes::from_static(b"again"),
            count: 3,
        })
        .await?
        .into_inner();
    while let Some(p) = stream.message().await? {
        println!("stream: {:?}", p.data);
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => {
            let session = Client::connect_default().await?.attach("greeter").await?;
            println!("serving Echo at {}/{PORT}", session.uid());
            serve(&session).await
        }
        Some("call") => {
            let server: Uid = args.get(1).ok_or("call UID")?.parse()?;
            let session = Client::connect_default().await?.attach("caller").await?;
            call(Arc::new(session), server).await
        }
        _ => {
            let dir = std::env::temp_dir().join(format!("uniplane-greeter-{}", std::process::id()));
            let config = uniplane_services::config::Config::parse(
                "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n",
                "greeter",
            )?;
            let (daemon, control) = uniplane_services::client::embedded(config, &dir).await?;
            let server = control.attach("greeter").await?;
            let uid = server.uid();
            tokio::spawn(async move { serve(&server).await });
            let caller = Client::connect(daemon.runtime_dir())
                .await?
                .attach("caller")
                .await?;
            let result = call(Arc::new(caller), uid).await;
            daemon.shutdown();
            let _ = std::fs::remove_dir_all(&dir);
            result
        }
    }
}
