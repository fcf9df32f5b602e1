//! One daemon in this process: the control protocol, the CLI, and the
//! data path, on loopback only.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use uniplane_services::client::{embedded, ClientError};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::daemon::CONTROL_SOCKET;

const CONFIG: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"

[[devices]]
name = "echo"
kind = "echo"
device = 1
memory = 4096
"#;

/// Runs the CLI against the daemon at `dir`; its standard output, once
/// it succeeded.
fn cli(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_uniplane"))
        .args(args)
        .env("UNIPLANE_RUNTIME_DIR", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_control_requests_get_errors_and_change_nothing() {
    let dir = runtime("malformed");
    let (_daemon, client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    let before = client.request(&Request::Resources).await.unwrap();

    let stream = UnixStream::connect(dir.join(CONTROL_SOCKET)).await.unwrap();
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    for bad in [
        "not json",
        r#"{"op":"fly"}"#,
        r#"{"op":"connect","dst":"nonsense","dst_port":1}"#,
        r#"{"op":"tables","device":99}"#,
        r#"{"op":"close","conn":{"src":"127.0.0.1:1","src_port":1,"dst":"127.0.0.1:2","dst_port":2}}"#,
        r#"{"op":"listen","port":5}"#,
        r#"{"op":"policy","device":1,"set":"weighted:0"}"#,
    ] {
        w.write_all(format!("{bad}\n").as_bytes()).await.unwrap();
        let answer: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["ok"], false, "{bad} → {answer}");
        assert!(answer["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let after = client.request(&Request::Resources).await.unwrap();
    assert_eq!(before, after, "nothing changed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_answers_status_and_pings_the_echo_device() {
    let dir = runtime("cli");
    let (_daemon, _client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    let cli = |args: &[&str]| cli(&dir, args);
    let status: serde_json::Value = tokio::task::spawn_blocking({
        let cli_out = cli(&["status", "--json"]);
        move || serde_json::from_str(cli_out.trim()).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(status["server"], "127.0.0.1");
    let ping = cli(&["ping", "self", "--count", "5", "--json"]);
    let summary: serde_json::Value =
        serde_json::from_str(ping.trim().lines().last().unwrap()).unwrap();
    assert_eq!(summary["received"], 5);
    assert!(summary["rtt_us"]["p50"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_applications_connect_and_detaching_closes_their_connections() {
    apps_connect_and_detach(CONFIG, "apps").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_on_an_engine_of_three_shards() {
    // The daemon's port, the echo device and the two applications land
    // on different shards: setup, data, teardown and metrics all cross.
    let config = format!("{CONFIG}\n[engine]\nshards = 3\nmode = \"spin-then-park\"\n");
    apps_connect_and_detach(&config, "apps-sharded").await;
}

async fn apps_connect_and_detach(config: &str, name: &str) {
    let dir = runtime(name);
    let (daemon, client) = embedded(Config::parse(config, "test").unwrap(), &dir)
        .await
        .unwrap();
    let parsed = Config::parse(config, "test").unwrap();
    let status = client.request(&Request::Status).await.unwrap();
    assert_eq!(status["engine"]["shards"], parsed.shards, "{status}");
    let server_app = client.attach("server").await.unwrap();
    let mut listener = server_app.listen(80).await.unwrap();
    let client_app = uniplane_services::client::Client::connect(daemon.runtime_dir())
        .await
        .unwrap()
        .attach("client")
        .await
        .unwrap();
    let mut conn = client_app.connect(server_app.uid().port(80)).await.unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(accepted.remote(), conn.local());
    conn.send_bytes(Bytes::from_static(b"ping")).await.unwrap();
    let got = accepted.recv().await.unwrap().unwrap();
    assert_eq!(got.payload().as_ref(), b"ping");
    accepted
        .send_bytes(Bytes::from_static(b"pong"))
        .await
        .unwrap();
    assert_eq!(
        conn.recv().await.unwrap().unwrap().payload().as_ref(),
        b"pong"
    );

    // Metrics: Prometheus text with the setup histogram and port counters.
    let metrics = client_app
        .client()
        .request(&Request::Metrics)
        .await
        .unwrap();
    let text = metrics["text"].as_str().unwrap();
    assert!(
        text.contains("uniplane_connect_seconds_count{path=\"local\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE uniplane_port_rx_messages counter"),
        "{text}"
    );
    assert!(text.contains("uniplane_connections 1"), "{text}");

    // Nothing listens there: refused.
    let refused = client_app.connect(server_app.uid().port(81)).await;
    assert!(matches!(refused, Err(ClientError::Daemon { ref kind, .. }) if kind == "refused"));

    // The server goes away: the client's connection ends.
    drop(listener);
    drop(accepted);
    drop(server_app);
    let end = tokio::time::timeout(Duration::from_secs(2), conn.recv())
        .await
        .unwrap();
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
    let observer = uniplane_services::client::Client::connect(daemon.runtime_dir())
        .await
        .unwrap();
    let resources = observer.request(&Request::Resources).await.unwrap();
    assert!(
        !resources
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "server"),
        "the detached resource is gone: {resources}"
    );
    let conns = observer.request(&Request::Connections).await.unwrap();
    assert_eq!(conns.as_array().map(Vec::len), Some(0), "{conns}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rows of `uniplane plane dump` for the port named `name`.
fn dump_port<'a>(dump: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    dump["ports"]
        .as_array()
        .and_then(|rows| rows.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no port {name} in {dump}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plane_dump_reads_the_connection_back_from_the_plane_and_sees_it_go() {
    let dir = runtime("dump");
    let (_daemon, client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    let app = client.attach("app").await.unwrap();
    let conn = app
        .connect(
            "127.0.0.1:1"
                .parse::<uniplane_dataplane::Uid>()
                .unwrap()
                .port(7),
        )
        .await
        .unwrap();
    let observer = uniplane_services::client::Client::connect(&dir)
        .await
        .unwrap();
    let dump = observer.request(&Request::PlaneDump).await.unwrap();
    assert_eq!(dump["plane"], "engine");
    let want = serde_json::json!({
        "src": conn.local().uid.to_string(), "src_port": conn.local().port,
        "dst": "127.0.0.1:1", "dst_port": 7,
    });
    for name in ["app", "echo"] {
        let port = dump_port(&dump, name);
        let conns = port["connections"].as_array().unwrap();
        assert!(
            conns
                .iter()
                .any(|c| *c == want || (c["src"] == want["dst"] && c["dst"] == want["src"])),
            "{name} admits the connection: {port}"
        );
        let routes = port["routes"].as_array().unwrap();
        assert!(
            routes
                .iter()
                .any(|r| r["key"] == conn.local().uid.to_string()),
            "{name} routes to the app: {port}"
        );
    }
    app.close(conn).await.unwrap();
    let dump = observer.request(&Request::PlaneDump).await.unwrap();
    for name in ["app", "echo"] {
        let port = dump_port(&dump, name);
        assert_eq!(
            port["connections"].as_array().map(Vec::len),
            Some(0),
            "{name} no longer admits it: {port}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_directory_names_resolve_to_this_daemons_resources() {
    let dir = runtime("resolve-local");
    let (_daemon, client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    let server_name = client.request(&Request::Status).await.unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let app = uniplane_services::client::Client::connect(&dir)
        .await
        .unwrap()
        .attach("worker")
        .await
        .unwrap();
    assert_eq!(
        client.resolve("echo").await.unwrap().to_string(),
        "127.0.0.1:1"
    );
    assert_eq!(
        client
            .resolve(&format!("echo@{server_name}"))
            .await
            .unwrap()
            .to_string(),
        "127.0.0.1:1"
    );
    assert_eq!(client.resolve("worker").await.unwrap(), app.uid());
    let kind = |r: Result<_, ClientError>| match r {
        Err(ClientError::Daemon { kind, .. }) => kind,
        r => panic!("{r:?}"),
    };
    assert_eq!(kind(client.resolve("nobody").await), "not-found");
    assert_eq!(kind(client.resolve("a/b").await), "bad-request");
    let _twin = uniplane_services::client::Client::connect(&dir)
        .await
        .unwrap()
        .attach("worker")
        .await
        .unwrap();
    assert_eq!(kind(client.resolve("worker").await), "exists", "ambiguous");
    // Claiming a cluster-wide name needs a directory.
    assert_eq!(
        kind(app.register("worker").await.map(|_| app.uid())),
        "unsupported"
    );

    let cli = |args: &[&str]| serde_json::from_str::<serde_json::Value>(&cli(&dir, args)).unwrap();
    assert_eq!(cli(&["resolve", "echo", "--json"])["uid"], "127.0.0.1:1");
    assert_eq!(cli(&["cluster", "status", "--json"])["registry"], "local");
    let _ = std::fs::remove_dir_all(&dir);
}
