// uniplane: one input's virtual output queues in one shared buffer.
//
// The buffer holds N*RES + POOL beats of all N queues of an input: each
// queue is a linked list of beats, and a beat takes whichever slot is
// free. Each queue may always hold RES beats (its reserve, what a FIFO per
// queue would hold) and beyond that takes beats from the pool shared by
// all queues, so one output's backlog may use the whole pool while the
// others keep their reserve. s_ready is low only when the beat's queue has
// used its reserve and the pool is full (lossless: a full queue holds the
// input, nothing is dropped; POOL = 0 is a FIFO of RES beats per queue);
// each queue keeps its beats in arrival order.
//
// A slot stores the beat and the link to the next slot of its queue, in
// one word of one memory with one write port: each queue owns one spare
// slot where its next beat will go, so a beat is written together with
// its link, the slot allocated as the queue's new spare (N more slots
// than beats). A queue is empty when its head is its spare.
//
// Every queue is a first-word-fall-through stream: its head beat is on
// m_data[q] while m_valid[q] is high, and the N queues may be read in the
// same cycle (one read port per output, as the outputs' arbiters pull
// independently). A beat written in one cycle is readable in the next, as
// in up_fifo. The lowest free slot is allocated; a slot read is free the
// next cycle.
//
// ONE_PORT = 1 keeps PORTS read ports instead of N (PORTS copies of the
// memory on an FPGA): m_data is PORTS beats wide, beat p carrying the
// head of queue m_sel[p]; m_valid[q] still says whether queue q holds a
// beat, and only m_ready[q] of a queue some port selects reads (two ports
// selecting one queue see the same beat, and it is read once). For a matcher that must see every queue without
// reading it, h_valid[q] and h_len[q] say whether queue q will hold a
// beat after this cycle's read and the top HW bits of the beat then at
// its head (the crossbar keeps a message's length there): the head's
// bits are kept per queue in a register, and when a queue is read the
// next beat's come from a narrow copy of those bits read at the link (a
// narrow read port per read port). Both look through this cycle's read so that a queue
// whose message ends now may be matched again at once.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_voq_buf #(
    parameter N    = 4,     // queues (outputs)
    parameter W    = 8,     // bits per beat
    parameter RES  = 16,    // beats each queue may always hold (>= 1)
    parameter POOL = 64,    // further beats shared by the queues (>= 0)
    parameter ONE_PORT = 0, // 1: PORTS read ports (queues m_sel) instead of one per queue
    parameter PORTS = 1,    // ONE_PORT: read ports (1 to N)
    parameter HW   = 1      // ONE_PORT: top bits of a beat kept per queue head (h_len)
) (
    input  wire                    clk,
    input  wire                    rst,

    input  wire [W-1:0]            s_data,
    input  wire [$clog2(N)-1:0]    s_dest,     // queue of the beat
    input  wire                    s_valid,
    output wire                    s_ready,

    output wire [(ONE_PORT != 0 ? PORTS*W : N*W)-1:0] m_data,
    output wire [N-1:0]            m_valid,
    input  wire [N-1:0]            m_ready,
    input  wire [PORTS*$clog2(N)-1:0] m_sel,   // ONE_PORT: the queue each read port reads

    output wire [N-1:0]            h_valid,    // ONE_PORT: queue q holds a beat after this cycle
    output wire [N*HW-1:0]         h_len,      // ONE_PORT: top HW bits of that head beat

    // Beats held, all queues together.
    output wire [$clog2(N*RES+POOL):0] count
);

localparam IW = $clog2(N);
localparam BEATS = N * RES + POOL;
localparam SLOTS = BEATS + N;            // a spare per queue
localparam AW = $clog2(SLOTS);
localparam CW = $clog2(BEATS) + 1;
localparam integer RES_I = RES;
localparam integer POOL_I = POOL;
localparam [CW-1:0] RES_C = RES_I[CW-1:0];
localparam [CW-1:0] POOL_C = POOL_I[CW-1:0];

initial begin
    if (RES < 1 || POOL < 0 || PORTS < 1 || PORTS > N) begin
        $error("up_voq_buf: RES must be >= 1, POOL >= 0 and PORTS 1 to N");
        $finish;
    end
end

reg [W+AW-1:0] buf_mem [0:SLOTS-1];       // {link, beat}
reg [SLOTS-1:0] used_reg = {{(SLOTS-N){1'b0}}, {N{1'b1}}};
reg [CW-1:0]    held_reg = {CW{1'b0}};
reg [AW-1:0]    head_reg [0:N-1];
reg [AW-1:0]    spare_reg [0:N-1];
reg [CW-1:0]    cnt_reg [0:N-1];

integer k;
initial begin
    for (k = 0; k < N; k = k + 1) begin
        head_reg[k] = k[AW-1:0];
        spare_reg[k] = k[AW-1:0];
        cnt_reg[k] = {CW{1'b0}};
    end
end

// The lowest clear bit of `used` (there is one whenever a beat is taken):
// first the lowest 32-slot group with a clear bit, then the bit in it.
localparam GROUPS = (SLOTS + 31) / 32;
function [AW-1:0] first_free;
    input [SLOTS-1:0] used;
    reg [GROUPS*32-1:0] u;
    reg [31:0] word;
    reg found;
    integer gi, bi;
    /* verilator lint_off UNUSEDSIGNAL */
    integer base;
    /* verilator lint_on UNUSEDSIGNAL */
    begin
        u = {{(GROUPS*32-SLOTS){1'b1}}, used};
        found = 1'b0;
        base = 0;
        for (gi = 0; gi < GROUPS; gi = gi + 1) begin
            if (!found && !(&u[gi*32 +: 32])) begin
                found = 1'b1;
                base = gi * 32;
            end
        end
        word = u[base +: 32];
        found = 1'b0;
        first_free = {AW{1'b0}};
        for (bi = 0; bi < 32; bi = bi + 1) begin
            if (!found && !word[bi]) begin
                found = 1'b1;
                first_free = bi[AW-1:0] + base[AW-1:0];
            end
        end
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

wire pool_room;
generate
    if (POOL > 0) begin : pool_gen
        assign pool_room = pooled < POOL_C;
    end else begin : no_pool_gen
        assign pool_room = 1'b0;
        wire unused_ok = &{1'b0, pooled};
    end
endgenerate

assign s_ready = cnt_reg[s_dest] < RES_C || pool_room;
assign count   = held_reg;

wire          wr = s_valid && s_ready;
wire [AW-1:0] slot = first_free(used_reg);
// The queues the read ports select (every queue with a port per queue).
function [N-1:0] selected;
    input [PORTS*IW-1:0] sel;
    integer sp;
    begin
        selected = {N{1'b0}};
        for (sp = 0; sp < PORTS; sp = sp + 1) begin
            selected = selected | ({{(N-1){1'b0}}, 1'b1} << sel[sp*IW +: IW]);
        end
    end
endfunction
wire [N-1:0]  sel_mask = ONE_PORT != 0 ? selected(m_sel) : {N{1'b1}};
wire [N-1:0]  rd = m_valid & m_ready & sel_mask;

// Slots read this cycle (free from the next), and how many.
reg [SLOTS-1:0] freed;
reg [CW-1:0]    n_rd;
integer f;
always @* begin
    freed = {SLOTS{1'b0}};
    n_rd = {CW{1'b0}};
    for (f = 0; f < N; f = f + 1) begin
        if (rd[f]) begin
            freed[head_reg[f]] = 1'b1;
            n_rd = n_rd + 1'b1;
        end
    end
end

// Each queue's head word: the beat, and the link to the slot after it.
wire [N*AW-1:0] link;
genvar g;
generate
    for (g = 0; g < N; g = g + 1) begin : valid_gen
        assign m_valid[g] = cnt_reg[g] != {CW{1'b0}};
    end
    if (ONE_PORT == 0) begin : ports_gen
        for (g = 0; g < N; g = g + 1) begin : out_gen
            wire [W+AW-1:0] word = buf_mem[head_reg[g]];
            assign m_data[g*W +: W] = word[W-1:0];
            assign link[g*AW +: AW] = word[W +: AW];
        end
        assign h_valid = {N{1'b0}};
        assign h_len = {(N*HW){1'b0}};
        wire unused_sel = &{1'b0, m_sel};
    end else begin : one_gen
        // The read ports, and the head bits of the beat after each.
        reg  [HW-1:0]   head_mem [0:SLOTS-1];
        reg  [HW-1:0]   hlen_reg [0:N-1];
        wire [PORTS*AW-1:0] p_nxt;
        wire [PORTS*HW-1:0] p_len;
        wire [HW-1:0]   s_len = s_data[W-1 -: HW];
        reg  [N*AW-1:0] q_nxt;      // per queue: the link of its head beat
        reg  [N*HW-1:0] q_len;      // and the head bits of the beat there
        integer h, qh, qp;
        initial begin
            for (h = 0; h < N; h = h + 1) hlen_reg[h] = {HW{1'b0}};
        end
        for (g = 0; g < PORTS; g = g + 1) begin : port_gen
            wire [W+AW-1:0] word = buf_mem[head_reg[m_sel[g*IW +: IW]]];
            assign m_data[g*W +: W] = word[W-1:0];
            assign p_nxt[g*AW +: AW] = word[W +: AW];
            assign p_len[g*HW +: HW] = head_mem[word[W +: AW]];
        end
        // A queue read now is selected by some port (all ports selecting
        // it see the same word); the last such port is taken.
        always @* begin
            q_nxt = {(N*AW){1'b0}};
            q_len = {(N*HW){1'b0}};
            for (qh = 0; qh < N; qh = qh + 1) begin
                for (qp = 0; qp < PORTS; qp = qp + 1) begin
                    if (m_sel[qp*IW +: IW] == qh[IW-1:0]) begin
                        q_nxt[qh*AW +: AW] = p_nxt[qp*AW +: AW];
                        q_len[qh*HW +: HW] = p_len[qp*HW +: HW];
                    end
                end
            end
        end
        for (g = 0; g < N; g = g + 1) begin : head_gen
            assign link[g*AW +: AW] = q_nxt[g*AW +: AW];
            // After a read the head is the beat at the link (written in
            // an earlier cycle when the queue held more than one beat).
            assign h_valid[g] = rd[g] ? cnt_reg[g] > {{(CW-1){1'b0}}, 1'b1} : m_valid[g];
            assign h_len[g*HW +: HW] = rd[g] ? q_len[g*HW +: HW] : hlen_reg[g];
        end
        always @(posedge clk) begin
            if (wr) head_mem[spare_reg[s_dest]] <= s_len;
            for (h = 0; h < N; h = h + 1) begin
                if (rd[h]) begin
                    // More beats: the next one's; else the beat written
                    // now, if any, becomes the head.
                    hlen_reg[h] <= cnt_reg[h] > {{(CW-1){1'b0}}, 1'b1} ? q_len[h*HW +: HW] : s_len;
                end else if (cnt_reg[h] == {CW{1'b0}} && wr && s_dest == h[IW-1:0]) begin
                    hlen_reg[h] <= s_len;
                end
            end
        end
    end
endgenerate

wire [SLOTS-1:0] taken = wr ? ({{(SLOTS-1){1'b0}}, 1'b1} << slot) : {SLOTS{1'b0}};

always @(posedge clk) begin
    for (k = 0; k < N; k = k + 1) begin
        if (rd[k]) begin
            head_reg[k] <= link[k*AW +: AW];
        end
        cnt_reg[k] <= cnt_reg[k] - {{(CW-1){1'b0}}, rd[k]}
                      + {{(CW-1){1'b0}}, wr && s_dest == k[IW-1:0]};
    end
    if (wr) begin
        buf_mem[spare_reg[s_dest]] <= {slot, s_data};
        spare_reg[s_dest] <= slot;
    end
    used_reg <= (used_reg | taken) & ~freed;
    held_reg <= held_reg + {{(CW-1){1'b0}}, wr} - n_rd;

    if (rst) begin
        used_reg <= {{(SLOTS-N){1'b0}}, {N{1'b1}}};
        held_reg <= {CW{1'b0}};
        for (k = 0; k < N; k = k + 1) begin
            head_reg[k] <= k[AW-1:0];
            spare_reg[k] <= k[AW-1:0];
            cnt_reg[k] <= {CW{1'b0}};
        end
    end
end

endmodule

`resetall
