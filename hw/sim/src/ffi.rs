//! The C ABI of `csrc/shim.h`, one set of functions per model.

use std::ffi::{c_int, c_uint, c_void};

/// The functions of one model, as a table so the safe wrapper serves all.
#[derive(Clone, Copy)]
pub(crate) struct ModelFns {
    pub new: unsafe extern "C" fn() -> *mut c_void,
    pub free: unsafe extern "C" fn(*mut c_void),
    pub ports: unsafe extern "C" fn() -> c_uint,
    pub stacks: unsafe extern "C" fn() -> c_uint,
    pub set_rst: unsafe extern "C" fn(*mut c_void, c_int),
    pub eval: unsafe extern "C" fn(*mut c_void),
    pub tick: unsafe extern "C" fn(*mut c_void),
    pub set_in: unsafe extern "C" fn(*mut c_void, c_int, c_uint, c_int, c_int, c_int, *const u32),
    pub in_ready: unsafe extern "C" fn(*mut c_void, c_int, c_uint) -> c_int,
    pub set_out_ready: unsafe extern "C" fn(*mut c_void, c_int, c_uint, c_int),
    pub out:
        unsafe extern "C" fn(*mut c_void, c_int, c_uint, *mut c_int, *mut c_int, *mut u32) -> c_int,
    #[allow(clippy::type_complexity)]
    pub set_axil:
        unsafe extern "C" fn(*mut c_void, u32, c_int, u32, c_int, c_int, u32, c_int, c_int),
    pub axil_out: unsafe extern "C" fn(*mut c_void, *mut u32),
}

macro_rules! model {
    ($table:ident, $new:ident, $free:ident, $ports:ident, $stacks:ident, $rst:ident, $eval:ident,
     $tick:ident, $set_in:ident, $in_ready:ident, $set_out_ready:ident, $out:ident,
     $set_axil:ident, $axil_out:ident) => {
        extern "C" {
            fn $new() -> *mut c_void;
            fn $free(s: *mut c_void);
            fn $ports() -> c_uint;
            fn $stacks() -> c_uint;
            fn $rst(s: *mut c_void, v: c_int);
            fn $eval(s: *mut c_void);
            fn $tick(s: *mut c_void);
            fn $set_in(
                s: *mut c_void,
                kind: c_int,
                i: c_uint,
                valid: c_int,
                first: c_int,
                last: c_int,
                d: *const u32,
            );
            fn $in_ready(s: *mut c_void, kind: c_int, i: c_uint) -> c_int;
            fn $set_out_ready(s: *mut c_void, kind: c_int, i: c_uint, ready: c_int);
            fn $out(
                s: *mut c_void,
                kind: c_int,
                i: c_uint,
                first: *mut c_int,
                last: *mut c_int,
                d: *mut u32,
            ) -> c_int;
            fn $set_axil(
                s: *mut c_void,
                awaddr: u32,
                awvalid: c_int,
                wdata: u32,
                wvalid: c_int,
                bready: c_int,
                araddr: u32,
                arvalid: c_int,
                rready: c_int,
            );
            fn $axil_out(s: *mut c_void, o: *mut u32);
        }
        pub(crate) const $table: ModelFns = ModelFns {
            new: $new,
            free: $free,
            ports: $ports,
            stacks: $stacks,
            set_rst: $rst,
            eval: $eval,
            tick: $tick,
            set_in: $set_in,
            in_ready: $in_ready,
            set_out_ready: $set_out_ready,
            out: $out,
            set_axil: $set_axil,
            axil_out: $axil_out,
        };
    };
}

model!(
    N4,
    up_n4_new,
    up_n4_free,
    up_n4_ports,
    up_n4_stacks,
    up_n4_set_rst,
    up_n4_eval,
    up_n4_tick,
    up_n4_set_in,
    up_n4_in_ready,
    up_n4_set_out_ready,
    up_n4_out,
    up_n4_set_axil,
    up_n4_axil_out
);
model!(
    N8,
    up_n8_new,
    up_n8_free,
    up_n8_ports,
    up_n8_stacks,
    up_n8_set_rst,
    up_n8_eval,
    up_n8_tick,
    up_n8_set_in,
    up_n8_in_ready,
    up_n8_set_out_ready,
    up_n8_out,
    up_n8_set_axil,
    up_n8_axil_out
);
model!(
    N4I,
    up_n4i_new,
    up_n4i_free,
    up_n4i_ports,
    up_n4i_stacks,
    up_n4i_set_rst,
    up_n4i_eval,
    up_n4i_tick,
    up_n4i_set_in,
    up_n4i_in_ready,
    up_n4i_set_out_ready,
    up_n4i_out,
    up_n4i_set_axil,
    up_n4i_axil_out
);
model!(
    N8I,
    up_n8i_new,
    up_n8i_free,
    up_n8i_ports,
    up_n8i_stacks,
    up_n8i_set_rst,
    up_n8i_eval,
    up_n8i_tick,
    up_n8i_set_in,
    up_n8i_in_ready,
    up_n8i_set_out_ready,
    up_n8i_out,
    up_n8i_set_axil,
    up_n8i_axil_out
);
model!(
    K8,
    up_k8_new,
    up_k8_free,
    up_k8_ports,
    up_k8_stacks,
    up_k8_set_rst,
    up_k8_eval,
    up_k8_tick,
    up_k8_set_in,
    up_k8_in_ready,
    up_k8_set_out_ready,
    up_k8_out,
    up_k8_set_axil,
    up_k8_axil_out
);
