//! tarpc over uniplane (feature `tarpc`): a tarpc service called by UID
//! through an embedded daemon.

use std::time::Duration;

use futures_util::StreamExt;
use tarpc::server::{BaseChannel, Channel};
use uniplane_rpc::ByteStream;
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;

#[tarpc::service]
trait Adder {
    /// The sum.
    async fn add(a: i32, b: i32) -> i32;
}

#[derive(Clone)]
struct AdderServer;

impl Adder for AdderServer {
    async fn add(self, _: tarpc::context::Context, a: i32, b: i32) -> i32 {
        a + b
    }
}

async fn spawn(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    tokio::spawn(fut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tarpc_client_calls_its_server_by_uid() {
    let dir = std::env::temp_dir().join(format!("uniplane-rpc-tarpc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = Config::parse(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n",
        "t",
    );
    let (daemon, control) = embedded(config.unwrap(), &dir).await.unwrap();
    let server = control.attach("server").await.unwrap();
    let mut listener = server.listen(9).await.unwrap();
    tokio::spawn(async move {
        while let Some(conn) = listener.accept().await {
            let t = uniplane_rpc::tarpc::transport(ByteStream::accepted(conn));
            tokio::spawn(
                BaseChannel::with_defaults(t)
                    .execute(AdderServer.serve())
                    .for_each(spawn),
            );
        }
    });
    let caller = Client::connect(daemon.runtime_dir())
        .await
        .unwrap()
        .attach("caller")
        .await
        .unwrap();
    let conn = caller.connect(server.uid().port(9)).await.unwrap();
    let t = uniplane_rpc::tarpc::transport(ByteStream::connected(conn));
    let client = AdderClient::new(tarpc::client::Config::default(), t).spawn();
    for (a, b) in [(1, 2), (40, 2), (-5, 5)] {
        let sum = tokio::time::timeout(
            Duration::from_secs(5),
            client.add(tarpc::context::current(), a, b),
        )
        .await
        .expect("an answer in time")
        .unwrap();
        assert_eq!(sum, a + b);
    }
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
