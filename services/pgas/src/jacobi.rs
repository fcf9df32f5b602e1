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

use std::ops::Range;

use crate::{Acl, Call, Completion, Endpoint, PgasError};

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

/// Runs this rank's part of `spec` on a joined endpoint (every rank of
/// the group calls it, each having registered the same segments before);
/// its rows of the final grid, in order.
pub async fn run_rank(ep: &Endpoint, spec: Spec) -> Result<Vec<f64>, PgasError> {
    let n = spec.n;
    let rank = ep.rank().ok_or(PgasError::NotJoined)?;
    let size = ep.size();
    if n < 3 || size > n - 2 {
        return Err(PgasError::Invalid(format!(
            "a {n}×{n} grid cannot be split over {size} ranks"
        )));
    }
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
    // Signals are counted per neighbour: one neighbour may already be an
    // iteration ahead of the other.
    let before: Vec<u64> = [up, down]
        .iter()
        .flatten()
        .map(|&r| ep.counter_from(r))
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
        new.copy_from_slice(&old);
        step(&old, &mut new, n, 1..rows + 1);
        let interior = to_bytes(&new[n..(rows + 1) * n]);
        seg.write(offset(next, 1, rows, n) as usize, &interior);
        if let Some(r) = up {
            let their = rows_of(r, size, n).len();
            let at = offset(next, their + 1, their, n);
            ep.long(
                r,
                seg.id(),
                at,
                &interior[..n * 8],
                Call::counter(1),
                Completion::Async,
            )
            .await?;
        }
        if let Some(r) = down {
            let at = offset(next, 0, rows_of(r, size, n).len(), n);
            let last = &interior[(rows - 1) * n * 8..];
            ep.long(r, seg.id(), at, last, Call::counter(1), Completion::Async)
                .await?;
        }
        for (&r, b) in [up, down].iter().flatten().zip(&before) {
            ep.wait_counter_from(r, b + k as u64 + 1).await;
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
