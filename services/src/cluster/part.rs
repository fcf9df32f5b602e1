//! One server's part of a cluster file: the per-server configuration
//! text its daemon would read, and the way back from an error in that
//! text to the cluster file.
//!
//! The text is the cluster file with every line outside the shared
//! tables (`[underlay]`, `[[classes]]`, `[policy]`, `[failure]`,
//! `[limits]`) blanked, so those keep their line and column, and then
//! the server's own tables — `[server]`, `[runtime]`, `[engine]`,
//! `[[stacks]]`, `[[devices]]`, a `[[peers]]` per link, its
//! `[[routes]]`, a `[[remotes]]` per server reached only through
//! another, `[cluster] secret` — one value per line (an array's
//! elements one per line too). Each added line remembers the place and
//! the field of the cluster file it came from: an error that
//! [`Config::parse`] reports on an added line is moved there.

use super::{Known, RawIngress, Resolved, ResolvedRoute, Text, SHARED_TABLES};
use crate::config::{Config, ConfigError};
use toml::Spanned;

/// Server `me`'s configuration, checked as a server's file is.
pub(super) fn config(
    src: &Text<'_>,
    raw: &super::RawCluster,
    known: &[Known<'_>],
    links: &[Resolved<'_>],
    routes: &[ResolvedRoute<'_>],
    me: usize,
) -> Result<Config, ConfigError> {
    let server = &known[me];
    let s = server.raw;
    let mut w = Writer::new(src);
    let at = s.id.span().start;
    w.line("[server]", at, "servers");
    w.string("id", &s.id, "servers.id");
    w.string("name", &s.name, "servers.name");
    w.string("peer_listen", &s.peer_listen, "servers.peer_listen");
    if let Some(r) = &s.runtime {
        w.line("[runtime]", at, "servers.runtime");
        if let Some(v) = &r.dir {
            w.string("dir", v, "servers.runtime.dir");
        }
        if let Some(v) = &r.metrics {
            w.string("metrics", v, "servers.runtime.metrics");
        }
    }
    if let Some(e) = &s.engine {
        w.line("[engine]", at, "servers.engine");
        for (key, v) in [
            ("max_ports", &e.max_ports),
            ("ring_depth", &e.ring_depth),
            ("voq_depth", &e.voq_depth),
            ("table_capacity", &e.table_capacity),
            ("shards", &e.shards),
        ] {
            if let Some(v) = v {
                w.int(key, v, &format!("servers.engine.{key}"));
            }
        }
        if let Some(v) = &e.mode {
            w.string("mode", v, "servers.engine.mode");
        }
        if let Some(v) = &e.cpus {
            w.array("cpus", v, "servers.engine.cpus", i64::to_string);
        }
    }
    for st in &s.stacks {
        w.line("[[stacks]]", st.name.span().start, "servers.stacks");
        w.string("name", &st.name, "servers.stacks.name");
        if let Some(v) = &st.listen {
            w.string("listen", v, "servers.stacks.listen");
        }
        if let Some(v) = &st.interface {
            w.string("interface", v, "servers.stacks.interface");
        }
        if let Some(v) = &st.address {
            w.string("address", v, "servers.stacks.address");
        }
        if let Some(v) = &st.transport {
            w.string("transport", v, "servers.stacks.transport");
        }
    }
    for d in &s.devices {
        w.line("[[devices]]", d.name.span().start, "servers.devices");
        w.string("name", &d.name, "servers.devices.name");
        w.string("kind", &d.kind, "servers.devices.kind");
        if let Some(v) = &d.device {
            w.int("device", v, "servers.devices.device");
        }
        if let Some(v) = &d.memory {
            w.int("memory", v, "servers.devices.memory");
        }
        if let Some(v) = &d.backend {
            w.string("backend", v, "servers.devices.backend");
        }
        if let Some(v) = &d.gpu {
            w.int("gpu", v, "servers.devices.gpu");
        }
        if let Some(v) = &d.transfer {
            w.string("transfer", v, "servers.devices.transfer");
        }
        if let Some(v) = &d.direct_from {
            w.int("direct_from", v, "servers.devices.direct_from");
        }
        for (key, v) in [("function", &d.function), ("wait", &d.wait)] {
            if let Some(v) = v {
                w.string(key, v, &format!("servers.devices.{key}"));
            }
        }
        for (key, v) in [
            ("pio_threshold", &d.pio_threshold),
            ("tokens", &d.tokens),
            ("stall_timeout_ms", &d.stall_timeout_ms),
            ("dma_pull_from", &d.dma_pull_from),
            ("dma_staged_from", &d.dma_staged_from),
            ("dma_pipelined_from", &d.dma_pipelined_from),
            ("next_class", &d.next_class),
        ] {
            if let Some(v) = v {
                w.int(key, v, &format!("servers.devices.{key}"));
            }
        }
        if let Some(p) = &d.params {
            let table: Vec<String> = p
                .get_ref()
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        toml::Value::String(s) => quote(s),
                        toml::Value::Integer(n) => n.to_string(),
                        toml::Value::Float(f) => f.to_string(),
                        toml::Value::Boolean(b) => b.to_string(),
                        // Refused by the server's parse, at this place.
                        _ => "[]".to_owned(),
                    };
                    format!("{} = {v}", quote(k))
                })
                .collect();
            w.line(
                &format!("params = {{ {} }}", table.join(", ")),
                p.span().start,
                "servers.devices.params",
            );
        }
        if let Some(next) = &d.next {
            let uid = next_uid(src, known, next)?;
            w.string_at("next", &uid, next.span().start, "servers.devices.next");
        }
    }
    for l in links.iter().filter(|l| l.a == me || l.b == me) {
        // The other end is this server's peer; what this end accepts
        // from it are the peer's ingress rules.
        let (other, other_name, field, accepts, accepts_field) = if l.a == me {
            (
                l.b,
                &l.raw.b,
                "links.b",
                &l.raw.a_accepts,
                "links.a_accepts",
            )
        } else {
            (
                l.a,
                &l.raw.a,
                "links.a",
                &l.raw.b_accepts,
                "links.b_accepts",
            )
        };
        let peer = &known[other];
        let at = other_name.span().start;
        w.line("[[peers]]", at, field);
        w.string_at("server", &peer.id.to_string(), at, field);
        w.string_at(
            "address",
            &peer.peer_listen.to_string(),
            peer.raw.peer_listen.span().start,
            "servers.peer_listen",
        );
        let stack_at = l.raw.stack.as_ref().map_or(at, |s| s.span().start);
        w.string_at("stack", &l.stack, stack_at, "links.stack");
        if let Some(listen) = peer.stack(&l.stack).and_then(|st| st.listen.as_ref()) {
            w.string("tunnel", listen, "servers.stacks.listen");
        }
        if let Some(mac) = peer.stack(&l.stack).and_then(|st| st.mac.as_ref()) {
            w.string("mac", mac, "servers.stacks.mac");
        }
        if let Some(rules) = accepts {
            w.ingress(rules, accepts_field);
        }
        for pin in &l.raw.pin {
            w.line("[[peers.pin]]", pin.class.span().start, "links.pin");
            w.int("class", &pin.class, "links.pin.class");
            w.string("stack", &pin.stack, "links.pin.stack");
            let theirs = peer.stack(pin.stack.get_ref());
            if let Some(listen) = theirs.and_then(|st| st.listen.as_ref()) {
                w.string("tunnel", listen, "servers.stacks.listen");
            }
            if let Some(mac) = theirs.and_then(|st| st.mac.as_ref()) {
                w.string("mac", mac, "servers.stacks.mac");
            }
        }
    }
    // Servers not linked to this one but reached over links: through the
    // first server on a shortest path, which carries their traffic on.
    let before = super::paths(known.len(), links, me);
    for (far, _) in known.iter().enumerate() {
        let linked = links
            .iter()
            .any(|l| (l.a, l.b) == (me, far) || (l.a, l.b) == (far, me));
        if far == me || linked || before[far].is_none() {
            continue;
        }
        let mut hop = far;
        while let Some(prev) = before[hop].filter(|&p| p != me) {
            hop = prev;
        }
        let at = known[far].raw.id.span().start;
        w.line("[[remotes]]", at, "links");
        w.string_at("server", &known[far].id.to_string(), at, "servers.id");
        w.string_at(
            "via",
            &known[hop].id.to_string(),
            known[hop].raw.id.span().start,
            "servers.id",
        );
    }
    for r in routes.iter().filter(|r| r.server == me) {
        w.line("[[routes]]", r.raw.from.span().start, "routes");
        w.string_at("from", &r.from, r.raw.from.span().start, "routes.from");
        w.string_at("via", &r.via, r.raw.via.span().start, "routes.via");
        w.string_at(
            "to",
            &format!("{}:*", known[r.to].id),
            r.raw.to.span().start,
            "routes.to",
        );
    }
    if let Some(secret) = &raw.cluster.secret {
        w.line("[cluster]", secret.span().start, "cluster");
        w.string("secret", secret, "cluster.secret");
    }
    Config::parse(&w.text, src.file).map_err(|e| w.moved(e))
}

/// Where an added line's value is in the cluster file.
struct Origin {
    /// Its offset in the cluster text.
    at: usize,
    /// The cluster file's name for its field.
    field: String,
}

/// A server's configuration text being written.
struct Writer<'a> {
    src: &'a Text<'a>,
    text: String,
    /// Lines of the cluster file kept (or blanked) at the top.
    kept: usize,
    /// One per added line.
    origins: Vec<Origin>,
}

impl<'a> Writer<'a> {
    fn new(src: &'a Text<'a>) -> Writer<'a> {
        let text = shared_lines(src.text);
        Writer {
            kept: text.matches('\n').count(),
            src,
            text,
            origins: Vec::new(),
        }
    }

    fn line(&mut self, line: &str, at: usize, field: &str) {
        self.text.push_str(line);
        self.text.push('\n');
        self.origins.push(Origin {
            at,
            field: field.to_owned(),
        });
    }

    fn string_at(&mut self, key: &str, value: &str, at: usize, field: &str) {
        self.line(&format!("{key} = {}", quote(value)), at, field);
    }

    fn string(&mut self, key: &str, value: &Spanned<String>, field: &str) {
        self.string_at(key, value.get_ref(), value.span().start, field);
    }

    fn int(&mut self, key: &str, value: &Spanned<i64>, field: &str) {
        self.line(
            &format!("{key} = {}", value.get_ref()),
            value.span().start,
            field,
        );
    }

    /// An array, one element a line.
    fn array<T>(
        &mut self,
        key: &str,
        list: &[Spanned<T>],
        field: &str,
        show: impl Fn(&T) -> String,
    ) {
        let at = list.first().map_or(0, |v| v.span().start);
        self.line(&format!("{key} = ["), at, field);
        for v in list {
            self.line(&format!("  {},", show(v.get_ref())), v.span().start, field);
        }
        self.line("]", at, field);
    }

    fn ingress(&mut self, rules: &RawIngress, field: &str) {
        if let Some(list) = &rules.classes {
            self.array("classes", list, &format!("{field}.classes"), i64::to_string);
        }
        if let Some(list) = &rules.types {
            self.array("types", list, &format!("{field}.types"), |s| quote(s));
        }
        if let Some(v) = &rules.max_message {
            self.int("max_message", v, &format!("{field}.max_message"));
        }
        if let Some(list) = &rules.sources {
            self.array("sources", list, &format!("{field}.sources"), |s| quote(s));
        }
    }

    /// `e`, moved from an added line to the cluster file's place and
    /// field; an error on a kept line already has its place.
    fn moved(&self, e: ConfigError) -> ConfigError {
        match e {
            ConfigError::Io { .. } => e,
            ConfigError::Syntax {
                file,
                line,
                column,
                message,
            } => {
                let (line, column, _) = self.place(line, column, "");
                ConfigError::Syntax {
                    file,
                    line,
                    column,
                    message,
                }
            }
            ConfigError::Invalid {
                file,
                line,
                column,
                field,
                message,
            } => {
                let (line, column, field) = self.place(line, column, &field);
                ConfigError::Invalid {
                    file,
                    line,
                    column,
                    field,
                    message,
                }
            }
            ConfigError::OutOfRange {
                file,
                line,
                column,
                field,
                value,
                bounds,
            } => {
                let (line, column, field) = self.place(line, column, &field);
                ConfigError::OutOfRange {
                    file,
                    line,
                    column,
                    field,
                    value,
                    bounds,
                }
            }
            ConfigError::Conflict {
                file,
                line,
                column,
                field,
                message,
                other,
            } => {
                let (line, column, field) = self.place(line, column, &field);
                ConfigError::Conflict {
                    file,
                    line,
                    column,
                    field,
                    message,
                    other: self.moved_other(other),
                }
            }
        }
    }

    /// The cluster file's line, column and field for a place in the
    /// written text.
    fn place(&self, line: usize, column: usize, field: &str) -> (usize, usize, String) {
        let Some(origin) = line
            .checked_sub(self.kept + 1)
            .and_then(|i| self.origins.get(i))
        else {
            return (line, column, field.to_owned());
        };
        let (line, column) = self.src.position(origin.at);
        // A server's own field becomes the cluster file's; a shared one
        // (`cluster.secret`, `classes.…`) keeps its name.
        let own = [
            "server", "runtime", "engine", "stacks", "devices", "peers", "routes",
        ];
        let first = field.split('.').next().unwrap_or_default();
        let field = if own.contains(&first) {
            origin.field.clone()
        } else {
            field.to_owned()
        };
        (line, column, field)
    }

    /// A conflict's first place (`` `FIELD` … at FILE:LINE:COLUMN``),
    /// moved to the cluster file when it is on an added line.
    fn moved_other(&self, other: String) -> String {
        let mut parts = other.rsplitn(3, ':');
        let (Some(column), Some(line), Some(head)) = (parts.next(), parts.next(), parts.next())
        else {
            return other;
        };
        let (Ok(line), Ok(column)) = (line.parse::<usize>(), column.parse::<usize>()) else {
            return other;
        };
        let Some(head) = head.strip_suffix(self.src.file) else {
            return other;
        };
        let old_field = other
            .strip_prefix('`')
            .and_then(|s| s.split_once('`'))
            .map(|(f, _)| f.to_owned())
            .unwrap_or_default();
        let (line, column, field) = self.place(line, column, &old_field);
        let head = head.replacen(&format!("`{old_field}`"), &format!("`{field}`"), 1);
        format!("{head}{}:{line}:{column}", self.src.file)
    }
}

/// A TOML basic string.
/// A chained device's `next`: a UID (`SERVER_ID:DEVICE`) as it is, or
/// `SERVER/DEVICE` (a server's name or ID, a device's name) resolved to
/// one — the device must have a fixed number, which is its UID.
fn next_uid(
    src: &Text<'_>,
    known: &[Known<'_>],
    next: &Spanned<String>,
) -> Result<String, ConfigError> {
    let field = "servers.devices.next";
    let (server, device) = super::split(next);
    let Some(device) = device else {
        return Ok(next.get_ref().clone());
    };
    let i = super::find(src, known, &server, field)?;
    let d = super::device(src, &known[i], &device, field)?;
    match &d.device {
        Some(n) => Ok(format!("{}:{}", known[i].id, n.get_ref())),
        None => src.invalid(
            next.span(),
            field,
            format!(
                "device `{}` of server `{}` has no fixed number: give it `device = N` \
                 (a chain names its next device by UID)",
                device.get_ref(),
                known[i].name()
            ),
        ),
    }
}

fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// The cluster text with only the shared tables' lines kept, every other
/// line blank, so the kept ones stay at their line and column.
pub(super) fn shared_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut keep = false;
    // Before the first header, each key decides for itself
    // (`policy.default = "deny"` is the shared policy's).
    let mut top = true;
    let mut quote = Quote::None;
    let mut depth = 0usize;
    for line in text.split_inclusive('\n') {
        if quote == Quote::None && depth == 0 {
            if let Some(table) = header(line) {
                keep = SHARED_TABLES.contains(&table);
                top = false;
            } else if let (true, Some(key)) = (top, first_key(line)) {
                keep = SHARED_TABLES.contains(&key);
            }
        }
        scan(line.as_bytes(), &mut quote, &mut depth);
        if keep {
            out.push_str(line);
        } else if line.ends_with('\n') {
            out.push('\n');
        }
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// The first name of a `[table]` or `[[array.of.tables]]` header line.
fn header(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('[')?;
    let rest = rest.strip_prefix('[').unwrap_or(rest);
    let name = rest.split([']', '.']).next()?.trim();
    Some(name.trim_matches(['"', '\'']))
}

/// The first name of a `key = value` or `dotted.key = value` line.
fn first_key(line: &str) -> Option<&str> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name = line.split(['=', '.']).next()?.trim();
    Some(name.trim_matches(['"', '\'']))
}

/// What the scanner is inside of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    None,
    Basic,
    Literal,
    MultiBasic,
    MultiLiteral,
}

/// Follows strings, comments and arrays through one line, so a line
/// inside a multi-line string or array is never taken for a header.
fn scan(line: &[u8], quote: &mut Quote, depth: &mut usize) {
    let mut i = 0;
    while i < line.len() {
        let rest = &line[i..];
        match *quote {
            Quote::None => match line[i] {
                b'#' => break,
                b'"' if rest.starts_with(b"\"\"\"") => {
                    *quote = Quote::MultiBasic;
                    i += 3;
                    continue;
                }
                b'\'' if rest.starts_with(b"'''") => {
                    *quote = Quote::MultiLiteral;
                    i += 3;
                    continue;
                }
                b'"' => *quote = Quote::Basic,
                b'\'' => *quote = Quote::Literal,
                b'[' => *depth += 1,
                b']' => *depth = depth.saturating_sub(1),
                _ => {}
            },
            Quote::Basic => match line[i] {
                b'\\' => i += 1,
                b'"' => *quote = Quote::None,
                _ => {}
            },
            Quote::Literal => {
                if line[i] == b'\'' {
                    *quote = Quote::None;
                }
            }
            Quote::MultiBasic => {
                if line[i] == b'\\' {
                    i += 1;
                } else if rest.starts_with(b"\"\"\"") {
                    *quote = Quote::None;
                    i += 3;
                    continue;
                }
            }
            Quote::MultiLiteral => {
                if rest.starts_with(b"'''") {
                    *quote = Quote::None;
                    i += 3;
                    continue;
                }
            }
        }
        i += 1;
    }
    // A one-line string ends with its line (or the file is refused).
    if matches!(*quote, Quote::Basic | Quote::Literal) {
        *quote = Quote::None;
    }
}
