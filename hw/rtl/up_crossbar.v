// uniplane: an N x N crossbar with virtual output queues.
//
// Each input keeps one queue per output (virtual output queues) in one
// buffer (up_voq_buf) of N*DEPTH + POOL beats: every queue may always
// hold DEPTH beats, and beyond that takes from a pool of POOL beats
// shared by the input's queues. A busy output never blocks an input's
// traffic to another one, and one output's backlog may take the whole
// pool while the input's other queues are empty (POOL = 0 is a FIFO of
// DEPTH beats per queue).
//
// Each output has an up_arb_mux that takes whole messages from the heads
// of its N queues as its scheduler decides (the policy of each output is
// set through its port's register page). Every output reads its own queue
// of every input (the buffer has a read port per output), so no output
// waits for another to release an input, no matching between inputs and
// outputs is needed, and each output's scheduler sees the whole backlog
// and decides exactly as the engine's does. Lossless: a queue that can
// take no more beats only lowers the input's ready. Every port moves one
// beat per cycle.
//
// s_tdest selects the output of the beats on input i; s_tlen carries the
// message's length in bytes on its first beat.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_crossbar #(
    parameter N       = 4,
    parameter DEPTH   = 32,    // beats each virtual output queue may always hold
    parameter POOL    = 768,   // further beats per input, shared by its N queues
    parameter LW      = 17,
    parameter WW      = 32,
    parameter QUANTUM = 1536
) (
    input  wire                      clk,
    input  wire                      rst,

    input  wire [N*256-1:0]          s_tdata,
    input  wire [N-1:0]              s_tvalid,
    output wire [N-1:0]              s_tready,
    input  wire [N-1:0]              s_tfirst,
    input  wire [N-1:0]              s_tlast,
    input  wire [N*LW-1:0]           s_tlen,
    input  wire [N*$clog2(N)-1:0]    s_tdest,

    output wire [N*256-1:0]          m_tdata,
    output wire [N-1:0]              m_tvalid,
    input  wire [N-1:0]              m_tready,
    output wire [N-1:0]              m_tfirst,
    output wire [N-1:0]              m_tlast,
    output wire [N*$clog2(N)-1:0]    m_tsrc,

    input  wire [N-1:0]              cfg_pause,
    input  wire [N-1:0]              cfg_drr,
    input  wire [N*N*WW-1:0]         cfg_weight,
    input  wire [N*N*$clog2(N)-1:0]  cfg_class,
    input  wire [N-1:0]              cfg_load
);

localparam IW = $clog2(N);
localparam QW = 256 + LW + 2;

// Queue (i, o) is element i*N + o.
wire [N*N*QW-1:0] q_data;
wire [N*N-1:0]    q_valid;
wire [N*N-1:0]    q_ready;

genvar i, o;
generate
    for (i = 0; i < N; i = i + 1) begin : in_gen
        /* verilator lint_off UNUSEDSIGNAL */
        wire [$clog2(N*DEPTH+POOL):0] count;
        /* verilator lint_on UNUSEDSIGNAL */
        up_voq_buf #(.N(N), .W(QW), .RES(DEPTH), .POOL(POOL)) voqs (
            .clk(clk), .rst(rst),
            .s_data({s_tlen[i*LW +: LW], s_tfirst[i], s_tlast[i], s_tdata[i*256 +: 256]}),
            .s_dest(s_tdest[i*IW +: IW]),
            .s_valid(s_tvalid[i]),
            .s_ready(s_tready[i]),
            .m_data(q_data[i*N*QW +: N*QW]),
            .m_valid(q_valid[i*N +: N]),
            .m_ready(q_ready[i*N +: N]),
            .count(count)
        );
    end

    for (o = 0; o < N; o = o + 1) begin : out_gen
        wire [N*256-1:0] a_data;
        wire [N-1:0]     a_valid, a_ready, a_first, a_last;
        wire [N*LW-1:0]  a_len;
        for (i = 0; i < N; i = i + 1) begin : col_gen
            assign {a_len[i*LW +: LW], a_first[i], a_last[i], a_data[i*256 +: 256]} = q_data[(i*N + o)*QW +: QW];
            assign a_valid[i] = q_valid[i*N + o];
            assign q_ready[i*N + o] = a_ready[i];
        end
        /* verilator lint_off UNUSEDSIGNAL */
        wire [LW-1:0] out_len;
        /* verilator lint_on UNUSEDSIGNAL */
        up_arb_mux #(.N(N), .DW(256), .LW(LW), .WW(WW), .QUANTUM(QUANTUM)) arb (
            .clk(clk), .rst(rst),
            .s_tdata(a_data), .s_tvalid(a_valid), .s_tready(a_ready),
            .s_tfirst(a_first), .s_tlast(a_last), .s_tlen(a_len),
            .m_tdata(m_tdata[o*256 +: 256]), .m_tvalid(m_tvalid[o]), .m_tready(m_tready[o]),
            .m_tfirst(m_tfirst[o]), .m_tlast(m_tlast[o]), .m_tlen(out_len),
            .m_tsrc(m_tsrc[o*IW +: IW]),
            .enable(!cfg_pause[o]),
            .cfg_drr(cfg_drr[o]),
            .cfg_weight(cfg_weight[o*N*WW +: N*WW]),
            .cfg_class(cfg_class[o*N*IW +: N*IW]),
            .cfg_load(cfg_load[o])
        );
    end
endgenerate

endmodule

`resetall
