//! `uniplane`: the operator's command line for a running `uniplaned`.
//!
//! Human tables by default, one JSON document with `--json`. The daemon is
//! found through `UNIPLANE_RUNTIME_DIR`, else the system service's
//! `/run/uniplane` when its socket is there, else
//! `$XDG_RUNTIME_DIR/uniplane`, else `/tmp/uniplane-$UID`.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use uniplane_client::protocol::Request;
use uniplane_client::{Client, ClientError};
use uniplane_dataplane::{Endpoint, MemoryAddress};
use uniplane_services::transfer;

/// Operate a uniplane host daemon.
#[derive(Parser)]
#[command(name = "uniplane", version)]
struct Args {
    /// Print one JSON document instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The daemon's identity, stacks and peers.
    Status,
    /// Writes this command's manual pages and shell completions into DIR
    /// (for packaging).
    #[command(hide = true)]
    GenerateManual {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
    /// Local resources and their device IDs.
    Resources,
    /// The interconnection table and routes.
    Routes,
    /// Open connections.
    Connections,
    /// Counters of one device's port.
    Tables {
        /// Device number.
        device: u16,
    },
    /// Counters of every port.
    Stats,
    /// Prometheus text of every metric.
    Metrics,
    /// A live view of ports, classes, peers and connections (`q` quits);
    /// one plain snapshot with `--once` or when stdout is not a terminal.
    Top {
        /// Print one snapshot and exit.
        #[arg(long)]
        once: bool,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// The forwarding plane (software engine or RTL), read back.
    Plane {
        #[command(subcommand)]
        what: PlaneCommand,
    },
    /// The cluster's shared secret and its cluster file (no daemon
    /// needed); the directory of its servers and names.
    Cluster {
        #[command(subcommand)]
        what: ClusterCommand,
    },
    /// The traffic classes and how they share each peer's tunnels.
    Class {
        #[command(subcommand)]
        what: Option<ClassCommand>,
    },
    /// Shows or sets a device port's scheduling policy.
    Policy {
        /// Device number.
        device: u16,
        /// rr, weighted:W0:W1:… or strict:C0/W0,C1/W1,…
        #[arg(long)]
        set: Option<String>,
    },
    /// Accepts connections on PORT and prints what arrives.
    Listen {
        /// Port.
        port: u16,
        /// Stop after this many messages.
        #[arg(long, default_value_t = u64::MAX)]
        count: u64,
        /// Claim NAME for the listener in the cluster's directory while it
        /// runs (`[registry] kind = "etcd"`), so `uniplane resolve NAME`
        /// finds it from any server.
        #[arg(long, value_name = "NAME")]
        register: Option<String>,
    },
    /// The UID a name stands for: in the cluster's directory, or among
    /// this daemon's resources when it has none (devices as DEVICE or
    /// DEVICE@SERVER-NAME).
    Resolve {
        /// The name.
        name: String,
    },
    /// Connects to ENDPOINT (SERVER:DEVICE/PORT) and sends data.
    Send {
        /// Destination endpoint.
        endpoint: Endpoint,
        /// The bytes to send.
        #[arg(long)]
        data: String,
    },
    /// Round trips through the overlay: `self` is this server's echo device.
    Ping {
        /// `self` or an endpoint SERVER:DEVICE/PORT that echoes.
        target: String,
        /// Round trips.
        #[arg(long, default_value_t = 10)]
        count: u32,
        /// Payload bytes.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Pause between round trips, in milliseconds.
        #[arg(long, default_value_t = 0)]
        interval_ms: u64,
    },
    /// Kernel devices: call one with a file's bytes.
    Kernel {
        #[command(subcommand)]
        what: KernelCommand,
    },
    /// One-sided write at SERVER:DEVICE@ADDR of a string or a file: into a
    /// mapping of the memory when the daemon lends it (this server's host
    /// memory, as the access rules allow), else in messages of at most
    /// the path's MTU, several in flight.
    Write {
        /// Target memory address.
        address: MemoryAddress,
        /// `auto` (map when lent, else messages), `map` or `messages`.
        #[arg(long, value_enum, default_value_t = RouteArg::Auto)]
        path: RouteArg,
        /// The bytes to write.
        #[arg(long, required_unless_present = "file", conflicts_with = "file")]
        data: Option<String>,
        /// A file whose bytes to write.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// One-sided read of LEN bytes at SERVER:DEVICE@ADDR (from a mapping
    /// of the memory when the daemon lends it, else in messages of at most
    /// the path's MTU, several in flight), shown or saved.
    Read {
        /// Source memory address.
        address: MemoryAddress,
        /// `auto` (map when lent, else messages), `map` or `messages`.
        #[arg(long, value_enum, default_value_t = RouteArg::Auto)]
        path: RouteArg,
        /// Bytes to read.
        #[arg(long)]
        len: u64,
        /// Saves the bytes in this file instead of showing them.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum KernelCommand {
    /// Sends the bytes of a file as one message to the kernel device UID
    /// (SERVER:DEVICE) and shows its answer, or saves it.
    Call {
        /// The kernel device.
        uid: uniplane_dataplane::Uid,
        /// The file whose bytes are the message (at most 65535).
        #[arg(long)]
        input: PathBuf,
        /// Saves the answer in this file instead of showing it.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The port to connect to on the device.
        #[arg(long, default_value_t = 7)]
        port: u16,
        /// How long to wait for the answer, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand)]
enum ClassCommand {
    /// Shows the classes (the default).
    Show,
    /// Changes a class's weight or priority, live, on every peer's
    /// underlay (until the next reload or restart).
    Set {
        /// The class.
        id: u8,
        /// Its share against the other classes (≥ 1).
        #[arg(long)]
        weight: Option<u32>,
        /// 0 is served first (with `scheduling = "priority"`).
        #[arg(long)]
        priority: Option<u8>,
    },
}

#[derive(Subcommand)]
enum PlaneCommand {
    /// Every port's forwarding entries, connections, access rules, policy
    /// and counters, and the translator, as the plane holds them.
    Dump,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Creates a new cluster secret in FILE (mode 0600; an existing file
    /// is never overwritten). Copy it to every server of the cluster and
    /// name it in `[cluster] secret`.
    Keygen {
        /// Where to write it.
        file: std::path::PathBuf,
    },
    /// Validates a cluster file (each mistake with its file, line and
    /// column) and prints the resolved view: per server its stacks,
    /// devices, peers with their addresses, and routes; the classes.
    Check {
        /// The cluster file.
        file: std::path::PathBuf,
    },
    /// The cluster's directory (`[registry] kind = "etcd"`): registered
    /// servers with their leases, claimed names, and how this daemon's
    /// own claims stand.
    Status,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if args.json {
                println!("{}", json!({ "ok": false, "error": e.to_string() }));
            } else {
                eprintln!("uniplane: {e}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), ClientError> {
    if let Command::GenerateManual { dir } = &args.command {
        use clap::CommandFactory;
        return uniplane_services::manual::write(Args::command(), "1", dir).map_err(|e| {
            ClientError::Daemon {
                kind: "manual".into(),
                message: e.to_string(),
            }
        });
    }
    if let Command::Cluster {
        what: ClusterCommand::Keygen { file },
    } = &args.command
    {
        uniplane_services::auth::Key::generate(file).map_err(|e| ClientError::Daemon {
            kind: "cluster".into(),
            message: e.to_string(),
        })?;
        if args.json {
            println!("{}", json!({ "ok": true, "file": file }));
        } else {
            println!("wrote a new cluster secret to {}", file.display());
        }
        return Ok(());
    }
    if let Command::Cluster {
        what: ClusterCommand::Check { file },
    } = &args.command
    {
        let cluster =
            uniplane_services::cluster::Cluster::load(file).map_err(|e| ClientError::Daemon {
                kind: "cluster check".into(),
                message: e.to_string(),
            })?;
        if args.json {
            println!("{}", json!({ "ok": true, "view": cluster.to_json() }));
        } else {
            print!("{cluster}");
        }
        return Ok(());
    }
    let client = Client::connect_default().await?;
    let simple = |req: Request| req;
    let req = match &args.command {
        Command::Status => simple(Request::Status),
        Command::Resources => Request::Resources,
        Command::Routes => Request::Routes,
        Command::Connections => Request::Connections,
        Command::Tables { device } => Request::Tables { device: *device },
        Command::Stats => Request::Stats,
        Command::Cluster {
            what: ClusterCommand::Keygen { .. } | ClusterCommand::Check { .. },
        }
        | Command::GenerateManual { .. } => {
            unreachable!("answered above, without the daemon")
        }
        Command::Plane {
            what: PlaneCommand::Dump,
        } => {
            let v = client.request(&Request::PlaneDump).await?;
            if args.json {
                println!("{v}");
            } else {
                print_plane_dump(&v);
            }
            return Ok(());
        }
        Command::Top { once, interval } => {
            use std::io::IsTerminal;
            use uniplane_services::top;
            if *once || args.json || !std::io::stdout().is_terminal() {
                if args.json {
                    let v = json!({
                        "status": client.request(&Request::Status).await?,
                        "stats": client.request(&Request::Stats).await?,
                        "connections": client.request(&Request::Connections).await?,
                    });
                    println!("{v}");
                } else {
                    print!("{}", top::plain(None, &top::Sample::read(&client).await?));
                }
                return Ok(());
            }
            let interval = Duration::try_from_secs_f64(*interval)
                .ok()
                .filter(|d| *d >= Duration::from_millis(100))
                .ok_or_else(|| ClientError::Daemon {
                    kind: "top".into(),
                    message: "--interval must be at least 0.1 seconds".into(),
                })?;
            return top::live(&client, interval).await;
        }
        Command::Metrics => {
            let v = client.request(&Request::Metrics).await?;
            if args.json {
                println!("{v}");
            } else {
                print!("{}", v["text"].as_str().unwrap_or_default());
            }
            return Ok(());
        }
        Command::Class { what } => {
            let req = match what {
                None | Some(ClassCommand::Show) => Request::Class {
                    id: None,
                    weight: None,
                    priority: None,
                },
                Some(ClassCommand::Set {
                    id,
                    weight,
                    priority,
                }) => Request::Class {
                    id: Some(*id),
                    weight: *weight,
                    priority: *priority,
                },
            };
            let v = client.request(&req).await?;
            if args.json {
                println!("{v}");
            } else {
                println!(
                    "scheduling: {}, rate: {}",
                    v["scheduling"].as_str().unwrap_or("?"),
                    v["rate_bytes_per_sec"]
                        .as_u64()
                        .map_or("unshaped".to_string(), |r| format!(
                            "{} Mb/s",
                            r * 8 / 1_000_000
                        ))
                );
                print(false, &v["classes"]);
            }
            return Ok(());
        }
        Command::Policy { device, set } => Request::Policy {
            device: *device,
            set: set.clone(),
        },
        Command::Listen {
            port,
            count,
            register,
        } => return listen(client, *port, *count, register.as_deref(), args.json).await,
        Command::Resolve { name } => Request::Resolve { name: name.clone() },
        Command::Cluster {
            what: ClusterCommand::Status,
        } => {
            let v = client.request(&Request::Directory).await?;
            if args.json {
                println!("{v}");
            } else {
                print_directory(&v);
            }
            return Ok(());
        }
        Command::Send { endpoint, data } => return send(client, *endpoint, data, args.json).await,
        Command::Ping {
            target,
            count,
            size,
            interval_ms,
        } => return ping(client, target, *count, *size, *interval_ms, args.json).await,
        Command::Kernel {
            what:
                KernelCommand::Call {
                    uid,
                    input,
                    out,
                    port,
                    timeout_ms,
                },
        } => {
            let call = KernelCall {
                target: uid.port(*port),
                input,
                out: out.as_deref(),
                timeout: Duration::from_millis(*timeout_ms),
            };
            return kernel_call(client, call, args.json).await;
        }
        Command::Write {
            address,
            path,
            data,
            file,
        } => {
            let bytes = match (data, file) {
                (Some(data), _) => Bytes::from(data.clone().into_bytes()),
                (None, Some(file)) => {
                    Bytes::from(std::fs::read(file).map_err(|e| ClientError::Daemon {
                        kind: "write".into(),
                        message: format!("{}: {e}", file.display()),
                    })?)
                }
                (None, None) => unreachable!("clap requires --data or --file"),
            };
            let mtu = path_mtu(&client, address.uid.server()).await?;
            let s = client.attach("uniplane-cli").await?;
            let started = Instant::now();
            let went = transfer::write_by(&s, *address, bytes.clone(), mtu, path.route()).await?;
            print(
                args.json,
                &json!({
                    "written": bytes.len(), "at": address.to_string(),
                    "path": went_name(went), "messages": went_messages(went),
                    "seconds": started.elapsed().as_secs_f64(),
                }),
            );
            return Ok(());
        }
        Command::Read {
            address,
            path,
            len,
            out,
        } => {
            let mtu = path_mtu(&client, address.uid.server()).await?;
            let s = client.attach("uniplane-cli").await?;
            let started = Instant::now();
            let size = usize::try_from(*len).map_err(|_| ClientError::Daemon {
                kind: "read".into(),
                message: format!("{len} bytes do not fit in memory"),
            })?;
            let mut bytes = vec![0u8; size];
            let went = transfer::read_by(&s, *address, &mut bytes, mtu, path.route()).await?;
            let seconds = started.elapsed().as_secs_f64();
            if let Some(out) = out {
                std::fs::write(out, &bytes).map_err(|e| ClientError::Daemon {
                    kind: "read".into(),
                    message: format!("{}: {e}", out.display()),
                })?;
                print(
                    args.json,
                    &json!({
                        "at": address.to_string(), "len": bytes.len(),
                        "out": out.display().to_string(), "seconds": seconds,
                        "path": went_name(went), "messages": went_messages(went),
                    }),
                );
                return Ok(());
            }
            let text = String::from_utf8_lossy(&bytes).to_string();
            print(
                args.json,
                &json!({
                    "at": address.to_string(), "len": bytes.len(), "hex": hex(&bytes),
                    "text": text, "path": went_name(went),
                }),
            );
            return Ok(());
        }
    };
    let v = client.request(&req).await?;
    print(args.json, &v);
    Ok(())
}

/// `--path` of `write` and `read`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum RouteArg {
    /// Map the memory when the daemon lends it, else messages.
    Auto,
    /// Map the memory, or fail with the daemon's reason.
    Map,
    /// One-sided messages through the engine.
    Messages,
}

impl RouteArg {
    fn route(self) -> transfer::Route {
        match self {
            RouteArg::Auto => transfer::Route::Auto,
            RouteArg::Map => transfer::Route::Map,
            RouteArg::Messages => transfer::Route::Messages,
        }
    }
}

fn went_name(w: transfer::Went) -> &'static str {
    match w {
        transfer::Went::Mapped => "map",
        transfer::Went::Messages(_) => "messages",
    }
}

fn went_messages(w: transfer::Went) -> usize {
    match w {
        transfer::Went::Mapped => 0,
        transfer::Went::Messages(n) => n,
    }
}

/// The plane's tables, a block per port.
fn print_plane_dump(v: &Value) {
    println!("plane: {}", v["plane"].as_str().unwrap_or("?"));
    let conn = |c: &Value| {
        format!(
            "{}/{} <-> {}/{}",
            c["src"].as_str().unwrap_or("?"),
            c["src_port"],
            c["dst"].as_str().unwrap_or("?"),
            c["dst_port"]
        )
    };
    for p in v["ports"].as_array().into_iter().flatten() {
        println!(
            "\nport {} ({}){}",
            p["port"],
            p["name"].as_str().unwrap_or(""),
            p["kind"]
                .as_str()
                .map(|k| format!(" {k}"))
                .unwrap_or_default()
        );
        if let Some(e) = p["error"].as_str() {
            println!("  error: {e}");
            continue;
        }
        for r in p["routes"].as_array().into_iter().flatten() {
            println!(
                "  route  {} mask {} prio {} -> port {}",
                r["key"].as_str().unwrap_or("?"),
                r["mask"].as_str().unwrap_or("?"),
                r["priority"],
                r["port"]
            );
        }
        if !p["default_route"].is_null() {
            println!("  route  default -> port {}", p["default_route"]);
        }
        for c in p["connections"].as_array().into_iter().flatten() {
            println!("  allow  {}", conn(c));
        }
        for r in p["rules"].as_array().into_iter().flatten() {
            let types: Vec<&str> = r["types"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            println!(
                "  rule   {} {}/{} -> {}/{} types {}",
                if r["allow"].as_bool() == Some(true) {
                    "allow"
                } else {
                    "deny "
                },
                r["src"].as_str().unwrap_or("?"),
                r["src_mask"].as_str().unwrap_or("?"),
                r["dst"].as_str().unwrap_or("?"),
                r["dst_mask"].as_str().unwrap_or("?"),
                types.join(",")
            );
        }
        if let Some(pol) = p["policy"].as_str() {
            println!("  policy {pol}");
        }
        let c = &p["counters"];
        println!(
            "  counters rx {} msgs, tx {} msgs, denied {}, no route {}, stalls {}",
            c["rx_msgs"], c["tx_msgs"], c["acl_denied"], c["no_route"], c["input_stalls"]
        );
    }
    let t = v["translations"].as_array();
    if t.is_some_and(|t| !t.is_empty()) {
        println!("\ntranslator");
        for e in t.into_iter().flatten() {
            println!("  {} -> port {}", conn(&e["conn"]), e["port"]);
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints `v` as JSON or as a table of its rows.
fn print(as_json: bool, v: &Value) {
    if as_json {
        println!("{v}");
        return;
    }
    match v {
        Value::Array(rows) if rows.iter().all(Value::is_object) && !rows.is_empty() => {
            // Nested objects (such as counters) become columns of their own.
            let rows: Vec<Value> = rows
                .iter()
                .map(|r| {
                    let mut flat = serde_json::Map::new();
                    for (k, v) in r.as_object().into_iter().flatten() {
                        match v {
                            Value::Object(inner) => flat.extend(inner.clone()),
                            other => {
                                flat.insert(k.clone(), other.clone());
                            }
                        }
                    }
                    Value::Object(flat)
                })
                .collect();
            let rows = &rows;
            let mut cols: Vec<String> = Vec::new();
            for r in rows {
                for k in r.as_object().into_iter().flat_map(|o| o.keys()) {
                    if !cols.contains(k) {
                        cols.push(k.clone());
                    }
                }
            }
            let cell = |v: &Value| match v {
                Value::String(s) => s.clone(),
                Value::Null => "-".into(),
                Value::Number(n) if n.is_f64() => format!("{:.1}", n.as_f64().unwrap_or(0.0)),
                other => other.to_string(),
            };
            let table: Vec<Vec<String>> = rows
                .iter()
                .map(|r| cols.iter().map(|c| cell(&r[c])).collect())
                .collect();
            let widths: Vec<usize> = cols
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    table
                        .iter()
                        .map(|r| r[i].len())
                        .chain([c.len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |cells: Vec<&str>| {
                cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:<w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
                    .trim_end()
                    .to_string()
            };
            println!("{}", line(cols.iter().map(String::as_str).collect()));
            for r in &table {
                println!("{}", line(r.iter().map(String::as_str).collect()));
            }
        }
        Value::Array(rows) if rows.is_empty() => println!("(none)"),
        Value::Object(map) => {
            let w = map.keys().map(String::len).max().unwrap_or(0);
            for (k, v) in map {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Array(a) if a.iter().all(|x| !x.is_object()) => a
                        .iter()
                        .map(|x| x.as_str().map_or(x.to_string(), str::to_owned))
                        .collect::<Vec<_>>()
                        .join(", "),
                    other => other.to_string(),
                };
                println!("{k:<w$}  {text}");
            }
        }
        other => println!("{other}"),
    }
}

/// Largest payload one message to `server` carries: a local device takes
/// the largest there is; a peer its tunnels' (as `uniplane status` shows
/// it); a server further away the smallest of all the peers'.
async fn path_mtu(client: &Client, server: Ipv4Addr) -> Result<usize, ClientError> {
    let status = client.request(&Request::Status).await?;
    if status["server"].as_str() == Some(server.to_string().as_str()) {
        return Ok(uniplane_dataplane::Message::MAX_PAYLOAD);
    }
    let peers = status["peers"].as_array().cloned().unwrap_or_default();
    let mtu_of = |p: &Value| p["tunnel_mtu"].as_u64().map(|m| m as usize);
    let direct = peers
        .iter()
        .find(|p| p["server"].as_str() == Some(server.to_string().as_str()))
        .and_then(mtu_of);
    Ok(direct
        .or_else(|| peers.iter().filter_map(mtu_of).min())
        .unwrap_or(uniplane_services::transfer::SMALLEST_MTU))
}

/// `uniplane cluster status` as text.
fn print_directory(v: &serde_json::Value) {
    let text = |v: &serde_json::Value| {
        v.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string())
    };
    println!(
        "registry: {}   this daemon: {} ({})",
        text(&v["registry"]),
        text(&v["server"]),
        text(&v["name"])
    );
    if let Some(e) = v["error"].as_str() {
        println!("directory: {e}");
    }
    if let Some(servers) = v["servers"].as_array() {
        println!(
            "\n{:<16} {:<16} {:<22} {:>20} {:>8}",
            "SERVER", "NAME", "PEER", "LEASE", "TTL(s)"
        );
        for s in servers {
            println!(
                "{:<16} {:<16} {:<22} {:>20} {:>8}",
                text(&s["server"]),
                text(&s["record"]["name"]),
                text(&s["record"]["peer_listen"]),
                s["lease"].as_i64().map_or("?".into(), |l| format!("{l:x}")),
                text(&s["ttl_s"]),
            );
        }
    }
    if let Some(names) = v["names"].as_array() {
        println!("\n{:<32} {:<22} {:>20}", "NAME", "UID", "LEASE");
        for n in names {
            println!(
                "{:<32} {:<22} {:>20}",
                text(&n["name"]),
                text(&n["uid"]),
                n["lease"].as_i64().map_or("?".into(), |l| format!("{l:x}")),
            );
        }
    }
    let claims = &v["claims"];
    if !claims.is_null() {
        let lease = &claims["lease"];
        if lease.is_null() {
            println!("\nthis daemon holds no lease");
        } else {
            println!(
                "\nthis daemon's lease {:x}, {} ms left",
                lease["id"].as_i64().unwrap_or_default(),
                text(&lease["left_ms"])
            );
        }
        if let Some(e) = claims["error"].as_str() {
            println!("last error: {e}");
        }
        for k in claims["keys"].as_array().into_iter().flatten() {
            println!(
                "  {:<40} {:<22} {}",
                text(&k["key"]),
                text(&k["value"]),
                text(&k["state"])
            );
        }
    }
}

async fn listen(
    client: Client,
    port: u16,
    count: u64,
    register: Option<&str>,
    as_json: bool,
) -> Result<(), ClientError> {
    let session = client.attach(register.unwrap_or("uniplane-listen")).await?;
    let mut listener = session.listen(port).await?;
    if let Some(name) = register {
        session.register(name).await?;
        eprintln!("listening at {}/{port} as {name}", session.uid());
    } else if !as_json {
        eprintln!("listening at {}/{port}", session.uid());
    }
    let mut seen = 0;
    while seen < count {
        let Some(mut conn) = listener.accept().await else {
            break;
        };
        while let Some(m) = conn.recv().await {
            let m = m?;
            seen += 1;
            let text = String::from_utf8_lossy(m.payload()).to_string();
            if as_json {
                println!(
                    "{}",
                    json!({ "from": conn.remote().to_string(), "seq": m.header().seqnum, "len": m.payload().len(), "text": text })
                );
            } else {
                println!("{} #{}: {text}", conn.remote(), m.header().seqnum);
            }
            if seen >= count {
                break;
            }
        }
    }
    Ok(())
}

async fn send(
    client: Client,
    endpoint: Endpoint,
    data: &str,
    as_json: bool,
) -> Result<(), ClientError> {
    let session = client.attach("uniplane-send").await?;
    let mut conn = session.connect(endpoint).await?;
    conn.send_bytes(Bytes::from(data.to_owned().into_bytes()))
        .await?;
    print(
        as_json,
        &json!({ "to": endpoint.to_string(), "from": conn.local().to_string(), "sent": data.len() }),
    );
    session.close(conn).await
}

/// What `uniplane kernel call` does.
struct KernelCall<'a> {
    target: Endpoint,
    input: &'a std::path::Path,
    out: Option<&'a std::path::Path>,
    timeout: Duration,
}

async fn kernel_call(
    client: Client,
    call: KernelCall<'_>,
    as_json: bool,
) -> Result<(), ClientError> {
    let fail = |message: String| ClientError::Daemon {
        kind: "kernel".into(),
        message,
    };
    let bytes =
        std::fs::read(call.input).map_err(|e| fail(format!("{}: {e}", call.input.display())))?;
    if bytes.len() > uniplane_dataplane::Message::MAX_PAYLOAD {
        return Err(fail(format!(
            "{}: {} bytes; one message carries at most {}",
            call.input.display(),
            bytes.len(),
            uniplane_dataplane::Message::MAX_PAYLOAD
        )));
    }
    let session = client.attach("uniplane-kernel").await?;
    let mut conn = session.connect(call.target).await?;
    let started = Instant::now();
    conn.send_bytes(Bytes::from(bytes)).await?;
    let answer = match tokio::time::timeout(call.timeout, conn.recv()).await {
        Ok(Some(Ok(m))) => m,
        Ok(Some(Err(e))) => return Err(e.into()),
        Ok(None) => return Err(ClientError::Protocol("connection closed".into())),
        Err(_) => {
            return Err(fail(format!(
                "no answer from {} in {} ms",
                call.target,
                call.timeout.as_millis()
            )))
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let payload = answer.payload();
    let mut v = json!({ "to": call.target.to_string(), "len": payload.len(), "seconds": seconds });
    match call.out {
        Some(out) => {
            std::fs::write(out, payload).map_err(|e| fail(format!("{}: {e}", out.display())))?;
            v["out"] = json!(out.display().to_string());
        }
        None => {
            v["hex"] = json!(hex(payload));
            v["text"] = json!(String::from_utf8_lossy(payload));
        }
    }
    print(as_json, &v);
    session.close(conn).await
}

async fn ping(
    client: Client,
    target: &str,
    count: u32,
    size: usize,
    interval_ms: u64,
    as_json: bool,
) -> Result<(), ClientError> {
    let endpoint = if target == "self" {
        let resources = client.request(&Request::Resources).await?;
        let echo = resources
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["kind"] == "echo"))
            .and_then(|r| r["uid"].as_str())
            .ok_or_else(|| ClientError::Protocol("this daemon hosts no echo device".into()))?;
        let uid: uniplane_dataplane::Uid = echo
            .parse()
            .map_err(|e| ClientError::Protocol(format!("{e}")))?;
        uid.port(7)
    } else {
        target
            .parse::<Endpoint>()
            .map_err(|e| ClientError::Protocol(e.to_string()))?
    };
    let session = client.attach("uniplane-ping").await?;
    let mut conn = session.connect(endpoint).await?;
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    let payload = Bytes::from(vec![0x5a; size]);
    if !as_json {
        println!("PING {endpoint} from {}: {size} bytes", conn.local());
    }
    let mut lost = 0;
    for i in 0..count {
        let start = Instant::now();
        let m = conn.message(payload.clone())?;
        let seq = m.header().seqnum;
        futures_util::SinkExt::send(&mut conn, m).await?;
        let reply = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match conn.recv().await {
                    Some(Ok(r)) if r.header().seqnum == seq => return Some(Ok(r)),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Some(Err(e)),
                    None => return None,
                }
            }
        })
        .await;
        let rtt = start.elapsed();
        match reply {
            Ok(Some(Ok(r))) => {
                hist.record(rtt.as_nanos().max(1) as u64).ok();
                if !as_json {
                    println!(
                        "{} bytes from {}: seq={i} time={:.1} µs",
                        r.payload().len(),
                        endpoint,
                        rtt.as_secs_f64() * 1e6
                    );
                }
            }
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) => return Err(ClientError::Protocol("connection closed".into())),
            Err(_) => {
                lost += 1;
                if !as_json {
                    println!("seq={i} timed out");
                }
            }
        }
        if interval_ms > 0 {
            tokio::time::sleep(Duration::from_millis(interval_ms)).await;
        }
    }
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    let summary = json!({
        "target": endpoint.to_string(), "count": count, "received": count - lost, "lost": lost, "size": size,
        "rtt_us": { "min": hist.min() as f64 / 1000.0, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": hist.max() as f64 / 1000.0 },
    });
    if as_json {
        println!("{summary}");
    } else {
        println!(
            "--- {endpoint} ping: {} sent, {} received, {lost} lost; rtt min/p50/p90/p99/max = {:.1}/{:.1}/{:.1}/{:.1}/{:.1} µs",
            count,
            count - lost,
            hist.min() as f64 / 1000.0,
            q(0.5),
            q(0.9),
            q(0.99),
            hist.max() as f64 / 1000.0
        );
    }
    session.close(conn).await
}
