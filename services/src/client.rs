//! The client library, re-exported from `uniplane-client` (applications
//! link that crate, never this one), plus [`embedded`]: a daemon inside
//! the application.

use std::path::Path;

pub use uniplane_client::*;

/// Runs a daemon inside this process (its sockets in `runtime`) and
/// returns it with a client connected to it: uniplane without a separate
/// daemon.
pub async fn embedded(
    mut config: crate::Config,
    runtime: &Path,
) -> Result<(crate::Daemon, Client), ClientError> {
    config.runtime_dir = Some(runtime.to_owned());
    let daemon = crate::Daemon::start(config)
        .await
        .map_err(|e| ClientError::Daemon {
            kind: "start".into(),
            message: e.to_string(),
        })?;
    let client = Client::connect(daemon.runtime_dir()).await?;
    Ok((daemon, client))
}

/// Daemons on a thread of their own, with a runtime of their own: the
/// thread can be one inside a network namespace (the caller's `spawn`
/// decides), and dropping the handle ends every task of the daemons at
/// once, as if their process had died (leases unrenewed, channels cut).
pub struct Detached {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Detached {
    /// Starts a daemon for each configuration (its `runtime_dir` set) on a
    /// thread `spawn` starts, and waits until all answer or one fails.
    pub fn start<S>(configs: Vec<crate::Config>, spawn: S) -> Result<Detached, String>
    where
        S: FnOnce(Box<dyn FnOnce() + Send>) -> std::io::Result<std::thread::JoinHandle<()>>,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (started, result) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = spawn(Box::new(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started.send(Err(e.to_string()));
                    return;
                }
            };
            rt.block_on(async move {
                let mut running = Vec::new();
                for config in configs {
                    match crate::Daemon::start(config).await {
                        Ok(d) => running.push(d),
                        Err(e) => {
                            let _ = started.send(Err(e.to_string()));
                            return;
                        }
                    }
                }
                let _ = started.send(Ok(()));
                let _ = stopped.await;
                for d in &running {
                    d.shutdown();
                }
            });
        }))
        .map_err(|e| e.to_string())?;
        let detached = Detached {
            stop: Some(stop),
            thread: Some(thread),
        };
        result
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| Err("the daemons did not start in time".into()))?;
        Ok(detached)
    }

    /// Ends the daemons now (what dropping does).
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        self.stop();
    }
}
