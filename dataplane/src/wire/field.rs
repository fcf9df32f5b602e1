//! The one field table of the DUA message header.
//!
//! Every other definition of the header — the byte ranges used by the codec,
//! the parameter layouts, the Verilog package under `hw/` — derives from the
//! tables in this module. Bits are numbered as the RTL numbers them: the
//! header is one 256-bit beat, the first field in the most significant bits,
//! sent first (big-endian).

use std::ops::Range;

/// One named field of a fixed layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldSpec {
    /// The field's name, as the RTL spells it.
    pub name: &'static str,
    /// Width in bits.
    pub bits: u32,
}

impl FieldSpec {
    const fn new(name: &'static str, bits: u32) -> Self {
        FieldSpec { name, bits }
    }
}

/// Size of one beat, and of the fixed header, in bytes.
pub const HEADER_LEN: usize = 32;
/// Size of the header of READ and COPY, which carry a second beat.
pub const EXTENDED_HEADER_LEN: usize = 2 * HEADER_LEN;

/// The header beat, most significant field first (DUA's `SiliconNetHead`).
pub const HEADER_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("src_uid", 48),
    FieldSpec::new("dst_uid", 48),
    FieldSpec::new("msg_length", 16),
    FieldSpec::new("msg_flag", 8),
    FieldSpec::new("msg_seqnum", 32),
    FieldSpec::new("req_type", 8),
    FieldSpec::new("req_param", 96),
];

/// Layout of `req_param` for SEND, RECV, PUSH, FWRD, their completions and
/// connection control.
pub const PORT_PARAM_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("req_flag", 8),
    FieldSpec::new("src_port", 16),
    FieldSpec::new("dst_port", 16),
    FieldSpec::new("reserved", 56),
];

/// Layout of `req_param` for WRTE, COPY_WRTE, READ_CMPL and the write and
/// copy completions.
pub const MEMORY_PARAM_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("req_flag", 8),
    FieldSpec::new("req_length", 16),
    FieldSpec::new("dst_addr", 64),
    FieldSpec::new("reserved", 8),
];

/// Layout of `req_param` for FLSH and FLSH_CMPL.
pub const FLUSH_PARAM_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("req_flag", 8),
    FieldSpec::new("reserved", 88),
];

/// Layout of `req_param` for READ (first beat).
pub const READ_PARAM_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("req_flag", 8),
    FieldSpec::new("req_length", 16),
    FieldSpec::new("reserved", 72),
];

/// Layout of `req_param` for COPY (first beat): `req_uid` is the resource
/// the copied bytes are written to.
pub const COPY_PARAM_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("req_flag", 8),
    FieldSpec::new("req_length", 16),
    FieldSpec::new("req_uid", 48),
    FieldSpec::new("reserved", 24),
];

/// Layout of `req_param` for CNFG, CNFG_CMPL and UPDT: a 16-bit register
/// address and a 64-bit value.
pub const CONFIG_PARAM_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("req_flag", 8),
    FieldSpec::new("reg_addr", 16),
    FieldSpec::new("reg_value", 64),
    FieldSpec::new("reserved", 8),
];

/// The second beat of READ and COPY.
pub const SECOND_BEAT_FIELDS: &[FieldSpec] = &[
    FieldSpec::new("src_addr", 64),
    FieldSpec::new("dst_addr", 64),
    FieldSpec::new("reserved", 128),
];

/// Total width of a layout in bits.
pub const fn total_bits(fields: &[FieldSpec]) -> u32 {
    let mut sum = 0;
    let mut i = 0;
    while i < fields.len() {
        sum += fields[i].bits;
        i += 1;
    }
    sum
}

/// Byte range of field `index` of a byte-aligned layout, counted from the
/// layout's first byte.
pub const fn byte_range(fields: &[FieldSpec], index: usize) -> Range<usize> {
    let mut start = 0;
    let mut i = 0;
    while i < index {
        start += fields[i].bits;
        i += 1;
    }
    assert!(start % 8 == 0 && fields[index].bits.is_multiple_of(8));
    let start = (start / 8) as usize;
    start..start + (fields[index].bits / 8) as usize
}

/// Bit span of field `index` of a layout: its offset from the layout's most
/// significant bit, and its width.
pub const fn bit_span(fields: &[FieldSpec], index: usize) -> (u32, u32) {
    let mut start = 0;
    let mut i = 0;
    while i < index {
        start += fields[i].bits;
        i += 1;
    }
    (start, fields[index].bits)
}

/// Bit offset of `req_param` in the header beat.
pub const REQ_PARAM_BIT: u32 = bit_span(HEADER_FIELDS, 6).0;

/// Bit span of field `index` of a parameter layout, counted from the header
/// beat's most significant bit.
pub const fn param_bit_span(fields: &[FieldSpec], index: usize) -> (u32, u32) {
    let (start, bits) = bit_span(fields, index);
    (REQ_PARAM_BIT + start, bits)
}

const fn shift(r: Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}

/// Source UID.
pub const SRC_UID: Range<usize> = byte_range(HEADER_FIELDS, 0);
/// Destination UID.
pub const DST_UID: Range<usize> = byte_range(HEADER_FIELDS, 1);
/// Payload length of this message (segment) in bytes.
pub const MSG_LENGTH: Range<usize> = byte_range(HEADER_FIELDS, 2);
/// Message flags: FIRST, LAST, PUSH, ERROR.
pub const MSG_FLAG: usize = byte_range(HEADER_FIELDS, 3).start;
/// Per-connection sequence number.
pub const MSG_SEQNUM: Range<usize> = byte_range(HEADER_FIELDS, 4);
/// Request type.
pub const REQ_TYPE: usize = byte_range(HEADER_FIELDS, 5).start;
/// The 96-bit request parameters.
pub const REQ_PARAM: Range<usize> = byte_range(HEADER_FIELDS, 6);

/// `req_flag`, first byte of every parameter layout.
pub const REQ_FLAG: usize = REQ_PARAM.start;
/// `src_port` of the port layout.
pub const SRC_PORT: Range<usize> = shift(byte_range(PORT_PARAM_FIELDS, 1), REQ_PARAM.start);
/// `dst_port` of the port layout.
pub const DST_PORT: Range<usize> = shift(byte_range(PORT_PARAM_FIELDS, 2), REQ_PARAM.start);
/// Reserved tail of the port layout.
pub const PORT_RESERVED: Range<usize> = shift(byte_range(PORT_PARAM_FIELDS, 3), REQ_PARAM.start);
/// `req_length` of the memory, read, copy layouts (`reg_addr` of config).
pub const REQ_LENGTH: Range<usize> = shift(byte_range(MEMORY_PARAM_FIELDS, 1), REQ_PARAM.start);
/// `dst_addr` of the memory layout (`reg_value` of config).
pub const MEM_ADDR: Range<usize> = shift(byte_range(MEMORY_PARAM_FIELDS, 2), REQ_PARAM.start);
/// Reserved tail of the memory and config layouts.
pub const MEM_RESERVED: Range<usize> = shift(byte_range(MEMORY_PARAM_FIELDS, 3), REQ_PARAM.start);
/// Reserved tail of the flush layout.
pub const FLUSH_RESERVED: Range<usize> = shift(byte_range(FLUSH_PARAM_FIELDS, 1), REQ_PARAM.start);
/// Reserved tail of the read layout.
pub const READ_RESERVED: Range<usize> = shift(byte_range(READ_PARAM_FIELDS, 2), REQ_PARAM.start);
/// `req_uid` of the copy layout.
pub const COPY_UID: Range<usize> = shift(byte_range(COPY_PARAM_FIELDS, 2), REQ_PARAM.start);
/// Reserved tail of the copy layout.
pub const COPY_RESERVED: Range<usize> = shift(byte_range(COPY_PARAM_FIELDS, 3), REQ_PARAM.start);
/// `src_addr` of the second beat.
pub const EXT_SRC_ADDR: Range<usize> = shift(byte_range(SECOND_BEAT_FIELDS, 0), HEADER_LEN);
/// `dst_addr` of the second beat.
pub const EXT_DST_ADDR: Range<usize> = shift(byte_range(SECOND_BEAT_FIELDS, 1), HEADER_LEN);
/// Reserved tail of the second beat.
pub const EXT_RESERVED: Range<usize> = shift(byte_range(SECOND_BEAT_FIELDS, 2), HEADER_LEN);

// The tables must fill their beats exactly; a wrong width fails the build.
const _: () = assert!(total_bits(HEADER_FIELDS) as usize == HEADER_LEN * 8);
const _: () = assert!(total_bits(SECOND_BEAT_FIELDS) as usize == HEADER_LEN * 8);
const _: () = assert!(total_bits(PORT_PARAM_FIELDS) == 96);
const _: () = assert!(total_bits(MEMORY_PARAM_FIELDS) == 96);
const _: () = assert!(total_bits(FLUSH_PARAM_FIELDS) == 96);
const _: () = assert!(total_bits(READ_PARAM_FIELDS) == 96);
const _: () = assert!(total_bits(COPY_PARAM_FIELDS) == 96);
const _: () = assert!(total_bits(CONFIG_PARAM_FIELDS) == 96);
const _: () = assert!(REQ_PARAM.end == HEADER_LEN);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_byte_ranges_follow_the_table() {
        assert_eq!(SRC_UID, 0..6);
        assert_eq!(DST_UID, 6..12);
        assert_eq!(MSG_LENGTH, 12..14);
        assert_eq!(MSG_FLAG, 14);
        assert_eq!(MSG_SEQNUM, 15..19);
        assert_eq!(REQ_TYPE, 19);
        assert_eq!(REQ_PARAM, 20..32);
    }

    #[test]
    fn parameter_ranges_sit_inside_req_param() {
        assert_eq!(SRC_PORT, 21..23);
        assert_eq!(DST_PORT, 23..25);
        assert_eq!(PORT_RESERVED, 25..32);
        assert_eq!(REQ_LENGTH, 21..23);
        assert_eq!(MEM_ADDR, 23..31);
        assert_eq!(COPY_UID, 23..29);
        assert_eq!(EXT_SRC_ADDR, 32..40);
        assert_eq!(EXT_DST_ADDR, 40..48);
        assert_eq!(EXT_RESERVED, 48..64);
    }
}
