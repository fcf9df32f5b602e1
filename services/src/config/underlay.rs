//! The underlay of the tunnels to peer servers (DUA §7.3): the traffic
//! classes and how they share a peer's tunnels (`[underlay]`,
//! `[[classes]]`), and what each peer may send (`[[peers]]`'s `classes`,
//! `types`, `max_message`, `sources`).
//!
//! ```toml
//! [underlay]
//! scheduling = "weighted"   # or "priority": lower priority first, weights inside one
//! rate_mbit = 1000          # shape each peer's tunnels to 1 Gb/s; 0: unshaped
//! burst_kib = 64
//! queue_depth = 256         # messages per class waiting for the shaper
//!
//! [[classes]]
//! id = 0
//! weight = 1
//! [[classes]]
//! id = 1
//! weight = 3
//! ```

use serde::Deserialize;
use toml::Spanned;
use uniplane_dataplane::wire::ReqType;

use super::bounds::Bounds;
use super::{ConfigError, Source, UidPattern};

/// Traffic classes a configuration may define: 0 to 7, as 802.1p has.
pub const MAX_CLASSES: usize = 8;

/// `underlay.rate_mbit`: 0 (unshaped) up to 400 Gb/s.
pub const RATE_MBIT: Bounds = Bounds::new(0, 400_000);
/// `underlay.burst_kib`: at least one large message, at most 64 MiB.
pub const BURST_KIB: Bounds = Bounds::new(64, 65_536);
/// `underlay.queue_depth`: messages per class queue.
pub const QUEUE_DEPTH: Bounds = Bounds::new(1, 65_536);
/// `classes.id`.
pub const CLASS_ID: Bounds = Bounds::new(0, MAX_CLASSES as u64 - 1);
/// `classes.weight`: 0 would starve the class.
pub const WEIGHT: Bounds = Bounds::new(1, 1_000_000);
/// `classes.priority`: 0 is served first.
pub const PRIORITY: Bounds = Bounds::new(0, 7);
/// `peers.max_message`: a header and as much payload as a message holds.
pub const MAX_MESSAGE: Bounds = Bounds::new(64, 65_600);

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUnderlay {
    scheduling: Option<Spanned<String>>,
    rate_mbit: Option<Spanned<i64>>,
    burst_kib: Option<Spanned<i64>>,
    queue_depth: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClass {
    id: Spanned<i64>,
    name: Option<String>,
    weight: Option<Spanned<i64>>,
    priority: Option<Spanned<i64>>,
}

/// What a peer's section says about what it sends.
pub(super) struct RawIngress<'a> {
    pub classes: Option<&'a [Spanned<i64>]>,
    pub types: Option<&'a [Spanned<String>]>,
    pub max_message: Option<&'a Spanned<i64>>,
    pub sources: Option<&'a [Spanned<String>]>,
}

/// How the classes share a peer's tunnels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheduling {
    /// Bytes in proportion to the weights.
    Weighted,
    /// The lowest priority number first; weights share a priority.
    Priority,
}

/// One traffic class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassConfig {
    /// Its number (a connection names it; a tunnel carries one).
    pub id: u8,
    /// A name for listings.
    pub name: String,
    /// Its share of a peer's tunnels, against the other classes'.
    pub weight: u32,
    /// Under `scheduling = "priority"`: 0 is served first.
    pub priority: u8,
}

/// The `[underlay]` table and the classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnderlayConfig {
    /// How classes share.
    pub scheduling: Scheduling,
    /// Each peer's tunnels together leave at most this many bytes per
    /// second; `None`: unshaped.
    pub rate: Option<u64>,
    /// Bytes that may leave back to back.
    pub burst: u64,
    /// Messages per class waiting for the shaper.
    pub queue_depth: usize,
    /// The classes, by id; class 0 always exists.
    pub classes: Vec<ClassConfig>,
}

impl Default for UnderlayConfig {
    /// Unshaped; the eight classes, each of weight 1.
    fn default() -> Self {
        UnderlayConfig {
            scheduling: Scheduling::Weighted,
            rate: None,
            burst: 64 * 1024,
            queue_depth: 256,
            classes: (0..MAX_CLASSES as u8)
                .map(|id| ClassConfig {
                    id,
                    name: format!("class-{id}"),
                    weight: 1,
                    priority: 0,
                })
                .collect(),
        }
    }
}

impl UnderlayConfig {
    /// The class numbered `id`.
    pub fn class(&self, id: u8) -> Option<&ClassConfig> {
        self.classes.iter().find(|c| c.id == id)
    }
}

/// What one peer may send us; a message that breaks a rule is dropped,
/// counted and reported, and the connection it claims is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressRules {
    /// Classes it may open tunnels of (and connections in).
    pub classes: Vec<u8>,
    /// Request types it may send; `None`: all.
    pub types: Option<Vec<ReqType>>,
    /// Largest message, header and payload, in bytes.
    pub max_message: usize,
    /// Resources whose messages it may carry: its own by default, and
    /// those of the servers reached through it (`[[remotes]]`).
    pub sources: Vec<UidPattern>,
    /// Whether the file gave `sources` (then nothing is added to them).
    pub sources_set: bool,
}

pub(super) fn parse(
    src: &Source<'_>,
    raw: &RawUnderlay,
    raw_classes: &[RawClass],
) -> Result<UnderlayConfig, ConfigError> {
    let scheduling = match raw.scheduling.as_ref() {
        None => Scheduling::Weighted,
        Some(s) => match s.get_ref().as_str() {
            "weighted" => Scheduling::Weighted,
            "priority" => Scheduling::Priority,
            other => {
                return src.invalid(
                    s.span(),
                    "underlay.scheduling",
                    format!("`{other}`: expected \"weighted\" or \"priority\""),
                )
            }
        },
    };
    let rate_mbit: u64 =
        src.number_or(raw.rate_mbit.as_ref(), 0, "underlay.rate_mbit", RATE_MBIT)?;
    let burst_kib: u64 =
        src.number_or(raw.burst_kib.as_ref(), 64, "underlay.burst_kib", BURST_KIB)?;
    let queue_depth = src.number_or(
        raw.queue_depth.as_ref(),
        256,
        "underlay.queue_depth",
        QUEUE_DEPTH,
    )?;
    let mut classes: Vec<ClassConfig> = Vec::new();
    for c in raw_classes {
        let id: u8 = src.number(&c.id, "classes.id", CLASS_ID)?;
        if classes.iter().any(|k| k.id == id) {
            return src.invalid(
                c.id.span(),
                "classes.id",
                format!("class {id} is defined twice"),
            );
        }
        classes.push(ClassConfig {
            id,
            name: c.name.clone().unwrap_or_else(|| format!("class-{id}")),
            weight: src.number_or(c.weight.as_ref(), 1, "classes.weight", WEIGHT)?,
            priority: src.number_or(c.priority.as_ref(), 0, "classes.priority", PRIORITY)?,
        });
    }
    if classes.is_empty() {
        classes = UnderlayConfig::default().classes;
    } else if !classes.iter().any(|c| c.id == 0) {
        return src.invalid(
            raw_classes[0].id.span(),
            "classes.id",
            "class 0 must be defined: it carries what names no class (the server routes)",
        );
    }
    classes.sort_by_key(|c| c.id);
    Ok(UnderlayConfig {
        scheduling,
        rate: (rate_mbit > 0).then_some(rate_mbit * 1_000_000 / 8),
        burst: burst_kib * 1024,
        queue_depth,
        classes,
    })
}

impl IngressRules {
    /// The rules of a peer the file does not describe (one the naming
    /// service's directory lists): every class, every request type, the
    /// largest message, and only its own resources as sources.
    pub fn default_for(peer: std::net::Ipv4Addr, underlay: &UnderlayConfig) -> IngressRules {
        IngressRules {
            classes: underlay.classes.iter().map(|c| c.id).collect(),
            types: None,
            max_message: MAX_MESSAGE.max as usize,
            sources: vec![UidPattern {
                key: uniplane_dataplane::Uid::new(peer, 0),
                mask: 0xffff_ffff << 16,
            }],
            sources_set: false,
        }
    }
}

/// A peer's ingress rules; `peer` is its server (its own resources are
/// the default sources).
pub(super) fn ingress(
    src: &Source<'_>,
    raw: &RawIngress<'_>,
    peer: std::net::Ipv4Addr,
    underlay: &UnderlayConfig,
) -> Result<IngressRules, ConfigError> {
    let classes = match raw.classes {
        None => underlay.classes.iter().map(|c| c.id).collect(),
        Some(list) => {
            let mut v = Vec::new();
            for c in list {
                let id: u8 = src.number(c, "peers.classes", CLASS_ID)?;
                if underlay.class(id).is_none() {
                    return src.invalid(
                        c.span(),
                        "peers.classes",
                        format!("class {id} is not defined in [[classes]]"),
                    );
                }
                v.push(id);
            }
            v
        }
    };
    let types = match raw.types {
        None => None,
        Some(list) => Some(super::request_types(src, list, "peers.types")?),
    };
    let sources = match raw.sources {
        None => vec![UidPattern {
            key: uniplane_dataplane::Uid::new(peer, 0),
            mask: 0xffff_ffff << 16,
        }],
        Some(list) => {
            let mut v = Vec::new();
            for s in list {
                match s.get_ref().parse() {
                    Ok(p) => v.push(p),
                    Err(e) => return src.invalid(s.span(), "peers.sources", e),
                }
            }
            v
        }
    };
    Ok(IngressRules {
        classes,
        types,
        sources_set: raw.sources.is_some(),
        max_message: src.number_or(
            raw.max_message,
            MAX_MESSAGE.max as usize,
            "peers.max_message",
            MAX_MESSAGE,
        )?,
        sources,
    })
}
