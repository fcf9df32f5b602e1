//! The demultiplexer: which stack (or queue) an incoming message goes to.
//!
//! An ordered list of [`DemuxRule`]s, each a destination UID pattern and a
//! set of request types; the first rule that matches names the output,
//! as in a priority key/mask table. A message no rule matches is a miss:
//! it goes to the default output, or nowhere when there is none.

use uniplane_dataplane::wire::Header;

use crate::{TypeSet, UidMatch};

/// One classification rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DemuxRule {
    /// Destinations this rule takes.
    pub dst: UidMatch,
    /// Request types this rule takes.
    pub types: TypeSet,
    /// Output the matching messages go to.
    pub output: usize,
}

impl DemuxRule {
    /// Messages to `dst` of a type in `types` go to `output`.
    pub const fn new(dst: UidMatch, types: TypeSet, output: usize) -> DemuxRule {
        DemuxRule { dst, types, output }
    }

    /// Whether `header` matches.
    #[inline]
    pub const fn matches(&self, header: &Header) -> bool {
        self.dst.matches(header.dst) && self.types.contains(header.request.kind())
    }
}

/// Why rules cannot be installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DemuxError {
    /// A rule (or the default, `rule: None`) names an output that does not
    /// exist.
    #[error("{} names output {output}, but there are only {outputs}", match .rule { Some(i) => format!("rule {i}"), None => "the default".to_owned() })]
    NoSuchOutput {
        /// Index of the rule, or `None` for the default.
        rule: Option<usize>,
        /// The output named.
        output: usize,
        /// Outputs there are.
        outputs: usize,
    },
}

/// What a [`Demux`] has classified.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DemuxCounters {
    /// Messages classified.
    pub classified: u64,
    /// Messages no rule matched (sent to the default, if any).
    pub misses: u64,
    /// Misses with no default output: the caller drops them.
    pub dropped: u64,
}

/// Classifies incoming messages to one of `outputs` outputs.
#[derive(Clone, Debug)]
pub struct Demux {
    outputs: usize,
    rules: Vec<DemuxRule>,
    default: Option<usize>,
    hits: Vec<u64>,
    delivered: Vec<u64>,
    counters: DemuxCounters,
}

impl Demux {
    /// A demultiplexer over `outputs` outputs with `rules` (first match
    /// wins) and a `default` output for misses.
    pub fn new(
        outputs: usize,
        rules: Vec<DemuxRule>,
        default: Option<usize>,
    ) -> Result<Demux, DemuxError> {
        let mut demux = Demux {
            outputs,
            rules: Vec::new(),
            default: None,
            hits: Vec::new(),
            delivered: vec![0; outputs],
            counters: DemuxCounters::default(),
        };
        demux.set_rules(rules, default)?;
        Ok(demux)
    }

    /// Replaces the rules and the default; per-rule hit counts restart at
    /// zero, the other counters are kept. Nothing changes on error.
    pub fn set_rules(
        &mut self,
        rules: Vec<DemuxRule>,
        default: Option<usize>,
    ) -> Result<(), DemuxError> {
        let outputs = self.outputs;
        let bad = |rule, output| DemuxError::NoSuchOutput {
            rule,
            output,
            outputs,
        };
        if let Some((i, r)) = rules.iter().enumerate().find(|(_, r)| r.output >= outputs) {
            return Err(bad(Some(i), r.output));
        }
        if let Some(d) = default.filter(|&d| d >= outputs) {
            return Err(bad(None, d));
        }
        self.hits = vec![0; rules.len()];
        self.rules = rules;
        self.default = default;
        Ok(())
    }

    /// The output for a message with `header`, or `None` for a miss with
    /// no default (the caller drops it). Counts the outcome.
    #[inline]
    pub fn classify(&mut self, header: &Header) -> Option<usize> {
        self.counters.classified += 1;
        let output = match self.rules.iter().position(|r| r.matches(header)) {
            Some(i) => {
                self.hits[i] += 1;
                self.rules[i].output
            }
            None => {
                self.counters.misses += 1;
                match self.default {
                    Some(d) => d,
                    None => {
                        self.counters.dropped += 1;
                        return None;
                    }
                }
            }
        };
        self.delivered[output] += 1;
        Some(output)
    }

    /// The rules, in match order.
    pub fn rules(&self) -> &[DemuxRule] {
        &self.rules
    }

    /// The default output.
    pub fn default_output(&self) -> Option<usize> {
        self.default
    }

    /// Number of outputs.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// Messages each rule matched since the rules were installed.
    pub fn hits(&self) -> &[u64] {
        &self.hits
    }

    /// Messages sent to each output (default included).
    pub fn delivered(&self) -> &[u64] {
        &self.delivered
    }

    /// The counters.
    pub fn counters(&self) -> &DemuxCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_dataplane::wire::{ReqType, Request};
    use uniplane_dataplane::Uid;

    fn header(dst: &str, request: Request) -> Header {
        Header::new("9.9.9.9:9".parse().unwrap(), dst.parse().unwrap(), request)
    }

    fn send_to(dst: &str) -> Header {
        header(dst, Request::send(1, 2))
    }

    fn write_to(dst: &str) -> Header {
        header(dst, Request::write(0x1000, 0))
    }

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    /// Output 0: memory requests to device 5 of 10.0.0.1; output 1:
    /// anything else to 10.0.0.1; output 2: the default.
    fn demux() -> Demux {
        let memory = TypeSet::of(&[ReqType::Write, ReqType::Read, ReqType::Copy]);
        Demux::new(
            3,
            vec![
                DemuxRule::new(UidMatch::exact(uid("10.0.0.1:5")), memory, 0),
                DemuxRule::new(
                    UidMatch::server("10.0.0.1".parse().unwrap()),
                    TypeSet::ALL,
                    1,
                ),
            ],
            Some(2),
        )
        .unwrap()
    }

    #[test]
    fn a_message_matching_the_first_rule_goes_to_its_output() {
        let mut d = demux();
        assert_eq!(d.classify(&write_to("10.0.0.1:5")), Some(0));
        assert_eq!(d.hits(), &[1, 0]);
    }

    #[test]
    fn the_first_matching_rule_wins_over_later_ones() {
        let mut d = demux();
        // Matches the dst of rule 0 but not its types: rule 1 takes it.
        assert_eq!(d.classify(&send_to("10.0.0.1:5")), Some(1));
        assert_eq!(d.classify(&write_to("10.0.0.1:6")), Some(1));
        assert_eq!(d.hits(), &[0, 2]);
    }

    #[test]
    fn a_miss_goes_to_the_default_and_is_counted() {
        let mut d = demux();
        assert_eq!(d.classify(&send_to("10.0.0.2:5")), Some(2));
        assert_eq!(d.counters().misses, 1);
        assert_eq!(d.counters().dropped, 0);
        assert_eq!(d.delivered(), &[0, 0, 1]);
    }

    #[test]
    fn a_miss_without_a_default_is_dropped_and_counted() {
        let mut d = demux();
        d.set_rules(d.rules().to_vec(), None).unwrap();
        assert_eq!(d.classify(&send_to("10.0.0.2:5")), None);
        assert_eq!(d.classify(&send_to("10.0.0.1:5")), Some(1));
        assert_eq!(
            *d.counters(),
            DemuxCounters {
                classified: 2,
                misses: 1,
                dropped: 1
            }
        );
    }

    #[test]
    fn rules_naming_a_missing_output_are_refused_and_change_nothing() {
        let mut d = demux();
        let bad = vec![DemuxRule::new(UidMatch::ANY, TypeSet::ALL, 3)];
        assert_eq!(
            d.set_rules(bad, Some(0)),
            Err(DemuxError::NoSuchOutput {
                rule: Some(0),
                output: 3,
                outputs: 3
            })
        );
        let err = d.set_rules(Vec::new(), Some(7)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the default names output 7, but there are only 3"
        );
        assert_eq!(d.rules().len(), 2);
        assert_eq!(d.default_output(), Some(2));
    }
}
