//! yosys elaborates `uniplane_top` into a netlist without errors (every
//! construct synthesizable, no multiple drivers, no combinational loop).
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
