//! Kernel devices chained by `next`: an application calls the first
//! device and gets the last one's answer, each device's answers sent on
//! to the next through the engine (over the next device's own emulated
//! path); errors of any stage, a next device that is missing and one that
//! dies all reach the caller as error answers, never a hang.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use uniplane_dataplane::{Endpoint, LinkError};
use uniplane_netns::free_port;

mod common;
use common::{app, device, status_until};
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;
use uniplane_services::Daemon;

const SERVER: &str = "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n";

/// Kernel device `device` computing `function`, sending on to `next`.
fn kernel(device: u16, function: &str, next: Option<u16>) -> String {
    let next = next.map_or(String::new(), |n| format!("next = \"127.0.0.1:{n}\"\n"));
    format!(
        "\n[[devices]]\nname = \"k{device}\"\nkind = \"kernel\"\ndevice = {device}\n\
         function = \"{function}\"\n{next}"
    )
}

fn config(devices: &[String]) -> Config {
    Config::parse(&format!("{SERVER}{}", devices.concat()), "test").unwrap()
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-chain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn at(device: u16) -> Endpoint {
    format!("127.0.0.1:{device}/7").parse().unwrap()
}

/// The next answer on `conn` (bounded).
async fn answer(
    conn: &mut uniplane_client::Connection,
) -> Result<uniplane_dataplane::Message, LinkError> {
    tokio::time::timeout(Duration::from_secs(20), conn.recv())
        .await
        .expect("no answer came")
        .expect("the connection closed")
}

fn words(seed: u64, n: usize) -> (Vec<u8>, u32) {
    let mut x = seed | 1;
    let mut bytes = Vec::with_capacity(n * 4);
    let mut sum = 0u32;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = x as u32;
        sum = sum.wrapping_add(w);
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    (bytes, sum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_chained_kernels_answer_the_caller_with_the_last_ones_answer_in_order() {
    let dir = runtime("three");
    let devices = [
        kernel(2, "echo", Some(3)),
        kernel(3, "echo", Some(4)),
        kernel(4, "sum32", None),
    ];
    let (_daemon, client) = embedded(config(&devices), &dir).await.unwrap();
    for k in ["k2", "k3"] {
        status_until(&client, k, |d| d["chain"]["up"] == true).await;
    }
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    // Sizes on both paths (PIO up to 256 B, Connect above), many in
    // flight at once; one in ten of partial words, which the last stage
    // refuses: its error comes back through the chain.
    let mut want = Vec::new();
    for i in 0..600u64 {
        let n = [1usize, 3, 60, 700, 4000][(i % 5) as usize];
        let (mut bytes, sum) = words(i + 1, n);
        if i % 10 == 7 {
            bytes.push(0xff);
            want.push(None);
        } else {
            want.push(Some(sum));
        }
        conn.send_bytes(Bytes::from(bytes)).await.unwrap();
    }
    for (i, w) in want.iter().enumerate() {
        match (answer(&mut conn).await, w) {
            (Ok(m), Some(sum)) => {
                assert_eq!(m.payload().as_ref(), sum.to_le_bytes(), "answer {i}")
            }
            (Err(LinkError::PeerFailed(status)), None) => {
                assert_eq!(status, "BadRequest", "answer {i}")
            }
            (got, w) => panic!("answer {i}: {got:?}, wanted {w:?}"),
        }
    }
    let first = device(&client, "k2").await;
    assert_eq!(first["chain"]["forwarded"], 600, "{first}");
    assert_eq!(first["chain"]["returned"], 600, "{first}");
    assert_eq!(first["chain"]["failed"], 0, "{first}");
    let last = device(&client, "k4").await;
    assert_eq!(last["kernel_errors"], 60, "{last}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_to_a_device_that_is_not_there_refuses_each_call_with_no_route() {
    let dir = runtime("missing");
    let (_daemon, client) = embedded(config(&[kernel(2, "echo", Some(9))]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    for _ in 0..3 {
        conn.send_bytes(Bytes::from_static(b"nowhere to go"))
            .await
            .unwrap();
        match answer(&mut conn).await {
            Err(LinkError::PeerFailed(status)) => assert_eq!(status, "NoRoute"),
            other => panic!("not refused: {other:?}"),
        }
    }
    let d = device(&client, "k2").await;
    assert_eq!(d["chain"]["up"], false, "{d}");
    assert_eq!(d["chain"]["failed"], 3, "{d}");
    assert_eq!(d["chain"]["forwarded"], 0, "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_kernel_that_dies_fails_its_callers_and_the_first_stage_stays_up() {
    let dir = runtime("dies");
    let devices = [kernel(2, "echo", Some(3)), kernel(3, "panic", None)];
    let (_daemon, client) = embedded(config(&devices), &dir).await.unwrap();
    status_until(&client, "k2", |d| d["chain"]["up"] == true).await;
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"boom")).await.unwrap();
    match answer(&mut conn).await {
        Err(LinkError::PeerFailed(status)) => assert_eq!(status, "PeerFailed"),
        other => panic!("not failed: {other:?}"),
    }
    status_until(&client, "k3", |d| d["state"] == "down").await;
    // Later calls are answered with an error too, whether the chain is
    // set up again to the failed device or not yet.
    for _ in 0..3 {
        conn.send_bytes(Bytes::from_static(b"again")).await.unwrap();
        match answer(&mut conn).await {
            Err(LinkError::PeerFailed(status)) => {
                assert!(status == "PeerFailed" || status == "NoRoute", "{status}")
            }
            other => panic!("not failed: {other:?}"),
        }
    }
    assert_eq!(device(&client, "k2").await["state"], "up");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two daemons in this process, servers 10.31.0.1 and .2, peered over
/// `stack` on loopback with a cluster secret; `devices[i]` are server
/// i's devices. Returns them once each sees the other alive.
async fn two_servers(
    name: &str,
    stack: &str,
    devices: [&str; 2],
) -> (Vec<Daemon>, Vec<String>, PathBuf) {
    let dir = runtime(name);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let addr = |p| SocketAddr::from(([127, 0, 0, 1], p));
    let ends = [
        ("10.31.0.1", addr(free_port()), addr(free_port())),
        ("10.31.0.2", addr(free_port()), addr(free_port())),
    ];
    let mut daemons = Vec::new();
    let mut texts = Vec::new();
    for (i, (me, peer, tunnel)) in ends.iter().enumerate() {
        let (other, opeer, otunnel) = ends[1 - i];
        let text = format!(
            "[server]\nid = \"{me}\"\npeer_listen = \"{peer}\"\n\n\
             [[stacks]]\nname = \"{stack}\"\nlisten = \"{tunnel}\"\n\n\
             [[peers]]\nserver = \"{other}\"\naddress = \"{opeer}\"\ntunnel = \"{otunnel}\"\n\
             stack = \"{stack}\"\n\n[policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n{}",
            secret.display(),
            devices[i]
        );
        let (daemon, _client) = embedded(
            Config::parse(&text, &format!("{name}{i}")).unwrap(),
            &dir.join(format!("d{i}")),
        )
        .await
        .unwrap();
        daemons.push(daemon);
        texts.push(text);
    }
    (daemons, texts, dir)
}

/// A chain across servers over `stack`: server 1's echo sends on to
/// server 2's sum32 through the tunnel; the application on server 1 gets
/// the sums. When server 2 goes, calls are refused, never left waiting.
async fn across_servers(stack: &str) {
    let first = "\n[[devices]]\nname = \"k2\"\nkind = \"kernel\"\ndevice = 2\n\
                 function = \"echo\"\nnext = \"10.31.0.2:3\"\n";
    let second =
        "\n[[devices]]\nname = \"k3\"\nkind = \"kernel\"\ndevice = 3\nfunction = \"sum32\"\n";
    let (daemons, texts, dir) =
        two_servers(&format!("across-{stack}"), stack, [first, second]).await;
    let a = dir.join("d0");
    let client = Client::connect(&a).await.unwrap();
    status_until(&client, "k2", |d| d["chain"]["up"] == true).await;
    let session = app(&a).await;
    let mut conn = session
        .connect("10.31.0.1:2/7".parse().unwrap())
        .await
        .unwrap();
    let mut want = Vec::new();
    for i in 0..300u64 {
        let (bytes, sum) = words(i + 11, [2usize, 100, 3000][(i % 3) as usize]);
        conn.send_bytes(Bytes::from(bytes)).await.unwrap();
        want.push(sum);
    }
    for (i, sum) in want.iter().enumerate() {
        let m = answer(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("answer {i}: {e:?}"));
        assert_eq!(m.payload().as_ref(), sum.to_le_bytes(), "answer {i}");
    }
    let d = device(&client, "k2").await;
    assert_eq!(d["chain"]["returned"], 300, "{d}");
    // A rule on server 1 denies the chain: it is closed, and each call
    // is refused rather than left waiting; without it, the chain is set
    // up again and calls go through.
    let reload = |rules: &str| {
        let mut c = Config::parse(&format!("{}{rules}", texts[0]), "reload").unwrap();
        c.runtime_dir = Some(a.clone());
        c
    };
    let deny =
        "\n[[policy.rules]]\nsrc = \"10.31.0.1:2\"\ndst = \"10.31.0.2:3\"\naction = \"deny\"\n";
    daemons[0].reload(&reload(deny)).await.unwrap();
    status_until(&client, "k2", |d| d["chain"]["up"] == false).await;
    conn.send_bytes(Bytes::from_static(&[1, 0, 0, 0]))
        .await
        .unwrap();
    match answer(&mut conn).await {
        Err(LinkError::PeerFailed(status)) => assert_eq!(status, "NoRoute"),
        other => panic!("not refused: {other:?}"),
    }
    daemons[0].reload(&reload("")).await.unwrap();
    status_until(&client, "k2", |d| d["chain"]["up"] == true).await;
    conn.send_bytes(Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]))
        .await
        .unwrap();
    let m = answer(&mut conn).await.unwrap();
    assert_eq!(m.payload().as_ref(), 3u32.to_le_bytes());
    for d in &daemons {
        d.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_across_servers_over_tcp_returns_the_far_kernels_answers() {
    across_servers("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_across_servers_over_ltl_returns_the_far_kernels_answers() {
    across_servers("ltl").await;
}
