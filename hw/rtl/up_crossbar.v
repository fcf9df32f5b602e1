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
// MATCH = 1 builds the crossbar with PORTS read ports per input buffer
// instead (PORTS copies of an input's memory on an FPGA rather than N): an
// up_match matches inputs with a free port to free outputs each cycle
// (iSLIP-style, ITER iterations, each output's grant made by its own
// up_sched under its policy), a match holds until its message's last beat
// has left, and each output reads its matched input's port. PORTS = 2
// lets an input feed two outputs at once: a speedup of two on the input
// side, which the matching needs to keep the outputs busy under
// saturation (docs/hw.md). The matcher sees every queue's
// head through up_voq_buf's per-queue head registers (valid and length),
// not through the data port. An output's scheduler then decides among
// the inputs that are free, not among all backlogged ones, so only the
// per-(input, output) order is the engine's (docs/hw.md, Equivalence).
// A message's first beat leaves the cycle after its match.
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
    parameter QUANTUM = 1536,
    parameter MATCH   = 0,     // 0: a read port per output; 1: one per input, iSLIP matching
    parameter ITER    = 1,     // MATCH = 1: matching iterations per cycle
    parameter PORTS   = 1,     // MATCH = 1: read ports per input buffer (1 to N)
    parameter PATIENCE = 16    // MATCH = 1: see up_match
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

genvar i, o;
generate
if (MATCH == 0) begin : port_per_output
    // Queue (i, o) is element i*N + o.
    wire [N*N*QW-1:0] q_data;
    wire [N*N-1:0]    q_valid;
    wire [N*N-1:0]    q_ready;

    for (i = 0; i < N; i = i + 1) begin : in_gen
        /* verilator lint_off UNUSEDSIGNAL */
        wire [$clog2(N*DEPTH+POOL):0] count;
        wire [N-1:0] h_valid;
        wire [N-1:0] h_len;
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
            .m_sel({IW{1'b0}}),
            .h_valid(h_valid),
            .h_len(h_len),
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
end else begin : matched
    localparam PW = PORTS > 1 ? $clog2(PORTS) : 1;
    // Input i's read ports, i*PORTS + p (port p reads queue i_out of it).
    wire [N*PORTS*QW-1:0] r_data;
    wire [N*PORTS-1:0]    r_valid;
    // Queue heads after this cycle's read, i*N + o.
    wire [N*N-1:0]    h_valid;
    wire [N*N*LW-1:0] h_len;
    // The matching.
    wire [N-1:0]      o_busy;
    wire [N*PORTS-1:0] i_busy;
    wire [N*IW-1:0]   o_in;
    wire [N*PW-1:0]   o_port;
    wire [N*PORTS*IW-1:0] i_out;
    wire [N-1:0]      done;
    wire [N-1:0]      out_ready;

    for (i = 0; i < N; i = i + 1) begin : in_gen
        /* verilator lint_off UNUSEDSIGNAL */
        wire [$clog2(N*DEPTH+POOL):0] count;
        /* verilator lint_on UNUSEDSIGNAL */
        wire [N-1:0] q_valid;
        wire [N-1:0] q_ready;
        wire [PORTS*IW-1:0] sel = i_out[i*PORTS*IW +: PORTS*IW];
        genvar p;
        for (p = 0; p < PORTS; p = p + 1) begin : port_gen
            assign r_valid[i*PORTS + p] = i_busy[i*PORTS + p] && q_valid[sel[p*IW +: IW]];
        end
        // Queue o is read when output o, matched to this input, takes a beat.
        for (o = 0; o < N; o = o + 1) begin : ready_gen
            assign q_ready[o] = o_busy[o] && o_in[o*IW +: IW] == i && out_ready[o];
        end
        up_voq_buf #(.N(N), .W(QW), .RES(DEPTH), .POOL(POOL), .ONE_PORT(1), .PORTS(PORTS), .HW(LW)) voqs (
            .clk(clk), .rst(rst),
            .s_data({s_tlen[i*LW +: LW], s_tfirst[i], s_tlast[i], s_tdata[i*256 +: 256]}),
            .s_dest(s_tdest[i*IW +: IW]),
            .s_valid(s_tvalid[i]),
            .s_ready(s_tready[i]),
            .m_data(r_data[i*PORTS*QW +: PORTS*QW]),
            .m_valid(q_valid),
            .m_ready(q_ready),
            .m_sel(sel),
            .h_valid(h_valid[i*N +: N]),
            .h_len(h_len[i*N*LW +: N*LW]),
            .count(count)
        );
    end

    up_match #(
        .N(N), .ITER(ITER), .PORTS(PORTS), .LW(LW), .WW(WW), .QUANTUM(QUANTUM), .PATIENCE(PATIENCE)
    ) match (
        .clk(clk), .rst(rst),
        .req(h_valid), .len(h_len),
        .enable(~cfg_pause), .done(done),
        .cfg_drr(cfg_drr), .cfg_weight(cfg_weight), .cfg_class(cfg_class), .cfg_load(cfg_load),
        .o_busy(o_busy), .o_in(o_in), .o_port(o_port), .i_busy(i_busy), .i_out(i_out)
    );

    for (o = 0; o < N; o = o + 1) begin : out_gen
        wire [IW-1:0] src = o_in[o*IW +: IW];
        // The read port it takes from: port o_port of input src.
        wire [QW-1:0] beat;
        wire          valid;
        if (PORTS == 1) begin : one_gen
            assign beat = r_data[src*QW +: QW];
            assign valid = o_busy[o] && r_valid[src];
            wire unused_port = &{1'b0, o_port[o*PW +: PW]};
        end else begin : ports_gen
            localparam RW = $clog2(N * PORTS);
            localparam integer PORTS_I = PORTS;
            localparam [RW-1:0] PORTS_R = PORTS_I[RW-1:0];
            wire [RW-1:0] rp = {{(RW-IW){1'b0}}, src} * PORTS_R
                               + {{(RW-PW){1'b0}}, o_port[o*PW +: PW]};
            assign beat = r_data[rp*QW +: QW];
            assign valid = o_busy[o] && r_valid[rp];
        end
        /* verilator lint_off UNUSEDSIGNAL */
        wire [LW-1:0] out_len;
        /* verilator lint_on UNUSEDSIGNAL */
        assign done[o] = valid && out_ready[o] && beat[256];
        up_skid #(.W(QW + IW)) out_skid (
            .clk(clk), .rst(rst),
            .s_data({src, beat}),
            .s_valid(valid),
            .s_ready(out_ready[o]),
            .m_data({m_tsrc[o*IW +: IW], out_len, m_tfirst[o], m_tlast[o], m_tdata[o*256 +: 256]}),
            .m_valid(m_tvalid[o]),
            .m_ready(m_tready[o])
        );
    end
end
endgenerate

endmodule

`resetall
