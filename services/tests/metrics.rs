//! The metrics endpoint of a running daemon, over HTTP as Prometheus
//! scrapes it, and the Grafana dashboard built on it: every metric a
//! dashboard query names is one the daemon exports.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uniplane_services::client::embedded;
use uniplane_services::config::Config;

const DASHBOARD: &str = include_str!("../../docs/grafana/uniplane.json");

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.1 request; the status line and the body.
async fn get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw))
        .await
        .expect("the endpoint answers and closes")
        .unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header and a body");
    let status = head.lines().next().unwrap_or_default().to_owned();
    assert!(
        head.to_ascii_lowercase().contains("content-length:"),
        "{head}"
    );
    (status, body.to_owned())
}

/// The sample names a family of this type and name may produce.
fn samples(kind: &str, family: &str) -> Vec<String> {
    match kind {
        "counter" => vec![format!("{family}_total")],
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{family}{s}"))
            .collect(),
        _ => vec![family.to_owned()],
    }
}

/// Every `uniplane_*` name in the dashboard's queries.
fn dashboard_metrics() -> BTreeSet<String> {
    let dash: serde_json::Value = serde_json::from_str(DASHBOARD).expect("valid JSON");
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(&dash, &mut exprs);
    assert!(exprs.len() > 20, "the dashboard has its queries");
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(at) = rest.find("uniplane_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_served_by_a_running_daemon() {
    let port = free_port();
    let config = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\
         [runtime]\nmetrics = \"127.0.0.1:{port}\"\n\
         [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\nmemory = 4096\n"
    );
    let dir = runtime("metrics-http");
    let (_daemon, client) = embedded(Config::parse(&config, "test").unwrap(), &dir)
        .await
        .unwrap();
    // An application with an open connection, so ports have samples.
    let server = client.attach("server").await.unwrap();
    let mut listener = server.listen(80).await.unwrap();
    let _conn = server.connect(server.uid().port(80)).await.unwrap();
    let _accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
        .await
        .unwrap()
        .unwrap();

    let (status, text) = get(port, "/metrics").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("uniplane_connections 1\n"), "{text}");
    assert!(
        text.contains("uniplane_port_rx_messages_total{port=\""),
        "{text}"
    );

    let mut exported = BTreeSet::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (family, kind) = t.split_once(' ').unwrap();
            exported.extend(samples(kind, family));
        }
    }
    let wanted = dashboard_metrics();
    assert!(wanted.len() >= 30, "{wanted:?}");
    let missing: Vec<_> = wanted.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics the daemon does not export: {missing:?}"
    );

    let (status, _) = get(port, "/other").await;
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
}

/// The value of the one sample of `text` that starts with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<u64> {
    let mut found = text.lines().filter_map(|l| l.strip_prefix(prefix));
    let v = found.next()?.trim().parse().ok();
    assert!(found.next().is_none(), "one sample starts with {prefix}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_counts_exactly_the_messages_and_bytes_it_carried_each_way() {
    const N: u64 = 300;
    const SIZE: usize = 1000;
    const BACK: u64 = 7;
    const BACK_SIZE: usize = 33;
    let port = free_port();
    let config = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\
         [runtime]\nmetrics = \"127.0.0.1:{port}\"\n"
    );
    let dir = runtime("metrics-connection");
    let (daemon, client) = embedded(Config::parse(&config, "test").unwrap(), &dir)
        .await
        .unwrap();
    let a = client.attach("a").await.unwrap();
    let b = uniplane_services::client::Client::connect(daemon.runtime_dir())
        .await
        .unwrap()
        .attach("b")
        .await
        .unwrap();
    let mut listener = b.listen(80).await.unwrap();
    let mut conn = a.connect(b.uid().port(80)).await.unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
        .await
        .unwrap()
        .unwrap();
    let within = Duration::from_secs(10);
    for i in 0..N {
        conn.send_bytes(vec![i as u8; SIZE].into()).await.unwrap();
    }
    for _ in 0..N {
        let m = tokio::time::timeout(within, accepted.recv())
            .await
            .expect("every message arrives")
            .unwrap()
            .unwrap();
        assert_eq!(m.payload().len(), SIZE);
    }
    for _ in 0..BACK {
        accepted
            .send_bytes(vec![1; BACK_SIZE].into())
            .await
            .unwrap();
    }
    for _ in 0..BACK {
        tokio::time::timeout(within, conn.recv())
            .await
            .expect("every answer arrives")
            .unwrap()
            .unwrap();
    }

    // Every message was delivered, so every one was counted on its way in.
    let observer = uniplane_services::client::Client::connect(daemon.runtime_dir())
        .await
        .unwrap();
    let conns = observer
        .request(&uniplane_client::protocol::Request::Connections)
        .await
        .unwrap();
    let conns = conns.as_array().expect("a list");
    assert_eq!(conns.len(), 1, "{conns:?}");
    let c = &conns[0];
    assert_eq!(c["src_to_dst_messages"], N, "{c}");
    assert_eq!(c["src_to_dst_bytes"], N * SIZE as u64, "{c}");
    assert_eq!(c["dst_to_src_messages"], BACK, "{c}");
    assert_eq!(c["dst_to_src_bytes"], BACK * BACK_SIZE as u64, "{c}");

    let (local, remote) = (conn.local(), conn.remote());
    let labels = |direction: &str| {
        format!(
            "{{src=\"{}\",src_port=\"{}\",dst=\"{}\",dst_port=\"{}\",direction=\"{direction}\"}} ",
            local.uid, local.port, remote.uid, remote.port
        )
    };
    let (status, text) = get(port, "/metrics").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let metric = |name: &str, direction: &str| {
        sample(&text, &format!("{name}{}", labels(direction)))
            .unwrap_or_else(|| panic!("{name} {direction} exported: {text}"))
    };
    assert_eq!(
        metric("uniplane_connection_messages_total", "src_to_dst"),
        N
    );
    assert_eq!(
        metric("uniplane_connection_bytes_total", "src_to_dst"),
        N * SIZE as u64
    );
    assert_eq!(
        metric("uniplane_connection_messages_total", "dst_to_src"),
        BACK
    );
    assert_eq!(
        metric("uniplane_connection_bytes_total", "dst_to_src"),
        BACK * BACK_SIZE as u64
    );
    assert_eq!(sample(&text, "uniplane_connections_unexported "), Some(0));

    // Closed, the connection's series go with it.
    drop(conn);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (_, text) = get(port, "/metrics").await;
        if !text.contains("uniplane_connection_messages_total{") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection's series stay: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(accepted);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_left_out_and_counted() {
    let port = free_port();
    let config = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\
         [runtime]\nmetrics = \"127.0.0.1:{port}\"\nmetrics_connections = 2\n"
    );
    let dir = runtime("metrics-cap");
    let (_daemon, client) = embedded(Config::parse(&config, "test").unwrap(), &dir)
        .await
        .unwrap();
    let server = client.attach("server").await.unwrap();
    let mut listener = server.listen(80).await.unwrap();
    let mut open = Vec::new();
    for _ in 0..5 {
        let c = server.connect(server.uid().port(80)).await.unwrap();
        let a = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .unwrap()
            .unwrap();
        open.push((c, a));
    }
    let (_, text) = get(port, "/metrics").await;
    assert_eq!(sample(&text, "uniplane_connections "), Some(5), "{text}");
    assert_eq!(
        sample(&text, "uniplane_connections_unexported "),
        Some(3),
        "{text}"
    );
    let series = text
        .lines()
        .filter(|l| l.starts_with("uniplane_connection_messages_total{"))
        .count();
    assert_eq!(series, 2 * 2, "two connections, two directions: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}
