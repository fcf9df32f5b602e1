//! Request types, message flags and completion status codes.

use std::fmt;

/// Which layout a request type's `req_param` (and second beat) uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamForm {
    /// `req_flag src_port dst_port reserved` ([`super::field::PORT_PARAM_FIELDS`]).
    Port,
    /// `req_flag req_length dst_addr reserved` ([`super::field::MEMORY_PARAM_FIELDS`]).
    Memory,
    /// `req_flag reserved` ([`super::field::FLUSH_PARAM_FIELDS`]).
    Flush,
    /// `req_flag req_length reserved` plus the second beat.
    Read,
    /// `req_flag req_length req_uid reserved` plus the second beat.
    Copy,
    /// `req_flag reg_addr reg_value reserved` ([`super::field::CONFIG_PARAM_FIELDS`]).
    Config,
    /// User-defined types (0x80–0xff): 96 bits the codec does not interpret.
    Opaque,
}

macro_rules! req_types {
    ($( $(#[$doc:meta])* $name:ident = $code:literal, $text:literal, $form:ident, $payload:ident; )*) => {
        /// The request type of a message (`req_type`).
        ///
        /// Codes 0x01–0x13 are DUA's; connection control takes codes from
        /// the reserved range 0x40–0x7f; 0x80–0xff are left to users.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ReqType {
            $( $(#[$doc])* $name, )*
            /// A user-defined request (0x80–0xff) with opaque parameters.
            User(u8),
        }

        impl ReqType {
            /// Every request type the codec defines (user types excluded).
            pub const ALL: &'static [ReqType] = &[$(ReqType::$name,)*];

            /// The type of wire code `code`, or `None` for a code that is
            /// unassigned.
            #[inline]
            pub const fn from_u8(code: u8) -> Option<ReqType> {
                match code {
                    $( $code => Some(ReqType::$name), )*
                    0x80..=0xff => Some(ReqType::User(code)),
                    _ => None,
                }
            }

            /// The wire code.
            #[inline]
            pub const fn to_u8(self) -> u8 {
                match self {
                    $( ReqType::$name => $code, )*
                    ReqType::User(code) => code,
                }
            }

            /// The name the RTL and the docs use (`SEND`, `WRTE_CMPL`, …).
            pub const fn name(self) -> &'static str {
                match self {
                    $( ReqType::$name => $text, )*
                    ReqType::User(_) => "USER",
                }
            }

            /// Which parameter layout this type uses.
            #[inline]
            pub const fn form(self) -> ParamForm {
                match self {
                    $( ReqType::$name => ParamForm::$form, )*
                    ReqType::User(_) => ParamForm::Opaque,
                }
            }

            /// Whether a message of this type may carry payload bytes.
            #[inline]
            pub const fn carries_payload(self) -> bool {
                match self {
                    $( ReqType::$name => req_types!(@bool $payload), )*
                    ReqType::User(_) => true,
                }
            }
        }
    };
    (@bool data) => { true };
    (@bool empty) => { false };
}

req_types! {
    /// Two-sided send of payload to a port.
    Send = 0x01, "SEND", Port, data;
    /// Completion of a SEND.
    SendCmpl = 0x02, "SEND_CMPL", Port, empty;
    /// A receive request posted at a port.
    Recv = 0x03, "RECV", Port, data;
    /// Completion of a RECV, carrying the received bytes.
    RecvCmpl = 0x04, "RECV_CMPL", Port, data;
    /// One-sided write of the payload at `dst_addr`.
    Write = 0x05, "WRTE", Memory, data;
    /// Completion of a WRTE.
    WriteCmpl = 0x06, "WRTE_CMPL", Memory, empty;
    /// One-sided read of `req_length` bytes at `src_addr` into the requester's `dst_addr`.
    Read = 0x07, "READ", Read, empty;
    /// Completion of a READ, carrying the bytes read, to be placed at `dst_addr`.
    ReadCmpl = 0x08, "READ_CMPL", Memory, data;
    /// Flush: complete every earlier write before answering.
    Flush = 0x09, "FLSH", Flush, empty;
    /// Completion of a FLSH.
    FlushCmpl = 0x0a, "FLSH_CMPL", Flush, empty;
    /// Copy `req_length` bytes from `src_addr` of the destination to `dst_addr` of `req_uid`.
    Copy = 0x0b, "COPY", Copy, empty;
    /// The write a COPY turns into, carrying the copied bytes.
    CopyWrite = 0x0c, "COPY_WRTE", Memory, data;
    /// Completion of a COPY.
    CopyCmpl = 0x0d, "COPY_CMPL", Memory, empty;
    /// Write a configuration register.
    Config = 0x0e, "CNFG", Config, empty;
    /// Completion of a CNFG, carrying the register's value.
    ConfigCmpl = 0x0f, "CNFG_CMPL", Config, empty;
    /// A message forwarded on behalf of another device.
    Forward = 0x10, "FWRD", Port, data;
    /// A push of payload without a posted receive.
    Push = 0x11, "PUSH", Port, data;
    /// Completion of a PUSH.
    PushCmpl = 0x12, "PUSH_CMPL", Port, empty;
    /// A table update from the control plane.
    Update = 0x13, "UPDT", Config, data;
    /// Connection request from `src_port` to `dst_port`.
    Connect = 0x40, "CONNECT", Port, data;
    /// Acceptance of a CONNECT.
    Accept = 0x41, "ACCEPT", Port, data;
    /// Close of a connection.
    Close = 0x42, "CLOSE", Port, empty;
    /// Asynchronous notice to an endpoint (failure, peer closed).
    Notify = 0x43, "NOTIFY", Port, data;
}

/// What the decoder needs to know of a type code, found with one load.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TypeInfo {
    pub(crate) kind: Option<ReqType>,
    pub(crate) form: ParamForm,
    pub(crate) carries_payload: bool,
    pub(crate) is_answer: bool,
    /// Reserved bits of `req_param`, as a mask over the low 128 bits of the
    /// first beat.
    pub(crate) reserved: u128,
}

/// The reserved bits of a parameter layout (its last field), as a mask over
/// the low 128 bits of the first beat.
const fn reserved_mask(form: ParamForm) -> u128 {
    use super::field::*;
    let fields = match form {
        ParamForm::Port => PORT_PARAM_FIELDS,
        ParamForm::Memory => MEMORY_PARAM_FIELDS,
        ParamForm::Flush => FLUSH_PARAM_FIELDS,
        ParamForm::Read => READ_PARAM_FIELDS,
        ParamForm::Copy => COPY_PARAM_FIELDS,
        ParamForm::Config => CONFIG_PARAM_FIELDS,
        ParamForm::Opaque => return 0,
    };
    let (start, bits) = param_bit_span(fields, fields.len() - 1);
    assert!(start >= 128 && bits < 128);
    ((1u128 << bits) - 1) << (256 - (start + bits))
}

/// [`TypeInfo`] of every code, built at compile time from [`ReqType`].
pub(crate) static TYPE_INFO: [TypeInfo; 256] = {
    let mut table = [TypeInfo {
        kind: None,
        form: ParamForm::Opaque,
        carries_payload: false,
        is_answer: false,
        reserved: 0,
    }; 256];
    let mut code = 0;
    while code < 256 {
        if let Some(kind) = ReqType::from_u8(code as u8) {
            table[code] = TypeInfo {
                kind: Some(kind),
                form: kind.form(),
                carries_payload: kind.carries_payload(),
                is_answer: kind.is_answer(),
                reserved: reserved_mask(kind.form()),
            };
        }
        code += 1;
    }
    table
};

impl ReqType {
    /// Whether this type answers another (a completion, ACCEPT, NOTIFY or
    /// CLOSE): only these may carry the ERROR flag and a non-zero status.
    #[inline]
    pub const fn is_answer(self) -> bool {
        matches!(
            self,
            ReqType::SendCmpl
                | ReqType::RecvCmpl
                | ReqType::WriteCmpl
                | ReqType::ReadCmpl
                | ReqType::FlushCmpl
                | ReqType::CopyCmpl
                | ReqType::ConfigCmpl
                | ReqType::PushCmpl
                | ReqType::Accept
                | ReqType::Close
                | ReqType::Notify
                | ReqType::User(_)
        )
    }

    /// The type that answers a request of this type (SEND → SEND_CMPL,
    /// CONNECT → ACCEPT, …), or `None` for types that are answers
    /// themselves and for user types: nobody answers an answer.
    pub const fn answer(self) -> Option<ReqType> {
        Some(match self {
            ReqType::Send => ReqType::SendCmpl,
            ReqType::Recv => ReqType::RecvCmpl,
            ReqType::Write => ReqType::WriteCmpl,
            ReqType::Read => ReqType::ReadCmpl,
            ReqType::Flush => ReqType::FlushCmpl,
            ReqType::Copy | ReqType::CopyWrite => ReqType::CopyCmpl,
            ReqType::Config | ReqType::Update => ReqType::ConfigCmpl,
            ReqType::Push => ReqType::PushCmpl,
            ReqType::Forward => ReqType::Notify,
            ReqType::Connect => ReqType::Accept,
            _ => return None,
        })
    }

    /// Whether the header of this type has the second 32-byte beat.
    #[inline]
    pub const fn has_second_beat(self) -> bool {
        matches!(self.form(), ParamForm::Read | ParamForm::Copy)
    }

    /// Header length in bytes: 32, or 64 with the second beat.
    #[inline]
    pub const fn header_len(self) -> usize {
        if self.has_second_beat() {
            super::field::EXTENDED_HEADER_LEN
        } else {
            super::field::HEADER_LEN
        }
    }
}

impl fmt::Display for ReqType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReqType::User(code) => write!(f, "USER({code:#04x})"),
            other => f.write_str(other.name()),
        }
    }
}

/// The `msg_flag` byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MsgFlags(u8);

impl MsgFlags {
    /// First segment of a message.
    pub const FIRST: MsgFlags = MsgFlags(0x01);
    /// Last segment of a message.
    pub const LAST: MsgFlags = MsgFlags(0x02);
    /// Message boundary: deliver to the application now.
    pub const PUSH: MsgFlags = MsgFlags(0x04);
    /// The answer reports a failure; `req_flag` holds the [`Status`].
    pub const ERROR: MsgFlags = MsgFlags(0x08);
    /// A whole message in one segment: FIRST | LAST.
    pub const WHOLE: MsgFlags = MsgFlags(0x03);
    /// No flag.
    pub const EMPTY: MsgFlags = MsgFlags(0);
    /// Bits that must be zero.
    pub const RESERVED_MASK: u8 = 0xf0;

    /// The flags of wire byte `bits`, or `None` when a reserved bit is set.
    #[inline]
    pub const fn from_bits(bits: u8) -> Option<MsgFlags> {
        if bits & Self::RESERVED_MASK == 0 {
            Some(MsgFlags(bits))
        } else {
            None
        }
    }

    /// The flags of wire byte `bits`, reserved bits included: for views,
    /// whose `check` reports reserved bits.
    #[inline]
    pub(crate) const fn raw(bits: u8) -> MsgFlags {
        MsgFlags(bits)
    }

    /// The wire byte.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every flag of `other` is set.
    #[inline]
    pub const fn contains(self, other: MsgFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags with `other`'s added.
    #[inline]
    pub const fn with(self, other: MsgFlags) -> MsgFlags {
        MsgFlags(self.0 | other.0)
    }

    /// These flags with `other`'s removed.
    #[inline]
    pub const fn without(self, other: MsgFlags) -> MsgFlags {
        MsgFlags(self.0 & !other.0)
    }
}

impl std::ops::BitOr for MsgFlags {
    type Output = MsgFlags;
    fn bitor(self, rhs: MsgFlags) -> MsgFlags {
        self.with(rhs)
    }
}

impl fmt::Debug for MsgFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (MsgFlags::FIRST, "FIRST"),
            (MsgFlags::LAST, "LAST"),
            (MsgFlags::PUSH, "PUSH"),
            (MsgFlags::ERROR, "ERROR"),
        ];
        let mut first = true;
        for (flag, name) in names {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

/// Outcome carried in `req_flag` of an answer whose ERROR flag is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Success (ERROR flag clear).
    Ok,
    /// The forwarding table has no entry for the destination.
    NoRoute,
    /// Access control refused the message.
    Denied,
    /// Nothing listens at the destination port.
    Refused,
    /// The connection was closed.
    Closed,
    /// The peer or a device on the path failed.
    PeerFailed,
    /// The request was malformed or not supported by the destination.
    BadRequest,
    /// A memory address or length lies outside the target's memory.
    OutOfRange,
    /// No answer came in time.
    Timeout,
    /// A status code this version does not know.
    Other(u8),
}

impl Status {
    /// The status of wire code `code`.
    pub const fn from_u8(code: u8) -> Status {
        match code {
            0 => Status::Ok,
            1 => Status::NoRoute,
            2 => Status::Denied,
            3 => Status::Refused,
            4 => Status::Closed,
            5 => Status::PeerFailed,
            6 => Status::BadRequest,
            7 => Status::OutOfRange,
            8 => Status::Timeout,
            other => Status::Other(other),
        }
    }

    /// The wire code.
    pub const fn to_u8(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::NoRoute => 1,
            Status::Denied => 2,
            Status::Refused => 3,
            Status::Closed => 4,
            Status::PeerFailed => 5,
            Status::BadRequest => 6,
            Status::OutOfRange => 7,
            Status::Timeout => 8,
            Status::Other(code) => code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_maps_back_to_itself() {
        for code in 0..=255u8 {
            if let Some(t) = ReqType::from_u8(code) {
                assert_eq!(t.to_u8(), code);
            }
        }
        assert_eq!(ReqType::ALL.len(), 23);
        assert_eq!(ReqType::from_u8(0x00), None);
        assert_eq!(ReqType::from_u8(0x14), None);
        assert_eq!(ReqType::from_u8(0x44), None);
        assert_eq!(ReqType::from_u8(0x80), Some(ReqType::User(0x80)));
    }

    #[test]
    fn dua_codes_are_kept() {
        assert_eq!(ReqType::Send.to_u8(), 0x01);
        assert_eq!(ReqType::Write.to_u8(), 0x05);
        assert_eq!(ReqType::Read.to_u8(), 0x07);
        assert_eq!(ReqType::Copy.to_u8(), 0x0b);
        assert_eq!(ReqType::Update.to_u8(), 0x13);
    }

    #[test]
    fn answers_are_answers_and_are_not_answered() {
        for t in ReqType::ALL {
            if let Some(a) = t.answer() {
                assert!(a.is_answer(), "{t} -> {a}");
                assert_eq!(a.answer(), None, "{a} must not be answered");
            }
        }
        assert_eq!(ReqType::Write.answer(), Some(ReqType::WriteCmpl));
    }

    #[test]
    fn only_read_and_copy_have_a_second_beat() {
        for t in ReqType::ALL {
            let expect = matches!(t, ReqType::Read | ReqType::Copy);
            assert_eq!(t.has_second_beat(), expect, "{t}");
        }
    }

    #[test]
    fn reserved_flag_bits_are_refused() {
        assert!(MsgFlags::from_bits(0x10).is_none());
        assert_eq!(MsgFlags::from_bits(0x0f).unwrap().bits(), 0x0f);
        assert_eq!(format!("{:?}", MsgFlags::WHOLE), "FIRST|LAST");
    }

    #[test]
    fn status_codes_round_trip() {
        for code in 0..=255u8 {
            assert_eq!(Status::from_u8(code).to_u8(), code);
        }
    }
}
