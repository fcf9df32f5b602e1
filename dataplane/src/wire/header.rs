//! The owned header: [`Header`], its [`Request`] and the parameter structs.

use super::beat::Beat;
use super::field::{self, EXTENDED_HEADER_LEN, HEADER_LEN};
use super::types::{TypeInfo, TYPE_INFO};
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

    /// Checks what the codec checks on decode: the rules between the
    /// fields. Runs the decoder's own check over the encoded header, so the
    /// rules live in one place.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let mut buf = [0u8; EXTENDED_HEADER_LEN];
        self.encode(&mut buf)?;
        validate(&buf).map(drop)
    }

    /// Reads and validates a header from the start of `buf` (the payload
    /// need not be present).
    ///
    /// This is the one validating decoder: views and messages call it.
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<Header, DecodeError> {
        let (beat, info) = validate(buf)?;
        let Some(kind) = info.kind else {
            unreachable!("validate refuses unassigned codes")
        };
        let flag = beat.get(span::REQ_FLAG) as u8;
        let params = match info.form {
            ParamForm::Port => Params::Port(PortParams {
                flag,
                src_port: beat.get(span::SRC_PORT) as u16,
                dst_port: beat.get(span::DST_PORT) as u16,
            }),
            ParamForm::Memory => Params::Memory(MemoryParams {
                flag,
                length: beat.get(span::MEM_LENGTH) as u16,
                addr: beat.get(span::MEM_ADDR) as u64,
            }),
            ParamForm::Config => Params::Config(ConfigParams {
                flag,
                reg: beat.get(span::CONFIG_REG) as u16,
                value: beat.get(span::CONFIG_VALUE) as u64,
            }),
            ParamForm::Flush => Params::Flush(flag),
            ParamForm::Read | ParamForm::Copy => {
                // validate checked that the second beat is present.
                let ext = buf[HEADER_LEN..]
                    .first_chunk::<HEADER_LEN>()
                    .map(Beat::load)
                    .unwrap_or_default();
                let src_addr = ext.get(span::EXT_SRC_ADDR) as u64;
                let dst_addr = ext.get(span::EXT_DST_ADDR) as u64;
                if info.form == ParamForm::Read {
                    Params::Read(ReadParams {
                        flag,
                        length: beat.get(span::READ_LENGTH) as u16,
                        src_addr,
                        dst_addr,
                    })
                } else {
                    Params::Copy(CopyParams {
                        flag,
                        length: beat.get(span::COPY_LENGTH) as u16,
                        target: Uid::from_u64_masked(beat.get(span::COPY_UID) as u64),
                        src_addr,
                        dst_addr,
                    })
                }
            }
            ParamForm::Opaque => {
                let word = (beat.get(span::REQ_PARAM)).to_be_bytes();
                let mut raw = [0u8; 12];
                raw.copy_from_slice(&word[4..]);
                Params::Opaque(raw)
            }
        };
        Ok(Header {
            src: Uid::from_u64_masked(beat.get(span::SRC_UID) as u64),
            dst: Uid::from_u64_masked(beat.get(span::DST_UID) as u64),
            length: beat.get(span::MSG_LENGTH) as u16,
            flags: MsgFlags::raw(beat.get(span::MSG_FLAG) as u8),
            seqnum: beat.get(span::MSG_SEQNUM) as u32,
            request: Request { kind, params },
        })
    }

    /// Writes the header at the start of `buf`, returning its length.
    ///
    /// Writes every byte of the header, reserved bits included, so `buf`
    /// need not be zeroed.
    #[inline]
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, DecodeError> {
        let len = self.len();
        if buf.len() < len {
            return Err(DecodeError::Truncated {
                needed: len,
                available: buf.len(),
            });
        }
        let mut beat = Beat::default();
        let mut ext = Beat::default();
        beat.put(span::SRC_UID, self.src.to_u64() as u128);
        beat.put(span::DST_UID, self.dst.to_u64() as u128);
        beat.put(span::MSG_LENGTH, self.length as u128);
        beat.put(span::MSG_FLAG, self.flags.bits() as u128);
        beat.put(span::MSG_SEQNUM, self.seqnum as u128);
        beat.put(span::REQ_TYPE, self.request.kind.to_u8() as u128);
        beat.put(span::REQ_FLAG, self.request.params.flag() as u128);
        match self.request.params {
            Params::Port(p) => {
                beat.put(span::SRC_PORT, p.src_port as u128);
                beat.put(span::DST_PORT, p.dst_port as u128);
            }
            Params::Memory(p) => {
                beat.put(span::MEM_LENGTH, p.length as u128);
                beat.put(span::MEM_ADDR, p.addr as u128);
            }
            Params::Config(p) => {
                beat.put(span::CONFIG_REG, p.reg as u128);
                beat.put(span::CONFIG_VALUE, p.value as u128);
            }
            Params::Flush(_) => {}
            Params::Read(p) => {
                beat.put(span::READ_LENGTH, p.length as u128);
                ext.put(span::EXT_SRC_ADDR, p.src_addr as u128);
                ext.put(span::EXT_DST_ADDR, p.dst_addr as u128);
            }
            Params::Copy(p) => {
                beat.put(span::COPY_LENGTH, p.length as u128);
                beat.put(span::COPY_UID, p.target.to_u64() as u128);
                ext.put(span::EXT_SRC_ADDR, p.src_addr as u128);
                ext.put(span::EXT_DST_ADDR, p.dst_addr as u128);
            }
            Params::Opaque(raw) => {
                let mut word = [0u8; 16];
                word[4..].copy_from_slice(&raw);
                beat.put(span::REQ_PARAM, u128::from_be_bytes(word));
            }
        }
        let (first, rest) = buf.split_at_mut(HEADER_LEN);
        if let Some(first) = first.first_chunk_mut::<HEADER_LEN>() {
            beat.store(first);
        }
        if len == EXTENDED_HEADER_LEN {
            if let Some(second) = rest.first_chunk_mut::<HEADER_LEN>() {
                ext.store(second);
            }
        }
        Ok(len)
    }
}

/// Bit spans of every field, from the tables in [`field`].
mod span {
    use super::field::{
        bit_span, param_bit_span, CONFIG_PARAM_FIELDS, COPY_PARAM_FIELDS, HEADER_FIELDS,
        MEMORY_PARAM_FIELDS, PORT_PARAM_FIELDS, READ_PARAM_FIELDS, SECOND_BEAT_FIELDS,
    };

    type Span = (u32, u32);
    pub const SRC_UID: Span = bit_span(HEADER_FIELDS, 0);
    pub const DST_UID: Span = bit_span(HEADER_FIELDS, 1);
    pub const MSG_LENGTH: Span = bit_span(HEADER_FIELDS, 2);
    pub const MSG_FLAG: Span = bit_span(HEADER_FIELDS, 3);
    pub const MSG_SEQNUM: Span = bit_span(HEADER_FIELDS, 4);
    pub const REQ_TYPE: Span = bit_span(HEADER_FIELDS, 5);
    pub const REQ_PARAM: Span = bit_span(HEADER_FIELDS, 6);
    pub const REQ_FLAG: Span = param_bit_span(PORT_PARAM_FIELDS, 0);
    pub const SRC_PORT: Span = param_bit_span(PORT_PARAM_FIELDS, 1);
    pub const DST_PORT: Span = param_bit_span(PORT_PARAM_FIELDS, 2);
    pub const MEM_LENGTH: Span = param_bit_span(MEMORY_PARAM_FIELDS, 1);
    pub const MEM_ADDR: Span = param_bit_span(MEMORY_PARAM_FIELDS, 2);
    pub const CONFIG_REG: Span = param_bit_span(CONFIG_PARAM_FIELDS, 1);
    pub const CONFIG_VALUE: Span = param_bit_span(CONFIG_PARAM_FIELDS, 2);
    pub const READ_LENGTH: Span = param_bit_span(READ_PARAM_FIELDS, 1);
    pub const COPY_LENGTH: Span = param_bit_span(COPY_PARAM_FIELDS, 1);
    // `validate` reads the length of READ and COPY at one span.
    const _: () = assert!(READ_LENGTH.0 == COPY_LENGTH.0 && READ_LENGTH.1 == COPY_LENGTH.1);
    pub const COPY_UID: Span = param_bit_span(COPY_PARAM_FIELDS, 2);
    pub const EXT_SRC_ADDR: Span = bit_span(SECOND_BEAT_FIELDS, 0);
    pub const EXT_DST_ADDR: Span = bit_span(SECOND_BEAT_FIELDS, 1);
    pub const EXT_RESERVED: Span = bit_span(SECOND_BEAT_FIELDS, 2);
}

/// The one check of an encoded header: its length, the type code, the
/// reserved bits and the rules between fields. Returns the first beat and
/// what the table says of its type.
#[inline(always)]
pub(super) fn validate(buf: &[u8]) -> Result<(Beat, &'static TypeInfo), DecodeError> {
    let Some(first) = buf.first_chunk::<HEADER_LEN>() else {
        return Err(DecodeError::Truncated {
            needed: HEADER_LEN,
            available: buf.len(),
        });
    };
    let beat = Beat::load(first);
    let code = beat.get(span::REQ_TYPE) as u8;
    let info = &TYPE_INFO[code as usize];
    let Some(kind) = info.kind else {
        return Err(DecodeError::UnknownRequestType(code));
    };
    if beat.low() & info.reserved != 0 {
        return Err(DecodeError::ReservedParamBits { req_type: kind });
    }
    let flags = beat.get(span::MSG_FLAG) as u8;
    if flags & MsgFlags::RESERVED_MASK != 0 {
        return Err(DecodeError::ReservedFlagBits(flags));
    }
    let length = beat.get(span::MSG_LENGTH) as u16;
    if length != 0 && !info.carries_payload {
        return Err(DecodeError::PayloadNotAllowed {
            req_type: kind,
            length,
        });
    }
    if flags & MsgFlags::ERROR.bits() != 0 && !info.is_answer {
        return Err(DecodeError::ErrorFlagOnRequest { req_type: kind });
    }
    match info.form {
        ParamForm::Memory if info.carries_payload => {
            let param_length = beat.get(span::MEM_LENGTH) as u16;
            if param_length != length {
                return Err(DecodeError::LengthMismatch {
                    req_type: kind,
                    param_length,
                    msg_length: length,
                });
            }
        }
        ParamForm::Read | ParamForm::Copy => {
            let Some(second) = buf[HEADER_LEN..].first_chunk::<HEADER_LEN>() else {
                return Err(DecodeError::Truncated {
                    needed: EXTENDED_HEADER_LEN,
                    available: buf.len(),
                });
            };
            if !Beat::load(second).is_zero(span::EXT_RESERVED) {
                return Err(DecodeError::ReservedParamBits { req_type: kind });
            }
            if beat.get(span::READ_LENGTH) == 0 {
                return Err(DecodeError::ZeroLength { req_type: kind });
            }
        }
        _ => {}
    }
    Ok((beat, info))
}
