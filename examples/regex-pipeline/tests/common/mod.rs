//! What the regex pipeline's tests share: the Core Rule Set of Debian's
//! `modsecurity-crs`, and the engines this build has.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::path::Path;

use uniplane_regex_pipeline::{EngineKind, RuleSet, DEBIAN_CRS_RULES};

/// The Core Rule Set, or `None` (skip) when the package is absent; with
/// `UNIPLANE_REQUIRE_TOOLS=1` its absence fails the test instead.
pub fn crs() -> Option<RuleSet> {
    let dir = Path::new(DEBIAN_CRS_RULES);
    if !dir.is_dir() {
        if std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_some_and(|v| v == "1") {
            panic!("needs the modsecurity-crs package (UNIPLANE_REQUIRE_TOOLS=1)");
        }
        eprintln!("skipped: no {DEBIAN_CRS_RULES} (apt-get install modsecurity-crs)");
        return None;
    }
    Some(RuleSet::load(dir).expect("the Core Rule Set loads"))
}

/// The stage engines of this build.
pub fn engines() -> Vec<EngineKind> {
    ["automata", "hyperscan"]
        .into_iter()
        .filter_map(|n| EngineKind::parse(n).ok())
        .collect()
}
