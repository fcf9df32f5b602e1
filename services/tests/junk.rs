//! Finding 9 (c) of issue 16: every junk frame sent to a tunnel listener
//! logged a WARN line, so a flood of junk became a flood of log. Now each
//! is counted, and warnings come at most once a second.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tracing_subscriber::layer::SubscriberExt;
use uniplane_services::client::embedded;
use uniplane_services::config::Config;

struct CountWarnings(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountWarnings {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *e.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding9_junk_to_a_tunnel_listener_is_counted_not_logged_each() {
    let warnings = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(CountWarnings(warnings.clone()));
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let tunnel = std::net::SocketAddr::from(([127, 0, 0, 1], uniplane_netns::free_port()));
    let config = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\n[[stacks]]\nname = \"tcp\"\nlisten = \"{tunnel}\"\n"
    );
    let dir = std::env::temp_dir().join(format!("uniplane-junk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, client) = embedded(Config::parse(&config, "junk").unwrap(), &dir)
        .await
        .unwrap();
    let start = Instant::now();
    let before = warnings.load(Ordering::Relaxed);
    let n = 200;
    for i in 0..n {
        let mut s = tokio::net::TcpStream::connect(tunnel).await.unwrap();
        let junk: Vec<u8> = (0..64u32).map(|b| (b * 31 + i) as u8).collect();
        let _ = s.write_all(&junk).await;
    }
    let refused = || async {
        let m = client
            .request(&uniplane_services::control::Request::Metrics)
            .await
            .unwrap();
        m["text"]
            .as_str()
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("uniplane_tunnel_refused_total "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused().await < n as u64 {
        assert!(
            Instant::now() < deadline,
            "refusals counted: {}",
            refused().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let logged = warnings.load(Ordering::Relaxed) - before;
    let seconds = start.elapsed().as_secs() as usize + 1;
    assert!(
        logged <= seconds + 1,
        "{logged} warnings for {n} junk connections in {seconds} s"
    );
    daemon.shutdown();
}
