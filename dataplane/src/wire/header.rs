//! The owned header: [`Header`], its [`Request`] and the parameter structs.

use super::field::{self, EXTENDED_HEADER_LEN};
use super::view::HeaderView;
use super::{DecodeError, MsgFlags, ParamForm, ReqType, Status};
use crate::Uid;

/// Parameters of the port layout (SEND, RECV, PUSH, FWRD, connection control).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PortParams {
    /// Per-type flag; the [`Status`] code in answers.
    pub flag: u8,
    /// Sending port.
    pub src_port: u16,
    /// Receiving port.
    pub dst_port: u16,
}

/// Parameters of the memory layout (WRTE, COPY_WRTE, READ_CMPL, completions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MemoryParams {
    /// Per-type flag; the [`Status`] code in answers.
    pub flag: u8,
    /// Bytes written (equals the payload length when the type carries data).
    pub length: u16,
    /// Address of the first byte at the destination.
    pub addr: u64,
}

/// Parameters of READ: `length` bytes at `src_addr` of the destination are
/// returned and placed at `dst_addr` of the requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ReadParams {
    /// Per-type flag.
    pub flag: u8,
    /// Bytes to read; never zero.
    pub length: u16,
    /// Where to read, in the destination's memory.
    pub src_addr: u64,
    /// Where to place the bytes, in the requester's memory.
    pub dst_addr: u64,
}

/// Parameters of COPY: `length` bytes at `src_addr` of the destination are
/// written at `dst_addr` of resource `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CopyParams {
    /// Per-type flag.
    pub flag: u8,
    /// Bytes to copy; never zero.
    pub length: u16,
    /// The resource the bytes are written to.
    pub target: Uid,
    /// Where to read, in the destination's memory.
    pub src_addr: u64,
    /// Where to write, in `target`'s memory.
    pub dst_addr: u64,
}

/// Parameters of CNFG, CNFG_CMPL and UPDT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ConfigParams {
    /// Per-type flag; the [`Status`] code in answers.
    pub flag: u8,
    /// Register address.
    pub reg: u16,
    /// Register value.
    pub value: u64,
}

/// The request parameters in one of the layouts of [`ParamForm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Params {
    /// [`ParamForm::Port`].
    Port(PortParams),
    /// [`ParamForm::Memory`].
    Memory(MemoryParams),
    /// [`ParamForm::Flush`]: only the flag.
    Flush(u8),
    /// [`ParamForm::Read`].
    Read(ReadParams),
    /// [`ParamForm::Copy`].
    Copy(CopyParams),
    /// [`ParamForm::Config`].
    Config(ConfigParams),
    /// [`ParamForm::Opaque`]: the 12 raw bytes of a user type.
    Opaque([u8; 12]),
}

impl Params {
    /// The layout these parameters use.
    pub const fn form(&self) -> ParamForm {
        match self {
            Params::Port(_) => ParamForm::Port,
            Params::Memory(_) => ParamForm::Memory,
            Params::Flush(_) => ParamForm::Flush,
            Params::Read(_) => ParamForm::Read,
            Params::Copy(_) => ParamForm::Copy,
            Params::Config(_) => ParamForm::Config,
            Params::Opaque(_) => ParamForm::Opaque,
        }
    }

    /// `req_flag`: the first parameter byte of every layout.
    pub const fn flag(&self) -> u8 {
        match self {
            Params::Port(p) => p.flag,
            Params::Memory(p) => p.flag,
            Params::Flush(flag) => *flag,
            Params::Read(p) => p.flag,
            Params::Copy(p) => p.flag,
            Params::Config(p) => p.flag,
            Params::Opaque(raw) => raw[0],
        }
    }
}

/// A request type with parameters of the layout that type uses.
///
/// The pairing is checked when the value is made, so a `Request` is always
/// encodable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    kind: ReqType,
    params: Params,
}

impl Request {
    /// `kind` with `params`, or [`DecodeError::ParamForm`] when `params`
    /// is not the layout `kind` uses.
    pub const fn new(kind: ReqType, params: Params) -> Result<Request, DecodeError> {
        if kind.form() as u8 == params.form() as u8 {
            Ok(Request { kind, params })
        } else {
            Err(DecodeError::ParamForm { req_type: kind })
        }
    }

    /// A SEND from `src_port` to `dst_port`.
    pub const fn send(src_port: u16, dst_port: u16) -> Request {
        Self::port(ReqType::Send, src_port, dst_port)
    }

    /// A request of port layout: `kind` must be of [`ParamForm::Port`].
    ///
    /// # Panics
    /// When `kind` is not of the port layout (a programming error).
    pub const fn port(kind: ReqType, src_port: u16, dst_port: u16) -> Request {
        assert!(matches!(kind.form(), ParamForm::Port));
        Request {
            kind,
            params: Params::Port(PortParams {
                flag: 0,
                src_port,
                dst_port,
            }),
        }
    }

    /// A WRTE of `length` bytes at `addr`.
    pub const fn write(addr: u64, length: u16) -> Request {
        Request {
            kind: ReqType::Write,
            params: Params::Memory(MemoryParams {
                flag: 0,
                length,
                addr,
            }),
        }
    }

    /// A READ of `length` bytes at `src_addr`, to be placed at `dst_addr`.
    pub const fn read(src_addr: u64, dst_addr: u64, length: u16) -> Request {
        Request {
            kind: ReqType::Read,
            params: Params::Read(ReadParams {
                flag: 0,
                length,
                src_addr,
                dst_addr,
            }),
        }
    }

    /// The request type.
    #[inline]
    pub const fn kind(&self) -> ReqType {
        self.kind
    }

    /// The parameters.
    #[inline]
    pub const fn params(&self) -> &Params {
        &self.params
    }

    /// This request with `req_flag` set to `flag`.
    pub const fn with_flag(mut self, flag: u8) -> Request {
        match &mut self.params {
            Params::Port(p) => p.flag = flag,
            Params::Memory(p) => p.flag = flag,
            Params::Flush(f) => *f = flag,
            Params::Read(p) => p.flag = flag,
            Params::Copy(p) => p.flag = flag,
            Params::Config(p) => p.flag = flag,
            Params::Opaque(raw) => raw[0] = flag,
        }
        self
    }

    /// The source and destination ports, for requests of the port layout.
    pub const fn ports(&self) -> Option<(u16, u16)> {
        match self.params {
            Params::Port(p) => Some((p.src_port, p.dst_port)),
            _ => None,
        }
    }
}

/// The owned, validated form of a message header.
///
/// `length` is the payload length of this message (segment); a [`crate::Message`]
/// keeps it equal to its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// The sending resource.
    pub src: Uid,
    /// The receiving resource.
    pub dst: Uid,
    /// Payload bytes following the header.
    pub length: u16,
    /// FIRST, LAST, PUSH, ERROR.
    pub flags: MsgFlags,
    /// Per-connection sequence number.
    pub seqnum: u32,
    /// Type and parameters.
    pub request: Request,
}

impl Header {
    /// A whole (FIRST|LAST) message header with no payload yet.
    pub const fn new(src: Uid, dst: Uid, request: Request) -> Header {
        Header {
            src,
            dst,
            length: 0,
            flags: MsgFlags::WHOLE,
            seqnum: 0,
            request,
        }
    }

    /// Encoded size: 32 bytes, or 64 for READ and COPY.
    #[inline]
    pub const fn len(&self) -> usize {
        self.request.kind.header_len()
    }

    /// Always false: a header is never empty. Present for clippy's sake.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// The completion status of an answer (`Ok` unless the ERROR flag is set).
    pub const fn status(&self) -> Status {
        if self.flags.contains(MsgFlags::ERROR) {
            Status::from_u8(self.request.params.flag())
        } else {
            Status::Ok
        }
    }

    /// Checks what the codec checks on decode: the rules between the fields.
    pub fn validate(&self) -> Result<(), DecodeError> {
        check_consistency(
            self.request.kind,
            self.flags,
            self.length,
            &self.request.params,
        )
    }

    /// Reads and validates a header from the start of `buf` (the payload
    /// need not be present).
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<Header, DecodeError> {
        let view = HeaderView::new_checked(buf)?;
        Ok(view.to_header())
    }

    /// Writes the header at the start of `buf`, returning its length.
    ///
    /// Writes every byte of the header, reserved bits included, so `buf`
    /// need not be zeroed.
    #[inline]
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, DecodeError> {
        let len = self.len();
        let Some(out) = buf.get_mut(..len) else {
            return Err(DecodeError::Truncated {
                needed: len,
                available: buf.len(),
            });
        };
        let mut beat = [0u8; EXTENDED_HEADER_LEN];
        beat[field::SRC_UID].copy_from_slice(&self.src.to_bytes());
        beat[field::DST_UID].copy_from_slice(&self.dst.to_bytes());
        beat[field::MSG_LENGTH].copy_from_slice(&self.length.to_be_bytes());
        beat[field::MSG_FLAG] = self.flags.bits();
        beat[field::MSG_SEQNUM].copy_from_slice(&self.seqnum.to_be_bytes());
        beat[field::REQ_TYPE] = self.request.kind.to_u8();
        beat[field::REQ_FLAG] = self.request.params.flag();
        match self.request.params {
            Params::Port(p) => {
                beat[field::SRC_PORT].copy_from_slice(&p.src_port.to_be_bytes());
                beat[field::DST_PORT].copy_from_slice(&p.dst_port.to_be_bytes());
            }
            Params::Memory(p) => {
                beat[field::REQ_LENGTH].copy_from_slice(&p.length.to_be_bytes());
                beat[field::MEM_ADDR].copy_from_slice(&p.addr.to_be_bytes());
            }
            Params::Config(p) => {
                beat[field::REQ_LENGTH].copy_from_slice(&p.reg.to_be_bytes());
                beat[field::MEM_ADDR].copy_from_slice(&p.value.to_be_bytes());
            }
            Params::Flush(_) => {}
            Params::Read(p) => {
                beat[field::REQ_LENGTH].copy_from_slice(&p.length.to_be_bytes());
                beat[field::EXT_SRC_ADDR].copy_from_slice(&p.src_addr.to_be_bytes());
                beat[field::EXT_DST_ADDR].copy_from_slice(&p.dst_addr.to_be_bytes());
            }
            Params::Copy(p) => {
                beat[field::REQ_LENGTH].copy_from_slice(&p.length.to_be_bytes());
                beat[field::COPY_UID].copy_from_slice(&p.target.to_bytes());
                beat[field::EXT_SRC_ADDR].copy_from_slice(&p.src_addr.to_be_bytes());
                beat[field::EXT_DST_ADDR].copy_from_slice(&p.dst_addr.to_be_bytes());
            }
            Params::Opaque(raw) => beat[field::REQ_PARAM].copy_from_slice(&raw),
        }
        out.copy_from_slice(&beat[..len]);
        Ok(len)
    }
}

/// The rules between fields that hold for every valid header.
#[inline]
pub(super) fn check_consistency(
    kind: ReqType,
    flags: MsgFlags,
    length: u16,
    params: &Params,
) -> Result<(), DecodeError> {
    if flags.bits() & MsgFlags::RESERVED_MASK != 0 {
        return Err(DecodeError::ReservedFlagBits(flags.bits()));
    }
    if length != 0 && !kind.carries_payload() {
        return Err(DecodeError::PayloadNotAllowed {
            req_type: kind,
            length,
        });
    }
    if flags.contains(MsgFlags::ERROR) && !kind.is_answer() {
        return Err(DecodeError::ErrorFlagOnRequest { req_type: kind });
    }
    match params {
        Params::Memory(p) if kind.carries_payload() && p.length != length => {
            Err(DecodeError::LengthMismatch {
                req_type: kind,
                param_length: p.length,
                msg_length: length,
            })
        }
        Params::Read(ReadParams { length: 0, .. }) | Params::Copy(CopyParams { length: 0, .. }) => {
            Err(DecodeError::ZeroLength { req_type: kind })
        }
        _ => Ok(()),
    }
}
