//! `uniplane top --once` against a running daemon: the snapshot lists the
//! daemon's ports and an open connection.

use std::process::Command;
use std::time::Duration;

use uniplane_services::client::embedded;
use uniplane_services::config::Config;

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

/// The lines of `text` under the heading `title`, up to the next blank line.
fn section<'a>(text: &'a str, title: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != title)
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_lists_the_daemons_ports_and_an_open_connection() {
    let dir = std::env::temp_dir().join(format!("uniplane-test-top-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (_daemon, client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
        .await
        .unwrap();
    let app = client.attach("shop").await.unwrap();
    let mut listener = app.listen(80).await.unwrap();
    let conn = app.connect(app.uid().port(80)).await.unwrap();
    let _accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
        .await
        .unwrap()
        .unwrap();

    let out = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_uniplane"))
                .args(["top", "--once"])
                .env("UNIPLANE_RUNTIME_DIR", &dir)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("uniplane top: 127.0.0.1"), "{text}");

    let ports = section(&text, "PORTS");
    for name in ["echo", "shop"] {
        assert!(
            ports
                .iter()
                .any(|l| l.split_whitespace().nth(1) == Some(name)),
            "no port {name} in\n{text}"
        );
    }
    let conns = section(&text, "CONNECTIONS");
    let (src, dst) = (
        format!("{}/{}", conn.local().uid, conn.local().port),
        format!("{}/80", app.uid()),
    );
    assert!(
        conns.iter().any(|l| {
            let cells: Vec<_> = l.split_whitespace().collect();
            cells.first() == Some(&src.as_str()) && cells.get(1) == Some(&dst.as_str())
        }),
        "no connection {src} -> {dst} in\n{text}"
    );

    // Without --once, stdout not being a terminal gives the same snapshot.
    let piped = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            Command::new(env!("CARGO_BIN_EXE_uniplane"))
                .arg("top")
                .env("UNIPLANE_RUNTIME_DIR", &dir)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(piped.status.success());
    let piped = String::from_utf8(piped.stdout).unwrap();
    assert!(piped.starts_with("uniplane top: 127.0.0.1"), "{piped}");
    assert_eq!(section(&piped, "CONNECTIONS").len(), conns.len());
    let _ = std::fs::remove_dir_all(&dir);
}
