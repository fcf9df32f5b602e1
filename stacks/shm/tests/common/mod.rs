//! Helpers the cross-process tests share: messages, bounded waits, and a
//! child process (this test binary again) that is always reaped.
#![allow(dead_code)]

use std::future::Future;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_dataplane::{Message, Uid};

/// Environment variable naming the child's role.
pub const ROLE_VAR: &str = "UNIPLANE_SHM_CHILD";
/// Environment variable with the socket path the child connects to.
pub const PATH_VAR: &str = "UNIPLANE_SHM_PATH";

/// A SEND whose sequence number and payload say `i`.
pub fn msg(i: u32, payload_len: usize) -> Message {
    let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
    let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
    let mut payload = vec![(i % 251) as u8; payload_len];
    let n = payload_len.min(4);
    payload[..n].copy_from_slice(&i.to_be_bytes()[..n]);
    let mut m = Message::send(a, b, Bytes::from(payload)).unwrap();
    m.set_seqnum(i);
    m
}

/// Runs `f`, failing the test if it takes longer than `secs` seconds.
pub async fn within<F: Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

/// A fresh socket path in the temporary directory.
pub fn socket_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "uniplane-shm-test-{}-{tag}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

/// The test binary running one test in another process; killed and
/// reaped when dropped.
pub struct ChildProcess(std::process::Child);

impl ChildProcess {
    /// Starts this binary's `test_name` test with `role` and `path` in its
    /// environment.
    pub fn spawn_test(test_name: &str, role: &str, path: &Path) -> ChildProcess {
        let exe = std::env::current_exe().expect("test binary path");
        let child = Command::new(exe)
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .env(PATH_VAR, path)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn child");
        ChildProcess(child)
    }

    /// Starts the `child_role` test with `role`.
    pub fn spawn(role: &str, path: &Path) -> ChildProcess {
        Self::spawn_test("child_role", role, path)
    }

    /// Waits up to `limit` for the child to exit; its exit code, or `None`
    /// if it had to be killed (or died of a signal).
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        loop {
            match self.0.try_wait() {
                Ok(Some(status)) => return status.code(),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = self.0.kill();
                    let _ = self.0.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}
