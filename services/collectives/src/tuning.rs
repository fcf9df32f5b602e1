//! Which algorithm each collective uses, by message size and rank count:
//! a table the user can read and override, as ACCL+ does.

/// A collective operation, for the algorithm table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Broadcast.
    Bcast,
    /// Reduce to a root.
    Reduce,
    /// Reduce, result everywhere.
    Allreduce,
    /// Gather, result everywhere.
    Allgather,
    /// Reduce, then every rank keeps its block.
    ReduceScatter,
    /// Every rank sends a block to every rank.
    Alltoall,
    /// Synchronisation.
    Barrier,
    /// Gather to a root.
    Gather,
    /// Scatter from a root.
    Scatter,
}

/// An algorithm. Not every collective has every one; asking for one it
/// lacks gives the collective's first supported algorithm in
/// [`Algorithm::supported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// One-to-all / all-to-one: the root talks to every rank directly
    /// (for allreduce, allgather and reduce-scatter: a reduce or gather to
    /// rank 0 followed by a broadcast or scatter; for alltoall: every pair
    /// at once; for barrier: gather and release through rank 0).
    Linear,
    /// A ring: `n - 1` steps, each rank sending one block to its right
    /// neighbour; bandwidth-optimal for large messages.
    Ring,
    /// A binomial tree: `log2 n` rounds; latency-optimal for one-to-all
    /// and all-to-one.
    BinomialTree,
    /// Recursive doubling: `log2 n` pairwise exchanges (with a fold-in
    /// step for rank counts that are not powers of two; for barrier, the
    /// dissemination algorithm).
    RecursiveDoubling,
}

impl Algorithm {
    /// The algorithms `collective` implements, its fallback first.
    pub fn supported(collective: Collective) -> &'static [Algorithm] {
        use Algorithm::*;
        match collective {
            Collective::Bcast | Collective::Reduce => &[BinomialTree, Linear],
            Collective::Allreduce => &[RecursiveDoubling, Ring, Linear],
            Collective::Allgather => &[Ring, RecursiveDoubling, Linear],
            Collective::ReduceScatter => &[Ring, Linear],
            Collective::Alltoall | Collective::Gather | Collective::Scatter => &[Linear],
            Collective::Barrier => &[RecursiveDoubling, Linear],
        }
    }
}

/// One row of the table: from `min_ranks` ranks and `min_bytes` bytes
/// (per rank's buffer) on, `collective` uses `algorithm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The collective.
    pub collective: Collective,
    /// Smallest communicator the row applies to.
    pub min_ranks: usize,
    /// Smallest message (bytes of one rank's input) the row applies to.
    pub min_bytes: usize,
    /// The algorithm.
    pub algorithm: Algorithm,
}

/// The algorithm table: for a call, the last row that matches wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    rules: Vec<Rule>,
}

impl Default for Tuning {
    /// Trees and recursive doubling for small messages, rings from
    /// 64 KiB.
    fn default() -> Self {
        use Algorithm::*;
        use Collective::*;
        let row = |collective, min_ranks, min_bytes, algorithm| Rule {
            collective,
            min_ranks,
            min_bytes,
            algorithm,
        };
        Tuning {
            rules: vec![
                row(Bcast, 0, 0, BinomialTree),
                row(Reduce, 0, 0, BinomialTree),
                row(Allreduce, 0, 0, RecursiveDoubling),
                row(Allreduce, 3, 64 * 1024, Ring),
                row(Allgather, 0, 0, RecursiveDoubling),
                row(Allgather, 3, 64 * 1024, Ring),
                row(ReduceScatter, 0, 0, Ring),
                row(Alltoall, 0, 0, Linear),
                row(Barrier, 0, 0, RecursiveDoubling),
                row(Gather, 0, 0, Linear),
                row(Scatter, 0, 0, Linear),
            ],
        }
    }
}

impl Tuning {
    /// The rows, in order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Adds a row (it overrides earlier rows where both match).
    pub fn push(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// Makes `collective` use `algorithm` at every size and rank count.
    pub fn force(&mut self, collective: Collective, algorithm: Algorithm) {
        self.rules.retain(|r| r.collective != collective);
        self.push(Rule {
            collective,
            min_ranks: 0,
            min_bytes: 0,
            algorithm,
        });
    }

    /// The algorithm for `collective` with `ranks` ranks and `bytes` per
    /// rank.
    pub fn choose(&self, collective: Collective, ranks: usize, bytes: usize) -> Algorithm {
        let supported = Algorithm::supported(collective);
        self.rules
            .iter()
            .rev()
            .find(|r| r.collective == collective && ranks >= r.min_ranks && bytes >= r.min_bytes)
            .map(|r| r.algorithm)
            .filter(|a| supported.contains(a))
            .unwrap_or(supported[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_matching_row_wins_and_unsupported_falls_back() {
        let mut t = Tuning::default();
        assert_eq!(
            t.choose(Collective::Allreduce, 4, 8),
            Algorithm::RecursiveDoubling
        );
        assert_eq!(t.choose(Collective::Allreduce, 4, 1 << 20), Algorithm::Ring);
        assert_eq!(
            t.choose(Collective::Allreduce, 2, 1 << 20),
            Algorithm::RecursiveDoubling
        );
        t.force(Collective::Allreduce, Algorithm::Linear);
        assert_eq!(
            t.choose(Collective::Allreduce, 4, 1 << 20),
            Algorithm::Linear
        );
        t.force(Collective::Alltoall, Algorithm::Ring);
        assert_eq!(t.choose(Collective::Alltoall, 4, 8), Algorithm::Linear);
    }
}
