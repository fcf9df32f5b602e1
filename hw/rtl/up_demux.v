// uniplane: the underlay's demultiplexer (interface -> stacks).
//
// Mirrors underlay/src/demux.rs: the first of the active rules whose
// destination key/mask and request-type set match the header beat names
// the output; a miss goes to the default output when it is valid and is
// dropped (and counted) otherwise. Whole messages follow their header.
// Output registered through a skid buffer; one beat per cycle.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_demux #(
    parameter M = 2,     // outputs (>= 2)
    parameter D = 8      // rules
) (
    input  wire              clk,
    input  wire              rst,

    input  wire [255:0]      s_tdata,
    input  wire              s_tvalid,
    output wire              s_tready,
    input  wire              s_tfirst,
    input  wire              s_tlast,

    output wire [255:0]      m_tdata,
    output wire [M-1:0]      m_tvalid,
    input  wire [M-1:0]      m_tready,
    output wire              m_tfirst,
    output wire              m_tlast,

    // Rules whose type set holds the header's type (read of the type
    // memory at lk_type).
    output wire [7:0]        lk_type,
    input  wire [D-1:0]      cfg_type_rules,
    input  wire [4:0]        cfg_rule_count,
    input  wire [D*48-1:0]   cfg_key,
    input  wire [D*48-1:0]   cfg_mask,
    input  wire [D*8-1:0]    cfg_out,
    input  wire              cfg_default_valid,
    input  wire [7:0]        cfg_default,

    output wire              ev_classified,
    output wire              ev_miss,
    output wire              ev_dropped
);

`include "uniplane_header.vh"

localparam IW = $clog2(M);

wire [47:0] dst = s_tdata[UP_DST_UID_MSB:UP_DST_UID_LSB];
assign lk_type = s_tdata[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];

reg       hit;
reg [7:0] hit_out;
integer i;
always @* begin
    hit = 1'b0;
    hit_out = 8'd0;
    for (i = D - 1; i >= 0; i = i - 1) begin
        if (i < cfg_rule_count && cfg_type_rules[i]
                && ((dst ^ cfg_key[i*48 +: 48]) & cfg_mask[i*48 +: 48]) == 48'd0) begin
            hit = 1'b1;
            hit_out = cfg_out[i*8 +: 8];
        end
    end
end

wire [7:0] out = hit ? hit_out : cfg_default;
wire deliver = (hit || cfg_default_valid) && {24'd0, out} < M;

reg          dropping_reg = 1'b0;
reg [IW-1:0] dest_reg = {IW{1'b0}};
wire         head = s_tvalid && s_tfirst && !dropping_reg;
wire         drop_now = dropping_reg || (head && !deliver);
wire [IW-1:0] dest = head ? out[IW-1:0] : dest_reg;
wire         skid_ready;

assign s_tready = drop_now ? 1'b1 : skid_ready;

wire head_done = head && (deliver ? skid_ready : 1'b1);
assign ev_classified = head_done;
assign ev_miss = head_done && !hit;
assign ev_dropped = head_done && !deliver;

always @(posedge clk) begin
    if (s_tvalid && s_tready) begin
        if (head) dest_reg <= out[IW-1:0];
        if (s_tlast) dropping_reg <= 1'b0;
        else if (head && !deliver) dropping_reg <= 1'b1;
    end
    if (rst) dropping_reg <= 1'b0;
end

wire          o_valid;
wire [IW-1:0] o_dest;
up_skid #(.W(256 + IW + 2)) out_skid (
    .clk(clk), .rst(rst),
    .s_data({dest, s_tfirst, s_tlast, s_tdata}), .s_valid(s_tvalid && !drop_now), .s_ready(skid_ready),
    .m_data({o_dest, m_tfirst, m_tlast, m_tdata}), .m_valid(o_valid), .m_ready(m_tready[o_dest])
);

genvar g;
generate
    for (g = 0; g < M; g = g + 1) begin : valid_gen
        assign m_tvalid[g] = o_valid && o_dest == g;
    end
endgenerate

endmodule

`resetall
