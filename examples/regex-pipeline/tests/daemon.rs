//! The three configurations of the paper's application, through a
//! daemon in this process: the stages as chained kernel devices (the
//! application calls the first, several inputs in flight), the same
//! stages relayed by the application (through the CPU), and PCRE2 on
//! this core, all finding the same rules in a seeded corpus with planted
//! matches; an input over a stage's limit and a stage that dies come back
//! as errors, never a hang.

mod common;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use uniplane_kernel::regex_stage::{engine, group_of};
use uniplane_regex_pipeline::corpus::{Corpus, PLANTED};
use uniplane_regex_pipeline::one_core::OneCore;
use uniplane_regex_pipeline::pipeline::{self, PipelineError, Stages, STAGES};
use uniplane_regex_pipeline::{EngineKind, PatternId, RuleSet, DEBIAN_CRS_RULES};
use uniplane_services::client::{embedded, Client, Session};
use uniplane_services::config::Config;
use uniplane_services::control::Request;

const SERVER: &str = "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n";
const HERE: Ipv4Addr = Ipv4Addr::LOCALHOST;

fn stages(engine: EngineKind, max_input: usize) -> Stages {
    Stages {
        rules: DEBIAN_CRS_RULES.into(),
        engine,
        seed: 17,
        max_input,
        chained: 11,
        relayed: 21,
        // Generous: the test machine may be loaded, and a stage that
        // answers nothing this long is declared failed.
        stall_timeout_ms: 10_000,
    }
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-regex-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn app(dir: &Path) -> Session {
    Client::connect(dir)
        .await
        .unwrap()
        .attach("regex-app")
        .await
        .unwrap()
}

/// Waits (bounded) until every chained stage but the last has its chain up.
async fn chains_up(client: &Client, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in names {
        loop {
            let status = client.request(&Request::Status).await.unwrap();
            let d: Option<Value> = status["devices"]
                .as_array()
                .and_then(|a| a.iter().find(|d| d["name"] == *name).cloned());
            if d.as_ref().is_some_and(|d| d["chain"]["up"] == true) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}'s chain never came up: {d:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The one-core baseline over the patterns the stages match.
fn baseline(set: &RuleSet, s: &Stages) -> OneCore {
    let matched: Vec<PatternId> = (0..u32::from(STAGES))
        .flat_map(|g| group_of(set, u32::from(STAGES), g, s.seed))
        .filter(|p| engine::check(s.engine, &p.regex).is_ok())
        .map(|p| p.id)
        .collect();
    OneCore::new(set, |id| matched.contains(&id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_uniplane_through_the_cpu_and_one_core_find_the_same_rules() {
    let Some(set) = common::crs() else { return };
    for kind in common::engines() {
        let dir = runtime(&format!("same-{}", kind.name()));
        let s = stages(kind, 16_384);
        let text = format!("{SERVER}{}", s.devices(HERE));
        let (_daemon, client) = embedded(Config::parse(&text, "test").unwrap(), &dir)
            .await
            .unwrap();
        chains_up(&client, &["chained0", "chained1"]).await;
        let session = app(&dir).await;
        let corpus = Corpus::new(31).inputs(60, &[64, 700, 4096, 16_384]);
        let inputs: Vec<Bytes> = corpus
            .iter()
            .map(|i| Bytes::from(i.bytes.clone()))
            .collect();
        let chained = pipeline::through_uniplane(&session, s.chained_uid(HERE, 0), &inputs, 8)
            .await
            .unwrap();
        let relayed_uids: Vec<_> = (0..STAGES).map(|g| s.relayed_uid(HERE, g)).collect();
        let relayed = pipeline::through_cpu(&session, &relayed_uids, &inputs)
            .await
            .unwrap();
        let one = baseline(&set, &s);
        let mut found = Vec::new();

        for (i, input) in corpus.iter().enumerate() {
            one.matches(&input.bytes, &mut found).unwrap();
            let a = chained[i]
                .list
                .as_ref()
                .unwrap_or_else(|e| panic!("input {i}: {e}"));
            let b = relayed[i]
                .list
                .as_ref()
                .unwrap_or_else(|e| panic!("input {i}: {e}"));
            assert_eq!(a, &found, "{}: input {i}, through uniplane", kind.name());
            assert_eq!(b, &found, "{}: input {i}, through the CPU", kind.name());
            if let Some(p) = input.planted {
                assert!(
                    a.contains(&PLANTED[p].1),
                    "input {i}: {} not found",
                    PLANTED[p].1
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_over_the_limit_is_refused_to_the_sender_and_the_next_goes_through() {
    if common::crs().is_none() {
        return;
    }
    let dir = runtime("limit");
    let s = stages(EngineKind::Automata, 1000);
    let text = format!("{SERVER}{}", s.devices(HERE));
    let (_daemon, client) = embedded(Config::parse(&text, "test").unwrap(), &dir)
        .await
        .unwrap();
    chains_up(&client, &["chained0", "chained1"]).await;
    let session = app(&dir).await;
    let inputs = [
        Bytes::from(vec![b'a'; 1001]),
        Bytes::from_static(b" sleep(5) "),
    ];
    let relayed_uids: Vec<_> = (0..STAGES).map(|g| s.relayed_uid(HERE, g)).collect();
    for answers in [
        pipeline::through_uniplane(&session, s.chained_uid(HERE, 0), &inputs, 2)
            .await
            .unwrap(),
        pipeline::through_cpu(&session, &relayed_uids, &inputs)
            .await
            .unwrap(),
    ] {
        match &answers[0].list {
            Err(PipelineError::Refused { stage: 0, status }) => assert_eq!(status, "BadRequest"),
            other => panic!("not refused: {other:?}"),
        }
        let list = answers[1].list.as_ref().unwrap();
        assert!(list.contains(&PatternId(942160)), "{list:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_that_dies_fails_every_input_in_flight_never_a_hang() {
    if common::crs().is_none() {
        return;
    }
    let dir = runtime("dies");
    // Two regex stages, then a kernel that panics on its first message.
    let s = stages(EngineKind::Automata, 16_384);
    let mut text = format!("{SERVER}{}", s.devices(HERE));
    text = text.replace("next = \"127.0.0.1:13\"\n", "next = \"127.0.0.1:30\"\n");
    text.push_str(
        "\n[[devices]]\nname = \"dies\"\nkind = \"kernel\"\ndevice = 30\nfunction = \"panic\"\n",
    );
    let (_daemon, client) = embedded(Config::parse(&text, "test").unwrap(), &dir)
        .await
        .unwrap();
    chains_up(&client, &["chained0", "chained1"]).await;
    let session = app(&dir).await;
    let inputs: Vec<Bytes> = Corpus::new(3)
        .inputs(16, &[2000])
        .into_iter()
        .map(|i| Bytes::from(i.bytes))
        .collect();
    let t0 = Instant::now();
    let answers = pipeline::through_uniplane(&session, s.chained_uid(HERE, 0), &inputs, 8)
        .await
        .unwrap();
    assert_eq!(answers.len(), inputs.len());
    for (i, a) in answers.iter().enumerate() {
        match &a.list {
            Err(PipelineError::Refused { status, .. }) => {
                assert!(
                    status == "PeerFailed" || status == "NoRoute",
                    "input {i}: {status}"
                )
            }
            other => panic!("input {i}: not failed: {other:?}"),
        }
    }
    assert!(
        t0.elapsed() < pipeline::ANSWER_DEADLINE,
        "answered by errors, not by the deadline"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
