//! The stages and the one-core PCRE2 baseline find the same rules in the
//! same inputs: a seeded corpus of random printable inputs (64 B to
//! 16 KiB), half with a string planted that matches a known rule. The
//! stages run here in this process, message by message as a chain runs
//! them; `daemon.rs` runs them as kernel devices.

mod common;

use uniplane_kernel::regex_stage::{decode_match_list, Stage, StageConfig};
use uniplane_kernel::{Emit, Kernel, KernelError};
use uniplane_regex_pipeline::corpus::{Corpus, PLANTED};
use uniplane_regex_pipeline::one_core::OneCore;
use uniplane_regex_pipeline::{EngineKind, PatternId, RuleSet};

/// The one answer or error a stage emitted.
#[derive(Default)]
struct One(Option<Result<Vec<u8>, KernelError>>);

impl Emit for One {
    fn answer(&mut self, _conn: u16, payload: &[u8]) {
        assert!(self.0.is_none(), "a second answer");
        self.0 = Some(Ok(payload.to_vec()));
    }
    fn error(&mut self, _conn: u16, error: KernelError) {
        assert!(self.0.is_none(), "a second answer");
        self.0 = Some(Err(error));
    }
}

fn stages(set: &RuleSet, kind: EngineKind, seed: u64) -> Vec<Stage> {
    (0..3u32)
        .map(|g| {
            let params = [
                ("rules", "unused".to_string()),
                ("group", g.to_string()),
                ("seed", seed.to_string()),
                ("engine", kind.name().to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            Stage::from_rules(&StageConfig::from_params(&params).unwrap(), set).unwrap()
        })
        .collect()
}

fn chain(stages: &mut [Stage], input: &[u8]) -> Result<Vec<PatternId>, KernelError> {
    let mut message = input.to_vec();
    for stage in stages {
        let mut out = One::default();
        stage.on_message(0, &message, &mut out);
        message = out.0.expect("an answer")?;
    }
    decode_match_list(&message)
}

#[test]
fn stages_and_pcre2_find_the_same_rules_and_the_planted_ones() {
    let Some(set) = common::crs() else { return };
    for kind in common::engines() {
        let mut stages = stages(&set, kind, 3);
        let matched: Vec<PatternId> = stages.iter().flat_map(|s| s.patterns().to_vec()).collect();
        let one = OneCore::new(&set, |id| matched.contains(&id));
        assert!(one.refused().is_empty());
        assert_eq!(one.len(), matched.len());
        let inputs = Corpus::new(24).inputs(120, &[64, 256, 1024, 4096, 16_384]);
        let mut found = Vec::new();
        let mut planted_found = 0;
        for (i, input) in inputs.iter().enumerate() {
            let list = chain(&mut stages, &input.bytes).unwrap();
            one.matches(&input.bytes, &mut found).unwrap();
            assert_eq!(
                list,
                found,
                "{}: input {i} of {} bytes",
                kind.name(),
                input.bytes.len()
            );
            if let Some(p) = input.planted {
                assert!(
                    list.contains(&PLANTED[p].1),
                    "input {i}: {} not found",
                    PLANTED[p].1
                );
                planted_found += 1;
            }
        }
        assert_eq!(planted_found, 60);
        // Every planted rule was found at least once.
        for (text, id) in PLANTED {
            let list = chain(&mut stages, text.as_bytes()).unwrap();
            assert!(
                list.contains(id),
                "{}: {text:?} does not match {id}",
                kind.name()
            );
        }
    }
}

#[test]
fn the_engines_agree_with_each_other_on_the_rules_both_take() {
    let Some(set) = common::crs() else { return };
    let engines = common::engines();
    if engines.len() < 2 {
        eprintln!("skipped: one engine in this build (--features hyperscan adds the other)");
        return;
    }
    let mut a = stages(&set, engines[0], 5);
    let mut b = stages(&set, engines[1], 5);
    let ma: Vec<PatternId> = a.iter().flat_map(|s| s.patterns().to_vec()).collect();
    let mb: Vec<PatternId> = b.iter().flat_map(|s| s.patterns().to_vec()).collect();
    for input in Corpus::new(9).inputs(60, &[100, 2000, 9000]) {
        let la = chain(&mut a, &input.bytes).unwrap();
        let lb = chain(&mut b, &input.bytes).unwrap();
        let both = |l: Vec<PatternId>| -> Vec<PatternId> {
            l.into_iter()
                .filter(|id| ma.contains(id) && mb.contains(id))
                .collect()
        };
        assert_eq!(both(la), both(lb));
    }
}
