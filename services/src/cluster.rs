//! One cluster description file for every server of a cluster: which
//! servers exist (their IDs, peer addresses, stacks and devices), which
//! of them peer over which stack (`[[links]]`), the multi-hop routes,
//! and what they share — the traffic classes, the access policy, failure
//! detection and limits. Every daemon reads the same file and runs its
//! own part (`uniplaned --cluster FILE [--server-id IP]`);
//! `uniplane cluster check FILE` validates it and prints the resolved
//! view.
//!
//! ```toml
//! [cluster]
//! name = "lab"
//! secret = "/etc/uniplane/cluster.key"
//!
//! [[classes]]            # shared: [underlay], [[classes]], [policy],
//! id = 0                 # [failure], [limits], as in a server's file
//! weight = 1
//!
//! [[servers]]
//! id = "10.0.0.1"
//! name = "alpha"
//! peer_listen = "10.0.0.1:7460"
//! [[servers.stacks]]
//! name = "tcp"
//! listen = "10.0.0.1:7470"
//! [[servers.devices]]
//! name = "echo"
//! kind = "echo"
//! device = 1
//!
//! [[servers]]
//! id = "10.0.0.2"
//! # …
//!
//! [[links]]              # alpha and beta peer over their tcp stacks
//! a = "alpha"
//! b = "beta"
//! stack = "tcp"
//! [links.b_accepts]      # what beta takes from alpha (a peer's ingress rules)
//! classes = [0]
//! ```
//!
//! How a server's part is made: its [`Config`] is the one a per-server
//! file would give, produced by writing that file and reading it with
//! [`Config::parse`], so every check of a server's file applies to each
//! server of the cluster. The written text keeps the cluster file's
//! shared tables on their own lines (every other line blanked) and adds
//! the server's own tables after them, one value per line, each line
//! remembering where in the cluster file its value came from; an error
//! in a server's part is reported at the cluster file's line and column
//! (see [`part`]). What only the cluster can know — unknown servers,
//! duplicate IDs, a link over a stack a server does not run, a route
//! with no link to its destination — is checked here first.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::Path;

use serde::de::IgnoredAny;
use serde::Deserialize;
use toml::Spanned;

use crate::config::{Config, ConfigError};

mod part;
mod view;

/// A validated cluster: every server's part, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Its name (`[cluster] name`).
    pub name: String,
    /// The servers, in the file's order.
    pub servers: Vec<ClusterServer>,
    /// Which servers peer, over which stack.
    pub links: Vec<ClusterLink>,
}

/// One server of a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterServer {
    /// Its name (`servers.name`).
    pub name: String,
    /// The configuration its daemon runs (its ID is `config.server`).
    pub config: Config,
}

/// Two servers that are each other's peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterLink {
    /// One end.
    pub a: Ipv4Addr,
    /// The other end.
    pub b: Ipv4Addr,
    /// The stack their tunnels use.
    pub stack: String,
}

/// A server ID that is not one of the cluster's servers.
#[derive(Debug, thiserror::Error)]
#[error("server {server} is not in cluster `{cluster}` (its servers: {known})")]
pub struct NotInCluster {
    /// The ID asked for.
    pub server: Ipv4Addr,
    /// The cluster's name.
    pub cluster: String,
    /// The cluster's servers, `name (id)`, comma-separated.
    pub known: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    #[serde(default)]
    cluster: RawClusterTable,
    #[serde(default)]
    servers: Vec<RawServer>,
    #[serde(default)]
    links: Vec<RawLink>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    // Shared by every server and read by `Config::parse` in each
    // server's part, where they keep their place in the file: here only
    // known, so that `deny_unknown_fields` lets them be.
    #[allow(dead_code)]
    underlay: Option<IgnoredAny>,
    #[allow(dead_code)]
    classes: Option<IgnoredAny>,
    #[allow(dead_code)]
    policy: Option<IgnoredAny>,
    #[allow(dead_code)]
    failure: Option<IgnoredAny>,
    #[allow(dead_code)]
    limits: Option<IgnoredAny>,
}

/// The tables a server's part takes from the cluster file as they are.
const SHARED_TABLES: &[&str] = &["underlay", "classes", "policy", "failure", "limits"];

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawClusterTable {
    name: Option<String>,
    secret: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    id: Spanned<String>,
    name: Spanned<String>,
    peer_listen: Spanned<String>,
    #[serde(default)]
    stacks: Vec<RawStack>,
    #[serde(default)]
    devices: Vec<RawDevice>,
    runtime: Option<RawRuntime>,
    engine: Option<RawEngine>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStack {
    name: Spanned<String>,
    listen: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    address: Option<Spanned<String>>,
    transport: Option<Spanned<String>>,
    /// This server's MAC on the interface of an `ether`/`dpdk` stack:
    /// where its linked peers' tunnels go.
    mac: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    name: Spanned<String>,
    kind: Spanned<String>,
    device: Option<Spanned<i64>>,
    memory: Option<Spanned<i64>>,
    backend: Option<Spanned<String>>,
    gpu: Option<Spanned<i64>>,
    transfer: Option<Spanned<String>>,
    direct_from: Option<Spanned<i64>>,
    function: Option<Spanned<String>>,
    pio_threshold: Option<Spanned<i64>>,
    tokens: Option<Spanned<i64>>,
    stall_timeout_ms: Option<Spanned<i64>>,
    wait: Option<Spanned<String>>,
    dma_pull_from: Option<Spanned<i64>>,
    dma_staged_from: Option<Spanned<i64>>,
    dma_pipelined_from: Option<Spanned<i64>>,
    params: Option<Spanned<std::collections::BTreeMap<String, toml::Value>>>,
    next: Option<Spanned<String>>,
    next_class: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    dir: Option<Spanned<String>>,
    metrics: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    max_ports: Option<Spanned<i64>>,
    ring_depth: Option<Spanned<i64>>,
    voq_depth: Option<Spanned<i64>>,
    table_capacity: Option<Spanned<i64>>,
    mode: Option<Spanned<String>>,
    shards: Option<Spanned<i64>>,
    cpus: Option<Vec<Spanned<i64>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    a: Spanned<String>,
    b: Spanned<String>,
    stack: Option<Spanned<String>>,
    /// What `a` takes from `b`.
    a_accepts: Option<RawIngress>,
    /// What `b` takes from `a`.
    b_accepts: Option<RawIngress>,
    /// Classes whose tunnels take another stack, both ways.
    #[serde(default)]
    pin: Vec<RawPin>,
}

/// A class of a link pinned to a stack both its ends run.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    class: Spanned<i64>,
    stack: Spanned<String>,
}

/// A peer's ingress rules, as `[[peers]]` of a server's file has them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIngress {
    classes: Option<Vec<Spanned<i64>>>,
    types: Option<Vec<Spanned<String>>>,
    max_message: Option<Spanned<i64>>,
    sources: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    from: Spanned<String>,
    via: Spanned<String>,
    to: Spanned<String>,
}

/// The cluster file's text and name, for errors.
struct Text<'a>(crate::config::Source<'a>);

impl<'a> std::ops::Deref for Text<'a> {
    type Target = crate::config::Source<'a>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Text<'_> {
    fn conflict<T>(
        &self,
        span: Range<usize>,
        field: &str,
        message: impl Into<String>,
        first: (&str, &Range<usize>),
    ) -> Result<T, ConfigError> {
        let other = format!("`{}` at {}", first.0, self.place(first.1.clone()));
        self.0.conflict(span, field, message.into(), other)
    }
}

/// A server as the cluster-wide checks see it.
struct Known<'r> {
    raw: &'r RawServer,
    id: Ipv4Addr,
    peer_listen: SocketAddr,
}

impl Known<'_> {
    fn name(&self) -> &str {
        self.raw.name.get_ref()
    }

    /// Its stack `name`, if it runs that stack.
    fn stack(&self, name: &str) -> Option<&RawStack> {
        self.raw.stacks.iter().find(|s| s.name.get_ref() == name)
    }
}

/// A link with both ends found.
struct Resolved<'r> {
    raw: &'r RawLink,
    a: usize,
    b: usize,
    stack: String,
}

/// A route with its servers found.
struct ResolvedRoute<'r> {
    raw: &'r RawRoute,
    /// The source server.
    server: usize,
    /// The source device's name, or `*`.
    from: String,
    /// The relay device's name (on the source server).
    via: String,
    /// The destination server.
    to: usize,
}

impl Cluster {
    /// Reads and validates the cluster file at `path`.
    pub fn load(path: &Path) -> Result<Cluster, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: file.clone(),
            source,
        })?;
        Cluster::parse(&text, &file)
    }

    /// Validates cluster text, every server's part included; `file`
    /// names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Cluster, ConfigError> {
        let src = Text(crate::config::Source { file, text });
        let raw: RawCluster = src.toml()?;
        let known = servers(&src, &raw.servers)?;
        let links = links(&src, &raw.links, &known)?;
        let routes = routes(&src, &raw.routes, &known, &links)?;
        let mut servers = Vec::new();
        for (i, server) in known.iter().enumerate() {
            let config = part::config(&src, &raw, &known, &links, &routes, i)?;
            servers.push(ClusterServer {
                name: server.name().to_owned(),
                config,
            });
        }
        Ok(Cluster {
            name: raw
                .cluster
                .name
                .clone()
                .unwrap_or_else(|| "uniplane".to_owned()),
            links: links
                .iter()
                .map(|l| ClusterLink {
                    a: known[l.a].id,
                    b: known[l.b].id,
                    stack: l.stack.clone(),
                })
                .collect(),
            servers,
        })
    }

    /// The server with ID `id`.
    pub fn server(&self, id: Ipv4Addr) -> Option<&ClusterServer> {
        self.servers.iter().find(|s| s.config.server == id)
    }

    /// The configuration the daemon of server `server` runs.
    pub fn config_for(&self, server: Ipv4Addr) -> Result<Config, NotInCluster> {
        self.server(server)
            .map(|s| s.config.clone())
            .ok_or_else(|| NotInCluster {
                server,
                cluster: self.name.clone(),
                known: self
                    .servers
                    .iter()
                    .map(|s| format!("{} ({})", s.name, s.config.server))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The first server whose ID is an address of this host: one a
    /// socket can bind to.
    pub fn server_here(&self) -> Option<Ipv4Addr> {
        self.servers
            .iter()
            .map(|s| s.config.server)
            .find(|id| std::net::UdpSocket::bind((*id, 0)).is_ok())
    }
}

fn servers<'r>(src: &Text<'_>, raw: &'r [RawServer]) -> Result<Vec<Known<'r>>, ConfigError> {
    let mut known: Vec<Known<'r>> = Vec::new();
    for s in raw {
        let Ok(id) = s.id.get_ref().parse::<Ipv4Addr>() else {
            return src.invalid(
                s.id.span(),
                "servers.id",
                format!("`{}` is not an IPv4 address", s.id.get_ref()),
            );
        };
        let Ok(peer_listen) = s.peer_listen.get_ref().parse::<SocketAddr>() else {
            return src.invalid(
                s.peer_listen.span(),
                "servers.peer_listen",
                format!(
                    "`{}` is not an address such as 10.0.0.1:7460",
                    s.peer_listen.get_ref()
                ),
            );
        };
        if peer_listen.ip().is_unspecified() || peer_listen.port() == 0 {
            return src.invalid(
                s.peer_listen.span(),
                "servers.peer_listen",
                format!(
                    "{peer_listen}: the other servers connect here, so it needs an address \
                     and a port they can reach (not 0.0.0.0, not port 0)"
                ),
            );
        }
        if let Some(first) = known.iter().find(|k| k.id == id) {
            return src.conflict(
                s.id.span(),
                "servers.id",
                format!("server ID {id} is used twice"),
                ("servers.id", &first.raw.id.span()),
            );
        }
        if let Some(first) = known.iter().find(|k| k.name() == s.name.get_ref()) {
            return src.conflict(
                s.name.span(),
                "servers.name",
                format!("server name `{}` is used twice", s.name.get_ref()),
                ("servers.name", &first.raw.name.span()),
            );
        }
        if let Some(first) = known.iter().find(|k| k.peer_listen == peer_listen) {
            return src.conflict(
                s.peer_listen.span(),
                "servers.peer_listen",
                format!("two servers' peer channels at {peer_listen}"),
                ("servers.peer_listen", &first.raw.peer_listen.span()),
            );
        }
        known.push(Known {
            raw: s,
            id,
            peer_listen,
        });
    }
    Ok(known)
}

/// The server `name` names (its name or its ID).
fn find(
    src: &Text<'_>,
    known: &[Known<'_>],
    name: &Spanned<String>,
    field: &str,
) -> Result<usize, ConfigError> {
    let n = name.get_ref();
    match known
        .iter()
        .position(|k| k.name() == n || k.raw.id.get_ref() == n)
    {
        Some(i) => Ok(i),
        None => src.invalid(
            name.span(),
            field,
            format!(
                "unknown server `{n}`: expected the name or ID of one of [[servers]] ({})",
                list(known)
            ),
        ),
    }
}

fn list(known: &[Known<'_>]) -> String {
    if known.is_empty() {
        return "there are none".to_owned();
    }
    known
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn links<'r>(
    src: &Text<'_>,
    raw: &'r [RawLink],
    known: &[Known<'_>],
) -> Result<Vec<Resolved<'r>>, ConfigError> {
    let mut links: Vec<Resolved<'r>> = Vec::new();
    for l in raw {
        let a = find(src, known, &l.a, "links.a")?;
        let b = find(src, known, &l.b, "links.b")?;
        if a == b {
            return src.invalid(
                l.b.span(),
                "links.b",
                format!("a link from server `{}` to itself", known[a].name()),
            );
        }
        if let Some(first) = links
            .iter()
            .find(|f| (f.a, f.b) == (a, b) || (f.a, f.b) == (b, a))
        {
            return src.conflict(
                l.b.span(),
                "links.b",
                format!(
                    "servers `{}` and `{}` are linked twice (one link makes each the other's peer)",
                    known[a].name(),
                    known[b].name()
                ),
                ("links.b", &first.raw.b.span()),
            );
        }
        let stack = l
            .stack
            .as_ref()
            .map_or_else(|| "tcp".to_owned(), |s| s.get_ref().clone());
        // The link's stack, and each stack a class of it is pinned to:
        // both ends run it, where the other can reach it.
        let at = l.stack.as_ref().map_or(l.a.span(), |s| s.span());
        let pinned = l
            .pin
            .iter()
            .map(|p| (p.stack.get_ref().clone(), p.stack.span()));
        for (stack, at) in std::iter::once((stack.clone(), at)).chain(pinned) {
            for end in [a, b] {
                let server = &known[end];
                let Some(s) = server.stack(&stack) else {
                    let runs: Vec<&str> = server
                        .raw
                        .stacks
                        .iter()
                        .map(|s| s.name.get_ref().as_str())
                        .collect();
                    return src.invalid(
                        at,
                        "links.stack",
                        format!(
                            "server `{}` runs no `{stack}` stack (its [[servers.stacks]]: {})",
                            server.name(),
                            if runs.is_empty() {
                                "none".to_owned()
                            } else {
                                runs.join(", ")
                            }
                        ),
                    );
                };
                if matches!(stack.as_str(), "ether" | "dpdk") {
                    if s.mac.is_none() {
                        return src.invalid(
                            s.name.span(),
                            "servers.stacks.mac",
                            format!(
                                "server `{}`'s `{stack}` stack carries a link: give its MAC on \
                                 the interface (mac = \"02:…\") for its peer's tunnels",
                                server.name()
                            ),
                        );
                    }
                    continue;
                }
                let Some(listen) = &s.listen else {
                    return src.invalid(
                        s.name.span(),
                        "servers.stacks.listen",
                        format!(
                            "server `{}`'s `{stack}` stack carries a link but has no `listen` \
                             address for its peer's tunnels",
                            server.name()
                        ),
                    );
                };
                if let Ok(addr) = listen.get_ref().parse::<SocketAddr>() {
                    if addr.ip().is_unspecified() || addr.port() == 0 {
                        return src.invalid(
                            listen.span(),
                            "servers.stacks.listen",
                            format!(
                                "{addr}: this stack carries a link, so its peer connects here; \
                                 it needs an address and a port the peer can reach \
                                 (not 0.0.0.0, not port 0)"
                            ),
                        );
                    }
                }
            }
        }
        links.push(Resolved {
            raw: l,
            a,
            b,
            stack,
        });
    }
    Ok(links)
}

/// The servers one can reach from `from` over links, each with the
/// server before it on a shortest path.
fn paths(known: usize, links: &[Resolved<'_>], from: usize) -> Vec<Option<usize>> {
    let mut before = vec![None; known];
    before[from] = Some(from);
    let mut queue = VecDeque::from([from]);
    while let Some(s) = queue.pop_front() {
        for l in links {
            let next = if l.a == s {
                l.b
            } else if l.b == s {
                l.a
            } else {
                continue;
            };
            if before[next].is_none() {
                before[next] = Some(s);
                queue.push_back(next);
            }
        }
    }
    before
}

fn routes<'r>(
    src: &Text<'_>,
    raw: &'r [RawRoute],
    known: &[Known<'_>],
    links: &[Resolved<'_>],
) -> Result<Vec<ResolvedRoute<'r>>, ConfigError> {
    let mut routes = Vec::new();
    for r in raw {
        // `from`: SERVER (all its resources) or SERVER/DEVICE.
        let (from_server, from_device) = split(&r.from);
        let server = find(src, known, &from_server, "routes.from")?;
        let from = match from_device {
            None => "*".to_owned(),
            Some(d) => {
                device(src, &known[server], &d, "routes.from")?;
                d.get_ref().clone()
            }
        };
        let (via_server, via_device) = split(&r.via);
        let Some(via_device) = via_device else {
            return src.invalid(
                r.via.span(),
                "routes.via",
                format!(
                    "`{}`: expected SERVER/DEVICE, a relay device of the route's server",
                    r.via.get_ref()
                ),
            );
        };
        let relay_server = find(src, known, &via_server, "routes.via")?;
        let relay = device(src, &known[relay_server], &via_device, "routes.via")?;
        if relay.kind.get_ref() != "relay" {
            return src.invalid(
                r.via.span(),
                "routes.via",
                format!(
                    "device `{}` of server `{}` is a{} `{}` device, not a relay",
                    via_device.get_ref(),
                    known[relay_server].name(),
                    if relay.kind.get_ref().starts_with(['a', 'e', 'i', 'o', 'u']) {
                        "n"
                    } else {
                        ""
                    },
                    relay.kind.get_ref()
                ),
            );
        }
        if relay_server != server {
            return src.invalid(
                r.via.span(),
                "routes.via",
                format!(
                    "the relay is on server `{}`, the route starts on `{}`: a server sends \
                     through its own relay devices only",
                    known[relay_server].name(),
                    known[server].name()
                ),
            );
        }
        let to = find(src, known, &r.to, "routes.to")?;
        if to == server {
            return src.invalid(
                r.to.span(),
                "routes.to",
                format!(
                    "the route starts on server `{}`: its own resources need no route",
                    known[to].name()
                ),
            );
        }
        // A server not linked to the route's own is reached through the
        // servers on a link path, which carry its traffic on.
        if paths(known.len(), links, server)[to].is_none() {
            return src.invalid(
                r.to.span(),
                "routes.to",
                format!(
                    "server `{}` is unreachable from `{}`: no link path joins them",
                    known[to].name(),
                    known[server].name()
                ),
            );
        }
        routes.push(ResolvedRoute {
            raw: r,
            server,
            from,
            via: via_device.get_ref().clone(),
            to,
        });
    }
    Ok(routes)
}

/// `SERVER` or `SERVER/DEVICE`, each with its place in the file.
fn split(value: &Spanned<String>) -> (Spanned<String>, Option<Spanned<String>>) {
    let span = value.span();
    // The span covers the quotes: the text starts one byte in.
    let start = span.start + 1;
    match value.get_ref().split_once('/') {
        None => (value.clone(), None),
        Some((server, device)) => {
            let at = start + server.len() + 1;
            (
                Spanned::new(span.start..at, server.to_owned()),
                Some(Spanned::new(at..span.end, device.to_owned())),
            )
        }
    }
}

/// Server `server`'s device named `name`.
fn device<'r>(
    src: &Text<'_>,
    server: &Known<'r>,
    name: &Spanned<String>,
    field: &str,
) -> Result<&'r RawDevice, ConfigError> {
    match server
        .raw
        .devices
        .iter()
        .find(|d| d.name.get_ref() == name.get_ref())
    {
        Some(d) => Ok(d),
        None => src.invalid(
            name.span(),
            field,
            format!(
                "server `{}` has no device named `{}`",
                server.name(),
                name.get_ref()
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
