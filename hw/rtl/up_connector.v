// uniplane: a connector, the overlay's per-port front end (DUA Fig. 4).
//
// Parses the header beat of each message arriving at its port, looks the
// message up, checks it and steers it into the crossbar's virtual output
// queue of its output, exactly as Engine::decide does in software:
//
//   1. access control (up_acl) denies       -> answer DENIED
//   2. a stack translator entry matches     -> forward to its port
//   3. a forwarding entry or the default    -> forward to its port
//   4. otherwise, or a port >= N            -> answer NO_ROUTE
//
// "Answer" means what the software engine does: the message is consumed,
// counted, and an error completion (the answering type, source and
// destination swapped, ERROR flag, req_flag = status, no payload) goes
// back out of this same port through the crossbar queue (port, port).
// A message whose type nobody answers (a completion) is dropped and
// counted as unanswerable. Nothing is dropped for congestion: a full
// queue holds the input (head of line, as the engine holds an input).
//
// Pipeline: input skid -> data FIFO, with the lookup started on the
// header beat as it enters; the decision is queued in a small FIFO and
// applied when the message reaches the head of the data FIFO.
//
// The connector also owns its port's register page (see docs/hw.md):
// default route, the scheduler policy of output PORT, counters, and the
// pages of up_fwd_table and up_acl.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_connector #(
    parameter N    = 4,      // ports of the crossbar
    parameter PORT = 0,      // this connector's port
    parameter E    = 32,     // forwarding entries
    parameter C    = 16,     // access-control connection entries
    parameter R    = 8,      // access-control rules
    parameter DF   = 8,      // data FIFO depth (beats)
    parameter LW   = 17,
    parameter WW   = 32,
    parameter PW   = 8
) (
    input  wire                    clk,
    input  wire                    rst,

    input  wire [255:0]            s_tdata,
    input  wire                    s_tvalid,
    output wire                    s_tready,
    input  wire                    s_tfirst,
    input  wire                    s_tlast,

    output reg  [255:0]            m_tdata,
    output reg                     m_tvalid,
    input  wire                    m_tready,
    output reg                     m_tfirst,
    output reg                     m_tlast,
    output reg  [LW-1:0]           m_tlen,
    output reg  [$clog2(N)-1:0]    m_tdest,

    output wire                    tr_lk_valid,
    output wire [127:0]            tr_lk_key,
    input  wire                    tr_res_hit,
    input  wire [PW-1:0]           tr_res_port,

    // A message began leaving output PORT, with this payload length.
    input  wire                    tx_msg,
    input  wire [15:0]             tx_len,

    output wire                    cfg_pause,
    output wire                    cfg_drr,
    output wire [N*WW-1:0]         cfg_weight,
    output wire [N*$clog2(N)-1:0]  cfg_class,
    output wire                    cfg_load,

    input  wire                    wr_en,
    input  wire [11:0]             wr_addr,
    input  wire [31:0]             wr_data,
    input  wire                    rd_en,
    input  wire [11:0]             rd_addr,
    output reg  [31:0]             rd_data
);

`include "uniplane_header.vh"

localparam IW = $clog2(N);
localparam DQ = 2 * DF;

localparam [1:0] ACT_FWD = 2'd0, ACT_DENY = 2'd1, ACT_NOROUTE = 2'd2, ACT_DROP = 2'd3;

// ---------------------------------------------------------------- input
wire [255:0] in_data;
wire         in_first, in_last, in_valid, in_ready;

up_skid #(.W(258)) in_skid (
    .clk(clk), .rst(rst),
    .s_data({s_tfirst, s_tlast, s_tdata}), .s_valid(s_tvalid), .s_ready(s_tready),
    .m_data({in_first, in_last, in_data}), .m_valid(in_valid), .m_ready(in_ready)
);

wire         df_ready;
wire [255:0] h_data;
wire         h_first, h_last, h_valid;
reg          h_pop;
/* verilator lint_off UNUSEDSIGNAL */
wire [$clog2(DF):0] df_count;
/* verilator lint_on UNUSEDSIGNAL */

wire [$clog2(DQ):0] dq_count;
wire         dq_room = dq_count <= DQ - 3;
assign in_ready = df_ready && dq_room;
wire         accept = in_valid && in_ready;
wire         lk_valid = accept && in_first;

up_fifo #(.W(258), .DEPTH(DF)) data_fifo (
    .clk(clk), .rst(rst),
    .s_data({in_first, in_last, in_data}), .s_valid(accept), .s_ready(df_ready),
    .m_data({h_first, h_last, h_data}), .m_valid(h_valid), .m_ready(h_pop),
    .count(df_count)
);

// --------------------------------------------------------------- lookup
wire [7:0]  lk_type = in_data[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];
wire        lk_ports = up_form(lk_type) == UP_FORM_PORT;
wire [47:0] lk_src = in_data[UP_SRC_UID_MSB:UP_SRC_UID_LSB];
wire [47:0] lk_dst = in_data[UP_DST_UID_MSB:UP_DST_UID_LSB];
wire [15:0] lk_sport = lk_ports ? in_data[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB] : 16'd0;
wire [15:0] lk_dport = lk_ports ? in_data[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB] : 16'd0;

assign tr_lk_valid = lk_valid;
assign tr_lk_key = {lk_src, lk_sport, lk_dst, lk_dport};

reg         s1_valid_reg = 1'b0;
reg [7:0]   s1_type_reg = 8'd0;
reg [15:0]  s1_len_reg = 16'd0;

always @(posedge clk) begin
    s1_valid_reg <= lk_valid;
    if (lk_valid) begin
        s1_type_reg <= lk_type;
        s1_len_reg <= in_data[UP_MSG_LENGTH_MSB:UP_MSG_LENGTH_LSB];
    end
    if (rst) s1_valid_reg <= 1'b0;
end

reg          default_valid_reg = 1'b0;
reg [PW-1:0] default_port_reg = {PW{1'b0}};

wire          fwd_res_valid, fwd_res_match, fwd_res_hit;
wire [PW-1:0] fwd_res_port;
wire [31:0]   fwd_rd_data;
wire          acl_res_valid, acl_res_allow, acl_res_by_rule;
wire [3:0]    acl_res_rule;
wire [31:0]   acl_rd_data;

wire fwd_wr = wr_en && wr_addr[11:10] == 2'b10;

up_fwd_table #(.E(E), .PW(PW)) fwd_table (
    .clk(clk), .rst(rst),
    .wr_en(fwd_wr), .wr_entry(wr_addr[4 +: $clog2(E)]), .wr_word(wr_addr[3:2]), .wr_data(wr_data),
    .rd_entry(rd_addr[4 +: $clog2(E)]), .rd_word(rd_addr[3:2]), .rd_data(fwd_rd_data),
    .default_valid(default_valid_reg), .default_port(default_port_reg),
    .lk_valid(lk_valid), .lk_uid(lk_dst),
    .res_valid(fwd_res_valid), .res_match(fwd_res_match), .res_hit(fwd_res_hit), .res_port(fwd_res_port)
);

up_acl #(.C(C), .R(R)) acl (
    .clk(clk), .rst(rst),
    .wr_en(wr_en), .wr_addr(wr_addr), .wr_data(wr_data),
    .rd_addr(rd_addr), .rd_data(acl_rd_data),
    .lk_valid(lk_valid), .lk_src(lk_src), .lk_src_port(lk_sport),
    .lk_dst(lk_dst), .lk_dst_port(lk_dport), .lk_type(lk_type),
    .res_valid(acl_res_valid), .res_allow(acl_res_allow),
    .res_by_rule(acl_res_by_rule), .res_rule(acl_res_rule)
);

// The decision, as Engine::decide makes it.
wire [PW-1:0] route_port = tr_res_hit ? tr_res_port : fwd_res_port;
wire          routed = (tr_res_hit || fwd_res_hit) && {{(32-PW){1'b0}}, route_port} < N;
wire          answerable = up_answer_code(s1_type_reg) != 8'h00;
reg  [1:0]    action;
always @* begin
    if (!acl_res_allow) action = answerable ? ACT_DENY : ACT_DROP;
    else if (routed)    action = ACT_FWD;
    else                action = answerable ? ACT_NOROUTE : ACT_DROP;
end

wire [1:0]    q_action;
wire [IW-1:0] q_port;
wire          dq_ready;
wire          q_valid;
reg           q_pop;

up_fifo #(.W(2 + IW), .DEPTH(DQ)) decision_fifo (
    .clk(clk), .rst(rst),
    .s_data({action, route_port[IW-1:0]}), .s_valid(s1_valid_reg), .s_ready(dq_ready),
    .m_data({q_action, q_port}), .m_valid(q_valid), .m_ready(q_pop),
    .count(dq_count)
);

// --------------------------------------------------------------- output
localparam [1:0] ST_START = 2'd0, ST_FWD = 2'd1, ST_DISCARD = 2'd2, ST_ANSWER2 = 2'd3;

reg [1:0]     state_reg = ST_START;
reg [IW-1:0]  port_reg = {IW{1'b0}};
reg [255:0]   beat0_reg = 256'd0;
reg [7:0]     status_reg = 8'd0;

/* verilator lint_off UNUSEDSIGNAL */
// The error completion answering header beat `b` (second beat `ext` for
// READ and COPY), as Message::error_answer builds it.
function [255:0] answer_beat;
    input [255:0] b;
    input [255:0] ext;
    input [7:0]   status;
    reg [7:0] t, a;
    reg [2:0] f, fa;
    begin
        t = b[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];
        a = up_answer_code(t);
        f = up_form(t);
        fa = up_form(a);
        answer_beat = 256'd0;
        answer_beat[UP_SRC_UID_MSB:UP_SRC_UID_LSB] = b[UP_DST_UID_MSB:UP_DST_UID_LSB];
        answer_beat[UP_DST_UID_MSB:UP_DST_UID_LSB] = b[UP_SRC_UID_MSB:UP_SRC_UID_LSB];
        answer_beat[UP_MSG_FLAG_MSB:UP_MSG_FLAG_LSB] = UP_FLAG_WHOLE | UP_FLAG_ERROR;
        answer_beat[UP_MSG_SEQNUM_MSB:UP_MSG_SEQNUM_LSB] = b[UP_MSG_SEQNUM_MSB:UP_MSG_SEQNUM_LSB];
        answer_beat[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB] = a;
        answer_beat[UP_PORT_REQ_FLAG_MSB:UP_PORT_REQ_FLAG_LSB] = status;
        if (f == UP_FORM_PORT && fa == UP_FORM_PORT) begin
            answer_beat[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB] = b[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB];
            answer_beat[UP_PORT_DST_PORT_MSB:UP_PORT_DST_PORT_LSB] = b[UP_PORT_SRC_PORT_MSB:UP_PORT_SRC_PORT_LSB];
        end
        if (f == UP_FORM_MEMORY && fa == UP_FORM_MEMORY)
            answer_beat[UP_MEM_DST_ADDR_MSB:UP_MEM_DST_ADDR_LSB] = b[UP_MEM_DST_ADDR_MSB:UP_MEM_DST_ADDR_LSB];
        if ((f == UP_FORM_READ || f == UP_FORM_COPY) && fa == UP_FORM_MEMORY)
            answer_beat[UP_MEM_DST_ADDR_MSB:UP_MEM_DST_ADDR_LSB] = ext[UP_EXT_DST_ADDR_MSB:UP_EXT_DST_ADDR_LSB];
        if (f == UP_FORM_CONFIG && fa == UP_FORM_CONFIG)
            answer_beat[UP_CNFG_REG_ADDR_MSB:UP_CNFG_REG_ADDR_LSB] = b[UP_CNFG_REG_ADDR_MSB:UP_CNFG_REG_ADDR_LSB];
    end
endfunction
/* verilator lint_on UNUSEDSIGNAL */

wire [7:0]  h_type = h_data[UP_REQ_TYPE_MSB:UP_REQ_TYPE_LSB];
wire [16:0] h_hlen = up_has_second_beat(h_type) ? 17'd64 : 17'd32;
wire [LW-1:0] h_msg_len = h_hlen + {1'b0, h_data[UP_MSG_LENGTH_MSB:UP_MSG_LENGTH_LSB]};
wire [7:0]  q_status = (q_action == ACT_DENY) ? UP_STATUS_DENIED : UP_STATUS_NO_ROUTE;

reg [1:0] state_next;

// What the output shows: depends on the FIFO heads and state only, never
// on m_tready (which depends on m_tdest through the crossbar).
always @* begin
    m_tdata = h_data;
    m_tvalid = 1'b0;
    m_tfirst = 1'b0;
    m_tlast = h_last;
    m_tlen = {LW{1'b0}};
    m_tdest = port_reg;
    case (state_reg)
        ST_START: begin
            if (h_valid && h_first && q_valid) begin
                if (q_action == ACT_FWD) begin
                    m_tvalid = 1'b1;
                    m_tfirst = 1'b1;
                    m_tlen = h_msg_len;
                    m_tdest = q_port;
                end else if (q_action != ACT_DROP && !(up_has_second_beat(h_type) && !h_last)) begin
                    m_tvalid = 1'b1;
                    m_tfirst = 1'b1;
                    m_tlast = 1'b1;
                    m_tlen = 17'd32;
                    m_tdest = PORT[IW-1:0];
                    m_tdata = answer_beat(h_data, 256'd0, q_status);
                end
            end
        end
        ST_FWD: m_tvalid = h_valid;
        ST_DISCARD: ;
        default: begin // ST_ANSWER2: the second header beat completes the answer
            m_tvalid = h_valid;
            m_tfirst = 1'b1;
            m_tlast = 1'b1;
            m_tlen = 17'd32;
            m_tdest = PORT[IW-1:0];
            m_tdata = answer_beat(beat0_reg, h_data, status_reg);
        end
    endcase
end

// What moves.
always @* begin
    h_pop = 1'b0;
    q_pop = 1'b0;
    state_next = state_reg;
    case (state_reg)
        ST_START: begin
            if (h_valid && !h_first) begin
                // A stray beat outside a message: discard it.
                h_pop = 1'b1;
            end else if (h_valid && q_valid) begin
                if (m_tvalid) begin
                    if (m_tready) begin
                        h_pop = 1'b1;
                        q_pop = 1'b1;
                        if (h_last) state_next = ST_START;
                        else if (q_action == ACT_FWD) state_next = ST_FWD;
                        else state_next = ST_DISCARD;
                    end
                end else begin
                    // Dropped, or the first of two header beats of an answer.
                    h_pop = 1'b1;
                    q_pop = 1'b1;
                    if (h_last) state_next = ST_START;
                    else if (q_action == ACT_DROP) state_next = ST_DISCARD;
                    else state_next = ST_ANSWER2;
                end
            end
        end
        ST_FWD: begin
            if (h_valid && m_tready) begin
                h_pop = 1'b1;
                if (h_last) state_next = ST_START;
            end
        end
        ST_DISCARD: begin
            h_pop = h_valid;
            if (h_valid && h_last) state_next = ST_START;
        end
        default: begin
            if (h_valid && m_tready) begin
                h_pop = 1'b1;
                state_next = h_last ? ST_START : ST_DISCARD;
            end
        end
    endcase
end

reg stalled_reg = 1'b0;

always @(posedge clk) begin
    state_reg <= state_next;
    if (state_reg == ST_START && h_valid && h_first && q_valid) begin
        port_reg <= q_port;
        beat0_reg <= h_data;
        status_reg <= q_status;
    end
    stalled_reg <= m_tvalid && !m_tready;
    if (rst) begin
        state_reg <= ST_START;
        stalled_reg <= 1'b0;
    end
end

// ------------------------------------------------------------- counters
localparam K_RX_MSGS = 0, K_RX_BYTES = 1, K_TX_MSGS = 2, K_TX_BYTES = 3, K_DENIED = 4,
           K_NO_ROUTE = 5, K_ERR_ANSWERS = 6, K_UNANSWERABLE = 7, K_STALLS = 8, NK = 9;

reg [63:0] counter_reg [0:NK-1];
reg [31:0] hold_reg = 32'd0;

integer k;
initial for (k = 0; k < NK; k = k + 1) counter_reg[k] = 64'd0;

wire denied = !acl_res_allow;
always @(posedge clk) begin
    if (s1_valid_reg) begin
        counter_reg[K_RX_MSGS] <= counter_reg[K_RX_MSGS] + 1'b1;
        counter_reg[K_RX_BYTES] <= counter_reg[K_RX_BYTES] + {48'd0, s1_len_reg};
        if (action != ACT_FWD) begin
            if (denied) counter_reg[K_DENIED] <= counter_reg[K_DENIED] + 1'b1;
            else        counter_reg[K_NO_ROUTE] <= counter_reg[K_NO_ROUTE] + 1'b1;
            if (action == ACT_DROP) counter_reg[K_UNANSWERABLE] <= counter_reg[K_UNANSWERABLE] + 1'b1;
            else                    counter_reg[K_ERR_ANSWERS] <= counter_reg[K_ERR_ANSWERS] + 1'b1;
        end
    end
    if (tx_msg) begin
        counter_reg[K_TX_MSGS] <= counter_reg[K_TX_MSGS] + 1'b1;
        counter_reg[K_TX_BYTES] <= counter_reg[K_TX_BYTES] + {48'd0, tx_len};
    end
    if (m_tvalid && !m_tready && !stalled_reg) begin
        counter_reg[K_STALLS] <= counter_reg[K_STALLS] + 1'b1;
    end
    if (rd_en && rd_addr >= 12'h020 && rd_addr < 12'h020 + 8 * NK && !rd_addr[2]) begin
        hold_reg <= counter_reg[rd_addr[6:3] - 4'd4][63:32];
    end
    if (rst) begin
        for (k = 0; k < NK; k = k + 1) counter_reg[k] <= 64'd0;
    end
end

// ------------------------------------------------------------- registers
reg            pause_reg = 1'b0;
reg            drr_shadow_reg = 1'b0, drr_reg = 1'b0;
reg [WW-1:0]   weight_shadow_reg [0:N-1];
reg [IW-1:0]   class_shadow_reg [0:N-1];
reg [N*WW-1:0] weight_reg;
reg [N*IW-1:0] class_reg;

integer q;
initial begin
    for (q = 0; q < N; q = q + 1) begin
        weight_shadow_reg[q] = 1;
        class_shadow_reg[q] = {IW{1'b0}};
        weight_reg[q*WW +: WW] = 1;
        class_reg[q*IW +: IW] = {IW{1'b0}};
    end
end

wire commit = wr_en && wr_addr == 12'h01c;
wire [IW-1:0] wr_q = wr_addr[2 +: IW];
wire [IW-1:0] rd_q = rd_addr[2 +: IW];
assign cfg_load = commit;
assign cfg_pause = pause_reg;
assign cfg_drr = drr_reg;
assign cfg_weight = weight_reg;
assign cfg_class = class_reg;

always @(posedge clk) begin
    if (wr_en) begin
        if (wr_addr == 12'h010) begin
            default_valid_reg <= wr_data[31];
            default_port_reg <= wr_data[PW-1:0];
        end
        if (wr_addr == 12'h014) pause_reg <= wr_data[0];
        if (wr_addr == 12'h018) drr_shadow_reg <= wr_data[0];
        if (wr_addr[11:6] == 6'b000010 && {28'd0, wr_addr[5:2]} < N) weight_shadow_reg[wr_q] <= wr_data[WW-1:0];
        if (wr_addr[11:6] == 6'b000011 && {28'd0, wr_addr[5:2]} < N) class_shadow_reg[wr_q] <= wr_data[IW-1:0];
    end
    if (commit) begin
        drr_reg <= drr_shadow_reg;
        for (q = 0; q < N; q = q + 1) begin
            weight_reg[q*WW +: WW] <= weight_shadow_reg[q];
            class_reg[q*IW +: IW] <= class_shadow_reg[q];
        end
    end
    if (rst) begin
        default_valid_reg <= 1'b0;
        pause_reg <= 1'b0;
    end
end

always @* begin
    rd_data = acl_rd_data;
    if (rd_addr[11:10] == 2'b10) rd_data = fwd_rd_data;
    case (rd_addr)
        12'h00c: rd_data = PORT;
        12'h010: rd_data = {default_valid_reg, {(31-PW){1'b0}}, default_port_reg};
        12'h014: rd_data = {31'd0, pause_reg};
        12'h018: rd_data = {31'd0, drr_shadow_reg};
        12'h07c: rd_data = {8'd0, R[7:0], C[7:0], E[7:0]};
        default: ;
    endcase
    if (rd_addr >= 12'h020 && rd_addr < 12'h020 + 8 * NK) begin
        rd_data = rd_addr[2] ? hold_reg : counter_reg[rd_addr[6:3] - 4'd4][31:0];
    end
    if (rd_addr[11:6] == 6'b000010 && {28'd0, rd_addr[5:2]} < N) rd_data = weight_shadow_reg[rd_q];
    if (rd_addr[11:6] == 6'b000011 && {28'd0, rd_addr[5:2]} < N) rd_data = {{(32-IW){1'b0}}, class_shadow_reg[rd_q]};
end

// Results the decision does not need.
wire unused_ok = &{1'b0, dq_ready, fwd_res_valid, fwd_res_match, acl_res_valid, acl_res_by_rule, acl_res_rule};

endmodule

`resetall
