//! A real etcd cluster for tests of the naming service: `n` members of
//! Debian's `etcd-server` on one host address (loopback, or a namespace's
//! veth address when started with [`crate::Namespace::command`]), killed
//! on drop.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// Whether `etcd` runs here; when it does not, prints a skip note and
/// returns `false`, or panics when `UNIPLANE_REQUIRE_TOOLS=1`.
pub fn require(test: &str) -> bool {
    let found = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_some_and(|v| v == "1") {
            panic!("{test} needs etcd (apt-get install etcd-server; UNIPLANE_REQUIRE_TOOLS=1)");
        }
        eprintln!("{test}: skipped, needs etcd (scripts/test.sh installs it)");
    }
    found
}

/// The members of one etcd cluster.
pub struct EtcdCluster {
    members: Vec<Child>,
    /// Each member's client URL (`http://HOST:PORT`).
    pub clients: Vec<String>,
}

impl EtcdCluster {
    /// `n` members on `host`, their data under `dir`, each started by
    /// `etcd()` (a command that runs `etcd`: `Command::new("etcd")`, or
    /// [`crate::Namespace::command`] for one inside a namespace). Short
    /// heartbeats and elections, so a lost leader is replaced in about a
    /// second.
    pub fn start(dir: &Path, host: Ipv4Addr, n: usize, etcd: impl Fn() -> Command) -> EtcdCluster {
        let peers: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let clients: Vec<String> = (0..n)
            .map(|_| format!("http://{host}:{}", free_port()))
            .collect();
        let initial = (0..n)
            .map(|i| format!("m{i}=http://{host}:{}", peers[i]))
            .collect::<Vec<_>>()
            .join(",");
        let members = (0..n)
            .map(|i| {
                let peer = format!("http://{host}:{}", peers[i]);
                etcd()
                    .args(["--name", &format!("m{i}")])
                    .arg("--data-dir")
                    .arg(dir.join(format!("etcd-m{i}")))
                    .args(["--listen-client-urls", &clients[i]])
                    .args(["--advertise-client-urls", &clients[i]])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &initial])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", "uniplane-test"])
                    .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                    .args(["--logger", "zap", "--log-level", "error"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("etcd starts")
            })
            .collect();
        EtcdCluster { members, clients }
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the first `n` members: a
    /// frozen member keeps its sockets and answers nothing.
    pub fn signal(&self, n: usize, sig: libc::c_int) {
        for m in &self.members[..n] {
            // SAFETY: kill(2) on our own child's pid.
            let r = unsafe { libc::kill(m.id() as libc::pid_t, sig) };
            assert_eq!(r, 0, "signal etcd");
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.signal(self.members.len(), libc::SIGCONT);
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

/// Waits (at most `within`) until every member at `clients` says it is
/// healthy (`GET /health`: it has a leader and answers reads); run it
/// where the members are reachable (inside their namespace's neighbour,
/// say, with [`crate::Namespace::run`]).
pub fn wait_healthy(clients: &[String], within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    for url in clients {
        let addr: SocketAddr = url
            .strip_prefix("http://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("{url}: not http://ADDRESS:PORT"))?;
        loop {
            if healthy(addr) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("etcd at {url} is not healthy"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

fn healthy(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.take(4096).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.starts_with("HTTP/1.") && text.contains("\"health\":\"true\"")
}
