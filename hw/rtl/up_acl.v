// uniplane: a connector's access control.
//
// Mirrors overlay/src/acl.rs. A message passes when
//   (a) its connection (src UID, src port, dst UID, dst port; ports are 0
//       for types without ports) is one of the C installed connection
//       entries (the driver installs both directions), or else
//   (b) the first of the active connectionless rules that matches it
//       (src and dst key/mask, request type in the rule's set) allows it.
// Everything else is denied.
//
// Pipelined like up_fwd_table: compare in the cycle of lk_valid, result
// on res_* in the next.
//
// Registers (byte offsets in the connector's page):
//   0x070 connection valid bitmap (bit c: entry c), C <= 32
//   0x074 active rules: rules 0 .. count-1 are checked, in order
//   0x078 allow bitmap (bit r: rule r allows; clear: denies)
//   0x100 + 16*c: connection c: +0 src[31:0], +4 {src_port, src[47:32]},
//                 +8 dst[31:0], +C {dst_port, dst[47:32]}
//   0x300 + 32*r: rule r: +0/+4 src, +8/+C src mask, +10/+14 dst,
//                 +18/+1C dst mask (low word, then bits 47:32)
//   0xC00 + 4*t:  rules whose type set holds request type t (bit r)
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_acl #(
    parameter C = 16,   // connection entries (<= 32)
    parameter R = 8     // rules (<= 16)
) (
    input  wire         clk,
    input  wire         rst,

    input  wire         wr_en,
    input  wire [11:0]  wr_addr,
    input  wire [31:0]  wr_data,
    input  wire [11:0]  rd_addr,
    output reg  [31:0]  rd_data,

    input  wire         lk_valid,
    input  wire [47:0]  lk_src,
    input  wire [15:0]  lk_src_port,
    input  wire [47:0]  lk_dst,
    input  wire [15:0]  lk_dst_port,
    input  wire [7:0]   lk_type,

    output wire         res_valid,
    output reg          res_allow,
    output reg          res_by_rule,   // decided by a rule (not a connection)
    output reg  [3:0]   res_rule       // which rule, when res_by_rule
);

reg [127:0]  conn_reg [0:C-1];
reg [C-1:0]  conn_valid_reg = {C{1'b0}};
reg [47:0]   rule_src_reg [0:R-1];
reg [47:0]   rule_smask_reg [0:R-1];
reg [47:0]   rule_dst_reg [0:R-1];
reg [47:0]   rule_dmask_reg [0:R-1];
reg [4:0]    rule_count_reg = 5'd0;
reg [R-1:0]  rule_allow_reg = {R{1'b0}};
reg [R-1:0]  types_mem [0:255];

reg          lk_valid_reg = 1'b0;
reg          conn_hit_reg = 1'b0;
reg [R-1:0]  rule_match_reg = {R{1'b0}};

integer i;
initial begin
    for (i = 0; i < C; i = i + 1) conn_reg[i] = 128'd0;
    for (i = 0; i < R; i = i + 1) begin
        rule_src_reg[i] = 48'd0;
        rule_smask_reg[i] = 48'd0;
        rule_dst_reg[i] = 48'd0;
        rule_dmask_reg[i] = 48'd0;
    end
    for (i = 0; i < 256; i = i + 1) types_mem[i] = {R{1'b0}};
end

// Entry numbers, counted from each table's base.
/* verilator lint_off UNUSEDSIGNAL */
wire [11:0] wr_conn_off = wr_addr - 12'h100;
wire [11:0] wr_rule_off = wr_addr - 12'h300;
wire [11:0] rd_conn_off = rd_addr - 12'h100;
wire [11:0] rd_rule_off = rd_addr - 12'h300;
/* verilator lint_on UNUSEDSIGNAL */
wire [$clog2(C)-1:0] wr_conn = wr_conn_off[4 +: $clog2(C)];
wire [$clog2(R)-1:0] wr_rule = wr_rule_off[5 +: $clog2(R)];
wire [$clog2(C)-1:0] rd_conn = rd_conn_off[4 +: $clog2(C)];
wire [$clog2(R)-1:0] rd_rule = rd_rule_off[5 +: $clog2(R)];
localparam integer CONN_END_I = 'h100 + 16 * C;
localparam integer RULE_END_I = 'h300 + 32 * R;
localparam [11:0] CONN_END = CONN_END_I[11:0];
localparam [11:0] RULE_END = RULE_END_I[11:0];
wire wr_conn_sel = wr_addr >= 12'h100 && wr_addr < CONN_END;
wire wr_rule_sel = wr_addr >= 12'h300 && wr_addr < RULE_END;
wire rd_conn_sel = rd_addr >= 12'h100 && rd_addr < CONN_END;
wire rd_rule_sel = rd_addr >= 12'h300 && rd_addr < RULE_END;

always @(posedge clk) begin
    if (wr_en) begin
        if (wr_addr == 12'h070) conn_valid_reg <= wr_data[C-1:0];
        if (wr_addr == 12'h074) rule_count_reg <= wr_data[4:0];
        if (wr_addr == 12'h078) rule_allow_reg <= wr_data[R-1:0];
        if (wr_conn_sel) begin
            case (wr_addr[3:2])
                2'd0: conn_reg[wr_conn][111:80] <= wr_data;
                2'd1: begin
                    conn_reg[wr_conn][127:112] <= wr_data[15:0];
                    conn_reg[wr_conn][79:64] <= wr_data[31:16];
                end
                2'd2: conn_reg[wr_conn][47:16] <= wr_data;
                default: begin
                    conn_reg[wr_conn][63:48] <= wr_data[15:0];
                    conn_reg[wr_conn][15:0] <= wr_data[31:16];
                end
            endcase
        end
        if (wr_rule_sel) begin
            case (wr_addr[4:2])
                3'd0: rule_src_reg[wr_rule][31:0] <= wr_data;
                3'd1: rule_src_reg[wr_rule][47:32] <= wr_data[15:0];
                3'd2: rule_smask_reg[wr_rule][31:0] <= wr_data;
                3'd3: rule_smask_reg[wr_rule][47:32] <= wr_data[15:0];
                3'd4: rule_dst_reg[wr_rule][31:0] <= wr_data;
                3'd5: rule_dst_reg[wr_rule][47:32] <= wr_data[15:0];
                3'd6: rule_dmask_reg[wr_rule][31:0] <= wr_data;
                default: rule_dmask_reg[wr_rule][47:32] <= wr_data[15:0];
            endcase
        end
        if (wr_addr[11:10] == 2'b11) types_mem[wr_addr[9:2]] <= wr_data[R-1:0];
    end

    lk_valid_reg <= lk_valid;
    if (lk_valid) begin
        conn_hit_reg <= 1'b0;
        for (i = 0; i < C; i = i + 1) begin
            if (conn_valid_reg[i] && conn_reg[i] == {lk_src, lk_src_port, lk_dst, lk_dst_port}) begin
                conn_hit_reg <= 1'b1;
            end
        end
        for (i = 0; i < R; i = i + 1) begin
            rule_match_reg[i] <= (i < rule_count_reg)
                && (((lk_src ^ rule_src_reg[i]) & rule_smask_reg[i]) == 48'd0)
                && (((lk_dst ^ rule_dst_reg[i]) & rule_dmask_reg[i]) == 48'd0)
                && types_mem[lk_type][i];
        end
    end

    if (rst) begin
        conn_valid_reg <= {C{1'b0}};
        rule_count_reg <= 5'd0;
        lk_valid_reg <= 1'b0;
    end
end

assign res_valid = lk_valid_reg;
always @* begin
    res_by_rule = 1'b0;
    res_rule = 4'd0;
    res_allow = 1'b0;
    for (i = R - 1; i >= 0; i = i - 1) begin
        if (rule_match_reg[i]) begin
            res_by_rule = 1'b1;
            res_rule = i[3:0];
            res_allow = rule_allow_reg[i];
        end
    end
    if (conn_hit_reg) begin
        res_allow = 1'b1;
        res_by_rule = 1'b0;
    end
end

always @* begin
    rd_data = 32'd0;
    if (rd_addr == 12'h070) rd_data[C-1:0] = conn_valid_reg;
    if (rd_addr == 12'h074) rd_data[4:0] = rule_count_reg;
    if (rd_addr == 12'h078) rd_data[R-1:0] = rule_allow_reg;
    if (rd_conn_sel) begin
        case (rd_addr[3:2])
            2'd0: rd_data = conn_reg[rd_conn][111:80];
            2'd1: rd_data = {conn_reg[rd_conn][79:64], conn_reg[rd_conn][127:112]};
            2'd2: rd_data = conn_reg[rd_conn][47:16];
            default: rd_data = {conn_reg[rd_conn][15:0], conn_reg[rd_conn][63:48]};
        endcase
    end
    if (rd_rule_sel) begin
        case (rd_addr[4:2])
            3'd0: rd_data = rule_src_reg[rd_rule][31:0];
            3'd1: rd_data = {16'd0, rule_src_reg[rd_rule][47:32]};
            3'd2: rd_data = rule_smask_reg[rd_rule][31:0];
            3'd3: rd_data = {16'd0, rule_smask_reg[rd_rule][47:32]};
            3'd4: rd_data = rule_dst_reg[rd_rule][31:0];
            3'd5: rd_data = {16'd0, rule_dst_reg[rd_rule][47:32]};
            3'd6: rd_data = rule_dmask_reg[rd_rule][31:0];
            default: rd_data = {16'd0, rule_dmask_reg[rd_rule][47:32]};
        endcase
    end
    if (rd_addr[11:10] == 2'b11) rd_data[R-1:0] = types_mem[rd_addr[9:2]];
end

endmodule

`resetall
