//! Element types and reduction operations.
//!
//! Buffers travel as little-endian bytes whatever the host, so ranks on
//! different machines agree. Integer operations wrap on overflow (as
//! MPI's do in practice) and unsigned types compare as unsigned.

/// The element types a collective carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Datatype {
    /// `i8`
    I8,
    /// `i16`
    I16,
    /// `i32`
    I32,
    /// `i64`
    I64,
    /// `u8`
    U8,
    /// `u16`
    U16,
    /// `u32`
    U32,
    /// `u64`
    U64,
    /// `f32`
    F32,
    /// `f64`
    F64,
}

impl Datatype {
    /// Every datatype, in a fixed order.
    pub const ALL: [Datatype; 10] = [
        Datatype::I8,
        Datatype::I16,
        Datatype::I32,
        Datatype::I64,
        Datatype::U8,
        Datatype::U16,
        Datatype::U32,
        Datatype::U64,
        Datatype::F32,
        Datatype::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Datatype::I8 | Datatype::U8 => 1,
            Datatype::I16 | Datatype::U16 => 2,
            Datatype::I32 | Datatype::U32 | Datatype::F32 => 4,
            Datatype::I64 | Datatype::U64 | Datatype::F64 => 8,
        }
    }

    /// The short name (`i32`, `f64`, …).
    pub fn name(self) -> &'static str {
        match self {
            Datatype::I8 => "i8",
            Datatype::I16 => "i16",
            Datatype::I32 => "i32",
            Datatype::I64 => "i64",
            Datatype::U8 => "u8",
            Datatype::U16 => "u16",
            Datatype::U32 => "u32",
            Datatype::U64 => "u64",
            Datatype::F32 => "f32",
            Datatype::F64 => "f64",
        }
    }
}

/// A reduction operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Minimum (unsigned types compare as unsigned).
    Min,
    /// Maximum (unsigned types compare as unsigned).
    Max,
}

impl Op {
    /// Every operation, in a fixed order.
    pub const ALL: [Op; 4] = [Op::Sum, Op::Prod, Op::Min, Op::Max];

    /// The short name (`sum`, `prod`, `min`, `max`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Min => "min",
            Op::Max => "max",
        }
    }
}

/// An element type collectives carry: a fixed-size number with a
/// little-endian encoding and the four reductions.
pub trait Element: Copy + Send + Sync + Default + std::fmt::Debug + 'static {
    /// Its datatype.
    const DATATYPE: Datatype;
    /// Bytes per element.
    const SIZE: usize;
    /// Appends the little-endian bytes of `values` to `out`.
    fn encode(values: &[Self], out: &mut Vec<u8>);
    /// Decodes `bytes` (a multiple of [`Element::SIZE`] long, checked by the
    /// caller) into `out`, which has `bytes.len() / SIZE` elements.
    fn decode(bytes: &[u8], out: &mut [Self]);
    /// `acc[i] = acc[i] op bytes[i]`, `bytes` little-endian elements.
    fn reduce_bytes(op: Op, acc: &mut [Self], bytes: &[u8]);
    /// `acc[i] = acc[i] op other[i]`.
    fn reduce(op: Op, acc: &mut [Self], other: &[Self]);
}

/// An [`Element`] for `$t`: little-endian encoding, and each operation
/// as the closure given for it (applied to `(acc, other)` pairs).
macro_rules! element {
    ($t:ty, $dt:expr, sum: $sum:expr, prod: $prod:expr, min: $min:expr, max: $max:expr) => {
        impl Element for $t {
            const DATATYPE: Datatype = $dt;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn encode(values: &[Self], out: &mut Vec<u8>) {
                out.reserve(values.len() * Self::SIZE);
                for v in values {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
            fn decode(bytes: &[u8], out: &mut [Self]) {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(Self::SIZE)) {
                    let mut b = [0u8; std::mem::size_of::<$t>()];
                    b.copy_from_slice(c);
                    *o = <$t>::from_le_bytes(b);
                }
            }
            fn reduce_bytes(op: Op, acc: &mut [Self], bytes: &[u8]) {
                let it = acc.iter_mut().zip(bytes.chunks_exact(Self::SIZE).map(|c| {
                    let mut b = [0u8; std::mem::size_of::<$t>()];
                    b.copy_from_slice(c);
                    <$t>::from_le_bytes(b)
                }));
                // One loop per operation: no branch per element.
                match op {
                    Op::Sum => it.for_each($sum),
                    Op::Prod => it.for_each($prod),
                    Op::Min => it.for_each($min),
                    Op::Max => it.for_each($max),
                }
            }
            fn reduce(op: Op, acc: &mut [Self], other: &[Self]) {
                let it = acc.iter_mut().zip(other.iter().copied());
                match op {
                    Op::Sum => it.for_each($sum),
                    Op::Prod => it.for_each($prod),
                    Op::Min => it.for_each($min),
                    Op::Max => it.for_each($max),
                }
            }
        }
    };
}

/// Integers wrap on overflow; each type compares as itself (unsigned as
/// unsigned).
macro_rules! int_element {
    ($t:ty, $dt:expr) => {
        element!($t, $dt,
            sum: |(a, b): (&mut $t, $t)| *a = a.wrapping_add(b),
            prod: |(a, b): (&mut $t, $t)| *a = a.wrapping_mul(b),
            min: |(a, b): (&mut $t, $t)| *a = (*a).min(b),
            max: |(a, b): (&mut $t, $t)| *a = (*a).max(b));
    };
}

/// Floats as C computes them; min and max as C's `a < b ? a : b`, which
/// MPI libraries use.
macro_rules! float_element {
    ($t:ty, $dt:expr) => {
        element!($t, $dt,
            sum: |(a, b): (&mut $t, $t)| *a += b,
            prod: |(a, b): (&mut $t, $t)| *a *= b,
            min: |(a, b): (&mut $t, $t)| *a = if *a < b { *a } else { b },
            max: |(a, b): (&mut $t, $t)| *a = if *a > b { *a } else { b });
    };
}

int_element!(i8, Datatype::I8);
int_element!(i16, Datatype::I16);
int_element!(i32, Datatype::I32);
int_element!(i64, Datatype::I64);
int_element!(u8, Datatype::U8);
int_element!(u16, Datatype::U16);
int_element!(u32, Datatype::U32);
int_element!(u64, Datatype::U64);
float_element!(f32, Datatype::F32);
float_element!(f64, Datatype::F64);

/// `values` as little-endian bytes.
pub(crate) fn to_bytes<T: Element>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    T::encode(values, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sums_wrap_and_unsigned_compares_as_unsigned() {
        let mut a = [i8::MAX, 3u8 as i8];
        i8::reduce(Op::Sum, &mut a, &[1, 4]);
        assert_eq!(a, [i8::MIN, 7]);
        let mut u = [u64::MAX, 1];
        u64::reduce(Op::Min, &mut u, &[1, u64::MAX]);
        assert_eq!(u, [1, 1]);
        let mut m = [0x8000_0000u32];
        u32::reduce(Op::Max, &mut m, &[1]);
        assert_eq!(m, [0x8000_0000]);
    }

    #[test]
    fn bytes_round_trip_little_endian() {
        let v = [1i32, -2, i32::MAX];
        let b = to_bytes(&v);
        assert_eq!(&b[..4], &[1, 0, 0, 0]);
        let mut back = [0i32; 3];
        i32::decode(&b, &mut back);
        assert_eq!(back, v);
        let mut acc = [10i32, 10, 0];
        i32::reduce_bytes(Op::Prod, &mut acc, &b);
        assert_eq!(acc, [10, -20, 0]);
    }
}
