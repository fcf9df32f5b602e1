//! The multi-pattern matchers a regex stage runs: which of its patterns
//! occur anywhere in an input.
//!
//! Both engines read the input as bytes and the patterns the way PCRE2
//! does without its UTF mode, so that all engines agree: `\w`, `\d`, `\s`,
//! `\b` and `(?i)` are ASCII, `.` matches any byte but `\n`, `^` and `$`
//! are the input's ends (PCRE2 and Hyperscan also let `$` match before a
//! final newline; inputs without `\n` see no difference).
//!
//! - [`EngineKind::Automata`]: a `regex-automata` meta regex per pattern
//!   (prefilter, lazy DFA), each asked whether it matches at all (the
//!   search stops at the first match end), each cache reused. One meta
//!   regex over all the patterns, searched for every pattern that
//!   matches (`MatchKind::All`, overlapping), gives the same answers but
//!   its lazy DFA's states explode on the Core Rule Set and it falls back
//!   to the PikeVM: about 100 times slower on 4 KiB inputs (41 ms against
//!   0.39 ms for a third of the rules, measured on the development
//!   machine).
//! - [`EngineKind::Hyperscan`] (cargo feature `hyperscan`): one Hyperscan
//!   block-mode database, each pattern reported once (`SINGLEMATCH`), its
//!   scratch reused.
//!
//! A pattern the engine refuses is found by compiling it alone first
//! ([`check`]); the database is built from those it accepts.

use regex_automata::{
    meta::{self, Regex},
    util::syntax,
    Input,
};

/// Which engine matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// `regex-automata`'s meta regex.
    Automata,
    /// Hyperscan (Debian's libhyperscan).
    Hyperscan,
}

impl EngineKind {
    /// Its name in a stage's parameters.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Automata => "automata",
            EngineKind::Hyperscan => "hyperscan",
        }
    }

    /// The engine named `name`, or why not (unknown, or not built in).
    pub fn parse(name: &str) -> Result<EngineKind, String> {
        match name {
            "automata" => Ok(EngineKind::Automata),
            "hyperscan" if cfg!(feature = "hyperscan") => Ok(EngineKind::Hyperscan),
            "hyperscan" => Err("engine `hyperscan` is not built in (cargo feature \
                 `uniplane-kernel/hyperscan`)"
                .into()),
            other => Err(format!(
                "unknown engine `{other}` (automata{})",
                if cfg!(feature = "hyperscan") {
                    ", hyperscan"
                } else {
                    ""
                }
            )),
        }
    }
}

/// Whether `engine` compiles `regex`, and if not, its reason.
pub fn check(engine: EngineKind, regex: &str) -> Result<(), String> {
    match engine {
        EngineKind::Automata => automata(regex).map(drop),
        #[cfg(feature = "hyperscan")]
        EngineKind::Hyperscan => hyperscan::Database::compile(&[regex]).map(drop),
        #[cfg(not(feature = "hyperscan"))]
        EngineKind::Hyperscan => EngineKind::parse("hyperscan").map(drop),
    }
}

fn automata(regex: &str) -> Result<Regex, String> {
    Regex::builder()
        .syntax(syntax::Config::new().unicode(false).utf8(false))
        .configure(
            Regex::config()
                .utf8_empty(false)
                .nfa_size_limit(Some(64 << 20))
                .hybrid_cache_capacity(8 << 20),
        )
        .build(regex)
        .map_err(|e| match e.syntax_error() {
            // The parser's message is a drawing of the pattern and an
            // `error: …` line: the line says why.
            Some(syntax) => {
                let text = syntax.to_string();
                let why = text.lines().find_map(|l| l.strip_prefix("error: "));
                why.map_or_else(|| text.replace('\n', " "), str::to_string)
            }
            None => e.to_string(),
        })
}

/// A compiled set of patterns and what one search needs, reused.
pub struct Matcher {
    inner: Inner,
}

enum Inner {
    Automata {
        regexes: Vec<Regex>,
        caches: Vec<meta::Cache>,
    },
    #[cfg(feature = "hyperscan")]
    Hyperscan {
        database: hyperscan::Database,
        scratch: hyperscan::Scratch,
    },
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matcher")
            .field("engine", &self.engine().name())
            .finish()
    }
}

impl Matcher {
    /// One matcher over `regexes` (each of which [`check`] accepted).
    pub fn build(engine: EngineKind, regexes: &[&str]) -> Result<Matcher, String> {
        let inner = match engine {
            EngineKind::Automata => {
                let regexes = regexes
                    .iter()
                    .enumerate()
                    .map(|(i, r)| automata(r).map_err(|e| format!("pattern {i}: {e}")))
                    .collect::<Result<Vec<_>, _>>()?;
                Inner::Automata {
                    caches: regexes.iter().map(Regex::create_cache).collect(),
                    regexes,
                }
            }
            #[cfg(feature = "hyperscan")]
            EngineKind::Hyperscan => {
                let database = hyperscan::Database::compile(regexes)?;
                let scratch = database.scratch()?;
                Inner::Hyperscan { database, scratch }
            }
            #[cfg(not(feature = "hyperscan"))]
            EngineKind::Hyperscan => return Err(EngineKind::parse("hyperscan").unwrap_err()),
        };
        Ok(Matcher { inner })
    }

    /// Its engine.
    pub fn engine(&self) -> EngineKind {
        match self.inner {
            Inner::Automata { .. } => EngineKind::Automata,
            #[cfg(feature = "hyperscan")]
            Inner::Hyperscan { .. } => EngineKind::Hyperscan,
        }
    }

    /// Puts the indices (into the `regexes` it was built from) of the
    /// patterns found in `input` into `found`, each once, ascending.
    /// No allocation once `found` has grown to the set's size.
    pub fn matches(&mut self, input: &[u8], found: &mut Vec<usize>) -> Result<(), String> {
        found.clear();
        match &mut self.inner {
            Inner::Automata { regexes, caches } => {
                for (i, (regex, cache)) in regexes.iter().zip(caches.iter_mut()).enumerate() {
                    let search = Input::new(input).earliest(true);
                    if regex.search_half_with(cache, &search).is_some() {
                        found.push(i);
                    }
                }
                Ok(())
            }
            #[cfg(feature = "hyperscan")]
            Inner::Hyperscan { database, scratch } => {
                database.scan(input, scratch, found)?;
                found.sort_unstable();
                found.dedup();
                Ok(())
            }
        }
    }
}

#[cfg(feature = "hyperscan")]
mod hyperscan {
    //! A thin safe wrapper of the `hyperscan-sys` calls a stage uses.

    use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
    use std::ptr;

    use hyperscan_sys as hs;

    /// Flags of every pattern: report each once, allow patterns that can
    /// match the empty string (they match every input).
    const FLAGS: c_uint = hs::HS_FLAG_SINGLEMATCH | hs::HS_FLAG_ALLOWEMPTY;

    /// A block-mode database.
    pub struct Database(*mut hs::hs_database_t);

    /// Scratch space for one scanning thread.
    pub struct Scratch(*mut hs::hs_scratch_t);

    // SAFETY: a database is immutable once compiled and may be used from
    // any thread; a scratch is used by one thread at a time (its owner's,
    // through `&mut`).
    unsafe impl Send for Database {}
    unsafe impl Send for Scratch {}

    impl Database {
        /// Compiles `regexes`, pattern `i` reporting id `i`.
        pub fn compile(regexes: &[&str]) -> Result<Database, String> {
            let exprs = regexes
                .iter()
                .map(|r| CString::new(*r).map_err(|_| "a NUL byte in the pattern".to_string()))
                .collect::<Result<Vec<_>, _>>()?;
            let ptrs: Vec<*const c_char> = exprs.iter().map(|e| e.as_ptr()).collect();
            let flags = vec![FLAGS; regexes.len()];
            let ids: Vec<c_uint> = (0..regexes.len() as c_uint).collect();
            let count = c_uint::try_from(regexes.len()).map_err(|_| "too many patterns")?;
            let mut db = ptr::null_mut();
            let mut error = ptr::null_mut();
            // SAFETY: the arrays hold `count` elements and outlive the call;
            // the out-pointers are valid.
            let rc = unsafe {
                hs::hs_compile_multi(
                    ptrs.as_ptr(),
                    flags.as_ptr(),
                    ids.as_ptr(),
                    count,
                    hs::HS_MODE_BLOCK,
                    ptr::null(),
                    &mut db,
                    &mut error,
                )
            };
            if rc == hs::HS_SUCCESS as hs::hs_error_t {
                return Ok(Database(db));
            }
            if error.is_null() {
                return Err(format!("hyperscan compile error {rc}"));
            }
            // SAFETY: a compile error from the failed call, freed once.
            unsafe {
                let message = CStr::from_ptr((*error).message)
                    .to_string_lossy()
                    .into_owned();
                let expression = (*error).expression;
                hs::hs_free_compile_error(error);
                Err(if regexes.len() > 1 && expression >= 0 {
                    format!("pattern {expression}: {message}")
                } else {
                    message
                })
            }
        }

        /// Scratch space for scanning this database.
        pub fn scratch(&self) -> Result<Scratch, String> {
            let mut scratch = ptr::null_mut();
            // SAFETY: a valid database and out-pointer.
            let rc = unsafe { hs::hs_alloc_scratch(self.0, &mut scratch) };
            if rc != hs::HS_SUCCESS as hs::hs_error_t {
                return Err(format!("hyperscan scratch allocation error {rc}"));
            }
            Ok(Scratch(scratch))
        }

        /// Appends the id of each pattern found in `input` to `found`.
        pub fn scan(
            &self,
            input: &[u8],
            scratch: &mut Scratch,
            found: &mut Vec<usize>,
        ) -> Result<(), String> {
            unsafe extern "C" fn on_match(
                id: c_uint,
                _from: c_ulonglong,
                _to: c_ulonglong,
                _flags: c_uint,
                context: *mut c_void,
            ) -> c_int {
                // SAFETY: `context` is the `found` that `scan` passed, alive
                // and borrowed only here during the call.
                let found = unsafe { &mut *(context as *mut Vec<usize>) };
                found.push(id as usize);
                0
            }
            let len = c_uint::try_from(input.len()).map_err(|_| "input too long")?;
            // SAFETY: the database and scratch are valid, the input is
            // `len` bytes, and `found` outlives the call.
            let rc = unsafe {
                hs::hs_scan(
                    self.0,
                    input.as_ptr() as *const c_char,
                    len,
                    0,
                    scratch.0,
                    Some(on_match),
                    found as *mut Vec<usize> as *mut c_void,
                )
            };
            if rc != hs::HS_SUCCESS as hs::hs_error_t {
                return Err(format!("hyperscan scan error {rc}"));
            }
            Ok(())
        }
    }

    impl Drop for Database {
        fn drop(&mut self) {
            // SAFETY: owned, freed once.
            unsafe { hs::hs_free_database(self.0) };
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            // SAFETY: owned, freed once.
            unsafe { hs::hs_free_scratch(self.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engines() -> Vec<EngineKind> {
        let mut e = vec![EngineKind::Automata];
        if cfg!(feature = "hyperscan") {
            e.push(EngineKind::Hyperscan);
        }
        e
    }

    #[test]
    fn every_pattern_that_occurs_is_found_once_overlapping_or_not() {
        for engine in engines() {
            let mut m =
                Matcher::build(engine, &["abc", "(?i:SLEEP)\\(", "^start", "end$", "b"]).unwrap();
            let mut found = Vec::new();
            m.matches(b"start abc sleep( b end", &mut found).unwrap();
            assert_eq!(found, vec![0, 1, 2, 3, 4], "{engine:?}");
            m.matches(b"xx start", &mut found).unwrap();
            assert_eq!(found, Vec::<usize>::new(), "{engine:?}");
        }
    }

    #[test]
    fn matching_is_bytewise_and_ascii_like_pcre_without_utf() {
        for engine in engines() {
            let mut m = Matcher::build(engine, &["\\w\\xff", "caf\\xe9"]).unwrap();
            let mut found = Vec::new();
            m.matches(b"\x80a\xff caf\xe9", &mut found).unwrap();
            assert_eq!(found, vec![0, 1], "{engine:?}");
            m.matches("é\u{ff}".as_bytes(), &mut found).unwrap();
            assert!(found.is_empty(), "{engine:?}: non-ASCII is not a word byte");
        }
    }

    #[test]
    fn a_pattern_the_engine_refuses_is_named_with_its_reason() {
        for engine in engines() {
            assert!(check(engine, "(?<=a)b|(a)\\1").is_err(), "{engine:?}");
            assert!(check(engine, "(").is_err(), "{engine:?}");
            assert!(check(engine, "a[0-9]+").is_ok(), "{engine:?}");
        }
    }

    #[test]
    fn engines_are_chosen_by_name() {
        assert_eq!(EngineKind::parse("automata"), Ok(EngineKind::Automata));
        assert!(EngineKind::parse("pcre")
            .unwrap_err()
            .contains("unknown engine"));
        assert_eq!(
            EngineKind::parse("hyperscan").is_ok(),
            cfg!(feature = "hyperscan")
        );
    }
}
