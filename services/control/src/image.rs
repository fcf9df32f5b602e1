//! What the core believes the plane holds, and the operations that turn
//! one such picture into another.
//!
//! The core never edits plane entries one by one: after each decision it
//! computes the picture its state calls for ([`PlaneImage`]) and submits
//! the difference from what is installed. So an entry exists exactly when
//! a live resource, connection or tunnel calls for it, and a rollback is
//! the same difference taken back.

use std::collections::{BTreeMap, HashMap, HashSet};

use uniplane_overlay::acl::{AclRule, ConnKey};
use uniplane_overlay::table::Route;
use uniplane_overlay::PortId;

use crate::PlaneOp;

/// The entries of one port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortImage {
    /// Routes by (key & mask, mask): the table replaces on that pair.
    pub routes: BTreeMap<(u64, u64), Route>,
    /// Admitted connections, each in its stored direction (the plane
    /// admits both).
    pub allows: HashSet<ConnKey>,
    /// Connectionless rules, in order.
    pub rules: Vec<AclRule>,
}

impl PortImage {
    /// Adds or replaces a route.
    pub fn route(&mut self, r: Route) {
        self.routes.insert((r.key.to_u64() & r.mask, r.mask), r);
    }
}

/// Every entry of every port the core owns, and the translations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlaneImage {
    /// Attached ports and their entries.
    pub ports: BTreeMap<PortId, PortImage>,
    /// Translator entries: connection (this direction) → output port.
    pub translations: HashMap<ConnKey, PortId>,
}

impl PlaneImage {
    /// The operations that turn `self` into `target`. Ports of `target`
    /// missing here are not attached (attaching is the caller's step):
    /// their entries are skipped. Removals come first, then detaches, then
    /// additions, so no entry ever points at a port being taken away.
    pub fn diff(&self, target: &PlaneImage) -> Vec<PlaneOp> {
        let mut removals = Vec::new();
        let mut additions = Vec::new();
        for (conn, port) in &self.translations {
            if target.translations.get(conn) != Some(port) {
                removals.push(PlaneOp::RemoveTranslation(*conn));
            }
        }
        for (&id, have) in &self.ports {
            let Some(want) = target.ports.get(&id) else {
                continue;
            };
            for (k, r) in &have.routes {
                match want.routes.get(k) {
                    None => removals.push(PlaneOp::RemoveRoute(id, r.key, r.mask)),
                    Some(w) if w != r => additions.push(PlaneOp::AddRoute(id, *w)),
                    Some(_) => {}
                }
            }
            for (k, w) in &want.routes {
                if !have.routes.contains_key(k) {
                    additions.push(PlaneOp::AddRoute(id, *w));
                }
            }
            for c in have.allows.difference(&want.allows) {
                removals.push(PlaneOp::Revoke(id, *c));
            }
            for c in want.allows.difference(&have.allows) {
                additions.push(PlaneOp::Allow(id, *c));
            }
            if have.rules != want.rules {
                let keep = have.rules.len() <= want.rules.len()
                    && want.rules[..have.rules.len()] == have.rules[..];
                let from = if keep {
                    have.rules.len()
                } else {
                    removals.push(PlaneOp::ClearRules(id));
                    0
                };
                for r in &want.rules[from..] {
                    additions.push(PlaneOp::AddRule(id, *r));
                }
            }
        }
        for id in self.ports.keys() {
            if !target.ports.contains_key(id) {
                removals.push(PlaneOp::Detach(*id));
            }
        }
        for (conn, port) in &target.translations {
            if self.translations.get(conn) != Some(port) && self.ports.contains_key(port) {
                additions.push(PlaneOp::AddTranslation(*conn, *port));
            }
        }
        removals.extend(additions);
        removals
    }

    /// Records that `op` took effect.
    pub fn apply(&mut self, op: &PlaneOp) {
        match op {
            PlaneOp::Detach(p) => {
                self.ports.remove(p);
            }
            PlaneOp::AddRoute(p, r) => {
                if let Some(port) = self.ports.get_mut(p) {
                    port.route(*r);
                }
            }
            PlaneOp::RemoveRoute(p, key, mask) => {
                if let Some(port) = self.ports.get_mut(p) {
                    port.routes.remove(&(key.to_u64() & mask, *mask));
                }
            }
            PlaneOp::Allow(p, c) => {
                if let Some(port) = self.ports.get_mut(p) {
                    port.allows.insert(*c);
                }
            }
            PlaneOp::Revoke(p, c) => {
                if let Some(port) = self.ports.get_mut(p) {
                    port.allows.remove(c);
                    port.allows.remove(&c.reversed());
                }
            }
            PlaneOp::AddRule(p, r) => {
                if let Some(port) = self.ports.get_mut(p) {
                    port.rules.push(*r);
                }
            }
            PlaneOp::ClearRules(p) => {
                if let Some(port) = self.ports.get_mut(p) {
                    port.rules.clear();
                }
            }
            PlaneOp::AddTranslation(c, p) => {
                self.translations.insert(*c, *p);
            }
            PlaneOp::RemoveTranslation(c) => {
                self.translations.remove(c);
            }
            PlaneOp::Attach(_)
            | PlaneOp::AttachIo(..)
            | PlaneOp::SetDefault(..)
            | PlaneOp::SetPolicy(..)
            | PlaneOp::Counters(_)
            | PlaneOp::Dump(_)
            | PlaneOp::ConnCounters(_)
            | PlaneOp::Translations
            | PlaneOp::MovePort(..) => {}
        }
    }

    /// Entries in all (routes, allows, rules, translations).
    pub fn len(&self) -> usize {
        self.translations.len()
            + self
                .ports
                .values()
                .map(|p| p.routes.len() + p.allows.len() + p.rules.len())
                .sum::<usize>()
    }

    /// Whether no port is attached and no translation held.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.translations.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_dataplane::Uid;

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    #[test]
    fn the_diff_of_a_picture_to_itself_is_empty_and_applying_a_diff_reaches_the_target() {
        let mut a = PlaneImage::default();
        a.ports.insert(1, PortImage::default());
        a.ports.insert(2, PortImage::default());
        let mut b = a.clone();
        b.ports
            .get_mut(&1)
            .unwrap()
            .route(Route::exact(uid("1.1.1.1:2"), 2));
        b.ports.get_mut(&1).unwrap().rules.push(AclRule::ALLOW_ALL);
        let conn = ConnKey {
            src: uid("1.1.1.1:1"),
            src_port: 1,
            dst: uid("2.2.2.2:1"),
            dst_port: 2,
        };
        b.ports.get_mut(&2).unwrap().allows.insert(conn);
        b.translations.insert(conn, 2);
        b.ports.remove(&1);
        assert!(a.diff(&a).is_empty());
        let ops = a.diff(&b);
        let mut c = a.clone();
        for op in &ops {
            c.apply(op);
        }
        assert_eq!(c, b);
        assert!(ops.iter().any(|o| matches!(o, PlaneOp::Detach(1))));
    }
}
