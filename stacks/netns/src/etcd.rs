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
    crate::require_tool(
        test,
        (!found).then_some("etcd (apt-get install etcd-server)"),
    )
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
        if sig == libc::SIGSTOP {
            // kill(2) only queues the stop: a member on another CPU may
            // still commit a write before it halts. Return once each is
            // really stopped.
            let deadline = Instant::now() + Duration::from_secs(5);
            for m in &self.members[..n] {
                while !stopped(m.id()) {
                    assert!(
                        Instant::now() < deadline,
                        "etcd member {} not stopped",
                        m.id()
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// Whether process `pid` is stopped by a signal (state `T` in
/// `/proc/PID/stat`, the field after the command's closing parenthesis).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
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

/// Certificates for an etcd member and its clients, made with the
/// `openssl` command: a CA, a server certificate for `127.0.0.1`, and a
/// client certificate, all signed by the CA and valid for a day.
pub struct TestPki {
    /// The CA's certificate (PEM).
    pub ca: std::path::PathBuf,
    /// The member's certificate and key.
    pub server: (std::path::PathBuf, std::path::PathBuf),
    /// A client's certificate and key.
    pub client: (std::path::PathBuf, std::path::PathBuf),
}

impl TestPki {
    /// Writes a fresh PKI under `dir` (named `name`, so two can live side
    /// by side).
    pub fn create(dir: &Path, name: &str) -> Result<TestPki, String> {
        let p = |f: &str| dir.join(format!("{name}-{f}"));
        let openssl = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .map_err(|e| format!("openssl: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "openssl {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        };
        let s = |p: &std::path::PathBuf| p.display().to_string();
        let (ca, ca_key) = (p("ca.pem"), p("ca.key"));
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            &s(&ca_key),
            "-out",
            &s(&ca),
            "-subj",
            &format!("/CN={name}-test-ca"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])?;
        let issue =
            |who: &str, ext: &str| -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
                let (cert, key, csr, extf) = (
                    p(&format!("{who}.pem")),
                    p(&format!("{who}.key")),
                    p(&format!("{who}.csr")),
                    p(&format!("{who}.ext")),
                );
                std::fs::write(&extf, ext).map_err(|e| e.to_string())?;
                openssl(&[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &s(&key),
                    "-out",
                    &s(&csr),
                    "-subj",
                    &format!("/CN={who}"),
                ])?;
                openssl(&[
                    "x509",
                    "-req",
                    "-in",
                    &s(&csr),
                    "-CA",
                    &s(&ca),
                    "-CAkey",
                    &s(&ca_key),
                    "-CAcreateserial",
                    "-days",
                    "1",
                    "-out",
                    &s(&cert),
                    "-extfile",
                    &s(&extf),
                ])?;
                Ok((cert, key))
            };
        let server = issue(
            "etcd",
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )?;
        let client = issue(
            "uniplane",
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )?;
        Ok(TestPki { ca, server, client })
    }
}

impl EtcdCluster {
    /// One member on loopback that speaks only TLS to its clients and
    /// asks them for a certificate signed by `pki`'s CA.
    pub fn start_tls(dir: &Path, pki: &TestPki) -> EtcdCluster {
        let client = format!("https://127.0.0.1:{}", free_port());
        let peer = format!("http://127.0.0.1:{}", free_port());
        let member = Command::new("etcd")
            .args(["--name", "tls"])
            .arg("--data-dir")
            .arg(dir.join("etcd-tls"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("tls={peer}")])
            .arg("--cert-file")
            .arg(&pki.server.0)
            .arg("--key-file")
            .arg(&pki.server.1)
            .arg("--trusted-ca-file")
            .arg(&pki.ca)
            .arg("--client-cert-auth")
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        EtcdCluster {
            members: vec![member],
            clients: vec![client],
        }
    }
}
