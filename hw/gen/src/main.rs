//! Prints the Verilog header package. Regenerate the checked-in copy with
//! `cargo run -p uniplane-hw-gen > hw/rtl/uniplane_header.vh`.

fn main() {
    print!("{}", uniplane_hw_gen::header_package());
}
