//! The `[limits]` table: the bounds on the state clients and peers can
//! make the control core keep ([`uniplane_control::Limits`]).
//!
//! Each key of the table is one row of [`LIMIT_FIELDS`]: its name, its
//! range, and the field of `Limits` it sets. A new field of `Limits` is
//! one more row here, one more line in `default.toml` and the docs; the
//! test `every_field_of_limits_is_configurable` fails to compile until the
//! row exists.

use std::collections::BTreeMap;

use toml::Spanned;
use uniplane_control::Limits;

use super::bounds::Bounds;
use super::{ConfigError, Source};

/// One key of `[limits]`.
pub struct LimitField {
    /// Its name in the table (the field's name in [`Limits`]).
    pub name: &'static str,
    /// The values it may take.
    pub bounds: Bounds,
    /// The field of [`Limits`] it sets.
    pub field: fn(&mut Limits) -> &mut usize,
}

/// Every key of `[limits]`. A key left out keeps [`Limits::default`]'s
/// value, except `resources`, which defaults to `engine.max_ports` (a
/// resource beyond the engine's ports could not attach anyway).
pub const LIMIT_FIELDS: &[LimitField] = &[
    LimitField {
        name: "resources",
        bounds: Bounds::new(1, 65536).note("one per device number"),
        field: |l| &mut l.resources,
    },
    LimitField {
        name: "connections",
        bounds: Bounds::new(1, 1 << 20),
        field: |l| &mut l.connections,
    },
    LimitField {
        name: "pending_per_peer",
        bounds: Bounds::new(1, 65536),
        field: |l| &mut l.pending_per_peer,
    },
    LimitField {
        name: "connections_per_peer",
        bounds: Bounds::new(1, 1 << 20),
        field: |l| &mut l.connections_per_peer,
    },
    LimitField {
        name: "listening_per_resource",
        bounds: Bounds::new(1, 65536).note("every port"),
        field: |l| &mut l.listening_per_resource,
    },
    LimitField {
        name: "peers",
        bounds: Bounds::new(1, 65536),
        field: |l| &mut l.peers,
    },
    LimitField {
        name: "shared_per_resource",
        bounds: Bounds::new(0, 4096),
        field: |l| &mut l.shared_per_resource,
    },
    LimitField {
        name: "shared_mib",
        bounds: Bounds::new(0, 1 << 20),
        field: |l| &mut l.shared_mib,
    },
];

/// The `[limits]` table as written: key → value, each with its place.
pub(super) type RawLimits = BTreeMap<Spanned<String>, Spanned<i64>>;

/// The limits `raw` sets over `base`; unknown keys and values out of
/// range are refused.
pub(super) fn parse(
    src: &Source<'_>,
    raw: &RawLimits,
    base: Limits,
) -> Result<Limits, ConfigError> {
    let mut limits = base;
    for (key, value) in raw {
        let Some(f) = LIMIT_FIELDS.iter().find(|f| f.name == key.get_ref()) else {
            let known: Vec<&str> = LIMIT_FIELDS.iter().map(|f| f.name).collect();
            return src.invalid(
                key.span(),
                &format!("limits.{}", key.get_ref()),
                format!("unknown limit: expected one of {}", known.join(", ")),
            );
        };
        *(f.field)(&mut limits) = src.number(value, &format!("limits.{}", f.name), f.bounds)?;
    }
    Ok(limits)
}
