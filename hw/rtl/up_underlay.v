// uniplane: the underlay of one interface (DUA §7.3).
//
//   stack 0 -> up_filter -> FIFO -+
//   ...                           +-> up_arb_mux (RR / DRR / strict) -> interface
//   stack M-1 -> up_filter -> FIFO -+
//   interface -> up_demux -> stack 0 .. M-1
//
// One set of filter rules for every stack input (as InterfaceMux has one
// Filter), one scheduler policy for the interface, one demux rule table.
// Register page (byte offsets; see docs/hw.md):
//   0x00C inputs M (ro)            0x010 filter max_len (bytes, header+payload)
//   0x014 source valid bitmap      0x018 interface output paused
//   0x01C policy (0 RR, 1 DRR)     0x020 commit the policy (write)
//   0x024 active demux rules       0x028 demux default {valid[31], output[7:0]}
//   0x02C {D[15:8], S[7:0]} (ro)
//   0x040.. 64-bit counters (low word first; reading it latches the high):
//     passed, source denied, type denied, too long, classified, misses,
//     dropped, messages sent on the interface
//   0x080 + 4q weight, 0x0C0 + 4q class of input q (shadow until commit)
//   0x100 + 16s source pattern s: key lo, key hi, mask lo, mask hi
//   0x200 + 16d demux rule d: key lo, {output[23:16], key hi}, mask lo, mask hi
//   0x400 + 4w allowed request types, bits 32w .. 32w+31
//   0x800 + 4t demux rules whose type set holds type t
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_underlay #(
    parameter M       = 2,     // stack inputs and outputs (>= 2)
    parameter S       = 4,     // filter source patterns (2 .. 16)
    parameter D       = 8,     // demux rules (2 .. 16)
    parameter DEPTH   = 32,    // beats per input FIFO
    parameter LW      = 17,
    parameter WW      = 32,
    parameter QUANTUM = 1536
) (
    input  wire              clk,
    input  wire              rst,

    input  wire [M*256-1:0]  s_tdata,
    input  wire [M-1:0]      s_tvalid,
    output wire [M-1:0]      s_tready,
    input  wire [M-1:0]      s_tfirst,
    input  wire [M-1:0]      s_tlast,

    output wire [255:0]      if_m_tdata,
    output wire              if_m_tvalid,
    input  wire              if_m_tready,
    output wire              if_m_tfirst,
    output wire              if_m_tlast,

    input  wire [255:0]      if_s_tdata,
    input  wire              if_s_tvalid,
    output wire              if_s_tready,
    input  wire              if_s_tfirst,
    input  wire              if_s_tlast,

    output wire [M*256-1:0]  m_tdata,
    output wire [M-1:0]      m_tvalid,
    input  wire [M-1:0]      m_tready,
    output wire [M-1:0]      m_tfirst,
    output wire [M-1:0]      m_tlast,

    input  wire              wr_en,
    input  wire [11:0]       wr_addr,
    input  wire [31:0]       wr_data,
    input  wire              rd_en,
    input  wire [11:0]       rd_addr,
    output reg  [31:0]       rd_data
);

localparam IW = $clog2(M);
localparam FW = 256 + LW + 2;

// ------------------------------------------------------------- registers
reg [31:0]    max_len_reg = 32'hffff_ffff;
reg [S-1:0]   src_valid_reg = {S{1'b0}};
reg [47:0]    src_key_reg [0:S-1];
reg [47:0]    src_mask_reg [0:S-1];
reg [255:0]   types_reg = {256{1'b0}};
reg           pause_reg = 1'b0;
reg           drr_shadow_reg = 1'b0, drr_reg = 1'b0;
reg [WW-1:0]  weight_shadow_reg [0:M-1];
reg [IW-1:0]  class_shadow_reg [0:M-1];
reg [M*WW-1:0] weight_reg;
reg [M*IW-1:0] class_reg;
reg [4:0]     rule_count_reg = 5'd0;
reg           default_valid_reg = 1'b0;
reg [7:0]     default_reg = 8'd0;
reg [47:0]    rule_key_reg [0:D-1];
reg [47:0]    rule_mask_reg [0:D-1];
reg [7:0]     rule_out_reg [0:D-1];
reg [D-1:0]   type_rules_mem [0:255];

integer i;
initial begin
    for (i = 0; i < S; i = i + 1) begin
        src_key_reg[i] = 48'd0;
        src_mask_reg[i] = 48'd0;
    end
    for (i = 0; i < M; i = i + 1) begin
        weight_shadow_reg[i] = 1;
        class_shadow_reg[i] = {IW{1'b0}};
        weight_reg[i*WW +: WW] = 1;
        class_reg[i*IW +: IW] = {IW{1'b0}};
    end
    for (i = 0; i < D; i = i + 1) begin
        rule_key_reg[i] = 48'd0;
        rule_mask_reg[i] = 48'd0;
        rule_out_reg[i] = 8'd0;
    end
    for (i = 0; i < 256; i = i + 1) type_rules_mem[i] = {D{1'b0}};
end

wire commit = wr_en && wr_addr == 12'h020;
wire [IW-1:0] wr_q = wr_addr[2 +: IW];
wire [IW-1:0] rd_q = rd_addr[2 +: IW];
wire [3:0] wr_src = wr_addr[7:4];
wire [3:0] rd_src = rd_addr[7:4];

always @(posedge clk) begin
    if (wr_en) begin
        case (wr_addr)
            12'h010: max_len_reg <= wr_data;
            12'h014: src_valid_reg <= wr_data[S-1:0];
            12'h018: pause_reg <= wr_data[0];
            12'h01c: drr_shadow_reg <= wr_data[0];
            12'h024: rule_count_reg <= wr_data[4:0];
            12'h028: begin
                default_valid_reg <= wr_data[31];
                default_reg <= wr_data[7:0];
            end
            default: ;
        endcase
        if (wr_addr[11:6] == 6'b000010 && {28'd0, wr_addr[5:2]} < M) weight_shadow_reg[wr_q] <= wr_data[WW-1:0];
        if (wr_addr[11:6] == 6'b000011 && {28'd0, wr_addr[5:2]} < M) class_shadow_reg[wr_q] <= wr_data[IW-1:0];
        if (wr_addr[11:8] == 4'h1 && {28'd0, wr_src} < S) begin
            case (wr_addr[3:2])
                2'd0: src_key_reg[wr_src[$clog2(S)-1:0]][31:0] <= wr_data;
                2'd1: src_key_reg[wr_src[$clog2(S)-1:0]][47:32] <= wr_data[15:0];
                2'd2: src_mask_reg[wr_src[$clog2(S)-1:0]][31:0] <= wr_data;
                default: src_mask_reg[wr_src[$clog2(S)-1:0]][47:32] <= wr_data[15:0];
            endcase
        end
        if (wr_addr[11:8] == 4'h2 && {28'd0, wr_src} < D) begin
            case (wr_addr[3:2])
                2'd0: rule_key_reg[wr_src[$clog2(D)-1:0]][31:0] <= wr_data;
                2'd1: begin
                    rule_key_reg[wr_src[$clog2(D)-1:0]][47:32] <= wr_data[15:0];
                    rule_out_reg[wr_src[$clog2(D)-1:0]] <= wr_data[23:16];
                end
                2'd2: rule_mask_reg[wr_src[$clog2(D)-1:0]][31:0] <= wr_data;
                default: rule_mask_reg[wr_src[$clog2(D)-1:0]][47:32] <= wr_data[15:0];
            endcase
        end
        if (wr_addr[11:5] == 7'b0100000) types_reg[wr_addr[4:2]*32 +: 32] <= wr_data;
        if (wr_addr[11:10] == 2'b10) type_rules_mem[wr_addr[9:2]] <= wr_data[D-1:0];
    end
    if (commit) begin
        drr_reg <= drr_shadow_reg;
        for (i = 0; i < M; i = i + 1) begin
            weight_reg[i*WW +: WW] <= weight_shadow_reg[i];
            class_reg[i*IW +: IW] <= class_shadow_reg[i];
        end
    end
    if (rst) begin
        src_valid_reg <= {S{1'b0}};
        rule_count_reg <= 5'd0;
        default_valid_reg <= 1'b0;
        pause_reg <= 1'b0;
    end
end

// -------------------------------------------------------- stacks -> wire
reg [S*48-1:0] src_key_flat, src_mask_flat;
reg [D*48-1:0] rule_key_flat, rule_mask_flat;
reg [D*8-1:0]  rule_out_flat;
always @* begin
    for (i = 0; i < S; i = i + 1) begin
        src_key_flat[i*48 +: 48] = src_key_reg[i];
        src_mask_flat[i*48 +: 48] = src_mask_reg[i];
    end
    for (i = 0; i < D; i = i + 1) begin
        rule_key_flat[i*48 +: 48] = rule_key_reg[i];
        rule_mask_flat[i*48 +: 48] = rule_mask_reg[i];
        rule_out_flat[i*8 +: 8] = rule_out_reg[i];
    end
end

wire [M*FW-1:0] q_data;
wire [M-1:0]    q_valid, q_ready;
wire [M-1:0]    ev_pass, ev_source, ev_type, ev_length;

genvar g;
generate
    for (g = 0; g < M; g = g + 1) begin : in_gen
        wire [255:0]  f_data;
        wire          f_valid, f_ready, f_first, f_last;
        wire [LW-1:0] f_len;
        up_filter #(.S(S), .LW(LW)) filter (
            .clk(clk), .rst(rst),
            .s_tdata(s_tdata[g*256 +: 256]), .s_tvalid(s_tvalid[g]), .s_tready(s_tready[g]),
            .s_tfirst(s_tfirst[g]), .s_tlast(s_tlast[g]),
            .m_tdata(f_data), .m_tvalid(f_valid), .m_tready(f_ready),
            .m_tfirst(f_first), .m_tlast(f_last), .m_tlen(f_len),
            .cfg_src_valid(src_valid_reg), .cfg_src_key(src_key_flat), .cfg_src_mask(src_mask_flat),
            .cfg_types(types_reg), .cfg_max_len(max_len_reg),
            .ev_pass(ev_pass[g]), .ev_source(ev_source[g]), .ev_type(ev_type[g]), .ev_length(ev_length[g])
        );
        /* verilator lint_off UNUSEDSIGNAL */
        wire [$clog2(DEPTH):0] count;
        /* verilator lint_on UNUSEDSIGNAL */
        up_fifo #(.W(FW), .DEPTH(DEPTH)) queue (
            .clk(clk), .rst(rst),
            .s_data({f_len, f_first, f_last, f_data}), .s_valid(f_valid), .s_ready(f_ready),
            .m_data(q_data[g*FW +: FW]), .m_valid(q_valid[g]), .m_ready(q_ready[g]),
            .count(count)
        );
    end
endgenerate

wire [M*256-1:0] a_data;
wire [M-1:0]     a_first, a_last;
wire [M*LW-1:0]  a_len;
generate
    for (g = 0; g < M; g = g + 1) begin : split_gen
        assign {a_len[g*LW +: LW], a_first[g], a_last[g], a_data[g*256 +: 256]} = q_data[g*FW +: FW];
    end
endgenerate

/* verilator lint_off UNUSEDSIGNAL */
wire [LW-1:0] mux_len;
wire [IW-1:0] mux_src;
/* verilator lint_on UNUSEDSIGNAL */

up_arb_mux #(.N(M), .DW(256), .LW(LW), .WW(WW), .QUANTUM(QUANTUM)) mux (
    .clk(clk), .rst(rst),
    .s_tdata(a_data), .s_tvalid(q_valid), .s_tready(q_ready),
    .s_tfirst(a_first), .s_tlast(a_last), .s_tlen(a_len),
    .m_tdata(if_m_tdata), .m_tvalid(if_m_tvalid), .m_tready(if_m_tready),
    .m_tfirst(if_m_tfirst), .m_tlast(if_m_tlast), .m_tlen(mux_len), .m_tsrc(mux_src),
    .enable(!pause_reg), .cfg_drr(drr_reg), .cfg_weight(weight_reg), .cfg_class(class_reg),
    .cfg_load(commit)
);

// -------------------------------------------------------- wire -> stacks
wire [7:0] dm_type;
wire [255:0] dm_data;
wire dm_first, dm_last;
wire       ev_classified, ev_miss, ev_dropped;

up_demux #(.M(M), .D(D)) demux (
    .clk(clk), .rst(rst),
    .s_tdata(if_s_tdata), .s_tvalid(if_s_tvalid), .s_tready(if_s_tready),
    .s_tfirst(if_s_tfirst), .s_tlast(if_s_tlast),
    .m_tdata(dm_data), .m_tvalid(m_tvalid), .m_tready(m_tready),
    .m_tfirst(dm_first), .m_tlast(dm_last),
    .lk_type(dm_type), .cfg_type_rules(type_rules_mem[dm_type]), .cfg_rule_count(rule_count_reg),
    .cfg_key(rule_key_flat), .cfg_mask(rule_mask_flat), .cfg_out(rule_out_flat),
    .cfg_default_valid(default_valid_reg), .cfg_default(default_reg),
    .ev_classified(ev_classified), .ev_miss(ev_miss), .ev_dropped(ev_dropped)
);

// Every stack output sees the same beat; its valid says whether it is its.
generate
    for (g = 0; g < M; g = g + 1) begin : fan_gen
        assign m_tdata[g*256 +: 256] = dm_data;
        assign m_tfirst[g] = dm_first;
        assign m_tlast[g] = dm_last;
    end
endgenerate

// ------------------------------------------------------------- counters
localparam NK = 8;
reg [63:0] counter_reg [0:NK-1];
reg [31:0] hold_reg = 32'd0;
integer n;
initial for (n = 0; n < NK; n = n + 1) counter_reg[n] = 64'd0;

function [63:0] popcount;
    input [M-1:0] v;
    integer b;
    begin
        popcount = 64'd0;
        for (b = 0; b < M; b = b + 1) popcount = popcount + {63'd0, v[b]};
    end
endfunction

always @(posedge clk) begin
    counter_reg[0] <= counter_reg[0] + popcount(ev_pass);
    counter_reg[1] <= counter_reg[1] + popcount(ev_source);
    counter_reg[2] <= counter_reg[2] + popcount(ev_type);
    counter_reg[3] <= counter_reg[3] + popcount(ev_length);
    counter_reg[4] <= counter_reg[4] + {63'd0, ev_classified};
    counter_reg[5] <= counter_reg[5] + {63'd0, ev_miss};
    counter_reg[6] <= counter_reg[6] + {63'd0, ev_dropped};
    counter_reg[7] <= counter_reg[7] + {63'd0, if_m_tvalid && if_m_tready && if_m_tfirst};
    if (rd_en && rd_addr[11:6] == 6'b000001 && !rd_addr[2]) hold_reg <= counter_reg[rd_addr[5:3]][63:32];
    if (rst) for (i = 0; i < NK; i = i + 1) counter_reg[i] <= 64'd0;
end

always @* begin
    rd_data = 32'd0;
    case (rd_addr)
        12'h00c: rd_data = M;
        12'h010: rd_data = max_len_reg;
        12'h014: rd_data[S-1:0] = src_valid_reg;
        12'h018: rd_data[0] = pause_reg;
        12'h01c: rd_data[0] = drr_shadow_reg;
        12'h024: rd_data[4:0] = rule_count_reg;
        12'h028: rd_data = {default_valid_reg, 23'd0, default_reg};
        12'h02c: rd_data = {16'd0, D[7:0], S[7:0]};
        default: ;
    endcase
    if (rd_addr[11:6] == 6'b000001) rd_data = rd_addr[2] ? hold_reg : counter_reg[rd_addr[5:3]][31:0];
    if (rd_addr[11:6] == 6'b000010 && {28'd0, rd_addr[5:2]} < M) rd_data = weight_shadow_reg[rd_q];
    if (rd_addr[11:6] == 6'b000011 && {28'd0, rd_addr[5:2]} < M) rd_data = {{(32-IW){1'b0}}, class_shadow_reg[rd_q]};
    if (rd_addr[11:8] == 4'h1 && {28'd0, rd_src} < S) begin
        case (rd_addr[3:2])
            2'd0: rd_data = src_key_reg[rd_src[$clog2(S)-1:0]][31:0];
            2'd1: rd_data = {16'd0, src_key_reg[rd_src[$clog2(S)-1:0]][47:32]};
            2'd2: rd_data = src_mask_reg[rd_src[$clog2(S)-1:0]][31:0];
            default: rd_data = {16'd0, src_mask_reg[rd_src[$clog2(S)-1:0]][47:32]};
        endcase
    end
    if (rd_addr[11:8] == 4'h2 && {28'd0, rd_src} < D) begin
        case (rd_addr[3:2])
            2'd0: rd_data = rule_key_reg[rd_src[$clog2(D)-1:0]][31:0];
            2'd1: rd_data = {8'd0, rule_out_reg[rd_src[$clog2(D)-1:0]], rule_key_reg[rd_src[$clog2(D)-1:0]][47:32]};
            2'd2: rd_data = rule_mask_reg[rd_src[$clog2(D)-1:0]][31:0];
            default: rd_data = {16'd0, rule_mask_reg[rd_src[$clog2(D)-1:0]][47:32]};
        endcase
    end
    if (rd_addr[11:5] == 7'b0100000) rd_data = types_reg[rd_addr[4:2]*32 +: 32];
    if (rd_addr[11:10] == 2'b10) rd_data[D-1:0] = type_rules_mem[rd_addr[9:2]];
end

endmodule

`resetall
