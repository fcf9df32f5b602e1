//! `uniplaned --check`: the built binary refuses a bad file with its
//! place, field, value and range, and accepts the default it prints.

use std::path::PathBuf;
use std::process::{Command, Output};

fn file(name: &str, text: &str) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("uniplane-check-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn check(path: &PathBuf) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uniplaned"))
        .arg("--check")
        .arg("--config")
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn finding7_check_refuses_a_number_that_would_abort_the_daemon_at_start() {
    let path = file(
        "memory",
        "[[devices]]\nname = \"m\"\nkind = \"memory\"\nmemory = 9223372036854775807\n",
    );
    let out = check(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        format!(
            "uniplaned: {}:4:10: field `devices.memory`: 9223372036854775807 is out of range \
             0..=1073741824 (1 GiB)",
            path.display()
        )
    );
}

#[test]
fn finding7_check_refuses_duplicate_device_numbers() {
    let path = file(
        "duplicate",
        "[[devices]]\nname = \"a\"\nkind = \"echo\"\ndevice = 3\n\
         [[devices]]\nname = \"b\"\nkind = \"echo\"\ndevice = 3\n",
    );
    let out = check(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("device number 3 is used twice"), "{stderr}");
}

#[test]
fn the_printed_default_configuration_passes_the_check() {
    let printed = Command::new(env!("CARGO_BIN_EXE_uniplaned"))
        .arg("--print-default-config")
        .output()
        .unwrap();
    assert!(printed.status.success());
    let path = file("default", &String::from_utf8(printed.stdout).unwrap());
    let out = check(&path);
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
