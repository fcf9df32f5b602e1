// uniplane: N streams onto one, a whole message at a time.
//
// An up_sched picks the input whose message goes next (round-robin or
// deficit round-robin by bytes, with strict-priority classes); the grant is
// held until that message's last beat has passed, so messages never
// interleave. The decision and the first beat happen in the same cycle, so
// back-to-back messages leave with no idle cycle between them. The output
// is registered through a skid buffer.
//
// s_tlen carries, on the first beat of a message, its length in bytes
// (header and payload): the deficit round-robin charges exactly that.
// `enable` low holds the output between messages (a message in flight is
// finished); the scheduler decides nothing meanwhile.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_arb_mux #(
    parameter N       = 4,
    parameter DW      = 256,
    parameter LW      = 17,
    parameter WW      = 32,
    parameter QUANTUM = 1536
) (
    input  wire                    clk,
    input  wire                    rst,

    input  wire [N*DW-1:0]         s_tdata,
    input  wire [N-1:0]            s_tvalid,
    output wire [N-1:0]            s_tready,
    input  wire [N-1:0]            s_tfirst,
    input  wire [N-1:0]            s_tlast,
    input  wire [N*LW-1:0]         s_tlen,

    output wire [DW-1:0]           m_tdata,
    output wire                    m_tvalid,
    input  wire                    m_tready,
    output wire                    m_tfirst,
    output wire                    m_tlast,
    output wire [LW-1:0]           m_tlen,
    output wire [$clog2(N)-1:0]    m_tsrc,     // input the beat came from

    input  wire                    enable,
    input  wire                    cfg_drr,
    input  wire [N*WW-1:0]         cfg_weight,
    input  wire [N*$clog2(N)-1:0]  cfg_class,
    input  wire                    cfg_load
);

localparam IW = $clog2(N);
localparam OW = DW + LW + IW + 2;

reg           busy_reg = 1'b0;
reg  [IW-1:0] grant_reg = {IW{1'b0}};

wire          pick;
wire [IW-1:0] pick_idx;

up_sched #(
    .N(N), .LW(LW), .WW(WW), .QUANTUM(QUANTUM)
) sched_inst (
    .clk(clk),
    .rst(rst),
    .req(s_tvalid & s_tfirst),
    .len(s_tlen),
    .cfg_drr(cfg_drr),
    .cfg_weight(cfg_weight),
    .cfg_class(cfg_class),
    .cfg_load(cfg_load),
    .decide(!busy_reg && enable),
    .accept(1'b1),
    .pick(pick),
    .pick_idx(pick_idx)
);

wire          active = busy_reg || pick;
wire [IW-1:0] cur = busy_reg ? grant_reg : pick_idx;

wire          out_ready;
wire          out_valid = active && s_tvalid[cur];
wire          fire = out_valid && out_ready;

genvar g;
generate
    for (g = 0; g < N; g = g + 1) begin : ready_gen
        assign s_tready[g] = active && (cur == g) && out_ready;
    end
endgenerate

always @(posedge clk) begin
    if (active) begin
        grant_reg <= cur;
        busy_reg <= !(fire && s_tlast[cur]);
    end
    if (rst) begin
        busy_reg <= 1'b0;
    end
end

wire [OW-1:0] out_data;

up_skid #(.W(OW)) out_skid (
    .clk(clk),
    .rst(rst),
    .s_data({cur, s_tlen[cur*LW +: LW], s_tfirst[cur], s_tlast[cur], s_tdata[cur*DW +: DW]}),
    .s_valid(out_valid),
    .s_ready(out_ready),
    .m_data(out_data),
    .m_valid(m_tvalid),
    .m_ready(m_tready)
);

assign {m_tsrc, m_tlen, m_tfirst, m_tlast, m_tdata} = out_data;

endmodule

`resetall
