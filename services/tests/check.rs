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

/// The packaged unit's command lines, with the packaged configuration,
/// are ones this build accepts: the unit names flags that exist, in a
/// form that parses, and the configuration it points at passes.
#[test]
fn the_packaged_unit_and_configuration_are_accepted() {
    let packaging = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging");
    let config = packaging.join("uniplaned.toml");
    let out = check(&config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unit = std::fs::read_to_string(packaging.join("uniplaned.service")).unwrap();
    let line = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in the unit"))
            .to_string()
    };
    assert_eq!(
        line("Type="),
        "notify",
        "readiness is told on NOTIFY_SOCKET"
    );
    assert!(line("ExecReload=").contains("-HUP"), "reload is SIGHUP");
    for key in ["ExecStartPre=", "ExecStart="] {
        let words: Vec<String> = line(key).split_whitespace().map(String::from).collect();
        assert_eq!(words[0], "/usr/bin/uniplaned", "{key}");
        let args: Vec<String> = words[1..]
            .iter()
            .map(|w| {
                if w == "/etc/uniplane/uniplaned.toml" {
                    config.display().to_string()
                } else {
                    w.clone()
                }
            })
            .collect();
        // Checked, not started: the same flags with --check.
        let mut checked = args.clone();
        if !checked.iter().any(|a| a == "--check") {
            checked.push("--check".into());
        }
        let out = Command::new(env!("CARGO_BIN_EXE_uniplaned"))
            .args(&checked)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{key} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn check_refuses_an_rtl_kernel_the_plane_cannot_serve() {
    let device = "[[devices]]\nname = \"k\"\nkind = \"kernel\"\nbackend = \"rtl\"\n\
                  function = \"echo\"\n";
    let path = file("rtl-kernel", device);
    let out = check(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "rtl") {
        // On the engine plane (the default), the reason and the way out.
        assert_eq!(
            stderr.trim(),
            "uniplaned: device `k`: a `backend = \"rtl\"` kernel runs on the RTL plane, \
             not on engine: start with --plane rtl (or plane = \"rtl\")"
        );
    } else {
        assert!(
            stderr.contains("built without the rtl feature (build with `--features rtl`)"),
            "{stderr}"
        );
    }
    if cfg!(feature = "rtl") {
        let path = file("rtl-kernel-plane", &format!("plane = \"rtl\"\n{device}"));
        let out = check(&path);
        let _ = std::fs::remove_file(&path);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}
