//! The same `deep-crossing` executable, run against daemons configured
//! for each placement of the dense layers — one endpoint; two endpoints
//! on one server over FPGA Connect, split after layer 1 and after layer
//! 2; two endpoints on two servers over an LTL tunnel — prints the same
//! digest of its outputs every time, and it is the digest of the model
//! computed in the test's own process. Only the configuration differs.

use std::net::Ipv4Addr;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use deep_crossing::placement::{render, Path, Placement, Servers};
use deep_crossing::{reference_digest, Model, DEFAULT_NNZ};
use serde_json::Value;
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::Daemon;

const DIMS: &str = "768,512,256,128,1";
const SEED: u64 = 7;
const COUNT: u64 = 24;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("deep-crossing-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits (bounded) until the daemon in `dir` says `ready` of its status.
async fn until(dir: &FsPath, what: &str, ready: impl Fn(&Value) -> bool) {
    let client = Client::connect(dir).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client.request(&Request::Status).await.unwrap();
        if ready(&status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never came to be: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The daemons of `placement`, started and ready (peers alive, the
/// entry's chain up), with their runtime directories; server A's first.
async fn start(
    model: &Model,
    placement: Placement,
    name: &str,
) -> (Vec<Daemon>, Vec<PathBuf>, String) {
    let base = scratch(name);
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let port = || uniplane_netns::try_free_port().unwrap();
    let servers = Servers {
        ids: [Ipv4Addr::new(10, 20, 0, 1), Ipv4Addr::new(10, 20, 0, 2)],
        peer_ports: [port(), port()],
        tunnel_ports: [port(), port()],
        secret,
    };
    let rendered = render(model, placement, Some(&servers)).unwrap();
    let mut daemons = Vec::new();
    let mut dirs = Vec::new();
    for (i, text) in rendered.configs.iter().enumerate() {
        let dir = base.join(format!("server{i}"));
        let config = Config::parse(text, "placement").unwrap();
        let (daemon, _client) = embedded(config, &dir).await.unwrap();
        daemons.push(daemon);
        dirs.push(dir);
    }
    if rendered.configs.len() > 1 {
        for dir in &dirs {
            until(dir, "the peer", |s| {
                s["peers"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
            })
            .await;
        }
    }
    if let Placement::Split { .. } = placement {
        until(&dirs[0], "the chain", |s| {
            s["devices"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["chain"]["up"] == true))
        })
        .await;
    }
    (daemons, dirs, rendered.entry)
}

/// Runs the `deep-crossing` executable against the daemon in `dir` with
/// the model of `dims` and `extra` options (bounded): whether it
/// succeeded, stdout, stderr.
fn run_binary(dir: &FsPath, entry: &str, dims: &str, extra: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deep-crossing"))
        .args(["--socket", &dir.display().to_string(), "--entry", entry])
        .args(["--count", &COUNT.to_string(), "--seed", &SEED.to_string()])
        .args(["--dims", dims, "--pipeline", "4"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the deep-crossing executable starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("deep-crossing did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The digest the executable printed for the model of [`DIMS`], having
/// checked every output itself (`--verify`) too.
fn digest_of_binary(dir: &FsPath, entry: &str) -> String {
    let (ok, stdout, stderr) = run_binary(dir, entry, DIMS, &["--verify"]);
    assert!(ok, "deep-crossing failed: {stdout}{stderr}");
    assert!(
        stdout.contains("verified: every output equals the reference's"),
        "{stdout}"
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("digest "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no digest line: {stdout}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_placement_prints_the_digest_of_the_reference() {
    let model = Model::new(DIMS, SEED, DEFAULT_NNZ).unwrap();
    let reference = reference_digest(&model, COUNT).hex();
    let placements = [
        ("single", Placement::Single),
        (
            "connect-2",
            Placement::Split {
                cut: 2,
                path: Path::Connect,
            },
        ),
        (
            "connect-1",
            Placement::Split {
                cut: 1,
                path: Path::Connect,
            },
        ),
        (
            "ltl",
            Placement::Split {
                cut: 2,
                path: Path::Ltl,
            },
        ),
    ];
    for (name, placement) in placements {
        let (daemons, dirs, entry) = start(&model, placement, name).await;
        let dir = dirs[0].clone();
        let digest = tokio::task::spawn_blocking(move || digest_of_binary(&dir, &entry))
            .await
            .unwrap();
        assert_eq!(digest, reference, "placement {name}");
        drop(daemons);
        let _ = std::fs::remove_dir_all(dirs[0].parent().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_the_wrong_width_is_refused_through_the_chain_and_the_run_says_so() {
    let model = Model::new(DIMS, SEED, DEFAULT_NNZ).unwrap();
    let split = Placement::Split {
        cut: 2,
        path: Path::Connect,
    };
    let (daemons, dirs, entry) = start(&model, split, "refused").await;
    // The application's model is wider than the kernels': the entry
    // refuses every request with an error answer, which the executable
    // reports with the inference it belongs to.
    let dir = dirs[0].clone();
    let entry2 = entry.clone();
    let (ok, stdout, stderr) =
        tokio::task::spawn_blocking(move || run_binary(&dir, &entry2, "1536,512,256,128,1", &[]))
            .await
            .unwrap();
    assert!(!ok, "a mismatched model ran: {stdout}");
    assert!(
        stderr.contains("inference 0: a stage answered an error: BadRequest"),
        "{stderr}"
    );
    // The chain is still up: the right model goes through.
    let dir = dirs[0].clone();
    let digest = tokio::task::spawn_blocking(move || digest_of_binary(&dir, &entry))
        .await
        .unwrap();
    assert_eq!(digest, reference_digest(&model, COUNT).hex());
    drop(daemons);
    let _ = std::fs::remove_dir_all(dirs[0].parent().unwrap());
}
