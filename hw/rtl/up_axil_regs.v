// uniplane: AXI-Lite slave to the internal register bus.
//
// 32-bit registers, whole-word writes (wstrb is ignored). A write becomes
// one wr_en cycle; a read one rd_en cycle, with the addressed block's
// rd_data (combinational from rd_addr) captured in the same cycle and
// returned on the R channel in the next. OKAY responses only: reads of
// unmapped addresses return 0.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_axil_regs #(
    parameter AW = 20
) (
    input  wire          clk,
    input  wire          rst,

    input  wire [AW-1:0] s_axil_awaddr,
    input  wire          s_axil_awvalid,
    output wire          s_axil_awready,
    input  wire [31:0]   s_axil_wdata,
    input  wire [3:0]    s_axil_wstrb,
    input  wire          s_axil_wvalid,
    output wire          s_axil_wready,
    output wire [1:0]    s_axil_bresp,
    output wire          s_axil_bvalid,
    input  wire          s_axil_bready,
    input  wire [AW-1:0] s_axil_araddr,
    input  wire          s_axil_arvalid,
    output wire          s_axil_arready,
    output wire [31:0]   s_axil_rdata,
    output wire [1:0]    s_axil_rresp,
    output wire          s_axil_rvalid,
    input  wire          s_axil_rready,

    output reg           reg_wr_en,
    output reg  [AW-1:0] reg_wr_addr,
    output reg  [31:0]   reg_wr_data,
    output reg           reg_rd_en,
    output reg  [AW-1:0] reg_rd_addr,
    input  wire [31:0]   reg_rd_data
);

reg        bvalid_reg = 1'b0;
reg        rvalid_reg = 1'b0;
reg [31:0] rdata_reg = 32'd0;

wire do_write = s_axil_awvalid && s_axil_wvalid && !bvalid_reg && !reg_wr_en;
wire do_read = s_axil_arvalid && !rvalid_reg && !reg_rd_en;

assign s_axil_awready = do_write;
assign s_axil_wready = do_write;
assign s_axil_bresp = 2'b00;
assign s_axil_bvalid = bvalid_reg;
assign s_axil_arready = do_read;
assign s_axil_rdata = rdata_reg;
assign s_axil_rresp = 2'b00;
assign s_axil_rvalid = rvalid_reg;

initial begin
    reg_wr_en = 1'b0;
    reg_wr_addr = {AW{1'b0}};
    reg_wr_data = 32'd0;
    reg_rd_en = 1'b0;
    reg_rd_addr = {AW{1'b0}};
end

always @(posedge clk) begin
    reg_wr_en <= do_write;
    if (do_write) begin
        reg_wr_addr <= {s_axil_awaddr[AW-1:2], 2'b00};
        reg_wr_data <= s_axil_wdata;
    end
    if (reg_wr_en) bvalid_reg <= 1'b1;
    else if (s_axil_bready) bvalid_reg <= 1'b0;

    reg_rd_en <= do_read;
    if (do_read) reg_rd_addr <= {s_axil_araddr[AW-1:2], 2'b00};
    if (reg_rd_en) begin
        rdata_reg <= reg_rd_data;
        rvalid_reg <= 1'b1;
    end else if (s_axil_rready) begin
        rvalid_reg <= 1'b0;
    end

    if (rst) begin
        reg_wr_en <= 1'b0;
        reg_rd_en <= 1'b0;
        bvalid_reg <= 1'b0;
        rvalid_reg <= 1'b0;
    end
end

wire unused_ok = &{1'b0, s_axil_wstrb, s_axil_awaddr[1:0], s_axil_araddr[1:0]};

endmodule

`resetall
