//! Deep crossing (DUA, NSDI'19 §8.2, Fig. 12) on uniplane: the host
//! computes three sparse matrix–vector products, the dense layers run in
//! kernel devices (the `dense` library kernel of `uniplane-kernel`), and
//! the application reaches them by one UID.
//!
//! ```text
//!  application (host)                                   kernel devices (configuration only)
//!  three text fields, each a 49,292-wide sparse
//!  letter-trigram vector ─ 3 sparse products ─▶ 3 × 256 f32
//!        concatenated: 768 f32 ──▶ entry UID ─▶ dense layers 0..4            (one endpoint)
//!                                           or ─▶ layers 0..2 ─next─▶ 2..4    (two endpoints, one
//!                                                                              server or two)
//!        ◀──────────── the score (1 f32) ──────────────┘
//! ```
//!
//! [`Model`] holds what both sides must agree on (the dense widths and
//! the seed of every weight); [`Model::input`] draws the `index`-th
//! input, [`Model::embed`] is the host's part, [`Model::reference`] the
//! whole model in this process. [`run`] drives inferences through a
//! connection to the entry device and digests their outputs
//! ([`Digest`]): the same digest from every placement is the proof that
//! only the configuration changed.

#![deny(missing_docs)]

pub mod placement;
pub mod run;

pub use run::{run, Outcome, RunConfig, RunError};
use uniplane_kernel::dense::{self, Rng};

/// The text fields of an input (query, keyword, title in the paper's
/// model): one sparse product each.
pub const FIELDS: usize = 3;

/// A field's width: the letter-trigram vocabulary of Deep Crossing.
pub const FIELD_DIM: usize = 49_292;

/// Nonzero rows in each column of a field's sparse embedding matrix.
pub const COLUMN_NNZ: usize = 16;

/// The most nonzeros an input field may have (a long text's trigrams).
pub const MAX_NNZ: usize = 4096;

/// The default nonzeros per field: a short text's trigrams.
pub const DEFAULT_NNZ: usize = 48;

/// The stream tags of the inputs and the embeddings (the dense layers
/// use their own, in `uniplane_kernel::dense`).
const INPUT_STREAM: u64 = 0x696e_7075_7400_0000;
const EMBED_STREAM: u64 = 0x656d_6265_6400_0000;

/// One input: per field, its nonzero trigrams (ascending) and counts.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseInput {
    /// `fields[f]`: (trigram index, count) of field `f`.
    pub fields: [Vec<(u32, f32)>; FIELDS],
}

/// The model both the application and the kernels compute: the dense
/// widths (`dims`, the kernels' `dims` parameter), the weights' seed (the
/// kernels' `seed`) and the inputs' nonzeros per field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    dims: Vec<usize>,
    seed: u64,
    nnz: usize,
}

impl Model {
    /// The model of `dims` (as the kernels' `dims` parameter), `seed` and
    /// `nnz` nonzeros per field; the first width must split into
    /// [`FIELDS`] equal embeddings.
    pub fn new(dims: &str, seed: u64, nnz: usize) -> Result<Model, String> {
        let dims = dense::parse_dims(dims)?;
        if dims[0] % FIELDS != 0 {
            return Err(format!(
                "dims: the first width, {}, is {FIELDS} embeddings concatenated: a multiple of {FIELDS}",
                dims[0]
            ));
        }
        if !(1..=MAX_NNZ).contains(&nnz) {
            return Err(format!("nnz: {nnz}; 1 to {MAX_NNZ} nonzeros per field"));
        }
        Ok(Model { dims, seed, nnz })
    }

    /// The dense widths.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// An embedding's width.
    pub fn embedding(&self) -> usize {
        self.dims[0] / FIELDS
    }

    /// Bytes of a request to the entry device (the concatenated embeddings).
    pub fn request_bytes(&self) -> usize {
        self.dims[0] * 4
    }

    /// Bytes of the answer (the last layer's output).
    pub fn answer_bytes(&self) -> usize {
        self.dims[self.dims.len() - 1] * 4
    }

    /// The `index`-th input: per field, `nnz` distinct trigrams with
    /// counts 1 to 3.
    pub fn input(&self, index: u64) -> SparseInput {
        let mut rng = Rng::new(self.seed, INPUT_STREAM ^ index);
        let fields = std::array::from_fn(|_| {
            let mut rows: Vec<u32> = Vec::with_capacity(self.nnz);
            while rows.len() < self.nnz {
                let want = self.nnz - rows.len();
                rows.extend((0..want).map(|_| (rng.next_u64() % FIELD_DIM as u64) as u32));
                rows.sort_unstable();
                rows.dedup();
            }
            rows.into_iter()
                .map(|r| (r, (1 + rng.next_u64() % 3) as f32))
                .collect()
        });
        SparseInput { fields }
    }

    /// The host's part: the three sparse products, each field's vector
    /// times its sparse embedding matrix (`embedding() × FIELD_DIM`,
    /// [`COLUMN_NNZ`] seeded nonzeros per column), concatenated into
    /// `out` (`dims()[0]` long). The sums run over the input's nonzeros in
    /// ascending order, so the result is the same bits everywhere.
    pub fn embed(&self, input: &SparseInput, out: &mut [f32]) {
        let width = self.embedding();
        let scale = 1.0 / (COLUMN_NNZ as f32).sqrt();
        for (f, (field, part)) in input
            .fields
            .iter()
            .zip(out.chunks_exact_mut(width))
            .enumerate()
        {
            part.fill(0.0);
            for &(column, count) in field {
                let tag = EMBED_STREAM ^ ((f as u64) << 32) ^ u64::from(column);
                let mut rng = Rng::new(self.seed, tag);
                for _ in 0..COLUMN_NNZ {
                    let row = (rng.next_u64() % width as u64) as usize;
                    part[row] += count * rng.next_signed() * scale;
                }
            }
        }
    }

    /// The concatenated embeddings of `input` as the request's bytes
    /// (f32, little-endian) into `out`.
    pub fn request(&self, input: &SparseInput, embedded: &mut [f32], out: &mut Vec<u8>) {
        self.embed(input, embedded);
        out.clear();
        for v in embedded.iter() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// The whole model in this process, no uniplane: the embeddings, then
    /// every dense layer.
    pub fn reference(&self, input: &SparseInput) -> Vec<f32> {
        let mut x = vec![0.0; self.dims[0]];
        self.embed(input, &mut x);
        dense::forward_all(&self.dims, self.seed, &x)
    }
}

/// A digest of outputs in order: 64-bit FNV-1a over their bytes. Not a
/// cryptographic hash: two runs' outputs compared in one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest(u64);

impl Default for Digest {
    fn default() -> Digest {
        Digest(0xcbf2_9ce4_8422_2325)
    }
}

impl Digest {
    /// Adds one output's bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// Adds one output given as f32s (their little-endian bytes).
    pub fn update_floats(&mut self, v: &[f32]) {
        for x in v {
            self.update(&x.to_le_bytes());
        }
    }

    /// The value, as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// The digest of the reference's outputs for inputs `0..count`.
pub fn reference_digest(model: &Model, count: u64) -> Digest {
    let mut d = Digest::default();
    for i in 0..count {
        d.update_floats(&model.reference(&model.input(i)));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_kernel::dense::{Dense, Stage};

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// The request of input `i` through dense endpoints cut at `cuts`.
    fn through(model: &Model, i: u64, cuts: &[usize]) -> Vec<u8> {
        let mut x = vec![0.0; model.dims()[0]];
        let mut v = Vec::new();
        model.request(&model.input(i), &mut x, &mut v);
        for w in cuts.windows(2) {
            let stage = Stage {
                dims: model.dims().to_vec(),
                layers: w[0]..w[1],
                seed: model.seed(),
            };
            v = Dense::new(&stage).compute(&v).unwrap().to_vec();
        }
        v
    }

    #[test]
    fn split_layers_give_the_bits_of_one_endpoint_and_of_the_reference() {
        let model = Model::new("768,512,256,128,1", 11, DEFAULT_NNZ).unwrap();
        for i in 0..3 {
            let reference = bytes(&model.reference(&model.input(i)));
            assert_eq!(reference.len(), 4);
            for cuts in [
                &[0, 4][..],
                &[0, 2, 4],
                &[0, 1, 4],
                &[0, 3, 4],
                &[0, 1, 2, 3, 4],
            ] {
                assert_eq!(
                    through(&model, i, cuts),
                    reference,
                    "input {i}, cuts {cuts:?}"
                );
            }
        }
    }

    #[test]
    fn inputs_are_seeded_distinct_sorted_and_nnz_long() {
        let model = Model::new("12,4,1", 3, 300).unwrap();
        let a = model.input(7);
        assert_eq!(a, model.input(7));
        assert_ne!(a, model.input(8));
        for field in &a.fields {
            assert_eq!(field.len(), 300);
            assert!(field.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(field
                .iter()
                .all(|&(r, c)| (r as usize) < FIELD_DIM && (1.0..=3.0).contains(&c)));
        }
    }

    #[test]
    fn each_field_lands_in_its_own_embedding() {
        let model = Model::new("24,4,1", 3, 5).unwrap();
        let mut input = model.input(0);
        input.fields[1].clear();
        input.fields[2].clear();
        let mut x = vec![1.0; 24];
        model.embed(&input, &mut x);
        assert!(x[..8].iter().any(|v| *v != 0.0));
        assert!(x[8..].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn a_model_that_does_not_fit_is_refused() {
        assert!(Model::new("769,4,1", 1, 4)
            .unwrap_err()
            .contains("multiple of 3"));
        assert!(Model::new("768,4,1", 1, 0).unwrap_err().contains("nnz"));
        assert!(Model::new("768,4,1", 1, MAX_NNZ + 1).is_err());
        assert!(Model::new("768,20000,1", 1, 4).is_err());
    }

    #[test]
    fn the_digest_sees_every_bit_and_the_order() {
        let mut a = Digest::default();
        a.update_floats(&[1.0, 2.0]);
        let mut b = Digest::default();
        b.update_floats(&[2.0, 1.0]);
        let mut c = Digest::default();
        c.update_floats(&[1.0, f32::from_bits(2.0f32.to_bits() ^ 1)]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.hex().len(), 16);
    }
}
