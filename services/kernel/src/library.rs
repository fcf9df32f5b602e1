//! Kernels that take parameters: the daemon builds one from a device's
//! `function` and its `[devices.params]` table.
//!
//! ```toml
//! [[devices]]
//! name = "stage1"
//! kind = "kernel"
//! function = "dense"                         # a name of LIBRARY
//! params = { layers = "0..2", seed = "7" }   # strings or integers; the kernel parses them
//! ```
//!
//! A library kernel is checked when the configuration is read
//! ([`check`], cheap: no weights generated, no rules compiled) and built
//! when the device starts ([`build`]): a build that fails (a rule file
//! that cannot be read, say) is the device's start error, named.

use std::collections::BTreeMap;

use crate::Kernel;

/// A library kernel's parameters: name → value, as the configuration
/// gives them (an integer is its decimal digits).
pub type Params = BTreeMap<String, String>;

/// One kernel of the library.
#[derive(Clone, Copy)]
pub struct Spec {
    /// Its name (`function = "…"`).
    pub name: &'static str,
    /// What it computes, for errors and `uniplane status`.
    pub about: &'static str,
    /// Checks the parameters without building anything heavy.
    pub check: fn(&Params) -> Result<(), String>,
    /// Builds the kernel (on the daemon's start; may take time).
    pub build: fn(&Params) -> Result<Box<dyn Kernel>, String>,
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec").field("name", &self.name).finish()
    }
}

/// Every library kernel.
pub const LIBRARY: &[Spec] = &[
    crate::dense::SPEC,
    crate::regex_stage::SPEC,
    crate::pgas_target::SPEC,
];

/// The library kernel named `name`.
pub fn spec(name: &str) -> Option<&'static Spec> {
    LIBRARY.iter().find(|s| s.name == name)
}

/// Checks `params` for the library kernel `name`: `None` when the
/// library has no such kernel.
pub fn check(name: &str, params: &Params) -> Option<Result<(), String>> {
    spec(name).map(|s| (s.check)(params))
}

/// Builds the library kernel `name`: `None` when the library has no such
/// kernel.
pub fn build(name: &str, params: &Params) -> Option<Result<Box<dyn Kernel>, String>> {
    spec(name).map(|s| (s.build)(params))
}

/// A parameter that must be there.
pub fn required<'a>(params: &'a Params, key: &str) -> Result<&'a str, String> {
    params
        .get(key)
        .map(String::as_str)
        .ok_or_else(|| format!("parameter `{key}` is missing"))
}

/// A parameter parsed as `T`, or `default` when absent.
pub fn parsed_or<T: std::str::FromStr>(params: &Params, key: &str, default: T) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    match params.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|e| format!("parameter `{key}` = `{v}`: {e}")),
    }
}

/// Refuses parameters not in `known` (a misspelt one is not ignored).
pub fn only(params: &Params, known: &[&str]) -> Result<(), String> {
    match params.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(format!(
            "unknown parameter `{k}` (this kernel takes: {})",
            known.join(", ")
        )),
    }
}
