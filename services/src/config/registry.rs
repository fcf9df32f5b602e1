//! `[registry]`: where names of resources and servers live — this daemon
//! alone (`kind = "local"`, the default) or an etcd cluster shared by
//! every daemon (`kind = "etcd"`).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::bounds::Bounds;
use super::{ConfigError, Source};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegistry {
    kind: Option<Spanned<String>>,
    endpoints: Option<Spanned<Vec<Spanned<String>>>>,
    prefix: Option<Spanned<String>>,
    lease_ttl_s: Option<Spanned<i64>>,
    timeout_ms: Option<Spanned<i64>>,
    user: Option<Spanned<String>>,
    password_file: Option<Spanned<PathBuf>>,
    ca: Option<Spanned<PathBuf>>,
    cert: Option<Spanned<PathBuf>>,
    key: Option<Spanned<PathBuf>>,
    domain: Option<Spanned<String>>,
    discover: Option<Spanned<bool>>,
}

/// Where names live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RegistryConfig {
    /// In this daemon only: names resolve to its own resources.
    #[default]
    Local,
    /// In an etcd cluster every daemon shares.
    Etcd(Box<EtcdConfig>),
}

/// How to reach the etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Its members' client URLs (`http://` or `https://`).
    pub endpoints: Vec<String>,
    /// Key prefix of this cluster's directory (`/uniplane`).
    pub prefix: String,
    /// Time to live of this daemon's lease: how long its names outlive it.
    pub lease_ttl: Duration,
    /// Bound on each request to etcd.
    pub timeout: Duration,
    /// User and the file holding its password, for etcd's authentication.
    pub credentials: Option<(String, PathBuf)>,
    /// The CA that signed the members' certificates (TLS).
    pub ca: Option<PathBuf>,
    /// This daemon's client certificate and key (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the members' certificates carry, when it is not the
    /// endpoints' host.
    pub domain: Option<String>,
    /// Whether every server the directory lists is a peer (reached over
    /// the first of this daemon's IP stacks it also runs), joining and
    /// leaving as its record does. Default: on when the file names a
    /// cluster secret (peers must prove it).
    pub discover: bool,
}

const ENDPOINTS: Bounds = Bounds::new(1, 16);
const LEASE_TTL_S: Bounds = Bounds::new(1, 3600);
const TIMEOUT_MS: Bounds = Bounds::new(50, 60_000);

pub(super) fn parse(
    src: &Source<'_>,
    raw: &RawRegistry,
    secret: bool,
) -> Result<RegistryConfig, ConfigError> {
    let kind = raw.kind.as_ref();
    match kind.map(|k| k.get_ref().as_str()) {
        None | Some("local") => {
            let extra = raw.endpoints.as_ref().map(|e| e.span());
            if let Some(span) = extra {
                return src.invalid(span, "registry.endpoints", "set only with kind = \"etcd\"");
            }
            return Ok(RegistryConfig::Local);
        }
        Some("etcd") => {}
        Some(other) => {
            return src.invalid(
                kind.expect("matched").span(),
                "registry.kind",
                format!("`{other}`: expected \"local\" or \"etcd\""),
            )
        }
    }
    let kind_span = kind.expect("etcd").span();
    let Some(list) = raw.endpoints.as_ref() else {
        return src.invalid(
            kind_span,
            "registry.endpoints",
            "kind = \"etcd\" needs the members' client URLs",
        );
    };
    let count = list.get_ref().len() as i64;
    if !ENDPOINTS.contains(count) {
        return src.invalid(
            list.span(),
            "registry.endpoints",
            format!("{count} endpoints: expected {ENDPOINTS}"),
        );
    }
    let tls = raw.ca.is_some() || raw.cert.is_some() || raw.domain.is_some();
    let mut endpoints = Vec::new();
    for e in list.get_ref() {
        let url = e.get_ref();
        let rest = url
            .strip_prefix("https://")
            .map(|r| (r, true))
            .or_else(|| url.strip_prefix("http://").map(|r| (r, false)));
        let Some((authority, secure)) = rest else {
            return src.invalid(
                e.span(),
                "registry.endpoints",
                format!("`{url}`: expected http://HOST:PORT or https://HOST:PORT"),
            );
        };
        let ok = authority.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !ok || authority.contains('/') {
            return src.invalid(
                e.span(),
                "registry.endpoints",
                format!("`{url}`: expected http://HOST:PORT or https://HOST:PORT"),
            );
        }
        if secure != tls {
            let why = if secure {
                "an https:// endpoint needs `ca` (the CA of the members' certificates)"
            } else {
                "TLS settings (ca, cert, domain) need https:// endpoints"
            };
            return src.invalid(e.span(), "registry.endpoints", why);
        }
        endpoints.push(url.clone());
    }
    let prefix = match raw.prefix.as_ref() {
        None => "/uniplane".to_owned(),
        Some(p) => {
            let v = p.get_ref();
            let bad = !v.starts_with('/')
                || v.ends_with('/')
                || v.len() > 128
                || v.chars().any(|c| c.is_whitespace() || c.is_control());
            if bad {
                return src.invalid(
                    p.span(),
                    "registry.prefix",
                    format!(
                        "`{v}`: expected a path like /uniplane (no trailing /, at most 128 bytes)"
                    ),
                );
            }
            v.clone()
        }
    };
    let ttl: u64 = src.number_or(
        raw.lease_ttl_s.as_ref(),
        5,
        "registry.lease_ttl_s",
        LEASE_TTL_S,
    )?;
    let timeout: u64 = src.number_or(
        raw.timeout_ms.as_ref(),
        1000,
        "registry.timeout_ms",
        TIMEOUT_MS,
    )?;
    let credentials = match (raw.user.as_ref(), raw.password_file.as_ref()) {
        (None, None) => None,
        (Some(u), Some(p)) => Some((u.get_ref().clone(), p.get_ref().clone())),
        (Some(u), None) => {
            return src.invalid(u.span(), "registry.user", "needs `password_file` beside it")
        }
        (None, Some(p)) => {
            return src.invalid(p.span(), "registry.password_file", "needs `user` beside it")
        }
    };
    let identity = match (raw.cert.as_ref(), raw.key.as_ref()) {
        (None, None) => None,
        (Some(c), Some(k)) => Some((c.get_ref().clone(), k.get_ref().clone())),
        (Some(c), None) => return src.invalid(c.span(), "registry.cert", "needs `key` beside it"),
        (None, Some(k)) => return src.invalid(k.span(), "registry.key", "needs `cert` beside it"),
    };
    if identity.is_some() && raw.ca.is_none() {
        return src.invalid(
            raw.cert.as_ref().expect("identity").span(),
            "registry.cert",
            "a client certificate needs `ca` too",
        );
    }
    let discover = match raw.discover.as_ref() {
        None => secret,
        Some(d) if *d.get_ref() && !secret => {
            return src.invalid(
                d.span(),
                "registry.discover",
                "peers found in the directory must prove the cluster secret: name one in [cluster] secret",
            )
        }
        Some(d) => *d.get_ref(),
    };
    Ok(RegistryConfig::Etcd(Box::new(EtcdConfig {
        discover,
        endpoints,
        prefix,
        lease_ttl: Duration::from_secs(ttl),
        timeout: Duration::from_millis(timeout),
        credentials,
        ca: raw.ca.as_ref().map(|c| c.get_ref().clone()),
        identity,
        domain: raw.domain.as_ref().map(|d| d.get_ref().clone()),
    })))
}
