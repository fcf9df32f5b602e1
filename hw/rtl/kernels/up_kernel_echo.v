// uniplane: the echo kernel in RTL (services/kernel `Echo`, answered as the
// daemon's echo and kernel devices answer it).
//
// One crossbar port's protocol on both sides: s_* comes from the crossbar
// (the messages a device port is sent), m_* goes back to it; 256-bit
// beats, first/last, and the message's length in bytes (header included)
// on the first beat.
//
//   SEND or PUSH, ERROR flag clear  ->  the same type back to its source:
//       src_uid <-> dst_uid, src_port <-> dst_port, req_flag 0, reserved 0,
//       msg_length, msg_flag and msg_seqnum kept; payload beats unchanged
//   anything else                   ->  consumed whole, nothing sent,
//                                       counted in `dropped`
//
// A message moves one beat per cycle; the output is registered by a skid
// buffer, so back-pressure on m_tready stalls the input without loss.
// s_tlen is taken for the port's shape; the header's msg_length is what
// the kernel reads.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_kernel_echo #(
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

    output reg  [CW-1:0]  answered,   // messages echoed
    output reg  [CW-1:0]  dropped     // messages that were not SEND or PUSH
);

`include "uniplane_header.vh"

// ------------------------------------------------------------ the header
wire [7:0]  h_type = s_tdata[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];
wire [7:0]  h_flag = s_tdata[UP_MSG_FLAG_MSB:UP_MSG_FLAG_LSB];
wire [15:0] h_len  = s_tdata[UP_MSG_LENGTH_MSB:UP_MSG_LENGTH_LSB];
wire        h_data = (h_type == UP_REQ_SEND || h_type == UP_REQ_PUSH)
                     && (h_flag & UP_FLAG_ERROR) == 8'd0;

// The reply header: back to the source, on its ports.
reg [255:0] reply;
always @* begin
    reply = s_tdata;
    reply[UP_SRC_UID_MSB:UP_SRC_UID_LSB] = s_tdata[UP_DST_UID_MSB:UP_DST_UID_LSB];
    reply[UP_DST_UID_MSB:UP_DST_UID_LSB] = s_tdata[UP_SRC_UID_MSB:UP_SRC_UID_LSB];
    reply[UP_REQ_PARAM_MSB:UP_REQ_PARAM_LSB] = {UP_REQ_PARAM_W{1'b0}};
    reply[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB] = s_tdata[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB];
    reply[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB] = s_tdata[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB];
end

// ------------------------------------------------------------- the state
reg dropping = 1'b0;   // inside a message that is being dropped

wire take  = s_tvalid && s_tready;
wire emit  = s_tfirst ? h_data : !dropping;

localparam [LW-1:0] HEADER_BYTES = UP_HEADER_BYTES;
wire [LW-1:0] reply_len = HEADER_BYTES + {{(LW-16){1'b0}}, h_len};

wire skid_ready;
assign s_tready = skid_ready;

up_skid #(.W(256 + 2 + LW)) out (
    .clk(clk), .rst(rst),
    .s_data({s_tfirst ? reply : s_tdata, s_tfirst, s_tlast, s_tfirst ? reply_len : {LW{1'b0}}}),
    .s_valid(s_tvalid && emit),
    .s_ready(skid_ready),
    .m_data({m_tdata, m_tfirst, m_tlast, m_tlen}),
    .m_valid(m_tvalid),
    .m_ready(m_tready)
);

always @(posedge clk) begin
    if (take && s_tfirst) begin
        dropping <= !h_data && !s_tlast;
        if (h_data) answered <= answered + 1'b1;
        else dropped <= dropped + 1'b1;
    end else if (take && s_tlast) begin
        dropping <= 1'b0;
    end

    if (rst) begin
        dropping <= 1'b0;
        answered <= {CW{1'b0}};
        dropped  <= {CW{1'b0}};
    end
end

wire unused_ok = &{1'b0, s_tlen};

endmodule

`resetall
