//! uniplane kernels: a kernel is a function over the port protocol —
//! messages in, answers out, per connection — with no I/O of its own.
//!
//! ```text
//!  host (daemon)                         kernel thread
//!  request frame ─PIO mailbox / Connect─▶ Kernel::on_message(conn, payload, out)
//!               ◀────────────────────────  out.answer(conn, bytes) | out.error(conn, e)
//! ```
//!
//! A [`Kernel`] sees one message at a time and writes its answers into an
//! [`Emit`]; whoever runs it (the daemon's emulated device over the
//! PCIe-emulation path of `uniplane-shm`, a test, later an RTL backend)
//! carries the bytes. [`wire`] is the frame both ends put around them.
//!
//! A kernel may have device memory ([`DeviceMemory`]): the host writes
//! and reads it one-sided (the daemon's emulated device carries those by
//! its DMA engine), and the kernel reads it in
//! [`Kernel::on_request`] to compute over what the host put there.
//!
//! Shipped kernels: [`Echo`] returns the payload, [`Sum32`] answers the
//! wrapping sum of a payload of little-endian `u32`s, [`SumMemory32`]
//! the same sum over a range of the device's memory. The [`library`] holds
//! kernels that take parameters: [`dense`], the layers of a multilayer
//! perceptron (deep crossing's stages), [`regex_stage`], a stage of
//! the multi-regex matching pipeline, and [`pgas_target`], a PGAS
//! hardware endpoint.

#![deny(missing_docs)]

pub mod dense;
pub mod library;
pub mod pgas_target;
pub mod regex_stage;
pub mod wire;

/// Why a kernel refused a message: the typed error answer a caller gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The payload's length does not fit the kernel's element size.
    #[error("payload of {len} bytes is not a whole number of {element}-byte elements")]
    Misaligned {
        /// The payload's length.
        len: usize,
        /// The element size it should be a multiple of.
        element: usize,
    },
    /// The kernel cannot do what the message asks.
    #[error("the kernel does not support this request")]
    Unsupported,
    /// An answer longer than one message carries (the runner answers
    /// this error instead of cutting it).
    #[error("an answer of {len} bytes is longer than one message")]
    AnswerTooLarge {
        /// The answer's length.
        len: usize,
    },
    /// A range outside the device's memory.
    #[error("{len} bytes at {addr} lie outside the device's memory")]
    OutOfRange {
        /// Where the range starts.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// An input longer than the kernel takes.
    #[error("an input of {len} bytes is longer than the {limit} this kernel takes")]
    InputTooLarge {
        /// The input's length.
        len: usize,
        /// The most the kernel takes.
        limit: usize,
    },
    /// A message whose own structure does not hold (a count past its end).
    #[error("a malformed message of {len} bytes")]
    Malformed {
        /// The message's length.
        len: usize,
    },
}

impl KernelError {
    /// The code an error frame carries ([`wire::Frame::code`]).
    pub fn code(&self) -> u8 {
        match self {
            KernelError::Misaligned { .. } => 1,
            KernelError::Unsupported => 2,
            KernelError::AnswerTooLarge { .. } => 3,
            KernelError::OutOfRange { .. } => 4,
            KernelError::InputTooLarge { .. } => 5,
            KernelError::Malformed { .. } => 6,
        }
    }
}

/// Where a kernel writes its answers.
pub trait Emit {
    /// One answer on `conn`.
    fn answer(&mut self, conn: u16, payload: &[u8]);
    /// An error answer on `conn` instead of data.
    fn error(&mut self, conn: u16, error: KernelError);
}

/// A kernel's device memory as the kernel sees it: bytes the host wrote
/// one-sided, read by copy.
pub trait DeviceMemory {
    /// Its size in bytes.
    fn size(&self) -> u64;

    /// Copies the `buf.len()` bytes at `addr` into `buf`; false (and
    /// `buf` untouched) when the range is not inside the memory.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;
}

/// No memory at all: what a kernel device without `memory` has.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMemory;

impl DeviceMemory for NoMemory {
    fn size(&self) -> u64 {
        0
    }

    fn read(&self, _addr: u64, buf: &mut [u8]) -> bool {
        buf.is_empty()
    }
}

/// A kernel: what it answers to each message of each connection. It runs
/// on a thread of its own; it must not block.
pub trait Kernel: Send {
    /// Its name in the configuration (`function = "…"`).
    fn name(&self) -> &'static str;

    /// Handles one message of `conn`, writing zero or more answers to
    /// `out` before it returns.
    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit);

    /// A new connection from `caller` takes kernel connection `conn`:
    /// whatever an earlier connection left there is to be forgotten. The
    /// caller is the daemon's word, not the connection's. By default
    /// nothing happens.
    fn on_open(&mut self, conn: u16, caller: wire::Caller) {
        let _ = (conn, caller);
    }

    /// Connection `conn` ended. By default nothing happens.
    fn on_close(&mut self, conn: u16) {
        let _ = conn;
    }

    /// Handles one message of `conn` with the device's `memory` at hand;
    /// what the runner calls. By default the memory is not used
    /// ([`Kernel::on_message`]).
    fn on_request(
        &mut self,
        conn: u16,
        payload: &[u8],
        memory: &dyn DeviceMemory,
        out: &mut dyn Emit,
    ) {
        let _ = memory;
        self.on_message(conn, payload, out);
    }
}

/// Answers every message with its own payload.
#[derive(Clone, Copy, Debug, Default)]
pub struct Echo;

impl Kernel for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        out.answer(conn, payload);
    }
}

/// A streaming reduction: the payload is little-endian `u32`s, the answer
/// their wrapping sum as 4 little-endian bytes. A payload whose length is
/// not a multiple of 4 is answered [`KernelError::Misaligned`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Sum32;

impl Sum32 {
    /// The wrapping sum of `payload`'s little-endian `u32`s, or why not.
    pub fn sum(payload: &[u8]) -> Result<u32, KernelError> {
        if !payload.len().is_multiple_of(4) {
            return Err(KernelError::Misaligned {
                len: payload.len(),
                element: 4,
            });
        }
        Ok(payload
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .fold(0u32, u32::wrapping_add))
    }
}

impl Kernel for Sum32 {
    fn name(&self) -> &'static str {
        "sum32"
    }

    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        match Sum32::sum(payload) {
            Ok(sum) => out.answer(conn, &sum.to_le_bytes()),
            Err(e) => out.error(conn, e),
        }
    }
}

/// [`Sum32`] over device memory: the payload is a range, 16 bytes —
/// `addr` and `len` as little-endian `u64`s — and the answer the wrapping
/// sum of the little-endian `u32`s the memory holds there, as 4 bytes. A
/// payload of another length is [`KernelError::Unsupported`], a `len`
/// not a multiple of 4 [`KernelError::Misaligned`], a range outside the
/// memory [`KernelError::OutOfRange`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SumMemory32;

impl SumMemory32 {
    /// The request for the `len` bytes at `addr`.
    pub fn request(addr: u64, len: u64) -> [u8; 16] {
        let mut r = [0u8; 16];
        r[..8].copy_from_slice(&addr.to_le_bytes());
        r[8..].copy_from_slice(&len.to_le_bytes());
        r
    }

    /// The sum asked by `payload` over `memory`, or why not.
    pub fn sum(payload: &[u8], memory: &dyn DeviceMemory) -> Result<u32, KernelError> {
        let range: &[u8; 16] = payload.try_into().map_err(|_| KernelError::Unsupported)?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&range[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let (addr, len) = (word(0), word(8));
        if !len.is_multiple_of(4) {
            return Err(KernelError::Misaligned {
                len: usize::try_from(len).unwrap_or(usize::MAX),
                element: 4,
            });
        }
        let outside = KernelError::OutOfRange { addr, len };
        if addr.checked_add(len).is_none_or(|end| end > memory.size()) {
            return Err(outside);
        }
        // Read in pieces: no allocation per request.
        let mut buf = [0u8; 4096];
        let mut sum = 0u32;
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(buf.len() as u64) as usize;
            if !memory.read(addr + at, &mut buf[..n]) {
                return Err(outside);
            }
            sum = sum.wrapping_add(Sum32::sum(&buf[..n])?);
            at += n as u64;
        }
        Ok(sum)
    }
}

impl Kernel for SumMemory32 {
    fn name(&self) -> &'static str {
        "sum32-memory"
    }

    /// Without memory every range is outside it.
    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        self.on_request(conn, payload, &NoMemory, out);
    }

    fn on_request(
        &mut self,
        conn: u16,
        payload: &[u8],
        memory: &dyn DeviceMemory,
        out: &mut dyn Emit,
    ) {
        match SumMemory32::sum(payload, memory) {
            Ok(sum) => out.answer(conn, &sum.to_le_bytes()),
            Err(e) => out.error(conn, e),
        }
    }
}

/// The kernel named `name` in the configuration, if this crate ships it.
pub fn by_name(name: &str) -> Option<Box<dyn Kernel>> {
    match name {
        "echo" => Some(Box::new(Echo)),
        "sum32" => Some(Box::new(Sum32)),
        "sum32-memory" => Some(Box::new(SumMemory32)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a kernel emitted, in order.
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

    #[test]
    fn echo_answers_each_message_with_its_payload_on_its_connection() {
        let mut out = Collect::default();
        Echo.on_message(3, b"abc", &mut out);
        Echo.on_message(4, b"", &mut out);
        assert_eq!(out.0, vec![(3, Ok(b"abc".to_vec())), (4, Ok(Vec::new()))]);
    }

    #[test]
    fn sum32_answers_the_wrapping_sum_of_little_endian_words() {
        let mut out = Collect::default();
        let mut payload = Vec::new();
        for w in [1u32, 2, u32::MAX, 0x0102_0304] {
            payload.extend_from_slice(&w.to_le_bytes());
        }
        Sum32.on_message(1, &payload, &mut out);
        let want = 1u32
            .wrapping_add(2)
            .wrapping_add(u32::MAX)
            .wrapping_add(0x0102_0304);
        assert_eq!(out.0, vec![(1, Ok(want.to_le_bytes().to_vec()))]);
    }

    #[test]
    fn sum32_of_nothing_is_zero() {
        assert_eq!(Sum32::sum(&[]), Ok(0));
    }

    #[test]
    fn sum32_refuses_a_payload_that_is_not_whole_words() {
        let mut out = Collect::default();
        Sum32.on_message(2, &[1, 2, 3, 4, 5], &mut out);
        assert_eq!(
            out.0,
            vec![(2, Err(KernelError::Misaligned { len: 5, element: 4 }))]
        );
    }

    /// Memory in a vector.
    struct Bytes(Vec<u8>);

    impl DeviceMemory for Bytes {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }

        fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
            let Some(src) = usize::try_from(addr)
                .ok()
                .and_then(|a| self.0.get(a..a.checked_add(buf.len())?))
            else {
                return false;
            };
            buf.copy_from_slice(src);
            true
        }
    }

    #[test]
    fn sum32_memory_sums_a_range_of_the_device_memory_across_read_pieces() {
        let words: Vec<u32> = (0..3000u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let mem = Bytes(words.iter().flat_map(|w| w.to_le_bytes()).collect());
        let mut out = Collect::default();
        // 2,000 words from word 500: three read pieces.
        SumMemory32.on_request(5, &SumMemory32::request(2000, 8000), &mem, &mut out);
        let want = words[500..2500]
            .iter()
            .fold(0u32, |a, w| a.wrapping_add(*w));
        assert_eq!(out.0, vec![(5, Ok(want.to_le_bytes().to_vec()))]);
    }

    #[test]
    fn sum32_memory_refuses_ranges_outside_misaligned_or_malformed() {
        let mem = Bytes(vec![1; 64]);
        let err = |payload: &[u8]| {
            let mut out = Collect::default();
            SumMemory32.on_request(1, payload, &mem, &mut out);
            out.0.remove(0).1.unwrap_err()
        };
        assert_eq!(
            err(&SumMemory32::request(60, 8)),
            KernelError::OutOfRange { addr: 60, len: 8 }
        );
        assert_eq!(
            err(&SumMemory32::request(u64::MAX, 4)),
            KernelError::OutOfRange {
                addr: u64::MAX,
                len: 4
            }
        );
        assert!(matches!(
            err(&SumMemory32::request(0, 6)),
            KernelError::Misaligned { element: 4, .. }
        ));
        assert_eq!(err(&[0; 15]), KernelError::Unsupported);
        let mut out = Collect::default();
        SumMemory32.on_message(1, &SumMemory32::request(0, 4), &mut out);
        assert_eq!(out.0[0].1, Err(KernelError::OutOfRange { addr: 0, len: 4 }));
    }

    #[test]
    fn kernels_are_found_by_their_configured_name() {
        assert_eq!(by_name("echo").map(|k| k.name()), Some("echo"));
        assert_eq!(by_name("sum32").map(|k| k.name()), Some("sum32"));
        assert_eq!(
            by_name("sum32-memory").map(|k| k.name()),
            Some("sum32-memory")
        );
        assert!(by_name("fft").is_none());
    }
}
