//! `regex-stage`: one stage of a multi-regex matching pipeline (DUA's
//! ModSecurity application, NSDI'19 §8.2). The rules' `@rx` patterns are
//! split into `groups` seeded random groups; a stage matches one group
//! and passes the input on with the IDs found so far.
//!
//! ```text
//!  app ─ input ─▶ stage (first) ─ carried ─▶ stage (middle) ─ carried ─▶ stage (last) ─ match list ─▶ app
//!
//!  input    = the bytes to match (at most `max_input`)
//!  carried  = [ count u32 | count × pattern ID u32 | input … ]   (little-endian)
//!  match list = [ count u32 | count × pattern ID u32 ]           (IDs ascending)
//! ```
//!
//! A stage emits exactly one answer or one error per message, so a chain
//! pairs answers with requests in order: whether the daemon forwards the
//! answer to the next stage (`next`) or an application relays it is the
//! configuration's business, not the stage's. Pattern IDs are
//! [`rules::PatternId`]s: the rule's ID, and its place in the rule's chain
//! in the top 8 bits.
//!
//! Parameters (`[devices.params]`):
//!
//! | key | value | default |
//! |---|---|---|
//! | `rules` | the directory of the `*.conf` rule files | (required) |
//! | `group` | which group this stage matches, `0..groups` | (required) |
//! | `groups` | how many groups the rules are split into | 3 |
//! | `seed` | the split's seed | 1 |
//! | `engine` | `automata` or `hyperscan` (cargo feature) | `automata` |
//! | `role` | `first` (takes an input), `middle`, `last` (answers the match list), `only` (input in, match list out) | by `group`: first, middle, last |
//! | `max_input` | the largest input it takes, bytes | 16384 |
//!
//! Bad input is answered, never trusted: an input over `max_input` is
//! [`KernelError::InputTooLarge`], a carried message whose count does not
//! fit [`KernelError::Malformed`]. Patterns of its group that the engine
//! refuses are skipped and listed by [`Stage::refused`] (and logged by the
//! builder's caller); the count of what was loaded never hides them.

pub mod engine;
pub mod rules;

use std::path::Path;

use crate::library::{only, parsed_or, required, Params, Spec};
use crate::{Emit, Kernel, KernelError};
use engine::{EngineKind, Matcher};
use rules::{Pattern, PatternId, RuleSet};

/// The library entry (`function = "regex-stage"`).
pub const SPEC: Spec = Spec {
    name: "regex-stage",
    about: "one stage of a multi-regex pipeline: matches a seeded group of a ModSecurity rule set's @rx patterns",
    check: |p| StageConfig::from_params(p).map(drop),
    build: |p| {
        let config = StageConfig::from_params(p)?;
        let stage = Stage::build(&config)?;
        Ok(Box::new(stage))
    },
};

/// Bytes before the IDs of a carried message or match list.
const COUNT_BYTES: usize = 4;

/// The most bytes a message between stages may have (a uniplane message).
pub const MAX_MESSAGE: usize = 65_535;

/// What a stage takes and answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes an input, forwards it carried with its IDs.
    First,
    /// Takes a carried message, forwards it with its IDs added.
    Middle,
    /// Takes a carried message, answers the match list.
    Last,
    /// Takes an input, answers the match list (a pipeline of one).
    Only,
}

impl Role {
    fn parse(name: &str) -> Result<Role, String> {
        Ok(match name {
            "first" => Role::First,
            "middle" => Role::Middle,
            "last" => Role::Last,
            "only" => Role::Only,
            other => {
                return Err(format!(
                    "unknown role `{other}` (first, middle, last, only)"
                ))
            }
        })
    }

    fn takes_input(self) -> bool {
        matches!(self, Role::First | Role::Only)
    }

    fn answers_list(self) -> bool {
        matches!(self, Role::Last | Role::Only)
    }
}

/// A stage's parameters, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageConfig {
    /// The rule files' directory.
    pub rules: String,
    /// How many groups the patterns are split into.
    pub groups: u32,
    /// This stage's group.
    pub group: u32,
    /// The split's seed.
    pub seed: u64,
    /// Which engine matches.
    pub engine: EngineKind,
    /// What it takes and answers.
    pub role: Role,
    /// The largest input it takes.
    pub max_input: usize,
}

impl StageConfig {
    /// The parameter names a stage takes.
    pub const KEYS: &'static [&'static str] = &[
        "rules",
        "groups",
        "group",
        "seed",
        "engine",
        "role",
        "max_input",
    ];

    /// Reads and checks `params` (nothing is loaded or compiled).
    pub fn from_params(params: &Params) -> Result<StageConfig, String> {
        only(params, Self::KEYS)?;
        let rules = required(params, "rules")?.to_string();
        let groups: u32 = parsed_or(params, "groups", 3)?;
        let group: u32 = required(params, "group")?
            .parse()
            .map_err(|e| format!("parameter `group`: {e}"))?;
        if groups == 0 || group >= groups {
            return Err(format!(
                "parameter `group` = {group} is not in 0..{groups} (`groups`)"
            ));
        }
        let default_role = match (group, groups) {
            (_, 1) => "only",
            (0, _) => "first",
            (g, n) if g + 1 == n => "last",
            _ => "middle",
        };
        let role = Role::parse(params.get("role").map_or(default_role, String::as_str))?;
        let max_input: usize = parsed_or(params, "max_input", 16_384)?;
        // The largest input must still fit a message with every ID of
        // the set carried beside it; a quarter of a message is left.
        let room = MAX_MESSAGE - MAX_MESSAGE / 4;
        if max_input == 0 || max_input > room {
            return Err(format!(
                "parameter `max_input` = {max_input} is not in 1..={room}"
            ));
        }
        Ok(StageConfig {
            rules,
            groups,
            group,
            seed: parsed_or(params, "seed", 1)?,
            engine: EngineKind::parse(params.get("engine").map_or("automata", String::as_str))?,
            role,
            max_input,
        })
    }
}

/// The group (`0..groups`) each of `count` patterns falls in: a seeded
/// shuffle of their places, dealt round-robin, so groups differ in size
/// by at most one.
pub fn split(count: usize, groups: u32, seed: u64) -> Vec<u32> {
    let mut order: Vec<usize> = (0..count).collect();
    let mut state = seed;
    // SplitMix64: a small, seedable and well-mixed stream.
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..count).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut group = vec![0; count];
    for (place, &pattern) in order.iter().enumerate() {
        group[pattern] = (place % groups.max(1) as usize) as u32;
    }
    group
}

/// The patterns of `set` in group `group` of `groups` (seed `seed`).
pub fn group_of(set: &RuleSet, groups: u32, group: u32, seed: u64) -> Vec<&Pattern> {
    let of = split(set.patterns.len(), groups, seed);
    set.patterns
        .iter()
        .zip(of)
        .filter(|(_, g)| *g == group)
        .map(|(p, _)| p)
        .collect()
}

/// A message between stages or a match list, checked: the IDs carried
/// and the input after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carried<'a> {
    ids: &'a [u8],
    /// The input (empty in a match list).
    pub input: &'a [u8],
}

impl<'a> Carried<'a> {
    /// Reads `bytes`: a count, that many IDs, then the input.
    pub fn decode(bytes: &'a [u8]) -> Result<Carried<'a>, KernelError> {
        let malformed = KernelError::Malformed { len: bytes.len() };
        let count: [u8; COUNT_BYTES] = bytes
            .get(..COUNT_BYTES)
            .and_then(|c| c.try_into().ok())
            .ok_or(malformed)?;
        let ids_end = (u32::from_le_bytes(count) as usize)
            .checked_mul(4)
            .and_then(|n| n.checked_add(COUNT_BYTES))
            .filter(|&end| end <= bytes.len())
            .ok_or(malformed)?;
        Ok(Carried {
            ids: &bytes[COUNT_BYTES..ids_end],
            input: &bytes[ids_end..],
        })
    }

    /// The IDs carried, in the order they were added.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = PatternId> + 'a {
        self.ids
            .chunks_exact(4)
            .map(|w| PatternId(u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
    }

    /// Writes a message of `ids` and `input` into `out` (cleared first).
    pub fn encode(ids: &[PatternId], input: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            out.extend_from_slice(&id.0.to_le_bytes());
        }
        out.extend_from_slice(input);
    }
}

/// Reads a match list (a stage's final answer): its IDs, ascending.
pub fn decode_match_list(bytes: &[u8]) -> Result<Vec<PatternId>, KernelError> {
    let list = Carried::decode(bytes)?;
    if !list.input.is_empty() {
        return Err(KernelError::Malformed { len: bytes.len() });
    }
    Ok(list.ids().collect())
}

/// One stage: its group's patterns compiled, and the buffers one message
/// needs, reused.
pub struct Stage {
    config: StageConfig,
    matcher: Matcher,
    /// The pattern ID of each of the matcher's patterns.
    ids: Vec<PatternId>,
    refused: Vec<(PatternId, String)>,
    found: Vec<usize>,
    carried: Vec<PatternId>,
    answer: Vec<u8>,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("config", &self.config)
            .field("patterns", &self.ids.len())
            .field("refused", &self.refused.len())
            .finish()
    }
}

impl Stage {
    /// Loads the rules, takes this stage's group and compiles it.
    pub fn build(config: &StageConfig) -> Result<Stage, String> {
        let set = RuleSet::load(Path::new(&config.rules)).map_err(|e| e.to_string())?;
        Stage::from_rules(config, &set)
    }

    /// Compiles this stage's group of `set`.
    pub fn from_rules(config: &StageConfig, set: &RuleSet) -> Result<Stage, String> {
        let mut ids = Vec::new();
        let mut regexes = Vec::new();
        let mut refused = Vec::new();
        for p in group_of(set, config.groups, config.group, config.seed) {
            match engine::check(config.engine, &p.regex) {
                Ok(()) => {
                    ids.push(p.id);
                    regexes.push(p.regex.as_str());
                }
                Err(why) => refused.push((p.id, why)),
            }
        }
        let matcher = Matcher::build(config.engine, &regexes)
            .map_err(|e| format!("group {} of {}: {e}", config.group, config.groups))?;
        Ok(Stage {
            config: config.clone(),
            found: Vec::with_capacity(ids.len()),
            carried: Vec::with_capacity(set.patterns.len()),
            answer: Vec::with_capacity(MAX_MESSAGE),
            matcher,
            ids,
            refused,
        })
    }

    /// The IDs of the patterns it matches.
    pub fn patterns(&self) -> &[PatternId] {
        &self.ids
    }

    /// The patterns of its group its engine refused, with the reason.
    pub fn refused(&self) -> &[(PatternId, String)] {
        &self.refused
    }

    /// Its answer to `message` (in [`Stage::answer`]'s buffer), or why not.
    fn run(&mut self, message: &[u8]) -> Result<(), KernelError> {
        self.carried.clear();
        let input = if self.config.role.takes_input() {
            message
        } else {
            let carried = Carried::decode(message)?;
            self.carried.extend(carried.ids());
            carried.input
        };
        if input.len() > self.config.max_input {
            return Err(KernelError::InputTooLarge {
                len: input.len(),
                limit: self.config.max_input,
            });
        }
        self.matcher
            .matches(input, &mut self.found)
            .map_err(|_| KernelError::Unsupported)?;
        self.carried.extend(self.found.iter().map(|&i| self.ids[i]));
        if self.config.role.answers_list() {
            self.carried.sort_unstable();
            self.carried.dedup();
            Carried::encode(&self.carried, &[], &mut self.answer);
        } else {
            Carried::encode(&self.carried, input, &mut self.answer);
        }
        Ok(())
    }
}

impl Kernel for Stage {
    fn name(&self) -> &'static str {
        SPEC.name
    }

    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        match self.run(payload) {
            Ok(()) => out.answer(conn, &self.answer),
            Err(e) => out.error(conn, e),
        }
    }
}

#[cfg(test)]
mod tests;
