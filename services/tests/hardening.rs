//! One daemon in this process, hardened: the limits of its file are the
//! ones it enforces, and the control protocol refuses what it does not
//! know.

use std::path::PathBuf;

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

fn runtime(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("uniplane-hardening-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_of_the_file_are_the_ones_the_daemon_enforces() {
    let dir = runtime("limits");
    let config = format!("{CONFIG}\n[limits]\nlistening_per_resource = 2\n");
    let (_daemon, client) = embedded(Config::parse(&config, "test").unwrap(), &dir)
        .await
        .unwrap();
    let session = client.attach("app").await.unwrap();
    let _a = session.listen(80).await.unwrap();
    let _b = session.listen(81).await.unwrap();
    let third = session.listen(82).await;
    assert!(
        matches!(&third, Err(ClientError::Daemon { kind, .. }) if kind == "limit"),
        "{:?}",
        third.err()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding5_the_daemon_makes_its_runtime_dir_0700_and_refuses_an_open_one() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = runtime("finding5");
    let (daemon, _client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    daemon.shutdown();

    // The same directory, opened to everyone while no daemon ran.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .err()
        .expect("a daemon started in a directory anyone may write to");
    let text = err.to_string();
    for part in [&dir.display().to_string(), "mode 0777", "chmod go-w"] {
        assert!(text.contains(part), "{part} not in: {text}");
    }
    assert!(
        !dir.join(uniplane_services::daemon::CONTROL_SOCKET).exists(),
        "no socket was bound there"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding9_unknown_control_fields_refused() {
    let dir = runtime("finding9");
    let (_daemon, client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    let before = client.request(&Request::Resources).await.unwrap();

    let stream = UnixStream::connect(dir.join(CONTROL_SOCKET)).await.unwrap();
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    for request in [
        r#"{"op":"status","bogus":1}"#,
        r#"{"op":"attach","name":"sneaky","bogus":1}"#,
        r#"{"op":"connect","dst":"127.0.0.1:1","dst_port":7,"bogus":1}"#,
        r#"{"op":"close","conn":{"src":"127.0.0.1:1","src_port":1,"dst":"127.0.0.1:2","dst_port":2,"bogus":1}}"#,
    ] {
        w.write_all(format!("{request}\n").as_bytes())
            .await
            .unwrap();
        let answer: serde_json::Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(answer["ok"], false, "{request} → {answer}");
        assert_eq!(
            answer["error"]["kind"], "bad-request",
            "{request} → {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("unknown field `bogus`"),
            "{request} → {answer}"
        );
    }
    // The same requests without the unknown field are answered.
    w.write_all(b"{\"op\":\"status\"}\n").await.unwrap();
    let answer: serde_json::Value =
        serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(answer["ok"], true, "{answer}");
    let after = client.request(&Request::Resources).await.unwrap();
    assert_eq!(before, after, "nothing attached");
    let _ = std::fs::remove_dir_all(&dir);
}
