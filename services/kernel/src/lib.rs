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
//! Shipped kernels: [`Echo`] returns the payload, [`Sum32`] answers the
//! wrapping sum of a payload of little-endian `u32`s.

#![deny(missing_docs)]

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
}

impl KernelError {
    /// The code an error frame carries ([`wire::Frame::code`]).
    pub fn code(&self) -> u8 {
        match self {
            KernelError::Misaligned { .. } => 1,
            KernelError::Unsupported => 2,
            KernelError::AnswerTooLarge { .. } => 3,
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

/// A kernel: what it answers to each message of each connection. It runs
/// on a thread of its own; it must not block.
pub trait Kernel: Send {
    /// Its name in the configuration (`function = "…"`).
    fn name(&self) -> &'static str;

    /// Handles one message of `conn`, writing zero or more answers to
    /// `out` before it returns.
    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit);
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

/// The kernel named `name` in the configuration, if this crate ships it.
pub fn by_name(name: &str) -> Option<Box<dyn Kernel>> {
    match name {
        "echo" => Some(Box::new(Echo)),
        "sum32" => Some(Box::new(Sum32)),
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

    #[test]
    fn kernels_are_found_by_their_configured_name() {
        assert_eq!(by_name("echo").map(|k| k.name()), Some("echo"));
        assert_eq!(by_name("sum32").map(|k| k.name()), Some("sum32"));
        assert!(by_name("fft").is_none());
    }
}
