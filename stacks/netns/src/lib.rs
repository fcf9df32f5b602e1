//! Network namespaces for uniplane's multi-server tests, and a seeded UDP
//! impairment relay.
//!
//! - [`Namespace`]: a network namespace with a unique name, deleted on
//!   drop (even when a test panics); [`Namespace::run`] runs a closure on
//!   a thread inside it, [`Namespace::command`] a program.
//! - [`Pair`]: two namespaces joined by a veth pair, addressed
//!   `10.R.S.1/24` and `10.R.S.2/24` — addresses that exist only inside
//!   the namespaces made here.
//! - [`relay`]: forwards UDP datagrams and misbehaves on purpose (loss,
//!   duplication, reordering, delay), seeded so a run replays; loss on the
//!   wire itself comes from nftables ([`Namespace::drop_udp_percent`]),
//!   since this kernel has no `sch_netem`.
//! - [`Line`] and [`frame_relay`]: three namespaces in a row, the middle
//!   one bridging raw frames between its two veths with the same seeded
//!   impairments; [`Namespace::drop_ether_percent`] drops frames of one
//!   EtherType at an interface's ingress (an nftables `netdev` chain: the
//!   `inet` hooks never see EtherTypes other than IP).
//!
//! - [`etcd`]: a real etcd cluster (Debian's `etcd-server`) for the
//!   naming service's tests, on loopback or inside a namespace.
//!
//! - [`free_port`]: a loopback port below the kernel's ephemeral range,
//!   so a daemon's outgoing connection never takes the port another is
//!   about to listen on.
//!
//! Creating namespaces needs root (CAP_SYS_ADMIN) and `ip` (iproute2).
//! [`require`] tells a test whether to run: when the tools are missing it
//! returns `false` (skip), or panics when `UNIPLANE_REQUIRE_TOOLS=1`.

pub mod etcd;
pub mod frame_relay;
pub mod ports;
pub mod relay;

pub use ports::{free_port, try_free_port};

use std::io;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace this crate creates.
pub const PREFIX: &str = "upns";

/// Why a namespace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A command could not start.
    #[error("cannot run {cmd}: {source}")]
    Spawn {
        /// The command.
        cmd: String,
        /// The cause.
        source: io::Error,
    },
    /// A command failed.
    #[error("{cmd} failed: {stderr}")]
    Failed {
        /// The command.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// Entering a namespace failed.
    #[error("setns into {ns}: {source}")]
    Setns {
        /// The namespace.
        ns: String,
        /// The cause.
        source: io::Error,
    },
}

fn run(program: &str, args: &[&str]) -> Result<Output, NetnsError> {
    let cmd = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| NetnsError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NetnsError::Failed {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out)
}

/// Whether namespaces can be made here: `ip` exists and we may create one.
///
/// Probed once per process (tests of one binary ask concurrently).
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let probe = format!("{PREFIX}probe{}", std::process::id());
        let ok = run("ip", &["netns", "add", &probe]).is_ok();
        if ok {
            let _ = run("ip", &["netns", "del", &probe]);
        }
        ok
    })
}

/// Whether `nft` exists.
pub fn nft_available() -> bool {
    Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether a namespace test should run: `true` if namespaces (and nft
/// when `need_nft`) are available; otherwise prints a skip note and
/// returns `false`, or panics when `UNIPLANE_REQUIRE_TOOLS=1`.
pub fn require(test: &str, need_nft: bool) -> bool {
    let missing = if !available() {
        Some("root and iproute2 (`ip netns`)")
    } else if need_nft && !nft_available() {
        Some("nftables (`nft`)")
    } else {
        None
    };
    require_tool(test, missing)
}

/// What every "needs a system tool" check does: `true` when nothing is
/// `missing`; otherwise prints a skip note naming what is missing and
/// returns `false`, or panics when `UNIPLANE_REQUIRE_TOOLS=1` (CI, where
/// a test that skips would hide a missing install step).
pub fn require_tool(test: &str, missing: Option<&str>) -> bool {
    let Some(what) = missing else {
        return true;
    };
    if std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_some_and(|v| v == "1") {
        panic!("{test} needs {what} (UNIPLANE_REQUIRE_TOOLS=1)");
    }
    eprintln!("{test}: skipped, needs {what} (scripts/test.sh installs it)");
    false
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// Deletes namespaces (and their veths) left by runs that crashed: those
/// with this crate's prefix whose creating process is gone.
pub fn remove_leftovers() {
    let Ok(out) = run("ip", &["netns", "list"]) else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: Option<u32> = rest.split('x').next().and_then(|p| p.parse().ok());
        if pid.is_some_and(|p| !pid_alive(p)) {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace, deleted when dropped.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

impl Namespace {
    /// Creates a namespace named `upns<pid>x<n>`, unique in this process,
    /// with its loopback up.
    pub fn new() -> Result<Namespace, NetnsError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{}x{n}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        let ns = Namespace { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<Output, NetnsError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `f` on a new thread inside the namespace and returns its result.
    /// Sockets `f` opens belong to the namespace.
    pub fn run<F, R>(&self, f: F) -> Result<R, NetnsError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let entered = self.enter_on_thread(f)?;
        Ok(entered
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p)))
    }

    /// Starts `f` on a new thread inside the namespace.
    pub fn spawn<F, R>(&self, f: F) -> Result<std::thread::JoinHandle<R>, NetnsError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.enter_on_thread(f)
    }

    fn enter_on_thread<F, R>(&self, f: F) -> Result<std::thread::JoinHandle<R>, NetnsError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let path = format!("/var/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).map_err(|source| NetnsError::Setns {
            ns: self.name.clone(),
            source,
        })?;
        let name = self.name.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this thread only, with an open netns file.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            let ok = rc == 0;
            let _ = tx.send(if ok {
                None
            } else {
                Some(io::Error::last_os_error())
            });
            if !ok {
                panic!("setns failed");
            }
            f()
        });
        match rx.recv() {
            Ok(None) => Ok(handle),
            Ok(Some(source)) => Err(NetnsError::Setns { ns: name, source }),
            Err(_) => Err(NetnsError::Setns {
                ns: name,
                source: io::Error::other("thread died"),
            }),
        }
    }

    /// Drops `percent`% of UDP datagrams arriving on `iface` in this
    /// namespace, with nftables' random number generator.
    pub fn drop_udp_percent(&self, iface: &str, percent: u32) -> Result<(), NetnsError> {
        let nft = |args: &[&str]| {
            let mut all = vec!["netns", "exec", self.name.as_str(), "nft"];
            all.extend_from_slice(args);
            run("ip", &all)
        };
        nft(&["add", "table", "inet", "uniplane"])?;
        nft(&[
            "add",
            "chain",
            "inet",
            "uniplane",
            "inp",
            "{ type filter hook input priority 0; }",
        ])?;
        let pct = percent.to_string();
        nft(&[
            "add", "rule", "inet", "uniplane", "inp", "iifname", iface, "meta", "l4proto", "udp",
            "numgen", "random", "mod", "100", "<", &pct, "counter", "drop",
        ])?;
        Ok(())
    }
}

impl Namespace {
    fn nft(&self, args: &[&str]) -> Result<Output, NetnsError> {
        let mut all = vec!["netns", "exec", self.name.as_str(), "nft"];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops `percent`% of the frames of `ethertype` arriving on `iface`,
    /// in an nftables `netdev` ingress chain (table `uniplane_<iface>`),
    /// which sees every EtherType before the IP layer does.
    pub fn drop_ether_percent(
        &self,
        iface: &str,
        ethertype: u16,
        percent: u32,
    ) -> Result<(), NetnsError> {
        let table = format!("uniplane_{iface}");
        self.nft(&["add", "table", "netdev", &table])?;
        let hook = format!("{{ type filter hook ingress device \"{iface}\" priority 0; }}");
        self.nft(&["add", "chain", "netdev", &table, "ing", &hook])?;
        let (et, pct) = (format!("0x{ethertype:04x}"), percent.to_string());
        self.nft(&[
            "add", "rule", "netdev", &table, "ing", "ether", "type", &et, "numgen", "random",
            "mod", "100", "<", &pct, "counter", "drop",
        ])?;
        Ok(())
    }

    /// Frames the [`Namespace::drop_ether_percent`] rule of `iface` dropped.
    pub fn ether_dropped(&self, iface: &str) -> Result<u64, NetnsError> {
        let table = format!("uniplane_{iface}");
        let out = self.nft(&["list", "table", "netdev", &table])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let n = text
            .split("counter packets ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok());
        n.ok_or_else(|| NetnsError::Failed {
            cmd: format!("nft list table netdev {table}"),
            stderr: format!("no counter in: {text}"),
        })
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth ends inside it.
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

/// Two namespaces joined by a veth pair.
#[derive(Debug)]
pub struct Pair {
    /// The first namespace; its veth end is `iface_a` at `addr_a`.
    pub a: Namespace,
    /// The second namespace; its veth end is `iface_b` at `addr_b`.
    pub b: Namespace,
    /// Interface name in `a`.
    pub iface_a: String,
    /// Interface name in `b`.
    pub iface_b: String,
    /// Address of `a` on the link.
    pub addr_a: std::net::Ipv4Addr,
    /// Address of `b` on the link.
    pub addr_b: std::net::Ipv4Addr,
}

impl Pair {
    /// Two fresh namespaces on one veth link, `10.R.S.1` and `10.R.S.2`
    /// with R.S unique per pair in this process. Removes leftovers of
    /// crashed runs first.
    pub fn new() -> Result<Pair, NetnsError> {
        remove_leftovers();
        let a = Namespace::new()?;
        let b = Namespace::new()?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tag = (std::process::id() % 10_000) * 100 + n % 100;
        let (va, vb) = (format!("upa{tag}"), format!("upb{tag}"));
        run(
            "ip",
            &[
                "link",
                "add",
                &va,
                "netns",
                a.name(),
                "type",
                "veth",
                "peer",
                "name",
                &vb,
                "netns",
                b.name(),
            ],
        )?;
        let sub = (std::process::id() as u16).wrapping_add(n as u16);
        let (r, s) = (100 + (sub >> 8) as u8 % 100, sub as u8);
        let addr_a = std::net::Ipv4Addr::new(10, r, s, 1);
        let addr_b = std::net::Ipv4Addr::new(10, r, s, 2);
        a.ip(&["addr", "add", &format!("{addr_a}/24"), "dev", &va])?;
        b.ip(&["addr", "add", &format!("{addr_b}/24"), "dev", &vb])?;
        a.ip(&["link", "set", &va, "up"])?;
        b.ip(&["link", "set", &vb, "up"])?;
        Ok(Pair {
            a,
            b,
            iface_a: va,
            iface_b: vb,
            addr_a,
            addr_b,
        })
    }
}

/// Three namespaces in a row, `a — m — b`, joined by two veth pairs and
/// without addresses: the middle one forwards raw frames (a
/// [`frame_relay::FrameRelay`]), so `a` and `b` share one Ethernet segment
/// as far as frames go.
#[derive(Debug)]
pub struct Line {
    /// One end.
    pub a: Namespace,
    /// The middle.
    pub m: Namespace,
    /// The other end.
    pub b: Namespace,
    /// `a`'s interface (towards `m`).
    pub iface_a: String,
    /// `m`'s interface towards `a`.
    pub iface_ma: String,
    /// `m`'s interface towards `b`.
    pub iface_mb: String,
    /// `b`'s interface (towards `m`).
    pub iface_b: String,
}

impl Line {
    /// Three fresh namespaces joined `a — m — b`, every interface up.
    pub fn new() -> Result<Line, NetnsError> {
        remove_leftovers();
        let a = Namespace::new()?;
        let m = Namespace::new()?;
        let b = Namespace::new()?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tag = (std::process::id() % 10_000) * 100 + n % 100;
        let names = [
            format!("ula{tag}"),
            format!("ulma{tag}"),
            format!("ulmb{tag}"),
            format!("ulb{tag}"),
        ];
        for (x, (ns1, ns2)) in [(&a, &m), (&m, &b)].into_iter().enumerate() {
            let (v1, v2) = (&names[2 * x], &names[2 * x + 1]);
            run(
                "ip",
                &[
                    "link",
                    "add",
                    v1,
                    "netns",
                    ns1.name(),
                    "type",
                    "veth",
                    "peer",
                    "name",
                    v2,
                    "netns",
                    ns2.name(),
                ],
            )?;
        }
        for (ns, i) in [(&a, 0), (&m, 1), (&m, 2), (&b, 3)] {
            ns.ip(&["link", "set", &names[i], "up"])?;
        }
        let [iface_a, iface_ma, iface_mb, iface_b] = names;
        Ok(Line {
            a,
            m,
            b,
            iface_a,
            iface_ma,
            iface_mb,
            iface_b,
        })
    }
}
