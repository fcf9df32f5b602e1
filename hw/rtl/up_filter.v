// uniplane: the underlay's filter on one stack input (DUA §7.3).
//
// Mirrors the first three rules of underlay/src/filter.rs, checked on the
// header beat in the same order: the source UID must match one of the
// valid source patterns, the request type must be in the allowed set,
// and the message (header and payload bytes) must not exceed max_len. A
// message that breaks a rule is dropped whole and counted by reason (one
// ev_* pulse per message). Memory windows are not checked in RTL.
// Output registered through a skid buffer; one beat per cycle.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_filter #(
    parameter S  = 4,    // source patterns
    parameter LW = 17
) (
    input  wire              clk,
    input  wire              rst,

    input  wire [255:0]      s_tdata,
    input  wire              s_tvalid,
    output wire              s_tready,
    input  wire              s_tfirst,
    input  wire              s_tlast,

    output wire [255:0]      m_tdata,
    output wire              m_tvalid,
    input  wire              m_tready,
    output wire              m_tfirst,
    output wire              m_tlast,
    output wire [LW-1:0]     m_tlen,

    input  wire [S-1:0]      cfg_src_valid,
    input  wire [S*48-1:0]   cfg_src_key,
    input  wire [S*48-1:0]   cfg_src_mask,
    input  wire [255:0]      cfg_types,
    input  wire [31:0]       cfg_max_len,

    output wire              ev_pass,
    output wire              ev_source,
    output wire              ev_type,
    output wire              ev_length
);

`include "uniplane_header.vh"

wire [47:0]   src = s_tdata[UP_SRC_UID_MSB:UP_SRC_UID_LSB];
wire [7:0]    typ = s_tdata[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];
wire [LW-1:0] len = (up_has_second_beat(typ) ? 17'd64 : 17'd32)
                  + {1'b0, s_tdata[UP_MSG_LENGTH_MSB:UP_MSG_LENGTH_LSB]};

reg src_ok;
integer i;
always @* begin
    src_ok = 1'b0;
    for (i = 0; i < S; i = i + 1) begin
        if (cfg_src_valid[i] && ((src ^ cfg_src_key[i*48 +: 48]) & cfg_src_mask[i*48 +: 48]) == 48'd0) begin
            src_ok = 1'b1;
        end
    end
end

wire type_ok = cfg_types[typ];
wire len_ok = {15'd0, len} <= cfg_max_len;
wire pass = src_ok && type_ok && len_ok;

reg  dropping_reg = 1'b0;
wire skid_ready;
wire head = s_tvalid && s_tfirst && !dropping_reg;
wire drop_now = dropping_reg || (head && !pass);
wire fwd = s_tvalid && !drop_now;

assign s_tready = drop_now ? 1'b1 : skid_ready;

wire head_done = head && (pass ? skid_ready : 1'b1);
assign ev_pass   = head_done && pass;
assign ev_source = head_done && !src_ok;
assign ev_type   = head_done && src_ok && !type_ok;
assign ev_length = head_done && src_ok && type_ok && !len_ok;

always @(posedge clk) begin
    if (s_tvalid && s_tready) begin
        if (s_tlast) dropping_reg <= 1'b0;
        else if (head && !pass) dropping_reg <= 1'b1;
    end
    if (rst) dropping_reg <= 1'b0;
end

up_skid #(.W(256 + LW + 2)) out_skid (
    .clk(clk), .rst(rst),
    .s_data({len, s_tfirst, s_tlast, s_tdata}), .s_valid(fwd), .s_ready(skid_ready),
    .m_data({m_tlen, m_tfirst, m_tlast, m_tdata}), .m_valid(m_tvalid), .m_ready(m_tready)
);

endmodule

`resetall
