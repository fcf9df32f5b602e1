// uniplane: one input's virtual output queues in one shared buffer.
//
// The buffer holds N*RES + POOL beats of all N queues of an input: each
// queue is a linked list of beats through `next`, and a beat takes
// whichever slot is free. Each queue may always hold RES beats (its
// reserve, what a FIFO per queue would hold) and beyond that takes beats
// from the pool shared by all queues, so one output's backlog may use the
// whole pool while the others keep their reserve. s_ready is low only when
// the beat's queue has used its reserve and the pool is full (lossless: a
// full queue holds the input, nothing is dropped; POOL = 0 is a FIFO of
// RES beats per queue); each queue keeps its beats in arrival order.
//
// Every queue is a first-word-fall-through stream: its head beat is on
// m_data[q] while m_valid[q] is high, and the N queues may be read in the
// same cycle (one read port per output, as the outputs' arbiters pull
// independently; the write port is the input's). A beat written in one
// cycle is readable in the next, as in up_fifo. Free slots are a list:
// slots never used yet, then those freed (up to N a cycle), first freed
// first reused.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_voq_buf #(
    parameter N    = 4,     // queues (outputs)
    parameter W    = 8,     // bits per beat
    parameter RES  = 16,    // beats each queue may always hold (>= 1)
    parameter POOL = 64     // further beats shared by the queues (>= 0)
) (
    input  wire                    clk,
    input  wire                    rst,

    input  wire [W-1:0]            s_data,
    input  wire [$clog2(N)-1:0]    s_dest,     // queue of the beat
    input  wire                    s_valid,
    output wire                    s_ready,

    output wire [N*W-1:0]          m_data,
    output wire [N-1:0]            m_valid,
    input  wire [N-1:0]            m_ready,

    // Beats held, all queues together.
    output wire [$clog2(N*RES+POOL):0] count
);

localparam DEPTH = N * RES + POOL;
localparam AW = $clog2(DEPTH);
localparam CW = AW + 1;
localparam integer RES_I = RES;
localparam integer POOL_I = POOL;
localparam integer DEPTH_I = DEPTH;
localparam [CW-1:0] RES_C = RES_I[CW-1:0];
localparam [CW-1:0] POOL_C = POOL_I[CW-1:0];
localparam [CW-1:0] DEPTH_C = DEPTH_I[CW-1:0];

initial begin
    if (RES < 1 || POOL < 0 || DEPTH < 2) begin
        $error("up_voq_buf: RES must be >= 1, POOL >= 0, N*RES+POOL >= 2");
        $finish;
    end
end

reg [W-1:0]  buf_mem [0:DEPTH-1];
reg [AW-1:0] next_mem [0:DEPTH-1];
reg [AW-1:0] free_mem [0:DEPTH-1];   // freed slots, a ring
reg [CW-1:0] fresh_reg = {CW{1'b0}}; // slots fresh_reg.. never used yet
reg [AW-1:0] free_rd_reg = {AW{1'b0}};
reg [AW-1:0] free_wr_reg = {AW{1'b0}};
reg [CW-1:0] free_cnt_reg = {CW{1'b0}};
reg [CW-1:0] held_reg = {CW{1'b0}};
reg [AW-1:0] head_reg [0:N-1];
reg [AW-1:0] tail_reg [0:N-1];
reg [CW-1:0] cnt_reg [0:N-1];

integer k;
initial begin
    for (k = 0; k < N; k = k + 1) begin
        head_reg[k] = {AW{1'b0}};
        tail_reg[k] = {AW{1'b0}};
        cnt_reg[k] = {CW{1'b0}};
    end
end

// The ring index `a + b`, modulo DEPTH.
function [AW-1:0] ring_add;
    input [AW-1:0] a;
    input [CW-1:0] b;
    reg [CW:0] t;
    begin
        t = {1'b0, {1'b0, a} + b};
        if (t >= {1'b0, DEPTH_C}) t = t - {1'b0, DEPTH_C};
        ring_add = t[AW-1:0];
    end
endfunction

// Beats the queues hold beyond their reserves: the pool in use.
reg [CW-1:0] pooled;
integer p;
always @* begin
    pooled = {CW{1'b0}};
    for (p = 0; p < N; p = p + 1) begin
        if (cnt_reg[p] > RES_C) pooled = pooled + (cnt_reg[p] - RES_C);
    end
end

wire [CW-1:0] dest_cnt = cnt_reg[s_dest];
wire          pool_room;
generate
    if (POOL > 0) begin : pool_gen
        assign pool_room = pooled < POOL_C;
    end else begin : no_pool_gen
        assign pool_room = 1'b0;
        wire unused_ok = &{1'b0, pooled};
    end
endgenerate
assign s_ready = dest_cnt < RES_C || pool_room;
assign count   = held_reg;

wire          wr = s_valid && s_ready;
wire          from_free = free_cnt_reg != {CW{1'b0}};
wire [AW-1:0] slot = from_free ? free_mem[free_rd_reg] : fresh_reg[AW-1:0];

wire [N-1:0] rd = m_valid & m_ready;

genvar g;
generate
    for (g = 0; g < N; g = g + 1) begin : out_gen
        assign m_valid[g] = cnt_reg[g] != {CW{1'b0}};
        assign m_data[g*W +: W] = buf_mem[head_reg[g]];
    end
endgenerate

// Freed slots join the free ring in queue order: queue q's at the ring
// position after those of the queues below it read in the same cycle.
reg [CW-1:0]   n_rd;
reg [N*AW-1:0] free_at;
integer f;
always @* begin
    n_rd = {CW{1'b0}};
    free_at = {N*AW{1'b0}};
    for (f = 0; f < N; f = f + 1) begin
        free_at[f*AW +: AW] = ring_add(free_wr_reg, n_rd);
        if (rd[f]) n_rd = n_rd + 1'b1;
    end
end

always @(posedge clk) begin
    for (k = 0; k < N; k = k + 1) begin
        // Reads: the head moves along its list (when the queue empties the
        // head is rewritten by the next write below), the slot is freed.
        if (rd[k]) begin
            head_reg[k] <= next_mem[head_reg[k]];
            free_mem[free_at[k*AW +: AW]] <= head_reg[k];
        end
        cnt_reg[k] <= cnt_reg[k] - {{AW{1'b0}}, rd[k]}
                      + {{AW{1'b0}}, wr && s_dest == k[$clog2(N)-1:0]};
    end
    free_wr_reg <= ring_add(free_wr_reg, n_rd);
    if (wr) begin
        buf_mem[slot] <= s_data;
        tail_reg[s_dest] <= slot;
        if (dest_cnt == {CW{1'b0}} || (dest_cnt == {{AW{1'b0}}, 1'b1} && rd[s_dest])) begin
            head_reg[s_dest] <= slot;
        end else begin
            next_mem[tail_reg[s_dest]] <= slot;
        end
        if (from_free) begin
            free_rd_reg <= ring_add(free_rd_reg, {{AW{1'b0}}, 1'b1});
        end else begin
            fresh_reg <= fresh_reg + 1'b1;
        end
    end
    free_cnt_reg <= free_cnt_reg + n_rd - {{AW{1'b0}}, wr && from_free};
    held_reg <= held_reg + {{AW{1'b0}}, wr} - n_rd;

    if (rst) begin
        fresh_reg <= {CW{1'b0}};
        free_rd_reg <= {AW{1'b0}};
        free_wr_reg <= {AW{1'b0}};
        free_cnt_reg <= {CW{1'b0}};
        held_reg <= {CW{1'b0}};
        for (k = 0; k < N; k = k + 1) begin
            cnt_reg[k] <= {CW{1'b0}};
        end
    end
end

endmodule

`resetall
