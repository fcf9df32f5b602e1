//! Helpers the integration tests share.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs the `uniplane-bench` binary with `args`.
pub fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uniplane-bench"))
        .args(args)
        .output()
        .expect("the uniplane-bench binary runs")
}

/// Runs the binary with `args`, which must fail with `needle` on stderr.
pub fn fails_with(args: &[&str], needle: &str) {
    let out = bench(args);
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "{args:?}: `{needle}` not in:\n{err}");
}

/// The JSON document on the last line of stdout of a successful run.
pub fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("some output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"))
}

/// The value at `path` (`a.b.c`), which must exist.
pub fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| {
        v.get(k)
            .unwrap_or_else(|| panic!("`{path}` missing (no `{k}`) in {v}"))
    })
}

/// Asserts `path` is a number.
pub fn number(v: &Value, path: &str) -> f64 {
    at(v, path)
        .as_f64()
        .unwrap_or_else(|| panic!("`{path}` is not a number"))
}

/// Asserts `path` is a non-negative integer.
pub fn count(v: &Value, path: &str) -> u64 {
    at(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("`{path}` is not a count"))
}

/// Asserts `path` is a string.
pub fn string<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

/// Asserts the `machine` section has every documented key.
pub fn check_machine(v: &Value) {
    for k in [
        "cpu_model",
        "kernel",
        "hostname",
        "os",
        "rustc",
        "uniplane",
        "build",
    ] {
        string(v, &format!("machine.{k}"));
    }
    assert!(count(v, "machine.cores") >= 1);
}

/// Whether a test that needs `tool` should run: true when it is installed;
/// when it is not, false (skip) unless `UNIPLANE_REQUIRE_TOOLS=1`, which
/// makes the absence a failure.
pub fn tool_available(tool: &str, package: &str) -> bool {
    if uniplane_bench::peer::find_tool(tool).is_some() {
        return true;
    }
    if std::env::var("UNIPLANE_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!("`{tool}` is required (UNIPLANE_REQUIRE_TOOLS=1) but not installed: apt-get install {package}");
    }
    eprintln!("skipping: `{tool}` not installed (Debian package {package})");
    false
}

/// The `uniplaned` built next to the benchmark, when there is one; when
/// there is none, `None` (skip) unless `UNIPLANE_REQUIRE_TOOLS` is set,
/// which makes the absence a failure.
pub fn uniplaned() -> Option<PathBuf> {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_uniplane-bench"));
    let daemon = bench.parent()?.join("uniplaned");
    if daemon.exists() {
        return Some(daemon);
    }
    assert!(
        std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_none(),
        "no uniplaned beside {}: run the workspace's tests (cargo test --workspace) or build it first",
        bench.display()
    );
    eprintln!("skipped: no uniplaned built beside the benchmark");
    None
}
