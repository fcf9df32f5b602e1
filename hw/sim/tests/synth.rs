//! yosys elaborates `uniplane_top` (with either crossbar) and each kernel
//! of `rtl/kernels/` into a netlist without errors (every construct synthesizable, no multiple
//! drivers, no combinational loop).
//! The area figures themselves come from `hw/synth/synth.sh`, which takes
//! too long for a test.

use std::path::PathBuf;
use std::process::Command;

fn rtl() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rtl")
}

/// Reads `files` (with `rtl/` on the include path) and elaborates `top`:
/// fails with yosys's output if anything is wrong; skips when yosys is
/// missing, unless `UNIPLANE_REQUIRE_TOOLS` is set.
fn elaborate(top: &str, files: &[String]) {
    elaborate_with(top, files, &[]);
}

/// [`elaborate`] with parameters of `top` set (`chparam`).
fn elaborate_with(top: &str, files: &[String], params: &[(&str, u32)]) {
    let chparam: String = params
        .iter()
        .map(|(k, v)| format!("chparam -set {k} {v} {top}; "))
        .collect();
    let script = format!(
        "read_verilog -I{} {}; {chparam}hierarchy -check -top {top}; proc; opt_clean; check -assert",
        rtl().display(),
        files.join(" ")
    );
    let out = match Command::new("yosys").args(["-q", "-p", &script]).output() {
        Ok(out) => out,
        Err(e) => {
            if std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_some() {
                panic!("yosys is not installed (apt-get install yosys): {e}");
            }
            eprintln!("skipped: yosys is not installed");
            return;
        }
    };
    assert!(
        out.status.success(),
        "yosys {top}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rtl_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(rtl())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "v"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    files
}

#[test]
fn yosys_elaborates_the_top_level_cleanly() {
    elaborate("uniplane_top", &rtl_files());
}

#[test]
fn yosys_elaborates_the_top_level_with_islip_matching_cleanly() {
    elaborate_with("uniplane_top", &rtl_files(), &[("MATCH", 1), ("ITER", 2)]);
    elaborate_with(
        "uniplane_top",
        &rtl_files(),
        &[("MATCH", 1), ("ITER", 2), ("PORTS", 2)],
    );
}

/// Elaborates the kernel `top` (in `rtl/kernels/`) with the modules it uses.
fn elaborate_kernel(top: &str) {
    let rtl = rtl();
    let files = [rtl.join(format!("kernels/{top}.v")), rtl.join("up_skid.v")];
    let files: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    elaborate(top, &files);
}

#[test]
fn yosys_elaborates_the_echo_kernel_cleanly() {
    elaborate_kernel("up_kernel_echo");
}

#[test]
fn yosys_elaborates_the_sum32_kernel_cleanly() {
    elaborate_kernel("up_kernel_sum32");
}
