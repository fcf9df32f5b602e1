//! A world of N ranks as tasks of this process, each its own session of
//! one embedded daemon: every message crosses the shared-memory data path
//! and the engine.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use uniplane_client::Client;
use uniplane_collectives::{join, Communicator, Options, WorldSpec};
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

pub const CONFIG: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"
"#;

/// Deadline of a whole test step.
pub const STEP: Duration = Duration::from_secs(60);

pub struct World {
    pub daemon: Daemon,
    pub dir: PathBuf,
    pub comms: Vec<Communicator>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.daemon.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn options() -> Options {
    Options {
        timeout: Duration::from_secs(10),
        setup_timeout: Duration::from_secs(20),
        ..Options::default()
    }
}

pub async fn daemon(name: &str) -> (Daemon, PathBuf) {
    let dir = std::env::temp_dir().join(format!("uniplane-coll-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, _client) = embedded(Config::parse(CONFIG, name).unwrap(), &dir)
        .await
        .unwrap();
    (daemon, dir)
}

/// `n` ranks of job `name`, joined.
pub async fn world(name: &str, n: usize, options: Options) -> World {
    let (daemon, dir) = daemon(name).await;
    let joins = (0..n).map(|rank| {
        let dir = dir.clone();
        let options = options.clone();
        let spec = WorldSpec {
            job: name.into(),
            rank,
            size: n,
        };
        tokio::spawn(async move {
            let client = Client::connect(&dir).await?;
            join(client, &spec, options).await
        })
    });
    let comms = tokio::time::timeout(STEP, futures_util::future::join_all(joins))
        .await
        .expect("the world joins in time")
        .into_iter()
        .map(|r| r.expect("join task").expect("join"))
        .collect();
    World { daemon, dir, comms }
}

/// Runs `f` on every rank at once (one task each); the results by rank.
pub async fn on_all<F, Fut, R>(comms: &[Communicator], f: F) -> Vec<R>
where
    F: Fn(Communicator) -> Fut,
    Fut: Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let tasks: Vec<_> = comms.iter().map(|c| tokio::spawn(f(c.clone()))).collect();
    tokio::time::timeout(STEP, futures_util::future::join_all(tasks))
        .await
        .expect("every rank finishes in time")
        .into_iter()
        .map(|r| r.expect("rank task"))
        .collect()
}

/// A 64-bit mix (splitmix64's finaliser): seeded test data.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Values of a type from a hash: integers take every bit pattern (so sums
/// and products wrap), floats are small integers (so every order of
/// summation is exact).
pub trait Gen: uniplane_collectives::Element + PartialEq {
    fn gen(x: u64) -> Self;
}

macro_rules! gen_int {
    ($($t:ty),*) => {$(impl Gen for $t { fn gen(x: u64) -> Self { x as $t } })*};
}
gen_int!(i8, i16, i32, i64, u8, u16, u32, u64);
impl Gen for f32 {
    fn gen(x: u64) -> Self {
        (x % 17) as f32 - 8.0
    }
}
impl Gen for f64 {
    fn gen(x: u64) -> Self {
        (x % 17) as f64 - 8.0
    }
}

/// `len` values of rank `rank` for case `seed`.
pub fn data<T: Gen>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::gen(mix(seed ^ mix(rank as u64) ^ mix(i as u64 + 7))))
        .collect()
}
