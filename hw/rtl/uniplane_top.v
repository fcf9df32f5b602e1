// uniplane: the overlay and underlay pipeline of one device, in RTL.
//
//   port p in --> up_connector p --+                    +--> port p out
//   (N ports)     (ACL, translator,|--> up_crossbar ----+    (N ports)
//                  forwarding)     |    (VOQ, RR/DRR)
//
//   stack s in  --> up_underlay: filters, mux (RR/DRR) --> interface out
//   stack s out <-- up_underlay: demux                 <-- interface in
//
// Streams are DUA Fig. 4's: 256-bit data, valid, ready, first, last; one
// message is a header beat (two for READ and COPY) and its payload beats,
// the last zero-padded; msg_length gives the byte count.
//
// Everything is programmed through one AXI-Lite register space of 4 KiB
// pages, each page a self-describing block (Corundum-style: 0x000 type,
// 0x004 version, 0x008 byte address of the next block, 0 at the end):
//   page 0        ID          type 0x55500001
//   page 1+p      port p      type 0x55500010 (connector, table, ACL,
//                             output p's scheduler, counters)
//   page 1+N      translator  type 0x55500020
//   page 2+N      underlay    type 0x55500030
`resetall
`timescale 1ns / 1ps
`default_nettype none

module uniplane_top #(
    parameter N         = 4,      // overlay ports: 4, 8 or 16
    parameter E         = 32,     // forwarding entries per port
    parameter C         = 16,     // access-control connections per port
    parameter R         = 8,      // access-control rules per port
    parameter T         = 16,     // translator entries
    parameter VOQ_DEPTH = 32,     // beats each virtual output queue may always hold
    parameter VOQ_POOL  = 768,    // further beats per input, shared by its N queues
    parameter DF        = 8,      // connector data FIFO (beats)
    parameter M         = 2,      // underlay stacks
    parameter S         = 4,      // underlay filter source patterns
    parameter D         = 8,      // underlay demux rules
    parameter UDEPTH    = 32,     // beats per underlay input FIFO
    parameter QUANTUM   = 1536,   // DRR bytes per round for weight 1
    parameter MATCH     = 0,      // crossbar: 0 a read port per output, 1 iSLIP matching
    parameter ITER      = 1,      // MATCH = 1: matching iterations per cycle
    parameter PORTS     = 1,      // MATCH = 1: read ports per input buffer (1 to N)
    parameter PATIENCE  = 16      // MATCH = 1: matches passing over a busy input before reserving it
) (
    input  wire               clk,
    input  wire               rst,

    input  wire [N*256-1:0]   s_axis_tdata,
    input  wire [N-1:0]       s_axis_tvalid,
    output wire [N-1:0]       s_axis_tready,
    input  wire [N-1:0]       s_axis_tfirst,
    input  wire [N-1:0]       s_axis_tlast,

    output wire [N*256-1:0]   m_axis_tdata,
    output wire [N-1:0]       m_axis_tvalid,
    input  wire [N-1:0]       m_axis_tready,
    output wire [N-1:0]       m_axis_tfirst,
    output wire [N-1:0]       m_axis_tlast,

    input  wire [M*256-1:0]   stk_s_axis_tdata,
    input  wire [M-1:0]       stk_s_axis_tvalid,
    output wire [M-1:0]       stk_s_axis_tready,
    input  wire [M-1:0]       stk_s_axis_tfirst,
    input  wire [M-1:0]       stk_s_axis_tlast,

    output wire [M*256-1:0]   stk_m_axis_tdata,
    output wire [M-1:0]       stk_m_axis_tvalid,
    input  wire [M-1:0]       stk_m_axis_tready,
    output wire [M-1:0]       stk_m_axis_tfirst,
    output wire [M-1:0]       stk_m_axis_tlast,

    output wire [255:0]       if_m_axis_tdata,
    output wire               if_m_axis_tvalid,
    input  wire               if_m_axis_tready,
    output wire               if_m_axis_tfirst,
    output wire               if_m_axis_tlast,

    input  wire [255:0]       if_s_axis_tdata,
    input  wire               if_s_axis_tvalid,
    output wire               if_s_axis_tready,
    input  wire               if_s_axis_tfirst,
    input  wire               if_s_axis_tlast,

    input  wire [19:0]        s_axil_awaddr,
    input  wire               s_axil_awvalid,
    output wire               s_axil_awready,
    input  wire [31:0]        s_axil_wdata,
    input  wire [3:0]         s_axil_wstrb,
    input  wire               s_axil_wvalid,
    output wire               s_axil_wready,
    output wire [1:0]         s_axil_bresp,
    output wire               s_axil_bvalid,
    input  wire               s_axil_bready,
    input  wire [19:0]        s_axil_araddr,
    input  wire               s_axil_arvalid,
    output wire               s_axil_arready,
    output wire [31:0]        s_axil_rdata,
    output wire [1:0]         s_axil_rresp,
    output wire               s_axil_rvalid,
    input  wire               s_axil_rready
);

`include "uniplane_header.vh"

localparam IW = $clog2(N);
localparam LW = 17;
localparam WW = 32;
localparam PW = 8;
localparam [31:0] VERSION = 32'h0001_0000;
localparam integer PAGE_TR_I = N + 1;
localparam integer PAGE_UL_I = N + 2;
localparam [7:0] PAGE_TR = PAGE_TR_I[7:0];
localparam [7:0] PAGE_UL = PAGE_UL_I[7:0];
// The crossbar's kind: bits 7:0 MATCH, bits 15:8 iterations, bits 23:16
// read ports per input (both 0 without matching).
localparam integer CROSSBAR_I = MATCH == 0 ? 0 : (1 + 256 * ITER + 65536 * PORTS);
localparam [31:0] CROSSBAR = CROSSBAR_I[31:0];

// ---------------------------------------------------------- register bus
wire        reg_wr_en, reg_rd_en;
wire [19:0] reg_wr_addr, reg_rd_addr;
wire [31:0] reg_wr_data;
reg  [31:0] reg_rd_data;

up_axil_regs #(.AW(20)) axil (
    .clk(clk), .rst(rst),
    .s_axil_awaddr(s_axil_awaddr), .s_axil_awvalid(s_axil_awvalid), .s_axil_awready(s_axil_awready),
    .s_axil_wdata(s_axil_wdata), .s_axil_wstrb(s_axil_wstrb), .s_axil_wvalid(s_axil_wvalid),
    .s_axil_wready(s_axil_wready), .s_axil_bresp(s_axil_bresp), .s_axil_bvalid(s_axil_bvalid),
    .s_axil_bready(s_axil_bready), .s_axil_araddr(s_axil_araddr), .s_axil_arvalid(s_axil_arvalid),
    .s_axil_arready(s_axil_arready), .s_axil_rdata(s_axil_rdata), .s_axil_rresp(s_axil_rresp),
    .s_axil_rvalid(s_axil_rvalid), .s_axil_rready(s_axil_rready),
    .reg_wr_en(reg_wr_en), .reg_wr_addr(reg_wr_addr), .reg_wr_data(reg_wr_data),
    .reg_rd_en(reg_rd_en), .reg_rd_addr(reg_rd_addr), .reg_rd_data(reg_rd_data)
);

wire [7:0]  wr_page = reg_wr_addr[19:12];
wire [7:0]  rd_page = reg_rd_addr[19:12];
wire [11:0] wr_off = reg_wr_addr[11:0];
wire [11:0] rd_off = reg_rd_addr[11:0];

// ----------------------------------------------------------- connectors
wire [N*256-1:0]  c_tdata;
wire [N-1:0]      c_tvalid, c_tready, c_tfirst, c_tlast;
wire [N*LW-1:0]   c_tlen;
wire [N*IW-1:0]   c_tdest;

wire [N-1:0]      tr_lk_valid;
wire [N*128-1:0]  tr_lk_key;
wire [N-1:0]      tr_res_valid, tr_res_hit;
wire [N*PW-1:0]   tr_res_port;

wire [N-1:0]      cfg_pause, cfg_drr, cfg_load;
wire [N*N*WW-1:0] cfg_weight;
wire [N*N*IW-1:0] cfg_class;
wire [N*32-1:0]   port_rd_data;

wire [N-1:0]      tx_msg = m_axis_tvalid & m_axis_tready & m_axis_tfirst;

genvar p;
generate
    for (p = 0; p < N; p = p + 1) begin : port_gen
        up_connector #(
            .N(N), .PORT(p), .E(E), .C(C), .R(R), .DF(DF), .LW(LW), .WW(WW), .PW(PW)
        ) connector (
            .clk(clk), .rst(rst),
            .s_tdata(s_axis_tdata[p*256 +: 256]), .s_tvalid(s_axis_tvalid[p]),
            .s_tready(s_axis_tready[p]), .s_tfirst(s_axis_tfirst[p]), .s_tlast(s_axis_tlast[p]),
            .m_tdata(c_tdata[p*256 +: 256]), .m_tvalid(c_tvalid[p]), .m_tready(c_tready[p]),
            .m_tfirst(c_tfirst[p]), .m_tlast(c_tlast[p]), .m_tlen(c_tlen[p*LW +: LW]),
            .m_tdest(c_tdest[p*IW +: IW]),
            .tr_lk_valid(tr_lk_valid[p]), .tr_lk_key(tr_lk_key[p*128 +: 128]),
            .tr_res_hit(tr_res_hit[p]), .tr_res_port(tr_res_port[p*PW +: PW]),
            .tx_msg(tx_msg[p]),
            .tx_len(m_axis_tdata[p*256 + UP_MSG_LENGTH_LSB +: 16]),
            .cfg_pause(cfg_pause[p]), .cfg_drr(cfg_drr[p]),
            .cfg_weight(cfg_weight[p*N*WW +: N*WW]), .cfg_class(cfg_class[p*N*IW +: N*IW]),
            .cfg_load(cfg_load[p]),
            .wr_en(reg_wr_en && wr_page == p + 1), .wr_addr(wr_off), .wr_data(reg_wr_data),
            .rd_en(reg_rd_en && rd_page == p + 1), .rd_addr(rd_off),
            .rd_data(port_rd_data[p*32 +: 32])
        );
    end
endgenerate

wire [31:0] tr_rd_data;
up_translator #(.N(N), .T(T), .PW(PW)) translator (
    .clk(clk), .rst(rst),
    .wr_en(reg_wr_en && wr_page == PAGE_TR), .wr_addr(wr_off), .wr_data(reg_wr_data),
    .rd_addr(rd_off), .rd_data(tr_rd_data),
    .lk_valid(tr_lk_valid), .lk_key(tr_lk_key),
    .res_valid(tr_res_valid), .res_hit(tr_res_hit), .res_port(tr_res_port)
);

// -------------------------------------------------------------- crossbar
/* verilator lint_off UNUSEDSIGNAL */
wire [N*IW-1:0] x_src;
/* verilator lint_on UNUSEDSIGNAL */

up_crossbar #(
    .N(N), .DEPTH(VOQ_DEPTH), .POOL(VOQ_POOL), .LW(LW), .WW(WW), .QUANTUM(QUANTUM),
    .MATCH(MATCH), .ITER(ITER), .PORTS(PORTS), .PATIENCE(PATIENCE)
) crossbar (
    .clk(clk), .rst(rst),
    .s_tdata(c_tdata), .s_tvalid(c_tvalid), .s_tready(c_tready),
    .s_tfirst(c_tfirst), .s_tlast(c_tlast), .s_tlen(c_tlen), .s_tdest(c_tdest),
    .m_tdata(m_axis_tdata), .m_tvalid(m_axis_tvalid), .m_tready(m_axis_tready),
    .m_tfirst(m_axis_tfirst), .m_tlast(m_axis_tlast), .m_tsrc(x_src),
    .cfg_pause(cfg_pause), .cfg_drr(cfg_drr), .cfg_weight(cfg_weight),
    .cfg_class(cfg_class), .cfg_load(cfg_load)
);

// -------------------------------------------------------------- underlay
wire [31:0] ul_rd_data;
up_underlay #(.M(M), .S(S), .D(D), .DEPTH(UDEPTH), .LW(LW), .WW(WW), .QUANTUM(QUANTUM)) underlay (
    .clk(clk), .rst(rst),
    .s_tdata(stk_s_axis_tdata), .s_tvalid(stk_s_axis_tvalid), .s_tready(stk_s_axis_tready),
    .s_tfirst(stk_s_axis_tfirst), .s_tlast(stk_s_axis_tlast),
    .if_m_tdata(if_m_axis_tdata), .if_m_tvalid(if_m_axis_tvalid), .if_m_tready(if_m_axis_tready),
    .if_m_tfirst(if_m_axis_tfirst), .if_m_tlast(if_m_axis_tlast),
    .if_s_tdata(if_s_axis_tdata), .if_s_tvalid(if_s_axis_tvalid), .if_s_tready(if_s_axis_tready),
    .if_s_tfirst(if_s_axis_tfirst), .if_s_tlast(if_s_axis_tlast),
    .m_tdata(stk_m_axis_tdata), .m_tvalid(stk_m_axis_tvalid), .m_tready(stk_m_axis_tready),
    .m_tfirst(stk_m_axis_tfirst), .m_tlast(stk_m_axis_tlast),
    .wr_en(reg_wr_en && wr_page == PAGE_UL), .wr_addr(wr_off), .wr_data(reg_wr_data),
    .rd_en(reg_rd_en && rd_page == PAGE_UL), .rd_addr(rd_off), .rd_data(ul_rd_data)
);

// ---------------------------------------------------- register read path
function [31:0] page_addr;
    input [7:0] page;
    begin
        page_addr = {12'd0, page, 12'd0};
    end
endfunction

always @* begin
    reg_rd_data = 32'd0;
    if (rd_page == 8'd0) begin
        case (rd_off)
            12'h000: reg_rd_data = 32'h5550_0001;
            12'h004: reg_rd_data = VERSION;
            12'h008: reg_rd_data = page_addr(8'd1);
            12'h00c: reg_rd_data = N;
            12'h010: reg_rd_data = E;
            12'h014: reg_rd_data = C;
            12'h018: reg_rd_data = R;
            12'h01c: reg_rd_data = T;
            12'h020: reg_rd_data = QUANTUM;
            12'h024: reg_rd_data = M;
            12'h028: reg_rd_data = UP_BEAT_BITS;
            12'h02c: reg_rd_data = UP_LAYOUT_HASH;
            12'h030: reg_rd_data = VOQ_DEPTH;
            12'h034: reg_rd_data = S;
            12'h038: reg_rd_data = D;
            12'h03c: reg_rd_data = DF;
            12'h040: reg_rd_data = VOQ_POOL;
            12'h044: reg_rd_data = CROSSBAR;
            default: reg_rd_data = 32'd0;
        endcase
    end else if ({24'd0, rd_page} <= N) begin
        reg_rd_data = port_rd_data[(rd_page - 8'd1) * 32 +: 32];
        case (rd_off)
            12'h000: reg_rd_data = 32'h5550_0010;
            12'h004: reg_rd_data = VERSION;
            12'h008: reg_rd_data = page_addr(rd_page + 8'd1);
            default: ;
        endcase
    end else if (rd_page == PAGE_TR) begin
        reg_rd_data = tr_rd_data;
        case (rd_off)
            12'h000: reg_rd_data = 32'h5550_0020;
            12'h004: reg_rd_data = VERSION;
            12'h008: reg_rd_data = page_addr(PAGE_UL);
            default: ;
        endcase
    end else if (rd_page == PAGE_UL) begin
        reg_rd_data = ul_rd_data;
        case (rd_off)
            12'h000: reg_rd_data = 32'h5550_0030;
            12'h004: reg_rd_data = VERSION;
            12'h008: reg_rd_data = 32'd0;
            default: ;
        endcase
    end
end

wire unused_ok = &{1'b0, tr_res_valid};

endmodule

`resetall
