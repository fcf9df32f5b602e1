//! `verilator --lint-only -Wall` passes on `uniplane_top` for every port
//! count the design supports, and on each table size extreme, with either
//! crossbar (a read port per output, or iSLIP matching); on each
//! kernel of `rtl/kernels/`; and on `up_top_kernels`, the plane with
//! kernels on two of its ports.

use std::path::PathBuf;
use std::process::Command;

fn rtl_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rtl")
}

/// The Verilog files directly in `dir`, sorted.
fn verilog_in(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "v"))
        .collect();
    files.sort();
    files
}

fn lint(params: &[&str]) {
    lint_top("uniplane_top", false, params);
}

/// Lints `top` with every module of `rtl/` (and of `rtl/kernels/` when
/// `kernels`).
fn lint_top(top: &str, kernels: bool, params: &[&str]) {
    let dir = rtl_dir();
    let mut files = verilog_in(&dir);
    if kernels {
        files.extend(verilog_in(&dir.join("kernels")));
    }
    let out = Command::new("verilator")
        .args(["--lint-only", "-Wall", "--top-module", top])
        .arg(format!("-I{}", dir.display()))
        .args(params)
        .args(&files)
        .output()
        .expect("verilator runs (the build needed it too)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "verilator --lint-only -Wall {top} {params:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Lints the kernel `top` (in `rtl/kernels/`) with the modules it uses.
fn lint_kernel(top: &str) {
    let dir = rtl_dir();
    let out = Command::new("verilator")
        .args(["--lint-only", "-Wall", "--top-module", top])
        .arg(format!("-I{}", dir.display()))
        .arg(dir.join("kernels").join(format!("{top}.v")))
        .arg(dir.join("up_skid.v"))
        .output()
        .expect("verilator runs (the build needed it too)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "verilator --lint-only -Wall {top}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_echo_kernel_is_lint_clean() {
    lint_kernel("up_kernel_echo");
}

#[test]
fn the_sum32_kernel_is_lint_clean() {
    lint_kernel("up_kernel_sum32");
}

#[test]
fn the_plane_with_kernels_is_lint_clean() {
    lint_top("up_top_kernels", true, &["-GVOQ_DEPTH=64"]);
}

#[test]
fn the_plane_with_kernels_is_lint_clean_with_8_ports() {
    lint_top(
        "up_top_kernels",
        true,
        &["-GN=8", "-GECHO_PORT=5", "-GSUM_PORT=1"],
    );
}

#[test]
fn the_top_level_is_lint_clean_with_4_ports() {
    lint(&["-GN=4"]);
}

#[test]
fn the_top_level_is_lint_clean_with_8_ports() {
    lint(&["-GN=8"]);
}

#[test]
fn the_top_level_is_lint_clean_with_16_ports_and_the_largest_tables() {
    lint(&["-GN=16", "-GC=32", "-GR=16", "-GT=32", "-GE=64", "-GM=4"]);
}

#[test]
fn the_top_level_is_lint_clean_with_the_smallest_tables() {
    lint(&[
        "-GN=2",
        "-GE=2",
        "-GC=2",
        "-GR=2",
        "-GT=2",
        "-GS=2",
        "-GD=2",
        "-GVOQ_DEPTH=2",
    ]);
}

#[test]
fn the_top_level_with_islip_matching_is_lint_clean_for_every_port_count() {
    lint(&["-GN=2", "-GMATCH=1", "-GVOQ_DEPTH=2", "-GPATIENCE=1"]);
    lint(&["-GN=4", "-GMATCH=1"]);
    lint(&["-GN=8", "-GMATCH=1", "-GITER=3"]);
    lint(&["-GN=16", "-GMATCH=1", "-GITER=2", "-GPATIENCE=64"]);
    // Several read ports per input: two (the built model's), three (not
    // a power of two), and as many as there are outputs.
    lint(&["-GN=2", "-GMATCH=1", "-GPORTS=2", "-GVOQ_DEPTH=2"]);
    lint(&["-GN=4", "-GMATCH=1", "-GITER=2", "-GPORTS=2"]);
    lint(&["-GN=4", "-GMATCH=1", "-GPORTS=3"]);
    lint(&["-GN=8", "-GMATCH=1", "-GITER=2", "-GPORTS=8"]);
}
