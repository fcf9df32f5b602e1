// uniplane: synchronous first-word-fall-through FIFO.
//
// DEPTH entries of W bits (DEPTH a power of two). The head entry is on
// m_data whenever m_valid is high; s_ready is low only when full. Ready and
// valid depend on registers only, so a FIFO also cuts combinational paths.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_fifo #(
    parameter W     = 8,
    parameter DEPTH = 16
) (
    input  wire                    clk,
    input  wire                    rst,

    input  wire [W-1:0]            s_data,
    input  wire                    s_valid,
    output wire                    s_ready,

    output wire [W-1:0]            m_data,
    output wire                    m_valid,
    input  wire                    m_ready,

    // Entries held.
    output wire [$clog2(DEPTH):0]  count
);

localparam AW = $clog2(DEPTH);

initial begin
    if (DEPTH < 2 || (1 << AW) != DEPTH) begin
        $error("up_fifo: DEPTH must be a power of two >= 2");
        $finish;
    end
end

reg [W-1:0] fifo_mem [0:DEPTH-1];
reg [AW:0]  wr_ptr_reg = {AW+1{1'b0}};
reg [AW:0]  rd_ptr_reg = {AW+1{1'b0}};

wire full  = wr_ptr_reg == (rd_ptr_reg ^ {1'b1, {AW{1'b0}}});
wire empty = wr_ptr_reg == rd_ptr_reg;

assign s_ready = !full;
assign m_valid = !empty;
assign m_data  = fifo_mem[rd_ptr_reg[AW-1:0]];
assign count   = wr_ptr_reg - rd_ptr_reg;

always @(posedge clk) begin
    if (s_valid && !full) begin
        fifo_mem[wr_ptr_reg[AW-1:0]] <= s_data;
        wr_ptr_reg <= wr_ptr_reg + 1'b1;
    end
    if (m_ready && !empty) begin
        rd_ptr_reg <= rd_ptr_reg + 1'b1;
    end
    if (rst) begin
        wr_ptr_reg <= {AW+1{1'b0}};
        rd_ptr_reg <= {AW+1{1'b0}};
    end
end

endmodule

`resetall
