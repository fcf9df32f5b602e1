//! What the kernel and chain tests share: an application attached to an
//! embedded daemon, and the daemon's status of one device.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use uniplane_services::client::{Client, Session};
use uniplane_services::control::Request;

/// An application attached to the daemon whose sockets are in `dir`.
pub async fn app(dir: &Path) -> Session {
    Client::connect(dir)
        .await
        .unwrap()
        .attach("app")
        .await
        .unwrap()
}

/// The device `name` in `uniplane status`.
pub async fn device(client: &Client, name: &str) -> Value {
    let status = client.request(&Request::Status).await.unwrap();
    status["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
        .unwrap()
}

/// Waits (bounded) until `device`'s status satisfies `ready`.
pub async fn status_until(client: &Client, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = device(client, name).await;
        if ready(&d) {
            return d;
        }
        assert!(Instant::now() < deadline, "status never came to be: {d}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
