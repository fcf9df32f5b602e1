// uniplane: the RTL plane with kernels on two of its device ports.
//
//   host port p in  --> +--------------+ --> host port p out
//                       | uniplane_top |
//   echo  <-- port ECHO_PORT out       |
//   echo  --> port ECHO_PORT in        |
//   sum32 <-- port SUM_PORT out        |
//   sum32 --> port SUM_PORT in  -------+
//
// The same ports as uniplane_top, so one C shim drives both. On
// ECHO_PORT and SUM_PORT the crossbar's output feeds the kernel
// (up_kernel_echo, up_kernel_sum32) and the kernel's answer enters that
// port's connector (access control, translator, forwarding) like any
// device's message; the host side of those two ports is not connected:
// their s_axis_tready and m_axis_tvalid read 0. A message reaches a
// kernel through a forwarding entry to its port, and the answer goes back
// through the kernel port's own forwarding table.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_top_kernels #(
    parameter N         = 4,      // overlay ports, kernels included
    parameter VOQ_DEPTH = 32,     // beats each virtual output queue may always hold
    parameter VOQ_POOL  = 768,    // further beats per input, shared by its N queues
    parameter M         = 2,      // underlay stacks
    parameter ECHO_PORT = 2,      // the port up_kernel_echo sits on
    parameter SUM_PORT  = 3       // the port up_kernel_sum32 sits on
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

localparam LW = 17;

// The plane's own port streams: what enters its connectors (p_s_*) and
// what its crossbar sends (p_m_*).
wire [N*256-1:0] p_s_tdata;
wire [N-1:0]     p_s_tvalid, p_s_tready, p_s_tfirst, p_s_tlast;
wire [N*256-1:0] p_m_tdata;
wire [N-1:0]     p_m_tvalid, p_m_tready, p_m_tfirst, p_m_tlast;

uniplane_top #(.N(N), .VOQ_DEPTH(VOQ_DEPTH), .VOQ_POOL(VOQ_POOL), .M(M)) plane (
    .clk(clk), .rst(rst),
    .s_axis_tdata(p_s_tdata), .s_axis_tvalid(p_s_tvalid), .s_axis_tready(p_s_tready),
    .s_axis_tfirst(p_s_tfirst), .s_axis_tlast(p_s_tlast),
    .m_axis_tdata(p_m_tdata), .m_axis_tvalid(p_m_tvalid), .m_axis_tready(p_m_tready),
    .m_axis_tfirst(p_m_tfirst), .m_axis_tlast(p_m_tlast),
    .stk_s_axis_tdata(stk_s_axis_tdata), .stk_s_axis_tvalid(stk_s_axis_tvalid),
    .stk_s_axis_tready(stk_s_axis_tready), .stk_s_axis_tfirst(stk_s_axis_tfirst),
    .stk_s_axis_tlast(stk_s_axis_tlast),
    .stk_m_axis_tdata(stk_m_axis_tdata), .stk_m_axis_tvalid(stk_m_axis_tvalid),
    .stk_m_axis_tready(stk_m_axis_tready), .stk_m_axis_tfirst(stk_m_axis_tfirst),
    .stk_m_axis_tlast(stk_m_axis_tlast),
    .if_m_axis_tdata(if_m_axis_tdata), .if_m_axis_tvalid(if_m_axis_tvalid),
    .if_m_axis_tready(if_m_axis_tready), .if_m_axis_tfirst(if_m_axis_tfirst),
    .if_m_axis_tlast(if_m_axis_tlast),
    .if_s_axis_tdata(if_s_axis_tdata), .if_s_axis_tvalid(if_s_axis_tvalid),
    .if_s_axis_tready(if_s_axis_tready), .if_s_axis_tfirst(if_s_axis_tfirst),
    .if_s_axis_tlast(if_s_axis_tlast),
    .s_axil_awaddr(s_axil_awaddr), .s_axil_awvalid(s_axil_awvalid), .s_axil_awready(s_axil_awready),
    .s_axil_wdata(s_axil_wdata), .s_axil_wstrb(s_axil_wstrb), .s_axil_wvalid(s_axil_wvalid),
    .s_axil_wready(s_axil_wready), .s_axil_bresp(s_axil_bresp), .s_axil_bvalid(s_axil_bvalid),
    .s_axil_bready(s_axil_bready), .s_axil_araddr(s_axil_araddr), .s_axil_arvalid(s_axil_arvalid),
    .s_axil_arready(s_axil_arready), .s_axil_rdata(s_axil_rdata), .s_axil_rresp(s_axil_rresp),
    .s_axil_rvalid(s_axil_rvalid), .s_axil_rready(s_axil_rready)
);

// The kernels' streams, one slot per port (only the kernel ports' used).
/* verilator lint_off UNUSEDSIGNAL */
wire [N*256-1:0] k_tdata;
wire [N-1:0]     k_tvalid, k_tready, k_tfirst, k_tlast;
wire [N*LW-1:0]  k_tlen;
wire [N*32-1:0]  k_answered, k_dropped;
wire [31:0]      k_misaligned;
/* verilator lint_on UNUSEDSIGNAL */

genvar p;
generate
    for (p = 0; p < N; p = p + 1) begin : port_gen
        if (p == ECHO_PORT || p == SUM_PORT) begin : kernel_port
            // The header's msg_length plus the header: the port's tlen.
            wire [LW-1:0] s_tlen = UP_HEADER_BYTES
                + {1'b0, p_m_tdata[p*256 + UP_MSG_LENGTH_LSB +: 16]};
            if (p == ECHO_PORT) begin : echo
                up_kernel_echo #(.LW(LW)) kernel (
                    .clk(clk), .rst(rst),
                    .s_tdata(p_m_tdata[p*256 +: 256]), .s_tvalid(p_m_tvalid[p]),
                    .s_tready(p_m_tready[p]), .s_tfirst(p_m_tfirst[p]),
                    .s_tlast(p_m_tlast[p]), .s_tlen(s_tlen),
                    .m_tdata(k_tdata[p*256 +: 256]), .m_tvalid(k_tvalid[p]),
                    .m_tready(k_tready[p]), .m_tfirst(k_tfirst[p]),
                    .m_tlast(k_tlast[p]), .m_tlen(k_tlen[p*LW +: LW]),
                    .answered(k_answered[p*32 +: 32]), .dropped(k_dropped[p*32 +: 32])
                );
            end else begin : sum32
                up_kernel_sum32 #(.LW(LW)) kernel (
                    .clk(clk), .rst(rst),
                    .s_tdata(p_m_tdata[p*256 +: 256]), .s_tvalid(p_m_tvalid[p]),
                    .s_tready(p_m_tready[p]), .s_tfirst(p_m_tfirst[p]),
                    .s_tlast(p_m_tlast[p]), .s_tlen(s_tlen),
                    .m_tdata(k_tdata[p*256 +: 256]), .m_tvalid(k_tvalid[p]),
                    .m_tready(k_tready[p]), .m_tfirst(k_tfirst[p]),
                    .m_tlast(k_tlast[p]), .m_tlen(k_tlen[p*LW +: LW]),
                    .answered(k_answered[p*32 +: 32]), .misaligned(k_misaligned),
                    .dropped(k_dropped[p*32 +: 32])
                );
            end
            // The kernel's answers enter the port's connector.
            assign p_s_tdata[p*256 +: 256] = k_tdata[p*256 +: 256];
            assign p_s_tvalid[p] = k_tvalid[p];
            assign p_s_tfirst[p] = k_tfirst[p];
            assign p_s_tlast[p]  = k_tlast[p];
            assign k_tready[p]   = p_s_tready[p];
            // The host side of a kernel port carries nothing.
            assign s_axis_tready[p] = 1'b0;
            assign m_axis_tdata[p*256 +: 256] = 256'd0;
            assign m_axis_tvalid[p] = 1'b0;
            assign m_axis_tfirst[p] = 1'b0;
            assign m_axis_tlast[p]  = 1'b0;
        end else begin : host_port
            assign p_s_tdata[p*256 +: 256] = s_axis_tdata[p*256 +: 256];
            assign p_s_tvalid[p] = s_axis_tvalid[p];
            assign p_s_tfirst[p] = s_axis_tfirst[p];
            assign p_s_tlast[p]  = s_axis_tlast[p];
            assign s_axis_tready[p] = p_s_tready[p];
            assign m_axis_tdata[p*256 +: 256] = p_m_tdata[p*256 +: 256];
            assign m_axis_tvalid[p] = p_m_tvalid[p];
            assign m_axis_tfirst[p] = p_m_tfirst[p];
            assign m_axis_tlast[p]  = p_m_tlast[p];
            assign p_m_tready[p] = m_axis_tready[p];
            assign k_tdata[p*256 +: 256] = 256'd0;
            assign k_tvalid[p] = 1'b0;
            assign k_tfirst[p] = 1'b0;
            assign k_tlast[p]  = 1'b0;
            assign k_tready[p] = 1'b0;
            assign k_tlen[p*LW +: LW] = {LW{1'b0}};
            assign k_answered[p*32 +: 32] = 32'd0;
            assign k_dropped[p*32 +: 32] = 32'd0;
        end
    end
endgenerate

// The host side of the kernel ports is not connected.
wire unused_ok = &{1'b0, s_axis_tdata, s_axis_tvalid, s_axis_tfirst, s_axis_tlast,
                   m_axis_tready};

endmodule

`resetall
