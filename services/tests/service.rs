//! `uniplaned` as a service manager runs it: readiness told on
//! `NOTIFY_SOCKET` once its sockets answer, SIGHUP re-reading the file
//! (access rules applied live, other changes refused and named), SIGTERM
//! closing every connection with a notice before it exits.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use uniplane_services::client::{Client, ClientError, Session};

const WAIT: Duration = Duration::from_secs(10);

struct Service {
    child: Child,
    dir: PathBuf,
    config: PathBuf,
    runtime: PathBuf,
    notes: UnixDatagram,
    log: mpsc::Receiver<String>,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(runtime: &Path, name: &str, rules: &str) -> String {
    format!(
        "[server]\nid = \"127.0.0.1\"\nname = \"{name}\"\npeer_listen = \"127.0.0.1:0\"\n\n\
         [runtime]\ndir = \"{}\"\n\n[policy]\ndefault = \"allow\"\n{rules}",
        runtime.display()
    )
}

impl Service {
    fn start(tag: &str) -> Service {
        let dir =
            std::env::temp_dir().join(format!("uniplane-service-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let runtime = dir.join("run");
        let config_path = dir.join("uniplaned.toml");
        std::fs::write(&config_path, config(&runtime, "svc", "")).unwrap();
        let notify_path = dir.join("notify.sock");
        let notes = UnixDatagram::bind(&notify_path).unwrap();
        notes.set_read_timeout(Some(WAIT)).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_uniplaned"))
            .arg("--config")
            .arg(&config_path)
            .env("NOTIFY_SOCKET", &notify_path)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("uniplaned starts");
        let (tx, log) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Service {
            child,
            dir,
            config: config_path,
            runtime,
            notes,
            log,
        }
    }

    /// The next notification to the service manager (bounded wait).
    fn note(&self) -> String {
        let mut buf = [0u8; 512];
        let n = self.notes.recv(&mut buf).expect("a notification in time");
        String::from_utf8_lossy(&buf[..n]).trim().to_string()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill with a signal number on our own child's pid.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) },
            0
        );
    }

    /// Waits (bounded) for a log line containing `needle`.
    fn logged(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.log.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => continue,
                Err(_) => panic!("no log line with {needle:?} in time"),
            }
        }
    }

    async fn session(&self, name: &str) -> Session {
        Client::connect(&self.runtime)
            .await
            .unwrap()
            .attach(name)
            .await
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_reload_and_stop_as_a_service_manager_sees_them() {
    let mut svc = Service::start("lifecycle");
    assert_eq!(svc.note(), "READY=1");
    // Ready means the control socket answers.
    let server = svc.session("server").await;
    let banned = svc.session("banned").await;
    let kept = svc.session("kept").await;
    let mut listener = server.listen(80).await.unwrap();
    let mut from_banned = banned.connect(server.uid().port(80)).await.unwrap();
    let mut from_kept = kept.connect(server.uid().port(80)).await.unwrap();
    let mut accepted = Vec::new();
    for _ in 0..2 {
        accepted.push(
            tokio::time::timeout(WAIT, listener.accept())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    from_banned
        .send_push(Bytes::from_static(b"hi"))
        .await
        .unwrap();

    // A rule against one client, applied by SIGHUP: its connection is
    // closed with Denied, a new one refused; the other stays.
    let rule = format!(
        "\n[[policy.rules]]\nsrc = \"{}\"\ndst = \"*\"\ntypes = [\"CONNECT\"]\naction = \"deny\"\n",
        banned.uid()
    );
    std::fs::write(&svc.config, config(&svc.runtime, "svc", &rule)).unwrap();
    svc.signal(libc::SIGHUP);
    assert_eq!(svc.note(), "RELOADING=1");
    assert_eq!(svc.note(), "READY=1");
    svc.logged("reloaded: access rules applied");
    let end = tokio::time::timeout(WAIT, from_banned.recv())
        .await
        .expect("the banned connection ends in time");
    assert!(matches!(end, Some(Err(_))), "{end:?}");
    match banned.connect(server.uid().port(80)).await {
        Err(ClientError::Daemon { kind, .. }) => assert_eq!(kind, "denied"),
        other => panic!("expected denied, got {other:?}"),
    }
    from_kept
        .send_push(Bytes::from_static(b"still here"))
        .await
        .unwrap();

    // A change only a restart can make: refused, named, nothing applied.
    std::fs::write(&svc.config, config(&svc.runtime, "renamed", "")).unwrap();
    svc.signal(libc::SIGHUP);
    assert_eq!(svc.note(), "RELOADING=1");
    assert_eq!(svc.note(), "READY=1");
    let refused = svc.logged("reload refused");
    assert!(refused.contains("server.name"), "{refused}");
    match banned.connect(server.uid().port(80)).await {
        Err(ClientError::Daemon { kind, .. }) => assert_eq!(kind, "denied"),
        other => panic!("the old rules still hold, got {other:?}"),
    }

    // SIGTERM: every connection is closed with a notice, then it exits.
    svc.signal(libc::SIGTERM);
    assert_eq!(svc.note(), "STOPPING=1");
    let end = tokio::time::timeout(WAIT, from_kept.recv())
        .await
        .expect("the kept connection hears of the stop");
    assert!(end.is_none(), "a clean close, not a failure: {end:?}");
    let status = tokio::task::spawn_blocking(move || {
        let status = svc.child.wait();
        (svc, status)
    })
    .await
    .unwrap()
    .1
    .unwrap();
    assert!(status.success(), "{status:?}");
}
