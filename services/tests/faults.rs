//! After faults — a client that dies mid-call, a malformed control line,
//! unknown UIDs, a plane that refuses an operation — what the daemon
//! believes, what its state calls for and what the plane reads back
//! (`PlaneOp::Dump`, `PlaneOp::Translations`) are one and the same.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::table::TableError;
use uniplane_overlay::{
    Engine, EngineConfig, EngineHandle, PlaneError, PlaneFuture, PlaneHandle, PlaneOp, PlaneReply,
    RunMode,
};
use uniplane_services::client::{Client, ClientError};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::daemon::CONTROL_SOCKET;
use uniplane_services::Daemon;

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

type Pick = fn(&PlaneOp) -> bool;

/// The engine, except that it refuses the next operation `refuse` picks
/// (as a full table would) without applying it.
struct Refusing {
    engine: EngineHandle,
    refuse: Arc<Mutex<Option<Pick>>>,
}

impl PlaneHandle for Refusing {
    fn kind(&self) -> &'static str {
        "engine"
    }

    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture {
        let refused = {
            let mut pick = self.refuse.lock().unwrap();
            let at = pick.and_then(|p| ops.iter().position(p));
            if at.is_some() {
                *pick = None;
            }
            at
        };
        let mut ops = ops;
        if let Some(i) = refused {
            ops.remove(i);
        }
        let inner = self.engine.submit(ops);
        Box::pin(async move {
            let mut results = inner.await?;
            if let Some(i) = refused {
                results.insert(i, Err(PlaneError::Table(TableError::Full(1))));
            }
            Ok(results)
        })
    }
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn line(w: &mut (impl AsyncWriteExt + Unpin), text: &str) {
    w.write_all(format!("{text}\n").as_bytes()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_faults_the_daemon_and_the_planes_read_back_agree() {
    let dir = runtime("faults");
    let mut config = Config::parse(CONFIG, "test").unwrap();
    config.runtime_dir = Some(dir.clone());
    let engine = Engine::new(EngineConfig {
        max_ports: config.max_ports,
        ..EngineConfig::default()
    })
    .spawn(RunMode::SpinThenPark { spins: 256 });
    let refuse = Arc::new(Mutex::new(None));
    let plane = Arc::new(Refusing {
        engine: engine.clone(),
        refuse: refuse.clone(),
    });
    let daemon = Daemon::start_with_plane(config, plane).await.unwrap();

    // Two applications with a connection that lives through it all.
    let server = Client::connect(&dir)
        .await
        .unwrap()
        .attach("server")
        .await
        .unwrap();
    let _listener = server.listen(80).await.unwrap();
    let client = Client::connect(&dir)
        .await
        .unwrap()
        .attach("client")
        .await
        .unwrap();
    let _conn = client.connect(server.uid().port(80)).await.unwrap();

    // A client that attaches, listens, asks for a connection and dies
    // before reading the answer.
    {
        let stream = UnixStream::connect(dir.join(CONTROL_SOCKET)).await.unwrap();
        let (r, mut w) = stream.into_split();
        let mut lines = BufReader::new(r).lines();
        line(&mut w, r#"{"op":"attach","name":"doomed"}"#).await;
        lines.next_line().await.unwrap();
        line(&mut w, r#"{"op":"listen","port":7}"#).await;
        lines.next_line().await.unwrap();
        let to_server = format!(
            r#"{{"op":"connect","dst":"{}","dst_port":80}}"#,
            server.uid()
        );
        line(&mut w, &to_server).await;
        // A malformed line, then gone.
        line(&mut w, "{\"op\":").await;
    }

    // Unknown UIDs: a device nobody has, a server nobody knows.
    for dst in ["127.0.0.1:77", "10.9.9.9:1"] {
        let r = client
            .connect(dst.parse::<uniplane_dataplane::Uid>().unwrap().port(1))
            .await;
        assert!(matches!(r, Err(ClientError::Daemon { .. })), "{dst}: {r:?}");
    }

    // The plane refuses a route while a process attaches.
    *refuse.lock().unwrap() = Some(|op| matches!(op, PlaneOp::AddRoute(..)));
    let refused = Client::connect(&dir).await.unwrap().attach("refused").await;
    assert!(
        matches!(refused, Err(ClientError::Daemon { ref kind, .. }) if kind == "engine"),
        "{:?}",
        refused.err()
    );

    // The daemon settles: the dead client is gone, nothing is in flight.
    let observer = Client::connect(&dir).await.unwrap();
    let start = Instant::now();
    loop {
        let resources = observer.request(&Request::Resources).await.unwrap();
        let names: HashSet<String> = resources
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        let settled = daemon.installed().await == daemon.picture().await;
        if settled && !names.contains("doomed") && !names.contains("refused") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{names:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let conns = observer.request(&Request::Connections).await.unwrap();
    assert_eq!(conns.as_array().map(Vec::len), Some(1), "{conns}");

    // Read the plane back, port by port, and compare.
    let installed = daemon.installed().await.unwrap();
    let resources = observer.request(&Request::Resources).await.unwrap();
    for r in resources.as_array().unwrap() {
        let port = r["port"].as_u64().unwrap() as u16;
        assert!(installed.ports.contains_key(&port), "{r}");
    }
    let max = u16::try_from(daemon_max_ports()).unwrap();
    let ops: Vec<PlaneOp> = (0..max).map(PlaneOp::Dump).collect();
    let dumps = engine.submit(ops).await.unwrap();
    for (port, dump) in (0..max).zip(dumps) {
        let Some(want) = installed.ports.get(&port) else {
            assert!(dump.is_err(), "port {port} is attached but nobody owns it");
            continue;
        };
        let Ok(PlaneReply::Dump(dump)) = dump else {
            panic!("port {port}: {dump:?}");
        };
        let routes: HashSet<(u64, u64, u32, u16)> = dump
            .routes
            .iter()
            .map(|r| (r.key.to_u64() & r.mask, r.mask, r.priority, r.port))
            .collect();
        let wanted: HashSet<(u64, u64, u32, u16)> = want
            .routes
            .values()
            .map(|r| (r.key.to_u64() & r.mask, r.mask, r.priority, r.port))
            .collect();
        assert_eq!(routes, wanted, "routes at port {port}");
        assert_eq!(dump.rules, want.rules, "rules at port {port}");
        let admitted: HashSet<ConnKey> = dump
            .connections
            .iter()
            .flat_map(|k| [*k, k.reversed()])
            .collect();
        let wanted: HashSet<ConnKey> = want
            .allows
            .iter()
            .flat_map(|k| [*k, k.reversed()])
            .collect();
        assert_eq!(admitted, wanted, "connections at port {port}");
    }
    let Ok(mut t) = engine.submit(vec![PlaneOp::Translations]).await else {
        panic!("translations")
    };
    let Some(Ok(PlaneReply::Translations(t))) = t.pop() else {
        panic!("translations")
    };
    assert_eq!(t.len(), installed.translations.len());
    for (k, p) in t {
        assert_eq!(installed.translations.get(&k), Some(&p));
    }
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn daemon_max_ports() -> usize {
    Config::parse(CONFIG, "test").unwrap().max_ports
}
