// uniplane: stack translator entries, shared by every connector.
//
// Mirrors overlay/src/translator.rs: an active connection (src UID, src
// port, dst UID, dst port) is steered to an output port ahead of the
// forwarding tables. T exact-match entries; each of the N connectors has
// its own lookup port (compare in the cycle of lk_valid, result on res_*
// in the next).
//
// Registers (byte offsets in the translator's page):
//   0x00C entries T (read only)
//   0x010 valid bitmap (bit t: entry t), T <= 32
//   0x100 + 32*t: entry t: +0 src[31:0], +4 {src_port, src[47:32]},
//                 +8 dst[31:0], +C {dst_port, dst[47:32]}, +10 output port
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_translator #(
    parameter N  = 4,    // lookup ports
    parameter T  = 16,   // entries (<= 32)
    parameter PW = 8
) (
    input  wire              clk,
    input  wire              rst,

    input  wire              wr_en,
    input  wire [11:0]       wr_addr,
    input  wire [31:0]       wr_data,
    input  wire [11:0]       rd_addr,
    output reg  [31:0]       rd_data,

    input  wire [N-1:0]      lk_valid,
    input  wire [N*128-1:0]  lk_key,      // {src, src_port, dst, dst_port}
    output wire [N-1:0]      res_valid,
    output reg  [N-1:0]      res_hit,
    output reg  [N*PW-1:0]   res_port
);

localparam TW = $clog2(T);

reg [127:0]  key_reg [0:T-1];
reg [PW-1:0] port_reg [0:T-1];
reg [T-1:0]  valid_reg = {T{1'b0}};

reg [N-1:0]  lk_valid_reg = {N{1'b0}};
reg [T-1:0]  match_reg [0:N-1];

integer i, j;
initial begin
    for (i = 0; i < T; i = i + 1) begin
        key_reg[i] = 128'd0;
        port_reg[i] = {PW{1'b0}};
    end
    for (i = 0; i < N; i = i + 1) match_reg[i] = {T{1'b0}};
end

/* verilator lint_off UNUSEDSIGNAL */
wire [11:0]   wr_off = wr_addr - 12'h100;
wire [11:0]   rd_off = rd_addr - 12'h100;
/* verilator lint_on UNUSEDSIGNAL */
wire [TW-1:0] wr_entry = wr_off[5 +: TW];
wire [TW-1:0] rd_entry = rd_off[5 +: TW];
localparam integer END_I = 'h100 + 32 * T;
localparam [11:0] END = END_I[11:0];
wire wr_sel = wr_addr >= 12'h100 && wr_addr < END;
wire rd_sel = rd_addr >= 12'h100 && rd_addr < END;

always @(posedge clk) begin
    if (wr_en) begin
        if (wr_addr == 12'h010) valid_reg <= wr_data[T-1:0];
        if (wr_sel) begin
            case (wr_addr[4:2])
                3'd0: key_reg[wr_entry][111:80] <= wr_data;
                3'd1: begin
                    key_reg[wr_entry][127:112] <= wr_data[15:0];
                    key_reg[wr_entry][79:64] <= wr_data[31:16];
                end
                3'd2: key_reg[wr_entry][47:16] <= wr_data;
                3'd3: begin
                    key_reg[wr_entry][63:48] <= wr_data[15:0];
                    key_reg[wr_entry][15:0] <= wr_data[31:16];
                end
                3'd4: port_reg[wr_entry] <= wr_data[PW-1:0];
                default: ;
            endcase
        end
    end

    lk_valid_reg <= lk_valid;
    for (j = 0; j < N; j = j + 1) begin
        if (lk_valid[j]) begin
            for (i = 0; i < T; i = i + 1) begin
                match_reg[j][i] <= valid_reg[i] && key_reg[i] == lk_key[j*128 +: 128];
            end
        end
    end

    if (rst) begin
        valid_reg <= {T{1'b0}};
        lk_valid_reg <= {N{1'b0}};
    end
end

assign res_valid = lk_valid_reg;
always @* begin
    for (j = 0; j < N; j = j + 1) begin
        res_hit[j] = 1'b0;
        res_port[j*PW +: PW] = {PW{1'b0}};
        for (i = T - 1; i >= 0; i = i - 1) begin
            if (match_reg[j][i]) begin
                res_hit[j] = 1'b1;
                res_port[j*PW +: PW] = port_reg[i];
            end
        end
    end
end

always @* begin
    rd_data = 32'd0;
    if (rd_addr == 12'h00c) rd_data = T;
    if (rd_addr == 12'h010) rd_data[T-1:0] = valid_reg;
    if (rd_sel) begin
        case (rd_addr[4:2])
            3'd0: rd_data = key_reg[rd_entry][111:80];
            3'd1: rd_data = {key_reg[rd_entry][79:64], key_reg[rd_entry][127:112]};
            3'd2: rd_data = key_reg[rd_entry][47:16];
            3'd3: rd_data = {key_reg[rd_entry][15:0], key_reg[rd_entry][63:48]};
            3'd4: rd_data[PW-1:0] = port_reg[rd_entry];
            default: ;
        endcase
    end
end

endmodule

`resetall
