//! DUA's multi-regex matching application (NSDI'19 §8.2) on uniplane:
//! the OWASP ModSecurity Core Rule Set's `@rx` patterns, split into three
//! seeded groups, matched by three `regex-stage` kernels.
//!
//! ```text
//!  through uniplane:  app ─▶ stage 0 ══next══▶ stage 1 ══next══▶ stage 2 ─▶ app   (several inputs in flight)
//!  through the CPU:   app ─▶ stage 0 ─▶ app ─▶ stage 1 ─▶ app ─▶ stage 2 ─▶ app   (the relay: one at a time)
//!  one core:          app: PCRE2, every rule in turn
//! ```
//!
//! The stages are kernel devices of one daemon ([`pipeline::Stages::devices`]);
//! whether they forward to each other (`next`) or an application relays
//! between them is the configuration's only difference. This crate holds
//! what the application needs around them: the rule set's per-engine
//! report ([`report`]), seeded inputs with planted matches ([`corpus`]),
//! the one-core PCRE2 baseline ([`one_core`]) and the two ways to drive
//! the stages ([`pipeline`]).

#![deny(missing_docs)]

pub mod corpus;
pub mod one_core;
pub mod pipeline;
pub mod report;

pub use uniplane_kernel::regex_stage::engine::EngineKind;
pub use uniplane_kernel::regex_stage::rules::{PatternId, RuleSet};

/// Where Debian's `modsecurity-crs` package puts the rule files.
pub const DEBIAN_CRS_RULES: &str = "/usr/share/modsecurity-crs/rules";
