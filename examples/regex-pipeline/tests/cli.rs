//! The `regex-pipeline` command line: its report names every refusal,
//! and the devices it prints are a configuration the daemon accepts.

mod common;

use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_regex-pipeline"))
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn report_counts_the_patterns_per_engine_and_names_each_refusal() {
    if common::crs().is_none() {
        return;
    }
    let text = run(&["report"]);
    let first = text.lines().next().unwrap();
    assert!(first.ends_with("loaded, 1 not loaded"), "{first}");
    assert!(text.contains("\nautomata: "), "{text}");
    assert!(text.contains("\npcre2: 264 compile, 0 refused"), "{text}");
    assert!(text.contains("  refused 942130: "), "{text}");
    assert!(text.contains("  not loaded 920480.1 "), "{text}");
}

#[test]
fn the_printed_devices_are_a_configuration_the_daemon_accepts() {
    let devices = run(&["devices", "--chained", "40", "--relayed", "50"]);
    let text = format!("[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n{devices}");
    let config = uniplane_services::config::Config::parse(&text, "devices").unwrap();
    let names: Vec<&str> = config.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["chained0", "chained1", "chained2", "relayed0", "relayed1", "relayed2"]
    );
    assert_eq!(devices.matches("next = \"127.0.0.1:").count(), 2);
    assert!(devices.contains("next = \"127.0.0.1:41\""));
}

#[test]
fn a_missing_rule_directory_is_an_error_that_names_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_regex-pipeline"))
        .args(["--rules", "no-such-rules-dir", "report"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-rules-dir"));
}
