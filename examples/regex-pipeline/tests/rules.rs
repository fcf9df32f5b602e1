//! The Core Rule Set as each engine takes it: every `@rx` pattern is
//! counted once, compiled or refused by name with the engine's reason,
//! and the stages' groups together are the whole set.

mod common;

use uniplane_kernel::regex_stage::{engine, group_of, Stage, StageConfig};
use uniplane_regex_pipeline::report::{Engine, Report};
use uniplane_regex_pipeline::PatternId;

#[test]
fn every_rx_pattern_is_counted_once_per_engine_and_refusals_are_named() {
    let Some(set) = common::crs() else { return };
    // Debian's 3.3 rule set: a few hundred @rx patterns.
    assert!(set.patterns.len() > 200, "{}", set.patterns.len());
    let mut engines: Vec<Engine> = common::engines().into_iter().map(Engine::Stage).collect();
    engines.push(Engine::Pcre2);
    let report = Report::new(&set, &engines);
    assert_eq!(report.total, set.patterns.len() + set.skipped.len());
    // 920480's chained rule expands %{tx.…}: not a fixed pattern.
    assert!(report
        .skipped
        .iter()
        .any(|(id, _, why)| id.is_some_and(|i| i.rule() == 920480) && why.contains("run-time")));
    for e in &report.engines {
        assert_eq!(
            e.compiled.len() + e.refused.len(),
            set.patterns.len(),
            "{}",
            e.engine.name()
        );
        for (id, why) in &e.refused {
            assert!(
                !why.is_empty(),
                "{} refused {id} without a reason",
                e.engine.name()
            );
        }
    }
    // PCRE2 is the rule set's own dialect: it takes every pattern.
    let pcre2 = report.engines.last().unwrap();
    assert!(pcre2.refused.is_empty(), "{:?}", pcre2.refused);
    // 942130 uses a look-behind, which neither stage engine has.
    for e in &report.engines[..report.engines.len() - 1] {
        let refused = e.refused.iter().find(|(id, _)| *id == PatternId(942130));
        assert!(refused.is_some(), "{} took 942130", e.engine.name());
    }
    let text = report.to_string();
    assert!(text.contains("refused 942130: "), "{text}");
}

#[test]
fn the_three_stages_split_the_set_and_skip_only_what_their_engine_refuses() {
    let Some(set) = common::crs() else { return };
    for kind in common::engines() {
        let mut matched = Vec::new();
        let mut refused = Vec::new();
        for g in 0..3u32 {
            let config = StageConfig::from_params(
                &[
                    ("rules", "unused"),
                    ("group", &g.to_string()),
                    ("seed", "11"),
                    ("engine", kind.name()),
                ]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            )
            .unwrap();
            let stage = Stage::from_rules(&config, &set).unwrap();
            assert_eq!(
                stage.patterns().len() + stage.refused().len(),
                group_of(&set, 3, g, 11).len()
            );
            matched.extend_from_slice(stage.patterns());
            refused.extend(stage.refused().iter().map(|(id, _)| *id));
        }
        let mut all: Vec<PatternId> = matched.iter().chain(&refused).copied().collect();
        all.sort_unstable();
        let mut want: Vec<PatternId> = set.patterns.iter().map(|p| p.id).collect();
        want.sort_unstable();
        assert_eq!(all, want, "{}: every pattern in one group", kind.name());
        for id in &refused {
            let p = set.patterns.iter().find(|p| p.id == *id).unwrap();
            assert!(engine::check(kind, &p.regex).is_err());
        }
    }
}
