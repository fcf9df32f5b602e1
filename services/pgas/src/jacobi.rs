//! The Jacobi example of the Shoal paper: a 2-D grid split over the
//! ranks of a group, halos exchanged with long puts and signals.
//!
//! The grid is `n × n` doubles whose outer rows and columns are a fixed
//! boundary. Rank `r` owns a strip of interior rows ([`rows_of`]) and
//! keeps it in one segment with a halo row above and below, twice (the
//! grid of this iteration and of the next). Each iteration a rank
//! computes its strip of the next grid from this one, then puts its first
//! and last rows into its neighbours' halo rows of the next grid, each
//! put signalling the neighbour's built-in counter once it landed; it
//! waits for its own halos by that counter. A neighbour writes into the
//! grid a rank reads only after that rank sent its halos of this
//! iteration, so no rank reads a halo while it is written.
//!
//! Every cell is computed as `0.25 * ((up + down) + (left + right))` in
//! the distributed run and in [`reference`], so both give the same bits.
//!
//! The grid is split over the group's software ranks. With a
//! [`HaloStore`], one of them keeps its halo rows in a segment of a
//! hardware endpoint (a `pgas-target` kernel device) instead of its own:
//! its neighbours put their edge rows there, complete the put (quiet) and
//! then signal it with a short message; it gets its halos from the
//! kernel before each iteration. The hardware rank holds and serves
//! those rows; it computes nothing and signals no one (a hardware
//! endpoint never initiates).

use std::ops::Range;

use crate::{Acl, Call, Completion, Endpoint, PgasError, SegmentId};

/// Where one rank's halo rows live when not in its own segment: segment
/// `segment` of hardware rank `rank`, at least [`store_bytes`] long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HaloStore {
    /// The hardware rank holding them.
    pub rank: usize,
    /// The software rank (group rank) whose halos they are.
    pub owner: usize,
    /// The segment at the hardware rank.
    pub segment: SegmentId,
}

/// Bytes a [`HaloStore`]'s segment needs for an `n`-wide grid: two
/// buffers of the row above and the row below.
pub fn store_bytes(n: usize) -> usize {
    4 * n * 8
}

/// Byte offset in a halo store of buffer `buf`'s row above (`below`
/// false) or below.
fn store_offset(buf: usize, below: bool, n: usize) -> u64 {
    ((buf * 2 + usize::from(below)) * n * 8) as u64
}

/// A Jacobi problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Grid side, boundary included (at least 3).
    pub n: usize,
    /// Iterations to run.
    pub iterations: usize,
}

/// The grid before the first iteration: a hot top edge, a left edge
/// warming downwards, everything else zero.
pub fn initial(n: usize) -> Vec<f64> {
    let mut g = vec![0.0; n * n];
    g[..n].fill(100.0);
    for i in 0..n {
        g[i * n] = i as f64;
    }
    g
}

fn step(old: &[f64], new: &mut [f64], n: usize, rows: Range<usize>) {
    for i in rows {
        for j in 1..n - 1 {
            let up = old[(i - 1) * n + j];
            let down = old[(i + 1) * n + j];
            let left = old[i * n + j - 1];
            let right = old[i * n + j + 1];
            new[i * n + j] = 0.25 * ((up + down) + (left + right));
        }
    }
}

/// The grid after `spec.iterations`, computed in one process.
pub fn reference(spec: Spec) -> Vec<f64> {
    let n = spec.n;
    let mut a = initial(n);
    let mut b = a.clone();
    for _ in 0..spec.iterations {
        step(&a, &mut b, n, 1..n - 1);
        std::mem::swap(&mut a, &mut b);
    }
    a
}

/// The interior rows (global indices) rank `rank` of `size` owns.
pub fn rows_of(rank: usize, size: usize, n: usize) -> Range<usize> {
    let interior = n - 2;
    let start = 1 + interior * rank / size;
    let end = 1 + interior * (rank + 1) / size;
    start..end
}

/// Byte offset in a rank's segment of local row `row` (0: the halo
/// above) of buffer `buf`, for a strip of `rows` rows.
fn offset(buf: usize, row: usize, rows: usize, n: usize) -> u64 {
    (((buf * (rows + 2)) + row) * n * 8) as u64
}

fn to_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

/// Runs this rank's part of `spec` on a joined endpoint (every software
/// rank of the group calls it, each having registered the same segments
/// before); its rows of the final grid, in order.
pub async fn run_rank(ep: &Endpoint, spec: Spec) -> Result<Vec<f64>, PgasError> {
    run_rank_with_store(ep, spec, None).await
}

/// [`run_rank`], with `store.owner`'s halo rows in `store` (every
/// software rank passes the same).
pub async fn run_rank_with_store(
    ep: &Endpoint,
    spec: Spec,
    store: Option<HaloStore>,
) -> Result<Vec<f64>, PgasError> {
    let n = spec.n;
    let me = ep.rank().ok_or(PgasError::NotJoined)?;
    let group = ep.group().ok_or(PgasError::NotJoined)?;
    // Strips go to the software ranks in order: `rank` is this one's
    // place among them, `ranks` maps a place back to the group's rank.
    let ranks: Vec<usize> = group.software_ranks().collect();
    let rank = ranks
        .iter()
        .position(|&r| r == me)
        .ok_or(PgasError::NotMember)?;
    let size = ranks.len();
    if n < 3 || size > n - 2 {
        return Err(PgasError::Invalid(format!(
            "a {n}×{n} grid cannot be split over {size} ranks"
        )));
    }
    let store = store.filter(|s| ranks.contains(&s.owner));
    let mine = rows_of(rank, size, n);
    let rows = mine.len();
    // Both buffers start as the initial grid's rows around the strip.
    let init = initial(n);
    let strip = &init[(mine.start - 1) * n..(mine.end + 1) * n];
    let seg = ep.register_segment(2 * (rows + 2) * n * 8, Acl::ReadWrite);
    seg.write(0, &to_bytes(strip));
    seg.write(offset(1, 0, rows, n) as usize, &to_bytes(strip));
    let up = (rank > 0).then(|| rank - 1);
    let down = (rank + 1 < size).then_some(rank + 1);
    // This rank's halos in the store: it puts the initial ones there.
    let stored = store.filter(|s| s.owner == me);
    if let Some(s) = stored {
        let strip = to_bytes(strip);
        for buf in 0..2 {
            for (below, row) in [(false, 0), (true, rows + 1)] {
                let bytes = &strip[row * n * 8..(row + 1) * n * 8];
                let at = store_offset(buf, below, n);
                ep.long(s.rank, s.segment, at, bytes, Call::NONE, Completion::Async)
                    .await?;
            }
        }
    }
    // Signals are counted per neighbour: one neighbour may already be an
    // iteration ahead of the other.
    let before: Vec<u64> = [up, down]
        .iter()
        .flatten()
        .map(|&r| ep.counter_from(ranks[r]))
        .collect();
    ep.barrier().await?;
    let mut old = vec![0.0; (rows + 2) * n];
    let mut new = vec![0.0; (rows + 2) * n];
    for k in 0..spec.iterations {
        let (cur, next) = (k % 2, (k + 1) % 2);
        seg.with(|b| {
            let at = offset(cur, 0, rows, n) as usize;
            old.copy_from_slice(&from_bytes(&b[at..at + (rows + 2) * n * 8]));
        });
        if let Some(s) = stored {
            // The halos this iteration reads come from the store (the
            // boundary rows of the grid's edges stay as they were).
            if up.is_some() {
                let row = ep.get(s.rank, s.segment, store_offset(cur, false, n), n * 8);
                old[..n].copy_from_slice(&from_bytes(&row.await?));
            }
            if down.is_some() {
                let row = ep.get(s.rank, s.segment, store_offset(cur, true, n), n * 8);
                old[(rows + 1) * n..].copy_from_slice(&from_bytes(&row.await?));
            }
        }
        new.copy_from_slice(&old);
        step(&old, &mut new, n, 1..rows + 1);
        let interior = to_bytes(&new[n..(rows + 1) * n]);
        seg.write(offset(next, 1, rows, n) as usize, &interior);
        let first = &interior[..n * 8];
        let last = &interior[(rows - 1) * n * 8..];
        // Into the neighbour above, its row below; into the one below,
        // its row above.
        for (neighbour, row, below) in [(up, first, true), (down, last, false)] {
            let Some(r) = neighbour else { continue };
            let (dst, their) = (ranks[r], rows_of(r, size, n).len());
            match store.filter(|s| s.owner == dst) {
                Some(s) => {
                    let at = store_offset(next, below, n);
                    ep.long(s.rank, s.segment, at, row, Call::NONE, Completion::Async)
                        .await?;
                    // Landed at the store before the owner hears of it.
                    ep.quiet().await?;
                    ep.short(dst, Call::counter(1), Completion::Async).await?;
                }
                None => {
                    let at = offset(next, if below { their + 1 } else { 0 }, their, n);
                    ep.long(dst, seg.id(), at, row, Call::counter(1), Completion::Async)
                        .await?;
                }
            }
        }
        for (&r, b) in [up, down].iter().flatten().zip(&before) {
            ep.wait_counter_from(ranks[r], b + k as u64 + 1).await;
        }
    }
    ep.barrier().await?;
    let at = offset(spec.iterations % 2, 1, rows, n) as usize;
    Ok(seg.with(|b| from_bytes(&b[at..at + rows * n * 8])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_cover_the_interior_once() {
        for size in 1..9 {
            let mut next = 1;
            for r in 0..size {
                let rows = rows_of(r, size, 20);
                assert_eq!(rows.start, next);
                assert!(!rows.is_empty());
                next = rows.end;
            }
            assert_eq!(next, 19);
        }
    }

    #[test]
    fn the_reference_keeps_its_boundary_and_spreads_heat() {
        let g = reference(Spec {
            n: 10,
            iterations: 30,
        });
        assert_eq!(&g[1..10], &[100.0; 9], "the top edge, past the left corner");
        assert!(g[10 + 5] > 0.0 && g[10 + 5] < 100.0);
    }
}
