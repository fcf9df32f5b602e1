//! The Verilog header package of the RTL under `hw/`, generated from the one
//! field table in [`uniplane_dataplane::wire::field`] and the request types
//! of [`uniplane_dataplane::wire::ReqType`].
//!
//! The package is `hw/rtl/uniplane_header.vh`: localparams for the bit span
//! of every field (as `[MSB:LSB]` of the 256-bit beat, bit 255 sent first),
//! every request type, flag and status code, and functions that classify a
//! type code (its answer, parameter form, whether it has a second beat). A
//! test fails when the checked-in file differs from [`header_package`].

#![deny(missing_docs)]

use std::fmt::Write;

use uniplane_dataplane::wire::field::{
    self, FieldSpec, CONFIG_PARAM_FIELDS, COPY_PARAM_FIELDS, FLUSH_PARAM_FIELDS, HEADER_FIELDS,
    MEMORY_PARAM_FIELDS, PORT_PARAM_FIELDS, READ_PARAM_FIELDS, SECOND_BEAT_FIELDS,
};
use uniplane_dataplane::wire::{MsgFlags, ParamForm, ReqType, Status};

/// Bits of one beat of the stream (the header is one beat).
pub const BEAT_BITS: u32 = (field::HEADER_LEN * 8) as u32;

/// The layouts the package describes: prefix, fields, and whether the
/// offsets count from the start of `req_param` (true) or of a beat.
const LAYOUTS: &[(&str, &[FieldSpec], bool)] = &[
    ("", HEADER_FIELDS, false),
    ("PORT_", PORT_PARAM_FIELDS, true),
    ("MEM_", MEMORY_PARAM_FIELDS, true),
    ("FLUSH_", FLUSH_PARAM_FIELDS, true),
    ("READ_", READ_PARAM_FIELDS, true),
    ("COPY_", COPY_PARAM_FIELDS, true),
    ("CNFG_", CONFIG_PARAM_FIELDS, true),
    ("EXT_", SECOND_BEAT_FIELDS, false),
];

/// The code the package gives each parameter form (`up_form`).
pub const fn form_code(form: ParamForm) -> u8 {
    match form {
        ParamForm::Port => 0,
        ParamForm::Memory => 1,
        ParamForm::Flush => 2,
        ParamForm::Read => 3,
        ParamForm::Copy => 4,
        ParamForm::Config => 5,
        ParamForm::Opaque => 6,
    }
}

const FORMS: &[(&str, ParamForm)] = &[
    ("PORT", ParamForm::Port),
    ("MEMORY", ParamForm::Memory),
    ("FLUSH", ParamForm::Flush),
    ("READ", ParamForm::Read),
    ("COPY", ParamForm::Copy),
    ("CONFIG", ParamForm::Config),
    ("OPAQUE", ParamForm::Opaque),
];

/// `[MSB:LSB]` of a field whose span from the beat's top is `(start, bits)`.
pub const fn msb_lsb(start: u32, bits: u32) -> (u32, u32) {
    (BEAT_BITS - 1 - start, BEAT_BITS - start - bits)
}

/// A 32-bit FNV-1a digest of the field tables and the type codes. The RTL
/// reports it in its ID register block, so a driver notices RTL built
/// from another version of the header.
pub fn layout_hash() -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |s: &str| {
        for b in s.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    for (prefix, fields, _) in LAYOUTS {
        for f in *fields {
            eat(&format!("{prefix}{}:{};", f.name, f.bits));
        }
    }
    for t in ReqType::ALL {
        eat(&format!("{}={};", t.name(), t.to_u8()));
    }
    h
}

fn upper_snake(camel: &str) -> String {
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn status_name(s: Status) -> String {
    upper_snake(&format!("{s:?}"))
}

/// One `case` function over every type code the codec knows.
fn case_function(
    out: &mut String,
    doc: &str,
    width: u32,
    name: &str,
    default: &str,
    value: impl Fn(ReqType) -> Option<String>,
) {
    let ret = if width == 1 {
        String::new()
    } else {
        format!("[{}:0] ", width - 1)
    };
    let _ = writeln!(out, "// {doc}");
    let _ = writeln!(out, "function {ret}{name};");
    let _ = writeln!(out, "    input [7:0] code;");
    let _ = writeln!(out, "    begin");
    let _ = writeln!(out, "        case (code)");
    for t in ReqType::ALL {
        if let Some(v) = value(*t) {
            let _ = writeln!(
                out,
                "            8'h{:02x}: {name} = {v}; // {}",
                t.to_u8(),
                t.name()
            );
        }
    }
    let _ = writeln!(out, "            default: {name} = {default};");
    let _ = writeln!(out, "        endcase");
    let _ = writeln!(out, "    end");
    let _ = writeln!(out, "endfunction");
    let _ = writeln!(out);
}

/// The text of `hw/rtl/uniplane_header.vh`.
pub fn header_package() -> String {
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(w, "// uniplane header package: GENERATED, do not edit.");
    let _ = writeln!(
        w,
        "// Source: dataplane/src/wire/field.rs and dataplane/src/wire/types.rs."
    );
    let _ = writeln!(
        w,
        "// Regenerate: cargo run -p uniplane-hw-gen > hw/rtl/uniplane_header.vh"
    );
    let _ = writeln!(
        w,
        "// Include inside a module body. Bit 255 of a beat is sent first."
    );
    let _ = writeln!(w, "/* verilator lint_off UNUSEDPARAM */");
    let _ = writeln!(w);
    let _ = writeln!(w, "localparam UP_BEAT_BITS = {BEAT_BITS};");
    let _ = writeln!(w, "localparam UP_HEADER_BYTES = {};", field::HEADER_LEN);
    let _ = writeln!(
        w,
        "localparam UP_EXT_HEADER_BYTES = {};",
        field::EXTENDED_HEADER_LEN
    );
    let _ = writeln!(
        w,
        "localparam [31:0] UP_LAYOUT_HASH = 32'h{:08x};",
        layout_hash()
    );
    let _ = writeln!(w);
    for (prefix, fields, in_param) in LAYOUTS {
        let base = if *in_param { field::REQ_PARAM_BIT } else { 0 };
        let what = match *prefix {
            "" => "header beat".to_owned(),
            "EXT_" => "second beat of READ and COPY".to_owned(),
            p => format!("req_param layout {}", p.trim_end_matches('_')),
        };
        let _ = writeln!(w, "// Fields of the {what}.");
        let mut start = base;
        for f in *fields {
            let (msb, lsb) = msb_lsb(start, f.bits);
            let n = format!("UP_{prefix}{}", f.name.to_ascii_uppercase());
            let _ = writeln!(
                w,
                "localparam {n}_MSB = {msb}, {n}_LSB = {lsb}, {n}_W = {};",
                f.bits
            );
            start += f.bits;
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w, "// Request types (req_type).");
    for t in ReqType::ALL {
        let _ = writeln!(
            w,
            "localparam [7:0] UP_REQ_{} = 8'h{:02x};",
            t.name(),
            t.to_u8()
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "// Message flags (msg_flag).");
    for (name, f) in [
        ("FIRST", MsgFlags::FIRST),
        ("LAST", MsgFlags::LAST),
        ("PUSH", MsgFlags::PUSH),
        ("ERROR", MsgFlags::ERROR),
        ("WHOLE", MsgFlags::WHOLE),
    ] {
        let _ = writeln!(w, "localparam [7:0] UP_FLAG_{name} = 8'h{:02x};", f.bits());
    }
    let _ = writeln!(
        w,
        "localparam [7:0] UP_FLAG_RESERVED_MASK = 8'h{:02x};",
        MsgFlags::RESERVED_MASK
    );
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "// Completion status codes (req_flag of an ERROR answer)."
    );
    for code in 0..=8u8 {
        let s = Status::from_u8(code);
        let _ = writeln!(
            w,
            "localparam [7:0] UP_STATUS_{} = 8'h{code:02x};",
            status_name(s)
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "// Parameter forms (up_form).");
    for (name, f) in FORMS {
        let _ = writeln!(w, "localparam [2:0] UP_FORM_{name} = 3'd{};", form_code(*f));
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "/* verilator lint_on UNUSEDPARAM */");
    let _ = writeln!(w);
    case_function(
        w,
        "Whether a code is a request type the codec accepts (user types 0x80-0xff included).",
        1,
        "up_known_type",
        "code[7]",
        |_| Some("1'b1".into()),
    );
    case_function(
        w,
        "The type answering a request of type `code`, or 0 when nobody answers it.",
        8,
        "up_answer_code",
        "8'h00",
        |t| t.answer().map(|a| format!("8'h{:02x}", a.to_u8())),
    );
    case_function(
        w,
        "The req_param layout of type `code` (UP_FORM_*).",
        3,
        "up_form",
        "UP_FORM_OPAQUE",
        |t| Some(format!("3'd{}", form_code(t.form()))),
    );
    case_function(
        w,
        "Whether the header of type `code` has the second beat (READ, COPY).",
        1,
        "up_has_second_beat",
        "1'b0",
        |t| t.has_second_beat().then(|| "1'b1".into()),
    );
    case_function(
        w,
        "Whether a message of type `code` may carry payload.",
        1,
        "up_carries_payload",
        "code[7]",
        |t| Some(if t.carries_payload() { "1'b1" } else { "1'b0" }.into()),
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHECKED_IN: &str = include_str!("../../rtl/uniplane_header.vh");

    #[test]
    fn the_checked_in_verilog_package_is_the_generated_one() {
        assert!(
            CHECKED_IN == header_package(),
            "hw/rtl/uniplane_header.vh is stale: run \
             `cargo run -p uniplane-hw-gen > hw/rtl/uniplane_header.vh`"
        );
    }

    #[test]
    fn header_fields_sit_where_the_codec_puts_them() {
        // src_uid is the first 48 bits: [255:208].
        assert_eq!(msb_lsb(0, 48), (255, 208));
        let pkg = header_package();
        assert!(pkg
            .contains("localparam UP_SRC_UID_MSB = 255, UP_SRC_UID_LSB = 208, UP_SRC_UID_W = 48;"));
        assert!(pkg.contains(
            "localparam UP_REQ_TYPE_MSB = 103, UP_REQ_TYPE_LSB = 96, UP_REQ_TYPE_W = 8;"
        ));
        assert!(pkg.contains("localparam [7:0] UP_REQ_WRTE_CMPL = 8'h06;"));
        assert!(pkg.contains("localparam [7:0] UP_STATUS_NO_ROUTE = 8'h01;"));
    }
}
