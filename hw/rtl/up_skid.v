// uniplane: register slice with a skid buffer.
//
// Registers a valid/ready stream of W bits (data and sideband packed by the
// caller) so that neither valid nor ready crosses it combinationally, and
// still moves one beat per cycle: when the output stalls, the beat already
// accepted waits in the skid register.
`resetall
`timescale 1ns / 1ps
`default_nettype none

module up_skid #(
    parameter W = 8
) (
    input  wire         clk,
    input  wire         rst,

    input  wire [W-1:0] s_data,
    input  wire         s_valid,
    output wire         s_ready,

    output wire [W-1:0] m_data,
    output wire         m_valid,
    input  wire         m_ready
);

reg [W-1:0] m_data_reg = {W{1'b0}};
reg         m_valid_reg = 1'b0;
reg [W-1:0] skid_data_reg = {W{1'b0}};
reg         skid_valid_reg = 1'b0;

assign s_ready = !skid_valid_reg;
assign m_data  = m_data_reg;
assign m_valid = m_valid_reg;

always @(posedge clk) begin
    if (m_valid_reg && !m_ready) begin
        // Output stalled: a beat accepted now waits in the skid register.
        if (s_valid && !skid_valid_reg) begin
            skid_data_reg  <= s_data;
            skid_valid_reg <= 1'b1;
        end
    end else if (skid_valid_reg) begin
        m_data_reg     <= skid_data_reg;
        m_valid_reg    <= 1'b1;
        skid_valid_reg <= 1'b0;
    end else begin
        m_data_reg  <= s_data;
        m_valid_reg <= s_valid;
    end

    if (rst) begin
        m_valid_reg    <= 1'b0;
        skid_valid_reg <= 1'b0;
    end
end

endmodule

`resetall
