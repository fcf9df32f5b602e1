//! Runs the unit testbenches of `hw/tb` (cocotb on Icarus, parameters
//! swept) so that `cargo test -p uniplane-hw-sim` runs every RTL test.
//!
//! They need `iverilog` and the Python packages `cocotb` (1.x; 2.x needs a
//! newer Verilator than Debian's, and these run on Icarus) and `pytest`;
//! `./scripts/test.sh` installs them. Without them this test fails when
//! `UNIPLANE_REQUIRE_TOOLS` is set (as the test script sets it) and is
//! skipped with a note otherwise.

use std::path::PathBuf;
use std::process::Command;

fn available() -> Result<(), String> {
    let iverilog = Command::new("iverilog").arg("-V").output();
    if !iverilog.is_ok_and(|o| o.status.success() || !o.stdout.is_empty()) {
        return Err("iverilog is not installed (apt-get install iverilog)".into());
    }
    let py = Command::new("python3")
        .args(["-c", "import cocotb, pytest"])
        .output();
    if !py.is_ok_and(|o| o.status.success()) {
        return Err("python3 with cocotb 1.x and pytest is missing \
             (python3 -m pip install 'cocotb>=1.8,<2' pytest)"
            .into());
    }
    Ok(())
}

#[test]
fn the_unit_testbenches_pass_on_icarus() {
    if let Err(why) = available() {
        if std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_some() {
            panic!("{why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let tb = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tb");
    let build = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hw-tb");
    let out = Command::new("python3")
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_units.py",
        ])
        .current_dir(&tb)
        .env("UNIPLANE_TB_BUILD", &build)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "hw/tb unit testbenches failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", text.lines().last().unwrap_or(""));
}
