//! How much of a rule set each engine takes: every `@rx` pattern is
//! counted once, as loaded and compiled, loaded and refused (with the
//! engine's reason), or not loaded (with the loader's reason).

use std::fmt;

use uniplane_kernel::regex_stage::engine::{self, EngineKind};
use uniplane_kernel::regex_stage::rules::{PatternId, RuleSet};

use crate::one_core;

/// An engine a report covers: a stage's, or PCRE2 (the one-core
/// baseline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// A stage engine.
    Stage(EngineKind),
    /// PCRE2.
    Pcre2,
}

impl Engine {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Stage(k) => k.name(),
            Engine::Pcre2 => "pcre2",
        }
    }

    /// Whether it compiles `regex`, and if not, why.
    pub fn check(self, regex: &str) -> Result<(), String> {
        match self {
            Engine::Stage(k) => engine::check(k, regex),
            Engine::Pcre2 => one_core::compile(regex).map(drop),
        }
    }
}

/// One engine's count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineReport {
    /// The engine.
    pub engine: Engine,
    /// Patterns it compiles.
    pub compiled: Vec<PatternId>,
    /// Patterns it refuses, with its reason.
    pub refused: Vec<(PatternId, String)>,
}

/// The whole count.
#[derive(Clone, Debug)]
pub struct Report {
    /// `@rx` patterns loaded plus those the loader skipped.
    pub total: usize,
    /// Those the loader skipped: (rule, file:line, reason).
    pub skipped: Vec<(Option<PatternId>, String, String)>,
    /// Per engine.
    pub engines: Vec<EngineReport>,
}

impl Report {
    /// Compiles every loaded pattern of `set` alone with each of `engines`.
    pub fn new(set: &RuleSet, engines: &[Engine]) -> Report {
        let engines = engines
            .iter()
            .map(|&engine| {
                let mut r = EngineReport {
                    engine,
                    compiled: Vec::new(),
                    refused: Vec::new(),
                };
                for p in &set.patterns {
                    match engine.check(&p.regex) {
                        Ok(()) => r.compiled.push(p.id),
                        Err(why) => r.refused.push((p.id, why)),
                    }
                }
                r
            })
            .collect();
        Report {
            total: set.patterns.len() + set.skipped.len(),
            skipped: set
                .skipped
                .iter()
                .map(|s| (s.id, format!("{}:{}", s.file, s.line), s.reason.clone()))
                .collect(),
            engines,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} @rx patterns: {} loaded, {} not loaded",
            self.total,
            self.total - self.skipped.len(),
            self.skipped.len()
        )?;
        for (id, at, why) in &self.skipped {
            let id = id.map_or_else(|| "(no id)".to_string(), |i| i.to_string());
            writeln!(f, "  not loaded {id} ({at}): {why}")?;
        }
        for e in &self.engines {
            writeln!(
                f,
                "{}: {} compile, {} refused",
                e.engine.name(),
                e.compiled.len(),
                e.refused.len()
            )?;
            for (id, why) in &e.refused {
                writeln!(f, "  refused {id}: {why}")?;
            }
        }
        Ok(())
    }
}
