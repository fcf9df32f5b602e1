//! The one-core baseline: every pattern matched in turn by PCRE2 (JIT
//! where available, no UTF mode: bytes and ASCII classes, as the stage
//! engines read them), in the application's own thread.

use uniplane_kernel::regex_stage::rules::{PatternId, RuleSet};

/// PCRE2 as the baseline compiles a pattern.
pub fn compile(regex: &str) -> Result<pcre2::bytes::Regex, String> {
    pcre2::bytes::RegexBuilder::new()
        .jit_if_available(true)
        .build(regex)
        .map_err(|e| e.to_string())
}

/// Patterns compiled by PCRE2.
pub struct OneCore {
    regexes: Vec<(PatternId, pcre2::bytes::Regex)>,
    refused: Vec<(PatternId, String)>,
}

impl std::fmt::Debug for OneCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneCore")
            .field("patterns", &self.regexes.len())
            .field("refused", &self.refused.len())
            .finish()
    }
}

/// Why an input could not be matched.
#[derive(Debug, thiserror::Error)]
#[error("pattern {id}: {error}")]
pub struct MatchError {
    /// The pattern.
    pub id: PatternId,
    /// PCRE2's error (a match or depth limit, say).
    pub error: pcre2::Error,
}

impl OneCore {
    /// Compiles the patterns of `set` that `keep` accepts (the ones the
    /// stages match, so the two answer over the same rules).
    pub fn new(set: &RuleSet, keep: impl Fn(PatternId) -> bool) -> OneCore {
        let mut regexes = Vec::new();
        let mut refused = Vec::new();
        for p in set.patterns.iter().filter(|p| keep(p.id)) {
            match compile(&p.regex) {
                Ok(r) => regexes.push((p.id, r)),
                Err(why) => refused.push((p.id, why)),
            }
        }
        OneCore { regexes, refused }
    }

    /// How many patterns it matches.
    pub fn len(&self) -> usize {
        self.regexes.len()
    }

    /// Whether it matches none.
    pub fn is_empty(&self) -> bool {
        self.regexes.is_empty()
    }

    /// Patterns kept that PCRE2 refused, with its reason.
    pub fn refused(&self) -> &[(PatternId, String)] {
        &self.refused
    }

    /// The IDs of the patterns found in `input`, ascending, into `found`.
    pub fn matches(&self, input: &[u8], found: &mut Vec<PatternId>) -> Result<(), MatchError> {
        found.clear();
        for (id, regex) in &self.regexes {
            match regex.is_match(input) {
                Ok(true) => found.push(*id),
                Ok(false) => {}
                Err(error) => return Err(MatchError { id: *id, error }),
            }
        }
        found.sort_unstable();
        Ok(())
    }
}
