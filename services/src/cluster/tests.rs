//! The cluster file's checks, one behaviour each: every mistake is
//! refused at the cluster file's line with what is wrong, and a server's
//! part is the configuration its own file would give.

use super::*;
use crate::config::{ConfigError, MemoryBackend};

/// Two servers linked over TCP, a relay on alpha, a route from alpha to
/// beta through it.
const BASE: &str = r#"[cluster]
name = "test"
secret = "/tmp/test.key"

[[classes]]
id = 0
weight = 1

[[classes]]
id = 1
weight = 2

[policy]
default = "allow"

[[servers]]
id = "10.9.0.1"
name = "alpha"
peer_listen = "127.0.0.1:17460"

[[servers.stacks]]
name = "tcp"
listen = "127.0.0.1:17470"

[[servers.devices]]
name = "echo"
kind = "echo"
device = 1

[[servers.devices]]
name = "relay"
kind = "relay"
device = 2

[[servers]]
id = "10.9.0.2"
name = "beta"
peer_listen = "127.0.0.1:17461"

[[servers.stacks]]
name = "tcp"
listen = "127.0.0.1:17471"

[[servers.devices]]
name = "echo"
kind = "echo"
device = 1

[[links]]
a = "alpha"
b = "beta"
stack = "tcp"

[[routes]]
from = "alpha"
via = "alpha/relay"
to = "beta"
"#;

/// A third server, gamma, linked to beta only.
const GAMMA: &str = r#"
[[servers]]
id = "10.9.0.3"
name = "gamma"
peer_listen = "127.0.0.1:17462"

[[servers.stacks]]
name = "tcp"
listen = "127.0.0.1:17472"

[[links]]
a = "beta"
b = "gamma"
"#;

/// `BASE` with `from` replaced by `to` (which must occur).
fn base_with(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "{from}");
    BASE.replacen(from, to, 1)
}

/// The error `text` is refused with: (line, column, field, message).
fn refused(text: &str) -> (usize, usize, String, String) {
    match Cluster::parse(text, "c.toml") {
        Ok(_) => panic!("accepted"),
        Err(ConfigError::Invalid {
            file,
            line,
            column,
            field,
            message,
        }) => {
            assert_eq!(file, "c.toml");
            (line, column, field, message)
        }
        Err(ConfigError::OutOfRange {
            line,
            column,
            field,
            value,
            bounds,
            ..
        }) => (
            line,
            column,
            field,
            format!("{value} is out of range {bounds}"),
        ),
        Err(ConfigError::Conflict {
            line,
            column,
            field,
            message,
            other,
            ..
        }) => (
            line,
            column,
            field,
            format!("{message}; the other is {other}"),
        ),
        Err(e) => panic!("{e}"),
    }
}

/// The 1-based line of the `n`th (from 1) line of `text` holding `needle`.
fn line_of(text: &str, needle: &str, n: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(n - 1)
        .map(|(i, _)| i + 1)
        .unwrap_or_else(|| panic!("no {n}th `{needle}`"))
}

#[test]
fn the_base_cluster_is_accepted() {
    let c = Cluster::parse(BASE, "c.toml").unwrap();
    assert_eq!(c.name, "test");
    assert_eq!(c.servers.len(), 2);
}

#[test]
fn a_link_to_an_unknown_server_is_refused_at_its_name() {
    let text = base_with("b = \"beta\"", "b = \"delta\"");
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "b = \"delta\"", 1), 5));
    assert_eq!(field, "links.b");
    assert_eq!(
        message,
        "unknown server `delta`: expected the name or ID of one of [[servers]] (alpha, beta)"
    );
}

#[test]
fn a_route_to_an_unknown_server_is_refused() {
    let text = base_with("to = \"beta\"", "to = \"10.9.0.9\"");
    let (line, _, field, message) = refused(&text);
    assert_eq!(line, line_of(&text, "to = \"10.9.0.9\"", 1));
    assert_eq!(field, "routes.to");
    assert!(
        message.starts_with("unknown server `10.9.0.9`"),
        "{message}"
    );
}

#[test]
fn a_server_may_be_named_by_its_id() {
    let text = base_with("a = \"alpha\"", "a = \"10.9.0.1\"");
    assert!(Cluster::parse(&text, "c.toml").is_ok());
}

#[test]
fn a_duplicate_server_id_names_both_places() {
    let text = base_with("id = \"10.9.0.2\"", "id = \"10.9.0.1\"");
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "id = \"10.9.0.1\"", 2), 6));
    assert_eq!(field, "servers.id");
    assert_eq!(
        message,
        format!(
            "server ID 10.9.0.1 is used twice; the other is `servers.id` at c.toml:{}:6",
            line_of(&text, "id = \"10.9.0.1\"", 1)
        )
    );
}

#[test]
fn a_duplicate_device_number_on_one_server_names_both_places_in_the_cluster_file() {
    let text = base_with("device = 2", "device = 1");
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "device = 1", 2), 10));
    assert_eq!(field, "servers.devices.device");
    assert_eq!(
        message,
        format!(
            "device number 1 is used twice; the other is `servers.devices.device` at c.toml:{}:10",
            line_of(&text, "device = 1", 1)
        )
    );
}

#[test]
fn the_same_device_number_on_two_servers_is_no_clash() {
    // echo is device 1 on both alpha and beta in BASE.
    assert_eq!(BASE.matches("device = 1").count(), 2);
    assert!(Cluster::parse(BASE, "c.toml").is_ok());
}

#[test]
fn overlapping_listeners_on_one_server_are_refused_with_both_places() {
    let text = base_with(
        "listen = \"127.0.0.1:17470\"",
        "listen = \"127.0.0.1:17460\"",
    );
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "127.0.0.1:17460", 2), 10));
    assert_eq!(field, "servers.stacks.listen");
    assert_eq!(
        message,
        format!(
            "TCP listener on 127.0.0.1:17460 overlaps another; the other is \
             `servers.peer_listen` (127.0.0.1:17460) at c.toml:{}:15",
            line_of(&text, "127.0.0.1:17460", 1)
        )
    );
}

#[test]
fn two_servers_with_one_peer_address_are_refused() {
    let text = base_with(
        "peer_listen = \"127.0.0.1:17461\"",
        "peer_listen = \"127.0.0.1:17460\"",
    );
    let (line, _, field, message) = refused(&text);
    assert_eq!(line, line_of(&text, "127.0.0.1:17460", 2));
    assert_eq!(field, "servers.peer_listen");
    assert!(
        message.starts_with("two servers' peer channels at 127.0.0.1:17460"),
        "{message}"
    );
}

#[test]
fn a_link_over_a_stack_a_server_does_not_run_is_refused_at_the_stack() {
    let text = base_with("stack = \"tcp\"", "stack = \"udp\"");
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "stack = \"udp\"", 1), 9));
    assert_eq!(field, "links.stack");
    assert_eq!(
        message,
        "server `alpha` runs no `udp` stack (its [[servers.stacks]]: tcp)"
    );
}

#[test]
fn a_linked_stack_without_a_listener_is_refused() {
    let text = base_with("listen = \"127.0.0.1:17471\"\n", "");
    let (line, _, field, message) = refused(&text);
    assert_eq!(line, line_of(&text, "name = \"tcp\"", 2));
    assert_eq!(field, "servers.stacks.listen");
    assert!(message.contains("has no `listen` address"), "{message}");
}

#[test]
fn a_route_with_no_link_path_to_its_destination_is_refused() {
    // gamma exists but is linked to nobody.
    let gamma = GAMMA.replace("[[links]]\na = \"beta\"\nb = \"gamma\"\n", "");
    let text = base_with("to = \"beta\"", "to = \"gamma\"") + &gamma;
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "to = \"gamma\"", 1), 6));
    assert_eq!(field, "routes.to");
    assert_eq!(
        message,
        "server `gamma` is unreachable from `alpha`: no link path joins them"
    );
}

#[test]
fn a_server_beyond_a_link_is_reached_through_the_server_in_between() {
    let text = base_with("to = \"beta\"", "to = \"gamma\"") + GAMMA;
    let c = Cluster::parse(&text, "c.toml").unwrap();
    let id = |s: &str| s.parse::<std::net::Ipv4Addr>().unwrap();
    let alpha = c.config_for(id("10.9.0.1")).unwrap();
    assert_eq!(
        alpha.remotes,
        [uniplane_control::RemoteSpec {
            server: id("10.9.0.3"),
            via: id("10.9.0.2")
        }]
    );
    // Beta's tunnels carry gamma's sources to alpha.
    let from_beta = &alpha.peers[0].ingress.sources;
    assert!(from_beta
        .iter()
        .any(|p| p.matches("10.9.0.3:1".parse().unwrap())));
    let gamma = c.config_for(id("10.9.0.3")).unwrap();
    assert_eq!(gamma.remotes[0].server, id("10.9.0.1"));
    let beta = c.config_for(id("10.9.0.2")).unwrap();
    assert!(beta.remotes.is_empty(), "beta is linked to both");
    assert_eq!(alpha.routes[0].to, "10.9.0.3:*".parse().unwrap());
}

#[test]
fn a_route_through_another_servers_relay_is_refused() {
    let text = base_with("via = \"alpha/relay\"", "via = \"beta/echo\"");
    let (_, _, field, message) = refused(&text);
    assert_eq!(field, "routes.via");
    assert_eq!(
        message,
        "device `echo` of server `beta` is an `echo` device, not a relay"
    );
    let text = BASE.replace(
        "[[links]]",
        "[[servers.devices]]\nname = \"relay\"\nkind = \"relay\"\ndevice = 2\n\n[[links]]",
    );
    let text = text.replacen("via = \"alpha/relay\"", "via = \"beta/relay\"", 1);
    let (_, _, field, message) = refused(&text);
    assert_eq!(field, "routes.via");
    assert!(
        message.starts_with("the relay is on server `beta`, the route starts on `alpha`"),
        "{message}"
    );
}

#[test]
fn a_route_through_a_device_the_server_lacks_is_refused_at_the_device_name() {
    let text = base_with("via = \"alpha/relay\"", "via = \"alpha/hop\"");
    let (line, column, field, message) = refused(&text);
    // At `hop`, after `via = "alpha/`.
    assert_eq!((line, column), (line_of(&text, "alpha/hop", 1), 14));
    assert_eq!(field, "routes.via");
    assert_eq!(message, "server `alpha` has no device named `hop`");
}

#[test]
fn a_class_of_weight_0_is_refused_at_its_line() {
    let text = base_with("weight = 2", "weight = 0");
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "weight = 0", 1), 10));
    assert_eq!(field, "classes.weight");
    assert_eq!(message, "0 is out of range 1..=1000000");
}

#[test]
fn a_bad_ingress_rule_of_a_link_is_refused_at_its_element() {
    let text = base_with(
        "stack = \"tcp\"\n",
        "stack = \"tcp\"\n[links.b_accepts]\nclasses = [\n  0,\n  5,\n]\n",
    );
    let (line, column, field, message) = refused(&text);
    assert_eq!((line, column), (line_of(&text, "  5,", 1), 3));
    assert_eq!(field, "links.b_accepts.classes");
    assert_eq!(message, "class 5 is not defined in [[classes]]");
}

#[test]
fn a_link_to_itself_and_a_link_twice_are_refused() {
    let text = base_with("b = \"beta\"", "b = \"alpha\"");
    let (_, _, field, message) = refused(&text);
    assert_eq!(field, "links.b");
    assert_eq!(message, "a link from server `alpha` to itself");
    let text = base_with(
        "[[routes]]",
        "[[links]]\na = \"beta\"\nb = \"alpha\"\n\n[[routes]]",
    );
    let (line, _, field, message) = refused(&text);
    assert_eq!(line, line_of(&text, "b = \"alpha\"", 1));
    assert_eq!(field, "links.b");
    assert!(message.contains("are linked twice"), "{message}");
}

#[test]
fn a_wildcard_peer_address_is_refused() {
    let text = base_with("127.0.0.1:17461", "0.0.0.0:17461");
    let (_, _, field, message) = refused(&text);
    assert_eq!(field, "servers.peer_listen");
    assert!(message.contains("not 0.0.0.0"), "{message}");
}

#[test]
fn a_field_the_cluster_file_does_not_know_is_refused_with_its_place() {
    let text = base_with("name = \"alpha\"", "name = \"alpha\"\nplane = \"rtl\"");
    match Cluster::parse(&text, "c.toml") {
        Err(ConfigError::Syntax { line, message, .. }) => {
            assert_eq!(line, line_of(&text, "plane = ", 1));
            assert!(message.contains("unknown field `plane`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn links_make_each_end_the_others_peer_with_its_addresses() {
    let c = Cluster::parse(BASE, "c.toml").unwrap();
    let alpha = c.config_for("10.9.0.1".parse().unwrap()).unwrap();
    let beta = c.config_for("10.9.0.2".parse().unwrap()).unwrap();
    assert_eq!(alpha.peers.len(), 1);
    assert_eq!(alpha.peers[0].server, beta.server);
    assert_eq!(alpha.peers[0].address, beta.peer_listen);
    assert_eq!(alpha.peers[0].tunnel, beta.stacks[0].listen.unwrap());
    assert_eq!(alpha.peers[0].stack, "tcp");
    assert_eq!(beta.peers[0].server, alpha.server);
    assert_eq!(beta.peers[0].address, alpha.peer_listen);
    assert_eq!(beta.peers[0].tunnel, alpha.stacks[0].listen.unwrap());
    // The route is alpha's only.
    assert_eq!(alpha.routes.len(), 1);
    assert_eq!(alpha.routes[0].via, "relay");
    assert_eq!(alpha.routes[0].to, "10.9.0.2:*".parse().unwrap());
    assert!(beta.routes.is_empty());
}

#[test]
fn a_servers_part_is_what_its_own_file_would_give() {
    let c = Cluster::parse(BASE, "c.toml").unwrap();
    let own = Config::parse(
        r#"
[server]
id = "10.9.0.2"
name = "beta"
peer_listen = "127.0.0.1:17461"
[[stacks]]
name = "tcp"
listen = "127.0.0.1:17471"
[[devices]]
name = "echo"
kind = "echo"
device = 1
[[peers]]
server = "10.9.0.1"
address = "127.0.0.1:17460"
tunnel = "127.0.0.1:17470"
stack = "tcp"
[[classes]]
id = 0
weight = 1
[[classes]]
id = 1
weight = 2
[policy]
default = "allow"
[cluster]
secret = "/tmp/test.key"
"#,
        "beta.toml",
    )
    .unwrap();
    assert_eq!(c.config_for("10.9.0.2".parse().unwrap()).unwrap(), own);
}

/// `BASE` with a memory device on beta whose extra fields are `fields`.
fn with_memory_device(fields: &str) -> String {
    base_with(
        "[[links]]",
        &format!(
            "[[servers.devices]]\nname = \"mem\"\nkind = \"memory\"\ndevice = 3\n\
             memory = 4096\n{fields}\n[[links]]"
        ),
    )
}

#[test]
fn a_memory_devices_backend_reaches_its_servers_part() {
    let text = with_memory_device("backend = \"host\"");
    let c = Cluster::parse(&text, "c.toml").unwrap();
    let beta = c.config_for("10.9.0.2".parse().unwrap()).unwrap();
    let mem = beta.devices.iter().find(|d| d.name == "mem").unwrap();
    assert_eq!((mem.memory, mem.backend), (4096, MemoryBackend::Host));
}

#[test]
fn a_gpu_field_of_a_host_memory_device_is_refused_at_its_line_in_the_cluster_file() {
    // Only passed through fields can be refused by the server's own check.
    for (field, value) in [
        ("gpu", "0"),
        ("transfer", "\"staged\""),
        ("direct_from", "4096"),
    ] {
        let text = with_memory_device(&format!("backend = \"host\"\n{field} = {value}"));
        let (line, column, name, _) = refused(&text);
        assert_eq!(
            (line, column, name),
            (
                line_of(&text, &format!("{field} = "), 1),
                field.len() + 4,
                format!("servers.devices.{field}")
            )
        );
    }
}

#[cfg(feature = "gpu")]
#[test]
fn a_gpu_memory_devices_settings_reach_its_servers_part() {
    use crate::config::{GpuMemoryConfig, Transfer};
    let text =
        with_memory_device("backend = \"gpu\"\ngpu = 1\ntransfer = \"auto\"\ndirect_from = 8192");
    let c = Cluster::parse(&text, "c.toml").unwrap();
    let beta = c.config_for("10.9.0.2".parse().unwrap()).unwrap();
    let mem = beta.devices.iter().find(|d| d.name == "mem").unwrap();
    assert_eq!(
        mem.backend,
        MemoryBackend::Gpu(GpuMemoryConfig {
            ordinal: 1,
            transfer: Transfer::Auto,
            direct_from: 8192,
        })
    );
}

#[test]
fn config_for_a_server_not_in_the_cluster_names_those_that_are() {
    let c = Cluster::parse(BASE, "c.toml").unwrap();
    let e = c.config_for("10.9.0.7".parse().unwrap()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "server 10.9.0.7 is not in cluster `test` (its servers: alpha (10.9.0.1), beta (10.9.0.2))"
    );
}

#[test]
fn a_line_inside_a_multi_line_array_is_never_taken_for_a_table() {
    let text = "[[servers]]\nx = [\n[1],\n]\n[policy]\ndefault = \"allow\"\ns = \"\"\"\n[servers]\n\"\"\"\n";
    let kept = part::shared_lines(text);
    assert_eq!(
        kept,
        "\n\n\n\n[policy]\ndefault = \"allow\"\ns = \"\"\"\n[servers]\n\"\"\"\n"
    );
}

#[test]
fn a_shared_key_before_the_first_table_is_kept_and_the_others_are_not() {
    let text = "policy.default = \"deny\"\nlinks = []\n[[servers]]\n";
    assert_eq!(part::shared_lines(text), "policy.default = \"deny\"\n\n\n");
    let text = format!(
        "policy.default = \"deny\"\n{}",
        BASE.replace("[policy]\ndefault = \"allow\"\n", "")
    );
    let c = Cluster::parse(&text, "c.toml").unwrap();
    assert_eq!(
        c.servers[0].config.default_action,
        crate::config::DefaultAction::Deny
    );
}

/// Each example server's part parses and agrees with the cluster: its
/// peers are the servers it is linked to, at their addresses; the secret
/// and the classes are the cluster's.
fn example_agrees(name: &str, text: &str) {
    let c = Cluster::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
    let first = &c.servers[0].config;
    for s in &c.servers {
        let config = c.config_for(s.config.server).unwrap();
        assert_eq!(config.secret, first.secret, "{}", s.name);
        assert!(config.secret.is_some());
        assert_eq!(config.underlay, first.underlay, "{}", s.name);
        let linked: Vec<Ipv4Addr> = c
            .links
            .iter()
            .filter_map(|l| match (l.a == config.server, l.b == config.server) {
                (true, _) => Some(l.b),
                (_, true) => Some(l.a),
                _ => None,
            })
            .collect();
        let peers: Vec<Ipv4Addr> = config.peers.iter().map(|p| p.server).collect();
        assert_eq!(peers, linked, "{}", s.name);
        for p in &config.peers {
            let other = c.server(p.server).unwrap();
            assert_eq!(p.address, other.config.peer_listen);
            let stack = other
                .config
                .stacks
                .iter()
                .find(|st| st.name == p.stack)
                .unwrap();
            if stack.on_ethernet() {
                // Tunnels over Ethernet go to the MAC the other names.
                assert!(p.mac.is_some(), "{}", s.name);
            } else {
                assert_eq!(Some(p.tunnel), stack.listen);
            }
        }
    }
}

#[test]
fn the_two_server_example_agrees_with_itself() {
    example_agrees(
        "two-servers.toml",
        include_str!("../../../examples/cluster/two-servers.toml"),
    );
}

#[test]
fn the_three_server_example_agrees_with_itself() {
    let text = include_str!("../../../examples/cluster/three-servers.toml");
    example_agrees("three-servers.toml", text);
    let c = Cluster::parse(text, "three-servers.toml").unwrap();
    // alpha and gamma are not each other's peers; beta routes to gamma
    // through its relay.
    let alpha = c.config_for("10.77.0.1".parse().unwrap()).unwrap();
    assert!(alpha
        .peers
        .iter()
        .all(|p| p.server != "10.77.0.3".parse::<Ipv4Addr>().unwrap()));
    let beta = c.config_for("10.77.0.2".parse().unwrap()).unwrap();
    assert_eq!(beta.routes.len(), 1);
    assert_eq!(beta.routes[0].to, "10.77.0.3:*".parse().unwrap());
}

#[test]
fn a_link_over_ethernet_gives_each_end_the_others_mac_and_its_interface() {
    let text = BASE
        .replace(
            "name = \"tcp\"\nlisten = \"127.0.0.1:17470\"",
            "name = \"tcp\"\nlisten = \"127.0.0.1:17470\"\n\n[[servers.stacks]]\nname = \"ether\"\ninterface = \"veth-a\"\nmac = \"02:00:00:00:00:01\"",
        )
        .replace(
            "name = \"tcp\"\nlisten = \"127.0.0.1:17471\"",
            "name = \"tcp\"\nlisten = \"127.0.0.1:17471\"\n\n[[servers.stacks]]\nname = \"ether\"\ninterface = \"veth-b\"\nmac = \"02:00:00:00:00:02\"",
        )
        .replace(
            "b = \"beta\"\nstack = \"tcp\"",
            "b = \"beta\"\nstack = \"ether\"",
        );
    let c = Cluster::parse(&text, "c.toml").unwrap();
    let alpha = c.config_for("10.9.0.1".parse().unwrap()).unwrap();
    assert_eq!(alpha.peers[0].stack, "ether");
    assert_eq!(alpha.peers[0].mac, Some([2, 0, 0, 0, 0, 2]));
    let ether = alpha.stacks.iter().find(|s| s.name == "ether").unwrap();
    assert_eq!(ether.options.interface.as_deref(), Some("veth-a"));
    // Without its MAC, beta's ether stack cannot carry the link.
    let err = Cluster::parse(&text.replace("mac = \"02:00:00:00:00:02\"\n", ""), "c.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("give its MAC"), "{err}");
}

#[test]
fn a_class_of_a_link_pinned_to_another_stack_takes_it_at_both_ends() {
    let ltl = |port: u16| {
        format!("\n\n[[servers.stacks]]\nname = \"ltl\"\nlisten = \"127.0.0.1:{port}\"")
    };
    let text = BASE
        .replace(
            "name = \"tcp\"\nlisten = \"127.0.0.1:17470\"",
            &format!("name = \"tcp\"\nlisten = \"127.0.0.1:17470\"{}", ltl(17480)),
        )
        .replace(
            "name = \"tcp\"\nlisten = \"127.0.0.1:17471\"",
            &format!("name = \"tcp\"\nlisten = \"127.0.0.1:17471\"{}", ltl(17481)),
        )
        .replace(
            "b = \"beta\"\nstack = \"tcp\"",
            "b = \"beta\"\nstack = \"tcp\"\n\n[[links.pin]]\nclass = 1\nstack = \"ltl\"",
        );
    let c = Cluster::parse(&text, "c.toml").unwrap();
    let alpha = c.config_for("10.9.0.1".parse().unwrap()).unwrap();
    let beta = c.config_for("10.9.0.2".parse().unwrap()).unwrap();
    assert_eq!(
        alpha.peers[0].tunnel_of(1),
        ("ltl", "127.0.0.1:17481".parse().unwrap(), None)
    );
    assert_eq!(
        beta.peers[0].tunnel_of(1),
        ("ltl", "127.0.0.1:17480".parse().unwrap(), None)
    );
    assert_eq!(alpha.peers[0].tunnel_of(0).0, "tcp");
    // A pinned stack one end does not run is refused at the pin.
    let one_sided = text.replacen(&ltl(17481), "", 1);
    let (line, _, field, message) = refused(&one_sided);
    assert_eq!(line, line_of(&one_sided, "stack = \"ltl\"", 1));
    assert_eq!(field, "links.stack");
    assert!(message.contains("runs no `ltl` stack"), "{message}");
}

/// `BASE` with a kernel on alpha chained to a kernel `k` on beta
/// (`beta_device`: its `device = …` line, or none).
fn with_chain(next: &str, beta_device: &str) -> String {
    base_with(
        "[[links]]",
        &format!(
            "[[servers.devices]]\nname = \"k\"\nkind = \"kernel\"\nfunction = \"sum32\"\n\
             {beta_device}\n[[links]]"
        ),
    )
    .replacen(
        "name = \"relay\"\nkind = \"relay\"\ndevice = 2\n",
        &format!(
            "name = \"relay\"\nkind = \"relay\"\ndevice = 2\n\n[[servers.devices]]\n\
             name = \"first\"\nkind = \"kernel\"\nfunction = \"echo\"\ndevice = 4\n\
             next = \"{next}\"\nnext_class = 1\n"
        ),
        1,
    )
}

#[test]
fn a_chains_next_device_named_server_slash_device_becomes_its_uid() {
    for next in ["beta/k", "10.9.0.2/k", "10.9.0.2:3"] {
        let c = Cluster::parse(&with_chain(next, "device = 3"), "c.toml").unwrap();
        let alpha = c.config_for("10.9.0.1".parse().unwrap()).unwrap();
        let first = alpha.devices.iter().find(|d| d.name == "first").unwrap();
        assert_eq!(
            first.next,
            Some(uniplane_control::NextHop {
                uid: "10.9.0.2:3".parse().unwrap(),
                class: 1
            }),
            "{next}"
        );
        let beta = c.config_for("10.9.0.2".parse().unwrap()).unwrap();
        let k = beta.devices.iter().find(|d| d.name == "k").unwrap();
        assert_eq!(k.kernel.map(|k| k.function.name()), Some("sum32"));
    }
}

#[test]
fn a_chain_to_a_device_without_a_number_or_of_no_server_is_refused_at_its_line() {
    let text = with_chain("beta/k", "");
    let (line, _, field, message) = refused(&text);
    assert_eq!(line, line_of(&text, "next = ", 1));
    assert_eq!(field, "servers.devices.next");
    assert!(message.contains("has no fixed number"), "{message}");
    let text = with_chain("gamma/k", "device = 3");
    let (line, _, field, message) = refused(&text);
    assert_eq!(
        (line, field.as_str()),
        (line_of(&text, "next = ", 1), "servers.devices.next")
    );
    assert!(message.contains("gamma"), "{message}");
}
