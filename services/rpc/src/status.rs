//! [`Status`]: how a call ended, with gRPC's codes.

use std::borrow::Cow;

/// gRPC's status codes, with their numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    /// Not an error.
    Ok = 0,
    /// The caller cancelled.
    Cancelled = 1,
    /// Unknown error.
    Unknown = 2,
    /// The request was not valid.
    InvalidArgument = 3,
    /// The deadline passed before the call finished.
    DeadlineExceeded = 4,
    /// Something asked for was not found.
    NotFound = 5,
    /// Something to be created exists.
    AlreadyExists = 6,
    /// The caller may not do this (the identity layer's refusal).
    PermissionDenied = 7,
    /// A limit ran out: a message too large, a server at its limit.
    ResourceExhausted = 8,
    /// The system is not in a state for this.
    FailedPrecondition = 9,
    /// Aborted, typically by a concurrency conflict.
    Aborted = 10,
    /// Out of a valid range.
    OutOfRange = 11,
    /// No such method.
    Unimplemented = 12,
    /// A broken invariant, a malformed frame.
    Internal = 13,
    /// The peer or the path is gone; retrying may help.
    Unavailable = 14,
    /// Data lost.
    DataLoss = 15,
    /// The caller is not authenticated.
    Unauthenticated = 16,
}

impl Code {
    /// The code numbered `v`, if any.
    pub fn from_u8(v: u8) -> Option<Code> {
        use Code::*;
        Some(match v {
            0 => Ok,
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            _ => return None,
        })
    }
}

/// How a call failed: a code and a text for people.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Status {
    code: Code,
    message: Cow<'static, str>,
}

impl Status {
    /// A status of `code` saying `message`.
    pub fn new(code: Code, message: impl Into<Cow<'static, str>>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }

    /// The code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The text.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The connection or the peer is gone.
    pub fn unavailable(message: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Unavailable, message)
    }

    /// The deadline passed.
    pub fn deadline_exceeded() -> Status {
        Status::new(Code::DeadlineExceeded, "deadline exceeded")
    }

    /// The caller cancelled.
    pub fn cancelled() -> Status {
        Status::new(Code::Cancelled, "cancelled")
    }

    /// No such method.
    pub fn unimplemented(method: &str) -> Status {
        Status::new(Code::Unimplemented, format!("no method {method}"))
    }

    /// A broken protocol or invariant.
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Internal, message)
    }

    /// A limit ran out.
    pub fn resource_exhausted(message: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::ResourceExhausted, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_to_16_is_a_code_and_back() {
        for v in 0..=16u8 {
            assert_eq!(Code::from_u8(v).map(|c| c as u8), Some(v));
        }
        assert_eq!(Code::from_u8(17), None);
    }
}
