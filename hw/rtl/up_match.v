// uniplane: iSLIP-style matching of N inputs to N outputs, a whole
// message at a time (McKeown, "The iSLIP scheduling algorithm for
// input-queued switches", 1999).
//
// For a crossbar whose inputs each have PORTS read ports: every cycle the
// free outputs and the inputs with a free port are matched, so that an
// input sends to at most PORTS outputs (one per port) and an output takes
// from at most one input. PORTS = 1 is iSLIP; PORTS = 2 lets an input
// drain two beats a cycle into two outputs, a speedup of two on the
// input side (an input-queued switch without one cannot keep its outputs
// busy under saturation: a cycle in which an input is unmatched is lost).
// A match holds until its message's last beat leaves (`done` of its
// output); a pair whose message ends in this cycle is free in it, so the
// next message of either side may be matched in the same cycle and start
// in the next one.
//
// One iteration, three steps, all in one cycle:
//   request: input i requests output o when it has a message for o at its
//            head (req[i*N+o]), o is free (and enabled) and i has a free
//            port;
//   grant:   each output picks one requesting input with its own up_sched,
//            so the output's policy (round-robin, DRR by bytes, strict
//            classes, its port's register page) keeps its meaning; inputs
//            busy with another output do not request, so the output grants
//            another one (work conservation first);
//   accept:  each input granted by several outputs accepts, for each of
//            its free ports (lowest port first), the next at or after its
//            accept pointer.
// The pointers move only on a grant accepted in the first iteration: the
// output's scheduler takes its pick then (up_sched's `accept`; for
// round-robin its pointer goes one beyond the input, iSLIP's grant
// pointer), and the input's accept pointer goes one beyond the last
// output it accepted.
// Further iterations (ITER > 1) match what is still free among
// round-robin outputs, each granting the first requesting input at or
// after its grant pointer, and move no pointer. A DRR output is granted
// by its scheduler only (a grant of a later iteration would send a
// message its deficit has not paid for); it tries again next cycle.
//
// Holding matches for whole messages while granting only free inputs can
// starve a pair (an input is busy when all its ports are): with two
// inputs and two outputs and one port each, (0, 0) and (1, 1) may
// each end while the other pair is busy and be matched again forever, so
// (0, 1) and (1, 0) never are. Each output counts, per input, the
// matches it made while that input requested it and was busy elsewhere
// (reset when the pair is matched or the request drops); at PATIENCE the
// output reserves the input (the first such at or after its grant
// pointer): it grants no other input, and the input, once free, requests
// only the outputs reserving it, so the pair is matched when the input's
// current message ends. Every persistent request is thereby matched
// within a bound (tb_match checks it); under uniform load reservations
// are rare and cost little.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_match #(
    parameter N       = 4,      // inputs and outputs (>= 2)
    parameter ITER    = 1,      // iterations per cycle (>= 1)
    parameter PORTS   = 1,      // read ports per input: matches it may hold (1 to N)
    parameter LW      = 17,
    parameter WW      = 32,
    parameter QUANTUM = 1536,
    parameter PATIENCE = 16     // matches passing over a busy requester before reserving it
) (
    input  wire                      clk,
    input  wire                      rst,

    input  wire [N*N-1:0]            req,     // i*N+o: input i has a message for o at its head
    input  wire [N*N*LW-1:0]         len,     // its length in bytes (for DRR)
    input  wire [N-1:0]              enable,  // per output: may start a message
    input  wire [N-1:0]              done,    // per output: its message's last beat leaves now

    input  wire [N-1:0]              cfg_drr,
    input  wire [N*N*WW-1:0]         cfg_weight,
    input  wire [N*N*$clog2(N)-1:0]  cfg_class,
    input  wire [N-1:0]              cfg_load,

    output wire [N-1:0]              o_busy,  // output o is matched
    output wire [N*$clog2(N)-1:0]    o_in,    // to this input
    output wire [N*(PORTS > 1 ? $clog2(PORTS) : 1)-1:0] o_port, // through this port of it
    output wire [N*PORTS-1:0]        i_busy,  // port p of input i (i*PORTS+p) is matched
    output wire [N*PORTS*$clog2(N)-1:0] i_out // to this output
);

localparam IW = $clog2(N);
localparam PW = PORTS > 1 ? $clog2(PORTS) : 1;
localparam P = N * PORTS;   // ports of all inputs, i*PORTS+p
localparam integer LAST_Q = N - 1;
localparam [IW-1:0] LAST = LAST_Q[IW-1:0];

localparam SW = $clog2(PATIENCE + 1);
localparam integer PAT_I = PATIENCE;
localparam [SW-1:0] PAT = PAT_I[SW-1:0];

initial begin
    if (N < 2 || ITER < 1 || PATIENCE < 1 || PORTS < 1 || PORTS > N) begin
        $error("up_match: N must be >= 2, ITER >= 1, PATIENCE >= 1 and PORTS 1 to N");
        $finish;
    end
end

reg [N-1:0]    ob_reg = {N{1'b0}};
reg [N*IW-1:0] oin_reg = {(N*IW){1'b0}};
reg [N*PW-1:0] oport_reg = {(N*PW){1'b0}};
reg [P-1:0]    ib_reg = {P{1'b0}};
reg [P*IW-1:0] iout_reg = {(P*IW){1'b0}};
reg [N*IW-1:0] gptr_reg = {(N*IW){1'b0}};   // grant pointers (later iterations)
reg [N*IW-1:0] aptr_reg = {(N*IW){1'b0}};   // accept pointers
wire [N*N*SW-1:0] skip;                    // o*N+i: matches of o passing over busy i

assign o_busy = ob_reg;
assign o_in   = oin_reg;
assign o_port = oport_reg;
assign i_busy = ib_reg;
assign i_out  = iout_reg;

// First index at or after `start`, cyclically, set in `mask` (0 if none).
function [IW-1:0] first_from;
    input [N-1:0]  mask;
    input [IW-1:0] start;
    integer k, j;
    reg found;
    begin
        found = 1'b0;
        first_from = {IW{1'b0}};
        for (k = 0; k < N; k = k + 1) begin
            j = k + {{(32-IW){1'b0}}, start};
            if (j >= N) j = j - N;
            if (!found && mask[j]) begin
                found = 1'b1;
                first_from = j[IW-1:0];
            end
        end
    end
endfunction

function [IW-1:0] succ;
    input [IW-1:0] q;
    begin
        succ = (q == LAST) ? {IW{1'b0}} : q + 1'b1;
    end
endfunction

// Free sides: unmatched, or matched to a message that ends this cycle;
// an input is free when one of its ports is.
wire [N-1:0] out_free = ~ob_reg | (ob_reg & done);
wire [P-1:0] port_free;
wire [N-1:0] in_free;
wire [N-1:0] offer = out_free & enable;

// Reservations: output o holds out for input res_in[o].
wire [N-1:0]    res;
wire [N*IW-1:0] res_in;
wire [N*N-1:0]  res_by;         // i*N+o: output o reserves input i
wire [N-1:0]    in_res;         // input i is reserved by some output
// Requests the reservations let through, i*N+o.
wire [N*N-1:0]  lreq;

wire [N-1:0]    pick;
wire [N*IW-1:0] pick_idx;
reg  [N-1:0]    acc1;           // outputs whose first-iteration grant was accepted

genvar g, h;
generate
    for (g = 0; g < P; g = g + 1) begin : port_gen
        assign port_free[g] = !ib_reg[g] || done[iout_reg[g*IW +: IW]];
    end
    for (g = 0; g < N; g = g + 1) begin : in_gen
        assign in_free[g] = |port_free[g*PORTS +: PORTS];
    end
    for (g = 0; g < N; g = g + 1) begin : res_gen
        wire [N-1:0] full;
        for (h = 0; h < N; h = h + 1) begin : full_gen
            assign full[h] = skip[(g*N + h)*SW +: SW] == PAT;
        end
        assign res[g] = |full && enable[g];   // a paused output holds no input
        assign res_in[g*IW +: IW] = first_from(full, gptr_reg[g*IW +: IW]);
        for (h = 0; h < N; h = h + 1) begin : by_gen
            assign res_by[h*N + g] = res[g] && res_in[g*IW +: IW] == h;
        end
    end
    for (g = 0; g < N; g = g + 1) begin : lreq_gen
        assign in_res[g] = |res_by[g*N +: N];
        for (h = 0; h < N; h = h + 1) begin : row_gen
            // Input g to output h.
            assign lreq[g*N + h] = req[g*N + h] && (!res[h] || res_by[g*N + h])
                                   && (!in_res[g] || res_by[g*N + h]);
        end
    end
    for (g = 0; g < N; g = g + 1) begin : out_gen
        wire [N-1:0]    r;
        wire [N*LW-1:0] l;
        for (h = 0; h < N; h = h + 1) begin : col_gen
            assign r[h] = lreq[h*N + g] && in_free[h];
            assign l[h*LW +: LW] = len[(h*N + g)*LW +: LW];
        end
        up_sched #(.N(N), .LW(LW), .WW(WW), .QUANTUM(QUANTUM)) sched (
            .clk(clk), .rst(rst),
            .req(r), .len(l),
            .cfg_drr(cfg_drr[g]),
            .cfg_weight(cfg_weight[g*N*WW +: N*WW]),
            .cfg_class(cfg_class[g*N*IW +: N*IW]),
            .cfg_load(cfg_load[g]),
            .decide(offer[g]),
            .accept(acc1[g]),
            .pick(pick[g]),
            .pick_idx(pick_idx[g*IW +: IW])
        );
    end
endgenerate

// Pass-over counts: output g, input h.
generate
    for (g = 0; g < N; g = g + 1) begin : skip_o_gen
        for (h = 0; h < N; h = h + 1) begin : skip_i_gen
            reg [SW-1:0] cnt_reg = {SW{1'b0}};
            assign skip[(g*N + h)*SW +: SW] = cnt_reg;
            always @(posedge clk) begin
                if (!req[h*N + g]) begin
                    cnt_reg <= {SW{1'b0}};
                end else if (m_out[g]) begin
                    if (m_out_in[g*IW +: IW] == h) begin
                        cnt_reg <= {SW{1'b0}};
                    end else if (!in_free[h] && cnt_reg != PAT) begin
                        cnt_reg <= cnt_reg + 1'b1;
                    end
                end
                if (rst || cfg_load[g]) cnt_reg <= {SW{1'b0}};
            end
        end
    end
endgenerate

// The iterations: grants, then accepts, on what is still unmatched.
reg [N-1:0]    m_out;           // output matched this cycle
reg [N*IW-1:0] m_out_in;
reg [N*PW-1:0] m_out_port;
reg [P-1:0]    m_port;          // port matched this cycle
reg [P*IW-1:0] m_port_out;
reg [N-1:0]    acc1_in;         // inputs that accepted in the first iteration
reg [N*IW-1:0] acc1_last;       // the last output each of them accepted then
reg [N*N-1:0]  gr;              // i*N+o: output o grants input i
reg [N-1:0]    cand, gi;
reg [IW-1:0]   a, gsel;
integer it, o, i, q;

always @* begin
    m_out = {N{1'b0}};
    m_out_in = {(N*IW){1'b0}};
    m_out_port = {(N*PW){1'b0}};
    m_port = {P{1'b0}};
    m_port_out = {(P*IW){1'b0}};
    acc1 = {N{1'b0}};
    acc1_in = {N{1'b0}};
    acc1_last = {(N*IW){1'b0}};
    cand = {N{1'b0}};
    gi = {N{1'b0}};
    a = {IW{1'b0}};
    gsel = {IW{1'b0}};
    for (it = 0; it < ITER; it = it + 1) begin
        gr = {(N*N){1'b0}};
        for (o = 0; o < N; o = o + 1) begin
            if (it == 0) begin
                gsel = pick_idx[o*IW +: IW];
                if (pick[o]) gr[gsel*N + o] = 1'b1;
            end else if (offer[o] && !cfg_drr[o] && !m_out[o]) begin
                for (i = 0; i < N; i = i + 1) begin
                    cand[i] = 1'b0;
                    for (q = 0; q < PORTS; q = q + 1) begin
                        if (port_free[i*PORTS + q] && !m_port[i*PORTS + q]) cand[i] = lreq[i*N + o];
                    end
                end
                gsel = first_from(cand, gptr_reg[o*IW +: IW]);
                if (|cand) gr[gsel*N + o] = 1'b1;
            end
        end
        for (i = 0; i < N; i = i + 1) begin
            gi = gr[i*N +: N];
            // Each port free and not yet matched, lowest first, takes the
            // next grant from the accept pointer on.
            for (q = 0; q < PORTS; q = q + 1) begin
                if (port_free[i*PORTS + q] && !m_port[i*PORTS + q] && |gi) begin
                    a = first_from(gi, aptr_reg[i*IW +: IW]);
                    gi[a] = 1'b0;
                    m_port[i*PORTS + q] = 1'b1;
                    m_port_out[(i*PORTS + q)*IW +: IW] = a;
                    m_out[a] = 1'b1;
                    m_out_in[a*IW +: IW] = i[IW-1:0];
                    m_out_port[a*PW +: PW] = q[PW-1:0];
                    if (it == 0) begin
                        acc1[a] = 1'b1;
                        acc1_in[i] = 1'b1;
                        acc1_last[i*IW +: IW] = a;
                    end
                end
            end
        end
    end
end

integer k;
always @(posedge clk) begin
    for (k = 0; k < N; k = k + 1) begin
        if (out_free[k]) begin
            ob_reg[k] <= m_out[k];
            oin_reg[k*IW +: IW] <= m_out_in[k*IW +: IW];
            oport_reg[k*PW +: PW] <= m_out_port[k*PW +: PW];
        end
        if (acc1[k]) gptr_reg[k*IW +: IW] <= succ(m_out_in[k*IW +: IW]);
        if (acc1_in[k]) aptr_reg[k*IW +: IW] <= succ(acc1_last[k*IW +: IW]);
        if (cfg_load[k]) gptr_reg[k*IW +: IW] <= {IW{1'b0}};
    end
    for (k = 0; k < P; k = k + 1) begin
        if (port_free[k]) begin
            ib_reg[k] <= m_port[k];
            iout_reg[k*IW +: IW] <= m_port_out[k*IW +: IW];
        end
    end
    if (rst) begin
        ob_reg <= {N{1'b0}};
        ib_reg <= {P{1'b0}};
        gptr_reg <= {(N*IW){1'b0}};
        aptr_reg <= {(N*IW){1'b0}};
    end
end

endmodule

`resetall
