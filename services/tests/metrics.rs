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
