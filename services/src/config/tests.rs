//! The configuration file's parser: what it accepts and how it refuses.

use super::*;

#[test]
fn the_embedded_default_is_valid() {
    let c = Config::embedded().unwrap();
    assert!(c.devices.iter().any(|d| d.kind == DeviceKind::Echo));
    assert!(c.stacks.iter().any(|s| s.name == "tcp"));
}

#[test]
fn the_plane_is_the_engine_unless_the_file_names_the_rtl() {
    assert_eq!(
        Config::embedded().unwrap().plane,
        crate::plane::PlaneKind::Engine
    );
    let c = Config::parse("plane = \"rtl\"\n[server]\nname = \"a\"\n", "c.toml").unwrap();
    assert_eq!(c.plane, crate::plane::PlaneKind::Rtl);
    let err = Config::parse("plane = \"fpga\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "c.toml:1:9: field `plane`: `fpga`: expected \"engine\" or \"rtl\""
    );
}

#[test]
fn syntax_errors_give_file_line_and_column() {
    let err = Config::parse("[server]\nid = 10.0.0.1\n", "x.toml").unwrap_err();
    let ConfigError::Syntax { file, line, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((file.as_str(), *line), ("x.toml", 2));
}

#[test]
fn a_bad_value_names_the_field_and_what_was_expected() {
    let text = "[server]\nname = \"a\"\n\n[[stacks]]\nname = \"carrier-pigeon\"\n";
    let err = Config::parse(text, "c.toml").unwrap_err().to_string();
    assert!(err.starts_with("c.toml:5:8: field `stacks.name`"), "{err}");
    assert!(err.contains("expected one of"), "{err}");
}

#[test]
fn unknown_fields_are_refused() {
    let err = Config::parse("[server]\nide = \"1.2.3.4\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("c.toml:2:1"), "{err}");
    assert!(err.contains("unknown field `ide`"), "{err}");
}

#[test]
fn uid_patterns_parse_and_match() {
    let p: UidPattern = "10.0.0.0/24:*".parse().unwrap();
    assert!(p.matches("10.0.0.9:4".parse().unwrap()));
    assert!(!p.matches("10.0.1.9:4".parse().unwrap()));
    let e: UidPattern = "10.0.0.7:3".parse().unwrap();
    assert!(e.matches("10.0.0.7:3".parse().unwrap()));
    assert!(!e.matches("10.0.0.7:4".parse().unwrap()));
    assert!(UidPattern::ANY.matches("1.2.3.4:5".parse().unwrap()));
    assert!("10.0.0.7".parse::<UidPattern>().is_err());
    assert!("10.0.0.0/33:*".parse::<UidPattern>().is_err());
}

#[test]
fn rules_decide_first_match_then_the_default() {
    let text = r#"
[server]
id = "10.0.0.1"
[policy]
default = "deny"
[[policy.rules]]
src = "10.0.0.1:*"
dst = "10.0.0.2:7"
types = ["WRTE"]
action = "deny"
[[policy.rules]]
src = "10.0.0.0/24:*"
dst = "10.0.0.0/24:*"
action = "allow"
"#;
    let c = Config::parse(text, "p.toml").unwrap();
    let (a, b) = ("10.0.0.1:3".parse().unwrap(), "10.0.0.2:7".parse().unwrap());
    assert!(!c.allows(a, b, ReqType::Write));
    assert!(c.allows(a, b, ReqType::Send));
    assert!(!c.allows(a, "10.9.0.2:7".parse().unwrap(), ReqType::Send));
}
