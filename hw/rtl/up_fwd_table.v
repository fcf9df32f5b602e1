// uniplane: a connector's forwarding table.
//
// E key/mask entries on the 48-bit destination UID, in priority order:
// entry 0 is tried first, and the first valid entry with
// (uid ^ key) & mask == 0 gives the output port. No match falls to the
// default entry when it is valid; otherwise the lookup is a miss.
//
// Pipelined: the entries are compared with the UID presented with
// lk_valid and the match vector registered; the encoded result is on res_*
// in the next cycle. One lookup per cycle.
//
// The host writes an entry as four 32-bit words (word 0: key[31:0];
// word 1: valid[31], port[23:16], key[47:32]; word 2: mask[31:0];
// word 3: mask[47:32]). Software orders the entries: the Rust driver
// reproduces the software table's priorities and tie-breaks exactly.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_fwd_table #(
    parameter E  = 32,   // entries
    parameter PW = 8     // port number width
) (
    input  wire                 clk,
    input  wire                 rst,

    input  wire                 wr_en,
    input  wire [$clog2(E)-1:0] wr_entry,
    input  wire [1:0]           wr_word,
    input  wire [31:0]          wr_data,
    input  wire [$clog2(E)-1:0] rd_entry,
    input  wire [1:0]           rd_word,
    output reg  [31:0]          rd_data,

    input  wire                 default_valid,
    input  wire [PW-1:0]        default_port,

    input  wire                 lk_valid,
    input  wire [47:0]          lk_uid,

    output wire                 res_valid,
    output reg                  res_match,  // an entry matched
    output reg                  res_hit,    // an entry or the default matched
    output reg  [PW-1:0]        res_port
);

reg [47:0]   key_reg   [0:E-1];
reg [47:0]   mask_reg  [0:E-1];
reg [PW-1:0] port_reg  [0:E-1];
reg [E-1:0]  valid_reg = {E{1'b0}};

reg [E-1:0]  match_reg = {E{1'b0}};
reg          lk_valid_reg = 1'b0;

integer i;
initial begin
    for (i = 0; i < E; i = i + 1) begin
        key_reg[i] = 48'd0;
        mask_reg[i] = 48'd0;
        port_reg[i] = {PW{1'b0}};
    end
end

always @(posedge clk) begin
    if (wr_en) begin
        case (wr_word)
            2'd0: key_reg[wr_entry][31:0] <= wr_data;
            2'd1: begin
                key_reg[wr_entry][47:32] <= wr_data[15:0];
                port_reg[wr_entry] <= wr_data[16 +: PW];
                valid_reg[wr_entry] <= wr_data[31];
            end
            2'd2: mask_reg[wr_entry][31:0] <= wr_data;
            default: mask_reg[wr_entry][47:32] <= wr_data[15:0];
        endcase
    end

    lk_valid_reg <= lk_valid;
    if (lk_valid) begin
        for (i = 0; i < E; i = i + 1) begin
            match_reg[i] <= valid_reg[i] && (((lk_uid ^ key_reg[i]) & mask_reg[i]) == 48'd0);
        end
    end

    if (rst) begin
        valid_reg <= {E{1'b0}};
        lk_valid_reg <= 1'b0;
    end
end

always @* begin
    case (rd_word)
        2'd0: rd_data = key_reg[rd_entry][31:0];
        2'd1: begin
            rd_data = {16'd0, key_reg[rd_entry][47:32]};
            rd_data[16 +: PW] = port_reg[rd_entry];
            rd_data[31] = valid_reg[rd_entry];
        end
        2'd2: rd_data = mask_reg[rd_entry][31:0];
        default: rd_data = {16'd0, mask_reg[rd_entry][47:32]};
    endcase
end

// Priority encoder: the lowest matching entry wins.
assign res_valid = lk_valid_reg;
always @* begin
    res_match = 1'b0;
    res_port = default_port;
    for (i = E - 1; i >= 0; i = i - 1) begin
        if (match_reg[i]) begin
            res_match = 1'b1;
            res_port = port_reg[i];
        end
    end
    res_hit = res_match || default_valid;
end

endmodule

`resetall
