//! The DUA message on the wire: the field table, the request types, the
//! checked zero-copy views and the owned header.
//!
//! One header, the same bytes in Rust and in RTL: 32 bytes (one 256-bit
//! beat), big-endian, most significant field first, field-compatible with
//! the `SiliconNetHead` of DUA's published RTL. READ and COPY add a second
//! beat with the addresses. `docs/wire-format.md` shows the table and
//! encoded examples.

mod beat;
pub mod field;
mod header;
mod types;
mod view;

pub use field::{EXTENDED_HEADER_LEN, HEADER_LEN};
pub use header::{
    ConfigParams, CopyParams, Header, MemoryParams, Params, PortParams, ReadParams, Request,
};
pub use types::{MsgFlags, ParamForm, ReqType, Status};
pub use view::{Frame, HeaderView};

/// Why bytes are not a valid message.
///
/// Every decoder in uniplane returns these instead of panicking; callers
/// count them and drop the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The buffer ends before the header or the payload does.
    #[error("truncated: {needed} bytes needed, {available} available")]
    Truncated {
        /// Bytes the message needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// `req_type` is a code no request type uses.
    #[error("unknown request type {0:#04x}")]
    UnknownRequestType(u8),
    /// A reserved bit of `msg_flag` is set.
    #[error("reserved bits set in msg_flag {0:#04x}")]
    ReservedFlagBits(u8),
    /// A reserved bit of the request parameters is set.
    #[error("reserved parameter bits set in a {req_type} header")]
    ReservedParamBits {
        /// The message's type.
        req_type: ReqType,
    },
    /// A type that carries no data has a non-zero `msg_length`.
    #[error("{req_type} carries no payload but msg_length is {length}")]
    PayloadNotAllowed {
        /// The message's type.
        req_type: ReqType,
        /// The `msg_length` found.
        length: u16,
    },
    /// `req_length` of a data-carrying memory request differs from `msg_length`.
    #[error("{req_type}: req_length {param_length} differs from msg_length {msg_length}")]
    LengthMismatch {
        /// The message's type.
        req_type: ReqType,
        /// `req_length`.
        param_length: u16,
        /// `msg_length`.
        msg_length: u16,
    },
    /// A READ or COPY of zero bytes.
    #[error("{req_type} of zero bytes")]
    ZeroLength {
        /// The message's type.
        req_type: ReqType,
    },
    /// The ERROR flag is set on a request rather than an answer.
    #[error("ERROR flag set on request {req_type}, which is not an answer")]
    ErrorFlagOnRequest {
        /// The message's type.
        req_type: ReqType,
    },
    /// Parameters of another layout than the request type uses.
    #[error("parameters do not match the layout of {req_type}")]
    ParamForm {
        /// The request type.
        req_type: ReqType,
    },
    /// A payload longer than `msg_length` can describe (65535 bytes).
    #[error("payload of {0} bytes exceeds the 65535-byte message limit")]
    PayloadTooLong(usize),
}
