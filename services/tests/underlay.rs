//! The underlay in the data path between two daemons peered over a TCP
//! tunnel on loopback (two servers in one process): the receiving
//! server's filter drops a message that breaks its rules for the peer,
//! counts it, and reports it to its control core, which closes the
//! connection it claimed to belong to and tells both owners; a class the
//! peer may not use is refused; a class's weight changes live.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use uniplane_client::protocol::Request;
use uniplane_client::Client;
use uniplane_netns::free_port;
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

const A: &str = "10.30.0.1";
const B: &str = "10.30.0.2";

/// `me` peered with `other`; `rules` go into the peer's section.
fn config(
    me: &str,
    ports: (u16, u16),
    other: &str,
    other_ports: (u16, u16),
    rules: &str,
    secret: &Path,
) -> String {
    format!(
        "[server]\nid = \"{me}\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"127.0.0.1:{}\"\n\n\
         [[classes]]\nid = 0\nweight = 1\n[[classes]]\nid = 1\nweight = 2\n\n\
         [[peers]]\nserver = \"{other}\"\naddress = \"127.0.0.1:{}\"\ntunnel = \"127.0.0.1:{}\"\nstack = \"tcp\"\n{rules}\n\n\
         [failure]\nheartbeat_ms = 50\nmisses = 20\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
        ports.0,
        ports.1,
        other_ports.0,
        other_ports.1,
        secret.display()
    )
}

async fn request(dir: &Path, req: &Request) -> Value {
    Client::connect(dir)
        .await
        .unwrap()
        .request(req)
        .await
        .unwrap()
}

/// Waits for `check` to hold, at most 20 s.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < Duration::from_secs(20), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Pair {
    daemons: Vec<Daemon>,
    dirs: Vec<PathBuf>,
    base: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for d in &self.daemons {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A and B peered; B lets A send at most 512-byte messages, class 0 only.
async fn pair(tag: &str) -> Pair {
    pair_with(
        tag,
        |_, _| String::new(),
        "max_message = 512\nclasses = [0]",
    )
    .await
}

/// A and B peered; each peer section gets `more(mine, theirs)` (given
/// two spare ports), and B's also `b_rules`.
async fn pair_with(tag: &str, more: impl Fn(u16, u16) -> String, b_rules: &str) -> Pair {
    let base = std::env::temp_dir().join(format!("uniplane-underlay-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let a = (free_port(), free_port());
    let b = (free_port(), free_port());
    let (a_more, b_more) = (free_port(), free_port());
    let texts = [
        config(A, a, B, b, &more(a_more, b_more), &secret),
        config(
            B,
            b,
            A,
            a,
            &format!("{b_rules}\n{}", more(b_more, a_more)),
            &secret,
        ),
    ];
    let mut daemons = Vec::new();
    let mut dirs = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let dir = base.join(format!("d{i}"));
        let config = Config::parse(text, &format!("server{i}")).unwrap();
        let (d, _client) = embedded(config, &dir).await.unwrap();
        daemons.push(d);
        dirs.push(dir);
    }
    for dir in &dirs {
        until("the daemons peer", async || {
            let s = request(dir, &Request::Status).await;
            s["peers"]
                .as_array()
                .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
        })
        .await;
    }
    Pair {
        daemons,
        dirs,
        base,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_filter_violation_is_dropped_counted_reported_and_closes_its_connection() {
    let p = pair("violation").await;
    let a = Client::connect(&p.dirs[0]).await.unwrap();
    let b = Client::connect(&p.dirs[1]).await.unwrap();
    let sa = a.attach("caller").await.unwrap();
    let sb = b.attach("listener").await.unwrap();
    let mut listener = sb.listen(7).await.unwrap();
    let mut conn = sa.connect(sb.uid().port(7)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"small")).await.unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("accepted in time")
        .expect("a connection");
    let first = tokio::time::timeout(Duration::from_secs(10), accepted.recv())
        .await
        .expect("in time")
        .expect("a message")
        .expect("not an error");
    assert_eq!(first.payload().as_ref(), b"small");
    let dropped = |dir: PathBuf| async move {
        let s = request(&dir, &Request::Status).await;
        s["peers"][0]["underlay"]["dropped"]["too_long"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(dropped(p.dirs[1].clone()).await, 0);

    // 1000 bytes: more than B lets A send.
    conn.send_bytes(Bytes::from(vec![1; 1000])).await.unwrap();
    until("B's underlay counts the drop", async || {
        dropped(p.dirs[1].clone()).await == 1
    })
    .await;
    // B's core closed the connection, and both owners hear why.
    for (side, c) in [("caller", &mut conn), ("listener", &mut accepted)] {
        let end = tokio::time::timeout(Duration::from_secs(10), c.recv())
            .await
            .unwrap_or_else(|_| panic!("the {side} is told in time"));
        match end {
            Some(Err(e)) => assert!(e.to_string().contains("Denied"), "{side}: {e}"),
            Some(Ok(m)) => panic!("the {side} got a message: {:?}", m.payload()),
            None => panic!("the {side}'s connection ended without saying why"),
        }
    }
    for dir in &p.dirs {
        until("the connection is gone from both daemons", async || {
            let c = request(dir, &Request::Connections).await;
            c.as_array().is_some_and(|v| v.is_empty())
        })
        .await;
    }
    let metrics = request(&p.dirs[1], &Request::Metrics).await;
    let text = metrics["text"].as_str().unwrap();
    assert!(
        text.contains(&format!(
            "uniplane_underlay_dropped_total{{server=\"{A}\",reason=\"too_long\"}} 1"
        )),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_class_the_peer_may_not_use_is_refused_and_weights_change_live() {
    let p = pair("class").await;
    let a = Client::connect(&p.dirs[0]).await.unwrap();
    let b = Client::connect(&p.dirs[1]).await.unwrap();
    let sa = a.attach("caller").await.unwrap();
    let sb = b.attach("listener").await.unwrap();
    let _listener = sb.listen(7).await.unwrap();
    // B allows A class 0 only; A defines classes 0 and 1, not 5.
    let refused = sa.connect_class(sb.uid().port(7), 1).await;
    let Err(e) = refused else {
        panic!("class 1 is refused")
    };
    let e = e.to_string();
    assert!(e.contains("class 1"), "{e}");
    let Err(e) = sa.connect_class(sb.uid().port(7), 5).await else {
        panic!("class 5 does not exist")
    };
    let e = e.to_string();
    assert!(e.contains("no traffic class 5"), "{e}");
    let ok = sa.connect_class(sb.uid().port(7), 0).await;
    assert!(ok.is_ok(), "class 0 is allowed: {:?}", ok.err());

    let show = request(
        &p.dirs[0],
        &Request::Class {
            id: None,
            weight: None,
            priority: None,
        },
    )
    .await;
    assert_eq!(show["classes"][1]["weight"], 2);
    let set = request(
        &p.dirs[0],
        &Request::Class {
            id: Some(1),
            weight: Some(7),
            priority: None,
        },
    )
    .await;
    assert_eq!(set["classes"][1]["weight"], 7);
    let show = request(
        &p.dirs[0],
        &Request::Class {
            id: None,
            weight: None,
            priority: None,
        },
    )
    .await;
    assert_eq!(show["classes"][1]["weight"], 7);
    let bad = Client::connect(&p.dirs[0])
        .await
        .unwrap()
        .request(&Request::Class {
            id: Some(1),
            weight: Some(0),
            priority: None,
        })
        .await;
    assert!(bad.is_err(), "a weight of 0 is refused");
}

/// A peer reached over a stack the daemon does not run fails the start
/// with the reason, not the first message.
#[tokio::test]
async fn a_peer_over_a_stack_not_running_fails_the_start() {
    let base =
        std::env::temp_dir().join(format!("uniplane-underlay-nostack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let text = config(
        A,
        (free_port(), free_port()),
        B,
        (free_port(), free_port()),
        "",
        &secret,
    )
    .replace("stack = \"tcp\"", "stack = \"udp\"");
    let config = Config::parse(&text, "nostack").unwrap();
    let err = embedded(config, &base.join("d"))
        .await
        .err()
        .map(|e| e.to_string())
        .expect("the start fails");
    assert!(
        err.contains("`udp` stack, which [[stacks]] does not run"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// A class pinned to another stack takes it: class 1 to B goes over LTL
/// (to B's LTL listener, where a TCP tunnel could not connect) while
/// class 0 stays on TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_class_pinned_to_another_stack_takes_it() {
    let ltl = |me: u16, other: u16| {
        format!(
            "\n[[peers.pin]]\nclass = 1\nstack = \"ltl\"\ntunnel = \"127.0.0.1:{other}\"\n\n\
             [[stacks]]\nname = \"ltl\"\nlisten = \"127.0.0.1:{me}\"\n"
        )
    };
    let p = pair_with("pin", ltl, "").await;
    let sa = Client::connect(&p.dirs[0])
        .await
        .unwrap()
        .attach("caller")
        .await
        .unwrap();
    let sb = Client::connect(&p.dirs[1])
        .await
        .unwrap()
        .attach("listener")
        .await
        .unwrap();
    let mut listener = sb.listen(7).await.unwrap();
    let mut conn = sa
        .connect_class(sb.uid().port(7), 1)
        .await
        .expect("class 1");
    conn.send_bytes(Bytes::from_static(b"over ltl"))
        .await
        .unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("in time")
        .expect("accepted");
    let got = tokio::time::timeout(Duration::from_secs(10), accepted.recv())
        .await
        .expect("in time")
        .expect("a message")
        .expect("no error");
    assert_eq!(got.payload().as_ref(), b"over ltl");
    let status = request(&p.dirs[0], &Request::Status).await;
    let tunnels = status["peers"][0]["tunnels"].as_array().unwrap().clone();
    let stack_of = |class: u64| {
        tunnels
            .iter()
            .find(|t| t["class"] == class)
            .map(|t| t["stack"].clone())
    };
    assert_eq!(stack_of(0), Some("tcp".into()), "{tunnels:?}");
    assert_eq!(stack_of(1), Some("ltl".into()), "{tunnels:?}");
}
