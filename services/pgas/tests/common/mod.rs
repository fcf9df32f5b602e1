//! A group of endpoints on one embedded daemon: every message crosses the
//! shared-memory data path and the engine.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use uniplane_pgas::{Endpoint, Group, Options};
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

const CONFIG: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"
"#;

/// Every wait in these tests has this deadline: a hang detector, not a
/// timing (800 contended fetch-adds over parked sessions took over 20 s
/// on this 2-core machine at load 12).
pub const WAIT: Duration = Duration::from_secs(60);

pub struct Setup {
    pub daemon: Daemon,
    pub dir: PathBuf,
    pub eps: Vec<Endpoint>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.eps.clear();
        self.daemon.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `f` with the test deadline.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result in {WAIT:?}"))
}

/// `n` endpoints of one daemon, bound; `prepare` registers segments and
/// handlers on each before the group joins.
pub async fn group(name: &str, n: usize, prepare: impl Fn(&Endpoint)) -> Setup {
    group_with(name, n, Options::default(), prepare).await
}

pub async fn group_with(
    name: &str,
    n: usize,
    options: Options,
    prepare: impl Fn(&Endpoint),
) -> Setup {
    group_with_devices(name, n, "", &[], options, prepare).await
}

/// [`group_with`] on a daemon that also has `devices` (configuration
/// text), the kernel devices `hardware` joining the group as hardware
/// ranks after the `n` software ones.
pub async fn group_with_devices(
    name: &str,
    n: usize,
    devices: &str,
    hardware: &[uniplane_dataplane::Uid],
    options: Options,
    prepare: impl Fn(&Endpoint),
) -> Setup {
    let dir = std::env::temp_dir().join(format!("uniplane-pgas-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = Config::parse(&format!("{CONFIG}{devices}"), name).unwrap();
    let (daemon, _client) = embedded(config, &dir).await.unwrap();
    let mut eps = Vec::new();
    for i in 0..n {
        let session = uniplane_services::client::Client::connect(daemon.runtime_dir())
            .await
            .unwrap()
            .attach(&format!("rank{i}"))
            .await
            .unwrap();
        let ep = Endpoint::bind(session, options.clone()).await.unwrap();
        prepare(&ep);
        eps.push(ep);
    }
    let mut members: Vec<_> = eps.iter().map(Endpoint::uid).collect();
    members.extend_from_slice(hardware);
    let g = Group::new(members).with_hardware(n..n + hardware.len());
    let joins = eps.iter().map(|e| e.join(g.clone()));
    for r in within("join", futures_util::future::join_all(joins)).await {
        r.unwrap();
    }
    Setup { daemon, dir, eps }
}
