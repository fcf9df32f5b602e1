// uniplane header package: GENERATED, do not edit.
// Source: dataplane/src/wire/field.rs and dataplane/src/wire/types.rs.
// Regenerate: cargo run -p uniplane-hw-gen > hw/rtl/uniplane_header.vh
// Include inside a module body. Bit 255 of a beat is sent first.
/* verilator lint_off UNUSEDPARAM */

localparam UP_BEAT_BITS = 256;
localparam UP_HEADER_BYTES = 32;
localparam UP_EXT_HEADER_BYTES = 64;
localparam [31:0] UP_LAYOUT_HASH = 32'h642863a6;

// Fields of the header beat.
localparam UP_SRC_UID_MSB = 255, UP_SRC_UID_LSB = 208, UP_SRC_UID_W = 48;
localparam UP_DST_UID_MSB = 207, UP_DST_UID_LSB = 160, UP_DST_UID_W = 48;
localparam UP_MSG_LENGTH_MSB = 159, UP_MSG_LENGTH_LSB = 144, UP_MSG_LENGTH_W = 16;
localparam UP_MSG_FLAG_MSB = 143, UP_MSG_FLAG_LSB = 136, UP_MSG_FLAG_W = 8;
localparam UP_MSG_SEQNUM_MSB = 135, UP_MSG_SEQNUM_LSB = 104, UP_MSG_SEQNUM_W = 32;
localparam UP_REQ_TYPE_MSB = 103, UP_REQ_TYPE_LSB = 96, UP_REQ_TYPE_W = 8;
localparam UP_REQ_PARAM_MSB = 95, UP_REQ_PARAM_LSB = 0, UP_REQ_PARAM_W = 96;

// Fields of the req_param layout PORT.
localparam UP_PORT_REQ_FLAG_MSB = 95, UP_PORT_REQ_FLAG_LSB = 88, UP_PORT_REQ_FLAG_W = 8;
localparam UP_PORT_SRC_PORT_MSB = 87, UP_PORT_SRC_PORT_LSB = 72, UP_PORT_SRC_PORT_W = 16;
localparam UP_PORT_DST_PORT_MSB = 71, UP_PORT_DST_PORT_LSB = 56, UP_PORT_DST_PORT_W = 16;
localparam UP_PORT_RESERVED_MSB = 55, UP_PORT_RESERVED_LSB = 0, UP_PORT_RESERVED_W = 56;

// Fields of the req_param layout MEM.
localparam UP_MEM_REQ_FLAG_MSB = 95, UP_MEM_REQ_FLAG_LSB = 88, UP_MEM_REQ_FLAG_W = 8;
localparam UP_MEM_REQ_LENGTH_MSB = 87, UP_MEM_REQ_LENGTH_LSB = 72, UP_MEM_REQ_LENGTH_W = 16;
localparam UP_MEM_DST_ADDR_MSB = 71, UP_MEM_DST_ADDR_LSB = 8, UP_MEM_DST_ADDR_W = 64;
localparam UP_MEM_RESERVED_MSB = 7, UP_MEM_RESERVED_LSB = 0, UP_MEM_RESERVED_W = 8;

// Fields of the req_param layout FLUSH.
localparam UP_FLUSH_REQ_FLAG_MSB = 95, UP_FLUSH_REQ_FLAG_LSB = 88, UP_FLUSH_REQ_FLAG_W = 8;
localparam UP_FLUSH_RESERVED_MSB = 87, UP_FLUSH_RESERVED_LSB = 0, UP_FLUSH_RESERVED_W = 88;

// Fields of the req_param layout READ.
localparam UP_READ_REQ_FLAG_MSB = 95, UP_READ_REQ_FLAG_LSB = 88, UP_READ_REQ_FLAG_W = 8;
localparam UP_READ_REQ_LENGTH_MSB = 87, UP_READ_REQ_LENGTH_LSB = 72, UP_READ_REQ_LENGTH_W = 16;
localparam UP_READ_RESERVED_MSB = 71, UP_READ_RESERVED_LSB = 0, UP_READ_RESERVED_W = 72;

// Fields of the req_param layout COPY.
localparam UP_COPY_REQ_FLAG_MSB = 95, UP_COPY_REQ_FLAG_LSB = 88, UP_COPY_REQ_FLAG_W = 8;
localparam UP_COPY_REQ_LENGTH_MSB = 87, UP_COPY_REQ_LENGTH_LSB = 72, UP_COPY_REQ_LENGTH_W = 16;
localparam UP_COPY_REQ_UID_MSB = 71, UP_COPY_REQ_UID_LSB = 24, UP_COPY_REQ_UID_W = 48;
localparam UP_COPY_RESERVED_MSB = 23, UP_COPY_RESERVED_LSB = 0, UP_COPY_RESERVED_W = 24;

// Fields of the req_param layout CNFG.
localparam UP_CNFG_REQ_FLAG_MSB = 95, UP_CNFG_REQ_FLAG_LSB = 88, UP_CNFG_REQ_FLAG_W = 8;
localparam UP_CNFG_REG_ADDR_MSB = 87, UP_CNFG_REG_ADDR_LSB = 72, UP_CNFG_REG_ADDR_W = 16;
localparam UP_CNFG_REG_VALUE_MSB = 71, UP_CNFG_REG_VALUE_LSB = 8, UP_CNFG_REG_VALUE_W = 64;
localparam UP_CNFG_RESERVED_MSB = 7, UP_CNFG_RESERVED_LSB = 0, UP_CNFG_RESERVED_W = 8;

// Fields of the second beat of READ and COPY.
localparam UP_EXT_SRC_ADDR_MSB = 255, UP_EXT_SRC_ADDR_LSB = 192, UP_EXT_SRC_ADDR_W = 64;
localparam UP_EXT_DST_ADDR_MSB = 191, UP_EXT_DST_ADDR_LSB = 128, UP_EXT_DST_ADDR_W = 64;
localparam UP_EXT_RESERVED_MSB = 127, UP_EXT_RESERVED_LSB = 0, UP_EXT_RESERVED_W = 128;

// Request types (req_type).
localparam [7:0] UP_REQ_SEND = 8'h01;
localparam [7:0] UP_REQ_SEND_CMPL = 8'h02;
localparam [7:0] UP_REQ_RECV = 8'h03;
localparam [7:0] UP_REQ_RECV_CMPL = 8'h04;
localparam [7:0] UP_REQ_WRTE = 8'h05;
localparam [7:0] UP_REQ_WRTE_CMPL = 8'h06;
localparam [7:0] UP_REQ_READ = 8'h07;
localparam [7:0] UP_REQ_READ_CMPL = 8'h08;
localparam [7:0] UP_REQ_FLSH = 8'h09;
localparam [7:0] UP_REQ_FLSH_CMPL = 8'h0a;
localparam [7:0] UP_REQ_COPY = 8'h0b;
localparam [7:0] UP_REQ_COPY_WRTE = 8'h0c;
localparam [7:0] UP_REQ_COPY_CMPL = 8'h0d;
localparam [7:0] UP_REQ_CNFG = 8'h0e;
localparam [7:0] UP_REQ_CNFG_CMPL = 8'h0f;
localparam [7:0] UP_REQ_FWRD = 8'h10;
localparam [7:0] UP_REQ_PUSH = 8'h11;
localparam [7:0] UP_REQ_PUSH_CMPL = 8'h12;
localparam [7:0] UP_REQ_UPDT = 8'h13;
localparam [7:0] UP_REQ_CONNECT = 8'h40;
localparam [7:0] UP_REQ_ACCEPT = 8'h41;
localparam [7:0] UP_REQ_CLOSE = 8'h42;
localparam [7:0] UP_REQ_NOTIFY = 8'h43;

// Message flags (msg_flag).
localparam [7:0] UP_FLAG_FIRST = 8'h01;
localparam [7:0] UP_FLAG_LAST = 8'h02;
localparam [7:0] UP_FLAG_PUSH = 8'h04;
localparam [7:0] UP_FLAG_ERROR = 8'h08;
localparam [7:0] UP_FLAG_WHOLE = 8'h03;
localparam [7:0] UP_FLAG_RESERVED_MASK = 8'hf0;

// Completion status codes (req_flag of an ERROR answer).
localparam [7:0] UP_STATUS_OK = 8'h00;
localparam [7:0] UP_STATUS_NO_ROUTE = 8'h01;
localparam [7:0] UP_STATUS_DENIED = 8'h02;
localparam [7:0] UP_STATUS_REFUSED = 8'h03;
localparam [7:0] UP_STATUS_CLOSED = 8'h04;
localparam [7:0] UP_STATUS_PEER_FAILED = 8'h05;
localparam [7:0] UP_STATUS_BAD_REQUEST = 8'h06;
localparam [7:0] UP_STATUS_OUT_OF_RANGE = 8'h07;
localparam [7:0] UP_STATUS_TIMEOUT = 8'h08;

// Parameter forms (up_form).
localparam [2:0] UP_FORM_PORT = 3'd0;
localparam [2:0] UP_FORM_MEMORY = 3'd1;
localparam [2:0] UP_FORM_FLUSH = 3'd2;
localparam [2:0] UP_FORM_READ = 3'd3;
localparam [2:0] UP_FORM_COPY = 3'd4;
localparam [2:0] UP_FORM_CONFIG = 3'd5;
localparam [2:0] UP_FORM_OPAQUE = 3'd6;

/* verilator lint_on UNUSEDPARAM */

// Whether a code is a request type the codec accepts (user types 0x80-0xff included).
function up_known_type;
    input [7:0] code;
    begin
        case (code)
            8'h01: up_known_type = 1'b1; // SEND
            8'h02: up_known_type = 1'b1; // SEND_CMPL
            8'h03: up_known_type = 1'b1; // RECV
            8'h04: up_known_type = 1'b1; // RECV_CMPL
            8'h05: up_known_type = 1'b1; // WRTE
            8'h06: up_known_type = 1'b1; // WRTE_CMPL
            8'h07: up_known_type = 1'b1; // READ
            8'h08: up_known_type = 1'b1; // READ_CMPL
            8'h09: up_known_type = 1'b1; // FLSH
            8'h0a: up_known_type = 1'b1; // FLSH_CMPL
            8'h0b: up_known_type = 1'b1; // COPY
            8'h0c: up_known_type = 1'b1; // COPY_WRTE
            8'h0d: up_known_type = 1'b1; // COPY_CMPL
            8'h0e: up_known_type = 1'b1; // CNFG
            8'h0f: up_known_type = 1'b1; // CNFG_CMPL
            8'h10: up_known_type = 1'b1; // FWRD
            8'h11: up_known_type = 1'b1; // PUSH
            8'h12: up_known_type = 1'b1; // PUSH_CMPL
            8'h13: up_known_type = 1'b1; // UPDT
            8'h40: up_known_type = 1'b1; // CONNECT
            8'h41: up_known_type = 1'b1; // ACCEPT
            8'h42: up_known_type = 1'b1; // CLOSE
            8'h43: up_known_type = 1'b1; // NOTIFY
            default: up_known_type = code[7];
        endcase
    end
endfunction

// The type answering a request of type `code`, or 0 when nobody answers it.
function [7:0] up_answer_code;
    input [7:0] code;
    begin
        case (code)
            8'h01: up_answer_code = 8'h02; // SEND
            8'h03: up_answer_code = 8'h04; // RECV
            8'h05: up_answer_code = 8'h06; // WRTE
            8'h07: up_answer_code = 8'h08; // READ
            8'h09: up_answer_code = 8'h0a; // FLSH
            8'h0b: up_answer_code = 8'h0d; // COPY
            8'h0c: up_answer_code = 8'h0d; // COPY_WRTE
            8'h0e: up_answer_code = 8'h0f; // CNFG
            8'h10: up_answer_code = 8'h43; // FWRD
            8'h11: up_answer_code = 8'h12; // PUSH
            8'h13: up_answer_code = 8'h0f; // UPDT
            8'h40: up_answer_code = 8'h41; // CONNECT
            default: up_answer_code = 8'h00;
        endcase
    end
endfunction

// The req_param layout of type `code` (UP_FORM_*).
function [2:0] up_form;
    input [7:0] code;
    begin
        case (code)
            8'h01: up_form = 3'd0; // SEND
            8'h02: up_form = 3'd0; // SEND_CMPL
            8'h03: up_form = 3'd0; // RECV
            8'h04: up_form = 3'd0; // RECV_CMPL
            8'h05: up_form = 3'd1; // WRTE
            8'h06: up_form = 3'd1; // WRTE_CMPL
            8'h07: up_form = 3'd3; // READ
            8'h08: up_form = 3'd1; // READ_CMPL
            8'h09: up_form = 3'd2; // FLSH
            8'h0a: up_form = 3'd2; // FLSH_CMPL
            8'h0b: up_form = 3'd4; // COPY
            8'h0c: up_form = 3'd1; // COPY_WRTE
            8'h0d: up_form = 3'd1; // COPY_CMPL
            8'h0e: up_form = 3'd5; // CNFG
            8'h0f: up_form = 3'd5; // CNFG_CMPL
            8'h10: up_form = 3'd0; // FWRD
            8'h11: up_form = 3'd0; // PUSH
            8'h12: up_form = 3'd0; // PUSH_CMPL
            8'h13: up_form = 3'd5; // UPDT
            8'h40: up_form = 3'd0; // CONNECT
            8'h41: up_form = 3'd0; // ACCEPT
            8'h42: up_form = 3'd0; // CLOSE
            8'h43: up_form = 3'd0; // NOTIFY
            default: up_form = UP_FORM_OPAQUE;
        endcase
    end
endfunction

// Whether the header of type `code` has the second beat (READ, COPY).
function up_has_second_beat;
    input [7:0] code;
    begin
        case (code)
            8'h07: up_has_second_beat = 1'b1; // READ
            8'h0b: up_has_second_beat = 1'b1; // COPY
            default: up_has_second_beat = 1'b0;
        endcase
    end
endfunction

// Whether a message of type `code` may carry payload.
function up_carries_payload;
    input [7:0] code;
    begin
        case (code)
            8'h01: up_carries_payload = 1'b1; // SEND
            8'h02: up_carries_payload = 1'b0; // SEND_CMPL
            8'h03: up_carries_payload = 1'b1; // RECV
            8'h04: up_carries_payload = 1'b1; // RECV_CMPL
            8'h05: up_carries_payload = 1'b1; // WRTE
            8'h06: up_carries_payload = 1'b0; // WRTE_CMPL
            8'h07: up_carries_payload = 1'b0; // READ
            8'h08: up_carries_payload = 1'b1; // READ_CMPL
            8'h09: up_carries_payload = 1'b0; // FLSH
            8'h0a: up_carries_payload = 1'b0; // FLSH_CMPL
            8'h0b: up_carries_payload = 1'b0; // COPY
            8'h0c: up_carries_payload = 1'b1; // COPY_WRTE
            8'h0d: up_carries_payload = 1'b0; // COPY_CMPL
            8'h0e: up_carries_payload = 1'b0; // CNFG
            8'h0f: up_carries_payload = 1'b0; // CNFG_CMPL
            8'h10: up_carries_payload = 1'b1; // FWRD
            8'h11: up_carries_payload = 1'b1; // PUSH
            8'h12: up_carries_payload = 1'b0; // PUSH_CMPL
            8'h13: up_carries_payload = 1'b1; // UPDT
            8'h40: up_carries_payload = 1'b1; // CONNECT
            8'h41: up_carries_payload = 1'b1; // ACCEPT
            8'h42: up_carries_payload = 1'b0; // CLOSE
            8'h43: up_carries_payload = 1'b1; // NOTIFY
            default: up_carries_payload = code[7];
        endcase
    end
endfunction

