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

/// The error of `text`, which must be refused.
fn refused(text: &str) -> ConfigError {
    match Config::parse(text, "c.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

#[test]
fn finding7_huge_memory_refused_by_check() {
    let text = "[[devices]]\nname = \"m\"\nkind = \"memory\"\nmemory = 9223372036854775807\n";
    assert_eq!(
        refused(text).to_string(),
        "c.toml:4:10: field `devices.memory`: 9223372036854775807 is out of range \
         0..=1073741824 (1 GiB)"
    );
}

#[test]
fn finding7_huge_ring_depth_refused_by_check() {
    let err = refused("[engine]\nring_depth = 4000000000000\n");
    assert_eq!(
        err.to_string(),
        "c.toml:2:14: field `engine.ring_depth`: 4000000000000 is out of range 2..=16384"
    );
}

/// Every number of the file, as a file with `VALUE` where the number
/// goes, and its range. A value one past either end (and the extremes of
/// TOML's integers) is refused with the field, the value and the range;
/// both ends are accepted.
#[test]
fn finding7_every_number_is_range_checked_at_both_ends() {
    let device = "[[devices]]\nname = \"d\"\nkind = \"echo\"\n";
    let cases = [
        (
            "engine.max_ports",
            bounds::MAX_PORTS,
            "[engine]\nmax_ports = VALUE\n".to_owned(),
        ),
        (
            "engine.ring_depth",
            bounds::RING_DEPTH,
            "[engine]\nring_depth = VALUE\n".to_owned(),
        ),
        (
            "engine.voq_depth",
            bounds::VOQ_DEPTH,
            "[engine]\nmax_ports = 2\nvoq_depth = VALUE\n".to_owned(),
        ),
        (
            "engine.table_capacity",
            bounds::TABLE_CAPACITY,
            "[engine]\ntable_capacity = VALUE\n".to_owned(),
        ),
        (
            "failure.heartbeat_ms",
            bounds::HEARTBEAT_MS,
            "[failure]\nheartbeat_ms = VALUE\n".to_owned(),
        ),
        (
            "failure.misses",
            bounds::MISSES,
            "[failure]\nmisses = VALUE\n".to_owned(),
        ),
        (
            "devices.memory",
            bounds::DEVICE_MEMORY,
            format!("{device}memory = VALUE\n"),
        ),
        (
            "devices.device",
            bounds::DEVICE,
            format!("{device}device = VALUE\n"),
        ),
    ];
    for (field, bounds, template) in cases {
        let text = |v: i64| template.replace("VALUE", &v.to_string());
        for ok in [bounds.min, bounds.max] {
            let ok = i64::try_from(ok).unwrap();
            if let Err(e) = Config::parse(&text(ok), "c.toml") {
                panic!("{field} = {ok} refused: {e}");
            }
        }
        for bad in [
            bounds.min as i64 - 1,
            bounds.max as i64 + 1,
            i64::MAX,
            i64::MIN,
        ] {
            match refused(&text(bad)) {
                ConfigError::OutOfRange {
                    field: f,
                    value,
                    bounds: b,
                    ..
                } => assert_eq!((f.as_str(), value, b), (field, bad, bounds)),
                other => panic!("{field} = {bad}: {other}"),
            }
        }
    }
}

#[test]
fn finding7_values_once_clamped_are_refused() {
    for (text, field) in [
        ("[engine]\nmax_ports = 1000\n", "engine.max_ports"),
        ("[engine]\nmax_ports = 1\n", "engine.max_ports"),
        ("[engine]\nring_depth = 0\n", "engine.ring_depth"),
        ("[engine]\nvoq_depth = 0\n", "engine.voq_depth"),
        ("[engine]\ntable_capacity = 0\n", "engine.table_capacity"),
        ("[failure]\nheartbeat_ms = 0\n", "failure.heartbeat_ms"),
        ("[failure]\nmisses = 0\n", "failure.misses"),
    ] {
        let err = refused(text).to_string();
        assert!(err.contains(&format!("field `{field}`")), "{err}");
        assert!(err.contains("is out of range"), "{err}");
    }
}

#[test]
fn finding7_device_zero_is_the_daemons_and_refused() {
    let err = refused("[[devices]]\nname = \"d\"\nkind = \"echo\"\ndevice = 0\n");
    assert!(
        matches!(err, ConfigError::OutOfRange { value: 0, .. }),
        "{err}"
    );
}

#[test]
fn finding7_a_crossbar_too_large_to_allocate_is_refused() {
    let err = refused("[engine]\nmax_ports = 256\nvoq_depth = 65\n").to_string();
    assert!(
        err.starts_with("c.toml:3:13: field `engine.voq_depth`: max_ports² × voq_depth"),
        "{err}"
    );
    assert!(err.contains("voq_depth can be at most 64"), "{err}");
    Config::parse("[engine]\nmax_ports = 256\nvoq_depth = 64\n", "c.toml").unwrap();
    Config::parse("[engine]\nmax_ports = 32\nvoq_depth = 4096\n", "c.toml").unwrap();
}

#[test]
fn finding7_more_devices_than_engine_ports_are_refused() {
    let mut text = String::from("[engine]\nmax_ports = 3\n");
    for i in 1..=3 {
        text.push_str(&format!("[[devices]]\nname = \"d{i}\"\nkind = \"echo\"\n"));
    }
    let err = refused(&text).to_string();
    assert!(
        err.starts_with("c.toml:10:8: field `devices.name`: device `d3` needs port 4"),
        "{err}"
    );
    let two = text.rsplit_once("[[devices]]").unwrap().0;
    Config::parse(two, "c.toml").unwrap();
}

#[test]
fn finding7_duplicate_device_numbers_are_refused_naming_both_places() {
    let text = "[[devices]]\nname = \"a\"\nkind = \"echo\"\ndevice = 3\n\
                [[devices]]\nname = \"b\"\nkind = \"echo\"\ndevice = 3\n";
    assert_eq!(
        refused(text).to_string(),
        "c.toml:8:10: field `devices.device`: device number 3 is used twice; \
         the other is `devices.device` at c.toml:4:10"
    );
}

#[test]
fn finding7_duplicate_device_names_are_refused_naming_both_places() {
    let text = "[[devices]]\nname = \"a\"\nkind = \"echo\"\n\
                [[devices]]\nname = \"a\"\nkind = \"memory\"\n";
    assert_eq!(
        refused(text).to_string(),
        "c.toml:5:8: field `devices.name`: device name `a` is used twice; \
         the other is `devices.name` at c.toml:2:8"
    );
}

#[test]
fn finding7_duplicate_stacks_are_refused_naming_both_places() {
    let text = "[[stacks]]\nname = \"tcp\"\n[[stacks]]\nname = \"tcp\"\n";
    assert_eq!(
        refused(text).to_string(),
        "c.toml:4:8: field `stacks.name`: stack `tcp` is used twice; \
         the other is `stacks.name` at c.toml:2:8"
    );
}

#[test]
fn finding7_duplicate_peers_and_a_peer_that_is_this_server_are_refused() {
    let peer = |ip: &str| format!("[[peers]]\nserver = \"{ip}\"\naddress = \"{ip}:7460\"\n");
    // Peers need a cluster secret; the file is read at start, not here.
    let secret = "[cluster]\nsecret = \"cluster.key\"\n";
    let text = format!(
        "[server]\nid = \"10.0.0.1\"\n{}{}{secret}",
        peer("10.0.0.2"),
        peer("10.0.0.2")
    );
    assert_eq!(
        refused(&text).to_string(),
        "c.toml:7:10: field `peers.server`: peer server 10.0.0.2 is used twice; \
         the other is `peers.server` at c.toml:4:10"
    );
    let text = format!("[server]\nid = \"10.0.0.1\"\n{}{secret}", peer("10.0.0.1"));
    let err = refused(&text).to_string();
    assert!(err.contains("10.0.0.1 is this server's own ID"), "{err}");
}

#[test]
fn finding7_two_listeners_on_one_address_are_refused_naming_both_places() {
    let stack =
        |name: &str, at: &str| format!("[[stacks]]\nname = \"{name}\"\nlisten = \"{at}\"\n");
    // A stack on the default peer channel's address.
    assert_eq!(
        refused(&stack("tcp", "127.0.0.1:7460")).to_string(),
        "c.toml:3:10: field `stacks.listen`: TCP listener on 127.0.0.1:7460 overlaps another; \
         the other is `server.peer_listen` (127.0.0.1:7460, its default)"
    );
    // Metrics on the peer channel's address.
    let text =
        "[server]\npeer_listen = \"127.0.0.1:9000\"\n[runtime]\nmetrics = \"127.0.0.1:9000\"\n";
    assert_eq!(
        refused(text).to_string(),
        "c.toml:4:11: field `runtime.metrics`: TCP listener on 127.0.0.1:9000 overlaps another; \
         the other is `server.peer_listen` (127.0.0.1:9000) at c.toml:2:15"
    );
    // Two datagram stacks; a wildcard overlaps every address of its port.
    let text = stack("udp", "0.0.0.0:7471") + &stack("ltl", "127.0.0.1:7471");
    let err = refused(&text).to_string();
    assert!(
        err.starts_with("c.toml:6:10: field `stacks.listen`: UDP listener"),
        "{err}"
    );
    assert!(
        err.contains("`stacks.listen` (0.0.0.0:7471) at c.toml:3:10"),
        "{err}"
    );
}

#[test]
fn listeners_that_can_bind_together_are_accepted() {
    let stack =
        |name: &str, at: &str| format!("[[stacks]]\nname = \"{name}\"\nlisten = \"{at}\"\n");
    for text in [
        // TCP and UDP ports are apart.
        stack("tcp", "127.0.0.1:7470") + &stack("udp", "127.0.0.1:7470"),
        // Other addresses, same port.
        stack("tcp", "127.0.0.2:7460"),
        // Port 0 takes a free port each time.
        stack("udp", "127.0.0.1:0") + &stack("ltl", "127.0.0.1:0"),
    ] {
        if let Err(e) = Config::parse(&text, "c.toml") {
            panic!("{text}: {e}");
        }
    }
}

#[test]
fn limits_default_to_the_cores_and_resources_to_the_engines_ports() {
    let c = Config::parse("[engine]\nmax_ports = 40\n", "c.toml").unwrap();
    assert_eq!(
        c.limits,
        uniplane_control::Limits {
            resources: 40,
            ..Default::default()
        }
    );
    let embedded = Config::embedded().unwrap();
    assert_eq!(
        embedded.limits,
        uniplane_control::Limits {
            resources: embedded.max_ports,
            ..Default::default()
        },
        "default.toml says the core's defaults"
    );
}

#[test]
fn every_limit_is_read_from_the_file_and_range_checked() {
    for f in limits::LIMIT_FIELDS {
        for v in [f.bounds.min, f.bounds.max] {
            let c = Config::parse(&format!("[limits]\n{} = {v}\n", f.name), "c.toml").unwrap();
            let mut limits = c.limits;
            assert_eq!(*(f.field)(&mut limits) as u64, v, "{}", f.name);
        }
        for bad in [f.bounds.min as i64 - 1, f.bounds.max as i64 + 1] {
            let err = refused(&format!("[limits]\n{} = {bad}\n", f.name));
            let ConfigError::OutOfRange { field, value, .. } = &err else {
                panic!("{err}")
            };
            assert_eq!(
                (field.as_str(), *value),
                (&*format!("limits.{}", f.name), bad)
            );
        }
    }
}

#[test]
fn an_unknown_limit_is_refused_with_the_known_ones() {
    let err = refused("[limits]\nconnections = 10\nsockets = 3\n").to_string();
    assert!(
        err.starts_with("c.toml:3:1: field `limits.sockets`: unknown limit: expected one of resources, connections"),
        "{err}"
    );
}

/// Naming every field of `Limits` (no `..`): a field added there stops
/// this from compiling until it has a row in `LIMIT_FIELDS`, a line in
/// `default.toml` and one in the docs.
#[test]
fn every_field_of_limits_is_configurable() {
    let uniplane_control::Limits {
        resources: _,
        connections: _,
        pending_per_peer: _,
        connections_per_peer: _,
        listening_per_resource: _,
        peers: _,
        shared_per_resource: _,
        shared_mib: _,
    } = uniplane_control::Limits::default();
    let names: Vec<&str> = limits::LIMIT_FIELDS.iter().map(|f| f.name).collect();
    assert_eq!(
        names,
        [
            "resources",
            "connections",
            "pending_per_peer",
            "connections_per_peer",
            "listening_per_resource",
            "peers",
            "shared_per_resource",
            "shared_mib"
        ]
    );
    for name in names {
        assert!(
            DEFAULT_CONFIG.contains(&format!("{name} = ")),
            "`{name}` is not in default.toml"
        );
    }
}

#[test]
fn a_reload_may_change_the_access_rules_and_nothing_else() {
    let base = "[server]\nid = \"10.0.0.1\"\n[policy]\ndefault = \"allow\"\n";
    let running = Config::parse(base, "a.toml").unwrap();
    let rules =
        format!("{base}[[policy.rules]]\nsrc = \"10.0.0.2:*\"\ndst = \"*\"\naction = \"deny\"\n");
    let new = Config::parse(&rules.replace("\"allow\"", "\"deny\""), "a.toml").unwrap();
    assert!(running.needs_restart_for(&new).is_empty());
    assert!(running.needs_restart_for(&running).is_empty());
    let moved = Config::parse(&base.replace("10.0.0.1", "10.0.0.9"), "a.toml").unwrap();
    assert_eq!(running.needs_restart_for(&moved), vec!["server.id"]);
    let both = format!("{rules}[[devices]]\nname = \"echo\"\nkind = \"echo\"\n")
        .replace("10.0.0.1\"\n[policy]", "10.0.0.9\"\n[policy]");
    let both = Config::parse(&both, "a.toml").unwrap();
    assert_eq!(
        running.needs_restart_for(&both),
        vec!["server.id", "devices"]
    );
}

#[test]
fn classes_and_a_peers_ingress_rules_are_read_and_checked() {
    let base = "[server]\nid = \"10.0.0.1\"\n[cluster]\nsecret = \"k\"\n";
    let peer = "[[peers]]\nserver = \"10.0.0.2\"\naddress = \"127.0.0.1:7460\"\n";
    // Nothing said: eight classes of weight 1, unshaped; a peer may use
    // them all and send anything of its own.
    let c = Config::parse(&format!("{base}{peer}"), "a.toml").unwrap();
    assert_eq!(c.underlay.classes.len(), MAX_CLASSES);
    assert_eq!(c.underlay.rate, None);
    let ingress = &c.peers[0].ingress;
    assert_eq!(ingress.classes, (0..8).collect::<Vec<u8>>());
    assert!(ingress.sources[0].matches("10.0.0.2:9".parse().unwrap()));
    assert!(!ingress.sources[0].matches("10.0.0.3:9".parse().unwrap()));

    let text = format!(
        "{base}[underlay]\nscheduling = \"priority\"\nrate_mbit = 80\n\
         [[classes]]\nid = 1\nweight = 3\npriority = 0\n[[classes]]\nid = 0\npriority = 1\n\
         {peer}classes = [1]\ntypes = [\"SEND\"]\nmax_message = 512\nsources = [\"10.0.0.0/24:*\"]\n"
    );
    let c = Config::parse(&text, "a.toml").unwrap();
    assert_eq!(c.underlay.scheduling, Scheduling::Priority);
    assert_eq!(c.underlay.rate, Some(10_000_000));
    let ids: Vec<_> = c
        .underlay
        .classes
        .iter()
        .map(|k| (k.id, k.weight, k.priority))
        .collect();
    assert_eq!(ids, [(0, 1, 1), (1, 3, 0)]);
    let ingress = &c.peers[0].ingress;
    assert_eq!(ingress.classes, [1]);
    assert_eq!(ingress.types, Some(vec![ReqType::Send]));
    assert_eq!(ingress.max_message, 512);
    assert!(ingress.sources[0].matches("10.0.0.3:9".parse().unwrap()));

    for (bad, want) in [
        (
            "[[classes]]\nid = 0\nweight = 0\n",
            "field `classes.weight`",
        ),
        ("[[classes]]\nid = 8\n", "field `classes.id`"),
        (
            "[[classes]]\nid = 0\n[[classes]]\nid = 0\n",
            "class 0 is defined twice",
        ),
        ("[[classes]]\nid = 1\n", "class 0 must be defined"),
        (
            "[underlay]\nscheduling = \"fifo\"\n",
            "expected \"weighted\" or \"priority\"",
        ),
        ("[underlay]\nburst_kib = 1\n", "field `underlay.burst_kib`"),
        (
            &format!("[[classes]]\nid = 0\n{peer}classes = [2]\n"),
            "class 2 is not defined in [[classes]]",
        ),
        (
            &format!("{peer}types = [\"SNED\"]\n"),
            "unknown request type `SNED`",
        ),
        (
            &format!("{peer}max_message = 10\n"),
            "field `peers.max_message`",
        ),
    ] {
        let err = Config::parse(&format!("{base}{bad}"), "a.toml")
            .expect_err(bad)
            .to_string();
        assert!(err.contains(want), "{bad}: {err}");
    }
}

#[test]
fn a_reload_may_change_how_the_classes_share_but_not_which_exist() {
    let base =
        "[server]\nid = \"10.0.0.1\"\n[[classes]]\nid = 0\n[[classes]]\nid = 1\nweight = 2\n";
    let running = Config::parse(base, "a.toml").unwrap();
    let heavier = Config::parse(&base.replace("weight = 2", "weight = 5"), "a.toml").unwrap();
    assert!(running.needs_restart_for(&heavier).is_empty());
    let shaped = Config::parse(&format!("{base}[underlay]\nrate_mbit = 100\n"), "a.toml").unwrap();
    assert!(running.needs_restart_for(&shaped).is_empty());
    let more = Config::parse(&format!("{base}[[classes]]\nid = 2\n"), "a.toml").unwrap();
    assert_eq!(
        running.needs_restart_for(&more),
        vec!["underlay (queue depth, which classes exist)"]
    );
}

#[test]
fn stacks_on_an_interface_take_their_options_and_need_what_they_need() {
    let base = "[server]\nid = \"10.0.0.1\"\n[cluster]\nsecret = \"k\"\n";
    let text = format!(
        "{base}[[stacks]]\nname = \"ether\"\ninterface = \"veth0\"\n\
         [[stacks]]\nname = \"smoltcp\"\ninterface = \"tap0\"\naddress = \"10.9.0.1/24\"\ntransport = \"udp\"\nlisten = \"10.9.0.1:7470\"\n\
         [[peers]]\nserver = \"10.0.0.2\"\naddress = \"127.0.0.1:7460\"\nstack = \"ether\"\nmac = \"02:00:00:00:00:02\"\n"
    );
    let c = Config::parse(&text, "a.toml").unwrap();
    let ether = &c.stacks[0];
    assert!(ether.on_ethernet());
    assert_eq!(ether.options.interface.as_deref(), Some("veth0"));
    assert!(ether.options.reliable, "tunnels over Ethernet run LTL");
    let smol = &c.stacks[1];
    assert_eq!(
        smol.options.address,
        Some(("10.9.0.1".parse().unwrap(), 24))
    );
    assert!(smol.options.datagrams);
    assert_eq!(c.peers[0].mac, Some([2, 0, 0, 0, 0, 2]));
    let udp = Config::parse(
        &format!("{base}[[stacks]]\nname = \"udp\"\nmtu = 8972\ngso = false\nio_uring = true\n"),
        "a.toml",
    )
    .unwrap();
    let o = &udp.stacks[0].options;
    assert_eq!((o.mtu, o.gso, o.io_uring), (Some(8972), Some(false), true));
    // A DPDK port: a net_af_packet vdev on the interface unless the EAL's
    // arguments are given (then the interface names the DPDK port).
    let dpdk = |extra: &str| {
        let c = Config::parse(
            &format!("{base}[[stacks]]\nname = \"dpdk\"\ninterface = \"veth0\"\n{extra}"),
            "a.toml",
        )
        .unwrap();
        uniplane_stacks::dpdk_port(&c.stacks[0].options)
    };
    let (port, args) = dpdk("");
    assert_eq!(port, "net_af_packet0");
    assert!(args.contains(&"--vdev=net_af_packet0,iface=veth0".to_string()));
    let (port, args) = dpdk("eal = [\"--vdev=net_pcap0,iface=veth0\"]\n");
    assert_eq!((port.as_str(), args.len()), ("veth0", 1));

    for (bad, want) in [
        ("[[stacks]]\nname = \"ether\"\n", "runs on an interface"),
        (
            "[[stacks]]\nname = \"ether\"\ninterface = \"e\"\nlisten = \"1.2.3.4:5\"\n",
            "listens on its interface",
        ),
        ("[[stacks]]\nname = \"smoltcp\"\ninterface = \"e\"\n", "needs its own address"),
        (
            "[[stacks]]\nname = \"smoltcp\"\ninterface = \"e\"\naddress = \"10.0.0.1\"\n",
            "with its prefix",
        ),
        (
            "[[stacks]]\nname = \"smoltcp\"\ninterface = \"e\"\naddress = \"10.0.0.1/8\"\ntransport = \"sctp\"\n",
            "expected \"tcp\" or \"udp\"",
        ),
        ("[[stacks]]\nname = \"tcp\"\ninterface = \"e\"\n", "takes no such option"),
        ("[[stacks]]\nname = \"tcp\"\nmtu = 1400\n", "takes no such option"),
        ("[[stacks]]\nname = \"ltl\"\ngso = false\n", "takes no such option"),
        ("[[stacks]]\nname = \"udp\"\nmtu = 100\n", "field `stacks.mtu`"),
        ("[[stacks]]\nname = \"udp\"\neal = [\"-l\", \"0\"]\n", "takes no such option"),
        ("[[stacks]]\nname = \"ether\"\ninterface = \"e\"\naddress = \"1.2.3.4/8\"\n", "takes no such option"),
        (
            "[[peers]]\nserver = \"10.0.0.2\"\naddress = \"127.0.0.1:7460\"\nstack = \"ether\"\n",
            "needs its MAC",
        ),
        (
            "[[peers]]\nserver = \"10.0.0.2\"\naddress = \"127.0.0.1:7460\"\nmac = \"02:00\"\n",
            "is not a MAC address",
        ),
    ] {
        let err = Config::parse(&format!("{base}{bad}"), "a.toml")
            .expect_err(bad)
            .to_string();
        assert!(err.contains(want), "{bad}: {err}");
    }
}

#[test]
fn remotes_are_reached_through_a_peer_whose_sources_grow_by_them() {
    let base = "[server]\nid = \"10.0.0.1\"\n[cluster]\nsecret = \"k\"\n\
                [[peers]]\nserver = \"10.0.0.2\"\naddress = \"127.0.0.1:7460\"\n";
    let c = Config::parse(
        &format!("{base}[[remotes]]\nserver = \"10.0.0.3\"\nvia = \"10.0.0.2\"\n"),
        "a.toml",
    )
    .unwrap();
    assert_eq!(
        c.remotes,
        [uniplane_control::RemoteSpec {
            server: "10.0.0.3".parse().unwrap(),
            via: "10.0.0.2".parse().unwrap()
        }]
    );
    let sources = &c.peers[0].ingress.sources;
    assert!(sources
        .iter()
        .any(|p| p.matches("10.0.0.3:7".parse().unwrap())));
    assert!(!sources
        .iter()
        .any(|p| p.matches("10.0.0.4:7".parse().unwrap())));
    // Sources the file gives are kept as they are.
    let given = Config::parse(
        &format!("{base}sources = [\"10.0.0.2:*\"]\n[[remotes]]\nserver = \"10.0.0.3\"\nvia = \"10.0.0.2\"\n"),
        "a.toml",
    )
    .unwrap();
    assert_eq!(given.peers[0].ingress.sources.len(), 1);
    for (bad, want) in [
        ("[[remotes]]\nserver = \"10.0.0.3\"\nvia = \"10.0.0.9\"\n", "is not a peer"),
        ("[[remotes]]\nserver = \"10.0.0.2\"\nvia = \"10.0.0.2\"\n", "reached directly"),
        ("[[remotes]]\nserver = \"10.0.0.1\"\nvia = \"10.0.0.2\"\n", "reached directly"),
        (
            "[[remotes]]\nserver = \"10.0.0.3\"\nvia = \"10.0.0.2\"\n[[remotes]]\nserver = \"10.0.0.3\"\nvia = \"10.0.0.2\"\n",
            "listed twice",
        ),
        ("[[remotes]]\nserver = \"ten\"\nvia = \"10.0.0.2\"\n", "not an IPv4 address"),
    ] {
        let err = Config::parse(&format!("{base}{bad}"), "a.toml")
            .expect_err(bad)
            .to_string();
        assert!(err.contains(want), "{bad}: {err}");
    }
}

#[test]
fn a_class_may_be_pinned_to_another_stack_of_a_peer() {
    let base = "[server]\nid = \"10.0.0.1\"\n[cluster]\nsecret = \"k\"\n\
                [[peers]]\nserver = \"10.0.0.2\"\naddress = \"127.0.0.1:7460\"\nstack = \"ltl\"\ntunnel = \"127.0.0.1:7472\"\n";
    let c = Config::parse(
        &format!("{base}[[peers.pin]]\nclass = 1\nstack = \"tcp\"\ntunnel = \"127.0.0.1:7470\"\n"),
        "a.toml",
    )
    .unwrap();
    let p = &c.peers[0];
    assert_eq!(
        p.tunnel_of(0),
        ("ltl", "127.0.0.1:7472".parse().unwrap(), None)
    );
    assert_eq!(
        p.tunnel_of(1),
        ("tcp", "127.0.0.1:7470".parse().unwrap(), None)
    );
    for (bad, want) in [
        ("[[peers.pin]]\nclass = 9\nstack = \"tcp\"\n", "field `peers.pin.class`"),
        (
            "[[peers.pin]]\nclass = 1\nstack = \"tcp\"\n[[peers.pin]]\nclass = 1\nstack = \"udp\"\n",
            "pinned twice",
        ),
        ("[[peers.pin]]\nclass = 1\nstack = \"pigeon\"\n", "unknown stack `pigeon`"),
        ("[[peers.pin]]\nclass = 1\nstack = \"ether\"\n", "needs the peer's MAC"),
    ] {
        let err = Config::parse(&format!("{base}{bad}"), "a.toml")
            .expect_err(bad)
            .to_string();
        assert!(err.contains(want), "{bad}: {err}");
    }
}

#[test]
fn engine_shards_and_cpus_parse_and_bad_ones_are_refused() {
    let c = Config::parse("[engine]\nshards = 4\ncpus = [0, 2, 4, 6]\n", "c.toml").unwrap();
    assert_eq!((c.shards, c.cpus.clone()), (4, vec![0, 2, 4, 6]));
    let d = Config::parse("", "c.toml").unwrap();
    assert_eq!((d.shards, d.cpus.len()), (1, 0));
    assert_eq!(c.needs_restart_for(&d), vec!["engine"]);
    assert_eq!(
        refused("[engine]\nshards = 0\n").to_string(),
        "c.toml:2:10: field `engine.shards`: 0 is out of range 1..=64"
    );
    assert_eq!(
        refused("[engine]\ncpus = [1, -1]\n").to_string(),
        "c.toml:2:12: field `engine.cpus`: -1 is out of range 0..=1023"
    );
}
const MEMORY_DEVICE: &str = "[[devices]]\nname = \"m\"\nkind = \"memory\"\nmemory = 4096\n";

#[test]
fn a_memory_device_is_in_host_memory_unless_the_file_says_gpu() {
    let c = Config::parse(MEMORY_DEVICE, "c.toml").unwrap();
    assert_eq!(c.devices[0].backend, MemoryBackend::Host);
    let c = Config::parse(&format!("{MEMORY_DEVICE}backend = \"host\"\n"), "c.toml").unwrap();
    assert_eq!(c.devices[0].backend, MemoryBackend::Host);
}

#[cfg(not(feature = "gpu"))]
#[test]
fn a_gpu_backend_is_refused_by_a_build_without_the_gpu_feature() {
    let err = refused(&format!("{MEMORY_DEVICE}backend = \"gpu\"\n"));
    assert_eq!(
        err.to_string(),
        "c.toml:5:11: field `devices.backend`: `gpu`: this daemon was built without the \
         gpu feature (build with `--features gpu`)"
    );
}

#[cfg(feature = "gpu")]
#[test]
fn a_gpu_backend_takes_its_ordinal_transfer_and_crossover() {
    let c = Config::parse(&format!("{MEMORY_DEVICE}backend = \"gpu\"\n"), "c.toml").unwrap();
    assert_eq!(
        c.devices[0].backend,
        MemoryBackend::Gpu(GpuMemoryConfig {
            ordinal: 0,
            transfer: Transfer::Auto,
            direct_from: DEFAULT_DIRECT_FROM,
        })
    );
    let text = format!(
        "{MEMORY_DEVICE}backend = \"gpu\"\ngpu = 3\ntransfer = \"auto\"\ndirect_from = 8192\n"
    );
    let c = Config::parse(&text, "c.toml").unwrap();
    assert_eq!(
        c.devices[0].backend,
        MemoryBackend::Gpu(GpuMemoryConfig {
            ordinal: 3,
            transfer: Transfer::Auto,
            direct_from: 8192,
        })
    );
    for (name, transfer) in [("staged", Transfer::Staged), ("direct", Transfer::Direct)] {
        let text = format!("{MEMORY_DEVICE}backend = \"gpu\"\ntransfer = \"{name}\"\n");
        let c = Config::parse(&text, "c.toml").unwrap();
        let MemoryBackend::Gpu(g) = c.devices[0].backend else {
            panic!("{:?}", c.devices[0].backend)
        };
        assert_eq!(g.transfer, transfer);
    }
}

#[cfg(feature = "gpu")]
#[test]
fn gpu_settings_out_of_range_or_unknown_are_refused_with_the_field() {
    let gpu = format!("{MEMORY_DEVICE}backend = \"gpu\"\n");
    let cases = [
        (
            format!("{gpu}gpu = 64\n"),
            "c.toml:6:7: field `devices.gpu`: 64 is out of range 0..=63",
        ),
        (
            format!("{gpu}gpu = -1\n"),
            "c.toml:6:7: field `devices.gpu`: -1 is out of range 0..=63",
        ),
        (
            format!("{gpu}transfer = \"dma\"\n"),
            "c.toml:6:12: field `devices.transfer`: `dma`: expected \"auto\", \"staged\" or \"direct\"",
        ),
        (
            format!("{gpu}direct_from = 2000000\n"),
            "c.toml:6:15: field `devices.direct_from`: 2000000 is out of range 0..=1048576 (1 MiB)",
        ),
        (
            format!("{gpu}transfer = \"staged\"\ndirect_from = 4096\n"),
            "c.toml:7:15: field `devices.direct_from`: only `transfer = \"auto\"` has a crossover",
        ),
        (
            "[[devices]]\nname = \"m\"\nkind = \"memory\"\nbackend = \"gpu\"\n".to_owned(),
            "c.toml:4:11: field `devices.backend`: a gpu memory device needs `memory` (bytes) above 0",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(refused(&text).to_string(), expected, "{text}");
    }
}

#[test]
fn a_backend_is_refused_where_it_means_nothing() {
    let cases = [
        (
            format!("{MEMORY_DEVICE}backend = \"disk\"\n"),
            "c.toml:5:11: field `devices.backend`: `disk`: expected \"host\" or \"gpu\"",
        ),
        (
            "[[devices]]\nname = \"e\"\nkind = \"echo\"\nbackend = \"host\"\n".to_owned(),
            "c.toml:4:11: field `devices.backend`: only a `kind = \"memory\"` or \
             `kind = \"kernel\"` device has a backend",
        ),
        (
            format!("{MEMORY_DEVICE}gpu = 1\n"),
            "c.toml:5:7: field `devices.gpu`: only a `backend = \"gpu\"` device takes it",
        ),
        (
            format!("{MEMORY_DEVICE}backend = \"host\"\ntransfer = \"staged\"\n"),
            "c.toml:6:12: field `devices.transfer`: only a `backend = \"gpu\"` device takes it",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(refused(&text).to_string(), expected, "{text}");
    }
}

#[test]
fn the_registry_is_local_unless_the_file_names_etcd() {
    assert_eq!(Config::embedded().unwrap().registry, RegistryConfig::Local);
    let text = "[registry]\nkind = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\", \"http://10.0.0.2:2379\"]\nlease_ttl_s = 10\n";
    let RegistryConfig::Etcd(e) = Config::parse(text, "c.toml").unwrap().registry else {
        panic!("not etcd")
    };
    assert_eq!(e.endpoints.len(), 2);
    assert_eq!(e.prefix, "/uniplane");
    assert_eq!(e.lease_ttl, std::time::Duration::from_secs(10));
    assert_eq!(e.timeout, std::time::Duration::from_millis(1000));
    assert_eq!(e.credentials, None);
    assert!(!e.discover, "no secret: peers are not discovered");
    let tls = "[registry]\nkind = \"etcd\"\nendpoints = [\"https://etcd.example:2379\"]\nca = \"/etc/uniplane/ca.pem\"\ncert = \"c.pem\"\nkey = \"k.pem\"\nuser = \"u\"\npassword_file = \"p\"\n";
    let RegistryConfig::Etcd(e) = Config::parse(tls, "c.toml").unwrap().registry else {
        panic!("not etcd")
    };
    assert!(e.ca.is_some() && e.identity.is_some() && e.credentials.is_some());
}

#[test]
fn a_bad_registry_is_refused_with_its_place() {
    let cases = [
        (
            "[registry]\nkind = \"zookeeper\"\n",
            "c.toml:2:8: field `registry.kind`: `zookeeper`: expected \"local\" or \"etcd\"",
        ),
        (
            "[registry]\nkind = \"etcd\"\n",
            "c.toml:2:8: field `registry.endpoints`: kind = \"etcd\" needs the members' client URLs",
        ),
        (
            "[registry]\nkind = \"etcd\"\nendpoints = [\"127.0.0.1:2379\"]\n",
            "c.toml:3:14: field `registry.endpoints`: `127.0.0.1:2379`: expected http://HOST:PORT or https://HOST:PORT",
        ),
        (
            "[registry]\nkind = \"etcd\"\nendpoints = [\"https://a:2379\"]\n",
            "c.toml:3:14: field `registry.endpoints`: an https:// endpoint needs `ca` (the CA of the members' certificates)",
        ),
        (
            "[registry]\nkind = \"etcd\"\nendpoints = [\"http://a:2379\"]\nca = \"ca.pem\"\n",
            "c.toml:3:14: field `registry.endpoints`: TLS settings (ca, cert, domain) need https:// endpoints",
        ),
        (
            "[registry]\nkind = \"etcd\"\nendpoints = [\"http://a:2379\"]\nuser = \"u\"\n",
            "c.toml:4:8: field `registry.user`: needs `password_file` beside it",
        ),
        (
            "[registry]\nkind = \"etcd\"\nendpoints = [\"http://a:2379\"]\nprefix = \"uniplane/\"\n",
            "c.toml:4:10: field `registry.prefix`: `uniplane/`: expected a path like /uniplane (no trailing /, at most 128 bytes)",
        ),
        (
            "[registry]\nendpoints = [\"http://a:2379\"]\n",
            "c.toml:2:13: field `registry.endpoints`: set only with kind = \"etcd\"",
        ),
    ];
    for (text, want) in cases {
        let err = Config::parse(text, "c.toml").unwrap_err().to_string();
        assert_eq!(err, want, "{text}");
    }
    let err = Config::parse(
        "[registry]\nkind = \"etcd\"\nendpoints = [\"http://a:2379\"]\ndiscover = true\n",
        "c.toml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("registry.discover"), "{err}");
    let err =
        refused("[registry]\nkind = \"etcd\"\nendpoints = [\"http://a:2379\"]\nlease_ttl_s = 0\n");
    assert!(err.to_string().contains("registry.lease_ttl_s"), "{err}");
}

#[test]
fn the_registry_changes_only_at_a_restart() {
    let a = Config::embedded().unwrap();
    let mut b = a.clone();
    b.registry = Config::parse(
        "[registry]\nkind = \"etcd\"\nendpoints = [\"http://a:2379\"]\n",
        "c.toml",
    )
    .unwrap()
    .registry;
    assert_eq!(a.needs_restart_for(&b), vec!["registry"]);
}

const KERNEL_DEVICE: &str = "[[devices]]\nname = \"k\"\nkind = \"kernel\"\nfunction = \"sum32\"\n";

#[test]
fn a_kernel_device_takes_its_function_and_the_defaults_of_its_path() {
    let c = Config::parse(KERNEL_DEVICE, "c.toml").unwrap();
    assert_eq!(c.devices[0].kind, DeviceKind::Kernel);
    assert_eq!(
        c.devices[0].kernel,
        Some(KernelDeviceConfig {
            function: KernelFunction::Sum32,
            pio_threshold: DEFAULT_PIO_THRESHOLD,
            tokens: DEFAULT_KERNEL_TOKENS,
            stall_timeout_ms: DEFAULT_STALL_TIMEOUT_MS,
            wait: KernelWait::Park,
            memory: 0,
            dma: DmaThresholds::default(),
        })
    );
    let text = format!(
        "{KERNEL_DEVICE}backend = \"emulated\"\npio_threshold = 0\ntokens = 256\n\
         stall_timeout_ms = 10\nwait = \"busy\"\n"
    );
    let k = Config::parse(&text, "c.toml").unwrap().devices[0]
        .kernel
        .unwrap();
    assert_eq!(
        (k.pio_threshold, k.tokens, k.stall_timeout_ms, k.wait),
        (0, 256, 10, KernelWait::Busy)
    );
    let text = format!(
        "{KERNEL_DEVICE}memory = 1048576
dma_pull_from = 0
dma_staged_from = 4096
         dma_pipelined_from = 65536
"
    );
    let k = Config::parse(&text, "c.toml").unwrap().devices[0]
        .kernel
        .unwrap();
    assert_eq!(k.memory, 1 << 20);
    assert_eq!(
        k.dma,
        DmaThresholds {
            pull_from: 0,
            staged_from: 4096,
            pipelined_from: 65_536
        }
    );
    assert_eq!(
        Config::parse(MEMORY_DEVICE, "c.toml").unwrap().devices[0].kernel,
        None
    );
}

#[test]
fn kernel_settings_out_of_range_unknown_or_misplaced_are_refused_with_the_field() {
    let cases = [
        (
            format!("{KERNEL_DEVICE}pio_threshold = 4097\n"),
            "c.toml:5:17: field `devices.pio_threshold`: 4097 is out of range 0..=4096",
        ),
        (
            format!("{KERNEL_DEVICE}tokens = 0\n"),
            "c.toml:5:10: field `devices.tokens`: 0 is out of range 1..=256",
        ),
        (
            format!("{KERNEL_DEVICE}stall_timeout_ms = 5\n"),
            "c.toml:5:20: field `devices.stall_timeout_ms`: 5 is out of range 10..=60000 (1 minute)",
        ),
        (
            format!("{KERNEL_DEVICE}wait = \"spin\"\n"),
            "c.toml:5:8: field `devices.wait`: `spin`: expected \"park\" or \"busy\"",
        ),
        (
            format!("{KERNEL_DEVICE}backend = \"fpga\"\n"),
            "c.toml:5:11: field `devices.backend`: `fpga`: a kernel device's backend is \
             \"emulated\" or \"rtl\"",
        ),
        (
            format!("{KERNEL_DEVICE}memory = -1\n"),
            "c.toml:5:10: field `devices.memory`: -1 is out of range 0..=1073741824 (1 GiB)",
        ),
        (
            format!("{KERNEL_DEVICE}dma_staged_from = 65537\n"),
            "c.toml:5:19: field `devices.dma_staged_from`: 65537 is out of range \
             0..=65536 (64 KiB: never)",
        ),
        (
            format!("{MEMORY_DEVICE}dma_pull_from = 0\n"),
            "c.toml:5:17: field `devices.dma_pull_from`: only a `kind = \"kernel\"` device takes it",
        ),
        (
            "[[devices]]\nname = \"k\"\nkind = \"kernel\"\nfunction = \"fft\"\n".to_owned(),
            "c.toml:4:12: field `devices.function`: `fft`: expected \"echo\", \"sum32\" or \
             \"sum32-memory\", or a library kernel: \"dense\", \"regex-stage\", \"pgas-target\" (or, for failure \
             tests, \
             \"stall\", \"panic\" or \"garbage\")",
        ),
        (
            "[[devices]]\nname = \"k\"\nkind = \"kernel\"\n".to_owned(),
            "c.toml:3:8: field `devices.function`: a kernel device needs `function` \
             (\"echo\" or \"sum32\")",
        ),
        (
            format!("{MEMORY_DEVICE}function = \"echo\"\n"),
            "c.toml:5:12: field `devices.function`: only a `kind = \"kernel\"` device takes it",
        ),
        (
            format!("{MEMORY_DEVICE}tokens = 4\n"),
            "c.toml:5:10: field `devices.tokens`: only a `kind = \"kernel\"` device takes it",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(refused(&text).to_string(), want, "{text}");
    }
}

#[cfg(not(feature = "rtl"))]
#[test]
fn an_rtl_kernel_in_a_build_without_the_rtl_feature_is_refused_with_how_to_get_it() {
    assert_eq!(
        refused(&format!("{KERNEL_DEVICE}backend = \"rtl\"\n")).to_string(),
        "c.toml:5:11: field `devices.backend`: `rtl`: this daemon was built without \
         the rtl feature (build with `--features rtl`)"
    );
}

#[cfg(feature = "rtl")]
#[test]
fn an_rtl_kernel_is_echo_or_sum32_and_takes_none_of_the_emulated_settings() {
    use super::KernelBackend;
    let text = format!("{KERNEL_DEVICE}backend = \"rtl\"\n");
    let c = Config::parse(&text, "c.toml").unwrap();
    assert_eq!(c.devices[0].kernel_backend, KernelBackend::Rtl);
    assert_eq!(
        c.devices[0].kernel.map(|k| k.function),
        Some(KernelFunction::Sum32)
    );
    let emulated = Config::parse(KERNEL_DEVICE, "c.toml").unwrap();
    assert_eq!(emulated.devices[0].kernel_backend, KernelBackend::Emulated);
    let cases = [
        (
            "[[devices]]\nname = \"k\"\nkind = \"kernel\"\nbackend = \"rtl\"\nfunction = \"stall\"\n"
                .to_owned(),
            "c.toml:5:12: field `devices.function`: `stall`: a `backend = \"rtl\"` kernel is \
             \"echo\" or \"sum32\" (the kernels the RTL has)",
        ),
        (
            format!("{text}tokens = 4\n"),
            "c.toml:6:10: field `devices.tokens`: a setting of the emulated path: \
             a `backend = \"rtl\"` kernel does not take it",
        ),
        (
            format!("{text}pio_threshold = 0\n"),
            "c.toml:6:17: field `devices.pio_threshold`: a setting of the emulated path: \
             a `backend = \"rtl\"` kernel does not take it",
        ),
        (
            format!("{text}wait = \"busy\"\n"),
            "c.toml:6:8: field `devices.wait`: a setting of the emulated path: \
             a `backend = \"rtl\"` kernel does not take it",
        ),
        (
            format!("{text}memory = 4096\n"),
            "c.toml:6:10: field `devices.memory`: a `backend = \"rtl\"` kernel has no memory \
             of its own to serve",
        ),
        (
            format!("{text}stall_timeout_ms = 100\n"),
            "c.toml:6:20: field `devices.stall_timeout_ms`: a setting of the emulated path: \
             a `backend = \"rtl\"` kernel does not take it",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(refused(&text).to_string(), want, "{text}");
    }
}

#[test]
fn a_kernel_device_takes_a_next_device_by_uid_and_a_class() {
    let c = Config::parse(
        &format!("{KERNEL_DEVICE}next = \"10.0.0.2:5\"\nnext_class = 3\n"),
        "c.toml",
    )
    .unwrap();
    assert_eq!(
        c.devices[0].next,
        Some(uniplane_control::NextHop {
            uid: "10.0.0.2:5".parse().unwrap(),
            class: 3
        })
    );
    assert!(c.devices[0].params.is_empty());
}

#[test]
fn chains_and_parameters_are_refused_where_they_mean_nothing() {
    let cases = [
        (
            format!("{MEMORY_DEVICE}next = \"10.0.0.2:5\"\n"),
            "c.toml:5:8: field `devices.next`: only a `kind = \"kernel\"` device takes it",
        ),
        (
            format!("{KERNEL_DEVICE}next = \"beta/k\"\n"),
            "c.toml:5:8: field `devices.next`: `beta/k`: expected the next device's UID, \
             SERVER:DEVICE (e.g. \"10.0.0.2:5\")",
        ),
        (
            format!("{KERNEL_DEVICE}next_class = 1\n"),
            "c.toml:5:14: field `devices.next_class`: it goes with `next`",
        ),
        (
            format!("{KERNEL_DEVICE}next = \"10.0.0.2:5\"\nnext_class = 8\n"),
            "c.toml:6:14: field `devices.next_class`: 8 is out of range 0..=7",
        ),
        (
            format!("{KERNEL_DEVICE}params = {{ seed = 7 }}\n"),
            "c.toml:5:10: field `devices.params`: only a library kernel takes parameters \
             (this device's kind or function takes none)",
        ),
        (
            format!("{MEMORY_DEVICE}params = {{ seed = 7 }}\n"),
            "c.toml:5:10: field `devices.params`: only a library kernel takes parameters \
             (this device's kind or function takes none)",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(refused(&text).to_string(), want, "{text}");
    }
}

#[test]
fn a_pgas_target_kernel_takes_its_segments_and_refuses_bad_ones_naming_the_device() {
    let device = |params: &str| {
        format!(
            "[[devices]]\nname = \"halo\"\nkind = \"kernel\"\nfunction = \"pgas-target\"\n{params}"
        )
    };
    let c = Config::parse(
        &device("params = { segments = 2, segment_bytes = 4096, acl = \"rw,0+2\" }\n"),
        "c.toml",
    )
    .unwrap();
    assert_eq!(c.devices[0].params["segments"], "2");
    assert_eq!(c.devices[0].params["acl"], "rw,0+2");
    let cases = [
        (
            device("params = { segments = 0 }\n"),
            "c.toml:5:10: field `devices.params`: device `halo`: kernel `pgas-target`: \
             parameter `segments` = 0: from 1 to 64",
        ),
        (
            device("params = { segments = 64, segment_bytes = 2097152 }\n"),
            "c.toml:5:10: field `devices.params`: device `halo`: kernel `pgas-target`: \
             64 segments of 2097152 bytes exceed the kernel's 67108864 bytes of memory",
        ),
        (
            device("params = { acl = \"anyone\" }\n"),
            "c.toml:5:10: field `devices.params`: device `halo`: kernel `pgas-target`: \
             parameter `acl`: `anyone`: expected `rw`, `ro` or ranks like `0+2`",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(refused(&text).to_string(), want, "{text}");
    }
}
