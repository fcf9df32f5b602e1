//! `dense`: consecutive dense layers of a multilayer perceptron, the
//! stages of the deep crossing application (DUA, NSDI'19 §8.2, Fig. 12).
//!
//! ```text
//!  dims   = d0, d1, …, dn            the whole model: n layers, layer i maps d(i) → d(i+1)
//!  layers = a..b                     what this endpoint computes (half-open)
//!  request: d(a) f32, little-endian ──▶ layer a ─ReLU─▶ … ─▶ layer b-1 ──▶ answer: d(b) f32
//! ```
//!
//! Layer `i` is `y = W x + c` with `W` of `d(i+1) × d(i)`, followed by a
//! ReLU unless it is the model's last layer. Its weights and biases come
//! from a [`Rng`] seeded by (`seed`, `i`) alone, so any split of the layers
//! over endpoints computes the same numbers as one endpoint holding all of
//! them, bit for bit: each layer's arithmetic is fixed (the order of every
//! addition is written out in [`dot`]; Rust never fuses or reorders float
//! operations on its own), and the f32 values cross between endpoints
//! exactly.
//!
//! The whole model fits one message each way: every `d(i)` is at most
//! [`MAX_DIM`] (4 bytes each, at most 65,535 bytes a message). A request
//! of the wrong length is answered with an error, never computed: one
//! that is not whole f32s is [`KernelError::Misaligned`], one with the
//! wrong number of them [`KernelError::Unsupported`].
//!
//! Parameters (`params = { … }` of the device):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `dims` | `768,512,256,128,1` | the widths d0…dn of the whole model |
//! | `layers` | every layer | `a..b` (or one index `a`): the layers this endpoint computes |
//! | `seed` | `1` | the weights' seed, the same on every endpoint of a model |

use std::ops::Range;

use crate::library::{only, parsed_or, Params};
use crate::{Emit, Kernel, KernelError};

/// The default model: three 256-wide embeddings concatenated, then
/// 512 → 256 → 128 → 1 (a score).
pub const DEFAULT_DIMS: &str = "768,512,256,128,1";

/// The widest layer a message can carry: 16,383 f32s are 65,532 bytes.
pub const MAX_DIM: usize = 65_535 / 4;

/// The most weights one endpoint holds (64 MiB of f32s): a guard against
/// a configuration that would allocate gigabytes.
pub const MAX_WEIGHTS: usize = 1 << 24;

/// The parameters this kernel takes.
const KNOWN: &[&str] = &["dims", "layers", "seed"];

/// A small, fast, seedable generator (SplitMix64): the weights' source.
/// Not cryptographic; the same seed gives the same stream everywhere.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream of (`seed`, `stream`): different streams of one seed
    /// are unrelated.
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform f32 in [-1, 1): 24 random bits, exact in f32.
    pub fn next_signed(&mut self) -> f32 {
        let bits = (self.next_u64() >> 40) as u32;
        bits as f32 * (2.0 / (1u32 << 24) as f32) - 1.0
    }
}

/// The stream tag of the dense layers' weights (embeddings of an
/// application use other tags of the same seed).
const DENSE_STREAM: u64 = 0x6465_6e73_6500_0000;

/// One dense layer: `outputs × inputs` weights (row-major) and biases.
#[derive(Clone, Debug)]
pub struct Layer {
    inputs: usize,
    outputs: usize,
    weights: Vec<f32>,
    biases: Vec<f32>,
    relu: bool,
}

impl Layer {
    /// Layer `index` of the model `dims` with weights of `seed`: uniform
    /// in ±sqrt(6 / (inputs + outputs)) (Glorot), biases in ±0.01; a ReLU
    /// unless it is the last layer.
    pub fn generate(dims: &[usize], index: usize, seed: u64) -> Layer {
        let (inputs, outputs) = (dims[index], dims[index + 1]);
        let mut rng = Rng::new(seed, DENSE_STREAM + index as u64);
        let scale = (6.0f32 / (inputs + outputs) as f32).sqrt();
        let weights = (0..inputs * outputs)
            .map(|_| rng.next_signed() * scale)
            .collect();
        let biases = (0..outputs).map(|_| rng.next_signed() * 0.01).collect();
        Layer {
            inputs,
            outputs,
            weights,
            biases,
            relu: index + 2 < dims.len(),
        }
    }

    /// Its input width.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Its output width.
    pub fn outputs(&self) -> usize {
        self.outputs
    }

    /// `output = relu?(W input + c)`; `input` is `inputs()` long, `output`
    /// `outputs()` long.
    pub fn forward(&self, input: &[f32], output: &mut [f32]) {
        for ((y, row), c) in output
            .iter_mut()
            .zip(self.weights.chunks_exact(self.inputs))
            .zip(&self.biases)
        {
            let v = dot(row, input) + c;
            *y = if self.relu { v.max(0.0) } else { v };
        }
    }
}

/// The dot product of `w` and `x` in one fixed order: eight running sums
/// over the whole groups of eight (which the compiler vectorises without
/// changing the order), added pairwise, then the tail in sequence.
pub fn dot(w: &[f32], x: &[f32]) -> f32 {
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let (wt, xt) = (wc.remainder(), xc.remainder());
    let mut acc = [0f32; 8];
    for (a, b) in wc.zip(xc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    let mut tail = 0f32;
    for (a, b) in wt.iter().zip(xt) {
        tail += a * b;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail
}

/// What an endpoint computes: the model's widths, its layers, the seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// The whole model's widths d0…dn.
    pub dims: Vec<usize>,
    /// The layers this endpoint computes.
    pub layers: Range<usize>,
    /// The weights' seed.
    pub seed: u64,
}

impl Stage {
    /// Reads and checks the parameters (no weights generated).
    pub fn from_params(params: &Params) -> Result<Stage, String> {
        only(params, KNOWN)?;
        let dims = parse_dims(params.get("dims").map_or(DEFAULT_DIMS, String::as_str))?;
        let n = dims.len() - 1;
        let layers = match params.get("layers") {
            None => 0..n,
            Some(text) => parse_layers(text, n)?,
        };
        let weights: usize = layers.clone().map(|i| dims[i] * dims[i + 1]).sum();
        if weights > MAX_WEIGHTS {
            return Err(format!(
                "layers {layers:?} hold {weights} weights; an endpoint holds at most {MAX_WEIGHTS}"
            ));
        }
        let seed = parsed_or(params, "seed", 1u64)?;
        Ok(Stage { dims, layers, seed })
    }

    /// Its input width (f32s of a request).
    pub fn inputs(&self) -> usize {
        self.dims[self.layers.start]
    }

    /// Its output width (f32s of an answer).
    pub fn outputs(&self) -> usize {
        self.dims[self.layers.end]
    }
}

/// `d0,d1,…,dn`: at least two widths, each 1 to [`MAX_DIM`].
pub fn parse_dims(text: &str) -> Result<Vec<usize>, String> {
    let dims = text
        .split(',')
        .map(|d| {
            let d = d.trim();
            match d.parse::<usize>() {
                Ok(v) if (1..=MAX_DIM).contains(&v) => Ok(v),
                Ok(v) => Err(format!(
                    "dims: a width of {v}; each is 1 to {MAX_DIM} (one message, 65,535 bytes, of f32s)"
                )),
                Err(e) => Err(format!("dims: `{d}`: {e}")),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if dims.len() < 2 {
        return Err(format!(
            "dims = `{text}`: a model needs at least two widths"
        ));
    }
    Ok(dims)
}

/// `a..b` (half-open) or `a`: a non-empty range of the `n` layers.
pub fn parse_layers(text: &str, n: usize) -> Result<Range<usize>, String> {
    let number = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|e| format!("layers = `{text}`: `{s}`: {e}"))
    };
    let range = match text.split_once("..") {
        Some((a, b)) => number(a)?..number(b)?,
        None => {
            let a = number(text)?;
            a..a.saturating_add(1)
        }
    };
    if range.start >= range.end || range.end > n {
        return Err(format!(
            "layers = `{text}`: not a non-empty range of the model's {n} layers (0..{n})"
        ));
    }
    Ok(range)
}

/// The `dense` kernel: a [`Stage`]'s layers with their weights, and the
/// buffers it computes in (nothing allocated per message).
#[derive(Debug)]
pub struct Dense {
    layers: Vec<Layer>,
    /// Two buffers of the widest layer: each layer reads one, writes the other.
    scratch: [Vec<f32>; 2],
    answer: Vec<u8>,
}

impl Dense {
    /// Generates the stage's weights.
    pub fn new(stage: &Stage) -> Dense {
        let layers: Vec<Layer> = stage
            .layers
            .clone()
            .map(|i| Layer::generate(&stage.dims, i, stage.seed))
            .collect();
        let widest = stage.dims[stage.layers.start..=stage.layers.end]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        Dense {
            layers,
            scratch: [vec![0.0; widest], vec![0.0; widest]],
            answer: Vec::with_capacity(stage.outputs() * 4),
        }
    }

    /// Its input width.
    pub fn inputs(&self) -> usize {
        self.layers.first().map_or(0, Layer::inputs)
    }

    /// Computes the answer to `payload` (f32s, little-endian) into the
    /// kernel's answer buffer, or why not.
    pub fn compute(&mut self, payload: &[u8]) -> Result<&[u8], KernelError> {
        if !payload.len().is_multiple_of(4) {
            return Err(KernelError::Misaligned {
                len: payload.len(),
                element: 4,
            });
        }
        if payload.len() / 4 != self.inputs() {
            return Err(KernelError::Unsupported);
        }
        let [a, b] = &mut self.scratch;
        for (x, w) in a.iter_mut().zip(payload.chunks_exact(4)) {
            *x = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
        let (mut from, mut to) = (a, b);
        for layer in &self.layers {
            layer.forward(&from[..layer.inputs], &mut to[..layer.outputs]);
            std::mem::swap(&mut from, &mut to);
        }
        let outputs = self.layers.last().map_or(0, Layer::outputs);
        self.answer.clear();
        for y in &from[..outputs] {
            self.answer.extend_from_slice(&y.to_le_bytes());
        }
        Ok(&self.answer)
    }
}

impl Kernel for Dense {
    fn name(&self) -> &'static str {
        "dense"
    }

    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        match self.compute(payload) {
            Ok(answer) => out.answer(conn, answer),
            Err(e) => out.error(conn, e),
        }
    }
}

/// The library's entry for `dense`.
pub const SPEC: crate::library::Spec = crate::library::Spec {
    name: "dense",
    about: "dense layers a..b of a multilayer perceptron (ReLU between), seeded weights; f32 LE in and out",
    check: |params| Stage::from_params(params).map(|_| ()),
    build: |params| {
        let stage = Stage::from_params(params)?;
        Ok(Box::new(Dense::new(&stage)))
    },
};

/// The whole model in one place, for references and tests: the output of
/// layers `0..n` for `input`.
pub fn forward_all(dims: &[usize], seed: u64, input: &[f32]) -> Vec<f32> {
    let mut x = input.to_vec();
    for i in 0..dims.len() - 1 {
        let layer = Layer::generate(dims, i, seed);
        let mut y = vec![0.0; layer.outputs()];
        layer.forward(&x, &mut y);
        x = y;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<(u16, Result<Vec<u8>, KernelError>)>);

    impl Emit for Collect {
        fn answer(&mut self, conn: u16, payload: &[u8]) {
            self.0.push((conn, Ok(payload.to_vec())));
        }
        fn error(&mut self, conn: u16, error: KernelError) {
            self.0.push((conn, Err(error)));
        }
    }

    fn params(pairs: &[(&str, &str)]) -> Params {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect()
    }

    fn input(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed, 99);
        (0..n).map(|_| rng.next_signed()).collect()
    }

    /// Runs `payload` through the library kernel built from `p`.
    fn call(p: &Params, payload: &[u8]) -> Result<Vec<u8>, KernelError> {
        let mut k = crate::library::build("dense", p).unwrap().unwrap();
        let mut out = Collect::default();
        k.on_message(9, payload, &mut out);
        assert_eq!(out.0.len(), 1, "exactly one answer or error");
        let (conn, r) = out.0.remove(0);
        assert_eq!(conn, 9);
        r
    }

    const DIMS: &str = "48,40,24,9,3";

    #[test]
    fn any_split_of_the_layers_gives_the_bits_of_the_whole_model() {
        let x = bytes(&input(48, 5));
        let all = call(&params(&[("dims", DIMS), ("seed", "7")]), &x).unwrap();
        assert_eq!(all.len(), 3 * 4);
        let dims = parse_dims(DIMS).unwrap();
        assert_eq!(all, bytes(&forward_all(&dims, 7, &floats(&x))));
        for cuts in [
            vec![0, 2, 4],
            vec![0, 1, 4],
            vec![0, 3, 4],
            vec![0, 1, 2, 3, 4],
        ] {
            let mut v = x.clone();
            for w in cuts.windows(2) {
                let layers = format!("{}..{}", w[0], w[1]);
                v = call(
                    &params(&[("dims", DIMS), ("seed", "7"), ("layers", &layers)]),
                    &v,
                )
                .unwrap();
            }
            assert_eq!(v, all, "split at {cuts:?}");
        }
    }

    #[test]
    fn another_seed_gives_other_weights() {
        let x = bytes(&input(48, 5));
        let a = call(&params(&[("dims", DIMS), ("seed", "7")]), &x).unwrap();
        let b = call(&params(&[("dims", DIMS), ("seed", "8")]), &x).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn hidden_layers_apply_relu_and_the_last_does_not() {
        let dims = [16, 64, 64];
        let hidden = Layer::generate(&dims, 0, 3);
        let last = Layer::generate(&dims, 1, 3);
        let x = input(16, 1);
        let mut h = vec![0.0; 64];
        hidden.forward(&x, &mut h);
        assert!(h.iter().all(|v| *v >= 0.0) && h.iter().any(|v| *v > 0.0));
        let mut y = vec![0.0; 64];
        last.forward(&h, &mut y);
        assert!(y.iter().any(|v| *v < 0.0));
    }

    #[test]
    fn the_default_model_answers_one_float_to_768() {
        let x = bytes(&input(768, 2));
        let y = call(&Params::new(), &x).unwrap();
        assert_eq!(y.len(), 4);
        assert!(floats(&y)[0].is_finite());
    }

    #[test]
    fn a_request_of_the_wrong_length_is_an_error_not_a_panic() {
        let p = params(&[("dims", DIMS), ("layers", "1..3")]);
        assert_eq!(
            call(&p, &[0; 161]),
            Err(KernelError::Misaligned {
                len: 161,
                element: 4
            })
        );
        assert_eq!(call(&p, &[0; 48 * 4]), Err(KernelError::Unsupported));
        assert_eq!(call(&p, &[]), Err(KernelError::Unsupported));
        assert_eq!(call(&p, &[0; 40 * 4]).map(|a| a.len()), Ok(9 * 4));
    }

    #[test]
    fn the_kernel_goes_on_after_a_refused_request() {
        let p = params(&[("dims", DIMS)]);
        let mut k = crate::library::build("dense", &p).unwrap().unwrap();
        let mut out = Collect::default();
        let x = bytes(&input(48, 3));
        k.on_message(1, &x, &mut out);
        k.on_message(1, &x[..8], &mut out);
        k.on_message(1, &x, &mut out);
        assert_eq!(out.0.len(), 3);
        assert_eq!(out.0[1].1, Err(KernelError::Unsupported));
        assert_eq!(out.0[0].1, out.0[2].1);
    }

    #[test]
    fn parameters_are_checked_before_anything_is_built() {
        let check =
            |pairs: &[(&str, &str)]| crate::library::check("dense", &params(pairs)).unwrap();
        assert!(check(&[]).is_ok());
        assert!(check(&[("dims", "8,4"), ("layers", "0"), ("seed", "3")]).is_ok());
        for (bad, why) in [
            (vec![("dims", "768")], "at least two"),
            (vec![("dims", "768,0,1")], "1 to 16383"),
            (vec![("dims", "768,16384,1")], "1 to 16383"),
            (vec![("dims", "768,x")], "`x`"),
            (vec![("layers", "2..2")], "non-empty"),
            (vec![("layers", "0..5")], "non-empty"),
            (vec![("layers", "3..1")], "non-empty"),
            (vec![("layers", "a..b")], "`a`"),
            (vec![("seed", "-1")], "seed"),
            (vec![("seeds", "1")], "unknown parameter `seeds`"),
            (vec![("dims", "16383,16383,16383")], "at most"),
        ] {
            let e = check(&bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_generator_is_the_same_stream_for_the_same_seed() {
        let a: Vec<u64> = (0..4)
            .scan(Rng::new(1, 2), |r, _| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(Rng::new(1, 2), |r, _| Some(r.next_u64()))
            .collect();
        let c: Vec<u64> = (0..4)
            .scan(Rng::new(1, 3), |r, _| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Rng::new(4, 0);
        assert!((0..10_000).all(|_| (-1.0..1.0).contains(&r.next_signed())));
    }

    #[test]
    fn dot_adds_in_its_documented_order() {
        let w: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let x: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.25).collect();
        let mut acc = [0f32; 8];
        for k in 0..16 {
            acc[k % 8] += w[k] * x[k];
        }
        let tail = w[16] * x[16] + w[17] * x[17] + w[18] * x[18];
        let want = ((acc[0] + acc[1]) + (acc[2] + acc[3]))
            + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
            + tail;
        assert_eq!(dot(&w, &x).to_bits(), want.to_bits());
    }
}
