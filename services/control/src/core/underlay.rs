//! What the core decides for the underlay of the tunnels: which traffic
//! classes a connection may name, and what a filter violation closes.

use super::*;

impl Control {
    /// Whether a connection between us and `peer` (`None`: a local one)
    /// may be of `class`.
    pub(super) fn class_allowed(
        &self,
        class: u8,
        peer: Option<Ipv4Addr>,
    ) -> Result<(), ControlError> {
        if !self.config.classes.contains(&class) {
            return Err(ControlError::Refused(format!(
                "no traffic class {class} (the configured classes are {:?})",
                self.config.classes
            )));
        }
        let spec = peer.and_then(|s| self.config.peers.iter().find(|p| p.server == s));
        if let Some(p) = spec {
            if !p.classes.contains(&class) {
                return Err(ControlError::Denied(format!(
                    "traffic class {class} is not allowed between {} and this server",
                    p.server
                )));
            }
        }
        Ok(())
    }

    /// The underlay dropped a message from `server` that broke its rules:
    /// DUA's rule is to disconnect the connection it claims to belong to
    /// and tell its owner. The message came in, so `src` is the far end
    /// and `dst` ours.
    pub(super) fn violation(
        &mut self,
        server: Ipv4Addr,
        src: Uid,
        dst: Uid,
        ports: Option<(u16, u16)>,
    ) {
        let mut claimed: Vec<ConnKey> = self
            .connections
            .values()
            .filter(|c| c.peer == Some(server))
            .map(|c| c.key)
            .filter(|k| {
                let joins = |a: Uid, ap: u16, b: Uid, bp: u16| {
                    a == src && b == dst && ports.is_none_or(|(sp, dp)| (ap, bp) == (sp, dp))
                };
                joins(k.src, k.src_port, k.dst, k.dst_port)
                    || joins(k.dst, k.dst_port, k.src, k.src_port)
            })
            .collect();
        claimed.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        tracing::warn!(
            %server, %src, %dst, ?ports, closed = claimed.len(),
            "the underlay dropped a message that broke its rules"
        );
        if claimed.is_empty() {
            return;
        }
        for key in claimed {
            self.drop_connection(key, Status::Denied, true);
        }
        self.sync(Then::nothing());
    }
}
