// uniplane: the streaming reduction kernel in RTL (services/kernel `Sum32`,
// answered as the daemon's kernel device answers it).
//
// One crossbar port's protocol on both sides: s_* comes from the crossbar
// (the messages a device port is sent), m_* goes back to it; 256-bit
// beats, first/last, and the message's length in bytes (header included)
// on the first beat.
//
//   SEND or PUSH, ERROR flag clear, msg_length a multiple of 4
//       -> the same type back to its source (src_uid <-> dst_uid,
//          src_port <-> dst_port, req_flag 0, reserved 0, msg_flag and
//          msg_seqnum kept, msg_length 4) with one payload beat: the
//          wrapping sum of the payload's little-endian 32-bit words, as 4
//          little-endian bytes (the rest of the beat zero)
//   SEND or PUSH, ERROR flag clear, msg_length not a multiple of 4
//       -> what Message::error_answer(BAD_REQUEST) builds, as the kernel
//          device answers KernelError::Misaligned: SEND_CMPL (PUSH_CMPL)
//          back to the source, ports swapped, msg_flag FIRST|LAST|ERROR,
//          req_flag = UP_STATUS_BAD_REQUEST, the same seqnum, no payload;
//          counted in `misaligned`
//   anything else
//       -> consumed whole, nothing sent, counted in `dropped`
//
// Streaming: the answer's header leaves as the request's header arrives
// (it depends on the header alone), each payload beat is added to the
// running sum as it arrives (8 words per beat; in the last beat only the
// words msg_length covers), and the sum beat leaves with the last payload
// beat. Nothing but the 32-bit sum is held. The input takes one beat per
// cycle, except one cycle after a request with no payload (its answer is
// two beats); the output is registered by a skid buffer, and back-pressure
// on m_tready stalls the input without loss. s_tlen is taken for the
// port's shape; the header's msg_length is what the kernel reads.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_kernel_sum32 #(
    parameter LW = 17,   // width of tlen (bytes of a message, header included)
    parameter CW = 32    // width of the counters
) (
    input  wire           clk,
    input  wire           rst,

    input  wire [255:0]   s_tdata,
    input  wire           s_tvalid,
    output wire           s_tready,
    input  wire           s_tfirst,
    input  wire           s_tlast,
    input  wire [LW-1:0]  s_tlen,

    output wire [255:0]   m_tdata,
    output wire           m_tvalid,
    input  wire           m_tready,
    output wire           m_tfirst,
    output wire           m_tlast,
    output wire [LW-1:0]  m_tlen,

    output reg  [CW-1:0]  answered,    // sums answered
    output reg  [CW-1:0]  misaligned,  // BAD_REQUEST answers
    output reg  [CW-1:0]  dropped      // messages that were not SEND or PUSH
);

`include "uniplane_header.vh"

localparam [LW-1:0] HEADER_BYTES = UP_HEADER_BYTES;
localparam [LW-1:0] SUM_BYTES    = UP_HEADER_BYTES + 4;

// ------------------------------------------------------------ the header
wire [7:0]  h_type = s_tdata[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];
wire [7:0]  h_flag = s_tdata[UP_MSG_FLAG_MSB:UP_MSG_FLAG_LSB];
wire [15:0] h_len  = s_tdata[UP_MSG_LENGTH_MSB:UP_MSG_LENGTH_LSB];
wire        h_data = (h_type == UP_REQ_SEND || h_type == UP_REQ_PUSH)
                     && (h_flag & UP_FLAG_ERROR) == 8'd0;
wire        h_misaligned = h_len[1:0] != 2'd0;

// The answer header: back to the source, on its ports; the sum's (4 bytes
// of the request's type and flags) or the error answer.
reg [255:0] reply;
always @* begin
    reply = 256'd0;
    reply[UP_SRC_UID_MSB:UP_SRC_UID_LSB] = s_tdata[UP_DST_UID_MSB:UP_DST_UID_LSB];
    reply[UP_DST_UID_MSB:UP_DST_UID_LSB] = s_tdata[UP_SRC_UID_MSB:UP_SRC_UID_LSB];
    reply[UP_MSG_SEQNUM_MSB:UP_MSG_SEQNUM_LSB] = s_tdata[UP_MSG_SEQNUM_MSB:UP_MSG_SEQNUM_LSB];
    reply[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB] = s_tdata[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB];
    reply[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB] = s_tdata[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB];
    if (h_misaligned) begin
        reply[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB] = up_answer_code(h_type);
        reply[UP_MSG_FLAG_MSB:UP_MSG_FLAG_LSB] = UP_FLAG_WHOLE | UP_FLAG_ERROR;
        reply[UP_PORT_REQ_FLAG_MSB:UP_PORT_REQ_FLAG_LSB] = UP_STATUS_BAD_REQUEST;
    end else begin
        reply[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB] = h_type;
        reply[UP_MSG_FLAG_MSB:UP_MSG_FLAG_LSB] = h_flag;
        reply[UP_MSG_LENGTH_MSB:UP_MSG_LENGTH_LSB] = 16'd4;
    end
end

// Words of the last payload beat that msg_length covers: word k holds
// bytes 4k..4k+3, and the last beat holds ((len - 1) mod 32) + 1 bytes.
wire [4:0] h_tail = h_len[4:0] - 5'd1;   // (bytes in the last beat) - 1
wire [7:0] h_last_words = ~(8'hfe << h_tail[4:2]);

// ---------------------------------------------------------- the datapath
reg         skipping = 1'b0;   // inside a message that answers nothing more
reg         pending = 1'b0;    // a request with no payload: its sum beat is due
reg [31:0]  acc = 32'd0;       // the sum of the payload beats so far
reg [7:0]   last_words = 8'hff;

// Little-endian word k of a beat (beat byte i is bits 255-8i downwards).
function [31:0] le_word;
    input [255:0] beat;
    input integer k;
    begin
        le_word = {beat[255 - 8*(4*k + 3) -: 8], beat[255 - 8*(4*k + 2) -: 8],
                   beat[255 - 8*(4*k + 1) -: 8], beat[255 - 8*(4*k) -: 8]};
    end
endfunction

// The beat's words that count, added as a tree (three adders deep), then
// to the running sum.
wire [7:0] words = s_tlast ? last_words : 8'hff;
reg  [255:0] w;   // word k at [32*k +: 32]
integer k;
always @* begin
    for (k = 0; k < 8; k = k + 1) begin
        w[32*k +: 32] = words[k] ? le_word(s_tdata, k) : 32'd0;
    end
end
wire [31:0] beat_sum = acc + (((w[31:0] + w[63:32]) + (w[95:64] + w[127:96]))
                           + ((w[159:128] + w[191:160]) + (w[223:192] + w[255:224])));

// The sum beat: 4 little-endian bytes, then zero padding.
function [255:0] sum_beat;
    input [31:0] sum;
    begin
        sum_beat = {sum[7:0], sum[15:8], sum[23:16], sum[31:24], 224'd0};
    end
endfunction

wire take = s_tvalid && s_tready;
// A beat sends something: a request's header (its answer's header), or
// the last payload beat of a sum (the sum beat).
wire emit_header = s_tfirst && h_data;
wire emit_sum    = !s_tfirst && !skipping && s_tlast;

wire skid_ready;
assign s_tready = skid_ready && !pending;

reg [256 + 2 + LW - 1:0] out_beat;
always @* begin
    if (pending)
        out_beat = {sum_beat(acc), 1'b0, 1'b1, {LW{1'b0}}};
    else if (s_tfirst)
        out_beat = {reply, 1'b1, h_misaligned,
                    h_misaligned ? HEADER_BYTES : SUM_BYTES};
    else
        out_beat = {sum_beat(beat_sum), 1'b0, 1'b1, {LW{1'b0}}};
end

up_skid #(.W(256 + 2 + LW)) out (
    .clk(clk), .rst(rst),
    .s_data(out_beat),
    .s_valid(pending || (s_tvalid && !pending && (emit_header || emit_sum))),
    .s_ready(skid_ready),
    .m_data({m_tdata, m_tfirst, m_tlast, m_tlen}),
    .m_valid(m_tvalid),
    .m_ready(m_tready)
);

always @(posedge clk) begin
    if (pending && skid_ready) begin
        pending <= 1'b0;
    end
    if (take) begin
        if (s_tfirst) begin
            acc <= 32'd0;
            last_words <= h_last_words;
            // Nothing more to send for this message when it is dropped or
            // misaligned; a sum with no payload beat to carry it is due.
            skipping <= !h_data || h_misaligned;
            pending <= h_data && !h_misaligned && s_tlast;
            if (!h_data) dropped <= dropped + 1'b1;
            else if (h_misaligned) misaligned <= misaligned + 1'b1;
            else answered <= answered + 1'b1;
        end else if (!skipping) begin
            acc <= beat_sum;
        end
    end

    if (rst) begin
        skipping   <= 1'b0;
        pending    <= 1'b0;
        acc        <= 32'd0;
        answered   <= {CW{1'b0}};
        misaligned <= {CW{1'b0}};
        dropped    <= {CW{1'b0}};
    end
end

wire unused_ok = &{1'b0, s_tlen, h_len[15:5], h_tail[1:0]};

endmodule

`resetall
