//! A tower service chain over uniplane-rpc, with tower's own layers.
//!
//! Server: identity (authorize by the caller's UID) → rate limit →
//! load shedding → concurrency limit → the handler. Client: retry with a
//! budget → timeout → concurrency limit → [`uniplane_rpc::Client`].
//!
//! ```text
//! cargo run -p uniplane-rpc --example layers
//! ```

use std::time::Duration;

use bytes::Bytes;
use tower::retry::budget::{Budget, TpsBudget};
use tower::{Service, ServiceBuilder, ServiceExt};
use uniplane_client::Client as Uniplane;
use uniplane_rpc::identity::AuthorizeLayer;
use uniplane_rpc::{
    BoxError, Call, Client, ClientOptions, Code, Reply, ServerCall, ServerOptions, Status,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Retries calls that failed with `Unavailable`, as long as the budget
/// (a share of the successful calls) allows.
#[derive(Clone)]
struct RetryUnavailable {
    budget: std::sync::Arc<TpsBudget>,
}

impl tower::retry::Policy<Call, Bytes, BoxError> for RetryUnavailable {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _call: &mut Call,
        result: &mut Result<Bytes, BoxError>,
    ) -> Option<Self::Future> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(e) => {
                let unavailable = e
                    .downcast_ref::<Status>()
                    .is_some_and(|s| s.code() == Code::Unavailable);
                (unavailable && self.budget.withdraw()).then(|| std::future::ready(()))
            }
        }
    }

    fn clone_request(&mut self, call: &Call) -> Option<Call> {
        Some(call.clone())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("uniplane-layers-{}", std::process::id()));
    let config = uniplane_services::config::Config::parse(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n",
        "layers",
    )?;
    let (daemon, control) = uniplane_services::client::embedded(config, &dir).await?;
    let server = control.attach("server").await?;
    let caller = Uniplane::connect(daemon.runtime_dir())
        .await?
        .attach("caller")
        .await?;
    let allowed = caller.uid();

    // The server's chain, one per connection.
    let listener = server.listen(7).await?;
    let handler = tower::service_fn(|call: ServerCall| async move {
        let who = call.peer().uid;
        let message = call.into_message().await?;
        Ok::<_, Status>(Reply::Unary(Bytes::from(format!(
            "{who} sent {} bytes",
            message.len()
        ))))
    });
    let running = uniplane_rpc::spawn(
        listener,
        move |_peer| {
            ServiceBuilder::new()
                .map_err(Status::from)
                .layer(AuthorizeLayer::new(move |peer| peer.uid == allowed))
                .rate_limit(10_000, Duration::from_secs(1))
                .load_shed()
                .concurrency_limit(64)
                .service(handler)
        },
        ServerOptions::default(),
    );

    // The caller's chain.
    let conn = caller.connect(server.uid().port(7)).await?;
    let budget = std::sync::Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.2));
    let mut svc = ServiceBuilder::new()
        .retry(RetryUnavailable { budget })
        .timeout(Duration::from_secs(1))
        .concurrency_limit(32)
        .service(Client::new(conn, ClientOptions::default()));
    for i in 0..3 {
        let call = Call::new("/demo/Size", Bytes::from(vec![0u8; 10 * (i + 1)]));
        let answer = svc.ready().await?.call(call).await?;
        println!("{}", String::from_utf8_lossy(&answer));
    }
    running.shutdown(Duration::from_secs(1)).await;
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
