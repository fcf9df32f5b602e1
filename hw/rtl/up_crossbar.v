// uniplane: an N x N crossbar with virtual output queues.
//
// A FIFO per (input, output) pair holds the messages of that input for
// that output, so a busy output never blocks an input's traffic to
// another one; each output has an up_arb_mux that takes whole messages
// from its N queues as its scheduler decides (the policy of each output is
// set through its port's register page). Lossless: a full queue only
// lowers the input's ready. Every port moves one beat per cycle.
//
// s_tdest selects the output of the beats on input i; s_tlen carries the
// message's length in bytes on its first beat.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_crossbar #(
    parameter N       = 4,
    parameter DEPTH   = 32,    // beats per virtual output queue
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
wire [N*N-1:0]    q_in_ready;

genvar i, o;
generate
    for (i = 0; i < N; i = i + 1) begin : in_gen
        wire [IW-1:0] dest = s_tdest[i*IW +: IW];
        assign s_tready[i] = q_in_ready[i*N + {{(32-IW){1'b0}}, dest}];
        for (o = 0; o < N; o = o + 1) begin : voq_gen
            /* verilator lint_off UNUSEDSIGNAL */
            wire [$clog2(DEPTH):0] count;
            /* verilator lint_on UNUSEDSIGNAL */
            up_fifo #(.W(QW), .DEPTH(DEPTH)) voq (
                .clk(clk), .rst(rst),
                .s_data({s_tlen[i*LW +: LW], s_tfirst[i], s_tlast[i], s_tdata[i*256 +: 256]}),
                .s_valid(s_tvalid[i] && dest == o),
                .s_ready(q_in_ready[i*N + o]),
                .m_data(q_data[(i*N + o)*QW +: QW]),
                .m_valid(q_valid[i*N + o]),
                .m_ready(q_ready[i*N + o]),
                .count(count)
            );
        end
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
