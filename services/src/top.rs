//! `uniplane top`: a live view of a daemon's ports, classes, peers and
//! connections, read from the control socket (`status`, `stats`,
//! `connections`: the same counters the metrics endpoint exports).
//!
//! A [`Sample`] is one reading of those three answers; two samples give
//! rates. [`plain`] renders a sample as text (`--once`, or when stdout is
//! not a terminal); [`live`] redraws a ratatui view every interval until
//! `q`, Esc or Ctrl-C.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::Value;
use uniplane_client::protocol::Request;
use uniplane_client::{Client, ClientError};

/// One port's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PortRow {
    /// The port's name (a resource, or `tunnel-…`/`from-…`).
    pub name: String,
    /// The plane's port number.
    pub port: u64,
    /// Messages read from the port.
    pub rx_msgs: u64,
    /// Payload bytes read from the port.
    pub rx_bytes: u64,
    /// Messages written to the port.
    pub tx_msgs: u64,
    /// Payload bytes written to the port.
    pub tx_bytes: u64,
    /// Messages refused by the port's ACL.
    pub acl_denied: u64,
    /// Messages no route matched.
    pub no_route: u64,
}

/// One open connection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConnRow {
    /// `SERVER:DEVICE/PORT` of the side that opened it.
    pub src: String,
    /// `SERVER:DEVICE/PORT` of the side it reached.
    pub dst: String,
    /// Its traffic class.
    pub class: u64,
    /// The peer daemon it crosses, if any.
    pub peer: Option<String>,
    /// Seconds since it opened.
    pub age_s: f64,
    /// Messages it carried from `src` to `dst` (into this server's plane).
    pub fwd_msgs: u64,
    /// Their payload bytes.
    pub fwd_bytes: u64,
    /// Messages it carried back from `dst` to `src`.
    pub back_msgs: u64,
    /// Their payload bytes.
    pub back_bytes: u64,
}

impl ConnRow {
    fn same(&self, other: &ConnRow) -> bool {
        self.src == other.src && self.dst == other.dst
    }
}

/// One traffic class.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassRow {
    /// Its number.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// Its share against the other classes.
    pub weight: u64,
    /// Its priority (0 first).
    pub priority: u64,
}

/// One peer daemon.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerRow {
    /// Its server address.
    pub server: String,
    /// Whether it answers.
    pub alive: bool,
    /// Tunnels open to it.
    pub tunnels: u64,
    /// Messages its underlay let leave.
    pub sent: u64,
    /// Messages from it the filter dropped.
    pub dropped: u64,
    /// Messages queued for it now.
    pub backlog: u64,
}

/// One reading of the daemon.
#[derive(Clone, Debug)]
pub struct Sample {
    /// When it was read.
    pub at: Instant,
    /// `SERVER (NAME)`.
    pub server: String,
    /// Seconds the daemon has run.
    pub uptime_s: f64,
    /// The forwarding plane's kind.
    pub plane: String,
    /// Every port.
    pub ports: Vec<PortRow>,
    /// The classes.
    pub classes: Vec<ClassRow>,
    /// The peers.
    pub peers: Vec<PeerRow>,
    /// Open connections.
    pub connections: Vec<ConnRow>,
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

impl Sample {
    /// A sample from the answers to `status`, `stats` and `connections`.
    pub fn from_answers(status: &Value, stats: &Value, connections: &Value, at: Instant) -> Sample {
        let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
        let ports = list(stats)
            .iter()
            .map(|p| {
                let c = &p["counters"];
                PortRow {
                    name: s(&p["name"]),
                    port: u(&p["port"]),
                    rx_msgs: u(&c["rx_msgs"]),
                    rx_bytes: u(&c["rx_bytes"]),
                    tx_msgs: u(&c["tx_msgs"]),
                    tx_bytes: u(&c["tx_bytes"]),
                    acl_denied: u(&c["acl_denied"]),
                    no_route: u(&c["no_route"]),
                }
            })
            .collect();
        let connections = list(connections)
            .iter()
            .map(|c| ConnRow {
                src: format!("{}/{}", s(&c["src"]), u(&c["src_port"])),
                dst: format!("{}/{}", s(&c["dst"]), u(&c["dst_port"])),
                class: u(&c["class"]),
                peer: c["peer"].as_str().map(str::to_owned),
                age_s: c["age_s"].as_f64().unwrap_or(0.0),
                fwd_msgs: u(&c["src_to_dst_messages"]),
                fwd_bytes: u(&c["src_to_dst_bytes"]),
                back_msgs: u(&c["dst_to_src_messages"]),
                back_bytes: u(&c["dst_to_src_bytes"]),
            })
            .collect();
        let classes = list(&status["classes"]["classes"])
            .iter()
            .map(|c| ClassRow {
                id: u(&c["id"]),
                name: s(&c["name"]),
                weight: u(&c["weight"]),
                priority: u(&c["priority"]),
            })
            .collect();
        let peers = list(&status["peers"])
            .iter()
            .map(|p| PeerRow {
                server: s(&p["server"]),
                alive: p["alive"].as_bool().unwrap_or(false),
                tunnels: p["tunnels"].as_array().map_or(0, |t| t.len() as u64),
                sent: u(&p["underlay"]["sent"]),
                dropped: u(&p["underlay"]["dropped_total"]),
                backlog: u(&p["underlay"]["backlog"]),
            })
            .collect();
        let name = status["name"].as_str().filter(|n| !n.is_empty());
        Sample {
            at,
            server: match name {
                Some(n) => format!("{} ({n})", s(&status["server"])),
                None => s(&status["server"]),
            },
            uptime_s: status["uptime_s"].as_f64().unwrap_or(0.0),
            plane: s(&status["plane"]),
            ports,
            classes,
            peers,
            connections,
        }
    }

    /// Reads the daemon once.
    pub async fn read(client: &Client) -> Result<Sample, ClientError> {
        let status = client.request(&Request::Status).await?;
        let stats = client.request(&Request::Stats).await?;
        let connections = client.request(&Request::Connections).await?;
        Ok(Sample::from_answers(
            &status,
            &stats,
            &connections,
            Instant::now(),
        ))
    }
}

/// Per-second rates of a port between two samples (`None` for a port the
/// earlier sample lacks).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PortRates {
    /// Messages read per second.
    pub rx_msgs: f64,
    /// Messages written per second.
    pub tx_msgs: f64,
    /// Bytes read per second.
    pub rx_bytes: f64,
    /// Bytes written per second.
    pub tx_bytes: f64,
}

/// The rates of `now`'s port `row` since `before`.
pub fn rates(before: &Sample, now: &Sample, row: &PortRow) -> Option<PortRates> {
    let dt = now.at.checked_duration_since(before.at)?.as_secs_f64();
    if dt <= 0.0 {
        return None;
    }
    let old = before
        .ports
        .iter()
        .find(|p| p.port == row.port && p.name == row.name)?;
    let r = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
    Some(PortRates {
        rx_msgs: r(row.rx_msgs, old.rx_msgs),
        tx_msgs: r(row.tx_msgs, old.tx_msgs),
        rx_bytes: r(row.rx_bytes, old.rx_bytes),
        tx_bytes: r(row.tx_bytes, old.tx_bytes),
    })
}

/// Per-second rates of a connection between two samples, each way.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ConnRates {
    /// Messages per second from source to destination.
    pub fwd_msgs: f64,
    /// Messages per second back.
    pub back_msgs: f64,
    /// Bytes per second from source to destination.
    pub fwd_bytes: f64,
    /// Bytes per second back.
    pub back_bytes: f64,
}

/// The rates of `now`'s connection `row` since `before` (`None` for a
/// connection the earlier sample lacks).
pub fn conn_rates(before: &Sample, now: &Sample, row: &ConnRow) -> Option<ConnRates> {
    let dt = now.at.checked_duration_since(before.at)?.as_secs_f64();
    if dt <= 0.0 {
        return None;
    }
    let old = before.connections.iter().find(|c| c.same(row))?;
    let r = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
    Some(ConnRates {
        fwd_msgs: r(row.fwd_msgs, old.fwd_msgs),
        back_msgs: r(row.back_msgs, old.back_msgs),
        fwd_bytes: r(row.fwd_bytes, old.fwd_bytes),
        back_bytes: r(row.back_bytes, old.back_bytes),
    })
}

/// A count with a k/M/G suffix.
fn human(v: f64) -> String {
    match v {
        v if v >= 1e9 => format!("{:.1}G", v / 1e9),
        v if v >= 1e6 => format!("{:.1}M", v / 1e6),
        v if v >= 1e4 => format!("{:.1}k", v / 1e3),
        v => format!("{v:.0}"),
    }
}

fn header(now: &Sample) -> String {
    format!(
        "uniplane top: {}, up {:.0} s, plane {}, {} ports, {} connections",
        now.server,
        now.uptime_s,
        now.plane,
        now.ports.len(),
        now.connections.len()
    )
}

fn port_cells(before: Option<&Sample>, now: &Sample, p: &PortRow) -> [String; 10] {
    let r = before.and_then(|b| rates(b, now, p));
    let rate = |f: fn(&PortRates) -> f64| r.as_ref().map_or("-".to_owned(), |r| human(f(r)));
    [
        p.port.to_string(),
        p.name.clone(),
        rate(|r| r.rx_msgs),
        rate(|r| r.tx_msgs),
        rate(|r| r.rx_bytes),
        rate(|r| r.tx_bytes),
        human(p.rx_msgs as f64),
        human(p.tx_msgs as f64),
        p.acl_denied.to_string(),
        p.no_route.to_string(),
    ]
}

const PORT_HEADER: [&str; 10] = [
    "PORT", "NAME", "RX/S", "TX/S", "RX B/S", "TX B/S", "RX", "TX", "ACL", "NOROUTE",
];
const CLASS_HEADER: [&str; 4] = ["CLASS", "NAME", "WEIGHT", "PRIORITY"];
const PEER_HEADER: [&str; 6] = ["PEER", "UP", "TUNNELS", "SENT", "DROPPED", "BACKLOG"];
const CONN_HEADER: [&str; 11] = [
    "SOURCE",
    "DESTINATION",
    "CLASS",
    "PEER",
    "AGE",
    "FWD/S",
    "BACK/S",
    "FWD B/S",
    "BACK B/S",
    "FWD",
    "BACK",
];

fn class_cells(c: &ClassRow) -> [String; 4] {
    [
        c.id.to_string(),
        c.name.clone(),
        c.weight.to_string(),
        c.priority.to_string(),
    ]
}

fn peer_cells(p: &PeerRow) -> [String; 6] {
    [
        p.server.clone(),
        if p.alive { "yes" } else { "no" }.to_owned(),
        p.tunnels.to_string(),
        human(p.sent as f64),
        human(p.dropped as f64),
        p.backlog.to_string(),
    ]
}

fn conn_cells(before: Option<&Sample>, now: &Sample, c: &ConnRow) -> [String; 11] {
    let r = before.and_then(|b| conn_rates(b, now, c));
    let rate = |f: fn(&ConnRates) -> f64| r.as_ref().map_or("-".to_owned(), |r| human(f(r)));
    [
        c.src.clone(),
        c.dst.clone(),
        c.class.to_string(),
        c.peer.clone().unwrap_or_else(|| "local".into()),
        format!("{:.0} s", c.age_s),
        rate(|r| r.fwd_msgs),
        rate(|r| r.back_msgs),
        rate(|r| r.fwd_bytes),
        rate(|r| r.back_bytes),
        human(c.fwd_msgs as f64),
        human(c.back_msgs as f64),
    ]
}

/// Writes a table with columns as wide as their widest cell.
fn table<const N: usize>(out: &mut String, title: &str, head: [&str; N], rows: &[[String; N]]) {
    let _ = writeln!(out, "\n{title}");
    let mut width = head.map(str::len);
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cells.enumerate() {
            let _ = write!(l, "{c:<w$}  ", w = width[i]);
        }
        l.trim_end().to_owned()
    };
    let _ = writeln!(out, "{}", line(&mut head.iter().copied()));
    for r in rows {
        let _ = writeln!(out, "{}", line(&mut r.iter().map(String::as_str)));
    }
    if rows.is_empty() {
        let _ = writeln!(out, "(none)");
    }
}

/// `now` as plain text, with rates since `before` if given.
pub fn plain(before: Option<&Sample>, now: &Sample) -> String {
    let mut out = header(now);
    out.push('\n');
    let ports: Vec<_> = now
        .ports
        .iter()
        .map(|p| port_cells(before, now, p))
        .collect();
    table(&mut out, "PORTS", PORT_HEADER, &ports);
    let classes: Vec<_> = now.classes.iter().map(class_cells).collect();
    table(&mut out, "CLASSES", CLASS_HEADER, &classes);
    let peers: Vec<_> = now.peers.iter().map(peer_cells).collect();
    table(&mut out, "PEERS", PEER_HEADER, &peers);
    let conns: Vec<_> = now
        .connections
        .iter()
        .map(|c| conn_cells(before, now, c))
        .collect();
    table(&mut out, "CONNECTIONS", CONN_HEADER, &conns);
    out
}

/// Draws `now` (rates since `before`) on a ratatui frame.
fn draw(f: &mut ratatui::Frame<'_>, before: Option<&Sample>, now: &Sample, error: Option<&str>) {
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Modifier, Style};
    use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};

    fn grid<const N: usize>(
        title: String,
        head: [&str; N],
        rows: Vec<[String; N]>,
        widths: [Constraint; N],
    ) -> Table<'static> {
        let head = Row::new(head.map(str::to_owned))
            .style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED));
        Table::new(rows.into_iter().map(Row::new), widths)
            .header(head)
            .block(Block::default().borders(Borders::ALL).title(title))
    }

    let areas = Layout::vertical([
        Constraint::Length(1),
        Constraint::Percentage(40),
        Constraint::Percentage(20),
        Constraint::Percentage(40),
        Constraint::Length(1),
    ])
    .split(f.area());
    f.render_widget(Paragraph::new(header(now)), areas[0]);
    let ports = now
        .ports
        .iter()
        .map(|p| port_cells(before, now, p))
        .collect();
    let num = Constraint::Length(9);
    f.render_widget(
        grid(
            format!(" Ports ({}) ", now.ports.len()),
            PORT_HEADER,
            ports,
            [
                Constraint::Length(5),
                Constraint::Min(16),
                num,
                num,
                num,
                num,
                num,
                num,
                Constraint::Length(6),
                Constraint::Length(8),
            ],
        ),
        areas[1],
    );
    let middle = Layout::horizontal([Constraint::Percentage(40), Constraint::Percentage(60)])
        .split(areas[2]);
    f.render_widget(
        grid(
            format!(" Classes ({}) ", now.classes.len()),
            CLASS_HEADER,
            now.classes.iter().map(class_cells).collect(),
            [
                Constraint::Length(6),
                Constraint::Min(8),
                Constraint::Length(7),
                Constraint::Length(9),
            ],
        ),
        middle[0],
    );
    f.render_widget(
        grid(
            format!(" Peers ({}) ", now.peers.len()),
            PEER_HEADER,
            now.peers.iter().map(peer_cells).collect(),
            [
                Constraint::Min(15),
                Constraint::Length(4),
                Constraint::Length(8),
                num,
                num,
                num,
            ],
        ),
        middle[1],
    );
    f.render_widget(
        grid(
            format!(" Connections ({}) ", now.connections.len()),
            CONN_HEADER,
            now.connections
                .iter()
                .map(|c| conn_cells(before, now, c))
                .collect(),
            [
                Constraint::Min(22),
                Constraint::Min(22),
                Constraint::Length(6),
                Constraint::Length(16),
                Constraint::Length(8),
                num,
                num,
                num,
                num,
                num,
                num,
            ],
        ),
        areas[3],
    );
    let footer = match error {
        Some(e) => format!("q: quit | last refresh failed: {e}"),
        None => "q: quit".to_owned(),
    };
    f.render_widget(Paragraph::new(footer), areas[4]);
}

/// Whether a key event asks to leave.
fn quits(ev: &ratatui::crossterm::event::Event) -> bool {
    use ratatui::crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
    match ev {
        Event::Key(k) if k.kind == KeyEventKind::Press => {
            matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL))
        }
        _ => false,
    }
}

/// Redraws the view every `interval` until the user quits. The terminal
/// is restored on the way out, also after an error.
pub async fn live(client: &Client, interval: Duration) -> Result<(), ClientError> {
    let io = |e: std::io::Error| ClientError::Daemon {
        kind: "terminal".into(),
        message: e.to_string(),
    };
    let mut before: Option<Sample> = None;
    let mut now = Sample::read(client).await?;
    let mut terminal = ratatui::try_init().map_err(io)?;
    let result = async {
        let mut error: Option<String> = None;
        loop {
            terminal
                .draw(|f| draw(f, before.as_ref(), &now, error.as_deref()))
                .map_err(io)?;
            let deadline = Instant::now() + interval;
            // Key events until the next refresh (the view is idle between).
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                if ratatui::crossterm::event::poll(left).map_err(io)? {
                    let ev = ratatui::crossterm::event::read().map_err(io)?;
                    if quits(&ev) {
                        return Ok(());
                    }
                }
            }
            match Sample::read(client).await {
                Ok(s) => {
                    before = Some(std::mem::replace(&mut now, s));
                    error = None;
                }
                Err(e) => error = Some(e.to_string()),
            }
        }
    }
    .await;
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(at: Instant, rx: u64) -> Sample {
        let status = json!({
            "server": "10.0.0.1", "name": "a", "uptime_s": 12.0, "plane": "software",
            "classes": { "classes": [{ "id": 0, "name": "default", "weight": 1, "priority": 0 }] },
            "peers": [{ "server": "10.0.0.2", "alive": true,
                        "tunnels": [{ "class": 0, "port": 5 }],
                        "underlay": { "sent": 9, "dropped_total": 1, "backlog": 0 } }],
        });
        let stats = json!([{ "name": "app", "port": 3,
            "counters": { "rx_msgs": rx, "rx_bytes": rx * 100, "tx_msgs": 2, "tx_bytes": 200,
                          "acl_denied": 1, "no_route": 0 } }]);
        let conns = json!([{ "src": "10.0.0.1:2", "src_port": 49152, "dst": "10.0.0.2:1",
                             "dst_port": 7, "class": 0, "peer": "10.0.0.2", "age_s": 3.2,
                             "src_to_dst_messages": rx, "src_to_dst_bytes": rx * 64,
                             "dst_to_src_messages": 3, "dst_to_src_bytes": 30 }]);
        Sample::from_answers(&status, &stats, &conns, at)
    }

    #[test]
    fn a_snapshot_lists_ports_classes_peers_and_connections() {
        let t = plain(None, &sample(Instant::now(), 10));
        assert!(t.starts_with("uniplane top: 10.0.0.1 (a), up 12 s, plane software"));
        assert!(t.contains("\nPORTS\nPORT  NAME  RX/S"), "{t}");
        assert!(t.contains("\n3     app   -"), "{t}");
        assert!(t.contains("\n0      default  1       0"), "{t}");
        assert!(t.contains("\n10.0.0.2  yes  1        9     1"), "{t}");
        assert!(
            t.contains("10.0.0.1:2/49152  10.0.0.2:1/7  0      10.0.0.2  3 s  -      -       -        -         10   3"),
            "{t}"
        );
    }

    #[test]
    fn rates_are_the_difference_over_the_time_between_samples() {
        let t0 = Instant::now();
        let a = sample(t0, 10);
        let b = sample(t0 + Duration::from_secs(2), 50);
        let r = rates(&a, &b, &b.ports[0]).unwrap();
        assert_eq!(r.rx_msgs, 20.0);
        assert_eq!(r.rx_bytes, 2000.0);
        assert_eq!(r.tx_msgs, 0.0);
        // Samples in the wrong order give no rate.
        assert_eq!(rates(&b, &a, &a.ports[0]), None);
        let t = plain(Some(&a), &b);
        assert!(t.contains("\n3     app   20"), "{t}");
        let c = conn_rates(&a, &b, &b.connections[0]).unwrap();
        assert_eq!((c.fwd_msgs, c.fwd_bytes), (20.0, 1280.0));
        assert_eq!((c.back_msgs, c.back_bytes), (0.0, 0.0));
        assert!(
            t.contains("3 s  20     0       1280     0         50   3"),
            "{t}"
        );
    }

    #[test]
    fn an_empty_daemon_says_so() {
        let s = Sample::from_answers(&json!({}), &json!([]), &json!([]), Instant::now());
        let t = plain(None, &s);
        assert_eq!(t.matches("(none)").count(), 4, "{t}");
    }
}
