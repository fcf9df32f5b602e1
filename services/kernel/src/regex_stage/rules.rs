//! The `@rx` patterns of a ModSecurity rule set (the OWASP Core Rule
//! Set's `*.conf` files), each with the ID of the rule it belongs to.
//!
//! ```text
//!  SecRule VARIABLES "@rx PATTERN" "id:942140,phase:2,…,chain"   → 942140     (part 0)
//!      SecRule VARIABLES "@rx PATTERN" "…"                        → 942140.1   (part 1, chained)
//! ```
//!
//! A logical line is the physical lines joined at a trailing `\`; a
//! line whose first non-blank character is `#` is a comment. The
//! operator is the second argument: `@rx PATTERN`, `!@rx PATTERN`, or a
//! bare pattern (ModSecurity's default operator is `@rx`); every other
//! operator (`@pm`, `@detectSQLi`, …) is not a regular expression and is
//! not loaded. Inside double quotes `\"` stands for `"`; every other
//! backslash belongs to the pattern. A rule that chains (`chain`) gives
//! its ID to the rule after it, whose pattern is part 1, and so on.
//!
//! What cannot be loaded is kept with its reason ([`Skipped`]): a pattern
//! that expands a run-time variable (`%{tx.…}`), an `@rx` rule without
//! an ID. Nothing is dropped from the count.

use std::fmt;
use std::path::Path;

/// A pattern's name on the wire and in reports: the rule's ID in the
/// low 24 bits, the pattern's place in the rule's chain in the top 8
/// (0: the rule's own operator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PatternId(pub u32);

impl PatternId {
    /// Rule IDs fit 24 bits (the Core Rule Set's are six digits).
    pub const MAX_RULE: u32 = (1 << 24) - 1;

    /// Part `part` of rule `rule`, if both fit.
    pub fn new(rule: u32, part: u32) -> Option<PatternId> {
        (rule <= Self::MAX_RULE && part <= 0xff).then_some(PatternId(part << 24 | rule))
    }

    /// The rule's ID.
    pub fn rule(self) -> u32 {
        self.0 & Self::MAX_RULE
    }

    /// Its place in the rule's chain.
    pub fn part(self) -> u32 {
        self.0 >> 24
    }
}

impl fmt::Display for PatternId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.part() {
            0 => write!(f, "{}", self.rule()),
            p => write!(f, "{}.{p}", self.rule()),
        }
    }
}

/// One `@rx` pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    /// Its rule (and part of the rule's chain).
    pub id: PatternId,
    /// The file it is in (its name, without the directory).
    pub file: String,
    /// The line its `SecRule` starts on (1-based).
    pub line: usize,
    /// The regular expression as the rule writes it.
    pub regex: String,
}

/// An `@rx` pattern that was not loaded, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its rule, when it has one.
    pub id: Option<PatternId>,
    /// The file it is in.
    pub file: String,
    /// The line its `SecRule` starts on.
    pub line: usize,
    /// Why it was not loaded.
    pub reason: String,
}

/// The `@rx` patterns of a rule set and those that could not be loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleSet {
    /// Loaded, in file order (files sorted by name).
    pub patterns: Vec<Pattern>,
    /// Not loaded, with the reason.
    pub skipped: Vec<Skipped>,
}

/// Why a rule directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The directory or a file in it could not be read.
    #[error("{path}: {source}")]
    Io {
        /// What was being read.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The directory holds no `*.conf` file.
    #[error("{0}: no *.conf rule files")]
    Empty(String),
}

impl RuleSet {
    /// Loads every `*.conf` file of `dir`, in name order.
    pub fn load(dir: &Path) -> Result<RuleSet, LoadError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| LoadError::Io { path, source }
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        if files.is_empty() {
            return Err(LoadError::Empty(dir.display().to_string()));
        }
        files.sort();
        let mut set = RuleSet::default();
        for path in files {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            set.parse_file(&name, &String::from_utf8_lossy(&bytes));
        }
        Ok(set)
    }

    /// Adds the patterns of one rule file's text.
    pub fn parse_file(&mut self, file: &str, text: &str) {
        // The ID the next rule inherits while a chain is open, and the
        // part it will be.
        let mut chain: Option<(Option<String>, u32)> = None;
        for (line, directive) in logical_lines(text) {
            let args = arguments(&directive);
            if !args
                .first()
                .is_some_and(|d| d.eq_ignore_ascii_case("SecRule"))
            {
                // A chain ends at the first directive that is not a rule.
                chain = None;
                continue;
            }
            let operator = args.get(2).map(String::as_str).unwrap_or("");
            let actions = args.get(3).map(String::as_str).unwrap_or("");
            let (own_id, chains) = parse_actions(actions);
            let (rule, part) = chain.take().unwrap_or((own_id, 0));
            if chains {
                chain = Some((rule.clone(), part + 1));
            }
            let Some(regex) = rx_pattern(operator) else {
                continue;
            };
            let id = match rule.as_deref().map(|r| (r, r.parse::<u32>())) {
                None => Err("a rule without an id".to_string()),
                Some((_, Ok(r))) => PatternId::new(r, part)
                    .ok_or_else(|| format!("rule {r} part {part}: does not fit 24 + 8 bits")),
                Some((r, Err(_))) => Err(format!("its id `{r}` is not a number")),
            };
            let skip = |id: Option<PatternId>, reason: String| Skipped {
                id,
                file: file.to_string(),
                line,
                reason,
            };
            match id {
                Err(reason) => self.skipped.push(skip(None, reason)),
                Ok(id) if regex.contains("%{") => self.skipped.push(skip(
                    Some(id),
                    "it expands a run-time variable (%{…}), not a fixed pattern".into(),
                )),
                Ok(id) => self.patterns.push(Pattern {
                    id,
                    file: file.to_string(),
                    line,
                    regex: regex.to_string(),
                }),
            }
        }
    }
}

/// The pattern of an `@rx` operator (negated or not, or a bare pattern,
/// which is `@rx` by default); `None` for another operator.
fn rx_pattern(operator: &str) -> Option<&str> {
    let op = operator.strip_prefix('!').unwrap_or(operator);
    match op.strip_prefix('@') {
        None => Some(op),
        Some(rest) => {
            let (name, pattern) = rest.split_once([' ', '\t']).unwrap_or((rest, ""));
            name.eq_ignore_ascii_case("rx")
                .then(|| pattern.trim_start_matches([' ', '\t']))
        }
    }
}

/// The rule's `id:` and whether it has `chain`, from its action list
/// (`id:942140,phase:2,…`): commas inside single quotes do not split.
fn parse_actions(actions: &str) -> (Option<String>, bool) {
    let mut id = None;
    let mut chains = false;
    let mut quoted = false;
    let mut start = 0;
    let mut take = |action: &str| {
        let action = action.trim();
        if action.eq_ignore_ascii_case("chain") {
            chains = true;
        } else if let Some(v) = action.strip_prefix("id:") {
            id = Some(v.trim().trim_matches('\'').to_string());
        }
    };
    for (i, c) in actions.char_indices() {
        match c {
            '\'' => quoted = !quoted,
            ',' if !quoted => {
                take(&actions[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    take(&actions[start..]);
    (id, chains)
}

/// The directives of a configuration text with their first line:
/// comments dropped, lines ending in `\` joined to the next.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if current.is_none() && (line.trim_start().starts_with('#') || line.trim().is_empty()) {
            continue;
        }
        let (body, continues) = match line.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        let entry = current.get_or_insert_with(|| (i + 1, String::new()));
        entry.1.push_str(body.trim_start());
        entry.1.push(' ');
        if !continues {
            out.extend(current.take());
        }
    }
    out.extend(current);
    out
}

/// The arguments of a directive: words split at blanks, a double-quoted
/// argument kept whole with `\"` read as `"` (other backslashes kept).
fn arguments(directive: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = directive.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else {
            return args;
        };
        let mut arg = String::new();
        if first == '"' {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' if chars.peek() == Some(&'"') => arg.push(chars.next().unwrap_or('"')),
                    '"' => break,
                    c => arg.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                arg.push(c);
            }
        }
        args.push(arg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
# A comment with SecRule ARGS "@rx nothing" "id:1"
SecRule ARGS "@rx (?i:sleep\(\s*?\d*?\s*?\))" \
    "id:942160,\
    phase:2,\
    msg:'blind, sqli',\
    block"

SecRule REQUEST_HEADERS:Content-Type "!@rx ^[\w/.+-]+=['\"\w]+$" "id:920470,chain"
    SecRule MATCHED_VAR "@rx charset\s*=\s*[\"']?x" "t:none"
SecRule ARGS "@pm select union" "id:942999"
SecRule ARGS "@rx ^%{tx.allowed}$" "id:920420"
SecRule ARGS "@rx abc" "phase:1"
SecRule ARGS "@detectSQLi" "id:942100,chain"
    SecRule ARGS "bare[0-9]+" "id:1"
"#;

    fn parsed() -> RuleSet {
        let mut set = RuleSet::default();
        set.parse_file("test.conf", RULES);
        set
    }

    #[test]
    fn loads_each_rx_pattern_with_its_rule_id_across_continued_lines() {
        let set = parsed();
        let got: Vec<(String, &str, usize)> = set
            .patterns
            .iter()
            .map(|p| (p.id.to_string(), p.regex.as_str(), p.line))
            .collect();
        assert_eq!(
            got,
            vec![
                ("942160".into(), r"(?i:sleep\(\s*?\d*?\s*?\))", 3),
                ("920470".into(), r#"^[\w/.+-]+=['"\w]+$"#, 9),
                ("920470.1".into(), r#"charset\s*=\s*["']?x"#, 10),
                ("942100.1".into(), r"bare[0-9]+", 15),
            ]
        );
    }

    #[test]
    fn a_pattern_that_cannot_be_loaded_is_kept_with_its_reason() {
        let set = parsed();
        let skipped: Vec<(Option<String>, usize, &str)> = set
            .skipped
            .iter()
            .map(|s| (s.id.map(|i| i.to_string()), s.line, s.reason.as_str()))
            .collect();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert_eq!(skipped[0].0.as_deref(), Some("920420"));
        assert!(skipped[0].2.contains("run-time variable"));
        assert_eq!((skipped[1].0.as_deref(), skipped[1].1), (None, 13));
        assert!(skipped[1].2.contains("without an id"));
    }

    #[test]
    fn pattern_ids_keep_the_rule_and_its_chain_place() {
        let id = PatternId::new(942_160, 2).unwrap();
        assert_eq!(
            (id.rule(), id.part(), id.to_string()),
            (942_160, 2, "942160.2".into())
        );
        assert!(PatternId::new(1 << 24, 0).is_none());
        assert!(PatternId::new(1, 256).is_none());
    }

    #[test]
    fn unterminated_quotes_and_junk_do_not_panic() {
        let mut set = RuleSet::default();
        set.parse_file("junk.conf", "SecRule ARGS \"@rx abc\\\nSecRule\n\"\\\n\\");
        set.parse_file("junk.conf", "SecRule ARGS \"@rx (a\" \"id:99999999999999\"");
        assert!(set.patterns.is_empty());
        assert_eq!(set.skipped.len(), 2);
    }

    #[test]
    fn a_directory_without_rule_files_is_an_error() {
        let dir = std::env::temp_dir().join(format!("uniplane-rules-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(matches!(RuleSet::load(&dir), Err(LoadError::Empty(_))));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(RuleSet::load(&dir), Err(LoadError::Io { .. })));
    }
}
