// uniplane: the output scheduler of the Rust engine, in RTL.
//
// Decides which of N queues sends the next whole message, exactly as
// uniplane_dataplane::sched::Scheduler::pick does, so that the RTL and the
// software engine make the same sequence of decisions from the same
// backlog:
//
// - round-robin (cfg_drr = 0): the first backlogged queue at or after the
//   pointer; the pointer moves past the queue served.
// - deficit round-robin (cfg_drr = 1), byte-accurate, with strict priority
//   between classes: the lowest class with a backlogged queue is served;
//   inside it a pointer visits the class's queues in index order. A
//   visited queue that is empty loses its deficit; a backlogged one gets
//   weight * QUANTUM bytes once per visit and sends messages while its
//   deficit covers the head message's length. Weighted fair sharing is
//   the case where every queue is in class 0.
//
// One decision takes one cycle when the queue under the pointer or the
// next backlogged one can send (the common case); when neither can (a
// message larger than a quantum), the pointer moves on and the decision
// continues next cycle, as the software loop does.
//
// State changes only when `decide` is high and some queue is backlogged:
// the software scheduler is likewise only asked when there is backlog.
// A pick changes it only with `accept` high: a caller that may be refused
// the queue it picked (the crossbar's matcher, where another output may
// take the same input in the same cycle) holds `accept` low and the
// scheduler decides again next time as if it had not been asked; callers
// that always take the pick tie it high.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_sched #(
    parameter N       = 4,      // queues (>= 2)
    parameter LW      = 17,     // width of a message length in bytes
    parameter WW      = 32,     // width of a weight
    parameter DW      = 48,     // width of a deficit counter
    parameter QUANTUM = 1536    // bytes per round for weight 1
) (
    input  wire                    clk,
    input  wire                    rst,

    input  wire [N-1:0]            req,        // queue has a message at its head
    input  wire [N*LW-1:0]         len,        // bytes of each head message

    input  wire                    cfg_drr,    // 0: round-robin, 1: deficit round-robin
    input  wire [N*WW-1:0]         cfg_weight, // weight per queue (>= 1)
    input  wire [N*$clog2(N)-1:0]  cfg_class,  // class per queue (0 first)
    input  wire                    cfg_load,   // new policy: forget pointers and credit

    input  wire                    decide,     // caller is between messages and may start one
    input  wire                    accept,     // the pick is taken (state moves on a pick only then)
    output reg                     pick,       // queue pick_idx starts a message now
    output reg  [$clog2(N)-1:0]    pick_idx
);

localparam IW = $clog2(N);
localparam [DW-1:0] Q = QUANTUM;
localparam integer LAST_Q = N - 1;
localparam [IW-1:0] LAST = LAST_Q[IW-1:0];

reg [IW-1:0] rr_next_reg = {IW{1'b0}};
reg [IW-1:0] pos_reg [0:N-1];
reg [N-1:0]  topped_reg = {N{1'b0}};
reg [DW-1:0] deficit_reg [0:N-1];

integer i;
initial begin
    for (i = 0; i < N; i = i + 1) begin
        pos_reg[i] = {IW{1'b0}};
        deficit_reg[i] = {DW{1'b0}};
    end
end

// First index at or after `start`, cyclically, whose bit is set in
// `mask` (mask must not be zero).
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

// The index after `q`, cyclically.
function [IW-1:0] succ;
    input [IW-1:0] q;
    begin
        succ = (q == LAST) ? {IW{1'b0}} : q + 1'b1;
    end
endfunction

// Indices in the cyclic range [a, b) (empty when a == b).
function [N-1:0] span;
    input [IW-1:0] a;
    input [IW-1:0] b;
    integer k;
    begin
        for (k = 0; k < N; k = k + 1) begin
            if (a <= b) span[k] = (k >= a) && (k < b);
            else        span[k] = (k >= a) || (k < b);
        end
    end
endfunction

// Functions take every signal they read as an argument: an always @*
// block is not sensitive to signals read only inside a called function.
function [DW-1:0] quantum_of;
    input [N*WW-1:0] weights;
    input [IW-1:0]   q;
    begin
        quantum_of = {{(DW-WW){1'b0}}, weights[q*WW +: WW]} * Q;
    end
endfunction

function [DW-1:0] len_of;
    input [N*LW-1:0] lens;
    input [IW-1:0]   q;
    begin
        len_of = {{(DW-LW){1'b0}}, lens[q*LW +: LW]};
    end
endfunction

// Deficit round-robin, one decision step.
reg [IW-1:0] csel;
reg [N-1:0]  members;
reg [N-1:0]  m;
reg [IW-1:0] p0, pm, e, e2, nxt;
reg          tp;
reg [DW-1:0] d1, d2;
reg          fit1, fit2;
reg [N-1:0]  reset1, reset2;
integer c, q;

always @* begin
    // The lowest class with a backlogged queue.
    csel = {IW{1'b0}};
    members = {N{1'b1}};
    for (c = N - 1; c >= 0; c = c - 1) begin
        for (q = 0; q < N; q = q + 1) begin
            m[q] = cfg_class[q*IW +: IW] == c[IW-1:0];
        end
        if (|(m & req)) begin
            csel = c[IW-1:0];
            members = m;
        end
    end

    // The pointer, on a member of the class.
    p0 = pos_reg[csel];
    pm = first_from(members, p0);
    tp = topped_reg[csel] && (pm == p0);
    // Empty members under the pointer lose their credit; stop at the
    // first backlogged one.
    e = first_from(members & req, pm);
    if (e != pm) tp = 1'b0;
    reset1 = (e != pm) ? (members & ~req & span(pm, e)) : {N{1'b0}};
    d1 = tp ? deficit_reg[e] : deficit_reg[e] + quantum_of(cfg_weight, e);
    fit1 = d1 >= len_of(len, e);

    // If e cannot send, the next backlogged member (e itself when it is
    // the only one) gets its quantum and is tried in the same cycle.
    e2 = first_from(members & req, succ(e));
    reset2 = members & ~req & span(succ(e), e2);
    d2 = (e2 == e) ? d1 + quantum_of(cfg_weight, e) : deficit_reg[e2] + quantum_of(cfg_weight, e2);
    fit2 = d2 >= len_of(len, e2);
    nxt = first_from(members, succ(e2));

    if (!cfg_drr) begin
        pick = decide && |req;
        pick_idx = first_from(req, rr_next_reg);
    end else begin
        pick = decide && |req && (fit1 || fit2);
        pick_idx = fit1 ? e : e2;
    end
end

always @(posedge clk) begin
    if (decide && |req && (accept || !pick)) begin
        if (!cfg_drr) begin
            rr_next_reg <= succ(pick_idx);
        end else begin
            for (i = 0; i < N; i = i + 1) begin
                if (reset1[i] || (!fit1 && reset2[i])) deficit_reg[i] <= {DW{1'b0}};
            end
            if (fit1) begin
                deficit_reg[e] <= d1 - len_of(len, e);
                pos_reg[csel] <= e;
                topped_reg[csel] <= 1'b1;
            end else if (fit2) begin
                deficit_reg[e] <= d1;
                deficit_reg[e2] <= d2 - len_of(len, e2);
                pos_reg[csel] <= e2;
                topped_reg[csel] <= 1'b1;
            end else begin
                deficit_reg[e] <= d1;
                deficit_reg[e2] <= d2;
                pos_reg[csel] <= nxt;
                topped_reg[csel] <= 1'b0;
            end
        end
    end

    if (rst || cfg_load) begin
        rr_next_reg <= {IW{1'b0}};
        topped_reg <= {N{1'b0}};
        for (i = 0; i < N; i = i + 1) begin
            pos_reg[i] <= {IW{1'b0}};
            deficit_reg[i] <= {DW{1'b0}};
        end
    end
end

endmodule

`resetall
