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
