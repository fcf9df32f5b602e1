//! yosys elaborates `uniplane_top` and each kernel of `rtl/kernels/` into a
//! netlist without errors (every construct synthesizable, no multiple
//! drivers, no combinational loop).
//! The area figures themselves come from `hw/synth/synth.sh`, which takes
//! too long for a test.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn yosys_elaborates_the_top_level_cleanly() {
    let rtl = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rtl");
    let mut files: Vec<String> = std::fs::read_dir(&rtl)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "v"))
        .map(|p| p.display().to_string())
        .collect();
    files.sort();
    let script = format!(
        "read_verilog -I{} {}; hierarchy -check -top uniplane_top; proc; opt_clean; check -assert",
        rtl.display(),
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
        "yosys:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Elaborates the kernel `top` (in `rtl/kernels/`) with the modules it uses.
fn elaborate_kernel(top: &str) {
    let rtl = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rtl");
    let script = format!(
        "read_verilog -I{rtl} {rtl}/kernels/{top}.v {rtl}/up_skid.v; \
         hierarchy -check -top {top}; proc; opt_clean; check -assert",
        rtl = rtl.display()
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

#[test]
fn yosys_elaborates_the_echo_kernel_cleanly() {
    elaborate_kernel("up_kernel_echo");
}

#[test]
fn yosys_elaborates_the_sum32_kernel_cleanly() {
    elaborate_kernel("up_kernel_sum32");
}
